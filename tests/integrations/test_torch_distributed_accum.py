"""Gradient accumulation in real 2-rank gloo runs under PerfCheck: two micro-batches per optimizer
step, the first without gradient sync (DDP ``no_sync()``, FSDP2 ``set_requires_gradient_sync(False)``;
TP+SP has no such switch: its Partial LayerNorm gradients are all-reduced once, at the step).
The predicted collectives per optimizer step (predicted_collectives.csv: bytes x calls_per_step)
equal the measured bytes per kind (profiler window) and hand arithmetic:

* DDP: one bucket all-reduce of the 808 fp32 gradients, on the synced micro-batch only: 3232 B;
* FSDP2: every micro-batch gathers each unit in forward and again in backward (2 x 2 x 808 x 4 B),
  reduce-scatters only on the synced one (808 x 4 B);
* TP+SP: every micro-batch gathers / reduce-scatters the 2x8x16 fp32 activation once per
  direction (2 x 2 x 1024 B each); the Partial LayerNorm gradients (32 floats) once per step."""
import contextlib
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared helpers
import _torch_dist_models as M  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 5  # warmup 1, profiler warm-up 1, profiled 1, measured 2
MICRO = 2


def _sync_switch(layout, model, on: bool):
    """A context for one micro-batch: DDP's no_sync() when ``on`` is False; FSDP2's switch is a setter."""
    if layout == "ddp" and not on:
        return model.no_sync()
    if layout == "fsdp2":
        model.set_requires_gradient_sync(on)
    return contextlib.nullcontext()


def _worker(rank, port, out):
    from perfcheck import PerfCheck

    M.init_gloo(rank, port, 2)
    result = {}
    for layout, (build, _) in M.LAYOUTS.items():
        model = build()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run = os.path.join(out, layout)
        with PerfCheck(model, warmup=1, steps=2, out_dir=run, sample_interval=None) as pc:
            for step in range(STEPS):
                for micro in range(MICRO):
                    with _sync_switch(layout, model, on=micro == MICRO - 1):
                        model(M.batch(layout, MICRO * step + micro, rank)).sum().backward()
                opt.step()
                opt.zero_grad()
                pc.step()
        meta = pc.meta()
        live = pc.reconciled().set_index("module")  # the live report: same per-step correction as the saved one
        result[layout] = {"micro_batches": meta["micro_batches"], "synced": meta["grad_sync_micro_batches"],
                          "live_root_comm": [float(live.loc["(root)", "comm_fwd_bytes"]),
                                             float(live.loc["(root)", "comm_bwd_bytes"])]}
    M.save_result(out, rank, result)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("accum"))
    return out, M.run_ranks(_worker, 2, out)


HAND = {"ddp": {"allreduce": 808 * 4},
        "fsdp2": {"allgather": MICRO * 2 * 808 * 4, "reducescatter": 808 * 4},
        "tp_sp": {"allgather": MICRO * 2 * 1024, "reducescatter": MICRO * 2 * 1024, "allreduce": 32 * 4}}


def test_sync_counts_recorded_and_the_live_report_is_per_step(runs):
    _, results = runs
    for r in results:
        assert {k: r["ddp"][k] for k in ("micro_batches", "synced")} == {"micro_batches": 2, "synced": 1}
        assert {k: r["fsdp2"][k] for k in ("micro_batches", "synced")} == {"micro_batches": 2, "synced": 1}
        assert {k: r["tp_sp"][k] for k in ("micro_batches", "synced")} == {"micro_batches": 2, "synced": None}
        # root comm bytes per optimizer step (fwd, bwd), as the saved run's report gives them below
        assert r["ddp"]["live_root_comm"] == [0.0, 808 * 4]
        assert r["fsdp2"]["live_root_comm"] == [2 * 808 * 4, 2 * 808 * 4 + 808 * 4]
        assert r["tp_sp"]["live_root_comm"] == [2 * 2048, 2 * 2048 + 128]


@pytest.mark.parametrize("layout", list(M.LAYOUTS))
def test_predicted_per_step_bytes_equal_measured_and_hand(runs, layout):
    from perfcheck.analysis.layouts import reconcile_layouts

    out, _ = runs
    table = reconcile_layouts([os.path.join(out, layout)])
    assert len(table) == 2
    for row in table.to_dict("records"):
        for kind in ("allgather", "reducescatter", "allreduce"):
            hand = HAND[layout].get(kind, 0.0)
            assert row[f"pred_{kind}_bytes"] == hand, (layout, kind, row)
            assert row[f"meas_{kind}_bytes"] == pytest.approx(hand), (layout, kind, row)
        assert row["bytes_ok"]


def test_reconciled_module_comm_columns_are_per_optimizer_step(runs):
    """The report's per-module predicted comm bytes (the one-micro-batch prediction x micro-batches)
    take the skipped gradient reductions back out: DDP's root 3232 B, not 2 x 3232; FSDP2's units
    gather twice per micro-batch but reduce-scatter once; the note says what was done."""
    from perfcheck.analysis.pipeline import reconcile_run

    out, _ = runs
    rec = reconcile_run(os.path.join(out, "ddp"))
    root = rec.table[(rec.table["module"] == "(root)") & (rec.table["rank"] == 0)].iloc[0]
    assert root["comm_bwd_bytes"] == 808 * 4 and root["comm_fwd_bytes"] == 0
    assert any("gradient reductions only on the micro-batches that synced them" in n for n in rec.notes)
    rec = reconcile_run(os.path.join(out, "fsdp2"))
    first = rec.table[(rec.table["module"] == "0") & (rec.table["rank"] == 0)].iloc[0]
    # Linear(16, 32): 544 fp32 elements; forward gather x2 micro-batches; backward gather x2 + one reduce-scatter
    assert first["comm_fwd_bytes"] == 2 * 544 * 4 and first["comm_bwd_bytes"] == 2 * 544 * 4 + 544 * 4
    rec = reconcile_run(os.path.join(out, "tp_sp"))
    root = rec.table[(rec.table["module"] == "(root)") & (rec.table["rank"] == 0)].iloc[0]
    # per micro-batch 1024 B gathered + 1024 B reduce-scattered each way; LayerNorm's Partial grads once
    assert root["comm_fwd_bytes"] == 2 * 2048 and root["comm_bwd_bytes"] == 2 * 2048 + 128


def test_layout_comparison_step_time_is_per_optimizer_step(runs):
    """compare's pred_step_s: 2 micro-batches of forward + backward, less the one DDP bucket
    all-reduce that no_sync() skipped (its time on the run's system, from the collective formula)."""
    import numpy as np

    from perfcheck.analysis.layouts import reconcile_layouts
    from perfcheck.hardware.systems import load_system
    from perfcheck.predict.collectives import collective_time_s
    from perfcheck.predict.for_run import load_predicted

    out, _ = runs
    table = reconcile_layouts([os.path.join(out, "ddp")]).set_index("rank")
    pred, info = load_predicted(os.path.join(out, "ddp"), ranks=(0,))
    root = pred[pred["module"] == "(root)"].iloc[0]
    skipped = float(np.asarray(collective_time_s("allreduce", 808 * 4, 2, load_system(info["spec"] or info["system"]))))
    assert skipped > 0
    assert table.loc[0, "pred_step_s"] == pytest.approx(2 * (root["pred_fwd_s"] + root["pred_bwd_s"]) - skipped)

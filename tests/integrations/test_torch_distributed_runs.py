"""Real 2-rank gloo runs of DDP, FSDP2 and a TP+SP MLP block under PerfCheck: the bytes each
collective kind moved (measured from the profiler window) equal the bytes predicted from one
process on a fake process group; training with PerfCheck is bit-identical to training without;
an FSDP2 model keeps training after PerfCheck wrote its run directory (its prediction used to
touch the live sharded model: "mixed torch.Tensor and DTensor")."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared helpers
import _torch_dist_models as M  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 5  # warmup 1, profiler warm-up 1, profiled 1, measured 2


def _params(model):
    return [p.full_tensor().detach().clone() if hasattr(p, "full_tensor") else p.detach().clone()
            for p in model.parameters()]


def _worker(rank, port, out):
    from perfcheck import PerfCheck
    from perfcheck.measure.collectives import bytes_by_kind

    M.init_gloo(rank, port, 2)
    result = {}
    for layout, (build, _) in M.LAYOUTS.items():
        bare = build()
        M.train(bare, lambda step: M.batch(layout, step, rank), STEPS)
        model = build()
        run = os.path.join(out, layout)
        pc = PerfCheck(model, warmup=1, steps=2, out_dir=run, sample_interval=None)
        with pc:
            M.train(model, lambda step: M.batch(layout, step, rank), STEPS, pc)
        same = all(torch.equal(a, b) for a, b in zip(_params(bare), _params(model)))
        model(M.batch(layout, 99, rank)).sum().backward()  # still trains after save()
        result[layout] = {"identical": same, "bytes": bytes_by_kind(pc.collectives()),
                          "parallel": pc.meta()["parallel"], "warnings": pc.meta()["warnings"],
                          "types": sorted(set(pc.measured()["type"]))}
    M.save_result(out, rank, result)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("native"))
    return out, M.run_ranks(_worker, 2, out)


def _predicted(layout):
    from perfcheck.predict.distributed import predict_parallel

    build, shape = M.LAYOUTS[layout]
    x = torch.randn(shape if layout != "tp_sp" else (shape[0], shape[1] // 2, shape[2]))
    return predict_parallel(build, (x,), world_size=2)


@pytest.mark.parametrize("layout", list(M.LAYOUTS))
def test_predicted_bytes_equal_measured_bytes_per_kind(runs, layout):
    _, results = runs
    pred = _predicted(layout)
    from perfcheck.predict.distributed import bytes_by_kind

    expected = bytes_by_kind(pred["collectives"])
    # hand check of the prediction: 808 parameters * 4 bytes; FSDP2 gathers each unit twice and
    # reduce-scatters it once: Linear(16,32) 544 and Linear(32,8) 264 elements; TP+SP: the
    # sequence-sharded 2x4x16 activation is gathered to 2x8x16 (1024 B) once per direction
    hand = {"ddp": {"allreduce": 808 * 4},
            "fsdp2": {"allgather": 2 * (544 + 264) * 4, "reducescatter": (544 + 264) * 4},
            # + the LayerNorm's Partial weight/bias gradients (16 + 16 floats) all-reduced at the step
            "tp_sp": {"allgather": 2 * 2 * 8 * 16 * 4, "reducescatter": 2 * 2 * 8 * 16 * 4,
                      "allreduce": (16 + 16) * 4}}[layout]
    assert expected == pytest.approx(hand)
    for r in results:
        assert r[layout]["bytes"] == pytest.approx(expected), (layout, r[layout]["bytes"])


@pytest.mark.parametrize("layout", list(M.LAYOUTS))
def test_training_with_perfcheck_is_bit_identical(runs, layout):
    _, results = runs
    for r in results:
        assert r[layout]["identical"]


def test_layout_recorded_and_fsdp_class_names(runs):
    _, results = runs
    r = results[0]
    assert r["ddp"]["parallel"]["kind"] == "ddp" and r["ddp"]["parallel"]["dp"] == 2
    assert r["fsdp2"]["parallel"]["kind"] == "fsdp2" and r["fsdp2"]["parallel"]["fsdp"] == 2
    assert r["tp_sp"]["parallel"]["kind"] == "tp" and r["tp_sp"]["parallel"]["tp"] == 2
    assert r["tp_sp"]["parallel"]["sp"] is True
    assert not any(t.startswith("FSDP") for t in r["fsdp2"]["types"]), r["fsdp2"]["types"]


def test_fsdp2_run_directory_has_prediction(runs):
    out, results = runs
    assert not any("predicted.csv not written" in w for w in results[0]["fsdp2"]["warnings"]), results[0]["fsdp2"]
    assert os.path.isfile(os.path.join(out, "fsdp2", "rank0", "predicted.csv"))
    assert os.path.isfile(os.path.join(out, "fsdp2", "rank0", "collectives.csv"))


def test_compare_reconciles_the_three_layouts(runs, capsys):
    from perfcheck.analysis.layouts import reconcile_layouts

    out, _ = runs
    table = reconcile_layouts([os.path.join(out, name) for name in M.LAYOUTS])
    assert len(table) == 6 and set(table["layout"]) == {"ddp", "fsdp2", "tp"}
    # TP/SP: the redistributes predicted live on a twin with fake shards (live_dtensor_collectives)
    assert table["bytes_ok"].all(), table.filter(like="_bytes")
    tp = table[table["layout"] == "tp"]
    assert (tp["pred_allgather_bytes"] == 2 * 2 * 8 * 16 * 4).all() and (tp["pred_allreduce_bytes"] == 32 * 4).all()
    assert (table.loc[table["layout"] == "fsdp2", "pred_allgather_bytes"] == 2 * (544 + 264) * 4).all()
    assert table["notes"].str.contains("bytes match").sum() == 6


def test_compare_command_writes_the_layout_page(runs, tmp_path, capsys):
    from perfcheck.commands.cli import main

    out, _ = runs
    dest = tmp_path / "cmp"
    code = main(["compare", *[os.path.join(out, name) for name in M.LAYOUTS], "--out", str(dest)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "Q: Do the predicted bytes match the measured bytes per collective kind?\nA: yes" in text
    page = (dest / "comparison.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "torch-native layouts" in page
    # the answer on traffic names the FSDP2 run: 3 x 808 x 4 B against DDP's 808 x 4 and TP's 4224
    assert "fsdp2 (fsdp2): 9696 B per rank" in page

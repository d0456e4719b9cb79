"""A real 2-D FSDP2 + TP run: 4 gloo ranks on a (dp=2, tp=2) mesh, the FFN tensor-parallel over
'tp' and fully_shard over 'dp', under PerfCheck. PerfCheck predicts its collectives from the live
model (FSDP2 units from the live layout, TP redistributes traced on a TP-only twin with fake
shards: no fake process group, no NotImplementedError) and the predicted bytes per collective
kind equal the measured ones and hand arithmetic; per-rank FLOPs are the TP shard's; training
with PerfCheck is bit-identical to training without."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared helpers
import _torch_dist_models as M  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 5  # warmup 1, profiler warm-up 1, profiled 1, measured 2


def _batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank // 2)  # the two tp ranks of a dp group share data
    return torch.randn(8, 16, generator=g)


def _worker(rank, port, out):
    from perfcheck import PerfCheck
    from perfcheck.measure.collectives import bytes_by_kind

    M.init_gloo(rank, port, 4)
    bare = M.fsdp2_tp()
    M.train(bare, lambda step: _batch(step, rank), STEPS)
    model = M.fsdp2_tp()
    pc = PerfCheck(model, warmup=1, steps=2, out_dir=os.path.join(out, "run"), sample_interval=None)
    with pc:
        M.train(model, lambda step: _batch(step, rank), STEPS, pc)
    same = all(torch.equal(a.full_tensor(), b.full_tensor()) for a, b in zip(bare.parameters(), model.parameters()))
    pred = pc.predicted().set_index("module")
    result = {"identical": same, "measured": bytes_by_kind(pc.collectives()), "parallel": pc.meta()["parallel"],
              "warnings": pc.meta()["warnings"], "up_macs_fwd": float(pred.loc["up", "macs_fwd"])}
    M.save_result(out, rank, result)


@pytest.fixture(scope="module")
def run2d(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("fsdp2tp"))
    return out, M.run_ranks(_worker, 4, out)


# FSDP2 over dp=2 of the TP-local shards: up 32x16+32 = 544, down 16x32+16 = 528 fp32 elements,
# gathered in forward and backward, reduce-scattered once; down's row-parallel (8, 16) output all-reduced
HAND = {"allgather": 2 * (544 + 528) * 4, "reducescatter": (544 + 528) * 4, "allreduce": 8 * 16 * 4}


def test_predicted_bytes_equal_measured_and_hand(run2d):
    from perfcheck.analysis.layouts import reconcile_layouts

    out, results = run2d
    for r in results:
        assert not any("predicted.csv not written" in w for w in r["warnings"]), r["warnings"]
        assert r["measured"] == pytest.approx(HAND), r["measured"]
    table = reconcile_layouts([os.path.join(out, "run")])
    assert len(table) == 4 and table["bytes_ok"].all()
    for k, v in HAND.items():
        assert (table[f"pred_{k}_bytes"] == v).all(), table.filter(like="_bytes")


def test_per_rank_flops_layout_and_bit_identical_training(run2d):
    _, results = run2d
    for r in results:
        assert r["identical"]
        assert r["up_macs_fwd"] == 8 * 16 * 32  # 8 rows x 16 in x this rank's 32 of 64 columns
        assert r["parallel"]["kind"] == "fsdp2+tp" and r["parallel"]["mesh_shape"] == [2, 2]

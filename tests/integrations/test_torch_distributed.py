"""Torch-native layouts predicted from ONE process on PyTorch's fake process group (fast lane):
bytes per collective kind against hand arithmetic, the issuing module, layout detection, the
meta twin leaves the live model alone, perfcheck.estimate accepts DTensor models, op names."""
import os
import sys

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared helpers
import _torch_dist_models as M  # noqa: E402

from perfcheck.errors import UserError
from perfcheck.predict import distributed as D


@pytest.fixture
def fake2():
    created = D.fake_process_group(2)
    yield
    if created:
        dist.destroy_process_group()


def _rows(coll, **eq):
    m = coll
    for k, v in eq.items():
        m = m[m[k] == v]
    return m


def test_fsdp2_gathers_each_unit_twice_and_reduce_scatters_once(fake2):
    res = D.predict_model(M.fsdp2(), (torch.randn(4, 16),))
    c = res["collectives"]
    # Linear(16,32): 16*32+32 = 544 elements, Linear(32,8): 32*8+8 = 264; fp32 -> *4 bytes
    assert sorted(_rows(c, kind="allgather", phase="fwd")["bytes"]) == [264 * 4, 544 * 4]
    assert sorted(_rows(c, kind="allgather", phase="bwd")["bytes"]) == [264 * 4, 544 * 4]
    assert sorted(_rows(c, kind="reducescatter")["bytes"]) == [264 * 4, 544 * 4]
    assert set(_rows(c, phase="fwd")["module"]) == {"0", "2"}  # each unit issues its own forward gather
    assert (c["group_size"] == 2).all()
    # per rank: half of the 808 parameters, their gradients, two Adam states
    assert res["memory"]["param_bytes"] == 808 * 4 / 2
    assert res["layout"]["kind"] == "fsdp2" and res["layout"]["fsdp"] == 2


def test_ddp_one_allreduce_per_bucket_of_all_gradients(fake2):
    res = D.predict_model(M.ddp(), (torch.randn(4, 16),))
    c = res["collectives"]
    assert list(c["kind"]) == ["allreduce"] and c["bytes"].sum() == 808 * 4
    assert c["module"].iloc[0] == "0"  # the bucket's last gradient is Linear 0's (first in forward)
    assert res["layout"] == {**res["layout"], "kind": "ddp", "dp": 2}


def test_tp_sp_block_collectives_and_sharded_flops(fake2):
    res = D.predict_model(M.tp_sp(), (torch.randn(2, 4, 16),))
    c = res["collectives"]
    # SP: the (2, 4, 16) sequence shard is gathered to (2, 8, 16) = 256 floats = 1024 B before `up`,
    # and `down`'s output reduce-scattered back; backward mirrors both. LayerNorm grads are Partial.
    assert list(_rows(c, phase="fwd")[["module", "kind", "bytes"]].itertuples(index=False, name=None)) == [
        ("up", "allgather", 1024.0), ("down", "reducescatter", 1024.0)]
    assert sorted(_rows(c, phase="bwd")["kind"]) == ["allgather", "reducescatter"]
    assert _rows(c, phase="optim")["bytes"].sum() == (16 + 16) * 4
    mods = res["modules"].set_index("module")
    # per rank: up = 2*8 gathered tokens x 16 in x 16 of its 32 out columns x 2 FLOPs = 8192
    # (FlopCounterMode on the DTensor model would say 16384: the global op)
    assert mods.loc["up", "flops_fwd"] == 2 * 8 * 16 * 16 * 2
    assert res["layout"]["kind"] == "tp" and res["layout"]["tp"] == 2 and res["layout"]["sp"] is True


def test_estimate_accepts_a_dtensor_model_and_adds_its_collectives(fake2):
    import perfcheck

    model = M.tp_sp()
    before = [p.to_local().clone() for p in model.parameters()]
    frame = perfcheck.estimate(model, (torch.randn(2, 4, 16),), system="cpu")
    root = frame.set_index("module").loc["(root)"]
    assert root["comm_fwd_bytes"] == 2048.0 and root["comm_bwd_bytes"] == 2048.0 + 128.0
    assert all(torch.equal(a, p.to_local()) for a, p in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())


def test_meta_twin_is_unparallelised_and_leaves_the_model_alone(fake2):
    from perfcheck.predict.twins import meta_twin

    model = M.fsdp2()
    twin = meta_twin(model)
    assert type(twin).__name__ == "Sequential" and type(twin[0]).__name__ == "Linear"
    assert twin[0].weight.device.type == "meta" and tuple(twin[0].weight.shape) == (32, 16)
    assert twin(torch.empty(4, 16, device="meta")).shape == (4, 8)
    assert type(model).__name__ == "FSDPSequential"
    model(torch.randn(4, 16)).sum().backward()  # the live model still runs


def test_real_process_group_is_refused_with_one_line(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda *a: "gloo")
    with pytest.raises(UserError, match="real process group"):
        D.fake_process_group(2)


@pytest.mark.parametrize("name,kind", [("c10d::_allgather_base_", "allgather"),
                                       ("c10d._reduce_scatter_base_.default", "reducescatter"),
                                       ("_c10d_functional::all_gather_into_tensor", "allgather"),
                                       ("c10d::allreduce_", "allreduce"),
                                       ("_c10d_functional::wait_tensor", None)])
def test_op_kind(name, kind):
    assert D.op_kind(name) == kind


def test_estimate_with_tensor_kwargs_on_meta():
    """model(x, labels=y) with meta kwargs (what a run's meta.json rebuilds) is traced, not rejected."""
    import perfcheck

    class WithLabels(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 4)

        def forward(self, x, labels=None):
            return torch.nn.functional.cross_entropy(self.lin(x), labels)

    frame = perfcheck.estimate(WithLabels(), (torch.empty(5, 8, device="meta"),), system="cpu",
                               kwargs={"labels": torch.zeros(5, dtype=torch.long, device="meta")})
    assert frame.set_index("module").loc["lin", "macs_fwd"] == 5 * 8 * 4


def test_collective_kernels_are_communication_not_irregular_access():
    """FSDP2's all-gathers used to be diagnosed as "irregular-access kernels" (the name has 'gather')."""
    import pandas as pd

    from perfcheck.analysis.kernels import kernel_summary

    k = pd.DataFrame({"module": ["0", "0"], "phase": ["fwd", "fwd"], "device": ["cpu", "cpu"],
                      "name": ["c10d::_allgather_base_", "aten::index_select"], "count": [1, 1],
                      "total_s": [0.004, 0.001], "self_s": [0.004, 0.001], "rank": [0, 0]})
    row = kernel_summary(k).set_index("module").loc["0"]
    assert row["comm_kernel_fwd_s"] == pytest.approx(0.004)
    assert row["irregular_kernel_fwd_s"] == pytest.approx(0.001)


def test_live_dtensor_collectives_trace_a_twin_with_fake_shards(fake2):
    """The TP+SP block's redistributes predicted from the live model (as PerfCheck does in a real
    group) equal the fake-group trace's, and the live model is left as it was."""
    model = M.tp_sp()
    before = [(p.to_local().clone(), p.grad) for p in model.parameters()]
    rows = D.live_dtensor_collectives(model, (torch.randn(2, 4, 16),))
    by_kind = {}
    for r in rows:
        by_kind[r.kind] = by_kind.get(r.kind, 0) + r.bytes
    # 2x8x16 fp32 activation gathered / reduce-scattered once per direction; LayerNorm's Partial
    # weight and bias gradients (16 + 16 floats) all-reduced at the step
    assert by_kind == {"allgather": 2 * 2 * 8 * 16 * 4, "reducescatter": 2 * 2 * 8 * 16 * 4, "allreduce": 32 * 4}
    assert {r.module for r in rows if r.phase == "fwd"} == {"up", "down"}
    for p, (value, grad) in zip(model.parameters(), before):
        assert torch.equal(p.to_local(), value) and p.grad is grad
    assert all(type(p).__name__ == "DTensor" for p in model.parameters())

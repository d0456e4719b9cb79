"""Per-rank compute of torch-native layouts (fast lane, one process, PyTorch's fake process group):
FLOPs, bytes and activation memory are one rank's, not the global op's, for TP, TP+SP, FSDP2,
DDP and 2-D FSDP2+TP; references are hand arithmetic and FlopCounterMode run on a plain model
holding the rank's local shards (``to_local()``), never perfcheck's own output. Also: FSDP2+TP
collectives predicted from the live layout (what PerfCheck does in a real group) equal the
fake-group trace's, and the one bytes rule reads functional all-gathers the same on both sides."""
import os
import sys

import pytest
import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the shared helpers
import _torch_dist_models as M  # noqa: E402

import perfcheck
from perfcheck.predict import distributed as D


def _fake(world):
    created = D.fake_process_group(world)
    return created


@pytest.fixture
def fake2():
    created = _fake(2)
    yield
    if created:
        dist.destroy_process_group()


@pytest.fixture
def fake4():
    if dist.is_initialized():
        dist.destroy_process_group()
    created = _fake(4)
    yield
    if created:
        dist.destroy_process_group()


def _flop_counter(model, *inputs):
    """{module path: (fwd FLOPs, fwd+bwd FLOPs)} from FlopCounterMode on a plain model."""
    counter = FlopCounterMode(display=False)
    with counter:
        out = model(*inputs)
        fwd = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
        out.sum().backward()
    total = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    root = type(model).__name__
    return {("(root)" if k == root else k.split(".", 1)[1]): (fwd.get(k, 0), t) for k, t in total.items() if k != "Global"}


def _est(model, x):
    return perfcheck.estimate(model, (x,), system="cpu").set_index("module")


def test_colwise_rowwise_ffn_flops_per_rank_are_the_shards(fake2):
    model = M.tp_ffn(d=16)
    x = torch.randn(8, 16)
    est = _est(model, x)
    # ColwiseParallel Linear(16, 64) on tp=2: each rank has 32 of the 64 output columns:
    #   forward 2*B*d*(4d/2) = 2*8*16*32 = 8192 FLOPs; backward: weight grad only (x needs none) 8192.
    # RowwiseParallel Linear(64, 16): 32 of the 64 input rows: forward 2*8*32*16 = 8192;
    #   backward input grad + weight grad = 2 * 8192.
    assert 2 * est.loc["up", "macs_fwd"] == 8192 and 2 * est.loc["up", "macs_bwd"] == 8192
    assert 2 * est.loc["down", "macs_fwd"] == 8192 and 2 * est.loc["down", "macs_bwd"] == 16384
    ref = _flop_counter(M.local_reference(model), x)  # FlopCounterMode on the local shards
    traced = D.predict_model(model, (x,))["modules"].set_index("module")
    for path in ("up", "down", "(root)"):
        fwd, total = ref[path]
        assert 2 * est.loc[path, "macs_fwd"] == fwd and 2 * (est.loc[path, "macs_fwd"] + est.loc[path, "macs_bwd"]) == total
        assert traced.loc[path, "flops_fwd"] == fwd and traced.loc[path, "flops_fwd"] + traced.loc[path, "flops_bwd"] == total
    # bytes and activation memory per rank equal the plain local-shard model's, row for row
    local = _est(M.local_reference(model), x)
    cols = ["macs_fwd", "macs_bwd", "flops_fwd", "flops_bwd", "bytes_fwd", "bytes_bwd", "act_mem"]
    assert (est.loc[local.index, cols].to_numpy() == local[cols].to_numpy()).all()


def test_sequence_parallel_block_flops_per_rank(fake2):
    model = M.tp_sp()  # norm SequenceParallel, up colwise (input Shard(1)), down rowwise (output Shard(1))
    x = torch.randn(2, 4, 16)  # this rank's half of the 8-token sequence
    est = _est(model, x)
    # up: the sequence is all-gathered first: 2*8 tokens x 16 in x 16 (of 32) out x 2 = 8192;
    # down: 16 tokens x 16 (of 32) in x 16 out x 2 = 8192 (then reduce-scattered back to 4 tokens)
    assert 2 * est.loc["up", "macs_fwd"] == 2 * 16 * 16 * 16 == 2 * est.loc["down", "macs_fwd"]
    # FlopCounterMode on the local computation: the linears' 16-column shards on the gathered sequence
    gathered = torch.randn(2, 8, 16)
    for path in ("up", "down"):
        counts = FlopCounterMode(display=False)
        with counts:
            torch.nn.Linear(16, 16)(gathered)
        assert 2 * est.loc[path, "macs_fwd"] == counts.get_total_flops()
    # the norm runs on the 4-token shard: its bytes are those of a LayerNorm on (2, 4, 16), not (2, 8, 16)
    plain_norm = _est(torch.nn.LayerNorm(16), x).loc["(root)"]
    assert est.loc["norm", "bytes_fwd"] == plain_norm["bytes_fwd"] and est.loc["norm", "flops_fwd"] == plain_norm["flops_fwd"]


def test_fsdp2_and_ddp_compute_the_full_layer_on_the_batch_shard(fake2):
    x = torch.randn(4, 16)  # this rank's batch shard
    ref = _flop_counter(M.plain(), x)
    for model in (M.fsdp2(), M.ddp()):
        est = _est(model, x)
        traced = D.predict_model(model, (x,))["modules"].set_index("module")
        for path in ("0", "2"):
            fwd, total = ref[path]
            assert 2 * est.loc[path, "macs_fwd"] == fwd, (type(model).__name__, path)
            assert 2 * (est.loc[path, "macs_fwd"] + est.loc[path, "macs_bwd"]) == total
            assert traced.loc[path, "flops_fwd"] == fwd
    # Linear(16, 32) forward on 4 rows: 2*4*16*32 = 4096 FLOPs, the whole layer
    assert ref["0"][0] == 4096


def test_fsdp2_tp_2d_flops_memory_and_collectives_per_rank(fake4):
    model = M.fsdp2_tp(dp=2, tp=2, d=16)
    x = torch.randn(8, 16)
    est = _est(model, x)
    ref = _flop_counter(M.local_reference(model), x)
    # per rank: the TP shard of each linear (FSDP2 all-gathers dp's half back first): 2*8*16*32 = 8192
    assert ref["up"][0] == 8192 and ref["down"][0] == 8192
    for path in ("up", "down", "(root)"):
        assert 2 * est.loc[path, "macs_fwd"] == ref[path][0]
        assert 2 * (est.loc[path, "macs_fwd"] + est.loc[path, "macs_bwd"]) == ref[path][1]
    res = D.predict_model(model, (x,))
    # memory per rank: TP halves the linears (up 32x16+32, down 16x32+16 = 1072 elements), FSDP2 halves again
    assert res["memory"]["param_bytes"] == 1072 * 4 / 2
    assert res["layout"]["kind"] == "fsdp2+tp" and res["layout"]["mesh_shape"] == [2, 2]
    # collectives: FSDP2 gathers each unit's TP-local shard over dp twice, reduce-scatters it once:
    # up 544 elements, down 528 (x 4 B); down's row-parallel output (8, 16) fp32 all-reduced over tp
    hand = {"allgather": 2 * (544 + 528) * 4, "reducescatter": (544 + 528) * 4, "allreduce": 8 * 16 * 4}
    assert D.bytes_by_kind(res["collectives"]) == hand
    # what PerfCheck predicts in a real 2-D group (no fake trace): FSDP2 units read from the live
    # layout + TP redistributes traced on the TP-only twin with fake shards; the same bytes per kind
    from perfcheck.predict.layout_collectives import live_collectives

    live = live_collectives(model) + D.live_dtensor_collectives(model, (x,))
    per_kind = {}
    for r in live:
        per_kind[r.kind] = per_kind.get(r.kind, 0) + r.bytes
    assert per_kind == hand
    assert {(r.module, r.kind) for r in live if r.phase == "fwd"} == {("up", "allgather"), ("down", "allgather"),
                                                                       ("down", "allreduce")}


def test_live_fsdp2_tp_estimate_has_per_rank_compute_and_comm(fake4, monkeypatch):
    """estimate() on an FSDP2+TP model as PerfCheck calls it in a real group (the live branch)."""
    model = M.fsdp2_tp()
    monkeypatch.setattr(dist, "get_backend", lambda *a: "gloo")  # take the live-layout branch
    est = _est(model, torch.randn(8, 16))
    assert 2 * est.loc["up", "macs_fwd"] == 8192
    assert est.loc["(root)", "comm_fwd_bytes"] == (544 + 528) * 4 + 8 * 16 * 4
    assert est.loc["(root)", "comm_bwd_bytes"] == 2 * (544 + 528) * 4


def test_one_bytes_rule_for_functional_all_gather_on_both_sides():
    """The prediction (tensors) and the measurement (profiler shapes) give S by one rule."""
    from types import SimpleNamespace

    from perfcheck.measure.collectives import _bytes
    from perfcheck.predict.collective_bytes import buffer_bytes

    # _c10d_functional.all_gather_into_tensor(x (4, 8) fp32, group_size 2, name): S = 4*8*4 * 2 = 256
    event = SimpleNamespace(input_shapes=[[4, 8], [], []], input_dtypes=["float", "", ""],
                            concrete_inputs=["", 2, "0"])
    assert _bytes("_c10d_functional::all_gather_into_tensor", "allgather", event) == 256.0
    assert buffer_bytes("_c10d_functional.all_gather_into_tensor.default", "allgather", [[128]], 2) == 256.0
    # c10d::_allgather_base_(out (8, 8), in (4, 8)): S = the output, 256 B
    event = SimpleNamespace(input_shapes=[[8, 8], [4, 8]], input_dtypes=["float", "float"], concrete_inputs=[])
    assert _bytes("c10d::_allgather_base_", "allgather", event) == 256.0
    # reduce_scatter_tensor(x (8, 8), op, 2, name): S = the unreduced input, 256 B
    event = SimpleNamespace(input_shapes=[[8, 8], [], [], []], input_dtypes=["float", "", "", ""],
                            concrete_inputs=["", "sum", 2, "0"])
    assert _bytes("_c10d_functional::reduce_scatter_tensor", "reducescatter", event) == 256.0
    # an unknown group size is NaN, never a silently halved number
    assert buffer_bytes("_c10d_functional.all_gather_into_tensor.default", "allgather", [[128]], None) != 256.0


def test_optimizer_time_is_for_the_local_shards(fake2):
    """pred_optim_s: a rank's optimizer updates its shards only (FSDP2 dim-0 halves, TP halves)."""
    from perfcheck.predict.host import optimizer_time

    root = _est(M.fsdp2(), torch.randn(4, 16)).loc["(root)"]
    # Linear(16, 32): weight 32x16 -> 16x16 = 256, bias 32 -> 16; Linear(32, 8): 8x32 -> 4x32 = 128, bias 8 -> 4
    assert root["pred_optim_s"] == pytest.approx(optimizer_time([256, 16, 128, 4], "sgd", "cpu").time_s)
    plain = _est(M.plain(), torch.randn(4, 16)).loc["(root)"]
    assert plain["pred_optim_s"] == pytest.approx(optimizer_time([512, 32, 256, 8], "sgd", "cpu").time_s)
    tp = _est(M.tp_ffn(d=16), torch.randn(8, 16)).loc["(root)"]
    # colwise up: weight 64x16 -> 32x16 = 512, bias 64 -> 32; rowwise down: 16x64 -> 16x32 = 512, bias 16 replicated
    assert tp["pred_optim_s"] == pytest.approx(optimizer_time([512, 32, 512, 16], "sgd", "cpu").time_s)


def test_fsdp2_tp_sp_live_prediction_matches_the_fake_trace(fake4):
    """torchtitan's 2-D layout (FSDP2 + TP with sequence parallel norms): the live prediction
    (what PerfCheck uses in a real group) gives the fake-group trace's bytes per kind; the norm's
    Partial gradients are all-reduced by FSDP2 in backward, on synced micro-batches only."""
    from perfcheck.predict.layout_collectives import issue_rate, live_collectives

    model = M.fsdp2_tp_sp()
    x = torch.randn(2, 4, 16)  # this rank's half of the 8-token sequence
    traced = D.bytes_by_kind(D.predict_model(model, (x,))["collectives"])
    live = live_collectives(model) + D.live_dtensor_collectives(model, (x,))
    per_kind = {}
    for r in live:
        per_kind[r.kind] = per_kind.get(r.kind, 0) + r.bytes
    # FSDP2 unit = the whole MLP, TP-local: norm 16+16, up 16x16+16, down 16x16+16 = 576 floats = 2304 B,
    # gathered once (root: no backward re-gather) and reduce-scattered once; SP: (2, 8, 16) fp32 = 1024 B
    # gathered and reduce-scattered once per direction; the norm's weight and bias grads 16 floats each
    hand = {"allgather": 2304 + 2 * 1024, "reducescatter": 2304 + 2 * 1024, "allreduce": 2 * 64}
    assert traced == hand and per_kind == hand
    partial = [r for r in live if r.kind == "allreduce"]
    assert {(r.phase, r.op, issue_rate(r)) for r in partial} == {("bwd", "fsdp2_partial_grad", "synced_micro_batch")}

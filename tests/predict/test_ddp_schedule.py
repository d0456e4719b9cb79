"""PyTorch DDP's bucketed all-reduce beside the last micro-batch's backward (``predict.ddp``) and the
front-end's ``dp_engine="ddp"``, by hand."""
from __future__ import annotations

import pytest

from perfcheck.errors import UserError
from perfcheck.hardware.systems import load_system
from perfcheck.predict import ddp
from perfcheck.predict.pipeline import host_constants
from perfcheck.predict.transformer import transformer_step

MIB = 2**20
LLAMA = dict(name="llama-tiny", layers=4, hidden=1024, heads=8, kv_heads=8, ffn_hidden=2816, vocab=32000,
             seq_len=2048, norm="rmsnorm", activation="swiglu", bias=False, tied_embeddings=False,
             position="rotary", dropout=0.0)


def test_buckets_follow_torch_default_cap():
    # torch.nn.parallel.distributed: 25 MiB buckets (bucket_cap_mb's default)
    assert ddp.BUCKET_BYTES == 25 * 1024 * 1024
    assert ddp.buckets(60 * MIB) == 3 and ddp.last_bucket_bytes(60 * MIB) == pytest.approx(10 * MIB)
    assert ddp.buckets(50 * MIB) == 2 and ddp.last_bucket_bytes(50 * MIB) == pytest.approx(25 * MIB)
    assert ddp.buckets(1.0) == 1 and ddp.buckets(0.0) == 0


def test_exposed_by_hand_in_both_regimes():
    spec = load_system("a100-80gb-sxm")
    lat = host_constants(spec)["collective_latency_s"]
    bw, n, r = 100e9, 4, 0.7
    ring = 2 * (n - 1) / n / bw  # seconds per byte of a ring all-reduce

    stack_s = 100 * MIB * ring + 4 * lat  # four buckets, each with its latency
    last_s = 25 * MIB * ring + lat
    tail_s = 10 * MIB * ring + lat
    # a long backward hides every stack bucket but for the (1 - r) share of the SMs NCCL holds; the last one
    # runs beside the embedding's 10 ms backward; the embedding's bucket has nothing left to hide behind
    long = ddp.exposed_s(100 * MIB, 10 * MIB, 1.0, 0.01, n, bw, spec, r)
    assert long == pytest.approx(0.3 * (stack_s - last_s) + 0.3 * last_s + tail_s, rel=1e-9)
    # a backward of 0.1 ms: the stream runs c - g past it, then the last bucket after the embedding's 1 us
    short = ddp.exposed_s(100 * MIB, 10 * MIB, 1e-4, 1e-6, n, bw, spec, r)
    assert short == pytest.approx((stack_s - last_s - 1e-4) + (last_s - 1e-6) + tail_s, rel=1e-9)


def _step(**kw):
    par = dict(tp=1, pp=1, dp=4, micro_batches=4)
    return transformer_step(LLAMA, batch=1, parallel=par, system="a100-80gb-sxm", dtype="bf16", flash=True,
                            causal=True, **kw).values


def test_ddp_engine_bytes_and_times_by_hand():
    spec = load_system("a100-80gb-sxm")
    lat = host_constants(spec)["collective_latency_s"]
    h, f, L, V = 1024, 2816, 4, 32000
    stack, tail = 2 * (L * (4 * h * h + 3 * h * f + 2 * h) + V * h + h), 2 * V * h  # bf16 gradients, untied
    d = _step(dp_engine="ddp")
    assert d["dp_allreduce_bytes"] == pytest.approx(stack + tail)
    assert d["dp_allgather_bytes"] == 0 and d["dp_reducescatter_bytes"] == 0
    # dp = 4 in one node: NVLink 300 GB/s x 0.8, ring factor 3/2; one latency per 25 MiB bucket
    bw = spec.intra_node_bandwidth_bytes_per_s * spec.efficiency["intra_node"]
    buckets = -(-stack // (25 * MIB)) + -(-tail // (25 * MIB))
    assert d["dp_comm_total_s"] == pytest.approx((stack + tail) * 1.5 / bw + buckets * lat, rel=1e-9)
    # the embedding's bucket is exposed in full; the rest hides in part behind the last micro-batch's backward
    tail_s = tail * 1.5 / bw + -(-tail // (25 * MIB)) * lat
    assert tail_s < d["dp_comm_time_s"] < d["dp_comm_total_s"]
    # Megatron's local DDP (all-reduce after the backward, nothing hidden) exposes all of it
    m = _step(dp_engine="megatron")
    assert m["dp_comm_time_s"] > d["dp_comm_time_s"]
    # and accumulates in the fused GEMM, where DDP's AccumulateGrad adds micro-batches 2..4 apart (grad_buffers)
    assert m["grad_accum_time_s"] == 0 and d["grad_accum_time_s"] > 0
    # and their optimizer steps and passes over the gradient buffers differ (optimizer_passes, grad_buffers)
    assert d["step_time_s"] - m["step_time_s"] == pytest.approx(d["dp_comm_time_s"] - m["dp_comm_time_s"]
                                                                + d["grad_accum_time_s"] + d["optimizer_time_s"]
                                                                - m["optimizer_time_s"] + d["dp_copy_time_s"]
                                                                - m["dp_copy_time_s"], rel=1e-9)


@pytest.mark.parametrize("kw, field", [
    (dict(parallel=dict(dp=4, zero_stage=1)), "zero_stage"),
    (dict(parallel=dict(dp=4, pp=2, micro_batches=4)), "pp"),
    (dict(parallel=dict(dp=4), dp_overlap=0.5), "dp_overlap"),
])
def test_bad_ddp_options_name_the_field(kw, field):
    with pytest.raises(UserError, match=field):
        transformer_step(LLAMA, batch=1, system="a100-80gb-sxm", dtype="bf16", dp_engine="ddp", **kw)


def test_a_sweep_prices_each_layout_as_its_single_step():
    import pandas as pd

    from perfcheck.predict.transformer import sweep_transformer

    lay = pd.DataFrame(dict(tp=[1, 2, 4], pp=[1] * 3, dp=[8, 4, 2], zero_stage=[0] * 3, micro_batch=[1] * 3,
                            micro_batches=[4] * 3))
    swept = sweep_transformer(LLAMA, lay, system="a100-80gb-sxm", dtype="bf16", flash=True, causal=True,
                              dp_engine="ddp")
    for (_, row), (_, got) in zip(lay.iterrows(), swept.iterrows()):
        single = transformer_step(LLAMA, batch=1, parallel=dict(tp=int(row.tp), dp=int(row.dp), micro_batches=4),
                                  system="a100-80gb-sxm", dtype="bf16", flash=True, causal=True, dp_engine="ddp").values
        for k in ("dp_comm_time_s", "grad_accum_time_s", "step_time_s"):
            assert got[k] == pytest.approx(single[k], rel=1e-12)

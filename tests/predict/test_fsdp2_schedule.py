"""FSDP2's per-block schedule (``predict.fsdp``) and the front-end's ``dp_engine="fsdp2"``, by hand."""
from __future__ import annotations

import pytest

from perfcheck.errors import UserError
from perfcheck.hardware.systems import load_system
from perfcheck.predict import fsdp
from perfcheck.predict.collectives import beside_compute_s
from perfcheck.predict.transformer import transformer_step

LLAMA = dict(name="llama-tiny", layers=4, hidden=1024, heads=8, kv_heads=8, ffn_hidden=2816, vocab=32000,
             seq_len=2048, norm="rmsnorm", activation="swiglu", bias=False, tied_embeddings=False,
             position="rotary", dropout=0.0)


def test_beside_compute_both_regimes():
    # compute outlasts the collective: the SMs NCCL holds cost (1 - r) c
    assert beside_compute_s(2.0, 10.0, 0.75) == pytest.approx(0.5)
    # the collective outlasts the compute (r c > g): exposed c - g
    assert beside_compute_s(8.0, 3.0, 0.75) == pytest.approx(5.0)
    assert beside_compute_s(2.0, 10.0, 1.0) == 0.0


def test_exposed_per_micro_step_by_hand():
    # L = 4 blocks; all-gather 2, reduce-scatter 3, root's 1 and 0.5; block forward 10, backward 20; the root's
    # backward (output layer) 1; r = 0.75
    kw = dict(ag_block=2.0, rs_block=3.0, ag_root=1.0, rs_root=0.5, fwd_block=10.0, bwd_block=20.0, bwd_root=1.0,
              rate_beside=0.75)
    # forward: 1 + 2 exposed, then 3 all-gathers beside a forward: 3 * (2 - 1.5) = 1.5          -> 4.5
    # backward: AG(L) beside the root's 1 s: 2 - min(1.5, 1) = 1; block L hides AG: 0.5; blocks 3 and 2 hide
    # AG + RS = 5: 2 * (5 - 3.75) = 2.5; block 1 hides RS(2): 3 - 2.25 = 0.75; drain RS(1) + root 3.5 -> 8.25
    assert fsdp.exposed_per_micro_step_s(layers=4, **kw) == pytest.approx(4.5 + 8.25)
    # without resharding after forward no all-gather in backward: 0 + 0 + 2 * 0.75 + 0.75 + 3.5 = 5.75
    assert fsdp.exposed_per_micro_step_s(layers=4, reshard_after_forward=False, **kw) == pytest.approx(4.5 + 5.75)
    # one block: forward 1 + 2; backward: AG beside the root's backward 1, then RS 3 + 0.5 exposed
    assert fsdp.exposed_per_micro_step_s(layers=1, **kw) == pytest.approx(3.0 + 4.5)


def test_compute_stream_copy_bytes_by_hand():
    # 1e9 parameters, bf16 gathered and computed, fp32 reduce: 2 all-gathers x (read + write 2 B) + 2 B read,
    # 4 B written for the reduce-scatter input
    assert fsdp.compute_stream_copy_bytes(1e9, 2, 2, 4) == pytest.approx(2 * 2 * 1e9 * 2 + 1e9 * 6)
    assert fsdp.compute_stream_copy_bytes(1e9, 2, 2, 2, reshard_after_forward=False) == pytest.approx(4e9 + 4e9)


def _step(**kw):
    par = dict(tp=1, pp=1, dp=4, zero_stage=3)
    return transformer_step(LLAMA, batch=1, parallel=par, system="a100-80gb-sxm", dtype="bf16", flash=True,
                            causal=True, dp_engine="fsdp2", **kw).values


def test_fsdp2_bytes_times_and_copies_by_hand():
    spec = load_system("a100-80gb-sxm")
    bf, fp = _step(), _step(dp_reduce_dtype="fp32")
    P = bf["params_per_gpu"]  # tp = pp = 1: the whole model
    h, f, L, V = 1024, 2816, 4, 32000
    assert P == pytest.approx(L * (4 * h * h + 3 * h * f + 2 * h) + 2 * V * h + h)  # Llama: no biases, untied
    assert bf["dp_allgather_bytes"] == pytest.approx(2 * P * 2)  # gathered before forward and backward
    assert bf["dp_reducescatter_bytes"] == pytest.approx(P * 2) and fp["dp_reducescatter_bytes"] == pytest.approx(P * 4)
    # dp = 4 inside one node: NVLink 300 GB/s x 0.8; ring factor 3/4; the fp32 reduce adds P * 2 B on the ring
    bw = spec.intra_node_bandwidth_bytes_per_s * spec.efficiency["intra_node"]
    assert fp["dp_comm_total_s"] - bf["dp_comm_total_s"] == pytest.approx(P * 2 * 3 / 4 / bw, rel=1e-9)
    # copies: P (2 x 2 x 2 + 2 + 4) B at 2.039 TB/s x 0.88 (the spec has no bandwidth curve)
    assert fp["dp_copy_time_s"] == pytest.approx(P * 14 / (2.039e12 * 0.88), rel=1e-9)
    terms = ("compute_time_s", "recompute_time_s", "tp_comm_time_s", "cp_comm_time_s", "pp_comm_time_s",
             "bubble_time_s", "dp_comm_time_s", "dp_copy_time_s", "optimizer_time_s")
    assert fp["step_time_s"] == pytest.approx(sum(fp[k] for k in terms), rel=1e-12)
    # some of the collectives hide, not all: exposed strictly between the first gathers and the total
    assert 0 < fp["dp_comm_time_s"] < fp["dp_comm_total_s"]


def test_megatron_engine_reduces_in_fp32_when_asked():
    par = dict(tp=1, pp=1, dp=4)
    kw = dict(batch=1, parallel=par, system="a100-80gb-sxm", dtype="bf16", dp_engine="megatron")
    half = transformer_step(LLAMA, **kw).values
    full = transformer_step(LLAMA, dp_reduce_dtype="fp32", **kw).values
    assert full["dp_allreduce_bytes"] == pytest.approx(2 * half["dp_allreduce_bytes"])


@pytest.mark.parametrize("kw, field", [
    (dict(parallel=dict(dp=4, zero_stage=1), dp_engine="fsdp2"), "zero_stage"),
    (dict(parallel=dict(dp=4, zero_stage=3), dp_engine="fsdp2", dp_overlap=0.5), "dp_overlap"),
    (dict(parallel=dict(dp=4, zero_stage=3), dp_engine="fsdp2", dp_reduce_dtype="fp8"), "dp_reduce_dtype"),
    (dict(parallel=dict(dp=4), dp_reduce_dtype="fp32"), "dp_reduce_dtype"),
    (dict(parallel=dict(dp=4, zero_stage=3), dp_engine="fsdp2", reshard_after_forward="yes"), "reshard_after_forward"),
])
def test_bad_fsdp2_options_name_the_field(kw, field):
    with pytest.raises(UserError, match=field):
        transformer_step(LLAMA, batch=1, system="a100-80gb-sxm", dtype="bf16", **kw)

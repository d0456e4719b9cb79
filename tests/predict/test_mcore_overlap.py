"""Megatron-Core's overlapped DP collectives (``predict.mcore_overlap``) and the front-end's ``overlap_grad_reduce`` /
``overlap_param_gather``, by hand: buckets of max(40e6, 1e6 x dp) parameters, ring times, what the compute hides."""
from __future__ import annotations

import pytest

from perfcheck.errors import UserError
from perfcheck.hardware.systems import host_constants, load_system
from perfcheck.predict import mcore_overlap
from perfcheck.predict.transformer import transformer_step

SPEC = load_system("h100-sxm")
LAT = host_constants(SPEC)["collective_latency_s"]
BW = 100e9  # a bus bandwidth for the hand arithmetic


def _ring(factor, nbytes):
    return nbytes * factor / BW + LAT


def test_bucket_size_is_megatron_cores_default():
    assert mcore_overlap.bucket_params(8) == 40e6 and mcore_overlap.bucket_params(64) == 64e6


def test_grad_reduce_by_hand():
    # 100e6 fp32 gradients over 16 ranks: buckets of 40e6, 40e6, 20e6 parameters; reduce-scatter factor 15/16
    f = 15 / 16
    full, last = _ring(f, 40e6 * 4), _ring(f, 20e6 * 4)
    total = 2 * full + last
    # a long backward (1 s) hides all but the last bucket's share the SMs it holds cost: (1 - r) (R - r_last)
    long = mcore_overlap.grad_reduce_exposed_s("reducescatter", 100e6, 4, 1.0, 16, BW, SPEC, 0.7)
    assert long == pytest.approx(0.3 * (total - last) + last, rel=1e-12)
    # a backward shorter than the collectives: R - r_last - g, then the last bucket
    short = mcore_overlap.grad_reduce_exposed_s("reducescatter", 100e6, 4, 1e-3, 16, BW, SPEC, 0.7)
    assert short == pytest.approx(total - last - 1e-3 + last, rel=1e-12)
    # an all-reduce moves twice the ring factor
    ar = mcore_overlap.grad_reduce_exposed_s("allreduce", 100e6, 4, 0.0, 16, BW, SPEC, 0.7)
    assert ar == pytest.approx(2 * _ring(2 * f, 40e6 * 4) + _ring(2 * f, 20e6 * 4), rel=1e-12)


def test_param_gather_by_hand():
    # 100e6 bf16 parameters over 16 ranks: the first (smallest) bucket waited on, the rest beside the forward
    f = 15 / 16
    first, total = _ring(f, 20e6 * 2), 2 * _ring(f, 40e6 * 2) + _ring(f, 20e6 * 2)
    got = mcore_overlap.param_gather_exposed_s(100e6, 2, 1.0, 16, BW, SPEC, 1.0)
    assert got == pytest.approx(first, rel=1e-12)  # perfect concurrency, a long forward: the first bucket only
    assert mcore_overlap.param_gather_exposed_s(100e6, 2, 0.0, 16, BW, SPEC, 1.0) == pytest.approx(total, rel=1e-12)


GPT = dict(name="gpt", layers=8, hidden=2048, heads=16, ffn_hidden=8192, vocab=32000, seq_len=2048, norm="layernorm",
           activation="gelu", bias=True, tied_embeddings=True, dropout=0.0)


def _step(zero_stage=1, pp=1, **kw):
    par = dict(tp=1, pp=pp, dp=64, zero_stage=zero_stage, micro_batches=8)
    return transformer_step(GPT, batch=1, parallel=par, system="h100-sxm", dp_engine="megatron", **kw).values


def test_front_end_overlap_lies_between_none_and_all():
    plain, hidden = _step(), _step(dp_overlap=1.0)
    rs = _step(overlap_grad_reduce=True)
    both = _step(overlap_grad_reduce=True, overlap_param_gather=True)
    assert hidden["dp_comm_time_s"] < both["dp_comm_time_s"] < rs["dp_comm_time_s"] < plain["dp_comm_time_s"]
    assert both["dp_comm_total_s"] == plain["dp_comm_total_s"]  # the same collectives, less of them exposed
    # the step moves by exactly the exposed DP time
    assert plain["step_time_s"] - both["step_time_s"] == pytest.approx(plain["dp_comm_time_s"]
                                                                       - both["dp_comm_time_s"], rel=1e-9)


@pytest.mark.parametrize("kw, field", [(dict(overlap_grad_reduce=True, dp_overlap=0.5), "dp_overlap"),
                                       (dict(overlap_param_gather=True, zero_stage=0), "zero_stage"),
                                       (dict(overlap_grad_reduce=True, zero_stage=3), "zero_stage"),
                                       (dict(overlap_grad_reduce="yes"), "overlap_grad_reduce")])
def test_bad_input_names_the_field(kw, field):
    with pytest.raises(UserError, match=field):
        _step(**kw)


def test_flags_need_the_megatron_engine():
    with pytest.raises(UserError, match="dp_engine"):
        transformer_step(GPT, batch=1, parallel=dict(dp=8, zero_stage=1), system="h100-sxm", overlap_grad_reduce=True)

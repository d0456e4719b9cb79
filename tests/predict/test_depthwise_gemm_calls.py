"""The GEMM-based weight gradient's per-call term of a CPU depthwise convolution above 3x3 (predict.gemm_calls,
class ``convolution_depthwise_large``): the calls by hand, their price in the estimator, and
the fit on a planted table (bench/results/depthwise_law.md)."""
import math

import pandas as pd
import pytest
import torch

import perfcheck
from perfcheck.calibrate.conv_shapes import CONV_CASES
from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS, build_spec
from perfcheck.calibrate.op_classes import DEPTHWISE_CALL_CASE, depthwise_call_cases
from perfcheck.predict.gemm_calls import gemm_call_key, weight_gemm_calls
from perfcheck.predict.trace import trace_model
from _host_only_specs import host_only_spec, root_row

US, NS = 1e-6, 1e-9
CLASS = "convolution_depthwise_large"


def _calls(x, k, groups=None, w_grad=True):
    """The sgemm calls the estimator counts for a k x k convolution of ``x`` (depthwise unless ``groups``)."""
    c = x.shape[1]
    conv = torch.nn.Conv2d(c, c, k, padding=k // 2, groups=groups or c, bias=False).requires_grad_(w_grad)
    if not x.is_contiguous():
        conv = conv.to(memory_format=torch.channels_last)
    return weight_gemm_calls(next(o for o in trace_model(conv, (x,)).ops if o.call.name == "convolution").call)


def test_calls_are_batch_times_groups():
    # oneDNN's gemm_convolution_bwd_weights_t (NCHW) loops g over 96 groups and mb over 4 samples: 384 sgemm calls
    assert _calls(torch.randn(4, 96, 6, 6, requires_grad=True), 5) == 4 * 96
    assert _calls(torch.randn(2, 32, 6, 6), 7) == 2 * 32
    # a 3x3 depthwise (jit_dw both gradients), a grouped 5x5 and a channels-last input run other kernels
    assert _calls(torch.randn(4, 96, 6, 6), 3) == 0
    assert _calls(torch.randn(4, 96, 6, 6), 5, groups=12) == 0
    assert _calls(torch.randn(4, 96, 6, 6).contiguous(memory_format=torch.channels_last), 5) == 0
    # a frozen weight: no weight gradient, no calls
    assert _calls(torch.randn(4, 96, 6, 6, requires_grad=True), 5, w_grad=False) == 0


def test_each_call_is_priced_by_its_class_in_the_backward():
    # 4 x 96 calls at 700 ns = 268.8 us more backward, nothing more forward; another class's price is not read
    model = torch.nn.Conv2d(96, 96, 5, padding=2, groups=96, bias=False)
    x = torch.randn(4, 96, 6, 6, requires_grad=True)
    priced = root_row(perfcheck.estimate(model, (x,), system=host_only_spec({gemm_call_key(CLASS): {"bwd": 700 * NS}})))
    other = root_row(perfcheck.estimate(model, (x,), system=host_only_spec(
        {gemm_call_key("convolution_depthwise"): {"bwd": 700 * NS}})))
    plain = root_row(perfcheck.estimate(model, (x,), system=host_only_spec(None)))
    assert priced["pred_bwd_s"] - plain["pred_bwd_s"] == pytest.approx(384 * 700 * NS, rel=1e-6)
    assert priced["pred_fwd_s"] == pytest.approx(plain["pred_fwd_s"])
    assert other["pred_bwd_s"] == pytest.approx(plain["pred_bwd_s"])


def _row(kind, label, seconds, m=0, k=0, n=0, flops=0.0, nbytes=0.0):
    return {"kind": kind, "label": label, "dtype": "fp32", "m": m, "k": k, "n": n, "flops": flops, "bytes": nbytes,
            "world_size": 1, "seconds": seconds, "seconds_min": seconds, "seconds_max": seconds, "repeats": 3,
            "iters": 1, "flops_per_s": math.nan, "bytes_per_s": math.nan, "busbw_bytes_per_s": math.nan}


def test_fit_solves_the_call_price_and_the_efficiency_together():
    # Planted: one op 4 us, copies at 10 GB/s, the class's backward fixed cost 100 us; a call's work is bytes only,
    # so its roofline R = bytes / 10 GB/s; planted efficiency e = 0.25 and price p = 500 ns per call:
    #   class case (M0 = 4 x 64 = 256 calls, 2 MB): 4 + 100 + 200 us / 0.25 + 256 x 0.5 us = 1032 us
    #   call cases (128 and 1024 calls, 0.1 and 0.8 MB): 104 + 40 + 64 = 208 us and 104 + 320 + 512 = 936 us
    # Solved apart (per_op_costs: e = 200 / 928 = 0.216; the slope less R/1: (728 - 70) / 896 = 734 ns) both drift.
    assert CONV_CASES[CLASS][0][0] * CONV_CASES[CLASS][2] == 256
    rows = [_row("launch", "op", 4 * US), _row("copy", "copy 64 MiB", 2 * 2 ** 26 / 10e9, nbytes=2 * 2 ** 26),
            _row("classfixed", f"{CLASS}:bwd", 104 * US),
            _row("opeff", f"{CLASS}:bwd", 1032 * US, 1, 2, 0, nbytes=2e6)]
    rows += [_row("oprows", f"{gemm_call_key(CLASS)} bwd", t * US, m, 20, 2, nbytes=b)
             for m, b, t in ((128, 1e5, 208), (1024, 8e5, 936))]
    spec = build_spec("cpu", pd.DataFrame(rows, columns=list(MEASUREMENT_COLUMNS)), peaks="measured", stamp="test")
    assert spec.op_row_s[gemm_call_key(CLASS)]["bwd"] == pytest.approx(500 * NS, rel=1e-3)
    assert spec.op_efficiency[f"{CLASS}:bwd"] == pytest.approx(0.25, rel=1e-3)
    assert "gemm_call" in spec.sources["op_row_s"]


def test_fit_floors_a_negative_price_and_keeps_the_class_case_alone():
    # the calls' times fall (noise): price 0, efficiency from the class case less its fixed cost: 200 / 928
    rows = [_row("launch", "op", 4 * US), _row("copy", "copy 64 MiB", 2 * 2 ** 26 / 10e9, nbytes=2 * 2 ** 26),
            _row("classfixed", f"{CLASS}:bwd", 104 * US),
            _row("opeff", f"{CLASS}:bwd", 1032 * US, 1, 2, 0, nbytes=2e6)]
    rows += [_row("oprows", f"{gemm_call_key(CLASS)} bwd", t * US, m, 20, 2, nbytes=0.0)
             for m, t in ((128, 300), (1024, 200))]
    spec = build_spec("cpu", pd.DataFrame(rows, columns=list(MEASUREMENT_COLUMNS)), peaks="measured", stamp="test")
    assert spec.op_row_s[gemm_call_key(CLASS)]["bwd"] == 0.0
    assert spec.op_efficiency[f"{CLASS}:bwd"] == pytest.approx(200 / 928, rel=1e-3)


def test_call_cases_run_at_two_batches_of_one_shape():
    cases = depthwise_call_cases("cpu")
    ch, pixels, batches = DEPTHWISE_CALL_CASE
    assert [c.shape[0] for c in cases] == [n * ch for n in batches]
    # both gradients' matrix FLOPs by hand: 2 x 2 x (n x ch x pixels^2 output x 25) per case
    assert [c.flops for c in cases] == [4 * n * ch * pixels ** 2 * 25 for n in batches]
    for c in cases:
        c.fn()

"""Kernels off a GPU's vectorised elementwise loop (perfcheck/predict/strided.py): the excess by hand, the spec rates
against the measurement files they came from, which traced ops are tagged, and the eager Llama rows against a trace
of the reference code itself (tests/predict/test_eager_ops.py's copies of torchtitan's modules)."""
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from perfcheck.hardware.systems import load_system
from perfcheck.predict import eager_ops, roofline
from perfcheck.predict import trace as tracing
from perfcheck.predict.module_estimator import _op_table
from perfcheck.predict.strided import is_strided_operand, strided_excess_s
from test_eager_ops import RMSNorm, OutCopy, RepeatKV, Rotary, _meta

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "bench" / "gpu_results" / "2026-11-27-layers"
#: the cases bench/elementwise_gpu.py runs off the vectorised loop whose rate did not follow the bandwidth
SM_BOUND = ("mul fp32 by a row (T,1)", "mul bf16 by a weight (D,)", "repeat_kv expand+reshape copy",
            "transpose(1,2).contiguous()", "cast bf16->fp32")


def test_excess_by_hand():
    """1e9 elements, 4e9 bytes on h100-sxm: 1e9 / 3.74e11 - 4e9 / (3.35e12 x 0.88) = 2.674 ms - 1.357 ms."""
    h100 = load_system("h100-sxm")
    assert strided_excess_s(1e9, 4e9, h100) == pytest.approx(1e9 / 3.74e11 - 4e9 / (3.35e12 * 0.88))
    assert strided_excess_s(1e9, 16e9, h100) == 0  # memory-bound: the roofline's memory term already covers it
    assert strided_excess_s(1e9, 4e9, load_system("cpu")) == 0  # no rate: not modelled
    assert strided_excess_s(1e9, 4e9, load_system("mi300x")) == 0


@pytest.mark.parametrize("name,csv", [("h100-sxm", "elementwise_h100.csv"), ("h200", "elementwise_h200.csv")])
def test_measured_rates_are_the_medians_of_their_files(name, csv):
    """The spec's rate is the median elements/s of the SM-bound cases at the two large shapes of the raw file."""
    df = pd.read_csv(RAW / csv)
    df = df[(df["T"] == 8192) & df["case"].isin(SM_BOUND)]
    assert len(df) == 10
    median = (df["T"] * df["D"] / df["seconds"]).median()
    assert load_system(name).strided_elements_per_s == pytest.approx(median, rel=0.01)


def test_the_h200_rate_did_not_follow_its_bandwidth():
    """The evidence for an element rate: 43% more bandwidth than the H100, at most 15% more speed on each case."""
    a, b = (pd.read_csv(RAW / f).set_index(["case", "T", "D"])["seconds"] for f in
            ("elementwise_h100.csv", "elementwise_h200.csv"))
    ratio = (a / b).loc[list(SM_BOUND)]
    ratio = ratio[ratio.index.get_level_values("T") == 8192]
    assert ratio.max() < 1.16 and ratio.min() > 0.95
    vec = (a / b).loc[["add bf16", "mul fp32"]]
    assert vec[vec.index.get_level_values("T") == 8192].min() > 1.3  # the vectorised ones did follow it


def test_a100_rate_is_derived_from_sms_and_clock():
    """1.474 elements per SM-cycle (mean of the two Hopper medians per 132 SMs x 1980 MHz) x 108 SMs x 1410 MHz."""
    per_cycle = (load_system("h100-sxm").strided_elements_per_s + load_system("h200").strided_elements_per_s) / 2 \
        / (132 * 1980e6)
    assert load_system("a100-80gb-sxm").strided_elements_per_s == pytest.approx(per_cycle * 108 * 1410e6, rel=0.01)


def test_operand_rule():
    n = 4096 * 512
    assert not is_strided_operand(n, n, n)  # same shape, contiguous
    assert is_strided_operand(512, 512, n)  # a weight broadcast over the rows
    assert is_strided_operand(4096, 4096, n)  # a row statistic
    assert not is_strided_operand(1, 1, n)  # a scalar the loop hoists
    assert is_strided_operand(n, n, n, contiguous=False)  # a transposed view


def _ops(module, *args):
    return _op_table(tracing.trace_model(module, args), False)


def test_traced_ops_are_tagged_as_cuda_loops_would_run_them():
    T, e = 256, 128
    x, w = _meta(T, e), _meta(e)
    ops = _ops(torch.nn.Identity(), x)  # nothing
    assert ops.empty or ops["strided_elems_fwd"].sum() == 0

    class Mul(torch.nn.Module):
        def forward(self, a, b):
            return a * b

    same = _ops(Mul(), x, _meta(T, e))
    assert same["strided_elems_fwd"].sum() == 0 and same["strided_elems_bwd"].sum() == 0
    bcast = _ops(Mul(), x, w)
    assert bcast["strided_elems_fwd"].sum() == T * e
    assert bcast["strided_elems_bwd"].sum() == T * e  # g * w for x; w's gradient is a contiguous product + sum
    copy = _ops(OutCopy(), _meta(1, 4, T, 32))
    assert copy["strided_elems_fwd"].sum() == T * 4 * 32

    class Widen(torch.nn.Module):
        def forward(self, a):
            return a.float()

    widen = _ops(Widen(), x)
    assert widen["strided_elems_fwd"].sum() == T * e and widen["strided_elems_bwd"].sum() == 0


@pytest.mark.parametrize("case", ["rms_norm", "rotary_cast", "repeat_kv", "out_copy"])
def test_eager_rows_tag_what_the_reference_code_runs(case):
    """Elements off the loop per phase: the front-end's formula against the trace of torchtitan's code."""
    T, e, heads, kv, d = 512, 256, 8, 2, 32
    with torch.device("meta"):
        norm = RMSNorm(e).to(torch.bfloat16)
    fc = torch.empty(1, T, 1, d // 2, dtype=torch.complex64, device="meta")
    traced, formula = {
        "rms_norm": (lambda: _ops(norm, _meta(1, T, e)), eager_ops.eager_rms_norm(T, e, 2)),
        "rotary_cast": (lambda: _ops(Rotary(), _meta(1, T, heads, d), fc), eager_ops.rotary_complex(T * heads * d,
                                                                                                    T * d // 2, 2)),
        "repeat_kv": (lambda: _ops(RepeatKV(heads // kv), _meta(1, T, kv, d)), eager_ops.repeat_kv(T * heads * d,
                                                                                                  heads // kv, 2)),
        "out_copy": (lambda: _ops(OutCopy(), _meta(1, heads, T, d)), eager_ops.transpose_copy(T * heads * d, 2)),
    }[case]
    ops = traced()
    for phase in ("fwd", "bwd"):
        got = ops[f"strided_elems_{phase}"]
        assert got.sum() == getattr(formula, phase).strided_elems, phase


def test_device_times_add_the_excess_to_the_memory_term():
    spec = load_system("h100-sxm")
    plain = roofline.device_times(0.0, 0.0, 4e9, 1, spec, "bf16", launch_s=0.0)
    tagged = roofline.device_times(0.0, 0.0, 4e9, 1, spec, "bf16", launch_s=0.0, strided=(1e9, 4e9))
    assert tagged["memory"] - plain["memory"] == pytest.approx(1e9 / 3.74e11 - 4e9 / (3.35e12 * 0.88))
    assert tagged["time"] - plain["time"] == pytest.approx(tagged["memory"] - plain["memory"])


def test_front_end_norm_row_pays_the_excess():
    """The eager RMSNorm row on h100-sxm, with and without the rate: the difference is the excess by hand, per phase,
    each kernel its own (``row_times`` times a row's ops apart): forward x.float() (n elements, 6 n bytes), x * r
    (n, 8 n + a row), * weight (n, 4 n + the weight); backward mean's expand (n, 4 n + a row), x * r's (n, 12 n),
    .type_as's (n, 6 n), * weight's (n, 6 n) (bf16)."""
    from perfcheck.predict.transformer import estimate_transformer

    model = dict(name="t", layers=1, hidden=1024, heads=16, kv_heads=4, ffn_hidden=2816, vocab=1000, seq_len=2048,
                 norm="rmsnorm", activation="swiglu", bias=False, tied_embeddings=False, position="rotary")
    spec = load_system("h100-sxm")
    off = dataclasses.replace(spec, strided_elements_per_s=0.0)
    kw = dict(batch=1, dtype="bf16", flash=True, causal=True, eager=True, eager_norm=True)
    on_rows = estimate_transformer(model, system=spec, **kw).set_index("sublayer")
    off_rows = estimate_transformer(model, system=off, **kw).set_index("sublayer")
    n, bw, row, weight = 2048 * 1024, 3.35e12 * 0.88, 2048 * 4, 1024 * 2
    kernels = {"fwd": (6 * n, 8 * n + row, 4 * n + weight), "bwd": (4 * n + row, 12 * n, 6 * n, 6 * n)}
    for phase, nbytes in kernels.items():
        want = sum(max(0.0, n / 3.74e11 - b / bw) for b in nbytes)
        got = on_rows.loc["layer_norm_1", f"pred_{phase}_s"] - off_rows.loc["layer_norm_1", f"pred_{phase}_s"]
        assert got == pytest.approx(want, rel=1e-6), phase
    assert np.allclose(on_rows["pred_fwd_s"]["q_proj"], off_rows["pred_fwd_s"]["q_proj"])  # GEMMs do not move

"""GEMMs with a wide output (an LM head): the calibrated factor by output width (``matrix_wide_curve``), read by
hand, applied to the ops that are wide and to no other, and fitted from the calibration's wide F.linear cases."""
import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch

from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS, build_spec
from perfcheck.hardware.systems import host_constants, load_system
from perfcheck.predict import module_estimator as me
from perfcheck.predict import roofline
from perfcheck.predict.trace import trace_model

CURVE = {"fwd": ((2048.0, 1.0), (32768.0, 0.5)), "bwd": ((2048.0, 1.0), (32768.0, 0.8))}


def test_factor_is_read_in_log_width_and_only_for_wide_outputs():
    spec = dataclasses.replace(load_system("cpu"), matrix_wide_curve=CURVE)
    gemms = [(1, 128, 128, 8192, True, True, 4), (1, 1024, 512, 8192, True, True, 4), None,
             (1, 128, 128, 65536, True, True, 4)]
    # 8192 is halfway between 2048 and 32768 in log: 1 - 0.5 x 0.5; 8192 < 16 x 1024: not wide; beyond the curve: 0.5
    assert list(roofline.wide_factors(spec, gemms, "fwd")) == pytest.approx([0.75, 1.0, 1.0, 0.5])
    assert list(roofline.wide_factors(spec, gemms, "bwd")) == pytest.approx([0.9, 1.0, 1.0, 0.8])
    assert list(roofline.wide_factors(load_system("cpu"), gemms, "fwd")) == [1.0] * 4  # no curve, no factor


def test_a_wide_linear_runs_its_gemms_at_the_factor():
    lin, x = torch.nn.Linear(128, 8192, bias=False), torch.randn(128, 128, requires_grad=True)
    trace = trace_model(lin, (x,))
    base = load_system("cpu")
    times = {}
    for label, spec in (("plain", base), ("wide", dataclasses.replace(base, matrix_wide_curve=CURVE))):
        ops = roofline.op_device_times(me._op_table(trace, False), spec, torch.float32, launch_s=0.0)
        mm = ops[ops["macs_fwd"] > 0].iloc[0]
        assert mm["bound_fwd"] == "compute" and mm["bound_bwd"] == "compute"
        times[label] = (float(mm["t_fwd"]), float(mm["t_bwd"]))
    assert times["wide"][0] == pytest.approx(times["plain"][0] / 0.75, rel=1e-6)
    assert times["wide"][1] == pytest.approx(times["plain"][1] / 0.9, rel=1e-6)


def _row(kind, label, seconds, m=0, k=0, n=0, flops=0.0, nbytes=0.0):
    return {"kind": kind, "label": label, "dtype": "fp32", "m": m, "k": k, "n": n, "flops": flops, "bytes": nbytes,
            "world_size": 1, "seconds": seconds, "seconds_min": seconds, "seconds_max": seconds, "repeats": 3,
            "iters": 1, "flops_per_s": math.nan, "bytes_per_s": math.nan, "busbw_bytes_per_s": math.nan}


def test_fit_reads_the_wide_cases_against_the_curves_it_fitted():
    squares = [_row("matmul", f"mm {n}", 2.0 * n ** 3 / 100e9, n, n, n, 2.0 * n ** 3, 12.0 * n * n)
               for n in (64, 256, 512, 1024)]
    spec0 = build_spec("cpu", pd.DataFrame(squares, columns=list(MEASUREMENT_COLUMNS)), peaks="measured",
                       stamp="test")
    flops = 2.0 * 128 * 128 * 32768
    fwd = float(roofline.compute_time_s(flops, 0.0, spec0, "fp32", kernels=1.0, min_dim=128))
    bwd = float(roofline.compute_time_s(2 * flops, 0.0, spec0, "fp32", kernels=2.0, min_dim=128))
    # the wide forward took 1 / 0.6 of what the curves give, the backward 1 / 0.9; a wide case read faster: 1
    wide = [_row("matmul_wide", "fwd 32768", fwd / 0.6, 128, 128, 32768, flops),
            _row("matmul_wide", "bwd 32768", bwd / 0.9, 128, 128, 32768, 2 * flops),
            _row("matmul_wide", "fwd 8192", fwd / 4 * 0.9, 128, 128, 8192, flops / 4)]
    spec = build_spec("cpu", pd.DataFrame(squares + wide, columns=list(MEASUREMENT_COLUMNS)), peaks="measured",
                      stamp="test")
    assert dict(spec.matrix_wide_curve["fwd"]) == pytest.approx({2048.0: 1.0, 8192.0: 1.0, 32768.0: 0.6}, abs=1e-4)
    assert dict(spec.matrix_wide_curve["bwd"]) == pytest.approx({2048.0: 1.0, 32768.0: 0.9}, abs=1e-4)
    assert "matrix_wide_curve" in spec.sources


def test_narrow_factor_by_output_row_length():
    from perfcheck.predict.gemm_shape import narrow_factors

    spec = dataclasses.replace(load_system("cpu"), matrix_narrow_curve=((4.0, 0.1), (16.0, 1.0), (128.0, 1.0)))
    # n = 8 is halfway between 4 and 16 in log: 0.1 + 0.9 / 2; no GEMM (NaN) or rows of 128+: 1
    assert list(narrow_factors(spec, [8.0, float("nan"), 200.0, 2.0])) == pytest.approx([0.55, 1.0, 1.0, 0.1])
    assert list(narrow_factors(load_system("cpu"), [8.0])) == [1.0]
    # backward: a per-sample convolution's two GEMMs, one narrow (0.55) and one not, of equal FLOPs: 2 / (1/0.55 + 1);
    # a matmul's backward GEMMs write rows of m and k: 1
    assert list(narrow_factors(spec, [8.0, 8.0], "bwd", [False, True])) == pytest.approx([2 / (1 / 0.55 + 1), 1.0])


def test_a_gemm_op_knows_the_rows_it_writes():
    # a Linear to 10 outputs writes rows of 10; a 1x1 convolution on torch's CPU per-sample GEMM path writes rows of
    # its output pixels per sample (3 x 3); an elementwise op none
    lin = trace_model(torch.nn.Linear(64, 10), (torch.randn(32, 64),))
    conv = trace_model(torch.nn.Conv2d(192, 1024, 1, bias=False), (torch.randn(4, 192, 3, 3),))
    relu = trace_model(torch.nn.ReLU(), (torch.randn(8, 8),))
    n = {name: [me.gemm_rows_n(op.call) for op in t.ops] for name, t in (("lin", lin), ("conv", conv), ("relu", relu))}
    assert 10.0 in n["lin"] and 9.0 in n["conv"] and all(v != v for v in n["relu"])


def test_fit_reads_the_narrow_cases_against_the_curves_it_fitted():
    squares = [_row("matmul", f"mm {n}", 2.0 * n ** 3 / 100e9, n, n, n, 2.0 * n ** 3, 12.0 * n * n)
               for n in (64, 256, 512, 1024)]
    spec0 = build_spec("cpu", pd.DataFrame(squares, columns=list(MEASUREMENT_COLUMNS)), peaks="measured",
                       stamp="test")
    rows = []
    for n, f in ((4, 0.1), (9, 0.2), (64, 1.5)):  # the last ran faster than the curves: capped at 1
        flops = 2.0 * 1024 * 256 * n
        t = float(roofline.compute_time_s(flops, 0.0, spec0, "fp32", kernels=1.0, min_dim=float(n)))
        rows.append(_row("matmul_narrow", f"narrow {n}", t / f, 1024, 256, n, flops))
    spec = build_spec("cpu", pd.DataFrame(squares + rows, columns=list(MEASUREMENT_COLUMNS)), peaks="measured",
                      stamp="test")
    assert dict(spec.matrix_narrow_curve) == pytest.approx({4.0: 0.1, 9.0: 0.2, 64.0: 1.0, 128.0: 1.0}, abs=1e-4)

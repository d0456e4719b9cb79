"""GEMM row-stride alignment (perfcheck.predict.gemm_operands.gemm_unaligned) and the spec's
``efficiency.matrix_unaligned`` factor: found on an H100 (2026-11-23), where GPT-2's lm_head
(768 -> 50257 in bf16) ran 6.3x (forward) and 3.9x (backward) slower than the model while the
aligned Linears of the same run were within 4%. CPU-only: the shapes are traced, nothing runs on a GPU."""
from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import perfcheck
from perfcheck.errors import UserError
from perfcheck.hardware.systems import load_system
from perfcheck.predict.gemm_operands import gemm_unaligned

SPECS = Path(perfcheck.__file__).parent / "hardware" / "specs"


def _addmm(k, n, dtype, m=16):
    """The call a Linear(k, n) traces to: addmm(bias, x[m, k], weight.t()[k, n])."""
    meta = dict(device="meta", dtype=dtype)
    return SimpleNamespace(name="addmm", args=(torch.empty(n, **meta), torch.empty(m, k, **meta),
                                               torch.empty(n, k, **meta).t()))


@pytest.mark.parametrize("k, n, dtype, expected", [
    (768, 50257, torch.bfloat16, 1.0),  # n: 50257 x 2 B = 100514 B, 100514 % 16 = 2
    (768, 50304, torch.bfloat16, 0.0),  # nanoGPT's padded vocabulary: 50304 x 2 = 100608 = 16 x 6288
    (770, 1024, torch.bfloat16, 1.0),  # k: 770 x 2 = 1540 B, 1540 % 16 = 4
    (768, 50260, torch.float32, 0.0),  # 50260 x 4 = 201040 = 16 x 12565
    (768, 50260, torch.bfloat16, 1.0),  # 50260 x 2 = 100520, 100520 % 16 = 8
    (768, 50258, torch.float32, 1.0),  # 50258 x 4 = 201032, % 16 = 8
])
def test_unaligned_when_k_or_n_is_not_a_16_byte_multiple(k, n, dtype, expected):
    assert gemm_unaligned(_addmm(k, n, dtype)) == expected
    # m, the rows, never matters
    assert gemm_unaligned(_addmm(k, n, dtype, m=4097)) == expected


def test_not_a_gemm_or_unknown_shapes_is_nan():
    assert math.isnan(gemm_unaligned(SimpleNamespace(name="relu", args=(torch.empty(3, device="meta"),))))
    assert math.isnan(gemm_unaligned(SimpleNamespace(name="mm", args=(1, 2))))


def _spec_with(tmp_path, **efficiency):
    raw = json.loads((SPECS / "h100-sxm.json").read_text())
    raw["efficiency"] = {**raw["efficiency"], **efficiency}
    path = tmp_path / "h100_unaligned.json"
    path.write_text(json.dumps(raw))
    return str(path)


def _linear_fwd_s(n, system):
    # on the meta device: the estimate reads shapes only (a meta model estimates as its CPU twin,
    # tests/predict/test_module_estimator_autograd.py), and 38.6M real bf16 weights take a second to fill
    meta = dict(device="meta", dtype=torch.bfloat16)
    model = torch.nn.Linear(768, n, bias=False, **meta)
    x = torch.empty(8192, 768, **meta)
    pred = perfcheck.estimate(model, (x,), system=system)
    return pred.set_index("module").loc["(root)"]


def test_unaligned_gemm_runs_at_the_specs_fraction(tmp_path):
    """2 x 8192 x 768 x 50257 = 632 GFLOP: ~1 ms at an H100's bf16 rate, so the compute term dominates
    the forward and a factor of 0.25 makes it ~4x; the aligned twin (n = 50264 = 8 x 6283, 0.014% more
    FLOPs) is untouched, and without the key both cost the same per FLOP."""
    spec = _spec_with(tmp_path, matrix_unaligned=0.25)
    slow, twin = _linear_fwd_s(50257, spec), _linear_fwd_s(50264, spec)
    assert 3.7 < slow["pred_fwd_s"] / twin["pred_fwd_s"] < 4.0
    assert 3.7 < slow["pred_bwd_s"] / twin["pred_bwd_s"] < 4.0  # both backward GEMMs have stride 50257 too
    plain = load_system("h100-sxm")
    assert "matrix_unaligned" not in plain.efficiency
    a, b = _linear_fwd_s(50257, plain), _linear_fwd_s(50264, plain)
    assert a["pred_fwd_s"] / b["pred_fwd_s"] == pytest.approx(50257 / 50264, rel=0.01)


def test_matrix_unaligned_is_a_fraction(tmp_path):
    with pytest.raises(UserError, match="matrix_unaligned"):
        load_system(_spec_with(tmp_path, matrix_unaligned=1.5))


def test_calibration_fits_the_unaligned_fraction_by_hand():
    """Two shapes, forward and backward each timed unaligned (perfcheck.calibrate.cases.
    alignment_cases). The bf16 matmuls run at 0.8 of the 989.4 TFLOP/s peak at every size, so the model
    times the aligned twin's F FLOPs at F / (0.8 x 989.4e12). Factor = model twin time / measured
    unaligned time = rate_u / (0.8 x 989.4e12) x F_twin / F_u:
    fwd 8192x768x50257 at 100 TFLOP/s: 0.12634 x 50264/50257; 8192x4096x4097 at 300: 0.37904 x 4104/4097;
    median of two = their mean. bwd (both GEMMs) at 200 and 400 TFLOP/s likewise."""
    import pandas as pd
    from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS, build_spec

    stamp = "measured by perfcheck calibrate on testhost (test GPU), 2026-01-01 00:00 UTC, torch 2.13.0"
    peak = 0.8 * 989.4e12

    def row(kind, label, seconds, dtype="fp32", m=0, k=0, n=0, flops=0.0, nbytes=0.0):
        return {"kind": kind, "label": label, "dtype": dtype, "m": m, "k": k, "n": n, "flops": flops,
                "bytes": nbytes, "world_size": 1, "seconds": seconds, "seconds_min": seconds, "seconds_max": seconds,
                "repeats": 5, "iters": 1, "flops_per_s": flops / seconds if flops else math.nan,
                "bytes_per_s": nbytes / seconds if nbytes else math.nan, "busbw_bytes_per_s": math.nan}

    def case(label, phase, m, k, n, rate):
        width = n if label == "unaligned" else -(-n // 8) * 8
        flops = (2.0 if phase == "fwd" else 4.0) * m * k * width
        return row("gemm_align", f"{label} {phase} {m}x{k}x{n}", flops / rate, "bf16", m, k, width, flops,
                   (m * k + width * k + m * width) * 2)

    def mm(n):
        return row("matmul", f"mm {n}", 2.0 * n ** 3 / peak, "bf16", n, n, n, 2.0 * n ** 3, 3 * n * n * 2)

    base = [row("launch", "op", 0.0), row("launch", "autograd", 6e-6),
            row("copy", "copy 2 GiB", 2 * 2 ** 31 / 2.9e12, nbytes=2 * 2 ** 31), mm(4096), mm(8192)]
    align = []
    for phase, (r1, r2) in (("fwd", (100e12, 300e12)), ("bwd", (200e12, 400e12))):
        align += [case("unaligned", phase, 8192, 768, 50257, r1), case("aligned", phase, 8192, 768, 50257, 600e12),
                  case("unaligned", phase, 8192, 4096, 4097, r2), case("aligned", phase, 8192, 4096, 4097, 600e12)]
    spec = build_spec("h100-sxm", pd.DataFrame(base + align, columns=list(MEASUREMENT_COLUMNS)), peaks="base",
                      stamp=stamp, kind="gpu")
    want = {"matrix_unaligned": (100e12 / peak * 50264 / 50257 + 300e12 / peak * 4104 / 4097) / 2,
            "matrix_unaligned_bwd": (200e12 / peak * 50264 / 50257 + 400e12 / peak * 4104 / 4097) / 2}
    for key, value in want.items():
        assert spec.efficiency[key] == pytest.approx(value, rel=1e-3), key
        assert spec.sources[f"efficiency.{key}"].startswith(stamp)
    plain = build_spec("h100-sxm", pd.DataFrame(base, columns=list(MEASUREMENT_COLUMNS)), peaks="base",
                       stamp=stamp, kind="gpu")
    assert "matrix_unaligned" not in plain.efficiency


def test_backward_uses_its_own_factor(tmp_path):
    """matrix_unaligned_bwd = 0.5 with matrix_unaligned = 0.25: backward 2x, forward 4x the twin."""
    spec = _spec_with(tmp_path, matrix_unaligned=0.25, matrix_unaligned_bwd=0.5)
    slow, twin = _linear_fwd_s(50257, spec), _linear_fwd_s(50264, spec)
    assert 3.7 < slow["pred_fwd_s"] / twin["pred_fwd_s"] < 4.0
    assert 1.85 < slow["pred_bwd_s"] / twin["pred_bwd_s"] < 2.0

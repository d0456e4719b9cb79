"""h100-sxm's matrix_shape_curve and matrix_sustained are the measurement file's numbers (recomputed here by
hand from bench/results/h100_gemm_shapes.json, not through bench/h100_shape_curve.py)."""
import json
import statistics
from pathlib import Path

import pytest

from perfcheck.hardware.systems import load_system

RAW = json.loads((Path(__file__).resolve().parents[2] / "bench" / "results" / "h100_gemm_shapes.json").read_text())


def test_sustained_factor_is_the_long_loop_over_the_first_second():
    spec = load_system("h100-sxm")
    assert spec.efficiency["matrix_sustained"] == pytest.approx(RAW["sustained_last5"] / RAW["sustained_first"], abs=5e-4)
    assert "h100_gemm_shapes.json" in spec.sources["efficiency.matrix_sustained"]


def test_shape_curve_points_are_the_medians_of_the_measured_ratios():
    ref = RAW["ref8192"]
    curve = dict(load_system("h100-sxm").matrix_shape_curve)
    assert "h100_gemm_shapes.json" in load_system("h100-sxm").sources["matrix_shape_curve"]
    # head dim 128: logits and attend at 4 and 8 heads; 96 and 160: one of each
    for q in (96, 128, 160):
        vals = [v / ref for k, v in RAW.items() if k.startswith((f"logits_q{q}_", f"attend_q{q}_"))]
        assert curve[q] == pytest.approx(statistics.median(vals), abs=5e-4)
    # smallest dimension 768: only out_proj of h = 6144 at t = 8, (2048, 768, 6144)
    assert curve[768] == pytest.approx(RAW["out_h6144_t8"] / ref, abs=5e-4)
    # 1024: out_proj of h = 8192 at t = 8 and of h = 4096 at t = 4, (2048, 1024, h)
    assert curve[1024] == pytest.approx(statistics.median([RAW["out_h8192_t8"] / ref, RAW["out_h4096_t4"] / ref]),
                                        abs=5e-4)
    assert curve[8192] == 1.0  # the reference itself
    assert list(curve) == sorted(curve)


"""a100-80gb-sxm's matrix_shape_curve and matrix_sustained are the H100 measurement transferred as
bench/a100_shape_curve.py says (recomputed here by hand from h100-sxm's fields and bench/results/a100_attention.json,
not through that script): projection ratios unchanged, attention ratios ** alpha, the sustained factor as is."""
import json
from pathlib import Path

import pytest

from perfcheck.hardware.systems import load_system

ALPHA = json.loads((Path(__file__).resolve().parents[2] / "bench" / "results" / "a100_attention.json").read_text())[
    "alpha"]


def test_a100_curve_is_the_h100_curve_with_attention_ratios_to_alpha():
    h100, a100 = dict(load_system("h100-sxm").matrix_shape_curve), dict(load_system("a100-80gb-sxm").matrix_shape_curve)
    assert sorted(a100) == sorted(h100)
    for head_dim in (96, 128, 160):  # the attention score products' smallest dimension
        assert a100[head_dim] == pytest.approx(h100[head_dim] ** ALPHA, abs=1e-4)
        assert a100[head_dim] > h100[head_dim]  # an A100's smaller tiles lose less on them
    for dim in (768, 1024, 1536, 2048, 8192):  # the projections, unchanged
        assert a100[dim] == h100[dim]


def test_a100_sustained_factor_and_sources_say_transferred():
    a100, h100 = load_system("a100-80gb-sxm"), load_system("h100-sxm")
    assert a100.efficiency["matrix_sustained"] == h100.efficiency["matrix_sustained"]
    for field in ("matrix_shape_curve", "efficiency.matrix_sustained"):
        assert "transferred from h100-sxm" in a100.sources[field]

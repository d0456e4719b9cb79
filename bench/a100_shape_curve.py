"""The a100-80gb-sxm spec's ``matrix_shape_curve`` and ``efficiency.matrix_sustained``: what GEMMs do inside
training on an A100, transferred from the H100 measurement shipped in h100-sxm.json.

    python bench/a100_shape_curve.py          # prints the two fields as a100-80gb-sxm.json carries them

No A100 GEMM-shape measurement was available to the project (no A100 lent; the public A100 tables give large
square products only, the MAMF figure behind efficiency.matrix). What is transferred, and how:

- the projection GEMMs' ratios (smallest dimension 768-8192 -> rate / the 8192^3 product's) as measured on the
  H100 (bench/h100_shape_curve.py on bench/results/h100_gemm_shapes.json), unchanged: a transformer layer's GEMMs
  at 2048 tokens lose their wave and tile quantisation on either card, an assumption this file states;
- the attention score products' ratios (smallest dimension = the head dim, 96-160), raised to ``alpha``: the H100's
  large tiles suit those small products worse than an A100's, and ``alpha`` is taken from public measurements of
  exactly those products on both cards (bench/a100_attention.py -> bench/results/a100_attention.json), not fitted
  to any training run;
- the sustained factor (a 40-second GEMM loop / its first second: power and clock limits), the H100 SXM's, for the
  A100 SXM's like-for-like power-limited boost clock (an assumption; a PCIe A100 is not given it).

tests/hardware/test_a100_training_data.py recomputes both by hand; bench/published_runs.py scores the shipped spec.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from a100_attention import shipped_alpha  # noqa: E402  (bench/results/a100_attention.json's alpha)

#: curve points under this smallest dimension are the attention score products' head dims (96-160)
ATTENTION_DIMS_BELOW = 768


def fields(alpha: float = None) -> dict:
    """{"matrix_shape_curve": [[dim, ratio], ...], "efficiency.matrix_sustained": f} for the A100 at ``alpha``
    (default: the shipped one)."""
    from perfcheck.hardware.systems import load_system

    alpha = shipped_alpha() if alpha is None else alpha
    h100 = load_system("h100-sxm")
    curve = {float(d): (f ** alpha if d < ATTENTION_DIMS_BELOW else f) for d, f in h100.matrix_shape_curve}
    return {"matrix_shape_curve": [[d, round(f, 4)] for d, f in sorted(curve.items())],
            "efficiency.matrix_sustained": h100.efficiency["matrix_sustained"]}


def main():
    print(json.dumps(fields()))


if __name__ == "__main__":
    main()

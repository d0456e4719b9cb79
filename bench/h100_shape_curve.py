"""The h100-sxm spec's ``matrix_shape_curve`` and ``efficiency.matrix_sustained``, derived from a measurement.

    python bench/h100_shape_curve.py          # prints the two fields as they stand in h100-sxm.json

Source: bench/results/h100_gemm_shapes.json, bench/gemm_shapes_gpu.py's output on one H100 80GB HBM3
(fp16 cuBLAS, torch 2.11, CUDA 13, 2026-11-26): the per-GPU GEMMs of Megatron transformer layers at
s = 2048 (qkv, out, fc1, fc2, fc1's weight gradient, fc2's input gradient for h = 2304..25600 at their
tensor-parallel size) and the attention score products (2048 x q) @ (q x 2048) and (2048 x 2048) @
(2048 x q) of head dims q = 96, 128, 160, each timed against the 8192^3 reference product.

- ``matrix_shape_curve``: smallest GEMM dimension -> the median of (shape's rate / reference rate) over
  the shapes with that smallest dimension, plus (8192, 1.0): the reference itself. ``roofline.shape_factor``
  interpolates it in log(dimension) and clamps it at its ends.
- ``matrix_sustained``: the mean rate over the last 5 s of a 40-second loop of the reference / its
  first second (power and clock limits under a long GEMM load).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "bench" / "results" / "h100_gemm_shapes.json"
#: (hidden, tensor-parallel size) of the measured projection shapes (the published runs' layouts)
SHAPES = ((2304, 1), (3072, 2), (4096, 4), (6144, 8), (8192, 8), (12288, 8), (16384, 8), (20480, 8), (25600, 8))
TOKENS = 2048
REFERENCE_DIM = 8192


def projection_shapes(h: int, t: int) -> dict:
    """(m, k, n) of one layer's projection GEMMs on one GPU at ``TOKENS`` tokens (Megatron's column/row split)."""
    T = TOKENS
    return {"qkv": (T, h, 3 * h // t), "out": (T, h // t, h), "fc1": (T, h, 4 * h // t),
            "fc2": (T, 4 * h // t, h), "fc1_dw": (h, T, 4 * h // t), "fc2_dx": (T, h, 4 * h // t)}


def ratios_by_min_dim(raw: dict) -> dict:
    """{smallest dimension: [rate / reference, ...]} over every measured shape."""
    ref, out = raw["ref8192"], {}
    for h, t in SHAPES:
        for name, mkn in projection_shapes(h, t).items():
            out.setdefault(min(mkn), []).append(raw[f"{name}_h{h}_t{t}"] / ref)
    for key, rate in raw.items():
        if key.startswith(("logits_q", "attend_q")):
            q = int(key.split("_q", 1)[1].split("_", 1)[0])  # the head dim is the products' smallest dimension
            out.setdefault(q, []).append(rate / ref)
    return out


def shape_curve(raw: dict) -> list:
    """[[smallest dimension, median ratio], ...] in increasing dimension, ending at the reference (8192, 1.0)."""
    curve = [[float(d), round(statistics.median(v), 3)] for d, v in sorted(ratios_by_min_dim(raw).items())]
    return curve + [[float(REFERENCE_DIM), 1.0]]


def sustained(raw: dict) -> float:
    return round(raw["sustained_last5"] / raw["sustained_first"], 3)


def main():
    raw = json.loads(MEASURED.read_text())
    print(json.dumps({"matrix_shape_curve": shape_curve(raw), "efficiency.matrix_sustained": sustained(raw)}))


if __name__ == "__main__":
    main()

"""GEMMs whose output rows are far from the square shapes': a wide output (an LM head: tokens x hidden -> vocabulary,
``matrix_wide_curve``) and a narrow one (rows of a few elements: a CPU convolution's per-sample GEMMs over few
pixels, a Linear to few outputs, ``matrix_narrow_curve``): the factors calibration measured
(perfcheck/calibrate/fit_wide.py) that ``roofline.op_device_times`` multiplies into a GEMM's rate."""
from __future__ import annotations

import numpy as np

from perfcheck.predict.cold_curves import log_curve_at


#: A GEMM's output is *wide* when its width n is at least this many times its other dimensions (m, k): the shape of
#: an LM head (tokens x hidden -> vocabulary); from 16x up a CPU's rate fell below its FLOPs curve (128 x 128 -> n:
#: 94 GFLOP/s at n = 2048, 84 at 8192, 53 at 32768 on the project's AMD VM; bench/results/cache_levels.md, table 2).
WIDE_RATIO = 16


def wide_factors(system, gemms, phase: str) -> np.ndarray:
    """Per op, the ``matrix_wide_curve[phase]`` factor (log-interpolated in n, clamped at its ends) for a GEMM whose
    output is wide (``gemms``: ``gemm_dims`` tuples, None for other ops; n >= WIDE_RATIO x max(m, k)); 1 for the
    others and on a spec without the curve. The backward takes the curve calibration measured for the same layer's
    backward (both gradients), keyed by the forward's n."""
    curve = (getattr(system, "matrix_wide_curve", {}) or {}).get(phase)
    out = np.ones(len(gemms))
    if not curve:
        return out
    for i, g in enumerate(gemms):
        if isinstance(g, tuple) and len(g) >= 4 and g[3] >= WIDE_RATIO * max(g[1], g[2]):
            out[i] = float(log_curve_at(curve, g[3]))
    return out


#: Output row length from which the shape curve alone prices a GEMM (``matrix_narrow_curve`` reaches 1.0 there): the
#: shape curve's own anchor on the project's machines (a square 128^3 product).
NARROW_END = 128


def narrow_factors(system, rows_n, phase: str = "fwd", matmul=None) -> np.ndarray:
    """Per op, the factor of ``matrix_narrow_curve`` (f, log-interpolated, clamped at its ends) at the op's GEMM output
    row length (``rows_n``: the op table's ``gemm_n``, NaN for an op without GEMMs) where it is under ``NARROW_END``;
    1 elsewhere and on a spec without the curve. In the backward only the GEMM that again writes rows of n is
    narrow: a per-sample convolution's input gradient (W^T @ dY, rows of its pixels) is, its weight gradient (dY @
    cols^T, a sum over the pixels) is not: the two GEMMs, of equal FLOPs, run at 2 / (1/f + 1); a matmul's backward
    GEMMs (``matmul``: True per op) write rows of m and k: 1. On the project's AMD VM, rows of 9: C = A @ B 0.43 ms,
    the same FLOPs summed over 9 (1024 x 9 @ 9 x 256) 0.08 ms; tv_shufflenet's conv5 backward 1.78 ms measured."""
    curve = getattr(system, "matrix_narrow_curve", ()) or ()
    n = np.asarray(rows_n, dtype=float)
    out = np.ones(len(n))
    if not curve:
        return out
    is_mm = np.zeros(len(n), dtype=bool) if matmul is None else np.asarray(matmul, dtype=bool)
    for i, v in enumerate(n):
        if v == v and v < NARROW_END:
            f = float(log_curve_at(curve, v))
            out[i] = f if phase == "fwd" else (1.0 if is_mm[i] else 2.0 / (1.0 / f + 1.0))
    return out

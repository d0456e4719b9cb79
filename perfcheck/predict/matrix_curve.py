"""A GEMM's efficiency by kernel size for any dtype, from the size curve calibration measured in one dtype.

``perfcheck calibrate`` fits ``matrix_efficiency_curve`` (FLOPs per kernel -> rate / peak) on the reference
dtype's matmuls (``matrix_efficiency_curve_dtype``: bf16 on a GPU, fp32 on a CPU) and only a flat large-GEMM
efficiency for the others (``efficiency.matrix_<dtype>``). A small GEMM's time is mostly a per-kernel floor that
does not depend on the dtype (an H200's 128^3 product: 13.6 us in bf16, 13.3 in fp32, 10.3 in tf32), so scaling
the reference curve by the flat efficiencies' ratio, as a fraction of the *other* dtype's peak, priced an fp32
128^3 product at the bf16 curve's 0.0006 x the fp32 peak: ~100 us on an H200, 7x its measured time (the peaks
are 989 and 67 TFLOP/s).

Model, derived: the reference dtype's time for a kernel of F FLOPs splits into the time its flat rate needs and
the rest, the size-dependent floor:
    t_ref(F) = F / (P_r c(F))                 c: the curve, P_r: the reference's peak
    floor(F) = t_ref(F) - F / (P_r phi_r)     phi_r: the reference's flat efficiency (``efficiency.matrix``)
and another dtype runs the same floor plus its own flat rate's time:
    t_d(F) = floor(F) + F / (P_d phi_d)
so its efficiency (F / (P_d t_d)) is
    eff_d(F) = 1 / (P_d [1 / (P_r c) - 1 / (P_r phi_r) + 1 / (P_d phi_d)])
which is c for the reference dtype itself, phi_d for a large kernel (c -> phi_r), and the reference's floor for
a small one. Checked against the H200 calibration's own fp32 rows (tests/predict/test_matrix_curve.py): 512^3
predicted 18.1 us, measured 18.5; 2048^3 325 vs 342. ``matrix_sustained`` multiplies the result, as before.
"""
from __future__ import annotations

import numpy as np

from perfcheck.hardware.systems import normalize_dtype


def curve_at(curve, flops_per_kernel) -> np.ndarray:
    """The curve's efficiency at ``flops_per_kernel``, interpolated linearly in log(FLOPs), clamped at its ends."""
    xs = np.log(np.array([p[0] for p in curve]))
    ys = np.array([p[1] for p in curve])
    return np.interp(np.log(np.maximum(np.asarray(flops_per_kernel, dtype=float), 1.0)), xs, ys)


def size_efficiency(system, dtype, flops_per_kernel) -> np.ndarray:
    """Fraction of ``dtype``'s matrix peak a kernel of ``flops_per_kernel`` reaches by the size curve (module
    docstring); a spec whose curve names no dtype (older files) scales it by the flat efficiencies' ratio."""
    eff = system.efficiency
    sustained = eff.get("matrix_sustained", 1.0)
    c = curve_at(system.matrix_efficiency_curve, flops_per_kernel)
    ref = getattr(system, "matrix_efficiency_curve_dtype", "")
    d = normalize_dtype(dtype)
    phi_d = eff.get(f"matrix_{d}", eff["matrix"])
    if not ref or d == ref:
        return c * (phi_d / eff["matrix"]) * sustained
    p_r, p_d = system.matrix_peak(ref), system.matrix_peak(d)
    phi_r = eff.get(f"matrix_{ref}", eff["matrix"])
    per_flop = 1.0 / (p_r * np.maximum(c, 1e-12)) - 1.0 / (p_r * phi_r) + 1.0 / (p_d * phi_d)
    return sustained / (p_d * np.maximum(per_flop, 1.0 / p_d))

"""The wide- and narrow-output GEMM fits (``matrix_wide_curve``, ``matrix_narrow_curve``) of ``perfcheck calibrate``:
their cases are in ``wide_cases``, the estimator reads them in ``predict/gemm_shape.py``."""
from __future__ import annotations

import dataclasses

import pandas as pd

from perfcheck.calibrate import case_names as names
from perfcheck.calibrate.fit_draft import Draft, rows_of
from perfcheck.predict import roofline
from perfcheck.predict.gemm_shape import NARROW_END


def matrix_wide(d: Draft, table: pd.DataFrame, mm_fixed: float):
    """``matrix_wide_curve``: per phase, ((n, factor), ...) from ``wide_cases.matmul_wide_cases`` (F.linear to n
    outputs, forward and backward): ``_factor`` of each case (one GEMM forward, two backward), anchored at 1.0 for
    n = ``roofline.WIDE_RATIO`` x the case's other dimensions, where the wide rule starts (F.linear 128 x 128 -> 2048
    ran at its square-GEMM rate on the project's AMD VM). The backward's time includes the autograd engine's start
    (tens of us against milliseconds of GEMMs)."""
    rows = rows_of(table, names.MATMUL_WIDE)
    if not len(rows) or not d.matrix.get("fp32"):
        return
    spec, curves = _spec_so_far(d), {}
    for phase, group in rows.assign(phase=rows["label"].str.split(" ").str[0]).groupby("phase"):
        kernels = 1.0 if phase == "fwd" else 2.0
        points = {float(r.n): f for r in group.itertuples(index=False)
                  if (f := _factor(spec, d, r, kernels, mm_fixed)) is not None}
        if points:
            anchor = roofline.WIDE_RATIO * max(float(group["m"].iloc[0]), float(group["k"].iloc[0]))
            points = {anchor: 1.0, **{n: f for n, f in points.items() if n > anchor}}
            curves[phase] = tuple(sorted(points.items()))
    if curves:
        d.fields["matrix_wide_curve"] = curves
        d.sources["matrix_wide_curve"] = (
            f"{d.stamp}: F.linear of {int(rows['m'].iloc[0])} x {int(rows['k'].iloc[0])} to n outputs, forward and "
            f"backward (both gradients): the FLOPs and shape curves' compute time over the measured time less the "
            f"tiny-op time, by n (1.0 at n = {roofline.WIDE_RATIO} x the other dimensions)")


def matrix_narrow(d: Draft, table: pd.DataFrame, mm_fixed: float):
    """``matrix_narrow_curve``: ((n, factor), ...) from ``wide_cases.matmul_narrow_cases`` (C = A @ B with rows of n):
    ``_factor`` of each case under ``gemm_shape.NARROW_END``, anchored at 1.0 there (from there on the shape curve
    alone applies)."""
    rows = rows_of(table, names.MATMUL_NARROW)
    if not len(rows) or not d.matrix.get("fp32"):
        return
    spec = _spec_so_far(d)
    points = {float(r.n): f for r in rows.itertuples(index=False)
              if float(r.n) < NARROW_END and (f := _factor(spec, d, r, 1.0, mm_fixed)) is not None}
    if points:
        d.fields["matrix_narrow_curve"] = tuple(sorted({**points, float(NARROW_END): 1.0}.items()))
        d.sources["matrix_narrow_curve"] = (
            f"{d.stamp}: torch.mm of {int(rows['m'].iloc[0])} x {int(rows['k'].iloc[0])} by k x n, output rows of n: "
            f"the FLOPs and shape curves' compute time over the measured time less the tiny-op time, by n (1.0 at "
            f"n = {NARROW_END})")


def _spec_so_far(d: Draft):
    """The spec the matmul fit has built: the draft's peaks, efficiencies and FLOPs and shape curves."""
    return dataclasses.replace(d.base, matrix_flops_per_s=d.matrix, efficiency=d.eff, **{
        k: v for k, v in d.fields.items() if k in ("matrix_efficiency_curve", "matrix_shape_curve")})


def _factor(spec, d: Draft, r, kernels: float, mm_fixed: float):
    """A GEMM case's rate over the one ``spec``'s curves give (compute time of its FLOPs in ``kernels`` GEMMs, the
    shape curve at its smallest dimension, over the measured time less the tiny-op time and ``mm_fixed`` per GEMM),
    in [0.001, 1]; None where the case read nothing above its fixed costs."""
    compute = float(roofline.compute_time_s(float(r.flops), 0.0, spec, "fp32", kernels=kernels,
                                            min_dim=min(float(r.m), float(r.k), float(r.n))))
    kernel_s = float(r.seconds) - d.op_s - kernels * mm_fixed
    return float(round(max(min(compute / kernel_s, 1.0), 1e-3), 4)) if kernel_s > 0 else None

"""Operands evicted from the core's L2 (a CPU training step's working set beyond it): the calibrated factors by which
``perfcheck.predict.roofline`` slows a matrix product (``matrix_cold_curve``) and a memory-bound op's memory term
(``memory_cold_curve``), and the L2 size beyond which ``perfcheck.predict.reuse`` counts an operand as evicted.
Why and how they are measured: bench/results/cold_operands.md, bench/results/memory_cold.md.
"""
from __future__ import annotations

import numpy as np

from perfcheck.hardware.systems import spec_of


def gemm_cold_blend(system, flops_per_kernel, cold):
    """Efficiency multiplier of GEMMs with an evicted operand (``cold`` > 0, ``predict.reuse``): the
    ``cold_factor`` at their FLOPs per kernel; 1 for the others. A flag, not a blend by the far share: with only
    the weight evicted a 17-50 MFLOP linear ran 1.16-1.44x its tight-loop time, more than the weight's share of the
    bytes gives (the packed weight panel stalls the whole kernel; predict/reuse.py)."""
    cold = np.asarray(cold, dtype=float)
    if not np.any(cold > 0):
        return 1.0
    return np.where(cold > 0, cold_factor(system, flops_per_kernel), 1.0)


def cold_factor(system, flops_per_kernel):
    """The ``matrix_cold_curve`` multiplier at ``flops_per_kernel`` (interpolated in log(FLOPs), clamped at its
    ends; 1 without a curve): a GEMM whose operands were evicted from L2 runs this fraction of its tight-loop
    rate (0.56-0.78 at 17-67 MFLOP, 1.0 at 2.4 GFLOP on the project's Xeon: bench/results/cold_operands.md)."""
    return log_curve_at(spec_of(system).matrix_cold_curve, flops_per_kernel)


#: Matrix products whose rate the ``matrix_cold_curve`` scales when the step is cold: torch.mm / F.linear's kernels
#: and their batched forms (a convolution's class efficiencies are calibrated apart and keep their own).
COLD_GEMMS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_addmm_activation")


def cold_cache_bytes(system) -> float:
    """The reuse distance beyond which an operand counts as evicted: the core's L2 that calibration recorded
    (``calibration.l2_bytes``) where the spec has a ``matrix_cold_curve`` or a ``memory_cold_curve``; 0 (nothing is
    cold) otherwise (a datasheet spec, a GPU)."""
    spec = spec_of(system)
    l2 = float((spec.calibration or {}).get("l2_bytes", 0) or 0)
    return l2 if (spec.matrix_cold_curve or spec.memory_cold_curve) else 0.0


def far_data(system) -> tuple:
    """``(l3_bytes, residency_s)`` for the far-data rule (``reuse.far_shares``, ``roofline.device_times``'s
    ``far_memory``): a CPU spec whose calibration ran the far cases (``host.op_cold_far_s`` and
    ``calibration.l3_bytes``: an L3 of at most 64 MiB) and measured the L3's residency (0: by distance only);
    ``(0, 0)`` (no op's data is far) otherwise: a GPU, a datasheet spec, a machine whose L3 holds the step."""
    spec = spec_of(system)
    l3 = float((spec.calibration or {}).get("l3_bytes", 0) or 0)
    host = dict(spec.host or {})
    if spec.kind != "cpu" or l3 <= 0 or host.get("op_cold_far_s") is None:
        return 0.0, 0.0
    return l3, float(host.get("l3_residency_s", 0.0) or 0.0)


def l3_loss(system):
    """``age -> fraction`` (0-1): how much of an eviction's refetch cost a byte the L3 held ``age`` seconds ago (nothing
    touched since) pays, for the far-data rules (``reuse.far_shares``, ``host.optimizer_far_share``): the L3's loss
    curve measured by calibration (``calibration.l3_lost``: ``loss_curve``), else the threshold at
    ``host.l3_residency_s`` (a spec fitted before the curve was kept), else 0 (no decay measured: distance only)."""
    spec = spec_of(system)
    l3, residency = far_data(spec)
    if l3 <= 0:
        return lambda age: 0.0
    return loss_curve((spec.calibration or {}).get("l3_lost", ()), residency)


def loss_curve(points, residency_s: float = 0.0):
    """``age -> fraction`` from ``points`` ((seconds asleep, fraction of an eviction's cost lost), ...: calibration's
    residency cases, ``fit_cold.l3_residency``): linear in log(age) through (a tenth of the first sleep, 0) and the
    points, each at least the one before (a later re-read cannot have lost less), and beyond the last sleep on the
    last segment's line up to 1 (what an L3 still held at the last sleep it keeps losing; an eviction is 1).
    Without points: 1 past ``residency_s`` (> 0), else 0. Why a curve and not the threshold alone: a shared L3 forgets
    gradually (an 8 MiB buffer's re-read on the project's AMD VM, as a share of an eviction's cost: 0.32-0.55
    after 2 ms, 0.54-1 after 8 ms over four calibrations), and the threshold put a 2 ms step's optimizer all in
    the L3 or all beyond it as one calibration's half-life came out 1.6 ms and another's 2.5 (wide & deep's SGD
    step predicted 0.58 or 1.04 ms; measured 0.96-1.69)."""
    if not points:
        if residency_s and residency_s > 0:
            return lambda age: 1.0 if age > residency_s else 0.0
        return lambda age: 0.0
    pts = sorted((float(w), float(f)) for w, f in points)
    xs = np.log([pts[0][0] / 10.0] + [w for w, _ in pts])
    ys = np.maximum.accumulate(np.clip([0.0] + [f for _, f in pts], 0.0, 1.0))
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])  # beyond the last sleep: the last segment's trend, up to 1

    def lost(age):
        if age <= 0:
            return 0.0
        x = np.log(age)
        return float(np.interp(x, xs, ys)) if x <= xs[-1] else float(min(1.0, ys[-1] + slope * (x - xs[-1])))
    return lost


def memory_cold_blend(system, bytes_per_kernel, cold):
    """``1 + cold x (1 / memory_cold_factor - 1)``: the memory term's multiplier for a ``cold`` share of far bytes."""
    cold = np.asarray(cold, dtype=float)
    if not np.any(cold > 0):
        return 1.0
    return 1.0 + cold * (1.0 / memory_cold_factor(system, bytes_per_kernel) - 1.0)


def memory_cold_factor(system, bytes_per_kernel):
    """The ``memory_cold_curve`` value at ``bytes_per_kernel`` (interpolated in log(bytes), clamped at its ends; 1
    without a curve): a memory-bound kernel's memory term with its operands evicted from L2 runs at this fraction of
    its tight-loop rate (``calibrate.fit._memory_cold`` derives it: m / (m + the measured extra cold time))."""
    return log_curve_at(spec_of(system).memory_cold_curve, bytes_per_kernel)


def log_curve_at(curve, x):
    """A ((x, factor), ...) curve read at ``x``: linear in log(x), clamped at its ends; 1 without a curve or x."""
    if not curve or x is None:
        return 1.0
    xs = np.log(np.array([p[0] for p in curve]))
    ys = np.array([p[1] for p in curve])
    return np.interp(np.log(np.maximum(np.asarray(x, dtype=float), 1.0)), xs, ys)[()]

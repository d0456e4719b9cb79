"""The slow-module rules of the diagnoses, in priority order (``RULES``; first match wins): each a name, a
description, a vectorised ``match`` over the reconciled rows of one phase and an ``evidence`` sentence
that quotes the numbers. What each rule means and why it sits where it does: ``analysis.findings``."""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import pandas as pd

from perfcheck.analysis import page_faults
from perfcheck.analysis.thresholds import Context
from perfcheck.units import fmt_bytes, fmt_count, fmt_gap, fmt_pct, fmt_rate, fmt_time


def phase_col(rows: pd.DataFrame, name: str, phase: str) -> np.ndarray:
    """Column ``name`` with ``{p}`` replaced by the phase, as float (NaN where absent)."""
    col = name.format(p=phase)
    if col not in rows:
        return np.full(len(rows), np.nan)
    return rows[col].to_numpy(dtype=float, na_value=np.nan)


def _per_call(rows, phase):
    calls = rows["calls"].to_numpy(dtype=float, na_value=np.nan) if "calls" in rows else np.ones(len(rows))
    calls = np.where(np.isfinite(calls) & (calls > 0), calls, 1.0)
    return phase_col(rows, "meas_{p}_s", phase) / calls, phase_col(rows, "pred_{p}_s", phase) / calls


@dataclasses.dataclass(frozen=True)
class Rule:
    """One diagnosis: ``match(rows, phase, ctx) -> bool array``; ``evidence(row, phase, ctx) -> str``."""

    name: str
    description: str
    match: Callable[[pd.DataFrame, str, Context], np.ndarray]
    evidence: Callable[[dict, str, Context], str]


def _hook_match(rows, phase, ctx):
    meas, _ = _per_call(rows, phase)
    floor = ctx.thresholds.hook_floor_factor * ctx.hook_overhead_s
    no_work = phase_col(rows, "kernels_{p}", phase) == 0  # the profiler saw nothing run in the module
    return (meas <= floor) | (no_work & (meas > 0))


def _hook_evidence(r, phase, ctx):
    calls = max(float(r.get("calls") or 1), 1.0)
    per_call = r[f"meas_{phase}_s"] / calls
    if r.get(f"kernels_{phase}") == 0:
        return f"no kernel or op ran in the module; {fmt_time(per_call)} per call is hook and dispatch time"
    return (f"{fmt_time(per_call)} per call is at the hook floor "
            f"({ctx.thresholds.hook_floor_factor:g} x {fmt_time(ctx.hook_overhead_s)} per instrumented call, "
            f"{ctx.hook_overhead_source})")


def _per_kernel(rows, phase):
    """Measured and predicted time per kernel (per call where the kernel count is unknown or 0), and the count."""
    k = phase_col(rows, "kernels_{p}", phase)
    calls = rows["calls"].to_numpy(dtype=float, na_value=np.nan) if "calls" in rows else np.ones(len(rows))
    n = np.where(np.isfinite(k) & (k > 0), k, np.where(np.isfinite(calls) & (calls > 0), calls, 1.0))
    return phase_col(rows, "meas_{p}_s", phase) / n, phase_col(rows, "pred_{p}_s", phase) / n


def _launch_match(rows, phase, ctx):
    t = ctx.thresholds
    meas, pred = _per_kernel(rows, phase)
    bound = rows[f"bound_{phase}"].astype(str).to_numpy() if f"bound_{phase}" in rows else np.full(len(rows), "")
    floor = ctx.launch_floor()
    # near the floor: without a system there is no floor to compare with, and the tiny-work test alone decides
    near = meas <= t.launch_floor_factor * floor if np.isfinite(floor) and floor > 0 else True
    return (meas <= t.tiny_s) & ((pred <= t.tiny_pred_s) | (bound == "overhead")) & near


def _launch_evidence(r, phase, ctx):
    calls = max(float(r.get("calls") or 1), 1.0)
    k = r.get(f"kernels_{phase}")
    has_k = k is not None and k == k and k > 0
    per = (f"{k / calls:.3g} kernels/ops per call, {fmt_time(r[f'meas_{phase}_s'] / k)} measured per kernel; "
           if has_k else "")
    launch = f"; launch floor {fmt_time(ctx.system.launch_overhead_s)} per kernel" if ctx.system is not None else ""
    return (f"tiny work: {per}{fmt_time(r[f'meas_{phase}_s'] / calls)} measured vs "
            f"{fmt_time(r[f'pred_{phase}_s'] / calls)} predicted per call{launch}; fixed per-kernel costs dominate")


def _comm_match(rows, phase, ctx):
    meas = phase_col(rows, "meas_{p}_s", phase)
    comm_k = phase_col(rows, "comm_kernel_{p}_s", phase)
    no_table = ~np.isfinite(phase_col(rows, "kernel_{p}_s", phase))
    comm_bytes = phase_col(rows, "comm_{p}_bytes", phase)
    waited = phase_col(rows, "meas_comm_wait_{p}_s", phase)
    return ((comm_k >= ctx.thresholds.comm_share * meas) | (waited >= ctx.thresholds.comm_share * meas)
            | (no_table & (comm_bytes > 0)))


def _comm_evidence(r, phase, ctx):
    parts = []
    ck = r.get(f"comm_kernel_{phase}_s")
    if ck == ck and ck is not None and ck > 0:
        parts.append(f"communication kernels {fmt_time(ck)} of {fmt_time(r[f'meas_{phase}_s'])} measured "
                     f"({fmt_pct(ck / r[f'meas_{phase}_s'])})")
    w = r.get(f"meas_comm_wait_{phase}_s")
    if w is not None and w == w and w > 0:
        parts.append(f"waits on collectives {fmt_time(w)} of {fmt_time(r[f'meas_{phase}_s'])} measured "
                     f"({fmt_pct(w / r[f'meas_{phase}_s'])})")
    b = r.get(f"comm_{phase}_bytes")
    if b == b and b:
        parts.append(f"{fmt_bytes(b)} {r.get('comm_kind') or 'collective'} predicted")
    own = r.get(f"comm_waits_{phase}")
    if own:
        parts.append(own)
    return "; ".join(parts) + "; communication not overlapped with compute"


def _unmodeled_match(rows, phase, ctx):
    ops = rows["unmodeled_ops"].fillna("").astype(str).to_numpy() if "unmodeled_ops" in rows else np.full(len(rows), "")
    irregular = phase_col(rows, "irregular_kernel_{p}_s", phase)
    kernel = phase_col(rows, "kernel_{p}_s", phase)
    return (ops != "") | ((irregular >= ctx.thresholds.irregular_share * kernel) & (irregular > 0))


def _unmodeled_evidence(r, phase, ctx):
    parts = []
    if r.get("unmodeled_ops"):
        parts.append(f"ops costed by bytes only (no formula): {r['unmodeled_ops']}")
    irr, kern = r.get(f"irregular_kernel_{phase}_s"), r.get(f"kernel_{phase}_s")
    if irr == irr and irr and kern:
        names = r.get(f"irregular_kernels_{phase}") or "scatter/gather/index"
        parts.append(f"irregular-access kernels ({names}) take {fmt_pct(irr / kern)} of kernel time, "
                     "which the roofline costs as streaming bytes")
    return "; ".join(parts)


def _host_match(rows, phase, ctx):
    kernel = phase_col(rows, "kernel_{p}_s", phase)
    return kernel < ctx.thresholds.host_share * phase_col(rows, "meas_{p}_s", phase)


def _host_evidence(r, phase, ctx):
    k, m = r[f"kernel_{phase}_s"], r[f"meas_{phase}_s"]
    return (f"kernels/ops run {fmt_time(k)} of {fmt_time(m)} wall time ({fmt_pct(k / m)}): "
            "the device waits for the host between kernels")


def _memory_match(rows, phase, ctx):
    bound = rows[f"bound_{phase}"].astype(str).to_numpy() if f"bound_{phase}" in rows else np.full(len(rows), "")
    bw = phase_col(rows, "achieved_bytes_{p}_per_s", phase)
    return (bound == "memory") & (bw < ctx.thresholds.roof_fraction * ctx.mem_bandwidth())


def _memory_evidence(r, phase, ctx):
    bw = r[f"achieved_bytes_{phase}_per_s"]
    peak = ctx.mem_bandwidth()
    return (f"memory-bound at {fmt_rate(bw, 'B/s')} = {fmt_pct(bw / peak)} of the {fmt_rate(peak, 'B/s')} "
            f"bandwidth roof ({fmt_bytes(r[f'bytes_{phase}'])} moved)")


def _compute_match(rows, phase, ctx):
    bound = rows[f"bound_{phase}"].astype(str).to_numpy() if f"bound_{phase}" in rows else np.full(len(rows), "")
    rate = phase_col(rows, "achieved_flops_{p}_per_s", phase)
    return (bound == "compute") & (rate < ctx.thresholds.roof_fraction * ctx.matrix_peak())


def _compute_evidence(r, phase, ctx):
    rate, peak = r[f"achieved_flops_{phase}_per_s"], ctx.matrix_peak()
    return (f"compute-bound at {fmt_rate(rate)} = {fmt_pct(rate / peak)} of the {fmt_rate(peak)} matrix peak "
            f"({fmt_count(r[f'flops_{phase}'], 'FLOP')})")


def _slow_kernels_match(rows, phase, ctx):
    return phase_col(rows, "kernel_{p}_s", phase) > ctx.thresholds.gap_high * phase_col(rows, "pred_{p}_s", phase)


def _slow_kernels_evidence(r, phase, ctx):
    k, pred = r[f"kernel_{phase}_s"], r[f"pred_{phase}_s"]
    spec = ctx.system
    hint = ("" if spec is None else f"; system {spec.name!r} is an uncalibrated default: run `perfcheck calibrate`"
            if not spec.calibrated else f"; system {spec.name!r} was calibrated on other shapes or another machine")
    return (f"in the profiled step(s) the kernels/ops alone take {fmt_time(k)} per step (kernel table), "
            f"{fmt_gap(k / pred if pred else np.inf)} the predicted {fmt_time(pred)}, against "
            f"{fmt_time(r[f'meas_{phase}_s'])} measured (median over all measured steps): this device runs them "
            f"slower than the system spec says{hint}")


def _contention_match(rows, phase, ctx):
    return np.full(len(rows), bool(ctx.contention))


def _contention_evidence(r, phase, ctx):
    return f"{fmt_gap(r[f'gap_{phase}'])} slower than predicted, in a run where {ctx.contention}"


#: Slow-module rules in priority order (first match wins).
RULES = (
    Rule("contention", "the run's process waited for a CPU core (or slept) most of the time: measured times include "
                       "the wait (other processes on the machine)", _contention_match, _contention_evidence),
    Rule("hook_overhead", "measured time is the per-call hook floor (or no kernel ran): timer cost, not work",
         _hook_match, _hook_evidence),
    Rule("launch_overhead", "launch- or overhead-bound: a tiny module whose time is fixed per-call costs",
         _launch_match, _launch_evidence),
    Rule("exposed_comm", "communication kernels take a large share of the time (not overlapped)",
         _comm_match, _comm_evidence),
    Rule("unmodeled_work", "work the formulas do not cover (ops without formula, scatter/gather/index kernels)",
         _unmodeled_match, _unmodeled_evidence),
    Rule("host_bound", "kernels cover little of the wall time: gaps between kernels (host, Python, syncs)",
         _host_match, _host_evidence),
    Rule("memory_below_roof", "memory-bound and well below the bandwidth roof", _memory_match, _memory_evidence),
    Rule("compute_below_roof", "compute-bound and well below the matrix peak", _compute_match, _compute_evidence),
    Rule("slow_kernels", "the kernels themselves (the profiled steps' kernel table) take longer than predicted: the "
                         "system spec is too fast for this device", _slow_kernels_match, _slow_kernels_evidence),
)


#: Rules over the per-rank totals of a step's phases (``rec.attrs["totals"]``, one row per rank; phases fwd,
#: bwd, optim), applied by ``analysis.findings.step_findings`` whatever the modules' findings are.
STEP_RULES = (
    Rule("page_faults", "the phase ran longer than predicted and took many first-touch page faults: memory freed "
                        "and allocated again every step (zero_grad(set_to_none=True), the C allocator returning "
                        "large blocks to the OS); measured per phase, with this machine's measured cost per fault",
         page_faults.match, page_faults.evidence),
)

"""Diagnoses: one small rule per reason a measured time is far from its prediction.

Like ``torch/profiler/_pattern_matcher.py``'s ``Pattern``: every rule has a ``name``, a
``description`` and a ``match`` over the reconciled rows (``perfcheck.reconcile``), vectorised over
all modules of one phase (fwd or bwd). ``diagnose`` walks the rules in order and gives each row
with a large gap the first reason whose evidence matches, with an ``evidence`` sentence that
quotes the numbers.

A gap is *large* when ``gap = measured / predicted`` is above ``Thresholds.gap_high`` (2: the
module took more than twice the model's time) or below ``Thresholds.gap_low`` (0.5: it ran more
than twice as fast). Every threshold is a field of ``Thresholds`` with its reason below.

Rules for slow modules (gap > gap_high), first match wins:

0. contention         the run's process had under half a CPU core while it ran (the sampler's
                      median cpu_util; analysis.system_notes.run_contention): every slow module.
1. hook_overhead      measured time per call is at the hook-overhead floor, or the profiler saw no
                      kernel/op at all in the module: the number is the timer's own cost.
2. launch_overhead    launch- or overhead-bound: tiny work per kernel (measured time per kernel, or
                      per call without a kernel table, under ``tiny_s`` and within
                      ``launch_floor_factor`` x the system's launch floor; predicted per kernel under
                      ``tiny_pred_s`` or bound 'overhead'), so fixed per-kernel costs (launches,
                      dispatch, Python) are the time, not FLOPs or bytes.
3. exposed_comm       communication kernels, or waits on collectives (``meas_comm_wait_<p>_s``, from
                      collectives.csv), take ``comm_share`` of the measured time, or the module has
                      predicted collectives and no kernel table says otherwise.
4. unmodeled_work     the estimate costed some ops by bytes only (``unmodeled_ops``), or irregular
                      kernels (scatter/gather/index/sort...) take ``irregular_share`` of the kernel time.
5. host_bound         device kernels (CPU: aten ops) cover less than ``host_share`` of the measured
                      wall time: the device idles between kernels, waiting for the host.
6. memory_below_roof  predicted memory-bound, and the achieved bandwidth (predicted bytes / measured
                      time) is below ``roof_fraction`` of the datasheet bandwidth.
7. compute_below_roof predicted compute-bound, and the achieved FLOP/s is below ``roof_fraction`` of
                      the datasheet matrix peak.
8. slow_kernels       the kernel-table time alone (per profiled step) exceeds ``gap_high`` x the
                      prediction (the evidence says it is the profiled steps'): the device runs
                      the kernels slower than the system spec says (uncalibrated spec, throttling,
                      contention with other processes).
   unexplained        none of the above matched.

A run measured on another device than the spec describes (a CPU run against a GPU spec) gets
``other_device`` for every large gap, whichever way: no rule about the model applies.

Fast modules (gap < gap_low): ``measurement_artifact`` when the achieved FLOP/s is above the
datasheet matrix peak (a timer that missed work; not when the spec is a calibration whose record says
it was taken under contention: its peaks are low), else ``overestimated`` (the model is
pessimistic: too much launch overhead, or an efficiency below what this device reaches).
One-sided rows: ``not_measured`` (predicted only) and ``not_predicted`` (measured only).
Whatever the gap, a module that itself waited on collectives for ``comm_wait_share`` of its rank's
step or more gets a ``comm_wait`` finding (``comm_wait_findings``) naming the collective kind,
bytes, and the module and phase that issued it against the one that waited.
Recompute (activation checkpointing, timed and predicted apart from backward) is a third phase with
one rule, ``recompute`` (``diagnose_recompute``).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np
import pandas as pd

from perfcheck.errors import UserError
from perfcheck.hardware.calibrate.sanity import contention
from perfcheck.schema import ROOT
from perfcheck.units import fmt_bytes, fmt_count, fmt_gap, fmt_pct, fmt_rate, fmt_time

#: Default hook cost per module call when the run gives no better figure: two clock reads and the
#: Python dispatch of a pre- and post-hook. Default chosen by perfcheck from public figures for one
#: timing-enabled CUDA event record: ~2.5 us (https://github.com/NVIDIA/NVTX/issues/3) to 5.2 us with
#: a query (https://github.com/ICLDisco/parsec/pull/576); a floor, not a measurement: bench/RESULTS.md
#: (issue #15 section) measured 46-54 us of host CPU time per module call for the whole forward +
#: backward timing on a loaded shared 2-core VM (109-120 us before #15).
DEFAULT_HOOK_OVERHEAD_S = 5e-6


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Every number the diagnoses compare against, with why it has its default."""

    #: gap = measured / predicted above this is "slower than the model" (2x: beyond the 1.7-2.75x
    #: optimism of roofline models in the wild: LLM-Viewer vs TensorRT-LLM on LLaMA-7B, 1.67x throughput
    #: and 2.3x first-token latency, https://github.com/hahnyuan/LLM-Viewer/issues/4; llm-analysis at
    #: ideal efficiency vs MT-NLG's published step time, 2.5-2.75x,
    #: https://github.com/cli99/llm-analysis/tree/main/examples/megatron-turing-nlg).
    gap_high: float = 2.0
    #: gap below this is "faster than the model" (the mirror image of gap_high).
    gap_low: float = 0.5
    #: measured time per kernel (per call without a kernel table) under which the work is tiny
    #: ("tens of us": every module of JSC_Tiny, perfcheck.examples.models).
    tiny_s: float = 100e-6
    #: predicted time per kernel under which the roofline work is negligible (a few launch latencies).
    tiny_pred_s: float = 25e-6
    #: launch_overhead needs the measured time per kernel within this many launch floors (the system's
    #: ``launch_overhead_s``): at 3x the fixed cost is a third or more of each kernel's time; at 10x it is a
    #: tenth, and the other nine tenths are something else (a transformer block at 29 us per kernel against
    #: a 2.9 us floor is not launch-bound).
    launch_floor_factor: float = 3.0
    #: measured per call at or under this many hook costs is the hook floor.
    hook_floor_factor: float = 2.0
    #: kernel (or op) time under this share of the wall time means the device waits for the host.
    host_share: float = 0.5
    #: irregular kernels (scatter/gather/index/sort) above this share of kernel time dominate.
    irregular_share: float = 0.25
    #: communication kernels above this share of the measured time are exposed communication.
    comm_share: float = 0.25
    #: achieved rate under this fraction of the datasheet roof is "below the roof".
    roof_fraction: float = 0.5
    #: a rank whose step time exceeds the median over ranks by more than this fraction is a straggler.
    straggler_tolerance: float = 0.05
    #: a module's own wait on collectives at or above this share of its rank's step is a finding (the
    #: straggler tolerance's 5%: a wait that moves the step by less is within step-to-step noise here).
    comm_wait_share: float = 0.05

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not np.isfinite(v) or v < 0:
                raise UserError(f"thresholds: {f.name} must be a non-negative number, got {v!r}")
        if not self.gap_low < 1 < self.gap_high:
            raise UserError(f"thresholds: need gap_low < 1 < gap_high, got {self.gap_low} and {self.gap_high}")


@dataclasses.dataclass(frozen=True)
class Context:
    """What the rules need besides the rows: thresholds, the system's roofs, the hook floor."""

    thresholds: Thresholds = Thresholds()
    system: object = None  # a SystemSpec, or None (rules that need a roof then do not match)
    dtype: Optional[str] = None
    hook_overhead_s: float = DEFAULT_HOOK_OVERHEAD_S
    #: where ``hook_overhead_s`` came from: the run's own measured overhead (meta.json, analysis.pipeline)
    #: or the assumed default; the hook_overhead evidence quotes it
    hook_overhead_source: str = "assumed default"
    #: a sentence when the run was measured on another device than ``system`` describes
    #: (analysis.system_notes.device_mismatch): every large gap is then ``other_device``
    other_device: str = ""
    #: a sentence when the run's process waited for a core most of the time (analysis.system_notes.run_contention)
    contention: str = ""

    def launch_floor(self) -> float:
        """The spec's fixed time per kernel (``launch_overhead_s``); NaN without a system."""
        return np.nan if self.system is None else float(self.system.launch_overhead_s)

    def peak_taken_under_load(self) -> bool:
        """True when the system is a calibration whose record says it was taken under contention: its
        measured peaks are low, so a real timing above them is no artifact."""
        record = getattr(self.system, "calibration", None) if self.system is not None else None
        return bool(record) and contention(record) is not None

    def matrix_peak(self) -> float:
        if self.system is None:
            return np.nan
        if self.dtype is not None:
            return self.system.matrix_peak(self.dtype)
        return max(self.system.matrix_flops_per_s.values())

    def mem_bandwidth(self) -> float:
        return np.nan if self.system is None else self.system.mem_bandwidth_bytes_per_s


def _c(rows: pd.DataFrame, name: str, phase: str) -> np.ndarray:
    """Column ``name`` with ``{p}`` replaced by the phase, as float (NaN where absent)."""
    col = name.format(p=phase)
    if col not in rows:
        return np.full(len(rows), np.nan)
    return rows[col].to_numpy(dtype=float, na_value=np.nan)


def _per_call(rows, phase):
    calls = rows["calls"].to_numpy(dtype=float, na_value=np.nan) if "calls" in rows else np.ones(len(rows))
    calls = np.where(np.isfinite(calls) & (calls > 0), calls, 1.0)
    return _c(rows, "meas_{p}_s", phase) / calls, _c(rows, "pred_{p}_s", phase) / calls


@dataclasses.dataclass(frozen=True)
class Rule:
    """One diagnosis: ``match(rows, phase, ctx) -> bool array``; ``evidence(row, phase, ctx) -> str``."""

    name: str
    description: str
    match: Callable[[pd.DataFrame, str, Context], np.ndarray]
    evidence: Callable[[dict, str, Context], str]


# ------------------------------------------------------------------------------------ rules
def _hook_match(rows, phase, ctx):
    meas, _ = _per_call(rows, phase)
    floor = ctx.thresholds.hook_floor_factor * ctx.hook_overhead_s
    no_work = _c(rows, "kernels_{p}", phase) == 0  # the profiler saw nothing run in the module
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
    k = _c(rows, "kernels_{p}", phase)
    calls = rows["calls"].to_numpy(dtype=float, na_value=np.nan) if "calls" in rows else np.ones(len(rows))
    n = np.where(np.isfinite(k) & (k > 0), k, np.where(np.isfinite(calls) & (calls > 0), calls, 1.0))
    return _c(rows, "meas_{p}_s", phase) / n, _c(rows, "pred_{p}_s", phase) / n


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
    meas = _c(rows, "meas_{p}_s", phase)
    comm_k = _c(rows, "comm_kernel_{p}_s", phase)
    no_table = ~np.isfinite(_c(rows, "kernel_{p}_s", phase))
    comm_bytes = _c(rows, "comm_{p}_bytes", phase)
    waited = _c(rows, "meas_comm_wait_{p}_s", phase)
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
    irregular = _c(rows, "irregular_kernel_{p}_s", phase)
    kernel = _c(rows, "kernel_{p}_s", phase)
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
    kernel = _c(rows, "kernel_{p}_s", phase)
    return kernel < ctx.thresholds.host_share * _c(rows, "meas_{p}_s", phase)


def _host_evidence(r, phase, ctx):
    k, m = r[f"kernel_{phase}_s"], r[f"meas_{phase}_s"]
    return (f"kernels/ops run {fmt_time(k)} of {fmt_time(m)} wall time ({fmt_pct(k / m)}): "
            "the device waits for the host between kernels")


def _memory_match(rows, phase, ctx):
    bound = rows[f"bound_{phase}"].astype(str).to_numpy() if f"bound_{phase}" in rows else np.full(len(rows), "")
    bw = _c(rows, "achieved_bytes_{p}_per_s", phase)
    return (bound == "memory") & (bw < ctx.thresholds.roof_fraction * ctx.mem_bandwidth())


def _memory_evidence(r, phase, ctx):
    bw = r[f"achieved_bytes_{phase}_per_s"]
    peak = ctx.mem_bandwidth()
    return (f"memory-bound at {fmt_rate(bw, 'B/s')} = {fmt_pct(bw / peak)} of the {fmt_rate(peak, 'B/s')} "
            f"bandwidth roof ({fmt_bytes(r[f'bytes_{phase}'])} moved)")


def _compute_match(rows, phase, ctx):
    bound = rows[f"bound_{phase}"].astype(str).to_numpy() if f"bound_{phase}" in rows else np.full(len(rows), "")
    rate = _c(rows, "achieved_flops_{p}_per_s", phase)
    return (bound == "compute") & (rate < ctx.thresholds.roof_fraction * ctx.matrix_peak())


def _compute_evidence(r, phase, ctx):
    rate, peak = r[f"achieved_flops_{phase}_per_s"], ctx.matrix_peak()
    return (f"compute-bound at {fmt_rate(rate)} = {fmt_pct(rate / peak)} of the {fmt_rate(peak)} matrix peak "
            f"({fmt_count(r[f'flops_{phase}'], 'FLOP')})")


def _slow_kernels_match(rows, phase, ctx):
    return _c(rows, "kernel_{p}_s", phase) > ctx.thresholds.gap_high * _c(rows, "pred_{p}_s", phase)


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

#: Every reason ``diagnose`` can give, with its meaning (the glossary for reports).
REASONS = {r.name: r.description for r in RULES}
REASONS.update({
    "other_device": "the run was measured on another device than the system spec describes: the gap compares two "
                    "machines, not the model with the run (analysis.system_notes.device_mismatch)",
    "unexplained": "slower than predicted and no rule's evidence matched",
    "measurement_artifact": "achieved rate above the datasheet peak: the timer missed work (never performance)",
    "overestimated": "faster than predicted: the model is pessimistic (launch overhead or efficiency too low)",
    "not_measured": "predicted only: the module never ran under the hooks in the measured steps",
    "not_instrumented": "predicted only, by design: outside PerfCheck's depth=/modules= selection; its time is "
                        "inside its nearest timed ancestor's",
    "not_predicted": "measured only: the estimate has no row for this module",
    "comm_wait": "the module itself waited on collectives for a large share of the step (whatever its gap): the "
                 "collective, its bytes, who issued it and who waited (FSDP2 prefetch, DDP overlap make them differ)",
    "recompute": "activation-checkpoint recompute (the forward re-run in backward, timed apart from it) far from "
                 "its prediction, run without being predicted, or predicted but never run",
})


class _Row:
    """One row of a frame as a read-only mapping over column arrays (cheaper than ``iloc`` + ``to_dict``)."""

    __slots__ = ("_cols", "_i")

    def __init__(self, cols: dict, i: int):
        self._cols, self._i = cols, i

    def __getitem__(self, key):
        v = self._cols[key][self._i]
        return v.item() if isinstance(v, np.generic) else v

    def get(self, key, default=None):
        return self[key] if key in self._cols else default


def diagnose(rows: pd.DataFrame, ctx: Context, phases=("fwd", "bwd")) -> dict:
    """``{reason_<phase>: array, evidence_<phase>: array}`` for every row; '' where the gap is small."""
    t = ctx.thresholds
    out = {}
    cols = {c: rows[c].to_numpy() for c in rows.columns}
    for phase in phases:
        gap = _c(rows, "gap_{p}", phase)
        reason = np.full(len(rows), "", dtype=object)
        evidence = np.full(len(rows), "", dtype=object)
        slow = gap > t.gap_high
        if ctx.other_device:  # two machines compared: no rule about the model applies
            other = slow | (gap < t.gap_low)
            _assign(cols, other, "other_device", _other_device_evidence, phase, ctx, reason, evidence)
            out[f"reason_{phase}"], out[f"evidence_{phase}"] = reason, evidence
            continue
        todo = slow.copy()
        for rule in RULES:
            if not todo.any():
                break
            hit = todo & np.asarray(rule.match(rows, phase, ctx), dtype=bool)
            _assign(cols, hit, rule.name, rule.evidence, phase, ctx, reason, evidence)
            todo &= ~hit
        reason[todo] = "unexplained"
        evidence[todo] = [f"{fmt_gap(g)} slower than predicted" for g in gap[todo]]
        fast = gap < t.gap_low
        # a calibration taken under load has low measured peaks: a real timing above them is no artifact
        artifact = fast & _flagged(rows, phase) & (not ctx.peak_taken_under_load())
        _assign(cols, artifact, "measurement_artifact", _artifact_evidence, phase, ctx, reason, evidence)
        over = fast & ~artifact
        _assign(cols, over, "overestimated", _over_evidence, phase, ctx, reason, evidence)
        out[f"reason_{phase}"], out[f"evidence_{phase}"] = reason, evidence
    return out


def _assign(cols, mask, name, make_evidence, phase, ctx, reason, evidence):
    idx = np.flatnonzero(mask)
    if not len(idx):
        return
    reason[idx] = name
    evidence[idx] = [make_evidence(_Row(cols, i), phase, ctx) for i in idx]


def _flagged(rows, phase) -> np.ndarray:
    if "flags" not in rows:
        return np.zeros(len(rows), dtype=bool)
    f = rows["flags"].fillna("").astype(str)
    # Bandwidth above the DRAM peak can be real (cache hits on CPU): only FLOP rates mark an artifact.
    return f.str.contains(f"{phase}_rate_above_peak", regex=False).to_numpy()


def _other_device_evidence(r, phase, ctx):
    return f"{fmt_gap(r[f'gap_{phase}'])}: {ctx.other_device}"


def _artifact_evidence(r, phase, ctx):
    rate = r[f"flops_{phase}"] / r[f"meas_{phase}_s"] if r[f"meas_{phase}_s"] else np.inf
    peak = ctx.matrix_peak()
    return (f"{fmt_count(r[f'flops_{phase}'], 'FLOP')} in {fmt_time(r[f'meas_{phase}_s'])} would be {fmt_rate(rate)}, "
            f"above the {fmt_rate(peak)} peak: the timer missed work")


def _over_evidence(r, phase, ctx):
    bound = r.get(f"bound_{phase}")
    why = ("launch overhead per kernel set too high for this device" if bound == "overhead"
           else f"predicted {bound}-bound time is pessimistic (efficiency below what this device reaches)")
    if ctx.peak_taken_under_load():
        why += "; the calibration was taken under load, so its rates are low (recalibrate on a quiet machine)"
    return f"{fmt_gap(r[f'gap_{phase}'])}: {fmt_time(r[f'meas_{phase}_s'])} measured vs {fmt_time(r[f'pred_{phase}_s'])} predicted; {why}"


def diagnose_recompute(rows: pd.DataFrame, ctx: Context) -> dict:
    """``{reason_recompute, evidence_recompute}``: the recompute phase's gap rule.

    The module timer reports activation-checkpoint recompute apart from backward (``meas_recompute_s``),
    and the estimate predicts it apart (``pred_recompute_s``), so a recompute gap never hides in
    ``gap_bwd``. Reason ``recompute`` when ``gap_recompute`` > ``gap_high`` (slower than its FLOPs
    say), when recompute was measured above the hook floor but none predicted (the estimate traced
    the model without the checkpointing the run uses), or when it was predicted but the run measured
    none (the run does not checkpoint what the estimate did); ``overestimated`` below ``gap_low``.
    Rows without a recompute measurement (NaN) or prediction column get ''.
    """
    t = ctx.thresholds
    meas, pred = _c(rows, "meas_recompute_s", ""), _c(rows, "pred_recompute_s", "")
    gap = _c(rows, "gap_recompute", "")
    calls = rows["calls"].to_numpy(dtype=float, na_value=np.nan) if "calls" in rows else np.ones(len(rows))
    floor = t.hook_floor_factor * ctx.hook_overhead_s * np.where(np.isfinite(calls) & (calls > 0), calls, 1.0)
    both = np.isfinite(meas) & np.isfinite(pred)
    unpredicted = both & (pred == 0) & (meas > floor)
    missing = both & (pred > 0) & (meas == 0)
    slow = both & (pred > 0) & (gap > t.gap_high)
    fast = both & (pred > 0) & (meas > 0) & (gap < t.gap_low)
    reason = np.full(len(rows), "", dtype=object)
    evidence = np.full(len(rows), "", dtype=object)
    cols = {c: rows[c].to_numpy() for c in rows.columns}
    _assign(cols, slow | unpredicted | missing, "recompute", _recompute_evidence, "recompute", ctx, reason, evidence)
    _assign(cols, fast, "overestimated", _recompute_over_evidence, "recompute", ctx, reason, evidence)
    return {"reason_recompute": reason, "evidence_recompute": evidence}


def _recompute_evidence(r, phase, ctx):
    meas, pred = r["meas_recompute_s"], r["pred_recompute_s"]
    if pred == 0:
        return (f"recompute {fmt_time(meas)} measured, none predicted: the run re-runs this forward in backward "
                "(activation checkpointing) but the estimate traced the model without it")
    if meas == 0:
        return (f"{fmt_time(pred)} of recompute predicted, none measured: the estimate checkpoints this module "
                "but the run does not")
    flops = r.get("flops_recompute")
    work = f" ({fmt_count(flops, 'FLOP')} re-run)" if flops == flops and flops else ""
    return (f"recompute {fmt_time(meas)} measured vs {fmt_time(pred)} predicted ({fmt_gap(meas / pred)}): the forward "
            f"re-run in backward{work} is slower than modelled")


def _recompute_over_evidence(r, phase, ctx):
    meas, pred = r["meas_recompute_s"], r["pred_recompute_s"]
    return (f"{fmt_gap(meas / pred)}: recompute {fmt_time(meas)} measured vs {fmt_time(pred)} predicted; the "
            "predicted time of the re-run forward is pessimistic")


def findings_table(rec: pd.DataFrame) -> pd.DataFrame:
    """One row per (module, rank, phase) with a reason, largest time lost (measured - predicted) first.

    Phases: fwd, bwd and recompute (activation checkpointing, ``diagnose_recompute``). The root is
    left out: its gap is the whole step's, reported with the totals.
    """
    parts = []
    for phase in ("fwd", "bwd", "recompute"):
        col = f"reason_{phase}"
        if col not in rec:
            continue
        sel = rec[(rec[col].fillna("") != "") & (rec["module"] != ROOT)]  # the root's gap is the summary's
        if sel.empty:
            continue
        parts.append(pd.DataFrame({
            "module": sel["module"], "type": sel["type"], "rank": sel["rank"] if "rank" in sel else 0,
            "phase": phase, "reason": sel[col], "gap": sel[f"gap_{phase}"],
            "pred_s": sel[f"pred_{phase}_s"], "meas_s": sel[f"meas_{phase}_s"],
            "lost_s": sel[f"meas_{phase}_s"].fillna(0) - sel[f"pred_{phase}_s"].fillna(0),
            "evidence": sel[f"evidence_{phase}"]}))
    cols = ["module", "type", "rank", "phase", "reason", "gap", "pred_s", "meas_s", "lost_s", "evidence"]
    comm = comm_wait_findings(rec)
    if not comm.empty:
        parts.append(comm[cols])
    if not parts:
        return pd.DataFrame(columns=cols)
    out = pd.concat(parts, ignore_index=True)
    return out.sort_values("lost_s", ascending=False, kind="stable", ignore_index=True)[cols]


def comm_wait_findings(rec: pd.DataFrame) -> pd.DataFrame:
    """``comm_wait`` rows (findings_table's columns): each (module, rank, phase) whose own wait on
    collectives (``meas_comm_wait_own_<p>_s``, per profiled step) is at least ``Thresholds.comm_wait_share``
    of the rank's profiled step (``rec.attrs["totals"]`` profiled_step_s, else its measured step; without
    totals, ``comm_share`` of the module's phase time).
    ``lost_s`` is the wait; the evidence is ``comm_waits_<p>`` (kind, bytes, issuer vs waiter). The
    root is included: DDP's and FSDP2's end-of-backward waits are the root's."""
    th = {**vars(Thresholds()), **(rec.attrs.get("thresholds") or {})}
    step = {int(t["rank"]): (t.get("profiled_step_s") if (t.get("profiled_step_s") or 0) > 0 else t.get("meas_step_s"))
            for t in rec.attrs.get("totals", []) if "rank" in t}
    parts = []
    for phase in ("fwd", "bwd"):
        col = f"meas_comm_wait_own_{phase}_s"
        if col not in rec:
            continue
        wait = rec[col].to_numpy(dtype=float, na_value=np.nan)
        ranks = rec["rank"].to_numpy() if "rank" in rec else np.zeros(len(rec), int)
        s = np.array([step.get(int(r), np.nan) for r in ranks], dtype=float)
        meas = rec[f"meas_{phase}_s"].to_numpy(dtype=float, na_value=np.nan)
        base = np.where(np.isfinite(s) & (s > 0), th["comm_wait_share"] * s, th["comm_share"] * meas)
        sel = rec[np.isfinite(wait) & (wait > 0) & (wait >= base)]
        if sel.empty:
            continue
        parts.append(pd.DataFrame({
            "module": sel["module"], "type": sel["type"], "rank": sel["rank"] if "rank" in sel else 0,
            "phase": phase, "reason": "comm_wait", "gap": sel[f"gap_{phase}"], "pred_s": sel[f"pred_{phase}_s"],
            "meas_s": sel[f"meas_{phase}_s"], "lost_s": sel[col],
            "evidence": sel[f"comm_waits_{phase}"].where(sel[f"comm_waits_{phase}"] != "",
                                                         [f"waited {fmt_time(w)} on collectives" for w in sel[col]])}))
    cols = ["module", "type", "rank", "phase", "reason", "gap", "pred_s", "meas_s", "lost_s", "evidence"]
    return pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)


# ------------------------------------------------------------------------------ before the run
def predicted_host_bound(pred: pd.DataFrame, depth: int = 1) -> list:
    """Findings from the prediction alone (no run needed): one line per module at ``depth`` or above
    and phase that the host model predicts ``host``-bound, e.g. "(root) fwd: predicted host-bound,
    host 1.1 ms vs device 0.02 ms". ``pred``: perfcheck.estimate's frame (host_fwd_s/host_bwd_s)."""
    if "host_fwd_s" not in pred.columns:
        return []
    out = []
    for r in pred[pred["depth"] <= depth].itertuples(index=False):
        for phase in ("fwd", "bwd"):
            if getattr(r, f"bound_{phase}") != "host":
                continue
            host = getattr(r, f"host_{phase}_s")
            device = _device_part(r, phase, host)
            out.append(f"{r.module} {phase}: predicted host-bound, host {fmt_time(host)} vs device "
                       f"{fmt_time(device)} (dispatch, autograd and Python exceed the kernels' work)")
    return out


def _device_part(r, phase, host) -> float:
    """Device seconds of a row: the two-timeline time less the host's (a CPU adds them; a GPU's
    host-bound region is the host's time plus the tail of its last kernel, so this is a lower bound)."""
    total = getattr(r, f"pred_{phase}_s")
    return max(total - host, 0.0)

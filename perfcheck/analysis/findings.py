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
The step's phases (forward, backward, optimizer of each rank's totals) have their own rules,
``rules.STEP_RULES`` (``step_findings``): ``page_faults`` when a phase ran longer than predicted and
took many first-touch page faults (``analysis.page_faults``).

The thresholds and what else the rules read are ``analysis.thresholds``; the rules themselves
``analysis.rules``; this module applies them and lists the findings.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from perfcheck.analysis import page_faults
from perfcheck.analysis.rules import RULES, STEP_RULES, phase_col
from perfcheck.analysis.thresholds import Context, Thresholds
from perfcheck.analysis.totals import totals_frame
from perfcheck.schema import ROOT
from perfcheck.units import fmt_count, fmt_gap, fmt_rate, fmt_time

#: Every reason ``diagnose`` can give, with its meaning (the glossary for reports).
REASONS = {r.name: r.description for r in RULES + STEP_RULES}
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
        gap = phase_col(rows, "gap_{p}", phase)
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
    meas, pred = phase_col(rows, "meas_recompute_s", ""), phase_col(rows, "pred_recompute_s", "")
    gap = phase_col(rows, "gap_recompute", "")
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
    for extra in (comm_wait_findings(rec), step_findings(rec)):
        if not extra.empty:
            parts.append(extra[cols])
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


def step_findings(rec: pd.DataFrame) -> pd.DataFrame:
    """Findings of ``rules.STEP_RULES`` over each rank's step phases (fwd, bwd, optim; ``rec.attrs["totals"]``),
    findings_table's columns, as the root's rows: ``gap`` = measured / predicted phase, ``lost_s`` the time
    the reason accounts for (``page_faults.lost_seconds``)."""
    cols = ["module", "type", "rank", "phase", "reason", "gap", "pred_s", "meas_s", "lost_s", "evidence"]
    totals = totals_frame(rec)
    if totals.empty:
        return pd.DataFrame(columns=cols)
    th = {**vars(Thresholds()), **(rec.attrs.get("thresholds") or {})}
    ctx = Context(Thresholds(**th))
    root = rec.loc[rec["module"] == ROOT, "type"] if "type" in rec else pd.Series(dtype=object)
    root_type = str(root.iloc[0]) if len(root) else ""
    out = []
    for phase in page_faults.FAULT_PHASES:
        todo = np.ones(len(totals), dtype=bool)
        for rule in STEP_RULES:
            hit = todo & np.asarray(rule.match(totals, phase, ctx), dtype=bool)
            todo &= ~hit
            for i in np.flatnonzero(hit):
                r = totals.iloc[i].to_dict()
                pred, meas = r.get(f"pred_{phase}_s"), r.get(f"meas_{phase}_s")
                out.append({"module": ROOT, "type": root_type, "rank": int(r["rank"]), "phase": phase,
                            "reason": rule.name, "gap": meas / pred if pred else np.inf, "pred_s": pred,
                            "meas_s": meas, "lost_s": page_faults.lost_seconds(r, phase),
                            "evidence": rule.evidence(r, phase, ctx)})
    return pd.DataFrame(out, columns=cols)


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

"""reconcile(predicted, measured): predicted and measured time side by side, per module and rank.

An outer join on module path (containers included, so the root row is the whole model): rows on
one side only are kept and labelled (``side``), never dropped. For each phase (fwd, bwd) it adds
the measured median per step, ``gap = measured / predicted``, ``efficiency = predicted /
measured``, the achieved FLOP/s and bandwidth (predicted FLOPs and bytes over measured time),
the kernel-table evidence summed over each module's subtree, flags for rates above the datasheet
peak (measurement artifacts: such rates are blanked, never shown as performance), and for each
large gap a ``reason`` with an ``evidence`` sentence (``perfcheck.analysis.findings``: one rule per
diagnosis; "large" is ``Thresholds.gap_high`` = 2 / ``gap_low`` = 0.5).

The whole-step totals (predicted vs measured step, and the share of the measured step that no
module explains: optimizer, loss, data, framework, idle) are in ``frame.attrs["totals"]`` as a
list of per-rank records; ``totals_frame(rec)`` gives them as a DataFrame, ``rank_summary(rec)``
the min/median/max over ranks with the slowest rank. Columns: ``RECONCILED_COLUMNS``,
``TOTALS_COLUMNS``, ``RANK_SUMMARY_COLUMNS`` (``analysis.columns``); the kernel-table evidence is
``analysis.kernels``, the totals ``analysis.totals``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from perfcheck.analysis.columns import PHASES2, RECONCILED_COLUMNS, module_paths
from perfcheck.analysis.comm import in_step_waits, module_comm
from perfcheck.analysis.findings import diagnose, diagnose_recompute
from perfcheck.analysis.kernels import kernel_summary
from perfcheck.analysis.thresholds import Context, DEFAULT_HOOK_OVERHEAD_S, Thresholds
from perfcheck.analysis.totals import ratio, root_value, totals_records
from perfcheck.errors import UserError
from perfcheck.hardware.labels import spec_label
from perfcheck.hardware.systems import load_system
from perfcheck.schema import MODULE_COMM_COLUMNS, PREDICTED_COLUMNS, module_depth, parent_path


# ------------------------------------------------------------------------------------ inputs
def _prepare_predicted(predicted: pd.DataFrame) -> pd.DataFrame:
    if not isinstance(predicted, pd.DataFrame):
        raise UserError(f"reconcile: predicted must be a DataFrame, got {type(predicted).__name__}")
    missing = [c for c in PREDICTED_COLUMNS if c not in predicted.columns]
    if missing:
        raise UserError(f"reconcile: predicted frame is missing column {missing[0]!r}"
                        + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    extra = ("unmodeled_ops", "rank", "pred_recompute_s", "flops_recompute")
    cols = list(PREDICTED_COLUMNS) + [c for c in extra if c in predicted.columns]
    pred = predicted[cols].copy()
    for c in ("pred_recompute_s", "flops_recompute"):  # predictions written before recompute was predicted
        if c not in pred:
            pred[c] = np.nan
    pred["module"] = module_paths(pred["module"])
    if "unmodeled_ops" not in pred:
        pred["unmodeled_ops"] = ""
    pred["unmodeled_ops"] = pred["unmodeled_ops"].fillna("").astype(str)
    pred["comm_kind"] = pred["comm_kind"].fillna("").astype(str)
    dup = pred.duplicated(["module"] + (["rank"] if "rank" in pred else []))
    if dup.any():
        raise UserError(f"reconcile: predicted frame has module {pred['module'][dup].iloc[0]!r} twice")
    return pred


_MEAS_REQUIRED = ("module", "fwd_s_median", "bwd_s_median")
_MEAS_RENAME = {"calls": "calls_measured", "fwd_s_median": "meas_fwd_s", "bwd_s_median": "meas_bwd_s",
                "fwd_s_min": "meas_fwd_s_min", "fwd_s_max": "meas_fwd_s_max", "bwd_s_min": "meas_bwd_s_min",
                "bwd_s_max": "meas_bwd_s_max", "recompute_s_median": "meas_recompute_s",
                "eval_s_median": "meas_eval_s", "eval_calls": "eval_calls",
                "act_mem_bytes": "meas_act_mem_bytes", "peak_mem_bytes": "meas_peak_mem_bytes", "steps": "steps",
                "type": "type_m"}


def _prepare_measured(measured: pd.DataFrame) -> pd.DataFrame:
    if not isinstance(measured, pd.DataFrame):
        raise UserError(f"reconcile: measured must be a DataFrame, got {type(measured).__name__}")
    missing = [c for c in _MEAS_REQUIRED if c not in measured.columns]
    if missing:
        raise UserError(f"reconcile: measured frame is missing column {missing[0]!r}")
    meas = measured[[c for c in list(_MEAS_RENAME) + ["module", "rank"] if c in measured.columns]].rename(columns=_MEAS_RENAME)
    meas["module"] = module_paths(meas["module"])
    meas["rank"] = meas["rank"].fillna(0).astype(int) if "rank" in meas else 0
    for c in _MEAS_RENAME.values():
        if c not in meas:
            meas[c] = np.nan if c != "type_m" else ""
    if meas.duplicated(["module", "rank"]).any():
        bad = meas[meas.duplicated(["module", "rank"])].iloc[0]
        raise UserError(f"reconcile: measured frame has module {bad['module']!r} twice for rank {bad['rank']}")
    return meas


# ------------------------------------------------------------------------------------ derived
def _derive(rec: pd.DataFrame, ctx: Context) -> list:
    """Ratios, achieved rates, intensities and artifact flags; returns the flag lists per row."""
    flags = [[] for _ in range(len(rec))]
    peak, bw = ctx.matrix_peak(), ctx.mem_bandwidth()
    for p in PHASES2:
        meas, pred = rec[f"meas_{p}_s"].to_numpy(float), rec[f"pred_{p}_s"].to_numpy(float)
        rec[f"gap_{p}"] = ratio(meas, pred)
        rec[f"efficiency_{p}"] = ratio(pred, meas)
        pos = np.where(meas > 0, meas, np.nan)
        rate = rec[f"flops_{p}"].to_numpy(float) / pos
        bytes_rate = rec[f"bytes_{p}"].to_numpy(float) / pos
        rec[f"intensity_{p}"] = ratio(rec[f"flops_{p}"].to_numpy(float), rec[f"bytes_{p}"].to_numpy(float))
        over = rate > peak  # NaN peak (no system) -> False
        over_bw = bytes_rate > bw
        rec[f"achieved_flops_{p}_per_s"] = np.where(over, np.nan, rate)
        rec[f"achieved_bytes_{p}_per_s"] = bytes_rate
        for i in np.flatnonzero(over):
            flags[i].append(f"{p}_rate_above_peak")
        for i in np.flatnonzero(over_bw):
            flags[i].append(f"{p}_bandwidth_above_peak")
    rec["gap_recompute"] = ratio(rec["meas_recompute_s"].to_numpy(float), rec["pred_recompute_s"].to_numpy(float))
    no_bwd = (rec["side"].to_numpy() == "both") & (rec["pred_bwd_s"].to_numpy(float) > 0) & ~np.isfinite(
        rec["meas_bwd_s"].to_numpy(float))
    for i in np.flatnonzero(no_bwd):
        flags[i].append("bwd_not_measured")
    rec["efficiency"] = ratio(rec["pred_fwd_s"].fillna(0).to_numpy(float) + rec["pred_bwd_s"].fillna(0).to_numpy(float),
                               rec["meas_fwd_s"].fillna(0).to_numpy(float) + rec["meas_bwd_s"].fillna(0).to_numpy(float))
    both = rec["side"].to_numpy() == "both"
    rec.loc[~both, "efficiency"] = np.nan
    return flags


def _stragglers(rec: pd.DataFrame, flags: list, tol: float):
    if rec["rank"].nunique() < 2:
        return
    t = rec["meas_fwd_s"].fillna(0) + rec["meas_bwd_s"].fillna(0)
    g = t.groupby(rec["module"])
    med, mx = g.transform("median"), g.transform("max")
    idx = (t == mx) & (t > (1 + tol) * med) & (mx > 0)
    first = rec.loc[idx.to_numpy()].drop_duplicates("module").index  # one slowest rank per module
    for i in first:
        flags[i].append("straggler")


def _summary_reason(rec: pd.DataFrame, timed=None) -> np.ndarray:
    """The reason of the phase (fwd, bwd, recompute) with the largest gap in log scale. ``timed``:
    the module paths PerfCheck's depth=/modules= selection timed (None: all)."""
    out = np.full(len(rec), "", dtype=object)
    best = np.full(len(rec), -np.inf)
    for p in PHASES2 + ("recompute",):
        g = rec[f"gap_{p}"].to_numpy(float)
        size = np.nan_to_num(np.abs(np.log(np.where(g > 0, g, np.nan))), nan=-1, posinf=1e9)
        # a recompute predicted but never run has gap 0: as large as any
        size = np.where((g == 0) & (rec[f"reason_{p}"].to_numpy(object) != ""), 1e9, size)
        r = rec[f"reason_{p}"].to_numpy(object)
        take = (r != "") & ((out == "") | (size > best))
        out, best = np.where(take, r, out).astype(object), np.where(take, size, best)
    side = rec["side"].to_numpy()
    out[side == "predicted_only"] = "not_measured"
    if timed is not None:  # outside the selection: absent by design, its time is in an ancestor's row
        out[(side == "predicted_only") & ~rec["module"].isin(set(timed)).to_numpy()] = "not_instrumented"
    out[side == "measured_only"] = "not_predicted"
    return out


def _tree_order(modules_in_order) -> dict:
    """Depth-first position of each path, children in first-appearance order."""
    seen = list(dict.fromkeys(modules_in_order))
    present = set(seen)
    children: dict = {}
    roots = []
    for m in seen:
        parent = parent_path(m)
        while parent is not None and parent not in present:
            parent = parent_path(parent)
        (children.setdefault(parent, []) if parent is not None else roots).append(m)
    order, stack = {}, list(reversed(roots))
    while stack:
        m = stack.pop()
        order[m] = len(order)
        stack.extend(reversed(children.get(m, [])))
    return order


# -------------------------------------------------------------------------------------- main
def reconcile(predicted: pd.DataFrame, measured: pd.DataFrame, *, system=None, kernels=None, steps=None,
              dtype=None, profile_steps=None, hook_overhead_s=None, thresholds: Thresholds | None = None,
              timed=None, collectives=None, layouts=None, hook_overhead_source=None,
              other_device=None, contention=None) -> pd.DataFrame:
    """Join predicted and measured rows on module path; one row per (module, rank).

    predicted: ``perfcheck.estimate(...)`` (schema.PREDICTED_COLUMNS; a ``rank`` column is optional).
    measured: ``PerfCheck.measured()`` (schema.MEASURED_COLUMNS; all ranks of a run in one frame).
    system: name, path or SystemSpec whose datasheet peaks flag artifacts and draw the roofs
      (without one, no rate is flagged and the below-the-roof rules do not match).
    kernels: ``PerfCheck.kernels()`` (schema.KERNEL_COLUMNS) for the kernel-table evidence.
    steps: ``PerfCheck.steps()`` (schema.STEP_COLUMNS) for the totals.
    dtype: the run's dtype, for the matrix peak (default: the system's largest matrix peak, so only
      rates no dtype can reach are flagged).
    profile_steps: active profiler steps behind the kernel table (int, or {rank: int}; default
      ``kernels.attrs["profile_steps"]`` or 1).
    hook_overhead_s: cost of the hooks per module call (default ``thresholds.DEFAULT_HOOK_OVERHEAD_S``);
      hook_overhead_source: where that figure came from (the evidence quotes it; analysis.pipeline passes
      the run's own measured overhead, meta.json ``overhead``).
    other_device: a sentence when the run was measured on another device than ``system`` describes
      (analysis.system_notes.device_mismatch): every large gap then gets reason ``other_device``.
    contention: a sentence when the run's process waited for a core most of the time
      (analysis.system_notes.run_contention): every slow module then gets reason ``contention``.
    timed: module paths a ``PerfCheck(depth=/modules=)`` run timed (meta.json ``selection.timed``);
      predicted-only rows outside it get reason ``not_instrumented`` instead of ``not_measured``.
    collectives: ``PerfCheck.collectives()`` / collectives.csv rows of all ranks (measure.collectives) for
      the per-module communication columns (schema.MODULE_COMM_COLUMNS, analysis.comm; same
      ``profile_steps``); ranks without rows get NaN there. layouts: {rank: meta.json parallel kind},
      for the words of the waits ("DDP bucket all-reduce", "DTensor all-gather").
    Returns RECONCILED_COLUMNS in tree order per rank; ``attrs["totals"]`` holds TOTALS_COLUMNS records.
    """
    spec, ctx = _context(system, dtype, thresholds, hook_overhead_s, hook_overhead_source, other_device, contention)
    rec, pred, meas = _join(_prepare_predicted(predicted), _prepare_measured(measured))
    rec, kern = _with_kernels(rec, kernels, profile_steps)
    rec = _with_comm(rec, collectives, profile_steps, layouts)
    rec = _diagnosed(rec, ctx, timed)
    rec = _in_tree_order(rec, list(pred["module"]) + list(meas["module"]))
    in_step = (in_step_waits(collectives, steps, 1 if profile_steps is None else profile_steps)
               if collectives is not None else {})
    totals = totals_records(rec, steps, kernels, profile_steps, ctx.thresholds, in_step)
    optim = root_value(predicted, "pred_optim_s") if "module" in predicted else np.nan
    for row in totals:
        row["pred_optim_s"] = optim
    rec.attrs = _attrs(totals, spec, dtype, ctx, kern is not None)
    return rec


def _context(system, dtype, thresholds, hook_overhead_s, hook_overhead_source, other_device, contention):
    """``(spec, thresholds.Context)`` of one reconcile call: the system loaded once, the thresholds, the hook
    overhead and its source, and the run's device and contention sentences."""
    spec = load_system(system) if system is not None else None
    ctx = Context(thresholds or Thresholds(), spec, dtype,
                  DEFAULT_HOOK_OVERHEAD_S if hook_overhead_s is None else float(hook_overhead_s),
                  hook_overhead_source or ("given" if hook_overhead_s is not None else "assumed default"),
                  other_device or "", contention or "")
    if spec is not None and dtype is not None:
        spec.matrix_peak(dtype)  # an unknown dtype is a UserError now, not a silent NaN later
    return spec, ctx


def _join(pred: pd.DataFrame, meas: pd.DataFrame):
    """``(rec, pred, meas)``: the outer join on (module, rank), a prediction without ranks shared by every
    measured rank; ``side`` says which frames have the row."""
    ranks = sorted(meas["rank"].unique().tolist()) or [0]
    if "rank" in pred and pred["rank"].nunique() > 1:
        pred["rank"] = pred["rank"].astype(int)
    else:
        pred = pred.drop(columns=["rank"], errors="ignore").merge(pd.DataFrame({"rank": ranks}), how="cross")
    rec = pred.merge(meas, on=["module", "rank"], how="outer", indicator=True)
    rec["side"] = rec.pop("_merge").map({"both": "both", "left_only": "predicted_only",
                                         "right_only": "measured_only"}).astype(object)
    rec["type"] = rec["type"].where(rec["type"].notna() & (rec["type"] != ""), rec["type_m"])
    rec = rec.drop(columns=["type_m"])
    rec["depth"] = rec["module"].map(module_depth).astype(int)
    rec["calls"] = rec["calls"].where(rec["calls"].notna(), rec["calls_measured"])
    for c in ("unmodeled_ops", "comm_kind", "source", "bound_fwd", "bound_bwd"):
        rec[c] = rec[c].fillna("").astype(object)
    return rec, pred, meas


def _with_kernels(rec: pd.DataFrame, kernels, profile_steps):
    """``(rec, kern)``: ``rec`` with the kernel-table columns (``analysis.kernels.kernel_summary``; NaN
    without a table, 0 for a module the profiler saw nothing in on a rank that has one); ``kern`` the
    summary, None without a table."""
    kern = None
    if kernels is not None and len(kernels):
        missing = [c for c in ("module", "phase", "name", "count", "self_s") if c not in kernels.columns]
        if missing:
            raise UserError(f"reconcile: kernels frame is missing column {missing[0]!r}")
        kern = kernel_summary(kernels, profile_steps)
        rec = rec.merge(kern, on=["rank", "module"], how="left")
        have = set(kern["rank"].unique().tolist())
        for p in PHASES2:  # a module the profiler saw nothing in (on a rank that has a table) ran 0 kernels
            for c in (f"kernels_{p}", f"kernel_{p}_s", f"comm_kernel_{p}_s", f"irregular_kernel_{p}_s"):
                rec[c] = rec[c].where(rec[c].notna() | ~rec["rank"].isin(have), 0.0)
    for p in PHASES2:
        for c in (f"kernels_{p}", f"kernel_{p}_s", f"comm_kernel_{p}_s", f"irregular_kernel_{p}_s"):
            if c not in rec:
                rec[c] = np.nan
        rec[f"irregular_kernels_{p}"] = rec.get(f"irregular_kernels_{p}", pd.Series("", index=rec.index)).fillna("")
    return rec, kern


def _diagnosed(rec: pd.DataFrame, ctx: Context, timed) -> pd.DataFrame:
    """``rec`` with the derived rates, the flags, every finding's reason and evidence per phase
    (``analysis.findings``), the summary ``reason`` and the ``bound`` of the larger phase."""
    flags = _derive(rec, ctx)
    _stragglers(rec, flags, ctx.thresholds.straggler_tolerance)
    rec["flags"] = ["+".join(f) for f in flags]
    for col, values in {**diagnose(rec, ctx), **diagnose_recompute(rec, ctx)}.items():
        rec[col] = values
    rec["reason"] = _summary_reason(rec, timed)
    bigger_bwd = rec["pred_bwd_s"].fillna(0) > rec["pred_fwd_s"].fillna(0)
    rec["bound"] = np.where(bigger_bwd, rec["bound_bwd"], rec["bound_fwd"]).astype(object)
    return rec


def _in_tree_order(rec: pd.DataFrame, modules_in_order) -> pd.DataFrame:
    """``rec`` sorted by rank, then depth-first in the modules' order, with RECONCILED_COLUMNS only."""
    order = _tree_order(modules_in_order)
    rec["_o"] = rec["module"].map(order)
    rec = rec.sort_values(["rank", "_o"], kind="stable", ignore_index=True).drop(columns="_o")
    return rec[list(RECONCILED_COLUMNS)]


def _attrs(totals: list, spec, dtype, ctx: Context, kernel_table: bool) -> dict:
    """The reconciled frame's ``attrs``: the per-rank totals and what the comparison was made with."""
    return {"totals": totals,
            "system": spec.name if spec is not None else None, "dtype": dtype,
            "system_label": _spec_label(spec),
            "system_calibration": dict(spec.calibration) if spec is not None else {},
            "hook_overhead_s": ctx.hook_overhead_s, "hook_overhead_source": ctx.hook_overhead_source,
            "other_device": ctx.other_device, "contention": ctx.contention, "thresholds": dict(vars(ctx.thresholds)),
            "kernel_table": kernel_table}


def _with_comm(rec: pd.DataFrame, collectives, profile_steps, layouts) -> pd.DataFrame:
    """``rec`` with schema.MODULE_COMM_COLUMNS: 0 / '' for a module of a rank whose collectives were
    recorded but that issued or waited on none; NaN / '' for ranks without collectives."""
    cols = [c.format(p=p) for p in PHASES2 for c in MODULE_COMM_COLUMNS]
    have: set = set()
    if collectives is not None and len(collectives):
        if "rank" not in collectives:
            collectives = collectives.assign(rank=0)
        comm = module_comm(collectives, 1 if profile_steps is None else profile_steps, layouts)
        have = set(pd.to_numeric(collectives["rank"], errors="coerce").fillna(0).astype(int).tolist())
        rec = rec.merge(comm, on=["rank", "module"], how="left")
    recorded = rec["rank"].isin(have)
    for c in cols:
        text = c.startswith("comm_waits_")
        if c not in rec:
            rec[c] = "" if text else np.nan
        if text:
            rec[c] = rec[c].fillna("").astype(object)
        else:
            rec[c] = rec[c].astype(float).where(rec[c].notna() | ~recorded, 0.0)
    return rec


def _spec_label(spec):
    """"NAME (calibrated: where | datasheet)" for report headers (perfcheck.hardware.cache.spec_label)."""
    return spec_label(spec) if spec is not None else None

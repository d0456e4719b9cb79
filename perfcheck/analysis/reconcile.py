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
``TOTALS_COLUMNS``, ``RANK_SUMMARY_COLUMNS`` below.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from perfcheck.analysis.comm import ancestors, in_step_waits, module_comm, profiled_step_s, subtree_sums
from perfcheck.analysis.findings import Context, DEFAULT_HOOK_OVERHEAD_S, Thresholds, diagnose, diagnose_recompute
from perfcheck.errors import UserError
from perfcheck.hardware.labels import spec_label
from perfcheck.hardware.systems import load_system
from perfcheck.schema import (MODULE_COMM_COLUMNS, PREDICTED_COLUMNS, ROOT, module_depth, parent_path,
                              strip_wrapper_prefix)

PHASES2 = ("fwd", "bwd")

_PER_PHASE = {
    "pred_{p}_s": "predicted {ph} time per step (from the estimate), seconds",
    "meas_{p}_s": "measured {ph} time per step, median over measured steps, seconds",
    "meas_{p}_s_min": "measured {ph} time per step, fastest measured step, seconds",
    "meas_{p}_s_max": "measured {ph} time per step, slowest measured step, seconds",
    "gap_{p}": "meas_{p}_s / pred_{p}_s: >1 slower than predicted (inf when predicted 0 but measured > 0)",
    "efficiency_{p}": "pred_{p}_s / meas_{p}_s: the fraction of the modelled roofline time reached",
    "achieved_flops_{p}_per_s": "flops_{p} (predicted) / meas_{p}_s; NaN when flagged above the datasheet peak",
    "achieved_bytes_{p}_per_s": "bytes_{p} (predicted) / meas_{p}_s: achieved device-memory bandwidth, B/s",
    "intensity_{p}": "arithmetic intensity flops_{p} / bytes_{p}, FLOP/byte (the roofline's x axis)",
    "kernels_{p}": "kernel launches (GPU) or aten ops incl. nested (CPU) per step in the module's subtree (kernel table); NaN without one",
    "kernel_{p}_s": "summed kernel time (GPU) or aten-op self time (CPU) per step in the subtree, seconds; NaN without a kernel table",
    "comm_kernel_{p}_s": "of kernel_{p}_s: communication kernels (nccl, gloo, c10d, all_reduce ...), seconds",
    "irregular_kernel_{p}_s": "of kernel_{p}_s: scatter/gather/index/sort kernels (irregular access), seconds",
    "irregular_kernels_{p}": "names of the largest irregular kernels, ','-joined",
    "reason_{p}": "why the {ph} gap is large (perfcheck.analysis.findings.REASONS); '' when the gap is within thresholds",
    "evidence_{p}": "the numbers behind reason_{p}, one sentence",
}

#: Column glossary of the reconciled frame (move to schema.py).
RECONCILED_COLUMNS = {
    "module": "module path (schema.ROOT for the root)",
    "type": "module class name",
    "depth": "0 for the root",
    "rank": "distributed rank of the measured side (the prediction is shared by all ranks unless it has a rank column)",
    "side": "both | predicted_only | measured_only: which frames have the module",
    "calls": "forward calls per step (predicted; measured where only measured)",
    "calls_measured": "forward calls per step, median over measured steps",
    "steps": "number of measured steps behind the medians",
    **{c: PREDICTED_COLUMNS[c] for c in ("params", "macs_fwd", "macs_bwd", "flops_fwd", "flops_bwd", "bytes_fwd",
                                         "bytes_bwd", "act_mem", "comm_fwd_bytes", "comm_bwd_bytes", "comm_kind",
                                         "bound_fwd", "bound_bwd", "source")},
    "unmodeled_ops": "aten ops the estimate costed by bytes only (no formula), ','-joined",
    "bound": "predicted bound of the phase with the larger predicted time",
    "meas_recompute_s": "measured activation-checkpoint recompute time per step, median, seconds",
    "pred_recompute_s": "predicted recompute time per step (the estimate's checkpointed forwards re-run in "
                        "backward), seconds; NaN for a prediction without the column",
    "flops_recompute": "predicted FLOPs of that recompute",
    "gap_recompute": "meas_recompute_s / pred_recompute_s (inf when none predicted but some measured)",
    "reason_recompute": "'recompute' or 'overestimated' when the recompute gap is large "
                        "(perfcheck.analysis.findings.diagnose_recompute); '' otherwise",
    "evidence_recompute": "the numbers behind reason_recompute, one sentence",
    "meas_eval_s": "measured eval forward time per step (module calls made with grad disabled outside a training "
                   "forward: a validation batch, an EMA/teacher call; schema.PHASES), median, seconds: kept out of "
                   "meas_fwd_s and never compared with a prediction; NaN for runs recorded before it was measured",
    "eval_calls": "eval forward calls per step, median over measured steps",
    "meas_act_mem_bytes": "measured activation memory of the forward (CUDA), bytes; NaN on CPU",
    "meas_peak_mem_bytes": "measured peak memory during the forward (CUDA), bytes; NaN on CPU",
    **{k.format(p=p): v.format(p=p, ph="forward" if p == "fwd" else "backward") for p in PHASES2 for k, v in _PER_PHASE.items()},
    **{k.format(p=p): v.format(p=p) for p in PHASES2 for k, v in MODULE_COMM_COLUMNS.items()},
    "efficiency": "(pred_fwd_s + pred_bwd_s) / (meas_fwd_s + meas_bwd_s)",
    "reason": "reason of the phase (fwd, bwd, recompute) with the largest gap (in log scale); not_measured / not_predicted for one-sided rows",
    "flags": "'+'-joined: fwd_rate_above_peak / bwd_rate_above_peak (FLOP/s above the datasheet matrix peak: a "
             "measurement artifact, achieved_flops blanked), fwd_bandwidth_above_peak / bwd_bandwidth_above_peak "
             "(bytes/s above the datasheet bandwidth: cache hits or a timer that missed work), bwd_not_measured "
             "(predicted backward but none measured), straggler (this rank is the slowest for the module, beyond "
             "the tolerance)",
}

#: Columns of ``totals_frame(rec)`` (one row per rank; also ``rec.attrs["totals"]``).
TOTALS_COLUMNS = {
    "rank": "distributed rank",
    "steps": "measured, non-failed steps behind the medians",
    "pred_fwd_s": "predicted forward time of the whole model (root row), seconds",
    "pred_bwd_s": "predicted backward time of the whole model, seconds",
    "pred_step_s": "pred_fwd_s + pred_bwd_s, seconds",
    "pred_optim_s": "the optimizer step predicted by the estimator (perfcheck.predict.host; its ``optimizer`` argument), seconds; NaN when the prediction has none",
    "meas_fwd_s": "measured forward time of the root, median per step, seconds",
    "meas_bwd_s": "measured backward time of the root, median per step, seconds",
    "meas_recompute_s": "measured recompute time, median per step, seconds",
    "meas_eval_s": "measured eval (grad-disabled) forward time of the step (steps.csv eval_s), median, seconds",
    "meas_optim_s": "measured time from the end of backward to the end of the step (optimizer, framework), median, seconds",
    "meas_step_s": "measured wall time of the step, median, seconds",
    "meas_bwd_finalize_s": "measured end-of-backward framework callbacks (DDP's gradient all-reduce wait, FSDP2's "
                           "reduce-scatter wait; steps.csv bwd_finalize_s), median, seconds: communication, not optimizer",
    "meas_comm_wait_s": "time waited on collectives per step: bwd_finalize_s (median over measured steps) + the waits "
                        "inside forward/backward (FSDP2 all-gathers, synchronous calls, DTensor waits; collectives.csv: "
                        "their share of the profiled steps' time applied to the measured median step, since the "
                        "profiler slows its steps; analysis.comm.in_step_waits), seconds",
    "profiled_step_s": "mean step time of the profiler window's active steps (steps.csv role 'profile'), seconds: the "
                       "step the per-module comm columns (per profiled step) belong to; NaN without them",
    "meas_compute_s": "measured step_s - bwd_finalize_s - the waits inside the step (meas_comm_wait_s: time outside "
                      "collective waits), median, seconds: DDP/FSDP make "
                      "step times equal over ranks, so the straggler is the rank with the most compute",
    "gap_fwd": "meas_fwd_s / pred_fwd_s",
    "gap_bwd": "meas_bwd_s / pred_bwd_s",
    "gap_fwd_bwd": "(meas_fwd_s + meas_bwd_s) / pred_step_s",
    "unexplained_s": "meas_step_s - meas_fwd_s - meas_bwd_s - meas_recompute_s - meas_eval_s (medians): time no module "
                     "explains, seconds",
    "unexplained_share": "unexplained_s / meas_step_s",
    "optim_share": "meas_optim_s / meas_step_s (part of the unexplained share)",
    "other_s": "unexplained_s - meas_optim_s - meas_bwd_finalize_s: loss, data loading, framework and idle time "
               "before/between phases, seconds",
    "optimizer_kernel_s": "kernel/op time attributed to the optimizer per profiled step (kernel table), seconds",
    "unattributed_kernel_s": "kernel/op time outside every module and the optimizer per profiled step, seconds",
    "hook_overhead_share": "instrumented / bare step time - 1 (medians; NaN without bare steps): what the hooks cost",
    "bare_steps": "steps run without hooks (the overhead A/B)",
    "slowest": "True for the rank with the largest meas_compute_s (meas_step_s where compute is unknown)",
    "straggler": "True when the slowest rank's compute time (step less collective waits) exceeds the median over ranks by "
                 "more than Thresholds.straggler_tolerance",
}

#: Columns of ``rank_summary(rec)``: one row per module over ranks.
RANK_SUMMARY_COLUMNS = {
    "module": "module path", "type": "module class name", "depth": "0 for the root", "ranks": "ranks measured",
    **{f"meas_{p}_s_{s}": f"measured {p} time per step, {s} over ranks, seconds" for p in PHASES2
       for s in ("min", "median", "max")},
    **{f"slowest_rank_{p}": f"rank with the largest measured {p} time" for p in PHASES2},
    "straggler": "the slowest rank's fwd+bwd exceeds the median over ranks by more than the tolerance",
}

#: Kernel/op names of collectives and of irregular memory access (the roofline costs the latter
#: as streaming bytes; the TransformerConv graph model of perfcheck.examples.graph spends 47% of
#: its CUDA time on an Ampere (sm_80) GPU in index_select and scatter_add_, per torch.profiler).
COMM_KERNELS = re.compile(r"nccl|rccl|c10d::|gloo|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast", re.I)
IRREGULAR_KERNELS = re.compile(r"scatter|gather|index|nonzero|unique|sort|topk|cumsum|embedding_dense_backward"
                               r"|segment_reduce", re.I)
_NOT_MODULES = ("unattributed", "(optimizer)")


# ------------------------------------------------------------------------------------ inputs
def _paths(series: pd.Series) -> pd.Series:
    s = series.fillna("").astype(str).map(strip_wrapper_prefix)
    return s.where(s != "", ROOT)


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
    pred["module"] = _paths(pred["module"])
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
    meas["module"] = _paths(meas["module"])
    meas["rank"] = meas["rank"].fillna(0).astype(int) if "rank" in meas else 0
    for c in _MEAS_RENAME.values():
        if c not in meas:
            meas[c] = np.nan if c != "type_m" else ""
    if meas.duplicated(["module", "rank"]).any():
        bad = meas[meas.duplicated(["module", "rank"])].iloc[0]
        raise UserError(f"reconcile: measured frame has module {bad['module']!r} twice for rank {bad['rank']}")
    return meas


# ------------------------------------------------------------------------------- kernel table
def _profile_steps(profile_steps, kernels, rank) -> float:
    value = profile_steps if profile_steps is not None else kernels.attrs.get("profile_steps", 1)
    if isinstance(value, dict):
        value = value.get(rank, value.get(str(rank), 1))
    value = float(value)
    if not value > 0:
        raise UserError(f"reconcile: profile_steps must be positive, got {value!r}")
    return value


def kernel_summary(kernels: pd.DataFrame, profile_steps=None) -> pd.DataFrame:
    """Kernel-table evidence per (rank, module) summed over the module's subtree, per profiled step.

    Columns kernels_<p>, kernel_<p>_s, comm_kernel_<p>_s, irregular_kernel_<p>_s and
    irregular_kernels_<p> for p in fwd, bwd (see RECONCILED_COLUMNS).
    """
    k = kernels[kernels["phase"].isin(PHASES2) & ~kernels["module"].isin(_NOT_MODULES)]
    k = k[k["name"] != "(outside ops)"]  # Python/hook time inside a module range: not kernel time
    cols = [f"{c}_{p}" if not c.endswith("_s") else f"{c[:-2]}_{p}_s" for p in PHASES2
            for c in ("kernels", "kernel_s", "comm_kernel_s", "irregular_kernel_s")]
    if k.empty:
        return pd.DataFrame(columns=["rank", "module"] + cols + [f"irregular_kernels_{p}" for p in PHASES2])
    k = k.assign(module=_paths(k["module"]), rank=k["rank"].fillna(0).astype(int) if "rank" in k else 0)
    names = k["name"].astype(str)
    cpu = k["device"].astype(str).eq("cpu").to_numpy() if "device" in k else np.zeros(len(k), bool)
    t = k["self_s"].to_numpy(float)
    counted = ~cpu | names.str.startswith("aten::").to_numpy()
    base = pd.DataFrame({"rank": k["rank"].to_numpy(), "module": k["module"].to_numpy(), "phase": k["phase"].to_numpy(),
                         "kernels": np.where(counted, k["count"].to_numpy(float), 0.0), "kernel_s": t,
                         "comm_kernel_s": np.where(names.str.contains(COMM_KERNELS).to_numpy(), t, 0.0),
                         # a collective (all_gather, reduce_scatter) is communication, never irregular access
                         "irregular_kernel_s": np.where((names.str.contains(IRREGULAR_KERNELS)
                                                         & ~names.str.contains(COMM_KERNELS)).to_numpy(), t, 0.0),
                         "name": names.to_numpy()})
    own = base.groupby(["rank", "module", "phase"], sort=False)[["kernels", "kernel_s", "comm_kernel_s",
                                                                 "irregular_kernel_s"]].sum().reset_index()
    anc = {m: ancestors(m) for m in own["module"].unique()}
    agg = subtree_sums(own, ["kernels", "kernel_s", "comm_kernel_s", "irregular_kernel_s"])
    wide = agg.set_index(["rank", "module", "phase"])[["kernels", "kernel_s", "comm_kernel_s",
                                                       "irregular_kernel_s"]].unstack("phase")
    wide.columns = [f"{c}_{p}" if not c.endswith("_s") else f"{c[:-2]}_{p}_s" for c, p in wide.columns]
    wide = wide.reset_index()
    for c in cols:
        if c not in wide:
            wide[c] = 0.0
    wide[cols] = wide[cols].fillna(0.0)
    steps = wide["rank"].map(lambda r: _profile_steps(profile_steps, kernels, r)).to_numpy(float)
    for c in cols:
        wide[c] = wide[c].to_numpy(float) / steps
    wide = wide.merge(_irregular_names(base, anc), on=["rank", "module"], how="left")
    for p in PHASES2:
        col = f"irregular_kernels_{p}"
        wide[col] = wide[col].fillna("") if col in wide else ""
    return wide


def _irregular_names(base: pd.DataFrame, anc: dict) -> pd.DataFrame:
    """The (up to 3) largest irregular kernel names per (rank, module subtree, phase), ','-joined."""
    irr = base[base["irregular_kernel_s"] > 0]
    if irr.empty:
        return pd.DataFrame(columns=["rank", "module"])
    own = irr.groupby(["rank", "module", "phase", "name"], sort=False)["irregular_kernel_s"].sum().reset_index()
    lens = own["module"].map(lambda m: len(anc[m])).to_numpy()
    rep = own.loc[own.index.repeat(lens)].reset_index(drop=True)
    rep["module"] = [a for m in own["module"] for a in anc[m]]
    df = rep.groupby(["rank", "module", "phase", "name"], sort=False)["irregular_kernel_s"].sum().reset_index()
    df = df.sort_values("irregular_kernel_s", ascending=False, kind="stable")
    df["_n"] = df.groupby(["rank", "module", "phase"], sort=False).cumcount()
    df = df[df["_n"] < 3]
    wide = df.pivot(index=["rank", "module", "phase"], columns="_n", values="name")
    joined = wide[0].astype(str)
    for j in range(1, wide.shape[1]):
        joined = joined + ("," + wide[j]).fillna("")
    names = joined.unstack("phase")
    names.columns = [f"irregular_kernels_{p}" for p in names.columns]
    return names.reset_index()


# ------------------------------------------------------------------------------------ derived
def _ratio(num, den) -> np.ndarray:
    num, den = np.asarray(num, float), np.asarray(den, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = num / den
    r = np.where((den == 0) & (num > 0), np.inf, r)
    return np.where((den == 0) & (num == 0), np.nan, r)


def _derive(rec: pd.DataFrame, ctx: Context) -> list:
    """Ratios, achieved rates, intensities and artifact flags; returns the flag lists per row."""
    flags = [[] for _ in range(len(rec))]
    peak, bw = ctx.matrix_peak(), ctx.mem_bandwidth()
    for p in PHASES2:
        meas, pred = rec[f"meas_{p}_s"].to_numpy(float), rec[f"pred_{p}_s"].to_numpy(float)
        rec[f"gap_{p}"] = _ratio(meas, pred)
        rec[f"efficiency_{p}"] = _ratio(pred, meas)
        pos = np.where(meas > 0, meas, np.nan)
        rate = rec[f"flops_{p}"].to_numpy(float) / pos
        bytes_rate = rec[f"bytes_{p}"].to_numpy(float) / pos
        rec[f"intensity_{p}"] = _ratio(rec[f"flops_{p}"].to_numpy(float), rec[f"bytes_{p}"].to_numpy(float))
        over = rate > peak  # NaN peak (no system) -> False
        over_bw = bytes_rate > bw
        rec[f"achieved_flops_{p}_per_s"] = np.where(over, np.nan, rate)
        rec[f"achieved_bytes_{p}_per_s"] = bytes_rate
        for i in np.flatnonzero(over):
            flags[i].append(f"{p}_rate_above_peak")
        for i in np.flatnonzero(over_bw):
            flags[i].append(f"{p}_bandwidth_above_peak")
    rec["gap_recompute"] = _ratio(rec["meas_recompute_s"].to_numpy(float), rec["pred_recompute_s"].to_numpy(float))
    no_bwd = (rec["side"].to_numpy() == "both") & (rec["pred_bwd_s"].to_numpy(float) > 0) & ~np.isfinite(
        rec["meas_bwd_s"].to_numpy(float))
    for i in np.flatnonzero(no_bwd):
        flags[i].append("bwd_not_measured")
    rec["efficiency"] = _ratio(rec["pred_fwd_s"].fillna(0).to_numpy(float) + rec["pred_bwd_s"].fillna(0).to_numpy(float),
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
    hook_overhead_s: cost of the hooks per module call (default ``findings.DEFAULT_HOOK_OVERHEAD_S``);
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
    spec = load_system(system) if system is not None else None
    ctx = Context(thresholds or Thresholds(), spec, dtype,
                  DEFAULT_HOOK_OVERHEAD_S if hook_overhead_s is None else float(hook_overhead_s),
                  hook_overhead_source or ("given" if hook_overhead_s is not None else "assumed default"),
                  other_device or "", contention or "")
    if spec is not None and dtype is not None:
        spec.matrix_peak(dtype)  # an unknown dtype is a UserError now, not a silent NaN later
    pred, meas = _prepare_predicted(predicted), _prepare_measured(measured)
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
    rec = _with_comm(rec, collectives, profile_steps, layouts)
    flags = _derive(rec, ctx)
    _stragglers(rec, flags, ctx.thresholds.straggler_tolerance)
    rec["flags"] = ["+".join(f) for f in flags]
    for col, values in {**diagnose(rec, ctx), **diagnose_recompute(rec, ctx)}.items():
        rec[col] = values
    rec["reason"] = _summary_reason(rec, timed)
    bigger_bwd = rec["pred_bwd_s"].fillna(0) > rec["pred_fwd_s"].fillna(0)
    rec["bound"] = np.where(bigger_bwd, rec["bound_bwd"], rec["bound_fwd"]).astype(object)
    order = _tree_order(list(pred["module"]) + list(meas["module"]))
    rec["_o"] = rec["module"].map(order)
    rec = rec.sort_values(["rank", "_o"], kind="stable", ignore_index=True).drop(columns="_o")
    rec = rec[list(RECONCILED_COLUMNS)]
    in_step = (in_step_waits(collectives, steps, 1 if profile_steps is None else profile_steps)
               if collectives is not None else {})
    totals = _totals(rec, steps, kernels, profile_steps, ctx.thresholds, in_step)
    optim = _root_value(predicted, "pred_optim_s") if "module" in predicted else np.nan
    for row in totals:
        row["pred_optim_s"] = optim
    rec.attrs = {"totals": totals,
                 "system": spec.name if spec is not None else None, "dtype": dtype,
                 "system_label": _spec_label(spec),
                 "system_calibration": dict(spec.calibration) if spec is not None else {},
                 "hook_overhead_s": ctx.hook_overhead_s, "hook_overhead_source": ctx.hook_overhead_source,
                 "other_device": ctx.other_device, "contention": ctx.contention, "thresholds": dict(vars(ctx.thresholds)),
                 "kernel_table": kern is not None}
    return rec


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


# -------------------------------------------------------------------------------------- totals
def _root_value(frame: pd.DataFrame, col: str) -> float:
    if frame.empty or col not in frame:
        return np.nan
    root = frame[frame["module"] == ROOT]
    if len(root):
        return float(root[col].iloc[0])
    top = frame[frame["depth"] == frame["depth"].min()]
    return float(top[col].sum(min_count=1))


def _totals(rec: pd.DataFrame, steps, kernels, profile_steps, thresholds: Thresholds, in_step=None) -> list:
    rows = []
    for rank, part in rec.groupby("rank", sort=True):
        row = {c: np.nan for c in TOTALS_COLUMNS}
        pf, pb = _root_value(part[part["side"] != "measured_only"], "pred_fwd_s"), _root_value(
            part[part["side"] != "measured_only"], "pred_bwd_s")
        row.update(rank=int(rank), pred_fwd_s=pf, pred_bwd_s=pb, pred_step_s=pf + pb,
                   meas_fwd_s=_root_value(part[part["side"] != "predicted_only"], "meas_fwd_s"),
                   meas_bwd_s=_root_value(part[part["side"] != "predicted_only"], "meas_bwd_s"),
                   bare_steps=0, slowest=False, straggler=False)
        if steps is not None and len(steps):
            row.update(_step_totals(steps, rank))
            wait = float((in_step or {}).get(int(rank), 0.0))  # waits inside forward/backward (profiled window)
            row["profiled_step_s"] = profiled_step_s(steps, int(rank), 1 if profile_steps is None else profile_steps)
            row["meas_comm_wait_s"] = np.nan_to_num(row["meas_bwd_finalize_s"]) + wait
            row["meas_compute_s"] = max(row["meas_compute_s"] - wait, 0.0) if np.isfinite(row["meas_compute_s"]) \
                else row["meas_compute_s"]
        if kernels is not None and len(kernels):
            k = kernels[(kernels["rank"].fillna(0).astype(int) == rank) if "rank" in kernels else slice(None)]
            n = _profile_steps(profile_steps, kernels, rank)
            ops = k[k["name"] != "(outside ops)"]
            row["optimizer_kernel_s"] = float(ops.loc[ops["module"] == "(optimizer)", "self_s"].sum()) / n
            row["unattributed_kernel_s"] = float(ops.loc[ops["module"] == "unattributed", "self_s"].sum()) / n
        row["gap_fwd"] = _ratio(row["meas_fwd_s"], row["pred_fwd_s"]).item()
        row["gap_bwd"] = _ratio(row["meas_bwd_s"], row["pred_bwd_s"]).item()
        row["gap_fwd_bwd"] = _ratio(row["meas_fwd_s"] + row["meas_bwd_s"], row["pred_step_s"]).item()
        rows.append(row)
    # compute per rank (step less collective waits), not step time: DDP/FSDP make every rank wait for
    # the slowest, so their step times are equal and the fast ranks' extra time is the wait
    step_times = np.array([r["meas_compute_s"] if np.isfinite(r["meas_compute_s"]) else r["meas_step_s"] for r in rows],
                          float)
    if len(rows) and np.isfinite(step_times).any():
        slow = int(np.nanargmax(step_times))
        rows[slow]["slowest"] = len(rows) > 1
        rows[slow]["straggler"] = bool(len(rows) > 1 and step_times[slow] > (1 + thresholds.straggler_tolerance)
                                       * np.nanmedian(step_times))
    return [{k: (v.item() if isinstance(v, np.generic) else v) for k, v in r.items()} for r in rows]


def _step_totals(steps: pd.DataFrame, rank: int) -> dict:
    s = steps[steps["rank"].fillna(0).astype(int) == rank] if "rank" in steps else steps
    failed = s["failed"].astype(str).str.lower().isin(("true", "1")) if "failed" in s else pd.Series(False, index=s.index)
    if "role" in s:
        ok = s[(s["role"] == "measured") & ~failed]
        bare = s[(s["role"] == "bare") & ~failed]
    else:
        ok = s[s["measured"].astype(str).str.lower().isin(("true", "1")) & ~failed]
        bare = s.iloc[0:0]
    out = {"steps": int(len(ok)), "bare_steps": int(len(bare))}
    if ok.empty:
        return out
    f = {c: ok[c].to_numpy(float) if c in ok else np.zeros(len(ok)) for c in ("fwd_s", "bwd_s", "recompute_s",
                                                                            "optim_s", "step_s", "bwd_finalize_s",
                                                                            "eval_s")}
    med = {c: float(np.median(np.nan_to_num(v) if c in ("recompute_s", "bwd_finalize_s", "eval_s") else v))
           for c, v in f.items()}
    med["compute_s"] = float(np.median(f["step_s"] - np.nan_to_num(f["bwd_finalize_s"])))
    # Medians of each part, so that the parts add up: step = fwd + bwd + recompute + eval + unexplained,
    # unexplained = optim (after backward) + other (before forward, between phases).
    unexplained = med["step_s"] - med["fwd_s"] - med["bwd_s"] - med["recompute_s"] - med["eval_s"]
    out.update(meas_fwd_s=med["fwd_s"], meas_bwd_s=med["bwd_s"], meas_recompute_s=med["recompute_s"],
               meas_eval_s=med["eval_s"],
               meas_optim_s=med["optim_s"], meas_step_s=med["step_s"], unexplained_s=unexplained,
               unexplained_share=unexplained / med["step_s"] if med["step_s"] > 0 else np.nan,
               optim_share=med["optim_s"] / med["step_s"] if med["step_s"] > 0 else np.nan,
               meas_bwd_finalize_s=med["bwd_finalize_s"], meas_compute_s=med["compute_s"],
               # Medians of separate distributions need not add up: a negative remainder is the parts'
               # medians overlapping, not time; it is 0 here and report/text.py says by how much they overlap.
               other_s=max(unexplained - med["optim_s"] - med["bwd_finalize_s"], 0.0))
    if len(bare):
        out["hook_overhead_share"] = float(np.median(f["step_s"]) / np.median(bare["step_s"].to_numpy(float)) - 1.0)
    return out


def totals_frame(rec: pd.DataFrame) -> pd.DataFrame:
    """``rec.attrs["totals"]`` as a DataFrame (TOTALS_COLUMNS), one row per rank."""
    return pd.DataFrame(rec.attrs.get("totals", []), columns=list(TOTALS_COLUMNS))


def rank_summary(rec: pd.DataFrame, tolerance: float | None = None) -> pd.DataFrame:
    """Per module over ranks: min/median/max measured time per phase, the slowest rank, straggler flag."""
    tol = (rec.attrs.get("thresholds") or {}).get("straggler_tolerance", Thresholds().straggler_tolerance) \
        if tolerance is None else tolerance
    m = rec[rec["side"] != "predicted_only"]
    if m.empty:
        return pd.DataFrame(columns=list(RANK_SUMMARY_COLUMNS))
    g = m.groupby("module", sort=False)
    out = g.agg(type=("type", "first"), depth=("depth", "first"), ranks=("rank", "nunique"))
    for p in PHASES2:
        col = f"meas_{p}_s"
        out[f"{col}_min"], out[f"{col}_median"], out[f"{col}_max"] = g[col].min(), g[col].median(), g[col].max()
        idx = m[col].fillna(-1.0).groupby(m["module"], sort=False).idxmax()
        out[f"slowest_rank_{p}"] = m.loc[idx.to_numpy(), "rank"].to_numpy()
    total = (m["meas_fwd_s"].fillna(0) + m["meas_bwd_s"].fillna(0)).groupby(m["module"], sort=False)
    out["straggler"] = (out["ranks"] > 1) & (total.max() > (1 + tol) * total.median())
    return out.reset_index()[list(RANK_SUMMARY_COLUMNS)]


def _spec_label(spec):
    """"NAME (calibrated: where | datasheet)" for report headers (perfcheck.hardware.cache.spec_label)."""
    return spec_label(spec) if spec is not None else None

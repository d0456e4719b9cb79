"""Terminal report: a module tree in the style of DeepSpeed's flops profiler, predicted vs measured.

DeepSpeed prints params, MACs, forward latency and FLOP/s per module, the top modules per depth,
and a summary. This report keeps that shape and adds, for forward AND backward: predicted time,
measured time, gap (measured / predicted), achieved FLOP/s, the predicted bound and the reason for
each large gap. It fixes what DeepSpeed gets wrong: times are printed from SI seconds with at
most "s" as unit (DeepSpeed printed "1.8 Gs" for a CPU forward), params of the model come from
the root row (DeepSpeed printed 0 for ``params per GPU * mp_size`` under ZeRO-3 and for JSC_Tiny),
backward time is per module (DeepSpeed has one model-level backward timer), and rates above the
datasheet peak are printed as "artifact", never as performance.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from perfcheck.analysis.findings import REASONS, findings_table
from perfcheck.analysis.page_faults import summary_text as faults_text
from perfcheck.analysis.totals import rank_summary, totals_frame
from perfcheck.schema import ROOT
from perfcheck.units import fmt_bytes, fmt_count, fmt_gap, fmt_pct, fmt_rate, fmt_time

_BAR = "-" * 100


def _name(row) -> str:
    if row["module"] == ROOT:
        return str(row["type"])
    return f"({row['module'].rsplit('.', 1)[-1]}): {row['type']}"


def _rate(row, p) -> str:
    if f"{p}_rate_above_peak" in str(row.get("flags", "")):
        return "artifact!"
    return fmt_rate(row.get(f"achieved_flops_{p}_per_s"))


def _has_eval(rec: pd.DataFrame) -> bool:
    """True when the run measured eval (grad-disabled) forwards: the tree then shows them in a column."""
    return "meas_eval_s" in rec and bool((rec["meas_eval_s"].fillna(0) > 0).any())


def _tree_rows(rec: pd.DataFrame, depth) -> list:
    part = rec if depth is None else rec[rec["depth"] <= depth]
    evals = _has_eval(rec)
    lines = []
    for r in part.to_dict("records"):
        name = "  " * int(r["depth"]) + _name(r)
        if r["side"] != "both":
            name += " [" + ("not timed (depth=/modules=)" if r["reason"] == "not_instrumented" else
                            "predicted only" if r["side"] == "predicted_only" else "measured only") + "]"
        cells = [name, fmt_count(r["params"]), fmt_count(r["macs_fwd"])]
        for p in ("fwd", "bwd"):
            cells += [fmt_time(r[f"pred_{p}_s"]), fmt_time(r[f"meas_{p}_s"]), fmt_gap(r[f"gap_{p}"]), _rate(r, p)]
        if evals:  # measured only: an eval forward has no prediction to be compared with
            cells.append(fmt_time(r["meas_eval_s"]))
        cells += [r["bound"] or "-", r["reason"] or ""]
        lines.append(cells)
    return lines


_HEAD = ["module", "params", "MACs fwd", "fwd pred", "fwd meas", "gap", "FLOP/s", "bwd pred", "bwd meas", "gap",
         "FLOP/s", "bound", "reason"]


def _table(head: list, rows: list, left=(0,)) -> list:
    widths = [max([len(h)] + [len(str(r[i])) for r in rows]) for i, h in enumerate(head)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i in left or i == len(cells) - 1 else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return [line(head)] + [line(r) for r in rows]


def _optimizer(rec: pd.DataFrame) -> str:
    """The optimizer the prediction costed (analysis.pipeline: attrs["optimizer"]), as 'adamw: ', or ''."""
    name = rec.attrs.get("optimizer")
    return f"{name}: " if name and "not modelled" not in name else ""


def _optimizer_why(rec: pd.DataFrame) -> str:
    name = rec.attrs.get("optimizer")
    return f": {name}" if name and "not modelled" in name else ""


def _summary(t: dict, rec: pd.DataFrame) -> list:
    root = rec[rec["module"] == ROOT]
    src = root if len(root) else rec[rec["depth"] == rec["depth"].min()]
    params = src["params"].max() if "params" in src and src["params"].notna().any() else np.nan
    macs = src["macs_fwd"].max() if src["macs_fwd"].notna().any() else np.nan
    flops_f, flops_b = src["flops_fwd"].max(), src["flops_bwd"].max()
    out = [f"{'params of model:':<44}{fmt_count(params)}",
           f"{'fwd MACs / FLOPs (predicted):':<44}{fmt_count(macs, 'MACs')} / {fmt_count(flops_f, 'FLOP')}",
           f"{'bwd FLOPs (predicted):':<44}{fmt_count(flops_b, 'FLOP')}"]
    for p, label in (("fwd", "fwd latency"), ("bwd", "bwd latency")):
        pred, meas = t.get(f"pred_{p}_s"), t.get(f"meas_{p}_s")
        flops = flops_f if p == "fwd" else flops_b
        rate = flops / meas if meas and meas == meas else math.nan
        out.append(f"{label + ' (predicted | measured | gap):':<44}{fmt_time(pred)} | {fmt_time(meas)} | "
                   f"{fmt_gap(t.get(f'gap_{p}'))}   achieved {fmt_rate(rate)}")
    out.append(f"{'step latency (measured, median):':<44}{fmt_time(t.get('meas_step_s'))}   "
               f"(predicted fwd+bwd {fmt_time(t.get('pred_step_s'))}; "
               + (f"optimizer {_optimizer(rec)}{fmt_time(t.get('pred_optim_s'))} predicted, {fmt_time(t.get('meas_optim_s'))} "
                  "measured with the framework after backward)" if t.get("pred_optim_s") == t.get("pred_optim_s") and
                  t.get("pred_optim_s") is not None else f"the optimizer is not predicted{_optimizer_why(rec)})"))
    share = t.get("unexplained_share")
    out.append(f"{'time no module explains:':<44}{fmt_time(t.get('unexplained_s'))} = {fmt_pct(share)} of the step"
               f" (optimizer/framework after backward {fmt_time(t.get('meas_optim_s'))},"
               + (f" collective waits at the end of backward (DDP/FSDP2) {fmt_time(t.get('meas_bwd_finalize_s'))},"
                  if (t.get('meas_bwd_finalize_s') or 0) > 1e-4 else "")
               + f" loss/data/idle {fmt_time(t.get('other_s'))})"
               + _overlap_note(t))
    if t.get("meas_recompute_s"):
        out.append(f"{'recompute (activation checkpointing):':<44}{fmt_time(t.get('meas_recompute_s'))}")
    if t.get("meas_eval_s"):
        out.append(f"{'eval forwards (grad disabled):':<44}{fmt_time(t.get('meas_eval_s'))} per step "
                   "(validation/EMA/teacher calls; not in fwd latency, not compared with the prediction)")
    out.append(f"{'hook overhead (instrumented vs bare steps):':<44}{hook_text(t)}")
    faults = faults_text(t)
    if faults:
        out.append(f"{'page faults per step (minor, median):':<44}{faults}")
    return out


def hook_text(t: dict) -> str:
    """The in-run A/B hook overhead of a totals record, in words (a negative A/B is noise, not a speed-up)."""
    hook = t.get("hook_overhead_share")
    if hook is None or hook != hook:
        return "not measured (no bare steps)"
    if hook < 0:
        return f"not resolved: bare steps were {fmt_pct(-hook)} slower (noise; {t.get('bare_steps')} bare steps)"
    return f"{fmt_pct(hook)} of the step ({t.get('bare_steps')} bare steps)"


def _top(rec: pd.DataFrame, depth, k: int) -> list:
    out = [f"Top {k} modules in terms of params, MACs, measured fwd/bwd latency and gap at different depths:"]
    max_d = int(rec["depth"].max()) if depth is None else min(int(depth), int(rec["depth"].max()))
    depths = rec["depth"].to_numpy()
    names = np.where(rec["module"].to_numpy() == ROOT, rec["type"].to_numpy(), rec["module"].to_numpy())
    metrics = [(rec[col].to_numpy(dtype=float, na_value=np.nan), label, fmt) for col, label, fmt in (
        ("params", "params", fmt_count), ("macs_fwd", "MACs", fmt_count), ("meas_fwd_s", "fwd latency", fmt_time),
        ("meas_bwd_s", "bwd latency", fmt_time), ("gap_fwd", "fwd gap", fmt_gap), ("gap_bwd", "bwd gap", fmt_gap))]
    for d in range(max_d + 1):
        at = np.flatnonzero(depths == d)
        if not len(at):
            continue
        out.append(f"depth {d}:")
        for values, label, fmt in metrics:
            v = values[at]
            ok = at[np.isfinite(v)]
            best = ok[np.argsort(-values[ok], kind="stable")[:k]]
            items = ", ".join(f"'{names[i]}': {fmt(values[i])}" for i in best)
            out.append(f"    {label:<12}- {{{items}}}")
    return out


def _findings(rec: pd.DataFrame, k: int) -> list:
    f = findings_table(rec)
    if f.empty:
        return ["No large gaps: every module is within the thresholds."]
    th = rec.attrs.get("thresholds", {})
    out = [f"Findings (gap = measured / predicted above {th.get('gap_high', 2):g} or below {th.get('gap_low', 0.5):g};"
           f" largest time lost first, {min(k, len(f))} of {len(f)}):"]
    for r in f.head(k).itertuples(index=False):
        where = r.module + (f" [rank {r.rank}]" if rec["rank"].nunique() > 1 else "")
        out.append(f"  {where} {r.phase}: {r.reason} ({fmt_gap(r.gap)}, {fmt_time(r.meas_s)} vs {fmt_time(r.pred_s)}"
                   f" predicted) - {r.evidence}")
    used = list(dict.fromkeys(f["reason"].head(k)))
    out.append("Reasons:")
    out += [f"  {name}: {REASONS.get(name, '')}" for name in used]
    return out


def _ranks(rec: pd.DataFrame, k: int) -> list:
    t = totals_frame(rec)
    out = ["Per-rank totals (slowest rank marked by compute = step less collective waits, which DDP/FSDP do not "
           "equalise; straggler when its compute exceeds the median over ranks by more than "
           f"{100 * rec.attrs.get('thresholds', {}).get('straggler_tolerance', 0.05):g}%):"]
    rows = [[int(r.rank), fmt_time(r.meas_fwd_s), fmt_time(r.meas_bwd_s), fmt_time(r.meas_step_s),
             fmt_time(r.meas_comm_wait_s), fmt_time(r.meas_compute_s), fmt_pct(r.unexplained_share),
             ("STRAGGLER" if r.straggler else "slowest") if r.slowest else ""] for r in t.itertuples(index=False)]
    out += ["  " + s for s in _table(["rank", "fwd", "bwd", "step", "waits", "compute", "unexplained", ""], rows,
                                     left=())]
    steps = t["meas_step_s"].astype(float)
    if steps.notna().any():
        out.append(f"  step over ranks: min {fmt_time(steps.min())} | median {fmt_time(steps.median())} | "
                   f"max {fmt_time(steps.max())}")
    s = rank_summary(rec)
    s = s.assign(_t=s["meas_fwd_s_max"].fillna(0) + s["meas_bwd_s_max"].fillna(0)).nlargest(k, "_t")
    rows = [[r.module, f"{fmt_time(r.meas_fwd_s_min)} / {fmt_time(r.meas_fwd_s_median)} / {fmt_time(r.meas_fwd_s_max)}",
             str(r.slowest_rank_fwd), f"{fmt_time(r.meas_bwd_s_min)} / {fmt_time(r.meas_bwd_s_median)} / "
             f"{fmt_time(r.meas_bwd_s_max)}", str(r.slowest_rank_bwd), "straggler" if r.straggler else ""]
            for r in s.itertuples(index=False)]
    out.append(f"Modules over ranks (top {len(rows)} by slowest-rank time; min / median / max):")
    out += ["  " + s for s in _table(["module", "fwd", "slowest", "bwd", "slowest", ""], rows, left=(0,))]
    return out


def comm_rows(part: pd.DataFrame, depth=None) -> list:
    """(module, phase, row) of one rank's modules with predicted or measured collectives, tree order:
    the rows of the collectives-per-module section (text and HTML)."""
    if not any(f"meas_comm_{p}_bytes" in part for p in ("fwd", "bwd")):
        return []
    sel = part if depth is None else part[part["depth"] <= depth]
    out = []
    for r in sel.to_dict("records"):
        for p in ("fwd", "bwd"):
            vals = [r.get(c) for c in (f"comm_{p}_bytes", f"meas_comm_{p}_bytes", f"meas_comm_wait_{p}_s")]
            if any(v is not None and v == v and v > 0 for v in vals):
                out.append((r["module"], p, r))
    return out


def _comm(part: pd.DataFrame, depth, k: int) -> list:
    rows = comm_rows(part, depth)
    if not rows:
        return []
    rank = int(part["rank"].iloc[0]) if len(part) else 0
    measured = part["meas_comm_fwd_bytes"].notna().any()
    out = [f"Collectives per module (rank {rank}, per step): bytes the module's subtree moves, predicted and measured; "
           "bytes and collectives the module itself issued (issued by); time it itself waited on collectives "
           "(waited on)." + ("" if measured else " Not measured: the run has no collectives.csv (profiler off or "
                                                 "no collective in its window).")]
    table = [[r["module"], p, fmt_bytes(r[f"comm_{p}_bytes"]), fmt_bytes(r[f"meas_comm_{p}_bytes"]),
              fmt_bytes(r[f"meas_comm_own_{p}_bytes"]), fmt_count(r[f"meas_comm_own_{p}_count"]),
              fmt_time(r[f"meas_comm_wait_own_{p}_s"])] for m, p, r in rows]
    out += ["  " + ln for ln in _table(["module", "phase", "pred bytes", "meas bytes", "issued here", "count",
                                        "waited here"], table, left=(0, 1))]
    waits = sorted(((r[f"meas_comm_wait_own_{p}_s"], m, p, r[f"comm_waits_{p}"]) for m, p, r in rows
                    if r.get(f"comm_waits_{p}")), key=lambda w: -w[0])
    if waits:
        n = max(k, 10)
        out.append(f"Waits, largest first ({min(n, len(waits))} of {len(waits)}; who issued the collective, who waited):")
        out += [f"  {m} {p}: {text}" for _, m, p, text in waits[:n]]
    return out


def _overlap_note(t: dict) -> str:
    """Why loss/data/idle shows 0: the remainder of the per-part medians was negative (they overlap)."""
    parts = [t.get(k) for k in ("unexplained_s", "meas_optim_s", "meas_bwd_finalize_s")]
    if any(p is None or p != p for p in parts[:2]):
        return ""
    raw = parts[0] - parts[1] - (parts[2] if parts[2] == parts[2] and parts[2] is not None else 0.0)
    return (f"\n{'':<44}(loss/data/idle shown as 0: the medians of the parts overlap by {fmt_time(-raw)}; "
            "they are medians of separate per-step distributions)") if raw < 0 else ""


def render_text(rec: pd.DataFrame, *, depth: int | None = None, top: int = 3, rank: int | None = None) -> str:
    """The terminal report of a reconciled frame (``perfcheck.reconcile``) as one string.

    depth: deepest module depth shown in the tree and the top-modules list (None: all).
    top: how many modules per depth in the top lists, and how many findings.
    rank: the rank whose tree is shown (default: the slowest rank of a multi-rank run, else the only one).
    """
    if depth is not None and depth < 0:
        depth = None
    ranks = sorted(rec["rank"].unique().tolist())
    totals = {r["rank"]: r for r in rec.attrs.get("totals", [])}
    if rank is None:
        slow = [r for r, t in totals.items() if t.get("slowest")]
        rank = slow[0] if slow else (ranks[0] if ranks else 0)
    part = rec[rec["rank"] == rank]
    part.attrs = rec.attrs
    title = " perfcheck: predicted vs measured "
    out = [f"{title:-^100}"]
    meta = [f"system: {rec.attrs.get('system_label') or rec.attrs.get('system') or '(none: no datasheet roofs)'}"]
    if rec.attrs.get("dtype"):
        meta.append(f"dtype: {rec.attrs['dtype']}")
    meta.append(f"ranks: {len(ranks)}" + (f" (tree below: rank {rank})" if len(ranks) > 1 else ""))
    n = rec.attrs.get("micro_batches", 1)
    if n not in (None, 1):  # gradient accumulation: analysis.pipeline scaled the one-micro-batch prediction
        meta.append(f"prediction scaled by {n:g} micro-batches")
    t = totals.get(rank, {})
    if t.get("steps") == t.get("steps"):
        meta.append(f"measured steps: {t.get('steps')}")
    out += [", ".join(meta)] + [f"note: {n}" for n in rec.attrs.get("notes", [])] + [""]
    out += _summary(t, part)
    if len(ranks) > 1:
        out += ["", *_ranks(rec, top)]
    out += ["", _BAR, *_top(part, depth, top), "", _BAR]
    out.append("Each module: params, forward MACs, then for forward and backward: predicted time, measured time "
               "(median per step), gap = measured/predicted, achieved FLOP/s (predicted FLOPs / measured time); "
               "then the predicted bound and the reason for a large gap.")
    if _has_eval(part):
        out.append("eval meas: forward calls made with grad disabled (validation, EMA/teacher) per step, measured "
                   "only: never joined with the training-forward prediction.")
    out += _table(_HEAD[:-2] + ["eval meas"] + _HEAD[-2:] if _has_eval(part) else _HEAD, _tree_rows(part, depth))
    untimed = int((part["reason"] == "not_instrumented").sum())
    if untimed:  # PerfCheck(depth=/modules=): say why those rows have no measurement
        out.append(f"{untimed} module(s) marked 'not timed' are outside PerfCheck's depth=/modules= selection: "
                   "their time is inside their nearest timed ancestor's row.")
    comm = _comm(part, depth, top)
    if comm:
        out += ["", _BAR, *comm]
    out += ["", _BAR, *_findings(part if len(ranks) == 1 else rec, top), _BAR]
    return "\n".join(out) + "\n"

"""Per-rank totals of the reconciled frame (``TOTALS_COLUMNS``: predicted and measured step parts, the
slowest rank, the straggler) and the per-module summary over ranks (``RANK_SUMMARY_COLUMNS``)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from perfcheck.analysis.columns import PHASES2, RANK_SUMMARY_COLUMNS, TOTALS_COLUMNS
from perfcheck.analysis.comm import profiled_step_s
from perfcheck.analysis.kernels import profile_steps_of
from perfcheck.analysis.thresholds import Thresholds
from perfcheck.schema import ROOT

def ratio(num, den) -> np.ndarray:
    num, den = np.asarray(num, float), np.asarray(den, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = num / den
    r = np.where((den == 0) & (num > 0), np.inf, r)
    return np.where((den == 0) & (num == 0), np.nan, r)


def root_value(frame: pd.DataFrame, col: str) -> float:
    if frame.empty or col not in frame:
        return np.nan
    root = frame[frame["module"] == ROOT]
    if len(root):
        return float(root[col].iloc[0])
    top = frame[frame["depth"] == frame["depth"].min()]
    return float(top[col].sum(min_count=1))


def totals_records(rec: pd.DataFrame, steps, kernels, profile_steps, thresholds: Thresholds, in_step=None) -> list:
    rows = []
    for rank, part in rec.groupby("rank", sort=True):
        row = {c: np.nan for c in TOTALS_COLUMNS}
        pf, pb = root_value(part[part["side"] != "measured_only"], "pred_fwd_s"), root_value(
            part[part["side"] != "measured_only"], "pred_bwd_s")
        row.update(rank=int(rank), pred_fwd_s=pf, pred_bwd_s=pb, pred_step_s=pf + pb,
                   meas_fwd_s=root_value(part[part["side"] != "predicted_only"], "meas_fwd_s"),
                   meas_bwd_s=root_value(part[part["side"] != "predicted_only"], "meas_bwd_s"),
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
            n = profile_steps_of(profile_steps, kernels, rank)
            ops = k[k["name"] != "(outside ops)"]
            row["optimizer_kernel_s"] = float(ops.loc[ops["module"] == "(optimizer)", "self_s"].sum()) / n
            row["unattributed_kernel_s"] = float(ops.loc[ops["module"] == "unattributed", "self_s"].sum()) / n
        row["gap_fwd"] = ratio(row["meas_fwd_s"], row["pred_fwd_s"]).item()
        row["gap_bwd"] = ratio(row["meas_bwd_s"], row["pred_bwd_s"]).item()
        row["gap_fwd_bwd"] = ratio(row["meas_fwd_s"] + row["meas_bwd_s"], row["pred_step_s"]).item()
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
    for c in ("minor_faults_fwd", "minor_faults_bwd", "minor_faults_optim", "minor_faults_step", "major_faults_step"):
        v = pd.to_numeric(ok[c], errors="coerce").dropna() if c in ok else ()
        if len(v):  # (a run recorded before the fault columns, or without a counter: NaN)
            out[c] = float(np.median(v))
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

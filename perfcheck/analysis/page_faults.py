"""Page faults of a step's phases against their predictions: the ``page_faults`` finding.

A CPU step that frees memory and allocates it again each step (``optimizer.zero_grad(set_to_none=True)``,
torch's default, frees every gradient; glibc hands a block above its mmap threshold back to the OS and the
next allocation gets fresh pages) pays a minor page fault for every 4 KiB page it first-touches again, inside
the phase that touches it. No FLOP or byte count predicts it, and whether it happens depends on the C
allocator's state, so it is measured (``measure.page_faults``: steps.csv ``minor_faults_<phase>``) and
explained here when the phase is slower than predicted:

    first-touched bytes  = minor faults x page size (meta.json ``page_faults.page_bytes``; a fault maps one page)
    fault time (estimate) = minor faults x seconds per fault (meta.json ``page_faults.cost``, measured in the
                            run's process by ``measure.fault_cost``)

The fault time is an upper bound of what the faults cost the step: the kernel's time per fault includes
zeroing the page, which leaves it in cache for the step's own first write (on the DLRM-style workload of
bench/results/page_faults.md the estimate was 1.3 ms where removing the faults saved about 0.8 ms).

The finding (one per rank and phase: fwd, bwd, optim) needs the phase measured above its prediction, at least
``Thresholds.page_fault_min`` minor faults per step (median over measured steps), and, where the cost is
known, an estimated fault time of at least ``Thresholds.page_fault_share`` of the phase's measured time.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from perfcheck.analysis.thresholds import Context
from perfcheck.units import fmt_bytes, fmt_count, fmt_pct, fmt_time

#: The phases with fault counts, and their words.
FAULT_PHASES = {"fwd": "forward", "bwd": "backward", "optim": "optimizer (after backward)"}

REMEDY = ("memory freed and re-allocated every step (e.g. zero_grad(set_to_none=True) frees gradients; glibc "
          "returns large blocks to the OS); remedies: zero_grad(set_to_none=False) keeps the gradients (a memset "
          "per step instead of the faults), MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ set together (glibc's "
          "environment, e.g. both 4294967296) keep freed blocks in the heap (setting only one turns glibc's dynamic "
          "threshold off and can add faults), or another allocator such as jemalloc or tcmalloc (LD_PRELOAD)")


def _num(value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return math.nan
    return v


def fault_cost_of(meta: dict) -> tuple:
    """``(seconds per fault, page bytes)`` from a rank's meta.json ``page_faults`` (NaN where absent)."""
    info = meta.get("page_faults") if isinstance(meta, dict) else None
    if not isinstance(info, dict):
        return math.nan, math.nan
    cost = info.get("cost") if isinstance(info.get("cost"), dict) else {}
    return _num(cost.get("seconds_per_fault")), _num(info.get("page_bytes"))


def add_fault_costs(rec: pd.DataFrame, metas: dict) -> None:
    """Put each rank's measured cost per fault and page size into ``rec.attrs["totals"]`` (in place)."""
    for row in rec.attrs.get("totals", []):
        cost, page = fault_cost_of(metas.get(row.get("rank"), metas.get(int(row.get("rank", 0)), {})))
        row["fault_cost_s"], row["page_bytes"] = cost, page


def estimate(t, phase: str) -> tuple:
    """``(minor faults, first-touched bytes, fault seconds)`` per step of ``phase`` in a totals record ``t``
    (NaN where the run has no count, page size or cost)."""
    faults = _num(t.get(f"minor_faults_{phase}"))
    return faults, faults * _num(t.get("page_bytes")), faults * _num(t.get("fault_cost_s"))


def _pred_meas(rows, phase: str):
    pred = rows[f"pred_{phase}_s"].to_numpy(dtype=float, na_value=np.nan) if f"pred_{phase}_s" in rows else None
    meas = rows[f"meas_{phase}_s"].to_numpy(dtype=float, na_value=np.nan) if f"meas_{phase}_s" in rows else None
    n = len(rows)
    return (np.full(n, np.nan) if pred is None else pred), (np.full(n, np.nan) if meas is None else meas)


def match(rows: pd.DataFrame, phase: str, ctx: Context) -> np.ndarray:
    """Per totals row (rank): the phase ran longer than predicted and took many first-touch faults."""
    t = ctx.thresholds
    col = f"minor_faults_{phase}"
    faults = rows[col].to_numpy(dtype=float, na_value=np.nan) if col in rows else np.full(len(rows), np.nan)
    cost = rows["fault_cost_s"].to_numpy(dtype=float, na_value=np.nan) if "fault_cost_s" in rows \
        else np.full(len(rows), np.nan)
    pred, meas = _pred_meas(rows, phase)
    with np.errstate(invalid="ignore"):
        slower = np.isfinite(pred) & np.isfinite(meas) & (meas > pred)
        many = np.isfinite(faults) & (faults >= t.page_fault_min)
        weighty = ~np.isfinite(cost) | (faults * cost >= t.page_fault_share * meas)
    return slower & many & weighty


def evidence(r, phase: str, ctx: Context) -> str:
    """"backward: N minor page faults per step (~X first-touched; ~Y at this machine's measured cost per fault
    ...): <why>; remedies: ..."."""
    faults, touched, seconds = estimate(r, phase)
    page = _num(r.get("page_bytes"))
    size = f"~{fmt_bytes(touched)} first-touched at {fmt_bytes(page)} per fault" if math.isfinite(touched) \
        else "first-touched pages"
    meas = _num(r.get(f"meas_{phase}_s"))
    if math.isfinite(seconds):
        cost = (f"up to ~{fmt_time(seconds)} at this machine's measured {fmt_time(_num(r.get('fault_cost_s')))} per "
                f"fault = {fmt_pct(seconds / meas) if meas > 0 else '-'} of the {fmt_time(meas)} measured, "
                f"{fmt_time(_num(r.get(f'pred_{phase}_s')))} predicted; up to: the kernel zeroes each page, which then "
                "saves the step's own first write some cache misses")
    else:
        cost = "the cost per fault was not measured in this run (meta.json page_faults.cost)"
    major = _num(r.get("major_faults_step"))
    disk = f"; {fmt_count(major)} major faults per step (pages read from disk)" if major > 0 else ""
    return (f"{FAULT_PHASES.get(phase, phase)}: {fmt_count(faults)} minor page faults per step ({size}; {cost})"
            f"{disk}: {REMEDY}")


def lost_seconds(r, phase: str) -> float:
    """The time the finding accounts for: the estimated fault time, at most the phase's excess over its
    prediction; the excess itself where the cost per fault is unknown."""
    _, _, seconds = estimate(r, phase)
    excess = _num(r.get(f"meas_{phase}_s")) - _num(r.get(f"pred_{phase}_s"))
    return min(seconds, excess) if math.isfinite(seconds) else excess


def summary_text(t: dict) -> str:
    """The report's line: minor faults per step by phase, first-touched bytes, the measured cost per fault;
    '' when the run recorded no fault counts."""
    counts = {p: _num(t.get(f"minor_faults_{p}")) for p in ("fwd", "bwd", "optim", "step")}
    if not math.isfinite(counts["step"]):
        return ""
    page, cost = _num(t.get("page_bytes")), _num(t.get("fault_cost_s"))
    out = (f"fwd {fmt_count(counts['fwd'])} | bwd {fmt_count(counts['bwd'])} | optimizer {fmt_count(counts['optim'])}"
           f" | step {fmt_count(counts['step'])}")
    if math.isfinite(page) and counts["step"] > 0:
        out += f" (~{fmt_bytes(counts['step'] * page)} first-touched per step"
        out += f"; {fmt_time(cost)} per fault measured)" if math.isfinite(cost) else "; cost per fault not measured)"
    major = _num(t.get("major_faults_step"))
    if major > 0:
        out += f"; {fmt_count(major)} major"
    return out

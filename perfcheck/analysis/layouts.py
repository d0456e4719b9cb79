"""Reconcile runs of one model under torch-native layouts (DDP, FSDP2, TP+SP...): predicted vs
measured bytes per collective kind, memory and step time, one row per (run, rank).

The torch-native counterpart of ``stages.py`` (ZeRO stages), with the same column rule
``pred_<what>`` / ``meas_<what>`` and the same bytes check (``stages.bytes_within``, 5%):

    <kind>_bytes     S bytes per optimizer step per collective kind (predicted: rank<R>/predicted_collectives.csv,
                     S x calls_per_step,
                     written by PerfCheck from the live layout; measured: rank<R>/collectives.csv
                     from the profiler window, per profiled step)
    step_s           predicted root forward + backward per optimizer step (x meta.json micro_batches,
                     less the gradient reductions no_sync() skipped); measured median step time
    peak_mem_bytes   measured peak (CUDA only; NaN on CPU)

plus ``layout`` (meta.json ``parallel.kind``), ``dp``, ``tp``, ``fsdp``, ``mesh_shape``, ``top_wait`` /
``top_wait_s`` (the rank's largest wait on collectives per profiled step in words: kind, bytes, the
module that issued it and the one that waited; ``analysis.comm``) and ``notes`` (answers drawn from
the rows: which layout moves the most bytes, which is fastest).
"""
from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

import perfcheck.rundir as runs
from perfcheck.analysis.comm import in_step_waits, sentence, wait_pairs
from perfcheck.analysis.pipeline import scale_by_micro_batches
from perfcheck.analysis.stages import bytes_within
from perfcheck.analysis.step_comm import per_step_comm
from perfcheck.analysis.thresholds import Thresholds
from perfcheck.measure.collectives import COLLECTIVE_COLUMNS, COLLECTIVES_CSV
from perfcheck.predict.for_run import load_predicted, system_from_meta
from perfcheck.predict.layout_collectives import bytes_per_step
from perfcheck.predict.zero import KINDS


def is_layout_run(run_dir) -> bool:
    """A PerfCheck run (rank*/meta.json) that is not a DeepSpeed run (no rank*/zero.json)."""
    d = Path(run_dir)
    return any(d.glob("rank*/meta.json")) and not any(d.glob("rank*/zero.json"))


def _table(path: Path, columns, what: str) -> pd.DataFrame:
    """A run-directory CSV through ``rundir.read_table`` (columns checked); empty when absent."""
    return runs.read_table(path, columns, what) if path.is_file() else pd.DataFrame()


def _row(run_dir: Path, rank_dir: Path) -> dict:
    meta = runs.read_versioned_json(rank_dir / runs.META)
    par = meta.get("parallel") or {}
    row = {"run": run_dir.name, "rank": int(meta.get("rank", 0)), "layout": par.get("kind", "none"),
           "world_size": meta.get("world_size", 1), "dp": par.get("dp", 1), "tp": par.get("tp", 1),
           "fsdp": par.get("fsdp", 1), "mesh_shape": str(par.get("mesh_shape", "")),
           "status": "ok" if meta.get("complete") else "failed"}
    pred = _table(rank_dir / "predicted_collectives.csv", ("kind", "bytes"), "predicted collectives")
    pred_bytes = bytes_per_step(pred)  # per optimizer step: S x calls_per_step (micro-batches, synced ones)
    meas = _table(rank_dir / COLLECTIVES_CSV, COLLECTIVE_COLUMNS, "collectives")
    active = max(1, int(((meta.get("profile") or {}).get("window") or {}).get("active", 1))
                 if isinstance(meta.get("profile"), dict) else 1)
    for k in KINDS:
        row[f"pred_{k}_bytes"] = pred_bytes.get(k, 0.0)
        issued = meas[(meas.get("what") == "issued") & (meas.get("kind") == k)] if not meas.empty else meas
        row[f"meas_{k}_bytes"] = float(issued["bytes"].sum()) / active if not meas.empty else math.nan
    predicted, info = load_predicted(run_dir, ranks=(int(meta.get("rank", 0)),))
    predicted = predicted if predicted is not None else pd.DataFrame()
    n = meta.get("micro_batches")
    if not predicted.empty and isinstance(n, (int, float)) and not isinstance(n, bool) and n > 1:
        # per optimizer step, as the reconciled report (analysis.pipeline): x micro-batches, less the
        # gradient reductions no_sync() skipped (analysis.step_comm.per_step_comm)
        rank = int(meta.get("rank", 0))
        predicted, _ = per_step_comm(scale_by_micro_batches(predicted, n),
                                     SimpleNamespace(ranks=[rank], run_dir=run_dir, meta={rank: meta}), n,
                                     info.get("spec") or info.get("system") or system_from_meta(meta))
    root = predicted[predicted["module"] == "(root)"] if not predicted.empty else predicted
    row["pred_step_s"] = float(root["pred_fwd_s"].iloc[0] + root["pred_bwd_s"].iloc[0]) if not root.empty else math.nan
    steps = _table(rank_dir / runs.TABLES["steps"][0], runs.TABLES["steps"][1], "steps")
    ok = steps[(steps["role"] == "measured") & (~steps["failed"].astype(bool))] if not steps.empty else steps
    row["meas_step_s"] = float(ok["step_s"].median()) if not ok.empty else math.nan
    row["meas_peak_mem_bytes"] = float(ok["peak_mem_bytes"].max()) if not ok.empty else math.nan
    # waits: the end-of-backward callbacks (DDP's all-reduce wait, FSDP2's reduce-scatter wait) from the
    # measured steps (steps.csv bwd_finalize_s); waits inside the step (FSDP2 all-gathers, DTensor
    # redistributes) from the profiler window's waited rows, per profiled step
    finalize = float(ok["bwd_finalize_s"].fillna(0).median()) if not ok.empty and "bwd_finalize_s" in ok else 0.0
    row["meas_wait_s"] = finalize + sum(in_step_waits(meas, steps, active).values())
    row["meas_compute_s"] = row["meas_step_s"] - row["meas_wait_s"]
    pairs = wait_pairs(meas, active)
    top = next(pairs.itertuples(index=False), None)  # wait_pairs sorts the largest wait first
    row["top_wait_s"] = float(top.wait_s) if top is not None else 0.0
    row["top_wait"] = sentence(top, row["layout"]) if top is not None else ""
    row["bytes_ok"] = bytes_within(row)
    return row


def reconcile_layouts(run_dirs) -> pd.DataFrame:
    rows = []
    for run_dir in map(Path, run_dirs):
        for d in sorted(run_dir.glob("rank*")):
            if (d / "meta.json").is_file():
                rows.append(_row(run_dir, d))
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame["notes"] = notes(frame)
    return frame.sort_values(["run", "rank"], ignore_index=True)


def notes(frame: pd.DataFrame) -> list:
    """One line per row, drawn from the table: bytes agreement, the layout with most traffic, the
    fastest layout, and the rank with the most compute (the straggler: waits equalise step times)."""
    meas_cols = [f"meas_{k}_bytes" for k in KINDS]
    traffic = frame.groupby("run")[meas_cols].mean().sum(axis=1)
    speed = frame.groupby("run")["meas_step_s"].median()
    heaviest = traffic.idxmax() if traffic.notna().any() else None
    fastest = speed.idxmin() if speed.notna().any() else None
    out = []
    for r in frame.itertuples(index=False):
        parts = ["bytes match the prediction per kind" if r.bytes_ok else "bytes differ from the prediction"]
        if r.run == heaviest and len(traffic) > 1:
            parts.append(f"most collective traffic ({traffic[r.run]:.0f} B/step)")
        if r.run == fastest and len(speed) > 1:
            parts.append("fastest step")
        same = frame[frame["run"] == r.run]
        if len(same) > 1 and same["meas_compute_s"].notna().all() and r.meas_compute_s == same["meas_compute_s"].max():
            median = float(same["meas_compute_s"].median())
            slow = r.meas_compute_s > (1 + Thresholds().straggler_tolerance) * median
            parts.append(f"{'straggler' if slow else 'slowest rank'}: most compute of its run's ranks "
                         f"({r.meas_compute_s * 1e3:.1f} ms against a median of {median * 1e3:.1f} ms; step less "
                         "collective waits, which DDP/FSDP equalise)")
        out.append("; ".join(parts))
    return out


def answers(frame: pd.DataFrame) -> list:
    """[(question, answer)] for the layout comparison, every number drawn from ``frame``."""
    if frame is None or frame.empty:
        return [("Which runs were compared?", "none: no rank directory with meta.json was found")]
    out = []
    bad = frame[~frame["bytes_ok"].astype(bool)]
    out.append(("Do the predicted bytes match the measured bytes per collective kind?",
                "yes, within 5% on every rank of every run" if bad.empty else
                "no: " + "; ".join(f"{r.run} rank {r.rank} ({r.layout})" for r in bad.itertuples(index=False))
                + " differ by more than 5% on some kind"))
    meas_cols = [f"meas_{k}_bytes" for k in KINDS]
    per_run = frame.groupby("run", sort=False)
    traffic = per_run[meas_cols].mean().sum(axis=1)
    speed = per_run["meas_step_s"].median()
    layout = per_run["layout"].first()
    if traffic.notna().any() and len(traffic) > 1:
        heavy, light = traffic.idxmax(), traffic.idxmin()
        out.append(("Which layout moves the most bytes per step?",
                    f"{heavy} ({layout[heavy]}): {traffic[heavy]:.0f} B per rank; the least: {light} "
                    f"({layout[light]}), {traffic[light]:.0f} B"))
    if speed.notna().any() and len(speed) > 1:
        fast, slow = speed.idxmin(), speed.idxmax()
        out.append(("Which layout has the shortest step?",
                    f"{fast} ({layout[fast]}): {speed[fast] * 1e3:.2f} ms median over ranks; the longest: {slow} "
                    f"({layout[slow]}), {speed[slow] * 1e3:.2f} ms"))
    for run, same in per_run:
        waits = same[same["top_wait_s"] > 0] if "top_wait_s" in same else same.iloc[0:0]
        if len(waits):
            r = waits.loc[waits["top_wait_s"].idxmax()]
            out.append((f"Where does {run} wait longest on a collective?",
                        f"rank {int(r['rank'])}: {r['top_wait']} (per profiled step)"))
        if len(same) < 2 or not same["meas_compute_s"].notna().all():
            continue
        r = same.loc[same["meas_compute_s"].idxmax()]
        med = float(same["meas_compute_s"].median())
        if r["meas_compute_s"] > (1 + Thresholds().straggler_tolerance) * med:
            out.append((f"Is a rank of {run} a straggler?",
                        f"rank {int(r['rank'])}: {r['meas_compute_s'] * 1e3:.1f} ms of compute (step less collective "
                        f"waits) against a median of {med * 1e3:.1f} ms; the other ranks wait for it "
                        f"({same['meas_wait_s'].max() * 1e3:.1f} ms at most)"))
    return out

"""Reconcile DeepSpeed runs, one per ZeRO stage: predicted (``predict/zero.py``) vs measured.

One row per (stage, rank). Every predicted quantity sits next to its measured twin under one
rule, ``pred_<what>`` / ``meas_<what>``:

    <kind>_bytes, <kind>_count     per optimizer step, kind in allreduce/allgather/reducescatter/reduce;
                                   bytes are the full buffer S (nccl-tests), from the comms logger
    <phase>_comm_bytes             fwd / bwd / step (optimizer) phase totals
    comm_bytes, wire_bytes         totals: S, and what one rank sends (S * bus factor)
    mem_bytes                      model states per rank (params + grads + optimizer states);
    param_mem_bytes, grad_mem_bytes, optim_mem_bytes   its parts
    fwd_s, bwd_s, optim_s, step_s  per optimizer step (engine calls; medians over measured steps)
    <phase>_compute_s, <phase>_comm_s   split into compute and EXPOSED communication
                                   (measured: the exposed share of the phase in the torch.profiler window,
                                   comms logger off, times the phase's median: ``measured_exposed``)

``pred_<phase>_wait_s`` (the expected wait for the latest rank at the phase's ``pred_<phase>_syncs`` blocking
collectives or waited batches: ``perfcheck.predict.collectives.straggler_wait_s``; part of ``pred_<phase>_s``),
``pred_batched_calls`` (collectives per step issued with async_op=True and waited together, priced as batches),
``local_processes`` (ranks on the rank's host) and ``pred_process_slowdown`` (the factor the host and
CPU-compute terms were multiplied by for them: ``perfcheck.predict.host.process_slowdown``; 1 for one rank),
plus ``meas_<phase>_cpu_s`` / ``meas_step_cpu_s`` (process CPU time in the engine calls: the elapsed time
less waiting for a core or for the peer ranks' collectives), ``meas_other_s`` (step wall time outside
the engine calls), ``meas_peak_mem_bytes``,
``meas_gpu_util`` / ``meas_cpu_util`` (the sampler) and ``notes`` explaining every remainder.
``meas_ref_s`` / ``meas_cref_s`` are the calibration's two references read by the ranks between steps
(``perfcheck.measure.speed``), ``meas_host_speed`` / ``meas_compute_speed`` the same over the calibration's
reference times (> 1: the machine ran slower than when it was calibrated), and ``pred_<phase>_at_run_s`` /
``pred_step_at_run_s`` the prediction set at that speed (``perfcheck.predict.run_speed``): measured over it is
the model's error with the machine's drift since the calibration taken out.
A stage whose run failed keeps its row with ``status`` = failed and the tail of its log.
The prediction side (the ZeRO model for what a rank recorded) is ``analysis.stage_prediction``.
"""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import pandas as pd

import perfcheck.rundir as runs
import perfcheck.rundir.deepspeed_files as run_files
from perfcheck.analysis.answers import notes
from perfcheck.analysis.pipeline import reconcile_run
from perfcheck.analysis.stage_prediction import (at_run_times, host_shares, local_processes, outside_model_s, predict,
                                                 stage_system, zero3_parts)
from perfcheck.errors import UserError
from perfcheck.hardware.labels import spec_label
from perfcheck.hardware.systems import load_system
from perfcheck.predict import for_run, run_speed, zero
from perfcheck.predict.for_run import load_predicted
from perfcheck.predict.host import process_slowdown
from perfcheck.predict.zero import KINDS
PHASES = {"fwd": "fwd", "bwd": "bwd", "step": "optim"}
#: Predicted parts with no measured twin: no clock separates them from the rest of their phase on a run
#: (the host share of each phase; ZeRO-3's hooks and fetches; all-gather time, of which the profiler sees
#: only the exposed part of every collective together). The stage-3 answer sets them beside the phases.
#: ``pred_process_slowdown`` is the factor the prediction applied for the ranks sharing a host (an input).
PREDICTED_ONLY = ("pred_fwd_host_s", "pred_bwd_host_s", "pred_optim_host_s", "pred_zero3_hooks_s",
                  "pred_zero3_gather_host_s", "pred_allgather_s", "pred_process_slowdown",
                  "pred_fwd_wait_s", "pred_bwd_wait_s", "pred_optim_wait_s",
                  "pred_fwd_syncs", "pred_bwd_syncs", "pred_optim_syncs", "pred_batched_calls",
                  # the prediction at the run's speed: its measured twins are the plain meas_<phase>_s / _cpu_s
                  "pred_fwd_at_run_s", "pred_bwd_at_run_s", "pred_optim_at_run_s", "pred_step_at_run_s")
BYTES_TOLERANCE = 0.05
LOG_NAMES = ("launcher.log", "log.txt")


def _read_json(path: Path):
    try:
        return runs.read_json(path) if path.is_file() else None
    except UserError:  # damaged, oversized or a link out of the run directory: treated as absent
        return None


_SALIENT = ("Error", "error:", "Exception", "Killed", "out of memory", "OOM", "exits with return code", "Traceback")


def log_tail(run_dir: Path, lines: int = 12) -> str:
    """The first salient lines (errors, kills, exits) of a run's launcher log, then its last lines."""
    for name in LOG_NAMES:
        p = Path(run_dir) / name
        if p.is_file():
            try:  # the last MiB only, and never through a link out of the run directory
                raw = runs.read_text(p, limit=1 << 20, tail=True)
            except UserError as exc:
                return f"({name} not read: {exc})"
            text = [t for t in raw.splitlines()
                    if "FutureWarning" not in t and "return func(*args" not in t]
            salient = []
            for t in text:
                if any(k in t for k in _SALIENT) and t not in salient:
                    salient.append(t)
            head = salient[:5]
            tail = [t for t in text[-lines:] if t not in head]
            return "\n".join(head + (["..."] if head and tail else []) + tail)
    return ""


def expand_run_dirs(paths) -> list:
    """Run directories (rank*/ inside) from the arguments; a sweep directory expands to its stage*/."""
    out = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise UserError(f"{p}: run directory not found")
        subs = sorted(q for q in p.iterdir() if q.is_dir() and q.name.startswith("stage"))
        if not any(p.glob("rank*")) and subs:
            out.extend(subs)
        else:
            out.append(p)
    return out


def _stage_from_name(run_dir: Path):
    cfg = (_read_json(run_dir / "run.json") or {}).get("config", {})
    if "zero_optimization" in cfg:
        return int(cfg["zero_optimization"].get("stage", 0))
    digits = "".join(ch for ch in run_dir.name if ch.isdigit())
    return int(digits) if digits else -1


def _save_problems(rank_dir: Path, facts: dict) -> list:
    """Why a rank that wrote zero.json still failed: the engine wrapper's PerfCheck failed (its warning
    in zero.json), or the per-module files of a run whose block asked for them were not saved
    (meta.json missing or marked incomplete)."""
    out = [f"rank {facts.get('rank')}: {w}" for w in facts.get("warnings") or []
           if w.startswith(("PerfCheck.stop failed", "PerfCheck.step failed", "per-module measurement off"))]
    wrote_tables = (rank_dir / runs.TABLES["steps"][0]).is_file()
    if facts.get("complete") and wrote_tables:  # PerfCheck ran on this rank: its meta.json must be complete
        meta = _read_json(rank_dir / runs.META)
        if meta is None:
            out.append(f"{rank_dir / runs.META}: missing or unreadable (the rank's per-module tables were not saved)")
        elif not meta.get("complete"):
            out.append(f"{rank_dir / runs.META}: marked incomplete (the rank's per-module tables were not saved)")
    return out


def load_stage(run_dir) -> dict:
    """Everything one stage's run directory holds, per rank, and its status. A rank whose files do
    not read (garbage, another schema version) makes the stage "failed" with that reason."""
    run_dir = Path(run_dir)
    ranks, problems = {}, []
    for d in sorted(run_dir.glob("rank*")):
        try:
            facts = run_files.read_zero_json(d)
            if facts is None:
                continue
            comms, steps = run_files.read_comms(d), run_files.read_engine_steps(d)
            samples_path = d / runs.TABLES["samples"][0]
            samples = (runs.read_table(samples_path, runs.TABLES["samples"][1], "samples") if samples_path.is_file()
                       else pd.DataFrame(columns=list(runs.TABLES["samples"][1])))
        except UserError as exc:
            problems.append(str(exc))
            continue
        problems.extend(_save_problems(d, facts))
        ranks[facts["rank"]] = {"facts": facts, "comms": comms if comms is not None else pd.DataFrame(),
                                "steps": steps if steps is not None else pd.DataFrame(), "samples": samples}
    world = max((r["facts"]["world_size"] for r in ranks.values()), default=0)
    complete = (bool(ranks) and not problems and all(r["facts"].get("complete") for r in ranks.values())
                and len(ranks) == world)
    status = "ok" if complete else "failed"
    stage = next(iter(ranks.values()))["facts"]["zero_stage"] if ranks else _stage_from_name(run_dir)
    try:
        predicted, _ = load_predicted(run_dir)
    except UserError as exc:
        predicted = None
        problems.append(str(exc))
    return {"run_dir": run_dir, "stage": stage, "status": status, "ranks": ranks, "world_size": world,
            "predicted": predicted if predicted is not None else pd.DataFrame(), "problems": problems,
            "log_tail": "" if complete else log_tail(run_dir)}


# -------------------------------------------------------------------------------- measured
def measured_comm(comms: pd.DataFrame) -> dict:
    """Bytes and counts per kind and per phase, per optimizer step (mean over logged steps)."""
    out = {f"meas_{k}_{w}": 0.0 for k in KINDS for w in ("bytes", "count")}
    out.update({f"meas_{p}_comm_bytes": 0.0 for p in PHASES})
    if comms.empty:
        return {k: math.nan for k in out} | {"logged_steps": 0}
    steps = comms["step"].nunique()
    for kind, g in comms.groupby("kind"):
        if kind in KINDS:
            out[f"meas_{kind}_bytes"] = float((g["bytes"] * g["count"]).sum()) / steps
            out[f"meas_{kind}_count"] = float(g["count"].sum()) / steps
    for phase, g in comms.groupby("phase"):
        if phase in PHASES:
            out[f"meas_{phase}_comm_bytes"] = float((g["bytes"] * g["count"]).sum()) / steps
    out["logged_steps"] = steps
    return out


def measured_times(steps: pd.DataFrame, facts: dict) -> dict:
    """Per optimizer step (sum over micro-steps), median over the measured steps run without the logger,
    or over the bare steps (no module hooks) when the run has them; ``meas_steps_role`` says which."""
    cpu_cols = ("fwd_cpu_s", "bwd_cpu_s", "step_cpu_s", "total_cpu_s")
    cpu_keys = ("meas_fwd_cpu_s", "meas_bwd_cpu_s", "meas_optim_cpu_s", "meas_step_cpu_s")
    nan = {k: math.nan for k in ("meas_fwd_s", "meas_bwd_s", "meas_optim_s", "meas_total_s", "meas_step_spread",
                                 "meas_ref_s", "meas_cref_s") + cpu_keys}
    if steps.empty:
        return nan
    # bare steps (PerfCheck's module hooks off, the block's overhead_pairs) measure DeepSpeed as the model
    # predicts it, uninstrumented; without them, the measured steps (their hooks' cost included)
    role = "bare" if (steps["role"] == "bare").any() else "measured"
    m = steps[steps["role"] == role]
    quiet = m[~m["comms_logged"].astype(bool)]
    m = quiet if not quiet.empty else m
    if m.empty:
        return nan
    cpu = [c for c in cpu_cols if c in m]
    per = m.groupby("step")[["fwd_s", "bwd_s", "step_s", "total_s", *cpu]].sum(min_count=1)
    total = steps[steps["role"] == role].groupby("step")["total_s"].sum()  # spread over every such step
    out = {"meas_fwd_s": float(per["fwd_s"].median()), "meas_bwd_s": float(per["bwd_s"].median()),
           "meas_optim_s": float(per["step_s"].median()), "meas_total_s": float(per["total_s"].median()),
           "meas_step_spread": float((total.max() - total.min()) / total.median()) if total.median() > 0 else math.nan}
    for col, key in zip(cpu_cols, cpu_keys):  # process CPU time (files from before the column: NaN)
        out[key] = float(per[col].median()) if col in per else math.nan
    for col in ("ref_s", "cref_s"):  # the machine's speed on the same steps (measure.speed; one reading per step)
        vals = m[col].dropna() if col in m else pd.Series(dtype=float)
        out[f"meas_{col}"] = float(vals.median()) if not vals.empty else math.nan
    out["meas_steps_role"] = role
    return out


def measured_exposed(facts: dict, times: dict = None) -> dict:
    """Exposed communication per phase on the same steps as the phase times (``times``: measured_times).

    The profiler window holds a few steps (``profiler.active``); the phase times are medians over every
    measured step. Mixing the two (the window's exposed seconds less a median over other steps) gave
    negative compute (-10.6 ms at stage 2) and identical collectives split as all-compute at one stage
    and all-communication at the next. So the window gives only the exposed SHARE of each phase
    (exposed_s / the phase ranges' wall time in the window, ``profiled_comm[phase].wall_s``), and that
    share times the phase's median gives the column: compute + communication = the phase's median,
    both >= 0. A window recorded before ``wall_s`` existed: its exposed seconds per active step, capped
    at the phase's median."""
    prof = facts.get("profiled_comm") or {}
    active = max(1, int(((facts.get("perfcheck_block") or {}).get("profiler") or {}).get("active", 1)))
    out = {}
    for ph, name in PHASES.items():
        rec, total = prof.get(ph), (times or {}).get(f"meas_{name}_s", math.nan)
        if not isinstance(rec, dict):
            out[f"meas_{name}_comm_s"] = math.nan
        elif (rec.get("wall_s") or 0) > 0 and total == total:
            out[f"meas_{name}_comm_s"] = min(rec["exposed_s"] / rec["wall_s"], 1.0) * total
        else:
            per_step = rec.get("exposed_s", math.nan) / active
            out[f"meas_{name}_comm_s"] = min(per_step, total) if total == total else per_step
    return out


# ------------------------------------------------------------------------------------ rows
def _row(stage: dict, rank: int, data: dict, system=None, local=None) -> dict:
    """One (stage, rank) row of the comparison: every ``pred_<what>`` beside its ``meas_<what>``, in the
    order of the steps below (the table's column order)."""
    facts = data["facts"]
    est = predict(facts, stage["predicted"], system, local)
    row = _config_cells(stage, rank, facts)
    _comm_cells(row, est, facts, data["comms"])
    _memory_cells(row, est, facts)
    _time_cells(row, est, facts, data["steps"])
    samples = data["samples"]
    for col in ("gpu_util", "cpu_util"):
        row[f"meas_{col}"] = float(samples[col].mean()) if not samples.empty and col in samples else math.nan
    _host_cells(row, est, facts, stage, system, local)
    _speed_cells(row, est, stage, load_system(stage_system(facts, system, local)))
    row["compute_predicted"] = not stage["predicted"].empty
    row["bytes_ok"] = bytes_within(row)
    row["notes"] = "; ".join(notes_for(row, facts, est))
    return row


def _config_cells(stage: dict, rank: int, facts: dict) -> dict:
    """The row's first cells: which stage, rank and node, and the configuration the rank recorded."""
    return {"stage": stage["stage"], "rank": rank, "node": facts.get("node_rank", 0), "status": stage["status"],
            "world_size": facts["world_size"], "dp": facts["dp"], "mp_size": facts["mp_size"],
            "gas": facts["gradient_accumulation_steps"], "dtype": facts["dtype"], "params": facts["params"],
            "params_local_partition": facts["params_local_partition"],
            "params_numel_visible": facts["params_numel_visible"], "persistent_params": facts["persistent_params"]}


def _comm_cells(row: dict, est: zero.ZeroEstimate, facts: dict, comms) -> None:
    """Bytes and calls per collective kind and phase, and the totals (the buffer S and the wire bytes)."""
    by_kind, counts = est.bytes_by_kind(), est.count_by_kind()
    meas = measured_comm(comms)
    for k in KINDS:
        row[f"pred_{k}_bytes"], row[f"meas_{k}_bytes"] = by_kind[k], meas[f"meas_{k}_bytes"]
        row[f"pred_{k}_count"], row[f"meas_{k}_count"] = counts[k], meas[f"meas_{k}_count"]
    for ph in PHASES:
        row[f"pred_{ph}_comm_bytes"] = sum(by_kind_phase for by_kind_phase in est.bytes_by_kind(ph).values())
        row[f"meas_{ph}_comm_bytes"] = meas[f"meas_{ph}_comm_bytes"]
    row["pred_comm_bytes"] = sum(by_kind.values())
    row["meas_comm_bytes"] = sum(row[f"meas_{k}_bytes"] for k in KINDS)
    row["pred_wire_bytes"] = float(sum(zero.wire_bytes(k, by_kind[k], facts["dp"]) for k in KINDS))
    row["meas_wire_bytes"] = float(sum(zero.wire_bytes(k, row[f"meas_{k}_bytes"], facts["dp"]) for k in KINDS))


def _memory_cells(row: dict, est: zero.ZeroEstimate, facts: dict) -> None:
    """Model-state bytes per rank (params, grads, optimizer states) and the measured peak."""
    mem = facts.get("model_state_bytes") or {}
    for part, key in (("param", "params"), ("grad", "grads"), ("optim", "optimizer")):
        row[f"pred_{part}_mem_bytes"], row[f"meas_{part}_mem_bytes"] = est.memory[key], mem.get(key, math.nan)
    row["pred_mem_bytes"], row["meas_mem_bytes"] = est.memory["total"], mem.get("model_states", math.nan)
    row["meas_buffer_bytes"], row["meas_peak_mem_bytes"] = mem.get("other", math.nan), facts.get("peak_mem_bytes")


def _time_cells(row: dict, est: zero.ZeroEstimate, facts: dict, steps) -> None:
    """Seconds per phase, split into compute and exposed communication, the step, the process CPU times
    and what the engine calls leave unexplained."""
    t, mt = est.times, measured_times(steps, facts)
    exp = measured_exposed(facts, mt)
    for ph, name in PHASES.items():
        row[f"pred_{name}_s"], row[f"meas_{name}_s"] = t[f"{name}_s"], mt[f"meas_{name}_s"]
        row[f"pred_{name}_comm_s"], row[f"meas_{name}_comm_s"] = t[f"{name}_comm_s"], exp[f"meas_{name}_comm_s"]
        row[f"pred_{name}_compute_s"] = t[f"{name}_compute_s"]
        row[f"pred_{name}_host_s"] = t.get(f"{name}_host_s", 0.0)
        row[f"pred_{name}_wait_s"] = t.get(f"{name}_wait_s", 0.0)  # for the latest rank (straggler_wait_s)
        row[f"pred_{name}_syncs"] = t.get(f"{name}_syncs", 0.0)
        comm = row[f"meas_{name}_comm_s"]
        row[f"meas_{name}_compute_s"] = row[f"meas_{name}_s"] - (0 if math.isnan(comm) else comm)
    row["pred_step_s"], row["meas_step_s"] = t["step_s"], mt["meas_total_s"]
    for key in ("meas_fwd_cpu_s", "meas_bwd_cpu_s", "meas_optim_cpu_s", "meas_step_cpu_s", "meas_ref_s", "meas_cref_s"):
        row[key] = mt[key]
    row["meas_steps_role"] = mt.get("meas_steps_role", "")
    other = mt["meas_total_s"] - sum(mt[f"meas_{n}_s"] for n in PHASES.values())
    # Medians of separate distributions need not add up: a negative remainder is no time, it is the
    # phases' medians overlapping; shown as 0 with the overlap in the notes.
    row["meas_other_s"] = max(other, 0.0) if other == other else other
    row["other_overlap_s"] = -other if other < 0 else 0.0
    row["meas_step_spread"] = mt["meas_step_spread"]


def _host_cells(row: dict, est: zero.ZeroEstimate, facts: dict, stage: dict, system, local=None) -> None:
    """The spec used, the ranks sharing the host and the slowdown they cause, ZeRO-3's hook and gather host
    costs, the batched calls and the predicted all-gather time."""
    spec = load_system(stage_system(facts, system, local))
    # where the spec came from; a calibration: when, with how many threads, under what load (report headers)
    row["system_label"] = spec_label(spec)
    parts = zero3_parts(facts, stage["predicted"], spec)
    row["local_processes"] = local_processes(facts)
    row["pred_process_slowdown"] = process_slowdown(spec, row["local_processes"])
    row["pred_zero3_hooks_s"] = row["pred_process_slowdown"] * parts["hooks_s"]
    row["pred_zero3_gather_host_s"] = row["pred_process_slowdown"] * parts["gather_host_s"]
    row["zero3_module_calls"], row["zero3_gathered_tensors"] = parts["module_calls"], parts["gathered_tensors"]
    # calls issued with async_op=True and waited together (ZeRO-3's post-step gathers): priced as batches
    row["pred_batched_calls"] = float(sum(float(c.count) for c in est.collectives if float(c.batch) > 1))
    row["pred_allgather_s"] = float(sum(
        zero.comm_time_s([c for c in est.collectives if c.kind == "allgather"], facts["dp"],
                         load_system(stage_system(facts, system, local)), spans_nodes=facts.get("nodes", 1) > 1).values()))


def _speed_cells(row: dict, est: zero.ZeroEstimate, stage: dict, spec) -> None:
    """The machine's speed during the run against the calibration's (``meas_host_speed``, ``meas_compute_speed``:
    ``perfcheck.predict.run_speed.speed_factors`` of the references the ranks read between steps) and every phase's
    prediction set at that speed (``pred_<phase>_at_run_s``, ``pred_step_at_run_s``: ``stage_prediction.at_run_times``,
    the ranks' process slowdown taken out: the readings hold it); NaN without references on either side.
    Runs after ``_host_cells`` (``pred_process_slowdown``)."""
    sh, sc = run_speed.speed_factors(getattr(spec, "calibration", {}), row.get("meas_ref_s"), row.get("meas_cref_s"))
    row["meas_host_speed"], row["meas_compute_speed"] = sh, sc
    at = at_run_times(est.times, host_shares(stage["predicted"]), sh, sc, row["pred_process_slowdown"])
    for name in PHASES.values():
        row[f"pred_{name}_at_run_s"] = at[f"{name}_s"]
    row["pred_step_at_run_s"] = at["step_s"]


def bytes_within(row, tol: float = BYTES_TOLERANCE) -> bool:
    for k in KINDS:
        p, m = row[f"pred_{k}_bytes"], row[f"meas_{k}_bytes"]
        if not (p == m == 0) and (math.isnan(m) or abs(m - p) > tol * max(p, m)):
            return False
    return True


def notes_for(row: dict, facts: dict, est: zero.ZeroEstimate) -> list:
    """Why predicted and measured differ (or agree only up to padding), from the numbers."""
    return notes(row, facts, est)


def module_summary(run_dir, system=None) -> dict:
    """Per rank, the module-level view of a stage through the one assembly path
    (``pipeline.reconcile_run``, as ``perfcheck report`` shows it): the module with the largest
    predicted-vs-measured gap and its reason. Empty when the stage has no module tables."""
    if not any(Path(run_dir).glob(f"rank*/{runs.META}")):
        return {}
    try:
        table = reconcile_run(run_dir, system=system).table
    except UserError as exc:
        return {"error": str(exc)}
    out = {}
    for rank, g in table[(table["module"] != "(root)") & (table["side"] == "both")].groupby("rank"):
        gap = (g["meas_fwd_s"].fillna(0) + g["meas_bwd_s"].fillna(0)) - (g["pred_fwd_s"].fillna(0) + g["pred_bwd_s"].fillna(0))
        if gap.empty:
            continue
        top = g.loc[gap.idxmax()]
        out[int(rank)] = (f"{top['module']} ({top['type']}): measured {top['meas_fwd_s'] + top['meas_bwd_s']:.3g} s vs "
                          f"predicted {top['pred_fwd_s'] + top['pred_bwd_s']:.3g} s fwd+bwd"
                          + (f"; {top['reason']}" if top.get("reason") else ""))
    return out


def reconcile_stages(run_dirs, system=None, local=None) -> pd.DataFrame:
    """The comparison table: one row per (stage, rank); failed stages keep a row with their log tail.
    ``local``: threads -> this machine's SystemSpec or None, for a stage that recorded no system
    (``stage_prediction.stage_system``; resolved by the caller, the edge)."""
    rows = []
    for run_dir in expand_run_dirs(run_dirs):
        stage = load_stage(run_dir)
        if system is not None and stage["ranks"]:
            stage["predicted"] = predicted_on(system, stage)
        if not stage["ranks"]:
            rows.append({"stage": stage["stage"], "run": run_dir.name, "rank": -1, "status": "failed",
                         "run_dir": str(run_dir),
                         "notes": "failed: " + ("; ".join(stage["problems"]) or "no rank wrote zero.json")
                                  + "; log tail:\n" + stage["log_tail"]})
            continue
        modules = module_summary(run_dir, system)
        for rank, data in sorted(stage["ranks"].items()):
            row = {"run": run_dir.name, **_row(stage, rank, data, system, local), "run_dir": str(run_dir)}
            row["module_top_gap"] = modules.get(rank, modules.get("error", ""))
            if stage["status"] != "ok":
                missing = sorted(set(range(stage["world_size"])) - set(stage["ranks"]))
                unfinished = sorted(r for r, d in stage["ranks"].items() if not d["facts"].get("complete"))
                wrote_nothing = f", {missing} wrote nothing" if missing else ""
                unreadable = ("; " + "; ".join(stage["problems"])) if stage["problems"] else ""
                row["notes"] = (f"failed: rank(s) {unfinished} did not finish{wrote_nothing}{unreadable}; log:\n"
                                + stage["log_tail"])
            rows.append(row)
    frame = pd.DataFrame(rows)
    return frame.sort_values(["stage", "run", "rank"], kind="stable", ignore_index=True) if not frame.empty else frame


def predicted_on(system, stage: dict) -> pd.DataFrame:
    """The stage's compute prediction on ``system`` (``--system``): the saved one when it was made for that
    system, else re-estimated for a built-in example model named by a rank's meta.json, else a UserError
    with the fix (never the old system's numbers under the new name)."""
    spec = load_system(system)
    try:
        _, info = for_run.load_predicted(stage["run_dir"])
    except UserError:
        info = {}
    saved = info.get("spec")
    if not stage["predicted"].empty and (saved == spec if saved is not None else info.get("system") == spec.name):
        return stage["predicted"]
    meta = _read_json(Path(stage["run_dir"]) / f"rank{min(stage['ranks'])}" / runs.META) or {}
    model = for_run.model_from_meta(meta) if meta.get("inputs") else None
    if model is None:
        raise UserError(f"--system {spec.name}: {stage['run_dir']} was predicted for {info.get('system')} and its "
                        "meta.json does not name a built-in example model to re-estimate; save a prediction for "
                        f"{spec.name} with perfcheck.predict.for_run.save_predicted, or compare without --system")
    meta = {**meta, "parallel": None}  # compute only, one micro-batch on one rank, as train_ds saves it
    facts = stage["ranks"][min(stage["ranks"])]["facts"] if stage.get("ranks") else None
    if not facts:
        return for_run.predict_for_run(model, meta, system=spec)
    # as the run predicted itself: with the engine's step in the far rule's ages (stage_prediction.outside_model_s)
    return for_run.with_step_other(lambda other: for_run.predict_for_run(model, meta, system=spec, step_other_s=other),
                                   lambda frame: outside_model_s(facts, frame, spec))


def stage_complete(run_dir) -> bool:
    """True when every rank of the run wrote a complete zero.json (the sweep skips such stages)."""
    try:
        return load_stage(run_dir)["status"] == "ok"
    except Exception:  # noqa: BLE001 - anything unreadable is incomplete
        return False


def merge_node_runs(node_dirs, dest) -> Path:
    """Merge run directories written on different nodes (no shared filesystem) into ``dest``.

    Each source holds some ``rank*/`` directories of one run; the merged run must have every rank
    exactly once, one world size and one ZeRO stage. Files are copied, sources are left alone.
    """
    dest = Path(dest)
    seen, worlds, stages = {}, set(), set()
    for src in map(Path, node_dirs):
        for d in sorted(src.glob("rank*")):
            facts = run_files.read_zero_json(d)
            if facts is None:
                raise UserError(f"{d}: no zero.json; not a perfcheck DeepSpeed rank directory")
            rank = int(facts["rank"])
            if rank in seen:
                raise UserError(f"rank {rank} appears in both {seen[rank]} and {d}")
            seen[rank] = d
            worlds.add(int(facts["world_size"]))
            stages.add(int(facts["zero_stage"]))
    if len(worlds) != 1 or len(stages) != 1:
        raise UserError(f"cannot merge runs of different world sizes {sorted(worlds)} or stages {sorted(stages)}")
    missing = sorted(set(range(worlds.pop())) - set(seen))
    if missing:
        raise UserError(f"ranks {missing} are in none of {', '.join(map(str, node_dirs))}")
    dest.mkdir(parents=True, exist_ok=True)
    for rank, d in seen.items():
        shutil.copytree(d, dest / d.name, dirs_exist_ok=True)
    for src in map(Path, node_dirs):
        for name in ("predicted.csv", "predicted.json", "run.json"):
            if (src / name).is_file() and not (dest / name).exists():
                shutil.copy2(src / name, dest / name)
    return dest

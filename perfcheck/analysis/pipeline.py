"""The one assembly path: a run (its directory, or a live ``PerfCheck``) → the reconciled table.

``perfcheck report``, ``PerfCheck.report()`` / ``reconciled()`` and the HTML report all call
``reconcile_run``; so the same run gives the same table whichever way it is read. The steps:

1. the measured side as a ``rundir.Run`` (``rundir.load_run(path)``, or ``PerfCheck.as_run()``,
   which hands over exactly the frames ``PerfCheck.save`` writes);
2. the predicted side: ``predicted.csv`` saved with the run (``for_run.load_predicted``; the live
   ``PerfCheck.predicted()`` is the same frame), else the estimator re-run on a built-in example
   model that meta.json names;
3. the system: the caller's ``system``, else the one the prediction was made for, else the run's
   device; the dtype from the prediction, else meta.json;
4. gradient accumulation: the prediction is for one forward + backward (one micro-batch); a run
   whose ``step()`` spans N root forwards (meta.json ``micro_batches``) has its per-micro-batch
   predicted columns (``PER_MICRO_BATCH``) multiplied by N (``scale_by_micro_batches``), so the
   summed micro-batches are compared with N predicted ones; the table's ``attrs["micro_batches"]``
   and a note say so;
5. the collectives of each rank's profiler window (``collectives.csv``, or the live
   ``PerfCheck.collectives()``): the bytes each module issued and the time each module waited, per
   phase (``analysis.comm``; schema.MODULE_COMM_COLUMNS), with the layout (meta.json ``parallel``)
   naming the framework in the waits' words; collectives outside every module's forward/backward
   get a note;
6. ``reconcile.reconcile`` with the kernel table, the steps and the profiled-step count per rank.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd

import perfcheck.rundir as rundir
from perfcheck.analysis.comm import outside_bytes, read_collectives
from perfcheck.analysis.page_faults import add_fault_costs
from perfcheck.analysis.reconcile import reconcile
from perfcheck.analysis.system_notes import device_mismatch, run_contention, system_notes
from perfcheck.errors import UserError
from perfcheck.hardware.systems import load_system
from perfcheck.measure.collectives import COLLECTIVES_CSV, COLLECTIVE_COLUMNS
from perfcheck.predict import for_run


@dataclasses.dataclass
class ReconciledRun:
    """The reconciled table of one run and what it was built from."""

    table: pd.DataFrame  # analysis.columns.RECONCILED_COLUMNS; attrs["notes"], attrs["totals"]
    run: rundir.Run
    system: object  # the system name, path or SystemSpec the table was reconciled on
    notes: list

    @property
    def profile_steps(self) -> int:
        """Active profiler steps behind the kernel table (the largest over ranks)."""
        return max((profile_steps(m) for m in self.run.meta.values()), default=1)


def profile_steps(meta: dict) -> int:
    """Active profiler steps recorded in a rank's meta.json (1 when it names none)."""
    prof = meta.get("profile")
    if isinstance(prof, dict) and isinstance(prof.get("steps"), list) and prof["steps"]:
        return len(prof["steps"])
    return 1


def _other_system(system, info: dict) -> bool:
    """True when ``system`` (given by the user) is not the one the saved prediction was made for."""
    if system is None:
        return False
    spec = load_system(system)
    saved = info.get("spec")
    return spec != saved if saved is not None else spec.name != info.get("system")


def _predicted_for(run: rundir.Run, system, live_predicted):
    """``(frame, info, notes)``: the saved or live prediction, else a re-run on a built-in example."""
    meta0 = run.meta[run.ranks[0]]
    if live_predicted is not None:
        frame = for_run.normalize_predicted(live_predicted)
        return frame, {"system": live_predicted.attrs.get("system"), "dtype": live_predicted.attrs.get("dtype")}, []
    pred, info = for_run.load_predicted(run.run_dir, run.ranks)
    if pred is not None and not _other_system(system, info):
        return pred, info, []
    model = for_run.model_from_meta(meta0)
    if pred is not None and model is None:
        raise UserError(f"--system {getattr(system, 'name', system)}: the saved prediction is for "
                        f"{info.get('system')} and meta.json does not name a built-in example model to re-estimate; "
                        "re-run perfcheck.estimate(model, inputs, system=...) and save it with "
                        "perfcheck.predict.for_run.save_predicted, or report without --system")
    if model is None:
        raise UserError(f"{Path(run.run_dir) / for_run.PREDICTED_CSV}: missing file (no predicted rows in the run, and "
                        "meta.json does not name a built-in example model to re-run the estimator; save them with "
                        "perfcheck.predict.for_run.save_predicted(run_dir, perfcheck.estimate(model, inputs)))")
    pred = for_run.predict_for_run(model, meta0, system=system)
    info = {"system": for_run.system_from_meta(meta0, system), "dtype": meta0.get("dtype")}
    return pred, info, [f"predicted rows re-computed from meta.json (model {meta0['model']['type']}, "
                        f"system {getattr(info['system'], 'name', info['system'])})"]


#: Predicted columns that are per micro-batch (one forward + backward): times N when a step holds N
#: micro-batches. Not scaled: ``params``; ``act_mem`` (each micro-batch's activations are freed by
#: its backward, so the peak is one micro-batch's); ``pred_optim_s`` (one optimizer step per step()).
#: Collective bytes are scaled as issued every micro-batch (DDP without ``no_sync``, DeepSpeed ZeRO-2/3);
#: gradients reduced only at the accumulation boundary (DDP's ``no_sync``, ZeRO-0/1) move less (a note says so).
PER_MICRO_BATCH = ("calls", "macs_fwd", "macs_bwd", "flops_fwd", "flops_bwd", "bytes_fwd", "bytes_bwd",
                   "comm_fwd_bytes", "comm_bwd_bytes", "pred_fwd_s", "pred_bwd_s", "kernels_fwd", "kernels_bwd",
                   "macs_recompute", "flops_recompute", "pred_recompute_s", "host_fwd_s", "host_bwd_s")


def micro_batches(meta: dict):
    """meta.json ``micro_batches`` (root training forwards per step, median over measured steps) as a
    positive number, else None (a run recorded before it was measured, or no forward measured)."""
    n = meta.get("micro_batches")
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n) or n <= 0:
        return None
    return n


def scale_by_micro_batches(pred: pd.DataFrame, n) -> pd.DataFrame:
    """``pred`` (one micro-batch) with its ``PER_MICRO_BATCH`` columns times ``n``; a copy, attrs kept."""
    out = pred.copy()
    for c in PER_MICRO_BATCH:
        if c in out:
            out[c] = pd.to_numeric(out[c], errors="coerce") * n
    out.attrs = dict(pred.attrs)
    return out


def _micro_batch_notes(run: rundir.Run, n, pred: pd.DataFrame, comm_note=None) -> list:
    """What the scaling assumed: steps or ranks with other counts, collectives scaled per micro-batch."""
    notes = [f"prediction scaled by {n:g} micro-batches (root forward calls per step(), meta.json micro_batches): "
             f"per-module time, FLOPs, bytes and calls x{n:g}; optimizer and memory not scaled"]
    steps = run.steps
    if "micro_batches" in steps and len(steps):
        failed = steps["failed"].astype(str).str.lower().isin(("true", "1"))
        seen = pd.to_numeric(steps.loc[(steps["role"] == "measured") & ~failed, "micro_batches"], errors="coerce")
        seen = seen.dropna()
        if len(seen) and seen.min() != seen.max():
            notes.append(f"micro-batches per step varied from {seen.min():g} to {seen.max():g}; the prediction "
                         f"uses the median, {n:g}")
    others = {r: micro_batches(m) for r, m in run.meta.items() if micro_batches(m) not in (None, n)}
    if others:
        notes.append(f"ranks saw other micro-batch counts ({others}); the prediction uses rank {run.ranks[0]}'s, {n:g}")
    comm = pred[[c for c in ("comm_fwd_bytes", "comm_bwd_bytes") if c in pred]].fillna(0).to_numpy(float)
    if comm_note:
        notes.append(comm_note)
    elif comm.size and comm.sum() > 0:
        notes.append("collective bytes scaled as issued every micro-batch; gradients reduced only at the accumulation "
                     "boundary (DDP under no_sync(), DeepSpeed ZeRO stages 0-1) move less")
    return notes


def collectives_of(run: rundir.Run, source=None) -> pd.DataFrame:
    """The collectives of every rank's profiler window: the live ``PerfCheck.collectives()`` when
    ``source`` is one, else each ``rank<R>/collectives.csv`` (columns checked); empty when none."""
    if source is not None and hasattr(source, "collectives"):
        return read_collectives(source.collectives())
    parts = []
    for r in run.ranks:
        path = rundir.rank_dir(run.run_dir, r) / COLLECTIVES_CSV
        if path.is_file():
            parts.append(rundir.read_table(path, COLLECTIVE_COLUMNS, "collectives").assign(rank=r))
    return read_collectives(pd.concat(parts, ignore_index=True) if parts else None)


def _layouts(run: rundir.Run) -> dict:
    """{rank: meta.json parallel kind} ('' when the rank recorded none)."""
    return {r: str((m.get("parallel") or {}).get("kind", "")) if isinstance(m.get("parallel"), dict) else ""
            for r, m in run.meta.items()}


def _spec_or_none(system):
    """``system`` as a SystemSpec, or None where it does not load (reconcile then says so itself)."""
    if system is None:
        return None
    try:
        return load_system(system)
    except UserError:
        return None


def hook_overhead_per_call(meta: dict, modules: pd.DataFrame) -> tuple:
    """``(seconds, source)``: the hooks' cost per module call and phase that this run measured, else
    ``(None, why)`` and the findings use their assumed floor (``thresholds.DEFAULT_HOOK_OVERHEAD_S``).

    From meta.json ``overhead`` (adjacent instrumented/bare step pairs): the low end of its 95% interval
    (``ci95[0]`` x the bare step median: a floor rule must not fire on noise, and on a busy machine the
    interval is wide), less PerfCheck's own bookkeeping at the step boundary (``bookkeeping_s_median``:
    not a hook), over the module calls per step (the rank's modules.csv ``calls``) and over 2 (a module's
    hooks fire in its forward and in its backward; the floor is compared per phase). Not used when the
    interval's low end does not exceed the bookkeeping (the A/B did not resolve the hooks' cost), nor for a
    run whose overhead has no interval or bookkeeping (older perfcheck)."""
    over = meta.get("overhead")
    if not isinstance(over, dict):
        return None, "assumed (the run measured no overhead: PerfCheck(overhead_pairs=N) measures it)"
    try:
        low = float(over["ci95"][0]) * float(over["bare_step_s_median"]) - float(over["bookkeeping_s_median"])
    except (KeyError, TypeError, ValueError, IndexError):
        return None, "assumed (meta.json overhead has no interval or bookkeeping: a run from an older perfcheck)"
    rank = meta.get("rank", 0)
    mine = modules[modules["rank"] == rank] if "rank" in modules else modules
    calls = float(pd.to_numeric(mine.get("calls", pd.Series(dtype=float)), errors="coerce").sum())
    if not (calls > 0 and math.isfinite(low)) or low <= 0:
        return None, ("assumed (the run's instrumented/bare steps did not resolve the hooks' cost: the low end of "
                      "its 95% interval is within PerfCheck's bookkeeping)")
    return low / (2 * calls), (f"measured in this run: at least {low * 1e3:.3g} ms per step (95% interval's low "
                               f"end, bookkeeping removed) over {calls:.0f} module calls and 2 phases (meta.json "
                               f"overhead)")


def reconcile_run(source, *, system=None) -> ReconciledRun:
    """Reconcile a run directory (path) or a live/stopped ``PerfCheck``.

    ``system`` overrides the system the run was predicted for (a name, a JSON path or a SystemSpec).
    """
    live_predicted, live = None, None
    if isinstance(source, (str, Path)):
        run = rundir.load_run(source)
    elif hasattr(source, "as_run") and hasattr(source, "predicted"):
        run, live = source.as_run(), source
        live_predicted = source.predicted(system=system)
        system = source.system_spec(system)  # the spec itself: a calibrated file's name is not a built-in
    else:
        raise UserError(f"reconcile_run needs a run directory or a PerfCheck, got {type(source).__name__}")
    pred, info, notes = _predicted_for(run, system, live_predicted)
    notes = list(run.notes) + notes
    meta0 = run.meta[run.ranks[0]]
    name = system if system is not None else (info.get("spec") or info.get("system")
                                              or for_run.system_from_meta(meta0))
    dtype = info.get("dtype") or meta0.get("dtype")
    sel = meta0.get("selection")  # PerfCheck(depth=/modules=): rows outside it are absent by design
    timed = sel.get("timed") if isinstance(sel, dict) else None
    if timed is not None:
        notes.append(f"{sel.get('note', 'modules outside the selection are not timed')} (timed "
                     f"{sel.get('timed_count', len(timed))} of {sel.get('module_count', '?')} modules: "
                     + (f"depth={sel['depth']})" if sel.get("depth") is not None else f"modules={sel.get('modules')})"))
    n = micro_batches(meta0)
    if n is not None and n != 1:
        from perfcheck.analysis.step_comm import per_step_comm

        # torch-native layouts: collectives issued fewer than n times per step (no_sync) taken back out
        scaled, comm_note = per_step_comm(scale_by_micro_batches(pred, n), run, n, name, live_predicted)
        notes += _micro_batch_notes(run, n, pred, comm_note)
        pred = scaled
    spec = _spec_or_none(name)
    notes += system_notes(spec, meta0)
    waited = run_contention(meta0, run.samples)
    if waited:
        notes.append(f"WARNING: {waited}; slow modules are marked 'contention'")
    hook_s, hook_source = hook_overhead_per_call(meta0, run.modules)
    windows = {r: profile_steps(m) for r, m in run.meta.items()}
    coll = collectives_of(run, live)
    outside = {r: b for r, b in outside_bytes(coll, windows).items() if b > 0}
    if outside:
        notes.append("collectives issued outside every module's forward/backward (optimizer step, unattributed) are in "
                     "no module's comm columns: " + ", ".join(f"rank {r} {b:.0f} B per step" for r, b in outside.items()))
    table = reconcile(pred, run.modules, system=spec if spec is not None else name, kernels=run.kernels,
                      steps=run.steps, dtype=dtype, profile_steps=windows, timed=timed, collectives=coll,
                      layouts=_layouts(run), hook_overhead_s=hook_s, hook_overhead_source=hook_source,
                      other_device=device_mismatch(spec, meta0), contention=waited)
    add_fault_costs(table, run.meta)  # each rank's measured cost per page fault (meta.json page_faults)
    table.attrs["micro_batches"] = n if n is not None else 1
    table.attrs["optimizer"] = for_run.optimizer_for_run(meta0)[1]  # the optimizer the step prediction costs
    table.attrs["notes"] = notes
    return ReconciledRun(table=table, run=run, system=name, notes=notes)

"""The predicted collectives of a recorded torch-native run per optimizer step: each rank's
predicted_collectives.csv (read through the run-directory reader) and ``per_step_comm``, which
takes back out of a prediction scaled by n micro-batches the collectives issued fewer than n times
per step (gradient reductions skipped under ``no_sync()``; Partial-gradient all-reduces once per step).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from perfcheck.hardware.systems import load_system
import perfcheck.rundir as rundir
from perfcheck.predict import collectives as coll_model
from perfcheck.predict.layout_collectives import (COLLECTIVE_FIELDS, PREDICTED_COLLECTIVES_CSV, frame_phase,
                                                  issuer_and_ancestors, per_step_collectives)

def read_predicted_collectives(rank_dir):
    """``rank<R>/predicted_collectives.csv`` as a frame (columns checked), None when absent."""
    path = Path(rank_dir) / PREDICTED_COLLECTIVES_CSV
    if not path.is_file():
        return None
    frame = rundir.read_table(path, COLLECTIVE_FIELDS, "predicted collectives")
    return frame.assign(module=frame["module"].astype(str))  # a module path "0" is a name, not a number


def per_step_comm(pred, run, n, system, live=None):
    """``(pred, note)``: a prediction already scaled by ``n`` micro-batches (``analysis.pipeline``)
    with the collectives issued fewer than ``n`` times per optimizer step taken back out: gradient
    reductions skipped under DDP's ``no_sync()`` / FSDP2's ``set_requires_gradient_sync(False)``
    (meta.json ``grad_sync_micro_batches``) and Partial-gradient all-reduces (once per step): their
    bytes from comm_<phase>_bytes and their time from pred_<phase>_s, on the issuing module and its
    ancestors. The collectives are each rank's predicted_collectives.csv, or ``live``'s
    ``attrs['collectives']`` (a live PerfCheck's prediction). ``note``: what was done, None when
    the run has no predicted collectives (nothing changed)."""
    spec = None
    out = pred.copy()
    out.attrs = dict(pred.attrs)
    changed, removed = False, 0.0
    for rank in run.ranks:
        if live is not None and live.attrs.get("collectives"):
            rows = live.attrs["collectives"]
        else:
            frame = read_predicted_collectives(rundir.rank_dir(run.run_dir, rank))
            rows = frame.to_dict("records") if frame is not None else None
        if not rows:
            continue
        meta = run.meta.get(rank, {})
        table = per_step_collectives(rows, n, meta.get("grad_sync_micro_batches"))
        mask = (out["rank"] == rank) if "rank" in out else np.ones(len(out), bool)
        index = {p: i for i, p in zip(out.index[mask], out.loc[mask, "module"])}
        changed = True
        for r in table.itertuples(index=False):
            extra = float(n) - float(r.calls_per_step)
            if extra <= 0:
                continue
            spec = spec or load_system(system)
            t = float(np.asarray(coll_model.collective_time_s(r.kind, float(r.bytes), int(r.group_size), spec)))
            phase = frame_phase(r.phase)
            removed += extra * float(r.bytes)
            for path in issuer_and_ancestors(str(r.module), index):
                out.loc[index[path], f"comm_{phase}_bytes"] -= extra * float(r.bytes)
                out.loc[index[path], f"pred_{phase}_s"] -= extra * t
    if not changed:
        return pred, None
    return out, (f"collectives per optimizer step: all-gathers and TP/SP redistributes x{n:g} micro-batches, gradient "
                 f"reductions only on the micro-batches that synced them (DDP no_sync(), FSDP2 "
                 f"set_requires_gradient_sync; meta.json grad_sync_micro_batches), Partial-gradient all-reduces once "
                 f"({removed:.0f} B per step taken back out of the x{n:g} scaling over the ranks)")

"""The DeepSpeed files in a run's ``rank<R>/`` directories: their layout, their one reader and writer.

    zero.json          the engine's ZeRO facts (stage, dp/tp/pp, ds_numel counts, settings, memory),
                       the ``"perfcheck"`` block, ``complete`` and ``schema_version``
    comms.csv          every collective the comms logger saw (``COMMS_COLUMNS``)
    engine_steps.csv   per micro-step forward/backward/step seconds (``ENGINE_STEP_COLUMNS``)

The engine wrapper (``integrations.deepspeed.engine_session``) writes them; ``perfcheck compare``
(``analysis.stages``), the answers and the sweep read them. A file of another schema version, or one
that does not parse, is a ``UserError`` naming the file; a missing file is ``None`` (the rank did not
get that far).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import pandas as pd

from perfcheck.errors import UserError
from perfcheck.rundir.files import read_table, read_versioned_json
from perfcheck.rundir.writer import CsvAppender, atomic_write_csv, atomic_write_json
from perfcheck.schema import SCHEMA_VERSION

ZERO_JSON = "zero.json"
COMMS_CSV = "comms.csv"
ENGINE_STEPS_CSV = "engine_steps.csv"
#: comms.csv: one row per (step, micro-step, phase, op, caller, size) the comms logger saw
#: (``integrations.deepspeed.comms.CommsCapture`` fills it).
COMMS_COLUMNS = {
    "rank": "distributed rank",
    "step": "optimizer step index (0-based from attach)",
    "micro_step": "micro-step within the optimizer step (gradient accumulation)",
    "phase": "fwd | bwd | step | other (between engine calls)",
    "op": "deepspeed.comm function (all_gather_into_tensor, reduce_scatter_tensor, all_reduce, ...)",
    "caller": "DeepSpeed function that issued it (comms logger debug name), '' if unknown",
    "kind": "canonical kind: allreduce | allgather | reducescatter | reduce | broadcast | alltoall | sendrecv",
    "msg_bytes": "size the comms logger records per call: each rank's input tensor, bytes",
    "bytes": "full buffer S per call (nccl-tests convention): msg * group for allgather, else msg, bytes",
    "count": "calls with this size in this phase",
    "logger_s": "summed comms-logger latency of these calls (synchronized, isolated op time), seconds",
    "group_size": "ranks in the communicating group (the data-parallel group)",
}
ENGINE_STEP_COLUMNS = {
    "rank": "global rank", "step": "optimizer step index (0-based, from the engine's first step)",
    "micro_step": "micro-batch index within the step", "role": "measure.schedule role of the step",
    "comms_logged": "True when DeepSpeed's comms logger was on (it synchronizes each collective)",
    "boundary": "True on the gradient-accumulation boundary (the optimizer stepped)",
    "fwd_s": "engine forward, s", "bwd_s": "engine.backward, s", "step_s": "engine.step, s",
    "total_s": "from the forward's start to the step's end, s",
    "fwd_cpu_s": "process CPU time in the engine forward, s", "bwd_cpu_s": "process CPU time in engine.backward, s",
    "step_cpu_s": "process CPU time in engine.step, s", "total_cpu_s": "sum of the three, s",
    "ref_s": "the calibration's host reference (a tiny torch.add) timed after the optimizer step, s per call "
             "(process CPU time; measure.speed; NaN off the CPU and on micro-steps without an optimizer step)",
    "cref_s": "the calibration's compute reference (a 128^3 fp32 torch.mm) timed beside ref_s, s per call",
}
#: Columns added after files of this schema version were written: a file without them reads with NaN.
ADDED_ENGINE_STEP_COLUMNS = ("fwd_cpu_s", "bwd_cpu_s", "step_cpu_s", "total_cpu_s", "ref_s", "cref_s")


def write_zero_json(rank_dir, facts: dict) -> Path:
    """Write ``zero.json`` (atomically) with this perfcheck's schema version."""
    return atomic_write_json(Path(rank_dir) / ZERO_JSON, {**facts, "schema_version": SCHEMA_VERSION})


def read_zero_json(rank_dir) -> Optional[dict]:
    """``zero.json`` of a rank directory; None when the rank never wrote one."""
    path = Path(rank_dir) / ZERO_JSON
    if not path.is_file():
        return None
    facts = read_versioned_json(path, ZERO_JSON)
    for key in ("rank", "world_size", "zero_stage"):
        if not isinstance(facts.get(key), int) or isinstance(facts.get(key), bool):
            raise UserError(f"{path}: {key} must be an integer, got {facts.get(key)!r}")
    return facts


def write_comms(rank_dir, frame: pd.DataFrame) -> Path:
    return atomic_write_csv(Path(rank_dir) / COMMS_CSV, frame, COMMS_COLUMNS)


def read_comms(rank_dir) -> Optional[pd.DataFrame]:
    path = Path(rank_dir) / COMMS_CSV
    return read_table(path, COMMS_COLUMNS, "collectives") if path.is_file() else None


def engine_steps_appender(rank_dir) -> CsvAppender:
    """Rows appended as the run goes, so a killed run keeps every finished micro-step."""
    return CsvAppender(Path(rank_dir) / ENGINE_STEPS_CSV, ENGINE_STEP_COLUMNS)


def read_engine_steps(rank_dir) -> Optional[pd.DataFrame]:
    path = Path(rank_dir) / ENGINE_STEPS_CSV
    if not path.is_file():
        return None
    required = [c for c in ENGINE_STEP_COLUMNS if c not in ADDED_ENGINE_STEP_COLUMNS]
    frame = read_table(path, required, "engine steps")
    for col in ADDED_ENGINE_STEP_COLUMNS:
        if col not in frame:
            frame[col] = float("nan")
    return frame

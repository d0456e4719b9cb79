"""The run directory's layout: file names, the CSV tables of a rank directory and their columns, and
run-directory names (new, checked, per rank).

Layout (one sub-directory per rank, so ranks never write the same file)::

    <run_dir>/rank<R>/meta.json          versions, device, world size, rank, dtype, input spec, ...
                      steps.csv          schema.STEP_COLUMNS, one row appended per step as it ends
                      module_steps.csv   MODULE_STEP_COLUMNS, per-step per-module rows, appended
                      samples.csv        schema.SAMPLE_COLUMNS, appended by the sampler thread
                      modules.csv        schema.MEASURED_COLUMNS (the summary), written at stop()
                      kernels.csv        schema.KERNEL_COLUMNS, written at stop()
                      trace.json         Chrome trace of the profiler window (if profiling was on)
"""
from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path

from perfcheck.errors import UserError
from perfcheck.schema import KERNEL_COLUMNS, MEASURED_COLUMNS, SAMPLE_COLUMNS, STEP_COLUMNS

META = "meta.json"
TRACE = "trace.json"

#: Per-step, per-module rows (the raw numbers behind modules.csv).
MODULE_STEP_COLUMNS = {
    "step": "step index (as in steps.csv)",
    "module": "module path",
    "type": "module class name",
    "calls": "forward calls in the step",
    "fwd_s": "forward time in the step (sum over calls), seconds",
    "bwd_s": "backward time in the step (recompute inside it excluded), seconds",
    "recompute_s": "activation-checkpoint recompute time in the step, seconds",
    "eval_calls": "eval (grad-disabled, schema.PHASES) forward calls in the step; not in calls",
    "eval_s": "eval forward time in the step (sum over eval calls), seconds; not in fwd_s",
    "act_mem_bytes": "allocated-memory delta over the module's forward calls (summed), bytes; NaN on CPU",
    "peak_mem_bytes": "peak allocated memory during the module's forward calls, bytes; NaN on CPU",
    "rank": "distributed rank",
}

#: name -> (file name, columns) of the CSV tables in a rank directory.
TABLES = {
    "modules": ("modules.csv", MEASURED_COLUMNS),
    "steps": ("steps.csv", STEP_COLUMNS),
    "module_steps": ("module_steps.csv", MODULE_STEP_COLUMNS),
    "kernels": ("kernels.csv", KERNEL_COLUMNS),
    "samples": ("samples.csv", SAMPLE_COLUMNS),
}


def rank_dir(run_dir, rank: int) -> Path:
    return Path(run_dir) / f"rank{int(rank)}"


def check_run_dir(path, field: str = "out_dir") -> Path:
    """``path`` as a run directory to write into, checked before anything runs: a ``UserError`` naming
    ``field`` when it, or a directory above it, exists as something other than a directory."""
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)) or str(path) == "":
        raise UserError(f"{field}: expected a directory path, got {path!r}")
    p = Path(path)
    for q in (p, *p.parents):
        if q.exists() and not q.is_dir():
            raise UserError(f"{field}: {q} exists and is not a directory")
    return p


def new_run_dir(base="runs", label: str = "run") -> Path:
    """A fresh, unique run directory name under ``base`` (not created)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", label).strip("-") or "run"
    return Path(base) / f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-{uuid.uuid4().hex[:6]}"


"""Run directories: names, files, atomic writes, append-as-you-go, loading and per-rank merge.

Layout (one sub-directory per rank, so ranks never write the same file)::

    <run_dir>/rank<R>/meta.json          versions, device, world size, rank, dtype, input spec, ...
                      steps.csv          schema.STEP_COLUMNS, one row appended per step as it ends
                      module_steps.csv   MODULE_STEP_COLUMNS, per-step per-module rows, appended
                      samples.csv        schema.SAMPLE_COLUMNS, appended by the sampler thread
                      modules.csv        schema.MEASURED_COLUMNS (the summary), written at stop()
                      kernels.csv        schema.KERNEL_COLUMNS, written at stop()
                      trace.json         Chrome trace of the profiler window (if profiling was on)

Whole files are written to a temporary name and moved into place with ``os.replace`` (atomic on
POSIX), so a reader never sees half a file. Appended CSVs are flushed after every row: a crash
loses at most the step in flight. ``meta.json`` is written at start with ``"complete": false``
and rewritten at stop; ``load_run`` rebuilds ``modules.csv`` of an incomplete rank from
``module_steps.csv`` and ``steps.csv``. Temporary files left by a killed writer are removed by
the next writer in that directory.
"""
from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from perfcheck.errors import UserError
from perfcheck.schema import (KERNEL_COLUMNS, MEASURED_COLUMNS, SAMPLE_COLUMNS, SCHEMA_VERSION,
                              STEP_COLUMNS, SchemaError, added_columns, module_depth, validate_frame)

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
_STATS = ("median", "mean", "min", "max")
_TMP = re.compile(r"^\..+\.tmp-(\d+)-[0-9a-f]+$")


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


# ---------------------------------------------------------------------------------- writing
def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def atomic_write_bytes(path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def atomic_write_text(path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def _json_default(obj):
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    return repr(obj)


def atomic_write_json(path, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def with_added_columns(frame: pd.DataFrame, columns) -> pd.DataFrame:
    """``frame`` with the added columns (``schema.added_columns``) among ``columns`` that it lacks,
    filled (a copy if any)."""
    fill = {c: v for c, v in added_columns(columns).items() if c not in frame.columns}
    return frame.assign(**fill) if fill else frame


def atomic_write_csv(path, frame: pd.DataFrame, columns) -> Path:
    columns = list(columns)
    frame = with_added_columns(frame, columns)
    validate_frame(frame, columns, str(path))
    return atomic_write_text(path, frame[columns].to_csv(index=False))


def atomic_copy(src, dst) -> Path:
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(dst)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dst


def clean_stale_temps(directory) -> list[Path]:
    """Remove temporary files of writers that no longer run (killed mid-write)."""
    removed = []
    directory = Path(directory)
    if not directory.is_dir():
        return removed
    for p in directory.iterdir():
        m = _TMP.match(p.name)
        if m and not _pid_alive(int(m.group(1))):
            try:
                p.unlink()
            except OSError:  # another process removed it first
                continue
            removed.append(p)
    return removed


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _csv_value(v):
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if v is None:
        return "nan"
    return v


class CsvAppender:
    """Append rows to a CSV (header written when the file is new), flushing after each row."""

    def __init__(self, path, columns):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.columns = list(columns)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._fh = open(self.path, "a", newline="", encoding="utf-8")
        self._writer = csv.writer(self._fh)
        if new:
            self._writer.writerow(self.columns)
            self._fh.flush()

    def append(self, row: dict):
        if self._fh is None:
            return
        self._writer.writerow([_csv_value(row.get(c)) for c in self.columns])
        self._fh.flush()

    def append_rows(self, rows):
        """Rows given as sequences in ``columns`` order (a step's module rows), one flush for all."""
        if self._fh is None:
            return
        self._writer.writerows([[_csv_value(v) for v in r] for r in rows])
        self._fh.flush()

    def close(self):
        if self._fh is not None:
            self._fh.close()
            self._fh = None


# ------------------------------------------------------------------------------ summarizing
def summarize_module_steps(module_steps: pd.DataFrame, steps: pd.DataFrame, rank: int = 0,
                           flops: dict | None = None) -> pd.DataFrame:
    """schema.MEASURED_COLUMNS from per-step module rows, over the measured, non-failed steps.

    A module absent from a measured step counts as 0 s in that step (it did not run).
    ``flops`` maps path -> (forward FLOPs, backward FLOPs) from FlopCounterMode.
    """
    cols = list(MEASURED_COLUMNS)
    ok = steps[(steps["role"] == "measured") & ~steps["failed"].astype(bool)]["step"]
    n = len(ok)
    ms = module_steps[module_steps["step"].isin(set(ok))]
    if n == 0 or ms.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for path, g in ms.groupby("module", sort=False):
        pad = n - len(g)  # steps where the module did not run
        row = {"module": path, "type": g["type"].iloc[0], "depth": module_depth(path),
               "calls": float(np.median(np.r_[g["calls"].to_numpy(float), np.zeros(pad)])), "steps": n, "rank": rank}
        for col in ("fwd", "bwd", "recompute", "eval"):
            v = np.r_[g[f"{col}_s"].to_numpy(float), np.zeros(pad)]
            row.update({f"{col}_s_median": float(np.median(v)), f"{col}_s_mean": float(v.mean()),
                        f"{col}_s_min": float(v.min()), f"{col}_s_max": float(v.max())})
        row["eval_calls"] = float(np.median(np.r_[g["eval_calls"].to_numpy(float), np.zeros(pad)]))
        act, peak = g["act_mem_bytes"].to_numpy(float), g["peak_mem_bytes"].to_numpy(float)
        row["act_mem_bytes"] = float(np.median(act)) if np.isfinite(act).any() else math.nan
        row["peak_mem_bytes"] = float(np.nanmax(peak)) if np.isfinite(peak).any() else math.nan
        f_fwd, f_bwd = (flops or {}).get(path, (math.nan, math.nan))
        row["flops_fwd_counted"], row["flops_bwd_counted"] = float(f_fwd), float(f_bwd)
        row["fwd_flops_per_s"] = row["flops_fwd_counted"] / row["fwd_s_median"] if row["fwd_s_median"] > 0 else math.nan
        row["bwd_flops_per_s"] = row["flops_bwd_counted"] / row["bwd_s_median"] if row["bwd_s_median"] > 0 else math.nan
        rows.append(row)
    frame = pd.DataFrame(rows, columns=cols)
    return frame.sort_values("depth", kind="stable", ignore_index=True)


# ---------------------------------------------------------------------------------- loading
@dataclass
class Run:
    """A loaded run directory; frames hold all ranks (the ``rank`` column tells them apart)."""

    run_dir: Path
    ranks: list[int]
    meta: dict[int, dict]
    modules: pd.DataFrame
    steps: pd.DataFrame
    module_steps: pd.DataFrame
    kernels: pd.DataFrame
    samples: pd.DataFrame
    missing_ranks: list[int] = field(default_factory=list)
    complete: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return max(int(m.get("world_size", 1)) for m in self.meta.values())


def read_table(path: Path, columns, what: str) -> pd.DataFrame:
    """A CSV of the run directory with its schema's columns checked; garbage or a missing column is a
    UserError naming the file, an empty file an empty frame with the columns."""
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        frame = pd.DataFrame(columns=list(columns))
    except (OSError, pd.errors.ParserError) as exc:
        raise UserError(f"{path}: cannot read {what} ({exc})") from None
    try:
        return validate_frame(with_added_columns(frame, columns), columns, str(path))
    except SchemaError as exc:
        raise UserError(str(exc)) from None


def as_saved(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    """``frame`` (one of ``TABLES``) exactly as writing it to its CSV and reading it back gives it:
    a live run hands the analysis the same frames as its saved run directory."""
    import io

    fname, cols = TABLES[key]
    return read_table(io.StringIO(frame[list(cols)].to_csv(index=False)), cols, key)


def read_versioned_json(path: Path, what: str = META) -> dict:
    """A JSON file of the run directory whose ``schema_version`` must be this perfcheck's."""
    if not path.is_file():
        raise UserError(f"{path}: missing file (every rank directory needs {what})")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    version = meta.get("schema_version")
    if version != SCHEMA_VERSION:
        raise UserError(f"{path}: schema version {version!r} does not match this perfcheck's "
                        f"schema version {SCHEMA_VERSION}; re-run the measurement with this version")
    return meta


def _load_rank(d: Path, rank: int, notes: list[str]):
    meta = read_versioned_json(d / META)
    complete = bool(meta.get("complete", False))
    listed = set(meta.get("files", []))
    for name in sorted(listed):
        if not (d / name).is_file():
            raise UserError(f"{d / name}: missing file (listed in {d / META})")
    frames = {}
    for key, (fname, cols) in TABLES.items():
        path = d / fname
        if path.is_file():
            frames[key] = read_table(path, cols, key)
        elif key == "modules" and not complete:
            frames[key] = None  # rebuilt below
        elif complete or key in ("steps", "module_steps"):
            raise UserError(f"{path}: missing file")
        else:
            frames[key] = pd.DataFrame(columns=list(cols))
    measured = int((frames["steps"]["role"] == "measured").sum()) if "role" in frames["steps"] else 0
    if frames["modules"] is not None and frames["modules"].empty and measured:
        raise UserError(f"{d / TABLES['modules'][0]}: no module rows although {d / TABLES['steps'][0]} records "
                        f"{measured} measured step(s); the file was emptied or truncated; re-run the measurement")
    if not complete:
        last = int(frames["steps"]["step"].max()) if len(frames["steps"]) else None
        where = f"after step {last}" if last is not None else "before its first step ended"
        rebuilt = "; modules.csv rebuilt from module_steps.csv" if frames["modules"] is None else ""
        notes.append(f"rank {rank}: run cut short {where} (the last row of steps.csv; {measured} measured "
                     f"step(s) recorded){rebuilt}")
    if frames["modules"] is None:
        frames["modules"] = summarize_module_steps(frames["module_steps"], frames["steps"], rank)
    return meta, frames, complete


def load_run(run_dir) -> Run:
    """Load every ``rank*/`` of a run directory and merge the ranks.

    Raises UserError naming a missing file, an unreadable one, a missing column or a schema
    version mismatch. A rank directory that is absent (a rank that crashed before writing) is
    listed in ``Run.missing_ranks`` with a warning; the other ranks load.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: run directory not found")
    rank_dirs = {}
    for p in run_dir.iterdir():
        m = re.fullmatch(r"rank(\d+)", p.name)
        if m and p.is_dir():
            rank_dirs[int(m.group(1))] = p
    if not rank_dirs:
        raise UserError(f"{run_dir}: no rank*/ directories; not a perfcheck run directory "
                        f"(expected {run_dir}/rank0/{META})")
    notes: list[str] = []
    metas, parts, complete = {}, {k: [] for k in TABLES}, True
    for rank in sorted(rank_dirs):
        meta, frames, ok = _load_rank(rank_dirs[rank], rank, notes)
        metas[rank], complete = meta, complete and ok
        for k, f in frames.items():
            parts[k].append(f)
    world = max(int(m.get("world_size", 1)) for m in metas.values())
    missing = [r for r in range(world) if r not in metas]
    if missing:
        msg = f"{run_dir}: ranks {missing} of world size {world} have no directory (crashed or not saved)"
        notes.append(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
    merged = {k: (pd.concat([f for f in v if not f.empty], ignore_index=True) if any(not f.empty for f in v)
                  else pd.DataFrame(columns=list(TABLES[k][1]))) for k, v in parts.items()}
    return Run(run_dir=run_dir, ranks=sorted(metas), meta=metas, missing_ranks=missing, complete=complete,
               notes=notes, **merged)

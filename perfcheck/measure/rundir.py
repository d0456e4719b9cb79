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

import contextlib
import csv
import errno
import fcntl
import io
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
        self.rows = 0  # data rows appended by this writer (meta.json ``rows`` at the end)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._fh = open(self.path, "a", newline="", encoding="utf-8")
        self._writer = csv.writer(self._fh)
        if new:
            self._writer.writerow(self.columns)
            self._fh.flush()

    def append(self, row: dict):
        if self._fh is None:
            return
        try:
            self._writer.writerow([_csv_value(row.get(c)) for c in self.columns])
            self._fh.flush()
        except OSError as exc:  # a full or vanished disk mid-run: one line, not a traceback
            raise UserError(f"{self.path}: cannot append a row ({exc.strerror or exc})") from None
        self.rows += 1

    def append_rows(self, rows):
        """Rows given as sequences in ``columns`` order (a step's module rows), one flush for all."""
        if self._fh is None:
            return
        rows = [[_csv_value(v) for v in r] for r in rows]
        try:
            self._writer.writerows(rows)
            self._fh.flush()
        except OSError as exc:
            raise UserError(f"{self.path}: cannot append rows ({exc.strerror or exc})") from None
        self.rows += len(rows)

    def close(self):
        if self._fh is not None:
            fh, self._fh = self._fh, None
            with contextlib.suppress(OSError):  # the flush of a full disk: append() already said so in one line
                fh.close()


LOCK = ".perfcheck.lock"


class RunLock:
    """An exclusive lock on a directory that one run writes into (``flock`` on ``LOCK`` inside it).

    The lock file is created atomically (``O_CREAT``) and locked without waiting: a second run into the
    same directory gets a UserError instead of mixing its rows with the first's. The kernel drops the
    lock when the holder exits, killed or not, so a stale lock file never blocks a later run; it holds
    the holder's pid, for the message."""

    def __init__(self, directory):
        self.path = Path(directory) / LOCK
        self._fd = None

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise UserError(f"{self.path.parent}: another perfcheck run{f' (pid {holder})' if holder else ''} "
                                    "is writing into this directory; choose a new out_dir") from None
                raise
            try:  # the holder before us may have removed the file after we opened it: lock the one in place
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self):
        """Remove the lock file, then unlock (a run that opened the removed file retries on the new one)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):  # already removed, or a read-only directory: the unlock below frees it
                self.path.unlink()
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


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


#: Columns that hold text in every run-directory table (module paths, names, kinds); every other
#: column of a table must hold numbers (or True/False): a cell that is neither is a damaged file.
TEXT_COLUMNS = frozenset({"module", "type", "role", "phase", "name", "device", "what", "kind", "op", "dtype",
                          "target", "caller", "rate", "comm_kind", "unmodeled_ops", "bound_fwd", "bound_bwd",
                          "source"})
_BOOL_TEXT = frozenset({"true", "false"})
#: Largest JSON file of a run directory read (meta.json of a long run is ~10 KiB; a predicted.json
#: with its spec ~20 KiB): a bigger one is damaged or not perfcheck's, and is not read into memory.
MAX_JSON_BYTES = 16 << 20
#: Largest world size a meta.json may name. The largest published training jobs use ~10^5 GPUs
#: (Meta's Llama 3: 16,384 H100s; xAI's Colossus: ~10^5): 2^20 leaves an order of magnitude, and keeps
#: what a reader allocates per rank (the list of missing ranks) bounded.
MAX_WORLD_SIZE = 1 << 20


def inside(path, root=None) -> Path:
    """``path`` after checking that it resolves inside ``root`` (default: the directory that lists it):
    a run directory comes from elsewhere, so a link out of it (``launcher.log -> ~/.ssh/...``) is never
    followed. UserError otherwise."""
    path = Path(path)
    root = Path(root) if root is not None else path.parent
    try:
        real, base = path.resolve(), root.resolve()
    except (OSError, RuntimeError) as exc:  # a link loop
        raise UserError(f"{path}: cannot resolve the path ({exc})") from None
    if real != base and base not in real.parents:
        raise UserError(f"{path}: a link to {real}, outside {root}; perfcheck reads no file outside the run "
                        "directory (copy the file in if it belongs to the run)")
    return path


def decode_text(data: bytes, where) -> str:
    """UTF-8 text of a run file; bytes that are not UTF-8 (a damaged or foreign file) are a UserError."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{where}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); the file "
                        "is damaged or not perfcheck's") from None


def read_text(path, *, root=None, limit: int | None = None, tail: bool = False) -> str:
    """A run file's text, through ``inside`` and ``decode_text``. ``limit``: at most that many bytes are
    read (the last ones when ``tail``, then from the first whole line; else a larger file is a UserError)."""
    path = inside(path, root)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if limit is not None and size > limit:
                if not tail:
                    raise UserError(f"{path}: {size} bytes, more than the {limit} a perfcheck file of this kind "
                                    "holds; the file is damaged or not perfcheck's")
                fh.seek(size - limit)
                data = fh.read(limit)
                data = data[data.find(b"\n") + 1:] if b"\n" in data else data
                return data.decode("utf-8", errors="replace")
            data = fh.read()
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return data.decode("utf-8", errors="replace") if tail else decode_text(data, path)


def parse_json_text(text: str, where):
    """``json.loads`` whose every failure (malformed, nested deeper than Python's stack) is a UserError."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise UserError(f"{where}: JSON nested too deep to read; the file is damaged or not perfcheck's") from None


def read_json(path, *, root=None):
    """A JSON file of a run directory: inside it, at most ``MAX_JSON_BYTES``, UTF-8, well-formed."""
    return parse_json_text(read_text(path, root=root, limit=MAX_JSON_BYTES), path)


def read_bytes(path, *, root=None) -> bytes:
    """A run file's bytes, through ``inside``; an unreadable file is a UserError."""
    path = inside(path, root)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None


def csv_data(source, where) -> tuple:
    """``(data, note)``: the CSV of ``source`` (a path: its bytes, UTF-8 checked by the parser; a text
    buffer: its text) with a cut last line removed.

    Every row perfcheck writes ends with a newline (appended rows are flushed whole; whole files are
    moved into place), so a last line without one was cut mid-write or the file truncated: it is dropped
    and ``note`` says so (``None`` when the file is whole)."""
    data = source.read() if hasattr(source, "read") else read_bytes(source)
    nl = "\n" if isinstance(data, str) else b"\n"
    if not data or data.endswith(nl):
        return data, None
    kept = data[:data.rfind(nl) + 1]
    rows = max(kept.count(nl) - 1, 0)
    return kept, (f"{where}: the last line is cut mid-row (the file was truncated or its writer killed "
                  f"mid-write); it was dropped, {rows} whole row(s) read")


def parse_csv(data, where, **kwargs) -> pd.DataFrame:
    """``pd.read_csv`` of ``csv_data``'s data; bytes that are not UTF-8 or rows it cannot split are a
    UserError naming ``where`` (an empty file: ``pd.errors.EmptyDataError``, for the caller)."""
    buf = io.BytesIO(data) if isinstance(data, bytes) else io.StringIO(data)
    try:
        return pd.read_csv(buf, encoding="utf-8", **kwargs)
    except UnicodeDecodeError as exc:
        raise UserError(f"{where}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}); the file is damaged or "
                        "not perfcheck's") from None
    except pd.errors.EmptyDataError:
        raise
    except (pd.errors.ParserError, ValueError) as exc:
        raise UserError(f"{where}: cannot read the rows ({str(exc).splitlines()[0] if str(exc) else exc})") from None


def check_cells(frame: pd.DataFrame, where) -> pd.DataFrame:
    """Every column of ``frame`` not in ``TEXT_COLUMNS`` holds numbers or True/False; the first other cell
    is a UserError naming the file, the column, the line and the value."""
    for col in frame.columns:
        if col in TEXT_COLUMNS or pd.api.types.is_numeric_dtype(frame[col]) or pd.api.types.is_bool_dtype(frame[col]):
            continue
        values = frame[col]
        num = pd.to_numeric(values, errors="coerce")
        bad = values.notna() & num.isna() & ~values.astype(str).str.strip().str.lower().isin(_BOOL_TEXT)
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise UserError(f"{where}: column {col!r}, line {i + 2}: {str(values.iloc[i])[:40]!r} is not a number; "
                            "the file is damaged")
    return frame


def read_table(path, columns, what: str, notes: list | None = None) -> pd.DataFrame:
    """A CSV of the run directory with its schema's columns checked: undecodable bytes, a cell that is not
    a number where one belongs, or a missing column is a UserError naming the file; an empty file an
    empty frame with the columns; a cut last line is dropped with a note (appended to ``notes``, else
    a RuntimeWarning)."""
    where = what if hasattr(path, "read") else path
    data, note = csv_data(path, where)
    if note is not None:
        if notes is not None:
            notes.append(note)
        else:
            warnings.warn(note, RuntimeWarning, stacklevel=2)
    try:
        frame = parse_csv(data, where)
    except pd.errors.EmptyDataError:
        frame = pd.DataFrame(columns=list(columns))
    try:
        frame = validate_frame(with_added_columns(frame, columns), columns, str(where))
    except SchemaError as exc:
        raise UserError(str(exc)) from None
    return check_cells(frame, where)


def as_saved(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    """``frame`` (one of ``TABLES``) exactly as writing it to its CSV and reading it back gives it:
    a live run hands the analysis the same frames as its saved run directory."""
    fname, cols = TABLES[key]
    return read_table(io.StringIO(frame[list(cols)].to_csv(index=False)), cols, key)


def read_versioned_json(path: Path, what: str = META) -> dict:
    """A JSON file of the run directory whose ``schema_version`` must be this perfcheck's."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: missing file (every rank directory needs {what})")
    meta = read_json(path)
    if not isinstance(meta, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    version = meta.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise UserError(f"{path}: schema version {version} does not match this perfcheck's schema version "
                        f"{SCHEMA_VERSION}: it was written by a newer perfcheck; upgrade perfcheck "
                        "(pip install -U perfcheck) to read it")
    if version != SCHEMA_VERSION:
        raise UserError(f"{path}: schema version {version!r} does not match this perfcheck's "
                        f"schema version {SCHEMA_VERSION}; re-run the measurement with this version")
    return meta


def _int_field(meta: dict, key: str, where, lo: int, hi: int, default=None):
    value = meta.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise UserError(f"{where}: {key!r} must be an integer in {lo}..{hi}, got {str(value)[:40]!r}")
    return value


def check_meta(meta: dict, where) -> dict:
    """The fields of a rank's meta.json the reader relies on, checked: a world size that is a whole
    number up to ``MAX_WORLD_SIZE``, a rank below it, ``complete`` true or false, ``files`` a list of
    names and ``rows`` a map of file name to row count."""
    world = _int_field(meta, "world_size", where, 1, MAX_WORLD_SIZE, default=1)
    _int_field(meta, "rank", where, 0, world - 1, default=0)
    if not isinstance(meta.get("complete", False), bool):
        raise UserError(f"{where}: 'complete' must be true or false, got {meta.get('complete')!r}")
    files = meta.get("files", [])
    if not isinstance(files, list) or not all(isinstance(f, str) and f and "/" not in f and f not in (".", "..")
                                              for f in files):
        raise UserError(f"{where}: 'files' must be a list of file names")
    rows = meta.get("rows", {})
    if not isinstance(rows, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                             for v in rows.values()):
        raise UserError(f"{where}: 'rows' must map file names to row counts")
    return meta


def _truncated(frame: pd.DataFrame, expected, path: Path, notes: list) -> bool:
    """True (with a note) when ``frame`` has fewer rows than meta.json's ``rows`` records for its file."""
    if expected is None or len(frame) >= expected:
        if expected is not None and len(frame) > expected:
            notes.append(f"{path}: {len(frame)} rows, more than the {expected} the run wrote (rows were added "
                         "after it ended)")
        return False
    notes.append(f"{path}: {len(frame)} of the {expected} rows the run wrote (the file was truncated)")
    return True


def _load_rank(d: Path, rank: int, notes: list[str], root: Path):
    inside(d, root)
    meta = check_meta(read_versioned_json(d / META), d / META)
    complete = bool(meta.get("complete", False))
    rows = meta.get("rows", {})
    listed = set(meta.get("files", []))
    for name in sorted(listed):
        if not (d / name).is_file():
            raise UserError(f"{d / name}: missing file (listed in {d / META})")
    frames, cut = {}, set()
    for key, (fname, cols) in TABLES.items():
        path = d / fname
        if path.is_file():
            local: list[str] = []
            frames[key] = read_table(inside(path, d), cols, key, local)
            if local or _truncated(frames[key], rows.get(fname), path, local):
                cut.add(key)
            notes += local
        elif key == "modules" and not complete:
            frames[key] = None  # rebuilt below
        elif complete or key in ("steps", "module_steps"):
            raise UserError(f"{path}: missing file")
        else:
            frames[key] = pd.DataFrame(columns=list(cols))
    steps = frames["steps"]
    dup = steps["step"][steps["step"].duplicated()]
    if len(dup):
        raise UserError(f"{d / TABLES['steps'][0]}: step {int(dup.iloc[0])} recorded {int((steps['step'] == dup.iloc[0]).sum())} "
                        "times: more than one run wrote into this directory, so its rows are mixed; re-run into a new one")
    measured = int((steps["role"] == "measured").sum()) if "role" in steps else 0
    if frames["modules"] is not None and frames["modules"].empty and measured:
        raise UserError(f"{d / TABLES['modules'][0]}: no module rows although {d / TABLES['steps'][0]} records "
                        f"{measured} measured step(s); the file was emptied or truncated; re-run the measurement")
    if "modules" in cut and "module_steps" not in cut:  # a damaged summary: rebuilt whole from the per-step rows
        kept = frames["modules"]
        flops = {m: (f, b) for m, f, b in zip(kept["module"], kept["flops_fwd_counted"], kept["flops_bwd_counted"])}
        frames["modules"] = None
        notes.append(f"rank {rank}: modules.csv rebuilt from module_steps.csv (every module kept; FLOP counts of "
                     "the lost rows are unknown)")
    elif "modules" in cut:
        flops = None
        notes.append(f"rank {rank}: modules.csv and module_steps.csv are both cut: modules after the last whole "
                     "row are missing from this report")
    else:
        flops = None
    if meta.get("interrupted"):
        notes.append(f"rank {rank}: interrupted ({meta['interrupted']}) after step "
                     f"{int(steps['step'].max()) if len(steps) else '-'}; every file was written at the stop")
    if not complete:
        last = int(steps["step"].max()) if len(steps) else None
        where = f"after step {last}" if last is not None else "before its first step ended"
        rebuilt = "; modules.csv rebuilt from module_steps.csv" if frames["modules"] is None and not cut else ""
        notes.append(f"rank {rank}: run cut short {where} (the last row of steps.csv; {measured} measured "
                     f"step(s) recorded){rebuilt}")
    if frames["modules"] is None:
        frames["modules"] = summarize_module_steps(frames["module_steps"], steps, rank, flops)
    _check_predicted(d, rows.get("predicted.csv"), notes)
    return meta, frames, complete


def _check_predicted(d: Path, expected, notes: list):
    """A note when the rank's predicted.csv (read by predict.for_run) is cut: a partial last line, or fewer
    rows than meta.json records; the modules it lost are then shown as measured only."""
    path = d / "predicted.csv"
    if not path.is_file():
        return
    data, note = csv_data(inside(path, d), path)
    if note is not None:
        notes.append(note + "; modules after it have no prediction")
    elif expected is not None and data.count(b"\n") - 1 < expected:
        rows = data.count(b"\n") - 1
        notes.append(f"{path}: {rows} of the {expected} rows the run wrote (the file was truncated); modules "
                     "after them have no prediction")


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
        meta, frames, ok = _load_rank(rank_dirs[rank], rank, notes, run_dir)
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

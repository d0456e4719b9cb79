"""Writing a run directory: atomic whole-file writes, append-as-you-go CSVs, stale temporary files.

Whole files are written to a temporary name and moved into place with ``os.replace`` (atomic on
POSIX), so a reader never sees half a file. Appended CSVs are flushed after every row: a crash
loses at most the step in flight. Temporary files left by a killed writer are removed by the next
writer in that directory.
"""
from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import re
import shutil
import uuid
from pathlib import Path

import numpy as np
import pandas as pd

from perfcheck.errors import UserError
from perfcheck.schema import added_columns, validate_frame

_TMP = re.compile(r"^\..+\.tmp-(\d+)-[0-9a-f]+$")


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


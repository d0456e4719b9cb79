"""Reading one run file safely: inside the run directory, bounded in size, UTF-8, well-formed, with
each table's columns and cells checked. Every failure is a one-line UserError naming the file."""
from __future__ import annotations

import io
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from perfcheck.errors import UserError
from perfcheck.rundir.layout import META, TABLES
from perfcheck.rundir.writer import with_added_columns
from perfcheck.schema import SCHEMA_VERSION, SchemaError, validate_frame

#: Columns that hold text in every run-directory table (module paths, names, kinds); every other
#: column of a table must hold numbers (or True/False): a cell that is neither is a damaged file.
TEXT_COLUMNS = frozenset({"module", "type", "role", "phase", "name", "device", "what", "kind", "op", "dtype",
                          "target", "caller", "rate", "comm_kind", "unmodeled_ops", "bound_fwd", "bound_bwd",
                          "source"})
_BOOL_TEXT = frozenset({"true", "false"})
#: Largest JSON file of a run directory read (meta.json of a long run is ~10 KiB; a predicted.json
#: with its spec ~20 KiB): a bigger one is damaged or not perfcheck's, and is not read into memory.
MAX_JSON_BYTES = 16 << 20


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


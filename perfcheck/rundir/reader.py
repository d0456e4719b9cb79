"""Loading a run directory: every rank's files checked, an incomplete rank's summary rebuilt, the ranks
merged into one ``Run``.

``meta.json`` is written at start with ``"complete": false`` and rewritten at stop; ``load_run``
rebuilds ``modules.csv`` of an incomplete rank from ``module_steps.csv`` and ``steps.csv``.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from perfcheck.errors import UserError
from perfcheck.rundir.files import csv_data, inside, read_table, read_versioned_json
from perfcheck.rundir.layout import META, TABLES
from perfcheck.rundir.summary import summarize_module_steps

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



#: Largest world size a meta.json may name. The largest published training jobs use ~10^5 GPUs
#: (Meta's Llama 3: 16,384 H100s; xAI's Colossus: ~10^5): 2^20 leaves an order of magnitude, and keeps
#: what a reader allocates per rank (the list of missing ranks) bounded.
MAX_WORLD_SIZE = 1 << 20


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

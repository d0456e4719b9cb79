"""Collectives of a profiled window: kind, bytes, the module and phase that issued each one, and
the time the main thread spent waiting on them, per rank.

Read from ``torch.profiler`` events (``record_shapes=True``; the window's steps are not in the
measured statistics, so the shapes cost nothing there):

* **issued**: every outermost collective op on the training thread, c10d (``c10d::_allgather_base_``,
  ``c10d::allreduce_``...) or functional (``_c10d_functional::all_gather_into_tensor``); nested
  ones (the c10d op a functional collective calls) are not counted again. Bytes S follow the
  predictor's rule (``perfcheck.predict.distributed``: all-gather output, reduce-scatter input,
  all-reduce tensor). A tensor-list op whose shapes the profiler does not record
  (``c10d::allreduce_``, DDP's bucket all-reduce) takes its size from the backend event it
  started (``gloo:all_reduce`` / ``nccl:all_reduce``, the next one of that process group's thread).
  Module and phase are the event's context (``kernel_table.attribute``: the ``perfcheck/fwd``
  range or the autograd node it ran in): **issued by**.
* **waited**: ``_c10d_functional::wait_tensor`` and ``c10d::wait`` events on the training thread:
  the module and phase whose time contains the wait (**waited on**) and its duration. FSDP2 and
  DDP wait inside ``Work.wait()`` calls the profiler does not record as events; their waits show
  as time in the module intervals (NB: helper-5, 2026-11-22: not separated yet).

Columns: COLLECTIVE_COLUMNS (``rank``, ``module``, ``phase``, ``kind``, ``op``, ``bytes``,
``dtype``, ``issue_s`` the issuing op's CPU time, ``what`` = issued/waited, ``wait_s``).
"""
from __future__ import annotations

import math

import pandas as pd
from torch.autograd import DeviceType

COLLECTIVES_CSV = "collectives.csv"
COLLECTIVE_COLUMNS = ("rank", "what", "module", "phase", "kind", "op", "bytes", "dtype", "issue_s", "wait_s")
_BACKENDS = ("gloo:", "nccl:", "mpi:", "ucc:", "xccl:")
_WAITS = ("_c10d_functional::wait_tensor", "c10d::wait", "c10d_functional::wait_tensor")
_ELEM = {"float": 4, "float32": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8, "long": 8, "int": 4,
         "signed char": 1, "unsigned char": 1, "bool": 1, "short": 2, "Half": 2, "BFloat16": 2}


def _is_collective(name: str) -> str | None:
    from perfcheck.predict.distributed import op_kind

    if not name.startswith(("c10d::", "_c10d_functional::", "c10d_functional::")):
        return None
    return op_kind(name)


def _sizes(e) -> list:
    shapes = e.input_shapes or []
    dtypes = list(getattr(e, "input_dtypes", None) or [])
    out = []
    for i, s in enumerate(shapes):
        if not s or not all(isinstance(d, int) for d in s):
            continue
        dt = dtypes[i] if i < len(dtypes) else "float"
        out.append(math.prod(s) * _ELEM.get(str(dt), 4))
    return out


def _bytes(name: str, kind: str, e) -> float:
    """S from the recorded shapes (same rule as perfcheck.predict.distributed), NaN if none."""
    sizes = _sizes(e)
    if not sizes:
        return math.nan
    if name.startswith(("_c10d_functional", "c10d_functional")):
        first = sizes[0]
        if kind == "allgather":
            group = next((v for v in (e.concrete_inputs or [])[1:] if isinstance(v, int)), None)
            return float(first * (group or 1)) if group else math.nan
        return float(first)
    return float(max(sizes))


def collective_rows(events, ctx: dict, rank: int = 0, steps: int = 1) -> pd.DataFrame:
    """The collective table of one profiler window (``events`` = ``prof.events()``, ``ctx`` =
    ``kernel_table.attribute(events)``); ``bytes`` and ``wait_s`` are per window (divide by
    ``steps`` for per-step numbers; the frame's ``attrs['steps']`` keeps it)."""
    cpu = sorted((e for e in events if e.device_type == DeviceType.CPU), key=lambda e: e.time_range.start)
    backend = [e for e in cpu if e.name.startswith(_BACKENDS)]
    used: set = set()
    rows = []
    for e in cpu:
        kind = _is_collective(e.name)
        if kind is not None:
            parent, nested = e.cpu_parent, False
            while parent is not None:
                if _is_collective(parent.name) is not None:
                    nested = True
                    break
                parent = parent.cpu_parent
            if nested:
                continue
            size = _bytes(e.name, kind, e)
            if math.isnan(size):  # tensor-list op: the backend event it started holds the size
                match = next((b for b in backend if id(b) not in used and b.time_range.start >= e.time_range.start), None)
                if match is not None:
                    used.add(id(match))
                    sz = _sizes(match)
                    size = float(max(sz)) if sz else math.nan
            module, phase = ctx.get(id(e), ("unattributed", "unattributed"))
            rows.append({"rank": rank, "what": "issued", "module": module, "phase": phase, "kind": kind,
                         "op": e.name, "bytes": size, "dtype": "", "issue_s": e.cpu_time_total * 1e-6, "wait_s": 0.0})
        elif e.name in _WAITS:
            module, phase = ctx.get(id(e), ("unattributed", "unattributed"))
            rows.append({"rank": rank, "what": "waited", "module": module, "phase": phase, "kind": "", "op": e.name,
                         "bytes": 0.0, "dtype": "", "issue_s": 0.0, "wait_s": e.cpu_time_total * 1e-6})
    frame = pd.DataFrame(rows, columns=list(COLLECTIVE_COLUMNS))
    frame.attrs["steps"] = int(steps)
    return frame


def bytes_by_kind(frame: pd.DataFrame, steps: int | None = None) -> dict:
    """{kind: S bytes per step} of the issued collectives."""
    if frame is None or frame.empty:
        return {}
    steps = steps or int(frame.attrs.get("steps", 1) or 1)
    issued = frame[frame["what"] == "issued"]
    return {k: float(v) / steps for k, v in issued.groupby("kind")["bytes"].sum().items()}


def compute_time_per_rank(steps: pd.DataFrame, waits_s_per_step: dict | None = None) -> pd.DataFrame:
    """Per rank: median step time, median time waiting on collectives, and compute time = step
    time - waits. DDP and FSDP make step times equal across ranks (everyone waits for the
    slowest), so the straggler is the rank with the most compute, not the longest step."""
    waits_s_per_step = waits_s_per_step or {}
    m = steps[(steps["role"] == "measured") & (~steps["failed"].astype(bool))] if not steps.empty else steps
    rows = []
    for rank, g in m.groupby("rank"):
        step_s = float(g["step_s"].median())
        wait = float(waits_s_per_step.get(int(rank), 0.0))
        rows.append({"rank": int(rank), "step_s": step_s, "wait_s": wait, "compute_s": step_s - wait})
    return pd.DataFrame(rows, columns=["rank", "step_s", "wait_s", "compute_s"])

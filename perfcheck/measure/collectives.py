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
* **waited**: the module and phase whose time contains a wait (**waited on**) and its duration:
  a synchronous c10d call (``async_op=False``: FSDP2's default unshard on gloo) blocks its issuer in
  ``work.wait()`` right after the op: from the op's end to the end of the backend event that ran it,
  when the thread started nothing in between (op ``<name> (synchronous)``, on the issuer);
  ``_c10d_functional::wait_tensor`` / ``c10d::wait`` events (DTensor redistributes); FSDP2's
  ``FSDP::all_gather_copy_out (<unit>)`` range (it waits on the unit's all-gather ``Work``, then
  copies the gathered shards out: an upper bound of the wait); and the module timer's
  ``perfcheck/wait/bwd_finalize`` range around the frameworks' end-of-backward callbacks (DDP's
  ``finalize_backward`` waiting for its bucket all-reduces, FSDP2's post-backward waiting for its
  reduce-scatters), on the root in backward. ``Work.wait()`` itself is no profiler event; these
  ranges enclose it. A wait nested in another counted wait is not counted again.
* **target**: the FSDP2 unit a collective serves, from FSDP2's own ranges (``FSDP::all_gather
  (<unit>)``, ``FSDP::backward_prefetch for <unit>``, ``FSDP::post_backward_reduce (<unit>)``):
  with prefetching, a unit's backward all-gather is *issued by* the module before it and *waited
  on* in the unit's own pre-backward; both rows name the unit. '' when not FSDP2.

Columns: COLLECTIVE_COLUMNS (``rank``, ``module``, ``phase``, ``kind``, ``op``, ``bytes``,
``dtype``, ``issue_s`` the issuing op's CPU time, ``what`` = issued/waited, ``wait_s``, ``target``).
"""
from __future__ import annotations

import bisect
import math
import re

import pandas as pd
from torch.autograd import DeviceType

from perfcheck.predict import collective_bytes
from perfcheck.schema import ROOT

COLLECTIVES_CSV = "collectives.csv"
COLLECTIVE_COLUMNS = ("rank", "what", "module", "phase", "kind", "op", "bytes", "dtype", "issue_s", "wait_s", "target")
_BACKENDS = ("gloo:", "nccl:", "mpi:", "ucc:", "xccl:")
_WAITS = ("_c10d_functional::wait_tensor", "c10d::wait", "c10d_functional::wait_tensor")
#: The module timer's range around the frameworks' end-of-backward callbacks (measure/timer/backward.py, _after_backward).
FINALIZE_RANGE = "perfcheck/wait/bwd_finalize"
#: The ``op`` of its waited rows.
FINALIZE_OP = "end-of-backward callbacks (DDP finalize_backward / FSDP2 post-backward)"
_FSDP_COPY_OUT = "FSDP::all_gather_copy_out"
#: FSDP2 ranges naming the unit a collective serves: "FSDP::all_gather (layers.0)", "FSDP::backward_prefetch
#: for layers.1", "FSDP::post_backward_reduce (layers.0) [pg=2]" (torch/distributed/fsdp/_fully_shard).
_FSDP_UNIT = re.compile(r"^FSDP::(?:\w+ \(([^)]*)\)|\w+_prefetch for (\S*))")


_FSDP_GROUP_LABELS = {"all_gather", "all_gather_copy_out", "pre_forward", "post_forward", "pre_backward",
                      "post_backward_accumulate", "post_backward_reshard", "post_backward_reduce"}


def _wait_kind(name: str):
    """(kind, op label) of a wait event or range, None for other events."""
    if name in _WAITS:
        return "", name
    if name == FINALIZE_RANGE:
        return "", FINALIZE_OP
    if name.startswith(_FSDP_COPY_OUT):
        return "allgather", _FSDP_COPY_OUT
    return None


def _fsdp_unit(e) -> str:
    """The FSDP2 unit named by the innermost enclosing FSDP range of ``e`` (itself included), else ''."""
    while e is not None:
        if e.name.startswith("FSDP::"):
            m = _FSDP_UNIT.match(e.name)
            if m:
                return m.group(1) if m.group(1) is not None else (m.group(2) or ROOT)
            if e.name.split(" ")[0][len("FSDP::"):] in _FSDP_GROUP_LABELS:
                return ROOT  # the root unit's fqn is '': its labels carry no "(unit)"
        e = e.cpu_parent
    return ""
_ELEM = {"float": 4, "float32": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8, "long": 8, "int": 4,
         "signed char": 1, "unsigned char": 1, "bool": 1, "short": 2, "Half": 2, "BFloat16": 2}


def _is_collective(name: str) -> str | None:
    if not name.startswith(tuple(ns + "::" for ns in collective_bytes.NAMESPACES)):
        return None
    return collective_bytes.op_kind(name)


def _arg_sizes(e) -> list:
    """Byte sizes per tensor argument from the recorded shapes: ``[[x]]`` per tensor, one size per
    tensor for a tensor list (``[[a, b]]``); arguments without a recorded shape are left out."""
    shapes = e.input_shapes or []
    dtypes = list(getattr(e, "input_dtypes", None) or [])
    out = []
    for i, s in enumerate(shapes):
        elem = _ELEM.get(str(dtypes[i] if i < len(dtypes) else "float"), 4)
        if s and all(isinstance(d, int) for d in s):
            out.append([math.prod(s) * elem])
        elif s and all(isinstance(t, (list, tuple)) and t and all(isinstance(d, int) for d in t) for t in s):
            out.append([math.prod(t) * elem for t in s])  # a tensor list whose shapes were recorded
    return out


def _bytes(name: str, kind: str, e) -> float:
    """S from the recorded shapes by the one rule (``predict.collective_bytes.buffer_bytes``), NaN if none."""
    group = None
    if collective_bytes.namespace(name) in collective_bytes.FUNCTIONAL_NAMESPACES:
        group = collective_bytes.functional_group_size(list(e.concrete_inputs or []))
    return collective_bytes.buffer_bytes(name, kind, _arg_sizes(e), group)


#: Suffix of the ``op`` of a synchronous collective's waited row (the issuing call blocked until it ended).
SYNC_SUFFIX = " (synchronous)"


def _blocked_after(e, backend, starts: dict) -> float:
    """Seconds the thread that issued c10d op ``e`` sat blocked after it returned, until the backend
    event that ran it (``backend``, on the process group's thread) ended: a synchronous call
    (``async_op=False``, FSDP2's default unshard on gloo) waits in ``work.wait()``, which is no
    profiler event. Blocked means: the thread started no event between the op's end and the
    collective's end, and the op's enclosing range (if any) lasted until then. 0 otherwise (an
    asynchronous op whose thread went on working). An upper bound, like the copy-out range."""
    if backend is None:
        return 0.0
    end, done = e.time_range.end, backend.time_range.end
    if done <= end:
        return 0.0
    ts = starts.get(e.thread, [])
    i = bisect.bisect_right(ts, end)
    if i < len(ts) and ts[i] < done:
        return 0.0
    if e.cpu_parent is not None and e.cpu_parent.time_range.end < done:
        return 0.0
    return (done - end) * 1e-6


def collective_rows(events, ctx: dict, rank: int = 0, steps: int = 1) -> pd.DataFrame:
    """The collective table of one profiler window (``events`` = ``prof.events()``, ``ctx`` =
    ``kernel_table.attribute(events)``); ``bytes`` and ``wait_s`` are per window (divide by
    ``steps`` for per-step numbers; the frame's ``attrs['steps']`` keeps it)."""
    cpu = sorted((e for e in events if e.device_type == DeviceType.CPU), key=lambda e: e.time_range.start)
    backend = [e for e in cpu if e.name.startswith(_BACKENDS)]
    starts: dict = {}
    for e in cpu:
        starts.setdefault(e.thread, []).append(e.time_range.start)
    used: set = set()
    rows = []
    for e in cpu:
        kind = _is_collective(e.name)
        if kind is not None:
            rows += _issued_rows(e, kind, ctx, rank, backend, used, starts)
        elif _wait_kind(e.name) is not None:
            rows += _wait_rows(e, ctx, rank)
    if not any(r["what"] == "issued" for r in rows):
        rows = []  # no collective in the window: its end-of-backward callbacks waited on none
    frame = pd.DataFrame(rows, columns=list(COLLECTIVE_COLUMNS))
    frame.attrs["steps"] = int(steps)
    return frame


def _issued_rows(e, kind: str, ctx: dict, rank: int, backend: list, used: set, starts: dict) -> list:
    """The ``issued`` row of a collective op event (none when it is nested in another collective's), and
    a ``waited`` row when the call blocked its issuer (a synchronous collective). ``used`` collects the
    backend events already matched to an op, in order."""
    parent, nested = e.cpu_parent, False
    while parent is not None:
        if _is_collective(parent.name) is not None:
            nested = True
            break
        parent = parent.cpu_parent
    if nested:
        return []
    size = _bytes(e.name, kind, e)
    match = None
    if e.name.startswith("c10d::"):  # the backend event it started (in order): sizes, synchronous waits
        match = next((b for b in backend if id(b) not in used and b.time_range.start >= e.time_range.start), None)
        if match is not None:
            used.add(id(match))
    if math.isnan(size):  # tensor-list op: the backend event it started holds the size
        if match is not None:
            sz = [b for g in _arg_sizes(match) for b in g]
            size = float(max(sz)) if sz else math.nan
    module, phase = ctx.get(id(e), ("unattributed", "unattributed"))
    target = _fsdp_unit(e)
    if module == "unattributed" and target and kind == "reducescatter":
        module, phase = target, "bwd"  # FSDP2's post-backward reduce of the unit, run outside its interval
    rows = [{"rank": rank, "what": "issued", "module": module, "phase": phase, "kind": kind,
             "op": e.name, "bytes": size, "dtype": "", "issue_s": e.cpu_time_total * 1e-6, "wait_s": 0.0,
             "target": target}]
    blocked = _blocked_after(e, match, starts)
    if blocked > 0:  # a synchronous call (async_op=False): work.wait() right after the op, in the issuer
        rows.append({"rank": rank, "what": "waited", "module": module, "phase": phase, "kind": kind,
                     "op": e.name + SYNC_SUFFIX, "bytes": 0.0, "dtype": "", "issue_s": 0.0, "wait_s": blocked,
                     "target": target})
    return rows


def _wait_rows(e, ctx: dict, rank: int) -> list:
    """The ``waited`` row of a wait event (none when it is inside a wait already counted)."""
    parent = e.cpu_parent
    while parent is not None and _wait_kind(parent.name) is None:
        parent = parent.cpu_parent
    if parent is not None:
        return []  # inside a counted wait
    wkind, op = _wait_kind(e.name)
    if e.name == FINALIZE_RANGE:
        module, phase = ROOT, "bwd"
    else:
        module, phase = ctx.get(id(e), ("unattributed", "unattributed"))
    return [{"rank": rank, "what": "waited", "module": module, "phase": phase, "kind": wkind, "op": op,
             "bytes": 0.0, "dtype": "", "issue_s": 0.0, "wait_s": e.cpu_time_total * 1e-6,
             "target": _fsdp_unit(e)}]


def bytes_by_kind(frame: pd.DataFrame, steps: int | None = None) -> dict:
    """{kind: S bytes per step} of the issued collectives."""
    if frame is None or frame.empty:
        return {}
    steps = steps or int(frame.attrs.get("steps", 1) or 1)
    issued = frame[frame["what"] == "issued"]
    return {k: float(v) / steps for k, v in issued.groupby("kind")["bytes"].sum().items()}



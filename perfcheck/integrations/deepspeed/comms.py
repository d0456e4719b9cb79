"""Every collective a rank issues: kind, bytes, count and time, from DeepSpeed's comms logger and
the profiler trace.

The comms logger (``deepspeed.comm``'s ``timed_op``) records each op's message size exactly but
synchronizes the device after every op it logs, so it is switched on only for the steps we count
bytes in, and the logger's latencies are kept as ``logger_s`` (isolated op time, not exposed
time). Exposed communication time comes from the torch.profiler trace of a step run with the
logger off: communication events inside the ``perfcheck::engine::<phase>`` ranges, minus their
overlap with compute kernels on GPU.

Sizes: the logger records the ``tensor`` argument, which is each rank's INPUT: the shard for
all_gather / all_gather_into_tensor, the full unreduced tensor for reduce_scatter_tensor,
the tensor for all_reduce (deepspeed/comm/utils.py ``get_msg_size_from_args``). ``bytes`` below is
the full buffer S of the nccl-tests convention (collectives.py): msg * group for allgather, msg
otherwise.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from perfcheck.predict.collectives import bytes_from_deepspeed_log, normalize_kind
from perfcheck.rundir.deepspeed_files import COMMS_COLUMNS

_NAME = re.compile(r"^\s*(?P<op>[^|]+?)\s*(\|\s*\[Caller Func:\s*(?P<caller>[^\]]*)\])?\s*$")


def _logger():
    from deepspeed.comm import comm as ds_comm

    return ds_comm.comms_logger


class CommsCapture:
    """Turns the comms logger on for chosen steps and cuts its records into (step, micro-step, phase)."""

    def __init__(self, rank: int, group_size: int):
        self.rank, self.group_size = rank, group_size
        self.rows: list[dict] = []
        self._saved = None
        self._snap: dict = {}

    # --- logger on/off, restoring the user's settings ---------------------------------------
    def enable(self):
        log = _logger()
        if self._saved is None:
            self._saved = {k: getattr(log, k) for k in ("enabled", "prof_all", "verbose", "debug")}
        log.enabled, log.prof_all, log.verbose, log.debug = True, True, False, True
        self._snap = self._snapshot()

    def disable(self):
        if self._saved is not None:
            log = _logger()
            for k, v in self._saved.items():
                setattr(log, k, v)
            self._saved = None

    @property
    def active(self) -> bool:
        return self._saved is not None

    # --- cutting ------------------------------------------------------------------------------
    @staticmethod
    def _snapshot() -> dict:
        return {(name, size): (rec[0], len(rec[1])) for name, by_size in _logger().comms_dict.items()
                for size, rec in by_size.items()}

    def cut(self, step: int, micro: int, phase: str):
        """Attribute everything logged since the last cut to (step, micro, phase)."""
        if not self.active:
            return
        log = _logger().comms_dict
        now = self._snapshot()
        for key, (count, nlat) in now.items():
            c0, l0 = self._snap.get(key, (0, 0))
            if count <= c0:
                continue
            name, size = key
            lat_ms = log[name][size][1][l0:nlat]
            m = _NAME.match(name)
            op = m.group("op") if m else name
            try:
                kind = normalize_kind(op)
                full = int(bytes_from_deepspeed_log(op, size, self.group_size))
            except Exception:  # noqa: BLE001 - an op we have no kind for: keep it, as logged
                kind, full = op, int(size)
            self.rows.append({"rank": self.rank, "step": step, "micro_step": micro, "phase": phase, "op": op,
                              "caller": (m.group("caller") or "") if m else "", "kind": kind,
                              "msg_bytes": int(size), "bytes": full, "count": int(count - c0),
                              "logger_s": float(np.sum(lat_ms)) / 1e3, "group_size": self.group_size})
        self._snap = now

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=list(COMMS_COLUMNS))


# ------------------------------------------------------------------------- profiler trace
_COMM_EVENT = re.compile(r"(c10d::|gloo:|nccl:|ncclDevKernel|ncclKernel|record_param_comms|allreduce|allgather|"
                         r"all_gather|reduce_scatter|_reduce_scatter|all_reduce)", re.IGNORECASE)
_RANGE = re.compile(r"^perfcheck::engine::(fwd|bwd|step)$")


def _union(intervals) -> list:
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _length(intervals) -> float:
    return float(sum(b - a for a, b in intervals))


def _clip(intervals, lo, hi) -> list:
    return [[max(a, lo), min(b, hi)] for a, b in intervals if min(b, hi) > max(a, lo)]


def _minus(a_list, b_list) -> float:
    """Length of union(a) not covered by union(b)."""
    a_u, b_u = _union(a_list), _union(b_list)
    covered = sum(_length(_clip(b_u, lo, hi)) for lo, hi in a_u)
    return _length(a_u) - covered


def exposed_comm_from_trace(trace_path) -> dict:
    """Per phase: summed wall time of communication events, the part not hidden behind compute, and
    the phase ranges' own wall time (``wall_s``: the exposed share is exposed_s / wall_s).

    CPU (gloo): the calling thread blocks in the collective (or in its wait), so the union of
    communication events on the thread that ran the phase range is exposed. GPU: communication
    kernels (nccl*) minus their overlap with other kernels in the same phase window.
    Returns {} when the trace has no perfcheck::engine ranges.
    """
    path = Path(trace_path)
    if not path.is_file():
        return {}
    try:
        events = json.loads(path.read_text()).get("traceEvents", [])
    except (OSError, ValueError):
        return {}
    ranges = [(m.group(1), e["ts"], e["ts"] + e.get("dur", 0), e.get("tid"))
              for e in events if e.get("ph") == "X" and (m := _RANGE.match(str(e.get("name", ""))))]
    if not ranges:
        return {}
    x = [e for e in events if e.get("ph") == "X" and "dur" in e]
    gpu = [e for e in x if str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset")]
    out = {}
    for phase, lo, hi, tid in ranges:
        rec = out.setdefault(phase, {"comm_s": 0.0, "exposed_s": 0.0, "events": 0, "windows": 0, "wall_s": 0.0})
        rec["windows"] += 1
        rec["wall_s"] += (hi - lo) / 1e6  # the phase's own time in the window: exposed_s / wall_s is its share
        if gpu:
            k = _clip([[e["ts"], e["ts"] + e["dur"]] for e in gpu if "nccl" in e["name"].lower()], lo, hi)
            other = _clip([[e["ts"], e["ts"] + e["dur"]] for e in gpu if "nccl" not in e["name"].lower()], lo, hi)
            rec["comm_s"] += _length(_union(k)) / 1e6
            rec["exposed_s"] += _minus(k, other) / 1e6
            rec["events"] += len(k)
        else:
            names = ((e, str(e.get("name", ""))) for e in x if e.get("tid") == tid)
            c = _clip([[e["ts"], e["ts"] + e["dur"]] for e, name in names
                       if _COMM_EVENT.search(name) and not _RANGE.match(name)], lo, hi)
            rec["comm_s"] += _length(_union(c)) / 1e6
            rec["exposed_s"] += _length(_union(c)) / 1e6
            rec["events"] += len(c)
    return out

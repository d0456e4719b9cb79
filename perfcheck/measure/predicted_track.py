"""The prediction as its own track in the run's Chrome trace (trace.json), beside the measured module ranges.

Perfetto, chrome://tracing and HTA show the profiler's trace; PerfCheck's ranges in it are named
``perfcheck/fwd/<path>`` (forward) and ``perfcheck/bwd/<path>/begin|end`` (backward markers). This
adds a process named "perfcheck predicted" whose events carry the same names, ``perfcheck/fwd/<path>``
and ``perfcheck/bwd/<path>``, laid out from predicted.csv's one micro-batch:

* forward: the root starts where the measured root forward of the profiled step starts; each
  module's children follow one another inside it in the order the trace first called them (the
  predicted frame's row order), each lasting its ``pred_fwd_s`` (all its calls together), so a
  module's own time is what is left after its children;
* backward: the same nesting in reverse child order, starting where the measured root backward
  begins (its ``begin`` marker), else where the predicted forward ends.

So where measured and predicted part ways shows at a glance. Events follow the Chrome Trace Event
Format (complete events ``ph: "X"`` with ``ts``/``dur`` in microseconds; metadata events ``ph: "M"``
naming the process and thread). Adding is idempotent: a second save replaces the track.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import perfcheck.rundir as runs
from perfcheck.schema import ROOT

CATEGORY = "perfcheck_predicted"
PROCESS_NAME = "perfcheck predicted"
THREAD_NAME = "predicted per module (one micro-batch: fwd, bwd)"


def _children(paths: list) -> dict:
    """{parent path: [child paths in order]} for named_modules() paths (ROOT the root)."""
    present = set(paths)
    out: dict = {p: [] for p in paths}
    for p in paths:
        if p == ROOT:
            continue
        parts = p.split(".")
        parent = next((".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1) if ".".join(parts[:i]) in present),
                      ROOT)
        out.setdefault(parent, []).append(p)
    return out


def _seconds(value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) and v > 0 else 0.0


def predicted_events(pred, fwd_start_us: float, bwd_start_us: float | None, pid: int, tid: int = 0) -> list:
    """Chrome trace events for ``pred`` (schema.PREDICTED_COLUMNS rows), forward from ``fwd_start_us``,
    backward from ``bwd_start_us`` (None: right after the predicted forward)."""
    rows = {str(r["module"]): r for r in pred.to_dict("records")}
    kids = _children(list(rows))
    events: list = []

    def place(path, start, phase):
        r = rows[path]
        dur = _seconds(r.get(f"pred_{phase}_s")) * 1e6
        events.append({"ph": "X", "cat": CATEGORY, "name": f"perfcheck/{phase}/{path}", "pid": pid, "tid": tid,
                       "ts": start, "dur": dur,
                       "args": {"predicted_s": dur / 1e6, "calls": int(_seconds(r.get("calls"))),
                                "bound": str(r.get(f"bound_{phase}", "") or ""), "module_type": str(r.get("type", "")),
                                "source": "perfcheck prediction (predicted.csv), one micro-batch"}})
        t = start
        for child in (kids.get(path, []) if phase == "fwd" else list(reversed(kids.get(path, [])))):
            t += place(child, t, phase)
        return dur

    if ROOT not in rows:
        return []
    fwd_dur = place(ROOT, fwd_start_us, "fwd")
    place(ROOT, bwd_start_us if bwd_start_us is not None else fwd_start_us + fwd_dur, "bwd")
    meta = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": PROCESS_NAME}},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": -1}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": THREAD_NAME}}]
    return meta + events


def _anchors(events: list) -> tuple:
    """``(ts of the first measured root forward, ts of the root backward's begin marker after it or None)``."""
    fwd_name, bwd_name = f"perfcheck/fwd/{ROOT}", f"perfcheck/bwd/{ROOT}/begin"
    fwd = min((e["ts"] for e in events if e.get("name") == fwd_name and e.get("ph") == "X" and e.get("cat") != CATEGORY),
              default=None)
    if fwd is None:
        return None, None
    bwd = min((e["ts"] for e in events if e.get("name") == bwd_name and e.get("ph") == "X" and e["ts"] >= fwd),
              default=None)
    return fwd, bwd


def add_predicted_track(trace_path, pred) -> bool:
    """Rewrite the Chrome trace at ``trace_path`` with the predicted track (replacing an earlier one);
    False (file untouched) when the trace has no measured root forward to anchor it or ``pred`` no root row."""
    path = Path(trace_path)
    trace = json.loads(runs.read_text(path))
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        return False
    ours = {e.get("pid") for e in events if e.get("cat") == CATEGORY}
    kept = [e for e in events if e.get("pid") not in ours]
    fwd, bwd = _anchors(kept)
    if fwd is None:
        return False
    pids = [e.get("pid") for e in kept if isinstance(e.get("pid"), int)]
    pid = (max(pids) + 1) if pids else 1  # a process of its own: an integer pid no measured event uses
    added = predicted_events(pred, fwd, bwd, pid)
    if not added:
        return False
    if isinstance(trace, dict):
        trace["traceEvents"] = kept + added
    else:
        trace = kept + added
    runs.atomic_write_text(path, json.dumps(trace))
    return True

"""Kernel (GPU) or aten-op (CPU) time per module and phase, from one torch.profiler window.

Attribution, so that nothing is counted twice and nothing is lost
-----------------------------------------------------------------
Every CPU event of the window gets a context (module path, phase), found by walking up the
profiler's event tree (``FunctionEvent.cpu_parent``) to the innermost of:

* a ``perfcheck/fwd/<path>``, ``perfcheck/recompute/<path>`` or ``perfcheck/eval/<path>`` range (opened
  by the module timer's forward hooks, properly nested; ``eval``: a forward made with grad disabled);
* an autograd node, ``autograd::engine::evaluate_function: <Node>``: phase ``bwd``, module = the
  module whose forward created that node. Backward ranges cannot be opened by hooks without
  breaking the profiler's nesting (a module's backward starts inside one node's evaluation and
  ends inside another's), so the link is the autograd sequence number: a forward op records the
  sequence number its node receives, the node's evaluation records it back (with the forward
  thread). ``AccumulateGrad`` nodes have none; they run right after the node that produced the
  gradient and are given that node's module. The timer also drops zero-length markers
  ``perfcheck/bwd/<path>/begin`` and ``.../end`` into the trace so backward boundaries are visible;
* an ``Optimizer.step#...`` / ``Optimizer.zero_grad#...`` range (torch.optim records them):
  module ``(optimizer)``, phase ``optim``;
* otherwise module ``unattributed``, phase ``unattributed`` (loss, data movement, user code
  outside the model).

Step: every row also carries the profiled step it ran in, the ``N`` of the ``ProfilerStep#N`` range
torch.profiler opens on the host at each ``prof.step()`` (PerfCheck calls it at every step
boundary, so ``N`` is the step index of steps.csv). A CPU event belongs to the step whose host range
contains its start (by time, not by nesting: the autograd engine's device threads run backward ops
outside the main thread's range); a device kernel belongs to the step of the CPU op that launched
it. Device events no CPU op claims (see below) have step -1: not tied to a step. Summed over
steps, the rows are the window's totals as before; per step, they give medians and spreads.

CPU (``device="cpu"``): one row per (module, phase, op name, step) with the ops' count, total (inclusive)
and self time. Self times partition the profiler's total self CPU time exactly; time inside a
perfcheck range but in no op (Python, hooks) is the row named ``(outside ops)``.
CUDA: one row per (module, phase, kernel name, step) for device events (kernels, memcpy, memset); a
kernel takes the context of the CPU op that launched it (the op's ``FunctionEvent.kernels``);
total = self = summed duration, and the rows sum to the profiler's total device time.
"""
from __future__ import annotations

import bisect
import os
import re
import tempfile
import uuid
from pathlib import Path

import pandas as pd
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, schedule

from perfcheck.measure.collectives import collective_rows
from perfcheck.schema import KERNEL_COLUMNS

OPTIMIZER = "(optimizer)"
UNATTRIBUTED = "unattributed"
OUTSIDE_OPS = "(outside ops)"
_EVAL = "autograd::engine::evaluate_function: "
_RANGE_PHASES = {"fwd", "recompute", "eval"}  # eval: a grad-disabled forward (measure.timer.EVAL)
_RUNTIME_API = re.compile(r"cu[A-Z]|cuda[A-Z]")  # cudaLaunchKernel, cuLaunchKernelEx, cudaMemcpyAsync, ...
_PROFILER_STEP = re.compile(r"ProfilerStep[#*](\d*)$")
NO_STEP = -1  # device work no CPU op claims: not tied to a step


def step_of(events, first_step: int = 0) -> dict:
    """The profiled step of every CPU event, keyed by id(event): the step of the host
    ``ProfilerStep`` range that contains the event's start (before the first range: the first
    step; between ranges: the one that started last). ``prof.events()`` names those ranges
    ``ProfilerStep*`` (torch 2.13 drops the ``#N`` the Chrome trace keeps), so the k-th range in
    time order is step ``first_step + k``, the window's k-th active step; a ``#N`` in the name, where
    present, is used as is. Empty when the window has no such range (a profiler driven without
    ``prof.step()``); callers then use ``NO_STEP``."""
    ranges = sorted((e.time_range.start, m.group(1)) for e in events
                    if e.device_type == DeviceType.CPU and (m := _PROFILER_STEP.match(e.name)))
    if not ranges:
        return {}
    starts = [t for t, _ in ranges]
    numbers = [int(n) if n else first_step + k for k, (_, n) in enumerate(ranges)]
    out = {}
    for e in events:
        if e.device_type == DeviceType.CPU:
            i = bisect.bisect_right(starts, e.time_range.start) - 1
            out[id(e)] = numbers[max(i, 0)]
    return out


def _range_context(name: str):
    """(path, phase) for a perfcheck forward/recompute range name, else None."""
    if not name.startswith("perfcheck/"):
        return None
    _, phase, path = name.split("/", 2)
    return (path, phase) if phase in _RANGE_PHASES else None


def _valid_seq(e) -> bool:
    return e.sequence_nr is not None and 0 <= e.sequence_nr < 2**62


def attribute(events) -> dict:
    """Context (module, phase) of every CPU event, keyed by id(event)."""
    cpu = sorted((e for e in events if e.device_type == DeviceType.CPU),
                 key=lambda e: (e.time_range.start, -e.time_range.end))
    # The node's own event ("AddmmBackward0", a child of evaluate_function) carries the sequence
    # number and forward thread; the evaluate_function wrapper does not always (not when the node
    # has tensor pre-hooks), and the wrapper also holds the node's hooks and grad accumulation.
    node_key: dict[int, tuple] = {}
    for e in cpu:
        parent = e.cpu_parent
        if parent is not None and e.fwd_thread and _valid_seq(e) and parent.name.startswith(_EVAL):
            node_key.setdefault(id(parent), (e.fwd_thread, e.sequence_nr))
    ctx: dict[int, tuple] = {}
    seq_owner: dict[tuple, str] = {}  # (forward thread, sequence nr) -> module path
    last_node: dict[int, tuple] = {}  # thread -> context of the last autograd node evaluated
    none = (UNATTRIBUTED, UNATTRIBUTED)
    for e in cpu:
        name = e.name
        own = _range_context(name)
        if own is None and name.startswith(_EVAL):
            key = node_key.get(id(e)) or ((e.fwd_thread, e.sequence_nr) if e.fwd_thread and _valid_seq(e) else None)
            if key is not None:
                owner = seq_owner.get(key)
                own = (owner, "bwd") if owner is not None else (UNATTRIBUTED, "bwd")
            else:  # AccumulateGrad: the node that produced the gradient ran just before
                own = last_node.get(e.thread, (UNATTRIBUTED, "bwd"))
            last_node[e.thread] = own
        elif own is None and name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")):
            own = (OPTIMIZER, "optim")
        if own is None:
            parent = e.cpu_parent
            own = ctx.get(id(parent), none) if parent is not None else none
        ctx[id(e)] = own
        if not e.fwd_thread and _valid_seq(e):
            # a forward op records the number its autograd node would get; the last op to record
            # a number is the one that created the node
            if own[1] in _RANGE_PHASES:
                seq_owner[(e.thread, e.sequence_nr)] = own[0]
            else:
                seq_owner.pop((e.thread, e.sequence_nr), None)
    return ctx


def kernel_rows(events, device: str, rank: int = 0, first_step: int = 0) -> pd.DataFrame:
    """The kernel table (schema.KERNEL_COLUMNS) for one profiler window's ``prof.events()``;
    ``first_step``: the step index of the window's first active step (see step_of)."""
    ctx = attribute(events)
    steps = step_of(events, first_step)
    acc: dict[tuple, list] = {}

    def add(key, total_us, self_us):
        row = acc.setdefault(key, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += total_us
        row[2] += self_us

    if device == "cpu":
        for e in events:
            if e.device_type != DeviceType.CPU:
                continue
            module, phase = ctx[id(e)]
            self_us = e.self_cpu_time_total
            step = steps.get(id(e), NO_STEP)
            if e.name.startswith("perfcheck/"):
                add((module, phase, OUTSIDE_OPS, step), self_us, self_us)
            else:
                add((module, phase, e.name, step), e.cpu_time_total, self_us)
    else:
        _device_rows(events, ctx, add, acc, steps)
    rows = [
        {"module": m, "phase": p, "name": n, "step": st, "device": device, "count": c, "total_s": t * 1e-6,
         "self_s": s * 1e-6, "rank": rank}
        for (m, p, n, st), (c, t, s) in acc.items()
    ]
    frame = pd.DataFrame(rows, columns=list(KERNEL_COLUMNS)).astype({"step": "int64"})
    return frame.sort_values(["module", "phase", "self_s", "step"], ascending=[True, True, False, True],
                             ignore_index=True)


def _device_rows(events, ctx: dict, add, acc: dict, steps: dict):
    """Device events (kernels, memcpy, memset) per (module, phase, name, step); ``steps``: step_of().
    torch hands each one to
    the CPU op that launched it (``FunctionEvent.kernels``, linked by correlation id when the
    profiler builds its events; the same on torch 2.11 and 2.13, whereas the device event's own
    ``linked_correlation_id`` attribute is newer than 2.11). A kernel takes its launcher's context;
    device events no CPU op claims (per name: profiler count and time minus claimed) are
    ``unattributed`` with step ``NO_STEP`` (a ``Kernel`` record carries no link back to its device
    event, so which ones went unclaimed is unknown), so the rows sum to the profiler's device total."""
    claimed: dict[str, list] = {}
    cpu_names = {e.name for e in events if e.device_type == DeviceType.CPU}
    for e in events:
        if e.device_type != DeviceType.CPU or getattr(e, "is_legacy", False) or not e.kernels:
            continue
        if getattr(e, "linked_correlation_id", 0) or _RUNTIME_API.match(e.name):
            continue  # a CUDA runtime/driver call (cudaLaunchKernel), never the op that asked for the
            # kernel; skipped defensively, should torch ever list the kernel under it too
        module, phase = ctx.get(id(e), (UNATTRIBUTED, UNATTRIBUTED))
        step = steps.get(id(e), NO_STEP)
        for k in e.kernels:
            if k.name in cpu_names:
                continue  # a range's device-side copy, not work (see device_work)
            add((module, phase, k.name, step), k.duration, k.duration)
            seen = claimed.setdefault(k.name, [0, 0.0])
            seen[0] += 1
            seen[1] += k.duration
    totals: dict[str, list] = {}
    for e in device_work(events):
        row = totals.setdefault(e.name, [0, 0.0])
        row[0] += 1
        row[1] += e.time_range.elapsed_us()
    for name, (n, us) in totals.items():
        n_claimed, us_claimed = claimed.get(name, (0, 0.0))
        if n > n_claimed:
            row = acc.setdefault((UNATTRIBUTED, UNATTRIBUTED, name, NO_STEP), [0, 0.0, 0.0])
            row[0] += n - n_claimed
            row[1] += us - us_claimed
            row[2] += us - us_claimed


def device_work(events) -> list:
    """The device events that are work (kernels, memcpy, memset): not the device-side copies of
    ``record_function`` ranges (``gpu_user_annotation`` in the trace, e.g. ``perfcheck/fwd/h.0``,
    ``ProfilerStep#3``), which span the kernels inside them. Counting those too more than doubled
    the device total on the first GPU run (2026-11-22, torch 2.11)."""
    cpu_names = {e.name for e in events if e.device_type == DeviceType.CPU}
    return [e for e in events if e.device_type != DeviceType.CPU and not getattr(e, "is_user_annotation", False)
            and e.name not in cpu_names]


def profiler_total_s(events, device: str) -> float:
    """The profiler's own total for the window: self CPU time (cpu) or device time (cuda), seconds."""
    if device == "cpu":
        return sum(e.self_cpu_time_total for e in events if e.device_type == DeviceType.CPU) * 1e-6
    return sum(e.time_range.elapsed_us() for e in device_work(events)) * 1e-6


def empty_kernel_frame() -> pd.DataFrame:
    return pd.DataFrame(columns=list(KERNEL_COLUMNS))


class ProfilerWindow:
    """One ``torch.profiler`` window on a schedule; at its end, the kernel table and trace.json.

    ``skip_first`` steps pass unprofiled, then ``torch.profiler.schedule(wait, warmup, active,
    repeat=1)``. ``step()`` is called at every step boundary. The Chrome trace is exported to
    ``trace_dir/trace.json`` (a temporary directory if None) via a temporary name + os.replace.
    Failures are reported through ``warn`` and never raised into the training loop.
    """

    def __init__(self, device: str, skip_first: int, window: tuple, rank: int, trace_dir=None, warn=print):
        self.device, self.rank, self.warn = device, rank, warn
        self.trace_dir = trace_dir
        wait, pwarm, active = window
        first = skip_first + wait + pwarm
        self.info: dict = {"window": {"skip_first": skip_first, "wait": wait, "warmup": pwarm, "active": active},
                           "steps": list(range(first, first + active))}
        self.kernels = empty_kernel_frame()
        self.collectives = None  # measure/collectives.py frame, set when the window ends
        self.trace_path = None
        self._prof = None
        self._schedule = (skip_first, wait, pwarm, active)

    def start(self):
        skip, wait, pwarm, active = self._schedule
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
        # record_shapes: collective sizes (measure/collectives.py); the window is not measured
        self._prof = profile(activities=acts, on_trace_ready=self._on_trace_ready, record_shapes=True,
                             schedule=schedule(skip_first=skip, wait=wait, warmup=pwarm, active=active, repeat=1))
        self._steps = 0
        self._sync_at_boundary()
        self._prof.start()
        return self

    def step(self):
        if self._prof is not None:
            self._steps += 1
            self._sync_at_boundary()
            self._prof.step()

    def _sync_at_boundary(self):
        """On CUDA, synchronize at the boundaries of the active window (never inside a step, and
        only around the profiled steps, which are not measured): a host that runs ahead has
        launched kernels in the step before the window that run inside it, whose launches the
        window did not record. On the first H100 run (2026-11-22) 44% of the window's device
        time was such kernels, unattributable. Bracketed, the window holds exactly its own
        steps' kernels."""
        if self.device != "cuda":
            return
        skip, wait, pwarm, active = self._schedule
        first = skip + wait + pwarm
        if self._steps in (first, first + active):
            torch.cuda.synchronize()

    def stop(self):
        prof, self._prof = self._prof, None
        if prof is None:
            return
        try:
            prof.stop()
        except Exception as exc:  # the profiler must not turn a finished run into a crash
            self.warn(f"torch.profiler failed to stop ({type(exc).__name__}: {exc})")

    def _on_trace_ready(self, prof):
        try:
            events = prof.events()
            self.kernels = kernel_rows(events, self.device, self.rank, self.info["steps"][0])
            self.collectives = collective_rows(events, attribute(events), self.rank, self._schedule[3])
            self.info.update({
                "total_s": profiler_total_s(events, self.device),
                "total_kind": "self CPU time of all events" if self.device == "cpu" else "device time of all kernels",
                "attributed_s": float(self.kernels["self_s"].sum())})
            if self.trace_dir is None:
                self.trace_dir = tempfile.mkdtemp(prefix="perfcheck-trace-")
            target = Path(self.trace_dir) / "trace.json"
            tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            try:
                prof.export_chrome_trace(str(tmp))
                os.replace(tmp, target)
            finally:  # a full disk leaves no partial trace behind
                if tmp.exists():
                    tmp.unlink()
            self.trace_path = target
        except Exception as exc:  # never crash the training run over a trace
            self.warn(f"profiler results could not be processed ({type(exc).__name__}: {exc})")



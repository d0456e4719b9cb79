"""Per-module forward, backward and recompute time from module and autograd hooks.

How each interval is taken (all hooks are markers: they never change inputs, outputs or grads)
------------------------------------------------------------------------------------------------
* Forward / recompute: a forward pre-hook (``prepend=True``: it runs before other pre-hooks, so
  their work, e.g. DeepSpeed ZeRO-3's parameter gather, is inside the interval) to a forward hook
  (``always_call=True``: it runs last, and also when forward raises). A call made while autograd
  runs a backward (``torch._C._current_graph_task_id() != -1``) is activation-checkpoint
  recompute and is reported as ``recompute``, not forward.
* Backward start: the first gradient w.r.t. any output of the call is ready (a tensor hook on
  each output that requires grad; autograd fires it just before running that output's grad_fn).
  No ``register_full_backward_hook``: it wraps inputs/outputs in a custom Function and raises on
  in-place ops such as ``nn.ReLU(inplace=True)``. Tensor hooks follow in-place semantics (a hook
  registered before an in-place op sees the gradient of the value it was registered on).
* Backward end: the earliest of
  (a) every needed input gradient is ready (``register_multi_grad_hook(mode="all")`` on the inputs
      that require grad; for one input a plain tensor hook);
  (b) the backward of a module outside this call's subtree starts, including another call of the
      same module. Autograd runs ready nodes in reverse creation order, so once it starts on work
      created before this call, this call's nodes are done;
  (c) an enclosing module's backward ends;
  (d) the end of the backward pass (``Variable._execution_engine.queue_callback``).
  (b)-(d) are what closes a module with no grad-requiring input (a first layer: its backward is
  only weight-gradient work, ending when autograd moves on to earlier work or the pass ends), and
  a module whose input also feeds later modules (q/k/v projections of one ``x``: (a) alone would
  wait for all three). Open backward intervals therefore always form one root-to-leaf chain.
* Backward time excludes recompute that ran inside the interval (non-reentrant checkpointing
  recomputes when the first saved tensor is unpacked, inside the module's backward).
* Clocks: CPU ``time.perf_counter_ns``; CUDA events taken from a pool and recorded on the
  current stream, resolved only after the step's end event has completed (``query()``), so
  the hot path never synchronizes the device.
"""
from __future__ import annotations

import sys

import torch
from torch.autograd.graph import register_multi_grad_hook

from perfcheck.measure.clocks import CpuClock, CudaClock  # noqa: F401 (re-exported for callers)
from perfcheck.measure.context import describe
from perfcheck.schema import ROOT

FWD, BWD, RECOMPUTE = "fwd", "bwd", "recompute"
_graph_task_id = torch._C._current_graph_task_id
_profiler = torch.autograd.profiler
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling


# ------------------------------------------------------------------------------ records
class _Call:
    """One forward (or recompute) call of a module."""

    __slots__ = ("path", "phase", "mid", "t0", "t1", "mem", "act", "peak", "rf", "bwd_task", "ended_task", "top")

    def __init__(self, path, phase, mid):
        self.path, self.phase, self.mid = path, phase, mid
        self.t0 = self.t1 = self.mem = self.act = self.peak = self.rf = None
        self.bwd_task = self.ended_task = None
        self.top = False  # a recompute call not nested in another recompute call


class _Bwd:
    """One backward interval of one call."""

    __slots__ = ("path", "call", "task", "b0", "b1", "rc")

    def __init__(self, path, call, task, b0):
        self.path, self.call, self.task, self.b0 = path, call, task, b0
        self.b1 = None
        self.rc: list[_Call] = []


def _grad_tensors(obj, out: list):
    """Tensors requiring grad inside args/kwargs (tensors, lists, tuples, dicts)."""
    if isinstance(obj, torch.Tensor):
        if obj.requires_grad:
            out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _grad_tensors(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _grad_tensors(x, out)
    return out


class PendingStep:
    """A finished step whose tokens may still be in flight on the device."""

    def __init__(self, clock, start, end, calls, bwds, tokens, failed, peak_mem):
        self.clock, self.start, self.end = clock, start, end
        self.calls, self.bwds, self.tokens = calls, bwds, tokens
        self.failed, self.peak_mem = failed, peak_mem

    def ready(self) -> bool:
        return self.clock.ready(self.end)

    def resolve(self) -> dict:
        """Seconds per module and phase. Returns {'modules': {path: [calls, fwd, bwd, rc, act, peak]}, ...}."""
        if not self.clock.ready(self.end):
            self.end.synchronize()  # only reached at stop() or when the CPU runs far ahead
        sec, s0 = self.clock.seconds, self.start
        mods: dict[str, list] = {}
        root_fwd_end = root_bwd_end = None
        for c in self.calls:
            if c.t1 is None:
                continue
            row = mods.setdefault(c.path, [0, 0.0, 0.0, 0.0, None, None])
            dt = sec(c.t0, c.t1)
            if c.phase == FWD:
                row[0] += 1
                row[1] += dt
                if c.act is not None:
                    row[4] = (row[4] or 0) + c.act
                    row[5] = c.peak if row[5] is None else max(row[5], c.peak)
                if c.path == ROOT:
                    root_fwd_end = c.t1
            else:
                row[3] += dt
        for b in self.bwds:
            if b.b1 is None:
                continue
            dt = sec(b.b0, b.b1) - sum(sec(r.t0, r.t1) for r in b.rc if r.t1 is not None)
            row = mods.setdefault(b.path, [0, 0.0, 0.0, 0.0, None, None])
            row[2] += max(dt, 0.0)
            if b.path == ROOT:
                root_bwd_end = b.b1
        last = root_bwd_end if root_bwd_end is not None else root_fwd_end
        root = mods.get(ROOT, [0, 0.0, 0.0, 0.0, None, None])
        recompute = sum(sec(c.t0, c.t1) for c in self.calls
                        if c.phase == RECOMPUTE and c.t1 is not None and c.top)
        out = {
            "modules": mods,
            "step_s": sec(s0, self.end),
            "fwd_s": root[1],
            "bwd_s": root[2],
            "recompute_s": recompute,
            "optim_s": sec(last, self.end) if last is not None else float("nan"),
            "failed": self.failed,
            "peak_mem_bytes": self.peak_mem,
        }
        self.clock.release(self.tokens)
        self.calls = self.bwds = self.tokens = None
        return out


class ModuleTimer:
    """Hooks on ``modules`` (a list of (path, module)); one instance per attached model."""

    def __init__(self, modules, clock, *, ranges: bool = True, memory=None):
        self.modules = list(modules)
        self.clock = clock
        self.ranges = ranges
        self.memory = memory
        paths = [p for p, _ in self.modules]
        self._ancestors = {p: frozenset(_ancestors(p)) for p in paths}
        self._handles: list = []
        self._step_handles: list = []
        self._on = False
        self._reset_step_state()
        self.first_root_inputs = None  # spec (shapes, dtypes) of the first root call's arguments
        self.internal_errors: list[str] = []

    # ------------------------------------------------------------------ attach / detach
    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def attach(self):
        if self._handles:
            return
        for path, mod in self.modules:
            self._handles.append(mod.register_forward_pre_hook(self._make_pre(path), prepend=True, with_kwargs=True))
            self._handles.append(mod.register_forward_hook(self._make_post(path), always_call=True))
        self._on = True

    def detach(self):
        self._on = False
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._drop_step_handles()

    def _drop_step_handles(self):
        for h in self._step_handles:
            h.remove()
        self._step_handles.clear()

    # ------------------------------------------------------------------ steps
    def _reset_step_state(self):
        self._calls: list[_Call] = []
        self._bwds: list[_Bwd] = []
        self._stack: list[_Call] = []
        self._bstack: list[_Bwd] = []
        self._cb_tasks: set = set()
        self._failed = False
        self._start = None

    @property
    def step_has_calls(self) -> bool:
        """True once any instrumented module was called since ``begin_step``."""
        return bool(self._calls)

    @property
    def root_forward_finished(self) -> bool:
        """True once a forward of the root module has returned in this step."""
        return any(c.path == ROOT and c.t1 is not None for c in self._calls)

    def begin_step(self):
        self._reset_step_state()
        if self.memory is not None:
            self.memory.begin_step()
        self._start = self.clock.now()

    def end_step(self) -> PendingStep:
        end = self.clock.now()
        self._drop_step_handles()
        for b in self._bstack:  # a backward still open at the step's end (should not happen)
            b.b1 = end
        peak = self.memory.end_step() if self.memory is not None else None
        failed = self._failed or any(c.t1 is None for c in self._stack)
        pending = PendingStep(self.clock, self._start, end, self._calls, self._bwds,
                              self.clock.take_step_tokens(), failed, peak)
        self._reset_step_state()
        return pending

    def mark_failed(self):
        self._failed = True

    # ------------------------------------------------------------------ forward hooks
    def _make_pre(self, path):
        def pre_hook(mod, args, kwargs):
            if not self._on or _is_compiling():
                return None
            try:
                self._pre(path, mod, args, kwargs)
            except Exception as exc:  # never break the user's forward
                self._internal_error(exc)
            return None
        return pre_hook

    def _make_post(self, path):
        def post_hook(mod, args, output):
            if not self._on or _is_compiling():
                return None
            t1 = self.clock.now()  # first: the interval ends as early as possible
            try:
                self._post(t1, path, mod, output)
            except Exception as exc:
                self._internal_error(exc)
            return None
        return post_hook

    def _pre(self, path, mod, args, kwargs):
        in_bw = _graph_task_id() != -1
        call = _Call(path, RECOMPUTE if in_bw else FWD, id(mod))
        if self.first_root_inputs is None and path == ROOT and not in_bw:
            self.first_root_inputs = {"args": describe(list(args)), "kwargs": describe(dict(kwargs))}
        if torch.is_grad_enabled():
            if not kwargs and len(args) == 1 and type(args[0]) is _Tensor:  # the common case, fast
                tensors = [args[0]] if args[0].requires_grad else ()
            else:
                tensors = _grad_tensors(kwargs, _grad_tensors(args, []))
            if len(tensors) == 1:
                self._step_handles.append(tensors[0].register_hook(self._make_end1(call)))
            elif tensors:
                self._step_handles.append(register_multi_grad_hook(tensors, self._make_end(call), mode="all"))
        if self.memory is not None and not in_bw:
            call.mem = self.memory.enter()
        if self.ranges and _profiler._is_profiler_enabled:
            call.rf = _profiler.record_function(f"perfcheck/{call.phase}/{path}")
            call.rf.__enter__()
        self._stack.append(call)
        self._calls.append(call)
        call.t0 = self.clock.now()  # last: the interval starts as late as possible

    def _post(self, t1, path, mod, output):
        stack = self._stack
        mid = id(mod)
        if stack and stack[-1].mid == mid:
            call = stack.pop()
        else:
            idx = next((i for i in range(len(stack) - 1, -1, -1) if stack[i].mid == mid), None)
            if idx is None:
                return
            call = stack[idx]
            del stack[idx:]
        call.t1 = t1
        if call.rf is not None:
            call.rf.__exit__(None, None, None)
            call.rf = None
        if call.phase == FWD and output is None and sys.exc_info()[0] is not None:
            self._failed = True  # forward raised: this step is incomplete. (Recompute may raise
            # on purpose: non-reentrant checkpointing stops early once it has what it needs.)
        if call.mem is not None:
            call.act, call.peak = self.memory.exit(call.mem)
        if call.phase == RECOMPUTE and not any(c.phase == RECOMPUTE for c in stack):
            call.top = True  # top-level recompute: subtract it from the open backward intervals
            for b in self._bstack:
                b.rc.append(call)
        if torch.is_grad_enabled():
            if type(output) is _Tensor:
                outs = (output,) if output.requires_grad else ()
            else:
                outs = _grad_tensors(output, [])
            if outs:
                start = self._make_start(call)
                for t in outs:
                    self._step_handles.append(t.register_hook(start))

    # ------------------------------------------------------------------ backward hooks
    def _make_start(self, call):
        def on_output_grad(grad):
            if self._on:
                try:
                    self._bwd_start(call)
                except Exception as exc:
                    self._internal_error(exc)
        return on_output_grad

    def _make_end1(self, call):
        def on_input_grad(grad):
            if self._on:
                try:
                    self._bwd_end(call)
                except Exception as exc:
                    self._internal_error(exc)
        return on_input_grad

    def _make_end(self, call):
        def on_input_grads(grads):
            if self._on:
                try:
                    self._bwd_end(call)
                except Exception as exc:
                    self._internal_error(exc)
        return on_input_grads

    def _bwd_start(self, call):
        task = _graph_task_id()
        if call.bwd_task == task or call.ended_task == task:
            return  # already started (another output), or inputs done first (module returned its input)
        call.bwd_task = task
        if task not in self._cb_tasks:
            self._cb_tasks.add(task)
            torch.autograd.Variable._execution_engine.queue_callback(lambda: self._task_end(task))
        now = self.clock.now()
        path, bstack, ancestors = call.path, self._bstack, self._ancestors
        # Descendants already open on top of the stack: a module returning its child's output
        # shares that tensor, whose hooks fire child first. This call encloses them, so it
        # starts where the outermost of them started.
        k = len(bstack)
        while k and path in ancestors[bstack[k - 1].path]:
            k -= 1
        if k and bstack[k - 1].path not in ancestors[path]:
            # below them sits another call of this module (or unrelated work): rule (b)
            while bstack and bstack[-1].path not in ancestors[path]:
                self._close(bstack.pop(), now)
            k = len(bstack)
        b = _Bwd(path, call, task, bstack[k].b0 if k < len(bstack) else now)
        bstack.insert(k, b)
        self._bwds.append(b)
        self._marker(path, "begin")

    def _bwd_end(self, call):
        task = _graph_task_id()
        bstack = self._bstack
        idx = next((i for i in range(len(bstack) - 1, -1, -1) if bstack[i].call is call), None)
        if idx is None:
            if call.bwd_task != task:
                call.ended_task = task
            return
        now = self.clock.now()
        while len(bstack) > idx:  # rule (c): descendants close with it
            self._close(bstack.pop(), now)

    def _task_end(self, task):
        if not self._on:
            return
        self._cb_tasks.discard(task)
        bstack = self._bstack
        if bstack and bstack[-1].task == task:
            now = self.clock.now()
            while bstack and bstack[-1].task == task:  # rule (d)
                self._close(bstack.pop(), now)

    def _close(self, b, now):
        b.b1 = now
        self._marker(b.path, "end")

    def _marker(self, path, what):
        if self.ranges and _profiler._is_profiler_enabled:
            marker = _profiler.record_function(f"perfcheck/bwd/{path}/{what}")
            marker.__enter__()  # zero-length range: a visible, properly nested marker in the trace
            marker.__exit__(None, None, None)

    def _internal_error(self, exc):
        self._failed = True
        if len(self.internal_errors) < 10:
            self.internal_errors.append(f"{type(exc).__name__}: {exc}")


def _ancestors(path: str):
    if path == ROOT:
        return []
    parts = path.split(".")
    return [ROOT] + [".".join(parts[:i]) for i in range(1, len(parts))]


"""Per-module forward, backward and recompute time, at a few microseconds of host time per module call.

How each interval is taken (nothing here changes inputs, outputs or grads)
-------------------------------------------------------------------------
* Forward / recompute: from just before the module's ``forward`` runs to just after it returns (or
  raises). Two ways in, chosen per module at ``attach()``:

  - a ``_TimedForward`` instance attribute that takes the readings: ``module._compiled_call_impl``
    (torch's ``Module.__call__`` calls it instead of ``_call_impl``; it makes ``_call_impl``'s own
    no-hook test and calls ``forward``, so a timed call costs less than ``_call_impl``'s frame it
    replaces), or, for classes with their own ``__call__``/``_call_impl``, ``module.forward``
    (~1 us per call; a forward pre-hook + forward hook pair costs ~12 us: bench/RESULTS.md). Used
    for modules with no hooks of their own and no global module hooks. The attribute is removed at
    ``detach()``; a ``deepcopy``/pickle of the module made meanwhile runs its own plain forward
    (never one that would run the original module), and ``inspect.signature`` sees the real
    signature.
  - the lean path of either (a forward call with one tensor argument, the common case) only
    appends two tuples to a flat log per call; the per-call records are built from it when the
    outermost call returns (``ModuleTimer._materialize``), in one loop.
  - forward hooks: a pre-hook with ``prepend=True`` (it runs before the module's other pre-hooks,
    so their work, e.g. DeepSpeed ZeRO-3's parameter gather or FSDP2's all-gather, is inside the
    interval) and a forward hook with ``always_call=True`` (last; also when forward raises). Used
    for modules that have hooks of their own (ZeRO-3, FSDP2, user hooks), when global module hooks
    exist, for ScriptModules and for torch.compile'd modules.
  - a module compiled in place by ``nn.Module.compile()`` (its ``_compiled_call_impl`` set before
    attach: hooks and ``forward`` run inside the compiled region, untimed) is timed as a whole by a
    ``_TimedForward`` in that slot around the compiled call; its submodules get no rows. One compiled
    while attached runs untimed from then on, and ``stop()`` names it in a warning.

  A call made while autograd runs a backward (``torch._C._current_graph_task_id() != -1``) is
  activation-checkpoint recompute and is reported as ``recompute``, not forward.
* Backward start: the first gradient w.r.t. any output of the call is ready: a pre-hook on the
  autograd node that produced the output (autograd runs it just before the node; put on through
  torch's tensor-hook route, ``_hook_carrier``, else ``grad_fn.register_prehook``). One
  hook per node serves every call that needs that node (a module's output
  is usually the next module's input and its parent's output), so a chain of N modules registers
  about N hooks. No ``register_full_backward_hook``: it wraps inputs/outputs in a custom Function
  and raises on in-place ops such as ``nn.ReLU(inplace=True)``. A node hook is taken on the node
  the tensor had when the hook was registered, so an in-place op that runs later (a new grad_fn
  for the same tensor) does not move it: it sees the gradient of the value it was registered on.
  A leaf tensor that requires grad (no grad_fn) gets a tensor hook, removed at the step's end.
* Backward end: the earliest of
  (a) every needed input gradient is ready (node pre-hooks on the inputs' grad_fn: all of the
      distinct nodes have run in this backward);
  (b) the backward of a module outside this call's subtree starts, including another call of the
      same module. Autograd runs ready nodes in reverse creation order, so once it starts on work
      created before this call, this call's nodes are done;
  (c) an enclosing module's backward ends;
  (d) the end of the backward pass (``Variable._execution_engine.queue_callback``).
  (b)-(d) are what closes a module with no grad-requiring input (a first layer: its backward is
  only weight-gradient work, ending when autograd moves on to earlier work or the pass ends), a
  module whose input also feeds later modules (q/k/v projections of one ``x``: (a) alone would
  wait for all three), and an input whose gradient this backward does not compute. Open backward
  intervals therefore always form one root-to-leaf chain.
* Backward time excludes recompute that ran inside the interval (non-reentrant checkpointing
  recomputes when the first saved tensor is unpacked, inside the module's backward).
* Hooks outlive their step only as inert objects: each carries the step's generation number and
  does nothing once the step has ended (a graph kept with ``retain_graph`` and run again later).
* Clocks: CPU ``time.perf_counter_ns``; CUDA events taken from a pool and recorded on the
  current stream, resolved only after the step's end event has completed (``query()``), so
  the hot path never synchronizes the device.
"""
from __future__ import annotations

import copy
import functools
import sys
import types

import torch
from torch.nn.modules import module as _module_globals

from perfcheck.measure.clocks import CpuClock, CudaClock  # noqa: F401 (re-exported for callers)
from perfcheck.measure.context import autocast_dtype, describe
from perfcheck.model_paths import compiled_call
from perfcheck.schema import ROOT

FWD, BWD, RECOMPUTE = "fwd", "bwd", "recompute"
#: A forward call made with grad disabled (``torch.no_grad()``/``inference_mode()``) outside any
#: training forward: a validation batch, an EMA/teacher call. Reported apart (eval_s), never as
#: forward, unless the step has no grad-enabled forward at all (inference: then it is the forward).
EVAL = "eval"
_graph_task_id = torch._C._current_graph_task_id
_grad_enabled = torch.is_grad_enabled
_profiler = torch.autograd.profiler
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
# ``torch.compiler.is_compiling()`` is ``_is_compiling_flag`` (export/AOT tracing) behind a
# ``torch.jit.is_scripting()`` call: two Python frames per module call. The lean path asks the same
# question in one trivial frame: ``is_dynamo_compiling()`` (False in eager; dynamo folds it to True
# while it traces, as it does ``is_compiling()``) or the flag itself.
if hasattr(torch.compiler, "is_dynamo_compiling") and hasattr(torch.compiler, "_is_compiling_flag"):
    _dynamo_compiling, _compiler = torch.compiler.is_dynamo_compiling, torch.compiler
else:  # another torch: the public function, and a flag that is never set
    _dynamo_compiling, _compiler = _is_compiling, types.SimpleNamespace(_is_compiling_flag=False)
#: True while the current CUDA stream is being captured into a CUDA graph (events cannot time it).
_cuda_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)
_MISSING = object()
_tracing_state = torch._C._get_tracing_state
_Module = torch.nn.Module
# The direct route (see _TimedForward): torch's Module.__call__ calls an instance's
# ``_compiled_call_impl`` when it is set (what ``Module.compile()`` uses), else ``_call_impl``.
_DIRECT_ROUTE = (getattr(_Module, "_wrapped_call_impl", None) is _Module.__call__
                 and getattr(_Module, "_compiled_call_impl", _MISSING) is None)
# Backward actions a node hook carries, in the order they were noted (the order in which tensor
# hooks on one tensor would fire).
_START, _END, _END_ALL = 0, 1, 2
# Backward events, logged by the hooks and replayed into intervals: a node ran, a backward pass
# ended, a top-level recompute call returned.
_FIRE, _TASK_END, _RC = 0, 1, 2


# ------------------------------------------------------------------------------ records
# The two records made once per module call have no ``__init__``: a class call that runs an
# ``__init__`` costs ~570 ns on the benchmark VM, one without ~150 ns plus ~15 ns per field set
# (bench/RESULTS.md). Each is made in one place (``_new_call``, ``_replay``).
class _Call:
    """One forward (or recompute) call of a module. Set per call: ``path, phase, mid, t0, t1,
    bwd_task, ended_task``; the rest are class-level defaults until a call needs them (a memory
    reading, a profiler range, ``top``: an outermost eval call, or a recompute call not nested in
    another recompute call)."""

    __slots__ = ("path", "phase", "mid", "t0", "t1", "bwd_task", "ended_task", "__dict__")
    mem = act = peak = rf = None
    top = False


def _new_call(path, phase, mid, t0=None) -> _Call:
    call = _Call()
    call.path, call.phase, call.mid, call.t0 = path, phase, mid, t0
    call.t1 = call.bwd_task = call.ended_task = None
    return call


class _Bwd:
    """One backward interval of one call (``anc``: the module's ancestor paths; ``rc``: the
    top-level recompute calls inside the interval, or None). Made in ``_replay`` only."""

    __slots__ = ("path", "anc", "call", "task", "b0", "b1", "rc")


class _EndAll:
    """Rule (a) for a call with several grad-requiring inputs on ``n`` distinct nodes."""

    __slots__ = ("call", "n", "task", "left")

    def __init__(self, call, n):
        self.call, self.n, self.task, self.left = call, n, None, n


def _grad_tensors(obj, out: list):
    """Tensors requiring grad inside args/kwargs/outputs (tensors, lists, tuples, dicts, dataclass
    instances: a module returning a plain dataclass of tensors gets its backward timed, not 0)."""
    if isinstance(obj, torch.Tensor):
        if obj.requires_grad:
            out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _grad_tensors(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _grad_tensors(x, out)
    elif hasattr(type(obj), "__dataclass_fields__"):
        for name in type(obj).__dataclass_fields__:
            _grad_tensors(getattr(obj, name, None), out)
    return out


class PendingStep:
    """A finished step whose tokens may still be in flight on the device.

    ``finals``: ``[t_a, t_b, range]`` per end-of-backward callback interval (``bwd_finalize_s``)."""

    def __init__(self, clock, start, end, calls, bwds, tokens, failed, peak_mem, finals=()):
        self.clock, self.start, self.end = clock, start, end
        self.calls, self.bwds, self.tokens = calls, bwds, tokens
        self.failed, self.peak_mem, self.finals = failed, peak_mem, finals

    def ready(self) -> bool:
        return self.clock.ready(self.end)

    def resolve(self) -> dict:
        """Seconds per module and phase. Returns {'modules': {path: [calls, fwd, bwd, rc, act, peak]},
        'eval_modules': {path: [eval calls, eval seconds]}, 'micro_batches': root forward calls, ...}."""
        # Plain loops, no comprehensions or generators: this runs once per step with cold caches,
        # where each extra frame costs microseconds (bench/RESULTS.md).
        clock = self.clock
        if not clock.ready(self.end):
            self.end.synchronize()  # only reached at stop() or when the CPU runs far ahead
        sec = clock.seconds
        ns = getattr(clock, "NS", None)  # host clock: integer nanoseconds, an interval is (end - start) * NS
        mods: dict[str, list] = {}
        evals: dict[str, list] = {}  # path -> [eval calls, eval seconds]
        top_evals = []  # (call, seconds) of the outermost eval calls
        root_fwd_end = root_bwd_end = None
        recompute = 0.0
        # a step without any grad-enabled forward (inference, a loop under no_grad): its eval calls are the forward
        as_fwd = True
        for c in self.calls:
            if c.phase == FWD:
                as_fwd = False
                break
        for c in self.calls:
            t1 = c.t1
            if t1 is None:
                continue
            dt = (t1 - c.t0) * ns if ns else sec(c.t0, t1)
            phase, path = c.phase, c.path
            if phase == FWD or (phase == EVAL and as_fwd):  # (the common case first)
                row = mods.get(path)
                if row is None:
                    row = mods[path] = [0, 0.0, 0.0, 0.0, None, None]
                row[0] += 1
                row[1] += dt
                if c.act is not None:
                    row[4] = (row[4] or 0) + c.act
                    row[5] = c.peak if row[5] is None else max(row[5], c.peak)
                if path == ROOT:
                    root_fwd_end = t1
            elif phase == EVAL:
                e = evals.get(path)
                if e is None:
                    e = evals[path] = [0, 0.0]
                e[0] += 1
                e[1] += dt
                if c.top:
                    top_evals.append((c, dt))
            else:
                row = mods.get(path)
                if row is None:
                    row = mods[path] = [0, 0.0, 0.0, 0.0, None, None]
                row[3] += dt
                if c.top:
                    recompute += dt
        for b in self.bwds:
            b1 = b.b1
            if b1 is None:
                continue
            dt = (b1 - b.b0) * ns if ns else sec(b.b0, b1)
            if b.rc:
                dt -= sum(sec(r.t0, r.t1) for r in b.rc if r.t1 is not None)
            path = b.path
            row = mods.get(path)
            if row is None:
                row = mods[path] = [0, 0.0, 0.0, 0.0, None, None]
            if dt > 0.0:
                row[2] += dt
            if path == ROOT:
                root_bwd_end = b1
        last = root_bwd_end if root_bwd_end is not None else root_fwd_end
        root = mods.get(ROOT, [0, 0.0, 0.0, 0.0, None, None])
        finalize = 0.0
        for f in self.finals:
            if f[1] is not None:
                finalize += sec(f[0], f[1])
        # eval calls after the last backward (or forward) ran inside the optim_s interval: not optimizer time
        eval_s = eval_after = 0.0
        for c, dt in top_evals:
            eval_s += dt
            if last is not None and sec(last, c.t0) >= 0:
                eval_after += dt
        out = {
            "modules": mods,
            "eval_modules": evals,
            "step_s": sec(self.start, self.end),
            "fwd_s": root[1],
            "bwd_s": root[2],
            "recompute_s": recompute,
            "eval_s": eval_s,
            "micro_batches": root[0],
            "optim_s": sec(last, self.end) - finalize - eval_after if last is not None else float("nan"),
            "bwd_finalize_s": finalize,
            "failed": self.failed,
            "peak_mem_bytes": self.peak_mem,
        }
        clock.release(self.tokens)
        self.calls = self.bwds = self.tokens = None
        return out


def _output_keys(output):
    """The distinct nodes of an output's grad-requiring tensors (a leaf: the tensor itself), in
    order, or None when there are none."""
    seen = []
    for t in _grad_tensors(output, []):
        node = t.grad_fn
        key = t if node is None else node
        if not any(k is key for k in seen):
            seen.append(key)
    return seen or None


def _bound_class_forward(mod):
    """The module's own ``forward`` (what a copy or an unpickled module gets instead of a timed one)."""
    return types.MethodType(type(mod).forward, mod)


def _same(obj):
    return obj


class _TimedForward:
    """Readings around a module's calls, installed as an instance attribute in one of two slots:

    * direct (``direct``, most modules): ``module._compiled_call_impl``, which torch's
      ``Module.__call__`` calls instead of ``Module._call_impl``. When the module and the process
      have no module hooks and no TorchScript tracing runs (``_call_impl``'s own fast-path test,
      made here on every call, so hooks added later still run), it calls ``module.forward``
      itself: the timer takes the place of ``_call_impl``'s frame instead of adding one (a chain
      of 101 ``Linear(8, 8)``, the wrapper alone: -0.3 to -0.5 us per call against no wrapper at
      all, where a wrapper as ``forward`` costs +1.05 to +1.2 us; bench/RESULTS.md). Otherwise it calls ``_call_impl`` (hooks inside the
      interval). ``module.forward`` is untouched; ``Module.__getstate__`` leaves the slot out of
      copies and pickles. Used when the class keeps torch's ``__call__`` and ``_call_impl`` and the
      module is not compiled (``_compiled_call_impl`` unset).
    * ``module.forward``: a call of the original forward (classes with their own ``__call__`` or
      ``_call_impl``). ``deepcopy``/pickle give a copy the plain bound forward; ``inspect.signature``
      sees the real one (``__wrapped__``).

    Inert (a plain call of what it replaced) once ``live`` is False, so a wrapper someone else put on
    top of it (and restores later) never reaches a detached timer.
    """

    #: model_paths.compiled_call tells this from a user's compiled call in the same slot
    perfcheck_timer = True

    def __init__(self, timer, path, mod, inner, prev, direct=False, slot=None):
        # name, doc, __wrapped__ (inspect.signature sees the real one); not inner's __dict__, which
        # for an earlier _TimedForward would bring its timer and state along
        functools.update_wrapper(self, inner, updated=())
        self.timer, self.path, self.mod, self.inner, self.prev = timer, path, mod, inner, prev
        self.direct = direct
        # (slot given: a module compiled by ``Module.compile()``, timed as a whole around its compiled call)
        self.slot = slot or ("_compiled_call_impl" if direct else "forward")
        self.mid = id(mod)
        self.live = True
        # live, and the timer's lean path applies (ModuleTimer._set_lean): one test instead of two
        self.lean = False

    def __call__(self, x=_MISSING, /, *args, **kwargs):
        # (x apart: the common call's one tensor is tested without len() or indexing)
        timer = self.timer
        # The common call (a live wrapper, a forward, one tensor argument, no memory readings, no
        # profiler ranges, no CUDA graph capture) only appends two tuples to the step's flat log: one
        # when the call starts, one when it returns. The per-call records (nesting, phase, the
        # (node, action) notes) are built from the log when the outermost call returns, in one loop
        # (``_materialize``): each bytecode here runs between the model's own ops, where it costs
        # several times what it costs in a loop (bench/RESULTS.md). Every test here is paid on every
        # module call.
        # (the compile test first: while dynamo traces this, nothing after it is looked at)
        mod = self.mod
        if (self.lean and not (_dynamo_compiling() or _compiler._is_compiling_flag) and type(x) is _Tensor
                and not args and not kwargs and _graph_task_id() == -1
                and not (self.direct and (mod._forward_pre_hooks or mod._forward_hooks or mod._backward_pre_hooks
                                          or mod._backward_hooks or _module_globals._global_forward_pre_hooks
                                          or _module_globals._global_forward_hooks
                                          or _module_globals._global_backward_pre_hooks
                                          or _module_globals._global_backward_hooks or _tracing_state()))
                and not (timer._watch and ((timer.ranges and _profiler._is_profiler_enabled)
                                           or (timer._check_capture and timer._capturing())))):
            log = timer._flog
            mgen = timer._mgen
            grad = _grad_enabled()
            if grad:
                node = x.grad_fn  # the node as it is now: an in-place op on x later does not move it
                if node is None and x.requires_grad:
                    node = x  # a leaf
                ent = (self, grad, node, timer._now())  # the clock last: the interval starts as late as possible
            else:
                ent = (self, grad, None, timer._now())
            log.append(ent)
            try:
                out = mod.forward(x) if self.direct else self.inner(x)
            except BaseException:
                timer._raised(timer._now(), self.mid)
                raise
            t1 = timer._now()  # first: the interval ends as early as possible
            try:
                if timer._mgen != mgen:
                    # the log was turned into records meanwhile (a call on the general path inside this
                    # one, or a reader): this call is a record on the stack now
                    timer._materialize()
                    call = timer._open_call(self.mid)
                    if call is not None:
                        timer._finish(t1, call, out, False)
                    return out
                if not grad:
                    log.append((t1, None))
                elif type(out) is _Tensor:
                    node = out.grad_fn
                    if node is None and out.requires_grad:
                        node = out  # a leaf (the module returned its leaf input)
                    log.append((t1, node))
                else:
                    log.append((t1, _output_keys(out)))
                if log[0] is ent and not timer._stack:  # the outermost call returned
                    timer._flush_log()
            except Exception as exc:
                timer._internal_error(exc)
            return out
        if x is not _MISSING:
            args = (x, *args)
        if not (self.live and timer._on) or _is_compiling() or (timer._check_capture and timer._capturing()):
            return self.inner(*args, **kwargs)
        try:
            call = timer._pre(self.path, self.mid, args, kwargs)
        except Exception as exc:  # never break the user's forward
            timer._internal_error(exc)
            return self.inner(*args, **kwargs)
        try:
            out = self.inner(*args, **kwargs)
        except BaseException:
            t1 = timer._now()
            try:
                timer._finish(t1, call, None, True)
            except Exception as exc:
                timer._internal_error(exc)
            raise
        t1 = timer._now()  # first: the interval ends as early as possible
        try:
            timer._finish(t1, call, out, False)
        except Exception as exc:
            timer._internal_error(exc)
        return out

    def __deepcopy__(self, memo):
        # copy.deepcopy(model) while attached: the copy runs its own forward, untimed. (The direct
        # slot never reaches here through nn.Module, whose __getstate__ leaves it out; a copy made
        # some other way gets torch's default, no compiled call.)
        if self.slot == "_compiled_call_impl":
            return None
        new = memo.get(id(self.mod))
        if new is None:
            return self
        return _bound_class_forward(new) if self.prev is _MISSING else copy.deepcopy(self.prev, memo)

    def __reduce__(self):
        if self.slot == "_compiled_call_impl":
            return (_same, (None,))
        return (_bound_class_forward, (self.mod,)) if self.prev is _MISSING else (_same, (self.prev,))


def _has_own_hooks(mod) -> bool:
    return bool(mod._forward_pre_hooks or mod._forward_hooks or mod._backward_hooks or mod._backward_pre_hooks)


def _global_module_hooks() -> bool:
    return bool(_module_globals._global_forward_pre_hooks or _module_globals._global_forward_hooks
                or _module_globals._global_backward_pre_hooks or _module_globals._global_backward_hooks)


def _direct(mod) -> bool:
    """Whether ``mod`` is timed through ``_compiled_call_impl`` (see ``_TimedForward``)."""
    cls = type(mod)
    return (_DIRECT_ROUTE and cls.__call__ is _Module.__call__ and cls._call_impl is _Module._call_impl
            and mod.__dict__.get("_compiled_call_impl") is None)


def _wrappable(mod) -> bool:
    """A module whose ``forward`` can be timed by an instance attribute (see the module docstring)."""
    return not (isinstance(mod, torch.jit.ScriptModule) or hasattr(mod, "_orig_mod") or _has_own_hooks(mod))


class ModuleTimer:
    """Times the calls of ``modules`` (a list of (path, module)); one instance per attached model."""

    def __init__(self, modules, clock, *, ranges: bool = True, memory=None):
        self.modules = list(modules)
        self.clock = clock
        self._now = clock.now
        self.ranges = ranges
        self.memory = memory
        paths = [p for p, _ in self.modules]
        self._ancestors = {p: frozenset(_ancestors(p)) for p in paths}
        self._handles: list = []  # forward hooks (modules that are not wrapped)
        self._wrapped: list = []  # (module, _TimedForward) currently installed
        self._fwd_cache: dict = {}  # id(module) -> _TimedForward removed cleanly at detach, reused at attach
        self._leaf_handles: list = []  # tensor hooks on leaves, removed at the step's end
        self._hooked: list = []  # the actions lists of this step's node hooks, emptied when it ends
        self._on = False
        self._attached = False
        self._gen = 0  # step generation: backward hooks of an ended step do nothing
        self._reset_step_state()
        self.first_root_inputs = None  # spec (shapes, dtypes) of the first root call's arguments
        self.internal_errors: list[str] = []
        # CUDA graph capture: module calls inside a capture are not timed (an event recorded into a
        # graph is no timestamp); a replay is timed by the hooks of the module that calls it.
        self._check_capture = getattr(clock, "kind", "cpu") == "cuda" and torch.cuda.is_available()
        self.saw_capture = False
        # _TimedForward's lean path applies (no per-call memory reading, root inputs already recorded)
        self._lean = False
        # the lean path has to look at the profiler (ranges) or at CUDA graph capture on each call
        # (inline there, behind this one flag: PerfCheck's default profile=True makes it True)
        self._watch = ranges or self._check_capture
        self._inputs_eval = False  # first_root_inputs came from an eval (grad-disabled) call
        # paths of modules compiled (``Module.compile()``) while attached: their later calls ran
        # untimed (the compiled call replaced ours, or runs our forward inside the compiled region)
        self.compiled_while_attached: list[str] = []

    # ------------------------------------------------------------------ attach / detach
    @property
    def attached(self) -> bool:
        return self._attached

    @property
    def wrapped_count(self) -> int:
        """Modules timed through an instance ``forward`` (the others through forward hooks)."""
        return len(self._wrapped)

    def attach(self):
        if self._attached:
            return
        use_wrappers = not _global_module_hooks()
        for path, mod in self.modules:
            # compiled by nn.Module.compile(): its hooks and forward run inside the compiled region, where
            # nothing is timed, so it is timed as a whole around that call (_TimedForward in the same slot,
            # calling the compiled one); its submodules are not timed (context.model_view)
            compiled = _DIRECT_ROUTE and compiled_call(mod)
            if compiled or (use_wrappers and _wrappable(mod)):
                direct = not compiled and _direct(mod)
                slot = "_compiled_call_impl" if compiled or direct else "forward"
                prev = mod.__dict__.get(slot, _MISSING)
                fwd = self._fwd_cache.pop(id(mod), None)
                if fwd is None or fwd.mod is not mod or fwd.prev is not prev or fwd.direct != direct or fwd.slot != slot:
                    inner = prev if compiled else mod._call_impl if direct else mod.forward
                    fwd = _TimedForward(self, path, mod, inner, prev, direct, slot)
                fwd.live = True
                fwd.lean = self._lean
                mod.__dict__[fwd.slot] = fwd
                self._wrapped.append((mod, fwd))
            else:
                self._handles.append(mod.register_forward_pre_hook(self._make_pre(path, mod), prepend=True,
                                                                   with_kwargs=True))
                self._handles.append(mod.register_forward_hook(self._make_post(path, mod), always_call=True))
        self._attached = True
        self._on = True

    def detach(self):
        self._on = False
        self._attached = False
        for mod, fwd in self._wrapped:
            fwd.live = fwd.lean = False
            cc = mod.__dict__.get("_compiled_call_impl")
            if cc is not fwd and (fwd.slot == "_compiled_call_impl" or compiled_call(mod)):
                if fwd.path not in self.compiled_while_attached:
                    self.compiled_while_attached.append(fwd.path)
            if mod.__dict__.get(fwd.slot) is fwd:
                if fwd.prev is _MISSING:
                    del mod.__dict__[fwd.slot]
                else:
                    mod.__dict__[fwd.slot] = fwd.prev
                self._fwd_cache[id(mod)] = fwd
            # else: someone wrapped forward over ours meanwhile (or compiled the module); ours stays
            # inside theirs, inert for good
        self._wrapped.clear()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._next_generation()
        self._drop_leaf_handles()

    def _next_generation(self):
        """The hooks put on so far go inert: their actions lists are emptied (a node hook outlives
        its step on a graph kept with ``retain_graph``), and the end-of-backward callbacks they
        queued carry the old generation."""
        self._gen += 1
        log = self._log
        if log:  # (events not replayed yet keep their actions)
            for i, event in enumerate(log):
                if event[0] == _FIRE:
                    log[i] = (_FIRE, event[1], event[2], list(event[3]))
        for actions in self._hooked:
            actions.clear()
        self._hooked.clear()

    def _drop_leaf_handles(self):
        for h in self._leaf_handles:
            h.remove()
        self._leaf_handles.clear()

    # ------------------------------------------------------------------ steps
    def _reset_step_state(self):
        self._calls: list[_Call] = []
        self._bwds: list[_Bwd] = []
        self._stack: list[_Call] = []
        self._bstack: list[_Bwd] = []
        self._pending: list = []  # (node or leaf tensor, action kind, call or _EndAll) noted in forward
        # the lean path's flat log (_TimedForward.__call__): (wrapper, grad enabled, input key, t0) when a
        # call starts, (t1, output key(s)) when it returns; the same list for the timer's life, emptied
        # by _materialize. _mgen counts the times it was emptied: a lean call whose start is no longer
        # in the log finishes through the general path.
        if not hasattr(self, "_flog"):
            self._flog: list = []
            self._mgen = 0
        self._flog.clear()
        self._mgen += 1
        # backward events not yet replayed, and the backward passes whose end callback is queued:
        # the same objects for the timer's life (the hooks hold them), emptied here
        if not hasattr(self, "_log"):
            self._log: list = []
            self._cb_tasks: set = set()
        self._log.clear()
        self._cb_tasks.clear()
        self._failed = False
        self._start = None
        self._finals: list = []  # [t_a, t_b, profiler range]: frameworks' end-of-backward callbacks (_after_backward)

    @property
    def step_has_calls(self) -> bool:
        """True once any instrumented module was called since ``begin_step``."""
        return bool(self._calls) or bool(self._flog)

    @property
    def root_forward_finished(self) -> bool:
        """True once a forward of the root module has returned in this step."""
        self._materialize()
        return any(c.path == ROOT and c.t1 is not None for c in self._calls)

    def begin_step(self):
        self._next_generation()
        self._reset_step_state()
        if self.memory is not None:
            self.memory.begin_step()
        self._start = self.clock.now()

    def end_step(self) -> PendingStep:
        end = self.clock.now()
        self._drop_leaf_handles()
        try:
            self._materialize()  # (a forward still in flight: its calls are open records)
            self._replay()
        except Exception as exc:
            self._internal_error(exc)
        self._next_generation()  # this step's backward hooks go inert
        for b in self._bstack:  # a backward still open at the step's end (should not happen)
            b.b1 = end
        peak = self.memory.end_step() if self.memory is not None else None
        # a backward pass whose end-of-backward callback never ran raised inside backward
        failed = self._failed or bool(self._cb_tasks) or bool(self._stack and any(c.t1 is None for c in self._stack))
        for f in self._finals:  # a callback after an exception in backward: close at the step's end
            if f[1] is None:
                f[1] = end
                self._close_final_range(f)
        pending = PendingStep(self.clock, self._start, end, self._calls, self._bwds,
                              self.clock.take_step_tokens(), failed, peak, self._finals)
        self._reset_step_state()
        return pending

    def _set_lean(self, lean: bool):
        """Whether calls of wrapped modules may take the lean path (no per-call memory reading, the
        root's inputs recorded); copied into each live wrapper's ``lean``."""
        self._lean = lean
        for _, fwd in self._wrapped:
            fwd.lean = lean and fwd.live

    def mark_failed(self):
        self._failed = True

    def _capturing(self) -> bool:
        if _cuda_capturing():
            self.saw_capture = True
            return True
        return False

    # ------------------------------------------------------------------ forward hooks (hook path)
    def _make_pre(self, path, module):
        def pre_hook(mod, args, kwargs):
            if mod is not module or not self._on or _is_compiling() or (self._check_capture and self._capturing()):
                return None  # (mod is not module: a deepcopy of the module carries this hook along)
            try:
                self._pre(path, id(mod), args, kwargs)
            except Exception as exc:  # never break the user's forward
                self._internal_error(exc)
            return None
        return pre_hook

    def _make_post(self, path, module):
        def post_hook(mod, args, output):
            if mod is not module or not self._on or _is_compiling() or (self._check_capture and self._capturing()):
                return None
            t1 = self._now()  # first: the interval ends as early as possible
            try:
                self._materialize()
                stack, mid = self._stack, id(mod)
                call = next((stack[i] for i in range(len(stack) - 1, -1, -1) if stack[i].mid == mid), None)
                if call is not None:
                    self._finish(t1, call, output, output is None and sys.exc_info()[0] is not None)
            except Exception as exc:
                self._internal_error(exc)
            return None
        return post_hook

    # ------------------------------------------------------------------ forward bookkeeping
    def _pre(self, path, mid, args, kwargs) -> _Call:
        self._materialize()  # calls of the lean path still open enclose this one
        in_bw = _graph_task_id() != -1
        stack = self._stack
        # recompute inside a backward; else the enclosing call's phase; else eval when grad is disabled
        phase = RECOMPUTE if in_bw else stack[-1].phase if stack else FWD if _grad_enabled() else EVAL
        call = _new_call(path, phase, mid)
        if phase == EVAL and not stack:
            call.top = True  # an outermost eval call: the step's eval_s
        if path == ROOT and (self.first_root_inputs is None or (self._inputs_eval and phase == FWD)) and not in_bw:
            amp = autocast_dtype()  # the compute dtype under torch.autocast (meta.json "dtype")
            self.first_root_inputs = {"args": describe(list(args)), "kwargs": describe(dict(kwargs)),
                                      **({"autocast": amp} if amp else {})}
            # a training forward's inputs replace an eval call's (a validation batch may differ in
            # shape); the lean path, which skips this, only once they are a training forward's
            self._inputs_eval = phase == EVAL
            self._set_lean(self.memory is None and phase == FWD)
        if _grad_enabled():
            if not kwargs and len(args) == 1 and type(args[0]) is _Tensor:  # the common case, fast
                if args[0].requires_grad:
                    node = args[0].grad_fn
                    self._pending.append((args[0] if node is None else node, _END, call))
            else:
                self._note_inputs(_grad_tensors(kwargs, _grad_tensors(args, [])), call)
        if self.memory is not None and not in_bw:
            call.mem = self.memory.enter()
        if self.ranges and _profiler._is_profiler_enabled:
            call.rf = _profiler.record_function(f"perfcheck/{call.phase}/{path}")
            call.rf.__enter__()
        self._stack.append(call)
        self._calls.append(call)
        call.t0 = self._now()  # last: the interval starts as late as possible
        return call

    def _finish(self, t1, call, output, raised: bool):
        self._materialize()  # calls of the lean path inside this one
        stack = self._stack
        if stack and stack[-1] is call:
            stack.pop()
        else:
            idx = next((i for i in range(len(stack) - 1, -1, -1) if stack[i] is call), None)
            if idx is None:
                return
            del stack[idx:]  # calls above it never returned (an exception skipped their hooks)
        call.t1 = t1
        if call.rf is not None:
            call.rf.__exit__(None, None, None)
            call.rf = None
        if raised and call.phase == FWD:
            self._failed = True  # forward raised: this step is incomplete. (Recompute may raise
            # on purpose: non-reentrant checkpointing stops early once it has what it needs.)
        if call.mem is not None:
            call.act, call.peak = self.memory.exit(call.mem)
        if call.phase == RECOMPUTE and not any(c.phase == RECOMPUTE for c in stack):
            call.top = True  # top-level recompute: subtracted from the backward intervals open now
            self._log.append((_RC, None, None, call))
        if not raised and _grad_enabled():
            if type(output) is _Tensor:
                if output.requires_grad:
                    node = output.grad_fn
                    self._pending.append((output if node is None else node, _START, call))
            else:
                self._note_outputs(output, call)
        if not stack:
            self._flush()

    # ------------------------------------------------------------------ the lean path's flat log
    def _materialize(self):
        """Turn the flat log into records: a ``_Call`` per call (phase: the enclosing call's, else
        forward, or eval when grad was disabled), the (node, action) notes in the order the general
        path notes them (an input's when the call starts, an output's when it returns). Calls still
        open go on the stack, on top of the general path's open calls, which enclose them."""
        log = self._flog
        if not log:
            return
        self._mgen += 1
        stack, calls, pending = self._stack, self._calls, self._pending
        for e in log:
            if len(e) == 4:
                fwd, grad, key, t0 = e
                if stack:
                    call = _new_call(fwd.path, stack[-1].phase, fwd.mid, t0)
                elif grad:
                    call = _new_call(fwd.path, FWD, fwd.mid, t0)
                else:
                    call = _new_call(fwd.path, EVAL, fwd.mid, t0)
                    call.top = True  # an outermost eval call: the step's eval_s
                if key is not None:
                    pending.append((key, _END, call))
                stack.append(call)
                calls.append(call)
            elif stack:  # (empty: the step was reset while the call was in flight)
                call = stack.pop()
                call.t1, key = e
                if key is not None:
                    if type(key) is list:
                        for k in key:
                            pending.append((k, _START, call))
                    else:
                        pending.append((key, _START, call))
        log.clear()

    def _flush_log(self):
        """The outermost call returned: its records, then its backward hooks."""
        self._materialize()
        self._flush()

    def _open_call(self, mid):
        """The innermost open call of the module ``mid`` (its calls above it have been finished)."""
        stack = self._stack
        for i in range(len(stack) - 1, -1, -1):
            if stack[i].mid == mid:
                return stack[i]
        return None

    def _raised(self, t1, mid):
        """A lean-path call's forward raised: finish its record as the general path does."""
        try:
            self._materialize()
            call = self._open_call(mid)
            if call is not None:
                self._finish(t1, call, None, True)
        except Exception as exc:
            self._internal_error(exc)

    # ------------------------------------------------------------------ backward hooks
    # The forward only notes (node, action) pairs; the hooks go on when the outermost instrumented
    # call returns, in one loop, one per distinct node (registering inside the forward, between
    # the model's own ops, cost about 3x more host time per hook: bench/RESULTS.md). A hook that
    # fires only logs (event, task, time, actions); the log becomes intervals at the step's end,
    # or at once while the profiler records (so that the markers land in the trace in place).

    def _note_outputs(self, output, call):
        """Backward start of ``call`` on the nodes of its grad-requiring outputs (tuples, dicts...)."""
        keys = _output_keys(output)
        if keys is not None:
            for key in keys:
                self._pending.append((key, _START, call))

    def _note_inputs(self, tensors, call):
        """Rule (a) for ``call``: its inputs' nodes (a leaf input: the tensor itself)."""
        keys = []
        for t in tensors:
            node = t.grad_fn
            key = t if node is None else node
            if not any(k is key for k in keys):
                keys.append(key)
        if len(keys) == 1:
            self._pending.append((keys[0], _END, call))
        elif keys:
            end_all = _EndAll(call, len(keys))
            self._pending.extend((k, _END_ALL, end_all) for k in keys)

    def _flush(self):
        """Put the noted hooks on: one per distinct node (a node pre-hook) or leaf tensor (a tensor
        hook, removed at the step's end), carrying its actions in the order they were noted."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        hook, groups, leaf_handles, bind, hooked = self._node_hook(), {}, self._leaf_handles, types.MethodType, self._hooked
        carrier = _hook_carrier()  # None: the public route
        last_key = last_actions = None
        try:
            for key, kind, obj in pending:  # (pending holds every key: ids are not reused meanwhile)
                if key is last_key:  # a module's input is usually the node its predecessor's output noted last
                    last_actions.append((kind, obj))
                    continue
                actions = groups.get(id(key))
                if actions is None:
                    actions = groups[id(key)] = [(kind, obj)]
                    hooked.append(actions)
                    if isinstance(key, _Tensor):
                        leaf_handles.append(key.register_hook(bind(hook, actions)))
                    elif carrier is not None:  # (inline: one frame fewer per node)
                        carrier._backward_hooks = {0: bind(hook, actions)}
                        key._register_hook_dict(carrier)
                    else:
                        key.register_prehook(bind(hook, actions))
                else:
                    actions.append((kind, obj))
                last_key, last_actions = key, actions
        except Exception as exc:  # never break the user's forward
            self._internal_error(exc)

    def _node_hook(self):
        """The hook body the nodes of this step share, each node's hook a bound method of it with the
        node's actions as ``self`` (``types.MethodType``: cheaper to make and to call than a
        ``functools.partial``; A/B in bench/RESULTS.md)."""
        # Everything the hook touches is bound here: it runs between autograd's own work, where
        # each attribute lookup costs several times what it costs in a loop (bench/RESULTS.md).
        now, append, cb_tasks, timer, gen = self._now, self._log.append, self._cb_tasks, self, self._gen
        task_id, fire = _graph_task_id, _FIRE
        # Inside the profiler window (it opens and closes at step boundaries: the same for the whole
        # step) the log is replayed at once, so that the trace markers land in place.
        replay_now = bool(self.ranges and _profiler._is_profiler_enabled)

        def on_node(actions, _grads):
            if actions:  # emptied when the step ended or the timer detached: inert (a retained graph)
                try:
                    t = now()
                    task = task_id()
                    append((fire, task, t, actions))
                    if task not in cb_tasks:  # rule (d): once per backward pass
                        timer._queue_task_end(task, gen)
                    if replay_now:
                        timer._replay()
                except Exception as exc:  # never break the user's backward
                    timer._internal_error(exc)
        return on_node

    def _queue_task_end(self, task, gen):
        self._cb_tasks.add(task)
        torch.autograd.Variable._execution_engine.queue_callback(lambda: self._task_end(task, gen))

    def _replay(self):
        """Backward intervals from the logged events, in the order they happened. One loop with the
        rules written inline (no method call per action: this runs once per node hook that fired,
        ~100 times a step on the chain, bench/RESULTS.md)."""
        if not self._log:
            return
        log = self._log.copy()
        self._log.clear()
        bstack, bwds, ancestors, close = self._bstack, self._bwds, self._ancestors, self._close_above
        markers = self.ranges and _profiler._is_profiler_enabled  # trace markers, only while the profiler records
        for event, task, now, obj in log:
            if event == _FIRE:
                for kind, call in obj:
                    if kind == _END_ALL:  # rule (a) for several inputs: when the last of their nodes runs
                        if call.task != task:
                            call.task, call.left = task, call.n
                        call.left -= 1
                        if call.left:
                            continue
                        call, kind = call.call, _END
                    if kind == _START:
                        if call.bwd_task == task or call.ended_task == task:
                            continue  # already started (another output), or inputs done first (module returned its input)
                        call.bwd_task = task
                        path = call.path
                        mine = ancestors[path]
                        # Descendants already open on top of the stack: a module returning its child's
                        # output shares that tensor, whose hooks fire child first. This call encloses
                        # them, so it starts where the outermost of them started.
                        k = n = len(bstack)
                        while k and path in bstack[k - 1].anc:
                            k -= 1
                        if k and bstack[k - 1].path not in mine:
                            # below them sits another call of this module (or unrelated work): rule (b)
                            # closes everything above this call's innermost open ancestor
                            while k and bstack[k - 1].path not in mine:
                                k -= 1
                            if markers:
                                close(k, now, markers)
                            else:  # (close inline: the common case on a chain of siblings)
                                while len(bstack) > k:
                                    bstack.pop().b1 = now
                            n = k
                        b = _Bwd()
                        b.path, b.anc, b.call, b.task, b.b1, b.rc = path, mine, call, task, None, None
                        if k == n:
                            b.b0 = now
                            bstack.append(b)
                        else:
                            b.b0 = bstack[k].b0
                            bstack.insert(k, b)
                        bwds.append(b)
                        if markers:
                            self._marker(path, "begin")
                    else:  # _END: rule (a); rule (c): its open descendants close with it
                        k = len(bstack) - 1
                        while k >= 0 and bstack[k].call is not call:
                            k -= 1
                        if k >= 0:
                            if markers:
                                close(k, now, markers)
                            else:
                                while len(bstack) > k:
                                    bstack.pop().b1 = now
                        elif call.bwd_task != task:
                            call.ended_task = task
            elif event == _TASK_END:
                n = len(bstack)
                while n and bstack[n - 1].task == task:  # rule (d)
                    n -= 1
                close(n, now, markers)
            else:  # _RC: a top-level recompute call returned inside the intervals open now
                for b in bstack:
                    if b.rc is None:
                        b.rc = [obj]
                    else:
                        b.rc.append(obj)

    def _close_above(self, n, now, markers=False):
        """End the open backward intervals above the first ``n`` at ``now``."""
        bstack = self._bstack
        while len(bstack) > n:
            b = bstack.pop()
            b.b1 = now
            if markers:
                self._marker(b.path, "end")

    def _task_end(self, task, gen):
        if gen != self._gen:
            return
        self._cb_tasks.discard(task)
        self._log.append((_TASK_END, task, self._now(), None))
        if self.ranges and _profiler._is_profiler_enabled:
            self._replay()
        self._after_backward(gen)

    # ------------------------------------------------------------------ end-of-backward callbacks
    def _after_backward(self, gen):
        """Time the end-of-backward callbacks frameworks queue after ours: DDP's finalize_backward
        (it waits for its gradient all-reduces) and FSDP2's root post-backward callback (it waits for
        its reduce-scatters). Autograd runs final callbacks in queue order, also those queued while
        they run, so a callback queued here runs after every callback queued so far: the interval
        from here to it is their time (``bwd_finalize_s``), otherwise counted in ``optim_s``.
        Inside the profiler window the interval is also a ``perfcheck/wait/bwd_finalize`` range
        (measure/collectives.py reads it as a wait)."""
        final = [None, None, None]
        if self.ranges and _profiler._is_profiler_enabled:
            final[2] = _profiler.record_function("perfcheck/wait/bwd_finalize")
            final[2].__enter__()
        self._finals.append(final)
        final[0] = self._now()

        def done():
            if gen == self._gen and final[1] is None:
                final[1] = self._now()
                self._close_final_range(final)
        torch.autograd.Variable._execution_engine.queue_callback(done)

    @staticmethod
    def _close_final_range(final):
        if final[2] is not None:
            final[2].__exit__(None, None, None)
            final[2] = None

    @staticmethod
    def _marker(path, what):
        marker = _profiler.record_function(f"perfcheck/bwd/{path}/{what}")
        marker.__enter__()  # zero-length range: a visible, properly nested marker in the trace
        marker.__exit__(None, None, None)

    def _internal_error(self, exc):
        self._failed = True
        if len(self.internal_errors) < 10:
            self.internal_errors.append(f"{type(exc).__name__}: {exc}")


_CARRIER = None  # not probed yet; then the carrier tensor, or False (the public route)


def _hook_carrier():
    """The carrier tensor of torch's tensor-hook route for node pre-hooks, or None.

    ``Node.register_prehook`` builds an OrderedDict and a ``RemovableHandle`` in Python for every
    node (~5 us of host time each on the benchmark VM, about a tenth of the timer's cost per module
    call: bench/RESULTS.md). torch's own tensor-hook route (``Tensor.register_hook`` ends in
    ``grad_fn._register_hook_dict(tensor)``, which puts the tensor's ``_backward_hooks`` dict on
    the node as a tensor pre-hook, run just before the node) costs ~1 us: ``_flush`` sets
    ``carrier._backward_hooks = {0: hook}`` and calls ``node._register_hook_dict(carrier)``. The
    carrier is a private 0-element tensor, so no user tensor is touched. The route is checked once
    per process on a two-op graph (the hook must run exactly once, with a gradient, and leave the
    gradients as they were); where it is missing or behaves otherwise (another torch version)
    ``register_prehook`` is used."""
    global _CARRIER
    if _CARRIER is None:
        carrier = _probe_tensor_prehook_route()
        _CARRIER = False if carrier is None else carrier
    return None if _CARRIER is False else _CARRIER  # (no truth test: a 0-element tensor has none)


def _probe_tensor_prehook_route():
    try:
        with torch.inference_mode(False), torch.enable_grad():
            carrier = torch.empty(0)
            x = torch.ones(2, requires_grad=True)
            y = x * 2
            fired = []
            carrier._backward_hooks = {0: lambda grad: fired.append(("hook", grad is not None))}
            y.grad_fn._register_hook_dict(carrier)
            (grad,) = torch.autograd.grad(y.sum() * 3, x)
            if fired != [("hook", True)] or not torch.equal(grad, torch.full((2,), 6.0)):
                return None
        return carrier
    except Exception:  # noqa: BLE001 - any failure: the public route
        return None


def _ancestors(path: str):
    if path == ROOT:
        return []
    parts = path.split(".")
    return [ROOT] + [".".join(parts[:i]) for i in range(1, len(parts))]

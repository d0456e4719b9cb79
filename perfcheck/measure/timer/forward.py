"""Forward (and recompute, eval) intervals: the timed call installed on each module, and the records
it makes.

Two paths, one record format (``records.Call``):

* the general path (``ForwardMixin._pre`` / ``_finish``, also what the forward hooks call): builds
  each call's record as the call starts and returns. It is the reference implementation: the lean
  path must produce the same records (tests/measure/test_timer_paths.py compares them on random
  module trees; ``ModuleTimer(reference=True)`` runs every call through this path).
* the lean path (``TimedForward.__call__``'s first branch: a forward with one tensor argument, no
  memory readings, no profiler ranges, no CUDA graph capture): appends a ``CallStart`` and a
  ``CallEnd`` to a flat log per call; ``_materialize`` turns the log into the same records when the
  outermost call returns, in one loop.
"""
from __future__ import annotations

import copy
import functools
import sys
import types

import torch

import perfcheck.measure.timer.torch_internals as ti
from perfcheck.measure.context import autocast_dtype, describe
from perfcheck.measure.page_faults import TAIL
from perfcheck.measure.timer.records import (END, END_ALL, EVAL, FWD, RC, RECOMPUTE, START, CallEnd, CallStart,
                                             EndAll, new_call, new_entry)
from perfcheck.schema import ROOT

_MISSING = ti.MISSING
_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
# The torch internals the lean path reads inline (one frame fewer per module call; what they are,
# and the versions they were checked on: torch_internals.py).
_graph_task_id, _module_globals, _tracing_state = ti.graph_task_id, ti.module_globals, ti.tracing_state
_dynamo_compiling, _compiler = ti.dynamo_compiling, ti.compiler_flags
_is_compiling, _profiler = ti.is_compiling, ti.profiler


def grad_tensors(obj, out: list):
    """Tensors requiring grad inside args/kwargs/outputs (tensors, lists, tuples, dicts, dataclass
    instances: a module returning a plain dataclass of tensors gets its backward timed, not 0)."""
    if isinstance(obj, torch.Tensor):
        if obj.requires_grad:
            out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            grad_tensors(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            grad_tensors(x, out)
    elif hasattr(type(obj), "__dataclass_fields__"):
        for name in type(obj).__dataclass_fields__:
            grad_tensors(getattr(obj, name, None), out)
    return out


def distinct_keys(tensors) -> list:
    """The distinct autograd keys of ``tensors`` (each one's node; a leaf: the tensor itself), in order."""
    seen = []
    for t in tensors:
        node = t.grad_fn
        key = t if node is None else node
        if not any(k is key for k in seen):
            seen.append(key)
    return seen


def output_keys(output):
    """The distinct nodes of an output's grad-requiring tensors, in order, or None when there are none."""
    return distinct_keys(grad_tensors(output, [])) or None


def _bound_class_forward(mod):
    """The module's own ``forward`` (what a copy or an unpickled module gets instead of a timed one)."""
    return types.MethodType(type(mod).forward, mod)


def _same(obj):
    return obj


class TimedForward:
    """Readings around a module's calls, installed as an instance attribute in one of two slots:

    * direct (``direct``, most modules): ``module._compiled_call_impl`` (torch_internals.DIRECT_ROUTE),
      which torch's ``Module.__call__`` calls instead of ``Module._call_impl``. When the module and
      the process have no module hooks and no TorchScript tracing runs (``_call_impl``'s own
      fast-path test, made here on every call, so hooks added later still run), it calls
      ``module.forward`` itself: the timer takes the place of ``_call_impl``'s frame instead of adding
      one (a chain of 101 ``Linear(8, 8)``, the wrapper alone: -0.3 to -0.5 us per call against no
      wrapper at all, where a wrapper as ``forward`` costs +1.05 to +1.2 us; bench/RESULTS.md).
      Otherwise it calls ``_call_impl`` (hooks inside the interval).
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
        # for an earlier TimedForward would bring its timer and state along
        functools.update_wrapper(self, inner, updated=())
        self.timer, self.path, self.mod, self.inner, self.prev = timer, path, mod, inner, prev
        self.direct = direct
        # (slot given: a module compiled by ``Module.compile()``, timed as a whole around its compiled call)
        self.slot = slot or (ti.DIRECT_SLOT if direct else "forward")
        self.mid = id(mod)
        self.live = True
        # live, and the timer's lean path applies (ModuleTimer._set_lean): one test instead of two
        self.lean = False

    def __call__(self, x=_MISSING, /, *args, **kwargs):
        # (x apart: the common call's one tensor is tested without len() or indexing)
        # The lean path: each bytecode here runs between the model's own ops, where it costs several
        # times what it costs in a loop (bench/RESULTS.md); every test is paid on every module call.
        # (the compile test first: while dynamo traces this, nothing after it is looked at)
        timer, mod = self.timer, self.mod
        if (self.lean and not (_dynamo_compiling() or _compiler._is_compiling_flag) and type(x) is _Tensor
                and not args and not kwargs and _graph_task_id() == -1
                # (torch_internals.has_own_hooks / global_module_hooks / tracing_state, inline)
                and not (self.direct and (mod._forward_pre_hooks or mod._forward_hooks or mod._backward_pre_hooks
                                          or mod._backward_hooks or _module_globals._global_forward_pre_hooks
                                          or _module_globals._global_forward_hooks
                                          or _module_globals._global_backward_pre_hooks
                                          or _module_globals._global_backward_hooks or _tracing_state()))
                and not (timer._watch and ((timer.ranges and _profiler._is_profiler_enabled)
                                           or (timer._check_capture and timer._capturing())))):
            log, mgen, grad = timer._flog, timer._mgen, _grad_enabled()
            node = None
            if grad:
                node = x.grad_fn  # the node as it is now: an in-place op on x later does not move it
                if node is None and x.requires_grad:
                    node = x  # a leaf
            ent = new_entry(CallStart, (self, grad, node, timer._now()))  # the clock last: start as late as possible
            log.append(ent)
            try:
                out = mod.forward(x) if self.direct else self.inner(x)
            except BaseException:
                timer._raised(timer._now(), self.mid)
                raise
            t1 = timer._now()  # first: the interval ends as early as possible
            try:
                if timer._mgen != mgen:  # the log was turned into records meanwhile: finish as a record
                    timer._finish_open(t1, self.mid, out)
                    return out
                if not grad:
                    log.append(new_entry(CallEnd, (t1, None)))
                elif type(out) is _Tensor:
                    node = out.grad_fn
                    if node is None and out.requires_grad:
                        node = out  # a leaf (the module returned its leaf input)
                    log.append(new_entry(CallEnd, (t1, node)))
                else:
                    log.append(new_entry(CallEnd, (t1, output_keys(out))))
                if log[0] is ent and not timer._stack:  # the outermost call returned
                    timer._flush_log()
            except Exception as exc:
                timer._internal_error(exc)
            return out
        if x is not _MISSING:
            args = (x, *args)
        return self._general(args, kwargs)

    def _general(self, args, kwargs):
        """The general (reference) path: ``_pre`` and ``_finish`` around the call."""
        timer = self.timer
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
        if self.slot == ti.DIRECT_SLOT:
            return None
        new = memo.get(id(self.mod))
        if new is None:
            return self
        return _bound_class_forward(new) if self.prev is _MISSING else copy.deepcopy(self.prev, memo)

    def __reduce__(self):
        if self.slot == ti.DIRECT_SLOT:
            return (_same, (None,))
        return (_bound_class_forward, (self.mod,)) if self.prev is _MISSING else (_same, (self.prev,))


class ForwardMixin:
    """ModuleTimer's forward bookkeeping: the forward hooks, the general path, the flat log."""

    # ------------------------------------------------------------------ forward hooks (hook route)
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
                call = self._open_call(id(mod))
                if call is not None:
                    self._finish(t1, call, output, output is None and sys.exc_info()[0] is not None)
            except Exception as exc:
                self._internal_error(exc)
            return None
        return post_hook

    # ------------------------------------------------------------------ the general path
    def _pre(self, path, mid, args, kwargs):
        self._materialize()  # calls of the lean path still open enclose this one
        in_bw = _graph_task_id() != -1
        stack = self._stack
        # recompute inside a backward; else the enclosing call's phase; else eval when grad is disabled
        phase = RECOMPUTE if in_bw else stack[-1].phase if stack else FWD if _grad_enabled() else EVAL
        call = new_call(path, phase, mid)
        if phase == EVAL and not stack:
            call.top = True  # an outermost eval call: the step's eval_s
        if path == ROOT and (self.first_root_inputs is None or (self._inputs_eval and phase == FWD)) and not in_bw:
            self._record_root_inputs(args, kwargs, phase)
        if _grad_enabled():
            if not kwargs and len(args) == 1 and type(args[0]) is _Tensor:  # the common case, fast
                if args[0].requires_grad:
                    node = args[0].grad_fn
                    self._pending.append((args[0] if node is None else node, END, call))
            else:
                self._note_inputs(grad_tensors(kwargs, grad_tensors(args, [])), call)
        if self.memory is not None and not in_bw:
            call.mem = self.memory.enter()
        if self.ranges and _profiler._is_profiler_enabled:
            call.rf = _profiler.record_function(f"perfcheck/{call.phase}/{path}")
            call.rf.__enter__()
        if path == ROOT and phase == FWD and self.phase_probe is not None:
            self.phase_probe.enter(FWD)
        self._stack.append(call)
        self._calls.append(call)
        call.t0 = self._now()  # last: the interval starts as late as possible
        return call

    def _record_root_inputs(self, args, kwargs, phase):
        """The root call's argument spec (shapes, dtypes; meta.json). A training forward's inputs
        replace an eval call's (a validation batch may differ in shape); the lean path, which skips
        this, applies only once they are a training forward's."""
        amp = autocast_dtype()  # the compute dtype under torch.autocast (meta.json "dtype")
        self.first_root_inputs = {"args": describe(list(args)), "kwargs": describe(dict(kwargs)),
                                  **({"autocast": amp} if amp else {})}
        self._inputs_eval = phase == EVAL
        self._set_lean(self.memory is None and phase == FWD)

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
        if call.phase == FWD and call.path == ROOT and self.phase_probe is not None:
            self.phase_probe.enter(TAIL)
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
            self._log.append((RC, None, None, call))
        if not raised and _grad_enabled():
            if type(output) is _Tensor:
                if output.requires_grad:
                    node = output.grad_fn
                    self._pending.append((output if node is None else node, START, call))
            else:
                self._note_outputs(output, call)
        if not stack:
            self._flush()

    def _note_outputs(self, output, call):
        """Backward start of ``call`` on the nodes of its grad-requiring outputs (tuples, dicts...)."""
        keys = output_keys(output)
        if keys is not None:
            for key in keys:
                self._pending.append((key, START, call))

    def _note_inputs(self, tensors, call):
        """Rule (a) for ``call``: its inputs' nodes (a leaf input: the tensor itself)."""
        keys = distinct_keys(tensors)
        if len(keys) == 1:
            self._pending.append((keys[0], END, call))
        elif keys:
            end_all = EndAll(call, len(keys))
            self._pending.extend((k, END_ALL, end_all) for k in keys)

    # ------------------------------------------------------------------ the lean path's flat log
    def _materialize(self):
        """Turn the flat log into records: a ``Call`` per call (phase: the enclosing call's, else
        forward, or eval when grad was disabled), the (node, action) notes in the order the general
        path notes them (an input's when the call starts, an output's when it returns). Calls still
        open go on the stack, on top of the general path's open calls, which enclose them."""
        log = self._flog
        if not log:
            return
        self._mgen += 1
        stack, calls, pending = self._stack, self._calls, self._pending
        for e in log:
            if type(e) is CallStart:
                fwd = e.fwd
                if stack:
                    call = new_call(fwd.path, stack[-1].phase, fwd.mid, e.t0)
                elif e.grad:
                    call = new_call(fwd.path, FWD, fwd.mid, e.t0)
                else:
                    call = new_call(fwd.path, EVAL, fwd.mid, e.t0)
                    call.top = True  # an outermost eval call: the step's eval_s
                if e.key is not None:
                    pending.append((e.key, END, call))
                stack.append(call)
                calls.append(call)
            elif stack:  # a CallEnd (stack empty: the step was reset while the call was in flight)
                call = stack.pop()
                call.t1, keys = e
                if type(keys) is list:
                    for k in keys:
                        pending.append((k, START, call))
                elif keys is not None:
                    pending.append((keys, START, call))
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

    def _finish_open(self, t1, mid, out):
        """A lean-path call whose start was turned into a record meanwhile (a call on the general path
        inside it, or a reader): finish that record."""
        self._materialize()
        call = self._open_call(mid)
        if call is not None:
            self._finish(t1, call, out, False)

    def _raised(self, t1, mid):
        """A lean-path call's forward raised: finish its record as the general path does."""
        try:
            self._materialize()
            call = self._open_call(mid)
            if call is not None:
                self._finish(t1, call, None, True)
        except Exception as exc:
            self._internal_error(exc)

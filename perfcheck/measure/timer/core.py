"""``ModuleTimer``: attaches the timed calls or forward hooks to a model's modules and keeps one step's
records (the forward and backward bookkeeping live in forward.py and backward.py)."""
from __future__ import annotations

import torch

import perfcheck.measure.timer.torch_internals as ti
from perfcheck.measure.timer.backward import BackwardMixin
from perfcheck.measure.timer.forward import ForwardMixin, TimedForward
from perfcheck.measure.timer.records import FIRE, Call, Bwd
from perfcheck.measure.timer.step import PendingStep
from perfcheck.model_paths import compiled_call
from perfcheck.schema import ROOT

_MISSING = ti.MISSING


def ancestors(path: str) -> list:
    """The paths enclosing ``path``, outermost (ROOT) first."""
    if path == ROOT:
        return []
    parts = path.split(".")
    return [ROOT] + [".".join(parts[:i]) for i in range(1, len(parts))]


def _wrappable(mod) -> bool:
    """A module whose calls can be timed by an instance attribute (see the package docstring)."""
    return not (ti.torch_compiled(mod) or ti.has_own_hooks(mod))


class ModuleTimer(ForwardMixin, BackwardMixin):
    """Times the calls of ``modules`` (a list of (path, module)); one instance per attached model.

    ``reference=True``: every call takes the general path (``ForwardMixin._pre``/``_finish``), the
    reference implementation the lean path is checked against (tests/measure/test_timer_paths.py)."""

    def __init__(self, modules, clock, *, ranges: bool = True, memory=None, reference: bool = False):
        self.modules = list(modules)
        self.clock = clock
        self._now = clock.now
        self.ranges = ranges
        self.memory = memory
        self.reference = reference
        self._ancestors = {p: frozenset(ancestors(p)) for p, _ in self.modules}
        self._handles: list = []  # forward hooks (modules that are not wrapped)
        self._wrapped: list = []  # (module, TimedForward) currently installed
        self._fwd_cache: dict = {}  # id(module) -> TimedForward removed cleanly at detach, reused at attach
        self._leaf_handles: list = []  # tensor hooks on leaves, removed at the step's end
        self._hooked: list = []  # the actions lists of this step's node hooks, emptied when it ends
        self._on = False
        self._attached = False
        self._gen = 0  # step generation: backward hooks of an ended step do nothing
        # the lean path's flat log (TimedForward.__call__: a CallStart when a call starts, a CallEnd when
        # it returns), the same list for the timer's life, emptied by _materialize. _mgen counts the times
        # it was emptied: a lean call whose start is no longer in the log finishes through the general path.
        self._flog: list = []
        self._mgen = 0
        # backward events not yet replayed, and the backward passes whose end callback is queued:
        # the same objects for the timer's life (the hooks hold them), emptied at each step
        self._log: list = []
        self._cb_tasks: set = set()
        self._reset_step_state()
        self.first_root_inputs = None  # spec (shapes, dtypes) of the first root call's arguments
        self.internal_errors: list[str] = []
        # CUDA graph capture: module calls inside a capture are not timed (an event recorded into a
        # graph is no timestamp); a replay is timed by the hooks of the module that calls it.
        self._check_capture = getattr(clock, "kind", "cpu") == "cuda" and torch.cuda.is_available()
        self.saw_capture = False
        # TimedForward's lean path applies (no per-call memory reading, root inputs already recorded)
        self._lean = False
        # the lean path has to look at the profiler (ranges) or at CUDA graph capture on each call
        # (inline there, behind this one flag: PerfCheck's default profile=True makes it True)
        self._watch = ranges or self._check_capture
        self._inputs_eval = False  # first_root_inputs came from an eval (grad-disabled) call
        # paths of modules compiled (``Module.compile()``) while attached: their later calls ran
        # untimed (the compiled call replaced ours, or runs our forward inside the compiled region)
        self.compiled_while_attached: list[str] = []
        # measure.page_faults.PhaseFaults (or None): told where the root's forward and each backward pass
        # start and end; the root's calls then take the general path (once per step), where it is told
        self.phase_probe = None

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
        use_wrappers = not ti.global_module_hooks()
        for path, mod in self.modules:
            # compiled by nn.Module.compile(): its hooks and forward run inside the compiled region, where
            # nothing is timed, so it is timed as a whole around that call (TimedForward in the same slot,
            # calling the compiled one); its submodules are not timed (context.model_view)
            compiled = ti.DIRECT_ROUTE and compiled_call(mod)
            if compiled or (use_wrappers and _wrappable(mod)):
                self._install(path, mod, compiled)
            else:
                self._handles.append(mod.register_forward_pre_hook(self._make_pre(path, mod), prepend=True,
                                                                   with_kwargs=True))
                self._handles.append(mod.register_forward_hook(self._make_post(path, mod), always_call=True))
        self._attached = True
        self._on = True

    def _install(self, path, mod, compiled):
        """A TimedForward in the module's direct slot, or as its ``forward`` (reused from the last attach)."""
        direct = not compiled and ti.direct(mod)
        slot = ti.DIRECT_SLOT if compiled or direct else "forward"
        prev = mod.__dict__.get(slot, _MISSING)
        fwd = self._fwd_cache.pop(id(mod), None)
        if fwd is None or fwd.mod is not mod or fwd.prev is not prev or fwd.direct != direct or fwd.slot != slot:
            inner = prev if compiled else mod._call_impl if direct else mod.forward
            fwd = TimedForward(self, path, mod, inner, prev, direct, slot)
        fwd.live = True
        fwd.lean = self._lean and not (path == ROOT and self.phase_probe is not None)
        mod.__dict__[fwd.slot] = fwd
        self._wrapped.append((mod, fwd))

    def detach(self):
        self._on = False
        self._attached = False
        for mod, fwd in self._wrapped:
            fwd.live = fwd.lean = False
            cc = mod.__dict__.get(ti.DIRECT_SLOT)
            if cc is not fwd and (fwd.slot == ti.DIRECT_SLOT or compiled_call(mod)):
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
            for i, (event, task, now, obj) in enumerate(log):
                if event == FIRE:
                    log[i] = (FIRE, task, now, list(obj))
        for actions in self._hooked:
            actions.clear()
        self._hooked.clear()

    def _drop_leaf_handles(self):
        for h in self._leaf_handles:
            h.remove()
        self._leaf_handles.clear()

    # ------------------------------------------------------------------ steps
    def _reset_step_state(self):
        self._calls: list[Call] = []
        self._bwds: list[Bwd] = []
        self._stack: list[Call] = []
        self._bstack: list[Bwd] = []
        self._pending: list = []  # (node or leaf tensor, action kind, Call or EndAll) noted in forward
        self._flog.clear()
        self._mgen += 1
        self._log.clear()
        self._cb_tasks.clear()
        self._failed = False
        self._start = None
        self._finals: list = []  # records.Final: frameworks' end-of-backward callbacks (_after_backward)

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
            if f.t_b is None:
                f.t_b = end
                self._close_final_range(f)
        pending = PendingStep(self.clock, self._start, end, self._calls, self._bwds,
                              self.clock.take_step_tokens(), failed, peak, self._finals)
        self._reset_step_state()
        return pending

    def _set_lean(self, lean: bool):
        """Whether calls of wrapped modules may take the lean path (no per-call memory reading, the
        root's inputs recorded; never with ``reference=True``); copied into each live wrapper's ``lean``."""
        lean = lean and not self.reference
        self._lean = lean
        probed = self.phase_probe is not None
        for _, fwd in self._wrapped:
            fwd.lean = lean and fwd.live and not (probed and fwd.path == ROOT)

    def mark_failed(self):
        self._failed = True

    def _capturing(self) -> bool:
        if ti.cuda_capturing():
            self.saw_capture = True
            return True
        return False

    def _internal_error(self, exc):
        self._failed = True
        if len(self.internal_errors) < 10:
            self.internal_errors.append(f"{type(exc).__name__}: {exc}")

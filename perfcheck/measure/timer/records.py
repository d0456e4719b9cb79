"""The module timer's records, each with named fields.

Made per module call (so cheap to make, see the notes): ``Call`` (one forward, eval or recompute
call), the flat log's ``CallStart``/``CallEnd`` (the lean path's two entries per call), ``Bwd`` (one
backward interval), ``EndAll``; per step: ``Final`` (an end-of-backward callback interval) and the
resolved rows ``ModuleRow``/``EvalRow``.

Cost notes (bench/RESULTS.md): a class call that runs an ``__init__`` costs ~570 ns on the
benchmark VM, one without ~150 ns plus ~15 ns per field set, so ``Call`` and ``Bwd`` have no
``__init__`` and are made in one place each. The NamedTuples made per call are built with
``tuple.__new__(Class, values)`` (``new_entry``), a C call, not the generated Python ``__new__``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

FWD, BWD, RECOMPUTE = "fwd", "bwd", "recompute"
#: A forward call made with grad disabled (``torch.no_grad()``/``inference_mode()``) outside any
#: training forward: a validation batch, an EMA/teacher call. Reported apart (eval_s), never as
#: forward, unless the step has no grad-enabled forward at all (inference: then it is the forward).
EVAL = "eval"

#: What a node hook does for a call when autograd reaches the node, in the order the actions were
#: noted (the order in which tensor hooks on one tensor would fire): the call's backward starts
#: (an output's node), ends (its input's node: rule (a)), or ends once all of several inputs' nodes ran.
START, END, END_ALL = 0, 1, 2
#: Backward events, logged by the hooks as ``(kind, task, time, obj)`` and replayed into intervals:
#: a node ran (obj: its actions), a backward pass ended (obj: None), a top-level recompute call
#: returned (obj: its Call).
FIRE, TASK_END, RC = 0, 1, 2

#: ``new_entry(CallStart, (fwd, grad, key, t0))``: a NamedTuple without its Python ``__new__`` frame.
new_entry = tuple.__new__


class Call:
    """One forward (or eval, or recompute) call of a module.

    Set per call: ``path`` (module path), ``phase`` (FWD/EVAL/RECOMPUTE), ``mid`` (id of the module),
    ``t0``/``t1`` (clock readings; ``t1`` None while open), ``bwd_task`` (the backward pass that
    started this call's backward interval), ``ended_task`` (the pass whose rule (a) ended it before
    it started). Class-level defaults until a call needs them: ``mem`` (memory reading), ``act`` and
    ``peak`` (activation and peak bytes), ``rf`` (the profiler range), ``top`` (an outermost eval
    call, or a recompute call not nested in another recompute call)."""

    __slots__ = ("path", "phase", "mid", "t0", "t1", "bwd_task", "ended_task", "__dict__")
    mem = act = peak = rf = None
    top = False


def new_call(path, phase, mid, t0=None) -> Call:
    call = Call()
    call.path, call.phase, call.mid, call.t0 = path, phase, mid, t0
    call.t1 = call.bwd_task = call.ended_task = None
    return call


class Bwd:
    """One backward interval of one call: ``path``, ``anc`` (the module's ancestor paths), ``call``,
    ``task`` (the backward pass), ``b0``/``b1`` (clock readings), ``rc`` (the top-level recompute
    calls inside the interval, or None). Made in ``BackwardMixin._start_bwd`` only."""

    __slots__ = ("path", "anc", "call", "task", "b0", "b1", "rc")


class EndAll:
    """Rule (a) for a call with several grad-requiring inputs on ``n`` distinct nodes: ``left`` of
    them still to run in backward pass ``task``."""

    __slots__ = ("call", "n", "task", "left")

    def __init__(self, call, n):
        self.call, self.n, self.task, self.left = call, n, None, n

    def last_node_ran(self, task) -> bool:
        """One of the nodes ran in backward pass ``task``: True once all ``n`` have (in that pass)."""
        if self.task != task:
            self.task, self.left = task, self.n
        self.left -= 1
        return not self.left


class CallStart(NamedTuple):
    """The lean path's entry when a call starts: its wrapper (``TimedForward``: path, module id),
    whether grad was enabled, the input's autograd key (its node, a leaf tensor, or None), the clock."""

    fwd: object
    grad: bool
    key: object
    t0: object


class CallEnd(NamedTuple):
    """The lean path's entry when the innermost open call returns: the clock, and its output's
    autograd key(s): None, one node/leaf, or a list of them."""

    t1: object
    keys: object


class Final:
    """An end-of-backward callback interval (``bwd_finalize_s``): ``t_a`` when ours ran, ``t_b`` when
    the one queued after the frameworks' ran (None until then), ``range`` the profiler range or None."""

    __slots__ = ("t_a", "t_b", "range")

    def __init__(self):
        self.t_a = self.t_b = self.range = None


class ModuleRow(NamedTuple):
    """One module's step totals (``PendingStep.resolve()["modules"][path]``)."""

    calls: int  # forward calls (eval calls too, in a step with no grad-enabled forward)
    fwd_s: float
    bwd_s: float  # recompute inside the backward intervals excluded
    recompute_s: float
    act_bytes: Optional[int]  # memory readings: None unless PerfCheck(memory=True)
    peak_bytes: Optional[int]


class EvalRow(NamedTuple):
    """One module's grad-disabled calls in a training step (``resolve()["eval_modules"][path]``)."""

    calls: int
    seconds: float

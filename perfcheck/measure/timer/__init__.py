"""Per-module forward, backward and recompute time, at a few microseconds of host time per module call.

Files: ``forward.py`` (the timed call on each module, the forward records; its general path is the
reference implementation the lean path is checked against), ``backward.py`` (node hooks and the
backward intervals), ``records.py`` (the records, with named fields), ``step.py`` (a finished step
resolved into seconds), ``core.py`` (``ModuleTimer``: attach/detach, steps), ``torch_internals.py``
(every torch internal used here, with the torch versions it was checked on).

How each interval is taken (nothing here changes inputs, outputs or grads)
-------------------------------------------------------------------------
* Forward / recompute: from just before the module's ``forward`` runs to just after it returns (or
  raises). Two ways in, chosen per module at ``attach()``:

  - a ``TimedForward`` (forward.py) instance attribute that takes the readings:
    ``module._compiled_call_impl``
    (torch's ``Module.__call__`` calls it instead of ``_call_impl``; it makes ``_call_impl``'s own
    no-hook test and calls ``forward``, so a timed call costs less than ``_call_impl``'s frame it
    replaces), or, for classes with their own ``__call__``/``_call_impl``, ``module.forward``
    (~1 us per call; a forward pre-hook + forward hook pair costs ~12 us: bench/RESULTS.md). Used
    for modules with no hooks of their own and no global module hooks. The attribute is removed at
    ``detach()``; a ``deepcopy``/pickle of the module made meanwhile runs its own plain forward
    (never one that would run the original module), and ``inspect.signature`` sees the real
    signature.
  - the lean path of either (a forward call with one tensor argument, the common case) only
    appends a ``CallStart`` and a ``CallEnd`` (records.py) to a flat log per call; the per-call
    records are built from it when the outermost call returns (``ForwardMixin._materialize``), in
    one loop. The general path (``_pre``/``_finish``) builds the same records as each call starts
    and returns: it is the reference implementation (``ModuleTimer(reference=True)``;
    tests/measure/test_timer_paths.py checks the two agree on random module trees).
  - forward hooks: a pre-hook with ``prepend=True`` (it runs before the module's other pre-hooks,
    so their work, e.g. DeepSpeed ZeRO-3's parameter gather or FSDP2's all-gather, is inside the
    interval) and a forward hook with ``always_call=True`` (last; also when forward raises). Used
    for modules that have hooks of their own (ZeRO-3, FSDP2, user hooks), when global module hooks
    exist, for ScriptModules and for torch.compile'd modules.
  - a module compiled in place by ``nn.Module.compile()`` (its ``_compiled_call_impl`` set before
    attach: hooks and ``forward`` run inside the compiled region, untimed) is timed as a whole by a
    ``TimedForward`` (forward.py) in that slot around the compiled call; its submodules get no rows. One compiled
    while attached runs untimed from then on, and ``stop()`` names it in a warning.

  A call made while autograd runs a backward (``torch._C._current_graph_task_id() != -1``) is
  activation-checkpoint recompute and is reported as ``recompute``, not forward.
* Backward start: the first gradient w.r.t. any output of the call is ready: a pre-hook on the
  autograd node that produced the output (autograd runs it just before the node; put on through
  torch's tensor-hook route, ``torch_internals.hook_carrier``, else ``grad_fn.register_prehook``). One
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

Compared with torch's ``torch.distributed._tools.mod_tracker.ModTracker`` (one job: which modules
are running, forward or backward): it uses global module hooks and ``register_multi_grad_hook``
per call (Python-level bookkeeping per tensor), tells recompute/backward apart the same way
(``_current_graph_task_id() != -1``) and resets its state in a ``queue_callback``. This timer takes
the same signals but pays less per call (an instance attribute instead of hooks, one node hook per
distinct node, records built after the outermost call returns), and also times the intervals.
"""
from perfcheck.measure.clocks import CpuClock, CudaClock
from perfcheck.measure.timer.core import ModuleTimer
from perfcheck.measure.timer.records import BWD, EVAL, FWD, RECOMPUTE, EvalRow, ModuleRow
from perfcheck.measure.timer.step import PendingStep

__all__ = ["BWD", "EVAL", "FWD", "RECOMPUTE", "CpuClock", "CudaClock", "EvalRow", "ModuleRow", "ModuleTimer",
           "PendingStep"]

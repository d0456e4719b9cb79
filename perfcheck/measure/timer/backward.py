"""Backward intervals: node hooks put on when the outermost forward call returns, the events they log,
and the replay that turns those events into intervals (rules (a)-(d) in the package docstring).

The forward only notes ``(key, action, call)`` triples (``records.START``/``END``/``END_ALL``); the
hooks go on when the outermost instrumented call returns, in one loop, one per distinct node
(registering inside the forward, between the model's own ops, cost about 3x more host time per
hook: bench/RESULTS.md). A hook that fires only logs a ``(FIRE, task, time, actions)`` event; the
log becomes intervals at the step's end, or at once while the profiler records (so that the markers
land in the trace in place).
"""
from __future__ import annotations

import types

import torch

import perfcheck.measure.timer.torch_internals as ti
from perfcheck.measure.page_faults import BWD, TAIL
from perfcheck.measure.timer.records import END, END_ALL, FIRE, START, TASK_END, Bwd, Final

_Tensor = torch.Tensor
_profiler = ti.profiler


class BackwardMixin:
    """ModuleTimer's backward bookkeeping."""

    def _flush(self):
        """Put the noted hooks on: one per distinct node (a node pre-hook) or leaf tensor (a tensor
        hook, removed at the step's end), carrying its actions in the order they were noted."""
        pending = self._pending
        if not pending:
            return
        self._pending = []
        hook, groups, bind = self._node_hook(), {}, types.MethodType
        leaf_handles, hooked = self._leaf_handles, self._hooked
        carrier, put = ti.hook_carrier(), ti.put_node_prehook  # carrier None: the public route
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
                    else:
                        put(key, bind(hook, actions), carrier)
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
        task_id, fire = ti.graph_task_id, FIRE
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
        # (the first node hook of this backward pass that fired: the pass's start for the page-fault phases)
        if self.phase_probe is not None:
            self.phase_probe.enter(BWD)
        self._cb_tasks.add(task)
        ti.queue_callback(lambda: self._task_end(task, gen))

    def _replay(self):
        """Backward intervals from the logged events, in the order they happened. Rules (a) and (c)
        inline, (b) in ``_start_bwd`` (this runs once per node hook that fired, ~100 times a step on
        the chain: no method call per action where it can be helped, bench/RESULTS.md)."""
        if not self._log:
            return
        log = self._log.copy()
        self._log.clear()
        bstack = self._bstack
        markers = self.ranges and _profiler._is_profiler_enabled  # trace markers, only while the profiler records
        for event, task, now, obj in log:
            if event == FIRE:
                for kind, call in obj:
                    if kind == END_ALL:  # rule (a) for several inputs: when the last of their nodes runs
                        if not call.last_node_ran(task):
                            continue
                        call, kind = call.call, END
                    if kind == START:
                        if call.bwd_task != task and call.ended_task != task:
                            # (else already started by another output, or its inputs were done first:
                            # the module returned its input)
                            self._start_bwd(call, task, now, markers)
                        continue
                    # END: rule (a); rule (c): its open descendants close with it
                    k = len(bstack) - 1
                    while k >= 0 and bstack[k].call is not call:
                        k -= 1
                    if k >= 0 and markers:
                        self._close_above(k, now, markers)
                    elif k >= 0:
                        while len(bstack) > k:
                            bstack.pop().b1 = now
                    elif call.bwd_task != task:
                        call.ended_task = task
            elif event == TASK_END:
                n = len(bstack)
                while n and bstack[n - 1].task == task:  # rule (d)
                    n -= 1
                self._close_above(n, now, markers)
            else:  # RC: a top-level recompute call returned inside the intervals open now
                for b in bstack:
                    if b.rc is None:
                        b.rc = [obj]
                    else:
                        b.rc.append(obj)

    def _start_bwd(self, call, task, now, markers):
        """``call``'s backward interval starts (the first gradient of one of its outputs is ready)."""
        bstack = self._bstack
        call.bwd_task = task
        path = call.path
        mine = self._ancestors[path]
        # Descendants already open on top of the stack: a module returning its child's output shares
        # that tensor, whose hooks fire child first. This call encloses them, so it starts where the
        # outermost of them started.
        k = n = len(bstack)
        while k and path in bstack[k - 1].anc:
            k -= 1
        if k and bstack[k - 1].path not in mine:
            # below them sits another call of this module (or unrelated work): rule (b) closes
            # everything above this call's innermost open ancestor
            while k and bstack[k - 1].path not in mine:
                k -= 1
            if markers:
                self._close_above(k, now, markers)
            else:  # (close inline: the common case on a chain of siblings)
                while len(bstack) > k:
                    bstack.pop().b1 = now
            n = k
        b = Bwd()
        b.path, b.anc, b.call, b.task, b.b1, b.rc = path, mine, call, task, None, None
        if k == n:
            b.b0 = now
            bstack.append(b)
        else:
            b.b0 = bstack[k].b0
            bstack.insert(k, b)
        self._bwds.append(b)
        if markers:
            self._marker(path, "begin")

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
        self._log.append((TASK_END, task, self._now(), None))
        if self.phase_probe is not None:
            self.phase_probe.enter(TAIL)
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
        final = Final()
        if self.ranges and _profiler._is_profiler_enabled:
            final.range = _profiler.record_function("perfcheck/wait/bwd_finalize")
            final.range.__enter__()
        self._finals.append(final)
        final.t_a = self._now()

        def done():
            if gen == self._gen and final.t_b is None:
                final.t_b = self._now()
                self._close_final_range(final)
        ti.queue_callback(done)

    @staticmethod
    def _close_final_range(final):
        if final.range is not None:
            final.range.__exit__(None, None, None)
            final.range = None

    @staticmethod
    def _marker(path, what):
        marker = _profiler.record_function(f"perfcheck/bwd/{path}/{what}")
        marker.__enter__()  # zero-length range: a visible, properly nested marker in the trace
        marker.__exit__(None, None, None)

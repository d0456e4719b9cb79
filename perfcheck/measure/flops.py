"""FLOPs per module and phase for one step, counted by ``torch.utils.flop_counter.FlopCounterMode``.

The counting step runs under FlopCounterMode (a TorchDispatchMode: nothing is monkey-patched)
and is left out of the timing statistics (the mode slows every op). FlopCounterMode keeps one
running total per module (forward and backward together, a container includes its children);
the split comes from snapshots taken when the root module's forward starts and ends: what was
counted inside a root forward is forward, the rest (up to the step's end) is backward.
Caveats (FlopCounterMode's, documented by torch): matrix products only (mm, addmm, bmm, conv,
SDPA) as 2*m*n*k, no bias or elementwise FLOPs, SDPA backward 2.5x forward, only input gradients
that are needed; activation-checkpoint recompute is counted in backward; its backward module
attribution follows torch's ModuleTracker.
"""
from __future__ import annotations

from collections import defaultdict

import torch
from torch.utils.flop_counter import FlopCounterMode


class FlopStep:
    """Count FLOPs for one step: ``begin()`` at the step start, ``end()`` at its end."""

    def __init__(self, root: torch.nn.Module, paths: dict):
        self.root = root
        self.paths = paths  # id(module) -> path
        self.fwd: dict[str, int] = defaultdict(int)
        self.bwd: dict[str, int] = defaultdict(int)
        self._mode = None
        self._handles = []
        self._last: dict[str, int] = {}

    def begin(self):
        self._mode = FlopCounterMode(display=False)
        self._mode.__enter__()
        self._last = {}
        self._handles = [
            self.root.register_forward_pre_hook(self._on_root_pre),
            self.root.register_forward_hook(self._on_root_post, always_call=True),
        ]

    def _delta(self) -> dict[str, int]:
        now = {k: sum(v.values()) for k, v in self._mode.flop_counts.items()}
        delta = {k: v - self._last.get(k, 0) for k, v in now.items()}
        self._last = now
        return delta

    def _add(self, into, delta):
        for k, v in delta.items():
            if v:
                into[k] += v

    def _on_root_pre(self, mod, args):
        if torch._C._current_graph_task_id() == -1:
            self._add(self.bwd, self._delta())

    def _on_root_post(self, mod, args, output):
        if torch._C._current_graph_task_id() == -1:
            self._add(self.fwd, self._delta())

    def end(self) -> dict[str, tuple[float, float]]:
        """Stop counting; return {module path: (forward FLOPs, backward FLOPs)}."""
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._mode is None:
            return {}
        self._add(self.bwd, self._delta())
        names = {}
        for mod, name in list(self._mode.mod_tracker._known_modules.items()):
            path = self.paths.get(id(mod))
            if path is not None:
                names[name] = path
        self._mode.__exit__(None, None, None)
        self._mode = None
        out = {}
        for name, path in names.items():
            out[path] = (float(self.fwd.get(name, 0)), float(self.bwd.get(name, 0)))
        return out

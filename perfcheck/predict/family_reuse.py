"""Which computing ops find their family's code still warm: a reuse distance over op families.

Why: the host model charges ``op_cold_s`` (the calibration round-robin's excess over the tight loops) to an op
whose family differs from the op before it. A recurrent layer without a oneDNN path (nn.GRU, nn.RNN, a cell
loop) runs the same ~10 families every time step, and measured on the project's Xeon (1 thread, process time,
bench/op_family_reuse.py, bench/results/op_family_reuse.md) a cycle over k light families cost 0.2-0.5 us per
op above the tight loops for k = 2..24 (rising to 1.3 us at 48), while the calibration's 14-op round-robin cost
2.4 us, of which its convolution alone made 1.5 us (the same round-robin without it: 1.0 us). So what an op
pays depends on the code run since its family's last call: little when that was a few light families ago, the
full ``op_cold_s`` after a convolution (a class whose large code calibration prices apart: ``host._class_cold``)
or after many families.

Rule (``near_reuse``): walking the computing ops in pass order (backward: reversed), an op is *near* when its
family ran before in the pass, at most ``NEAR_DISTANCE`` distinct other families ago, and no heavy op (a class
with its own evicted price) ran since. A near op pays ``op_cold_near_s`` (calibration: the round-robin without
the convolution, ``NEAR_DISTANCE + 1`` = 13 families, so each op's family ran 12 distinct families ago, the
distance it measures), any other switching op ``op_cold_s``; a repeat of the op before pays nothing, as before.
NB: families are counted, not their code bytes; between the near round-robin's 12 and the micro-benchmark's
flat range (up to 23) the rule keeps the full price, the conservative side.
"""
from __future__ import annotations

import numpy as np

#: Distinct other families between two calls of a family within which the call is near: the near round-robin's
#: own (perfcheck/calibrate/op_cases.op_cold_near_cases: the 14 tiny ops less the convolution, 13 families).
NEAR_DISTANCE = 12


def near_reuse(names, skip, heavy) -> tuple:
    """``(forward, backward)`` bool arrays: True where a computing op is near (module docstring), per pass.
    ``names``: op family per op; ``skip``: ops outside the walk (views, gradient accumulations); ``heavy``: ops
    whose family evicts the others' code (they are never near themselves and make every op after them far)."""
    names = np.asarray(names, dtype=object)
    skip, heavy = np.asarray(skip, dtype=bool), np.asarray(heavy, dtype=bool)
    idx = np.flatnonzero(~skip)
    fwd, bwd = np.zeros(len(names), dtype=bool), np.zeros(len(names), dtype=bool)
    fwd[idx] = _walk(names[idx], heavy[idx])
    bwd[idx] = _walk(names[idx][::-1], heavy[idx][::-1])[::-1]
    return fwd, bwd


def _walk(run, heavy) -> np.ndarray:
    """Near flags along ``run`` in order: an LRU list of families (most recent first); a family found at
    position p has p distinct others run since its last call; a heavy op empties the list."""
    recent, out = [], np.zeros(len(run), dtype=bool)
    for i, (name, h) in enumerate(zip(run, heavy)):
        if h:
            recent = []
            continue
        if name in recent:
            p = recent.index(name)
            out[i] = p <= NEAR_DISTANCE
            del recent[p]
        recent.insert(0, name)
    return out

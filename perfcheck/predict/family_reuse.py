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

Light cycles (``light_reuse``): the near round-robin's 13 families include six of large code (batch and layer
norm, mean, max-pool, gelu, embedding). Measured on the project's Xeon (1 thread, process time, bench/host_switch.py,
bench/results/host_switch.md), a switch inside a cycle of pointwise ops, copies, splits and small GEMMs (a native
GRU or RNN time step at batch 2-16, hidden 48-200; cycles of 2-8 elementwise families) cost 0.1-0.75 us over the
tight loops, while the near round-robin's switch cost 1.4 us (its six large-code ops 1.8 us, its seven others 0.4
us) and ``op_cold_near_s`` read 2.3-5.5 us across calibrations. So an op is *light-near* when it is near and it and
every family run since its last call are light (``is_light``: a TensorIterator pointwise op, tagged ``pointwise``
in native_functions.yaml, a copy, a split, or a GEMM of ``LIGHT_OTHERS``); it pays ``op_cold_light_s``, the
excess of calibration's own light round-robin (op_cases.op_cold_light_cases: 13 light families, so again 12
others between two calls of a family, the distance ``NEAR_DISTANCE`` measures).

Far (``far_reuse``, ``family_ages``): the other end. An op whose family last ran more than the L3 of distinct data
ago finds its code and data in memory and pays at least ``op_cold_far_s``, calibration's round-robin after an L3
eviction (on an AMD EPYC VM, 31.5 us per op against op_cold_s's 5.8; bench/results/cache_levels.md); an L3 shared
with other tenants' cores also forgets with time, so an op pays the share of that price its L3 lost in the time
since its family last ran (``family_ages``; ``host._far_shares`` with calibration's loss curve,
``cold_curves.l3_loss``: on an AMD EPYC VM an 8 MiB buffer left in its 32 MiB L3 read at 84 GB/s at once, 38 GB/s
after 5 ms asleep and as evicted after 20 ms). Where calibration measured neither the L3 nor the far price (a large
L3, a GPU, a datasheet spec), no op is far.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

#: Distinct other families between two calls of a family within which the call is near: the near round-robin's
#: own (perfcheck/calibrate/op_cases.op_cold_near_cases: the 14 tiny ops less the convolution, 13 families).
NEAR_DISTANCE = 12

#: Light families beside the pointwise-tagged ones: copies (the copy kernel, a TensorIterator loop), splits (views
#: in all but name), and the GEMMs a recurrent step runs (their code is small and stays warm; their data's
#: coldness is priced apart, perfcheck.predict.reuse).
LIGHT_OTHERS = frozenset(("clone", "copy_", "contiguous", "_to_copy", "unsafe_split", "split", "split_with_sizes",
                          "unsafe_chunk", "chunk", "addmm", "mm", "bmm"))


@lru_cache(maxsize=None)
def is_light(name: str) -> bool:
    """True for an aten op family of small, shared code: one of ``LIGHT_OTHERS``, or a family with an overload
    tagged ``pointwise`` (torch.Tag.pointwise: native_functions.yaml's TensorIterator elementwise ops, in place or
    not: add_, mul_, sigmoid_, tanh, relu, gelu, their backward ops ...). Why: a cycle of such families cost
    0.1-0.75 us per switch on the project's Xeon, the near round-robin's norms, pooling, mean and embedding 1.8
    (module docstring)."""
    if name in LIGHT_OTHERS:
        return True
    packet = getattr(torch.ops.aten, str(name), None)
    if packet is None or not hasattr(packet, "overloads"):
        return False
    return any(torch.Tag.pointwise in getattr(getattr(packet, o), "tags", ()) for o in packet.overloads())


def near_reuse(names, skip, heavy) -> tuple:
    """``(forward, backward)`` bool arrays: True where a computing op is near (module docstring), per pass.
    ``names``: op family per op; ``skip``: ops outside the walk (views, gradient accumulations); ``heavy``: ops
    whose family evicts the others' code (they are never near themselves and make every op after them far)."""
    return _passes(names, skip, heavy, light_only=False)


def light_reuse(names, skip, heavy) -> tuple:
    """``(forward, backward)`` bool arrays: True where a computing op is near (``near_reuse``) and it and every
    family run since its family's last call in the pass are light (``is_light``)."""
    return _passes(names, skip, heavy, light_only=True)


def _passes(names, skip, heavy, light_only: bool) -> tuple:
    """The forward walk over the computing ops in order and the backward walk in reverse (``_walk``)."""
    names = np.asarray(names, dtype=object)
    skip, heavy = np.asarray(skip, dtype=bool), np.asarray(heavy, dtype=bool)
    idx = np.flatnonzero(~skip)
    fwd, bwd = np.zeros(len(names), dtype=bool), np.zeros(len(names), dtype=bool)
    fwd[idx] = _walk(names[idx], heavy[idx], light_only)
    bwd[idx] = _walk(names[idx][::-1], heavy[idx][::-1], light_only)[::-1]
    return fwd, bwd


def _walk(run, heavy, light_only: bool = False) -> np.ndarray:
    """Near flags along ``run`` in order: an LRU list of families (most recent first); a family found at
    position p has p distinct others run since its last call; a heavy op empties the list. ``light_only``: near
    only when the op's family and the p others are all light (``is_light``)."""
    recent, out = [], np.zeros(len(run), dtype=bool)
    for i, (name, h) in enumerate(zip(run, heavy)):
        if h:
            recent = []
            continue
        if name in recent:
            p = recent.index(name)
            out[i] = p <= NEAR_DISTANCE and (not light_only or all(is_light(f) for f in recent[:p + 1]))
            del recent[p]
        recent.insert(0, name)
    return out


def far_reuse(distance_fwd, distance_bwd, skip, cache_bytes: float) -> tuple:
    """``(forward, backward)`` bool arrays: True where a computing op's family last ran more than ``cache_bytes``
    (the L3, ``calibration.l3_bytes``) of distinct data ago in its pass (``distance_<phase>``:
    ``perfcheck.predict.reuse.family_distances``; NaN, an op moving nothing in the phase: not far), so its code and
    data come from memory and it pays ``op_cold_far_s`` (calibration's round-robin after an L3 eviction,
    op_cases.op_cold_far_cases). All False where ``cache_bytes`` is not positive; ``skip`` (views, gradient
    accumulations) never far.
    Why: on an AMD EPYC VM whose L3 is 32 MiB, an op whose data stream exceeded it since its last call paid tens of
    microseconds more than after an L2 eviction (a tiny mm 43 us against 5.4; bench/results/cache_levels.md), while
    on a machine whose L3 holds the step the same ops pay only ``op_cold_s``."""
    skip = np.asarray(skip, dtype=bool)
    if not cache_bytes or cache_bytes <= 0:
        return np.zeros(len(skip), dtype=bool), np.zeros(len(skip), dtype=bool)
    out = []
    for dist in (distance_fwd, distance_bwd):
        d = np.asarray(dist, dtype=float)
        out.append(~skip & (np.nan_to_num(d, nan=0.0) > cache_bytes))
    return tuple(out)


def family_ages(names, skip, seconds_fwd, seconds_bwd, idle_s: float = 0.0) -> tuple:
    """``(forward, backward)`` float arrays: the seconds since each computing op's family last ran in its pass (the
    predicted seconds of the ops in between, ``seconds_<phase>``; a family's first call in a pass last ran a step
    ago: all the ops' seconds plus ``idle_s``, the step's time outside them, e.g. the optimizer's step); NaN for
    ``skip`` (views, gradient accumulations)."""
    skip = np.asarray(skip, dtype=bool)
    fwd, bwd = np.full(len(skip), np.nan), np.full(len(skip), np.nan)
    if not len(skip):
        return fwd, bwd
    names = np.asarray(names, dtype=object)
    sec_f = np.where(skip, 0.0, np.asarray(seconds_fwd, dtype=float))
    sec_b = np.where(skip, 0.0, np.asarray(seconds_bwd, dtype=float))
    step = float(sec_f.sum() + sec_b.sum()) + float(idle_s)
    idx = np.flatnonzero(~skip)
    fwd[idx] = _time_walk(names[idx], sec_f[idx], step)
    bwd[idx] = _time_walk(names[idx][::-1], sec_b[idx][::-1], step)[::-1]
    return fwd, bwd


def _time_walk(run, seconds, step_s: float) -> np.ndarray:
    """Ages along ``run`` in order (``family_ages``): the seconds between a family's calls."""
    ends = np.cumsum(seconds)
    starts = ends - seconds
    last, out = {}, np.zeros(len(run))
    for i, name in enumerate(run):
        out[i] = starts[i] - last[name] if name in last else step_s
        last[name] = ends[i]
    return out

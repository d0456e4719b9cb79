"""How much of each op's input comes from beyond the core's L2: the reuse distance of its operands in a step.

Why: calibration times a kernel in a tight loop, where its operands stay in L2; in a step, a layer's weight was
last read a whole step ago, the activation its backward reads was written in the forward, while the input a
forward op reads was usually written by the op just before it, and an RNN's recurrent weight is read again at
every time step. A GEMM of 17-67 MFLOP ran 1.2-1.8x its tight-loop time with its operands evicted on the project's
Xeon, a 2.4 GFLOP one the same (bench/results/cold_operands.md; ``cold_curves.cold_factor`` prices it).

Model (one pass over the traced forward, one over it reversed for the backward): an operand's reuse distance is
the bytes of the distinct storages kernels touched since that storage was last read or written by a kernel (a
stack distance, ``all_cold_shares``; ``TracedOp.reads``/``writes`` of an op that moves bytes: a view touches no
data; the backward's gradients, which are not traced, one buffer per size, ``_touched``). The backward of op i
runs after the backward of every later op and touches what op i read and wrote (its saved inputs and weights, its
output's gradient), so a storage last touched in the forward is as far as the distinct data the rest of the
forward and the backward so far touched. A storage no op touched before in the step (a parameter, the batch) was
last touched in the previous step: far when the step's kernels move more than the L2 (their bytes, the
formulas' ``bytes_<phase>``). An operand is *far* when its distance exceeds the L2 (``calibration.l2_bytes``).
Each op's cold share is the far operands' bytes over all its operands' bytes (each storage once). A matrix product
with any far operand is cold (``cold_curves.gemm_cold_blend``: share > 0): with only the weight evicted, a 17-50
MFLOP linear ran 1.16-1.44x its tight-loop time against 1.28-1.83x with both operands evicted, more than the
weight's share of the operand bytes (19-43%) would give (the packed weight panel stalls the whole kernel; the
project's Xeon, 2026-11-26). A memory-bound op streams its operands, so only the far bytes refetch: its memory term
takes the share (``roofline.memory_time_s``); a layer norm whose input the op before just wrote and whose weight
(a few KiB) was last read a step ago has a share of a few per mille, not 1.
Why reuse and not one flag per step: an RNN's recurrent GEMMs re-read the same weight every time step, so they
stay hot in a step whose working set exceeds L2 (a GRU classifier's step read 0.53 measured/predicted with the
per-step flag, 0.74 without the term, 0.74 with reuse distances).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from perfcheck.predict.cold_curves import loss_curve


def cold_shares(trace, ops: pd.DataFrame, cache_bytes: float, *, fresh_writes: bool = False) -> tuple:
    """``(forward, backward)`` arrays aligned with ``ops`` (the estimator's op table: ``op`` = index into
    ``trace.ops``, ``bytes_fwd``, ``bytes_bwd``): per op the share (0-1) of its operand bytes whose reuse
    distance exceeds ``cache_bytes``; zeros when ``cache_bytes`` is not positive.

    ``fresh_writes``: the forward share also counts the storages the op writes (each storage once with its
    reads), a storage no kernel touched before in the step (a fresh output) as far as a step ago. Why: a forward
    output is a new allocation while the step's activations are held, so the allocator hands out lines last
    touched long ago and the kernel's stores miss (write-allocate); a tight loop recycles the chunk it just freed,
    hot. A layer norm of 64 Ki elements with its input just read and only its output's lines cold ran 1.36-1.47x
    its tight-loop time against 1.55-1.7x with everything evicted (bench/results/norm_attribution.md). Only the
    memory term takes this share (``module_estimator``): a matrix product's cold flag keeps reads only. The
    backward's outputs (input gradients) are not traced storages and reuse what the backward just freed: its
    share is unchanged."""
    fwd, bwd, fresh = all_cold_shares(trace, ops, cache_bytes)
    return (fresh if fresh_writes else fwd), bwd


def all_cold_shares(trace, ops: pd.DataFrame, cache_bytes: float) -> tuple:
    """``(forward, backward, forward with fresh writes)``: both of ``cold_shares``' forward shares and its backward
    one from one walk over the trace (the estimator needs all three: a GEMM's flag, a memory term's share).

    The walk is a stack distance (Mattson et al. 1970): the forward's ops in order, then the backward's in reverse,
    each an event touching the storages ``_touched`` gives; an operand's distance is the bytes of the *distinct*
    storages touched by the events after its own last touch (``_StackDistance``), not the bytes those events moved.
    Why: an RNN's time-step loop touches the same few storages at every step (the recurrent weight, its gradient,
    the recycled per-step gradient buffers); summed as traffic, 64 steps of a 96-wide nn.RNN moved several MiB
    between a hidden state's forward and its backward (16 MiB in its step, 0.93 MiB distinct), so every backward
    GEMM read "far" and was priced at the cold curve's small end (4x96x96: 56 us, 20x its 2.6 us), while the whole
    backward step measured ~50-80 us (bench/results/native_rnn.md)."""
    n = len(trace.ops)
    if cache_bytes <= 0 or not len(ops):
        return np.zeros(len(ops)), np.zeros(len(ops)), np.zeros(len(ops))
    index, fwd_bytes, bwd_bytes, events, touched = _events(trace, ops)
    # a storage no kernel touched before in the step (a parameter, the batch) was last touched a step ago, with the
    # loss, the optimizer, the data loading and Python's own data in between, none of it traced: far when the step's
    # kernels move more than the L2 (its traffic, the conservative side), as before this walk counted distinct bytes
    unseen = math.inf if float(fwd_bytes.sum() + bwd_bytes.sum()) > cache_bytes else 0.0
    stack = _StackDistance(len(events))
    share_f, share_b, share_w = np.zeros(n), np.zeros(n), np.zeros(n)
    at = set(events)
    # ops moving no bytes in a phase (views) touch nothing: their shares are read where the walk stands
    e = 0
    for i in range(n):
        share_f[i] = _far_share(trace.ops[i].reads, lambda key: stack.distance(key, e, unseen), cache_bytes)
        share_w[i] = _far_share(trace.ops[i].reads + trace.ops[i].writes, lambda key: stack.distance(key, e, unseen),
                                cache_bytes)
        if (i, "fwd") in at:
            stack.touch(touched[e], e)
            e += 1
    for i in range(n - 1, -1, -1):
        share_b[i] = _far_share(trace.ops[i].reads, lambda key: stack.distance(key, e, unseen), cache_bytes)
        if (i, "bwd") in at:
            stack.touch(touched[e], e)
            e += 1
    return share_f[index], share_b[index], share_w[index]


def far_shares(trace, ops: pd.DataFrame, l3_bytes: float, loss) -> tuple:
    """``(forward, backward)`` arrays aligned with ``ops``: per op the share (0-1) of its operand bytes that come
    from beyond the L3: a storage whose stack distance exceeds ``l3_bytes`` (the walk of ``all_cold_shares``) or
    none of the step's kernels touched before (a parameter, a fresh forward output: a step ago) in full, any other
    by the time since the step last touched it: ``loss(age)`` of its bytes (an L3 shared with other tenants' cores
    forgets with time: ``cold_curves.l3_loss``; a number: the threshold at that many seconds, ``loss_curve``). The
    forward's share counts the storages the op writes too (a fresh output's write-allocate), the backward's its
    reads (its outputs reuse what the backward just freed). Time runs on the
    ops' predicted device seconds (``t_fwd``, ``t_bwd`` of ``ops``), the events in the walk's order.
    Zeros where ``l3_bytes`` is not positive.
    Why: on the project's AMD VM (L3 32 MiB, shared) a ReLU over 1.5 MiB took 37 us in a tight loop and 165-176 us
    after an L3 eviction or 5 ms asleep: its 3.2 MB at memory's 23 GB/s instead of the L3's 87, plus the op's code
    (``op_cold_far_s``, priced apart); the L2-evicted refetch (``cold_shares``) comes from the L3 and is barely
    slower than hot there."""
    n = len(trace.ops)
    if l3_bytes <= 0 or not len(ops):
        return np.zeros(len(ops)), np.zeros(len(ops))
    index, _, _, events, touched = _events(trace, ops)
    seconds = {"fwd": np.zeros(n), "bwd": np.zeros(n)}
    for phase in seconds:
        seconds[phase][index] = ops[f"t_{phase}"].to_numpy(float)
    ends = np.cumsum([seconds[phase][i] for i, phase in events])
    stack, last_end = _StackDistance(len(events)), {}
    share_f, share_b = np.zeros(n), np.zeros(n)
    at = set(events)
    lost = loss if callable(loss) else loss_curve((), float(loss))

    def far(key, e):  # the share of the storage's bytes from beyond the L3
        if key not in last_end or stack.distance(key, e, math.inf) > l3_bytes:
            return 1.0
        return lost((ends[e - 1] if e > 0 else 0.0) - last_end[key])

    def touch(e):
        stack.touch(touched[e], e)
        for key in touched[e]:
            last_end[key] = ends[e]

    e = 0
    for i in range(n):
        share_f[i] = _share_where(trace.ops[i].reads + trace.ops[i].writes, lambda key: far(key, e))
        if (i, "fwd") in at:
            touch(e)
            e += 1
    for i in range(n - 1, -1, -1):
        share_b[i] = _share_where(trace.ops[i].reads, lambda key: far(key, e))
        if (i, "bwd") in at:
            touch(e)
            e += 1
    return share_f[index], share_b[index]


def _share_where(storages, is_far) -> float:
    """The bytes of ``storages`` ((key, bytes); each storage once) weighted by ``is_far(key)`` (a bool, or the
    share 0-1 of that storage's bytes) over all their bytes."""
    storages = dict(storages)
    total = float(sum(storages.values()))
    if total <= 0:
        return 0.0
    return float(sum(b * float(is_far(key)) for key, b in storages.items() if b > 0)) / total


def _events(trace, ops: pd.DataFrame) -> tuple:
    """``(index, fwd_bytes, bwd_bytes, events, touched)``: the op table's trace indices, the bytes per trace op and
    phase, the walk's events ((trace index, phase): the forward's ops in order, then the backward's reversed, each
    moving bytes) and the storages each event touches (``_touched``)."""
    n = len(trace.ops)
    fwd_bytes, bwd_bytes = np.zeros(n), np.zeros(n)
    index = ops["op"].to_numpy(int)
    fwd_bytes[index] = ops["bytes_fwd"].to_numpy(float)
    bwd_bytes[index] = ops["bytes_bwd"].to_numpy(float)
    events = [(i, "fwd") for i in range(n) if fwd_bytes[i] > 0] + [(i, "bwd") for i in range(n - 1, -1, -1)
                                                                   if bwd_bytes[i] > 0]
    touched = [_touched(trace.ops[i], fwd_bytes[i] if phase == "fwd" else bwd_bytes[i], phase, i)
               for i, phase in events]
    return index, fwd_bytes, bwd_bytes, events, touched


def family_distances(trace, ops: pd.DataFrame) -> tuple:
    """``(forward, backward)`` arrays aligned with ``ops``: per op and phase, the distinct bytes of data the step's
    kernels touched since its family's last call in that phase's pass (the same stack distance as the operands':
    ``_StackDistance`` over ``_events``; a family is the op's aten name, its backward a family of its own), NaN where
    the op moves no bytes in the phase. A family's first call in a pass last ran a step ago: the step's distinct
    bytes (every storage the walk touched, once; the optimizer's and the loss's data are not traced).
    ``perfcheck.predict.family_reuse.far_reuse`` compares them with the L3. Why distinct bytes and not traffic: a
    loop re-reading the same few storages (an RNN's time steps) moves many times its footprint, and lines it touches
    again do not evict others (the same lesson as the operands', module docstring)."""
    if not len(ops):
        return np.zeros(0), np.zeros(0)
    index, _, _, events, touched = _events(trace, ops)
    footprint: dict = {}
    for keys in touched:
        for key, nbytes in keys.items():
            footprint[key] = max(footprint.get(key, 0.0), nbytes)
    unseen = float(sum(footprint.values()))
    stack = _StackDistance(len(events))
    dist = {"fwd": np.full(len(trace.ops), np.nan), "bwd": np.full(len(trace.ops), np.nan)}
    for e, ((i, phase), keys) in enumerate(zip(events, touched)):
        family = ("family", phase, trace.ops[i].call.name)
        dist[phase][i] = stack.distance(family, e, unseen)
        stack.touch({**keys, family: 0.0}, e)
    return dist["fwd"][index], dist["bwd"][index]


class _StackDistance:
    """Distinct bytes touched since a storage's last touch, over a sequence of events (a Fenwick tree over event
    positions holding each storage's bytes at its latest touch: O(log events) per touch and query)."""

    def __init__(self, events: int):
        self.tree = [0.0] * (events + 1)
        self.last = {}  # storage key -> (event, bytes) of its latest touch

    def _add(self, pos: int, value: float) -> None:
        pos += 1
        while pos < len(self.tree):
            self.tree[pos] += value
            pos += pos & -pos

    def _prefix(self, pos: int) -> float:
        """Sum over events [0, pos)."""
        total = 0.0
        while pos > 0:
            total += self.tree[pos]
            pos -= pos & -pos
        return total

    def distance(self, key, now: int, unseen: float) -> float:
        """Bytes of the distinct storages touched by events after ``key``'s last touch and before event ``now``;
        ``unseen`` for a storage not touched before."""
        if key not in self.last:
            return unseen
        return self._prefix(now) - self._prefix(self.last[key][0] + 1)

    def touch(self, keys: dict, event: int) -> None:
        for key, nbytes in keys.items():
            if key in self.last:  # its bytes move from its previous touch to this one
                before, size = self.last[key]
                self._add(before, -size)
            self.last[key] = (event, nbytes)
            self._add(event, nbytes)


def _touched(op, moved: float, phase: str, i: int) -> dict:
    """The storages (key -> bytes) an op's kernels in ``phase`` touch, whose lines it brings into the cache.

    Forward: its recorded storages (reads and writes, each once), scaled down to the formula's bytes where those are
    fewer (a kernel reading part of a tensor); none recorded: a storage of its own of the formula's bytes.
    Backward: the recorded storages (its saved inputs, weights) and the gradients it writes, which are not traced:
    the formula's bytes beyond the recorded ones, as one buffer *recycled by size* (key ``("grad", bytes)``): the
    CPU allocator hands a freed block back to the next request of its size, so a loop's per-step gradients of one
    shape reuse the same lines (the same reason ``cold_shares`` keeps the backward's outputs out of its share).
    The engine's gradient accumulation records no storages and adds the incoming gradient into the buffer in place
    (autograd's ``InputBuffer::accumulate``; a profiler shows ``aten::add_``): two gradient-sized buffers, recycled
    by size as well (``_footprint``: 2 x the gradient where its formula moves 3)."""
    if op.grad_accumulate:
        return {("accumulate", _footprint(op, moved)): _footprint(op, moved)}
    storages = dict(op.reads + op.writes)
    recorded = float(sum(storages.values()))
    if phase == "bwd":
        grad = max(moved - recorded, 0.0)
        if recorded <= 0:
            return {("grad", moved): moved}
        return {**storages, ("grad", grad): grad} if grad > 0 else storages
    if recorded <= 0:
        return {("op", i): moved}
    scale = min(1.0, moved / recorded)
    return {key: nbytes * scale for key, nbytes in storages.items()}


def _footprint(op, moved: float) -> float:
    """The bytes an op brings into the cache: its distinct storages' bytes (each once) where it records them and
    they are fewer than the bytes its formula moves, else those (``_touched`` reads it for the gradient
    accumulation). Why: a reuse distance counts the distinct data
    touched in between (Mattson et al. 1970's stack distance), not the traffic: an in-place op reads and writes the
    same lines, and torch's CPU oneDNN LSTM layer re-reads its recurrent weight at every time step. Used for the
    forward (an op's recorded storages are its forward's tensors; its backward also writes gradients they do not
    hold, so a backward op keeps its formula's bytes) and for the engine's gradient accumulation, which records no
    storages (``grad_accumulation.insert``) and adds the incoming gradient into the buffer in place (autograd's
    ``InputBuffer::accumulate``; a profiler shows ``aten::add_``): two gradient-sized buffers touched where its
    formula moves three. Without this a GRU's per-step weight-gradient accumulation (3 x 768 KiB moved, 2 x 768
    KiB touched) put the recurrent weight beyond a 2 MiB L2 between two time steps' backward GEMMs, which then
    read cold (bench/results/rnn.md)."""
    if moved <= 0:
        return 0.0
    if op.grad_accumulate:
        out = op.call.outputs[0] if op.call.outputs else None
        distinct = 2.0 * out.numel * out.elem_bytes if out is not None else moved
    else:
        distinct = float(sum(dict(op.reads + op.writes).values()))
    return min(moved, distinct) if distinct > 0 else moved


def _far_share(reads, distance, cache_bytes: float) -> float:
    """The bytes of the storages of ``reads`` ((key, bytes); each storage once) farther than ``cache_bytes`` over
    all their bytes; 0.0 when they hold none."""
    return _share_where(reads, lambda key: distance(key) > cache_bytes)

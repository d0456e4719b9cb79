"""Autograd's gradient accumulation: the element-wise adds backward runs where one tensor feeds several ops.

What: a tensor that needs a gradient and is consumed by k > 1 autograd edges in the forward (a residual
stream feeding a LayerNorm and the residual add; a ResNet block's input feeding the conv branch and the
shortcut; ``x * x``) receives k gradients in backward. The engine sums them in the InputBuffer of the node
that made the tensor (torch/csrc/autograd/input_buffer.cpp, ``InputBuffer::add`` -> ``accumulate``: ``old +
new``, or ``old.add_(new)`` when it may steal the buffer): k - 1 element-wise adds of the tensor's size, each
reading two gradients and writing one (3 streams), run by the engine right after the consumer node whose
gradient arrives 2nd..k-th (torch's profiler shows them as ``aten::add`` directly under that consumer's
``autograd::engine::evaluate_function``, not inside its ``*Backward`` node). Backward runs consumers in reverse
forward order, so every consumer but the LAST one in forward order pays one add.

Parameters and leaf inputs (an ``AccumulateGrad`` node) accumulate in the same InputBuffer. Those registered in
m > 1 modules are already priced by ``perfcheck.predict.host.tied_gradient_s`` (m - 1 adds); here a leaf
used by k edges adds the k - max(m, 1) adds beyond those (a module called twice on its own weight).

``accumulations`` returns, per add, the trace position of its consumer's op and the gradient's shape record;
``perfcheck.predict.trace.trace_model`` inserts one backward-only op per add (``TracedOp.grad_accumulate``)
just before its consumer's op, on that op's module stack, so the add lands in the consumer's module backward
(backward runs the sequence reversed: after the consumer's node, as the engine runs it).
"""
from __future__ import annotations

import bisect

import torch

from perfcheck.predict.aten_costs import OpCall, TensorMeta
from perfcheck.predict.trace_records import TracedOp, element_size

#: The op an accumulation is costed as: an out-of-place add of two gradients (read 2, write 1).
ACCUMULATE_OP = torch.ops.aten.add.Tensor
#: Its name in the estimator's op table.
ACCUMULATE_NAME = "grad_accumulate"


def node_ops(outs: dict) -> dict:
    """id(autograd node) -> index of the traced op that made it: its output's own ``grad_fn`` (a view's is its
    view node, never its base's; an in-place op later applied to the same tensor takes over the tensor's node:
    the latest index wins)."""
    made = {}
    for index, tensors in outs.items():
        for t in tensors or ():
            if t.grad_fn is not None:
                made[id(t.grad_fn)] = max(made.get(id(t.grad_fn), -1), index)
    return made


def accumulations(seen: dict, made: dict, leaf_owners: dict, elem_bytes) -> list:
    """``[(op index, TensorMeta)]``, one per gradient add autograd's backward runs.

    ``seen``: id -> node for every node backward reaches (``trace_modes.mark_backward``); ``made``:
    ``node_ops``; ``leaf_owners``: id(leaf tensor) -> number of modules registering it (a parameter; 0 or absent
    for another leaf). A consumer node no traced op made (a custom autograd.Function's, a node an in-place op
    replaced) is placed at the op after the traced node created just before it (autograd's sequence numbers)."""
    order = sorted((node._sequence_nr(), index) for nid, index in made.items() if nid in seen
                   for node in (seen[nid],))
    seqs = [s for s, _ in order]

    def position(node) -> int:
        if id(node) in made:
            return made[id(node)]
        k = bisect.bisect_right(seqs, node._sequence_nr())
        return order[k - 1][1] + 1 if k else (order[0][1] if order else -1)

    incoming: dict = {}  # (id(producer), input_nr) -> (producer, input_nr, [consumer positions])
    for node in seen.values():
        for nxt, nr in node.next_functions:
            if nxt is not None:
                incoming.setdefault((id(nxt), nr), (nxt, nr, []))[2].append(position(node))
    out = []
    for producer, nr, positions in incoming.values():
        if len(positions) < 2:
            continue
        leaf = getattr(producer, "variable", None) if type(producer).__name__ == "AccumulateGrad" else None
        if leaf is not None:
            extra = len(positions) - max(leaf_owners.get(id(leaf), 0), 1)  # tied_gradient_s has m - 1 of them
            shape, dtype = tuple(leaf.shape), leaf.dtype
        else:
            extra = len(positions) - 1
            slot = producer._input_metadata[nr]  # the gradient this slot receives: the forward output's
            shape, dtype = tuple(slot.shape), slot.dtype
        grad = _meta(shape, dtype, elem_bytes)
        out += [(p, grad) for p in sorted(positions)[:max(extra, 0)] if p >= 0]
    return sorted(out, key=lambda pg: pg[0])


def _meta(shape, dtype, elem_bytes) -> TensorMeta:
    """The gradient's shape record, in the trace's element size (``elem_bytes``: the trace's ``ElemSize`` or None)."""
    floating = dtype.is_floating_point or dtype.is_complex
    eb = element_size(dtype, torch.empty((), dtype=dtype).element_size(), elem_bytes)
    numel = 1
    for n in shape:
        numel *= int(n)
    return TensorMeta(shape, eb, False, floating, numel)


def insert(trace, adds: list) -> None:
    """Put one backward-only ``TracedOp`` per add in ``trace.ops``, just before its consumer's op, on its stack."""
    if not adds:
        return
    at: dict = {}
    for index, grad in adds:
        at.setdefault(index, []).append(grad)
    ops = []
    for index, op in enumerate(trace.ops):
        for grad in at.get(index, ()):
            ops.append(TracedOp(OpCall(ACCUMULATE_OP, (grad, grad), {}, (grad,)), op.stack, recompute=False,
                                grad_accumulate=True))
        ops.append(op)
    trace.ops[:] = ops

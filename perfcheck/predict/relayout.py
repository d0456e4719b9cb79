"""The copies an op's kernel makes of a non-contiguous operand before it runs: ops the trace does not see.

ATen's ``layer_norm_cpu`` (and the CUDA one) start with ``input.expect_contiguous()``, and
``layer_norm_backward_cpu`` does the same to the saved input, which autograd keeps as the view the forward got
(aten/src/ATen/native/layer_norm.cpp). So a LayerNorm over a permuted view (torchvision's ConvNeXt normalises the
(N, H, W, C) view of an NCHW activation in every block and in its ``LayerNorm2d``) runs one copy of its n input
elements in the forward and another in the backward, each a kernel of its own (under torch.profiler, torch 2.13
CPU: an ``aten::contiguous`` -> ``clone`` -> ``copy_`` of the input's shape inside ``native_layer_norm`` and inside
``native_layer_norm_backward``; bench/results/norm_permuted.md). The fake-tensor trace records the outer op only,
so the estimator priced the norm as if its input were contiguous; the copy's time does not hide inside the norm's
own roofline either (its backward is priced by its FLOPs, so bytes added to it would add nothing).

``insert`` puts one ``aten.permute_copy`` op before each such norm, on its module stack: its cost
(``aten_costs._copy``) is a copy of the n elements forward (read n, write n) and, where the norm's backward runs,
the same again backward: the two relayouts above, each priced as a copy kernel (its efficiency, its memory curve,
its host fixed cost: the real one dispatches ``contiguous``, ``clone`` and ``copy_``). A non-contiguous incoming
gradient is copied too (``dY.contiguous()``), but its layout is not traced (an open item).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from perfcheck.predict.aten_costs import OpCall, TensorMeta
from perfcheck.predict.trace_records import TracedOp

#: The op a relayout is costed as: a copy forward and a copy backward (``aten_costs._copy``; not ``clone``, whose
#: backward passes the gradient through).
RELAYOUT_OP = torch.ops.aten.permute_copy.default
#: Ops whose kernels copy a non-contiguous first argument into a contiguous one in both phases.
COPIES_INPUT = ("native_layer_norm",)


def relayout_of(op: TracedOp):
    """The relayout op to put before ``op`` (a ``TracedOp`` on the same stack), or None where its kernel makes no
    copy (a contiguous input, or an op not in ``COPIES_INPUT``)."""
    call = op.call
    if call.name not in COPIES_INPUT or not call.args or not isinstance(call.args[0], TensorMeta):
        return None
    x = call.args[0]
    if x.contiguous:
        return None
    # the backward copies the saved input whenever the norm's backward runs (an input or a weight gradient)
    grad = op.backward and any(t.requires_grad for t in call.tensors())
    src = replace(x, requires_grad=bool(grad))
    out = replace(x, requires_grad=bool(grad), contiguous=True, distinct=-1)
    copy = OpCall(RELAYOUT_OP, (src, list(range(len(x.shape)))), {}, (out,))
    return TracedOp(copy, op.stack, backward=op.backward, recompute=op.recompute, reads=op.reads[:1], writes=())


def insert(trace) -> None:
    """Put each op's relayout (``relayout_of``) in ``trace.ops`` just before it."""
    ops = []
    for op in trace.ops:
        extra = relayout_of(op)
        if extra is not None:
            ops.append(extra)
        ops.append(op)
    trace.ops[:] = ops

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
its host fixed cost: the real one dispatches ``contiguous``, ``clone`` and ``copy_``).

The gradient a LayerNorm's backward receives is copied too when it arrives out of row-major order, and so is a
softmax's or log-softmax's (torch.profiler, torch 2.13 CPU: an ``aten::copy_`` inside
``native_layer_norm_backward`` / ``_softmax_backward_data`` / ``_log_softmax_backward_data``; group norm, batch
norm, GELU and SiLU backwards read such a gradient in place; tests/predict/test_relayout_grad.py checks the rule
below against the profiler, on the CPU and on CUDA). Two CUDA kernels differ, and a GPU target's trace
(``trace_model(fused_dropout=True)``) walks by them (an H200, torch 2.11: bench/relayout_probe.py,
bench/gpu_results/2026-11-27-h200-late/relayout_cuda.txt): torch's softmax backward first multiplies the gradient by
the output (``softmax_backward_cuda_out``: ``tmp = grad * output``, a dense tensor in the gradient's order), so only a
permuted gradient is copied there, not a gapped or expanded one (``MULTIPLIES_FIRST_ON_GPU``); and CUDA's dropout
(``native_dropout``, the op a GPU trace records; a CPU trace records ``bernoulli_`` and ``mul``) writes its input's
gradient in the input's suggested memory format (``masked_scale``: row-major, or channels-last), whatever the
incoming gradient's order (``SUGGESTS_FORMAT``). Where it arrives permuted is not in the
forward trace, but in autograd's graph, which the trace holds: a consumer's backward hands its input a gradient
either laid out as that input is in memory or dense in the input's logical (row-major) order:

- a view that reorders (transpose, permute, view, squeeze, ...) passes the gradient back through the same view,
  and a pointwise op writes its output in its input's layout while its backward follows the incoming gradient's
  layout: in memory order at the input exactly when it arrived in memory order at the output;
- a copy whose backward passes the gradient through (``clone``, ``contiguous``, a same-size ``_to_copy``): the
  same, where the copy kept its input's layout; where it changed it (a permuted view made contiguous), the
  gradient reaches the input laid out as the copy is, so not in the input's memory order;
- ``cat`` and ``stack`` hand each input a slice of their output's gradient (``narrow`` / ``select`` along their
  dimension): memory order where that gradient is and the slice is row-major, i.e. every dimension before the
  concatenated one has size 1 (a concatenation along the last dimension hands each input a strided slice);
- a sum hands back its gradient expanded (stride 0 over the summed dimensions): never memory order;
- any other op (matmul, linear, softmax, mean, a slice's or a split's backward) hands back a dense gradient in its
  input's logical order: memory order when that input is row-major (or channels-last into a convolution, whose
  oneDNN backward writes channels-last).

A tensor feeding several consumers gets the sum of their gradients, laid out as the first to arrive: the
consumer autograd made last (highest sequence number) runs first (``InputBuffer::accumulate`` keeps the stored
gradient's order of strides: ``old + new`` or ``old.add_(new)``), and a first gradient that is a slice or an expansion
(in order but not dense) comes out of ``old + new`` dense. So ``mark_permuted_grads`` follows, from each such op's
output, the consumer made last, through views and pointwise ops, and marks the op ``grad_permuted`` where the
gradient it gets is not row-major (a token-mixing MLP over ``norm(x).transpose(1, 2)``: the Linear's dense
gradient, transposed back); ``insert`` puts a backward-only copy of its output's elements before it
(``TracedOp.grad_relayout``: priced as a ``clone`` of a permuted source, read n and write n, in its backward only).
Approximations: a pointwise op with two operands is taken to follow the walked one's layout, the engine's ready
queue to follow sequence numbers, and a slice of an expanded gradient to stay gapped (``stack(..., -1).sum(-1)``
hands each input a dense one).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from perfcheck.predict.aten_costs import OpCall, TensorMeta, is_view_op
from perfcheck.predict.grad_accumulation import node_ops
from perfcheck.predict.trace_records import TracedOp

#: The op a relayout is costed as: a copy forward and a copy backward (``aten_costs._copy``; not ``clone``, whose
#: backward passes the gradient through).
RELAYOUT_OP = torch.ops.aten.permute_copy.default
#: Ops whose kernels copy a non-contiguous first argument into a contiguous one in both phases.
COPIES_INPUT = ("native_layer_norm",)
#: Copies whose backward passes the gradient through unchanged (``aten_costs._copy``'s same rule).
PASSES_GRAD = ("clone", "contiguous", "_to_copy", "alias")
#: Ops whose backward kernels copy an incoming gradient that is not row-major (``mark_permuted_grads``).
COPIES_GRAD = ("native_layer_norm", "_softmax", "_log_softmax")
#: The op a gradient's relayout is costed as: a copy (its forward cost, moved to the backward).
GRAD_RELAYOUT_OP = torch.ops.aten.clone.default
#: Views whose backward re-views the gradient (its layout carried through); any other view's backward writes a
#: dense gradient (a slice's or select's zeros and copy, an expand's sum, a split's concatenation).
REORDERING_VIEWS = ("transpose", "permute", "t", "view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "alias",
                    "movedim", "swapaxes", "swapdims", "unflatten", "flatten")
#: Of ``COPIES_GRAD``, those whose CUDA backward first writes ``grad * output`` as a fresh tensor in the gradient's
#: order (SoftMax.cu, ``softmax_backward_cuda_out``): on a GPU only a permuted gradient is copied, not a gapped one.
MULTIPLIES_FIRST_ON_GPU = ("_softmax",)
#: Ops whose backward writes the input's gradient in the input's suggested memory format (row-major, or channels-last
#: for a 4-d channels-last input) whatever the incoming gradient's order: CUDA's dropout (``masked_scale`` allocates
#: ``empty_like(grad, grad.suggest_memory_format())``; the op only a GPU target's trace records).
SUGGESTS_FORMAT = ("native_dropout",)
#: Ops whose backward hands each input a slice of the output's gradient along their ``dim`` argument.
SLICES_GRAD = ("cat", "stack")
#: Reductions whose backward expands the gradient (``SumBackward``: ``grad.expand(self.sizes())``).
EXPANDS_GRAD = ("sum",)
#: Ops after which a channels-last input's gradient comes back channels-last (oneDNN's NHWC path).
CHANNELS_LAST_BACKWARD = ("convolution", "_convolution", "mkldnn_convolution")
#: How many views and pointwise ops the walk follows from one output before it stops (and assumes memory order).
MAX_WALK = 64


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


def grad_relayout_of(op: TracedOp):
    """The backward-only copy of the gradient ``op``'s kernel makes (``op.grad_permuted``: it arrives permuted),
    or None."""
    if not (op.grad_permuted and op.backward and op.call.name in COPIES_GRAD and op.call.outputs):
        return None
    y = op.call.outputs[0]
    src = replace(y, requires_grad=False, contiguous=False, channels_last=False)
    out = replace(y, requires_grad=False, contiguous=True, channels_last=False, distinct=-1)
    copy = OpCall(GRAD_RELAYOUT_OP, (src,), {}, (out,))
    return TracedOp(copy, op.stack, recompute=False, grad_relayout=True)


def insert(trace) -> None:
    """Put each op's relayouts (``relayout_of``, ``grad_relayout_of``) in ``trace.ops`` just before it."""
    ops = []
    for op in trace.ops:
        ops += [extra for extra in (grad_relayout_of(op), relayout_of(op)) if extra is not None]
        ops.append(op)
    trace.ops[:] = ops


#: The layouts a gradient reaching a tensor can have, relative to that tensor's memory: laid out as it is (no copy);
#: in its order of strides but not dense (a slice with gaps, an expansion): a kernel still copies it, an out-of-place
#: sum with another gradient makes it dense; in another order (a transposed one): copied, and a sum keeps its order.
DENSE, GAPPED, PERMUTED = "dense", "gapped", "permuted"


def mark_permuted_grads(trace, seen: dict, outs: dict, gpu: bool = False) -> None:
    """Set ``grad_permuted`` on each differentiated op of ``COPIES_GRAD`` whose kernel copies its output's gradient:
    where it does not arrive laid out as the output is (the module docstring's walk, ``_GradLayout``), on a GPU
    target (``gpu``) only where it arrives permuted for ``MULTIPLIES_FIRST_ON_GPU``. ``seen``: id -> node for every
    node backward reaches (``trace_modes.mark_backward``); ``outs``: op index -> its output tensors (fake; their
    ``grad_fn``s)."""
    walk = _GradLayout(trace, seen, outs)
    for index, op in enumerate(trace.ops):
        if op.call.name in COPIES_GRAD and op.backward and outs.get(index):
            y = outs[index][0]
            copied = (PERMUTED,) if gpu and op.call.name in MULTIPLIES_FIRST_ON_GPU else (PERMUTED, GAPPED)
            op.grad_permuted = y.grad_fn is not None and walk.layout(y, 0) in copied


class _GradLayout:
    """The layout (``DENSE``, ``GAPPED``, ``PERMUTED``) of the gradient reaching a traced tensor."""

    def __init__(self, trace, seen: dict, outs: dict):
        self.trace, self.outs, self.made = trace, outs, node_ops(outs)
        self.consumers: dict = {}  # (id(node), output nr) -> the nodes reading that output's gradient
        for node in seen.values():
            for nxt, nr in node.next_functions:
                if nxt is not None:
                    self.consumers.setdefault((id(nxt), nr), []).append(node)

    def layout(self, t, steps: int) -> str:
        """The gradient reaching ``t``: the first to arrive (the consumer made last), summed with any others."""
        readers = self.consumers.get((id(t.grad_fn), t.output_nr)) if t.grad_fn is not None else None
        if not readers or steps > MAX_WALK:
            return DENSE
        first = self._contribution(t, max(readers, key=lambda n: n._sequence_nr()), steps)
        # a gapped first gradient is a view the engine cannot steal: ``old + new`` writes a dense one in its order
        return DENSE if first == GAPPED and len(readers) > 1 else first

    def _contribution(self, t, node, steps: int) -> str:
        index = self.made.get(id(node))
        outputs = self.outs.get(index) if index is not None else None
        if not outputs:
            return DENSE  # a node no traced op made (a custom autograd.Function): taken as laid out as t
        call, out = self.trace.ops[index].call, outputs[0]
        if len(outputs) == 1 and call.name in REORDERING_VIEWS and is_view_op(call):
            return self.layout(out, steps + 1)
        if len(outputs) == 1 and call.name in PASSES_GRAD:  # before pointwise: torch tags clone pointwise
            return self.layout(out, steps + 1) if _same_layout(t, out) else PERMUTED
        if len(outputs) == 1 and torch.Tag.pointwise in getattr(call.func, "tags", ()):
            return self.layout(out, steps + 1)
        own = DENSE if t.is_contiguous() else PERMUTED  # a dense gradient in t's logical order
        if call.name in SUGGESTS_FORMAT and t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
            return DENSE
        if call.name in SLICES_GRAD:
            dim = int(call.arg(1, "dim", 0)) % out.dim()
            whole = self.layout(out, steps + 1)
            if own == PERMUTED or whole == PERMUTED:
                return PERMUTED
            return DENSE if whole == DENSE and all(n == 1 for n in out.shape[:dim]) else GAPPED
        if call.name in EXPANDS_GRAD:
            return GAPPED if own == DENSE else PERMUTED
        if own == PERMUTED and call.name in CHANNELS_LAST_BACKWARD and t.dim() == 4 \
                and t.is_contiguous(memory_format=torch.channels_last):
            return DENSE
        return own


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape and the same strides over every dimension longer than 1 (a size-1 dimension's stride is free)."""
    return tuple(a.shape) == tuple(b.shape) and all(
        n == 1 or sa == sb for n, sa, sb in zip(a.shape, a.stride(), b.stride()))

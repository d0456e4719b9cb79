"""The registry that maps each traced aten op to the shape formulas in ``formulas.py``.

One function per op family, registered by decorator; registering an op twice raises. An op
with no entry is resolved in a fixed, explicit order (``cost_of``):
  1. a view or metadata op (aliasing output, or in ``ZERO_COST_OPS``)      -> no kernel, no cost
  2. torch.Tag.pointwise                                                   -> formulas.elementwise
  3. torch.Tag.reduction                                                   -> formulas.reduction
  4. torch.utils.flop_counter's registry has it                            -> counted (source='counted')
  5. anything else                                                         -> a memory-only op
     (bytes of its inputs and outputs), reported by name in ``unmodeled_ops`` so it is never
     silently zero.
How these costs become a module's predicted time: docs/model.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch

from perfcheck.predict import formulas as F
from perfcheck.predict.strided import is_strided_operand

aten = torch.ops.aten


@dataclass(frozen=True)
class TensorMeta:
    """What a formula needs to know about one tensor argument or result."""

    shape: tuple
    elem_bytes: int
    requires_grad: bool
    is_float: bool
    distinct: int = -1  # elements actually stored (an expanded view repeats them); -1: numel
    contiguous: bool = True  # row-major dense (a transposed or expanded view is not: predict.strided)
    #: dense in channels-last order and not row-major (4-D: NHWC strides, what ``x.permute(0, 3, 1, 2)`` of an
    #: (N, H, W, C) tensor or ``.to(memory_format=torch.channels_last)`` gives): torch's oneDNN convolution runs
    #: such an input in NHWC (aten/src/ATen/native/ConvUtils.h, ``mkldnn_conv_use_channels_last``); a sliced NCHW
    #: view is not contiguous either, and runs the NCHW kernels
    channels_last: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes_read(self) -> int:
        """Bytes a kernel reads for this input: its distinct elements, not its broadcast size."""
        return (self.numel if self.distinct < 0 else self.distinct) * self.elem_bytes

    def off_vector_loop(self, out_numel) -> bool:
        """As an operand of a GPU elementwise kernel writing ``out_numel`` elements: does it keep the kernel off the
        vectorised loop (``strided.is_strided_operand``: broadcast or not contiguous)?"""
        stored = self.numel if self.distinct < 0 else self.distinct
        return is_strided_operand(stored, self.numel, out_numel, self.contiguous)


@dataclass(frozen=True)
class OpCall:
    """One traced aten call: the op, its arguments with tensors replaced by ``TensorMeta``."""

    func: object  # torch._ops.OpOverload
    args: tuple
    kwargs: dict
    outputs: tuple  # TensorMeta of tensor outputs, in order

    @property
    def name(self) -> str:
        return str(self.func.overloadpacket.__name__)

    def tensors(self):
        return [a for a in _flat(self.args) if isinstance(a, TensorMeta)]

    def arg(self, i, name=None, default=None):
        if i < len(self.args):
            return self.args[i]
        return self.kwargs.get(name, default)


@dataclass(frozen=True)
class Resolved:
    """An op's cost and how it was obtained."""

    cost: F.OpCost
    source: str  # "modeled" | "counted" | "unmodeled" | "free"


def _flat(xs):
    for x in xs:
        if isinstance(x, (list, tuple)):
            yield from _flat(x)
        else:
            yield x


_REGISTRY: dict = {}


def register(*packets) -> Callable:
    """Register a cost function for aten op packets; registering a packet twice is an error."""

    def wrap(fn):
        for p in packets:
            if p in _REGISTRY:
                raise RuntimeError(f"aten op {p} already has a cost formula ({_REGISTRY[p].__name__})")
            _REGISTRY[p] = fn
        return fn

    return wrap


def _packets(*names):
    """aten packets that exist in this torch build (some ops are newer or CUDA-only)."""
    return tuple(getattr(aten, n) for n in names if hasattr(aten, n))


def _eb(t: TensorMeta) -> int:
    return t.elem_bytes


def _distinct(t: Optional[TensorMeta]) -> int:
    """Distinct elements of an (index) tensor; 0 when absent."""
    if t is None:
        return 0
    return t.numel if t.distinct < 0 else t.distinct


# ---------------------------------------------------------------------------------- matmuls

@register(*_packets("_grouped_mm"))
def _grouped_mm(c: OpCall):
    """torch._grouped_mm (output shapes as torch's meta kernel: _create_grouped_mm_output_tensor).
    MACs: every output element is a K-term dot product, K = a.shape[-1] -- except 2D x 2D, where
    offsets split K_total into G groups and out is (G, M, N): M*K_total*N (each k in one group)."""
    a, b, out = c.args[0], c.args[1], c.outputs[0]
    if len(a.shape) == 2 and len(b.shape) == 2:
        macs = a.shape[0] * a.shape[1] * b.shape[1]
    else:
        macs = out.numel * a.shape[-1]
    return F.grouped_matmul(macs, a.numel, b.numel, out.numel, a_grad=a.requires_grad, b_grad=b.requires_grad,
                            elem_bytes=_eb(a))


@register(aten.mm)
def _mm(c: OpCall):
    a, b = c.args[0], c.args[1]
    (m, k), n = a.shape, b.shape[1]
    return F.matmul(m, k, n, a_grad=a.requires_grad, b_grad=b.requires_grad, elem_bytes=_eb(a))


@register(aten.addmm)
def _addmm(c: OpCall):
    bias, a, b = c.args[0], c.args[1], c.args[2]
    (m, k), n = a.shape, b.shape[1]
    return F.matmul(m, k, n, a_grad=a.requires_grad, b_grad=b.requires_grad, bias=True,
                    bias_grad=bias.requires_grad, elem_bytes=_eb(a))


@register(aten.bmm)
def _bmm(c: OpCall):
    a, b = c.args[0], c.args[1]
    batch, m, k = a.shape
    return F.matmul(m, k, b.shape[2], batch=batch, a_grad=a.requires_grad, b_grad=b.requires_grad,
                    elem_bytes=_eb(a))


@register(aten.baddbmm)
def _baddbmm(c: OpCall):
    bias, a, b = c.args[0], c.args[1], c.args[2]
    batch, m, k = a.shape
    return F.matmul(m, k, b.shape[2], batch=batch, a_grad=a.requires_grad, b_grad=b.requires_grad,
                    bias=True, bias_grad=bias.requires_grad, elem_bytes=_eb(a))


@register(*_packets("convolution", "_convolution", "cudnn_convolution", "_slow_conv2d_forward",
                    "convolution_overrideable", "mkldnn_convolution"))
def _conv(c: OpCall):
    x, w, bias = c.args[0], c.args[1], c.arg(2)
    transposed = bool(c.arg(6, "transposed", False)) if c.name in ("convolution", "_convolution") else False
    groups = c.arg(8, "groups", 1) if c.name in ("convolution", "_convolution") else 1
    out = c.outputs[0]
    c_out = w.shape[1] * groups if transposed else w.shape[0]
    matmul_path = is_matmul_path_conv(c)
    return F.conv(x.shape[0], x.shape[1], c_out, math.prod(w.shape[2:]), math.prod(out.shape[2:]),
                  math.prod(x.shape[2:]), groups=groups, bias=isinstance(bias, TensorMeta),
                  transposed=transposed, x_grad=x.requires_grad, w_grad=w.requires_grad,
                  elem_bytes=_eb(x), reorder=not matmul_path, per_sample=matmul_path)


def is_matmul_path_conv(c: OpCall) -> bool:
    """A convolution torch runs on a CPU thread as one matrix product per sample (class ``convolution_1x1``:
    ``_is_1x1_matmul_path``), not through oneDNN."""
    if c.name not in ("convolution", "_convolution") or len(c.args) < 2 or not isinstance(c.args[1], TensorMeta):
        return False
    return (int(c.arg(8, "groups", 1) or 1) == 1 and not bool(c.arg(6, "transposed", False))
            and _is_1x1_matmul_path(c, c.args[1]))


def matmul_path_min_dim(c: OpCall) -> float:
    """The smallest dimension of the per-sample GEMMs of a matmul-path convolution (``is_matmul_path_conv``):
    min(output pixels, C_in, C_out), the same three dimensions in the forward (HW x C_in @ C_in x C_out) and both
    backward GEMMs; NaN for any other op."""
    if not is_matmul_path_conv(c):
        return float("nan")
    return float(min(math.prod(c.outputs[0].shape[2:]), c.args[0].shape[1], c.args[1].shape[0]))


def sdpa_cost(q: TensorMeta, k: TensorMeta, v: TensorMeta, causal=False) -> F.OpCost:
    """F.scaled_dot_product_attention on (..., heads, seq, dim) tensors, fused kernel semantics."""
    *lead, s_q, d = q.shape
    batch_heads = math.prod(lead)
    kv_heads_ratio = math.prod(k.shape[:-2]) / batch_heads
    grad = q.requires_grad or k.requires_grad or v.requires_grad
    return F.attention(batch_heads, 1, s_q, k.shape[-2], d, v.shape[-1], kv_heads=kv_heads_ratio,
                       causal=causal, grad=grad, elem_bytes=_eb(q))


@register(*_packets("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                    "_scaled_dot_product_fused_attention_overrideable"))
def _sdpa(c: OpCall):
    # NB(perfcheck): causal flag is counted in full, like FlopCounterMode; see estimate(causal=...).
    return sdpa_cost(c.args[0], c.args[1], c.args[2])


# --------------------------------------------------------------------------- normalisations

@register(aten.native_layer_norm)
def _layer_norm(c: OpCall):
    x, shape, w, b = c.args[0], c.args[1], c.arg(2), c.arg(3)
    cols = math.prod(shape)
    affine = isinstance(w, TensorMeta)
    return F.layer_norm(x.numel // cols, cols, affine=affine, bias=isinstance(b, TensorMeta),
                        x_grad=x.requires_grad, w_grad=affine and w.requires_grad, elem_bytes=_eb(x))


@register(*_packets("_fused_rms_norm", "rms_norm"))
def _rms_norm(c: OpCall):
    x, shape, w = c.args[0], c.args[1], c.arg(2)
    cols = math.prod(shape)
    affine = isinstance(w, TensorMeta)
    return F.layer_norm(x.numel // cols, cols, affine=affine, bias=False, rms=True,
                        x_grad=x.requires_grad, w_grad=affine and w.requires_grad, elem_bytes=_eb(x))


@register(*_packets("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                    "_native_batch_norm_legit_no_training", "cudnn_batch_norm", "miopen_batch_norm"))
def _batch_norm(c: OpCall):
    x, w = c.args[0], c.arg(1)
    if c.name == "_native_batch_norm_legit_no_training":
        training = False
    else:
        training = bool(next(a for a in c.args[3:] if isinstance(a, bool)))
    affine = isinstance(w, TensorMeta)
    return F.batch_norm(x.shape[0], x.shape[1], math.prod(x.shape[2:]), training=training, affine=affine,
                        x_grad=x.requires_grad, w_grad=affine and w.requires_grad, elem_bytes=_eb(x))


@register(aten.native_group_norm)
def _group_norm(c: OpCall):
    x, w = c.args[0], c.arg(1)
    n, ch, hxw, groups = c.args[3], c.args[4], c.args[5], c.args[6]
    affine = isinstance(w, TensorMeta)
    return F.group_norm(n, ch, hxw, groups, affine=affine, x_grad=x.requires_grad,
                        w_grad=affine and w.requires_grad, elem_bytes=_eb(x))


@register(*_packets("_softmax", "_log_softmax", "_safe_softmax"))
def _softmax(c: OpCall):
    x, dim = c.args[0], c.args[1]
    cols = x.shape[dim] if x.shape else 1
    rows, eb = x.numel // max(cols, 1), _eb(c.outputs[0])
    if c.name == "_safe_softmax":  # four kernels: softmax, eq(-inf), all, where (formulas.safe_softmax)
        return F.safe_softmax(rows, cols, x_grad=x.requires_grad, elem_bytes=eb)
    return F.softmax(rows, cols, x_grad=x.requires_grad, elem_bytes=eb, log=c.name == "_log_softmax")


@register(aten.native_dropout)
def _dropout(c: OpCall):
    x, train = c.args[0], c.arg(2, "train", True)
    return F.dropout(x.numel, training=bool(train) if train is not None else True,
                     x_grad=x.requires_grad, elem_bytes=_eb(x))


#: Ops that draw random numbers (torch's CPU dropout runs empty_like(x).bernoulli_(1 - p), div_ and mul).
_RNG_OPS = ("bernoulli", "bernoulli_", "uniform_", "normal_", "rand", "randn", "rand_like", "randn_like", "randint",
            "randint_like", "random_", "exponential_", "geometric_", "log_normal_", "cauchy_", "randperm")


@register(*_packets(*_RNG_OPS))
def _rng(c: OpCall):
    out = c.outputs[0] if c.outputs else None
    return F.rng(out.numel if out is not None else 0, elem_bytes=out.elem_bytes if out is not None else 4)


_ACTIVATIONS = {
    "relu": "relu", "relu_": "relu", "gelu": "gelu", "gelu_": "gelu", "silu": "silu", "silu_": "silu",
    "sigmoid": "sigmoid", "sigmoid_": "sigmoid", "tanh": "tanh", "tanh_": "tanh", "hardtanh": "hardtanh",
    "hardtanh_": "hardtanh", "leaky_relu": "leaky_relu", "leaky_relu_": "leaky_relu", "elu": "elu",
    "elu_": "elu", "hardswish": "hardswish", "hardswish_": "hardswish", "hardsigmoid": "hardsigmoid",
    "mish": "mish", "softplus": "softplus", "threshold": "threshold", "threshold_": "threshold",
    "celu": "celu", "selu": "selu",
}


@register(*_packets(*_ACTIVATIONS))
def _activation(c: OpCall):
    x = c.args[0]
    return F.activation(x.numel, _ACTIVATIONS[c.name], x_grad=x.requires_grad, elem_bytes=_eb(x))


# ------------------------------------------------------------------------------- pooling

@register(*_packets("max_pool2d_with_indices", "max_pool3d_with_indices", "max_pool1d", "max_pool2d",
                    "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d", "_adaptive_avg_pool2d",
                    "_adaptive_avg_pool3d", "adaptive_max_pool2d", "adaptive_max_pool3d", "adaptive_avg_pool1d",
                    "adaptive_max_pool1d"))
def _pool(c: OpCall):
    x, out = c.args[0], c.outputs[0]
    nd = len(out.shape) - 2 if len(out.shape) >= 3 else 1
    in_spatial, out_spatial = math.prod(x.shape[-nd:]), math.prod(out.shape[-nd:])
    kernel = c.arg(1)
    if "adaptive" in c.name:  # window ~ input/output per dim, rounded up
        kernel_numel = math.prod(-(-a // b) for a, b in zip(x.shape[-nd:], out.shape[-nd:]))
    else:
        ks = list(kernel) if isinstance(kernel, (list, tuple)) else [kernel]
        kernel_numel = math.prod(ks * (nd if len(ks) == 1 else 1))
    lead = math.prod(x.shape[:-nd])
    return F.pool(lead, 1, out_spatial, in_spatial, kernel_numel, kind="max" if "max" in c.name else "avg",
                  x_grad=x.requires_grad, elem_bytes=_eb(x))


# ------------------------------------------------------------------- embedding / indexing

@register(aten.embedding)
def _embedding(c: OpCall):
    w, idx = c.args[0], c.args[1]
    return F.embedding(idx.numel, w.shape[1], w.shape[0], w_grad=w.requires_grad, elem_bytes=_eb(w),
                       index_bytes=idx.elem_bytes)


@register(*_packets("index_select", "gather", "index", "_unsafe_index", "take_along_dim"))
def _gather(c: OpCall):
    x, out = c.args[0], c.outputs[0]
    idx = next((t for t in c.tensors()[1:] if not t.is_float), None)
    return F.gather(out.numel, _distinct(idx), x_grad=x.requires_grad, elem_bytes=_eb(out),
                    index_bytes=idx.elem_bytes if idx else 8)


@register(*_packets("scatter_add", "scatter_add_", "index_add", "index_add_", "scatter_reduce",
                    "scatter_reduce_", "index_put", "index_put_", "scatter", "scatter_", "index_reduce",
                    "index_reduce_", "_index_put_impl_"))
def _scatter(c: OpCall):
    tensors = c.tensors()
    src = max(tensors[1:], key=lambda t: t.numel * t.is_float, default=tensors[0])
    idx = next((t for t in tensors[1:] if not t.is_float), None)
    grad = any(t.requires_grad for t in tensors if t.is_float)
    return F.gather(src.numel, _distinct(idx), x_grad=grad, elem_bytes=_eb(src),
                    index_bytes=idx.elem_bytes if idx else 8, accumulate=True)


@register(*_packets("_embedding_bag", "_embedding_bag_forward_only"))
def _embedding_bag(c: OpCall):
    w, idx = c.args[0], c.args[1]
    offsets = c.arg(2, "offsets")
    bags = c.outputs[0].shape[0] if c.outputs and c.outputs[0].shape else (offsets.numel if offsets else 1)
    return F.embedding_bag(idx.numel, bags, w.shape[1], w.shape[0], w_grad=w.requires_grad, elem_bytes=_eb(w),
                           index_bytes=idx.elem_bytes, mode=int(c.arg(4, "mode", 0) or 0))


# -------------------------------------------------------------------------- recurrent layers

_RNN_GATES = {0: 1, 1: 1, 2: 4, 3: 3}  # mkldnn/cuDNN modes: RNN_RELU, RNN_TANH, LSTM, GRU


@register(*_packets("mkldnn_rnn_layer"))
def _mkldnn_rnn(c: OpCall):
    """One oneDNN LSTM layer and direction (the only recurrent layer torch's CPU build sends to oneDNN: RNN.cpp's
    ``lstm`` calls ``lstm_mkldnn_stub``; GRU and Elman RNN run ``_rnn_impl``'s per-step ``linear`` and gate ops,
    each traced and priced as itself). Its input is always time-major, (steps, batch, features): mkldnn/RNN.cpp's
    ``mkldnn_impl`` transposes a batch-first input and makes it contiguous *before* calling the op, and passes
    ``batch_first`` along only as a flag (arg 14) that no longer describes the tensor; reading it swapped the
    steps and the batch (an 8 x 32 batch-first LSTM LM was priced as 8 steps of batch 32)."""
    x, w_ih = c.args[0], c.args[1]
    steps, batch = (x.shape[0], x.shape[1]) if len(x.shape) == 3 else (1, x.shape[0] if len(x.shape) == 2 else 1)
    hidden = int(c.args[10])
    return F.rnn(steps, batch, x.shape[-1], hidden, w_ih.shape[0] // hidden, x_grad=x.requires_grad,
                 w_grad=w_ih.requires_grad, bias=bool(c.args[12]), elem_bytes=_eb(x))


@register(*_packets("_cudnn_rnn", "miopen_rnn"))
def _cudnn_rnn(c: OpCall):
    x, weights = c.args[0], c.args[1]
    mode = int(c.args[6] if c.name == "_cudnn_rnn" else c.args[5])
    hidden, layers = int(c.args[7] if c.name == "_cudnn_rnn" else c.args[6]), int(c.arg(9 if c.name == "_cudnn_rnn" else 7))
    batch_first = bool(c.arg(10 if c.name == "_cudnn_rnn" else 8))
    bidirectional = bool(c.arg(13 if c.name == "_cudnn_rnn" else 11))
    steps, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    gates, dirs = _RNN_GATES[mode], 1 + bidirectional
    has_bias = len(weights) == 4 * layers * dirs
    total = F.OpCost()
    for layer in range(layers):  # layer l > 0 reads the previous layer's (dirs*hidden) outputs
        in_size = x.shape[-1] if layer == 0 else hidden * dirs
        total = total + F.rnn(steps, batch, in_size, hidden, gates, x_grad=x.requires_grad or layer > 0,
                              w_grad=weights[0].requires_grad, bias=has_bias, elem_bytes=_eb(x), directions=dirs)
    return total


# ------------------------------------------------------------------------ losses / copies

@register(*_packets("nll_loss_forward", "nll_loss2d_forward"))
def _nll(c: OpCall):
    x, target = c.args[0], c.args[1]
    rows = target.numel
    # each row is one element read (fwd) or written (bwd) at its target's index: a row of length 1
    fwd = F.Cost(flops=rows, bytes=rows * (_eb(x) + target.elem_bytes) + _eb(x), kernels=1, rows=rows, row_elems=rows)
    bwd = F.Cost(bytes=x.numel * _eb(x) + rows * target.elem_bytes, kernels=1, rows=rows, row_elems=rows)
    return F.OpCost(fwd, bwd.scale(x.requires_grad), 0, 0)


# ------------------------------------------------------------------- views whose backward runs kernels
# A view's forward is metadata, but autograd's formula for some views builds the input's gradient with kernels
# (torch/csrc/autograd/FunctionsManual.cpp); their forward stays a view for the host terms (``is_view_op``).

@register(*_packets("select", "slice", "diagonal", "as_strided", "unfold"))
def _view_scatter(c: OpCall):
    x = c.args[0]
    return F.view_scatter(x.numel, c.outputs[0].numel, x_grad=x.requires_grad, elem_bytes=_eb(x))


@register(*_packets("split", "split_with_sizes", "chunk", "unbind"))
def _view_gather(c: OpCall):
    x = c.args[0]
    return F.view_gather(x.numel, x_grad=x.requires_grad, elem_bytes=_eb(x))


@register(aten.expand)
def _expand(c: OpCall):
    x = c.args[0]
    return F.view_reduce(x.numel, c.outputs[0].numel, x_grad=x.requires_grad, elem_bytes=_eb(x))


def is_view_op(c: OpCall) -> bool:
    """True when the op's forward only makes a view (aliasing output, an in-place view, or a zero-cost op):
    no kernel and a view's dispatch in the forward, whatever its backward runs."""
    return (_is_view(c.func) or torch.Tag.inplace_view in getattr(c.func, "tags", ())
            or c.func.overloadpacket in ZERO_COST_OPS)


#: Copies whose backward runs no kernel (derivatives.yaml): ``clone`` passes the gradient through; ``cat`` /
#: ``stack`` hand each input a narrow / select view of it; ``constant_pad_nd``'s backward is a narrow of it;
#: ``_to_copy`` to the same element size returns it (a cast back otherwise).
_GRAD_PASSTHROUGH = frozenset(("clone", "contiguous", "cat", "stack", "constant_pad_nd"))


@register(*_packets("clone", "_to_copy", "copy_", "contiguous", "cat", "stack", "repeat", "constant_pad_nd",
                    "flip", "roll", "expand_copy", "permute_copy", "_reshape_copy", "tril", "triu",
                    "reflection_pad1d", "reflection_pad2d", "reflection_pad3d", "replication_pad1d",
                    "replication_pad2d", "replication_pad3d", "pixel_shuffle", "pixel_unshuffle",
                    "channel_shuffle", "im2col", "col2im"))
def _copy(c: OpCall):
    ins = [t for t in c.tensors() if t.is_float or not c.outputs[0].is_float]
    src = sum(t.numel * t.elem_bytes for t in ins[1:] if c.name == "copy_") if c.name == "copy_" else \
        sum(t.numel * t.elem_bytes for t in ins)
    out = c.outputs[0]
    grad = any(t.requires_grad for t in c.tensors())
    cost = F.copy(src, out.numel * out.elem_bytes, x_grad=grad, elem_bytes=1, out_elem_bytes=1)
    # off a GPU's vectorised loop (predict.strided): a broadcast or strided source, or a float widened on load;
    # a narrowing cast's backward widens
    sources = [t for t in (ins[1:] if c.name == "copy_" else ins) if t.numel > 0]
    widen = [t.is_float and out.is_float and t.elem_bytes < out.elem_bytes for t in sources]
    if any(w or t.off_vector_loop(out.numel) for t, w in zip(sources, widen)):
        cost = replace(cost, fwd=replace(cost.fwd, strided_elems=out.numel, strided_bytes=cost.fwd.bytes))
    if c.name == "_to_copy" and any(t.is_float and out.is_float and t.elem_bytes > out.elem_bytes for t in sources):
        cost = replace(cost, bwd=replace(cost.bwd, strided_elems=out.numel * grad, strided_bytes=cost.bwd.bytes))
    if c.name in _GRAD_PASSTHROUGH or (c.name == "_to_copy" and ins and ins[0].elem_bytes == out.elem_bytes):
        return F.OpCost(cost.fwd, F.ZERO, cost.act_mem, cost.params)
    return cost


#: FLOPs per output element of an interpolation (weights x neighbours, plus index arithmetic).
_UPSAMPLE_FLOPS = {"nearest": 0, "linear": 4, "bilinear": 11, "trilinear": 23, "bicubic": 48}


@register(*_packets("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
                    "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d",
                    "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bilinear2d_aa",
                    "_upsample_bicubic2d_aa"))
def _upsample(c: OpCall):
    x, out = c.args[0], c.outputs[0]
    kind = next(k for k in ("nearest", "trilinear", "bilinear", "bicubic", "linear") if k in c.name)
    flops = _UPSAMPLE_FLOPS[kind]
    fwd = F.Cost(flops=out.numel * flops, bytes=(x.numel + out.numel) * _eb(x), kernels=1)
    bwd = F.Cost(flops=out.numel * max(flops, 1), bytes=(out.numel + x.numel) * _eb(x), kernels=2)
    return F.OpCost(fwd, bwd.scale(x.requires_grad), 0, 0)


#: Ops that launch no compute kernel worth modelling (allocation without initialisation,
#: metadata, RNG state). Factory ops that *fill* memory (zeros, ones, full) are costed as writes.
ZERO_COST_OPS = frozenset(_packets(
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "lift_fresh",
    "_local_scalar_dense", "resize_", "set_", "sym_size", "sym_stride", "is_same_size", "alias",
    "_has_compatible_shallow_copy_type", "to", "lift_fresh_copy", "scalar_tensor", "_assert_async",
    "_unsafe_view",  # a view that autograd treats as a fresh tensor: still no kernel
    "transpose_", "t_", "unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk", "squeeze_", "unsqueeze_",
))

_FILL_OPS = frozenset(_packets("zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "fill_",
                               "zero_", "new_zeros", "new_ones", "new_full", "arange"))


def _is_view(func) -> bool:
    if getattr(func, "is_view", False):
        return True
    rets = func._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


def _write_only(c: OpCall) -> F.OpCost:
    written = sum(t.numel * t.elem_bytes for t in c.outputs)
    return F.OpCost(F.Cost(bytes=written, kernels=1 if written else 0))


#: Ops whose backward hands the output's gradient on as each input's (AddBackward0, SubBackward0: ``grad`` and
#: ``maybe_multiply(grad, alpha)``, which returns it unchanged for alpha 1, torch/csrc/autograd/FunctionsManual.cpp).
_GRAD_IS_THE_OUTPUTS = frozenset(("add", "add_", "sub", "sub_"))


def _add_backward(c: OpCall, ins, out) -> F.Cost:
    """add's and sub's backward: no kernel for an input of the output's shape (autograd passes the same gradient
    on; summing it with another gradient of that input is the engine's add, ``grad_accumulation``); an input
    broadcast to the output gets it summed back to its shape (``sum_to_size``: a reduction over the output's
    gradient); sub's second input, or an input scaled by an ``alpha`` other than 1, gets one pointwise kernel."""
    alpha = c.arg(2, "alpha", 1)
    flops = nbytes = kernels = 0
    for i, t in enumerate(ins):
        if not (t.is_float and t.requires_grad):
            continue
        if t.numel < out.numel:  # sum_to_size
            flops, nbytes, kernels = flops + out.numel, nbytes + (out.numel + t.numel) * out.elem_bytes, kernels + 1
        elif i == 1 and (c.name.startswith("sub") or alpha != 1):  # -grad, alpha * grad
            flops, nbytes, kernels = flops + out.numel, nbytes + 2 * out.numel * out.elem_bytes, kernels + 1
    return F.Cost(flops=flops, bytes=nbytes, kernels=kernels)


#: (kernels, passes of the output's size) of the one-input pointwise backwards autograd runs in several kernels
#: (``_several_kernel_backward``'s table; eager_ops' RMSNorm parts read the same numbers).
SEVERAL_KERNEL_BACKWARD = {"pow": (3, 7), "rsqrt": (3, 7), "sqrt": (2, 5)}


def _several_kernel_backward(c: OpCall, ins, out) -> Optional[F.Cost]:
    """The backward of a pointwise op whose derivative autograd computes in several full-size kernels
    (tools/autograd/derivatives.yaml and FunctionsManual.cpp; each checked against torch.profiler, CPU, torch 2.13:
    tests/predict/test_pointwise_backward.py), as (kernels, passes of the output's size): a pass reads or writes one
    tensor of the output's elements. None: the one-kernel rule of ``_pointwise``.

      pow(x, scalar e)   grad * (e * x.pow(e - 1))          pow (a copy for e = 2), e *, grad *:  3 kernels, 7 passes
      rsqrt(x)           -0.5 * grad * result.pow(3)        -0.5 *, pow, *:                        3 kernels, 7 passes
      sqrt(x)            grad / (2 * result)                2 *, /:                                2 kernels, 5 passes
      div(a, b)          a: grad / b; b: -grad * ((a / b) / b)   a: 1 kernel, 3 passes; b: 4, 11 (-, /, /, *)

    Why: pricing these as one kernel of 3 passes left an eager RMSNorm's backward (x.pow(2)) 2 kernels and 4 passes
    short per norm; on an H200 torchtitan block those were the pow backward's copy and scalar product kernels that no
    row priced (bench/gpu_results/2026-11-27-layers/layers_h200_kernels.csv)."""
    grads = [bool(t.is_float and t.requires_grad) for t in ins]
    base = c.name.rstrip("_")
    scalar_pow = base != "pow" or (len(c.args) > 1 and not isinstance(c.args[1], TensorMeta))
    if base in SEVERAL_KERNEL_BACKWARD and scalar_pow and grads[:1] == [True]:
        kernels, passes = SEVERAL_KERNEL_BACKWARD[base]
    elif c.name in ("div", "div_") and len(ins) == 2 and ins[0].numel == ins[1].numel == out.numel and any(grads):
        kernels, passes = grads[0] * 1 + grads[1] * 4, grads[0] * 3 + grads[1] * 11
    else:
        return None
    return F.Cost(flops=out.numel * kernels, bytes=passes * out.numel * out.elem_bytes, kernels=kernels)


def _broadcast_sums(ins, out) -> F.Cost:
    """A broadcast operand's gradient is the full-size product summed back to its shape (autograd's
    ``sum_to_size``): a reduction kernel of its own after the product (torch.profiler: ``mul`` then ``sum`` for the
    weight of ``x * w``, CPU and CUDA alike), reading the product and writing the operand's elements."""
    small = [t for t in ins if t.is_float and t.requires_grad and t.numel < out.numel]
    return F.Cost(flops=out.numel * len(small), kernels=len(small),
                  bytes=sum(out.numel + t.numel for t in small) * out.elem_bytes)


def _pointwise(c: OpCall) -> F.OpCost:
    """Any op tagged pointwise (add, mul, div, pow, where, masked_fill, ...): 1 FLOP per output; backward one kernel per
    input needing a gradient, except the ops whose derivative runs several (``_several_kernel_backward``)."""
    ins = [t for t in c.tensors()]
    out = c.outputs[0] if c.outputs else None
    if out is None:
        return F.OpCost()
    grad_inputs = sum(t.requires_grad for t in ins if t.is_float)
    in_bytes = sum(t.nbytes_read for t in ins)
    saves = 0 if c.name in ("add", "add_", "sub", "sub_", "neg", "clone") else len(ins)
    fwd = F.Cost(flops=out.numel, bytes=in_bytes + out.numel * out.elem_bytes, kernels=1)
    bwd = (_add_backward(c, ins, out) if c.name in _GRAD_IS_THE_OUTPUTS else
           _several_kernel_backward(c, ins, out) or
           F.Cost(flops=out.numel * grad_inputs, bytes=(out.numel * (1 + grad_inputs) + saves * out.numel) * out.elem_bytes,
                  kernels=grad_inputs) + _broadcast_sums(ins, out))
    if any(t.off_vector_loop(out.numel) for t in ins):  # a broadcast or strided operand (predict.strided)
        fwd = replace(fwd, strided_elems=out.numel, strided_bytes=fwd.bytes)
        # the gradient of each full-size operand reads the broadcast one (g * w); add/sub's pass through
        full = (saves > 0) * sum(t.requires_grad and t.is_float and not t.off_vector_loop(out.numel) for t in ins)
        bwd = replace(bwd, strided_elems=full * out.numel, strided_bytes=full * 3 * out.numel * out.elem_bytes)
    return F.OpCost(fwd, bwd, (saves * out.numel * out.elem_bytes) * (grad_inputs > 0), 0)


def _reduction(c: OpCall) -> F.OpCost:
    x = c.tensors()[0]
    out_numel = sum(t.numel for t in c.outputs[:1])
    per = 3 if c.name in ("var", "std", "var_mean", "std_mean", "logsumexp", "norm", "linalg_vector_norm") else 1
    cost = F.reduction(x.numel, out_numel, x_grad=x.requires_grad, elem_bytes=_eb(x), flops_per_elem=per)
    # backward broadcasts grad_out back over x's shape: off a GPU's vectorised loop (predict.strided)
    return replace(cost, bwd=replace(cost.bwd, strided_elems=x.numel * x.requires_grad, strided_bytes=cost.bwd.bytes))


def _counted(c: OpCall, formula) -> F.OpCost:
    """An op torch.utils.flop_counter knows and we don't: its forward count, backward as 2x
    (a matrix product's two gradients), bytes of inputs and outputs."""
    shapes = [list(a.shape) if isinstance(a, TensorMeta) else a for a in c.args]
    out_shape = [list(t.shape) for t in c.outputs] if len(c.outputs) > 1 else list(c.outputs[0].shape)
    flops = formula(*shapes, **c.kwargs, out_shape=out_shape)
    io = sum(t.numel * t.elem_bytes for t in c.tensors()) + sum(t.numel * t.elem_bytes for t in c.outputs)
    grad = any(t.requires_grad for t in c.tensors())
    return F.OpCost(F.Cost(macs=flops / 2, bytes=io, kernels=1),
                    F.Cost(macs=flops, bytes=2 * io, kernels=2).scale(grad), 0, 0)


def _memory_only(c: OpCall) -> F.OpCost:
    io = sum(t.numel * t.elem_bytes for t in c.tensors()) + sum(t.numel * t.elem_bytes for t in c.outputs)
    grad = any(t.requires_grad for t in c.tensors())
    return F.OpCost(F.Cost(bytes=io, kernels=1), F.Cost(bytes=io, kernels=1).scale(grad), 0, 0)


def cost_of(c: OpCall) -> Resolved:
    """Resolve one traced op to a cost (see the module docstring for the order)."""
    packet = c.func.overloadpacket
    fn: Optional[Callable] = _REGISTRY.get(packet)
    if fn is not None:
        return Resolved(fn(c), "modeled")
    tags = getattr(c.func, "tags", ())
    if c.func.namespace == "prim" or is_view_op(c):
        return Resolved(F.OpCost(), "free")  # inplace_view: as_strided_, transpose_, ... change metadata only
    functional = _functional_twin(c)
    if functional is not None:  # masked_fill_ -> masked_fill: same work, written in place
        return cost_of(functional)
    if packet in _FILL_OPS:
        return Resolved(_write_only(c), "modeled")
    if torch.Tag.pointwise in tags:
        return Resolved(_pointwise(c), "modeled")
    if torch.Tag.reduction in tags:
        return Resolved(_reduction(c), "modeled")
    from torch.utils.flop_counter import flop_registry

    if packet in flop_registry and c.outputs:
        return Resolved(_counted(c, flop_registry[packet]), "counted")
    return Resolved(_memory_only(c), "unmodeled")


_INPLACE_TAG = getattr(torch.Tag, "inplace", None)


def _functional_twin(c: OpCall) -> Optional[OpCall]:
    """The out-of-place overload of an in-place op (``x.masked_fill_(m, v)`` -> ``masked_fill``),
    when it exists with the same arguments: in-place variants often lack the ``pointwise`` tag
    their functional twin carries, and otherwise fall through to 'unmodeled'."""
    name = c.name
    if not name.endswith("_") or name.startswith("_"):
        return None
    if _INPLACE_TAG is not None and _INPLACE_TAG not in getattr(c.func, "tags", ()):
        return None  # NB: torch < 2.12 has no Tag.inplace (seen on 2.11 on the GPU run): the name decides
    packet = getattr(aten, name[:-1], None)
    overload = getattr(packet, c.func._overloadname, None) if packet is not None else None
    if overload is None:
        return None
    return OpCall(overload, c.args, c.kwargs, c.outputs)


#: Suffix of a depthwise convolution class on a channels-last operand (``op_class``).
NHWC_SUFFIX = "_nhwc"


def op_class(c: OpCall) -> str:
    """The op's efficiency class: the key its ``op_efficiency`` is looked up under first (then its name), for op
    families whose CPU kernels run at different rates by shape (``perfcheck calibrate``'s op-class cases,
    perfcheck/calibrate/op_classes.py, measure each):

      convolution   ``convolution_depthwise`` (groups == C_in > 1: one filter per channel, MobileNet's 3x3;
                    ``convolution_depthwise_large`` above 3x3, 5x5 and 7x7: their backward leaves oneDNN's 3x3
                    kernel, 0.7 ns per MAC against 0.26-0.5 on the project's Xeon),
                    each with ``_nhwc`` appended where the input or weight is channels-last
                    (``TensorMeta.channels_last``: torch then runs oneDNN's NHWC kernels, jit:avx512_core's weight
                    gradient in place of the per-(sample, channel) GEMMs; 1.3-2.6x faster per phase on the
                    project's Xeon, bench/results/depthwise_law.md section 5; torchvision's ConvNeXt feeds its 7x7
                    depthwise convolutions the channels-last output of its permuted LayerNorm and layer scale),
                    ``convolution_grouped`` (1 < groups < C_in: ResNeXt, ShuffleNet's grouped 1x1),
                    ``convolution_transposed``; ``convolution_1x1`` for a 1x1 kernel, stride 1, no dilation,
                    batch < 16 (torch's ConvParams::use_mkldnn sends it to the matmul path, not oneDNN, on one
                    thread: 4.5 us forward for a tiny call where a oneDNN call takes 57-100 us on the project's
                    Xeon); with input or output channels not multiples of 8 (3 or 6: the LeNet-size case, padded
                    and reordered) ``convolution``; else ``convolution_1d`` (one spatial dim) or
                    ``convolution_wide`` (2-D: oneDNN's blocked layouts take the channels as they are).
                    Each class has its own fixed cost per call (op_fixed_s[<class>], and <class>:bwd for the
                    backward: calibration's tiny call of the class, op_classes.conv_fixed_cases)
      gelu          ``gelu_tanh`` for approximate="tanh" (a polynomial and tanh, not erf)
      embedding bag ``_embedding_bag`` (sum), ``_embedding_bag_mean``, ``_embedding_bag_max`` (``embedding_bag_class``),
                    each with its fixed cost per call (op_fixed_s[<class>], <class>:bwd:
                    index_cases.embedding_bag_fixed_cases); max's rate: index_cases.embedding_bag_max_cases
      softmax       ``softmax_block`` (``softmax_class``): rows CUDA's softmax runs with its block kernels, not one warp
                    per row
      others        the op's name
    """
    if c.name in ("convolution", "_convolution") and len(c.args) > 1 and isinstance(c.args[1], TensorMeta):
        x, w = c.args[0], c.args[1]
        groups = int(c.arg(8, "groups", 1) or 1)
        if bool(c.arg(6, "transposed", False)):
            return "convolution_transposed"
        if groups > 1 and groups == x.shape[1]:
            depthwise = "convolution_depthwise" if math.prod(w.shape[2:]) <= 9 else "convolution_depthwise_large"
            return depthwise + NHWC_SUFFIX if (x.channels_last or w.channels_last) else depthwise
        if groups > 1:
            return "convolution_grouped"
        if _is_1x1_matmul_path(c, w):
            return "convolution_1x1"
        if x.shape[1] % 8 or w.shape[0] % 8:
            return "convolution"
        return "convolution_1d" if len(x.shape) == 3 else "convolution_wide"
    if c.name in ("gelu", "gelu_") and c.arg(1, "approximate", "none") == "tanh":
        return "gelu_tanh"
    if c.name in ("_embedding_bag", "_embedding_bag_forward_only"):
        return embedding_bag_class(int(c.arg(4, "mode", 0) or 0))
    if c.name in ("_softmax", "_log_softmax") and c.args and isinstance(c.args[0], TensorMeta):
        return softmax_class(c.args[0], int(c.arg(1, "dim", -1)), c.name)
    return c.name


#: CUDA's softmax keeps a row in one warp's registers (``dispatch_softmax_forward``) only while it has at most this
#: many elements and bytes (aten/src/ATen/native/cuda/SoftMax.cu, ``host_softmax``: ``dim_size <= 1024 &&
#: dim_size*sizeof(scalar_t) <= 4096``, the last dimension, inner size 1); longer rows run the block kernels
#: (``cunn_SoftMaxForward``/``...Smem``, ``cunn_SoftMaxBackward``), which an H100 ran at 0.50 of its bandwidth on
#: 2048-column fp16 rows where a copy moves 0.89 (bench/results/elementwise_gpu.md).
SOFTMAX_WARP_ELEMENTS, SOFTMAX_WARP_BYTES = 1024, 4096


def softmax_class(x: TensorMeta, dim: int, name: str = "_softmax") -> str:
    """``softmax_block`` for a (log-)softmax over the last dimension whose rows exceed the warp kernel's limits
    (``SOFTMAX_WARP_ELEMENTS`` elements or ``SOFTMAX_WARP_BYTES`` bytes), else the op's ``name``. A spec without a
    ``softmax_block`` entry (every CPU spec) reads the op's own (``efficiency._class_keys``); torch's CPU softmax has
    no such split."""
    if not x.shape:
        return name
    d = dim % len(x.shape)
    cols = x.shape[d]
    last = math.prod(x.shape[d + 1:]) == 1
    return "softmax_block" if last and (cols > SOFTMAX_WARP_ELEMENTS or cols * x.elem_bytes > SOFTMAX_WARP_BYTES) \
        else name


def embedding_bag_class(mode: int) -> str:
    """The class of an ``_embedding_bag`` call by its ``mode`` (0 sum, 1 mean, 2 max): ``_embedding_bag``,
    ``_embedding_bag_mean``, ``_embedding_bag_max``. Why: their CPU paths differ (EmbeddingBag.cpp
    ``_embedding_bag_cpu_impl_out``): mean fills bag_size and divides each bag (a tiny call 19 us forward against
    sum's 11, beside a tiny add's 1.4, on the project's Xeon, 1 thread, process time, 2026-11-26); max runs a
    scalar loop per gathered element (``embedding_bag_cpu_max_out``: compare, store value and index), not
    fbgemm's vectorized kernel, and its backward one ``index_add_`` per column: 2218 us forward for 4096 indices of
    128 columns against sum's 78, 1237 us backward against 580 (2026-11-27, bench/results/embedding_classes.md).
    Calibration measures each class's fixed cost (index_cases.embedding_bag_fixed_cases) and max's rate
    (index_cases.embedding_bag_max_cases)."""
    return {1: "_embedding_bag_mean", 2: "_embedding_bag_max"}.get(mode, "_embedding_bag")


def _is_1x1_matmul_path(c: OpCall, w: TensorMeta) -> bool:
    """A 2-D convolution torch runs as a matrix product on a CPU thread, not through oneDNN: 1x1 kernel, stride 1,
    no dilation, batch < 16 (aten/src/ATen/native/Convolution.cpp, ConvParams::use_mkldnn: "For 1x1 filters,
    MKLDNN is faster than THNN when multi-threaded, but THNN is faster when single-threaded")."""
    x = c.args[0]
    if len(w.shape) != 4 or tuple(w.shape[2:]) != (1, 1) or x.shape[0] >= 16:
        return False
    stride, dilation = c.arg(3, "stride", [1]), c.arg(5, "dilation", [1])
    return all(int(s) == 1 for s in stride) and all(int(d) == 1 for d in dilation)


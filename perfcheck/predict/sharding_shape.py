"""The per-GPU shape of one micro-batch under tensor parallelism (``Shape``: Megatron 1D, or the 2D,
2.5D and 3D grids, ``grid_side``), what a sublayer is (``Sublayer``: its cost and the collectives it
issues, ``Collective``), the sublayer names, and the cost functions the 1D and the grid front-ends
share. The sublayers themselves: ``predict.sharding`` (1D) and ``predict.sharding_grid``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Tuple

import numpy as np

from perfcheck.predict import formulas as F
from perfcheck.predict.eager_ops import eager_rms_norm_parts, total as eager_total
from perfcheck.predict.collectives import COLLECTIVE_KINDS



#: The unfused attention core: what selective recompute recomputes (Korthikanti et al. 2022, 5.1).
CORE_ATTENTION = ("logits", "softmax", "dropout_softmax", "attend", "core_attention")


#: The collective kinds a sublayer issues: every kind of the one list (perfcheck.predict.collectives) but the
#: pipeline's point-to-point hand-offs (perfcheck.predict.pipeline costs those). all-to-all: MoE token dispatch;
#: broadcast and reduce: the SUMMA steps of 2D / 2.5D tensor parallelism.
SUBLAYER_KINDS = tuple(k for k in COLLECTIVE_KINDS if k != "sendrecv")


#: Tensor-parallel schemes (``tp_scheme``): Megatron 1D, and the grid schemes of ``grid_*`` below.
TP_SCHEMES = ("1d", "2d", "2.5d", "3d")


@dataclass(frozen=True)
class Collective:
    """One tensor-parallel collective a sublayer issues: phase, kind, full buffer bytes (array)."""

    phase: str  # "fwd" | "bwd"
    kind: str  # one of SUBLAYER_KINDS
    bytes: object
    group: str = "tp"  # which ranks: a key of Shape.group_sizes ("tp", "ep", "q", "d", "q2")
    #: the backward GEMM Megatron-LM runs it beside with ``async_op=True`` (``Options.tp_async_backward``):
    #: "dw" the weight-gradient GEMM, "dx" the input-gradient GEMM; "" none (on the critical path)
    beside: str = ""


@dataclass(frozen=True)
class Sublayer:
    """A row of the per-layer table: the formula used, its cost on this GPU, its collectives.

    ``stage``: "layer" (one per transformer layer), "first" (first pipeline stage only) or "last".
    ``recomputed_act``: activation bytes that selective recompute does not keep (the attention
    core's s x s tensors).
    """

    name: str
    formula: str
    cost: F.OpCost
    stage: str = "layer"
    comms: Tuple[Collective, ...] = ()
    recomputed_act: object = 0.0
    #: (m, k, n) of the row's GEMM (a: m x k, b: k x n; scalars or arrays), None for other rows: the
    #: roofline's matrix_shape_curve (by min(m, k, n)) and alignment factor (k, n) need them, as they
    #: need ``gemm_operands.gemm_min_dim`` / ``gemm_unaligned`` of the traced op in ``perfcheck.estimate``
    gemm: object = None
    #: (key length, head dim, causal) of a fused attention kernel's row, None for other rows: the roofline's
    #: ``attention_kernel_curve`` needs them, as ``perfcheck.estimate`` reads them off the traced SDPA op
    attention: object = None
    #: ((aten name, cost), ...) of kernels of other ops the row runs, inside ``cost``: each timed under its own op's
    #: efficiency (``row_times``), as ``perfcheck.estimate`` times that op (a norm's residual gradient sum: an add)
    parts: Tuple[Tuple[str, F.OpCost], ...] = ()


@dataclass(frozen=True)
class Shape:
    """Per-GPU sizes of one micro-batch; any field may be a numpy array (one entry per config)."""

    b: object  # micro-batch size
    s: object  # sequence length
    t: object  # tensor-parallel degree
    sp: object  # sequence parallelism on (bool array)
    elem_bytes: float  # activation / weight element size
    ep: int = 1  # expert-parallel degree (MoE): experts/ep experts per GPU
    scheme: str = "1d"  # tensor-parallel scheme, one of TP_SCHEMES
    depth: object = 1  # 2.5D: the depth d of the q x q x d grid (1 otherwise)

    @property
    def tokens(self):
        return self.b * self.s

    @property
    def norm_tokens(self):
        """Tokens in the norm/dropout/residual regions: T/t with SP, else T (replicated)."""
        return self.tokens / np.where(self.sp, self.t, 1)

    # ---- the grid schemes (2D, 2.5D, 3D): t = q*q, q*q*d, q**3 GPUs ----------------------------
    @property
    def grid(self) -> bool:
        return self.scheme != "1d"

    @property
    def q(self):
        """Side of the grid: sqrt(t) (2D), sqrt(t/d) (2.5D), cbrt(t) (3D); t for 1D."""
        return grid_side(self.t, self.scheme, self.depth)

    @property
    def row_split(self):
        """Ways the tokens (batch) are split: 1 (1D), q (2D), d*q (2.5D), q*q (3D)."""
        q = self.q
        return {"1d": 1, "2d": q, "2.5d": self.depth * q, "3d": q * q}[self.scheme]

    @property
    def b_local(self):
        """Sequences of the micro-batch on this GPU: b (1D), b / row_split (grid schemes)."""
        return self.b / self.row_split

    def inner(self, features):
        """Elements on this GPU of a (T, features) activation whose features are TP-split:
        T*features/t (1D: the MLP's inner activation, q/k/v), T/row_split * features/q (grid)."""
        if not self.grid:
            return self.tokens * features / self.t
        return self.tokens / self.row_split * features / self.q

    def local(self, features):
        """Elements on this GPU of a (T, features) residual-stream activation: Tn*features (1D:
        replicated, or sequence-split with SP), T/row_split * features/q (grid: split both ways)."""
        return self.inner(features) if self.grid else self.norm_tokens * features

    def group_sizes(self) -> dict:
        """Ranks in each kind of group a Collective names."""
        q = self.q
        return {"tp": self.t, "ep": self.ep, "q": q, "d": self.depth, "q2": q * q}

    def tp_bytes(self, elements, on):
        """Full-buffer bytes of a TP collective of ``elements`` elements, where ``on``; 0 at t = 1."""
        return elements * self.elem_bytes * (self.t > 1) * on


def grid_side(t, scheme, depth=1):
    """Side q of the grid: sqrt(t) (2D), sqrt(t/depth) (2.5D), cbrt(t) (3D), t (1D). Rounded:
    ``grid_problems`` reports a t that is not a perfect square / cube."""
    t = np.asarray(t, dtype=float) if np.ndim(t) else float(t)
    if scheme == "1d":
        return t
    if scheme == "3d":
        return np.rint(np.cbrt(t))
    return np.rint(np.sqrt(t / (depth if scheme == "2.5d" else 1)))


def norm_cost(model, rows, cols, eb) -> F.OpCost:
    """A LayerNorm/RMSNorm over ``rows`` x ``cols``, one kernel each way."""
    rms = model.norm == "rmsnorm"
    return F.layer_norm(rows, cols, bias=model.bias and not rms, rms=rms, elem_bytes=eb)


def gradient_sum(rows, cols, eb) -> F.OpCost:
    """Autograd summing two gradients of one (rows, cols) tensor in backward (InputBuffer: one add, read 2 write 1,
    1 FLOP per element): the module estimator's ``grad_accumulate`` op, charged to the consumer whose gradient
    arrives second (perfcheck.predict.grad_accumulation). The residual stream feeds a norm and the residual add; the
    normed input feeds the reference Llama code's separate wq, wk, wv (w1, w3)."""
    n = rows * cols
    return F.OpCost(bwd=F.Cost(flops=n, bytes=3 * n * eb, kernels=1))


def norm_sublayer(name, model, rows, cols, eb, *, residual: bool, eager: bool = False, stage="layer", comms=()):
    """The norm's row: ``norm_cost``, or with ``eager`` an RMSNorm as the reference Llama code's Python, its eight
    aten ops as parts (``eager_ops.eager_rms_norm_parts``; a LayerNorm is one kernel anyway); with ``residual`` the
    gradient sum (``gradient_sum``) as a part priced as the add it is (``Sublayer.parts``)."""
    python_rms = eager and model.norm == "rmsnorm"
    parts = eager_rms_norm_parts(rows, cols, eb) if python_rms else ()
    if residual:
        parts += (("add", gradient_sum(rows, cols, eb)),)
    main = F.OpCost() if python_rms else norm_cost(model, rows, cols, eb)
    return Sublayer(name, "layer_norm", main + eager_total(parts), stage, comms, parts=parts)


def parts_sublayer(name, formula, parts, stage="layer", comms=()):
    """A row made of its aten ops alone ((name, cost) pairs, each priced as that op: ``Sublayer.parts``)."""
    return Sublayer(name, formula, eager_total(parts), stage, comms, parts=tuple(parts))


def act_sublayer(name, model, numel, eb):
    """The MLP's activation over ``numel`` elements; SwiGLU: silu(gate) * up, the activation, then a product that
    saves both operands. Each kernel is a part (``Sublayer.parts``) priced under its own op's efficiency, as
    ``perfcheck.estimate`` prices silu and mul (``row_times``)."""
    if model.activation == "swiglu":
        parts = (("silu", F.activation(numel, "silu", elem_bytes=eb)),
                 ("mul", F.elementwise(numel, inputs=2, saves=2, elem_bytes=eb)))
    else:
        parts = ((model.activation, F.activation(numel, model.activation, elem_bytes=eb)),)
    return parts_sublayer(name, "activation", parts)


def widening_cast(numel, eb) -> F.OpCost:
    """``.float()`` of ``numel`` elements of ``eb`` bytes: one kernel each way where eb < 4 (forward reads eb and
    writes 4 per element, off a GPU's vectorised loop, ``predict.strided``; backward casts the gradient down,
    4 + eb), nothing where eb = 4 (it returns the tensor)."""
    wide = 1.0 * (np.asarray(eb) < 4)
    cast = (eb + 4) * numel * wide
    return F.OpCost(F.Cost(bytes=cast, kernels=wide, strided_elems=numel * wide, strided_bytes=cast),
                    F.Cost(bytes=cast, kernels=wide), 0, 0)


def cross_entropy_sublayer(rows, classes, eb, comms=(), *, upcast: bool = False):
    """The loss over (rows, classes) logits: log_softmax and nll_loss, each a part priced as its own op
    (``Sublayer.parts``, the ops ``perfcheck.estimate`` traces from ``F.cross_entropy``). ``upcast``: the reference
    Llama code's ``self.output(h).float()`` first (torchtitan/models/llama/model.py at 395a52627 and 1ea476e9f;
    the transformer front-end's ``eager``): a widening cast of the logits where they are narrower than fp32
    (``_to_copy``: eb + 4 bytes per element each way, off a GPU's vectorised loop forward, ``predict.strided``),
    then both ops in fp32.
    Megatron-LM's default path runs its own vocab-parallel loss instead: ``vocab_parallel_cross_entropy_sublayer``."""
    parts = ()
    if upcast and np.any(np.asarray(eb) < 4):
        parts += (("_to_copy", widening_cast(rows * classes, eb)),)
        eb = 4
    log_softmax = F.softmax(rows, classes, elem_bytes=eb, log=True)
    loss = F.cross_entropy(rows, classes, elem_bytes=eb)
    nll = F.OpCost(loss.fwd + log_softmax.fwd.scale(-1), loss.bwd + log_softmax.bwd.scale(-1))
    parts += (("_log_softmax", log_softmax), ("nll_loss_forward", nll))
    return parts_sublayer("cross_entropy", "cross_entropy", parts, "last", comms)


def vocab_parallel_cross_entropy_sublayer(rows, classes, eb, comms=()):
    """Megatron-LM's loss as it runs: ``vocab_parallel_cross_entropy(output.float(), labels)`` (the default; with
    ``--fp16-lm-cross-entropy`` the logits stay narrow), the autograd function ``_VocabParallelCrossEntropy`` of
    megatron/mpu/cross_entropy.py (2020-2022; megatron/core/tensor_parallel/cross_entropy.py since), over this rank's
    n = rows x classes logits (classes = V/t), in place on the fp32 copy, eb the logits' element bytes:

        forward   .float()            eb + 4 per element (a widening cast: off a GPU's vectorised loop,
                                      ``predict.strided``; none where eb = 4, .float() returns the tensor)
                  max over the vocab  4 (a row reduction; its all-reduce is ``comms``)
                  sub_ the row max    4 + 4 (a broadcast operand: off the vectorised loop)
                  exp (out=)          4 + 4
                  sum over the vocab  4
                  div_ by the sum     4 + 4 (broadcast)                 -> 36 + eb bytes, six kernels (five in fp32)
        backward  mul_ by the row's loss gradient   4 + 4 (broadcast)
                  .float()'s backward, the cast down  4 + eb              -> 12 + eb bytes, two kernels (one in fp32)

    The target logit's gather and the backward's -1 at the target touch one element per row and are left out. Saves
    the fp32 softmax (4 n bytes). FLOPs: one per element per kernel but the casts (max's compare, the subtract, exp,
    the sum's add, the divide; the product backward). Each kernel is a part priced as its own op (``Sublayer.parts``).
    Where torch's ``F.cross_entropy`` runs the loss instead (log_softmax, nll_loss): ``cross_entropy_sublayer``."""
    n = rows * classes

    def kernel(nbytes, *, flops=1, strided=False, phase="fwd", act_mem=0):
        cost = F.Cost(flops=flops * n, bytes=nbytes, kernels=1, strided_elems=n * strided,
                      strided_bytes=nbytes * strided)
        return F.OpCost(cost, F.Cost(), act_mem, 0) if phase == "fwd" else F.OpCost(F.Cost(), cost, 0, 0)

    parts = (("_to_copy", widening_cast(n, eb)),
             ("max", kernel(4 * n)),
             ("sub_", kernel(8 * n, strided=True)),
             ("exp", kernel(8 * n)),
             ("sum", kernel(4 * n)),
             ("div_", kernel(8 * n, strided=True, act_mem=4 * n)),
             ("mul_", kernel(8 * n, strided=True, phase="bwd")))
    return parts_sublayer("cross_entropy", "cross_entropy", parts, "last", comms)


def scaled_softmax(rows, cols, eb) -> F.OpCost:
    """softmax(scores / sqrt(q)) over ``rows`` rows of ``cols`` scores: Megatron's fused scale + softmax
    (FusedScaleMaskSoftmax): one kernel, ``formulas.softmax``'s bytes, plus the scaling's 1 FLOP per
    score forward and backward (what an unfused ``scores / sqrt(q)`` costs; the module estimator
    counts that divide on the same block, so the two front-ends agree FLOP for FLOP)."""
    cost = F.softmax(rows, cols, elem_bytes=eb)
    n = rows * cols
    return replace(cost, fwd=replace(cost.fwd, flops=cost.fwd.flops + n), bwd=replace(cost.bwd, flops=cost.bwd.flops + n))


def residual_add(numel, eb):
    """x + branch(x): 1 FLOP per element forward. Backward hands the gradient to both inputs unchanged (AddBackward0:
    no kernel; summing it with the stream's other gradient is the engine's add, ``gradient_sum``). Saves nothing."""
    return F.OpCost(F.elementwise(numel, inputs=2, flops_per_elem=1, saves=0, elem_bytes=eb).fwd, F.Cost(), 0, 0)


def scale_macs(cost: F.OpCost, frac) -> F.OpCost:
    """Causal attention: count half the products of the score matmuls (what a causal kernel skips)."""
    if frac == 1.0:
        return cost
    return replace(cost, fwd=replace(cost.fwd, macs=cost.fwd.macs * frac),
                   bwd=replace(cost.bwd, macs=cost.bwd.macs * frac))


def padded_vocab(model, t):
    """Vocabulary rows per TP rank: ceil(V/t) (Megatron pads the vocabulary to a multiple of t)."""
    return np.ceil(model.vocab / np.asarray(t, dtype=float))

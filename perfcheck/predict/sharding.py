"""One transformer layer on one GPU under Megatron 1D tensor parallelism (TP) and sequence
parallelism (SP): the sublayers, their costs (from ``formulas.py``, nothing re-derived here) and
the tensor-parallel collectives each one issues.

Every size may be a numpy array (one entry per configuration of a sweep): the formulas are plain
arithmetic, so one call costs thousands of layouts at once. Names (per GPU, one micro-batch):

    b micro-batch, s sequence, e hidden, h heads, q = e/h head dim, f ffn hidden, V vocab,
    t TP degree, T = b*s tokens, Tn = T/t with SP (else T): tokens in the norm/dropout regions.

Megatron-LM 1D TP (Shoeybi et al. 2019, arXiv 1909.08053, Fig. 3): qkv_proj and fc1 are
column-parallel (outputs split over t), out_proj and fc2 row-parallel (inputs split, partial sums
added by a collective). The conjugate operators per block:

    f: identity in forward, all-reduce of dX (b,s,e) in backward      (before qkv_proj / fc1)
    g: all-reduce of Y (b,s,e) in forward, identity in backward       (after out_proj / fc2)

With SP (Korthikanti et al. 2022, arXiv 2205.05198, section 4.2.2) the norms, dropouts and
residual adds run on Tn = T/t tokens and the collectives change kind, not volume:

    g  -> all-gather (b,s,e) in forward, reduce-scatter (b,s,e) in backward   (before qkv/fc1)
    g' -> reduce-scatter (b,s,e) in forward, all-gather (b,s,e) in backward   (after out_proj/fc2)

NB(perfcheck): with SP Megatron saves only the sequence shard (b, s/t, e) of the input of the
column-parallel linears and all-gathers it again in backward for the weight gradient
(``LinearWithGradAccumulationAndAsyncCommunication``; overlapped with dgrad there). That is one
more all-gather of (b,s,e) per column-parallel linear in backward; we count it (overlap is the
caller's ``tp_overlap``) and save the shard, which is what makes Korthikanti's 34/t exact.

Collective sizes are the FULL buffer S in the nccl-tests convention (``collectives.py``): the
(b,s,e) tensor for all-reduce, the gathered output for all-gather, the unreduced input for
reduce-scatter; at t = 1 every size is 0.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Tuple

import numpy as np

from perfcheck.predict import formulas as F

#: Sublayer names of one transformer layer, in execution order (documented in docs/transformer.md).
LAYER_SUBLAYERS = ("layer_norm_1", "qkv_proj", "rotary", "logits", "softmax", "dropout_softmax",
                   "attend", "core_attention", "out_proj", "dropout_attn", "residual_attn",
                   "layer_norm_2", "fc1", "act", "fc2", "dropout_mlp", "residual_mlp")
#: Model-level sublayers: on the first pipeline stage, and on the last.
FIRST_SUBLAYERS = ("embedding", "position_embedding", "dropout_embedding")
LAST_SUBLAYERS = ("final_norm", "lm_head", "cross_entropy")
#: The unfused attention core: what selective recompute recomputes (Korthikanti et al. 2022, 5.1).
CORE_ATTENTION = ("logits", "softmax", "dropout_softmax", "attend", "core_attention")

#: all-to-all: MoE token dispatch; broadcast and reduce: the SUMMA steps of 2D / 2.5D tensor parallelism.
COLLECTIVE_KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce")
#: Tensor-parallel schemes (``tp_scheme``): Megatron 1D, and the grid schemes of ``grid_*`` below.
TP_SCHEMES = ("1d", "2d", "2.5d", "3d")


@dataclass(frozen=True)
class Collective:
    """One tensor-parallel collective a sublayer issues: phase, kind, full buffer bytes (array)."""

    phase: str  # "fwd" | "bwd"
    kind: str  # one of COLLECTIVE_KINDS
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
    #: need ``roofline.gemm_min_dim`` / ``gemm_unaligned`` of the traced op in ``perfcheck.estimate``
    gemm: object = None


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
    def head_split(self):
        """Ways the attention heads (and the hidden features) are split: t (1D), q (grid schemes)."""
        return self.q

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


def _col_parallel_comms(x: Shape, elements):
    """Collectives around a column-parallel linear (qkv_proj, fc1, lm_head): operator f / g.

    Megatron-LM's backward of this linear (``LinearWithGradAccumulationAndAsyncCommunication``; the
    all-reduce added 2021-08-30, commit cf7efd4f, on by default from 2021-09-02, commit 3f652469 (its
    ``--no-async-tensor-model-parallel-allreduce`` turns it off); the SP pair 2022-03-02, commit 02bb1f5c) issues the input gradient's all-reduce (reduce-scatter with SP) with
    ``async_op=True`` and computes the weight gradient while it runs ("dw"); with SP the re-gather of
    the saved input shard runs while the input gradient is computed ("dx")."""
    sp, nsp = np.asarray(x.sp), ~np.asarray(x.sp)
    return (Collective("fwd", "allgather", x.tp_bytes(elements, sp)),
            Collective("bwd", "reducescatter", x.tp_bytes(elements, sp), beside="dw"),
            Collective("bwd", "allgather", x.tp_bytes(elements, sp), beside="dx"),  # re-gather of the saved shard
            Collective("bwd", "allreduce", x.tp_bytes(elements, nsp), beside="dw"))


def _row_parallel_comms(x: Shape, elements):
    """Collectives after a row-parallel linear (out_proj, fc2): operator g / g'."""
    sp, nsp = np.asarray(x.sp), ~np.asarray(x.sp)
    return (Collective("fwd", "reducescatter", x.tp_bytes(elements, sp)),
            Collective("fwd", "allreduce", x.tp_bytes(elements, nsp)),
            Collective("bwd", "allgather", x.tp_bytes(elements, sp)))


def _sp_saved_input(cost: F.OpCost, x: Shape, features) -> F.OpCost:
    """A column-parallel linear under SP keeps the (Tn, features) shard of its input, not (T, features)."""
    return replace(cost, act_mem=x.norm_tokens * features * x.elem_bytes)


def _norm(model, rows, cols, eb) -> F.OpCost:
    rms = model.norm == "rmsnorm"
    return F.layer_norm(rows, cols, bias=model.bias and not rms, rms=rms, elem_bytes=eb)


def _scaled_softmax(rows, cols, eb) -> F.OpCost:
    """softmax(scores / sqrt(q)) over ``rows`` rows of ``cols`` scores: Megatron's fused scale + softmax
    (FusedScaleMaskSoftmax): one kernel, ``formulas.softmax``'s bytes, plus the scaling's 1 FLOP per
    score forward and backward (what an unfused ``scores / sqrt(q)`` costs; the module estimator
    counts that divide on the same block, so the two front-ends agree FLOP for FLOP)."""
    cost = F.softmax(rows, cols, elem_bytes=eb)
    n = rows * cols
    return replace(cost, fwd=replace(cost.fwd, flops=cost.fwd.flops + n), bwd=replace(cost.bwd, flops=cost.bwd.flops + n))


def _residual(numel, eb) -> F.OpCost:
    # x + branch(x): 1 FLOP per element; backward passes the gradient to both inputs. Saves nothing.
    return F.elementwise(numel, inputs=2, flops_per_elem=1, bwd_flops_per_elem=1, saves=0, elem_bytes=eb)


def attention_sublayers(model, x: Shape, *, causal: bool, flash: bool):
    """qkv_proj .. out_proj: Megatron self-attention with h/t query heads and kv/t key/value
    heads per GPU (grouped-query attention when kv_heads < heads)."""
    e, eb, T = model.hidden, x.elem_bytes, x.tokens
    q = e // model.heads
    heads_t, kv_t = model.heads / x.t, model.kv_heads / x.t
    rows = []
    qkv = F.linear(T, e, (model.heads + 2 * model.kv_heads) * q / x.t, bias=model.bias,
                   elem_bytes=eb)  # (T,e) @ (e,(h+2kv)q/t); (e, 3e/t) without GQA
    qkv = F.OpCost(qkv.fwd, qkv.bwd, np.where(x.sp, _sp_saved_input(qkv, x, e).act_mem, qkv.act_mem), qkv.params)
    rows.append(Sublayer("qkv_proj", "linear", qkv, comms=_col_parallel_comms(x, T * e),
                         gemm=(T, e, (model.heads + 2 * model.kv_heads) * q / x.t)))
    if model.position == "rotary":
        # q and k rotated: x*cos + rotate_half(x)*sin, 3 FLOPs per element; cos/sin tables not counted.
        rows.append(Sublayer("rotary", "elementwise",
                             F.elementwise(T * (heads_t + kv_t) * q, flops_per_elem=3, bwd_flops_per_elem=3, saves=0,
                                           elem_bytes=eb)))
    frac = 0.5 if causal else 1.0
    if flash:
        core = F.attention(x.b, heads_t, x.s, x.s, q, q, kv_heads=kv_t, causal=causal, elem_bytes=eb)
        # The kernel saves its output, which is also out_proj's saved input: one tensor, counted
        # there (autograd keeps one storage; the module estimator deduplicates it the same way).
        core = replace(core, act_mem=core.act_mem - x.tokens * e / x.t * eb)
        rows.append(Sublayer("core_attention", "attention", core))
    else:
        probs = x.b * heads_t * x.s * x.s  # elements of the (b, h/t, s, s) score matrix
        logits = F.matmul(x.s, q, x.s, batch=x.b * heads_t, elem_bytes=eb)  # (s,q) @ (q,s) per (b, head)
        rows.append(Sublayer("logits", "matmul", _scale_macs(logits, frac), gemm=(x.s, q, x.s)))
        rows.append(Sublayer("softmax", "softmax", _scaled_softmax(x.b * heads_t * x.s, x.s, eb),
                             recomputed_act=probs * eb))
        if model.dropout > 0:
            rows.append(Sublayer("dropout_softmax", "dropout", F.dropout(probs, elem_bytes=eb),
                                 recomputed_act=probs * 1))
        attend = F.matmul(x.s, x.s, q, batch=x.b * heads_t, elem_bytes=eb)  # (s,s) @ (s,q) per (b, head)
        rows.append(Sublayer("attend", "matmul", _scale_macs(attend, frac), recomputed_act=probs * eb,
                             gemm=(x.s, x.s, q)))
    out = F.linear(T, e / x.t, e, bias=model.bias, elem_bytes=eb)  # (T,e/t) @ (e/t,e); bias replicated
    rows.append(Sublayer("out_proj", "linear", out, comms=_row_parallel_comms(x, T * e), gemm=(T, e / x.t, e)))
    if model.dropout > 0:
        rows.append(Sublayer("dropout_attn", "dropout", F.dropout(x.norm_tokens * e, elem_bytes=eb)))
    rows.append(Sublayer("residual_attn", "elementwise", _residual(x.norm_tokens * e, eb)))
    return rows


def _scale_macs(cost: F.OpCost, frac) -> F.OpCost:
    """Causal attention: count half the products of the score matmuls (what a causal kernel skips)."""
    if frac == 1.0:
        return cost
    return replace(cost, fwd=replace(cost.fwd, macs=cost.fwd.macs * frac),
                   bwd=replace(cost.bwd, macs=cost.bwd.macs * frac))


def _expert_mlp(model, x: Shape, tokens, prefix, copies, a2a_bytes):
    """fc1, act, fc2 of ``copies`` experts (on this GPU) over ``tokens`` tokens, Megatron TP inside
    each expert; ``a2a_bytes``: the all-to-all that brings the tokens (before fc1) and takes the
    results back (after fc2), in forward and again for their gradients in backward."""
    e, eb, T = model.hidden, x.elem_bytes, x.tokens
    f_t = model.ffn_hidden / x.t
    glu = model.activation == "swiglu"
    fc1 = F.linear(tokens, e, (2 if glu else 1) * f_t, bias=model.bias, elem_bytes=eb)
    fc1 = F.OpCost(fc1.fwd, fc1.bwd, fc1.act_mem, fc1.params * copies)
    a2a = (Collective("fwd", "alltoall", a2a_bytes, "ep"), Collective("bwd", "alltoall", a2a_bytes, "ep"))
    if glu:
        act = F.activation(tokens * f_t, "silu", elem_bytes=eb) + F.elementwise(tokens * f_t, inputs=2, saves=2,
                                                                                elem_bytes=eb)
    else:
        act = F.activation(tokens * f_t, model.activation, elem_bytes=eb)
    fc2 = F.linear(tokens, f_t, e, bias=model.bias, elem_bytes=eb)
    fc2 = F.OpCost(fc2.fwd, fc2.bwd, fc2.act_mem, fc2.params * copies)
    return [Sublayer(f"{prefix}fc1", "linear", fc1, comms=a2a + _col_parallel_comms(x, T * e)),
            Sublayer(f"{prefix}act", "activation", act),
            Sublayer(f"{prefix}fc2", "linear", fc2, comms=a2a + _row_parallel_comms(x, T * e))]  # grouped: no GEMM dims


def moe_sublayers(model, x: Shape):
    """A mixture-of-experts MLP: router, shared experts (if any), routed experts.

    router: a replicated linear (T, e) @ (e, E) + softmax over E and the top-k selection.
    Routed tokens per GPU: T * top_k * capacity_factor (each token's top_k copies; the capacity
    factor pads or trims an expert's share); with expert parallelism (``ep``) the ep GPUs of a
    group exchange tokens by all-to-all so that each runs experts/ep experts on an equal share:
    send buffer S = routed tokens x e x elem bytes, forward (dispatch, combine) and backward
    (their gradients) (Lepikhin et al. 2021, GShard, arXiv 2006.16668, section 2.2; Fedus et al.
    2022, Switch Transformers, arXiv 2101.03961, section 2.1 for the capacity factor).
    """
    e, eb, T = model.hidden, x.elem_bytes, x.tokens
    n = model.experts
    rows = []
    router = F.linear(T, e, n, bias=False, elem_bytes=eb) + F.softmax(T, n, elem_bytes=eb)
    rows.append(Sublayer("router", "linear", router))
    if model.shared_experts:
        rows += _expert_mlp(model, x, T * model.shared_experts, "shared_", model.shared_experts, 0.0)
    routed = T * model.top_k * model.capacity_factor
    a2a = routed * e * eb * (np.asarray(x.ep) > 1)
    rows += _expert_mlp(model, x, routed, "expert_", n / x.ep, a2a)
    return rows


def mlp_sublayers(model, x: Shape):
    """layer_norm_2 .. residual_mlp: fc1 column-parallel (f/t outputs; 2f/t gate+up for SwiGLU),
    or the mixture-of-experts rows (``moe_sublayers``) when the model has experts."""
    e, eb, T = model.hidden, x.elem_bytes, x.tokens
    f_t = model.ffn_hidden / x.t
    glu = model.activation == "swiglu"
    rows = [Sublayer("layer_norm_2", "layer_norm", _norm(model, x.norm_tokens, e, eb))]
    if model.experts:
        rows += moe_sublayers(model, x)
        if model.dropout > 0:
            rows.append(Sublayer("dropout_mlp", "dropout", F.dropout(x.norm_tokens * e, elem_bytes=eb)))
        rows.append(Sublayer("residual_mlp", "elementwise", _residual(x.norm_tokens * e, eb)))
        return rows
    fc1 = F.linear(T, e, (2 if glu else 1) * f_t, bias=model.bias, elem_bytes=eb)
    fc1 = F.OpCost(fc1.fwd, fc1.bwd, np.where(x.sp, _sp_saved_input(fc1, x, e).act_mem, fc1.act_mem), fc1.params)
    rows.append(Sublayer("fc1", "linear", fc1, comms=_col_parallel_comms(x, T * e), gemm=(T, e, (2 if glu else 1) * f_t)))
    if glu:  # silu(gate) * up: the activation, then a product that saves both operands
        act = F.activation(T * f_t, "silu", elem_bytes=eb) + F.elementwise(T * f_t, inputs=2, saves=2, elem_bytes=eb)
    else:
        act = F.activation(T * f_t, model.activation, elem_bytes=eb)
    rows.append(Sublayer("act", "activation", act))
    fc2 = F.linear(T, f_t, e, bias=model.bias, elem_bytes=eb)
    rows.append(Sublayer("fc2", "linear", fc2, comms=_row_parallel_comms(x, T * e), gemm=(T, f_t, e)))
    if model.dropout > 0:
        rows.append(Sublayer("dropout_mlp", "dropout", F.dropout(x.norm_tokens * e, elem_bytes=eb)))
    rows.append(Sublayer("residual_mlp", "elementwise", _residual(x.norm_tokens * e, eb)))
    return rows


def layer_sublayers(model, x: Shape, *, causal=False, flash=False):
    """All sublayers of one transformer layer on one GPU, in execution order."""
    if x.grid:
        return grid_layer_sublayers(model, x, causal=causal, flash=flash)
    ln1 = Sublayer("layer_norm_1", "layer_norm", _norm(model, x.norm_tokens, model.hidden, x.elem_bytes))
    return [ln1, *attention_sublayers(model, x, causal=causal, flash=flash), *mlp_sublayers(model, x)]


def padded_vocab(model, t):
    """Vocabulary rows per TP rank: ceil(V/t) (Megatron pads the vocabulary to a multiple of t)."""
    return np.ceil(model.vocab / np.asarray(t, dtype=float))


def model_sublayers(model, x: Shape, *, tied_copy):
    """Embedding (first stage) and final norm, LM head, loss (last stage).

    Vocabulary-parallel embedding and LM head (Megatron ``VocabParallelEmbedding``,
    ``ColumnParallelLinear``): V/t rows per rank. The embedding's partial lookups are all-reduced
    (reduce-scattered with SP) in forward; the LM head is a column-parallel linear; the vocab-
    parallel cross entropy all-reduces three fp32 values per token (max, sum of exp, target logit).
    ``tied_copy`` (array): the LM head owns weights (untied, or tied across pipeline stages,
    where Megatron keeps a copy on the last stage); else its weight is the embedding's.
    """
    if x.grid:
        return grid_model_sublayers(model, x, tied_copy=tied_copy)
    e, eb, T = model.hidden, x.elem_bytes, x.tokens
    v_t = padded_vocab(model, x.t)
    sp, nsp = np.asarray(x.sp), ~np.asarray(x.sp)
    emb = F.embedding(T, e, v_t, elem_bytes=eb)
    rows = [Sublayer("embedding", "embedding", emb, "first",
                     (Collective("fwd", "reducescatter", x.tp_bytes(T * e, sp)),
                      Collective("fwd", "allreduce", x.tp_bytes(T * e, nsp)),
                      Collective("bwd", "allgather", x.tp_bytes(T * e, sp))))]
    if model.position == "learned":
        # one lookup per position (s, or s/t with SP), broadcast over the batch by the add
        positions = x.s / np.where(x.sp, x.t, 1)
        rows.append(Sublayer("position_embedding", "embedding", F.embedding(positions, e, model.seq_len, elem_bytes=eb),
                             "first"))
    if model.dropout > 0:
        rows.append(Sublayer("dropout_embedding", "dropout", F.dropout(x.norm_tokens * e, elem_bytes=eb), "first"))
    rows.append(Sublayer("final_norm", "layer_norm", _norm(model, x.norm_tokens, e, eb), "last"))
    head = F.linear(T, e, v_t, bias=False, elem_bytes=eb)
    head = F.OpCost(head.fwd, head.bwd, np.where(x.sp, _sp_saved_input(head, x, e).act_mem, head.act_mem),
                    head.params * tied_copy)
    rows.append(Sublayer("lm_head", "linear", head, "last", _col_parallel_comms(x, T * e), gemm=(T, e, v_t)))
    ce_bytes = 3 * T * 4 * (x.t > 1)  # fp32 max, sum-exp and target logit per token
    rows.append(Sublayer("cross_entropy", "cross_entropy", F.cross_entropy(T, v_t, elem_bytes=eb), "last",
                         (Collective("fwd", "allreduce", ce_bytes * np.ones_like(np.asarray(T, dtype=float))),)))
    return rows



# ---- 2D, 2.5D and 3D tensor parallelism ---------------------------------------------------------------
# The grid schemes split every activation both ways (tokens over the grid's rows, features over its
# columns) and every weight over a q x q (or q x q x q) grid, so activation memory also falls with
# the degree (Megatron 1D replicates the (T, e) activations). Per linear Y = X W, X: (T, in), W: (in, out):
#
# 2D, Optimus (Xu et al. 2021, "An Efficient 2D Method for Training Super-Large Deep Learning
#   Models", arXiv 2104.05343): t = q*q GPUs. X is split (T/q, in/q), W (in/q, out/q), Y (T/q, out/q).
#   SUMMA forward, q steps: broadcast the X block along its grid row and the W block along its grid
#   column, accumulate X_il W_lj. Backward: dX = dY W^T (q steps: broadcast W blocks, reduce the dX
#   partials along the row) and dW = X^T dY (q steps: broadcast X blocks, reduce the dW partials along
#   the column). Every group has q ranks; per GPU q broadcasts/reduces of one block each.
# 2.5D, Tesseract (Wang et al. 2021, "2.5-dimensional distributed model training", arXiv 2105.14500):
#   t = q*q*d. The tokens are split d*q ways, the weights q x q and replicated over the d layers of
#   the grid; each layer runs 2D SUMMA on its T/d tokens; the d replicas of each weight-gradient
#   block are all-reduced over the depth group (d ranks).
# 3D (Bian et al. 2021, "Maximizing Parallelism in Distributed Training for Huge Neural Networks",
#   arXiv 2105.14450): t = q**3. X is split (T/q^2, in/q), W stored (in/q, out/q^2), Y (T/q^2, out/q).
#   Forward: all-gather X over q ranks -> (T/q, in/q), all-gather W over q ranks -> (in/q, out/q),
#   multiply, reduce-scatter Y over q ranks. Backward: all-gather dY -> (T/q, out/q), reduce-scatter
#   dX = dY W^T and dW = X^T dY, each over q ranks. The gathered X and W are what backward keeps.
#
# The collective sequences are Colossal-AI's implementation of the three papers (hpcaitech/ColossalAI,
# colossalai/legacy/nn/layer/parallel_2d, parallel_2p5d, parallel_3d; the papers' authors), whose
# documentation (docs/source/en/features/{2D,2p5D,3D}_tensor_parallel.md) gives the worked shapes
# the tests repeat. Attention: heads split over q (the feature split), sequences over the row split,
# so the attention core is local. LayerNorm: statistics (sum, sum of squares) all-reduced over the q
# ranks that share a token's features, forward and backward. Not counted: the small all-reduces of
# bias and LayerNorm-weight gradients (O(e/q) elements per layer).


def grid_side(t, scheme, depth=1):
    """Side q of the grid: sqrt(t) (2D), sqrt(t/depth) (2.5D), cbrt(t) (3D), t (1D). Rounded:
    ``grid_problems`` reports a t that is not a perfect square / cube."""
    t = np.asarray(t, dtype=float) if np.ndim(t) else float(t)
    if scheme == "1d":
        return t
    if scheme == "3d":
        return np.rint(np.cbrt(t))
    return np.rint(np.sqrt(t / (depth if scheme == "2.5d" else 1)))


def grid_problems(model, tp, scheme, depth, batch, sp):
    """(bad mask, message) pairs for layouts a grid scheme cannot run (vectorised over tp/batch/sp).

    2D: tp = q*q; 2.5D: tp = q*q*tp_depth; 3D: tp = q**3; q divides heads and kv_heads (whole heads
    per grid column) and hidden and ffn_hidden (q*q for 3D, whose weights are split out/q^2); the
    micro-batch splits over the grid's rows (q, tp_depth*q, q*q); no sequence parallelism (the grid
    splits the tokens already); no mixture-of-experts (not modelled under grid schemes).
    """
    tp = np.asarray(tp)
    q = grid_side(tp, scheme, depth)
    name = {"2d": "2D", "2.5d": "2.5D", "3d": "3D"}[scheme]
    if scheme == "2d":
        shape_bad, need = q * q != tp, "a square q*q"
    elif scheme == "2.5d":
        shape_bad, need = q * q * depth != tp, f"q*q*tp_depth with tp_depth = {depth}"
    else:
        shape_bad, need = q ** 3 != tp, "a cube q**3"
    q = np.maximum(q, 1)
    feat = q * q if scheme == "3d" else q
    rows = {"2d": q, "2.5d": depth * q, "3d": q * q}[scheme]
    return [
        (shape_bad, f"tp must be {need} for {name} tensor parallelism"),
        (model.heads % q != 0, f"the {name} grid side q does not divide heads = {model.heads}"),
        (model.kv_heads % q != 0, f"the {name} grid side q does not divide kv_heads = {model.kv_heads}"),
        (model.hidden % feat != 0, f"{'q*q' if scheme == '3d' else 'q'} ({name} grid) does not divide hidden = {model.hidden}"),
        (model.ffn_hidden % feat != 0,
         f"{'q*q' if scheme == '3d' else 'q'} ({name} grid) does not divide ffn_hidden = {model.ffn_hidden}"),
        (np.asarray(batch) % rows != 0, f"the micro-batch (batch) must be divisible by the {name} grid's row split "
                                         f"({'q' if scheme == '2d' else 'tp_depth*q' if scheme == '2.5d' else 'q*q'}): "
                                         "grid schemes split the batch"),
        (np.asarray(sp, dtype=bool), f"sp (sequence parallelism) is Megatron 1D's; {name} already splits the tokens"),
        (np.full(np.shape(tp), bool(model.experts)), f"mixture-of-experts layers are not modelled under {name} "
                                                     "tensor parallelism (tp_scheme='1d' only)"),
    ]


def grid_linear(x: Shape, tokens, in_f, out_f, *, bias, elem_bytes):
    """One linear (tokens, in_f) @ (in_f, out_f) on one GPU of a grid scheme: (OpCost, collectives).

    MACs per GPU = tokens*in_f*out_f / t in every scheme (the matmul work is split evenly).
    2D/2.5D: costed as the q SUMMA steps together, (tokens/row_split, in_f) @ (in_f, out_f/q): q
    kernels forward, 2q backward; saves its local X block; holds a (in_f/q, out_f/q) weight block.
    3D: (tokens/q, in_f/q) @ (in_f/q, out_f/q) on the gathered blocks (saved for backward); holds
    in_f*out_f/q**3 weights. Bias: out_f/q per GPU. Collective sizes are full buffers (nccl-tests).
    """
    q, eb = x.q, elem_bytes
    on = q > 1
    if x.scheme == "3d":
        rows = tokens / (q * q) * q  # the gathered token rows: T/q^2 per GPU, times q
        cost = F.linear(rows, in_f / q, out_f / q, bias=bias, elem_bytes=eb)
        cost = replace(cost, params=in_f * out_f / q ** 3 + bias * out_f / q)
        x_g, w_g, y_g = rows * in_f / q * eb * on, in_f * out_f / (q * q) * eb * on, rows * out_f / q * eb * on
        comms = (Collective("fwd", "allgather", x_g, "q"), Collective("fwd", "allgather", w_g, "q"),
                 Collective("fwd", "reducescatter", y_g, "q"),
                 Collective("bwd", "allgather", y_g, "q"), Collective("bwd", "reducescatter", x_g, "q"),
                 Collective("bwd", "reducescatter", w_g, "q"))
        return cost, comms
    rows = tokens / x.row_split
    cost = F.linear(rows, in_f, out_f / q, bias=bias, elem_bytes=eb)
    x_blk, w_blk = rows * in_f / q, in_f * out_f / (q * q)  # elements of this GPU's X and W blocks
    cost = F.OpCost(replace(cost.fwd, kernels=q), replace(cost.bwd, kernels=2 * q + bias),
                    act_mem=x_blk * eb, params=w_blk + bias * out_f / q)
    xb, wb = q * x_blk * eb * on, q * w_blk * eb * on  # q SUMMA steps, one block each
    comms = (Collective("fwd", "broadcast", xb, "q"), Collective("fwd", "broadcast", wb, "q"),
             Collective("bwd", "broadcast", wb, "q"), Collective("bwd", "reduce", xb, "q"),  # dX = dY W^T
             Collective("bwd", "broadcast", xb, "q"), Collective("bwd", "reduce", wb, "q"))  # dW = X^T dY
    if x.scheme == "2.5d":  # the d replicas of the weight block add their gradients
        comms += (Collective("bwd", "allreduce", w_blk * eb * (np.asarray(x.depth) > 1), "d"),)
    return cost, comms


def grid_gemm(x: Shape, tokens, in_f, out_f):
    """(m, k, n) of one kernel of ``grid_linear``: 3D (T/q, in_f/q) @ (in_f/q, out_f/q) on the gathered blocks;
    2D/2.5D one SUMMA step (T/row_split, in_f/q) @ (in_f/q, out_f/q). At q = 1 it is 1D's (T, in_f, out_f),
    so the roofline's shape curve and alignment see the same GEMM under every scheme."""
    q = x.q
    rows = tokens / q if x.scheme == "3d" else tokens / x.row_split
    return rows, in_f / q, out_f / q


def _grid_norm(model, x: Shape, name, stage="layer"):
    """LayerNorm/RMSNorm on this GPU's (T/row_split, e/q) block; the per-token sums (mean and
    mean of squares: two values per token) all-reduced over the q feature ranks, fwd and bwd."""
    rows, eb = x.tokens / x.row_split, x.elem_bytes
    stats = 2 * rows * eb * (x.q > 1)
    return Sublayer(name, "layer_norm", _norm(model, rows, model.hidden / x.q, eb), stage,
                    (Collective("fwd", "allreduce", stats, "q"), Collective("bwd", "allreduce", stats, "q")))


def grid_layer_sublayers(model, x: Shape, *, causal=False, flash=False):
    """One transformer layer on one GPU under 2D / 2.5D / 3D tensor parallelism: the same rows as
    Megatron's (``layer_sublayers``), every linear a ``grid_linear``, attention on b/row_split
    sequences and h/q heads, element-wise rows on the (T/row_split, e/q) block."""
    e, eb, T = model.hidden, x.elem_bytes, x.tokens
    hd, hq, kvq, b = model.head_dim, model.heads / x.q, model.kv_heads / x.q, x.b_local
    rows = [_grid_norm(model, x, "layer_norm_1")]
    qkv, comms = grid_linear(x, T, e, (model.heads + 2 * model.kv_heads) * hd, bias=model.bias, elem_bytes=eb)
    rows.append(Sublayer("qkv_proj", "linear", qkv, comms=comms,
                         gemm=grid_gemm(x, T, e, (model.heads + 2 * model.kv_heads) * hd)))
    if model.position == "rotary":
        rows.append(Sublayer("rotary", "elementwise", F.elementwise(b * x.s * (hq + kvq) * hd, flops_per_elem=3,
                                                                     bwd_flops_per_elem=3, saves=0, elem_bytes=eb)))
    frac = 0.5 if causal else 1.0
    if flash:
        core = F.attention(b, hq, x.s, x.s, hd, hd, kv_heads=kvq, causal=causal, elem_bytes=eb)
        if x.scheme != "3d":  # its output is out_proj's saved block (3D's out_proj keeps a gathered copy)
            core = replace(core, act_mem=core.act_mem - x.local(e) * eb)
        rows.append(Sublayer("core_attention", "attention", core))
    else:
        probs = b * hq * x.s * x.s
        rows.append(Sublayer("logits", "matmul", _scale_macs(F.matmul(x.s, hd, x.s, batch=b * hq, elem_bytes=eb), frac),
                             gemm=(x.s, hd, x.s)))
        rows.append(Sublayer("softmax", "softmax", _scaled_softmax(b * hq * x.s, x.s, eb), recomputed_act=probs * eb))
        if model.dropout > 0:
            rows.append(Sublayer("dropout_softmax", "dropout", F.dropout(probs, elem_bytes=eb), recomputed_act=probs))
        rows.append(Sublayer("attend", "matmul", _scale_macs(F.matmul(x.s, x.s, hd, batch=b * hq, elem_bytes=eb), frac),
                             recomputed_act=probs * eb, gemm=(x.s, x.s, hd)))
    out, comms = grid_linear(x, T, e, e, bias=model.bias, elem_bytes=eb)
    rows.append(Sublayer("out_proj", "linear", out, comms=comms, gemm=grid_gemm(x, T, e, e)))
    if model.dropout > 0:
        rows.append(Sublayer("dropout_attn", "dropout", F.dropout(x.local(e), elem_bytes=eb)))
    rows.append(Sublayer("residual_attn", "elementwise", _residual(x.local(e), eb)))
    rows.append(_grid_norm(model, x, "layer_norm_2"))
    glu = model.activation == "swiglu"
    fc1, comms = grid_linear(x, T, e, (2 if glu else 1) * model.ffn_hidden, bias=model.bias, elem_bytes=eb)
    rows.append(Sublayer("fc1", "linear", fc1, comms=comms,
                         gemm=grid_gemm(x, T, e, (2 if glu else 1) * model.ffn_hidden)))
    inner = x.inner(model.ffn_hidden)
    act = (F.activation(inner, "silu", elem_bytes=eb) + F.elementwise(inner, inputs=2, saves=2, elem_bytes=eb)
           if glu else F.activation(inner, model.activation, elem_bytes=eb))
    rows.append(Sublayer("act", "activation", act))
    fc2, comms = grid_linear(x, T, model.ffn_hidden, e, bias=model.bias, elem_bytes=eb)
    rows.append(Sublayer("fc2", "linear", fc2, comms=comms, gemm=grid_gemm(x, T, model.ffn_hidden, e)))
    if model.dropout > 0:
        rows.append(Sublayer("dropout_mlp", "dropout", F.dropout(x.local(e), elem_bytes=eb)))
    rows.append(Sublayer("residual_mlp", "elementwise", _residual(x.local(e), eb)))
    return rows


def grid_model_sublayers(model, x: Shape, *, tied_copy):
    """Embedding (first stage), final norm, LM head and loss (last stage) under a grid scheme.

    Embedding: a (ceil(V/q), e/q) table block per GPU (3D: V*e/q**3 weights held), T/row_split
    lookups of e/q features, the partial lookups of the q vocabulary blocks all-reduced over q
    ranks in forward (Megatron's vocab-parallel pattern along one grid dimension; Colossal-AI's
    exact gather/scatter sequence for the embedding is not reproduced). LM head: a ``grid_linear``
    (e -> ceil(V/q) * q). Cross entropy: vocab-parallel over the q ranks holding a token's logits
    (three fp32 values per local token all-reduced).
    """
    e, eb, T, q = model.hidden, x.elem_bytes, x.tokens, x.q
    v_q = padded_vocab(model, q)
    tokens_local = T / x.row_split
    emb = F.embedding(tokens_local, e / q, v_q, elem_bytes=eb)
    if x.scheme == "3d":
        emb = replace(emb, params=v_q * e / (q * q))
    rows = [Sublayer("embedding", "embedding", emb, "first",
                     (Collective("fwd", "allreduce", x.local(e) * eb * (q > 1), "q"),))]
    if model.position == "learned":
        rows.append(Sublayer("position_embedding", "embedding",
                             F.embedding(x.s, e / q, model.seq_len, elem_bytes=eb), "first"))
    if model.dropout > 0:
        rows.append(Sublayer("dropout_embedding", "dropout", F.dropout(x.local(e), elem_bytes=eb), "first"))
    rows.append(_grid_norm(model, x, "final_norm", "last"))
    head, comms = grid_linear(x, T, e, v_q * q, bias=False, elem_bytes=eb)
    head = replace(head, params=head.params * tied_copy)
    rows.append(Sublayer("lm_head", "linear", head, "last", comms, gemm=grid_gemm(x, T, e, v_q * q)))
    ce_bytes = 3 * tokens_local * 4 * (q > 1)
    rows.append(Sublayer("cross_entropy", "cross_entropy", F.cross_entropy(tokens_local, v_q, elem_bytes=eb), "last",
                         (Collective("fwd", "allreduce", ce_bytes * np.ones_like(np.asarray(T, dtype=float)), "q"),)))
    return rows

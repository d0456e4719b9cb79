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

from dataclasses import replace

import numpy as np

from perfcheck.predict import eager_ops, formulas as F
from perfcheck.predict.eager_ops import total as eager_total
from perfcheck.predict.sharding_grid import (grid_layer_sublayers, grid_linear, grid_model_sublayers,  # noqa: F401
                                             grid_problems)
from perfcheck.predict.sharding_shape import (CORE_ATTENTION, SUBLAYER_KINDS, TP_SCHEMES,  # noqa: F401
                                              Collective, Shape,
                                              Sublayer, act_sublayer, cross_entropy_sublayer, gradient_sum, norm_sublayer, padded_vocab, parts_sublayer, residual_add, scale_macs,
                                              scaled_softmax, vocab_parallel_cross_entropy_sublayer)

# The names above that this module does not use itself (the sublayer names and schemes, grid_linear,
# grid_problems) are the front-ends' and tests' ``sharding.X``: this module is the tensor-parallel
# model's entry; predict.sharding_shape and predict.sharding_grid hold its parts.


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


def _column_linears(model, x: Shape, outs) -> list:
    """Column-parallel linears of one input (the normed residual stream, (T, e)): ``outs`` = ((row name, output
    features per GPU), ...), one GEMM each: Megatron's fused qkv / fc1 is one, the reference Llama code's wq, wk, wv
    (or w1, w3) are three (two) separate GEMMs of their own shapes. The first row carries the operator-f
    collectives and the saved input (its SP shard with SP); the others read the same tensor, which autograd saves
    once (one storage), so they keep no activation of their own. Backward sums their input gradients, one add per
    further linear (``gradient_sum``), charged as autograd runs them: to every linear but the last (its gradient
    arrives first), as a part priced as an add."""
    e, eb, T = model.hidden, x.elem_bytes, x.tokens
    rows = []
    for i, (name, n) in enumerate(outs):
        c = F.linear(T, e, n, bias=model.bias, elem_bytes=eb)
        kept = np.where(x.sp, _sp_saved_input(c, x, e).act_mem, c.act_mem) if i == 0 else 0.0
        parts = (("add", gradient_sum(T, e, eb)),) if i < len(outs) - 1 else ()
        cost = F.OpCost(c.fwd, c.bwd, kept, c.params)
        rows.append(Sublayer(name, "linear", cost + eager_total(parts), comms=_col_parallel_comms(x, T * e) if i == 0 else (),
                             gemm=(T, e, n), parts=parts))
    return rows


def attention_sublayers(model, x: Shape, *, causal: bool, flash: bool, eager: bool = False):
    """qkv_proj .. out_proj: Megatron self-attention with h/t query heads and kv/t key/value
    heads per GPU (grouped-query attention when kv_heads < heads). ``eager``: the reference Llama code's
    unfused rotary, repeat_kv and output copy and its three projections wq, wk, wv (``eager_ops``)."""
    e, eb, T = model.hidden, x.elem_bytes, x.tokens
    q = e // model.heads
    heads_t, kv_t = model.heads / x.t, model.kv_heads / x.t
    # (T,e) @ (e,(h+2kv)q/t), (e, 3e/t) without GQA; eager: (T,e) @ (e,hq/t), and twice (T,e) @ (e,kv q/t)
    rows = _column_linears(model, x, (("q_proj", heads_t * q), ("k_proj", kv_t * q), ("v_proj", kv_t * q)) if eager
                           else (("qkv_proj", (heads_t + 2 * kv_t) * q),))
    if model.position == "rotary" and eager:  # q and k, each with the (s, q/2) complex table
        rows.append(parts_sublayer("rotary", "elementwise", eager_ops.rotary_complex_parts(T * heads_t * q, x.s * q / 2, eb)
                                   + eager_ops.rotary_complex_parts(T * kv_t * q, x.s * q / 2, eb)))
    elif model.position == "rotary":
        # q and k rotated: x*cos + rotate_half(x)*sin, 3 FLOPs per element; cos/sin tables not counted.
        rows.append(Sublayer("rotary", "elementwise",
                             F.elementwise(T * (heads_t + kv_t) * q, flops_per_elem=3, bwd_flops_per_elem=3, saves=0,
                                           elem_bytes=eb)))
    if eager and model.kv_heads < model.heads:  # k and v copied up to every query head
        rows.append(parts_sublayer("repeat_kv", "elementwise", tuple(  # k and v
            (name, cost.scale(2)) for name, cost in eager_ops.repeat_kv_parts(T * heads_t * q, model.heads / model.kv_heads, eb))))
    frac = 0.5 if causal else 1.0
    if flash:
        core = F.attention(x.b, heads_t, x.s, x.s, q, q, kv_heads=kv_t, causal=causal, elem_bytes=eb)
        # The kernel saves its output, which is also out_proj's saved input: one tensor, counted
        # there (autograd keeps one storage; the module estimator deduplicates it the same way).
        core = replace(core, act_mem=core.act_mem - x.tokens * e / x.t * eb)
        rows.append(Sublayer("core_attention", "attention", core, attention=(x.s, q, causal)))
    else:
        probs = x.b * heads_t * x.s * x.s  # elements of the (b, h/t, s, s) score matrix
        logits = F.matmul(x.s, q, x.s, batch=x.b * heads_t, elem_bytes=eb)  # (s,q) @ (q,s) per (b, head)
        rows.append(Sublayer("logits", "matmul", scale_macs(logits, frac), gemm=(x.s, q, x.s)))
        rows.append(Sublayer("softmax", "softmax", scaled_softmax(x.b * heads_t * x.s, x.s, eb),
                             recomputed_act=probs * eb))
        if model.dropout > 0:
            rows.append(Sublayer("dropout_softmax", "dropout", F.dropout(probs, elem_bytes=eb),
                                 recomputed_act=probs * 1))
        attend = F.matmul(x.s, x.s, q, batch=x.b * heads_t, elem_bytes=eb)  # (s,s) @ (s,q) per (b, head)
        rows.append(Sublayer("attend", "matmul", scale_macs(attend, frac), recomputed_act=probs * eb,
                             gemm=(x.s, x.s, q)))
    if eager and not flash:  # a fused kernel writes its output as (b, s, h, d): the transpose is contiguous already
        rows.append(parts_sublayer("attn_out_copy", "elementwise", eager_ops.transpose_copy_parts(T * heads_t * q, eb)))
    out = F.linear(T, e / x.t, e, bias=model.bias, elem_bytes=eb)  # (T,e/t) @ (e/t,e); bias replicated
    rows.append(Sublayer("out_proj", "linear", out, comms=_row_parallel_comms(x, T * e), gemm=(T, e / x.t, e)))
    if model.dropout > 0:
        rows.append(Sublayer("dropout_attn", "dropout", F.dropout(x.norm_tokens * e, elem_bytes=eb)))
    rows.append(Sublayer("residual_attn", "elementwise", residual_add(x.norm_tokens * e, eb)))
    return rows


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
    fc2 = F.linear(tokens, f_t, e, bias=model.bias, elem_bytes=eb)
    fc2 = F.OpCost(fc2.fwd, fc2.bwd, fc2.act_mem, fc2.params * copies)
    return [Sublayer(f"{prefix}fc1", "linear", fc1, comms=a2a + _col_parallel_comms(x, T * e)),
            act_sublayer(f"{prefix}act", model, tokens * f_t, eb),
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


def mlp_sublayers(model, x: Shape, eager_norm: bool = False, eager: bool = False):
    """layer_norm_2 .. residual_mlp: fc1 column-parallel (f/t outputs; 2f/t gate+up for SwiGLU; ``eager`` SwiGLU:
    w1 and w3 as two GEMMs, fc1_gate and fc1_up), or the mixture-of-experts rows (``moe_sublayers``)."""
    e, eb, T = model.hidden, x.elem_bytes, x.tokens
    f_t = model.ffn_hidden / x.t
    glu = model.activation == "swiglu"
    rows = [norm_sublayer("layer_norm_2", model, x.norm_tokens, e, eb, residual=True, eager=eager_norm)]
    if model.experts:
        rows += moe_sublayers(model, x)
        if model.dropout > 0:
            rows.append(Sublayer("dropout_mlp", "dropout", F.dropout(x.norm_tokens * e, elem_bytes=eb)))
        rows.append(Sublayer("residual_mlp", "elementwise", residual_add(x.norm_tokens * e, eb)))
        return rows
    rows += _column_linears(model, x, (("fc1_gate", f_t), ("fc1_up", f_t)) if glu and eager  # w1, w3
                            else (("fc1", (2 if glu else 1) * f_t),))
    rows.append(act_sublayer("act", model, T * f_t, eb))
    fc2 = F.linear(T, f_t, e, bias=model.bias, elem_bytes=eb)
    rows.append(Sublayer("fc2", "linear", fc2, comms=_row_parallel_comms(x, T * e), gemm=(T, f_t, e)))
    if model.dropout > 0:
        rows.append(Sublayer("dropout_mlp", "dropout", F.dropout(x.norm_tokens * e, elem_bytes=eb)))
    rows.append(Sublayer("residual_mlp", "elementwise", residual_add(x.norm_tokens * e, eb)))
    return rows


def layer_sublayers(model, x: Shape, *, causal=False, flash=False, eager=False, eager_norm=False):
    """All sublayers of one transformer layer on one GPU, in execution order (``eager``, ``eager_norm``: the
    reference Llama code's unfused ops, ``step.Options``)."""
    if x.grid:
        return grid_layer_sublayers(model, x, causal=causal, flash=flash)
    ln1 = norm_sublayer("layer_norm_1", model, x.norm_tokens, model.hidden, x.elem_bytes, residual=True,
                        eager=eager_norm)
    return [ln1, *attention_sublayers(model, x, causal=causal, flash=flash, eager=eager),
            *mlp_sublayers(model, x, eager_norm, eager)]


def model_sublayers(model, x: Shape, *, tied_copy, eager_norm=False, eager=False):
    """Embedding (first stage) and final norm, LM head, loss (last stage: Megatron-LM's vocab-parallel loss on the
    fp32 logits, ``vocab_parallel_cross_entropy_sublayer``; ``eager``: torch's cross entropy on them, as the
    reference Llama code computes it, ``cross_entropy_sublayer``).

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
    rows.append(norm_sublayer("final_norm", model, x.norm_tokens, e, eb, residual=False, eager=eager_norm, stage="last"))
    head = F.linear(T, e, v_t, bias=False, elem_bytes=eb)
    head = F.OpCost(head.fwd, head.bwd, np.where(x.sp, _sp_saved_input(head, x, e).act_mem, head.act_mem),
                    head.params * tied_copy)
    rows.append(Sublayer("lm_head", "linear", head, "last", _col_parallel_comms(x, T * e), gemm=(T, e, v_t)))
    ce_bytes = 3 * T * 4 * (x.t > 1)  # fp32 max, sum-exp and target logit per token
    ce_comms = (Collective("fwd", "allreduce", ce_bytes * np.ones_like(np.asarray(T, dtype=float))),)
    rows.append(cross_entropy_sublayer(T, v_t, eb, ce_comms, upcast=True) if eager
                else vocab_parallel_cross_entropy_sublayer(T, v_t, eb, ce_comms))
    return rows

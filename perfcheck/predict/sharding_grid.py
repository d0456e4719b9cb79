"""One transformer layer on one GPU under the grid schemes of tensor parallelism: 2D (Optimus), 2.5D
(Tesseract) and 3D. Megatron 1D is ``predict.sharding``; the shape and records are
``predict.sharding_shape``.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from perfcheck.predict import formulas as F
from perfcheck.predict.sharding_shape import (Collective, Shape, Sublayer, act_sublayer,
                                              grid_side, norm_sublayer, padded_vocab, residual_add, scale_macs,
                                              scaled_softmax, vocab_parallel_cross_entropy_sublayer)


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


def grid_gemm(x: Shape, tokens, in_f, out_f):
    """(m, k, n) of one kernel of ``grid_linear``: 3D (T/q, in_f/q) @ (in_f/q, out_f/q) on the gathered blocks;
    2D/2.5D one SUMMA step (T/row_split, in_f/q) @ (in_f/q, out_f/q). At q = 1 it is 1D's (T, in_f, out_f),
    so the roofline's shape curve and alignment see the same GEMM under every scheme."""
    q = x.q
    rows = tokens / q if x.scheme == "3d" else tokens / x.row_split
    return rows, in_f / q, out_f / q


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


def _grid_norm(model, x: Shape, name, stage="layer"):
    """LayerNorm/RMSNorm on this GPU's (T/row_split, e/q) block; the per-token sums (mean and
    mean of squares: two values per token) all-reduced over the q feature ranks, fwd and bwd."""
    rows, eb = x.tokens / x.row_split, x.elem_bytes
    stats = 2 * rows * eb * (x.q > 1)
    return norm_sublayer(name, model, rows, model.hidden / x.q, eb, residual=stage == "layer", stage=stage,
                         comms=(Collective("fwd", "allreduce", stats, "q"), Collective("bwd", "allreduce", stats, "q")))


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
        rows.append(Sublayer("core_attention", "attention", core, attention=(x.s, hd, causal)))
    else:
        probs = b * hq * x.s * x.s
        rows.append(Sublayer("logits", "matmul", scale_macs(F.matmul(x.s, hd, x.s, batch=b * hq, elem_bytes=eb), frac),
                             gemm=(x.s, hd, x.s)))
        rows.append(Sublayer("softmax", "softmax", scaled_softmax(b * hq * x.s, x.s, eb), recomputed_act=probs * eb))
        if model.dropout > 0:
            rows.append(Sublayer("dropout_softmax", "dropout", F.dropout(probs, elem_bytes=eb), recomputed_act=probs))
        rows.append(Sublayer("attend", "matmul", scale_macs(F.matmul(x.s, x.s, hd, batch=b * hq, elem_bytes=eb), frac),
                             recomputed_act=probs * eb, gemm=(x.s, x.s, hd)))
    out, comms = grid_linear(x, T, e, e, bias=model.bias, elem_bytes=eb)
    rows.append(Sublayer("out_proj", "linear", out, comms=comms, gemm=grid_gemm(x, T, e, e)))
    if model.dropout > 0:
        rows.append(Sublayer("dropout_attn", "dropout", F.dropout(x.local(e), elem_bytes=eb)))
    rows.append(Sublayer("residual_attn", "elementwise", residual_add(x.local(e), eb)))
    rows.append(_grid_norm(model, x, "layer_norm_2"))
    glu = model.activation == "swiglu"
    fc1, comms = grid_linear(x, T, e, (2 if glu else 1) * model.ffn_hidden, bias=model.bias, elem_bytes=eb)
    rows.append(Sublayer("fc1", "linear", fc1, comms=comms,
                         gemm=grid_gemm(x, T, e, (2 if glu else 1) * model.ffn_hidden)))
    inner = x.inner(model.ffn_hidden)
    rows.append(act_sublayer("act", model, inner, eb))
    fc2, comms = grid_linear(x, T, model.ffn_hidden, e, bias=model.bias, elem_bytes=eb)
    rows.append(Sublayer("fc2", "linear", fc2, comms=comms, gemm=grid_gemm(x, T, model.ffn_hidden, e)))
    if model.dropout > 0:
        rows.append(Sublayer("dropout_mlp", "dropout", F.dropout(x.local(e), elem_bytes=eb)))
    rows.append(Sublayer("residual_mlp", "elementwise", residual_add(x.local(e), eb)))
    return rows


def grid_model_sublayers(model, x: Shape, *, tied_copy):
    """Embedding (first stage), final norm, LM head and loss (last stage) under a grid scheme.

    Embedding: a (ceil(V/q), e/q) table block per GPU (3D: V*e/q**3 weights held), T/row_split
    lookups of e/q features, the partial lookups of the q vocabulary blocks all-reduced over q
    ranks in forward (Megatron's vocab-parallel pattern along one grid dimension; Colossal-AI's
    exact gather/scatter sequence for the embedding is not reproduced). LM head: a ``grid_linear``
    (e -> ceil(V/q) * q). Cross entropy: vocab-parallel over the q ranks holding a token's logits
    (three fp32 values per local token all-reduced), Megatron's kernels on fp32 logits
    (``vocab_parallel_cross_entropy_sublayer``: Colossal-AI's ``_VocabParallelCrossEntropy2D`` is "modified based on
    megatron.mpu.cross_entropy", its inputs cast to fp32 by ``custom_fwd(cast_inputs=torch.float32)``).
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
    rows.append(vocab_parallel_cross_entropy_sublayer(tokens_local, v_q, eb, (Collective(
        "fwd", "allreduce", ce_bytes * np.ones_like(np.asarray(T, dtype=float)), "q"),)))
    return rows

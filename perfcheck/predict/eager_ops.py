"""What a Llama layer costs beyond the fused kernels when it runs as the reference PyTorch code, eagerly.

The transformer front-end prices a layer as Megatron-LM runs it: one kernel per norm, rotary embedding and
activation. Meta's reference Llama model (llama/model.py), which torchtitan's ``torchtitan/models/llama/model.py``
copies (read at commit 1ea476e9f, April 2024) and which runs op by op without ``torch.compile``, spends more:

- ``RMSNorm.forward``: ``self._norm(x.float()).type_as(x) * self.weight`` with
  ``_norm(x) = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``: eight kernels, five of them over
  every element in fp32 (``eager_rms_norm``).
- ``apply_rotary_emb``: ``view_as_complex(xq.float()...) * freqs_cis``, ``view_as_real(...).type_as(xq)``: an fp32
  copy, a complex product and a copy back, for q and for k (``rotary_complex``).
- ``repeat_kv`` (grouped-query attention): ``x[:, :, :, None, :].expand(...).reshape(...)`` copies k and v up to
  every query head; its backward sums them back (``repeat_kv``).
- ``output.transpose(1, 2).contiguous()`` after the attention kernel: one copy of the output (``transpose_copy``).

Every cost lists its aten ops with their bytes at the width each runs in (``eb`` the model's element bytes,
fp32 4); backward as autograd runs them (derivatives.yaml). They are the ops ``perfcheck.estimate`` traces from
that code (tests/predict/test_eager_ops.py traces it and compares), written as formulas so that the front-end's
vectorised sweeps can use them. Small per-row and per-column terms (row statistics, the weight and the cos/sin
table) are counted where the ops read them.
"""
from __future__ import annotations

from perfcheck.predict.formulas import Cost, OpCost

FP32 = 4


def eager_rms_norm(rows, cols, elem_bytes) -> OpCost:
    """The reference RMSNorm over ``rows`` x ``cols`` (n elements), eb = ``elem_bytes``.

    forward, eight kernels: x.float() (eb + 4 per element), pow (4 + 4), mean (4; writes a row), + eps and rsqrt
    (on the rows), x * r (4 + 4), .type_as(x) (4 + eb), * weight (eb + eb): 7 x 4 + 4 eb bytes per element (36 in
    bf16); 4 FLOPs per element (pow, mean, mul, mul).
    backward, eleven: * weight's two gradients (g w: eb + eb; g out, then summed over rows: 3 eb), .type_as's
    (4 + eb), x * r's two (g r: 4 + 4; g x, summed over the row: 3 x 4), mean's expand (4), rsqrt's and add's (rows),
    pow's (g 2x: 3 x 4), the sum of x's two gradients (3 x 4), x.float()'s (4 + eb): 14 x 4 + 7 eb per element
    (70 in bf16); 6 FLOPs per element. Saves x.float() (which pow and the product share), the row statistic and
    the normalised output in eb (the weight product's input): 4 + eb bytes per element.
    Off a GPU's vectorised loop (``predict.strided``), n elements each: forward x.float() (a widening cast, where
    eb < 4), x * r (r broadcast), * weight (broadcast); backward g w, .type_as's (widening), g r, mean's expand.
    """
    n, eb = rows * cols, elem_bytes
    row, wide = rows * FP32, 1 * (eb < FP32)
    fwd = Cost(flops=4 * n, bytes=(7 * FP32 + 4 * eb) * n + 5 * row + cols * eb, kernels=8,
               strided_elems=(2 + wide) * n, strided_bytes=(wide * (eb + FP32) + 2 * FP32 + 2 * eb) * n)
    bwd = Cost(flops=6 * n, bytes=(14 * FP32 + 7 * eb) * n + 6 * row + cols * eb, kernels=11,
               strided_elems=(3 + wide) * n, strided_bytes=(2 * eb + wide * (eb + FP32) + 3 * FP32) * n)
    return OpCost(fwd, bwd, (FP32 + eb) * n + row, cols)


def rotary_complex(numel, table_elems, elem_bytes) -> OpCost:
    """The reference ``apply_rotary_emb`` on one tensor of ``numel`` elements with a cos/sin table of
    ``table_elems`` complex64 entries (seq x head_dim / 2).

    forward, three kernels: .float() (eb + 4), the complex product with the table (4 + 4, the table's 8 bytes per
    entry), .type_as (4 + eb): 4 x 4 + 2 eb per element (20 in bf16); 3 FLOPs per real element (a complex product:
    4 multiplies, 2 adds per pair). backward, three: the cast up (eb + 4), the product with the conjugate table
    (4 x 4), the cast down (4 + eb): 6 x 4 + 2 eb (28 in bf16); its read of the table (8 / (28 heads) of the
    rest, under 4% from 8 heads on) is left out, as ``perfcheck.estimate``'s count of that product leaves it.
    Off a GPU's vectorised loop (``predict.strided``): each direction's widening cast (eb < 4), n elements. The
    product with the broadcast table is off it too, but moves 8 bytes per element, memory-bound on every card measured
    (0.75-0.86 of the bandwidth): no excess, so it is left out here, where its slack would hide the cast's."""
    n, eb, table = numel, elem_bytes, table_elems * 2 * FP32
    wide = 1 * (eb < FP32)
    fwd = Cost(flops=3 * n, bytes=(4 * FP32 + 2 * eb) * n + table, kernels=3, strided_elems=wide * n,
               strided_bytes=wide * (eb + FP32) * n)
    bwd = Cost(flops=3 * n, bytes=(6 * FP32 + 2 * eb) * n, kernels=3, strided_elems=wide * n,
               strided_bytes=wide * (eb + FP32) * n)
    return OpCost(fwd, bwd, FP32 * n, 0)


def repeat_kv(repeated_elems, n_rep, elem_bytes) -> OpCost:
    """The reference ``repeat_kv`` of one of k, v to ``repeated_elems`` elements (n_rep copies of each head).

    forward: the reshape of the expanded view copies it: reads the view, writes the copy (2 eb per output element),
    off a GPU's vectorised loop (a zero-stride source: ``predict.strided``).
    backward: expand's gradient sums the n_rep copies: reads the gradient, writes 1/n_rep of it."""
    n, eb = repeated_elems, elem_bytes
    return OpCost(Cost(bytes=2 * eb * n, kernels=1, strided_elems=n, strided_bytes=2 * eb * n),
                  Cost(flops=n, bytes=eb * n * (1 + 1 / n_rep), kernels=1), 0, 0)


def transpose_copy(numel, elem_bytes) -> OpCost:
    """``.transpose(1, 2).contiguous()`` of the attention output: one copy forward (read + write); its backward is
    a view of the gradient (no kernel). The copy reads a permuted source: off a GPU's vectorised loop."""
    return OpCost(Cost(bytes=2 * elem_bytes * numel, kernels=1, strided_elems=numel,
                       strided_bytes=2 * elem_bytes * numel), Cost(), 0, 0)

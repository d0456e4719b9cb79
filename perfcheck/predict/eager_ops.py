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
- ``output.transpose(1, 2).contiguous()`` after the attention: one copy of the output (``transpose_copy``) where the
  attention is unfused (matmul, softmax, matmul: a (b, h, s, d) product); a fused SDPA kernel (flash, cuDNN, the CPU's
  flash) writes its output as (b, s, h, d), so the transpose is already contiguous and no kernel runs (the trace of
  torchtitan's code on the meta device, and an H200's kernel table of it: bench/gpu_results/2026-11-27-layers/).

Every cost lists its aten ops with their bytes at the width each runs in (``eb`` the model's element bytes,
fp32 4); backward as autograd runs them (derivatives.yaml). They are the ops ``perfcheck.estimate`` traces from
that code (tests/predict/test_eager_ops.py traces it and compares), written as formulas so that the front-end's
vectorised sweeps can use them. Small per-row and per-column terms (row statistics, the weight and the cos/sin
table) are counted where the ops read them.
"""
from __future__ import annotations

from perfcheck.predict.aten_costs import SEVERAL_KERNEL_BACKWARD
from perfcheck.predict.formulas import Cost, OpCost

FP32 = 4


def total(parts) -> OpCost:
    """One cost of a row's parts ((aten name, cost) pairs)."""
    out = OpCost()
    for _, cost in parts:
        out = out + cost
    return out


def _cost(bytes_fwd, bytes_bwd, *, flops=(0, 0), kernels=(1, 1), strided=((0, 0), (0, 0)), act_mem=0, params=0):
    """An OpCost from per-phase (bytes, FLOPs, kernels, (strided elements, strided bytes))."""
    (ef, bf), (eb_, bb) = strided
    return OpCost(Cost(flops=flops[0], bytes=bytes_fwd, kernels=kernels[0], strided_elems=ef, strided_bytes=bf),
                  Cost(flops=flops[1], bytes=bytes_bwd, kernels=kernels[1], strided_elems=eb_, strided_bytes=bb),
                  act_mem, params)


def eager_rms_norm_parts(rows, cols, elem_bytes) -> tuple:
    """The reference RMSNorm over ``rows`` x ``cols`` (n elements), eb = ``elem_bytes``, as its aten ops ((name, cost)
    pairs, as ``perfcheck.estimate`` traces them; tests/predict/test_eager_ops.py compares them op by op).

    forward: x.float() (eb + 4 per element; only where eb < 4: on fp32 it returns x), pow (4 + 4), mean (4; writes a
    row), + eps and rsqrt (on the rows), x * r (4 + 4, reads the row), .type_as(x) (4 + eb; only where eb < 4),
    * weight (eb + eb, reads the weight): 7 x 4 + 4 eb bytes per element in bf16 (36), eight kernels.
    backward as autograd runs them: * weight's two gradients (g w: eb + eb; the weight's: the product g x_n, 3 eb,
    then its sum over rows, eb: three kernels), .type_as's (4 + eb), x * r's two (g r: 4 + 4; r's: the product
    g x, 3 x 4, then its sum per row, 4: three kernels; ``aten_costs._broadcast_sums``), rsqrt's
    (rows, three kernels: ``aten_costs._several_kernel_backward``; + eps passes its gradient on), mean's expand (4),
    pow's (grad * (2 * x.pow(1)): a copy, a scalar product, a product: 7 x 4, three kernels), the sum of x's two
    gradients (autograd's add, 3 x 4), x.float()'s (4 + eb): 19 x 4 + 8 eb per element in bf16 (92), sixteen
    kernels, as torch.profiler lists them (the + eps hands its gradient on). FLOPs: pow, mean, each product one per
    element forward, their gradients three per product (the sum's included), pow's three; the row ops one per row.
    Off a GPU's vectorised loop (``predict.strided``), n elements each: forward x.float() (a widening cast), x * r
    (r broadcast), * weight (broadcast); backward .type_as's (widening), mean's expand, x * r's and * weight's (a
    broadcast operand). Saved (on the last part): x.float(), the row statistic, the normalised output in eb."""
    n, eb, row = rows * cols, elem_bytes, rows * FP32
    wide = eb < FP32
    w = cols * eb
    (pow_k, pow_passes), (rsqrt_k, rsqrt_passes) = SEVERAL_KERNEL_BACKWARD["pow"], SEVERAL_KERNEL_BACKWARD["rsqrt"]
    parts = [
        ("pow", _cost(8 * n, pow_passes * FP32 * n, flops=(n, pow_k * n), kernels=(1, pow_k))),  # x.pow(1), 2 *, g *
        ("mean", _cost(4 * n + row, 4 * n + row, flops=(n, 0), strided=((0, 0), (n, 4 * n + row)))),
        ("add", _cost(2 * row, 0, flops=(rows, 0), kernels=(1, 0))),  # + eps: its gradient passes through
        ("rsqrt", _cost(2 * row, rsqrt_passes * row, flops=(rows, rsqrt_k * rows), kernels=(1, rsqrt_k))),  # -0.5*, pow
        ("mul", _cost(8 * n + row, 24 * n + row, flops=(n, 3 * n), kernels=(1, 3),
                      strided=((n, 8 * n + row), (n, 12 * n)))),
        ("mul", _cost(2 * eb * n + w, 6 * eb * n + w, flops=(n, 3 * n), kernels=(1, 3),
                      strided=((n, 2 * eb * n + w), (n, 3 * eb * n)), act_mem=(FP32 + eb) * n + row, params=cols)),
        ("add", _cost(0, 12 * n, flops=(0, n), kernels=(0, 1))),  # autograd's sum of x.float()'s two gradients
    ]
    if wide:
        parts += [("_to_copy", _cost((eb + FP32) * n, (eb + FP32) * n, strided=((n, (eb + FP32) * n), (0, 0)))),
                  ("_to_copy", _cost((eb + FP32) * n, (eb + FP32) * n, strided=((0, 0), (n, (eb + FP32) * n))))]
    return tuple(parts)


def eager_rms_norm(rows, cols, elem_bytes) -> OpCost:
    """The reference RMSNorm as one cost: the sum of ``eager_rms_norm_parts``."""
    return total(eager_rms_norm_parts(rows, cols, elem_bytes))


def rotary_complex_parts(numel, table_elems, elem_bytes) -> tuple:
    """The reference ``apply_rotary_emb`` on one tensor of ``numel`` elements with a cos/sin table of
    ``table_elems`` complex64 entries (seq x head_dim / 2), as its aten ops.

    forward, three kernels: .float() (eb + 4), the complex product with the table (4 + 4, the table's 8 bytes per
    entry), .type_as (4 + eb): 4 x 4 + 2 eb per element (20 in bf16); 3 FLOPs per real element (a complex product:
    4 multiplies, 2 adds per pair). backward, three: the cast up (eb + 4), the product with the conjugate table
    (4 x 4), the cast down (4 + eb): 6 x 4 + 2 eb (28 in bf16); its read of the table (8 / (28 heads) of the
    rest, under 4% from 8 heads on) is left out, as ``perfcheck.estimate``'s count of that product leaves it.
    Off a GPU's vectorised loop (``predict.strided``): each direction's widening cast (eb < 4), n elements, and the
    product with the broadcast table (n / 2 complex elements), memory-bound on every card measured (0.75-0.86 of the
    bandwidth): timed as its own kernel, it pays no excess."""
    n, eb, table = numel, elem_bytes, table_elems * 2 * FP32
    wide = 1 * (eb < FP32)
    cast = (eb + FP32) * n
    return (("_to_copy", _cost(cast, cast, strided=((wide * n, wide * cast), (0, 0)))),
            ("mul", _cost(2 * FP32 * n + table, 4 * FP32 * n, flops=(3 * n, 3 * n),
                          strided=((n / 2, 2 * FP32 * n + table), (n / 2, 4 * FP32 * n)), act_mem=FP32 * n)),
            ("_to_copy", _cost(cast, cast, strided=((0, 0), (wide * n, wide * cast)))))


def rotary_complex(numel, table_elems, elem_bytes) -> OpCost:
    """The reference rotary embedding as one cost: the sum of ``rotary_complex_parts``."""
    return total(rotary_complex_parts(numel, table_elems, elem_bytes))


def repeat_kv_parts(repeated_elems, n_rep, elem_bytes) -> tuple:
    """The reference ``repeat_kv`` of one of k, v to ``repeated_elems`` elements (n_rep copies of each head).

    forward: the reshape of the expanded view copies it (``clone``): reads the view, writes the copy (2 eb per output
    element), off a GPU's vectorised loop (a zero-stride source: ``predict.strided``).
    backward: expand's gradient sums the n_rep copies: reads the gradient, writes 1/n_rep of it."""
    n, eb = repeated_elems, elem_bytes
    return (("clone", _cost(2 * eb * n, 0, kernels=(1, 0), strided=((n, 2 * eb * n), (0, 0)))),
            ("expand", _cost(0, eb * n * (1 + 1 / n_rep), flops=(0, n), kernels=(0, 1))))


def repeat_kv(repeated_elems, n_rep, elem_bytes) -> OpCost:
    """``repeat_kv`` as one cost: the sum of ``repeat_kv_parts``."""
    return total(repeat_kv_parts(repeated_elems, n_rep, elem_bytes))


def transpose_copy_parts(numel, elem_bytes) -> tuple:
    """``.transpose(1, 2).contiguous()`` of the attention output: one copy forward (``clone``: read + write); its
    backward is a view of the gradient (no kernel). The copy reads a permuted source: off a GPU's vectorised loop."""
    return (("clone", _cost(2 * elem_bytes * numel, 0, kernels=(1, 0),
                            strided=((numel, 2 * elem_bytes * numel), (0, 0)))),)


def transpose_copy(numel, elem_bytes) -> OpCost:
    """The output copy as one cost: the sum of ``transpose_copy_parts``."""
    return total(transpose_copy_parts(numel, elem_bytes))

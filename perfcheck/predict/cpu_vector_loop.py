"""Which CPU elementwise kernels leave PyTorch's vectorised loop: the CPU's predicate (a GPU's: ``predict.strided``).

PyTorch's CPU elementwise kernels (``cpu_kernel_vec``, aten/src/ATen/native/cpu/Loops.h) hand TensorIterator a
2-D loop, ``VectorizedLoop2d``: it runs ``vectorized_loop`` (SIMD loads and stores) over the innermost dimension
when ``is_contiguous<traits>(strides)`` (every operand's inner stride is its element size) or
``is_contiguous_scalar<traits, S>`` (exactly one input's inner stride is 0, a scalar along that dimension, every
other operand's the element size); otherwise ``basic_loop``, one scalar load per operand per element through its
stride. The outer dimension only advances the pointers, so a broadcast over OUTER dimensions keeps the inner loop
vectorised. The strides it sees are TensorIterator's after two steps (aten/src/ATen/TensorIterator.cpp,
TensorIteratorInternal.h):

  ``reorder_dimensions``: an insertion sort of the dimensions, fastest first, by ``should_swap(d0, d1)``: the
      first operand (outputs first; an output it allocates is skipped) whose strides on d0 and d1 are both
      non-zero and differ decides (smaller stride goes first); equal strides: the smaller size goes first when
      this operand says so, else the next operand is asked; nobody decides: the order stays. An output it
      allocates gets contiguous strides in that order (``allocate_or_resize_outputs``): its inner stride is 1.
  ``coalesce_dimensions``: adjacent dimensions merge when either has size 1 or, for EVERY operand,
      shape[d0] * stride[d0] == stride[d1].

So the rule, on the strides after both steps: off the vectorised loop when some operand's innermost stride is
neither 1 nor (for one input alone) 0. Examples (hand reasoning, tests/predict/test_cpu_vector_loop.py):
``x.permute(0, 2, 3, 1).contiguous()`` (output contiguous, source inner stride H*W): off; a channel shuffle
``x.view(b, g, c // g, h, w).transpose(1, 2).contiguous()`` (inner h*w contiguous in both): on; ``relu`` of a
permuted dense view (its output allocated in the same order): on; ``a + b.permute(...)`` with ``a`` contiguous: off;
``x * w`` with ``w`` broadcast along the inner dimension (a scalar there): on; ``x[..., ::2] * 2``: off.

One exception in the copy (aten/src/ATen/native/Copy.cpp, ``copy_impl``): a 2-D source of strides (1, size(0))
copied to a contiguous tensor of the same dtype with >= 60 * 60 elements goes to ``copy_same_type_transpose_``,
a blocked transpose, not TensorIterator (``is_blocked_transpose``).

Pure Python on (shape, strides) in elements: the tracer records both (``aten_costs.TensorMeta.stride``).
"""
from __future__ import annotations

import math


def contiguous_strides(shape) -> tuple:
    """Row-major strides, in elements, of ``shape``."""
    out, acc = [], 1
    for n in reversed(tuple(shape)):
        out.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(out))


def _broadcast_strides(shape, op_shape, op_stride) -> list:
    """``op``'s strides on the full ``shape`` (right-aligned; 0 where it broadcasts: a missing or size-1 dim)."""
    off = len(shape) - len(op_shape)
    out = [0] * len(shape)
    for i, (n, s) in enumerate(zip(op_shape, op_stride)):
        out[off + i] = 0 if (n == 1 and shape[off + i] != 1) else int(s)
    return out


def inner_strides(shape, operands) -> tuple:
    """(inner size, inner strides per operand) after TensorIterator's reorder and coalesce (the module docstring).

    ``operands``: [(shape, strides or None)], the output first; None for an output TensorIterator allocates."""
    shape = [int(n) for n in shape]
    nd = len(shape)
    if nd == 0 or math.prod(shape) <= 1:
        return (math.prod(shape), tuple(1 for _ in operands))
    strides = [None if st is None else _broadcast_strides(shape, s, st) for s, st in operands]

    def should_swap(d0, d1):
        for st in strides:
            if st is None:
                continue
            s0, s1 = st[d0], st[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(range(nd))[::-1]
    for i in range(1, nd):
        dim1 = i
        for dim0 in range(i - 1, -1, -1):
            cmp = should_swap(perm[dim0], perm[dim1])
            if cmp > 0:
                perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
                dim1 = dim0
            elif cmp < 0:
                break
    sh = [shape[p] for p in perm]
    st = []
    for s in strides:
        if s is None:  # allocated in the iterator's order: contiguous there
            acc, alloc = 1, []
            for n in sh:
                alloc.append(acc)
                acc *= n
            st.append(alloc)
        else:
            st.append([s[p] for p in perm])
    prev = 0
    for dim in range(1, nd):
        if sh[prev] == 1 or sh[dim] == 1 or all(sh[prev] * s[prev] == s[dim] for s in st):
            if sh[prev] == 1:
                for s in st:
                    s[prev] = s[dim]
            sh[prev] *= sh[dim]
        else:
            prev += 1
            if prev != dim:
                for s in st:
                    s[prev] = s[dim]
                sh[prev] = sh[dim]
    return sh[0], tuple(s[0] for s in st)


def off_vector_loop(shape, operands) -> bool:
    """True where a ``cpu_kernel_vec`` kernel over ``operands`` (output first, as in ``inner_strides``) runs
    ``basic_loop``: after reorder and coalesce, some operand's inner stride is neither 1 nor, for one input
    alone, 0 (Loops.h: ``is_contiguous`` / ``is_contiguous_scalar``)."""
    size, inner = inner_strides(shape, operands)
    if size <= 1:
        return False
    out, ins = inner[0], inner[1:]
    if out != 1:
        return True
    if all(s == 1 for s in ins):
        return False
    zeros = sum(s == 0 for s in ins)
    return not (zeros == 1 and all(s in (0, 1) for s in ins))


def is_blocked_transpose(out_shape, out_stride, src_shape, src_stride, same_dtype=True) -> bool:
    """A copy torch runs as a blocked 2-D transpose, not TensorIterator (Copy.cpp ``copy_transpose_valid``): a
    contiguous destination, a 2-D source of strides (1, size(0)), the same dtype and shape, >= 60 * 60 elements."""
    return (same_dtype and len(src_shape) == 2 and tuple(out_shape) == tuple(src_shape)
            and tuple(out_stride) == contiguous_strides(out_shape) and math.prod(src_shape) >= 60 * 60
            and int(src_stride[0]) == 1 and int(src_stride[1]) == int(src_shape[0]))


__all__ = ["contiguous_strides", "inner_strides", "off_vector_loop", "is_blocked_transpose"]

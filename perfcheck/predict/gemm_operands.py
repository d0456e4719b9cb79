"""The GEMM dimensions of a traced matmul-family call (mm, addmm, bmm, baddbmm, addbmm, matmul): its smallest
dimension, its row-stride alignment and its (batch, m, k, n), which the roofline's shape, alignment and
output-width factors read (``roofline``, ``gemm_shape``, ``module_estimator``'s op table).
"""
from __future__ import annotations


#: Matmul-family aten ops -> the positions of their two matrix operands (a: m x k, b: k x n).
_GEMM_OPERANDS = {"mm": (0, 1), "bmm": (0, 1), "matmul": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2), "addbmm": (1, 2)}


def _gemm_operands(call):
    """``(a, b)``, the two matrix operands of a matmul-family call; None for any other op."""
    idx = _GEMM_OPERANDS.get(call.name)
    if idx is None:
        return None
    try:
        return call.args[idx[0]], call.args[idx[1]]
    except (IndexError, TypeError):
        return None


def gemm_min_dim(call) -> float:
    """Smallest of (m, k, n) for a matmul-family aten call (mm, addmm, bmm, baddbmm, matmul); NaN otherwise.

    The backward GEMMs of a matmul use the same three dimensions (dX = dY W^T: m, n, k; dW =
    X^T dY: k, m, n), so one value serves both phases.
    """
    operands = _gemm_operands(call)
    if operands is None:
        return float("nan")
    a, b = operands
    try:
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    except (AttributeError, IndexError, TypeError):
        return float("nan")
    return float(min(m, k, n))


#: Bytes a GEMM's row strides must be a multiple of for cuBLAS's fastest tensor-core kernels (16-byte
#: vector loads): k and n multiples of 8 in bf16/fp16, of 4 in fp32/tf32. NVIDIA, "Matrix Multiplication
#: Background User's Guide", Tensor Core Requirements (docs.nvidia.com/deeplearning/performance).
GEMM_ALIGN_BYTES = 16


def gemm_unaligned(call) -> float:
    """1.0 when a matmul-family call (mm, addmm, bmm, baddbmm, matmul) has k or n (the row strides of
    its operands and output, also of its backward GEMMs: dX = dY W^T, dW = X^T dY) that is not a
    multiple of ``GEMM_ALIGN_BYTES`` bytes; 0.0 when both are; NaN for any other op or an unknown shape.
    m (the rows) does not matter. GPT-2's lm_head (768 -> 50257, bf16) is unaligned."""
    operands = _gemm_operands(call)
    if operands is None:
        return float("nan")
    a, b = operands
    try:
        k, n = int(a.shape[-1]), int(b.shape[-1])
        size = int(a.elem_bytes) if hasattr(a, "elem_bytes") else int(a.element_size())  # TensorMeta | Tensor
    except (AttributeError, IndexError, TypeError, ValueError):
        return float("nan")
    return float((k * size) % GEMM_ALIGN_BYTES != 0 or (n * size) % GEMM_ALIGN_BYTES != 0)


def gemm_dims(call):
    """``(batch, m, k, n, a_grad, b_grad, elem_bytes)`` of a matmul-family call (a: m x k, b: k x n, batch 1 for
    2-D operands; a_grad/b_grad: whether backward computes that operand's gradient); None for any other op or an
    unknown shape. The forward GEMM writes batch x m rows of n; backward's dA = dC b^T writes batch x m rows of
    k, its dB = a^T dC batch x k rows of n (perfcheck.predict.formulas.matmul)."""
    operands = _gemm_operands(call)
    if operands is None:
        return None
    a, b = operands
    try:
        m, k, n = int(a.shape[-2]), int(a.shape[-1]), int(b.shape[-1])
        batch = int(a.shape[0]) if len(a.shape) == 3 and call.name in ("bmm", "baddbmm") else 1
        return batch, m, k, n, bool(a.requires_grad), bool(b.requires_grad), int(a.elem_bytes)
    except (AttributeError, IndexError, TypeError, ValueError):
        return None


__all__ = ["GEMM_ALIGN_BYTES", "gemm_min_dim", "gemm_unaligned", "gemm_dims"]

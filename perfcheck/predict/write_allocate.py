"""In-place kernels on a CPU stream faster than the copy the calibration timed: the write-allocate a copy pays.

A store to a line the cache does not hold reads the line first (write-allocate), so a copy's counted bytes (read n,
write n) move 3n, and the bandwidth curve calibration measures with copies (``mem_bandwidth_curve``) carries that
hidden read. A kernel that writes the tensor it has just read (``add_``, ``mul_``, an optimizer's updates) stores into
lines it holds: its counted bytes are what moves, 3n / 2n = 1.5 the copy's counted rate. ``roofline.memory_time_s``
applies the gain per kernel (``write_allocate_gain``), so the op table's rows and the optimizer's kernels get it alike.
Evidence (bench/results/inplace_bandwidth.md) on the project's AMD VM, one thread, counted GB/s, copy / out-of-place
add / add_ / mul_: 64 MiB 25.5 / 26-28 / 40-45 / 47; 16 MiB 23-38 / 31 / 52-61 / 109-119; 4 MiB 88-92 / 77-85 / 127 /
176; and the optimizers, whose kernels are in place, alone on one tensor: SGD over 4 M elements 0.9-1.2 ms against
2.28 priced at the copy's rate, SGD with momentum over 9.4 M 5.7-8.0 against 14.3, AdamW over 3.9 M 9.0-10.9 against
15.4.
"""
from __future__ import annotations

import numpy as np

from perfcheck.hardware.systems import spec_of
from perfcheck.predict.grad_accumulation import ACCUMULATE_NAME

#: How much faster than a copy's counted rate an in-place kernel streams beyond the L2 on a CPU (the module docstring).
WRITE_ALLOCATE_GAIN = 1.5
#: In-place ops that only write the tensor (no read of it first): they pay the write-allocate as a copy does.
WRITE_ONLY = frozenset(("copy_", "fill_", "zero_", "normal_", "uniform_", "bernoulli_", "random_", "exponential_",
                        "geometric_", "cauchy_", "log_normal_", "set_", "resize_", "detach_", "requires_grad_"))


def is_inplace(name: str) -> bool:
    """Does aten op ``name``'s kernel write a tensor it reads (``add_``, ``relu_``, ``_foreach_mul_``,
    ``_fused_adamw_``; not a write-only one, ``WRITE_ONLY``)?"""
    n = str(name)
    return n.endswith("_") and (not n.startswith("_") or n.startswith(("_foreach_", "_fused_"))) and n not in WRITE_ONLY


def inplace_kernels(names, phase: str) -> np.ndarray:
    """Per op of an op table: is its ``phase`` kernel in place? Forward: ``is_inplace`` of its name (its backward runs
    other, out-of-place kernels: ``relu_``'s is ``threshold_backward``); backward: the engine's gradient accumulation
    (``InputBuffer::accumulate``'s ``add_``, ``grad_accumulation``), the one backward-only op that is."""
    return np.array([is_inplace(n) if phase == "fwd" else str(n) == ACCUMULATE_NAME for n in names], dtype=bool)


def write_allocate_gain(system, per_kernel_bytes, inplace) -> np.ndarray:
    """``WRITE_ALLOCATE_GAIN`` where a kernel is in place (``inplace``, per kernel) and moves more than the core's L2
    (``calibration.l2_bytes``: below it the copy's stores hit lines the cache holds) on a CPU spec whose bandwidth a
    calibration measured with copies; 1 elsewhere (a GPU, a datasheet spec, ``inplace`` None)."""
    spec = spec_of(system)
    l2 = float((spec.calibration or {}).get("l2_bytes", 0) or 0)
    if inplace is None or spec.kind != "cpu" or l2 <= 0:
        return 1.0
    return np.where(np.asarray(inplace, dtype=bool) & (np.asarray(per_kernel_bytes, dtype=float) > l2),
                    WRITE_ALLOCATE_GAIN, 1.0)


__all__ = ["WRITE_ALLOCATE_GAIN", "WRITE_ONLY", "is_inplace", "inplace_kernels", "write_allocate_gain"]

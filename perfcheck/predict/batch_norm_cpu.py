"""The per-plane work of torch's CPU BatchNorm backward beyond its elements: the serial steps of its reductions."""
from __future__ import annotations

from typing import Optional


def batch_norm_reduction_steps(n, channels, spatial, vector_elems: Optional[int] = None) -> float:
    """Serial steps of a training BatchNorm backward's per-plane reductions on a CPU (its ``Cost.rows``, priced per
    step by the spec's op_row_s["native_batch_norm"]; 0 where ``vector_elems`` is None: not that kernel).

    torch's contiguous fp32 kernel (aten/src/ATen/native/cpu/batch_norm_kernel.cpp,
    ``batch_norm_cpu_backward_contiguous_impl``) reduces each (sample, channel) plane of ``spatial`` elements twice,
    ``vec::reduce_all`` (the sum of dY) and ``vec::map2_reduce_all`` (the dot of X - mean and dY), then writes dX with
    ``vec::map2``. A plane of at least one vector (``vector_elems``: the kernel's ``Vectorized`` size,
    perfcheck.hardware.cpu_vector) ends each reduction in one horizontal reduction (``VecReduceAllSIMD``): 1 step per
    plane. A shorter plane takes ``vec_reduce_all``'s slow path (aten/src/ATen/cpu/vec/functional_base.h): per element
    the vector stored, one lane copied into a zeroed array and reloaded, a serial chain through memory: ``spatial``
    steps per plane. A plane of 1 element runs the channels-last kernel (vectorized over the channels): 0 steps.
    Measured on the project's Xeon (its AVX2 kernel, 8 fp32 per vector; 1 thread, process time;
    bench/results/cnn_backward.md): 16-20 ns per element at planes of 2-7 elements, 15-20 ns per plane at 8-64,
    so one price per step."""
    if vector_elems is None or spatial <= 1:
        return 0.0
    return float(n * channels * (spatial if spatial < vector_elems else 1))

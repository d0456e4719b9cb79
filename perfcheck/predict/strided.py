"""Elementwise kernels a GPU runs at an element rate, not at its memory bandwidth: broadcast, strided and widening.

PyTorch's CUDA elementwise loops (aten/src/ATen/native/cuda/CUDALoops.cuh, ``gpu_kernel_impl``) run the vectorised
kernel (16-byte loads, no index arithmetic) only when every operand is contiguous and needs no dtype conversion on
load; an operand with a zero stride (a broadcast row statistic, a norm's weight, a bias), a permuted one (a
``transpose(...).contiguous()``, the copy behind ``expand(...).reshape(...)``) or a load that converts (a 2-byte float
widened to fp32) sends the op to ``elementwise_kernel`` / ``unrolled_elementwise_kernel``, which computes every
element's offsets through ``OffsetCalculator`` (an integer divide and modulo per dimension per operand) and moves one
element per load. Such a kernel is bound by the SMs' issue rate, not by HBM.

Evidence (bench/elementwise_gpu.py, bench/results/elementwise_gpu.md): at a Llama layer's sizes (8192 x 4096 and
8192 x 8192 elements) the same kernels write 287-492 G elements/s on an H100 SXM (HBM3, 3.35 TB/s) and 331-500 G/s
on an H200 (HBM3e, 4.8 TB/s; the same 132 SMs at 1980 MHz): 43% more bandwidth, 3-12% more speed, where the
vectorised copies, activations and contiguous products moved 0.82-0.89 of each card's bandwidth (they scale with
it). A spec gives the rate as ``strided_elements_per_s`` (0 or absent: not modelled, every CPU spec); the kernel's
time is the larger of its bytes at the memory rate and its elements at that rate:

    t = max(bytes / (bandwidth x eff_memory), elements / strided_elements_per_s)

so the excess over the memory term the roofline already charges is

    excess = max(0, elements / strided_elements_per_s - bytes / (bandwidth x eff_memory))        (strided_excess_s)

A cost (``formulas.Cost``) carries such kernels' written elements (``strided_elems``) and the bytes they move
(``strided_bytes``, already inside ``bytes``); ``roofline.device_times`` adds the excess to the memory term, for both
front-ends (the transformer's eager rows, ``eager_ops``, and the traced ops, ``aten_costs``).

A CPU: the same formula with its own rate and its own predicate. Its elementwise loop leaves SIMD on another rule
(``predict.cpu_vector_loop``: an operand's innermost stride after TensorIterator's reorder and coalesce neither 1
nor a lone 0; a broadcast, a widening cast keep it), so the traced ops carry the CPU's tags apart
(``Cost.cpu_strided_elems`` / ``cpu_strided_bytes``, tagged by ``aten_costs.cpu_vector_loop_cost``) and a CPU spec's
``strided_elements_per_s`` is calibrated (``calibrate.cpu_strided_cases``: strided kernels against their contiguous
twins). On a CPU the excess is added after the op's roofline (``roofline.device_times``), not inside its memory
term: one thread runs the strided pass and the op's other work one after the other (a layer norm's row-major
copy of a strided input, then the norm), and the calibration measures it so, as the difference from the twin.
"""

from __future__ import annotations

import numpy as np


def memory_rate(system) -> float:
    """Bytes per second the excess is taken against: the spec's bandwidth x its memory efficiency."""
    return system.mem_bandwidth_bytes_per_s * system.efficiency["memory"]


def strided_excess_s(strided_elems, strided_bytes, system):
    """Seconds the strided kernels take beyond their bytes at the memory rate (0 where the spec has no rate)."""
    rate = float(getattr(system, "strided_elements_per_s", 0.0) or 0.0)
    elems = np.asarray(strided_elems, dtype=float)
    if rate <= 0:
        return np.zeros_like(elems)
    return np.maximum(0.0, elems / rate - np.asarray(strided_bytes, dtype=float) / memory_rate(system))


def is_strided_operand(stored: int, numel: int, out_numel: int, contiguous: bool = True) -> bool:
    """True where an operand keeps an elementwise kernel off the vectorised loop: broadcast (fewer stored elements
    than the output writes, more than one: a single element is a scalar the loop hoists) or not contiguous."""
    if numel <= 1:
        return False
    return stored < out_numel or not contiguous


def strided_columns(ops, phase, cpu: bool = False):
    """(elements, bytes) of an op table's kernels off the vectorised loop in ``phase`` (columns
    ``strided_elems_<phase>``, ``strided_bytes_<phase>``; on a CPU ``cpu_strided_elems_<phase>``,
    ``cpu_strided_bytes_<phase>``: the CPU's own predicate, predict.cpu_vector_loop), or None where the table has none."""
    prefix = "cpu_strided" if cpu else "strided"
    if f"{prefix}_elems_{phase}" not in ops:
        return None
    return ops[f"{prefix}_elems_{phase}"].to_numpy(float), ops[f"{prefix}_bytes_{phase}"].to_numpy(float)

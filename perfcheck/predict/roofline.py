"""Roofline times on a ``SystemSpec``: the device time of an op (compute vs memory, its efficiency factors and launches).

Every function takes scalars or numpy arrays of one shape (numpy broadcasting) and never loops in Python, so a
10k-module estimate is a handful of array operations. Scalars in, scalars out.

Model (Williams et al., "Roofline", CACM 2009), as ``device_times`` applies it to every op and phase (the one
device-time path of ``perfcheck.estimate`` and the transformer front-end):

    compute  = matrix_flops / (matrix_peak(dtype) * e_matrix) + other_flops / (vector_peak * eff_vector)
    memory   = bytes_moved / (mem_bandwidth * eff_memory * bandwidth_factor(bytes per kernel)) + strided excess
    time     = max(compute, memory) / op_efficiency + kernels * device_kernel_s + rows_s
    bound    = "overhead" if the launch term exceeds max(compute, memory), else the larger of the two

e_matrix = the efficiency curve by FLOPs per kernel x ``shape_factor`` (GEMM smallest dimension) x
``alignment_factor`` (GEMM row strides); ``op_efficiency`` = ``efficiency.class_efficiency`` (the op's class, phase
and dtype; a measured curve read at the kernel's roofline seconds); ``rows_s`` = rows x ``row_prices`` (a CPU
kernel's price per row beyond its elements: an embedding's index, a convolution weight's reorder); the strided
excess: ``predict.strided``. The host side of each op (dispatch, autograd, module calls) is on a second timeline
that replaces this result per module (perfcheck.predict.host). Every factor with its formula: docs/model.md.

``ideal_time_s``: datasheet peaks, efficiency 1, no launch (a GPU's lower bound: its efficiencies are at most 1). Matrix
and vector work are added, not overlapped: one module's kernels mostly run one after another on one stream.
"""
from __future__ import annotations

import os

import numpy as np

from perfcheck.errors import UserError
from perfcheck.hardware.systems import SystemSpec, host_constants, normalize_dtype, row_costs, spec_of
from perfcheck.predict.attention_kernel import attention_fractions_of
from perfcheck.predict.gemm_calls import gemm_call_seconds
from perfcheck.predict import matrix_curve
from perfcheck.predict.strided import strided_columns, strided_excess_s
from perfcheck.predict.write_allocate import inplace_kernels, write_allocate_gain
from perfcheck.predict.efficiency import efficiencies, op_flop_prices
from perfcheck.predict.gemm_shape import WIDE_RATIO, narrow_factors, wide_factors  # noqa: F401 (fit_wide: WIDE_RATIO)
from perfcheck.predict.cold_curves import (COLD_GEMMS, gemm_cold_blend, memory_cold_blend, cold_cache_bytes,  # noqa: F401
                                           cold_factor, far_data, memory_cold_factor)


def _array(x, name: str) -> np.ndarray:
    """``x`` as a float array; negative entries are user errors (NaN passes through)."""
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError):
        raise UserError(f"{name} must be numeric, got {x!r}") from None
    if np.any(arr < 0):
        raise UserError(f"{name} must be >= 0 (got a negative value)")
    return arr


def _scalar_out(value, *inputs):
    """Return a Python scalar when every input was a scalar, else the array."""
    if all(np.ndim(x) == 0 for x in inputs):
        return value.item() if isinstance(value, np.ndarray) else value
    return value


def matrix_efficiency(system, dtype, flops_per_kernel=None, min_dim=None, align=None, cold=0.0, kernel_fraction=None):
    """Achievable fraction of the matrix peak; from the calibrated curves when the system has them.

    ``matrix_efficiency_curve`` gives efficiency by kernel size (FLOPs per kernel), interpolated
    linearly in log(FLOPs) and clamped at its ends; it is measured on square-ish GEMMs.
    ``matrix_shape_curve`` multiplies it by a factor keyed by the GEMM's smallest dimension
    (``min_dim``: min(m, k, n); a 96-row Linear runs ~1.4x slower than a square GEMM of equal
    FLOPs on a CPU), interpolated in log(min_dim) and clamped; NaN or absent ``min_dim`` (a
    convolution, an unknown shape) uses factor 1. A per-dtype override (``efficiency.matrix_fp8``)
    scales the curve by ``matrix_<dtype> / matrix``. ``align`` (optional, per GEMM) multiplies it:
    ``alignment_factor`` of GEMMs whose row strides are not 16-byte multiples. ``cold`` (per GEMM, the share of
    its operand bytes that come from beyond L2: ``predict.reuse.cold_shares``; any share > 0 counts) multiplies it
    by ``cold_factor``. Capped at 1. ``kernel_fraction`` (per op; NaN: none): a fused kernel's measured rate
    (``attention_kernel``) replaces all of that, times ``matrix_sustained`` (a short benchmark, as the curves').
    """
    system = spec_of(system)
    flat = system.matrix_efficiency(dtype)
    curve = system.matrix_efficiency_curve
    if not curve or flops_per_kernel is None:
        eff = flat if flops_per_kernel is None else np.full(np.shape(flops_per_kernel), flat)
    else:  # the size curve, measured in one dtype, carried to this one (``matrix_curve``)
        eff = matrix_curve.size_efficiency(system, dtype, flops_per_kernel)
    eff = np.minimum(np.asarray(eff, dtype=float) * shape_factor(system, min_dim)
                     * (1.0 if align is None else np.asarray(align, dtype=float))
                     * gemm_cold_blend(system, flops_per_kernel, cold), 1.0)
    kf = np.full(np.shape(eff), np.nan) if kernel_fraction is None else np.asarray(kernel_fraction, dtype=float)
    return np.where(np.isfinite(kf), kf * system.efficiency.get("matrix_sustained", 1.0), eff)[()]


def alignment_factor(system, unaligned, phase: str = "fwd"):
    """Efficiency multiplier of GEMMs flagged ``unaligned`` (1: ``gemm_unaligned``), 1 for the others:
    the spec's ``efficiency.matrix_unaligned`` in the forward, ``matrix_unaligned_bwd`` in the backward
    (its two GEMMs lose less: GPT-2's lm_head ran 6.3x fwd, 3.9x bwd below the aligned model on an
    H100), falling back to the forward's; 1 without either key."""
    eff = spec_of(system).efficiency
    f = eff.get("matrix_unaligned", 1.0)
    if phase == "bwd":
        f = eff.get("matrix_unaligned_bwd", f)
    if unaligned is None:
        return 1.0
    return np.where(np.asarray(unaligned, dtype=float) == 1.0, f, 1.0)[()]


def shape_factor(system, min_dim):
    """The ``matrix_shape_curve`` multiplier for GEMMs whose smallest dimension is ``min_dim`` (1 without a curve)."""
    system = spec_of(system)
    curve = system.matrix_shape_curve
    if min_dim is None or not curve:
        return 1.0 if min_dim is None else np.ones(np.shape(min_dim))[()]
    d = np.asarray(min_dim, dtype=float)
    xs = np.log(np.array([p[0] for p in curve]))
    ys = np.array([p[1] for p in curve])
    f = np.interp(np.log(np.where(np.isfinite(d) & (d > 0), d, 1.0)), xs, ys)
    return np.where(np.isfinite(d) & (d > 0), f, 1.0)[()]


def compute_time_s(matrix_flops, other_flops, system, dtype, *, kernels=None, min_dim=None, align=None, cold=0.0,
                   kernel_fraction=None):
    """Seconds to execute the FLOPs at achievable rates.

    ``kernels`` (optional) splits ``matrix_flops`` into equal kernels for the efficiency-curve
    lookup (FLOPs per kernel = matrix_flops / kernels); without it the whole is one kernel.
    ``min_dim`` (optional): the GEMMs' smallest dimension, for the shape curve; ``align`` (optional):
    the GEMMs' ``alignment_factor``; ``cold``: operands evicted from L2; ``kernel_fraction``: ``matrix_efficiency``'s
    (a measured kernel rate covers the kernel's vector FLOPs too: not added).
    """
    system = spec_of(system)
    mf = _array(matrix_flops, "matrix_flops")
    of = _array(other_flops, "other_flops")
    per_kernel = mf if kernels is None else mf / np.maximum(_array(kernels, "kernels"), 1.0)
    eff = matrix_efficiency(system, dtype, per_kernel, min_dim, align, cold, kernel_fraction)
    of = of if kernel_fraction is None else np.where(np.isfinite(np.asarray(kernel_fraction, dtype=float)), 0.0, of)
    t = mf / (system.matrix_peak(dtype) * eff) + of / (system.vector_peak(dtype) * system.efficiency["vector"])
    return _scalar_out(t, matrix_flops, other_flops, kernels)


def bandwidth_factor(system, bytes_per_kernel):
    """The ``mem_bandwidth_curve`` multiplier for kernels moving ``bytes_per_kernel`` (1 without a curve).

    The curve (bytes moved per kernel -> achieved bandwidth / the large-copy bandwidth, measured by
    ``perfcheck calibrate`` on copies of several sizes) is interpolated in log(bytes) and clamped at
    its ends: a working set that stays in a cache moves faster than the DRAM-sized copy the
    bandwidth ceiling is measured on (3.5x at 2 MiB on the project's EPYC VM, 1.0 from 8 MiB on).
    """
    system = spec_of(system)
    curve = system.mem_bandwidth_curve
    if bytes_per_kernel is None or not curve:
        return 1.0 if bytes_per_kernel is None else np.ones(np.shape(bytes_per_kernel))[()]
    xs = np.log(np.array([p[0] for p in curve]))
    ys = np.array([p[1] for p in curve])
    return np.interp(np.log(np.maximum(np.asarray(bytes_per_kernel, dtype=float), 1.0)), xs, ys)[()]


def memory_time_s(bytes_moved, system, *, kernels=None, cold=0.0, inplace=None):
    """Seconds to move ``bytes_moved`` through device memory at achievable bandwidth.

    ``kernels`` (optional) splits the bytes into equal kernels for the ``mem_bandwidth_curve`` lookup
    (bytes per kernel); without it the bandwidth is the large-copy ceiling, whatever the size. ``cold`` (per op,
    in [0, 1]: the share of its operand bytes whose reuse distance exceeds the L2, ``predict.reuse.cold_shares``)
    lengthens it by ``memory_cold_factor``:

        memory = bytes / (bandwidth x eff_memory x bandwidth_factor) x (1 + cold x (1 / f - 1))

    i.e. the far share of the bytes moves at f of the tight-loop rate (f = ``memory_cold_curve`` at the bytes per
    kernel; 1 without a curve, so an older spec is unchanged). ``inplace`` (optional, bool per kernel): an in-place
    kernel beyond the L2 moves at ``write_allocate_gain`` x that rate on a calibrated CPU.
    """
    system = spec_of(system)
    b = _array(bytes_moved, "bytes_moved")
    per_kernel = None if kernels is None else b / np.maximum(_array(kernels, "kernels"), 1.0)
    factor = 1.0 if kernels is None else bandwidth_factor(system, per_kernel)
    factor = factor * write_allocate_gain(system, b if per_kernel is None else per_kernel, inplace)
    t = b / (system.mem_bandwidth_bytes_per_s * system.efficiency["memory"] * factor)
    t = t * memory_cold_blend(system, b if per_kernel is None else per_kernel, cold)
    return _scalar_out(t, bytes_moved)


def op_time_s(matrix_flops, other_flops, bytes_moved, kernels, system, dtype, *, launch_s=None, min_dim=None,
              align=None):
    """``(time_s, bound)``: roofline time plus launch overhead, and what limits it.

    bound is "compute", "memory" or "overhead" (a str for scalar inputs, else a numpy str
    array). Ties between compute and memory go to "compute". ``launch_s`` replaces the spec's
    ``launch_overhead_s`` per kernel: the host model (perfcheck.predict.host) passes the
    device-side ``device_kernel_s`` because it costs dispatch on the host timeline itself.
    ``min_dim``, ``align``: GEMM smallest dimension and alignment factor per op (see ``matrix_efficiency``).
    """
    system = spec_of(system)
    k = _array(kernels, "kernels")
    compute = np.asarray(compute_time_s(matrix_flops, other_flops, system, dtype, kernels=kernels, min_dim=min_dim,
                                        align=align))
    memory = np.asarray(memory_time_s(bytes_moved, system, kernels=kernels))
    roof = np.maximum(compute, memory)
    launch = k * (system.launch_overhead_s if launch_s is None else _array(launch_s, "launch_s"))
    time = roof + launch
    bound = np.where(launch > roof, "overhead", np.where(compute >= memory, "compute", "memory"))
    inputs = (matrix_flops, other_flops, bytes_moved, kernels)
    if all(np.ndim(x) == 0 for x in inputs):
        return float(time), str(bound)
    return time, bound


def ideal_time_s(matrix_flops, other_flops, bytes_moved, kernels=None, system=None, dtype=None):
    """Lower bound: max(FLOPs at datasheet peak, bytes at datasheet bandwidth), no launch term.

    Takes the same arguments as ``op_time_s`` (``kernels`` is accepted and ignored) so call sites
    can swap the two; ``ideal_time_s(mf, of, bytes, system, dtype)`` also works.
    """
    if dtype is None and isinstance(kernels, (SystemSpec, str, os.PathLike)):  # called without kernels
        kernels, system, dtype = None, kernels, system
    if system is None or dtype is None:
        raise UserError("ideal_time_s: give system and dtype")
    system = spec_of(system)
    normalize_dtype(dtype)
    mf = _array(matrix_flops, "matrix_flops")
    of = _array(other_flops, "other_flops")
    b = _array(bytes_moved, "bytes_moved")
    compute = mf / system.matrix_peak(dtype) + of / system.vector_peak(dtype)
    t = np.maximum(compute, b / system.mem_bandwidth_bytes_per_s)
    return _scalar_out(t, matrix_flops, other_flops, bytes_moved)


def flag_rate_above_peak(achieved_flops_per_s, system, dtype, tolerance: float = 1.0):
    """True where a measured FLOP/s exceeds the datasheet matrix peak (times ``tolerance``).

    Such rates are measurement artifacts (a timer that missed work, a double count), never
    performance: DeepSpeed's tutorial prints 1310 TFLOPS for a Linear on a 312 TFLOPS A100.
    NaN gives False.
    """
    system = spec_of(system)
    rate = np.asarray(achieved_flops_per_s, dtype=float)
    flags = rate > system.matrix_peak(dtype) * tolerance
    return _scalar_out(np.asarray(flags), achieved_flops_per_s)


def flag_bandwidth_above_peak(achieved_bytes_per_s, system, tolerance: float = 1.0):
    """True where a measured device-memory B/s exceeds the datasheet bandwidth (artifact, or cache hits)."""
    system = spec_of(system)
    rate = np.asarray(achieved_bytes_per_s, dtype=float)
    flags = rate > system.mem_bandwidth_bytes_per_s * tolerance
    return _scalar_out(np.asarray(flags), achieved_bytes_per_s)


def device_times(matrix_flops, other_flops, bytes_moved, kernels, system, dtype, *, launch_s, min_dim=None,
                 align=None, op_eff=1.0, rows_s=0.0, cold=0.0, cold_memory=0.0, calls=None,
                 kernel_fraction=None, strided=None, compute_floor_s=0.0, far_memory=0.0, inplace=None) -> dict:
    """The device timeline of ops, the ONE timing path of every front-end (``perfcheck.estimate``'s op table via
    ``op_device_times``, the transformer front-end's rows via ``predict.step``): arrays of one shape in and out:

        compute  = ``compute_time_s`` (matrix_efficiency_curve by FLOPs per kernel, matrix_shape_curve by the
                   GEMM's smallest dimension ``min_dim``, ``align``ment factor), at least ``compute_floor_s``
                   (the op's FLOPs at its own measured price, ``efficiency.op_flop_prices``: a square root's
                   element takes ~3x an add's on the project's AMD VM, so the add-measured vector rate undercounts it)
        memory   = ``memory_time_s`` (mem_bandwidth_curve by bytes per kernel), its operands in L2, + the strided
                   kernels' excess (``strided``)
        evicted  = memory_cold - memory
                   (``memory_cold``: ``memory_time_s`` with ``cold_memory``, the share of the op's operand bytes
                   evicted from L2, memory_cold_curve: the refetch, stalled on whatever bounds the hot kernel;
                   of it, the share ``far_memory`` that comes from beyond the L3 (``reuse.far_shares``) moves at
                   the bandwidth curve's rate for 4 x the L3 instead: + far x bytes x (far - hot seconds per byte))
        roof     = max(compute, memory) / op_eff + evicted (``op_efficiency`` of the op's kernel, 1 by default)
        launch   = kernels * launch_s                     (the device-side per-kernel time, ``device_kernel_s``)
        time     = roof + launch + rows_s                 (``rows_s``: per-row prices of CPU kernels, ``row_prices``)
        bound    = "overhead" if launch > max(compute, memory_cold), else the larger of compute and memory_cold

    The refetch is added, as the calibration fits it (``calibrate.fit._memory_cold``: cold = hot + e, f = m / (m + e)),
    whatever bounds the hot kernel: its layer norm and softmax cases, compute-bound here, paid it as the copies did
    (a layer norm of 64 Ki elements 53 us hot, 99 us cold; bench/results/memory_cold.md). Taken as max(compute,
    memory_cold) - max(compute, memory) instead, a row-wise op's refetch vanished under its compute term. It is
    added after ``op_eff``, not divided by it: a kernel slower than its roofline (a CPU max-pool's backward,
    efficiency ~0.2) is slow at its own work, not at fetching its bytes:
    divided by its efficiency, LeNet's pool backward (1 MiB) took 0.77 ms more. ``memory`` in the result is memory_cold.

    ``calls`` (optional, per op; 0: one per kernel): the separate GEMM calls an op's kernels loop over
    (``formulas.Cost.gemms``: a CPU's per-sample GEMMs of a 1x1 convolution): the efficiency and bandwidth curves
    are read per call (FLOPs and bytes / calls), the launch term stays per kernel. ``kernel_fraction`` (per op, NaN:
    none; ``attention_kernel``): a fused kernel's measured rate, its whole efficiency (``op_eff`` 1 there).
    ``strided`` (optional, (elements, bytes) per op): kernels off the vectorised loop, ``strided.strided_excess_s``.
    ``inplace`` (optional, bool per op): in-place kernels, their far refetch too (``write_allocate.write_allocate_gain``).
    """
    k = _array(kernels, "kernels")
    split = k if calls is None else np.where(_array(calls, "calls") > 0, calls, k)
    compute = np.asarray(compute_time_s(matrix_flops, other_flops, system, dtype, kernels=split, min_dim=min_dim,
                                        align=align, cold=cold, kernel_fraction=kernel_fraction), dtype=float)
    compute = np.maximum(compute, np.asarray(compute_floor_s, dtype=float))
    index = 0.0 if strided is None else strided_excess_s(*strided, system)
    kw = {"kernels": split, "inplace": inplace}
    hot = np.asarray(memory_time_s(bytes_moved, system, **kw), dtype=float) + index
    top = np.maximum(compute, hot)
    memory = hot
    far = np.asarray(far_memory, dtype=float)
    cold_memory = np.maximum(np.asarray(cold_memory, dtype=float) - far, 0.0)  # the far bytes are refetched below
    if np.any(cold_memory > 0):
        memory = np.asarray(memory_time_s(bytes_moved, system, cold=cold_memory, **kw), dtype=float) + index
    if np.any(far > 0):
        memory = memory + _far_refetch_s(far, bytes_moved, split, system, inplace)
    evicted = memory - hot
    launch = k * _array(launch_s, "launch_s")
    op_eff = op_eff if kernel_fraction is None else np.where(np.isfinite(np.asarray(kernel_fraction, float)), 1.0, op_eff)
    roof = top / np.asarray(op_eff, dtype=float) + evicted
    bound = np.where(launch > top + evicted, "overhead", np.where(compute >= memory, "compute", "memory"))
    return {"compute": compute, "memory": memory, "roof": roof, "launch": launch,
            "time": roof + launch + np.asarray(rows_s, dtype=float), "bound": bound}


def far_seconds_per_byte(system) -> float:
    """Seconds per byte from beyond the L3: the bandwidth curve read at 4 x the L3 (``cold_curves.far_data``), the
    rate of the eviction the far cases run; 0 where the far-data rule is off."""
    l3, _ = far_data(system)
    return float(memory_time_s(4.0 * l3, system, kernels=1.0)) / (4.0 * l3) if l3 > 0 else 0.0


def _far_refetch_s(far, bytes_moved, kernels, system, inplace) -> np.ndarray:
    """Seconds the share ``far`` of an op's bytes takes from beyond the L3 more than from where the curve puts them
    (``_far_refetch_per_byte``), an in-place kernel's at ``write_allocate_gain`` x the rate."""
    b = np.asarray(bytes_moved, dtype=float)
    gain = write_allocate_gain(system, b / np.maximum(np.asarray(kernels, dtype=float), 1.0), inplace)
    return np.asarray(far, dtype=float) * _far_refetch_per_byte(b, kernels, system) * b / gain


def _far_refetch_per_byte(bytes_moved, kernels, system) -> np.ndarray:
    """Seconds per byte a kernel's bytes take from beyond the L3 more than at its own size's rate
    (``far_seconds_per_byte`` less the curve at the kernel's bytes), floored at 0."""
    b = np.maximum(np.asarray(bytes_moved, dtype=float), 1.0)
    hot = np.asarray(memory_time_s(b, system, kernels=kernels), dtype=float) / b
    return np.maximum(far_seconds_per_byte(system) - hot, 0.0)


def device_times_read(matrix_flops, other_flops, bytes_moved, kernels, system, dtype, *, names, phase, classes=None,
                      unpriced=None, rows_s=0.0, **shape) -> dict:
    """``device_times`` with each op's efficiency (``efficiency.efficiencies``: class, name, ``phase``, dtype) read at
    the op's own roofline seconds per kernel, as a curve (``op_efficiency_curve``) is measured: the roofline is taken
    once at efficiency 1 to find them, then with them; and each op's compute floor, its other FLOPs at the price
    per FLOP calibration measured for that op (``efficiency.op_flop_prices``). ``unpriced`` (bool per op): ops priced without one (1).
    Both front-ends time through here (``op_device_times``, ``predict.step``)."""
    k = _array(kernels, "kernels")
    args = (matrix_flops, other_flops, bytes_moved, kernels, system, dtype)
    inplace = inplace_kernels(names, phase)
    shape.setdefault("inplace", np.reshape(inplace, (-1,) + (1,) * max(np.ndim(bytes_moved) - 1, 0)))
    price = op_flop_prices(system, names, phase)
    if np.any(price > 0):
        other = np.asarray(other_flops, dtype=float)
        shape["compute_floor_s"] = other * np.reshape(price, (-1,) + (1,) * max(other.ndim - 1, 0))
    per_kernel = device_times(*args, **shape)["roof"] / np.where(k > 0, k, 1.0)
    eff = efficiencies(system, names, dtype, phase, per_kernel, classes)
    if unpriced is not None:
        eff = np.where(np.reshape(unpriced, (-1,) + (1,) * (eff.ndim - 1)), 1.0, eff)
    return device_times(*args, **shape, op_eff=eff, rows_s=rows_s)


def op_device_times(ops, system, dtype, launch_s: float = None):
    """Device seconds and bound per op and phase for the estimator's op table (a DataFrame with
    name, macs_*, other_*, bytes_*, kernels_*, min_dim, optionally unaligned): adds columns ``t_fwd``, ``t_bwd``,
    ``bound_fwd``, ``bound_bwd`` and returns the frame.

    Per op: ``device_times`` with ``launch_s`` per kernel, the roofline part divided by the spec's
    ``op_efficiency`` of that op in ``dtype`` and phase, read off its curve at the kernel's roofline seconds where
    the spec has one (``op_efficiency()``: a kernel measured slower than the roofline on this machine: a CPU
    convolution with few channels, a max-pool), plus ``rows_<phase>`` x the spec's per-row price of that op
    (``row_prices``; and gemm_calls.gemm_call_seconds) where the table has them (CPU: ``pages_<phase>`` x page_fault_s).
    An op family's fixed cost (``op_fixed_s``) is host time: perfcheck.predict.host adds it. Columns ``cold_fwd``,
    ``cold_bwd`` (optional): the share of an op's operand bytes evicted from L2 (``predict.reuse.cold_shares``;
    ``cold_memory_fwd``/``cold_memory_bwd``, where present, the memory term's share instead: fresh outputs counted):
    a matrix product (``COLD_GEMMS``, the ops calibration's matmul cold cases time) with any evicted operand runs at
    the ``matrix_cold_curve`` rate; the memory term of an op without matrix FLOPs (elementwise, copies, fills,
    reductions, norms, embeddings) takes the share (``memory_time_s``, ``memory_cold_curve``). Convolutions keep
    their class efficiencies, calibrated apart: with the memory share applied to them too, the design set's dense
    and grouped convolution classes went from 1.04 and 1.15 measured/predicted to 0.79 and 0.44 (their memory
    terms at a few hundred KiB per kernel took the small-size end of the curve; bench/results/memory_cold.md).
    Columns ``gemms_<phase>`` (optional; ``formulas.Cost.gemms``), CPU: an op looping over that many GEMM calls
    (a 1x1 convolution's per-sample GEMMs) is priced as those GEMMs (matrix curves per call, no class efficiency).
    Optional: ``attn_seq``, ``attn_head_dim``, ``attn_causal`` (a fused attention kernel's); ``strided_elems_<phase>``,
    ``strided_bytes_<phase>`` (``device_times``'s ``strided``).
    """
    system = spec_of(system)
    names = ops["name"].to_numpy(object)
    classes = ops["op_class"].to_numpy(object) if "op_class" in ops else names
    cpu = system.kind == "cpu"
    for phase in ("fwd", "bwd"):
        k = ops[f"kernels_{phase}"].to_numpy(float)
        calls = ops[f"gemms_{phase}"].to_numpy(float) if cpu and f"gemms_{phase}" in ops else np.zeros(len(ops))
        gemm_priced = calls > 0
        launch = system.launch_overhead_s if launch_s is None else launch_s
        extra = (ops[f"rows_{phase}"].to_numpy(float) * row_prices(system, names, phase, classes)
                 if f"rows_{phase}" in ops else np.zeros(len(ops))) + gemm_call_seconds(system, ops, classes, phase)
        if cpu and f"pages_{phase}" in ops:  # first-touch faults of fresh mappings (predict.pages.fresh_pages)
            extra = extra + ops[f"pages_{phase}"].to_numpy(float) * host_constants(system)["page_fault_s"]
        args = (ops[f"macs_{phase}"].to_numpy(float) * 2, ops[f"other_{phase}"].to_numpy(float),
                ops[f"bytes_{phase}"].to_numpy(float), k, system, dtype)
        share = ops[f"cold_{phase}"].to_numpy(float) if f"cold_{phase}" in ops else np.zeros(len(ops))
        mem_share = ops[f"cold_memory_{phase}"].to_numpy(float) if f"cold_memory_{phase}" in ops else share
        min_dim = ops["min_dim"].to_numpy(float) if "min_dim" in ops else None
        if min_dim is not None and not cpu and "gemms_fwd" in ops:  # a convolution's per-sample GEMMs: CPU only
            min_dim = np.where((ops["gemms_fwd"].to_numpy(float) > 0) | (ops["gemms_bwd"].to_numpy(float) > 0),
                               np.nan, min_dim)
        shape = dict(launch_s=launch, calls=calls, min_dim=min_dim, kernel_fraction=attention_fractions_of(system, ops),
                     align=_gemm_factors(system, ops, phase),
                     cold=np.where(np.isin(names, COLD_GEMMS), share, 0.0),
                     cold_memory=np.where(ops[f"macs_{phase}"].to_numpy(float) > 0, 0.0, mem_share),
                     far_memory=np.where(ops[f"macs_{phase}"].to_numpy(float) > 0, 0.0,
                                         ops[f"far_{phase}"].to_numpy(float) if f"far_{phase}" in ops else 0.0),
                     strided=strided_columns(ops, phase))
        d = device_times_read(*args, names=names, classes=classes, phase=phase, unpriced=gemm_priced, rows_s=extra,
                              **shape)
        ops[f"t_{phase}"] = np.where(k > 0, d["time"], 0.0)
        ops[f"bound_{phase}"] = np.broadcast_to(np.asarray(d["bound"], dtype=object), len(ops))
    return ops


def _gemm_factors(system, ops, phase: str):
    """The GEMM-rate factors an op table's columns give per op: the alignment factor (``unaligned``) times the
    wide-output factor (``gemm``: ``wide_factors``) and the narrow-output one (``gemm_n``: ``narrow_factors``); None
    where the table has none of these columns."""
    align = alignment_factor(system, ops["unaligned"].to_numpy(float), phase) if "unaligned" in ops else None
    if "gemm" not in ops:
        return align
    shape = wide_factors(system, list(ops["gemm"]), phase)  # gemm_shape.py
    if "gemm_n" in ops:
        shape = shape * narrow_factors(system, ops["gemm_n"].to_numpy(float), phase,
                                       [isinstance(g, tuple) for g in ops["gemm"]])
    return shape if align is None else np.asarray(align, dtype=float) * shape


def row_prices(system, names, phase: str, classes=None) -> np.ndarray:
    """Seconds per row of each op in ``names`` in ``phase`` ("fwd"/"bwd"): the spec's ``op_row_s`` of the op's
    class where ``classes`` is given and the spec lists it (EmbeddingBag's max mode scatters one element per row,
    sum's sorts and adds whole rows), else of its name (measured by ``perfcheck calibrate``'s op-class cases,
    perfcheck/calibrate/op_classes.py) over the defaults for its kind (``systems.row_costs``: host_defaults.json,
    none today); 0 for an op neither lists. Why: some CPU kernels pay a fixed cost per row beyond their
    elements' roofline: an embedding's backward per index (its index sort and scatter), a convolution's weight
    gradient per weight element (the reorder back to OIHW); perfcheck.predict.formulas counts the rows. The
    row-wise ops' per-row terms (softmax, layer norm, ...) were retired (bench/results/pruning.md)."""
    table = row_costs(spec_of(system))
    keys = names if classes is None else [c if c in table else n for c, n in zip(classes, names)]
    return np.array([table.get(n, {}).get(phase, 0.0) for n in keys], dtype=float)

"""The per-call term of a GEMM-based convolution weight gradient on a CPU: its count and its price.

oneDNN runs a depthwise convolution's weight gradient above 3x3 on plain NCHW tensors with
``gemm_convolution_bwd_weights_t::execute_backward_weights_ncsp`` (src/cpu/gemm_convolution.cpp): for each group g,
for each sample mb, an im2col of the group's input and one ``extended_sgemm`` of M = (C_in/groups) x kernel,
N = C_out/groups, K = output pixels (for a depthwise 5x5: a 25 x 1 product). So its time is

    t = fixed + MACs x (per-MAC rate: the im2col writes and the GEMV reads one element per MAC)
              + batch x groups x (one sgemm call's set-up)

``weight_gemm_calls`` counts the calls of one traced op (batch x groups, where it runs this kernel and its weight
needs a gradient; the module estimator's column ``weight_gemm_calls_bwd``); the spec prices a call per op class in
op_row_s["<class>:gemm_call"]["bwd"] (``gemm_call_key``), calibrated by op_classes.depthwise_call_cases and fitted
with the class's backward efficiency by calibrate.fit_host.gemm_call_costs.
On the project's Xeon (1 thread, process time; bench/results/depthwise_law.md)
the 5x5/7x7 weight gradient over channels 32-768, 2x2-56x56 output pixels, batch 1-8 fits 60 us + 1.25 ns per MAC
+ 0.63 us per call (measured / law: median 1.01, 10th-90th percentile 0.84-1.46); without the call term the best
fixed + per-MAC fit reads 1.12 (0.77-2.05): a layer of many channels on few pixels ran up to 2x its price.
"""
from __future__ import annotations

import numpy as np

from perfcheck.hardware.systems import row_costs, spec_of
from perfcheck.predict.aten_costs import OpCall, TensorMeta, op_class

#: Suffix of an op class's per-call price in op_row_s: ``<class>:gemm_call`` (``gemm_call_key``).
GEMM_CALL_SUFFIX = ":gemm_call"


def gemm_call_key(op_class: str) -> str:
    """The op_row_s key of the price of one sgemm call of ``op_class``'s GEMM-based weight gradient."""
    return f"{op_class}{GEMM_CALL_SUFFIX}"


def runs_gemm_weight_grad(c: OpCall) -> bool:
    """Whether oneDNN runs ``c``'s CPU weight gradient as one im2col and sgemm per (sample, group): a convolution of
    class ``convolution_depthwise_large`` on a contiguous (plain NCHW) input. Why not a non-contiguous one: torch's
    oneDNN path takes a channels-last input as NHWC (aten/src/ATen/native/ConvUtils.h,
    ``mkldnn_conv_use_channels_last``), and oneDNN then runs its ``jit:avx512_core`` weight gradient
    (bench/results/conv_classes.md)."""
    return op_class(c) == "convolution_depthwise_large" and bool(getattr(c.args[0], "contiguous", True))


def weight_gemm_calls(c: OpCall) -> float:
    """The sgemm calls of ``c``'s weight gradient (batch x groups) where ``runs_gemm_weight_grad`` and its weight
    needs a gradient; else 0."""
    if not runs_gemm_weight_grad(c):
        return 0.0
    x, w = c.args[0], c.args[1]
    return float(x.shape[0] * int(c.arg(8, "groups", 1) or 1)) if isinstance(w, TensorMeta) and w.requires_grad else 0.0


def gemm_call_seconds(system, ops, classes, phase: str) -> np.ndarray:
    """Seconds per op of the estimator's op table ``ops`` in ``phase``: its ``weight_gemm_calls_<phase>`` column
    (0 where absent) x the spec's price per call of its class (0 where the spec has none)."""
    column = f"weight_gemm_calls_{phase}"
    if column not in ops:
        return np.zeros(len(ops))
    table = row_costs(spec_of(system))
    prices = np.array([table.get(gemm_call_key(c), {}).get(phase, 0.0) for c in classes], dtype=float)
    return ops[column].to_numpy(float) * prices

"""An op's kernel efficiency on a spec: measured rate / roofline rate, by op class, aten name, phase and dtype.

A spec carries what calibration measured (``op_efficiency``: one number per key; ``op_efficiency_curve``: a GPU
kernel class by size, (roofline seconds per kernel, efficiency) points); ``roofline.device_times`` divides an op's
roofline time by it. Both front-ends read it here, through ``efficiencies`` (``roofline.op_device_times`` for
``perfcheck.estimate``'s traced ops, ``predict.step`` for the transformer front-end's rows): one lookup and one
reading of a curve, at each kernel's own roofline seconds, so the two agree under any spec.

Keys, first found wins: ``<class>:<phase>``, ``<class>``, (its ``CLASS_PARENTS`` entry's), ``<name>:<phase>``,
``<name>``; each in the run's dtype first (``op_efficiency_key``), then as measured in fp32. Per key a curve wins
over a flat number; none found: 1.
"""
from __future__ import annotations

import numpy as np

from perfcheck.hardware.systems import normalize_dtype

#: A class split out of another, read as that one where a spec has no entry of its own (a calibration taken before
#: the split): the 1x1 matrix-product convolutions were ``convolution_wide``, a depthwise convolution on a
#: channels-last input (``aten_costs.op_class``, ``_nhwc``) its NCHW class.
CLASS_PARENTS = {"convolution_1x1": "convolution_wide", "convolution_depthwise_nhwc": "convolution_depthwise",
                 "convolution_depthwise_large_nhwc": "convolution_depthwise_large"}


def op_efficiency_key(name: str, dtype: str) -> str:
    """The spec's ``op_efficiency`` key of op ``name`` measured in ``dtype``: the op's name for fp32 (and tf32,
    which runs on fp32 tensors), ``name@dtype`` for the others (bf16, fp16): a cuDNN convolution's efficiency in
    bf16 is not its efficiency in fp32 (an H100's 3->6 channel conv: 0.029 in bf16, about 2x that in fp32)."""
    dtype = normalize_dtype(dtype)
    return name if dtype in ("fp32", "tf32") else f"{name}@{dtype}"


def _class_keys(op_class: str, name: str, dtype, phase: str) -> list:
    """The keys ``class_efficiency`` tries, in order (module docstring)."""
    parent = CLASS_PARENTS.get(op_class, op_class)
    keys = list(dict.fromkeys((f"{op_class}:{phase}", op_class, f"{parent}:{phase}", parent, f"{name}:{phase}",
                               name)))
    return list(dict.fromkeys([op_efficiency_key(k, dtype) for k in keys] + keys))


def _source(system, keys):
    """The first of ``keys`` the spec has: its curve's points (a list), its flat number (a float), or None."""
    curves, flat = getattr(system, "op_efficiency_curve", {}) or {}, system.op_efficiency
    for key in keys:
        if curves.get(key):
            return curves[key]
        if key in flat:
            return float(flat[key])
    return None


def _read(source, roof_s):
    """A source (``_source``) at ``roof_s`` seconds per kernel (scalar or array; None: a curve's middle point)."""
    if source is None:
        return 1.0
    if isinstance(source, float):
        return source
    return op_curve_at(source, source[len(source) // 2][0] if roof_s is None else roof_s)


def op_efficiency(system, name: str, dtype, phase: str = "fwd", roof_s: float = None) -> float:
    """Measured / roofline rate of op ``name``'s kernel in ``dtype`` and ``phase`` on ``system``: the value measured
    in that dtype, else the fp32 one (a spec calibrated in fp32 only, e.g. a CPU's, for a bf16 run), else 1.
    The backward looks for its own entry first (key ``<name>:bwd``, ``op_efficiency_key``; a LayerNorm's or an
    embedding's backward kernel is not as efficient as its forward), then the forward's. Per key, a curve in
    ``op_efficiency_curve`` (measured by size on a GPU, perfcheck.calibrate.gpu_ops) wins over the flat
    ``op_efficiency``: read at ``roof_s``, the kernel's roofline seconds (``op_curve_at``), its middle point
    when ``roof_s`` is not given."""
    keys = [op_efficiency_key(name, dtype), name]
    if phase == "bwd":
        keys = [op_efficiency_key(f"{name}:bwd", dtype), keys[0], f"{name}:bwd", name]
    return float(_read(_source(system, keys), roof_s))


def op_curve_at(points, roof_s):
    """An ``op_efficiency_curve`` read at ``roof_s`` roofline seconds per kernel (a number or an array): linear in
    log(seconds) between the measured sizes, the end value beyond them (no extrapolation: a kernel smaller or
    larger than any measured one keeps the nearest measured efficiency)."""
    xs = np.log([p[0] for p in points])
    ys = [p[1] for p in points]
    at = np.interp(np.log(np.maximum(np.asarray(roof_s, dtype=float), 1e-12)), xs, ys)
    return float(at) if np.ndim(at) == 0 else at


def class_efficiency(system, op_class: str, name: str, dtype, phase: str, roof_s: float = None) -> float:
    """The efficiency of an op of efficiency class ``op_class`` (perfcheck.predict.aten_costs.op_class) and aten name
    ``name`` in ``phase``: the first key the spec has of ``<class>:<phase>``, ``<class>``, ``<name>:<phase>``,
    ``<name>`` (after the class, its ``CLASS_PARENTS`` entry's keys), each in ``dtype`` first
    (``op_efficiency_key``: a GPU's bf16 convolution is not its fp32 one), then as measured in fp32; per key a
    measured curve (``op_efficiency_curve``, GPU kernel classes by size, read at the kernel's roofline seconds
    ``roof_s``: ``op_curve_at``) before a flat ``op_efficiency``; else 1. A phase key exists where calibration
    timed the backward apart (a depthwise convolution's or a LayerNorm's backward runs at another rate than its
    forward)."""
    return float(_read(_source(system, _class_keys(op_class, name, dtype, phase)), roof_s))


def efficiencies(system, names, dtype, phase: str, roof_s, classes=None) -> np.ndarray:
    """``class_efficiency`` of every op: ``names`` (aten names) and ``classes`` (their classes; None: the names),
    ``roof_s`` each op's roofline seconds per kernel, shape (ops,) or (ops, layouts): a curve is read at each
    entry. The key lookup runs once per op, the reading over its layouts at once (the planner's thousands)."""
    roof = np.asarray(roof_s, dtype=float)
    out = np.ones_like(roof)
    classes = names if classes is None else classes
    for i, (op_class, name) in enumerate(zip(classes, names)):
        out[i] = _read(_source(system, _class_keys(op_class, name, dtype, phase)), roof[i])
    return out


def op_flop_key(name: str) -> str:
    """The ``op_flop_s`` key of aten op ``name``: the kernel's name, without ``_foreach_`` (a foreach op runs the same
    vectorised loop per tensor on a CPU) and without the in-place ``_`` (``sqrt_`` runs ``sqrt``'s kernel)."""
    name = str(name).removeprefix("_foreach_")
    return name[:-1] if name.endswith("_") and not name.startswith("_") else name


def op_flop_prices(system, names, phase: str = "fwd") -> np.ndarray:
    """Seconds per formula FLOP that each op's kernel takes at least (``SystemSpec.op_flop_s``, calibration's
    ``oprate`` cases: an op timed hot, its per-element work the bound), 0 where the spec has none. Forward kernels
    only: an op's backward runs other kernels (a square root's is a division and a product), priced as before."""
    prices = getattr(system, "op_flop_s", {}) or {}
    if phase != "fwd" or not prices:
        return np.zeros(len(names))
    return np.array([float(prices.get(op_flop_key(n), 0.0)) for n in names])


__all__ = ["CLASS_PARENTS", "op_efficiency_key", "op_efficiency", "op_curve_at", "class_efficiency", "efficiencies",
           "op_flop_key", "op_flop_prices"]

"""Turn a table of micro-benchmark measurements into a calibrated ``SystemSpec`` (pure arithmetic).

``build_spec(base, table, peaks=...)`` is kept apart from the timing code so its arithmetic is
tested on hand-made tables (tests/calibrate/test_calibrate.py). Conventions are documented in
``perfcheck.calibrate``; in short, per ceiling:

=====================  ==========================================  ==========================================
ceiling                peaks="base" (GPU default)                  peaks="measured" (CPU default)
=====================  ==========================================  ==========================================
matrix, per dtype      peak = base datasheet; efficiency =         peak = best measured rate; efficiency =
                       median of the 3 largest shapes / peak       median of the 3 largest shapes / best
matrix curve           (FLOPs per kernel, measured / peak) for the reference dtype (bf16 on GPU, fp32 on CPU),
                       with the tiny-op time subtracted from each matmul time first
vector (CPU only)      efficiency = add rate / base peak           peak = add rate; efficiency 1
memory                 efficiency = copy B/s / base bandwidth      bandwidth = copy B/s; efficiency 1
intra-node             efficiency = all-reduce busbw / base link   link = all-reduce busbw; efficiency 1
launch_overhead_s      per-kernel time of a tiny forward+backward chain under autograd (both)
=====================  ==========================================  ==========================================

Efficiencies are capped at 1 (a boost clock can beat a datasheet). Anything not measured keeps
the base's value, and its source says so.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import pandas as pd

from perfcheck.calibrate.fit_draft import Draft, cap, fmt_rate, fp32_rows, rows_of, seconds_of, size_text
from perfcheck.calibrate.fit_wide import matrix_narrow, matrix_wide
from perfcheck.calibrate import case_names as names
from perfcheck.calibrate.fit_host import (alignment, collective_latency, host_terms, launch,
                                          element_rates, gemm_call_costs, module_costs, per_op_costs,
                                          row_costs)
from perfcheck.errors import UserError
from perfcheck.hardware.systems import SystemSpec, host_constants, load_system
from perfcheck.predict import roofline

#: Columns of the measurement table (``Calibration.measurements``, ``perfcheck calibrate --csv``).
MEASUREMENT_COLUMNS = ("kind", "label", "dtype", "m", "k", "n", "flops", "bytes", "world_size", "seconds",
                       "seconds_min", "seconds_max", "repeats", "iters", "flops_per_s", "bytes_per_s",
                       "busbw_bytes_per_s")
#: The collective kinds calibration benchmarks (a subset of perfcheck.predict.collectives.COLLECTIVE_KINDS, the
#: one list of kinds; tests/test_pred_writers.py checks it): the link bandwidth comes from all-reduce.
BENCHMARKED_KINDS = ("allreduce", "allgather", "reducescatter")
#: Which measured dtype's matmuls set a spec's efficiency curves, in order of preference per device kind
#: (a GPU's tensor-core dtypes first; a CPU's fp32, the dtype CPU training runs in).
REFERENCE_ORDER = {"gpu": ("bf16", "fp16", "tf32", "fp32"), "cpu": ("fp32", "bf16", "fp16", "tf32")}
_LARGEST = 3  # shapes that set efficiency.matrix (median of the largest by FLOPs)


def reference_dtype(kind: str, measured) -> str:
    """The dtype among ``measured`` whose matmuls set a ``kind`` ("cpu"/"gpu") spec's curves
    (REFERENCE_ORDER; the first measured one when none is listed; fp32 when nothing was measured)."""
    measured = tuple(measured)
    order = REFERENCE_ORDER.get(kind, REFERENCE_ORDER["gpu"])
    return next((x for x in order + measured if x in measured), "fp32")


def matrix_efficiencies(rows: pd.DataFrame, peak: float, op_s: float) -> np.ndarray:
    """Per-shape efficiency: FLOPs / ((time - tiny-op time) * peak), capped at 1.

    The estimator adds launch overhead per kernel on top of the roofline time, so the part of a
    small matmul's time that is dispatch is taken out before it enters the curve.
    """
    flops = rows["flops"].to_numpy(float)
    compute_s = np.maximum(rows["seconds"].to_numpy(float) - op_s, 0.0)
    with np.errstate(divide="ignore"):
        rate = np.where(compute_s > 0, flops / np.where(compute_s > 0, compute_s, 1.0), np.inf)
    return np.minimum(rate / peak, 1.0)


def efficiency_curve(rows: pd.DataFrame, eff: np.ndarray) -> tuple:
    """((FLOPs per kernel, efficiency), ...) sorted by FLOPs; shapes with equal FLOPs share the median."""
    frame = pd.DataFrame({"flops": rows["flops"].to_numpy(float), "eff": eff})
    frame = frame[(frame["flops"] > 0) & (frame["eff"] > 0)]
    grouped = frame.groupby("flops", sort=True)["eff"].median()
    return tuple((float(f), float(round(e, 4)) or 1e-4) for f, e in grouped.items())


#: A GEMM is *skinny* when its smallest dimension is under this fraction of its largest: those shapes
#: key the shape curve; the others (squares, Linear-like shapes) key the FLOPs curve.
SKINNY_RATIO = 0.25


def _is_square(rows: pd.DataFrame) -> np.ndarray:
    """Not skinny (see SKINNY_RATIO): the shapes that set the FLOPs-keyed efficiency curve."""
    dims = rows[["m", "k", "n"]].to_numpy(float)
    return dims.min(axis=1) >= SKINNY_RATIO * dims.max(axis=1)


def shape_curve(rows: pd.DataFrame, eff: np.ndarray, curve: tuple) -> tuple:
    """((smallest dim, factor), ...): each skinny shape's efficiency over the FLOPs curve's at its
    FLOPs (median per smallest dim), then 1.0 at the smallest dimension of the first non-skinny
    shape above them (the anchor: from there on the FLOPs curve alone applies); () when there is
    no skinny shape or no curve."""
    if len(curve) < 2:
        return ()
    square = _is_square(rows)
    xs, ys = np.log([p[0] for p in curve]), np.array([p[1] for p in curve])
    dims = rows[["m", "k", "n"]].to_numpy(float).min(axis=1)
    ref = np.interp(np.log(np.maximum(rows["flops"].to_numpy(float), 1.0)), xs, ys)
    frame = pd.DataFrame({"dim": dims, "factor": eff / ref})[~square & (eff > 0)]
    if frame.empty:
        return ()
    points = {float(k): float(round(v, 4)) for k, v in frame.groupby("dim")["factor"].median().items()}
    above = dims[square & (dims > max(points))]
    if len(above):
        points[float(above.min())] = 1.0
    # capped at 1: the curve is a penalty for skinny shapes; a skinny shape that beat the (coarse) FLOPs
    # curve says the curve is sparse there, not that skinny GEMMs are faster
    return tuple(sorted((k, min(max(v, 1e-3), 1.0)) for k, v in points.items()))


def merge_measurements(tables) -> pd.DataFrame:
    """Several calibrations' tables as one: per case the median time (min of mins, max of maxes).

    Calibrating before and after a measurement and merging brackets the machine's drift on a
    shared host (bench/accuracy.py does this)."""
    frame = pd.concat(list(tables), ignore_index=True)
    keys = ["kind", "label", "dtype", "m", "k", "n", "flops", "bytes", "world_size"]
    g = frame.groupby(keys, sort=False, dropna=False)
    out = g.agg(seconds=("seconds", "median"), seconds_min=("seconds_min", "min"), seconds_max=("seconds_max", "max"),
                repeats=("repeats", "sum"), iters=("iters", "max"),
                busbw_bytes_per_s=("busbw_bytes_per_s", "median")).reset_index()
    out["flops_per_s"] = (out["flops"] / out["seconds"]).where(out["flops"] > 0)
    out["bytes_per_s"] = (out["bytes"] / out["seconds"]).where(out["bytes"] > 0)
    return out[list(MEASUREMENT_COLUMNS)]


def build_spec(base, table: pd.DataFrame, *, peaks: str, stamp: str, name: Optional[str] = None,
               kind: Optional[str] = None, mem_capacity_bytes: Optional[float] = None,
               threads: Optional[int] = None) -> SystemSpec:
    """A calibrated spec from ``base`` and a measurement table (``MEASUREMENT_COLUMNS``).

    peaks: "base" keeps the base's peaks (efficiency = measured / peak); "measured" sets each peak
    to the best measured rate. stamp: provenance text put in every measured field's source.
    """
    base = load_system(base)
    if peaks not in ("base", "measured"):
        raise UserError(f"peaks: unknown {peaks!r} (known: base, measured)")
    missing = [c for c in ("kind", "label", "dtype", "flops", "bytes", "seconds") if c not in table.columns]
    if missing:
        raise UserError(f"measurements: missing column {missing[0]!r}")
    sources = {k: (v if v.startswith("from base spec") else f"from base spec {base.name!r} (not measured): {v}")
               for k, v in base.sources.items()}
    d = Draft(base, peaks, stamp, kind or base.kind, dict(base.matrix_flops_per_s), dict(base.vector_flops_per_s),
               dict(base.efficiency), sources)
    launch(d, table, threads)
    host_terms(d, table, threads)
    _matrix(d, table)
    matrix_wide(d, table, _mm_fixed(d, table))
    matrix_narrow(d, table, _mm_fixed(d, table))
    _vector(d, table)
    _memory(d, table)
    _collectives(d, table)
    if mem_capacity_bytes:
        d.fields["mem_capacity_bytes"] = float(mem_capacity_bytes)
        d.sources["mem_capacity_bytes"] = f"{stamp}: total device memory (CUDA) or RAM (psutil)"
    convention = ("peaks are the base spec's datasheet numbers, efficiencies measured / peak" if peaks == "base"
                  else "peaks are the best rates measured here (no datasheet), efficiencies relative to them")
    description = (f"{base.name} calibrated by perfcheck calibrate: {convention}. "
                   f"{stamp[0].upper() + stamp[1:]}. Unmeasured fields are the base spec {base.name!r}'s.")
    sources = {k: v for k, v in d.sources.items() if k.split(".", 1)[0] in _field_names()}
    spec = dataclasses.replace(
        base, name=name or f"{base.name}-calibrated", description=description, kind=d.kind,
        matrix_flops_per_s=d.matrix, vector_flops_per_s=d.vector, efficiency=d.eff, calibrated=True,
        sources=sources, **d.fields)
    spec = element_rates(gemm_call_costs(row_costs(per_op_costs(spec, table, d), table, d), table, d), table, d)
    return alignment(module_costs(spec, table, d), table, d)


def measured_here(spec, keys) -> bool:
    """Whether each of ``keys`` (source keys, e.g. "host.collective_latency_s") of ``spec`` was measured by a
    calibration of its own: it has a source, and not one ``build_spec`` hands down from the base spec ("from
    base spec ...": a datasheet value or a rough default, from another machine)."""
    sources = dict(getattr(spec, "sources", {}) or {})
    return all(k in sources and not str(sources[k]).startswith("from base spec") for k in keys)


def apply_collectives(spec: SystemSpec, table, stamp: str, *, peaks: str = None) -> SystemSpec:
    """``spec`` with what a collectives table measures, by the same arithmetic as ``perfcheck calibrate``
    (``_collectives``, ``collective_latency``): the intra-node link (all-reduce bus bandwidth at the
    largest size; ``peaks`` "measured", a CPU's default: it becomes the link with efficiency 1; "base": the
    efficiency over the spec's link) and ``host.collective_latency_s`` (alpha: a small all-reduce less its
    bandwidth term), each with its source. Used by ``perfcheck sweep`` to add the collectives to a cached
    calibration that was made without them (the automatic quick calibration runs no second process)."""
    peaks = peaks or ("measured" if spec.kind == "cpu" else "base")
    draft = Draft(spec, peaks, stamp, spec.kind, dict(spec.matrix_flops_per_s), dict(spec.vector_flops_per_s),
                   dict(spec.efficiency), dict(spec.sources))
    _collectives(draft, table)
    host = dict(spec.host)
    collective_latency(host, draft.sources, table, stamp)
    return dataclasses.replace(spec, efficiency=draft.eff, host=host, sources=draft.sources, **draft.fields)


def _matrix(d: Draft, table):
    """Peaks (measured convention), efficiency at the largest shapes per dtype, the reference dtype's curve."""
    mm = rows_of(table, names.MATMUL)
    measured = [x for x in dict.fromkeys(mm["dtype"]) if x]
    large, curves, shapes = {}, {}, {}
    mm_fixed = _mm_fixed(d, table)
    for dt in measured:
        rows = _timed(mm[mm["dtype"] == dt].sort_values("flops", kind="stable"), dt)
        best = float((rows["flops"] / rows["seconds"]).max())
        if d.peaks == "measured":
            d.matrix[dt] = best
        elif dt not in d.base.matrix_flops_per_s:
            raise UserError(f"peaks: base spec {d.base.name!r} has no matrix peak for measured dtype {dt!r}; "
                            f"use peaks='measured'")
        e = matrix_efficiencies(rows, d.matrix[dt], d.op_s + mm_fixed)
        square = _is_square(rows)
        large[dt], curves[dt] = float(np.median(e[-_LARGEST:])), efficiency_curve(rows[square], e[square])
        if len(curves[dt]) < 2:  # too few squares: every shape (the curve by FLOPs alone, as before)
            curves[dt] = efficiency_curve(rows, e)
        shapes[dt] = shape_curve(rows, e, curves[dt])
        label = f"{rows['m'].iloc[-1]}x{rows['k'].iloc[-1]}x{rows['n'].iloc[-1]}"
        kept = ("set as the peak (no datasheet)" if d.peaks == "measured"
                else f"peak kept from base spec {d.base.name!r}")
        d.sources[f"matrix_flops_per_s.{dt}"] = (f"{d.stamp}: best of {len(rows)} matmul shapes "
                                                 f"{fmt_rate(best, 'FLOP/s')} (median over repeats); {kept}; "
                                                 f"largest shape {label}")
    if not measured:
        return
    ref = reference_dtype(d.kind, measured)
    # the rate measured here is this GPU's over the calibration's own run: the base spec's sustained factor
    # (another GPU's long GEMM loop) does not carry over onto it
    d.eff.pop("matrix_sustained", None)
    d.sources.pop("efficiency.matrix_sustained", None)
    d.eff["matrix"] = cap(large[ref]) or d.eff["matrix"]
    for dt in measured:
        d.eff[f"matrix_{dt}"] = cap(large[dt]) or d.eff["matrix"]
        if dt != ref:
            d.sources[f"efficiency.matrix_{dt}"] = (f"{d.stamp}: {dt} matmul rate {d.relative}, median of the "
                                                    f"{_LARGEST} largest shapes")
    d.eff.pop(f"matrix_{ref}", None)
    d.fields["matrix_efficiency_curve"], d.fields["matrix_efficiency_curve_dtype"] = (
        (curves[ref], ref) if len(curves[ref]) >= 2 else ((), ""))
    d.fields["matrix_shape_curve"] = shapes[ref]
    if shapes[ref]:
        d.sources["matrix_shape_curve"] = (
            f"{d.stamp}: {ref} skinny F.linear shapes (smallest dimension < {SKINNY_RATIO} x largest), smallest "
            f"dimension -> measured efficiency / the FLOPs curve's at equal FLOPs (median per dimension), 1.0 from "
            f"the next non-skinny shape's smallest dimension on")
    d.sources["matrix_efficiency_curve"] = (
        f"{d.stamp}: {ref} matmuls (torch.mm squares and non-skinny F.linear shapes), FLOPs per kernel -> measured rate "
        f"{d.relative} after subtracting the {d.op_s * 1e6:.2f} us tiny-op time"
        + (f" and mm's fixed cost ({mm_fixed * 1e6:.2f} us, op_fixed_s)" if mm_fixed else "")
        + "; other dtypes run its size-dependent floor plus their own flat rate (perfcheck.predict.matrix_curve)")
    d.sources["efficiency.matrix"] = (f"{d.stamp}: {ref} matmul rate {d.relative}, median of the {_LARGEST} largest "
                                      f"shapes" + "".join(f"; {x}: {large[x]:.3f}" for x in measured if x != ref))
    _matrix_cold(d, table)


def _mm_fixed(d: Draft, table) -> float:
    """mm's fixed cost per call beyond a tiny op's (CPU; 0 on a GPU or without its ``opfixed`` row). On a CPU a GEMM
    is priced dispatch + op_fixed_s["mm"] + FLOPs / (peak x eff) on one thread: the curves take out both fixed parts
    (a 32^3 mm: ~9.6 us of which ~4.8 us fixed on the project's VM). On a GPU the loop is timed on the device, where
    the host's fixed cost overlaps; only the tiny-op time comes out."""
    fixed_mm = seconds_of(table[(table["kind"] != names.OPFIXED) | fp32_rows(table)], names.OPFIXED, "mm")
    return max(fixed_mm - d.op_s, 0.0) if (fixed_mm is not None and d.kind == "cpu") else 0.0


def _timed(rows: pd.DataFrame, dtype: str) -> pd.DataFrame:
    """The matmul rows that read a time: a case's repeats are read against the tiny-op reference timed before each
    (``repeats.against_reference``: t - ref), so on a busy machine a small GEMM's reading can fall to the floor
    (seconds 0 after ``anchored``'s clip at 0): such a row says nothing of the rate and is left out, not read as an
    infinite one (which made the peak infinite and every prediction after it wrong). None left: a one-line error."""
    kept = rows[np.isfinite(rows["seconds"].to_numpy(float)) & (rows["seconds"].to_numpy(float) > 0)]
    if kept.empty:
        raise UserError(f"calibration: no {dtype} matmul case read a time above the tiny-op reference (the machine "
                        "was too busy while it ran); run `perfcheck calibrate` again on a quieter machine")
    return kept


def _matrix_cold(d: Draft, table: pd.DataFrame):
    """``matrix_cold_curve``: per shape of ``matmul_cold_cases`` (each call timed alone after the same call, label
    ``hot <shape>``, and after L2 was evicted, label ``<shape>``), hot / cold compute time (less the ``fixed_s``
    dispatch and fixed cost), capped at 1, by FLOPs per kernel (``efficiency_curve``); since 2026-11-26 as
    c / (c + e), c the GEMM's compute term on the spec fitted so far, e the extra cold time (see the code). The
    smallest shape's extra
    The estimator's per-op code coldness (``host.op_cold_s``, added to an op whose family differs from the one
    before: a GEMM in a step) is taken out of every cold time first, so it is not counted twice; the rest (the
    operands' and the library's buffers' refetch, and the translation entries the eviction dropped: a 32^3 GEMM,
    a few KiB of data, took ~26 us more after it on the project's Xeon, op_cold_s ~8 us) is the curve's. Also ``calibration.l2_bytes``, the L2 those cases evicted (their ``l2`` row): the
    reuse distance beyond which the estimator counts an operand as evicted (``predict.reuse``)."""
    rows = rows_of(table, names.MATMUL_COLD)
    l2 = rows[rows["label"] == "l2"]
    hot = rows[rows["label"].str.startswith("hot ")].assign(label=lambda t: t["label"].str[4:])
    pairs = hot.merge(rows[["label", "seconds"]], on="label", suffixes=("", "_cold")).sort_values("flops")
    if not len(l2) or len(pairs) < 3:
        return
    hot_s = pairs["seconds"].to_numpy(float)
    cold_s = pairs["seconds_cold"].to_numpy(float)
    code_s = float(dict(d.fields.get("host", {}) or {}).get("op_cold_s", host_constants(d.base)["op_cold_s"]))
    # the refetch e = cold - op_cold_s - hot over the GEMM's compute term c on the spec built so far (the
    # estimator's time of that call): factor = c / (c + e), so the estimator's cold time c / factor = c + e. The
    # measured hot time less the fixed cost, the denominator before, is a fraction of a microsecond for the
    # smallest GEMM: one noisy calibration fitted 1e-4 there and priced a cold 32^3 GEMM at 4.1 ms, not ~0.4 us + e
    spec = dataclasses.replace(d.base, matrix_flops_per_s=d.matrix, efficiency=d.eff, **{
        k: v for k, v in d.fields.items() if k in ("matrix_efficiency_curve", "matrix_shape_curve")})
    dtype = str(pairs["dtype"].iloc[0] or "fp32")
    min_dim = pairs[["m", "k", "n"]].to_numpy(float).min(axis=1)
    compute_s = np.asarray(roofline.compute_time_s(pairs["flops"].to_numpy(float), 0.0, spec, dtype,
                                                   kernels=np.ones(len(pairs)), min_dim=min_dim), dtype=float)
    extra = np.maximum(cold_s - code_s - hot_s, 0.0)
    ratio = compute_s / np.maximum(compute_s + extra, 1e-15)
    d.fields["matrix_cold_curve"] = efficiency_curve(pairs, np.clip(ratio, 1e-3, 1.0))
    d.fields["calibration"] = {**dict(d.base.calibration or {}), **dict(d.fields.get("calibration", {}) or {}),
                               "l2_bytes": int(l2["m"].iloc[0])}
    d.sources["matrix_cold_curve"] = (
        f"{d.stamp}: the matmul shapes timed call by call after the same call and after streaming "
        f"{names.EVICT_L2_MULTIPLE} x the {int(l2['m'].iloc[0]) // 1024} KiB L2 (untimed): the GEMM's compute "
        f"term c over c + the extra cold time (cold - hot, less op_cold_s, {code_s * 1e6:.1f} us, priced per op "
        f"apart), by FLOPs per kernel")


def _vector(d: Draft, table):
    vec = rows_of(table, names.VECTOR)
    for r in vec.itertuples(index=False):
        rate = r.flops / max(r.seconds - d.op_s, r.seconds * 0.05)
        if d.peaks == "measured":
            d.vector[r.dtype] = rate
        if r.dtype == "fp32" or len(vec) == 1:
            d.eff["vector"] = 1.0 if d.peaks == "measured" else cap(rate / d.base.vector_peak(r.dtype))
        d.sources[f"vector_flops_per_s.{r.dtype}"] = (
            f"{d.stamp}: torch.add of {int(r.m)} elements (cache-resident), 1 FLOP per element, "
            f"{fmt_rate(rate, 'FLOP/s')} after subtracting the tiny-op time")
    if len(vec):
        d.sources["efficiency.vector"] = f"{d.stamp}: elementwise add rate {d.relative}"


def _memory(d: Draft, table):
    cp = rows_of(table, names.COPY).sort_values("bytes", kind="stable")
    if not len(cp):
        return
    big = cp.iloc[-1]
    bw = float(big["bytes"] / big["seconds"])
    if d.peaks == "measured":
        d.fields["mem_bandwidth_bytes_per_s"], d.eff["memory"] = bw, 1.0
    else:
        d.eff["memory"] = cap(bw / d.base.mem_bandwidth_bytes_per_s)
    # CPU only: a GPU copy loop is timed on the device, where the host's tiny-op time is not the per-kernel
    # fixed cost to take out (an L2-resident GPU working set is not modelled yet: no curve, factor 1)
    curve = bandwidth_curve(cp, d.op_s) if d.kind == "cpu" else ()
    d.fields["mem_bandwidth_curve"] = curve
    if curve:
        d.sources["mem_bandwidth_curve"] = (
            f"{d.stamp}: copies of {', '.join(size_text(b / 2) for b, _ in curve)}, bytes moved (read + write) -> "
            f"rate after subtracting the {d.op_s * 1e6:.2f} us tiny-op time / the largest copy's rate (at least 1)")
    others = ", ".join(f"{size_text(r.bytes / 2)}: {fmt_rate(r.bytes / r.seconds, 'B/s')}" for r in cp.itertuples())
    d.sources["mem_bandwidth_bytes_per_s"] = (
        f"{d.stamp}: copy of {size_text(big['bytes'] / 2)} (read + write counted), {fmt_rate(bw, 'B/s')}"
        + ("" if d.peaks == "measured" else f", i.e. {d.eff['memory']:.3f} of the datasheet") + f"; by size: {others}")
    d.sources["efficiency.memory"] = f"{d.stamp}: large-copy bandwidth {d.relative}"
    _memory_cold(d, table)


def _memory_cold(d: Draft, table: pd.DataFrame):
    """``memory_cold_curve``: ((bytes per kernel, f), ...) from ``cold_cases.memory_cold_cases`` (each memory-bound
    op timed alone after the same call, label ``hot <op> <n>``, and after L2 was evicted, label ``<op> <n>``).

    Derivation. A cold call pays its hot time plus the refetch of its operands from beyond L2,
    e = max(cold - op_cold_s - hot, 0) (``host.op_cold_s``, the per-op code coldness the estimator adds to an op
    whose family differs from the one before, is taken out so it is not counted twice, as for the GEMMs). That
    refetch is memory traffic: it lengthens the op's roofline memory term m = bytes / (bandwidth x efficiency x
    ``mem_bandwidth_curve``(bytes)) (``roofline.memory_time_s`` on the spec this fit has built so far), so

        f = m / (m + e)          the memory term's rate with the operands evicted over its tight-loop rate,

    median over the ops of one size, keyed by the median of their bytes. The estimator divides the memory term of
    an op whose operands are evicted by f (``cold_curves.memory_cold_factor``) and adds the difference, e, to the
    op's time whatever bounds it (``roofline.device_times``: a softmax or layer norm case paid it too).
    Also ``calibration.l2_bytes`` (the cases' ``l2`` row), as the matmul cold cases record it."""
    rows = rows_of(table, names.MEMORY_COLD)
    l2 = rows[rows["label"] == "l2"]
    hot = rows[rows["label"].str.startswith("hot ")].assign(label=lambda t: t["label"].str[4:])
    pairs = hot.merge(rows[["label", "seconds"]], on="label", suffixes=("", "_cold"))
    if not len(l2) or pairs["m"].nunique() < 2:
        return
    spec = dataclasses.replace(d.base, efficiency=d.eff, **{k: v for k, v in d.fields.items() if k in (
        "mem_bandwidth_bytes_per_s", "mem_bandwidth_curve")})
    nbytes = pairs["bytes"].to_numpy(float)
    mem_s = np.asarray(roofline.memory_time_s(nbytes, spec, kernels=np.ones(len(pairs))), dtype=float)
    code_s = float(dict(d.fields.get("host", {}) or {}).get("op_cold_s", host_constants(d.base)["op_cold_s"]))
    extra = np.maximum(pairs["seconds_cold"].to_numpy(float) - code_s - pairs["seconds"].to_numpy(float), 0.0)
    frame = pd.DataFrame({"m": pairs["m"].to_numpy(), "bytes": nbytes, "f": mem_s / np.maximum(mem_s + extra, 1e-15)})
    grouped = frame.groupby("m", sort=True).median()
    d.fields["memory_cold_curve"] = tuple((float(r.bytes), float(round(min(max(r.f, 1e-3), 1.0), 4)))
                                          for r in grouped.itertuples())
    d.fields["calibration"] = {**dict(d.base.calibration or {}), **dict(d.fields.get("calibration", {}) or {}),
                               "l2_bytes": int(l2["m"].iloc[0])}
    ops = ", ".join(dict.fromkeys(str(x).rsplit(" ", 1)[0] for x in pairs["label"]))
    d.sources["memory_cold_curve"] = (
        f"{d.stamp}: memory-bound ops ({ops}) timed call by call after the same call and after streaming "
        f"{names.EVICT_L2_MULTIPLE} x the {int(l2['m'].iloc[0]) // 1024} KiB L2 (untimed): the roofline memory "
        f"term m over m + the extra cold time (less op_cold_s, {code_s * 1e6:.1f} us, priced per op apart), median "
        f"per size, by bytes per kernel")


def bandwidth_curve(copies: pd.DataFrame, op_s: float = 0.0) -> tuple:
    """((bytes moved, factor), ...) from copy rows sorted by size: each copy's rate (time less the
    tiny-op time ``op_s``, at least 5% of it left) over the largest copy's, at least 1 (a smaller copy
    measured slower than the largest is noise, not a slower memory), the largest at exactly 1;
    () with fewer than two sizes."""
    cp = copies.sort_values("bytes", kind="stable")
    if len(cp) < 2:
        return ()
    b = cp["bytes"].to_numpy(float)
    t = cp["seconds"].to_numpy(float)
    rate = b / np.maximum(t - op_s, 0.05 * t)
    factor = np.maximum(rate / rate[-1], 1.0)
    factor[-1] = 1.0
    return tuple((float(x), float(round(f, 4))) for x, f in zip(b, factor))


def _collectives(d: Draft, table):
    """The intra-node link: all-reduce bus bandwidth at the largest size; every size kept in the source text."""
    comm = table[table["kind"].isin(BENCHMARKED_KINDS)]
    if not len(comm):
        return
    ar = comm[comm["kind"] == "allreduce"] if (comm["kind"] == "allreduce").any() else comm
    big = ar.sort_values("bytes", kind="stable").iloc[-1]
    busbw = float(big["busbw_bytes_per_s"])
    if d.peaks == "measured":
        d.fields["intra_node_bandwidth_bytes_per_s"], d.eff["intra_node"] = busbw, 1.0
    else:
        d.eff["intra_node"] = cap(busbw / d.base.intra_node_bandwidth_bytes_per_s)
    by_size = "; ".join(f"{k}: " + ", ".join(f"{size_text(r.bytes)} {fmt_rate(r.busbw_bytes_per_s, 'B/s')}"
                                             for r in g.sort_values("bytes").itertuples())
                        for k, g in comm.groupby("kind", sort=False))
    d.sources["intra_node_bandwidth_bytes_per_s"] = (
        f"{d.stamp}: {big['kind']} bus bandwidth (nccl-tests convention) at {size_text(big['bytes'])} across "
        f"{int(big['world_size'])} ranks, {fmt_rate(busbw, 'B/s')}; busbw by size: {by_size}")
    d.sources["efficiency.intra_node"] = f"{d.stamp}: large-message all-reduce busbw {d.relative}"


def _field_names():
    return {f.name for f in dataclasses.fields(SystemSpec)}


def summary_rows(spec: SystemSpec, table: pd.DataFrame) -> list:
    """(what, value) lines for the calibration report (presentation helper, no printing)."""
    out = [("system", f"{spec.name} (calibrated)" if spec.calibrated else spec.name)]
    for d, v in spec.matrix_flops_per_s.items():
        out.append((f"matrix {d}", f"{fmt_rate(v, 'FLOP/s')} peak x {spec.matrix_efficiency(d):.3f} at large sizes"))
    for d, v in spec.vector_flops_per_s.items():
        out.append((f"vector {d}", f"{fmt_rate(v, 'FLOP/s')} x {spec.efficiency['vector']:.3f}"))
    out.append(("memory", f"{fmt_rate(spec.mem_bandwidth_bytes_per_s, 'B/s')} x {spec.efficiency['memory']:.3f}"))
    out.append(("launch overhead", f"{spec.launch_overhead_s * 1e6:.2f} us per kernel"))
    out.append(("intra-node link", f"{fmt_rate(spec.intra_node_bandwidth_bytes_per_s, 'B/s')} x "
                                   f"{spec.efficiency['intra_node']:.3f}"))
    for f, e in spec.matrix_efficiency_curve:
        out.append(("curve", f"{f:.3g} FLOP/kernel -> {e:.3f}"))
    for b, f in spec.mem_bandwidth_curve:
        out.append(("memory curve", f"{size_text(b)} moved per kernel -> {f:.2f} x the memory rate"))
    for b, f in spec.memory_cold_curve:
        out.append(("memory cold", f"{size_text(b)} moved per kernel, operands evicted from L2 -> {f:.2f} x its rate"))
    for name, phases in spec.op_row_s.items():
        out.append((f"per row {name}", ", ".join(f"{ph} {v * 1e9:.0f} ns" for ph, v in phases.items())))
    comm = table[table["kind"].isin(BENCHMARKED_KINDS)] if "kind" in table else table.iloc[0:0]
    for r in comm.itertuples(index=False):
        out.append((f"{r.kind} {size_text(r.bytes)}",
                    f"{r.seconds * 1e6:.1f} us, busbw {fmt_rate(r.busbw_bytes_per_s, 'B/s')}"))
    return out

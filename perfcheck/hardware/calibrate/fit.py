"""Turn a table of micro-benchmark measurements into a calibrated ``SystemSpec`` (pure arithmetic).

``build_spec(base, table, peaks=...)`` is kept apart from the timing code so its arithmetic is
tested on hand-made tables (tests/test_calibrate.py). Conventions are documented in
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

from perfcheck.errors import UserError
from perfcheck.hardware.systems import LOW_HOST_DTYPES, SystemSpec, host_constants, load_system

#: Columns of the measurement table (``Calibration.measurements``, ``perfcheck calibrate --csv``).
MEASUREMENT_COLUMNS = ("kind", "label", "dtype", "m", "k", "n", "flops", "bytes", "world_size", "seconds",
                       "seconds_min", "seconds_max", "repeats", "iters", "flops_per_s", "bytes_per_s",
                       "busbw_bytes_per_s")
COLLECTIVE_KINDS = ("allreduce", "allgather", "reducescatter")
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


def _cap(x: float) -> float:
    return float(min(1.0, x))


def _rows(table: pd.DataFrame, kind: str, **eq) -> pd.DataFrame:
    sel = table["kind"] == kind
    for col, value in eq.items():
        sel &= table[col] == value
    return table[sel]


def _seconds(table, kind, label) -> Optional[float]:
    rows = _rows(table, kind, label=label)
    return float(rows["seconds"].iloc[0]) if len(rows) else None


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


def _fmt_rate(x, unit):
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def _size(nbytes: float) -> str:
    for scale, unit in ((2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


@dataclasses.dataclass
class _Draft:
    """The spec being built: fields to replace, sources, and the conventions every step needs."""

    base: SystemSpec
    peaks: str
    stamp: str
    kind: str
    matrix: dict
    vector: dict
    eff: dict
    sources: dict
    fields: dict = dataclasses.field(default_factory=dict)
    op_s: float = 0.0  # one plain tiny op, subtracted from matmul and vector times

    @property
    def relative(self) -> str:
        what = "the datasheet peak" if self.peaks == "base" else "the best measured rate"
        return f"as a fraction of {what}"


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
    d = _Draft(base, peaks, stamp, kind or base.kind, dict(base.matrix_flops_per_s), dict(base.vector_flops_per_s),
               dict(base.efficiency), sources)
    _launch(d, table, threads)
    _host(d, table, threads)
    _matrix(d, table)
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
    spec = _row_costs(_per_op_costs(spec, table, d), table, d)
    return _alignment(_module_costs(spec, table, d), table, d)


def measured_here(spec, keys) -> bool:
    """Whether each of ``keys`` (source keys, e.g. "host.collective_latency_s") of ``spec`` was measured by a
    calibration of its own: it has a source, and not one ``build_spec`` hands down from the base spec ("from
    base spec ...": a datasheet value or a rough default, from another machine)."""
    sources = dict(getattr(spec, "sources", {}) or {})
    return all(k in sources and not str(sources[k]).startswith("from base spec") for k in keys)


def apply_collectives(spec: SystemSpec, table, stamp: str, *, peaks: str = None) -> SystemSpec:
    """``spec`` with what a collectives table measures, by the same arithmetic as ``perfcheck calibrate``
    (``_collectives``, ``_collective_latency``): the intra-node link (all-reduce bus bandwidth at the
    largest size; ``peaks`` "measured", a CPU's default: it becomes the link with efficiency 1; "base": the
    efficiency over the spec's link) and ``host.collective_latency_s`` (alpha: a small all-reduce less its
    bandwidth term), each with its source. Used by ``perfcheck sweep`` to add the collectives to a cached
    calibration that was made without them (the automatic quick calibration runs no second process)."""
    peaks = peaks or ("measured" if spec.kind == "cpu" else "base")
    draft = _Draft(spec, peaks, stamp, spec.kind, dict(spec.matrix_flops_per_s), dict(spec.vector_flops_per_s),
                   dict(spec.efficiency), dict(spec.sources))
    _collectives(draft, table)
    host = dict(spec.host)
    _collective_latency(host, draft.sources, table, stamp)
    return dataclasses.replace(spec, efficiency=draft.eff, host=host, sources=draft.sources, **draft.fields)


def _alignment(spec: SystemSpec, table, d: _Draft) -> SystemSpec:
    """``efficiency.matrix_unaligned`` (forward) and ``matrix_unaligned_bwd``: per ``alignment_cases``
    shape, the estimator's time on this spec for the aligned twin's GEMMs (FLOPs at the calibrated
    curve and shape factor) over the measured unaligned time; median over shapes, capped at 1. Relative
    to the model's twin, not the twin's measured time, so the factor does not count the curve's own
    error twice. Absent when not measured (CPU)."""
    from perfcheck.predict import roofline

    rows = table[table["kind"] == "gemm_align"]
    if rows.empty:
        return spec
    meas = {r.label: r for r in rows.itertuples()}
    eff, sources = dict(spec.efficiency), dict(spec.sources)
    for phase, key in (("fwd", "matrix_unaligned"), ("bwd", "matrix_unaligned_bwd")):
        ratios = []
        for lab, r in meas.items():
            twin = meas.get(lab.replace("unaligned ", "aligned ", 1))
            if not lab.startswith(f"unaligned {phase} ") or twin is None or r.seconds <= 0:
                continue
            gemms = 1 if phase == "fwd" else 2  # dX = dY W, dW = dY^T X: each the forward's FLOPs
            model, _ = roofline.op_time_s(float(twin.flops), 0.0, float(twin.bytes), float(gemms), spec, r.dtype,
                                          launch_s=0.0, min_dim=float(min(twin.m, twin.k, twin.n)))
            ratios.append(model / float(r.seconds))
        if ratios:
            eff[key] = _cap(float(np.median(ratios)))
            sources[f"efficiency.{key}"] = (
                f"{d.stamp}: F.linear {phase} with n not a multiple of 16 bytes, the estimator's time for its aligned "
                f"twin (n rounded up to 8) over the measured time, median of {len(ratios)} shapes "
                f"({', '.join(f'{x:.3f}' for x in sorted(ratios))})")
    return dataclasses.replace(spec, efficiency=eff, sources=sources)


def _per_op_costs(spec: SystemSpec, table, d: _Draft) -> SystemSpec:
    """op_fixed_s (tiny call less one plain tiny op) and op_efficiency (the formulas' roofline time on
    the calibrated spec / the measured time less dispatch and fixed cost, capped at 1)."""
    from perfcheck.predict import roofline

    # classfixed: a CPU op class's tiny call (op_classes.conv_fixed_cases), fitted as an op family's
    all_fixed, eff_rows = pd.concat([_rows(table, "opfixed"), _rows(table, "classfixed")]), _rows(table, "opeff")
    if not len(all_fixed) and not len(eff_rows):
        return spec
    fp32 = _fp32(all_fixed)
    fixed_rows = all_fixed[fp32]
    fixed = {r.label: max(float(r.seconds) - d.op_s, 0.0) for r in fixed_rows.itertuples(index=False)}
    # other dtypes (cases.op_fixed_cases' ``dtypes``) ran with gradients: less the dispatch and the autograd node,
    # each priced apart in the estimator; keyed <op>@<dtype> (the estimator falls back to <op> for a dtype
    # calibration did not run)
    node = float(host_constants(spec)["autograd_node_s"])
    low = {roofline.op_efficiency_key(r.label, r.dtype): max(float(r.seconds) - d.op_s - node, 0.0)
           for r in all_fixed[~fp32].itertuples(index=False)}
    eff, sources = {}, dict(spec.sources)
    for r in eff_rows.itertuples(index=False):
        roof, _ = roofline.op_time_s(float(r.flops), float(r.n), float(r.bytes), 1.0, spec, r.dtype or "fp32",
                                     launch_s=0.0)
        kernel_s = max(float(r.seconds) - d.op_s - fixed.get(r.label, 0.0), 1e-9)
        eff[roofline.op_efficiency_key(r.label, r.dtype or "fp32")] = float(min(max(roof / kernel_s, 1e-4), 1.0))
    if fixed:
        sources["op_fixed_s"] = (f"{d.stamp}: per aten op, one call on tiny tensors (8x16, 1x1x6x6; a convolution "
                                 f"on 2x1x6x6, the path of a batch >= 2) less one plain tiny op ({d.op_s * 1e6:.2f} us): the op family's fixed cost beyond a "
                                 f"tiny add's dispatch (host time in the estimator)")
    if eff:
        sources["op_efficiency"] = (f"{d.stamp}: the estimator's roofline time on this spec / the measured time "
                                    f"less dispatch and fixed cost, at a LeNet-like size (conv 3->6 ch 5x5 on "
                                    f"8x3x32x32; 2x2 max-pool of 8x6x28x28), per dtype measured (op@bf16: bf16)")
    if low:
        sources["op_fixed_s"] = sources.get("op_fixed_s", "") + (
            f"; <op>@<dtype>: the same calls in that dtype on tensors needing a gradient less the tiny op and "
            f"autograd_node_s ({node * 1e6:.2f} us)")
    return dataclasses.replace(spec, op_fixed_s={**fixed, **low}, op_efficiency=eff, sources=sources)


def _fp32(rows: pd.DataFrame) -> pd.Series:
    """Rows of the fp32 (or untyped: older tables) host cases."""
    return rows["dtype"].fillna("").astype(str).isin(("fp32", "", "nan"))


def _row_costs(spec: SystemSpec, table, d: _Draft) -> SystemSpec:
    """op_row_s: per row-wise op and phase (``cases.row_cases``, label "<op> fwd|bwd", m = rows, k = row length),
    per row length L the slope of the measured time over the row count less the slope of the estimator's roofline
    time for the same calls on ``spec`` (its elements' share: the model adds that itself); then the row's cost by
    its length, ``slope(L) = row + vector x floor(L/W) + tail x L x [L < W] + partial x [L > W, L mod W > 0]``
    (perfcheck.predict.roofline.row_time_s), by least squares over the lengths with every term >= 0
    (``row_terms_fit``; ``cases.row_lengths``' four lengths W/2, W, W + W/4, 2W determine the four terms):
    ``<phase>``, ``<phase>_vector``, ``<phase>_tail``, ``<phase>_partial``. W (fp32 elements per SIMD vector) is
    half the longest length and sets the spec's ``simd_bytes``. One length (nll_loss): its slope, floored at 0, prices every row alike.
    Slopes leave out every fixed cost (dispatch, op_fixed_s), which the model prices apart."""
    rows = _rows(table, "oprows")
    if not len(rows):
        return spec
    from perfcheck.predict import roofline

    lengths = sorted(set(rows["k"].astype(int)))
    width = max(lengths[-1] // 2, 1)
    table_out, shown = {}, []
    for label, group in rows.groupby("label", sort=False):
        name, phase = str(label).rsplit(" ", 1)
        eff = roofline.op_efficiency(spec, name, "fp32")  # the row cases run in fp32
        slopes = {}
        for cols, g in group.groupby("k", sort=True):
            g = g.sort_values("m")
            if len(g) < 2 or g["m"].iloc[-1] <= g["m"].iloc[0]:
                continue
            roof = [roofline.op_time_s(0.0, float(r["flops"]), float(r["bytes"]), float(max(r["n"], 1)), spec,
                                       r["dtype"] or "fp32", launch_s=0.0)[0] / eff for r in (g.iloc[0], g.iloc[-1])]
            span = float(g["m"].iloc[-1] - g["m"].iloc[0])
            slopes[int(cols)] = (float(g["seconds"].iloc[-1] - g["seconds"].iloc[0]) - (roof[1] - roof[0])) / span
        if not slopes:
            continue
        terms = row_terms_fit(slopes, width) if len(slopes) >= 4 else (float(max(np.median(list(slopes.values())),
                                                                                   0.0)), None, None, None)
        entry = table_out.setdefault(name, {})
        entry[phase] = terms[0]
        text = f"{name} {phase} {terms[0] * 1e9:.0f} ns"
        if terms[1] is not None:
            entry[f"{phase}_vector"], entry[f"{phase}_tail"], entry[f"{phase}_partial"] = terms[1:]
            text += (f" + {terms[1] * 1e9:.1f} per vector, {terms[2] * 1e9:.1f} per element under a vector, "
                     f"{terms[3] * 1e9:.1f} per partial vector")
        shown.append(text)
    if not table_out:
        return spec
    counts = sorted(set(rows["m"].astype(int)))
    sources = dict(spec.sources)
    sources["op_row_s"] = (f"{d.stamp}: per row-wise kernel, the slope of its time over {counts[0]} -> {counts[-1]} rows "
                           f"less the slope of the estimator's roofline time for the same calls, per row length "
                           f"{', '.join(map(str, lengths))} (fp32), fitted as row + vector x floor(L/{width}) + tail x L "
                           f"[L < {width}] + partial [L > {width}, L mod {width} > 0] (least squares, terms >= 0): "
                           + "; ".join(shown))
    sources["simd_bytes"] = (f"{d.stamp}: the row cases' SIMD width ({width} fp32 elements: "
                             f"torch.backends.cpu.get_cpu_capability(), perfcheck.hardware.systems.SIMD_BYTES)")
    return dataclasses.replace(spec, op_row_s=table_out, simd_bytes=4 * width, sources=sources)


def row_terms_fit(slopes: dict, width: int) -> tuple:
    """``(row, vector, tail, partial)`` seconds, each >= 0, minimising the squared error of
    ``row + vector x floor(L/width) + tail x L x [L < width] + partial x [L > width and L mod width > 0]`` against
    ``slopes`` (row length L -> seconds per row): ordinary least squares on every subset of the four terms (the
    others 0), the best one with no negative term."""
    import itertools

    lengths = np.array(sorted(slopes), dtype=float)
    y = np.array([slopes[int(L)] for L in lengths], dtype=float)
    x = np.stack([np.ones_like(lengths), np.floor(lengths / width), lengths * (lengths < width),
                  ((lengths > width) & (np.mod(lengths, width) > 0)).astype(float)], axis=1)
    best, best_err = (0.0, 0.0, 0.0, 0.0), float(np.sum(y ** 2))
    for size in (1, 2, 3, 4):
        for cols in itertools.combinations(range(4), size):
            coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if np.any(coef < 0):
                continue
            full = np.zeros(4)
            full[list(cols)] = coef
            err = float(np.sum((x @ full - y) ** 2))
            if err < best_err - 1e-30:
                best, best_err = tuple(float(c) for c in full), err
    return best


def _module_costs(spec: SystemSpec, table, d: _Draft) -> SystemSpec:
    """module_fixed_s: per standard nn module class, its measured call (``layers.tiny_modules``) less the
    estimator's forward for it on ``spec`` (whose host constants and per-op costs are already fitted),
    floored at 0: the Python and autograd work of that layer the per-op host model does not see."""
    rows = _rows(table, "modfixed")
    if not len(rows):
        return spec
    from perfcheck.hardware.calibrate.layers import tiny_modules
    from perfcheck.predict.estimate import estimate
    from perfcheck.schema import ROOT

    mods = tiny_modules("cpu")  # the estimator traces on fake tensors: the device does not matter
    # the cases repeat one module in a tight loop: estimate them as such, without the step's per-op cold cost
    tight = dataclasses.replace(spec, host={**dict(spec.host), "op_cold_s": 0.0})
    fixed = {}
    for r in rows.itertuples(index=False):
        if r.label not in mods:
            continue  # a table from another perfcheck version
        m, x = mods[r.label]
        pred = estimate(m, x, system=tight)
        fixed[r.label] = max(float(r.seconds) - float(pred.loc[pred["module"] == ROOT, "pred_fwd_s"].iloc[0]), 0.0)
    sources = dict(spec.sources)
    sources["module_fixed_s"] = (f"{d.stamp}: per nn module class, one training-mode call on tiny tensors "
                                 f"(8x16, 1x1x6x6, convolutions on a batch of 2; parameters and inputs needing "
                                 f"gradients) less the estimator's "
                                 f"forward for it on this spec (dispatch, autograd nodes, per-op fixed costs, module call)")
    return dataclasses.replace(spec, module_fixed_s=fixed, sources=sources)


def op_cold_excess(table, dtype: str = "fp32") -> Optional[tuple]:
    """``(op_cold_s, ops, round-robin s per op, tight-loop s per op)`` from the ``opcold`` case (the tiny
    ops called one after another, seconds per op) and the ``opfixed`` cases of the same ops (each in its own
    tight loop): the round-robin's time per op less the tight loops' mean, floored at 0 (a negative excess
    is noise: an op cannot run faster for following another). None without both. ``dtype``: the cases of
    that dtype (fp32: also untyped rows of older tables)."""
    rr, fixed = _rows(table, "opcold"), _rows(table, "opfixed")
    if dtype == "fp32":
        rr, fixed = rr[_fp32(rr)], fixed[_fp32(fixed)]
    else:
        rr, fixed = rr[rr["dtype"] == dtype], fixed[fixed["dtype"] == dtype]
    if not len(rr) or not len(fixed):
        return None
    r = rr.iloc[0]
    n = int(str(r["label"]).rsplit("x", 1)[-1]) if str(r["label"]).rsplit("x", 1)[-1].isdigit() else 0
    if n != len(fixed):  # not the same set of ops (a table from another version): no matched subtraction
        return None
    tight = float(fixed["seconds"].mean())
    return max(float(r["seconds"]) - tight, 0.0), n, float(r["seconds"]), tight


def _launch(d: _Draft, table, threads):
    d.op_s = _seconds(table, "launch", "op") or 0.0
    launch = _seconds(table, "launch", "autograd") or (d.op_s or None)
    if launch:
        where = f" with {threads} thread{'s' if threads != 1 else ''}" if threads else ""
        d.fields["launch_overhead_s"] = launch
        d.sources["launch_overhead_s"] = (f"{d.stamp}: per-kernel time of a chain of tiny multiplies run forward and "
                                          f"backward under autograd{where} (one plain tiny op: {d.op_s * 1e6:.2f} us)")


def _host(d: _Draft, table, threads):
    """The host block (perfcheck.predict.host): each constant from its case, slopes and intercepts
    from the cases of two sizes; constants without a case keep the base's (or the defaults)."""
    host = _rows(table, "host")
    if not len(host):
        return
    sec = {r.label: float(r.seconds) for r in host.itertuples(index=False)}
    where = f" with {threads} thread{'s' if threads != 1 else ''}" if threads else ""
    out, src = dict(d.base.host), {}

    def put(key, value, how):
        out[key] = float(max(value, 0.0))
        src[f"host.{key}"] = f"{d.stamp}{where}: {how}"

    op = d.op_s
    if op:
        put("op_dispatch_s", op, "one torch.add of 1-element tensors (nothing to compute: all dispatch)")
    if "view" in sec:
        put("view_dispatch_s", sec["view"], "Tensor.t() of a 1x1 tensor")
    chain = next((lab for lab in sec if lab.startswith("autograd forward x")), None)
    plain = sec.get(chain.replace("autograd", "plain")) if chain else None
    if chain and plain:
        # the same ``y * b`` chain without autograd: subtracting torch.add's dispatch instead (a Python
        # function call, ~1-2 us dearer than the ``*`` operator's slot) read 1.0 us where a node costs 2.9
        put("autograd_node_s", sec[chain] - plain, f"per op of a chain of 1-element multiplies under autograd "
                                                   f"({sec[chain] * 1e6:.2f} us), minus the same chain without "
                                                   f"autograd ({plain * 1e6:.2f} us)")
    elif chain and op:
        put("autograd_node_s", sec[chain] - op, f"per op of a chain of 1-element multiplies under autograd "
                                                f"({sec[chain] * 1e6:.2f} us), minus the plain op")
    fb = _rows(host, "host")[host["label"].str.startswith("forward+backward x")].sort_values("m")
    if len(fb) >= 2 and chain and op:
        per_fwd = sec[chain]
        n = fb["m"].to_numpy(float)
        bwd = fb["seconds"].to_numpy(float) - n * per_fwd
        slope = (bwd[-1] - bwd[0]) / (n[-1] - n[0])
        put("backward_node_s", slope - op, f"backward of 1-element multiply chains of {int(n[0])} and {int(n[-1])} "
                                           f"(forward part subtracted): slope {slope * 1e6:.2f} us per node, minus "
                                           f"one op's dispatch (its grad kernel)")
        put("backward_call_s", bwd[0] - n[0] * slope, "intercept of the same line: loss.backward()'s fixed cost")
    if "module call" in sec:
        put("module_call_s", sec["module call"], "calling an nn.Module whose forward returns its input")
    for dt, key in (("fp32", "op_cold_s"), *((x, f"op_cold_{x}_s") for x in LOW_HOST_DTYPES)):
        cold = op_cold_excess(table, dt)
        if cold is not None:
            put(key, cold[0], f"the {cold[1]} tiny ops of the op_fixed cases called one after another, "
                              f"{cold[2] * 1e6:.2f} us per op, less the same ops each in a tight loop, "
                              f"{cold[3] * 1e6:.2f} us per op (mean)"
                              + ("" if dt == "fp32" else f"; {dt}, on tensors needing a gradient"))
    for label in ("sgd", "sgd_foreach", "adam", "adam_foreach"):
        rows = host[host["label"].str.fullmatch(f"optim {label} x\\d+")].sort_values("m")
        if len(rows) < 2:
            continue
        n, t = rows["m"].to_numpy(float), rows["seconds"].to_numpy(float)
        per = (t[-1] - t[0]) / (n[-1] - n[0])
        put(f"optim_{label}_per_tensor_s", per, f"torch.optim.{'SGD' if 'sgd' in label else 'Adam'}"
            f"(foreach={'foreach' in label}).step() + zero_grad(set_to_none=True) on {int(n[0])} and "
            f"{int(n[-1])} 1-element tensors: slope")
        # each implementation's own intercept: SGD foreach's was 139 us against the for-loop's 63 us on the H100
        # VM of 2026-11-26 (grouping by device and dtype, one launch per _foreach_ op), Adam's for-loop 211 us
        put("optim_step_s" if label == "sgd" else f"optim_{label}_step_s", t[0] - n[0] * per,
            f"intercept of the same line: step() + zero_grad()'s fixed cost ({label})")
    if "device kernel" in sec:
        put("device_kernel_s", sec["device kernel"], "GPU time per tiny add queued behind torch.cuda._sleep "
                                                     "(device alone, CUDA events)")
    elif d.kind == "cpu":
        put("device_kernel_s", 0.0, "0 on a CPU by definition: the op runs on the dispatching thread, "
                                    "so its fixed cost is op_dispatch_s")
    _collective_latency(out, src, table, d.stamp)
    d.fields["host"] = out
    d.sources.update(src)


def _collective_latency(out, src, table, stamp):
    """alpha of all-reduce: a smaller message's time less its bandwidth term (scaled from the largest),
    the least over the smaller sizes: on a shared machine one size's median can be a scheduler stall
    (4 KiB 5.8 ms beside 64 KiB 0.9 ms on the project's loaded 2-core VM), and alpha is a floor."""
    ar = table[table["kind"] == "allreduce"].sort_values("bytes", kind="stable")
    if len(ar) < 2:
        return
    big = ar.iloc[-1]
    alphas = [(float(r["seconds"]) - float(r["bytes"]) / float(big["bytes"]) * float(big["seconds"]), i)
              for i, (_, r) in enumerate(ar.iloc[:-1].iterrows())]
    alpha, i = min(alphas)
    small = ar.iloc[i]
    alpha = min(max(alpha, 0.0), float(small["seconds"]))
    out["collective_latency_s"] = alpha
    src["host.collective_latency_s"] = (f"{stamp}: all-reduce of {_size(small['bytes'])} "
                                        f"({small['seconds'] * 1e6:.1f} us) less its bandwidth term at the "
                                        f"{_size(big['bytes'])} rate, across {int(small['world_size'])} ranks")


def _matrix(d: _Draft, table):
    """Peaks (measured convention), efficiency at the largest shapes per dtype, the reference dtype's curve."""
    mm = _rows(table, "matmul")
    measured = [x for x in dict.fromkeys(mm["dtype"]) if x]
    large, curves, shapes = {}, {}, {}
    # On a CPU the estimator prices a GEMM as dispatch + op_fixed_s["mm"] (host) + FLOPs / (peak x eff), one after
    # the other on one thread: the curve takes out both fixed parts, so a small GEMM's efficiency is its compute
    # alone (a 32^3 mm: ~9.6 us of which ~4.8 us fixed on the project's VM). On a GPU the loop is timed on the
    # device, where the host's fixed cost overlaps; only the tiny-op time comes out, as before.
    fixed_mm = _seconds(table[(table["kind"] != "opfixed") | _fp32(table)], "opfixed", "mm")
    mm_fixed = max(fixed_mm - d.op_s, 0.0) if (fixed_mm is not None and d.kind == "cpu") else 0.0
    for dt in measured:
        rows = mm[mm["dtype"] == dt].sort_values("flops", kind="stable")
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
                                                 f"{_fmt_rate(best, 'FLOP/s')} (median over repeats); {kept}; "
                                                 f"largest shape {label}")
    if not measured:
        return
    ref = reference_dtype(d.kind, measured)
    d.eff["matrix"] = _cap(large[ref]) or d.eff["matrix"]
    for dt in measured:
        d.eff[f"matrix_{dt}"] = _cap(large[dt]) or d.eff["matrix"]
        if dt != ref:
            d.sources[f"efficiency.matrix_{dt}"] = (f"{d.stamp}: {dt} matmul rate {d.relative}, median of the "
                                                    f"{_LARGEST} largest shapes")
    d.eff.pop(f"matrix_{ref}", None)
    d.fields["matrix_efficiency_curve"] = curves[ref] if len(curves[ref]) >= 2 else ()
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
        + "; other dtypes scale it by efficiency.matrix_<dtype> / efficiency.matrix")
    d.sources["efficiency.matrix"] = (f"{d.stamp}: {ref} matmul rate {d.relative}, median of the {_LARGEST} largest "
                                      f"shapes" + "".join(f"; {x}: {large[x]:.3f}" for x in measured if x != ref))


def _vector(d: _Draft, table):
    vec = _rows(table, "vector")
    for r in vec.itertuples(index=False):
        rate = r.flops / max(r.seconds - d.op_s, r.seconds * 0.05)
        if d.peaks == "measured":
            d.vector[r.dtype] = rate
        if r.dtype == "fp32" or len(vec) == 1:
            d.eff["vector"] = 1.0 if d.peaks == "measured" else _cap(rate / d.base.vector_peak(r.dtype))
        d.sources[f"vector_flops_per_s.{r.dtype}"] = (
            f"{d.stamp}: torch.add of {int(r.m)} elements (cache-resident), 1 FLOP per element, "
            f"{_fmt_rate(rate, 'FLOP/s')} after subtracting the tiny-op time")
    if len(vec):
        d.sources["efficiency.vector"] = f"{d.stamp}: elementwise add rate {d.relative}"


def _memory(d: _Draft, table):
    cp = _rows(table, "copy").sort_values("bytes", kind="stable")
    if not len(cp):
        return
    big = cp.iloc[-1]
    bw = float(big["bytes"] / big["seconds"])
    if d.peaks == "measured":
        d.fields["mem_bandwidth_bytes_per_s"], d.eff["memory"] = bw, 1.0
    else:
        d.eff["memory"] = _cap(bw / d.base.mem_bandwidth_bytes_per_s)
    # CPU only: a GPU copy loop is timed on the device, where the host's tiny-op time is not the per-kernel
    # fixed cost to take out (an L2-resident GPU working set is not modelled yet: no curve, factor 1)
    curve = bandwidth_curve(cp, d.op_s) if d.kind == "cpu" else ()
    d.fields["mem_bandwidth_curve"] = curve
    if curve:
        d.sources["mem_bandwidth_curve"] = (
            f"{d.stamp}: copies of {', '.join(_size(b / 2) for b, _ in curve)}, bytes moved (read + write) -> "
            f"rate after subtracting the {d.op_s * 1e6:.2f} us tiny-op time / the largest copy's rate (at least 1)")
    others = ", ".join(f"{_size(r.bytes / 2)}: {_fmt_rate(r.bytes / r.seconds, 'B/s')}" for r in cp.itertuples())
    d.sources["mem_bandwidth_bytes_per_s"] = (
        f"{d.stamp}: copy of {_size(big['bytes'] / 2)} (read + write counted), {_fmt_rate(bw, 'B/s')}"
        + ("" if d.peaks == "measured" else f", i.e. {d.eff['memory']:.3f} of the datasheet") + f"; by size: {others}")
    d.sources["efficiency.memory"] = f"{d.stamp}: large-copy bandwidth {d.relative}"


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


def _collectives(d: _Draft, table):
    """The intra-node link: all-reduce bus bandwidth at the largest size; every size kept in the source text."""
    comm = table[table["kind"].isin(COLLECTIVE_KINDS)]
    if not len(comm):
        return
    ar = comm[comm["kind"] == "allreduce"] if (comm["kind"] == "allreduce").any() else comm
    big = ar.sort_values("bytes", kind="stable").iloc[-1]
    busbw = float(big["busbw_bytes_per_s"])
    if d.peaks == "measured":
        d.fields["intra_node_bandwidth_bytes_per_s"], d.eff["intra_node"] = busbw, 1.0
    else:
        d.eff["intra_node"] = _cap(busbw / d.base.intra_node_bandwidth_bytes_per_s)
    by_size = "; ".join(f"{k}: " + ", ".join(f"{_size(r.bytes)} {_fmt_rate(r.busbw_bytes_per_s, 'B/s')}"
                                             for r in g.sort_values("bytes").itertuples())
                        for k, g in comm.groupby("kind", sort=False))
    d.sources["intra_node_bandwidth_bytes_per_s"] = (
        f"{d.stamp}: {big['kind']} bus bandwidth (nccl-tests convention) at {_size(big['bytes'])} across "
        f"{int(big['world_size'])} ranks, {_fmt_rate(busbw, 'B/s')}; busbw by size: {by_size}")
    d.sources["efficiency.intra_node"] = f"{d.stamp}: large-message all-reduce busbw {d.relative}"


def _field_names():
    return {f.name for f in dataclasses.fields(SystemSpec)}


def summary_rows(spec: SystemSpec, table: pd.DataFrame) -> list:
    """(what, value) lines for the calibration report (presentation helper, no printing)."""
    out = [("system", f"{spec.name} (calibrated)" if spec.calibrated else spec.name)]
    for d, v in spec.matrix_flops_per_s.items():
        out.append((f"matrix {d}", f"{_fmt_rate(v, 'FLOP/s')} peak x {spec.matrix_efficiency(d):.3f} at large sizes"))
    for d, v in spec.vector_flops_per_s.items():
        out.append((f"vector {d}", f"{_fmt_rate(v, 'FLOP/s')} x {spec.efficiency['vector']:.3f}"))
    out.append(("memory", f"{_fmt_rate(spec.mem_bandwidth_bytes_per_s, 'B/s')} x {spec.efficiency['memory']:.3f}"))
    out.append(("launch overhead", f"{spec.launch_overhead_s * 1e6:.2f} us per kernel"))
    out.append(("intra-node link", f"{_fmt_rate(spec.intra_node_bandwidth_bytes_per_s, 'B/s')} x "
                                   f"{spec.efficiency['intra_node']:.3f}"))
    for f, e in spec.matrix_efficiency_curve:
        out.append(("curve", f"{f:.3g} FLOP/kernel -> {e:.3f}"))
    for b, f in spec.mem_bandwidth_curve:
        out.append(("memory curve", f"{_size(b)} moved per kernel -> {f:.2f} x the memory rate"))
    for name, phases in spec.op_row_s.items():
        out.append((f"per row {name}", ", ".join(f"{ph} {v * 1e9:.0f} ns" for ph, v in phases.items())))
    comm = table[table["kind"].isin(COLLECTIVE_KINDS)] if "kind" in table else table.iloc[0:0]
    for r in comm.itertuples(index=False):
        out.append((f"{r.kind} {_size(r.bytes)}",
                    f"{r.seconds * 1e6:.1f} us, busbw {_fmt_rate(r.busbw_bytes_per_s, 'B/s')}"))
    return out

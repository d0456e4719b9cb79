"""The host-side and per-op terms ``calibrate.fit.build_spec`` fits from the measurement table: launch
and host constants (dispatch, autograd, backward, module call, optimizer steps, collective latency),
per-op fixed costs, per-row costs (an embedding's index, a convolution weight), unaligned GEMMs, per-module
costs. Each term's source names the cases and the arithmetic.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import pandas as pd

from perfcheck.calibrate import case_names as names
from perfcheck.calibrate.fit_cold import (AFTER_FILLER_KINDS, l3_residency, op_cold_excess,
                                         op_cold_far_excess, op_cold_light_excess, op_cold_near_excess,
                                         step_start_excess)
from perfcheck.calibrate.fit_draft import Draft, cap, fp32_rows, rows_of, seconds_of, size_text
from perfcheck.calibrate.layers import tiny_modules
from perfcheck.calibrate.conv_shapes import CONV_CASES
from perfcheck.hardware.host_keys import OPTIM_LINES, op_cold_key, optim_per_tensor_key, optim_step_key
from perfcheck.hardware.systems import LOW_HOST_DTYPES, RETIRED_ROW_OPS, SystemSpec, host_constants, op_efficiency_max
from perfcheck.predict import roofline
from perfcheck.predict import efficiency
from perfcheck.predict.estimate import estimate
from perfcheck.predict.gemm_calls import GEMM_CALL_SUFFIX
from perfcheck.predict.host import EVICTED_SUFFIX
from perfcheck.schema import ROOT


def alignment(spec: SystemSpec, table, d: Draft) -> SystemSpec:
    """``efficiency.matrix_unaligned`` (forward) and ``matrix_unaligned_bwd``: per ``alignment_cases``
    shape, the estimator's time on this spec for the aligned twin's GEMMs (FLOPs at the calibrated
    curve and shape factor) over the measured unaligned time; median over shapes, capped at 1. Relative
    to the model's twin, not the twin's measured time, so the factor does not count the curve's own
    error twice. Absent when not measured (CPU)."""
    rows = table[table["kind"] == names.GEMM_ALIGN]
    if rows.empty:
        return spec
    meas = {r.label: r for r in rows.itertuples()}
    eff, sources = dict(spec.efficiency), dict(spec.sources)
    for phase, key in (("fwd", "matrix_unaligned"), ("bwd", "matrix_unaligned_bwd")):
        ratios = []
        for lab, r in meas.items():
            twin = meas.get(names.aligned_twin(lab))
            if not names.is_unaligned(lab, phase) or twin is None or r.seconds <= 0:
                continue
            gemms = 1 if phase == "fwd" else 2  # dX = dY W, dW = dY^T X: each the forward's FLOPs
            model, _ = roofline.op_time_s(float(twin.flops), 0.0, float(twin.bytes), float(gemms), spec, r.dtype,
                                          launch_s=0.0, min_dim=float(min(twin.m, twin.k, twin.n)))
            ratios.append(model / float(r.seconds))
        if ratios:
            eff[key] = cap(float(np.median(ratios)))
            sources[f"efficiency.{key}"] = (
                f"{d.stamp}: F.linear {phase} with n not a multiple of 16 bytes, the estimator's time for its aligned "
                f"twin (n rounded up to 8) over the measured time, median of {len(ratios)} shapes "
                f"({', '.join(f'{x:.3f}' for x in sorted(ratios))})")
    return dataclasses.replace(spec, efficiency=eff, sources=sources)


def per_op_costs(spec: SystemSpec, table, d: Draft) -> SystemSpec:
    """op_fixed_s (tiny call less one plain tiny op) and op_efficiency (the formulas' roofline time on
    the calibrated spec / the measured time less dispatch and fixed cost, capped by ``efficiency_cap``)."""
    # CLASSFIXED: a CPU op class's tiny call (op_classes.conv_fixed_cases), fitted as an op family's fixed cost
    all_fixed = pd.concat([rows_of(table, names.OPFIXED), rows_of(table, names.CLASSFIXED)])
    eff_rows = rows_of(table, names.OPEFF)
    if not len(all_fixed) and not len(eff_rows):
        return spec
    fp32 = fp32_rows(all_fixed)
    fixed_rows = all_fixed[fp32]
    fixed = {r.label: max(float(r.seconds) - d.op_s, 0.0) for r in fixed_rows.itertuples(index=False)}
    # other dtypes (op_cases.op_fixed_cases' ``dtypes``) ran with gradients: less the dispatch and the autograd node,
    # each priced apart in the estimator; keyed <op>@<dtype> (the estimator falls back to <op> for a dtype
    # calibration did not run)
    node = float(host_constants(spec)["autograd_node_s"])
    low = {efficiency.op_efficiency_key(r.label, r.dtype): max(float(r.seconds) - d.op_s - node, 0.0)
           for r in all_fixed[~fp32].itertuples(index=False)}
    eff, sources = {}, dict(spec.sources)
    cap = efficiency_cap(spec)
    for r in eff_rows.itertuples(index=False):
        # the case's kernels (k; 0 in older tables: one), as the estimator splits an op's bytes over its kernels
        # for the bandwidth curve (a _safe_softmax runs four)
        kernels = max(float(getattr(r, "k", 0) or 0), 1.0)
        roof, _ = roofline.op_time_s(float(r.flops), float(r.n), float(r.bytes), kernels, spec, r.dtype or "fp32",
                                     launch_s=0.0)
        # a class's forward-only case (``<class>:fwd``) less the class's own fixed cost (``<class>``)
        kernel_s = max(float(r.seconds) - d.op_s - fixed.get(r.label, fixed.get(r.label.removesuffix(":fwd"), 0.0)),
                       1e-9)
        eff[efficiency.op_efficiency_key(r.label, r.dtype or "fp32")] = float(min(max(roof / kernel_s, 1e-4), cap))
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


def element_rates(spec: SystemSpec, table, d: Draft) -> SystemSpec:
    """``op_flop_s``: per ``oprate`` case (``op_classes.element_rate_cases``: one elementwise op, operands hot), the
    measured time less one tiny op's dispatch and the op's fixed cost (``op_fixed_s``, host time in the estimator)
    over its formula FLOPs (``n``): the price per FLOP below which that op's kernel does not run
    (``efficiency.op_flop_prices``; the floor of its compute term). A case that read nothing above its fixed costs
    (a busy machine) sets no price."""
    rows = rows_of(table, names.OPRATE)
    if not len(rows):
        return spec
    fixed = dict(spec.op_fixed_s or {})
    prices = {}
    for r in rows.itertuples(index=False):
        kernel_s = float(r.seconds) - d.op_s - float(fixed.get(r.label, 0.0))
        if float(r.n) > 0 and np.isfinite(kernel_s) and kernel_s > 0:
            prices[efficiency.op_flop_key(r.label)] = kernel_s / float(r.n)
    if not prices:
        return spec
    sources = {**dict(spec.sources), "op_flop_s": (
        f"{d.stamp}: per elementwise op, one call on {int(rows['m'].iloc[0])} fp32 elements with its operands hot, "
        f"less one tiny op's dispatch ({d.op_s * 1e6:.2f} us) and the op's fixed cost, over the formulas' FLOPs "
        f"(the floor of the op's compute term)")}
    return dataclasses.replace(spec, op_flop_s=prices, sources=sources)


def efficiency_cap(spec: SystemSpec) -> float:
    """Largest measured / roofline rate an ``opeff`` case may set (``systems.op_efficiency_max``): 1 on a GPU,
    whose roofline is its datasheet ceiling; above 1 on a CPU, whose vector rate is calibration's elementwise add
    (``cases.vector_cases``), which a kernel doing several FLOPs per element in registers outruns. Capped at 1, a
    LayerNorm or GELU on the project's Xeon was priced 2-5x too slow."""
    return op_efficiency_max(spec.kind)


def row_costs(spec: SystemSpec, table, d: Draft) -> SystemSpec:
    """op_row_s: per op and phase of the op-class row cases (``index_cases.embedding_row_cases``,
    ``conv_weight_cases``; label "<op> fwd|bwd", m = rows, k = row length), the slope of the measured time over
    the row count less the slope of the estimator's roofline time for the same calls on ``spec`` (its elements'
    share: the model adds that itself), floored at 0 (the median over row lengths where a table has several).
    Slopes leave out every fixed cost (dispatch, op_fixed_s), which the model prices apart. Rows of the retired
    row-wise ops (softmax, log_softmax, layer norm, nll_loss: ``systems.RETIRED_ROW_OPS``) in an older table
    are skipped."""
    rows = rows_of(table, names.OPROWS)
    if not len(rows):
        return spec

    table_out, shown = {}, []
    for label, group in rows.groupby("label", sort=False):
        name, phase = str(label).rsplit(" ", 1)
        if name in RETIRED_ROW_OPS or name.endswith(GEMM_CALL_SUFFIX):  # the latter: gemm_call_costs
            continue
        eff = efficiency.op_efficiency(spec, name, "fp32")  # the row cases run in fp32
        slopes = []
        for _, g in group.groupby("k", sort=True):
            g = g.sort_values("m")
            if len(g) < 2 or g["m"].iloc[-1] <= g["m"].iloc[0]:
                continue
            roof = [roofline.op_time_s(0.0, float(r["flops"]), float(r["bytes"]), float(max(r["n"], 1)), spec,
                                       r["dtype"] or "fp32", launch_s=0.0)[0] / eff for r in (g.iloc[0], g.iloc[-1])]
            span = float(g["m"].iloc[-1] - g["m"].iloc[0])
            slopes.append((float(g["seconds"].iloc[-1] - g["seconds"].iloc[0]) - (roof[1] - roof[0])) / span)
        if not slopes:
            continue
        price = float(max(np.median(slopes), 0.0))
        table_out.setdefault(name, {})[phase] = price
        shown.append(f"{name} {phase} {price * 1e9:.1f} ns")
    if not table_out:
        return spec
    counts = sorted(set(rows["m"].astype(int)))
    sources = dict(spec.sources)
    sources["op_row_s"] = (f"{d.stamp}: per op and phase, the slope of its time over {counts[0]} -> {counts[-1]} rows "
                           f"less the slope of the estimator's roofline time for the same calls (fp32), floored at 0: "
                           + "; ".join(shown))
    return dataclasses.replace(spec, op_row_s=table_out, sources=sources)


def gemm_call_costs(spec: SystemSpec, table, d: Draft) -> SystemSpec:
    """op_row_s["<class>:gemm_call"]["bwd"] (the price of one sgemm call of a GEMM-based weight gradient,
    predict.gemm_calls) and the class's backward efficiency op_efficiency["<class>:bwd"], solved together from two
    measurements (op_classes.depthwise_call_cases and the class's ``opeff`` backward case, conv_shapes.CONV_CASES), each less one tiny op's dispatch and the class's fixed cost (op_fixed_s["<class>:bwd"]):

        class case   T0           = R0 / e + M0 * p
        call slope   T2 - T1      = (R2 - R1) / e + (M2 - M1) * p

    R = the estimator's roofline time of the call (its matrix FLOPs, bytes, kernels) at efficiency 1, M = its sgemm
    calls (batch x groups), e = the class's backward efficiency, p = the price per call. Solved apart, the efficiency
    fitted at the class case would price that case's calls as MACs, and the slope would count the MACs' share twice.
    A price below 0 (noise), or no solution, leaves p 0 and e read off the class case alone (as ``per_op_costs``)."""
    rows = rows_of(table, names.OPROWS)
    if not len(rows):
        return spec
    rows = rows[rows["label"].astype(str).str.endswith(f"{GEMM_CALL_SUFFIX} bwd")]
    eff_rows = rows_of(table, names.OPEFF)
    fixed_rows = rows_of(table, names.CLASSFIXED)
    table_out, eff, shown = dict(spec.op_row_s), dict(spec.op_efficiency), []
    for label, group in rows.groupby("label", sort=False):
        key = str(label).rsplit(" ", 1)[0]
        cls = key.removesuffix(GEMM_CALL_SUFFIX)
        case = eff_rows[eff_rows["label"] == f"{cls}:bwd"]
        g = group.sort_values("m")
        if cls not in CONV_CASES or not len(case) or len(g) < 2 or g["m"].iloc[-1] <= g["m"].iloc[0]:
            continue
        fixed = fixed_rows[fixed_rows["label"] == f"{cls}:bwd"]
        base = d.op_s + (max(float(fixed["seconds"].iloc[0]) - d.op_s, 0.0) if len(fixed) else 0.0)

        def roof(r) -> float:
            return roofline.op_time_s(float(r["flops"]), 0.0, float(r["bytes"]), float(max(r["n"], 1)), spec,
                                      "fp32", launch_s=0.0)[0]
        c0, lo, hi = case.iloc[0], g.iloc[0], g.iloc[-1]
        xs, groups = CONV_CASES[cls][0], CONV_CASES[cls][2]
        r0 = roofline.op_time_s(float(c0["flops"]), float(c0["n"]), float(c0["bytes"]),
                                max(float(c0["k"] or 0), 1.0), spec, "fp32", launch_s=0.0)[0]
        t0, m0 = max(float(c0["seconds"]) - base, 1e-9), float(xs[0] * groups)
        dt, dr, dm = float(hi["seconds"] - lo["seconds"]), roof(hi) - roof(lo), float(hi["m"] - lo["m"])
        try:
            inv_e, price = np.linalg.solve(np.array([[r0, m0], [dr, dm]]), np.array([t0, dt]))
        except np.linalg.LinAlgError:
            inv_e, price = 0.0, -1.0
        if price < 0 or inv_e <= 0:
            price, inv_e = 0.0, t0 / r0
        table_out[key] = {"bwd": float(price)}
        eff[efficiency.op_efficiency_key(f"{cls}:bwd", "fp32")] = float(min(max(1.0 / inv_e, 1e-4),
                                                                            efficiency_cap(spec)))
        shown.append(f"{cls}: {price * 1e9:.0f} ns per call, backward efficiency {1.0 / inv_e:.4f}")
    if not shown:
        return spec
    sources = dict(spec.sources)
    sources["op_row_s"] = "; ".join(filter(None, (sources.get("op_row_s", ""), (
        f"{d.stamp}: <class>:gemm_call, the price of one sgemm call of a GEMM-based weight gradient, solved with "
        f"the class's backward efficiency from its opeff case and the slope over the calls: " + "; ".join(shown)))))
    return dataclasses.replace(spec, op_row_s=table_out, op_efficiency=eff, sources=sources)


def module_costs(spec: SystemSpec, table, d: Draft) -> SystemSpec:
    """module_fixed_s: per standard nn module class, its measured call (``layers.tiny_modules``) less the
    estimator's forward for it on ``spec`` (whose host constants and per-op costs are already fitted),
    floored at 0: the Python and autograd work of that layer the per-op host model does not see."""
    rows = rows_of(table, names.MODFIXED)
    if not len(rows):
        return spec

    mods = tiny_modules("cpu")  # the estimator traces on fake tensors: the device does not matter
    # the cases repeat one module in a tight loop: estimate them as such, without the step's per-op cold cost
    # (op_cold_s, and the classes' evicted-call excess: host._class_cold) or its start (step_start_s)
    tight = dataclasses.replace(spec, host={**dict(spec.host), "op_cold_s": 0.0, "step_start_s": 0.0},
                                op_fixed_s={k: v for k, v in dict(spec.op_fixed_s or {}).items()
                                            if not str(k).endswith(EVICTED_SUFFIX)})
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


def launch(d: Draft, table, threads):
    d.op_s = seconds_of(table, names.LAUNCH, names.LAUNCH_OP) or 0.0
    launch = seconds_of(table, names.LAUNCH, names.LAUNCH_AUTOGRAD) or (d.op_s or None)
    if launch:
        where = f" with {threads} thread{'s' if threads != 1 else ''}" if threads else ""
        d.fields["launch_overhead_s"] = launch
        d.sources["launch_overhead_s"] = (f"{d.stamp}: per-kernel time of a chain of tiny multiplies run forward and "
                                          f"backward under autograd{where} (one plain tiny op: {d.op_s * 1e6:.2f} us)")


def host_terms(d: Draft, table, threads):
    """The host block (perfcheck.predict.host): each constant from its case, slopes and intercepts
    from the cases of two sizes; constants without a case keep the base's (or the defaults)."""
    host = rows_of(table, names.HOST)
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
    if names.HOST_VIEW in sec:
        put("view_dispatch_s", sec[names.HOST_VIEW], "Tensor.t() of a 1x1 tensor")
    _host_autograd(host, sec, op, put)
    if names.HOST_MODULE_CALL in sec:
        put("module_call_s", sec[names.HOST_MODULE_CALL], "calling an nn.Module whose forward returns its input")
    _host_cold(table, put, d.kind)
    _host_far(d, table, put)
    if names.HOST_FRESH_FILL in sec and names.HOST_REUSED_FILL in sec:
        put("page_fault_s", sec[names.HOST_FRESH_FILL] - sec[names.HOST_REUSED_FILL],
            "torch.zeros of a fresh 32 MiB buffer (a new mapping: one minor fault per page) less zero_() of a kept "
            "one, per 4 KiB page")
    if names.HOST_SQRT_ZERO in sec and names.HOST_SQRT_NORMAL in sec:
        put("sqrt_zero_s", sec[names.HOST_SQRT_ZERO] - sec[names.HOST_SQRT_NORMAL],
            "torch.sqrt of a buffer of zeros less the same of ones, per element (perfcheck.predict.zero_rows)")
    _host_optimizers(host, put)
    if names.HOST_DEVICE_KERNEL in sec:
        put("device_kernel_s", sec[names.HOST_DEVICE_KERNEL], "GPU time per tiny add queued behind torch.cuda._sleep "
                                                     "(device alone, CUDA events)")
    elif d.kind == "cpu":
        put("device_kernel_s", 0.0, "0 on a CPU by definition: the op runs on the dispatching thread, "
                                    "so its fixed cost is op_dispatch_s")
    collective_latency(out, src, table, d.stamp)
    d.fields["host"] = out
    d.sources.update(src)


def _host_autograd(host, sec: dict, op, put):
    """autograd_node_s (a chain under autograd less the same chain without), backward_node_s and
    backward_call_s (the slope and intercept of forward+backward over two chain lengths)."""
    chain = next((lab for lab in sec if names.is_label(lab, names.chain_label, True)), None)
    plain = sec.get(names.chain_label(False, names.count_of(chain))) if chain else None
    if chain and plain:
        # the same ``y * b`` chain without autograd: subtracting torch.add's dispatch instead (a Python
        # function call, ~1-2 us dearer than the ``*`` operator's slot) read 1.0 us where a node costs 2.9
        put("autograd_node_s", sec[chain] - plain, f"per op of a chain of 1-element multiplies under autograd "
                                                   f"({sec[chain] * 1e6:.2f} us), minus the same chain without "
                                                   f"autograd ({plain * 1e6:.2f} us)")
    elif chain and op:
        put("autograd_node_s", sec[chain] - op, f"per op of a chain of 1-element multiplies under autograd "
                                                f"({sec[chain] * 1e6:.2f} us), minus the plain op")
    fb = host[[names.is_label(lab, names.forward_backward_label) for lab in host["label"]]].sort_values("m")
    if len(fb) >= 2 and chain and op:
        per_fwd = sec[chain]
        n = fb["m"].to_numpy(float)
        bwd = fb["seconds"].to_numpy(float) - n * per_fwd
        slope = (bwd[-1] - bwd[0]) / (n[-1] - n[0])
        put("backward_node_s", slope - op, f"backward of 1-element multiply chains of {int(n[0])} and {int(n[-1])} "
                                           f"(forward part subtracted): slope {slope * 1e6:.2f} us per node, minus "
                                           f"one op's dispatch (its grad kernel)")
        put("backward_call_s", bwd[0] - n[0] * slope, "intercept of the same line: loss.backward()'s fixed cost")


def _host_cold(table, put, kind: str):
    """op_cold_s per dtype: the tiny ops called one after another (after the cold filler on a spec of a kind in
    ``AFTER_FILLER_KINDS``) less each in a tight loop."""
    for dt, key in (("fp32", op_cold_key()), *((x, op_cold_key(x)) for x in LOW_HOST_DTYPES)):
        use_after = kind in AFTER_FILLER_KINDS
        cold = op_cold_excess(table, dt, after_filler=use_after)
        if cold is not None:
            after = use_after and rows_of(table, names.OPCOLD)["label"].astype(str).str.startswith(names.AFTER_FILLER).any()
            put(key, cold[0], f"the {cold[1]} tiny ops of the op_fixed cases called one after another"
                              f"{', each round timed alone after a cold filler (a forward and backward of other layers)' if after else ''}, "
                              f"{cold[2] * 1e6:.2f} us per op, less the same ops each in a tight loop, "
                              f"{cold[3] * 1e6:.2f} us per op (mean)"
                              + ("" if dt == "fp32" else f"; {dt}, on tensors needing a gradient"))
    if kind in AFTER_FILLER_KINDS:
        return
    # a switch inside a cycle of near and of light families: (excess, ops, cycle s, tight s) each, or None
    for key, excess, ops, tight, tail in (
            ("op_cold_near_s", op_cold_near_excess(table),
             lambda n: f"the {n} light tiny ops of the op_fixed cases (less {', '.join(names.NEAR_LEFT_OUT)})",
             "the same ops each in a tight loop", " (mean); perfcheck.predict.family_reuse"),
            ("op_cold_light_s", op_cold_light_excess(table),
             lambda n: f"{n} light op families (pointwise, a copy, a small GEMM)",
             f"each {names.LIGHT_TIGHT_RUN} times in a row", "; perfcheck.predict.family_reuse.light_reuse")):
        if excess is not None:
            put(key, excess[0], f"{ops(excess[1])} called one after another, {excess[2] * 1e6:.2f} us per op, less "
                                f"{tight}, {excess[3] * 1e6:.2f} us per op{tail}")


def _host_far(d: Draft, table, put):
    """op_cold_far_s and the L3 it evicted (``calibration.l3_bytes``) from the far round-robin, and l3_residency_s
    from the residency cases (``fit_cold``); nothing where the cases did not run."""
    far = op_cold_far_excess(table)
    if far is not None:
        d.fields["calibration"] = {**dict(d.base.calibration or {}), **dict(d.fields.get("calibration", {}) or {}),
                                   "l3_bytes": far[4]}
        put("op_cold_far_s", far[0], f"the {far[1]} tiny ops of the op_fixed cases called one after another, each round "
                                     f"after writing {far[4] // 2 ** 20} MiB x 4 (the L3) and re-warming the shared "
                                     f"path, {far[2] * 1e6:.2f} us per op, less the same ops each in a tight loop, "
                                     f"{far[3] * 1e6:.2f} us per op (mean); paid by an op whose family last ran more "
                                     f"than the L3 of data ago (calibration.l3_bytes; perfcheck.predict.family_reuse"
                                     f".far_reuse)")
    start = step_start_excess(table)
    if start is not None:
        put("step_start_s", start[0], f"a tiny nn.Linear call after a step of other code (a small MLP's forward, "
                                      f"backward and AdamW step) and the L3 eviction, {start[1] * 1e6:.1f} us, less its "
                                      f"bare addmm after the eviction alone, {start[2] * 1e6:.1f} us; paid once per "
                                      f"step by the forward's first op (perfcheck.predict.host)")
    residency = l3_residency(table)
    if residency is not None:
        tau, hot, evicted, points = residency  # the loss curve (cold_curves.loss_curve): each sleep's share lost
        d.fields["calibration"] = {**dict(d.base.calibration or {}), **dict(d.fields.get("calibration", {}) or {}),
                                   "l3_lost": tuple((w, min(max((r - hot) / (evicted - hot), 0.0), 1.0))
                                                    for w, r in points)}
        put("l3_residency_s", residency[0], f"the sleep after which a re-read of a quarter of the L3 lost half of what "
                                            f"an eviction costs (hot {residency[1] * 1e6:.0f} us, evicted "
                                            f"{residency[2] * 1e6:.0f} us; after "
                                            + ", ".join(f"{w * 1e3:g} ms {r * 1e6:.0f} us" for w, r in residency[3])
                                            + "): data left in an L3 shared with other tenants decays with time; "
                                            "perfcheck.predict.host._far_shares")


def _host_optimizers(host, put):
    """Per optimizer implementation: the per-tensor slope and the step's intercept over two tensor counts."""
    for label in OPTIM_LINES:
        rows = host[[names.is_label(lab, names.optim_label, label) for lab in host["label"]]].sort_values("m")
        if len(rows) < 2:
            continue
        n, t = rows["m"].to_numpy(float), rows["seconds"].to_numpy(float)
        per = (t[-1] - t[0]) / (n[-1] - n[0])
        put(optim_per_tensor_key(label), per, f"torch.optim.{'SGD' if 'sgd' in label else 'Adam'}"
            f"(foreach={'foreach' in label}).step() + zero_grad(set_to_none=True) on {int(n[0])} and "
            f"{int(n[-1])} 1-element tensors: slope")
        # each implementation's own intercept: SGD foreach's was 139 us against the for-loop's 63 us on the H100
        # VM of 2026-11-26 (grouping by device and dtype, one launch per _foreach_ op), Adam's for-loop 211 us
        put(optim_step_key(label), t[0] - n[0] * per,
            f"intercept of the same line: step() + zero_grad()'s fixed cost ({label})")


def collective_latency(out, src, table, stamp):
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
    src["host.collective_latency_s"] = (f"{stamp}: all-reduce of {size_text(small['bytes'])} "
                                        f"({small['seconds'] * 1e6:.1f} us) less its bandwidth term at the "
                                        f"{size_text(big['bytes'])} rate, across {int(small['world_size'])} ranks")

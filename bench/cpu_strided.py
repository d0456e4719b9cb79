"""CPU kernels off the vectorised loop: the calibration pairs, and probes at other sizes, measured and predicted.

Why: ``perfcheck.predict.cpu_vector_loop`` says which CPU kernels run torch's scalar ``basic_loop``; the spec's
``strided_elements_per_s`` (calibrate.cpu_strided_cases / cpu_strided_fit) prices them. This script (1) times the
calibration's ``cpustrided`` pairs as calibration does (run_cases, process clock, read against the references) and
writes them as rows (``--rows``) to add to a saved calibration table; (2) fits the spec from that table plus these
rows; (3) times probes at sizes and patterns the calibration does not use (ConvNeXt-like NHWC permutes, a channel
shuffle, head-split copies, an erf-GELU and a batch norm on strided inputs), each beside its contiguous twin, and
prints the predicate, the measured extra time of the strided call over its twin and the estimator's extra time with
the fitted rate (``perfcheck.estimate`` of the call, forward).

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python bench/cpu_strided.py \\
        --calibration CAL.csv --rows /tmp/rows.csv
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import pandas as pd
import torch
import torch.nn.functional as F

import perfcheck
from perfcheck.calibrate.cases import Timer, run_cases
from perfcheck.calibrate import cpu_strided_fit
from perfcheck.calibrate.cpu_strided_cases import cpu_strided_cases
from perfcheck.calibrate.fit import build_spec
from perfcheck.calibrate.layers import CallModule
from perfcheck.calibrate.phase import compute_reference_fn, reference_fn
from perfcheck.schema import ROOT



def _per_call(fn, budget=0.04, repeats=7) -> float:
    """Median over ``repeats`` of process seconds per call in a loop of ~``budget`` s."""
    fn()
    out = []
    for _ in range(repeats):
        k, t0 = 0, time.process_time()
        while time.process_time() - t0 < budget:
            fn()
            k += 1
        out.append((time.process_time() - t0) / k)
    return statistics.median(out)


def probes():
    """(label, strided fn, twin fn, args of each): other sizes and patterns than the calibration's."""
    x = torch.randn(8, 96, 56, 56)  # a ConvNeXt stage-1 activation, NCHW
    xp = x.permute(0, 2, 3, 1)
    xc = xp.contiguous()
    y = torch.randn(8, 768, 7, 7)
    yp = y.permute(0, 2, 3, 1)
    s = torch.randn(8, 232, 14, 14)  # a channel shuffle, 2 groups
    sv = s.view(8, 2, 116, 14, 14).transpose(1, 2)
    h = torch.randn(8, 128, 12, 64)  # (batch, seq, heads, dim) -> (batch, heads, seq, dim)
    hp = h.transpose(1, 2)
    g = torch.randn(8, 96, 56, 56)
    w = torch.ones(96)
    z = torch.randn(16, 64, 32, 32)
    return [
        ("NHWC permute copy 8x96x56x56", lambda a: a.contiguous(), lambda a: a.clone(), (xp,), (x,)),
        ("NHWC permute copy 8x768x7x7", lambda a: a.contiguous(), lambda a: a.clone(), (yp,), (y,)),
        ("NCHW back: add(x, NHWC.permute) 8x96x56x56", lambda a, b: a + b.permute(0, 3, 1, 2),
         lambda a, b: a + b, (x, xc), (x, x)),
        ("layer norm of NHWC view 8x96x56x56", lambda a: F.layer_norm(a, (96,), w, w),
         lambda a: F.layer_norm(a, (96,), w, w), (xp,), (xc,)),
        ("channel shuffle copy 8x232x14x14", lambda a: a.contiguous(), lambda a: a.clone(), (sv,), (sv.contiguous(),)),
        ("head split copy 8x128x12x64", lambda a: a.contiguous(), lambda a: a.clone(), (hp,), (h,)),
        ("erf-GELU of a step-2 view 16x64x32x32", lambda a: F.gelu(a[..., ::2]), lambda a: F.gelu(a),
         (z,), (z[..., ::2].contiguous(),)),
        ("relu of NHWC view (dense) 8x96x56x56", lambda a: torch.relu(a), lambda a: torch.relu(a), (xp,), (x,)),
        ("batch norm of H<->W transposed 8x96x56x56", lambda a: F.batch_norm(a, None, None, training=True),
         lambda a: F.batch_norm(a, None, None, training=True), (g.transpose(2, 3),), (g,)),
    ]


def _pred_fwd(fn, args, spec) -> float:
    est = perfcheck.estimate(CallModule(fn), args, system=spec)
    return float(est[est["module"] == ROOT].iloc[0]["pred_fwd_s"])


def _off(fn, args) -> bool:
    """Whether any traced op of ``fn(*args)`` is tagged off a CPU's vectorised loop."""
    from perfcheck.predict.aten_costs import cost_of
    from perfcheck.predict.trace import trace_model

    tr = trace_model(CallModule(fn), args)
    return any(cost_of(op.call).cost.fwd.cpu_strided_elems > 0 for op in tr.ops)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibration", required=True, help="a saved calibration table (heldout.py --save-calibration)")
    ap.add_argument("--rows", default=None, help="write the cpustrided rows measured here (CSV)")
    ap.add_argument("--with-rows", default=None, help="use these cpustrided rows instead of measuring them")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    dev = torch.device("cpu")
    base = pd.read_csv(args.calibration, keep_default_na=True)
    base["dtype"] = base["dtype"].fillna("")
    if args.with_rows:
        rows = pd.read_csv(args.with_rows, keep_default_na=True)
    else:
        rows = run_cases(cpu_strided_cases(dev), Timer(dev, "process"), repeats=3, target_s=0.01,
                         reference=reference_fn(dev), compute_reference=compute_reference_fn(dev))
    rows["dtype"] = rows["dtype"].fillna("")
    if args.rows:
        rows.to_csv(args.rows, index=False)
    table = pd.concat([base[base["kind"] != "cpustrided"], rows], ignore_index=True)
    fitted = build_spec("cpu", table, peaks="measured", stamp="bench/cpu_strided.py", kind="cpu", threads=1)
    # the term is not in the model (cpu_strided_fit.IN_MODEL): priced here with the rate the pairs give
    spec = cpu_strided_fit.apply(fitted, table, "bench/cpu_strided.py", in_model=True)
    before = dataclasses.replace(spec, strided_elements_per_s=0.0)
    print(f"calibration pairs (elements {int(rows['m'].iloc[0])}):")
    for r in rows.itertuples(index=False):
        print(f"  {r.label:34s} {r.seconds * 1e6:8.1f} us  {r.seconds / r.m * 1e9:5.2f} ns/element")
    print(f"fitted strided_elements_per_s = {spec.strided_elements_per_s / 1e9:.3f} G/s "
          f"({spec.sources.get('strided_elements_per_s', '')})")
    print("\nprobes (1 thread, process time; extra = strided - twin):")
    print(f"  {'case':46s} {'off':>4s} {'meas twin':>10s} {'meas extra':>11s} {'pred extra':>11s} "
          f"{'pred extra, no term':>20s}")
    for label, fs, ft, a_s, a_t in probes():
        ms, mt = _per_call(lambda: fs(*a_s)), _per_call(lambda: ft(*a_t))
        ps, pt = _pred_fwd(fs, a_s, spec), _pred_fwd(ft, a_t, spec)
        bs, bt = _pred_fwd(fs, a_s, before), _pred_fwd(ft, a_t, before)
        print(f"  {label:46s} {str(_off(fs, a_s)):>5s} {mt * 1e6:8.0f} us {(ms - mt) * 1e6:8.0f} us "
              f"{(ps - pt) * 1e6:8.0f} us {(bs - bt) * 1e6:17.0f} us")


if __name__ == "__main__":
    main()

"""How steady is the quick calibration? N quick calibrations, each in a fresh process, some beside a busy loop.

Each run is the automatic quick calibration's call (``perfcheck.calibrate.run.calibrate``: quick mode, no
collectives, one thread, the process clock: what ``perfcheck sweep`` measures before its ranks start), in
its own Python process (as the sweep's parent calibrates once, right after its imports). Every case's raw
per-repeat times are kept beside the fitted spec, so other kept statistics can be compared later on the
SAME timings (``--refit``: paired, no new measurement). Per run: every fitted scalar constant, the
calibration's own time, and LeNet's forward / step at batch 8 predicted on the spec (the sweep's micro
batch; no ZeRO terms: they come from the sweep's own once-per-machine cases).

    flock /tmp/perfcheck-bench.lock python bench/calibration_steadiness.py --runs 6 --busy 1 3 5 --out DIR
    python bench/calibration_steadiness.py --table DIR          # the spread table of a finished DIR
    python bench/calibration_steadiness.py --sweep SWEEP_OUT    # forward/step measured/predicted per stage
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _flatten(spec) -> dict:
    """Every scalar figure of ``spec`` a prediction uses, name -> value."""
    out = {"launch_overhead_s": spec.launch_overhead_s, "mem_bandwidth": spec.mem_bandwidth_bytes_per_s}
    out.update({f"matrix.{k}": v for k, v in spec.matrix_flops_per_s.items()})
    out.update({f"vector.{k}": v for k, v in spec.vector_flops_per_s.items()})
    out.update({f"host.{k}": v for k, v in spec.host.items() if isinstance(v, (int, float))})
    out.update({f"op_fixed_s.{k}": v for k, v in spec.op_fixed_s.items()})
    out.update({f"module_fixed_s.{k}": v for k, v in spec.module_fixed_s.items()})
    out.update({f"op_efficiency.{k}": v for k, v in spec.op_efficiency.items()})
    out.update({f"efficiency.{k}": v for k, v in spec.efficiency.items() if isinstance(v, (int, float))})
    for op, phases in (spec.op_row_s or {}).items():
        out.update({f"op_row_s.{op}.{p}": v for p, v in phases.items()})
    for i, (f, e) in enumerate(spec.mem_bandwidth_curve or ()):
        out[f"mem_curve.{f:.3g}"] = e
    for i, (f, e) in enumerate(spec.matrix_efficiency_curve or ()):
        out[f"matrix_curve.{f:.3g}"] = e
    return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(float(v))}


def lenet(spec) -> dict:
    import torch

    from perfcheck.examples.models import Net
    from perfcheck.predict.estimate import estimate
    from perfcheck.schema import ROOT

    pred = estimate(Net(), (torch.randn(8, 3, 32, 32),), system=spec, optimizer="sgd")
    root = pred[pred["module"] == ROOT].iloc[0]
    return {"lenet_fwd_s": float(root["pred_fwd_s"]),
            "lenet_step_s": float(root["pred_fwd_s"] + root["pred_bwd_s"] + root["pred_optim_s"])}


def one(out: Path):
    """One calibration in this process; writes out (JSON: constants, LeNet, raw samples, time)."""
    import torch

    from perfcheck.calibrate import run as calrun
    from perfcheck.hardware.labels import AUTO_NAME

    samples = []
    original = calrun.run_cases

    def recording(cases, timer, **kw):
        table = original(cases, timer, **kw)
        raw, refs, crefs = (table.attrs.get(k) for k in ("samples", "references", "compute_references"))
        for i, c in enumerate(cases):
            samples.append({"kind": c.kind, "label": c.label, "dtype": c.dtype,
                            "samples": list(raw[i]) if raw else None, "references": list(refs[i]) if refs else None,
                            "compute_references": list(crefs[i]) if crefs else None})
        return table

    calrun.run_cases = recording
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        res = calrun.calibrate("cpu", mode="quick", device="cpu", comm=False, threads=1, name=AUTO_NAME,
                               clock="process")
    took = time.perf_counter() - t0
    doc = {"took_s": took, "cpu_s": time.process_time(), "calibration": dict(res.spec.calibration or {}),
           "constants": _flatten(res.spec), **lenet(res.spec), "samples": samples, "notes": list(res.notes)}
    res.measurements.to_csv(out.with_suffix(".csv"), index=False)
    out.write_text(json.dumps(doc))


def drive(n: int, busy: set, out: Path):
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PERFCHECK_AUTO_CALIBRATE": "0"}
    for i in range(n):
        hog = subprocess.Popen(["sh", "-c", "while :; do :; done"]) if i in busy else None
        try:
            t0 = time.time()
            subprocess.run([sys.executable, __file__, "--one", str(out / f"run{i}.json")], env=env, check=True)
            doc = json.loads((out / f"run{i}.json").read_text())
            doc["busy"] = i in busy
            (out / f"run{i}.json").write_text(json.dumps(doc))
            print(f"run {i}{' (busy loop)' if i in busy else ''}: {time.time() - t0:.1f} s, LeNet fwd "
                  f"{doc['lenet_fwd_s'] * 1e3:.3f} ms, step {doc['lenet_step_s'] * 1e3:.3f} ms, op_cold_s "
                  f"{doc['constants'].get('host.op_cold_s', float('nan')) * 1e6:.2f} us", flush=True)
        finally:
            if hog:
                hog.terminate()
                hog.wait()


def table(out: Path, top: int = 25):
    docs = [json.loads(p.read_text()) for p in sorted(out.glob("run*.json"))]
    keys = sorted(set.intersection(*(set(d["constants"]) for d in docs)))
    rows = []
    for k in keys:
        v = [d["constants"][k] for d in docs]
        lo, hi = min(v), max(v)
        rows.append((hi / lo if lo > 0 else (math.inf if hi > 0 else 1.0), k, v))
    print(f"{len(docs)} runs ({sum(d.get('busy', False) for d in docs)} beside a busy loop); calibration took "
          + ", ".join(f"{d['took_s']:.1f}" for d in docs) + " s")
    for name in ("lenet_fwd_s", "lenet_step_s"):
        v = [d[name] for d in docs]
        print(f"{name}: " + " ".join(f"{x * 1e3:.3f}" for x in v) + f" ms  max/min {max(v) / min(v):.2f}")
    rows.sort(reverse=True)
    for ratio, k, v in rows[:top]:
        print(f"{ratio:8.2f}  {k:45s} " + " ".join(f"{x:.3g}" for x in v))


def sweep(out: Path):
    """Forward and step measured/predicted per stage (median of the ranks) of a sweep's comparison.csv."""
    import pandas as pd

    t = pd.read_csv(out / "comparison.csv")
    print("| stage | fwd pred ms | fwd meas ms | fwd meas/pred | fwd CPU meas/pred | step pred ms | step meas ms | "
          "step meas/pred | step CPU meas/pred |\n|---|---|---|---|---|---|---|---|---|")
    for stage, g in t.groupby("stage", sort=True):
        m = g[["pred_fwd_s", "meas_fwd_s", "meas_fwd_cpu_s", "pred_step_s", "meas_step_s", "meas_step_cpu_s"]].median()
        print(f"| {stage} | {m.pred_fwd_s * 1e3:.2f} | {m.meas_fwd_s * 1e3:.2f} | {m.meas_fwd_s / m.pred_fwd_s:.2f} | "
              f"{m.meas_fwd_cpu_s / m.pred_fwd_s:.2f} | {m.pred_step_s * 1e3:.2f} | {m.meas_step_s * 1e3:.2f} | "
              f"{m.meas_step_s / m.pred_step_s:.2f} | {m.meas_step_cpu_s / m.pred_step_s:.2f} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--one", type=Path)
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--busy", type=int, nargs="*", default=[], help="runs (0-based) taken beside a busy loop")
    p.add_argument("--out", type=Path)
    p.add_argument("--table", type=Path)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--sweep", type=Path, help="a finished `perfcheck sweep --out` folder: its forward/step table")
    a = p.parse_args()
    if a.sweep:
        sweep(a.sweep)
    elif a.one:
        one(a.one)
    elif a.table:
        table(a.table, a.top)
    else:
        drive(a.runs, set(a.busy), a.out)
        table(a.out, a.top)


if __name__ == "__main__":
    main()

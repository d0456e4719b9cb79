"""Which reference statistic should a calibration be anchored at? Paired: every statistic on the SAME readings.

The quick calibration reads every CPU repeat against a tiny add and a 128^3 mm timed beside it and puts the whole
table back in seconds at one reference time per reference (``perfcheck.calibrate.repeats.anchor_s``). Which
statistic of the readings (``repeats.ANCHOR_STATISTICS``) is only a choice of level, so one calibration's readings
give every statistic's spec: ``--calibrate`` runs one quick calibration (the automatic one's call: quick mode,
one thread, process clock) and fits its table once per statistic, through the calibration's own fit
(``run._spec``), writing per statistic the spec (``<stat>.json``), the table (``<stat>.csv``, for
``bench/heldout.py --calibration`` and ``bench/repredict.py``) and LeNet's forward / step at batch 8; and once more
as main fits it without the references ("raw": each case the fastest half of its raw repeats, ``_raw``).

    flock /tmp/perfcheck-bench.lock python bench/calibration_anchor.py --calibrate DIR/run0 [--cache]
    python bench/calibration_anchor.py --spread DIR        # per statistic: LeNet over DIR/run*/, max/min
    python bench/calibration_anchor.py --sweep-specs CAL SWEEP_OUT
        # per statistic, CAL's spec plus the sweep terms the sweep added to the cache (CAL/<stat>.sweep.json),
        # then `perfcheck compare SWEEP_OUT --system CAL/<stat>.sweep.json --out CAL/sweep.<stat>`

``--cache`` also keeps the calibration of the default statistic in the per-user cache ($PERFCHECK_CACHE_DIR), as
the automatic calibration would, so a sweep started next uses these readings.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def lenet(spec) -> dict:
    import torch

    from perfcheck.examples.models import Net
    from perfcheck.predict.estimate import estimate
    from perfcheck.schema import ROOT

    pred = estimate(Net(), (torch.randn(8, 3, 32, 32),), system=spec, optimizer="sgd")
    root = pred[pred["module"] == ROOT].iloc[0]
    return {"lenet_fwd_s": float(root["pred_fwd_s"]),
            "lenet_step_s": float(root["pred_fwd_s"] + root["pred_bwd_s"] + root["pred_optim_s"])}


#: Main's statistic before the references, for the same readings: the fastest half of each case's raw repeats.
RAW = "raw"


def _raw(frame):
    """``frame`` as the calibration without references kept it: each case the fastest half of its raw repeats."""
    from perfcheck.calibrate.repeats import fastest_half

    samples = frame.attrs.get("samples")
    out = frame.copy()
    if samples:
        out["seconds"] = [fastest_half(x) for x in samples]
        out["seconds_min"] = [min(x) for x in samples]
        out["seconds_max"] = [max(x) for x in samples]
        sec = out["seconds"].astype(float).where(out["seconds"] > 0)
        out["flops_per_s"] = (out["flops"].astype(float) / sec).where(out["flops"] > 0)
        out["bytes_per_s"] = (out["bytes"].astype(float) / sec).where(out["bytes"] > 0)
    out.attrs = {}
    return out


def calibrate(out: Path, cache: bool):
    """One quick calibration; its table and spec at every statistic (see the module docstring)."""
    import time

    import torch

    from perfcheck.calibrate import repeats
    from perfcheck.calibrate import run as calrun
    from perfcheck.hardware.cache import save_to_cache
    from perfcheck.hardware.labels import AUTO_NAME

    out.mkdir(parents=True, exist_ok=True)
    fits, refs = {}, {}
    original = calrun._spec

    def every_statistic(run, *args):
        readings = [x for f in run.frames for r in f.attrs.get("references") or () for x in r]
        computes = [x for f in run.frames for r in f.attrs.get("compute_references") or () for x in r]
        default = repeats.ANCHOR
        try:
            for stat in repeats.ANCHOR_STATISTICS:
                repeats.ANCHOR = stat
                fits[stat] = original(run, *args)
                refs[stat] = (repeats.anchor_s(readings), repeats.anchor_s(computes))
        finally:
            repeats.ANCHOR = default
        fits[RAW] = original(SimpleNamespace(frames=[_raw(f) for f in run.frames], dev=run.dev), *args)
        refs[RAW] = (math.nan, math.nan)
        return fits[default]

    calrun._spec = every_statistic
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        res = calrun.calibrate("cpu", mode="quick", device="cpu", comm=False, threads=1, name=AUTO_NAME,
                               clock="process")
    doc = {"took_s": time.perf_counter() - t0, "default": repeats.ANCHOR,
           "calibration": dict(res.spec.calibration or {}), "stats": {}}
    for stat, (table, spec) in fits.items():
        spec = dataclasses.replace(spec, calibration=res.spec.calibration)
        spec.save(out / f"{stat}.json")
        table.to_csv(out / f"{stat}.csv", index=False)
        doc["stats"][stat] = {"reference_s": refs[stat][0], "compute_reference_s": refs[stat][1], **lenet(spec),
                              "op_cold_s": float(spec.host.get("op_cold_s", float("nan")))}
    (out / "summary.json").write_text(json.dumps(doc, indent=1))
    if cache:
        print(f"kept in the cache: {save_to_cache(res.spec, 'cpu', threads=1)}")
    print(f"{out}: {doc['took_s']:.1f} s; " + "; ".join(
        f"{s}: add {v['reference_s'] * 1e6:.2f} us, mm {v['compute_reference_s'] * 1e6:.1f} us, LeNet fwd "
        f"{v['lenet_fwd_s'] * 1e3:.3f} ms step {v['lenet_step_s'] * 1e3:.3f} ms" for s, v in doc["stats"].items()))


def spread(root: Path):
    docs = [json.loads(p.read_text()) for p in sorted(root.glob("*/summary.json"))]
    print(f"{len(docs)} calibrations ({', '.join(format(d['took_s'], '.0f') for d in docs)} s)")
    print("| statistic | figure | values | max/min |\n|---|---|---|---|")
    for stat in docs[0]["stats"]:
        for key, unit, scale in (("reference_s", "us", 1e6), ("compute_reference_s", "us", 1e6),
                                 ("lenet_fwd_s", "ms", 1e3), ("lenet_step_s", "ms", 1e3), ("op_cold_s", "us", 1e6)):
            v = [d["stats"][stat][key] for d in docs]
            print(f"| {stat} | {key} ({unit}) | {' '.join(f'{x * scale:.3g}' for x in v)} | "
                  f"{max(v) / min(v):.2f} |")


def sweep_specs(cal: Path, sweep_out: Path):
    """Per statistic: CAL/<stat>.json with every field the sweep's terms changed in the cached spec (the cache's
    spec against CAL's default statistic's, field by field, dict keys one by one) laid over it; then compare."""
    import subprocess

    from perfcheck.hardware.cache import cached_spec
    from perfcheck.hardware.systems import load_system

    doc = json.loads((cal / "summary.json").read_text())
    base = load_system(str(cal / f"{doc['default']}.json"))
    after = cached_spec("cpu", threads=1)
    changed = {}
    for f in dataclasses.fields(after):
        a, b = getattr(after, f.name), getattr(base, f.name)
        if f.name in ("calibration", "name"):
            continue
        if hasattr(a, "items") and hasattr(b, "items"):
            diff = {k: v for k, v in a.items() if k not in b or b[k] != v}
            if diff:
                changed[f.name] = diff
        elif a != b:
            changed[f.name] = a
    print("sweep terms: " + ", ".join(f"{k}({len(v)})" if isinstance(v, dict) else k for k, v in changed.items()))
    for stat in doc["stats"]:
        spec = load_system(str(cal / f"{stat}.json"))
        over = {k: ({**dict(getattr(spec, k)), **v} if isinstance(v, dict) else v) for k, v in changed.items()}
        path = spec.__class__.save(dataclasses.replace(spec, **over), cal / f"{stat}.sweep.json")
        out = cal / f"sweep.{stat}"
        subprocess.run([sys.executable, "-m", "perfcheck", "compare", str(sweep_out), "--system", str(path), "--out",
                        str(out), "--no-html"], check=True, stdout=subprocess.DEVNULL)
        print(f"--- {stat}")
        subprocess.run([sys.executable, str(Path(__file__).parent / "calibration_steadiness.py"), "--sweep",
                        str(out)], check=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calibrate", type=Path)
    p.add_argument("--cache", action="store_true")
    p.add_argument("--spread", type=Path)
    p.add_argument("--sweep-specs", type=Path, nargs=2, metavar=("CAL", "SWEEP_OUT"))
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if a.calibrate:
        calibrate(a.calibrate, a.cache)
    elif a.spread:
        spread(a.spread)
    elif a.sweep_specs:
        sweep_specs(*a.sweep_specs)


if __name__ == "__main__":
    main()

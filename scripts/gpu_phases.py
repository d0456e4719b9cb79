"""Where a GPU training step's time goes, per phase, without any instrumentation hooks: the
diagnostic behind bench/accuracy.py's "(step)" rows on a GPU (issue 12's host model, issue 9).

For each workload of bench/accuracy.py (same models, batches, dtypes, loss, SGD) it measures:

* ``issue``: host seconds to *issue* each phase (forward, loss, backward, optimizer step,
  zero_grad) with no synchronization inside the step: ``perf_counter`` around the Python call.
  On a host-bound step this is the host timeline the prediction's ``host_*`` columns model.
* ``synced``: the same phases each closed by ``torch.cuda.synchronize()``: max(host, device)
  per phase (plus one sync's latency).
* ``step``: the whole step issued as bench/accuracy.py does, one synchronize at its end.
* ``device``: one step under torch.profiler: kernel (+ memcpy/memset) seconds per phase
  (record_function markers), and the top aten ops by count and host time.

and beside them the prediction (``perfcheck.estimate`` with ``--system``) of the same phases.
Output: a markdown table per workload on stdout and a CSV (``--csv``).

    python scripts/gpu_phases.py --system calibrated.json --models lenet,jsc,gpt --csv phases.csv
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

import accuracy  # noqa: E402  (bench/accuracy.py: the workloads)

PHASES = ("fwd", "loss", "bwd", "optim", "zero_grad")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a smoke test of this script


def _sync():
    if DEVICE.type == "cuda":
        _sync()


def _phases(w, opt, sync: bool):
    """One step; seconds per phase (host issue time, or synced time when ``sync``)."""
    out, now = {}, time.perf_counter
    s = _sync if sync else (lambda: None)
    t0 = now()
    y = w.model(*w.inputs)
    s()
    t1 = now()
    loss = w.loss(y, w.target)
    s()
    t2 = now()
    loss.backward()
    s()
    t3 = now()
    opt.step()
    s()
    t4 = now()
    opt.zero_grad(set_to_none=True)
    s()
    t5 = now()
    _sync()
    t6 = now()
    out.update(fwd=t1 - t0, loss=t2 - t1, bwd=t3 - t2, optim=t4 - t3, zero_grad=t5 - t4, drain=t6 - t5, total=t6 - t0)
    return out


def _profiled(w, opt):
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE.type == "cuda" else [])) as prof:
        with record_function("phase:fwd"):
            y = w.model(*w.inputs)
        with record_function("phase:loss"):
            loss = w.loss(y, w.target)
        with record_function("phase:bwd"):
            loss.backward()
        with record_function("phase:optim"):
            opt.step()
        with record_function("phase:zero_grad"):
            opt.zero_grad(set_to_none=True)
        _sync()
    ev = prof.events()
    # device seconds per phase: kernels launched from inside each phase marker's host interval
    marks = {e.name[6:]: (e.time_range.start, e.time_range.end) for e in ev if e.name.startswith("phase:")}
    dev = dict.fromkeys(PHASES, 0.0)
    ops = {}
    for e in ev:
        if e.device_type == torch.autograd.DeviceType.CPU and e.kernels:
            k = sum(kk.duration for kk in e.kernels) * 1e-6
            for p, (a, b) in marks.items():
                if a <= e.time_range.start <= b:
                    dev[p] += k
                    break
    for a in prof.key_averages():
        if a.key.startswith("aten::") and a.count:
            ops[a.key] = (a.count, a.cpu_time_total * 1e-6, a.self_cpu_time_total * 1e-6,
                          getattr(a, "device_time_total", getattr(a, "cuda_time_total", 0.0)) * 1e-6)
    return dev, ops


def _predicted(w, system):
    import perfcheck
    from perfcheck.hardware.systems import host_constants, load_system

    spec = load_system(system) if system else None
    p = perfcheck.estimate(w.model, w.inputs, system=spec, optimizer="sgd")
    root = p[p["module"] == "(root)"].iloc[0]
    loss = accuracy._loss_s(w, spec)
    return {"fwd": root.pred_fwd_s, "host_fwd": root.host_fwd_s, "bwd": root.pred_bwd_s, "host_bwd": root.host_bwd_s,
            "optim": root.pred_optim_s, "loss": loss, "backward_call": host_constants(spec)["backward_call_s"],
            "step": root.pred_fwd_s + root.pred_bwd_s + root.pred_optim_s + loss}


def run(name, system, steps, gpt_batch, dtype):
    w = accuracy.build(name, DEVICE, dtype, gpt_batch=gpt_batch)
    opt = torch.optim.SGD(w.model.parameters(), lr=1e-4)
    for _ in range(3):
        _phases(w, opt, sync=True)
    issue, synced = [], []
    for _ in range(steps):  # interleaved
        issue.append(_phases(w, opt, sync=False))
        synced.append(_phases(w, opt, sync=True))
    bare = []
    for _ in range(steps):
        t0 = time.perf_counter()
        w.loss(w.model(*w.inputs), w.target).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync()
        bare.append(time.perf_counter() - t0)
    _profiled(w, opt)  # warm the profiler
    dev, ops = _profiled(w, opt)
    pred = _predicted(w, system)
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    rows = []
    for p in PHASES + ("total",):
        rows.append({"model": name, "phase": p, "issue_s": med(issue, p), "synced_s": med(synced, p),
                     "device_s": sum(dev.values()) if p == "total" else dev.get(p, float("nan")),
                     "pred_s": pred["step"] if p == "total" else pred.get(p, float("nan")),
                     "pred_host_s": {"fwd": pred["host_fwd"], "bwd": pred["host_bwd"]}.get(p, float("nan"))})
    rows.append({"model": name, "phase": "step (accuracy.py)", "issue_s": float("nan"),
                 "synced_s": statistics.median(bare), "device_s": float("nan"), "pred_s": pred["step"],
                 "pred_host_s": float("nan")})
    table = pd.DataFrame(rows)
    opt_rows = sorted(ops.items(), key=lambda kv: -kv[1][2])[:25]
    return table, pd.DataFrame([(name, k, *v) for k, v in opt_rows],
                               columns=["model", "op", "count", "cpu_total_s", "self_cpu_s", "device_s"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="lenet,jsc,gpt")
    ap.add_argument("--system", default=None, help="system file for the prediction (default: datasheet/cache)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--gpt-batch", type=int, default=8)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--csv", default=None)
    args = ap.parse_args(argv)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    tables, opss = [], []
    for name in args.models.split(","):
        t, ops = run(name, args.system, args.steps, args.gpt_batch, dtype)
        tables.append(t)
        opss.append(ops)
        fmt = t.copy()
        for c in ("issue_s", "synced_s", "device_s", "pred_s", "pred_host_s"):
            fmt[c] = (fmt[c] * 1e6).round(1)
        print(f"\n## {name} (us)\n" + fmt.rename(columns=lambda c: c.replace("_s", "_us")).to_string(index=False))
        o = ops.copy()
        for c in ("cpu_total_s", "self_cpu_s", "device_s"):
            o[c] = (o[c] * 1e6).round(1)
        print(o.head(15).to_string(index=False), flush=True)
    if args.csv:
        pd.concat(tables).to_csv(args.csv, index=False)
        pd.concat(opss).to_csv(str(args.csv).replace(".csv", "_ops.csv"), index=False)


if __name__ == "__main__":
    main()

"""Where a GPU training step's time goes, per phase, without any instrumentation hooks: the
diagnostic behind bench/accuracy.py's "(step)" rows on a GPU (issue 12's host model, issue 9).

For each workload of bench/accuracy.py (same models, batches, dtypes, loss, SGD) it measures:

* ``issue``: host seconds to *issue* each phase (forward, loss, backward, optimizer step,
  zero_grad) with no synchronization inside the step: ``perf_counter`` around the Python call.
  On a host-bound step this is the host timeline the prediction's ``host_*`` columns model.
* ``synced``: the same phases each closed by ``torch.cuda.synchronize()``: max(host, device)
  per phase (plus one sync's latency).
* ``step``: the whole step issued as bench/accuracy.py does, one synchronize at its end.
* ``device``: one step under torch.profiler: the top aten ops by count, host time and kernel time
  (reliable), and kernel seconds per phase by the launching op's start inside the phase markers
  (NOT reliable: on the H100, 2026-11-23, backward kernels were not attributed to ``bwd``; use the
  op table, or perfcheck's own kernel table, for device time).

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
        torch.cuda.synchronize()


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

    from perfcheck.hardware.cache import resolve_system

    spec = load_system(system) if system else resolve_system()  # the default perfcheck.estimate would use
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


def _host_per_call(fn, n=200, reps=5):
    """Host (process CPU) seconds per call of ``fn`` in a tight loop, best of ``reps``; a sync after
    each loop only (small tensors: the device keeps up, so this is the host's issue cost)."""
    for _ in range(20):
        fn()
    _sync()
    best = float("inf")
    for _ in range(reps):
        t0 = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - t0) / n)
        _sync()
    return best


def op_costs(batch=8):
    """Tight-loop host cost of LeNet's ops one by one (as calibration times them) against the same
    ops issued in sequence (as a forward issues them), in fp32 and bf16, grad on and off: whether a
    gap between calibration and a model's issue time is the dtype's (cuDNN/cuBLAS paths) or the
    sequence's (a loop of one op keeps every cache hot)."""
    import torch.nn.functional as F
    from perfcheck.examples.models import Net

    rows = []
    for dt in (torch.float32, torch.bfloat16):
        net = Net().to(DEVICE, dt)
        x = torch.randn(batch, 3, 32, 32, device=DEVICE, dtype=dt)
        a1 = net.conv1(x)
        p1 = net.pool(F.relu(a1))
        p2 = net.pool(F.relu(net.conv2(p1)))
        f = torch.flatten(p2, 1)
        one = torch.ones(1, device=DEVICE, dtype=dt)
        ops = {"add 1-element": lambda: one + one, "conv1": lambda: F.conv2d(x, net.conv1.weight, net.conv1.bias),
               "relu": lambda: F.relu(a1), "max_pool2d": lambda: F.max_pool2d(a1, 2, 2),
               "conv2": lambda: F.conv2d(p1, net.conv2.weight, net.conv2.bias), "flatten": lambda: torch.flatten(p2, 1),
               "linear fc1": lambda: F.linear(f, net.fc1.weight, net.fc1.bias)}
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                for name, fn in ops.items():
                    rows.append({"dtype": str(dt)[6:], "grad": grad, "what": name, "host_us": _host_per_call(fn) * 1e6})
                rows.append({"dtype": str(dt)[6:], "grad": grad, "what": "LeNet forward (12 ops, 6 modules)",
                             "host_us": _host_per_call(lambda: net(x), n=100) * 1e6})
                rows.append({"dtype": str(dt)[6:], "grad": grad, "what": "LeNet forward, functional (no modules)",
                             "host_us": _host_per_call(lambda: _lenet_functional(net, x), n=100) * 1e6})
        with torch.enable_grad():
            rows.append({"dtype": str(dt)[6:], "grad": True, "what": "LeNet forward+backward",
                         "host_us": _host_per_call(lambda: net(x).float().sum().backward(), n=50) * 1e6})
    return pd.DataFrame(rows)


def _per_call(fn, before=None, n=200):
    """Median host seconds of one ``fn()`` call (perf_counter around the call, no sync inside), each
    call after ``before()`` (untimed): the call's cost in the context ``before`` leaves."""
    ts = []
    for i in range(n + 10):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        if i >= 10:
            ts.append(dt)
        if i % 50 == 0:
            _sync()
    _sync()
    return statistics.median(ts)


def contexts(batch=8):
    """The same host work timed in four contexts: a tight loop (how calibration times it), right
    after a torch.cuda.synchronize(), right after calibration's cold filler (another model's forward
    and backward: perfcheck.calibrate.layers.cold_filler), and inside real training steps."""
    from perfcheck.examples.models import Net
    from perfcheck.calibrate.layers import cold_filler

    cold = cold_filler(DEVICE)
    net = Net().to(DEVICE)
    x = torch.randn(batch, 3, 32, 32, device=DEVICE)
    tgt = torch.randint(0, 10, (batch,), device=DEVICE)
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)
    a, b = torch.ones(1, device=DEVICE), torch.ones(1, device=DEVICE)
    rows = []

    def add(what, ctx, sec):
        rows.append({"what": what, "context": ctx, "host_us": sec * 1e6})

    for what, fn in (("add 1-element", lambda: a + b), ("LeNet forward", lambda: net(x)),
                     ("SGD step + zero_grad", lambda: (opt.step(), opt.zero_grad(set_to_none=True)))):
        if what.startswith("SGD"):
            for p in net.parameters():
                p.grad = torch.zeros_like(p)
        add(what, "tight loop", _per_call(fn))
        add(what, "after synchronize", _per_call(fn, _sync))
        add(what, "after cold filler", _per_call(fn, cold))
    # inside real steps: each phase's issue time
    ph = {k: [] for k in ("fwd", "loss", "bwd", "optim+zero_grad", "step")}
    for i in range(210):
        t0 = time.perf_counter()
        y = net(x)
        t1 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(y, tgt)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        if i >= 10:
            for k, v in zip(ph, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
                ph[k].append(v)
        if i % 20 == 0:
            _sync()
    for k, v in ph.items():
        add({"fwd": "LeNet forward", "optim+zero_grad": "SGD step + zero_grad"}.get(k, f"step: {k}"),
            "in training steps", statistics.median(v))
    # forward + backward in a tight loop (no optimizer, no zero_grad): the backward's tight-loop cost
    add("step: fwd+loss+bwd", "tight loop",
        _per_call(lambda: torch.nn.functional.cross_entropy(net(x), tgt).backward()))
    return pd.DataFrame(rows)


def sizes():
    """Host issue cost of the same op at growing tensor sizes (allocator pools: <= 1 MiB small,
    larger blocks large) and of LeNet's ops and forward at batch 8 vs 256, bf16: whether a step's
    host time grows with the batch although every constant is measured on tiny tensors."""
    import torch.nn.functional as F
    from perfcheck.examples.models import Net

    rows = []
    for n in (1, 1 << 14, 1 << 18, 1 << 20, 1 << 21):  # fp32 elements: 4 B .. 8 MiB
        a, b = torch.ones(n, device=DEVICE), torch.ones(n, device=DEVICE)
        rows.append({"what": f"add, {n * 4} B", "host_us": _host_per_call(lambda: a + b, n=100) * 1e6})
        rows.append({"what": f"empty, {n * 4} B",
                     "host_us": _host_per_call(lambda: torch.empty(n, device=DEVICE), n=100) * 1e6})
    for batch in (8, 256):
        net = Net().to(DEVICE, torch.bfloat16)
        x = torch.randn(batch, 3, 32, 32, device=DEVICE, dtype=torch.bfloat16)
        p1 = net.pool(F.relu(net.conv1(x)))
        with torch.no_grad():
            rows.append({"what": f"bf16 batch {batch}: conv1 (no grad)",
                         "host_us": _host_per_call(lambda: net.conv1(x), n=100) * 1e6})
            rows.append({"what": f"bf16 batch {batch}: conv2 (no grad)",
                         "host_us": _host_per_call(lambda: net.conv2(p1), n=100) * 1e6})
        rows.append({"what": f"bf16 batch {batch}: LeNet forward (grad)",
                     "host_us": _host_per_call(lambda: net(x), n=50) * 1e6})
        rows.append({"what": f"bf16 batch {batch}: LeNet forward+backward",
                     "host_us": _host_per_call(lambda: net(x).float().sum().backward(), n=20) * 1e6})
    return pd.DataFrame(rows)


def _lenet_functional(net, x):
    import torch.nn.functional as F

    x = F.max_pool2d(F.relu(F.conv2d(x, net.conv1.weight, net.conv1.bias)), 2, 2)
    x = F.max_pool2d(F.relu(F.conv2d(x, net.conv2.weight, net.conv2.bias)), 2, 2)
    x = torch.flatten(x, 1)
    x = F.relu(F.linear(x, net.fc1.weight, net.fc1.bias))
    x = F.relu(F.linear(x, net.fc2.weight, net.fc2.bias))
    return F.linear(x, net.fc3.weight, net.fc3.bias)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="lenet,jsc,gpt")
    ap.add_argument("--system", default=None, help="system file for the prediction (default: datasheet/cache)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--gpt-batch", type=int, default=8)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--sizes", action="store_true", help="only host issue cost vs tensor size and batch")
    ap.add_argument("--context", action="store_true", help="only the same host work timed in four contexts")
    ap.add_argument("--ops", action="store_true", help="only the per-op tight-loop vs in-sequence host costs")
    args = ap.parse_args(argv)
    if args.context or args.sizes:
        t = contexts() if args.context else sizes()
        t["host_us"] = t["host_us"].round(2)
        print(t.to_string(index=False), flush=True)
        if args.csv:
            t.to_csv(args.csv, index=False)
        return
    if args.ops:
        t = op_costs()
        t["host_us"] = t["host_us"].round(2)
        print(t.to_string(index=False), flush=True)
        if args.csv:
            t.to_csv(args.csv, index=False)
        return
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

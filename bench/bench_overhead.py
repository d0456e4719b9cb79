"""Step-time overhead of PerfCheck's timing mode against the bare model, and of the tools it is
compared with (torch.profiler recording every op, DeepSpeed's flops profiler).

Same process, interleaved: every round runs one training step in each mode, in a shuffled order,
after ``--warmup`` untimed rounds. A step is forward + loss + backward + optimizer step + zero_grad
(+ ``pc.step()`` for PerfCheck: the step-boundary work users pay). Attaching/detaching a tool
happens outside the timed region. Each step is timed twice: wall clock, and the process's CPU
time (``time.process_time``, all threads) which other processes on a shared machine disturb far
less. Reported: median per mode, overhead = median over rounds of (mode / bare of the same round)
- 1, with a 95% bootstrap interval over rounds.

    python bench/bench_overhead.py --model gpt --rounds 10          # 6 layers, d=512, batch 8, seq 256
    python bench/bench_overhead.py --model lenet --rounds 200
    python bench/bench_overhead.py --micro                          # hook cost per module call
    ... --write bench/RESULTS.md   (replaces this script's section, keeps the others)
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import random
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from perfcheck import PerfCheck  # noqa: E402
from perfcheck.examples.models import EXAMPLES  # noqa: E402
from perfcheck.measure.context import device_name  # noqa: E402

SECTION = ("<!-- bench_overhead:start -->", "<!-- bench_overhead:end -->")


class Mode:
    """attach() before the timed step, boundary() inside it, detach() after."""

    name = "bare"

    def attach(self, model):
        return None

    def boundary(self):
        return None

    def detach(self):
        return None


class PerfCheckMode(Mode):
    name = "perfcheck timing (hooks)"

    def __init__(self, sample_interval=None):
        self.sample_interval = sample_interval
        if sample_interval:
            self.name = f"perfcheck timing + sampler {sample_interval}s"

    def attach(self, model):
        self.pc = PerfCheck(model, warmup=0, steps=None, profile=False, sample_interval=self.sample_interval).start()

    def boundary(self):
        self.pc.step()

    def detach(self):
        self.pc.stop()


class TorchProfilerMode(Mode):
    name = "torch.profiler (CPU activity, every op)"

    def attach(self, model):
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self.prof = profile(activities=acts)
        self.prof.__enter__()

    def detach(self):
        self.prof.__exit__(None, None, None)


class DeepSpeedFlopsMode(Mode):
    name = "deepspeed flops profiler"

    def attach(self, model):
        from deepspeed.profiling.flops_profiler import FlopsProfiler

        self.prof = FlopsProfiler(model)
        self.prof.start_profile()

    def detach(self):
        self.prof.stop_profile()
        self.prof.end_profile()


def train_step(model, inputs, target, loss_fn, opt, mode):
    loss_fn(model(*inputs), target).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    mode.boundary()
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def bootstrap_ci(ratios, n=2000, seed=0):
    rng = np.random.default_rng(seed)
    ratios = np.asarray(ratios)
    meds = [np.median(rng.choice(ratios, size=len(ratios))) for _ in range(n)]
    return float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def run_ab(example_name, rounds, warmup, modes, batch, seed=0):
    ex = EXAMPLES[example_name]
    torch.manual_seed(seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = ex.build().to(dev)
    inputs, target = ex.batch(batch or ex.default_batch, torch.Generator().manual_seed(seed))
    inputs, target = tuple(t.to(dev) for t in inputs), target.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    times = {m.name: ([], []) for m in modes}  # (wall, cpu)
    rng = random.Random(seed)
    for r in range(warmup + rounds):
        order = list(modes)
        rng.shuffle(order)
        for mode in order:
            mode.attach(model)
            t0, c0 = time.perf_counter(), time.process_time()
            train_step(model, inputs, target, ex.loss, opt, mode)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            mode.detach()
            if r >= warmup:
                times[mode.name][0].append(dt)
                times[mode.name][1].append(dc)
    rows = []
    for mode in modes:
        row = {"mode": mode.name, "n": len(times[mode.name][0])}
        for k, key in ((0, "wall"), (1, "cpu")):
            t, bare = np.asarray(times[mode.name][k]), np.asarray(times["bare"][k])
            ratios = t / bare
            lo, hi = bootstrap_ci(ratios)
            row[key] = {"median_s": float(np.median(t)), "overhead": float(np.median(ratios) - 1), "ci": (lo - 1, hi - 1)}
        rows.append(row)
    return rows, sum(p.numel() for p in model.parameters())


def micro(n_modules=100, steps=300):
    """Hook cost per module call (forward + backward hooks), on a chain of tiny Linear layers."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(n_modules)])
    x = torch.randn(2, 8)
    res = {"bare": [], "hooks": []}
    for _ in range(steps):
        for name in random.sample(list(res), 2):
            pc = PerfCheck(model, warmup=0, steps=None, profile=False, sample_interval=None).start() if name == "hooks" else None
            t0 = time.perf_counter()
            model(x).sum().backward()
            if pc:
                pc.step()
            res[name].append(time.perf_counter() - t0)
            if pc:
                pc.stop()
    b, h = statistics.median(res["bare"]), statistics.median(res["hooks"])
    return {"modules": n_modules + 1, "bare_ms": b * 1e3, "hooks_ms": h * 1e3, "per_call_us": (h - b) / (n_modules + 1) * 1e6}


def environment():
    return (f"{device_name(torch.device('cuda' if torch.cuda.is_available() else 'cpu'))}, "
            f"{os.cpu_count()} logical cores, torch {torch.__version__} ({torch.get_num_threads()} intra-op threads), "
            f"Python {platform.python_version()}")


def table(rows):
    out = ["| mode | wall: median step | wall: overhead [95% CI] | process CPU: median step | CPU: overhead [95% CI] | steps |",
           "|---|---|---|---|---|---|"]
    for r in rows:
        cells = []
        for key in ("wall", "cpu"):
            v = r[key]
            ov = "—" if r["mode"] == "bare" else (f"{v['overhead'] * 100:+.1f}% [{v['ci'][0] * 100:+.1f}%, "
                                                  f"{v['ci'][1] * 100:+.1f}%]")
            cells += [f"{v['median_s'] * 1e3:.2f} ms", ov]
        out.append(f"| {r['mode']} | " + " | ".join(cells) + f" | {r['n']} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(EXAMPLES), action="append", help="repeatable (default: gpt and lenet)")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (default: gpt 12, others 100)")
    ap.add_argument("--compare-rounds", type=int, default=None,
                    help="rounds for the torch.profiler / DeepSpeed comparison (a separate A/B; default: gpt 5, others --rounds)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--no-compare", action="store_true", help="skip torch.profiler and DeepSpeed")
    ap.add_argument("--no-sampler", action="store_true", help="skip the perfcheck + sampler mode")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--micro", action="store_true", help="also measure the hook cost per module call")
    ap.add_argument("--write", default=None, help="RESULTS.md to update (this script's section only)")
    args = ap.parse_args(argv)
    models = args.model or ["gpt", "lenet"]
    if args.threads:
        torch.set_num_threads(args.threads)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    report = [f"Machine: {environment()}; load average at start {load:.1f}.", f"Date: {datetime.date.today().isoformat()}.",
              f"Command: `python bench/bench_overhead.py {' '.join(argv if argv is not None else sys.argv[1:])}`", ""]
    for name in models:
        ex = EXAMPLES[name]
        rounds = args.rounds or (12 if name == "gpt" else 100)
        runs_ = [("PerfCheck timing mode", rounds,
                  [Mode(), PerfCheckMode()] + ([] if args.no_sampler else [PerfCheckMode(sample_interval=0.5)]))]
        if not args.no_compare:
            runs_.append(("other tools, for comparison", args.compare_rounds or (5 if name == "gpt" else rounds),
                          [Mode(), TorchProfilerMode(), DeepSpeedFlopsMode()]))
        for title, n, modes in runs_:
            rows, params = run_ab(name, n, args.warmup, modes, args.batch)
            report += [f"**{name}, {title}**: {ex.description}, batch {args.batch or ex.default_batch}, "
                       f"{params / 1e6:.2f} M params, SGD; {n} interleaved rounds after {args.warmup} warm-up rounds.",
                       "", table(rows), ""]
            print("\n".join(report[-4:]), flush=True)
    if args.micro:
        m = micro()
        line = (f"**hook cost per module call** (chain of {m['modules']} tiny modules, forward + backward hooks, "
                f"step boundary included): bare {m['bare_ms']:.3f} ms, with hooks {m['hooks_ms']:.3f} ms, "
                f"**{m['per_call_us']:.1f} µs per module call**.")
        report += [line, ""]
        print(line)
    if args.write:
        path = Path(args.write)
        text = path.read_text() if path.exists() else "# Benchmark results\n"
        body = "\n".join([SECTION[0], "## Measurement overhead (bench/bench_overhead.py)", ""] + report + [SECTION[1]])
        if SECTION[0] in text:
            text = re.sub(re.escape(SECTION[0]) + r".*?" + re.escape(SECTION[1]), lambda _: body, text, flags=re.S)
        else:
            text = text.rstrip("\n") + "\n\n" + body + "\n"
        path.write_text(text)


if __name__ == "__main__":
    main()

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
    python bench/bench_overhead.py --model gpt2-small --dtype bf16  # GPU: GPT-2 small 124M, batch 8, seq 1024
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
from perfcheck.examples.models import EXAMPLES, GPT, Example  # noqa: E402
from perfcheck.measure.context import device_name  # noqa: E402

SECTION = ("<!-- bench_overhead:start -->", "<!-- bench_overhead:end -->")


def _gpt2_batch(n, g):
    shape = (n, 1024)
    return (torch.randint(0, 50257, shape, generator=g),), torch.randint(0, 50257, shape, generator=g)


def _chain():
    return nn.Sequential(*[nn.Linear(8, 8) for _ in range(100)])


def _chain_batch(n, g):
    return (torch.randn(n, 8, generator=g),), torch.randn(n, 8, generator=g)


def _mse(out, target):
    return ((out - target) ** 2).mean()


#: The examples, plus the per-call probe (issue #15: 101 tiny modules, so the step is nearly all
#: per-module-call cost) and GPT-2 small (124 M, seq 1024: a GPU workload; too slow for a CPU benchmark).
MODELS = {**EXAMPLES, "chain": Example("chain", "a chain of 100 Linear(8, 8) in one nn.Sequential (101 module calls "
                                       "per step: the per-call cost probe)", _chain, _chain_batch, _mse, 2),
          "gpt2-small": Example("gpt2-small", "GPT-2 small (124 M params, 12 layers, d=768, vocab 50257), "
                                            "seq 1024, SDPA attention", GPT, _gpt2_batch,
                                            EXAMPLES["gpt"].loss, 8)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class SyncCounter:
    """Counts device synchronizations inside ``counting()``: the ones ``set_sync_debug_mode("warn")``
    reports (implicit: .item(), nonzero, blocking copies) plus explicit ``torch.cuda.synchronize``,
    ``Event.synchronize`` and ``Stream.synchronize`` calls (wrapped here, in the benchmark only)."""

    def __init__(self):
        self.count = 0
        self.active = False
        self._saved = []

    def install(self):
        if not torch.cuda.is_available():
            return self
        counter = self

        def wrap(owner, name):
            fn = getattr(owner, name)
            self._saved.append((owner, name, fn))

            def counted(*a, **k):
                if counter.active:
                    counter.count += 1
                return fn(*a, **k)
            setattr(owner, name, counted)

        wrap(torch.cuda, "synchronize")
        wrap(torch.cuda.Event, "synchronize")
        wrap(torch.cuda.Stream, "synchronize")
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def uninstall(self):
        for owner, name, fn in reversed(self._saved):
            setattr(owner, name, fn)
        self._saved.clear()
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("default")

    def counting(self):
        import contextlib
        import warnings

        @contextlib.contextmanager
        def ctx():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.active = True
                try:
                    yield
                finally:
                    self.active = False
            self.count += sum(1 for w in caught if "synchroniz" in str(w.message).lower())
        return ctx()


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
    """A fresh PerfCheck per round; ``warm_steps`` untimed steps run with it first, so the timed step
    is a steady-state step (the first step after start() records the input spec and similar one-offs)."""

    name = "perfcheck timing (hooks)"
    warm_steps = 1

    def __init__(self, sample_interval=None, memory=None, depth=None):
        self.sample_interval, self.memory, self.depth = sample_interval, memory, depth
        if sample_interval:
            self.name = f"perfcheck timing + sampler {sample_interval}s"
        if depth is not None:
            self.name = f"perfcheck timing, depth={depth}"
        if memory is not None:
            self.name += f", per-module memory {'on' if memory else 'off'}"

    def attach(self, model):
        self.pc = PerfCheck(model, warmup=0, steps=None, profile=False, sample_interval=self.sample_interval,
                            memory=self.memory, depth=self.depth).start()

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


def train_step(model, inputs, target, loss_fn, opt, mode, syncs=None):
    """One step; on a GPU, synchronizations inside it are counted (not the closing synchronize
    that makes the wall-clock reading cover the device's work)."""
    if syncs is None:
        loss_fn(model(*inputs), target).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mode.boundary()
    else:
        with syncs.counting():
            loss_fn(model(*inputs).float(), target).backward()
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


def run_ab(example_name, rounds, warmup, modes, batch, seed=0, dtype="fp32"):
    ex = MODELS[example_name]
    torch.manual_seed(seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = ex.build().to(device=dev, dtype=DTYPES[dtype])
    inputs, target = ex.batch(batch or ex.default_batch, torch.Generator().manual_seed(seed))
    inputs, target = tuple(t.to(dev) for t in inputs), target.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    times = {m.name: ([], []) for m in modes}  # (wall, cpu)
    syncs = {m.name: [] for m in modes}
    counter = SyncCounter().install() if dev.type == "cuda" else None
    rng = random.Random(seed)
    try:
        _rounds(model, inputs, target, ex, opt, modes, rng, warmup, rounds, times, syncs, counter)
    finally:
        if counter is not None:
            counter.uninstall()
    return _rows(modes, times, syncs), sum(p.numel() for p in model.parameters())


def _rounds(model, inputs, target, ex, opt, modes, rng, warmup, rounds, times, syncs, counter):
    for r in range(warmup + rounds):
        order = list(modes)
        rng.shuffle(order)
        for mode in order:
            mode.attach(model)
            for _ in range(getattr(mode, "warm_steps", 0)):  # untimed
                train_step(model, inputs, target, ex.loss, opt, mode)
            before = counter.count if counter is not None else 0
            t0, c0 = time.perf_counter(), time.process_time()
            train_step(model, inputs, target, ex.loss, opt, mode, counter)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            mode.detach()
            if r >= warmup:
                syncs[mode.name].append((counter.count - before) if counter is not None else float("nan"))
                times[mode.name][0].append(dt)
                times[mode.name][1].append(dc)


def _rows(modes, times, syncs):
    rows = []
    for mode in modes:
        row = {"mode": mode.name, "n": len(times[mode.name][0]),
               "syncs": float(np.median(syncs[mode.name])) if syncs[mode.name] else float("nan")}
        for k, key in ((0, "wall"), (1, "cpu")):
            t, bare = np.asarray(times[mode.name][k]), np.asarray(times["bare"][k])
            ratios = t / bare
            lo, hi = bootstrap_ci(ratios)
            row[key] = {"median_s": float(np.median(t)), "overhead": float(np.median(ratios) - 1), "ci": (lo - 1, hi - 1)}
        rows.append(row)
    return rows


def micro(n_modules=100, steps=300):
    """Cost per module call (forward + backward, step boundary included) on a chain of tiny Linear
    layers: forward + backward only, process CPU time, one steady-state step per round (a fresh
    PerfCheck, one untimed step, then the timed one)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(n_modules)])
    x = torch.randn(2, 8)
    res = {"bare": [], "hooks": []}
    for _ in range(steps):
        for name in random.sample(list(res), 2):
            pc = None
            if name == "hooks":
                pc = PerfCheck(model, warmup=0, steps=None, profile=False, sample_interval=None).start()
                model(x).sum().backward()
                pc.step()
            t0 = time.process_time()
            model(x).sum().backward()
            if pc:
                pc.step()
            res[name].append(time.process_time() - t0)
            if pc:
                pc.stop()
    b, h = statistics.median(res["bare"]), statistics.median(res["hooks"])
    return {"modules": n_modules + 1, "bare_ms": b * 1e3, "hooks_ms": h * 1e3, "per_call_us": (h - b) / (n_modules + 1) * 1e6}


def environment():
    return (f"{device_name(torch.device('cuda' if torch.cuda.is_available() else 'cpu'))}, "
            f"{os.cpu_count()} logical cores, torch {torch.__version__} ({torch.get_num_threads()} intra-op threads), "
            f"Python {platform.python_version()}")


def table(rows):
    gpu = any(np.isfinite(r["syncs"]) for r in rows)
    out = ["| mode | wall: median step | wall: overhead [95% CI] | process CPU: median step | CPU: overhead [95% CI] | steps |"
           + (" device syncs per step |" if gpu else ""), "|---|---|---|---|---|---|" + ("---|" if gpu else "")]
    for r in rows:
        cells = []
        for key in ("wall", "cpu"):
            v = r[key]
            ov = "—" if r["mode"] == "bare" else (f"{v['overhead'] * 100:+.1f}% [{v['ci'][0] * 100:+.1f}%, "
                                                  f"{v['ci'][1] * 100:+.1f}%]")
            cells += [f"{v['median_s'] * 1e3:.2f} ms", ov]
        out.append(f"| {r['mode']} | " + " | ".join(cells) + f" | {r['n']} |" + (f" {r['syncs']:.0f} |" if gpu else ""))
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), action="append", help="repeatable (default: gpt and lenet)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="parameter dtype of the model (bf16 on GPUs)")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (default: gpt 12, others 100)")
    ap.add_argument("--compare-rounds", type=int, default=None,
                    help="rounds for the torch.profiler / DeepSpeed comparison (a separate A/B; default: gpt 5, others --rounds)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--no-compare", action="store_true", help="skip torch.profiler and DeepSpeed")
    ap.add_argument("--no-sampler", action="store_true", help="skip the perfcheck + sampler mode")
    ap.add_argument("--depth", type=int, action="append", default=[],
                    help="also time PerfCheck(depth=N) (repeatable): the cheap always-on mode of issue #15")
    ap.add_argument("--together", action="store_true",
                    help="one A/B with every mode (PerfCheck, torch.profiler, DeepSpeed's flops profiler) per model, "
                         "so their ratios come from the same rounds")
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
        ex = MODELS[name]
        rounds = args.rounds or (12 if name.startswith("gpt") else 100)
        runs_ = [("PerfCheck timing mode", rounds,
                  [Mode(), PerfCheckMode()] + ([] if args.no_sampler else [PerfCheckMode(sample_interval=0.5)])
                  # per-module CUDA memory is opt-in (PerfCheck(memory=True)): its cost, beside the default
                  + ([PerfCheckMode(memory=True)] if torch.cuda.is_available() else [])
                  + [PerfCheckMode(depth=d) for d in args.depth])]
        if args.together and not args.no_compare:
            runs_ = [("PerfCheck timing mode and the other tools, same rounds", rounds,
                      runs_[0][2] + [TorchProfilerMode(), DeepSpeedFlopsMode()])]
        elif not args.no_compare:
            runs_.append(("other tools, for comparison", args.compare_rounds or (5 if name.startswith("gpt") else rounds),
                          [Mode(), TorchProfilerMode(), DeepSpeedFlopsMode()]))
        for title, n, modes in runs_:
            rows, params = run_ab(name, n, args.warmup, modes, args.batch, dtype=args.dtype)
            report += [f"**{name}, {title}**: {ex.description}, batch {args.batch or ex.default_batch}, "
                       f"{params / 1e6:.2f} M params, {args.dtype}, SGD; {n} interleaved rounds after {args.warmup} "
                       "warm-up rounds.",
                       "", table(rows), ""]
            print("\n".join(report[-4:]), flush=True)
    if args.micro:
        m = micro()
        line = (f"**cost per module call** (chain of {m['modules']} tiny modules, forward + backward, step boundary "
                f"included, process CPU time): bare {m['bare_ms']:.3f} ms, timed {m['hooks_ms']:.3f} ms, "
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

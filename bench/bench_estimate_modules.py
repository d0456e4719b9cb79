"""Where a 1,000-module ``perfcheck.estimate`` spends its time (issue #13 re-measure; bench/RESULTS.md).

    python bench/bench_estimate_modules.py [--rounds 7]

One process, one intra-op thread, interleaved rounds, process CPU time (``time.process_time``),
medians. Per round: (a) the floor, a plain forward of the same meta model under a
``FakeTensorMode`` with no perfcheck hooks; (b) ``trace.trace_model`` alone; (c) the whole
``perfcheck.estimate``. The model is ``bench_transformer.deep_sequential()``: 333 x (Linear(256,
256), ReLU, LayerNorm(256)) on the meta device, input (32, 256). Target: (c) < 1 s warm.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    import perfcheck
    from perfcheck.predict import trace as tracing
    from perfcheck.predict.trace import inputs_from_shapes
    from torch._subclasses.fake_tensor import FakeTensorMode
    from bench_transformer import deep_sequential

    model = deep_sequential()
    x = inputs_from_shapes([(32, 256)])

    def floor():
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            params = {k: mode.from_tensor(torch.empty(v.shape)) for k, v in model.named_parameters()}
            torch.func.functional_call(model, params, (mode.from_tensor(torch.empty(32, 256)),))

    cases = {"floor: fake forward, no hooks": floor,
             "trace_model": lambda: tracing.trace_model(model, x),
             "perfcheck.estimate": lambda: perfcheck.estimate(model, x, system="h100-sxm")}
    t0 = time.process_time()
    cases["perfcheck.estimate"]()
    cold = time.process_time() - t0
    for fn in cases.values():
        fn()
    cpu = {k: [] for k in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            c0 = time.process_time()
            fn()
            cpu[name].append(time.process_time() - c0)
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}, torch {torch.__version__}, 1 thread, {args.rounds} interleaved rounds, CPU s")
    print(f"cold estimate (first call in the process): {cold:.3f} s")
    for name, v in cpu.items():
        print(f"{name}: median {statistics.median(v):.3f} s (min {min(v):.3f}, max {max(v):.3f})")


if __name__ == "__main__":
    main()

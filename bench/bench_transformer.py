"""Speed of the analytical front-ends (plain script; numbers go to bench/RESULTS.md).

    python bench/bench_transformer.py [--repeat 50] [--profile]

1. Per-layer table of GPT-3 175B (96 layers, TP 8 + SP, PP 8, DP 16 = 1024 GPUs, ZeRO-1):
   ``estimate_transformer``; target <= 5 ms.
2. ``sweep_transformer`` over a grid of >= 10,000 layouts; target >= 10,000 configs/s.
3. ``perfcheck.estimate`` (module front-end) of a 1,000-module nn.Sequential of
   Linear/ReLU/LayerNorm built on the meta device; target < 1 s. ``--profile`` prints the top of
   a cProfile of one warm call.
"""
from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import sys
import time

import pandas as pd
import torch
import torch.nn as nn


def _timed(fn, repeat):
    """(median wall, min wall, median process CPU) seconds per call. On a shared machine the CPU
    time is the fairer number: wall time also counts the time other processes held the cores."""
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), min(wall), statistics.median(cpu)


def bench_table(repeat):
    from perfcheck.predict.transformer import estimate_transformer

    par = dict(tp=8, sp=True, pp=8, dp=16, zero_stage=1, micro_batches=16)
    call = lambda: estimate_transformer("gpt3-175b", batch=1, parallel=par, system="a100-80gb-sxm", dtype="bf16")  # noqa: E731
    call()
    med, best, cpu = _timed(call, repeat)
    return {"what": "per-layer table, GPT-3 175B, tp8+sp pp8 dp16 ZeRO-1", "median_ms": med * 1e3, "min_ms": best * 1e3,
            "cpu_ms": cpu * 1e3, "target": "<= 5 ms", "met": med <= 5e-3}


def layout_grid() -> pd.DataFrame:
    rows = [dict(tp=tp, pp=pp, dp=dp, zero_stage=z, micro_batch=mb, sp=sp, micro_batches=m)
            for tp, pp, dp, z, mb, sp, m in itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16), (1, 2, 4, 8, 16, 32, 64, 128),
                                                              (0, 1, 2, 3), (1, 2, 4, 8), (False, True), (1, 4, 8, 16, 32, 64))
            if not (sp and tp == 1) and not (pp > 1 and z >= 2)]
    return pd.DataFrame(rows)


def bench_sweep(repeat):
    from perfcheck.predict.transformer import sweep_transformer

    grid = layout_grid()
    call = lambda: sweep_transformer("gpt3-175b", grid, system="a100-80gb-sxm")  # noqa: E731
    call()
    med, best, cpu = _timed(call, max(3, repeat // 10))
    return {"what": f"sweep_transformer, GPT-3 175B, {len(grid)} layouts", "median_ms": med * 1e3, "min_ms": best * 1e3,
            "cpu_ms": cpu * 1e3, "configs_per_s": len(grid) / med, "target": ">= 10,000 configs/s",
            "met": len(grid) / med >= 1e4}


def deep_sequential(n_modules=1000, width=256):
    layers = []
    with torch.device("meta"):
        while len(layers) + 1 < n_modules:  # + the Sequential itself
            layers += [nn.Linear(width, width), nn.ReLU(), nn.LayerNorm(width)]
        model = nn.Sequential(*layers[: n_modules - 1])
    assert sum(1 for _ in model.modules()) == n_modules
    return model


def bench_modules(repeat, profile=False):
    import perfcheck
    from perfcheck.predict.trace import inputs_from_shapes

    model = deep_sequential()
    x = inputs_from_shapes([(32, 256)])
    call = lambda: perfcheck.estimate(model, x, system="h100-sxm")  # noqa: E731
    t0 = time.perf_counter()
    rows = len(call())
    cold = time.perf_counter() - t0
    med, best, cpu = _timed(call, max(3, repeat // 10))
    out = {"what": f"perfcheck.estimate, nn.Sequential of {rows} modules on meta", "cold_s": cold, "median_s": med,
           "min_s": best, "cpu_s": cpu, "target": "< 1 s", "met": med < 1.0}
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(call)
        pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(25)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--profile", action="store_true", help="cProfile one warm module-estimator call")
    args = ap.parse_args(argv)
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs visible, load average {os.getloadavg()[0]:.1f}, torch {torch.__version__}, "
          f"python {platform.python_version()}")
    for result in (bench_table(args.repeat), bench_sweep(args.repeat), bench_modules(args.repeat, args.profile)):
        print(" | ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()

"""What an op pays when the data streamed since its last call exceeded the L3, and how a GEMM's rate falls with the
width of its output: the two effects a machine with a small last-level cache shows that one with a large L3 hides.

Why: on an AMD EPYC VM (2 vCPUs, L2 1 MiB, L3 32 MiB) every held-out model read 1.1-1.5x its prediction, where the
project's Xeon (L3 300 MiB as its VM reports it) read 0.97-1.06 (bench/results/heldout.md). Two tables:

1. Tiny and small memory-bound ops and small GEMMs timed hot (right after the same call), after writing 4x the L2,
   and after writing 4x the L3 then re-warming the path every op shares (a few tiny adds), and the same with the
   op's own input re-read (its data warm, its code not). The L3 column less the L2 one is what
   ``host.op_cold_far_s`` prices per op (calibration: ``op_cases.op_cold_far_cases``).
2. fp32 GEMMs of one thread by shape: the rate falls for a wide output (N in the thousands: an LM head's vocabulary)
   far below the square GEMMs' rate the calibration's matrix curve holds. Not modelled yet (bench/results/
   cache_levels.md says what was measured).
3. A quarter of the L3 re-read after sleeping: where other tenants' cores share the L3, what this process left there
   decays with time (``host.l3_residency_s``, calibration: ``op_cases.l3_residency_cases``).

    OMP_NUM_THREADS=1 python bench/cache_levels.py [--out bench/results/cache_levels.md]

Process CPU time, one intra-op thread, medians of 15 calls (GEMMs: 5); about a minute.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from perfcheck.calibrate.cases import cache_bytes  # noqa: E402
from perfcheck.calibrate.cold_cases import _ops  # noqa: E402

EVICT_MULTIPLE = 4
GEMMS = tuple((m, k, n) for m in (128, 512) for k in (128, 512) for n in (2048, 8192, 32768)) + (
    (128, 128, 50257), (64, 128, 65536), (1024, 128, 16384), (256, 4096, 8192), (2048, 2048, 2048),
    (1024, 8192, 1024), (8192, 128, 128), (50257, 128, 128), (128, 50257, 128))


def _timed(fn, between=None, reps: int = 15) -> float:
    out = []
    for _ in range(reps):
        if between is not None:
            between()
        t0 = time.process_time()
        fn()
        out.append(time.process_time() - t0)
    return statistics.median(out)


def eviction_table(l2: int, l3: int) -> list:
    """Rows of table 1: (op, elements, hot us, after L2 us, after L3 us, after L3 with its data re-read us)."""
    l2_flush = torch.empty(EVICT_MULTIPLE * l2 // 4)
    l3_flush = torch.empty(EVICT_MULTIPLE * l3 // 4)
    a, b = torch.ones(4), torch.ones(4)

    def rewarm():
        for _ in range(4):
            torch.add(a, b)

    rows = []
    cases = [(label, n, (lambda fn=fn, x=x: fn(x)), x) for n in (1 << 14, 1 << 16, 1 << 18)
             for label, (fn, _, x) in _ops(n, "cpu").items()]
    cases += [(f"mm {s}^3", s ** 3, (lambda p=p, q=q: p @ q), p) for s in (32, 64, 128, 256)
              for p, q in [(torch.randn(s, s), torch.randn(s, s))]]
    for label, n, fn, x in cases:
        for _ in range(3):
            fn()
        hot = _timed(fn, fn)
        after_l2 = _timed(fn, lambda: (l2_flush.add_(1.0), rewarm()))
        after_l3 = _timed(fn, lambda: (l3_flush.add_(1.0), rewarm()))
        data_warm = _timed(fn, lambda: (l3_flush.add_(1.0), rewarm(), x.add_(0.0)))
        rows.append((label, n, hot * 1e6, after_l2 * 1e6, after_l3 * 1e6, data_warm * 1e6))
    return rows


def gemm_table() -> list:
    """Rows of table 2: (m, k, n, ms with a fresh output, GFLOP/s, GFLOP/s into a kept output, minor page faults
    per call with a fresh output, B MiB, output MiB)."""
    import resource

    rows = []
    for m, k, n in GEMMS:
        a, b, kept = torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        s = _timed(lambda: a @ b, lambda: None, reps=5)
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 5
        s_kept = _timed(lambda: torch.mm(a, b, out=kept), lambda: None, reps=5)
        flops = 2 * m * k * n
        rows.append((m, k, n, s * 1e3, flops / s / 1e9, flops / s_kept / 1e9, faults, k * n * 4 / 2 ** 20,
                     m * n * 4 / 2 ** 20))
    return rows


SLEEPS_S = (0.0, 0.001, 0.002, 0.005, 0.008, 0.02, 0.1)


def decay_table(l2: int, l3: int) -> list:
    """Rows of table 3: (sleep s, read us) for a quarter of the L3 read right after the same read and a read of 2x
    the L2, then a sleep (None: after writing 4x the L3 instead). Where other tenants' cores share the L3, data left
    there decays with time even while this process sleeps (``op_cases.l3_residency_cases`` measures the same)."""
    buf, l2_buf = torch.ones(l3 // 16), torch.ones(2 * l2 // 4)
    flush = torch.empty(EVICT_MULTIPLE * l3 // 4)
    rows = []
    for sleep in (*SLEEPS_S, None):
        def prepare(sleep=sleep):
            buf.sum()
            l2_buf.sum()
            if sleep is None:
                flush.add_(1.0)
            elif sleep:
                time.sleep(sleep)
        rows.append((sleep, _timed(buf.sum, prepare) * 1e6))
    return rows


def report(l2: int, l3: int, evict: list, gemms: list, decay: list) -> str:
    lines = ["# Cache levels: an op after an L3 eviction, and GEMMs with a wide output", "",
             f"Machine: {platform.node()} ({platform.processor() or platform.machine()}), L2 {l2 // 1024} KiB, "
             f"L3 {l3 // 2 ** 20} MiB (sysfs), torch {torch.__version__}, 1 thread, process CPU time. "
             f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. Command: "
             "`OMP_NUM_THREADS=1 python bench/cache_levels.py --out bench/results/cache_levels.md`.", "",
             f"## 1. Per call, us: hot; after writing {EVICT_MULTIPLE}x the L2; after {EVICT_MULTIPLE}x the L3 and "
             "a re-warm of the shared path; the same with the op's own input re-read", "",
             "| op | elements | hot | after L2 | after L3 | after L3, data re-read | L3 - L2 |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {o} | {n} | {h:.1f} | {c2:.1f} | {c3:.1f} | {d:.1f} | {c3 - c2:.1f} |"
              for o, n, h, c2, c3, d in evict]
    lines += ["", "## 2. fp32 GEMMs, one thread (C = A (m x k) B (k x n))", "",
              "| m | k | n | ms, fresh output | GFLOP/s | GFLOP/s, kept output | faults per call | B MiB | C MiB |",
              "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {m} | {k} | {n} | {ms:.2f} | {r:.0f} | {rk:.0f} | {f:.0f} | {bm:.1f} | {cm:.1f} |"
              for m, k, n, ms, r, rk, f, bm, cm in gemms]
    lines += ["", "Each GEMM allocates its output per call, as a training step's forward does; where the C library maps "
              "it anew, its first touch faults one page per 4 KiB (priced only from 32 MiB up, perfcheck/predict/"
              "pages.py), so part of a wide GEMM's loss can be faults and part the kernel itself."]
    lines += ["", f"## 3. A read of a quarter of the L3 ({l3 // 2 ** 22} MiB) after sleeping (us; the L3's residency)", "",
              "| sleep | read us | GB/s |", "|---|---|---|"]
    lines += [f"| {'after 4x the L3 written' if w is None else f'{w * 1e3:g} ms'} | {us:.0f} | "
              f"{l3 / 4 / (us * 1e-6) / 1e9:.1f} |" for w, us in decay]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the markdown here as well as printing it")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    l2, l3 = cache_bytes(2), cache_bytes(3)
    if l2 <= 0 or l3 <= 0:
        raise SystemExit("cache_levels: sysfs gives no L2 or L3 size on this machine")
    text = report(l2, l3, eviction_table(l2, l3), gemm_table(), decay_table(l2, l3))
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()

"""How much slower a CPU op runs when its operands are not in the core's caches, as inside a training step.

Why: calibration times each op in a tight loop, where its operands stay in L2; inside a step, the weights, the
activations saved for the backward and a layer's input after other layers ran have been evicted by everything
touched in between. On the held-out models (bench/heldout.py) the Linear class and the matrix-product-heavy
attention modules read 1.3-1.6x measured/predicted while the same GEMMs in a loop read 0.84-0.9: this script
measures the effect directly, so a model term for it can be derived from data rather than fitted to models.

Method: process CPU time, one intra-op thread, per op the median over ``--calls`` calls of two interleaved
variants in one process: ``hot`` (the call right after the same call) and ``cold`` (each call after streaming a
buffer of ``--flush-mib`` MiB, untimed: more than the per-core L2, so the operands come from the last-level cache
or memory, as after other layers' work). Ratio = cold / hot.

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python bench/cold_operands.py [--calls 31] [--flush-mib 64]
"""
from __future__ import annotations

import argparse
import datetime
import platform
import time

import torch


def cases() -> list:
    """(label, fn, bytes of operands and result) of matrix products of transformer- and MLP-size shapes, a
    strided copy, a softmax and a layer norm."""
    out = []
    for m, k, n in ((512, 128, 128), (512, 128, 384), (512, 512, 128), (64, 128, 4000), (2048, 768, 768)):
        a, b, g = torch.randn(m, k), torch.randn(k, n), torch.randn(m, n)
        nbytes = 4 * (m * k + k * n + m * n)
        out += [(f"mm {m}x{k} @ {k}x{n}", lambda a=a, b=b: a @ b, nbytes),
                (f"  grad_input {m}x{n} @ ({k}x{n})^T", lambda g=g, b=b: g @ b.t(), nbytes),
                (f"  grad_weight ({m}x{k})^T @ {m}x{n}", lambda a=a, g=g: a.t() @ g, nbytes)]
    x = torch.randn(3, 64, 8, 128).permute(1, 2, 0, 3)
    out.append(("copy of a permuted (64, 8, 3, 128)", lambda: x.contiguous(), 2 * 4 * x.numel()))
    s = torch.randn(8, 4, 64, 64)
    out.append(("softmax (8, 4, 64, 64)", lambda: torch.softmax(s, -1), 2 * 4 * s.numel()))
    h = torch.randn(512, 768)
    ln = torch.nn.LayerNorm(768)
    out.append(("layer_norm (512, 768)", lambda: torch.nn.functional.layer_norm(h, (768,), ln.weight, ln.bias),
                2 * 4 * h.numel()))
    return out


def median_s(fn, flush, calls: int) -> tuple:
    """``(hot, cold)`` medians of ``calls`` interleaved timed calls (process CPU time)."""
    hot, cold = [], []
    for i in range(calls + 3):
        fn()
        t0 = time.process_time()
        fn()
        t1 = time.process_time()
        flush.add_(1.0)
        t2 = time.process_time()
        fn()
        t3 = time.process_time()
        if i >= 3:
            hot.append(t1 - t0)
            cold.append(t3 - t2)
    hot.sort()
    cold.sort()
    return hot[len(hot) // 2], cold[len(cold) // 2]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=31)
    ap.add_argument("--flush-mib", type=int, default=64)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    flush = torch.empty(args.flush_mib << 18)
    print(f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; {platform.processor() or platform.machine()}; "
          f"torch {torch.__version__}; 1 thread; process CPU time; flush {args.flush_mib} MiB; {args.calls} calls\n")
    print("| op | operand MiB | hot us | cold us | cold / hot | extra us per MiB |")
    print("|---|---|---|---|---|---|")
    for label, fn, nbytes in cases():
        hot, cold = median_s(fn, flush, args.calls)
        mib = nbytes / 2 ** 20
        print(f"| {label} | {mib:.2f} | {hot * 1e6:.0f} | {cold * 1e6:.0f} | {cold / hot:.2f} | "
              f"{(cold - hot) * 1e6 / mib:.0f} |")


if __name__ == "__main__":
    main()

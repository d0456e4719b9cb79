"""aten.native_batch_norm_backward by plane length: CPU, one thread, process CPU time (a loop sized to ~20 ms,
median of 5). Shapes as NxCxL or NxCxHxW; prints us per call and ns per (sample, channel) plane, with all three
gradients and with the input gradient alone.

Why: the kernel's cost per plane depends on whether a plane fills one of its vectors (perfcheck.predict.batch_norm_cpu,
bench/results/cnn_backward.md). ``ATEN_CPU_CAPABILITY=avx2`` shows which build runs.

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/batch_norm_probe.py 4x256x4 4x256x8 4x512x2x2
"""
from __future__ import annotations

import sys
import time

import torch

aten = torch.ops.aten


def per_call_s(fn) -> float:
    """Process seconds per call: two warm calls, a loop of ~20 ms, the second fastest of 5 loops."""
    fn()
    fn()
    t0 = time.process_time()
    fn()
    reps = max(5, min(3000, int(0.02 / max(time.process_time() - t0, 1e-6))))
    loops = []
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(reps):
            fn()
        loops.append((time.process_time() - t0) / reps)
    return sorted(loops)[1]


def main(shapes):
    torch.set_num_threads(1)
    print(f"capability {torch.backends.cpu.get_cpu_capability()}")
    for text in shapes:
        s = tuple(int(v) for v in text.split("x"))
        n, c = s[:2]
        x, g = torch.randn(s), torch.randn(s)
        w, b, rm, rv = torch.ones(c), torch.zeros(c), torch.zeros(c), torch.ones(c)
        _, mean, invstd = aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5)
        every = per_call_s(lambda: aten.native_batch_norm_backward(g, x, w, rm, rv, mean, invstd, True, 1e-5,
                                                                   [True, True, True]))
        gx = per_call_s(lambda: aten.native_batch_norm_backward(g, x, w, rm, rv, mean, invstd, True, 1e-5,
                                                                [True, False, False]))
        print(f"{text:>12} plane {x.numel() // (n * c):5d}  {every * 1e6:8.1f} us  {every * 1e9 / (n * c):7.1f} ns/plane"
              f"  (input gradient alone {gx * 1e9 / (n * c):7.1f})")


if __name__ == "__main__":
    main(sys.argv[1:])

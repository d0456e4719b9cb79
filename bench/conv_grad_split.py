"""A 2-D convolution's forward and backward by gradient, one thread, process CPU time (second fastest of 5 loops of
~20 ms): the forward, aten.convolution_backward with both gradients, the weight gradient alone and the input gradient
alone, per shape N,C_in,H,C_out,k,stride,groups (square input and kernel, padding k // 2). Which oneDNN kernel runs
each: ``ONEDNN_VERBOSE=1`` on one call (bench/results/conv_classes.md).

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/conv_grad_split.py 4,64,16,128,1,2,1 4,576,3,576,5,1,576
"""
import sys
import time

import torch

aten = torch.ops.aten


def cpu_time(fn, loop_s: float = 0.02, min_reps: int = 3) -> float:
    """Seconds per call: the second fastest of 5 loops of ~``loop_s`` (process CPU time)."""
    fn(); fn()
    t0 = time.process_time(); fn(); one = max(time.process_time() - t0, 1e-6)
    reps = max(min_reps, min(2000, int(loop_s / one)))
    best = []
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(reps):
            fn()
        best.append((time.process_time() - t0) / reps)
    return sorted(best)[1]


def main(specs):
    torch.set_num_threads(1)
    print("| input | weight | stride | groups | fwd us | bwd both us | grad_w us | grad_x us | MACs | grad_w us per group "
          "| grad_w ns per MAC |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for spec in specs:
        n, ci, h, co, k, s, g = (int(v) for v in spec.split(","))
        p = k // 2
        x, w = torch.randn(n, ci, h, h), torch.randn(co, ci // g, k, k)
        y = torch.nn.functional.conv2d(x, w, None, s, p, 1, g)
        gy = torch.randn_like(y)

        def bwd(mask):
            return lambda: aten.convolution_backward(gy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], g, mask)
        f = cpu_time(lambda: torch.nn.functional.conv2d(x, w, None, s, p, 1, g))
        b, bw, bx = cpu_time(bwd([True, True, False])), cpu_time(bwd([False, True, False])), cpu_time(bwd([True, False, False]))
        macs = y.numel() * (ci // g) * k * k
        print(f"| {tuple(x.shape)} | {tuple(w.shape)} | {s} | {g} | {f * 1e6:.0f} | {b * 1e6:.0f} | {bw * 1e6:.0f} | "
              f"{bx * 1e6:.0f} | {macs} | {bw * 1e6 / g:.2f} | {bw * 1e9 / macs:.2f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

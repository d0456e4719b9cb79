"""The depthwise convolution's forward, input gradient and weight gradient, each alone, over channels x output pixels x
batch x kernel (3x3, 5x5, 7x7), NCHW and channels-last, one thread, process CPU time (second fastest of 5 loops of
~10 ms): the grid bench/results/depthwise_law.md fits its cost law on. Shapes are a grid (channels 32-768, 2x2-56x56
pixels, batch 1/2/8), none of them a benchmark model's layer.

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/depthwise_sweep.py out.csv [max_macs]
"""
import csv
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conv_grad_split import cpu_time as split_cpu_time  # noqa: E402

aten = torch.ops.aten
CHANNELS = (32, 128, 384, 768)
PIXELS = (2, 4, 7, 10, 14, 28, 56)
BATCHES = (1, 2, 8)
KERNELS = (3, 5, 7)


def cpu_time(fn) -> float:
    """Seconds per call: the second fastest of 5 loops of ~10 ms (process CPU time; conv_grad_split's loop)."""
    return split_cpu_time(fn, loop_s=0.01, min_reps=2)


def shapes(max_macs):
    for k in KERNELS:
        for c in CHANNELS:
            for h in PIXELS:
                for n in BATCHES:
                    for s in ((1, 2) if n == 2 and h >= 4 else (1,)):
                        ho = (h + 2 * (k // 2) - k) // s + 1
                        if n * c * ho * ho * k * k <= max_macs:
                            yield n, c, h, k, s


def time_shape(n, c, h, k, s, layout):
    mf = torch.channels_last if layout == "cl" else torch.contiguous_format
    p = k // 2
    x = torch.randn(n, c, h, h).contiguous(memory_format=mf)
    w = torch.randn(c, 1, k, k).contiguous(memory_format=mf)
    y = torch.nn.functional.conv2d(x, w, None, s, p, 1, c)
    gy = torch.randn_like(y).contiguous(memory_format=mf)

    def bwd(mask):
        return lambda: aten.convolution_backward(gy, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], c, mask)
    return (cpu_time(lambda: torch.nn.functional.conv2d(x, w, None, s, p, 1, c)),
            cpu_time(bwd([True, False, False])), cpu_time(bwd([False, True, False])), y.shape[2])


def main(out, max_macs=40e6):
    torch.set_num_threads(1)
    with open(out, "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["layout", "n", "c", "h", "k", "stride", "ho", "fwd_us", "gx_us", "gw_us"])
        for n, c, h, k, s in shapes(max_macs):
            for layout in ("nchw", "cl"):
                fw, gx, gw, ho = time_shape(n, c, h, k, s, layout)
                wr.writerow([layout, n, c, h, k, s, ho, f"{fw * 1e6:.2f}", f"{gx * 1e6:.2f}", f"{gw * 1e6:.2f}"])
                f.flush()


if __name__ == "__main__":
    main(sys.argv[1], *(float(a) for a in sys.argv[2:]))

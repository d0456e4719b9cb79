"""Why a small memory-bound kernel runs slower inside a training step than in a tight loop: one kernel, several
preludes.

The kernel under test (a layer norm's forward, ``aten.native_layer_norm``, or a residual ``aten.add``, at
nn_encoder's activation shape 8x64x128 fp32 = 256 KiB) is timed alone (process CPU clock around the one call), each
call after an untimed prelude that sets up one suspected cause:

- ``tight``: nothing: the previous call was the same kernel on the same operands (calibration's loop).
- ``gemm_l1``: a GEMM on unrelated operands that fit in L1 (64x64x64, repeated to ~150 us): AVX-512 heavy, touches
  48 KiB: the frequency license and a code switch, not the L2 (hypothesis c, with b).
- ``spin``: a Python loop of about the same CPU time (no vector work; the interpreter's own code and data);
  ``spin_short``: a tenth of it (about a module call's Python).
- ``add_tiny``: one elementwise op on unrelated 4 KiB tensors: only a kernel switch (hypothesis b).
- ``evict``: a copy of 8 MiB (4x the L2) on unrelated buffers: data and code evicted, no FMA work.
- ``gemm_l2``: a GEMM on unrelated operands that evict the L2 (3 MiB; 512x512x512): hypothesis a, the operands gone.
- ``mix``: a small CNN's forward and backward on 2x3x16x16 (about 40 distinct ops, module calls, autograd; a
  few hundred KiB of data): the code and branch state of a step without its data (hypothesis b);
  ``mix_written``: then ``written``.
- ``written``: the input is a fresh tensor the op before just wrote (x + 0); the kernel reads it (hypothesis a, hot).
- ``evict_written``: ``evict``, then ``written``: the step's pattern (the L2 flushed since the op's last call, its
  input just written by the op before).
- ``fresh``: the outputs are held (as a step holds its activations), so each call's output is a block the allocator
  last handed out a round ago, not the one just freed (hypothesis d); minor page faults counted.
- ``step``: a linear (128->128, fresh output) and ``written``'s add before the kernel, outputs held: the step's
  sequence.

The conditions are interleaved round by round, medians over all calls; the same timer pair in every condition, so
its overhead cancels in the differences.

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/instep_rates.py [--rounds 15] [--calls 10]
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

SHAPE = (8, 64, 128)


def _spin(n):
    s = 0
    for i in range(n):
        s += i
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--kernels", default="layer_norm,add,layer_norm_bwd,layer_norm_small,add_small")
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*SHAPE, generator=g)
    y = torch.randn(*SHAPE, generator=g)
    w, b = torch.randn(SHAPE[-1], generator=g), torch.randn(SHAPE[-1], generator=g)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [SHAPE[-1]], w, b, 1e-5)
    a1, b1 = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
    a2, b2 = torch.randn(512, 512, generator=g), torch.randn(512, 512, generator=g)
    t1, t2 = torch.randn(1024, generator=g), torch.randn(1024, generator=g)
    big_src, big_dst = torch.randn(2 ** 21, generator=g), torch.empty(2 ** 21)
    lw, lb = torch.randn(128, 128, generator=g), torch.randn(128, generator=g)
    kernels = {
        "layer_norm": lambda inp: torch.ops.aten.native_layer_norm(inp, [SHAPE[-1]], w, b, 1e-5)[0],
        "add": lambda inp: torch.ops.aten.add(inp, y),
        "layer_norm_bwd": lambda inp: torch.ops.aten.native_layer_norm_backward(
            inp, x, [SHAPE[-1]], mean, rstd, w, b, [True, True, True])[0],
        # the same calls on 4x128 elements (2 KiB): almost all of their time is the call's host code (dispatch,
        # TensorIterator, the kernel's setup): a prelude's effect on it is the code side (b), not the data side
        "layer_norm_small": lambda inp: torch.ops.aten.native_layer_norm(inp[0, :4], [SHAPE[-1]], w, b, 1e-5)[0],
        "add_small": lambda inp: torch.ops.aten.add(inp[0, :4], y[0, :4]),
    }
    held = []
    # a different model's step on small tensors: many distinct ops, modules, autograd nodes, little data
    mix_model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                    torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 7 * 7, 32),
                                    torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 10),
                                    torch.nn.LogSoftmax(-1))
    mix_in = torch.randn(2, 3, 16, 16, generator=g)

    def mix():
        mix_model(mix_in).sum().backward()
        mix_model.zero_grad(set_to_none=True)

    def gemm_l1():
        for _ in range(60):
            torch.mm(a1, b1)

    def gemm_l2():
        torch.mm(a2, b2)

    spin_n = 0
    t0 = time.process_time()
    gemm_l1()
    dt = time.process_time() - t0
    t0 = time.process_time()
    _spin(100000)
    spin_n = int(100000 * dt / max(time.process_time() - t0, 1e-9))

    preludes = {
        "tight": lambda: x,
        "gemm_l1": lambda: (gemm_l1(), x)[1],
        "spin": lambda: (_spin(spin_n), x)[1],
        "spin_short": lambda: (_spin(spin_n // 10), x)[1],
        "add_tiny": lambda: (torch.add(t1, t2), x)[1],
        "evict": lambda: (big_dst.copy_(big_src), x)[1],
        "gemm_l2": lambda: (gemm_l2(), x)[1],
        "mix": lambda: (mix(), x)[1],
        "mix_written": lambda: (mix(), torch.ops.aten.add(x, 0.0))[1],
        "written": lambda: torch.ops.aten.add(x, 0.0),
        "evict_written": lambda: (big_dst.copy_(big_src), torch.ops.aten.add(x, 0.0))[1],
        "fresh": lambda: x,
        "step": lambda: (held.append(torch.addmm(lb, x.view(-1, 128), lw)), torch.ops.aten.add(x, held[-1].view(SHAPE)))[1],
    }
    names = [k for k in args.kernels.split(",")]
    samples = {(k, c): [] for k in names for c in preludes}
    faults = {(k, c): 0 for k in names for c in preludes}
    for _ in range(2):  # warm-up round, also raises glibc's mmap threshold past these blocks
        for k in names:
            for c, pre in preludes.items():
                kernels[k](pre())
    for _ in range(args.rounds):
        for k in names:
            for c, pre in preludes.items():
                keep = c in ("fresh", "step")
                for _ in range(args.calls):
                    inp = pre()
                    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    t0 = time.process_time_ns()
                    out = kernels[k](inp)
                    t1_ = time.process_time_ns()
                    faults[(k, c)] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
                    samples[(k, c)].append((t1_ - t0) / 1e3)
                    if keep:
                        held.append(out)
                    del out, inp
                held.clear()
    n = args.rounds * args.calls
    print(f"torch {torch.__version__}, shape {SHAPE}, {args.rounds} rounds x {args.calls} calls, medians in us "
          f"(ratio to tight; minor faults per call)")
    print("| kernel | " + " | ".join(preludes) + " |")
    print("|---|" + "---|" * len(preludes))
    for k in names:
        base = statistics.median(samples[(k, "tight")])
        cells = []
        for c in preludes:
            m = statistics.median(samples[(k, c)])
            cells.append(f"{m:.1f} ({m / base:.2f}; {faults[(k, c)] / n:.1f})")
        print(f"| {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

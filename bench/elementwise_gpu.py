"""Achieved memory bandwidth of PyTorch's eager elementwise kernels on a GPU, contiguous against broadcast and strided.

Why (issue 23): a torchtitan Llama block measured on an H200 (bench/layer_gpu.py) spent 1.4-1.6x the time the spec's
one memory efficiency (0.88 of the HBM bandwidth) gives its elementwise kernels, while its plain copies and
activations ran near 0.88. PyTorch's CUDA loops (aten/src/ATen/native/cuda/CUDALoops.cuh, ``gpu_kernel_impl``) take
the vectorised kernel (``vectorized_elementwise_kernel``: 16-byte loads, no index arithmetic) only when every
operand is contiguous; an operand with a zero stride (a broadcast row statistic, a weight, a rotary table) or any
other stride sends the op to ``elementwise_kernel`` / ``unrolled_elementwise_kernel``, which computes each element's
offsets through ``OffsetCalculator`` (an integer divide and modulo per dimension per operand) and loads one element at
a time. This times each pattern the eager Llama code runs, at its shapes, with CUDA events.

Per case: bytes moved (each operand read once, the output written once; a broadcast operand's distinct bytes), median
of ``--iters`` timed calls after 3 warm-up calls, achieved bytes/s and its fraction of the card's datasheet bandwidth
(``--bandwidth``, default the h200 spec's). Writes ``<csv>``.

    python bench/elementwise_gpu.py --system h200 --csv elementwise.csv     # on the GPU machine
    python bench/elementwise_gpu.py --device cpu --tiny                      # a dry run here
    python bench/elementwise_gpu.py --softmax --csv softmax.csv              # + softmax by row length, dtype, phase
    python bench/elementwise_gpu.py --inplace --csv inplace.csv              # + in-place against a copy, by size
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from perfcheck.hardware.systems import load_system  # noqa: E402
from perfcheck.predict.aten_costs import TensorMeta, softmax_class  # noqa: E402


def cases(T: int, D: int, device):
    """(name, path, fn, bytes): ``path`` is the loop PyTorch's CUDA code takes: vectorized (all contiguous),
    strided (a zero-stride or permuted operand). T rows (tokens) of D columns, as one Llama layer's activations."""
    bf, f32 = torch.bfloat16, torch.float32
    x16 = torch.randn(T, D, device=device, dtype=bf)
    y16 = torch.randn(T, D, device=device, dtype=bf)
    x32 = torch.randn(T, D, device=device, dtype=f32)
    row = torch.randn(T, 1, device=device, dtype=f32)
    w16 = torch.randn(D, device=device, dtype=bf)
    hd = 128
    xc = torch.randn(T, D // hd, hd // 2, device=device, dtype=torch.complex64)
    table = torch.randn(T, 1, hd // 2, device=device, dtype=torch.complex64)
    kv = torch.randn(1, T, D // hd // 4, hd, device=device, dtype=bf)  # 4 query heads per K/V head
    heads = torch.randn(1, D // hd, T, hd, device=device, dtype=bf)
    n = T * D
    return [
        ("silu bf16", "vectorized", lambda: torch.nn.functional.silu(x16), 4 * n),
        ("add bf16", "vectorized", lambda: x16 + y16, 6 * n),
        ("cast fp32->bf16", "vectorized", lambda: x32.to(bf), 6 * n),
        ("cast bf16->fp32", "vectorized", lambda: x16.float(), 6 * n),
        ("mul fp32", "vectorized", lambda: x32 * x32, 8 * n),
        ("mul fp32 by a row (T,1)", "strided", lambda: x32 * row, 8 * n + 4 * T),
        ("mul bf16 by a weight (D,)", "strided", lambda: x16 * w16, 4 * n + 2 * D),
        ("complex mul by a table", "strided", lambda: xc * table, 16 * xc.numel() + 8 * table.numel()),
        ("repeat_kv expand+reshape copy", "strided",
         lambda: kv.unsqueeze(3).expand(1, T, kv.shape[2], 4, hd).reshape(1, T, -1, hd), 2 * kv.numel() + 2 * n),
        ("transpose(1,2).contiguous()", "strided", lambda: heads.transpose(1, 2).contiguous(), 4 * n),
        ("mean fp32 over rows (-1)", "reduction", lambda: x32.mean(-1, keepdim=True), 4 * n + 4 * T),
        ("sum bf16 over tokens (0)", "reduction", lambda: x16.sum(0), 2 * n + 2 * D),
    ]


def megatron_cases(device):
    """Kernels of a Megatron GPT layer that are not GEMMs, fp16, at Korthikanti et al.'s 22B shapes per GPU (micro-batch
    4, 2048 tokens, 64 heads / tp 8 = 8 heads; hidden 6144): the attention probabilities' softmax and dropout
    (4 x 8 x 2048 x 2048 elements), LayerNorm and GELU on the hidden states. ``path`` "rng": dropout draws Philox
    random numbers per element (is it bound by its bytes or by the draws?)."""
    f16 = torch.float16
    scores = torch.randn(4 * 8 * 2048, 2048, device=device, dtype=f16)
    hid = torch.randn(4 * 2048, 6144, device=device, dtype=f16)
    ffn = torch.randn(4 * 2048 // 8, 4 * 6144, device=device, dtype=f16)
    ln = torch.nn.LayerNorm(6144, device=device, dtype=f16)
    n, h, g = scores.numel(), hid.numel(), ffn.numel()
    drop = torch.nn.functional.dropout
    return [
        ("dropout p=0.1 fp16 (scores)", "rng", lambda: drop(scores, 0.1, True), 5 * n),  # x, out, uint8 mask
        ("copy fp16 (scores)", "vectorized", lambda: scores.clone(), 4 * n),
        ("softmax fp16 (scores rows)", "row", lambda: torch.softmax(scores, -1), 4 * n),
        ("dropout p=0.1 fp16 (hidden)", "rng", lambda: drop(hid, 0.1, True), 5 * h),
        ("layer_norm fp16 (hidden)", "row", lambda: ln(hid), 4 * h),
        ("gelu tanh fp16 (ffn)", "vectorized", lambda: torch.nn.functional.gelu(ffn, approximate="tanh"), 4 * g),
    ]


#: Row lengths of ``softmax_cases``: both sides of CUDA's one-warp limit (1024 elements, 4096 bytes:
#: ``aten_costs.softmax_class``) and the long rows of unfused attention and of a loss over a vocabulary.
SOFTMAX_COLS = (256, 512, 1024, 2048, 4096, 8192, 32768)


def softmax_cases(device, elements: int):
    """torch's softmax over rows of ``SOFTMAX_COLS`` columns (``elements`` in all), forward and backward
    (``aten._softmax_backward_data``: reads the output and its gradient, writes the input's), fp16, bf16 and fp32:
    what ``softmax_block`` and the one-warp kernel each run at, per phase and dtype (the specs hold the forward's
    rate at 2048 fp16 columns only; the backward reads it by fallback). ``path``: "block" where
    ``aten_costs.softmax_class`` says so, else "warp"."""
    out = []
    for dtype, name in ((torch.float16, "fp16"), (torch.bfloat16, "bf16"), (torch.float32, "fp32")):
        eb = torch.empty((), dtype=dtype).element_size()
        for cols in SOFTMAX_COLS:
            x = torch.randn(max(elements // cols, 1), cols, device=device, dtype=dtype)
            y, g = torch.softmax(x, -1), torch.randn_like(x)
            block = softmax_class(TensorMeta((x.shape[0], cols), eb, True, True), -1) == "softmax_block"
            path = "block" if block else "warp"
            n = x.numel()
            out += [(f"softmax fwd {name} {cols} cols", path, lambda x=x: torch.softmax(x, -1), 2 * eb * n),
                    (f"softmax bwd {name} {cols} cols", path,
                     lambda y=y, g=g, dtype=dtype: torch.ops.aten._softmax_backward_data(g, y, -1, dtype), 3 * eb * n)]
    return out


INPLACE_MIB = (1, 4, 16, 64, 256, 1024)


def inplace_cases(device, mib_sizes):
    """A copy, an out-of-place add, and the in-place ``add_`` and ``mul_`` over fp32 buffers of ``mib_sizes`` MiB,
    bytes as counted (each operand read once, the output written once). ``predict.write_allocate`` prices in-place
    kernels at 1.5x a copy's counted rate on a calibrated CPU (a copy's store reads the line it overwrites first)
    and at the copy's rate elsewhere, a GPU included: this is the GPU's side of that claim."""
    out = []
    for mib in mib_sizes:
        n = mib * (1 << 20) // 4
        a, b, c = (torch.randn(n, device=device) for _ in range(3))
        out += [(f"copy {mib} MiB", "copy", lambda a=a, b=b: a.copy_(b), 8 * n),
                (f"add out= {mib} MiB", "out-of-place", lambda a=a, b=b, c=c: torch.add(a, b, out=c), 12 * n),
                (f"add_ {mib} MiB", "in-place", lambda a=a, b=b: a.add_(b), 12 * n),
                (f"mul_ {mib} MiB", "in-place", lambda a=a: a.mul_(1.0), 8 * n)]
    return out


def measure(rows: list, tag: str, case_list, args, device, bw, T: int = 0, D: int = 0) -> None:
    """Time each (name, path, fn, bytes) case, append its row to ``rows`` (``T``, ``D``: the Llama cases' shape)
    and print one EW line."""
    for name, path, fn, nbytes in case_list:
        s = time_case(fn, args.iters, device)
        rows.append(dict(case=name, path=path, T=T, D=D, bytes=nbytes, seconds=s, bytes_per_s=nbytes / s,
                         fraction=nbytes / s / bw))
        print(f"EW {tag} {path:12} {name:30} {s * 1e6:9.1f} us {nbytes / s / 1e12:6.2f} TB/s "
              f"{nbytes / s / bw:5.2f} of {args.system}", flush=True)


def time_case(fn, iters: int, device) -> float:
    for _ in range(3):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for a, b in ev:
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        return statistics.median(a.elapsed_time(b) / 1e3 for a, b in ev)
    out = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--system", default="h200", help="spec whose mem_bandwidth_bytes_per_s the fraction is of")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--csv", default="elementwise.csv")
    ap.add_argument("--megatron", action="store_true", help="also a Megatron layer's dropout, softmax, LayerNorm, GELU")
    ap.add_argument("--softmax", action="store_true", help="also softmax forward and backward by row length and dtype")
    ap.add_argument("--inplace", action="store_true", help="also in-place add_/mul_ against a copy and add(out=)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    bw = load_system(args.system).mem_bandwidth_bytes_per_s
    shapes = [(64, 512)] if args.tiny else [(8192, 4096), (8192, 8192), (4096, 1024)]
    rows = []
    if device.type == "cuda":
        print("device", torch.cuda.get_device_name(), "torch", torch.__version__, "bandwidth of", args.system,
              f"{bw / 1e12:.2f} TB/s", flush=True)
    for T, D in shapes:
        measure(rows, f"{T}x{D}", cases(T, D, device), args, device, bw, T, D)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    with torch.no_grad():
        if args.megatron and not args.tiny:
            measure(rows, "megatron", megatron_cases(device), args, device, bw)
        if args.softmax:
            measure(rows, "softmax", softmax_cases(device, 1 << (12 if args.tiny else 27)), args, device, bw)
        if args.inplace:
            measure(rows, "inplace", inplace_cases(device, (1, 4) if args.tiny else INPLACE_MIB), args, device, bw)
    df = pd.DataFrame(rows)
    df.to_csv(args.csv, index=False)
    big = df[(df["bytes"] >= df["bytes"].max() / 8) & (df["T"] > 0)]
    for path, g in big.groupby("path"):
        print(f"EWPATH {path}: median fraction {g.fraction.median():.3f} over {len(g)} cases "
              f"(min {g.fraction.min():.3f}, max {g.fraction.max():.3f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

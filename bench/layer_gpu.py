"""One Llama block as torchtitan's eager code runs it, measured on a GPU: forward and backward time and the kernel table.

Why (issue 23): the torchtitan rows of bench/published_runs.py are all predicted too fast (4.7% mean, 8 of 8). The
front-end prices a torchtitan layer from its GEMMs (the spec's shape curve), the attention kernel (FlashAttention-2's
published rate) and the eager elementwise kernels (``predict/eager_ops.py``). This measures the same layer on the card
at hand, so each of those three can be checked against a kernel table rather than against the published rows.

The block is written here from torchtitan's ``models/llama/model.py`` and ``models/norms.py`` (commit 1ea476e9f,
April 2024, the commit of its published A100 table): RMSNorm in fp32 as Python ops, rotary embedding through
``view_as_complex``, grouped-query K/V repeated by expand + reshape, ``F.scaled_dot_product_attention(is_causal=True)``,
the output's transpose copy, SwiGLU ``w2(silu(w1 x) * w3 x)``, no biases; parameters and activations in bf16 (FSDP2's
``MixedPrecisionPolicy(param_dtype=bf16)`` runs the block's compute in bf16). Shapes: the published rows' (Llama 3 8B
and 70B at 8192 tokens, batch 1; Llama 2 13B at 4096 tokens, batch 2).

Method: per shape, 3 warm-up iterations, then ``--iters`` iterations timed with CUDA events (forward; backward of
the output with a fixed random gradient), medians; one more iteration under ``torch.profiler`` for the kernel table
(per kernel name: calls and device time, and a class: gemm, attention, elementwise/reduction). ``--sustain S``:
the first shape run back to back for S seconds (the clock's fall under a sustained load, as the h100-sxm spec's
``matrix_sustained`` was measured). Writes ``<csv>`` (one row per shape and phase) and ``<csv>.kernels.csv``.

    python bench/layer_gpu.py --csv layers.csv --sustain 20       # on the GPU machine
    python bench/layer_gpu.py --device cpu --tiny --iters 1        # a dry run here
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    name: str
    dim: int
    heads: int
    kv_heads: int
    ffn: int
    seq: int
    batch: int


SHAPES = (  # the published torchtitan rows (bench/data/torchtitan_runs.csv) and configs/models/*.json
    Shape("llama3-8b", 4096, 32, 8, 14336, 8192, 1),
    Shape("llama2-13b", 5120, 40, 40, 13824, 4096, 2),
    Shape("llama3-70b", 8192, 64, 8, 28672, 8192, 1),
)
TINY = (Shape("tiny", 64, 4, 2, 160, 32, 2),)


class RMSNorm(nn.Module):
    """torchtitan's RMSNorm: fp32 Python ops, cast back, scaled by the weight."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotary(x, freqs):
    """Rotary embedding through complex numbers in fp32, cast back to x's dtype."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs.view(1, x.shape[1], 1, -1)).flatten(3).type_as(x)


class Block(nn.Module):
    """A Llama block as torchtitan's eager model computes it (no biases, GQA, SwiGLU)."""

    def __init__(self, s: Shape):
        super().__init__()
        self.s, self.hd = s, s.dim // s.heads
        self.wq = nn.Linear(s.dim, s.heads * self.hd, bias=False)
        self.wk = nn.Linear(s.dim, s.kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(s.dim, s.kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(s.heads * self.hd, s.dim, bias=False)
        self.w1 = nn.Linear(s.dim, s.ffn, bias=False)
        self.w2 = nn.Linear(s.ffn, s.dim, bias=False)
        self.w3 = nn.Linear(s.dim, s.ffn, bias=False)
        self.attention_norm, self.ffn_norm = RMSNorm(s.dim), RMSNorm(s.dim)

    def attention(self, x, freqs):
        b, t, _ = x.shape
        q = rotary(self.wq(x).view(b, t, -1, self.hd), freqs)
        k = rotary(self.wk(x).view(b, t, -1, self.hd), freqs)
        v = self.wv(x).view(b, t, -1, self.hd)
        rep = self.s.heads // self.s.kv_heads
        if rep > 1:  # repeat_kv: expand then reshape (a copy)
            k = k.unsqueeze(3).expand(b, t, k.shape[2], rep, self.hd).reshape(b, t, -1, self.hd)
            v = v.unsqueeze(3).expand(b, t, v.shape[2], rep, self.hd).reshape(b, t, -1, self.hd)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(o.transpose(1, 2).contiguous().view(b, t, -1))

    def forward(self, x, freqs):
        h = x + self.attention(self.attention_norm(x), freqs)
        z = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(z)) * self.w3(z))


def freqs_cis(head_dim, seq, device, theta=500000.0):
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device)[: head_dim // 2].float() / head_dim)
    ang = torch.outer(torch.arange(seq, device=device).float(), inv)
    return torch.polar(torch.ones_like(ang), ang)


class Timer:
    """CUDA events on the current stream (process clock on a CPU dry run)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def span_s(self, a, b):
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


def kernel_class(name: str) -> str:
    """gemm / attention / elementwise by the kernel's name. cuDNN's fused attention launches auxiliary kernels
    beside its fprop/bprop (``cudnn::fusion::compute_dot_do_o_specialized``: the backward's rowwise dO . O,
    ``convert_dq_to_16bits``: dQ's fp32 accumulator to bf16): they are attention's work, classed with it; a block
    of this benchmark runs no other cuDNN kernel."""
    n = name.lower()
    if "flash" in n or "fmha" in n or "attention" in n or "sdpa" in n or n.startswith("void cudnn::fusion::"):
        return "attention"
    if any(k in n for k in ("gemm", "cutlass", "sm90_xmma", "sm80_xmma", "nvjet", "ampere_", "hopper_", "cublas")):
        return "gemm"
    return "elementwise"


def measure(s: Shape, device, dtype, iters: int, clock: Timer, sustain_s: float = 0.0):
    torch.manual_seed(0)
    block = Block(s).to(device=device, dtype=dtype)
    x = torch.randn(s.batch, s.seq, s.dim, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)
    freqs = freqs_cis(s.dim // s.heads, s.seq, device)

    def once():
        a = clock.mark()
        out = block(x, freqs)
        b = clock.mark()
        out.backward(grad)
        c = clock.mark()
        block.zero_grad(set_to_none=True)
        x.grad = None
        return a, b, c

    for _ in range(3):
        once()
    clock.sync()
    marks = [once() for _ in range(iters)]
    clock.sync()
    fwd = [clock.span_s(a, b) for a, b, _ in marks]
    bwd = [clock.span_s(b, c) for _, b, c in marks]
    rows = [dict(shape=s.name, phase=p, seconds=statistics.median(v), min_s=min(v), max_s=max(v), iters=len(v))
            for p, v in (("forward", fwd), ("backward", bwd))]
    kernels = kernel_table(s, once, device)
    sustained = []
    if sustain_s > 0:
        t_end, t0 = time.perf_counter() + sustain_s, time.perf_counter()
        while time.perf_counter() < t_end:
            a, _, c = once()
            clock.sync()
            sustained.append(dict(shape=s.name, t_s=time.perf_counter() - t0, step_s=clock.span_s(a, c)))
    del block, x, grad
    return rows, kernels, sustained


def kernel_table(s: Shape, once, device) -> list:
    if device.type != "cuda":
        return []
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        once()
        torch.cuda.synchronize()
    out = []
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t > 0 and ev.count > 0:
            out.append(dict(shape=s.name, kernel=ev.key[:160], calls=ev.count, seconds=t / 1e6, klass=kernel_class(ev.key)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="one tiny shape (a dry run)")
    ap.add_argument("--shapes", default=None, help="comma-separated subset of " + ",".join(s.name for s in SHAPES))
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--sustain", type=float, default=0.0, help="seconds of back-to-back steps on the first shape")
    ap.add_argument("--csv", default="layers.csv")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes = TINY if args.tiny else tuple(s for s in SHAPES if not args.shapes or s.name in args.shapes.split(","))
    clock = Timer(device)
    if device.type == "cuda":
        print("device", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    rows, kernels, sustained = [], [], []
    for i, s in enumerate(shapes):
        try:
            r, k, su = measure(s, device, dtype, args.iters, clock, args.sustain if i == 0 else 0.0)
        except torch.OutOfMemoryError as exc:
            print(f"LAYER {s.name} out of memory: {exc}".splitlines()[0], flush=True)
            continue
        rows += r
        kernels += k
        sustained += su
        f, b = r[0]["seconds"], r[1]["seconds"]
        by = pd.DataFrame(k).groupby("klass")["seconds"].sum().to_dict() if k else {}
        print(f"LAYER {s.name} fwd {f * 1e3:.2f} ms bwd {b * 1e3:.2f} ms | kernels "
              + " ".join(f"{c} {v * 1e3:.2f} ms" for c, v in sorted(by.items())), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    pd.DataFrame(rows).to_csv(args.csv, index=False)
    pd.DataFrame(kernels).to_csv(args.csv + ".kernels.csv", index=False)
    if sustained:
        su = pd.DataFrame(sustained)
        su.to_csv(args.csv + ".sustained.csv", index=False)
        first = su[su.t_s <= 1.0].step_s.median()
        last = su[su.t_s >= su.t_s.max() - 5.0].step_s.median()
        print(f"SUSTAIN {shapes[0].name} first second {first * 1e3:.2f} ms, last 5 s {last * 1e3:.2f} ms, "
              f"ratio {first / last:.3f} over {su.t_s.max():.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How much of its rate a kernel keeps while a collective-like copy runs beside it on one GPU.

Why: at scale, collectives run beside compute on other streams (Megatron's asynchronous column-parallel backward,
FSDP2's prefetched all-gathers and reduce-scatters). perfcheck prices that with
``efficiency.matrix_beside_collective`` (``predict.collectives.beside_compute_s``): the compute keeps
(SMs - channels) / SMs of its rate, because NCCL runs one CTA per channel and a GEMM's CTAs do not share an SM
with it. The HBM the collective reads and writes is not modelled. This benchmark measures both on one GPU, with
no second GPU needed: NCCL's kernels are stood in for by a persistent copy kernel of ``k`` CTAs (512 threads
each, as NCCL's), which holds k SMs and moves HBM bytes at a rate set by its block size (bytes in flight per
CTA); a real collective additionally sends over NVLink, which this does not model.

Measured per victim kernel (bf16 GEMMs of transformer shapes, and a memory-bound add as the HBM-bound case):
  alone:   the victim loop's time t0 (CUDA events), the copier's bandwidth alone at each (k, block);
  beside:  the copier launched first on a side stream and sized to outlast the victim loop, then the loop on the
           main stream (after a 50 us device sleep, so the copier's CTAs are resident first): time t1;
           rate kept = t0 / t1; the copier's bandwidth beside it; and whether it outlasted the loop.
  model:   (SMs - k) / SMs, the SM-count rule the A100 spec's 0.778 uses.
Interleaved repeats (alone and beside alternate), medians. Writes a CSV (``--csv``) and prints a table.

    python bench/gemm_beside_copy.py --csv beside.csv          # on the GPU machine (needs triton), ~30 s
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import pandas as pd
import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the GPU machine has triton; here the module still imports for --help
    triton = None

if triton is not None:
    @triton.jit
    def _copier(src, dst, n, passes, iters, BLOCK: tl.constexpr):
        """Persistent copy: program i copies blocks i, i + k, i + 2k, ... (``iters`` of them, the last ones
        masked past the end) of src into dst, ``passes`` times."""
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        for _ in range(passes):
            for j in range(iters):
                offs = (pid + j * nprog) * BLOCK + tl.arange(0, BLOCK)
                m = offs < n
                tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)


def copy_kernel(src, dst, ctas: int, block: int, passes: int):
    iters = -(-src.numel() // (block * ctas))
    _copier[(ctas,)](src, dst, src.numel(), passes, iters, BLOCK=block, num_warps=16)


#: Victims: name -> (M, K, N) bf16 GEMMs (tokens x in -> out) of the layers collectives run beside
#: (Llama-style attention projection and FFN, a tp-8 175B-style column-parallel fc1, the 8192^3 product);
#: "add" is a memory-bound elementwise add of three 256 MiB bf16 tensors (the HBM-bound case).
VICTIMS = {"gemm 8192x8192x8192": (8192, 8192, 8192), "gemm 16384x4096x4096": (16384, 4096, 4096),
           "gemm 8192x4096x14336": (8192, 4096, 14336), "gemm 2048x12288x6144": (2048, 12288, 6144),
           "add 3x256MiB": None}


def victim(name, dev, reps):
    """A callable running the victim ``reps`` times, and its FLOPs and bytes per run."""
    shape = VICTIMS[name]
    if shape is None:
        n = 128 * 2**20
        a, b, c = (torch.randn(n, device=dev, dtype=torch.bfloat16) for _ in range(3))
        return (lambda: [torch.add(a, b, out=c) for _ in range(reps)]), 0.0, 3.0 * 2 * n
    m, k, n = shape
    x, w = torch.randn(m, k, device=dev, dtype=torch.bfloat16), torch.randn(k, n, device=dev, dtype=torch.bfloat16)
    out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    return (lambda: [torch.mm(x, w, out=out) for _ in range(reps)]), 2.0 * m * k * n, 2.0 * (m * k + k * n + m * n)


def timed(fn, side=None):
    """Seconds of ``fn`` on the current stream; with ``side`` (a callable launching the copier on a side
    stream first), also the copier's seconds and whether it ended after ``fn``."""
    main = torch.cuda.current_stream()
    start = torch.cuda.Event(enable_timing=True)
    start.record(main)
    res = {}
    if side is not None:
        s2 = torch.cuda.Stream()
        s2.wait_event(start)
        c0, c1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(s2):
            c0.record()
            side()
            c1.record()
        torch.cuda._sleep(100_000)  # ~50 us at 2 GHz: the copier's CTAs are resident before the victim's
    v0, v1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    v0.record(main)
    fn()
    v1.record(main)
    torch.cuda.synchronize()
    res["victim_s"] = v0.elapsed_time(v1) / 1e3
    if side is not None:
        res["copy_s"] = c0.elapsed_time(c1) / 1e3
        res["copy_outlasted"] = bool(start.elapsed_time(c1) >= start.elapsed_time(v1))
        res["copy_started_first"] = bool(start.elapsed_time(c0) <= start.elapsed_time(v0))
    return res


def run(args):
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    n = args.copy_mib * 2**20 // 2
    src = torch.randn(n, device=dev, dtype=torch.bfloat16)
    for ctas, block in ((3, 1024), (7, 8192)):  # every element copied (poisoned first), a ragged tail included
        dst = torch.full((n - 12345,), float("nan"), device=dev, dtype=torch.bfloat16)
        copy_kernel(src[:n - 12345], dst, ctas, block, 2)
        assert torch.equal(src[:n - 12345], dst), f"copy kernel wrong at {ctas} CTAs, block {block}"
    dst = torch.empty_like(src)
    rows = []
    for ctas in args.ctas:  # the copier alone: bandwidth per (k, block)
        for block in args.blocks:
            copy_kernel(src, dst, ctas, block, 1)
            t = [timed(lambda: copy_kernel(src, dst, ctas, block, 2))["victim_s"] for _ in range(3)]
            bw = 2 * 2 * src.numel() * 2 / float(np.median(t))
            rows.append({"victim": "(copier alone)", "ctas": ctas, "block": block, "copy_bw_Bps": bw,
                         "copy_alone_s_per_pass": float(np.median(t)) / 2})
    alone_bw = {(r["ctas"], r["block"]): r["copy_bw_Bps"] for r in rows}
    for name in VICTIMS:
        fn, flops, nbytes = victim(name, dev, args.reps)
        fn()
        t_alone = timed(fn)["victim_s"]
        for ctas in args.ctas:
            for block in args.blocks:
                per_pass = 2 * 2 * src.numel() / alone_bw[(ctas, block)]
                passes = max(1, int(np.ceil(2.5 * t_alone / per_pass)))  # outlasts the victim even if slowed 2.5x
                side = lambda c=ctas, b=block, p=passes: copy_kernel(src, dst, c, b, p)  # noqa: E731
                alone, beside, info = [], [], []
                for _ in range(args.repeats):  # interleaved: alone, beside, alone, beside ...
                    alone.append(timed(fn)["victim_s"])
                    r = timed(fn, side)
                    beside.append(r["victim_s"])
                    info.append(r)
                t0, t1 = float(np.median(alone)), float(np.median(beside))
                copy_s = float(np.median([r["copy_s"] for r in info]))
                rows.append({"victim": name, "ctas": ctas, "block": block, "sms": sms, "reps": args.reps,
                             "victim_alone_s": t0, "victim_beside_s": t1, "rate_kept": t0 / t1,
                             "sm_rule": (sms - ctas) / sms, "victim_tflops_alone": flops * args.reps / t0 / 1e12,
                             "victim_TBps_alone": nbytes * args.reps / t0 / 1e12,
                             "copy_bw_alone_Bps": alone_bw[(ctas, block)],
                             "copy_bw_beside_Bps": 2 * 2 * src.numel() * passes / copy_s,
                             "copy_outlasted": all(r["copy_outlasted"] for r in info),
                             "copy_started_first": all(r["copy_started_first"] for r in info),
                             "spread_alone": (max(alone) - min(alone)) / t0})
        print(f"{name}: done", file=sys.stderr, flush=True)
    return pd.DataFrame(rows)


def table(df: pd.DataFrame) -> str:
    lines = ["| victim | CTAs | block | copier alone GB/s | rate kept | SM rule | copier beside GB/s | outlasted |",
             "|---|---|---|---|---|---|---|---|"]
    for r in df[df["victim"] != "(copier alone)"].itertuples():
        lines.append(f"| {r.victim} | {r.ctas} | {r.block} | {r.copy_bw_alone_Bps / 1e9:.0f} | {r.rate_kept:.3f} | "
                     f"{r.sm_rule:.3f} | {r.copy_bw_beside_Bps / 1e9:.0f} | {r.copy_outlasted} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ctas", type=lambda s: [int(x) for x in s.split(",")], default=[8, 16, 24, 32, 64])
    ap.add_argument("--blocks", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 8192],
                    help="elements per CTA per iteration (bf16): the copier's bytes in flight, hence its rate")
    ap.add_argument("--copy-mib", type=int, default=1024, help="copier buffer, MiB")
    ap.add_argument("--reps", type=int, default=20, help="victim runs per timed loop")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--csv", default=None)
    args = ap.parse_args(argv)
    if triton is None:
        raise SystemExit("triton is needed (the GPU machine has it)")
    t0 = time.perf_counter()
    df = run(args)
    if args.csv:
        df.to_csv(args.csv, index=False)
    print(f"device {torch.cuda.get_device_name()}, {df['sms'].dropna().iloc[0]:.0f} SMs, torch {torch.__version__}, "
          f"triton {triton.__version__}, {time.perf_counter() - t0:.0f} s")
    print(table(df))


if __name__ == "__main__":
    main()

"""``efficiency.matrix_beside_collective`` derived from a measurement: the rate a GEMM keeps beside a collective.

    python bench/beside_curve.py                       # the curve, and the A100 spec's value (24 channels, 108 SMs)
    python bench/beside_curve.py --channels 16 --sms 132

Source: bench/gpu_results/2026-11-27-h200/beside.csv, ``bench/gemm_beside_copy.py`` on one NVIDIA H200
(132 SMs, torch 2.11, CUDA 13, cuBLAS bf16, 2026-11-27): four transformer-shaped GEMMs (8192^3, 16384x4096x4096,
8192x4096x14336, 2048x12288x6144) timed alone and beside a persistent copy kernel of k CTAs (512 threads each,
NCCL's CTA size), k = 8, 16, 24, 32, 64, at two copy rates (block 1024: 86-616 GB/s, block 8192: 0.5-2.6 TB/s).

The curve: fraction of the SMs the copier holds (k / SMs) -> the median over shapes and copy rates of the rate
kept (time alone / time beside). A spec's value is the curve at its collective's channels / SMs (NCCL runs one
CTA per channel), interpolated linearly. What the measurement shows against the SM-count rule (SMs - k) / SMs
that the spec used before: at k = 8 the GEMMs keep 0.84 where the rule says 0.94, at k = 32 0.66 where it says
0.76; a GEMM loses about 0.1 of its rate more than the SMs taken (its tiles no longer fill whole waves of the
SMs left, the tile-to-SM schedule it was tuned for is broken), and the 2048-row tp-8 GEMM 0.63-0.65 already at
k = 8 (384 tiles over 132 SMs: one more wave). The copy rate moves the GEMMs little (both rates in the median).
Caveat, said: measured on Hopper (thread-block clusters); the A100 has none, so its value is transferred.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "bench" / "gpu_results" / "2026-11-27-h200" / "beside.csv"


def curve(df: pd.DataFrame) -> list:
    """[(k / SMs, median rate kept over the GEMM victims and copy rates)], ascending, with (0, 1.0) first."""
    g = df[df["victim"].astype(str).str.startswith("gemm")]
    pts = [(float(k) / float(s["sms"].iloc[0]), float(np.median(s["rate_kept"]))) for k, s in g.groupby("ctas")]
    return [(0.0, 1.0)] + sorted(pts)


def value_at(pts: list, fraction: float) -> float:
    """The curve at ``fraction`` of the SMs, linearly interpolated (clamped at its last point)."""
    xs, ys = zip(*pts)
    return float(np.interp(fraction, xs, ys))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--channels", type=int, default=24, help="NCCL channels (CTAs) of the collective")
    ap.add_argument("--sms", type=int, default=108, help="SMs of the GPU the spec describes")
    args = ap.parse_args(argv)
    df = pd.read_csv(MEASURED)
    pts = curve(df)
    print("k/SMs -> rate kept (median of GEMMs x copy rates): "
          + ", ".join(f"{x:.3f}: {y:.3f}" for x, y in pts))
    f = args.channels / args.sms
    print(f"{args.channels} channels / {args.sms} SMs = {f:.3f}: matrix_beside_collective = {value_at(pts, f):.3f} "
          f"(SM-count rule {(args.sms - args.channels) / args.sms:.3f})")


if __name__ == "__main__":
    main()

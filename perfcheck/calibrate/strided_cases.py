"""The element rate of a GPU's elementwise kernels off the vectorised loop: the spec's ``strided_elements_per_s``.

Why: a kernel with a broadcast operand, a permuted or expanded source or a widening cast leaves PyTorch's
vectorised CUDA loop and is bound by the SMs' issue rate, not by HBM (``perfcheck.predict.strided``; on an H100
and an H200, bench/results/elementwise_gpu.md: the same 287-500 G elements/s on cards 43% apart in bandwidth).
The shipped specs carry that rate measured on two cards and derived for others; a calibration measures this GPU's.

What: four such kernels at a Llama layer's size (8192 x 4096 elements, bf16), each at 2-6 bytes per element so
that the element rate, not the bytes, bounds it: a product by a broadcast weight (RMSNorm's ``* weight``), a
transpose copy (``.transpose(1, 2).contiguous()``), an expand + reshape copy (``repeat_kv``) and a bf16 -> fp32
cast (RMSNorm's ``x.float()``). ``m`` = elements written per call; the rate is the median of elements / seconds
over the four (``fit_rate``). Timed as ``gpu_ops`` times its kernels: the device held while the calls are queued.
"""
from __future__ import annotations

import dataclasses
import statistics

import torch

from perfcheck.calibrate.cases import Case, Timer, run_cases

KIND = "strided"
#: (rows, columns) written per call: a Llama layer's activations on a GPU; "tiny" for tests and CPU dry runs
SIZES = {"gpu": (8192, 4096), "tiny": (64, 128)}


def strided_cases(device, sizes: str = "gpu") -> list:
    """Cases of kind ``strided`` (bf16): label the pattern, ``m`` the elements each call writes, ``bytes`` its
    bytes (each operand's distinct bytes read once, the output written once)."""
    dev = torch.device(device)
    T, D = SIZES[sizes]
    bf = torch.bfloat16
    x = torch.randn(T, D, device=dev, dtype=bf)
    w = torch.randn(D, device=dev, dtype=bf)
    heads = torch.randn(1, D // 128, T, 128, device=dev, dtype=bf)
    kv = torch.randn(1, T, max(D // 512, 1), 128, device=dev, dtype=bf)
    rep = D // 128 // kv.shape[2]
    n = T * D
    built = [
        ("mul by a broadcast weight", lambda: x * w, 4 * n + 2 * D, n),
        ("transpose copy", lambda: heads.transpose(1, 2).contiguous(), 4 * heads.numel(), heads.numel()),
        ("expand + reshape copy", lambda: kv.unsqueeze(3).expand(1, T, kv.shape[2], rep, 128).reshape(1, T, -1, 128),
         2 * kv.numel() + 2 * kv.numel() * rep, kv.numel() * rep),
        ("widening cast bf16 -> fp32", lambda: x.float(), 6 * n, n),
    ]
    return [Case(KIND, label, fn, "bf16", 0.0, float(nbytes), (int(elems), 1, 0)) for label, fn, nbytes, elems in built]


def bench_strided(device, sizes: str = "gpu", repeats: int = 3, target_s: float = 0.005):
    """The measurement table of ``strided_cases`` (CUDA: ``gpu_ops.DeviceTimer``; a CPU: the wall-clock Timer)."""
    from perfcheck.calibrate.gpu_ops import DeviceTimer

    dev = torch.device(device)
    timer = DeviceTimer(dev) if dev.type == "cuda" else Timer(dev)
    return run_cases(strided_cases(dev, sizes), timer, repeats=repeats, target_s=target_s, max_iters=32)


def fit_rate(table):
    """Elements per second: the median over the ``strided`` rows of elements written / seconds; None without rows."""
    rows = table[table["kind"] == KIND]
    rates = [float(r.m) / float(r.seconds) for r in rows.itertuples(index=False) if float(r.seconds) > 0]
    return statistics.median(rates) if rates else None


def apply(spec, table, stamp: str):
    """``spec`` with this GPU's ``strided_elements_per_s`` and its source; unchanged without ``strided`` rows."""
    rate = fit_rate(table)
    if rate is None:
        return spec
    rows = table[table["kind"] == KIND]
    each = ", ".join(f"{r.label} {float(r.m) / float(r.seconds) / 1e9:.0f} G/s" for r in rows.itertuples(index=False))
    sources = {**dict(spec.sources), "strided_elements_per_s": (
        f"{stamp}: median elements written per second of four bf16 kernels off the vectorised loop "
        f"(perfcheck.calibrate.strided_cases): {each}")}
    return dataclasses.replace(spec, strided_elements_per_s=float(rate), sources=sources)


__all__ = ["KIND", "SIZES", "strided_cases", "bench_strided", "fit_rate", "apply"]

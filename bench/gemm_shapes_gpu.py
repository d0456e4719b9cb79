"""fp16 GEMM rates of the per-GPU transformer shapes of the published Megatron runs (needs a CUDA GPU).

    python bench/gemm_shapes_gpu.py > bench/results/h100_gemm_shapes.json

Times (CUDA events, 3 warm-ups, 20 products) the 8192^3 reference, the projection GEMMs (qkv, out,
fc1, fc2 and two backward shapes) of h = 2304..25600 at the runs' tensor-parallel size t, the attention
score products of head dims 96/128/160, and a 40-second loop of the reference (first reading vs the
mean of the last five: the sustained clock). bench/published_runs.py's H100_MEASURED holds the ratios
this printed on one H100 80GB HBM3 (torch 2.11, 2026-11-26; raw output in bench/results/h100_gemm_shapes.json).
"""
import json
import time

import torch

d, dev = torch.float16, "cuda"


def tf(m, k, n, b=1, it=20):
    A = torch.randn(b, m, k, device=dev, dtype=d)
    B = torch.randn(b, k, n, device=dev, dtype=d)
    for _ in range(3):
        torch.bmm(A, B)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    for _ in range(it):
        torch.bmm(A, B)
    e1.record()
    torch.cuda.synchronize()
    return 2 * b * m * k * n * it / (e0.elapsed_time(e1) / 1e3) / 1e12


r = {"ref8192": tf(8192, 8192, 8192)}
T = 2048
for h, t in ((2304, 1), (3072, 2), (4096, 4), (6144, 8), (8192, 8), (12288, 8), (16384, 8), (20480, 8), (25600, 8)):
    for nm, (m, k, n) in {"qkv": (T, h, 3 * h // t), "out": (T, h // t, h), "fc1": (T, h, 4 * h // t),
                          "fc2": (T, 4 * h // t, h), "fc1_dw": (h, T, 4 * h // t), "fc2_dx": (T, h, 4 * h // t)}.items():
        r[f"{nm}_h{h}_t{t}"] = tf(m, k, n)
for q, nh in ((96, 24), (128, 4), (128, 8), (160, 16)):
    r[f"logits_q{q}_b{nh}"] = tf(T, q, T, nh)
    r[f"attend_q{q}_b{nh}"] = tf(T, T, q, nh)
x, t0 = [], time.time()
while time.time() - t0 < 40:
    x.append(tf(8192, 8192, 8192, it=50))
r["sustained_first"], r["sustained_last5"], r["n"] = x[0], sum(x[-5:]) / 5, len(x)
print(json.dumps(r, indent=0))

"""CUDA's softmax kernels by row length (``aten_costs.softmax_class``) and the rate the GPU specs give the block
kernels. References: the dispatch rule of aten/src/ATen/native/cuda/SoftMax.cu written out by hand, and
FlashAttention-2's published H100 timings of PyTorch's unfused attention, which nothing here was fitted on."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from perfcheck.hardware.systems import load_system
from perfcheck.predict.aten_costs import TensorMeta, softmax_class

ROOT = Path(__file__).resolve().parents[2]


def _x(shape, eb):
    return TensorMeta(tuple(shape), eb, True, True)


@pytest.mark.parametrize("shape,eb,dim,want", [
    ((64, 1024), 2, -1, "_softmax"),         # 1024 elements, 2 KiB: one warp per row
    ((64, 1025), 2, -1, "softmax_block"),    # over 1024 elements
    ((64, 1024), 4, -1, "_softmax"),         # fp32: 4096 bytes, still the warp kernel
    ((64, 1024), 8, -1, "softmax_block"),    # fp64: 8 KiB, over 4096 bytes
    ((8, 16, 2048, 2048), 2, 3, "softmax_block"),
    ((4096, 64), 2, 0, "_softmax"),          # not the last dimension (inner size 64): not this split
])
def test_rows_go_to_the_kernel_torch_picks(shape, eb, dim, want):
    assert softmax_class(_x(shape, eb), dim) == want


def test_log_softmax_keeps_its_name_below_the_limit():
    assert softmax_class(_x((8, 512), 2), -1, "_log_softmax") == "_log_softmax"
    assert softmax_class(_x((8, 50257), 2), -1, "_log_softmax") == "softmax_block"


def test_the_gpu_specs_price_the_block_kernels_below_a_copy_and_cpus_do_not():
    for name in ("h100-sxm", "h200", "a100-80gb-sxm"):
        eff = load_system(name).op_efficiency
        assert 0.3 < eff["softmax_block@fp16"] == eff["softmax_block@bf16"] < 1.0
    assert not any(k.startswith("softmax_block") for k in load_system("cpu").op_efficiency)


def test_h100_unfused_attention_at_long_rows_matches_the_published_timings():
    """FlashAttention-2's H100 bars of PyTorch's attention at head dim 64, sequence 2k-8k (rows of 2048-8192
    scores: the block kernels; head dim 64 keeps the products memory-bound, so the softmax decides): measured /
    predicted within 12% on the shipped h100-sxm spec, where the copy rate (no softmax rate in the spec) leaves them
    more than 1.25 slow."""
    spec = importlib.util.spec_from_file_location("a100_attention", ROOT / "bench" / "a100_attention.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.h100_bars()
    rows = rows[(rows["head_dim"] == 64) & (rows["seq"] >= 2048)]
    assert len(rows) == 6
    ratio = bench.ratios(rows, "h100-sxm")
    assert np.all(np.abs(ratio - 1.0) <= 0.12), ratio
    plain = bench.ratios(rows, bench.without_softmax_rate("h100-sxm"))
    assert np.all(plain > 1.25)


#: An H200's recorded softmax backward times (bench/elementwise_gpu.py --softmax, 2^27 elements per case, CUDA events)
H200_SOFTMAX = ROOT / "bench" / "gpu_results" / "2026-11-27-h200-late" / "softmax.csv"


@pytest.mark.parametrize("dtype,eb,torch_dtype", [("fp32", 4, "float32"), ("bf16", 2, "bfloat16")])
@pytest.mark.parametrize("cols", [256, 512, 2048, 8192])
def test_the_h200_spec_prices_the_two_pass_softmax_backward_as_measured(dtype, eb, torch_dtype, cols):
    """torch's CUDA softmax backward is two passes (softmax_backward_cuda_out: ``tmp = grad * output``, then the
    backward kernel), 6n bytes where 3n are counted: the h200 spec's ``:bwd`` entries put its predicted time within
    15% of the recorded one at every row length (one pass at a copy's rate would be about half of it). By hand:
    3 n eb bytes / (4.8 TB/s x 0.88 x efficiency)."""
    import pandas as pd
    import torch
    from torch import nn

    from perfcheck import estimate
    rec = pd.read_csv(H200_SOFTMAX).set_index("case")
    measured = float(rec.loc[f"softmax bwd {dtype} {cols} cols", "seconds"])
    n = 1 << 27
    with torch.device("meta"):
        x = torch.empty(n // cols, cols, dtype=getattr(torch, torch_dtype), requires_grad=True)
    spec = load_system("h200")
    row = estimate(nn.Softmax(-1), (x,), system=spec, dtype=dtype).iloc[0]
    predicted = float(row["pred_bwd_s"])
    assert predicted == pytest.approx(measured, rel=0.15)
    key = ("softmax_block:bwd" if cols > 1024 else "_softmax:bwd") + ("" if dtype == "fp32" else "@bf16")
    by_hand = 3 * n * eb / (spec.mem_bandwidth_bytes_per_s * 0.88 * spec.op_efficiency[key])
    # the step's first backward also waits on the host (host_bwd_s, ~50 us), and the launch (a few us)
    assert predicted - float(row["host_bwd_s"]) == pytest.approx(by_hand, rel=0.02)


def test_the_front_ends_fused_softmax_row_is_one_pass_each_way():
    """The transformer front-end's softmax row is Megatron's fused scale-mask-softmax (one kernel each way), so the
    specs' rates of torch's kernels (``_softmax:bwd``: two passes) must not reach it: its backward is 3n bytes at the
    copy rate, as on a spec with no softmax entries at all."""
    import dataclasses

    from perfcheck.predict.transformer import estimate_transformer
    m = dict(name="t", layers=2, hidden=1024, heads=16, ffn_hidden=4096, vocab=1000, seq_len=512, norm="layernorm",
             activation="gelu", bias=True, tied_embeddings=True, dropout=0.0)
    spec = load_system("h100-sxm")
    bare = dataclasses.replace(spec, op_efficiency={k: v for k, v in spec.op_efficiency.items()
                                                    if "softmax" not in k})
    assert "_softmax:bwd@fp16" in spec.op_efficiency
    ours = estimate_transformer(m, batch=4, system=spec, dtype="fp16").set_index("sublayer").loc["softmax"]
    plain = estimate_transformer(m, batch=4, system=bare, dtype="fp16").set_index("sublayer").loc["softmax"]
    assert ours["pred_bwd_s"] == pytest.approx(plain["pred_bwd_s"], rel=1e-9)
    n = 4 * 16 * 512 * 512  # rows x columns of the attention scores
    assert ours["pred_bwd_s"] >= 3 * n * 2 / (spec.mem_bandwidth_bytes_per_s * 0.88)

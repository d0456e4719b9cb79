"""A fused attention kernel's rate from the spec's ``attention_kernel_curve`` (A100: FlashAttention-2's public
benchmark; H100: this project's timing of SDPA on one), checked against the benchmark's bar labels, the recorded
timings and by hand, in both front-ends."""
import json
from importlib import resources

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from perfcheck.errors import UserError
from perfcheck.hardware.systems import SystemSpec, load_system
from perfcheck.predict.module_estimator import estimate
from perfcheck.predict.attention_kernel import attention_kernel_fraction
from perfcheck.predict.transformer import estimate_transformer

SPECS = resources.files("perfcheck.hardware") / "specs"
#: TFLOP/s printed on the FlashAttention-2 bars (Dao-AILab/flash-attention assets, commit 4f285b35), forward +
#: backward, head dim 128, causal, at sequence 512 .. 16k: A100 80GB SXM4 (peak 312) and H100 80GB SXM5 (989.4)
A100_D128_CAUSAL = (99, 133, 155, 173, 182, 189)
SEQS = (512, 1024, 2048, 4096, 8192, 16384)


def test_fraction_at_the_measured_lengths_is_the_bar_label_over_the_peak():
    got = attention_kernel_fraction(load_system("a100-80gb-sxm"), list(SEQS), 128, 1)
    assert got == pytest.approx([t / 312 for t in A100_D128_CAUSAL], abs=1e-4)


def test_h100_fraction_is_the_recorded_sdpa_timing():
    """bench/gpu_results/2026-11-26-h100/calibration.csv.gz: causal SDPA (4, 32, 2048, 128) forward 259.8 us and
    backward 880.5 us; 3.5 x (4 b h s^2 d / 2) FLOPs over their sum, over 989.4 TFLOP/s."""
    fwd = 4 * 4 * 32 * 2048 ** 2 * 128 / 2
    assert attention_kernel_fraction(load_system("h100-sxm"), 2048, 128, True) == pytest.approx(
        3.5 * fwd / (259.8e-6 + 880.5e-6) / 989.4e12, abs=2e-4)


def test_fraction_between_points_is_log_linear_and_clamped_at_the_ends():
    a100 = load_system("a100-80gb-sxm")
    # halfway in log(seq) between 2k (155) and 4k (173): (155 + 173) / 2 = 164 TFLOP/s
    assert attention_kernel_fraction(a100, 2048 * 2 ** 0.5, 128, True) == pytest.approx(164 / 312, abs=2e-4)
    # head dim 96: log(96/64)/log(2) = 0.585 of the way from d64 (165 at 8k, causal) to d128 (182)
    w = 0.5849625
    assert attention_kernel_fraction(a100, 8192, 96, True) == pytest.approx(((1 - w) * 165 + w * 182) / 312, abs=2e-4)
    assert attention_kernel_fraction(a100, 64, 256, True) == pytest.approx(99 / 312, abs=2e-4)  # both ends clamp
    assert attention_kernel_fraction(a100, 8192, 128, False) == pytest.approx(201 / 312, abs=2e-4)  # full mask


def test_no_curve_no_fraction():
    """A spec without measurements (the CPU's, the V100's) keeps pricing the kernel as a GEMM: NaN here."""
    for name in ("cpu", "v100-sxm"):
        assert attention_kernel_fraction(load_system(name), 8192, 128, True) != attention_kernel_fraction(
            load_system(name), 8192, 128, True)  # NaN


def test_bad_curve_key_is_a_one_line_error_naming_the_field():
    d = json.loads((SPECS / "a100-80gb-sxm.json").read_text())
    d["attention_kernel_curve"] = {"d128:sliding": [[512, 0.3]]}
    with pytest.raises(UserError, match="attention_kernel_curve key 'd128:sliding'"):
        SystemSpec.from_dict(d)
    d["attention_kernel_curve"] = {"d128:causal": [[512, 1.3]]}
    with pytest.raises(UserError, match="attention_kernel_curve.d128:causal"):
        SystemSpec.from_dict(d)


class Core(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("system, rate", [("a100-80gb-sxm", 173e12 * 0.904),  # its 4k causal d128 bar x the
                                          # sustained factor it carries (transferred from the H100, 0.904)
                                          ("h100-sxm", 0.4264 * 989.4e12 * 0.904)])  # x matrix_sustained (0.904)
def test_both_front_ends_price_the_kernel_at_the_measured_rate(system, rate):
    """b 2, 16 heads, s 4096, d 128, causal: forward 4 b h s^2 d / 2 FLOPs, backward 2.5x, at the bar's rate."""
    b, h, s, d = 2, 16, 4096, 128
    fwd_flops = 4 * b * h * s * s * d / 2
    m = dict(name="t", layers=1, hidden=h * d, heads=h, ffn_hidden=4 * h * d, vocab=1000, seq_len=s,
             norm="rmsnorm", activation="swiglu", bias=False, tied_embeddings=False, position="rotary")
    tab = estimate_transformer(m, batch=b, system=system, dtype="bf16", flash=True, causal=True).set_index("sublayer")
    assert tab.loc["core_attention", "t_compute_fwd_s"] == pytest.approx(fwd_flops / rate, rel=1e-3)
    assert tab.loc["core_attention", "t_compute_bwd_s"] == pytest.approx(2.5 * fwd_flops / rate, rel=1e-3)
    with torch.device("meta"):
        q, k, v = (torch.empty(b, h, s, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    mod = estimate(Core(), (q, k, v), system=system, dtype="bf16", causal=True).iloc[0]
    # perfcheck.estimate adds the host's share of a lone op (``host_*_s``) to its device time
    assert mod["pred_fwd_s"] - mod["host_fwd_s"] == pytest.approx(fwd_flops / rate, rel=0.01)
    assert mod["pred_bwd_s"] - mod["host_bwd_s"] == pytest.approx(2.5 * fwd_flops / rate, rel=0.01)

"""A 20-billion-parameter GPT built on the meta device estimates on a CPU-only machine with no
memory for its weights, and its counts equal the hand derivation (Narayanan et al. 2021, eq. 3 style)."""
import pytest
import resource

import torch

import perfcheck
from perfcheck.examples.models import GPT
from perfcheck.schema import ROOT


@pytest.mark.slow  # > 5 s on the 2-core VM: full suite only, not the fast lane
def test_20b_gpt_on_meta_device():
    layers, heads, d, vocab, seq, batch = 44, 48, 6144, 50257, 2048, 1
    with torch.device("meta"):
        model = GPT(n_layer=layers, n_head=heads, d_model=d, vocab=vocab, seq_len=seq, bias=False)
    tokens = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    est = perfcheck.estimate(model, (tokens,), system="h100-sxm", dtype=torch.bfloat16).set_index("module")
    rss_growth_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    root = est.loc[ROOT]
    # params: per layer 12*d^2 (qkv 3d^2, proj d^2, fc 8d^2) + 2 LayerNorm weights; tied wte; wpe.
    params = layers * (12 * d * d + 2 * d) + vocab * d + seq * d + d
    assert root.params == params > 20e9
    # forward MACs: per layer 12*d^2 per token + QK^T and PV (2*t*t*d); lm_head d*V per token.
    t = batch * seq
    macs = layers * (12 * d * d * t + 2 * t * t * d) + t * d * vocab
    assert root.macs_fwd == macs
    assert root.pred_fwd_s > 2 * macs / 989.4e12  # never faster than the datasheet peak
    assert rss_growth_kib < 2 * 1024 * 1024  # far below the 40 GB the bf16 weights would need
    assert est.loc["h.0.attn"].act_mem > 0

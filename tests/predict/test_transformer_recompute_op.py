"""torchtitan's op-level selective activation checkpointing (recompute="selective_op"), by hand.

The policy (torchtitan parallelize_llama.py at 1ea476e9f): per block keep the outputs of aten.mm calls 1, 3, 5, 7
and of the SDPA call, re-run every other op in backward. A Llama block's matmuls run wq, wk, wv, wo, w1, w3, w2,
so wk (h x kv_dim), wo (h x h) and w3 (h x f) re-run: 2 b s (h kv_dim + h^2 + h f) matrix FLOPs per layer; the
kept activations per token are the block input, wq, the attention output, w2 (h each), wv (kv_dim) and w1 (f),
2 bytes each in bf16, and the flash attention's fp32 log-sum-exp per head."""
import pytest

from perfcheck.errors import UserError
from perfcheck.predict.transformer import estimate_transformer, load_model, transformer_step

MATMUL_ROWS = ("qkv_proj", "out_proj", "fc1", "fc2", "core_attention")


@pytest.mark.parametrize("name, batch", [("llama3-8b", 1), ("llama3-70b", 2)])
def test_re_run_matmuls_are_wk_wo_w3(name, batch):
    m = load_model(name)
    b, s, h, f, kv, L = batch, 4096, m.hidden, m.ffn_hidden, m.kv_heads * m.head_dim, m.layers
    kw = dict(batch=b, seq=s, system="a100-80gb-sxm", dtype="bf16", flash=True, causal=True)
    step = transformer_step(m, recompute="selective_op", **kw)
    table = estimate_transformer(m, **kw)
    layer = table[table.stage == "layer"]
    other = layer[~layer.sublayer.isin(MATMUL_ROWS)].flops_fwd.sum()  # norms, rotary, activation, adds: re-run
    matmul = 2 * b * s * (h * kv + h * h + h * f)
    assert step.recompute_flops_per_gpu == pytest.approx(L * (matmul + other), rel=1e-9)
    # and the re-run is below full recompute by the kept matmuls (wq, wv, w1, w2) and the attention
    full = transformer_step(m, recompute="full", **kw)
    kept = 2 * b * s * (h * h + h * kv + 2 * h * f) + layer[layer.sublayer == "core_attention"].flops_fwd.sum()
    assert full.recompute_flops_per_gpu - step.recompute_flops_per_gpu == pytest.approx(L * kept, rel=1e-9)


def test_kept_activations_per_layer():
    m = load_model("llama3-8b")
    b, s, h, f, kv, a = 2, 8192, m.hidden, m.ffn_hidden, m.kv_heads * m.head_dim, m.heads
    step = transformer_step(m, batch=b, seq=s, system="a100-80gb-sxm", dtype="bf16", flash=True,
                            recompute="selective_op")
    assert step.act_per_layer_bytes == b * s * (2 * (4 * h + kv + f) + 4 * a)


@pytest.mark.parametrize("model, kw, field", [
    ("llama3-8b", dict(flash=False), "flash"),
    ("llama3-8b", dict(flash=True, parallel=dict(tp=2)), "tp = 1"),
    ("gpt3-175b", dict(flash=True), "SwiGLU"),
    ("mixtral-8x7b", dict(flash=True), "SwiGLU"),
])
def test_selective_op_refuses_what_it_does_not_model(model, kw, field):
    with pytest.raises(UserError, match=field):
        transformer_step(model, recompute="selective_op", **kw)

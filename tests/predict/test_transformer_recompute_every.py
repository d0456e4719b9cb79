"""Full recompute of every Nth layer only (``recompute_every``; torchtitan's "selective layer" activation
checkpointing): the counting rule of torchtitan's parallelize_llama.py (the k-th wrapped block, k = 1..L, is
checkpointed when k % N == 0, so floor(L/N) of the L layers re-run their forward) and the activation memory of
Korthikanti et al. 2022, Table 2, both by hand."""
import pytest

from perfcheck.errors import UserError
from perfcheck.predict.step import STEP_COLUMNS
from perfcheck.predict.transformer import load_model, transformer_step


def _model(layers):
    return dict(name="tiny", layers=layers, hidden=256, heads=8, ffn_hidden=1024, vocab=1000, seq_len=512,
                norm="layernorm", activation="gelu", bias=True, tied_embeddings=True, dropout=0.1)


@pytest.mark.parametrize("layers, every, recomputed", [(5, 2, 2), (32, 2, 16), (5, 6, 0), (6, 3, 2), (7, 1, 7)])
def test_recomputed_layers_follow_torchtitans_count(layers, every, recomputed):
    """k = 1..L, checkpointed when k % N == 0: L=5, N=2 -> blocks 2, 4; L=32, N=2 -> 16; L=5, N=6 -> none;
    L=6, N=3 -> 3, 6; N=1 -> all. The re-run forward's FLOPs, time and TP bytes scale by that count."""
    kw = dict(batch=2, parallel=dict(tp=2), system="a100-80gb-sxm", dtype="bf16")
    full = transformer_step(_model(layers), recompute="full", **kw)
    none = transformer_step(_model(layers), recompute="none", **kw)
    nth = transformer_step(_model(layers), recompute="full", recompute_every=every, **kw)
    share = recomputed / layers
    assert nth.recompute_flops_per_gpu == pytest.approx(share * full.recompute_flops_per_gpu, rel=1e-12)
    assert nth.recompute_time_s == pytest.approx(share * full.recompute_time_s, rel=1e-12)
    assert nth.tp_comm_bytes - none.tp_comm_bytes == pytest.approx(
        share * (full.tp_comm_bytes - none.tp_comm_bytes), rel=1e-12)
    assert nth.compute_time_s == pytest.approx(full.compute_time_s, rel=1e-12)  # the layers' own work is unchanged


def test_every_first_layer_is_full_recompute():
    kw = dict(batch=1, parallel=dict(tp=8, sp=True, pp=2, dp=2, micro_batches=4), system="a100-80gb-sxm")
    a = transformer_step("gpt3-175b", recompute="full", **kw)
    b = transformer_step("gpt3-175b", recompute="full", recompute_every=1, **kw)
    assert all(a.values[k] == b.values[k] for k in STEP_COLUMNS)


def test_activation_memory_every_second_layer_is_korthikanti_mean():
    """Half of the 96 layers keep only their input (2 s b h bytes, Table 2's full recompute), the other half
    everything (34 s b h + 5 a s^2 b, Table 2 without recompute, plus our LayerNorms' fp32 mean and rstd:
    2 norms x 8 bytes per token); the per-layer figure is their mean."""
    m = load_model("gpt3-175b")
    s, b, h, a = m.seq_len, 1, m.hidden, m.heads
    step = transformer_step(m, batch=b, dtype="fp16", recompute="full", recompute_every=2)
    kept_full, kept_none = 2 * s * b * h, 34 * s * b * h + 5 * a * s * s * b + 16 * s * b
    assert step.act_per_layer_bytes == pytest.approx((kept_full + kept_none) / 2, rel=1e-12)


@pytest.mark.parametrize("kw, field", [(dict(recompute="none", recompute_every=2), "recompute_every"),
                                       (dict(recompute="selective", recompute_every=3), "recompute_every"),
                                       (dict(recompute="full", recompute_every=0), "recompute_every"),
                                       (dict(recompute="full", recompute_every=True), "recompute_every")])
def test_bad_recompute_every_names_the_field(kw, field):
    with pytest.raises(UserError, match=field):
        transformer_step(_model(4), **kw)

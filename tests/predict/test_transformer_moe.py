"""Grouped-query attention and mixture-of-experts in the transformer front-end (issue #13):
published parameter counts of Llama 3 8B/70B and Mixtral 8x7B exactly (integers derived by hand
from their HF configs), GQA's key/value projections, MoE routing work and expert-parallel
all-to-all bytes, and the errors for layouts the models cannot take."""
import pytest

from perfcheck.errors import UserError
from perfcheck.predict.transformer import estimate_transformer, load_model, transformer_step


def _params(name, **kw):
    t = estimate_transformer(name, **kw)
    return int((t.params * t["count"]).sum())


def test_llama3_8b_parameter_count():
    # per layer: q 4096^2 = 16,777,216; k, v 2*4096*1024 = 8,388,608 (8 kv heads x 128); o 16,777,216;
    # SwiGLU 3*4096*14336 = 176,160,768; two RMSNorms 8,192 -> 218,112,000; x 32 = 6,979,584,000.
    # embedding and untied head 2*128256*4096 = 1,050,673,152; final norm 4,096.
    assert _params("llama3-8b") == 6_979_584_000 + 1_050_673_152 + 4_096 == 8_030_261_248  # "8.03B"


def test_llama3_70b_parameter_count():
    # per layer: q 8192^2 = 67,108,864; k, v 2*8192*1024 = 16,777,216; o 67,108,864;
    # SwiGLU 3*8192*28672 = 704,643,072; norms 16,384 -> 855,654,400; x 80 = 68,452,352,000.
    # embedding + head 2*128256*8192 = 2,101,346,304; final norm 8,192.
    assert _params("llama3-70b") == 68_452_352_000 + 2_101_346_304 + 8_192 == 70_553_706_496  # "70.6B"


def test_mixtral_8x7b_parameter_count_total_and_active():
    # per layer: attention 16,777,216 + 8,388,608 + 16,777,216 = 41,943,040; 8 experts x 176,160,768
    # = 1,409,286,144; router 4096*8 = 32,768; norms 8,192 -> 1,451,270,144; x 32 = 46,440,644,608.
    # embedding + head 2*32000*4096 = 262,144,000; final norm 4,096.
    total = _params("mixtral-8x7b")
    assert total == 46_440_644_608 + 262_144_000 + 4_096 == 46_702_792_704  # "46.7B"
    # active per token: 6 of 8 experts idle in each of 32 layers -> 12,879,925,248 ("12.9B active")
    assert total - 32 * 6 * 176_160_768 == 12_879_925_248


def test_gqa_key_value_projections_and_flash_activations():
    model = load_model("llama3-8b")
    b, s, e, q = 1, 1024, 4096, 128
    tab = estimate_transformer("llama3-8b", batch=b, seq=s, dtype="bf16", flash=True).set_index("sublayer")
    t = b * s
    assert tab.loc["qkv_proj", "params"] == e * (32 + 2 * 8) * q  # 25,165,824 (MHA would be 3e^2)
    assert tab.loc["qkv_proj", "macs_fwd"] == t * e * (32 + 2 * 8) * q
    # flash keeps q (t*32*128), k and v (t*8*128 each) and the fp32 log-sum-exp (b*32*s): bf16
    assert tab.loc["core_attention", "act_mem"] == (t * 32 * q + 2 * t * 8 * q) * 2 + b * 32 * s * 4
    # rotary rotates q and k: t*(32 + 8)*128 elements at 3 FLOPs each
    assert tab.loc["rotary", "flops_fwd"] == 3 * t * 40 * q
    assert model.kv_heads == 8 and load_model("llama-7b").kv_heads == 32  # default: one kv head per head


def test_gqa_tensor_parallel_split():
    tp8 = estimate_transformer("llama3-70b", seq=512, parallel=dict(tp=8)).set_index("sublayer")
    tp1 = estimate_transformer("llama3-70b", seq=512).set_index("sublayer")
    assert tp8.loc["qkv_proj", "params"] * 8 == tp1.loc["qkv_proj", "params"]  # one kv head per rank
    with pytest.raises(UserError, match="kv_heads"):
        estimate_transformer("llama3-8b", parallel=dict(tp=16), seq=1024)  # 16 ranks, 8 kv heads


def test_moe_routing_work_per_layer():
    b, s, e, f, n, k = 2, 512, 4096, 14336, 8, 2
    tab = estimate_transformer("mixtral-8x7b", batch=b, seq=s).set_index("sublayer")
    t = b * s
    assert tab.loc["router", "macs_fwd"] == t * e * n
    # every token through its top-2 experts: fc1 (gate + up) t*k*e*2f, fc2 t*k*f*e
    assert tab.loc["expert_fc1", "macs_fwd"] == t * k * e * 2 * f
    assert tab.loc["expert_fc2", "macs_fwd"] == t * k * f * e
    assert tab.loc["expert_fc1", "params"] == n * e * 2 * f and tab.loc["expert_fc2", "params"] == n * f * e
    # capacity factor 1.25 pads each expert's share: 25% more expert work
    padded = estimate_transformer(dict(load_model("mixtral-8x7b").to_json_dict(), capacity_factor=1.25),
                                  batch=b, seq=s).set_index("sublayer")
    assert padded.loc["expert_fc2", "macs_fwd"] == 1.25 * tab.loc["expert_fc2", "macs_fwd"]


def test_shared_experts_see_every_token():
    spec = dict(load_model("mixtral-8x7b").to_json_dict(), name="shared", shared_experts=1)
    tab = estimate_transformer(spec, batch=1, seq=256).set_index("sublayer")
    assert tab.loc["shared_fc2", "macs_fwd"] == 256 * 14336 * 4096
    assert tab.loc["shared_fc1", "comm_fwd_bytes"] == 0  # no all-to-all: the token stays


def test_expert_parallel_all_to_all_bytes_and_expert_split():
    b, s, e, k = 1, 1024, 4096, 2
    one = estimate_transformer("mixtral-8x7b", batch=b, seq=s).set_index("sublayer")
    ep4 = estimate_transformer("mixtral-8x7b", batch=b, seq=s, ep=4).set_index("sublayer")
    # dispatch before fc1 and combine after fc2: each GPU's send buffer = its routed tokens
    # (t * top_k) x e x 2 bytes (bf16) = 1024*2*4096*2 = 16,777,216 B, forward and again backward.
    assert one.loc["expert_fc1", "comm_fwd_bytes"] == 0
    assert ep4.loc["expert_fc1", "comm_fwd_bytes"] == ep4.loc["expert_fc2", "comm_fwd_bytes"] == b * s * k * e * 2
    assert ep4.loc["expert_fc1", "comm_bwd_bytes"] == b * s * k * e * 2
    assert ep4.loc["expert_fc1", "comm_fwd_kind"] == "alltoall"
    assert ep4.loc["expert_fc1", "params"] * 4 == one.loc["expert_fc1", "params"]  # 2 of 8 experts per GPU
    assert ep4.loc["expert_fc1", "macs_fwd"] == one.loc["expert_fc1", "macs_fwd"]  # same tokens per GPU
    assert ep4.loc["expert_fc1", "t_comm_fwd_s"] > 0
    step = transformer_step("mixtral-8x7b", batch=b, seq=s, ep=4)
    assert step.tp_comm_time_s > 0  # all-to-all time is on the critical path with tp_overlap = 0


@pytest.mark.parametrize("model,kw,field", [
    ("mixtral-8x7b", dict(ep=3), "ep"), ("llama3-8b", dict(ep=2), "ep"),
    (dict(name="x", layers=2, hidden=64, heads=8, kv_heads=3, ffn_hidden=128, vocab=10, seq_len=8, norm="rmsnorm",
          activation="swiglu", bias=False, tied_embeddings=False), {}, "kv_heads"),
    (dict(name="x", layers=2, hidden=64, heads=8, ffn_hidden=128, vocab=10, seq_len=8, norm="rmsnorm",
          activation="swiglu", bias=False, tied_embeddings=False, experts=4, top_k=5), {}, "top_k"),
    (dict(name="x", layers=2, hidden=64, heads=8, ffn_hidden=128, vocab=10, seq_len=8, norm="rmsnorm",
          activation="swiglu", bias=False, tied_embeddings=False, experts=4, capacity_factor=0), {}, "capacity_factor"),
])
def test_bad_moe_and_gqa_settings_are_one_line_errors_naming_the_field(model, kw, field):
    with pytest.raises(UserError, match=field) as err:
        estimate_transformer(model, seq=8 if isinstance(model, dict) else 128, **kw)
    assert "\n" not in str(err.value)


def test_gqa_and_moe_files_cite_every_field_they_set():
    import json
    from importlib import resources

    for name in ("llama3-8b", "llama3-70b", "mixtral-8x7b"):
        data = json.loads((resources.files("perfcheck.predict") / "model_files" / f"{name}.json").read_text())
        fields = [k for k in data if k not in ("name", "description", "sources")]
        assert not [f for f in fields if not data["sources"].get(f, "").strip()], name

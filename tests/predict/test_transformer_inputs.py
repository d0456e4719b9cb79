"""Model files and every bad-input path of the transformer front-end: UserError naming the field,
NotImplementedError naming a scheme we do not model."""
import json

import numpy as np
import pandas as pd
import pytest

from perfcheck.errors import UserError
from perfcheck.predict.transformer import (ARCH_FIELDS, TABLE_COLUMNS, TransformerModel, estimate_transformer,
                                            list_models, load_model, sweep_transformer, transformer_step)


def _params(name, **parallel):
    t = estimate_transformer(name, parallel=parallel or None)
    return (t["params"] * t["count"]).sum()


def test_builtin_models_load_and_cite_a_source_for_every_field():
    assert {"gpt3-175b", "gpt2-124m", "llama-7b"} <= set(list_models())
    for name in list_models():
        m = load_model(name)
        assert m.name == name
        missing = [f for f in ARCH_FIELDS if not m.sources.get(f, "").strip()]
        assert not missing, (name, missing)
        assert TransformerModel.from_dict(m.to_json_dict()) == m


def test_parameter_counts_of_the_model_files():
    # GPT-2 small: 124,439,808 with wte tied to lm_head (HF GPT2LMHeadModel.num_parameters()).
    assert _params("gpt2-124m") == 124_439_808
    # LLaMA-7B: 6,738,415,616 (HF LlamaForCausalLM, untied lm_head, no biases, RMSNorm weights only).
    assert _params("llama-7b") == 6_738_415_616
    # GPT-3: Narayanan et al. 2021's P = 12 l h^2 (1 + 13/12h + (V + s)/12lh), plus the final LayerNorm.
    m = load_model("gpt3-175b")
    l, h = m.layers, m.hidden
    assert _params("gpt3-175b") == 12 * l * h * h + 13 * l * h + (m.vocab + m.seq_len) * h + 2 * h
    # TP shards the layer weights and the (padded) vocabulary; norms and row-parallel biases replicate.
    t8 = estimate_transformer("gpt3-175b", parallel=dict(tp=8)).set_index("sublayer")
    assert t8.loc["fc1"].params == h * 4 * h / 8 + 4 * h / 8 and t8.loc["fc2"].params == 4 * h / 8 * h + h
    assert t8.loc["embedding"].params == 6283 * h  # ceil(50257 / 8) rows per rank


def test_table_columns_and_si_units():
    t = estimate_transformer("llama-7b", batch=2)
    assert list(t.columns) == list(TABLE_COLUMNS)
    assert "rotary" in set(t.sublayer) and "position_embedding" not in set(t.sublayer)
    assert "dropout_attn" not in set(t.sublayer)  # llama trains without dropout
    assert (t.filter(like="_s").select_dtypes("number") >= 0).all().all()
    assert t.set_index("sublayer").loc["fc1"].params == 4096 * 2 * 11008  # gate and up, no bias


def _bad_model(**kw):
    base = load_model("gpt2-124m").to_json_dict()
    base.update(kw)
    return base


@pytest.mark.parametrize("call, field", [
    (lambda: estimate_transformer("gpt2-124m", parallel=dict(tp=5)), "tp"),
    (lambda: estimate_transformer("gpt2-124m", parallel=dict(tp=8)), "tp"),  # 8 does not divide 12 heads
    (lambda: estimate_transformer("gpt2-124m", parallel=dict(pp=5)), "pp"),
    (lambda: estimate_transformer("gpt2-124m", parallel=dict(sp=True)), "sp"),
    (lambda: estimate_transformer("gpt2-124m", parallel=dict(pp=2, zero_stage=3)), "zero_stage"),
    (lambda: estimate_transformer("gpt2-124m", parallel=dict(zero_stage=4)), "zero_stage"),
    (lambda: estimate_transformer("gpt2-124m", parallel=dict(tpp=2)), "tpp"),
    (lambda: estimate_transformer("gpt2-124m", batch=-1), "batch"),
    (lambda: estimate_transformer("gpt2-124m", batch=1.5), "batch"),
    (lambda: estimate_transformer("gpt2-124m", seq=0), "seq"),
    (lambda: estimate_transformer("gpt2-124m", seq=4096), "seq"),  # learned positions stop at 1024
    (lambda: estimate_transformer("gpt2-124m", system="no-such-gpu"), "system"),
    (lambda: estimate_transformer("gpt2-124m", dtype="int8"), "dtype"),
    (lambda: estimate_transformer("gpt2-124m", recompute="sometimes"), "recompute"),
    (lambda: estimate_transformer("gpt2-124m", tp_overlap=1.5), "tp_overlap"),
    (lambda: estimate_transformer("gpt2-124m", warp_speed=True), "warp_speed"),
    (lambda: estimate_transformer("gpt2-124m", optimizer="adafactor"), "optimizer"),
    (lambda: estimate_transformer("gpt2-124m", tp_scheme="4d"), "tp_scheme"),
    (lambda: estimate_transformer("no-such-model"), "model"),
    (lambda: estimate_transformer(_bad_model(kv_heads=5)), "kv_heads"),  # 5 does not divide 12 heads
    (lambda: estimate_transformer(_bad_model(hidden=-768)), "hidden"),
    (lambda: estimate_transformer(_bad_model(heads=7)), "heads"),
    (lambda: estimate_transformer(_bad_model(norm="batchnorm")), "norm"),
    (lambda: estimate_transformer(_bad_model(activation="tanh")), "activation"),
    (lambda: estimate_transformer(_bad_model(bias="yes")), "bias"),
    (lambda: estimate_transformer(_bad_model(dropout=1.0)), "dropout"),
    (lambda: estimate_transformer(_bad_model(sources={"colour": "x"})), "colour"),
    (lambda: estimate_transformer({"name": "x", "layers": 2}), "hidden"),
])
def test_bad_input_raises_user_error_naming_the_field(call, field):
    with pytest.raises(UserError, match=field):
        call()


def test_a_layout_read_from_a_dataframe_is_the_same_layout():
    """numpy scalars (a CSV row's cells) are the values they hold: the same step as Python's, not an error."""
    rows = pd.DataFrame({"layers": [4], "hidden": [1024], "heads": [16], "ffn_hidden": [4096], "vocab": [32000],
                         "seq_len": [1024], "bias": [True], "tied_embeddings": [False], "dropout": [0.1],
                         "tp": [2], "dp": [2], "batch": [2]})
    r = rows.iloc[0]
    assert isinstance(r.layers, np.integer) and isinstance(r.dropout, np.floating)
    arch = dict(name="x", norm="layernorm", activation="gelu")
    from_frame = transformer_step(dict(arch, **{k: r[k] for k in rows.columns[:9]}), batch=r.batch,
                                  parallel=dict(tp=r.tp, sp=r.tp > 1, dp=r.dp), system="h100-sxm", dtype="bf16")
    plain = transformer_step(dict(arch, layers=4, hidden=1024, heads=16, ffn_hidden=4096, vocab=32000, seq_len=1024,
                                  bias=True, tied_embeddings=False, dropout=0.1), batch=2,
                             parallel=dict(tp=2, sp=True, dp=2), system="h100-sxm", dtype="bf16")
    assert from_frame.step_time_s == plain.step_time_s > 0
    with pytest.raises(UserError, match="layers must be a positive integer"):
        transformer_step(dict(arch, **{k: r[k] for k in rows.columns[1:9]}, layers=np.float64(4.5)))


def test_model_file_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "layers": 2,')
    with pytest.raises(UserError, match=r"bad.json: malformed JSON at line 1"):
        load_model(str(bad))
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps(_bad_model(rope_theta=10000.0)))
    with pytest.raises(UserError, match="unknown key.*'rope_theta'"):
        load_model(str(extra))
    good = tmp_path / "mine.json"
    good.write_text(json.dumps(_bad_model(name="mine", layers=2)))
    assert load_model(str(good)).layers == 2


@pytest.mark.parametrize("scheme", ["2d", "2.5D", "3D"])
def test_other_tensor_parallel_schemes_are_modelled_not_ignored(scheme):
    """2D/2.5D/3D change the table (tests/predict/test_transformer_grid.py has their numbers); at tp = 1 the
    grid has one GPU and the table is the unsharded one."""
    one = estimate_transformer("gpt2-124m", batch=8)
    grid1 = estimate_transformer("gpt2-124m", batch=8, tp_scheme=scheme)
    pd.testing.assert_frame_equal(grid1.drop(columns=["comm_fwd_kind", "comm_bwd_kind"]),
                                  one.drop(columns=["comm_fwd_kind", "comm_bwd_kind"]))
    par = dict(tp=8) if scheme.lower() != "2d" else dict(tp=4)
    extra = dict(tp_depth=2) if scheme.lower() == "2.5d" else {}
    grid = estimate_transformer("gpt3-175b", batch=8, seq=128, parallel=par, tp_scheme=scheme, **extra)
    megatron = estimate_transformer("gpt3-175b", batch=8, seq=128, parallel=par)
    assert grid.act_mem.sum() < megatron.act_mem.sum()  # activations are split too
    assert transformer_step("gpt2-124m", batch=8, parallel=par, tp_scheme=scheme, **extra).step_time_s > 0


@pytest.mark.parametrize("frame, message", [
    (pd.DataFrame(dict(tp=[1], pp=[1], dp=[1], zero_stage=[0])), "missing column.*'micro_batch'"),
    (pd.DataFrame(dict(tp=[1], pp=[1], dp=[1], zero_stage=[0], micro_batch=[1], zero=[1])), "unknown column.*'zero'"),
    (pd.DataFrame(dict(tp=[1, 5], pp=[1, 1], dp=[1, 1], zero_stage=[0, 0], micro_batch=[1, 1])), "row 1: tp does not divide heads"),
    (pd.DataFrame(dict(tp=[1], pp=[1], dp=[0], zero_stage=[0], micro_batch=[1])), "row 0: dp must be >= 1"),
    (pd.DataFrame(dict(tp=[1], pp=[2], dp=[1], zero_stage=[2], micro_batch=[1])), "row 0: zero_stage 2/3"),
    (pd.DataFrame(dict(tp=[1], pp=[1], dp=[1], zero_stage=[0], micro_batch=[1], sp=[True])), "row 0: sp needs tp > 1"),
    (pd.DataFrame(dict(tp=[1.5], pp=[1], dp=[1], zero_stage=[0], micro_batch=[1])), "tp must hold integers"),
])
def test_sweep_bad_layouts(frame, message):
    with pytest.raises(UserError, match=message):
        sweep_transformer("gpt2-124m", frame)

"""The transformer front-end against independent references: the printed tables of an early
analytical notebook of transformer-perf-estimates (Subramanian et al. 2024, "Comprehensive
Performance Modeling and System Design Insights for Foundation Models", arXiv 2410.00273;
https://github.com/ShashankSubramanian/transformer-perf-estimates), Megatron's published formulas
(Narayanan et al. 2021; Korthikanti et al. 2022), the ZeRO paper's memory per GPU, the 1F1B bubble,
and perfcheck.estimate on equivalent torch modules (same formulas, two front-ends: MACs must agree
exactly)."""
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
import torch.nn as nn

from perfcheck.predict import zero
from perfcheck.predict.module_estimator import estimate
from perfcheck.predict.transformer import estimate_transformer, load_model, sweep_transformer, transformer_step
from perfcheck.examples.models import GPT
from perfcheck.schema import ROOT
from perfcheck.hardware.systems import SystemSpec, load_system

# ---------------------------------------------- transformer-perf-estimates notebook (arXiv 2410.00273)
# "The notebook" below is that early transformer-perf-estimates notebook. Its system dict: 312 TFLOP/s
# fp16 tensor cores, 78 vector, 1555 GB/s HBM, no efficiency factors, no launch overhead (its times
# are FLOPs/peak and bytes/bandwidth).
NB_SYSTEM = SystemSpec.from_dict(dict(
    name="notebook-a100", description="the notebook's A100 dict", kind="gpu", matrix_flops_per_s={"fp16": 312e12},
    vector_flops_per_s={"fp16": 78e12}, mem_bandwidth_bytes_per_s=1555e9, mem_capacity_bytes=40e9,
    intra_node_bandwidth_bytes_per_s=600e9, gpus_per_node=4, inter_node_bandwidth_bytes_per_s=100e9,
    launch_overhead_s=0.0, efficiency=dict(matrix=1, vector=1, memory=1, intra_node=1, inter_node=1),
    host=dict(device_kernel_s=0.0)))  # the notebook has no per-kernel time
# b = 1, l = 2048, e = 12288, h = 96, f = 4e, m1 = 4 (tensor parallel), fp16
B, L, E, H, FF, M = 1, 2048, 12288, 96, 4 * 12288, 4
Q = E // H
NB_MODEL = dict(name="notebook", layers=96, hidden=E, heads=H, ffn_hidden=FF, vocab=50257, seq_len=L,
                norm="layernorm", activation="gelu", bias=True, tied_embeddings=True, dropout=0.1)


def nb_table(bias=True, sp=False):
    return estimate_transformer({**NB_MODEL, "bias": bias}, batch=B, parallel=dict(tp=M, sp=sp),
                                system=NB_SYSTEM, dtype="fp16").set_index("sublayer")


def test_fc1_flops_match_the_notebook():
    fc1 = nb_table().loc["fc1"]
    assert fc1.macs_fwd == B * L * E * (FF // M)  # (b,l,e) @ (e,f/m)
    # The notebook counts a k-term dot product as 2k-1 FLOPs and adds the bias: 2k per output,
    # i.e. exactly 2 * MACs = 0.618475 TFLOP (its printed value).
    assert round(2 * fc1.macs_fwd / 1e12, 6) == 0.618475
    # We count 2k per dot product plus the bias add (FlopCounterMode/DeepSpeed convention):
    assert fc1.flops_fwd - 2 * fc1.macs_fwd == B * L * (FF // M)
    assert abs(fc1.flops_fwd / 0.618475e12 - 1) < 1e-4
    # Backward: dX (2f/m-1 per (l,e) element) + dW (2l-1 per (e,f/m) element) + bias grad ((l-1) per
    # column). Our 2k counts are one FLOP per dot product (and per bias column) higher:
    notebook_convention = fc1.flops_bwd - (L * E + E * (FF // M) + FF // M)
    assert round(notebook_convention / 1e12, 4) == 1.2368


def test_attention_matmul_flops_match_the_notebook_within_the_convention():
    t = nb_table()
    heads = B * H // M
    # logits: (l,q) @ (q,l) per head: notebook 2q-1 per dot product -> 0.025669 TFLOP
    assert round((t.loc["logits"].flops_fwd - heads * L * L) / 1e12, 6) == 0.025669
    # attend: (l,l) @ (l,q): 2l-1 per dot product -> 0.025764 TFLOP
    assert round((t.loc["attend"].flops_fwd - heads * L * Q) / 1e12, 6) == 0.025764


def test_memory_columns_match_the_notebook():
    t = nb_table()
    gb = {k: round(v / 1e9, 6) for k, v in t["weight_mem"].items()}
    assert gb["fc1"] == gb["fc2"] == 0.302014  # (e*f/m + f/m) fp16 weights
    assert gb["out_proj"] == 0.075522  # the notebook's v_proj: (e/m*e + e), bias replicated
    assert round(nb_table(bias=False).loc["qkv_proj"].weight_mem / 1e9, 6) == 0.226492  # e*3e/m, no bias
    act = {k: round(v / 1e9, 6) for k, v in t["act_mem"].items()}
    # activation_buffer column of the printed tables
    assert act["fc1"] == act["qkv_proj"] == 0.050332
    assert act["logits"] == 0.025166  # Q and K
    assert act["softmax"] == 0.201327  # (b, h/m, l, l) fp16
    assert act["dropout_softmax"] == 0.100663  # 1-byte mask
    assert act["attend"] == 0.21391  # dropped-out probabilities + V
    sp = nb_table(sp=True)
    rows = B * L // M  # sequence-parallel norm on l/m tokens: 0.012583 GB input, plus fp32 mean/rstd
    assert round((sp.loc["layer_norm_1"].act_mem - rows * 8) / 1e9, 6) == 0.012583
    assert round(sp.loc["dropout_attn"].act_mem / 1e9, 6) == 0.006291  # l/m tokens, 1-byte mask


def test_fc1_times_match_the_notebook():
    fc1 = nb_table().loc["fc1"]
    assert round(fc1.t_memory_fwd_s * 1e3, 6) == 0.258957  # 0.402678 GB / 1555 GB/s
    assert round(2 * fc1.macs_fwd / 312e12 * 1e3, 6) == 1.982293  # the matrix part
    # ours adds the bias adds at the 78 TFLOP/s vector rate: +0.016%
    assert abs(fc1.t_compute_fwd_s / 1.982293e-3 - 1) < 2e-4
    assert fc1.pred_fwd_s == fc1.t_compute_fwd_s and fc1.bound_fwd == "compute"


# --------------------------------------------------------------------------------------- Megatron
def test_narayanan_flops_per_iteration_with_full_recompute():
    """Narayanan et al. 2021 eq. (3): F = 96 B s l h^2 (1 + s/6h + V/16lh) matrix FLOPs per
    iteration with full recompute (layers: fwd + recompute + 2x bwd; logits: fwd + 2x bwd)."""
    m = load_model("gpt3-175b")
    b, s, l, h, v = 2, m.seq_len, m.layers, m.hidden, m.vocab
    t = estimate_transformer(m, batch=b, dtype="fp16", recompute="full").set_index("sublayer")
    layer = t[t.stage == "layer"]
    ours = l * 2 * (2 * layer.macs_fwd + layer.macs_bwd).sum() + 2 * (t.loc["lm_head"].macs_fwd + t.loc["lm_head"].macs_bwd)
    assert ours == 96 * b * s * l * h * h + 16 * b * s * s * l * h + 6 * b * s * h * v
    # causal halves the two score products: 2 b s^2 h MACs per layer forward become b s^2 h
    causal = estimate_transformer(m, batch=b, dtype="fp16", causal=True).set_index("sublayer")
    assert layer.macs_fwd.sum() - causal[causal.stage == "layer"].macs_fwd.sum() == b * s * s * h


@pytest.mark.parametrize("t, sp, recompute, expected", [
    (1, False, "none", lambda s, b, h, a, t: s * b * h * 34 + 5 * a * s * s * b),
    (8, False, "none", lambda s, b, h, a, t: s * b * h * 10 + s * b * h * 24 // t + 5 * a * s * s * b // t),
    (8, True, "none", lambda s, b, h, a, t: (s * b * h * 34 + 5 * a * s * s * b) // t),
    (8, False, "selective", lambda s, b, h, a, t: s * b * h * 10 + s * b * h * 24 // t),
    (8, True, "selective", lambda s, b, h, a, t: 34 * s * b * h // t),
    (1, False, "full", lambda s, b, h, a, t: 2 * s * b * h),
    (8, True, "full", lambda s, b, h, a, t: 2 * s * b * h // t),
])
def test_korthikanti_activation_memory_per_layer(t, sp, recompute, expected):
    """Korthikanti et al. 2022, Table 2 (fp16, 1-byte dropout masks). Our LayerNorms also keep
    fp32 mean and rstd per row: 2 norms x 8 bytes per token on their (possibly sharded) rows."""
    m = load_model("gpt3-175b")
    s, b, h, a = m.seq_len, 1, m.hidden, m.heads
    step = transformer_step(m, batch=b, parallel=dict(tp=t, sp=sp), dtype="fp16", recompute=recompute)
    stats = 0 if recompute == "full" else 16 * s * b // (t if sp else 1)
    assert step.act_per_layer_bytes == expected(s, b, h, a, t) + stats


# ------------------------------------------------------------------------------- ZeRO and pipeline
@pytest.mark.parametrize("stage, per_gpu", [(0, lambda p, n: 16 * p), (1, lambda p, n: 4 * p + 12 * p / n),
                                            (2, lambda p, n: 2 * p + 14 * p / n), (3, lambda p, n: 16 * p / n)])
def test_zero_model_state_memory_per_gpu(stage, per_gpu):
    """Rajbhandari et al. 2020, Fig. 1: mixed-precision Adam, K = 12."""
    n = 64
    s = transformer_step("gpt2-124m", parallel=dict(dp=n, zero_stage=stage), dtype="bf16")
    p = s.params_per_gpu
    assert p == 124_439_808  # GPT-2 small with tied embeddings (the HF model's parameter count)
    assert s.mem_params_bytes + s.mem_grads_bytes + s.mem_optimizer_bytes == pytest.approx(per_gpu(p, n), rel=1e-12)


def test_dp_collectives_come_from_zero_py_and_repeat_per_micro_step_for_stages_2_3():
    by_stage = {}
    for stage in range(4):
        one = transformer_step("gpt2-124m", parallel=dict(dp=8, zero_stage=stage), dtype="bf16")
        four = transformer_step("gpt2-124m", parallel=dict(dp=8, zero_stage=stage, micro_batches=4), dtype="bf16")
        ref = zero.step_comm_bytes(one.params_per_gpu, stage, 8, micro_steps=4, dtype="bf16")
        for kind in ("allreduce", "allgather", "reducescatter"):
            assert four.values[f"dp_{kind}_bytes"] == pytest.approx(ref[kind])
        by_stage[stage] = (one, four)
    p2 = 2 * by_stage[0][0].params_per_gpu
    assert by_stage[0][1].dp_allreduce_bytes == pytest.approx(p2, abs=16)  # once per step (+ scalars)
    assert by_stage[3][1].dp_reducescatter_bytes == pytest.approx(4 * by_stage[3][0].dp_reducescatter_bytes)
    assert by_stage[3][1].dp_allgather_bytes >= 4 * p2  # parameters gathered for forward on every micro-step


@pytest.mark.parametrize("pp, m", [(2, 1), (4, 8), (8, 32)])
def test_1f1b_bubble(pp, m):
    par = dict(tp=8, pp=pp, dp=2, micro_batches=m)
    s = transformer_step("gpt3-175b", parallel=par, dtype="bf16")
    assert s.bubble_fraction == (pp - 1) / (m + pp - 1)
    # flow-shop makespan: m * t_critical + the other stages' own times; the middle stages hold layers only,
    # the first adds the embedding rows, the last the LM head and loss (the slower end is critical)
    rows = estimate_transformer("gpt3-175b", parallel=par, dtype="bf16")
    t = rows["pred_fwd_s"] + rows["pred_bwd_s"]
    first, last = t[rows["stage"] == "first"].sum(), t[rows["stage"] == "last"].sum()
    t_critical = (s.step_time_s - s.dp_comm_time_s - s.optimizer_time_s - s.bubble_time_s) / m
    t_middle = t_critical - max(first, last)
    assert s.bubble_time_s == pytest.approx((pp - 2) * t_middle + t_middle + min(first, last), rel=1e-9)
    assert s.bubble_time_s < (pp - 1) * t_critical  # not every fill/drain slot at the slowest stage's pace
    assert transformer_step("gpt3-175b", parallel=dict(tp=8, micro_batches=m)).bubble_time_s == 0


def test_mfu_is_model_flops_over_step_time_and_peak():
    spec = load_system("a100-80gb-sxm")
    s = transformer_step("gpt3-175b", batch=1, parallel=dict(tp=8, sp=True, pp=8, dp=16, zero_stage=1, micro_batches=16),
                         system=spec, dtype="bf16")
    m = load_model("gpt3-175b")
    tokens = 16 * 16 * m.seq_len
    # matrix FLOPs per token, no recompute: 72 l h^2 (1 + s/6h + V/12lh) per sequence token
    matrix = 72 * tokens * m.layers * m.hidden ** 2 * (1 + m.seq_len / (6 * m.hidden) + m.vocab / (12 * m.layers * m.hidden))
    assert 0 < s.model_flops_per_step / matrix - 1 < 0.01  # + norms, softmax, dropout, residuals
    assert s.mfu == pytest.approx(s.model_flops_per_step / (s.step_time_s * 1024 * spec.matrix_peak("bf16")))
    assert 0.2 < s.mfu < 0.8 and s.mem_fits


# ------------------------------------------------------------------------------ tensor parallel comm
def _comm(table, phase):
    return {r: (k, b) for r, k, b in zip(table.index, table[f"comm_{phase}_kind"], table[f"comm_{phase}_bytes"]) if b}


def test_megatron_tp_collectives_without_and_with_sp():
    m = load_model("gpt3-175b")
    kw = dict(batch=2, dtype="bf16", parallel=dict(tp=8))
    full = 2 * m.seq_len * m.hidden * 2  # (b, s, e) bf16
    t = estimate_transformer(m, **kw).set_index("sublayer")
    layer = t[t.stage == "layer"]
    # "g": all-reduce after out_proj and fc2 in forward; "f": all-reduce before qkv_proj and fc1 in backward
    assert _comm(layer, "fwd") == {"out_proj": ("allreduce", full), "fc2": ("allreduce", full)}
    assert _comm(layer, "bwd") == {"qkv_proj": ("allreduce", full), "fc1": ("allreduce", full)}
    spt = estimate_transformer(m, **{**kw, "parallel": dict(tp=8, sp=True)}).set_index("sublayer")
    layer = spt[spt.stage == "layer"]
    assert _comm(layer, "fwd") == {"qkv_proj": ("allgather", full), "out_proj": ("reducescatter", full),
                                   "fc1": ("allgather", full), "fc2": ("reducescatter", full)}
    assert _comm(layer, "bwd") == {"qkv_proj": ("allgather+reducescatter", 2 * full), "out_proj": ("allgather", full),
                                   "fc1": ("allgather+reducescatter", 2 * full), "fc2": ("allgather", full)}
    # norms, dropouts and residuals run on s/t tokens with SP
    assert spt.loc["dropout_attn"].act_mem == t.loc["dropout_attn"].act_mem / 8
    assert not estimate_transformer(m, batch=2)[["comm_fwd_bytes", "comm_bwd_bytes"]].to_numpy().any()


def test_tp_allreduce_time_is_the_ring_formula():
    spec = load_system("h100-sxm")
    t = estimate_transformer("gpt3-175b", batch=1, parallel=dict(tp=8), system=spec).set_index("sublayer")
    size = 2048 * 12288 * 2
    ring = size * 2 * 7 / 8 / (spec.intra_node_bandwidth_bytes_per_s * spec.efficiency["intra_node"])
    alpha = 2e-5  # GPU default collective latency (perfcheck/hardware/host_defaults.json)
    assert t.loc["fc2"].t_comm_fwd_s == pytest.approx(ring + alpha, rel=1e-12)
    assert t.loc["fc2"].pred_fwd_s == pytest.approx(max(t.loc["fc2"].t_compute_fwd_s, t.loc["fc2"].t_memory_fwd_s)
                                                    + t.loc["fc2"].t_overhead_fwd_s + t.loc["fc2"].t_comm_fwd_s)
    half = estimate_transformer("gpt3-175b", batch=1, parallel=dict(tp=8), system=spec, tp_overlap=0.5).set_index("sublayer")
    assert half.loc["fc2"].pred_fwd_s == pytest.approx(t.loc["fc2"].pred_fwd_s - 0.5 * t.loc["fc2"].t_comm_fwd_s)


# ---------------------------------------------------------------- two front-ends, one set of formulas
class MegatronBlock(nn.Module):
    """A GPT pre-norm layer with explicit (unfused) attention, written as the notebook's sublayers."""

    def __init__(self, e, h, f, p=0.1):
        super().__init__()
        self.h = h
        self.ln_1, self.ln_2 = nn.LayerNorm(e), nn.LayerNorm(e)
        self.qkv_proj, self.out_proj = nn.Linear(e, 3 * e), nn.Linear(e, e)
        self.fc1, self.act, self.fc2 = nn.Linear(e, f), nn.GELU(), nn.Linear(f, e)
        self.dropout_softmax, self.dropout_attn, self.dropout_mlp = nn.Dropout(p), nn.Dropout(p), nn.Dropout(p)

    def forward(self, x):
        b, s, e = x.shape
        q, k, v = self.qkv_proj(self.ln_1(x)).split(e, dim=2)
        q, k, v = (z.view(b, s, self.h, e // self.h).transpose(1, 2) for z in (q, k, v))
        probs = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(e // self.h), dim=-1)
        y = (self.dropout_softmax(probs) @ v).transpose(1, 2).reshape(b, s, e)
        x = x + self.dropout_attn(self.out_proj(y))
        return x + self.dropout_mlp(self.fc2(self.act(self.fc1(self.ln_2(x)))))


def test_layer_table_agrees_with_the_module_estimator_on_a_torch_block():
    e, h, f, b, s = 64, 4, 256, 2, 16
    with torch.device("meta"):
        block = MegatronBlock(e, h, f)
    x = torch.empty(b, s, e, device="meta", requires_grad=True)  # a middle layer: its input needs a grad
    mod = estimate(block, (x,), system="h100-sxm", dtype="fp32").set_index("module")
    spec = dict(name="tiny", layers=1, hidden=e, heads=h, ffn_hidden=f, vocab=100, seq_len=s, norm="layernorm",
                activation="gelu", bias=True, tied_embeddings=True, dropout=0.1)
    tab = estimate_transformer(spec, batch=b, dtype="fp32").set_index("sublayer")
    layer = tab[tab.stage == "layer"]
    assert mod.loc[ROOT].macs_fwd == layer.macs_fwd.sum() == b * s * (4 * e * e + 2 * e * f) + 2 * b * s * s * e
    assert mod.loc[ROOT].macs_bwd == layer.macs_bwd.sum() == 2 * layer.macs_fwd.sum()
    assert mod.loc[ROOT].params == layer.params.sum()
    for ours, theirs in (("layer_norm_1", "ln_1"), ("qkv_proj", "qkv_proj"), ("out_proj", "out_proj"),
                         ("layer_norm_2", "ln_2"), ("fc1", "fc1"), ("act", "act"), ("fc2", "fc2")):
        for col in ("macs_fwd", "macs_bwd", "flops_fwd", "flops_bwd", "bytes_fwd", "bytes_bwd", "act_mem"):
            assert layer.loc[ours, col] == mod.loc[theirs, col], (ours, col)


def test_whole_model_agrees_with_the_module_estimator_on_the_example_gpt():
    layers, heads, d, vocab, seq, b = 2, 4, 64, 100, 32, 3
    with torch.device("meta"):
        gpt = GPT(n_layer=layers, n_head=heads, d_model=d, vocab=vocab, seq_len=seq)  # SDPA, dropout 0, tied
    mod = estimate(gpt, (torch.zeros(b, seq, dtype=torch.long, device="meta"),), system="h100-sxm", dtype="fp32")
    root = mod.set_index("module").loc[ROOT]
    spec = dict(name="tiny-gpt", layers=layers, hidden=d, heads=heads, ffn_hidden=4 * d, vocab=vocab, seq_len=seq,
                norm="layernorm", activation="gelu", bias=True, tied_embeddings=True, dropout=0.0)
    tab = estimate_transformer(spec, batch=b, dtype="fp32", flash=True)
    total = lambda col: (tab[col] * tab["count"]).sum()  # noqa: E731
    assert total("macs_fwd") == root.macs_fwd and total("macs_bwd") == root.macs_bwd
    assert total("params") == root.params


# -------------------------------------------------------------------------------------- the sweep
def test_sweep_equals_one_layout_at_a_time():
    layouts = pd.DataFrame([
        dict(tp=8, pp=8, dp=16, zero_stage=1, micro_batch=1, sp=True, micro_batches=16, grad_accum_steps=1),
        dict(tp=4, pp=1, dp=32, zero_stage=3, micro_batch=2, sp=False, micro_batches=4, grad_accum_steps=1),
        dict(tp=2, pp=4, dp=4, zero_stage=0, micro_batch=4, sp=True, micro_batches=8, grad_accum_steps=2),
        dict(tp=1, pp=1, dp=64, zero_stage=2, micro_batch=1, sp=False, micro_batches=1, grad_accum_steps=1),
    ])
    for recompute in ("none", "selective", "full"):
        out = sweep_transformer("gpt3-175b", layouts, system="a100-80gb-sxm", recompute=recompute)
        for i, row in layouts.iterrows():
            par = {k: (bool(v) if k == "sp" else int(v)) for k, v in row.items() if k != "micro_batch"}
            one = transformer_step("gpt3-175b", batch=int(row.micro_batch), parallel=par, system="a100-80gb-sxm",
                                   recompute=recompute)
            for col, value in one.values.items():
                assert out.loc[i, col] == pytest.approx(value, rel=1e-12), (i, col, recompute)


def test_sweep_of_many_layouts_is_vectorised():
    grid = pd.DataFrame([dict(tp=tp, pp=pp, dp=dp, zero_stage=z, micro_batch=mb)
                         for tp in (1, 2, 4, 8) for pp in (1, 2, 4) for dp in (1, 8, 64) for z in (0, 1)
                         for mb in (1, 2, 4, 8)])
    out = sweep_transformer("llama-7b", grid)
    assert len(out) == len(grid) and np.isfinite(out["step_time_s"]).all()
    best = out.loc[out["tokens_per_s"].idxmax()]
    assert best.dp == 64  # more replicas, more tokens per second


@settings(max_examples=25, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), sp=st.booleans(), b=st.integers(1, 8), s=st.sampled_from([128, 512, 2048]),
       flash=st.booleans(), causal=st.booleans())
def test_tensor_parallelism_conserves_work_and_moves_megatron_volumes(tp, sp, b, s, flash, causal):
    """t GPUs together do the unsharded layer's matrix work, and the TP collectives of one layer
    carry 4 all-reduces of (b,s,e) without SP; with SP the same ring volume plus the 2 backward
    re-gathers: 10 x S (t-1)/t per GPU instead of 8 x S (t-1)/t."""
    sp = sp and tp > 1
    m = load_model("gpt3-175b")
    kw = dict(batch=b, seq=s, dtype="bf16", flash=flash, causal=causal)
    one = estimate_transformer(m, **kw)
    sharded = estimate_transformer(m, parallel=dict(tp=tp, sp=sp), **kw)
    lay1, layt = one[one.stage == "layer"], sharded[sharded.stage == "layer"]
    assert tp * layt.macs_fwd.sum() == lay1.macs_fwd.sum() and tp * layt.macs_bwd.sum() == lay1.macs_bwd.sum()
    size, ring = b * s * m.hidden * 2, (tp - 1) / tp
    wire = 0.0
    for phase in ("fwd", "bwd"):
        for kinds, nbytes in zip(layt[f"comm_{phase}_kind"], layt[f"comm_{phase}_bytes"]):
            if nbytes:
                factor = 2 * ring if kinds == "allreduce" else ring
                wire += nbytes * factor
    assert wire == pytest.approx((10 if sp else 8) * size * ring, rel=1e-12)

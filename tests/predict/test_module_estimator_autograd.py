"""Issue #13: the module estimator on what people train today, each defect on its minimal case.

Backward follows autograd (no_grad, .detach(), frozen weights); meta-device and CPU models give
identical numbers, run after run; MoE experts through torch._grouped_mm are traced in any dtype
and their MACs counted exactly; activation checkpointing's recompute is its own quantity; a
TorchScript submodule is a one-line error; in-place metadata/pointwise ops are modelled; a
failing trace prints one line; the CPU target costs attention the way the CPU runs it.
References are hand derivations (arithmetic in the comments) and FlopCounterMode."""

import pandas as pd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import perfcheck
from perfcheck.errors import UserError
from perfcheck.examples.models import GPT
from perfcheck.schema import ROOT
from reference import flop_counter_by_module


def _est(model, inputs, system="cpu", **kw):
    return perfcheck.estimate(model, inputs, system=system, **kw).set_index("module")


# ------------------------------------------------------------- 1. backward only where autograd goes
class _Distill(nn.Module):
    """A frozen teacher run under no_grad next to a trainable student (knowledge distillation)."""

    def __init__(self):
        super().__init__()
        self.teacher = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 64))
        self.student = nn.Linear(64, 64)

    def forward(self, x):
        with torch.no_grad():
            t = self.teacher(x)
        return self.student(x) + t


def test_no_grad_submodule_has_no_backward():
    est = _est(_Distill(), (torch.randn(8, 64),))
    # teacher forward: 8*64*512 + 8*512*64 = 524,288 MACs; backward: none (no_grad).
    assert est.loc["teacher", "macs_fwd"] == 524_288
    assert est.loc["teacher", ["macs_bwd", "flops_bwd", "bytes_bwd", "act_mem"]].tolist() == [0, 0, 0, 0]
    assert est.loc["teacher", "kernels_bwd"] == 0
    # student: the input needs no grad, so only the weight gradient: 8*64*64 = 32,768 MACs.
    assert est.loc[ROOT, "macs_bwd"] == est.loc["student", "macs_bwd"] == 32_768
    # FlopCounterMode agrees on the root (it counts what autograd runs).
    assert 2 * est.loc[ROOT, "macs_bwd"] == flop_counter_by_module(_Distill(), (torch.randn(8, 64),))[ROOT][1]


def test_detached_branch_has_no_backward_and_keeps_no_activations():
    class Detached(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)

        def forward(self, x):
            return self.b(self.a(x).detach())

    est = _est(Detached(), (torch.randn(8, 64),))
    assert est.loc["a", "macs_fwd"] == 8 * 64 * 64
    assert est.loc["a", "macs_bwd"] == 0 and est.loc["a", "act_mem"] == 0  # its graph is freed at the detach
    assert est.loc["b", "macs_bwd"] == 8 * 64 * 64  # weight gradient only: its input is detached
    assert est.loc["b", "act_mem"] == 8 * 64 * 4  # b keeps its fp32 input for the weight gradient


def test_frozen_middle_layer_computes_only_the_input_gradient():
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16))
    model[1].requires_grad_(False)
    est = _est(model, (torch.randn(4, 16),))
    mm = 4 * 16 * 16
    assert est.loc["0", "macs_bwd"] == mm  # weight grad only (input needs none)
    assert est.loc["1", "macs_bwd"] == mm  # input grad only (frozen weight)
    assert est.loc["2", "macs_bwd"] == 2 * mm
    ref = flop_counter_by_module(model, (torch.randn(4, 16),))
    assert 2 * est.loc[ROOT, "macs_bwd"] == ref[ROOT][1]


# ------------------------------------------------------------- 2. meta device == CPU, every run
def _vit_like(device):
    with torch.device(device):
        layer = nn.TransformerEncoderLayer(96, 3, 384, batch_first=True, norm_first=True, dropout=0.0)
        return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), (torch.randn(2, 50, 96),)


def _mha(device, **_):
    with torch.device(device):
        m, x = nn.MultiheadAttention(64, 4, batch_first=True), torch.randn(2, 16, 64)
    return m, (x, x, x)


def _gpt(device, use_sdpa=True, dropout=0.0):
    with torch.device(device):
        m = GPT(n_layer=2, n_head=4, d_model=64, vocab=100, seq_len=32, use_sdpa=use_sdpa, dropout=dropout)
    return m, (torch.zeros(2, 32, dtype=torch.long, device=device),)


_NUMERIC = ["params", "macs_fwd", "macs_bwd", "flops_fwd", "flops_bwd", "bytes_fwd", "bytes_bwd", "act_mem",
            "pred_fwd_s", "pred_bwd_s"]


@pytest.mark.parametrize("system", ["cpu", pytest.param("h100-sxm", marks=pytest.mark.slow)])  # h100: full suite
@pytest.mark.parametrize("build,kwargs", [
    (_vit_like, {}), (_mha, {}), (_mha, {"need_weights": False}),
    (lambda d: _gpt(d), {}), (lambda d: _gpt(d, use_sdpa=False, dropout=0.1), {}),
    (lambda d: _gpt(d, dropout=0.1), {}),
], ids=["vit", "mha", "mha-no-weights", "gpt-sdpa", "gpt-mha-dropout", "gpt-sdpa-dropout"])
def test_meta_and_cpu_models_estimate_identically_every_time(build, kwargs, system):
    frames = []
    for device in ("cpu", "meta", "cpu", "meta"):
        model, inputs = build(device)
        frames.append(perfcheck.estimate(model, inputs, system=system, kwargs=kwargs)[["module"] + _NUMERIC])
    for other in frames[1:]:
        pd.testing.assert_frame_equal(frames[0], other, check_dtype=False)
    assert frames[0].set_index("module").loc[ROOT, "act_mem"] > 0


def test_multihead_attention_without_weights_is_the_fused_kernel_on_a_gpu_target():
    model, inputs = _mha("meta")
    est = _est(model, inputs, system="h100-sxm", kwargs={"need_weights": False})
    t, e, h, s, b = 32, 64, 4, 16, 2
    proj = t * 3 * e * e + t * e * e  # in_proj (q, k, v) and out_proj: 393,216 + 131,072
    attn = b * h * s * s * (e // h) * 2  # QK^T and PV: 65,536
    assert est.loc[ROOT, "macs_fwd"] == proj + attn
    # backward: in_proj weight grad only (inputs need none), out_proj both, fused attention 2.5x forward
    assert est.loc[ROOT, "macs_bwd"] == t * 3 * e * e + 2 * t * e * e + 2.5 * attn


# ------------------------------------------------------------- 3. MoE experts: torch._grouped_mm
class _Experts(nn.Module):
    """HF-style experts: tokens sorted by expert, one grouped GEMM against (E, f, d) weights."""

    def __init__(self, experts=4, d=16, f=32):
        super().__init__()
        self.w = nn.Parameter(torch.randn(experts, f, d))

    def forward(self, x, offs):
        return torch._grouped_mm(x, self.w.transpose(-2, -1), offs=offs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_is_traced_in_any_dtype_and_counted_exactly(dtype):
    model = _Experts().to(dtype)
    x = torch.randn(64, 16, dtype=dtype, requires_grad=True)
    offs = torch.tensor([10, 30, 50, 64], dtype=torch.int32)
    assert model(x, offs).shape == (64, 32)  # the CPU runs it in this dtype
    est = _est(model, (x, offs))
    root = est.loc[ROOT]
    # 64 tokens x (16 -> 32) each, whatever the split between experts: 64*16*32 = 32,768 MACs;
    # backward: grad_x (same) + grad_w (same) = 65,536.
    assert (root.macs_fwd, root.macs_bwd, root.unmodeled_ops) == (32_768, 65_536, "")
    assert root.act_mem == 64 * 16 * x.element_size()  # x, kept for the weight gradient


def test_grouped_mm_batched_and_2d_by_2d_forms():
    a, b = torch.randn(4, 8, 16, dtype=torch.bfloat16), torch.randn(4, 16, 24, dtype=torch.bfloat16)

    class Batched(nn.Module):
        def forward(self, a, b):
            return torch._grouped_mm(a, b)

    class WeightGrad(nn.Module):  # 2D x 2D: K split by offsets, out (G, M, N)
        def forward(self, a, b, offs):
            return torch._grouped_mm(a, b, offs=offs)

    assert _est(Batched(), (a, b)).loc[ROOT, "macs_fwd"] == 4 * 8 * 16 * 24
    a2, b2 = torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(64, 24, dtype=torch.bfloat16)
    offs = torch.tensor([16, 32, 48, 64], dtype=torch.int32)
    assert _est(WeightGrad(), (a2, b2, offs)).loc[ROOT, "macs_fwd"] == 8 * 64 * 24  # M * K_total * N


# ------------------------------------------------------------- 4. activation-checkpoint recompute
def _recomputed_macs(model_cls, x):
    """MACs torch re-runs in backward (the independent reference): FlopCounterMode's matrix FLOPs of the
    backward less the gradients' own (2 MACs per output element of each GEMM's two gradients, counted
    on the same model with checkpoint replaced by a plain call)."""
    import torch.utils.checkpoint as ckpt
    from torch.utils.flop_counter import FlopCounterMode

    counts = []
    for plain in (False, True):
        torch.manual_seed(0)
        model = model_cls()
        real = ckpt.checkpoint
        if plain:
            globals()["checkpoint"] = lambda fn, *a, **k: fn(*a)
        try:
            y = model(x)
        finally:
            globals()["checkpoint"] = real
        with FlopCounterMode(display=False) as fc:
            y.sum().backward()
        counts.append(fc.get_total_flops())
    return (counts[0] - counts[1]) // 2


def test_checkpoint_early_stop_minimal_case_counts_what_torch_reruns():
    """checkpoint(lambda x: b(relu(a(x)))), two Linear(64, 64), x (32, 64) (issue 21): torch re-runs a
    (32*64*64 = 131,072 MACs) and relu, not b; FlopCounterMode on the backward is the reference."""
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)

        def forward(self, x):
            return checkpoint(lambda t: self.b(torch.relu(self.a(t))), x, use_reentrant=False)

    x = torch.randn(32, 64, requires_grad=True)
    est = _est(Two(), (x,))
    assert est.loc[ROOT, "macs_recompute"] == 131_072 == _recomputed_macs(Two, x)
    assert est.loc["b", "macs_recompute"] == 0
    from torch.utils.checkpoint import set_checkpoint_early_stop

    with set_checkpoint_early_stop(False):  # without early stop the whole region re-runs
        assert _est(Two(), (x,)).loc[ROOT, "macs_recompute"] == 262_144 == _recomputed_macs(Two, x)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_recompute_is_predicted_as_its_own_quantity(reentrant):
    class Checkpointed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.head = nn.Linear(32, 64), nn.Linear(64, 32), nn.Linear(32, 8)

        def forward(self, x):
            y = checkpoint(lambda t: self.b(F.gelu(self.a(t))), x, use_reentrant=reentrant)
            return self.head(y)

    x = torch.randn(4, 32, requires_grad=True)
    est = _est(Checkpointed(), (x,))
    # a: 4*32*64 = 8,192 MACs, b: 4*64*32 = 8,192; re-run once in backward. head is not checkpointed.
    # Non-reentrant checkpoint stops re-running once it has saved as many tensors as the forward did
    # (early stop, torch's default): b's operands, saved before b runs, are the last, so b is not re-run.
    b_rerun = 8_192 if reentrant else 0
    assert est.loc["a", "macs_recompute"] == 8_192 and est.loc["b", "macs_recompute"] == b_rerun
    assert est.loc["head", "macs_recompute"] == 0 and est.loc["head", "pred_recompute_s"] == 0
    assert est.loc[ROOT, "macs_recompute"] == 8_192 + b_rerun == _recomputed_macs(Checkpointed, x)
    assert est.loc[ROOT, "flops_recompute"] > 2 * (8_192 + b_rerun)  # + GELU and the bias adds
    # the device time of a's forward kernels again (pred_fwd_s also carries host time)
    assert 0 < est.loc["a", "pred_recompute_s"] <= est.loc["a", "pred_fwd_s"]
    # backward itself is unchanged: both gradients of a and b (the input requires grad)
    assert est.loc["a", "macs_bwd"] == est.loc["b", "macs_bwd"] == 2 * 8_192
    assert est.loc["a", "act_mem"] == 0  # nothing inside the region is kept


def test_no_checkpoint_no_recompute():
    est = _est(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), (torch.randn(2, 8),))
    assert (est["macs_recompute"] == 0).all() and (est["pred_recompute_s"] == 0).all()


# ------------------------------------------------------------- 5. TorchScript submodule
def test_torchscript_submodule_is_a_one_line_error_naming_it():
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = torch.jit.script(nn.Linear(8, 8))
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            return self.head(self.enc(x))

    with pytest.raises(UserError) as err:
        perfcheck.estimate(Mixed(), (torch.randn(2, 8),), system="cpu")
    message = str(err.value)
    assert "'enc'" in message and "TorchScript" in message and "\n" not in message


# ------------------------------------------------------------- 6. smaller ones
def test_inplace_metadata_and_inplace_pointwise_ops_are_modelled():
    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            y = self.lin(x)
            y.as_strided_((2, 8), (8, 1))
            return y.masked_fill_(y > 0, 0.0)

    root = _est(InPlace(), (torch.randn(2, 8),)).loc[ROOT]
    assert root.unmodeled_ops == ""
    assert root.flops_fwd == 2 * 2 * 8 * 8 + 2 * 8 + 2 * 8 + 2 * 8  # matmul, bias add, the compare, the fill


def test_failing_trace_prints_nothing_but_perfcheck_error(capfd):
    class Mismatch(nn.Module):
        def forward(self, a, b):
            return torch._grouped_mm(a, b)  # batch sizes differ: torch's meta kernel refuses

    with pytest.raises(UserError) as err:
        perfcheck.estimate(Mismatch(), (torch.randn(4, 8, 16, dtype=torch.bfloat16),
                                        torch.randn(3, 16, 8, dtype=torch.bfloat16)), system="cpu")
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""
    assert "\n" not in str(err.value)


def _attention_block(dropout=0.0, mask_grad=False):
    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.mask = nn.Parameter(torch.zeros(16, 16), requires_grad=mask_grad)

        def forward(self, q, k, v):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, dropout_p=dropout)

    return Attn()


@pytest.mark.parametrize("case", ["dropout", "mask_grad"])
def test_cpu_target_costs_attention_as_the_math_path_the_cpu_runs(case):
    qkv = tuple(torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    model = _attention_block(dropout=0.1 if case == "dropout" else 0.0, mask_grad=case == "mask_grad")
    fwd = 2 * 4 * 16 * 16 * 8 * 2  # QK^T and PV per (batch, head): 16,384 MACs
    cpu = _est(model, qkv).loc[ROOT]
    gpu = _est(model, qkv, system="h100-sxm").loc[ROOT]
    assert cpu.macs_fwd == gpu.macs_fwd == fwd
    assert cpu.macs_bwd == 2 * fwd  # math path: two bmm gradients each, no recomputed QK^T
    assert gpu.macs_bwd == 2.5 * fwd  # fused kernel (its backward recomputes QK^T)
    assert cpu.act_mem > 2 * 4 * 16 * 16 * 4  # the math path keeps the (s x s) probabilities


def test_cpu_target_without_dropout_or_mask_grad_is_the_cpu_flash_kernel():
    qkv = tuple(torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    root = _est(_attention_block(), qkv).loc[ROOT]
    assert root.macs_bwd == 2.5 * root.macs_fwd


def test_flash_transformer_layer_counts_the_attention_output_once():
    from perfcheck.predict.transformer import estimate_transformer

    layers, heads, d, vocab, seq, b = 2, 4, 64, 100, 32, 3
    with torch.device("meta"):
        gpt = GPT(n_layer=layers, n_head=heads, d_model=d, vocab=vocab, seq_len=seq)
    mod = _est(gpt, (torch.zeros(b, seq, dtype=torch.long, device="meta"),), system="h100-sxm", dtype="fp32")
    spec = dict(name="tiny-gpt", layers=layers, hidden=d, heads=heads, ffn_hidden=4 * d, vocab=vocab, seq_len=seq,
                norm="layernorm", activation="gelu", bias=True, tied_embeddings=True, dropout=0.0)
    tab = estimate_transformer(spec, batch=b, dtype="fp32", flash=True)
    layer = tab[tab.stage == "layer"].set_index("sublayer")
    assert layer.act_mem.sum() == mod.loc["h.0", "act_mem"]
    # core attention keeps q, k, v (3*T*e) and the fp32 log-sum-exp (b*h*s); out is out_proj's input.
    t = b * seq
    assert layer.loc["core_attention", "act_mem"] == (3 * t * d + b * heads * seq) * 4

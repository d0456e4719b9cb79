"""The eager Llama ops (perfcheck/predict/eager_ops.py) against an independent count: ``perfcheck.estimate``'s trace
of the reference code itself (torchtitan's model.py at 1ea476e9f, copied below), each aten op costed at the width
it runs in (the model's own dtypes: bf16 tensors, fp32 upcasts), and against hand arithmetic; then the front-end's
``eager`` rows and what they add to a layer."""
import pytest
import torch
import torch.nn as nn

from perfcheck.predict import eager_ops
from perfcheck.predict import trace as tracing
from perfcheck.predict.module_estimator import _op_table
from perfcheck.predict.transformer import estimate_transformer


class RMSNorm(nn.Module):  # torchtitan/models/norms.py (1ea476e9f)
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


class Rotary(nn.Module):  # apply_rotary_emb, one of q, k
    def forward(self, xq, freqs_cis):
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        return torch.view_as_real(xq_ * freqs_cis).flatten(3).type_as(xq)


class RepeatKV(nn.Module):
    def __init__(self, n_rep):
        super().__init__()
        self.n_rep = n_rep

    def forward(self, x):
        bs, slen, kv, d = x.shape
        return x[:, :, :, None, :].expand(bs, slen, kv, self.n_rep, d).reshape(bs, slen, kv * self.n_rep, d)


class OutCopy(nn.Module):
    def forward(self, o):
        return o.transpose(1, 2).contiguous().view(o.shape[0], o.shape[2], -1)


def _traced(module, *args):
    """Sum of the traced ops' (bytes, kernels, FLOPs) per phase, at the tensors' own widths."""
    ops = _op_table(tracing.trace_model(module, args), False)
    return {p: (ops[f"bytes_{p}"].sum(), ops[f"kernels_{p}"].sum(), ops[f"other_{p}"].sum()) for p in ("fwd", "bwd")}


def _meta(*shape, dtype=torch.bfloat16, grad=True):
    return torch.empty(*shape, dtype=dtype, device="meta", requires_grad=grad)


def test_rms_norm_is_its_eight_kernels_forward_and_sixteen_backward():
    """Kernels as torch.profiler lists the reference RMSNorm's backward (CPU, torch 2.13): the weight's product and
    its sum, g w, the type_as cast, r's product and its sum, g r, rsqrt's three (-0.5 *, pow, *), mean's divide,
    pow's three (x.pow(1), 2 *, grad *), the sum of x.float()'s two gradients, the cast back: 16."""
    T, e = 1024, 512
    with torch.device("meta"):
        norm = RMSNorm(e).to(torch.bfloat16)
    got = eager_ops.eager_rms_norm(T, e, 2)
    traced = _traced(norm, _meta(1, T, e))
    assert got.fwd.bytes == pytest.approx(traced["fwd"][0], rel=0.005)
    assert got.bwd.bytes == pytest.approx(traced["bwd"][0], rel=0.005)
    assert (got.fwd.kernels, got.bwd.kernels) == (traced["fwd"][1], traced["bwd"][1]) == (8, 16)  # + eps: none
    assert got.fwd.bytes == pytest.approx(36 * T * e, rel=0.005)  # by hand: 7 x 4 + 4 x 2 bytes per element in bf16
    assert got.bwd.bytes == pytest.approx(92 * T * e, rel=0.005)  # 19 x 4 + 8 x 2


@pytest.mark.parametrize("T, h, d", [(1024, 8, 64), (512, 32, 128)])
def test_rotary_is_a_cast_a_complex_product_and_a_cast_back(T, h, d):
    freqs = torch.empty(1, T, 1, d // 2, dtype=torch.complex64, device="meta")
    got = eager_ops.rotary_complex(T * h * d, T * d // 2, 2)
    traced = _traced(Rotary(), _meta(1, T, h, d), freqs)
    for p in ("fwd", "bwd"):
        assert got.__getattribute__(p).bytes == pytest.approx(traced[p][0], rel=0.005), p
        assert getattr(got, p).kernels == traced[p][1] == 3
    assert got.fwd.bytes == pytest.approx(20 * T * h * d + T * d // 2 * 8)  # (4 x 4 + 2 x 2) per element + table


def test_repeat_kv_copies_forward_and_sums_backward():
    T, kv, rep, d = 1024, 2, 4, 64
    got = eager_ops.repeat_kv(T * kv * rep * d, rep, 2)
    traced = _traced(RepeatKV(rep), _meta(1, T, kv, d))
    assert (got.fwd.bytes, got.bwd.bytes) == pytest.approx((traced["fwd"][0], traced["bwd"][0]))
    assert got.bwd.bytes == pytest.approx(2 * T * kv * rep * d * 1.25)  # read the gradient, write a quarter


def test_output_copy_is_one_copy_forward_none_backward():
    T, h, d = 1024, 8, 64
    got = eager_ops.transpose_copy(T * h * d, 2)
    traced = _traced(OutCopy(), _meta(1, h, T, d))
    assert (got.fwd.bytes, got.bwd.bytes, got.bwd.kernels) == pytest.approx((traced["fwd"][0], traced["bwd"][0], 0))


LLAMA = dict(name="t", layers=2, hidden=1024, heads=16, kv_heads=4, ffn_hidden=2816, vocab=1000, seq_len=2048,
             norm="rmsnorm", activation="swiglu", bias=False, tied_embeddings=False, position="rotary")


def test_eager_rows_in_the_front_end():
    """eager=True: the rotary row is the complex path on q and k, repeat_kv copies k and v (4 kv heads -> 16), the
    attention output is copied where the attention is unfused (a fused kernel writes it as (b, s, h, d), so its
    transpose is contiguous: no copy, as the trace of the code shows); eager_norm=True: the norms are the
    eight-kernel RMSNorm. Bytes by hand."""
    b, s, e, q = 1, 2048, 1024, 64
    T = b * s
    fused = estimate_transformer(LLAMA, batch=b, system="h100-sxm", dtype="bf16", flash=True,
                                 causal=True).set_index("sublayer")
    eager = estimate_transformer(LLAMA, batch=b, system="h100-sxm", dtype="bf16", flash=True, causal=True,
                                 eager=True, eager_norm=True).set_index("sublayer")
    qk = T * (16 + 4) * q
    assert eager.loc["rotary", "bytes_fwd"] == pytest.approx(20 * qk + 2 * s * q // 2 * 8)
    assert eager.loc["repeat_kv", "bytes_fwd"] == pytest.approx(2 * (2 * 2 * T * 16 * q))  # k and v, 2 eb each
    assert "attn_out_copy" not in eager.index
    unfused = estimate_transformer(LLAMA, batch=b, system="h100-sxm", dtype="bf16", flash=False, causal=True,
                                   eager=True, eager_norm=True).set_index("sublayer")
    assert unfused.loc["attn_out_copy", "bytes_fwd"] == pytest.approx(2 * 2 * T * e)
    assert eager.loc["layer_norm_1", "bytes_fwd"] == pytest.approx(36 * T * e + 6 * T * 4 + e * 2)  # rows: mean,
    # + eps (read and write), rsqrt (read and write), x * r
    for row in ("core_attention", "out_proj", "fc2"):  # the attention kernel and the other GEMMs do not move
        assert eager.loc[row, "pred_fwd_s"] == fused.loc[row, "pred_fwd_s"]
    assert "repeat_kv" not in fused.index and "attn_out_copy" not in fused.index
    assert eager["pred_fwd_s"].sum() > fused["pred_fwd_s"].sum()


def test_eager_projections_are_separate_gemms_of_their_own_shapes():
    """The reference code's wq, wk, wv (and w1, w3) are separate GEMMs: the same FLOPs as the fused rows, each at
    its own shape's rate. On a spec without a shape curve the times add up to the fused row's; on h100-sxm's
    measured curve the k and v products (N = 4 kv heads x 64 = 256) run at the curve's 256 point, by hand."""
    import dataclasses

    from perfcheck.hardware.systems import load_system
    from perfcheck.predict.roofline import shape_factor

    kw = dict(batch=1, dtype="bf16", flash=True, causal=True)
    plain = dict(system=dataclasses.replace(load_system("a100-80gb-sxm"), matrix_shape_curve=()), **kw)
    fused = estimate_transformer(LLAMA, **plain).set_index("sublayer")
    eager = estimate_transformer(LLAMA, eager=True, **plain).set_index("sublayer")
    qkv, fc1 = ["q_proj", "k_proj", "v_proj"], ["fc1_gate", "fc1_up"]
    for split, whole in ((qkv, "qkv_proj"), (fc1, "fc1")):
        assert eager.loc[split, "flops_fwd"].sum() == pytest.approx(fused.loc[whole, "flops_fwd"])
        assert eager.loc[split, "t_compute_fwd_s"].sum() == pytest.approx(fused.loc[whole, "t_compute_fwd_s"])
        assert eager.loc[split, "act_mem"].sum() == pytest.approx(fused.loc[whole, "act_mem"])  # x saved once
    h100 = load_system("h100-sxm")
    eager = estimate_transformer(LLAMA, system=h100, eager=True, **kw).set_index("sublayer")
    T, e = 2048, 1024
    rate = 989.4e12 * h100.matrix_efficiency("bf16")
    assert eager.loc["k_proj", "t_compute_fwd_s"] == pytest.approx(2 * T * e * 256 / (rate * shape_factor(h100, 256)))
    assert eager.loc["q_proj", "t_compute_fwd_s"] == pytest.approx(2 * T * e * 1024 / (rate * shape_factor(h100, 1024)))


def test_selective_op_reruns_wk_and_w3_as_their_own_rows():
    """torchtitan's op-level policy keeps mm calls 1, 3, 5, 7 (wq, wv, w1, w2) and the SDPA output, and re-runs wk,
    wo, w3 and every non-matmul op: with the GEMMs apart the recompute is, by hand, the forward of k_proj, out_proj,
    fc1_up and of every elementwise row, per layer (tp 1, one micro-batch)."""
    from perfcheck.predict.transformer import transformer_step

    kw = dict(batch=1, system="a100-80gb-sxm", dtype="bf16", flash=True, causal=True, eager=True)
    rows = estimate_transformer(LLAMA, **kw).set_index("sublayer")
    layer = rows[rows["stage"] == "layer"]
    kept = {"q_proj", "v_proj", "fc1_gate", "fc2", "core_attention"}
    expected = LLAMA["layers"] * layer.loc[[r for r in layer.index if r not in kept], "pred_fwd_s"].sum()
    got = transformer_step(LLAMA, recompute="selective_op", **kw).values["recompute_time_s"]
    assert got == pytest.approx(expected, rel=1e-9)
    assert {"k_proj", "out_proj", "fc1_up", "rotary", "repeat_kv"} <= set(layer.index) - kept


class LossHead(nn.Module):
    """The reference Llama code's head and torchtitan's loss: ``self.output(h).float()``, then cross entropy."""

    def __init__(self, e, vocab):
        super().__init__()
        self.output = nn.Linear(e, vocab, bias=False)

    def forward(self, h, labels):
        return nn.functional.cross_entropy(self.output(h).float().flatten(0, 1), labels.flatten(0, 1))


def test_loss_row_is_the_fp32_cast_log_softmax_and_nll_loss():
    """The cross-entropy row (sharding_shape.cross_entropy_sublayer) against the trace of the code: the widening cast
    of bf16 logits (6 bytes per element each way, off a GPU's loop forward), log_softmax and nll_loss in fp32."""
    from perfcheck.predict.sharding_shape import cross_entropy_sublayer

    T, e, vocab = 512, 256, 1000
    with torch.device("meta"):
        head = LossHead(e, vocab).to(torch.bfloat16)
    ops = _op_table(tracing.trace_model(head, (_meta(1, T, e), torch.zeros(1, T, dtype=torch.long, device="meta"))),
                    False)
    row = cross_entropy_sublayer(T, vocab, 2, upcast=True)
    parts = dict(row.parts)
    assert [name for name, _ in row.parts] == ["_to_copy", "_log_softmax", "nll_loss_forward"]
    traced = ops.set_index("name")
    for name in ("_to_copy", "_log_softmax"):
        for phase in ("fwd", "bwd"):
            got = getattr(parts[name], phase)
            assert got.bytes == pytest.approx(traced.loc[name, f"bytes_{phase}"]), (name, phase)
            assert got.strided_elems == traced.loc[name, f"strided_elems_{phase}"], (name, phase)
    assert parts["_to_copy"].fwd.bytes == 6 * T * vocab  # by hand: read bf16, write fp32
    assert parts["nll_loss_forward"].bwd.bytes == pytest.approx(traced.loc["nll_loss_forward", "bytes_bwd"])
    assert row.cost.fwd.kernels == traced.loc[["_to_copy", "_log_softmax", "nll_loss_forward"], "kernels_fwd"].sum()


class VocabParallelLossForward(nn.Module):
    """The forward of Megatron-LM's ``_VocabParallelCrossEntropy`` on one rank (megatron/mpu/cross_entropy.py; its
    all-reduces are no-ops at t = 1), on ``output.float()`` as ``post_language_model_processing`` calls it: the
    ops in the order that code runs them, in place on the fp32 copy."""

    def forward(self, logits, target):
        x = logits.float()
        x.sub_(torch.max(x, dim=-1)[0].unsqueeze(-1))
        torch.exp(x, out=x)
        sum_exp = x.sum(dim=-1)
        x.div_(sum_exp.unsqueeze(-1))
        return torch.log(sum_exp)


def test_megatron_loss_row_is_its_kernels_in_fp32():
    """sharding_shape.vocab_parallel_cross_entropy_sublayer against the trace of the loss's forward (each op's bytes
    and its kernels off a GPU's loop) and, backward (a hand-written autograd function the trace does not enter), by
    hand: mul_ by the broadcast loss gradient (4 + 4 bytes per element) and the cast down (4 + 2)."""
    from perfcheck.predict.sharding_shape import vocab_parallel_cross_entropy_sublayer

    T, vocab = 512, 1000
    ops = _op_table(tracing.trace_model(VocabParallelLossForward(), (_meta(T, vocab, grad=False),
                                                                     torch.zeros(T, dtype=torch.long, device="meta"))),
                    False)
    traced = ops[ops.kernels_fwd > 0].groupby("name")[["bytes_fwd", "kernels_fwd", "strided_elems_fwd"]].sum()
    row = vocab_parallel_cross_entropy_sublayer(T, vocab, 2)
    parts = dict(row.parts)
    assert [name for name, _ in row.parts] == ["_to_copy", "max", "sub_", "exp", "sum", "div_", "mul_"]
    for name in ("_to_copy", "max", "sub_", "exp", "sum", "div_"):  # the row statistics' bytes aside
        assert parts[name].fwd.bytes == pytest.approx(traced.loc[name, "bytes_fwd"], rel=0.01), name
        assert parts[name].fwd.strided_elems == traced.loc[name, "strided_elems_fwd"], name
    n = T * vocab
    assert row.cost.fwd.kernels == 6 and row.cost.fwd.bytes == (2 + 4 + 4 + 8 + 8 + 4 + 8) * n
    assert row.cost.bwd.kernels == 2 and row.cost.bwd.bytes == (8 + 6) * n
    assert row.cost.bwd.strided_elems == n  # mul_ by the broadcast gradient; the cast down stays on the loop
    assert row.cost.act_mem == 4 * n  # the fp32 softmax it saves
    fp32 = vocab_parallel_cross_entropy_sublayer(T, vocab, 4)
    assert (fp32.cost.fwd.kernels, fp32.cost.bwd.kernels) == (5, 1)  # .float() of fp32 logits returns them

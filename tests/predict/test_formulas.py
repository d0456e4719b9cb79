"""Per-op formulas: hand arithmetic, and activation memory against what autograd really saves."""
import numpy as np
import pytest
import torch
import torch.nn as nn

import perfcheck
from perfcheck.predict import formulas as F
from perfcheck.predict.aten_costs import register
from perfcheck.schema import ROOT


def test_linear_hand_count():
    # (tokens=6, in=4) @ (4, 3) + bias: 6*4*3 = 72 MACs; bias adds 6*3 = 18 FLOPs.
    c = F.linear(6, 4, 3, bias=True)
    assert (c.fwd.macs, c.fwd.flops, c.fwd.total_flops) == (72, 18, 162)
    # backward: grad_x 72 + grad_w 72 MACs, grad_b 18 FLOPs; saved: x (24 floats), not the weight.
    assert (c.bwd.macs, c.bwd.flops) == (144, 18)
    assert c.act_mem == 24 * 4 and c.params == 4 * 3 + 3
    first = F.linear(6, 4, 3, bias=True, x_grad=False)
    assert first.bwd.macs == 72
    frozen = F.linear(6, 4, 3, bias=True, w_grad=False)
    assert (frozen.bwd.macs, frozen.bwd.flops, frozen.act_mem) == (72, 0, 0)


def test_formulas_vectorise_over_numpy_arrays():
    tokens = np.array([1, 2, 4])
    c = F.linear(tokens, 8, 8)
    np.testing.assert_array_equal(c.fwd.macs, tokens * 64)
    np.testing.assert_array_equal(F.attention(tokens, 2, 16, 16, 8, 8).bwd.macs, 2.5 * tokens * 2 * 16 * 16 * 16)


def test_attention_counts_match_torch_sdpa_formulas():
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    b, h, s, d = 2, 3, 10, 8
    shape = (b, h, s, d)
    c = F.attention(b, h, s, s, d, d)
    assert 2 * c.fwd.macs == sdpa_flop_count(shape, shape, shape)
    assert 2 * c.bwd.macs == sdpa_backward_flop_count(shape, shape, shape, shape)
    assert F.attention(b, h, s, s, d, d, causal=True).fwd.macs == c.fwd.macs / 2


def test_conv_groups_hand_count():
    # N=2, C_in=8, C_out=4, groups=2, 3x3 kernel, 5x5 output: 2*4*25*(8/2)*9 = 7200 MACs.
    c = F.conv(2, 8, 4, 9, 25, 49, groups=2)
    assert c.fwd.macs == 7200 and c.bwd.macs == 2 * 7200
    assert c.params == 4 * (8 / 2) * 9


def test_dropout_keeps_a_one_byte_mask_and_eval_is_free():
    assert F.dropout(1000).act_mem == 1000
    assert F.dropout(1000, training=False) == F.OpCost()


def test_registering_an_op_twice_raises():
    with pytest.raises(RuntimeError, match="already has a cost formula"):
        register(torch.ops.aten.mm)(lambda call: None)


@pytest.mark.parametrize("module, shape, formula", [
    (nn.Linear(16, 32), (5, 16), lambda: F.linear(5, 16, 32)),
    (nn.ReLU(), (5, 16), lambda: F.activation(80, "relu")),
    (nn.GELU(), (5, 16), lambda: F.activation(80, "gelu")),
    # CPU dropout keeps a float mask (bernoulli_ then mul); CUDA's fused kernel a bool one.
    (nn.Dropout(0.5), (5, 16), lambda: F.dropout(80, mask_bytes=4)),
    (nn.LayerNorm(16), (5, 16), lambda: F.layer_norm(5, 16)),
    (nn.Softmax(dim=-1), (5, 16), lambda: F.softmax(5, 16)),
    (nn.BatchNorm1d(16), (5, 16), lambda: F.batch_norm(5, 16, 1)),
])
def test_activation_memory_formula_equals_what_autograd_saves(module, shape, formula):
    """The estimator reads act_mem from autograd's saved tensors; the formulas (used by the
    transformer front-end) must say the same bytes."""
    module.train()
    x = torch.randn(*shape, requires_grad=True)
    est = perfcheck.estimate(module, (x,), system="cpu").set_index("module").loc[ROOT]
    assert est.act_mem == pytest.approx(formula().act_mem)


def test_dropout_on_a_gpu_target_is_one_fused_kernel_with_a_byte_mask():
    """On a GPU system dropout is costed as CUDA's native_dropout (the trace on CPU would see
    bernoulli_/div_/mul and a float mask); on the cpu system as what the CPU runs."""
    x = torch.randn(5, 16, requires_grad=True)
    gpu = perfcheck.estimate(nn.Dropout(0.5), (x,), system="h100-sxm").set_index("module").loc[ROOT]
    assert gpu.act_mem == F.dropout(80).act_mem == 80
    assert gpu.kernels_fwd == 1 and gpu.bytes_fwd == F.dropout(80).fwd.bytes
    cpu = perfcheck.estimate(nn.Dropout(0.5), (x,), system="cpu").set_index("module").loc[ROOT]
    assert cpu.act_mem == 80 * 4 and cpu.kernels_fwd > 1


def test_sdpa_keeps_q_k_v_out_and_lse_not_the_attention_matrix():
    import torch.nn.functional as TF

    class Attention(nn.Module):
        def forward(self, q, k, v):
            return TF.scaled_dot_product_attention(q, k, v)

    b, h, s, d = 2, 4, 64, 16
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
    for device in ("cpu", "meta"):  # meta decomposes to the math path, whose s x s matrix is not kept
        args = tuple(t.to(device) if device == "meta" else t for t in (q, k, v))
        row = perfcheck.estimate(Attention(), args, system="h100-sxm").set_index("module").loc[ROOT]
        assert row.act_mem == 4 * (b * h * s * d) * 4 + b * h * s * 4, device

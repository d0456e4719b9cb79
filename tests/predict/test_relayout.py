"""A LayerNorm over a permuted view copies its input in both phases (predict.relayout): the copies by hand.

ATen's layer_norm_cpu and layer_norm_backward_cpu call ``input.expect_contiguous()``; the trace sees the norm only,
so ``relayout.insert`` puts a copy op before it. Expected bytes are hand arithmetic: n fp32 elements read and n
written, 8 n bytes per phase."""
import torch
from torch import nn

from perfcheck.predict import module_estimator as me
from perfcheck.predict.trace import trace_model


class _Permuted(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):  # (N, C, H, W) -> the (N, H, W, C) view, as torchvision's CNBlock
        return self.inner(x.permute(0, 2, 3, 1))


def _table(model, x):
    return me._op_table(trace_model(model, (x,)), False).set_index("name")


def test_a_norm_of_a_permuted_view_gets_one_copy_per_phase():
    x = torch.randn(2, 8, 3, 5, requires_grad=True)  # n = 240 elements
    t = _table(_Permuted(nn.LayerNorm(8)), x)
    assert list(t.index) == ["permute_copy", "native_layer_norm"]
    copy = t.loc["permute_copy"]
    assert copy.bytes_fwd == 2 * 240 * 4 and copy.kernels_fwd == 1
    assert copy.bytes_bwd == 2 * 240 * 4 and copy.kernels_bwd == 1
    assert copy.other_fwd == 0 and copy.macs_fwd == 0


def test_the_backward_copy_runs_for_the_weight_gradient_alone():
    # the input needs no gradient, the norm's weight does: its backward still copies the saved input
    t = _table(_Permuted(nn.LayerNorm(8)), torch.randn(2, 8, 3, 5))
    assert t.loc["permute_copy"].bytes_bwd == 2 * 240 * 4
    # a frozen norm on a plain input: no backward at all, the forward copy only
    t = _table(_Permuted(nn.LayerNorm(8).requires_grad_(False)), torch.randn(2, 8, 3, 5))
    assert t.loc["permute_copy"].bytes_fwd == 2 * 240 * 4 and t.loc["permute_copy"].bytes_bwd == 0


def test_a_contiguous_input_gets_no_copy():
    t = _table(nn.LayerNorm(8), torch.randn(2, 15, 8, requires_grad=True))
    assert list(t.index) == ["native_layer_norm"]


def test_the_copy_belongs_to_the_norms_module():
    model = nn.Sequential(nn.Conv2d(8, 8, 1), _Permuted(nn.LayerNorm(8)))
    tr = trace_model(model, (torch.randn(2, 8, 3, 5),))
    copy = next(o for o in tr.ops if o.call.name == "permute_copy")
    norm = next(o for o in tr.ops if o.call.name == "native_layer_norm")
    assert copy.stack == norm.stack and "1.inner" in copy.stack

"""Autograd's gradient accumulation (perfcheck.predict.grad_accumulation): a tensor consumed by k autograd edges
gets k - 1 backward-only adds of its size, charged to every consumer but the last in forward order.

References: hand counts on small modules, and torch's own profiler on a real CPU backward of the same model,
where the engine's InputBuffer adds are the ``aten::add``/``aten::add_`` events directly under an
``autograd::engine::evaluate_function`` (not inside any ``*Backward`` node)."""
from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch import nn

import perfcheck
from perfcheck.examples.models import Block
from perfcheck.predict.trace import trace_model


class Residual(nn.Module):
    """x -> LayerNorm -> Linear, + x; x made by a Linear so it needs a gradient."""

    def __init__(self, d=16):
        super().__init__()
        self.inp, self.ln, self.lin = nn.Linear(d, d), nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x):
        x = self.inp(x)
        return self.lin(self.ln(x)) + x


class ThreeUses(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.inp, self.a, self.b = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        x = self.inp(x)
        return self.a(x) + self.b(x) + x


class OneUse(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class NoGradBranch(nn.Module):
    """x used twice, but only under no_grad / detached the second time: autograd sums nothing."""

    def __init__(self, d=16):
        super().__init__()
        self.inp, self.a = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        x = self.inp(x)
        with torch.no_grad():
            y = self.a(x)
        return self.a(x) + y + x.detach()


class BasicBlock(nn.Module):
    """A ResNet basic block (conv-bn-relu-conv-bn + identity shortcut, relu) after a stem conv."""

    def __init__(self, c=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        x = self.stem(x)
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + x)


def _adds(model, x):
    """(consumer module path, gradient numel) of every accumulation op in the trace."""
    trace = trace_model(model, (x,))
    return [(op.stack[-1], op.call.outputs[0].numel) for op in trace.ops if op.grad_accumulate]


def _profiled_adds(model, x) -> int:
    """Accumulation adds autograd runs in a real CPU backward of ``model(x).sum()``, by torch's profiler."""
    loss = model(x).float().sum()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loss.backward()
    return sum(1 for e in prof.events() if e.name in ("aten::add", "aten::add_") and e.cpu_parent is not None
               and e.cpu_parent.name.startswith("autograd::engine::evaluate_function"))


def test_residual_one_add_in_the_layernorm():
    # x (4 x 16) feeds ln and the residual add; the add is created last, so its gradient arrives first and the
    # LayerNorm's (2nd) is summed into it: one add of 64 elements in ln's backward
    assert _adds(Residual(), torch.randn(4, 16)) == [("ln", 64)]


def test_gpt_block_adds_in_its_layernorms():
    # the block's input feeds ln_1 and the first residual add, their sum feeds ln_2 and the second one: both
    # LayerNorms pay one add of the residual stream (2 x 8 x 16), not the Linear after them (whose input is a
    # view of the LayerNorm's output)
    x = torch.randn(2, 8, 16, requires_grad=True)
    assert _adds(Block(2, 16, 8, True, 0.0, True), x) == [("ln_1", 256), ("ln_2", 256)]
    # nn.MultiheadAttention slices its 48 x 16 in_proj weight three times (q, k, v: one parameter, 3 edges, 2 adds)
    assert sorted(_adds(Block(2, 16, 8, False, 0.0, True), x)) == [("attn.mha", 768)] * 2 + [("ln_1", 256),
                                                                                             ("ln_2", 256)]


def test_three_uses_two_adds():
    adds = _adds(ThreeUses(), torch.randn(4, 16))
    assert sorted(adds) == [("a", 64), ("b", 64)]


def test_single_use_and_no_grad_none():
    assert _adds(OneUse(), torch.randn(4, 16)) == []
    assert _adds(NoGradBranch(), torch.randn(4, 16)) == []
    with torch.no_grad():
        assert _adds(Residual(), torch.randn(4, 16)) == []


def test_frozen_input_linear_none():
    # the input needs no gradient and Linear `inp` is frozen: x has no grad_fn, nothing is summed
    m = Residual()
    m.inp.requires_grad_(False)
    assert _adds(m, torch.randn(4, 16)) == []


def test_estimate_charges_the_add_to_the_layernorm_backward():
    x = torch.randn(4, 16)
    frame = perfcheck.estimate(Residual(), x, system="cpu").set_index("module")
    # 3 streams of 64 fp32 elements beyond native_layer_norm's own backward bytes (independent: the
    # LayerNorm alone, without a residual, in a Sequential)
    alone = perfcheck.estimate(nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 16)), x,
                               system="cpu").set_index("module")
    assert frame.loc["ln", "bytes_bwd"] - alone.loc["1", "bytes_bwd"] == 3 * 64 * 4
    assert frame.loc["ln", "pred_bwd_s"] > alone.loc["1", "pred_bwd_s"]
    assert frame.loc["ln", "bytes_fwd"] == alone.loc["1", "bytes_fwd"]


@pytest.mark.parametrize("build, shape", [
    (Residual, (4, 16)),
    (ThreeUses, (4, 16)),
    (BasicBlock, (2, 3, 8, 8)),
    (lambda: Block(n_head=2, d_model=16, seq_len=8, use_sdpa=True, dropout=0.0, bias=True), (2, 8, 16)),
    (lambda: Block(n_head=2, d_model=16, seq_len=8, use_sdpa=False, dropout=0.0, bias=True), (2, 8, 16)),
])
def test_count_matches_torch_profiler(build, shape):
    torch.manual_seed(0)
    model = build()
    x = torch.randn(*shape, requires_grad=(len(shape) == 3))  # the GPT block's input is a leaf needing grad
    assert len(_adds(model, x)) == _profiled_adds(model, x) > 0


def test_op_table_names_it():
    from perfcheck.predict import module_estimator as me

    trace = trace_model(Residual(), (torch.randn(4, 16),))
    table = me._op_table(trace, causal=False)
    row = table[table["name"] == "grad_accumulate"]
    assert len(row) == 1 and row["kernels_fwd"].item() == 0 and row["kernels_bwd"].item() == 1
    assert row["bytes_bwd"].item() == 3 * 64 * 4 and isinstance(table, pd.DataFrame)

"""A norm's or softmax's backward copies a gradient that arrives permuted (predict.relayout): the trace's walk
through autograd's graph against torch.profiler, and the copy's cost by hand.

Reference: a real CPU forward and backward of each pattern under torch.profiler, counting the ``aten::copy_``
calls inside ``native_layer_norm_backward`` (or ``_softmax_backward_data``); the trace must predict a gradient
copy exactly where the profiler sees one. The same patterns on CUDA (marked gpu; and here, against an H200's recorded
counts) with a GPU target's trace, which walks by CUDA's kernels. Cost: n fp32 elements read and n written (8 n
bytes), backward only."""
import re
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from perfcheck.predict import module_estimator as me
from perfcheck.predict.trace import trace_model

F = nn.functional
W = torch.randn(16, 16)
Z = torch.randn(2, 16, 16)
_DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                                  reason="needs CUDA")])]


class _Pattern(nn.Module):
    """``after(op(x))`` for an op of ``relayout.COPIES_GRAD``: ``after`` decides how the gradient comes back."""

    def __init__(self, op, after):
        super().__init__()
        self.op, self.after = op, after

    def forward(self, x):
        return self.after(self.op(x))


_OPS = {
    "layer_norm": (lambda x: F.layer_norm(x, (16,)), "aten::native_layer_norm_backward"),
    "softmax": (lambda x: x.softmax(-1), "aten::_softmax_backward_data"),
}
_AFTERS = {
    "linear": lambda y: F.linear(y, W),
    "transpose, linear": lambda y: F.linear(y.transpose(1, 2), W),
    "transpose, matmul": lambda y: y.transpose(1, 2) @ W,
    "transpose, gelu, linear": lambda y: F.linear(F.gelu(y.transpose(1, 2)), W),
    "transpose, transpose back, linear": lambda y: F.linear(y.transpose(1, 2).transpose(1, 2), W),
    "transpose, softmax, linear": lambda y: F.linear(y.transpose(1, 2).softmax(-1), W),
    "transpose, slice, linear": lambda y: F.linear(y.transpose(1, 2)[:, :8], W),
    "transposed made first, direct last": lambda y: F.linear(y.transpose(1, 2), W) + F.linear(y, W),
    "direct made first, transposed last": lambda y: F.linear(y, W) + F.linear(y.transpose(1, 2), W),
    "transpose, dropout, linear": lambda y: F.linear(F.dropout(y.transpose(1, 2), 0.1), W),
    "transpose, dropout, transpose back, linear": lambda y: F.linear(F.dropout(y.transpose(1, 2), 0.1).transpose(1, 2),
                                                                     W),
    "transpose, mul, linear": lambda y: F.linear(y.transpose(1, 2) * 3.0, W),
    "transpose, contiguous, linear": lambda y: F.linear(y.transpose(1, 2).contiguous(), W),
    "transpose, reshape, linear": lambda y: F.linear(y.transpose(1, 2).reshape(2, 16, 16), W),
    "transpose, add a residual, linear": lambda y: F.linear(y.transpose(1, 2) + torch.ones(2, 16, 16), W),
    "transpose, bmm with itself": lambda y: torch.bmm(y.transpose(1, 2), y),
    "transpose, layer norm": lambda y: F.layer_norm(y.transpose(1, 2), (16,)),
    "cat on the last dimension, linear": lambda y: F.linear(torch.cat([y, y * 2], -1), torch.randn(16, 32)),
    "cat with another tensor on the last dimension": lambda y: F.linear(torch.cat([y, Z], -1), torch.randn(16, 32)),
    "cat with another tensor on dimension 1": lambda y: F.linear(torch.cat([y, Z], 1), W),
    "cat with another tensor on dimension 0": lambda y: F.linear(torch.cat([y, Z], 0), W),
    "stack with another tensor on dimension 0": lambda y: F.linear(torch.stack([y, Z], 0), W),
    "chunk on the last dimension, linear": lambda y: F.linear(y.chunk(2, -1)[0], torch.randn(16, 8)),
    "sum": lambda y: y.sum(),
    "mean over a dimension": lambda y: y.mean(1),
    "permute to NCHW, conv (channels-last)": lambda y: F.conv2d(y.reshape(2, 4, 4, 16).permute(0, 3, 1, 2),
                                                              torch.randn(16, 16, 1, 1)),
    "permute to NCHW, contiguous, conv": lambda y: F.conv2d(y.reshape(2, 4, 4, 16).permute(0, 3, 1, 2).contiguous(),
                                                            torch.randn(16, 16, 1, 1)),
}


def _profiled_copies(model, x, backward_op: str) -> int:
    """aten::copy_ calls inside ``backward_op`` in one real backward (the model's output's gradient: ones laid out
    as the output is). The ops are recorded on the host, on CUDA as on the CPU."""
    out = model(x)
    out.backward(torch.ones_like(out))  # warm
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = model(x)
        out.backward(torch.ones_like(out))
    copies = 0
    for event in prof.events():
        if event.name == backward_op:
            todo = list(event.cpu_children)
            while todo:
                child = todo.pop()
                copies += child.name == "aten::copy_"
                todo.extend(child.cpu_children)
    return copies


@contextmanager
def _constants_on(device: str):
    """The patterns' constants (W, Z and the tensors the patterns make) on ``device`` inside the block."""
    global W, Z
    saved = W, Z
    W, Z = W.to(device), Z.to(device)
    try:
        with torch.device(device):
            yield
    finally:
        W, Z = saved


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("after", list(_AFTERS))
@pytest.mark.parametrize("op", list(_OPS))
def test_the_trace_predicts_a_gradient_copy_where_the_profiler_sees_one(op, after, device):
    fn, backward_op = _OPS[op]
    model = _Pattern(fn, _AFTERS[after])
    x = torch.randn(2, 16, 16, requires_grad=True)
    with _constants_on(device):
        measured = _profiled_copies(model, x.detach().to(device).requires_grad_(), backward_op)
    assert _predicted_copies(model, x, backward_op, gpu=device != "cpu") == measured, (op, after, measured)


def _predicted_copies(model, x, backward_op: str, gpu: bool) -> int:
    """The copies the trace predicts inside ``backward_op``: gradient relayouts, and a later layer norm over a permuted
    view copying its saved input in its backward (the other relayout). ``gpu``: a GPU target's trace."""
    return sum(1 for o in trace_model(model, (x,), fused_dropout=gpu).ops
               if o.grad_relayout or (o.call.name == "permute_copy" and o.backward and "layer_norm" in backward_op))


#: The same patterns' copies as an H200 counted them (torch 2.11+cu130; bench/relayout_probe.py --device cuda)
CUDA_COUNTS = (Path(__file__).resolve().parents[2] / "bench" / "gpu_results" / "2026-11-27-h200-late"
               / "relayout_cuda.txt")


def _recorded_cuda_counts() -> dict:
    rows = {}
    for line in CUDA_COUNTS.read_text().splitlines():
        m = re.match(r"RELAYOUT cuda (\S+)\s+(.*?)\s+measured (\d+) predicted", line)
        if m:
            rows[(m.group(1), m.group(2))] = int(m.group(3))
    return rows


def test_a_gpu_targets_trace_predicts_the_copies_an_h200_counted():
    """Without a GPU here: the GPU target's walk (CUDA's softmax multiplies first, CUDA's dropout writes its input's
    gradient row-major) against the profiler's counts recorded on an H200, every pattern."""
    recorded = _recorded_cuda_counts()
    assert len(recorded) == len(_OPS) * len(_AFTERS)
    for (op, after), measured in recorded.items():
        fn, backward_op = _OPS[op]
        x = torch.randn(2, 16, 16, requires_grad=True)
        assert _predicted_copies(_Pattern(fn, _AFTERS[after]), x, backward_op, gpu=True) == measured, (op, after)


def test_the_gradient_copy_costs_one_copy_backward_only_in_the_ops_module():
    model = nn.Sequential(nn.Linear(16, 16), _Pattern(nn.LayerNorm(16), _AFTERS["transpose, linear"]))
    x = torch.randn(2, 16, 16)  # n = 512 elements
    tr = trace_model(model, (x,))
    t = me._op_table(tr, False).set_index("name")
    copy = t.loc["clone"]
    assert copy.bytes_fwd == 0 and copy.kernels_fwd == 0
    assert copy.bytes_bwd == 2 * 512 * 4 and copy.kernels_bwd == 1
    ops = [o for o in tr.ops if o.call.name in ("clone", "native_layer_norm")]
    assert [o.call.name for o in ops] == ["clone", "native_layer_norm"]  # before it: backward runs it after
    assert ops[0].stack == ops[1].stack and "1" in ops[0].stack


def test_no_copy_where_the_norm_gets_no_gradient():
    model = _Pattern(nn.LayerNorm(16).requires_grad_(False), _AFTERS["transpose, linear"])
    with torch.no_grad():
        tr = trace_model(model, (torch.randn(2, 16, 16),))
    assert not any(o.grad_relayout for o in tr.ops)

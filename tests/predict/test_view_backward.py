"""Views whose backward runs kernels, copies whose backward runs none, and ``_safe_softmax``'s four kernels.

References: hand arithmetic of each formula, and torch's own profiler on a real CPU backward: which aten kernels
autograd runs for each op's backward node (``select_backward`` makes zeros and copies the gradient in; ``cat`` and
``clone`` hand the gradient on as a view; ``split``'s backward concatenates; ``expand``'s sums), and the kernels
``_safe_softmax`` runs under it (softmax, a compare with -inf, ``all``, ``where``)."""
from __future__ import annotations

import pytest
import torch

from perfcheck.predict import formulas as F
from perfcheck.predict.aten_costs import cost_of, is_view_op
from perfcheck.predict.trace import trace_model

#: Kernels that write memory in a backward (not views, not bookkeeping).
_WRITERS = ("aten::fill_", "aten::zero_", "aten::zeros", "aten::copy_", "aten::cat", "aten::stack", "aten::sum",
            "aten::add", "aten::add_", "aten::index_add_")


class Call(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


OPS = {  # name: (function of x, op name in the trace)
    "select": (lambda x: x.select(0, 1) * 2, "select"),
    "slice": (lambda x: x[..., :16] * 2, "slice"),
    "split": (lambda x: sum(p * (i + 1) for i, p in enumerate(x.split(1, dim=0))), "split"),
    "unbind": (lambda x: sum(p * (i + 1) for i, p in enumerate(x.unbind(0))), "unbind"),
    "expand": (lambda x: x[:1].expand(3, 8, 32) * 2, "expand"),
    "clone": (lambda x: x.clone() * 2, "clone"),
    "cat": (lambda x: torch.cat([x, x * 3], dim=1) * 2, "cat"),
}


def _backward_writers(fn, x) -> set:
    """aten kernels that write memory inside the backward node of the op under test (a profiled real backward)."""
    y = fn(x)
    g = torch.ones_like(y)
    with torch.profiler.profile() as prof:
        y.backward(g)
    names = {e.name for e in prof.events() if e.name in _WRITERS and e.cpu_parent is not None
             and any(k in _ancestors(e) for k in ("SelectBackward", "SliceBackward", "SplitBackward",
                                                  "UnbindBackward", "ExpandBackward", "CloneBackward",
                                                  "CatBackward"))}
    return names


def _ancestors(e) -> str:
    out, p = [], e.cpu_parent
    while p is not None:
        out.append(p.name)
        p = p.cpu_parent
    return " ".join(out)


def _traced(fn, x):
    trace = trace_model(Call(fn), (x,))
    return trace


@pytest.mark.parametrize("name", sorted(OPS))
def test_backward_kernels_match_what_autograd_runs(name):
    """The op's backward costs kernels exactly when torch's backward node for it runs memory-writing kernels."""
    fn, op = OPS[name]
    x = torch.randn(3, 8, 32, requires_grad=True)
    writes = _backward_writers(fn, x)
    calls = [o.call for o in _traced(fn, x).ops if o.call.name == op]
    assert calls, f"{op} not traced"
    kernels = sum(cost_of(c).cost.bwd.kernels for c in calls)
    assert (kernels > 0) == bool(writes), (name, kernels, writes)


def test_select_backward_by_hand():
    """select_backward: zeros of the input (FILL_STREAMS per element) + the gradient copied in (read + write)."""
    x = torch.randn(3, 8, 32, requires_grad=True)
    call = next(o.call for o in _traced(lambda t: t.select(0, 1) * 2, x).ops if o.call.name == "select")
    cost = cost_of(call).cost
    assert cost.fwd.kernels == 0 and cost.fwd.bytes == 0
    assert cost.bwd.kernels == 2
    assert cost.bwd.bytes == (F.FILL_STREAMS * 3 * 8 * 32 + 2 * 8 * 32) * 4
    assert is_view_op(call)


def test_split_and_expand_backward_by_hand():
    x = torch.randn(3, 8, 32, requires_grad=True)
    split = next(o.call for o in _traced(OPS["split"][0], x).ops if o.call.name == "split")
    assert cost_of(split).cost.bwd.bytes == 2 * 3 * 8 * 32 * 4  # cat: read the pieces, write the input
    expand = next(o.call for o in _traced(OPS["expand"][0], x).ops if o.call.name == "expand")
    assert cost_of(expand).cost.bwd.bytes == (3 * 8 * 32 + 8 * 32) * 4  # sum_to_size: read 3x, write 1x
    assert cost_of(expand).cost.bwd.flops == 3 * 8 * 32


def test_identity_expand_and_frozen_input_cost_nothing():
    x = torch.randn(1, 8, 32, requires_grad=True)
    expand = next(o.call for o in _traced(lambda t: t.expand(1, 8, 32) * 2, x).ops if o.call.name == "expand")
    assert cost_of(expand).cost.bwd.kernels == 0
    frozen = torch.randn(3, 8, 32)
    sel = [o.call for o in _traced(lambda t: t.select(0, 1) * 2, frozen).ops if o.call.name == "select"]
    assert all(cost_of(c).cost.bwd.kernels == 0 for c in sel)


def test_clone_and_cat_backward_are_free_but_the_forward_copies():
    x = torch.randn(3, 8, 32, requires_grad=True)
    for name in ("clone", "cat"):
        call = next(o.call for o in _traced(OPS[name][0], x).ops if o.call.name == name)
        cost = cost_of(call).cost
        assert cost.fwd.bytes > 0 and cost.bwd.kernels == 0 and cost.bwd.bytes == 0


def test_safe_softmax_four_kernels_by_hand_and_by_profiler():
    rows, cols = 4 * 2 * 16, 16
    x = torch.randn(4, 2, 16, 16)
    with torch.profiler.profile() as prof:
        torch.ops.aten._safe_softmax(x, -1)
    children = [e.name for e in prof.events() if e.cpu_parent is not None and e.cpu_parent.name == "aten::_safe_softmax"
                and e.name in ("aten::softmax", "aten::eq", "aten::isneginf", "aten::all", "aten::where")]
    assert len(children) == 4, children
    cost = F.safe_softmax(rows, cols, elem_bytes=4)
    n = rows * cols
    assert cost.fwd.kernels == 4
    # softmax 2n elements; eq reads x (n), where reads the softmax and writes (2n); masks: n + n + rows + rows bytes
    assert cost.fwd.bytes == (2 * n + 3 * n) * 4 + 2 * n + 2 * rows
    assert cost.bwd == F.softmax(rows, cols, elem_bytes=4).bwd

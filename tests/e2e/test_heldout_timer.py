"""bench/heldout.py's ModuleTimer hooks only the nodes that bound a module's backward window (``_boundary``): the
entry and exit nodes of a LayerNorm and of a chain by hand, and planted CPU work: an interior node's inside the
window, a neighbour module's outside it. The planted spans are process CPU time spent in a busy loop, so a loaded
machine stretches them only upward; the bounds asserted are the planted work itself and the sum of both."""
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import heldout  # noqa: E402

MS = 1e-3


def test_boundary_of_a_layer_norm_is_its_node_in_and_its_two_accumulations_out():
    x = torch.randn(4, 8, requires_grad=True) * 2  # a node before the module: the walk stops there
    ln = torch.nn.LayerNorm(8)
    y = ln(x)
    entries, exits = heldout._boundary([y.grad_fn], {id(x.grad_fn): x.grad_fn})
    assert [type(n).__name__ for n in entries] == ["NativeLayerNormBackward0"]
    # the norm's node feeds its weight's and bias's AccumulateGrad (inside) and x's node (outside): not an exit
    assert sorted(type(n).__name__ for n in exits) == ["AccumulateGrad", "AccumulateGrad"]


def test_boundary_of_a_chain_without_parameters_is_its_first_and_last_node():
    x = torch.randn(16, requires_grad=True) * 2
    y = torch.sin(torch.exp(x))
    entries, exits = heldout._boundary([y.grad_fn], {id(x.grad_fn): x.grad_fn})
    assert [type(n).__name__ for n in entries] == ["SinBackward0"]
    assert [type(n).__name__ for n in exits] == ["ExpBackward0"]


def _spin(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


class _Busy(torch.autograd.Function):
    """Identity forward; its backward spins ``seconds`` of process CPU time."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        _spin(ctx.seconds)
        return g, None


class _Inner(torch.nn.Module):
    """Linear -> busy backward (interior: a node with a successor inside the module) -> Linear."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.b(_Busy.apply(self.a(x), 20 * MS))


class _Neighbour(torch.nn.Module):
    def forward(self, x):
        return _Busy.apply(x, 10 * MS)


@pytest.mark.timing  # planted CPU work, read on the process clock: outside the fast lane
def test_window_holds_an_interior_node_and_not_the_neighbour():
    inner, after = _Inner(), _Neighbour()
    model = torch.nn.Sequential(inner, after)
    timer = heldout.ModuleTimer({"inner": inner, "after": after})
    x = torch.randn(4, 8, requires_grad=True)
    with timer:
        for _ in range(3):
            timer.new_step()
            model(x * 1.0).sum().backward()
            timer.end_step()
    med = timer.medians()
    assert med["inner"][1] >= 20 * MS  # the interior node's planted work is inside the window
    assert med["after"][1] >= 10 * MS
    # the neighbour's backward runs first, before the inner module's entry node: not inside its window. On a loaded
    # machine process time only grows, so no upper bound tighter than the two spans' sum is asserted.
    assert med["inner"][1] < 20 * MS + 10 * MS

"""The standard nn layers whose per-call host cost calibration measures (``module_fixed_s``).

Shared by the cases (which time them) and the fit (which estimates them with the host model and keeps
the measured excess); a module of its own so neither imports the other.
"""
from __future__ import annotations

import torch


class CallModule(torch.nn.Module):
    """A function as a module, so the estimator's tracer (perfcheck.predict.trace.trace_model) can trace one call of
    it: the calibration cases price their call with the estimator's own formulas this way."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def tiny_modules(dev):
    """torch.nn class name -> (module, inputs): the standard layers whose Python ``forward`` does work
    beyond its aten ops (a convolution's padding-mode and argument checks, BatchNorm's running-stat
    bookkeeping), on tiny tensors in training mode with parameters and inputs needing gradients, as a
    training step calls them. perfcheck.calibrate.fit estimates each with the host model and keeps the
    measured excess per call (``module_fixed_s``). Linear, LayerNorm, Embedding, ReLU, GELU, Dropout and
    MaxPool2d were measured too until the held-out pruning retired their entries: removing them moved no
    held-out model (bench/results/pruning.md; ``systems.RETIRED_MODULE_FIXED``)."""
    nn = torch.nn
    dev = torch.device(dev)
    # the op_fixed cases' shapes (``_tiny_ops``); convolutions at a batch of 2, the CPU path of a training
    # batch (119 us for a 1->1 channel 3x3 on 6x6 on the project's VM; batch 1 takes another, 10 us), whose
    # fixed cost op_fixed_s["convolution"] holds, so the layer's excess here is its Python alone
    y, img = torch.randn(8, 16, device=dev), torch.randn(1, 1, 6, 6, device=dev)
    mods = {
        "Conv1d": (nn.Conv1d(1, 1, 3), torch.randn(2, 1, 16, device=dev)),
        "Conv2d": (nn.Conv2d(1, 1, 3), torch.randn(2, 1, 6, 6, device=dev)), "BatchNorm1d": (nn.BatchNorm1d(16), y),
        "BatchNorm2d": (nn.BatchNorm2d(1), img),
        # F.embedding_bag's Python (argument checks, the mode's name to its number) beyond _embedding_bag's
        # fixed cost (op_fixed_s[<class>]): ~6 us on the project's Xeon; inputs: 8 indices, offsets of 2 bags
        "EmbeddingBag": (nn.EmbeddingBag(16, 4, mode="mean"), (torch.arange(8, device=dev), torch.tensor([0, 4], device=dev))),
    }
    # a layer's input needs a gradient (it comes out of the layer before), as for every layer of a step but
    # the first: autograd then records more (a ReLU on 8x16 took 17.4 us so, 9.8 us on a plain input, on the
    # project's VM, where the estimator says 9.3 and 7.9)
    return {name: (m.to(dev).train(), tuple(t.requires_grad_(True) if t.is_floating_point() else t
                                            for t in (x if isinstance(x, tuple) else (x,))))
            for name, (m, x) in mods.items()}


def cold_filler(dev):
    """A call that runs other framework code (a forward and backward through Linear, LayerNorm, GELU,
    Dropout; ~0.1-0.2 ms on a CPU): the cases that a training step runs once per step (the optimizer
    step, loss.backward()'s start) run it untimed before each timed call, so the caches and branch
    predictors hold what a step leaves in them. A tight loop keeps the optimizer's Python hot: SGD
    step + zero_grad on 4 tiny tensors took 122 us in a loop and 178 us right after a forward and
    backward on the project's VM (1 thread, process time)."""
    nn = torch.nn
    dev = torch.device(dev)
    net = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.GELU(), nn.Dropout(0.1)).to(dev).train()
    x = torch.randn(4, 8, device=dev)

    def fill():
        net(x).sum().backward()
        for p in net.parameters():
            p.grad = None
    return fill

"""Independent references for the estimator tests: torch's FlopCounterMode, run on real tensors."""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from perfcheck.schema import ROOT


def flop_counter_by_module(model: torch.nn.Module, inputs, loss_fn=None) -> dict:
    """{module path: (forward FLOPs, backward FLOPs)} as FlopCounterMode attributes them.

    One FlopCounterMode spans forward and backward (its module tracker registers the backward
    hooks during forward); the forward counts are read before backward runs.
    """
    root = type(model).__name__
    with FlopCounterMode(display=False) as counter:
        out = model(*inputs)
        fwd = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
        out = out[0] if isinstance(out, tuple) else out
        (loss_fn(out) if loss_fn else out.float().sum()).backward()
        total = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    result = {}
    for name, flops in total.items():
        if name == "Global":
            continue
        path = ROOT if name == root else name[len(root) + 1:]
        result[path] = (fwd.get(name, 0), flops - fwd.get(name, 0))
    return result

"""Embedding rows a step's batch never reaches: their gradient is exactly 0, so an adaptive optimizer's second
moment (Adam's exp_avg_sq, RMSprop's square_avg, Adagrad's sum) stays exactly 0 there, and the step's square root
of it runs on zeros.

Why it matters: on a CPU torch's vectorized sqrt of +0.0 takes a slow path, ~5 ns per element against 0.2-0.4 for
normal values at 16 Ki-4 Mi elements (1 thread, the project's AVX-512 Xeon, 2026-11-27; -0.0 and subnormals
likewise; rsqrt, div, add, mul, lerp, addcmul of zeros run at full speed): a torch.nn.TransformerEncoder
stack's 4000 x 128 embedding under Adam (88% of its rows untouched by a batch of 8 x 64 tokens) spent 1.96 ms in
that one sqrt per step against 0.16 ms on random values, a fifth of its optimizer step
(bench/results/optimizer_step.md). The price per zero element is the spec's host constant ``sqrt_zero_s``
(perfcheck/calibrate/cases.py ``sqrt_zero_cases``); the step's square roots per tensor are counted from torch's
own code (``optimizers.Profile.sqrts``).

The share of a table's rows left at zero, with ``N`` indices per step drawn uniformly over ``V`` rows:

    untouched = (1 - 1/V)^N ~= exp(-N / V)          (the expected share of rows no index reaches)

NB (perfcheck): this is one step's batch, i.e. the first steps of training or a batch seen again (the held-out
benchmark's case); over k steps of fresh batches the rows still at zero fall to exp(-k N / V), and a rare-token
tail keeps more of them than uniform draws give. A weight registered in several modules (an LM's tied input and
output embedding) receives a dense gradient: no untouched rows. A sparse embedding (``sparse=True``) is stepped
by a sparse optimizer: not counted.
"""
from __future__ import annotations

import math

import torch

#: aten ops that gather rows of their first argument (the weight) by the indices in their second
_GATHERS = ("embedding", "_embedding_bag", "_embedding_bag_forward_only")


def untouched_share(indices: int, rows: int) -> float:
    """``(1 - 1/rows)^indices``: the expected share of ``rows`` rows that ``indices`` uniform draws miss."""
    if rows <= 0:
        return 0.0
    if rows == 1:
        return 0.0 if indices > 0 else 1.0
    return math.exp(indices * math.log1p(-1.0 / rows))


def zero_elements(trace, modules: dict) -> dict:
    """``{id(parameter): elements whose gradient is 0 in every step}`` for the embedding weights of ``modules``
    (path -> nn.Module) that the forward in ``trace`` gathers from: numel x ``untouched_share`` of the indices
    gathered per step (every call of the module summed). Weights owned by several modules (tied) or sparse are
    left out (module docstring)."""
    owners = {}
    for mod in modules.values():
        for q in mod.parameters(recurse=False):
            owners[id(q)] = owners.get(id(q), 0) + 1
    indices = {}
    for op in trace.ops:
        if op.call.name not in _GATHERS or not op.stack:
            continue
        mod = modules.get(op.stack[-1])
        if not isinstance(mod, (torch.nn.Embedding, torch.nn.EmbeddingBag)) or getattr(mod, "sparse", False):
            continue
        w = mod.weight
        if not w.requires_grad or owners.get(id(w), 0) != 1:
            continue
        idx = op.call.arg(1, "indices")
        indices[id(w)] = (w, indices.get(id(w), (w, 0))[1] + int(getattr(idx, "numel", 0)))
    return {key: float(w.numel()) * untouched_share(n, int(w.shape[0])) for key, (w, n) in indices.items()}

"""The module timer's fast (lean) path against its reference (general) path, on random module trees.

The reference: ``ModuleTimer(reference=True)``, every call through ``ForwardMixin._pre``/``_finish``
(the record built as the call starts and returns). The fast path appends two entries per call to a
flat log and builds the records later. Both must give the same records: the same module paths,
phases, call counts, nesting and order of the forward calls, and the same backward intervals. A
third route, forward hooks (taken for every module while a global module hook exists), must agree
too. Times are compared only structurally: the clock is a counter (each reading one tick), so equal
readings mean the same readings were taken in the same order.

The trees (seeded) mix nn.Sequential, nn.ModuleList, custom modules, a submodule shared by two
parents, modules called twice, modules with no parameters, a two-argument module (the general
path nested inside the fast path), tuple outputs, a grad-disabled call inside the forward and
activation checkpointing (recompute inside backward); each step also makes a grad-disabled call of
the whole model (eval records).
"""
from __future__ import annotations

import itertools
import random

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from perfcheck.measure.timer import CpuClock, ModuleTimer
from perfcheck.measure.timer import torch_internals
from perfcheck.schema import ROOT

D = 4


class CounterClock(CpuClock):
    """Each reading is the next integer: readings compare by order only."""

    def __init__(self):
        self._ticks = itertools.count(1)
        self.now = self._ticks.__next__


class Double(nn.Module):  # no parameters
    def forward(self, x):
        return x * 2


class Twice(nn.Module):
    """Calls its child twice in a row."""

    def __init__(self, child):
        super().__init__()
        self.child = child

    def forward(self, x):
        return self.child(self.child(x))


class Fan(nn.Module):
    """A ModuleList whose members all read the same input (q/k/v style); their outputs summed."""

    def __init__(self, children):
        super().__init__()
        self.parts = nn.ModuleList(children)

    def forward(self, x):
        out = None
        for part in self.parts:
            y = part(x)
            out = y if out is None else out + y
        return out


class Mix(nn.Module):
    """Two tensor arguments (a call the fast path hands to the general path)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(D))

    def forward(self, a, b):
        return a * self.w + b


class PairThenMix(nn.Module):
    """A child returning a tuple, fed into a two-argument module."""

    def __init__(self, child):
        super().__init__()
        self.child, self.mix = child, Mix()

    def forward(self, x):
        a, b = self.child(x)
        return self.mix(a, b)


class Split(nn.Module):  # tuple output
    def __init__(self, child):
        super().__init__()
        self.child = child

    def forward(self, x):
        y = self.child(x)
        return y, y * 0.5


class Side(nn.Module):
    """A grad-disabled call of its child (a teacher/EMA-style side call) beside the training one."""

    def __init__(self, child):
        super().__init__()
        self.child = child

    def forward(self, x):
        with torch.no_grad():
            side = self.child(x)
        return self.child(x) + side


class Ckpt(nn.Module):
    """Its child under non-reentrant activation checkpointing: recomputed inside backward."""

    def __init__(self, child):
        super().__init__()
        self.child = child

    def forward(self, x):
        return checkpoint(self.child, x, use_reentrant=False)


def _leaf(rng, shared):
    kind = rng.randrange(5)
    if kind == 0 and shared:
        return rng.choice(shared)  # a submodule shared with another parent
    leaf = [lambda: nn.Linear(D, D), nn.ReLU, nn.Tanh, Double, lambda: nn.LayerNorm(D)][kind]()
    if isinstance(leaf, (nn.Linear, nn.LayerNorm)):
        shared.append(leaf)
    return leaf


def _tree(rng, depth, shared):
    """A random module of ``depth`` levels at most."""
    if depth == 0 or rng.random() < 0.25:
        return _leaf(rng, shared)
    kind = rng.randrange(7)
    sub = lambda: _tree(rng, depth - 1, shared)  # noqa: E731
    if kind == 0:
        return nn.Sequential(*[sub() for _ in range(rng.randint(1, 3))])
    if kind == 1:
        return Fan([sub() for _ in range(rng.randint(2, 3))])
    if kind == 2:
        return Twice(sub())
    if kind == 3:
        return PairThenMix(Split(sub()))
    if kind == 4:
        return Side(sub())
    if kind == 5:
        return Ckpt(sub())
    return nn.Sequential(sub(), nn.ReLU(), sub())


def _model(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = nn.Sequential(*[_tree(rng, 4, []) for _ in range(rng.randint(2, 4))])
    return model, rng.random() < 0.5  # (the input requires grad or not)


def _record(model, x_grad, seed, route, monkeypatch):
    """Two steps on ``route``: the records of each (forward calls, backward intervals, totals)."""
    clock, hook = CounterClock(), None
    with monkeypatch.context() as m:
        if route == "forward route":
            m.setattr(torch_internals, "DIRECT_ROUTE", False)
        if route == "hooks":
            hook = torch.nn.modules.module.register_module_forward_hook(lambda mod, args, out: None)
        timer = ModuleTimer([(n or ROOT, mod) for n, mod in model.named_modules()], clock, ranges=False,
                            reference=route == "reference")
        timer.attach()
    wrapped, logged = timer.wrapped_count, []
    materialize = timer._materialize

    def spy():  # how many flat-log entries the fast path left each time they are turned into records
        logged.append(len(timer._flog))
        materialize()
    timer._materialize = spy
    try:
        steps = [_one_step(timer, model, x_grad, seed + i) for i in range(2)]
        lean = timer._lean  # (the fast path on, after the first root call)
    finally:
        timer.detach()
        if hook is not None:
            hook.remove()
    assert not timer.internal_errors
    return steps, wrapped, lean, max(logged, default=0)


def _one_step(timer, model, x_grad, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, D, generator=g).requires_grad_(x_grad)
    timer.begin_step()
    model(x).sum().backward()
    with torch.no_grad():  # a validation-style call in the same step: eval records, nested ones too
        model(x)
    pending = timer.end_step()
    calls, bwds = pending.calls, pending.bwds
    index = {id(c): i for i, c in enumerate(calls)}
    tasks = {}
    fwd = [(c.path, c.phase, c.top, c.t0, c.t1) for c in calls]
    bwd = [(b.path, index[id(b.call)], tasks.setdefault(b.task, len(tasks)), b.b0, b.b1,
            None if b.rc is None else [index[id(r)] for r in b.rc]) for b in bwds]
    res = pending.resolve()
    return {"calls": fwd, "bwds": bwd, "nesting": _nesting(calls), "resolved": res}


def _nesting(calls):
    """Each call's enclosing call (index), from the interval readings: a structural view of the stack."""
    out = []
    for i, c in enumerate(calls):
        parent = None
        for j in range(i - 1, -1, -1):
            p = calls[j]
            if p.t0 < c.t0 and p.t1 is not None and c.t1 is not None and c.t1 < p.t1:
                parent = j
                break
        out.append(parent)
    return out


SEEDS = list(range(24))


@pytest.mark.parametrize("seed", SEEDS)
def test_fast_path_records_equal_the_reference_path(seed, monkeypatch):
    model, x_grad = _model(seed)
    ref, wrapped, lean, logged = _record(model, x_grad, seed, "reference", monkeypatch)
    assert wrapped == len(list(model.modules())) and not lean and logged == 0  # (no hooks, no fast path)
    for route in ("direct route", "forward route", "hooks"):
        got, wrapped, lean, logged = _record(model, x_grad, seed, route, monkeypatch)
        for step, (a, b) in enumerate(zip(got, ref)):
            for key in ("calls", "nesting", "bwds", "resolved"):
                assert a[key] == b[key], f"seed {seed}, {route}, step {step}: {key} differ"
        if route == "hooks":
            assert wrapped == 0
        else:
            assert lean and wrapped == len(list(model.modules())) and logged >= 2  # the fast path ran


def test_the_trees_cover_the_cases():
    """The comparison above means something only if the trees hold the cases named in the module
    docstring (that the fast path ran is checked there: its flat log filled)."""
    seen = set()
    for seed in SEEDS:
        model, _ = _model(seed)
        counts = {}
        for mod in model.modules():
            counts[id(mod)] = counts.get(id(mod), 0)
        for _, mod in model.named_modules(remove_duplicate=False):
            counts[id(mod)] += 1
        seen |= {type(m).__name__ for m in model.modules()}
        if any(n > 1 for n in counts.values()):
            seen.add("shared")
    assert {"Sequential", "ModuleList", "Twice", "Fan", "Mix", "Split", "Side", "Ckpt", "Double", "ReLU",
            "shared"} <= seen


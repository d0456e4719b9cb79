"""Calibration cases of the kernels that take indices (Embedding and EmbeddingBag, each mode), every one timed on
fresh indices at every call, as a training step's batch gives them.

Why fresh indices: some of these kernels branch on their data (EmbeddingBag's sum and mean backward sorts its
indices, ``_embedding_bag_dense_backward_cpu_sum_mean``; max mode compares every gathered element,
``embedding_bag_cpu_max_out``), and a tight loop over one index set lets the core's branch predictor learn the
outcomes. On the project's AMD EPYC VM (Zen 4, 1 thread, process time, 2026-11-27) ``torch.sort`` of 1024 int64
indices took 13 us on one set repeated and 36 us on 64 sets in turn (2048: 24 and 75 us; the same within 5% from
16 sets on at 2048, from 64 at 1024: the predictor holds ~8-16 Ki outcomes); an EmbeddingBag's backward (sum,
1024 indices into 20000 x 16) 92 against 117 us, max mode's forward (2048 indices x 20) 63 against 170 us; a gather
(``aten.embedding``, forward) and Embedding's dense backward moved < 10%. In a step the indices are new every
batch, and even a benchmark's repeated batch runs the whole step's other code between two calls of the kernel:
wide & deep's 1024-index bag backwards read 131-143 us in its step against 77 in the tight loop, 44 of them in
the sort (bench/results/heldout.md). So each case here cycles through index sets holding ``ROTATION_INDICES``
indices in all (``rotating``); every other calibration case keeps its one input (its kernel's branches do not
depend on the values: a layer norm, a GEMM, a vectorised elementwise op).

Rows (``op_classes``' module docstring: the kinds and their fits): ``oprows`` ``<op> fwd|bwd`` (per index),
``classfixed`` ``<class>[:bwd]`` (EmbeddingBag's fixed cost per call by mode), ``opeff`` ``_embedding_bag_max:fwd``.
"""
from __future__ import annotations

import itertools
import math

import torch

from perfcheck.calibrate import case_names as names
from perfcheck.calibrate.cases import Case
from perfcheck.calibrate.op_cases import ROW_CASE_LENGTH
from perfcheck.calibrate.op_classes import formula_costs, opeff_case

aten = torch.ops.aten

#: Embedding table rows of the per-index cases (their dense gradient is the same at both index counts: the slope
#: over the indices is the per-index price).
EMBED_ROWS = 4096
#: Index counts of the per-index cases: a wider span than the 64 -> 512 they ran at before. Why: a
#: backward call's fixed part (the 4096-row gradient zeroed; the bag's backward through autograd: the engine's
#: start, AccumulateGrad) is 20-55 us, as much as 448 indices' worth, so its wobble moves the slope: six fits in a
#: row on the project's Xeon (1 thread, process time, 2026-11-26) gave the bag's backward 56-83 ns per index (40%
#: spread) at 64 -> 512 through autograd, 84-107 (25%) at 128 -> 2048 as one aten call. 128 -> 2048 also spans
#: the index counts of typical lookups (the held-out models': 64 - 2048), where the sort's n log n bends the line.
EMBED_COUNTS = (128, 2048)
#: Indices a rotating case's sets hold in all: 4-8x what the branch predictor held above, so no outcome repeats
#: within its memory; sets of ``n`` indices: ceil(ROTATION_INDICES / n), within ``ROTATION_SETS``.
ROTATION_INDICES = 1 << 16
#: Fewest and most index sets of a rotating case. The most bounds what a small case's calls touch besides their
#: indices (each set's offset2bag, bag sizes and tensor objects): cycling 512 sets of 8 indices read its tiny calls
#: up to 1.5x a one-set loop, a sort of 8 has next to no branches to learn, and 64 sets of 128 indices already
#: reach the branch effect a fresh index set gives there (sort: 5.3 us on one set, 6.7 on 64, 9.5 fresh, randint's
#: ~4 us included).
ROTATION_SETS = (16, 64)

#: EmbeddingBag classes (perfcheck.predict.aten_costs.embedding_bag_class) -> the mode of their tiny call. Why: an
#: ``_embedding_bag`` call costs a fixed 10-18 us beyond its rows whatever its size (offset2bag, bag_size and
#: max_indices allocated and filled, the fbgemm kernel looked up; backward: the indices sorted, offset2bag
#: index_select'ed, per-row counts allocated: EmbeddingBag.cpp ``_embedding_bag_cpu_impl_out``,
#: ``_embedding_bag_dense_backward_cpu_sum_mean``). On the project's Xeon (1 thread, process time, 2026-11-26) a
#: tiny call took 11 us forward and 17 us backward (sum), 19 and 12 us (mean), where a tiny add takes 1.4 us; the
#: per-index cases (``embedding_row_cases``) fit a slope, which leaves it out, so wide & deep's EmbeddingBag
#: forwards (1024-2048 indices) read 20-50 us against 5-19 predicted.
EMBEDDING_BAG_FIXED_CASES = {"_embedding_bag": 0, "_embedding_bag_mean": 1, "_embedding_bag_max": 2}
#: The tiny call's table rows, columns, indices and bags.
EMBEDDING_BAG_TINY = (16, 4, 8, 2)
#: The max-mode cases (class ``_embedding_bag_max``): columns and bag counts (bags of 4 indices) into an
#: ``EMBED_ROWS`` table, a mid size (none of the held-out models' tables). Why a class of its own: max runs a scalar
#: loop per gathered element (EmbeddingBag.cpp ``embedding_bag_cpu_max_out``), not sum's fbgemm kernel, and its
#: backward an ``index_add_`` per column, one strided element per bag, not sum's sorted row adds: on the project's
#: Xeon (1 thread, process time, 2026-11-27) 630 us forward for 4096 indices of 32 columns against sum's 20, and
#: ~6 ns per scattered element backward (bench/results/embedding_classes.md).
EMBEDDING_BAG_MAX_DIM, EMBEDDING_BAG_MAX_BAGS = 32, (128, 1024)


def index_sets(rows: int, n: int, device, seed: int = 0) -> list:
    """Random int64 index sets of ``n`` indices into ``rows`` rows, as many as ``rotating`` needs: ceil(
    ``ROTATION_INDICES`` / n) within ``ROTATION_SETS``."""
    lo, hi = ROTATION_SETS
    gen = torch.Generator().manual_seed(seed)
    count = min(max(math.ceil(ROTATION_INDICES / max(n, 1)), lo), hi)
    return [torch.randint(0, rows, (n,), generator=gen).to(device) for _ in range(count)]


def rotating(calls) -> callable:
    """One zero-argument callable that runs ``calls`` (zero-argument callables) in turn, one per call, round robin,
    returning that call's result: a case's ``fn`` that never sees the same input twice in a row."""
    cycle = itertools.cycle(list(calls))
    return lambda: next(cycle)()


def _bag_calls(table, sets, offs, mode: int, grad) -> tuple:
    """(forward calls, backward calls) of ``aten._embedding_bag`` in ``mode`` over each index set, the backward
    ``aten._embedding_bag_backward`` (what autograd's EmbeddingBagBackward0 calls) with that set's forward
    outputs and ``grad`` as the bags' gradient."""
    fwd, bwd, rows = [], [], table.shape[0]
    for idx in sets:
        _, o2b, bag_size, max_idx = aten._embedding_bag(table, idx, offs, False, mode)
        fwd.append(lambda i=idx: aten._embedding_bag(table, i, offs, False, mode))
        bwd.append(lambda i=idx, o=o2b, b=bag_size, x=max_idx: aten._embedding_bag_backward(
            grad, i, offs, o, b, x, rows, False, mode, False, None))
    return fwd, bwd


def embedding_row_cases(dev) -> list:
    """Per index: ``nn.Embedding`` (aten ``embedding``: a row gather; backward aten.embedding_dense_backward: the
    dense gradient, then one row added per index) and ``nn.EmbeddingBag`` (``_embedding_bag``, sum over bags of 4;
    backward aten._embedding_bag_backward, what autograd's node calls: one aten call, as the embedding's, so no
    engine start or AccumulateGrad adds noise to the slope), each on ``EMBED_COUNTS`` indices into an
    ``EMBED_ROWS``-row table of ``ROW_CASE_LENGTH`` columns, fresh indices every call (``rotating``)."""
    dim = ROW_CASE_LENGTH
    table = torch.randn(EMBED_ROWS, dim, device=dev)
    tg = table.clone().requires_grad_(True)
    out = []
    for n in EMBED_COUNTS:
        sets = index_sets(EMBED_ROWS, n, dev, seed=n)
        offs = torch.arange(0, n, 4, device=dev)
        g, gb = torch.randn(n, dim, device=dev), torch.randn(len(offs), dim, device=dev)
        emb = lambda t, i=sets[0]: torch.nn.functional.embedding(i, t)  # noqa: E731
        bag = lambda t, i=sets[0], o=offs: torch.nn.functional.embedding_bag(i, t, o, mode="sum")  # noqa: E731
        cost = {"embedding": formula_costs(emb, (tg,), ("embedding",)),
                "_embedding_bag": formula_costs(bag, (tg,), ("_embedding_bag",))}
        bag_fwd, bag_bwd = _bag_calls(table, sets, offs, 0, gb)
        calls = {("embedding", "fwd"): [lambda i=i: aten.embedding(table, i) for i in sets],
                 ("embedding", "bwd"): [lambda i=i, g=g: aten.embedding_dense_backward(g, i, EMBED_ROWS, -1, False)
                                        for i in sets],
                 ("_embedding_bag", "fwd"): bag_fwd, ("_embedding_bag", "bwd"): bag_bwd}
        for (name, phase), fns in calls.items():
            _, of, nb, k = cost[name][phase]
            out.append(Case(names.OPROWS, f"{name} {phase}", rotating(fns), "fp32", float(of), float(nb),
                            (n, dim, int(max(k, 1)))))
    return out


def embedding_bag_fixed_cases(dev) -> list:
    """``classfixed`` rows: per ``EMBEDDING_BAG_FIXED_CASES`` class, one tiny ``aten._embedding_bag`` (label = the
    class) and its ``aten._embedding_bag_backward`` (``<class>:bwd``: what autograd's EmbeddingBagBackward0 node
    calls, without the engine), each one aten call on fresh indices (``rotating``), so its time less one tiny op's
    dispatch is the class's fixed cost per call (op_fixed_s; host time in the estimator, perfcheck.predict.host)."""
    rows, dim, n, bags = EMBEDDING_BAG_TINY
    table = torch.randn(rows, dim, device=dev)
    sets = index_sets(rows, n, dev)
    offs = torch.arange(0, n, n // bags, device=dev)
    g = torch.randn(bags, dim, device=dev)
    out = []
    for label, mode in EMBEDDING_BAG_FIXED_CASES.items():
        fwd, bwd = _bag_calls(table, sets, offs, mode, g)
        out += [Case(names.CLASSFIXED, label, rotating(fwd), "fp32", host=True),
                Case(names.CLASSFIXED, f"{label}:bwd", rotating(bwd), "fp32", host=True)]
    return out


def embedding_bag_max_cases(dev) -> list:
    """``opeff`` row ``_embedding_bag_max:fwd`` (``aten._embedding_bag`` in max mode at the larger bag count; the
    fit takes the class's fixed cost, ``embedding_bag_fixed_cases``, out first) and ``oprows`` rows
    ``_embedding_bag_max bwd`` (its ``aten._embedding_bag_backward``, m = bags x columns, the scattered elements)
    at both ``EMBEDDING_BAG_MAX_BAGS``: the slope is the price per scattered element (op_row_s). Fresh indices every
    call (``rotating``): the forward's compares are data-dependent branches."""
    dim, out = EMBEDDING_BAG_MAX_DIM, []
    table = torch.randn(EMBED_ROWS, dim, device=dev)
    for bags in EMBEDDING_BAG_MAX_BAGS:
        sets = index_sets(EMBED_ROWS, 4 * bags, dev, seed=bags)
        offs = torch.arange(0, 4 * bags, 4, device=dev)
        fwd, bwd = _bag_calls(table, sets, offs, 2, torch.randn(bags, dim, device=dev))
        bag = lambda t, i=sets[0], o=offs: torch.nn.functional.embedding_bag(i, t, o, mode="max")  # noqa: E731
        cost = formula_costs(bag, (table.clone().requires_grad_(True),), ("_embedding_bag",))
        _, of, nb, k = cost["bwd"]
        out.append(Case(names.OPROWS, "_embedding_bag_max bwd", rotating(bwd), "fp32", float(of), float(nb),
                        (bags * dim, 1, int(max(k, 1)))))
    out.append(opeff_case("_embedding_bag_max:fwd", rotating(fwd), cost["fwd"]))
    return out


def index_cases(device) -> list:
    """Every case here on ``device``: CPU only (per-index prices and a kernel's fixed cost per call are CPU terms; a
    GPU kernel spreads the indices over its threads, and its fixed cost is the host's, per op family)."""
    dev = torch.device(device)
    if dev.type != "cpu":
        return []
    return embedding_row_cases(dev) + embedding_bag_fixed_cases(dev) + embedding_bag_max_cases(dev)

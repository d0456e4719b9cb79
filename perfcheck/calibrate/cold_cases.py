"""Calibration cases of memory-bound ops timed hot and with their operands evicted from L2 (``memory_cold_curve``).

Why: calibration times each op in a tight loop, where a working set smaller than the core's L2 stays there
(``mem_bandwidth_curve``: a 2 MiB copy moves up to a few times faster than a DRAM-sized one). In a training step
the op's input was often last touched many layers ago (an activation saved for the backward, a parameter) and
comes back from the last-level cache: on the project's Xeon a permuted copy ran 2.1x, a softmax 1.6x and a layer
norm 1.6x their tight-loop time with their operands evicted (bench/results/cold_operands.md).

Cases (kind ``case_names.MEMORY_COLD``), per op of ``COLD_OPS`` and per size of ``COLD_ELEMENTS``: label
``hot <op> <n>`` (each call timed alone right after the same call) and ``<op> <n>`` (each call timed alone after
streaming ``EVICT_L2_MULTIPLE`` x the L2, untimed: ``Case.between``), ``m`` = elements, ``bytes`` = the bytes the
estimator's formulas count for the call (perfcheck.predict.aten_costs.cost_of); and a row ``l2`` (``m`` = the L2
bytes evicted for). ``fit.memory_cold_curve`` turns the pairs into the spec's curve. CPU only: none where the
L2 size is unknown (sysfs).
"""
from __future__ import annotations

import dataclasses

import torch

from perfcheck.calibrate import case_names as names
from perfcheck.calibrate.cases import Case, l2_cache_bytes
from perfcheck.calibrate.op_classes import formula_costs

#: Row length of the row-wise cases (softmax, layer norm): a transformer's hidden size or attention keys.
ROW = 256
#: fp32 elements per operand: 64 KiB to 4 MiB per tensor, i.e. a working set well inside the 2 MiB L2 up to one
#: twice its size (read + write counted: 128 KiB to 8 MiB moved), where a tight loop streams it from beyond
#: L2 as well and the eviction should cost little.
COLD_ELEMENTS = (1 << 14, 1 << 16, 1 << 18, 1 << 20)


def _ops(n: int, dev) -> dict:
    """label -> (function of one input tensor, the aten op it runs, input): the memory-bound op families of a
    step: a copy (``contiguous()`` of a transposed view, as attention's head reshapes run it), a fill (a gradient
    zeroed), a row-wise reduction (softmax) and a normalization (layer norm with weight and bias)."""
    w, b = torch.randn(ROW, device=dev), torch.randn(ROW, device=dev)
    rows = torch.randn(n // ROW, ROW, device=dev)
    return {"copy": (lambda t: t.t().contiguous(), "clone", torch.randn(ROW, n // ROW, device=dev)),
            "fill": (lambda t: t.zero_(), "zero_", torch.randn(n, device=dev)),
            "softmax": (lambda t: torch.softmax(t, -1), "_softmax", rows),
            "layer_norm": (lambda t: torch.nn.functional.layer_norm(t, (ROW,), w, b), "native_layer_norm", rows)}


def memory_cold_cases(device, sizes=COLD_ELEMENTS) -> list:
    """The hot and cold pairs of every op of ``_ops`` at each of ``sizes`` (elements), then the ``l2`` row."""
    dev = torch.device(device)
    l2 = l2_cache_bytes()
    if dev.type != "cpu" or l2 <= 0:
        return []
    flush = torch.empty(names.EVICT_L2_MULTIPLE * l2 // 4, device=dev)
    cases = []
    for n in sizes:
        for label, (fn, aten_name, x) in _ops(n, dev).items():
            _, other, nbytes, _ = formula_costs(fn, (x.clone(),), (aten_name,))["fwd"]
            case = Case(names.MEMORY_COLD, f"{label} {n}", lambda fn=fn, x=x: fn(x), "fp32", float(other),
                        float(nbytes), (n, 0, 0))
            cases += [dataclasses.replace(case, label=f"hot {case.label}", between=case.fn),
                      dataclasses.replace(case, between=lambda f=flush: f.add_(1.0))]
    return cases + [Case(names.MEMORY_COLD, "l2", lambda: None, "fp32", 0.0, 0.0, (l2, 0, 0))]

"""A CPU spec's ``strided_elements_per_s`` from the ``cpustrided`` rows (``cpu_strided_cases``).

The estimator prices a CPU kernel off its vectorised loop as its op's time plus
``max(0, elements / rate - charged_bytes / memory_rate)`` (``predict.strided.strided_excess_s``, added after the
roofline on a CPU), where its contiguous twin is the op alone. So each pair gives, with ``dt`` = strided - twin
seconds, ``n`` = elements, ``b`` = the bytes already charged (the row's ``bytes``):

    n / rate = dt + b / memory_rate     ->     rate_i = n / (dt + b / memory_rate)

(memory_rate = mem_bandwidth x efficiency["memory"], as in ``strided_excess_s``); the spec's rate is the median of
the pairs' (a pair with dt + b / memory_rate <= 0, noise, is left out).

Not in the model (``IN_MODEL`` False): a CPU spec keeps ``strided_elements_per_s`` 0, so the estimator adds nothing
for these kernels. Why: the design set of bench/heldout.py holds almost none of them (two 32 Ki-element key copies
in BERT's attention), and re-predicted on the same measurements with the term its steps moved by at most 0.05%
(bench/results/cpu_strided.md), no improvement beyond noise; the project keeps a term only where the design set
shows one. The calibration still measures the pairs (the table's ``cpustrided`` rows, about a second of the quick
calibration) and ``pair_rates`` reads them: bench/cpu_strided.py prices its op-level probes with that rate.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Optional

from perfcheck.calibrate import case_names as names
from perfcheck.predict.strided import memory_rate


def pair_rates(spec, table) -> dict:
    """label -> elements per second of each strided case against its twin (``cpustrided`` rows of ``table``)."""
    if "kind" not in table:
        return {}
    rows = table[table["kind"] == names.CPU_STRIDED]
    seconds = {str(r.label): float(r.seconds) for r in rows.itertuples(index=False)}
    mem = memory_rate(spec)
    out = {}
    for r in rows.itertuples(index=False):
        label = str(r.label)
        if label.endswith(names.TWIN) or label + names.TWIN not in seconds:
            continue
        spent = seconds[label] - seconds[label + names.TWIN] + float(r.bytes) / mem
        if spent > 0 and float(r.m) > 0:
            out[label] = float(r.m) / spent
    return out


#: Whether a calibrated CPU spec carries the fitted rate (the module docstring: not while the design set shows no gain).
IN_MODEL = False


def fitted_rate(spec, table):
    """The median of ``pair_rates``, or None without pairs."""
    rates = pair_rates(spec, table)
    return float(statistics.median(rates.values())) if rates else None


def apply(spec, table, stamp: str, in_model: Optional[bool] = None):
    """``spec`` with a CPU's ``strided_elements_per_s`` (``fitted_rate``) and its source where ``in_model`` (None:
    ``IN_MODEL``); unchanged otherwise or without ``cpustrided`` pairs."""
    rates = pair_rates(spec, table)
    if not rates or not (IN_MODEL if in_model is None else in_model):
        return spec
    each = ", ".join(f"{k} {v / 1e9:.2f} G/s" for k, v in rates.items())
    sources = {**dict(spec.sources), "strided_elements_per_s": (
        f"{stamp}: median elements per second of CPU kernels off the vectorised loop against their contiguous "
        f"twins (perfcheck.calibrate.cpu_strided_cases, cpu_strided_fit): {each}")}
    return dataclasses.replace(spec, strided_elements_per_s=fitted_rate(spec, table), sources=sources)


__all__ = ["IN_MODEL", "pair_rates", "fitted_rate", "apply"]

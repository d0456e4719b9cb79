"""A CPU spec's ``strided_elements_per_s`` from the ``cpustrided`` rows (``cpu_strided_cases``).

The estimator prices a CPU kernel off its vectorised loop as its op's time plus
``max(0, elements / rate - charged_bytes / memory_rate)`` (``predict.strided.strided_excess_s``, added after the
roofline on a CPU), where its contiguous twin is the op alone. So each pair gives, with ``dt`` = strided - twin
seconds, ``n`` = elements, ``b`` = the bytes already charged (the row's ``bytes``):

    n / rate = dt + b / memory_rate     ->     rate_i = n / (dt + b / memory_rate)

(memory_rate = mem_bandwidth x efficiency["memory"], as in ``strided_excess_s``); the spec's rate is the median of
the pairs' (a pair with dt + b / memory_rate <= 0, noise, is left out).
"""
from __future__ import annotations

import dataclasses
import statistics

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


def apply(spec, table, stamp: str):
    """``spec`` with a CPU's ``strided_elements_per_s`` (median of ``pair_rates``) and its source; unchanged without
    ``cpustrided`` pairs."""
    rates = pair_rates(spec, table)
    if not rates:
        return spec
    each = ", ".join(f"{k} {v / 1e9:.2f} G/s" for k, v in rates.items())
    sources = {**dict(spec.sources), "strided_elements_per_s": (
        f"{stamp}: median elements per second of CPU kernels off the vectorised loop against their contiguous "
        f"twins (perfcheck.calibrate.cpu_strided_cases, cpu_strided_fit): {each}")}
    return dataclasses.replace(spec, strided_elements_per_s=float(statistics.median(rates.values())), sources=sources)


__all__ = ["pair_rates", "apply"]

"""The machine's phase in a calibration (``perfcheck.calibrate.repeats``: why): the two references timed beside
every repeat of a CPU case (``run_cases``' ``reference`` and ``compute_reference``), which kinds of case read
against which, and the re-anchoring of a group's table at a whole calibration's reference times.
"""
from __future__ import annotations

import pandas as pd
import torch

from perfcheck.calibrate import case_names as names, repeats as repeats_mod

#: Seconds of one reference loop (``run_cases``' ``reference`` and ``compute_reference``): ~500 tiny adds or
#: ~25 128^3 mms, long enough to dwarf the clock, short beside a case's own loop (``target_s``, 10 ms in quick
#: mode): ~20% more time for the two.
REFERENCE_LOOP_S = 1e-3
#: Case kinds whose every call is framework code (dispatch, autograd, Python: read ``host`` against the
#: references, ``repeats.against_reference``); every other kind is one dispatch and a kernel's work.
PHASE_HOST_KINDS = (names.LAUNCH, names.HOST, names.OPFIXED, names.OPCOLD, names.MODFIXED, names.CLASSFIXED)


def reference_fn(device):
    """The host reference of ``run_cases``: one ``torch.add`` of 1-element tensors (the ``LAUNCH_OP`` case's call)."""
    a, b = torch.ones(1, device=device), torch.ones(1, device=device)
    return lambda: torch.add(a, b)


def compute_reference_fn(device, n: int = 128):
    """The compute reference of ``run_cases``: an fp32 ``torch.mm`` of n x n (128: ~40 us on the project's
    Xeon, its vector units' work, with one dispatch a few percent of it)."""
    a = torch.randn(n, n, device=device)
    return lambda: torch.mm(a, a)


def per_call_s(fn, calls: int, clock) -> float:
    """Seconds per call of ``calls`` back-to-back calls of ``fn`` on ``clock`` (a reading of a reference between
    timed windows: the DeepSpeed case's rounds, a run's steps, ``perfcheck.measure.speed``)."""
    t0 = clock()
    for _ in range(calls):
        fn()
    return (clock() - t0) / calls


def reanchor(table: pd.DataFrame, reference_s: float, compute_reference_s: float = None) -> pd.DataFrame:
    """``table`` (from ``run_cases`` with a reference) with its seconds at the reference times ``reference_s``
    and ``compute_reference_s`` (a whole calibration's ``repeats.anchor_s``) instead of its own; unchanged
    without a reference."""
    relative = table.attrs.get("relative")
    if not relative:
        return table
    out = table.copy()
    for col, j in (("seconds", 1), ("seconds_min", 2), ("seconds_max", 3)):
        anchored = [repeats_mod.anchored(rel[j], reference_s, rel[0], compute_reference_s) for rel in relative]
        # a kernel faster than the tiny-add reference read in a slow phase anchors at 0 or below: no reading
        # at the reference times exists for it, so it keeps its own (a positive time, never a zero to divide by)
        out[col] = [a if a > 0 else raw for a, raw in zip(anchored, table[col])]
    sec = out["seconds"].astype(float).where(out["seconds"] > 0)
    out["flops_per_s"] = (out["flops"].astype(float) / sec).where(out["flops"] > 0)
    out["bytes_per_s"] = (out["bytes"].astype(float) / sec).where(out["bytes"] > 0)
    out.attrs = {**table.attrs, "reference_s": reference_s, "compute_reference_s": compute_reference_s}
    return out

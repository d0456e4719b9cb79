"""The number a calibration case keeps from its repeats: the median of the fastest half.

Interference on a shared or busy host only ever adds time to a timed loop: another process holding
the core (preemption), its data evicting the case's from the caches, a neighbour's turbo budget.
Nothing makes a loop faster than its code and data allow on an idle core. So the repeats' low end
is the machine's own cost and the high end is the neighbours' (the median of all repeats let a
calibration taken with both cores busy hold 35.8 MB/s copies and a 12.7 ms convolution setup).

The very fastest repeat alone is not kept either: a single repeat can be short for reasons that do
not recur in a run (a loop sized on a warm cache, a clock read landing between ticks), so the kept
value is the median of the fastest ceil(n/2) repeats: with 3 repeats the mean of the two fastest,
with 5 the second fastest, with 9 the third. Up to half the repeats can be disturbed and the number
does not move. ``unsteady`` names the cases whose fastest half still disagrees (the kept value more
than ``UNSTEADY_SPREAD`` above the fastest): the runner times those again.
"""
from __future__ import annotations

import math
import statistics

#: kept / fastest above this: the fastest half of the repeats disagree (a quiet VM's repeats of one
#: case agree within a few percent; a repeat preempted once in a 10 ms loop is 25-50% slower)
UNSTEADY_SPREAD = 1.25


def fastest_half(samples) -> float:
    """Median of the fastest ceil(n/2) of ``samples`` (seconds); see the module docstring."""
    s = sorted(samples)
    if not s:
        raise ValueError("fastest_half: no samples")
    return statistics.median(s[:math.ceil(len(s) / 2)])


def unsteady(samples) -> bool:
    """True when the fastest half of ``samples`` disagrees by more than ``UNSTEADY_SPREAD``."""
    s = sorted(samples)
    return len(s) > 0 and s[0] > 0 and fastest_half(s) > UNSTEADY_SPREAD * s[0]


# ------------------------------------------------------------------------------ the machine's phase
# On the project's shared 2-core VM the same loop of tiny ops runs for seconds at a time at one speed, then at
# another, ~2x apart, in process CPU time too (nothing preempts it: the physical core is shared beneath the VM):
# a 10 s series of 200-add loops read 3.1-3.5 us per add for ~5 s, then 1.6-1.7 us, then 3.0-3.4 again
# (bench/results/calibration_steadiness.md). A calibration's groups run seconds apart, so two groups can sit in
# different phases, and every constant fitted as a difference of two groups' timings then moves by the phase
# step, not by the machine's cost: op_cold_s (a round-robin less the same ops' tight loops) read 2.1-15.9 us
# over six quick calibrations of one afternoon, the small end of the GEMM curve (a 32^3 mm less one tiny add)
# 0.21-1.0. Remedy: a *reference* (the tiny add of ``LAUNCH_OP``) timed right before every timed repeat; each
# repeat is expressed against it, and the calibration-wide reference (``anchor_s``) turns it back into seconds,
# so every case of every group is read at the same phase. The ratio of a dispatch-bound loop to the adjacent
# reference spread 1.2-1.3x (p90/p10) where the raw loop spread 1.6-2.2x; a 256^3 mm's or a 1 MiB copy's did
# not (raw 1.4-1.6x, against the reference 1.4-1.8x): the phase slows host code, not the vector units. Hence
# two readings, one per kind of case:
#   host   (every call is framework code: dispatch, autograd, Python)   kept t / ref,  anchored x R
#   kernel (one dispatch, then the kernel's work)                        kept t - ref,  anchored + R
# (R: ``anchor_s`` of all the reference readings). A kernel reading assumes the phase slows its one dispatch
# as it slows the tiny add and leaves the work alone: a 4 us 32^3 mm is then read without the phase's 2 us,
# a 2.5 ms 512^3 mm is moved by at most that.

#: Quantile of all a calibration's reference readings taken as the reference time R (``anchor_s``). Low: a
#: phase can last most of a short calibration, and interference only adds time; not the very fastest reading
#: (one ~1 ms loop can be short for reasons that do not recur: its quantile needs a tenth of ~hundreds of
#: readings to be as short).
ANCHOR_QUANTILE = 0.1


def anchor_s(readings) -> float:
    """The calibration's reference time: the ``ANCHOR_QUANTILE`` quantile of ``readings`` (seconds; the
    lower of the two neighbours, no interpolation, so a handful of readings gives one of them)."""
    s = sorted(float(x) for x in readings)
    if not s:
        raise ValueError("anchor_s: no reference readings")
    return s[int(ANCHOR_QUANTILE * (len(s) - 1))]


def against_reference(samples, refs, host: bool) -> list:
    """Each repeat read against the reference timed right before it: t / ref for a ``host`` case, t - ref
    for a kernel case (see above)."""
    if len(samples) != len(refs):
        raise ValueError(f"against_reference: {len(samples)} repeats but {len(refs)} reference readings")
    return [t / r for t, r in zip(samples, refs)] if host else [t - r for t, r in zip(samples, refs)]


def anchored(value: float, reference_s: float, host: bool) -> float:
    """A reading of ``against_reference`` back in seconds at the reference time ``reference_s`` (>= 0)."""
    return max(value * reference_s if host else value + reference_s, 0.0)

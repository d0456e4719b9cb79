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
# another, ~2x apart, in process CPU time too (nothing preempts it: the physical core is shared beneath the VM;
# it happened with no other process busy in the VM): a 10 s series of 200-add loops read 3.1-3.5 us per add for
# ~5 s, then 1.6-1.7 us, then 3.0-3.4 again (bench/results/calibration_steadiness.md). A calibration's groups run
# seconds apart, so two groups can sit in different phases, and every constant fitted as a difference of two
# groups' timings then moves by the phase step, not by the machine's cost: op_cold_s (a round-robin less the same
# ops' tight loops) read 2.1-15.9 us over six quick calibrations of one afternoon, the small end of the GEMM
# curve (a 32^3 mm less one tiny add) 0.21-1.0.
#
# Remedy: two *references* timed right before every timed repeat, each repeat expressed against them, and the
# calibration-wide reference times (``anchor_s``) turning it back into seconds, so every case of every group is
# read at one phase. Two, because host code and vector units move apart: against an adjacent tiny add a
# dispatch-bound loop spread 1.2-1.3x (p90/p10; raw 1.6-2.2x) but a 256^3 mm or a LeNet convolution did not
# (raw 1.4-1.7x, against the add 1.4-1.7x); against an adjacent 128^3 mm those spread 1.2-1.3x. So a case is
#   host   (every call is framework code: dispatch, autograd, Python)  t / ref                 anchored x R
#   kernel (one dispatch, then the kernel's work)                       (t - ref) / cref        anchored x Rc + R
# with ref the tiny add and cref the compute reference beside the repeat, R and Rc their ``anchor_s`` over the
# calibration (without a compute reference, kernel: t - ref, anchored + R). The kernel reading is the two-part
# model of a call the estimator itself uses (a dispatch, then roofline work): a 4 us 32^3 mm moves with the add,
# a 2.5 ms 512^3 mm with the mm.

#: Quantile of all a calibration's readings of a reference taken as its time (``anchor_s``): 0, the fastest
#: reading, i.e. the machine's fast phase, which even a calibration spent mostly in the slow one catches for a
#: moment (a reading is a ~1 ms loop of the same tiny call, on a nanosecond clock: nothing makes one spuriously
#: short). It was the steadiest statistic between calibrations: over twelve quick calibrations of one evening
#: (~380 readings each) the tiny add's fastest reading was 1.40-1.66 us (1.18x), its tenth percentile 1.51-2.70
#: (1.78x), its median 1.75-3.32 (1.90x: the phase mix of a 10 s window, bimodal); the 128^3 mm's 26.2-31.3 us
#: (1.20x) against a median of 30.5-46.7 (1.53x). So a calibration reads the machine at its fast phase; a run
#: measured while the slow phase lasts reads above it (bench/results/calibration_steadiness.md). Each case's own
#: repeats still keep their fastest half (``fastest_half``).
ANCHOR_QUANTILE = 0.0


def anchor_s(readings) -> float:
    """A calibration's reference time: the ``ANCHOR_QUANTILE`` quantile of ``readings`` (seconds; the
    lower neighbour, no interpolation)."""
    s = sorted(float(x) for x in readings)
    if not s:
        raise ValueError("anchor_s: no reference readings")
    return s[int(ANCHOR_QUANTILE * (len(s) - 1))]


def against_reference(samples, refs, host: bool, compute_refs=None) -> list:
    """Each repeat read against the references timed right before it (see above): t / ref for a ``host``
    case; (t - ref) / cref for a kernel case (t - ref without ``compute_refs``)."""
    crefs = compute_refs if compute_refs is not None else [1.0] * len(samples)
    if not len(samples) == len(refs) == len(crefs):
        raise ValueError(f"against_reference: {len(samples)} repeats but {len(refs)} reference readings "
                         f"and {len(crefs)} compute reference readings")
    if host:
        return [t / r for t, r in zip(samples, refs)]
    return [(t - r) / c for t, r, c in zip(samples, refs, crefs)]


def anchored(value: float, reference_s: float, host: bool, compute_reference_s: float = None) -> float:
    """A reading of ``against_reference`` back in seconds at the reference times (>= 0): x ``reference_s``
    (host), x ``compute_reference_s`` + ``reference_s`` (kernel; + ``reference_s`` alone without one)."""
    if host:
        return max(value * reference_s, 0.0)
    return max(value * (compute_reference_s if compute_reference_s is not None else 1.0) + reference_s, 0.0)

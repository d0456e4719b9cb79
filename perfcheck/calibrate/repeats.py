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

#: The statistic of all a calibration's readings of a reference taken as its time (``anchor_s``), by name: the
#: level at which the whole calibration is put back in seconds. Each was fitted on the same readings
#: (bench/calibration_anchor.py; bench/results/calibration_anchor.md has the tables).
#:   fastest       the fastest reading: the machine's fast phase. Steady only when a calibration catches that
#:                 phase (16 quick ones: tiny add 1.37-2.61 us, 1.90x; LeNet forward 1.61x), and a run lasting
#:                 longer than a phase is slower than it: the design set's steps read 1.34x its prediction
#:                 (geometric mean over eight paired fits), the ZeRO sweep's forward 1.7-2.4x (CPU time).
#:   median        the middle reading (the lower one of an even count): the phase mix of a ~14 s window, which
#:                 flips between the two phases when the mix is near even (design steps 1.14x then 0.66x their
#:                 prediction with two calibrations around one measurement, the trimmed mean 1.08x then 0.72x;
#:                 LeNet forward 1.39x over 16).
#:   mean          the arithmetic mean. A long run doing a fixed amount of work takes the SUM of its calls' times,
#:                 i.e. its call count times their mean time at the phase mix it meets; the readings are one per
#:                 timed repeat (spread over the work, as a run's calls are), so their mean is that per-call time
#:                 at the calibration's phase mix, moving smoothly with the mix (LeNet forward 1.35x over 16).
#:   trimmed_mean  the mean of the readings between the 5th and the 95th percentile (``TRIM``): the mean without
#:                 a reading stretched by a preemption (the wall clock of ``perfcheck calibrate`` on several
#:                 threads) or a spuriously short one. The steadiest averaging statistic (LeNet forward 1.32x over 16, step 1.34x) and
#:                 on the design set within noise of the fit without references (median |step error| 15.1%
#:                 against 13.7%, level 0.95x against 1.00x, six paired fits): the default.
ANCHOR_STATISTICS = ("fastest", "median", "mean", "trimmed_mean")
#: The statistic a calibration uses (one of ``ANCHOR_STATISTICS``).
ANCHOR = "trimmed_mean"
#: Fraction of the readings ``trimmed_mean`` leaves out at EACH end.
TRIM = 0.05


def anchor_s(readings, statistic: str = None) -> float:
    """A calibration's reference time: the ``statistic`` (default ``ANCHOR``; one of ``ANCHOR_STATISTICS``, see
    there) of ``readings`` (seconds)."""
    s = sorted(float(x) for x in readings)
    if not s:
        raise ValueError("anchor_s: no reference readings")
    statistic = ANCHOR if statistic is None else statistic
    if statistic == "fastest":
        return s[0]
    if statistic == "median":
        return s[(len(s) - 1) // 2]
    if statistic == "mean":
        return math.fsum(s) / len(s)
    if statistic == "trimmed_mean":
        cut = int(TRIM * len(s))  # whole readings left out at each end (none below 1 / TRIM = 20 readings)
        kept = s[cut:len(s) - cut]
        return math.fsum(kept) / len(kept)
    raise ValueError(f"anchor_s: statistic {statistic!r} is not one of {', '.join(ANCHOR_STATISTICS)}")


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

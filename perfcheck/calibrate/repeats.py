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

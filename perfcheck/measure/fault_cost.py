"""What one first-touch page fault costs on this machine: a micro-benchmark run once in the measured process.

Method (independent of the process's malloc state, so it measures the kernel, not glibc's thresholds):
map a fresh anonymous region with ``mmap`` (``MADV_NOHUGEPAGE``: 4 KiB pages, the granularity of the
faults a freed-and-reallocated tensor takes under the usual ``madvise`` transparent-huge-page setting),
write one byte in every page (a strided numpy store: each page faults on its first write; the kernel
maps and zeroes it), then the same bytes again (no fault: the pages are mapped). The difference of the
two passes' CPU time over the faults counted during the first is the cost of one fault, the kernel's
zeroing included, and nothing else (a full ``memset`` per page would add the C library's store strategy,
e.g. non-temporal stores over the freshly zeroed lines):

    seconds per fault = (t(first pass) - t(second pass)) / minor faults of the first pass

Times are the calling thread's CPU time (``time.thread_time_ns``: a fault is handled in the kernel on the
thread that touched the page and counted as its system time; time spent waiting for a core on a shared
machine is not), median over ``REPEATS`` fresh regions of ``REGION_BYTES``. About 15-30 ms in all.

Why here and not in the calibration: the cost depends on the kernel, on virtualisation (a fault in a VM
may also exit to the hypervisor) and on the host's current state (1.1 to 3.4 us per fault on the shared
2-core VM of bench/results/page_faults.md within one hour), and it is cheap. Measured in the run's own
process it is this run's machine's number at the time of the run, it needs no calibration-cache key, and
a report read on another machine still quotes the run's. The recorder runs it once, at the first measured
step that faulted (``measure.fault_record``), so runs without faults never pay for it; meta.json
``page_faults.cost``.
"""
from __future__ import annotations

import mmap
import statistics
import time

import numpy as np

from perfcheck.measure.page_faults import fault_reader

#: Region per repeat: 1024 pages of 4 KiB (about 1.5 ms of faults at 1.5 us each: large enough that the
#: two reads of the fault counter and the clock are noise, small enough to run inside a run).
REGION_BYTES = 4 << 20
#: Fresh regions measured; the median is kept (a repeat preempted between its two passes is an outlier).
REPEATS = 7

METHOD = ("fresh anonymous mmap (MADV_NOHUGEPAGE), one byte of every page written (first touch: one minor fault "
          "per page) and written again (no fault); (thread CPU time of the first pass - the second) / minor faults "
          "of the first; median over repeats")


def _one(size: int, read, clock):
    """(faults, first-pass seconds, second-pass seconds) of one fresh region."""
    region = mmap.mmap(-1, size)
    try:
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            region.madvise(mmap.MADV_NOHUGEPAGE)
        pages = np.frombuffer(region, dtype=np.uint8)[::mmap.PAGESIZE]  # one byte of every page
        try:
            f0 = read()[0]
            t0 = clock()
            pages[:] = 1
            t1 = clock()
            f1 = read()[0]
            t2 = clock()
            pages[:] = 2
            t3 = clock()
        finally:
            del pages  # the exported buffer must go before the region can close
    finally:
        region.close()
    return f1 - f0, (t1 - t0) * 1e-9, (t3 - t2) * 1e-9


def measure_fault_cost(size: int = REGION_BYTES, repeats: int = REPEATS, read=None) -> dict | None:
    """``{"seconds_per_fault", "faults_per_region", "region_bytes", "bytes_per_fault", "repeats", "method"}``
    for this machine, or None when there is no fault counter or no repeat faulted (a platform that
    pre-faults anonymous memory)."""
    if read is None:
        read, _ = fault_reader()
        if read is None:
            return None
    clock = getattr(time, "thread_time_ns", time.process_time_ns)
    costs, faults = [], []
    for _ in range(max(int(repeats), 1)):
        n, first, second = _one(int(size), read, clock)
        if n > 0:
            costs.append((first - second) / n)
            faults.append(n)
    if not costs:
        return None
    per_region = statistics.median(faults)
    return {"seconds_per_fault": max(statistics.median(costs), 0.0), "faults_per_region": per_region,
            "region_bytes": int(size), "bytes_per_fault": size / per_region, "repeats": len(costs), "method": METHOD}

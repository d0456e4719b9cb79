"""What one first-touch page fault costs on this machine: a micro-benchmark run once in the measured process.

Method (independent of the process's malloc state, so it measures the kernel, not glibc's thresholds):
map a fresh anonymous region with ``mmap`` (``MADV_NOHUGEPAGE``: 4 KiB pages, the granularity of the
faults a freed-and-reallocated tensor takes under the usual ``madvise`` transparent-huge-page setting),
write every byte once (``memset``: each page faults on its first write; the kernel maps and zeroes it),
then write it all again (no fault: the same bytes, pages mapped). The difference of the two writes' CPU
time over the faults counted during the first is the cost of one fault, zeroing included:

    seconds per fault = (t(first write) - t(second write)) / minor faults of the first write

Times are the calling thread's CPU time (``time.thread_time_ns``: a fault is handled in the kernel on the
thread that touched the page and counted as its system time; time spent waiting for a core on a shared
machine is not), median over ``REPEATS`` fresh regions of ``REGION_BYTES``. About 25 ms in all.

Why here and not in the calibration: the cost depends on the kernel, on virtualisation (a fault in a VM
may also exit to the hypervisor) and on the host's current state, and it is cheap; measured in the run's
own process it is this run's machine's number, it needs no calibration-cache key, and a report read on
another machine still quotes the run's. The recorder runs it once, at the first measured step that
faulted (``measure.session``), so runs without faults never pay for it; meta.json ``page_faults.cost``.
"""
from __future__ import annotations

import ctypes
import mmap
import statistics
import time

from perfcheck.measure.page_faults import fault_reader

#: Region per repeat: 1024 pages of 4 KiB (about 2 ms of faults at 2 us each; large enough that the
#: two reads of the fault counter and the timer calls are noise, small enough to run inside a run).
REGION_BYTES = 4 << 20
#: Fresh regions measured; the median is kept (a repeat preempted between its two writes is an outlier).
REPEATS = 7

METHOD = ("fresh anonymous mmap (MADV_NOHUGEPAGE) written once (first touch: one minor fault per page) and "
          "again (no fault); (thread CPU time of the first write - the second) / minor faults of the first; "
          "median over repeats")


def _one(size: int, read, clock):
    """(faults, first-write seconds, second-write seconds) of one fresh region."""
    region = mmap.mmap(-1, size)
    try:
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            region.madvise(mmap.MADV_NOHUGEPAGE)
        view = (ctypes.c_char * size).from_buffer(region)
        try:
            addr = ctypes.addressof(view)
            f0 = read()[0]
            t0 = clock()
            ctypes.memset(addr, 1, size)
            t1 = clock()
            f1 = read()[0]
            t2 = clock()
            ctypes.memset(addr, 2, size)
            t3 = clock()
        finally:
            del view  # the exported buffer must go before the region can close
    finally:
        region.close()
    return f1 - f0, (t1 - t0) * 1e-9, (t3 - t2) * 1e-9


def measure_fault_cost(size: int = REGION_BYTES, repeats: int = REPEATS, read=None) -> dict | None:
    """``{"seconds_per_fault", "faults_per_region", "region_bytes", "bytes_per_fault", "touch_s_per_byte",
    "repeats", "method"}`` for this machine, or None when there is no fault counter or no repeat faulted
    (a platform that pre-faults anonymous memory)."""
    if read is None:
        read, _ = fault_reader()
        if read is None:
            return None
    clock = getattr(time, "thread_time_ns", time.process_time_ns)
    costs, faults, rewrite = [], [], []
    for _ in range(max(int(repeats), 1)):
        n, first, second = _one(int(size), read, clock)
        if n > 0:
            costs.append((first - second) / n)
            faults.append(n)
            rewrite.append(second)
    if not costs:
        return None
    per_region = statistics.median(faults)
    return {"seconds_per_fault": max(statistics.median(costs), 0.0), "faults_per_region": per_region,
            "region_bytes": int(size), "bytes_per_fault": size / per_region,
            "touch_s_per_byte": statistics.median(rewrite) / size,  # the write alone, pages mapped (a memset)
            "repeats": len(costs), "method": METHOD}

"""First-touch page faults of fresh CPU buffers: which allocations fault every call, and how many pages.

Why: a CPU kernel that allocates a large output (an Embedding's backward: a new (vocab, dim) gradient zero-filled
every call) pays, beyond the fill's bytes, one minor page fault per 4 KiB page when the C library hands it a fresh
mapping; the estimator prices those pages at the spec's host constant ``page_fault_s`` (formulas.Cost.pages,
perfcheck.predict.roofline.op_device_times).
"""
from __future__ import annotations

import numpy as np

#: Bytes from which glibc's malloc always serves an allocation by a fresh mmap: its dynamic mmap threshold rises
#: to the size of a freed mapped chunk, but only up to DEFAULT_MMAP_THRESHOLD_MAX = 4 * 1024 * 1024 *
#: sizeof(long) = 32 MiB on a 64-bit system (glibc malloc/malloc.c, mallopt(3) M_MMAP_THRESHOLD), so a buffer of
#: 32 MiB or more is mapped at its allocation and unmapped at its free, every time: each of its pages faults on
#: first touch. Below it, whether a fresh buffer faults depends on the allocation history (the threshold's
#: rise, heap trimming): not priced.
MMAP_ALWAYS_BYTES = 32 * 2 ** 20
#: Bytes of a base page (x86-64 and most Linux systems: 4 KiB; transparent huge pages are not used by torch's
#: CPU allocator unless THP_MEM_ALLOC_ENABLE is set).
PAGE_BYTES = 4096


def fresh_pages(nbytes):
    """4 KiB pages a fresh ``nbytes`` buffer faults in on its first touch where every allocation of it is a new
    mapping (``MMAP_ALWAYS_BYTES`` or more), else 0. Why: an Embedding's backward zero-fills a new (vocab, dim)
    gradient every call (aten embedding_dense_backward: ``at::zeros({num_weights, dim})``); on the project's Xeon
    (1 thread, process time, 2026-11-27) a 100000 x 128 table's (49 MiB) took 25.1 ms against 7.6 predicted from
    its bytes, 12501 minor faults per call at 2.0 us each (bench/results/embedding_classes.md)."""
    nbytes = np.asarray(nbytes, dtype=float)
    pages = np.where(nbytes >= MMAP_ALWAYS_BYTES, np.ceil(nbytes / PAGE_BYTES), 0.0)
    return float(pages) if pages.ndim == 0 else pages

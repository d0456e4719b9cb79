"""Device memory per module forward and per step, from the CUDA caching allocator's counters.

``torch.cuda.memory_allocated`` / ``max_memory_allocated`` read host-side allocator statistics:
no device synchronize. A module's activation memory is ``allocated(after forward) -
allocated(before forward)`` (what the forward kept alive: saved activations plus its output).
Its peak is read with nested resets of the allocator's peak counter:

* entering a module folds the current peak into the enclosing frame, then resets the counter;
* leaving it reads the peak since the last reset and folds it into the enclosing frame.

So every frame (module call, and the step at the bottom) sees the true maximum over its span,
even though the allocator keeps one global counter. The side effect, documented for users:
while PerfCheck tracks memory, ``torch.cuda.max_memory_allocated()`` read by the user's own code
only covers the time since the last module boundary (pass ``memory=False`` to avoid it).

On CPU there is no allocator counter for tensors: per-module values are NaN and ``meta.json``
says so; the sampler's process RSS (samples.csv ``rss_bytes``) is what is measurable.
"""
from __future__ import annotations

import torch

CPU_NOTE = ("memory: per-module activation and peak memory are measured from the CUDA caching "
            "allocator; on CPU they are not measurable (act_mem_bytes and peak_mem_bytes are NaN). "
            "Process RSS is sampled in samples.csv (rss_bytes, and mem_used_bytes without NVML).")

OFF_NOTE = ("memory: per-module and per-step CUDA memory off (PerfCheck(memory=True) turns it on; it reads the "
            "allocator's stats at every module boundary, ~23 us of host time per call on an H100); GPU memory used "
            "is sampled in samples.csv (NVML).")

CUDA_NOTE = ("memory: act_mem_bytes = torch.cuda.memory_allocated() after minus before the module's "
             "forward; peak_mem_bytes = max_memory_allocated() over its forward, read with nested "
             "reset_peak_memory_stats() at module boundaries (so the user's own max_memory_allocated() "
             "only covers the time since the last module boundary while PerfCheck runs).")


class _Frame:
    __slots__ = ("running", "start")

    def __init__(self, start: int):
        self.running = 0
        self.start = start


def _allocator_readers(device: torch.device):
    """``read() -> (allocated now, peak since the last reset)`` and ``reset()`` for one device.

    NB: ``torch.cuda.memory_allocated`` builds, flattens and sorts the allocator's whole statistics
    dict on every call (about 100 us); four such calls per module call made PerfCheck's hooks cost
    more host time than GPT-2 small's GPU step on an H100 (+216% step time, 2026-11-22). One read
    of the nested dict per module boundary costs a few microseconds."""
    stats = getattr(torch._C, "_cuda_memoryStats", None)
    reset = getattr(torch._C, "_cuda_resetPeakMemoryStats", None)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if stats is None or reset is None:  # another torch build: the public (slower) functions
        return (lambda: (torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)),
                lambda: torch.cuda.reset_peak_memory_stats(device))

    def read():
        b = stats(index)["allocated_bytes"]["all"]
        return b["current"], b["peak"]

    return read, lambda: reset(index)


class CudaMemoryTracker:
    """Nested allocator-peak tracking for one CUDA device (see module docstring)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._read, self._reset = _allocator_readers(device)
        self._stack: list[_Frame] = []

    def begin_step(self):
        self._stack = [_Frame(self._read()[0])]
        self._reset()

    def enter(self) -> _Frame:
        current, peak = self._read()
        if self._stack:
            top = self._stack[-1]
            if peak > top.running:
                top.running = peak
        self._reset()
        frame = _Frame(current)
        self._stack.append(frame)
        return frame

    def exit(self, frame: _Frame) -> tuple[int, int]:
        """Close ``frame``: return (allocated delta, peak) in bytes."""
        current, peak = self._read()
        peak = max(frame.running, peak)
        delta = current - frame.start
        stack = self._stack
        while stack and stack[-1] is not frame:  # frames left open by an exception
            stack.pop()
        if stack:
            stack.pop()
        if stack and peak > stack[-1].running:
            stack[-1].running = peak
        return delta, peak

    def end_step(self) -> int:
        """Peak allocated bytes over the step (the bottom frame)."""
        peak = self._read()[1]
        if self._stack:
            peak = max(peak, self._stack[0].running)
        self._stack = []
        return peak

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

CUDA_NOTE = ("memory: act_mem_bytes = torch.cuda.memory_allocated() after minus before the module's "
             "forward; peak_mem_bytes = max_memory_allocated() over its forward, read with nested "
             "reset_peak_memory_stats() at module boundaries (so the user's own max_memory_allocated() "
             "only covers the time since the last module boundary while PerfCheck runs).")


class _Frame:
    __slots__ = ("running", "start")

    def __init__(self, start: int):
        self.running = 0
        self.start = start


class CudaMemoryTracker:
    """Nested allocator-peak tracking for one CUDA device (see module docstring)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._allocated = torch.cuda.memory_allocated
        self._max = torch.cuda.max_memory_allocated
        self._reset = torch.cuda.reset_peak_memory_stats
        self._stack: list[_Frame] = []

    def begin_step(self):
        self._stack = [_Frame(self._allocated(self.device))]
        self._reset(self.device)

    def enter(self) -> _Frame:
        dev = self.device
        if self._stack:
            top = self._stack[-1]
            peak = self._max(dev)
            if peak > top.running:
                top.running = peak
        self._reset(dev)
        frame = _Frame(self._allocated(dev))
        self._stack.append(frame)
        return frame

    def exit(self, frame: _Frame) -> tuple[int, int]:
        """Close ``frame``: return (allocated delta, peak) in bytes."""
        dev = self.device
        peak = max(frame.running, self._max(dev))
        delta = self._allocated(dev) - frame.start
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
        peak = self._max(self.device)
        if self._stack:
            peak = max(peak, self._stack[0].running)
        self._stack = []
        return peak

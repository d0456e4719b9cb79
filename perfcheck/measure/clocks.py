"""The two clocks every measurement in perfcheck uses: host time on CPU, CUDA events on GPUs.

A clock hands out tokens (``now()``); ``seconds(start, end)`` turns two into an interval once
``ready(end)``. CUDA tokens are pooled events recorded on the current stream and resolved only
after the work has completed (``query()``), so taking a reading never synchronizes the device.
"""
from __future__ import annotations

import time

import torch


class CpuClock:
    """Tokens are ``perf_counter_ns`` integers."""

    kind = "cpu"
    now = staticmethod(time.perf_counter_ns)
    #: seconds per token unit: an interval is (end - start) * NS (written out in hot loops)
    NS = 1e-9

    def take_step_tokens(self):
        return None

    @staticmethod
    def ready(token) -> bool:
        return True

    @staticmethod
    def seconds(start, token) -> float:
        return (token - start) * CpuClock.NS

    def release(self, tokens):
        """Integers need no pooling."""
        return None


class CudaClock:
    """Tokens are pooled ``torch.cuda.Event(enable_timing=True)`` recorded on the current stream."""

    kind = "cuda"

    def __init__(self, device):
        self.device = torch.device(device)
        self._pool: list = []
        self._used: list = []

    def now(self):
        ev = self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self.device))
        self._used.append(ev)
        return ev

    def take_step_tokens(self):
        used, self._used = self._used, []
        return used

    @staticmethod
    def ready(token) -> bool:
        return token.query()

    @staticmethod
    def seconds(start, token) -> float:
        try:
            return start.elapsed_time(token) * 1e-3
        except RuntimeError:  # recorded on another stream that has not reached it yet
            token.synchronize()
            return start.elapsed_time(token) * 1e-3

    def release(self, tokens):
        if tokens:
            self._pool.extend(tokens)


def clock_for(device) -> "CpuClock | CudaClock":
    """The clock for a model on ``device``: CUDA events on a CUDA device, host time otherwise."""
    device = torch.device(device)
    return CudaClock(device) if device.type == "cuda" else CpuClock()

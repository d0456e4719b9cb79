"""The calibration timer's CUDA paths, on a CPU, with a fake CUDA runtime and a fake clock.

Reference: a scripted clock (each call of the case advances it by a known amount, the filler by another)
and a log of which CUDA calls ran. What is checked (issue 24): on CUDA a host case with a filler runs the
filler before each call, outside the timing, and is timed on the host clock with no sync inside the call nor between filler and call;
a once-per-step case (optimizer, backward()) is called once per filler, i.e. once per "step"; a host
case without a filler is timed on the host clock; a device case (GEMM, copy) is still timed with events.
"""
from __future__ import annotations

import pytest
import torch

from perfcheck.calibrate import cases as cases_mod
from perfcheck.calibrate.cases import Case, Timer, host_cases, run_cases


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class _FakeCuda:
    """torch.cuda.synchronize / Event replaced: each records what ran into ``log``; an event pair reads
    ``event_ms`` per elapsed_time call."""

    def __init__(self, log, event_ms=3.0):
        self.log, self.event_ms = log, event_ms
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                fake.log.append("event")

            def record(self):
                fake.log.append("record")

            def synchronize(self):
                fake.log.append("event.sync")

            def elapsed_time(self, other):
                return fake.event_ms

        self.Event = Event

    def synchronize(self, device=None):
        self.log.append("sync")


@pytest.fixture
def fake_cuda(monkeypatch):
    log = []
    fake = _FakeCuda(log)
    monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
    monkeypatch.setattr(torch.cuda, "Event", fake.Event)
    clock = _Clock()
    timer = Timer(torch.device("cuda"))
    timer._now = clock
    timer._read = 0.0  # the fake clock costs nothing to read
    return timer, clock, log


def test_cuda_host_case_with_a_filler_runs_it_before_each_call_untimed(fake_cuda):
    timer, clock, log = fake_cuda

    def filler():
        log.append("filler")
        clock.t += 1.0  # 1 s of filler: must not be counted

    def fn():
        log.append("call")
        clock.t += 0.005  # 5 ms per call: the answer

    assert timer.loop(fn, 4, between=filler, host=True) == pytest.approx(0.005)
    calls = [e for e in log if e in ("filler", "call")]
    assert calls == ["filler", "call"] * 4  # once per "step": one call after each filler
    # the device is synchronized once, before the loop: never between a filler and its call (a step runs its
    # optimizer right after the backward's queued kernels) nor inside a call; no events
    assert "event" not in log and log.count("sync") == 1 and log[0] == "sync"
    for i, e in enumerate(log):
        if e == "call":
            assert log[i - 1] == "filler"


def test_cuda_host_case_without_a_filler_is_timed_on_the_host_clock(fake_cuda):
    timer, clock, log = fake_cuda

    def fn():
        log.append("call")
        clock.t += 0.002

    assert timer.loop(fn, 10, host=True) == pytest.approx(0.002)
    assert "event" not in log and log.count("sync") == 1 and log[0] == "sync"  # one sync, before the loop


def test_cuda_device_case_is_timed_with_events(fake_cuda):
    timer, clock, log = fake_cuda
    timer_log_before = len(log)

    def fn():
        clock.t += 1.0  # the host clock moves, but a device case reads the events: 3 ms / 6 calls

    assert timer.loop(fn, 6) == pytest.approx(3e-3 / 6)
    assert log[timer_log_before:].count("event") == 2 and "record" in log


def test_once_per_step_host_cases_on_cuda_have_the_filler_and_the_host_clock(fake_cuda, monkeypatch):
    """host_cases built for a CUDA device (tensors on the CPU here: the device only picks the paths) mark
    the optimizer and backward() cases cold (a filler) and every host case host-clocked; run_cases then
    calls each once-per-step case once per filler in the timed repeats."""
    timer, clock, log = fake_cuda
    real_device = torch.device

    built = host_cases(real_device("cpu"))
    by_label = {c.label: c for c in built}
    for label in ("optim sgd x2", "optim adam_foreach x16", "forward+backward x8"):
        assert by_label[label].between is not None and by_label[label].host, label
    assert all(c.host for c in built)
    assert by_label["module call"].between is None

    counts = {"filler": 0, "call": 0}

    def filler():
        counts["filler"] += 1
        clock.t += 0.5

    def step_cost():
        counts["call"] += 1
        clock.t += 200e-6  # an optimizer step of 200 us

    case = Case("host", "optim fake", step_cost, "fp32", between=filler, host=True)
    table = run_cases([case], timer, repeats=3, target_s=0.01)
    # every timed call follows its filler (once per step); the one extra is run_cases' untimed warm-up call
    assert counts["call"] == counts["filler"] + 1
    assert table.seconds.iloc[0] == pytest.approx(200e-6)
    assert table.iters.iloc[0] <= cases_mod._COLD_MAX_ITERS

"""perfcheck.measure.speed.SpeedProbe: the calibration's two references, per call, on a planted clock."""
import math

import pytest
import torch

from perfcheck.measure import speed


def test_read_is_seconds_per_call_of_each_reference(monkeypatch):
    probe = speed.SpeedProbe(torch.device("cpu"))
    calls = {"add": 0, "mm": 0}
    probe._add = lambda: calls.__setitem__("add", calls["add"] + 1)
    probe._mm = lambda: calls.__setitem__("mm", calls["mm"] + 1)
    after_adds = 10.0 + speed.ADDS * 3e-6  # each reference's loop reads the clock before and after it
    stamps = iter([10.0, after_adds, after_adds, after_adds + speed.MMS * 50e-6])
    monkeypatch.setattr(speed.time, "process_time", lambda: next(stamps))
    ref, cref = probe.read()
    # one untimed warm-up call of each before its timed loop (the step before a reading evicts the operands)
    assert calls == {"add": speed.ADDS + 1, "mm": speed.MMS + 1}
    assert ref == pytest.approx(3e-6) and cref == pytest.approx(50e-6)


def test_real_readings_are_positive():
    ref, cref = speed.SpeedProbe().read()
    assert 0 < ref < 1e-3 and 0 < cref < 1e-1


def test_off_the_cpu_nothing_is_read():
    probe = speed.SpeedProbe(torch.device("meta"))
    assert not probe.enabled and all(math.isnan(x) for x in probe.read())

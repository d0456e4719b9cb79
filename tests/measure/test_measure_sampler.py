"""The utilization sampler: interval limits, psutil fallback, NVML failures (missing library,
MIG/NotSupported), shutdown order, no per-sample process queries, step labels."""
from __future__ import annotations

import math
import sys
import threading
import time
import types

import pytest
import torch

from perfcheck import PerfCheck, UserError
from perfcheck.examples.models import JSC_Tiny
from perfcheck.measure import sampler as sampler_mod
from perfcheck.measure.sampler import Sampler
from perfcheck.schema import SAMPLE_COLUMNS


@pytest.mark.parametrize("interval", [0.0, 0.05, 0.099, -1, float("nan"), "fast"])
def test_interval_below_minimum_is_rejected(interval):
    with pytest.raises(UserError, match="sample_interval"):
        Sampler(interval)
    with pytest.raises(UserError, match="sample_interval"):
        PerfCheck(JSC_Tiny(), sample_interval=interval)


def test_psutil_samples_carry_steps_cpu_and_rss():
    step = {"n": 0}
    s = Sampler(0.1, step_fn=lambda: step["n"]).start()
    t0 = time.time()
    while time.time() - t0 < 0.55:
        step["n"] = int((time.time() - t0) / 0.1)
        sum(i * i for i in range(20000))  # keep the process busy
    s.stop()
    assert len(s.rows) >= 3 and s.backend == "psutil"
    for r in s.rows:
        assert set(r) == set(SAMPLE_COLUMNS)
        assert r["rss_bytes"] > 10e6 and r["mem_used_bytes"] == r["rss_bytes"] and r["mem_total_bytes"] > r["rss_bytes"]
        assert math.isnan(r["gpu_util"]) and math.isnan(r["power_w"])
        assert 0 <= r["cpu_util"] <= 64
    assert [r["step"] for r in s.rows] == sorted(r["step"] for r in s.rows) and s.rows[-1]["step"] >= 2
    assert not any(t.name == "perfcheck-sampler" for t in threading.enumerate())


class FakeNVMLError(Exception):
    """Stands in for pynvml.NVMLError."""


def fake_pynvml(calls: list, *, init_fails=False, util_unsupported=False):
    nv = types.ModuleType("pynvml")
    nv.NVMLError = FakeNVMLError
    nv.NVML_CLOCK_SM, nv.NVML_TEMPERATURE_GPU = 1, 0

    def log(name, value=None):
        def fn(*a):
            calls.append((name, threading.current_thread().name))
            if callable(value):
                return value()
            return value
        return fn

    def init():
        calls.append(("init", threading.current_thread().name))
        if init_fails:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def util():
        if util_unsupported:
            raise FakeNVMLError("Not Supported")
        return types.SimpleNamespace(gpu=37)

    def shutdown():
        alive = any(t.name == "perfcheck-sampler" for t in threading.enumerate())
        calls.append(("shutdown", "sampler alive" if alive else "sampler joined"))

    def processes(*a):
        raise AssertionError("running processes must never be queried per sample")

    nv.nvmlInit = init
    nv.nvmlShutdown = shutdown
    nv.nvmlDeviceGetUtilizationRates = log("util", util)
    nv.nvmlDeviceGetMemoryInfo = log("mem", types.SimpleNamespace(used=3e9, total=80e9))
    nv.nvmlDeviceGetPowerUsage = log("power", 250_000)
    nv.nvmlDeviceGetClockInfo = log("clock", 1980)
    nv.nvmlDeviceGetTemperature = log("temp", 55)
    nv.nvmlDeviceGetComputeRunningProcesses = processes
    nv.nvmlDeviceGetGraphicsRunningProcesses = processes
    return nv


def test_nvml_missing_warns_once_and_falls_back_to_psutil(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(calls, init_fails=True))
    with pytest.warns(RuntimeWarning, match="NVML unavailable") as rec:
        s = Sampler(0.1, device=torch.device("cuda", 0)).start()
        time.sleep(0.35)
        s.stop()
    assert len([w for w in rec if "NVML" in str(w.message)]) == 1
    assert s.backend == "psutil" and len(s.rows) >= 2 and all(r["rss_bytes"] > 0 for r in s.rows)


def test_nvml_mig_not_supported_keeps_the_rest_and_shuts_down_after_join(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(calls, util_unsupported=True))
    monkeypatch.setattr(sampler_mod._Nvml, "_find_handle", lambda self, index: "handle-by-uuid")
    with pytest.warns(RuntimeWarning, match="cannot read gpu_util") as rec:
        s = Sampler(0.1, device=torch.device("cuda", 0)).start()
        time.sleep(0.45)
        s.stop()
    assert len([w for w in rec if "gpu_util" in str(w.message)]) == 1  # warned once, not per sample
    assert s.backend == "nvml+psutil" and len(s.rows) >= 3
    for r in s.rows:
        assert math.isnan(r["gpu_util"])
        assert r["mem_used_bytes"] == 3e9 and r["power_w"] == 250.0 and r["sm_clock_hz"] == 1.98e9
        assert r["temperature_c"] == 55.0 and r["rss_bytes"] > 0
    assert calls[-1] == ("shutdown", "sampler joined")
    assert sum(1 for c in calls if c[0] == "util") == 1  # unsupported: tried once, not per sample
    assert all(thread == "perfcheck-sampler" for name, thread in calls if name in ("mem", "power"))


def test_perfcheck_samples_are_labelled_with_steps():
    model = JSC_Tiny()
    pc = PerfCheck(model, warmup=0, steps=None, profile=False, sample_interval=0.1)
    with pc:
        for _ in range(4):
            model(torch.randn(8, 16)).sum().backward()
            time.sleep(0.12)
            pc.step()
    s = pc.samples()
    assert list(s.columns) == list(SAMPLE_COLUMNS) and len(s) >= 3
    assert s["step"].is_monotonic_increasing and s["step"].max() >= 2
    assert pc.meta()["sampler"]["backend"] == "psutil"


@pytest.mark.timing  # upper bounds on when the sampler thread wakes (wall clock): out of the fast lane
def test_short_runs_get_a_dense_curve_to_their_end():
    """Issue 11: a run's sampler panel had 2 points. With a 0.5 s interval a 1.2 s run gets samples every
    0.1 s from its start (DENSE_SAMPLES of them) and one at stop()."""
    import time as _time

    from perfcheck.measure import sampler as S

    s = Sampler(0.5)
    s.start()
    _time.sleep(1.2)
    t_stop = _time.perf_counter() - s._t0
    s.stop()
    times = [r["time_s"] for r in s.rows]
    assert len(times) >= 8, times  # ~11 at 0.1 s on a quiet machine; 0.5 s would give 2
    assert times[0] < 0.35 and abs(times[-1] - t_stop) < 0.3
    assert S.DENSE_SAMPLES * S.MIN_INTERVAL_S <= 2.0  # the dense phase is bounded: long runs keep the interval
    s2 = Sampler(0.5)
    s2.rows = [{}] * S.DENSE_SAMPLES
    assert s2.next_wait() == 0.5

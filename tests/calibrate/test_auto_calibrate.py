"""The automatic quick calibration of a CPU with no cache entry (perfcheck.calibrate.auto): off under
the tests unless turned on, measured once and then read from the cache, named in the report header,
never waited on (another process's lock), never in a rank of a multi-process job, and a failure
falls back to the datasheet. The calibration itself is replaced by a hand-made table here (its
arithmetic is tests/calibrate/test_calibrate.py's); the quick mode's case selection is checked without timing."""
import math

import pandas as pd
import pytest
import torch

from perfcheck.errors import UserError
from perfcheck.calibrate import auto
from perfcheck.hardware import cache
from perfcheck.calibrate import run as calrun
from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS, build_spec
from perfcheck.hardware.systems import load_system

STAMP = "measured by perfcheck calibrate on testhost (test CPU), 2026-01-01 00:00 UTC, torch 2.13.0"


def _table():
    """Tiny op 2 us; fp32 matmuls at 40 GFLOP/s; copy 10 GB/s; add 4 GFLOP/s."""
    def row(kind, label, seconds, m=0, k=0, n=0, flops=0.0, nbytes=0.0):
        return {"kind": kind, "label": label, "dtype": "fp32", "m": m, "k": k, "n": n, "flops": flops, "bytes": nbytes,
                "world_size": 1, "seconds": seconds, "seconds_min": seconds, "seconds_max": seconds, "repeats": 3,
                "iters": 1, "flops_per_s": flops / seconds if flops else math.nan,
                "bytes_per_s": nbytes / seconds if nbytes else math.nan, "busbw_bytes_per_s": math.nan}
    rows = [row("launch", "op", 2e-6), row("launch", "autograd", 4e-6),
            row("copy", "copy 64 MiB", 2 * 2 ** 26 / 10e9, nbytes=2 * 2 ** 26),
            row("vector", "add", 2 ** 18 / 4e9 + 2e-6, m=2 ** 18, flops=2 ** 18, nbytes=12 * 2 ** 18)]
    rows += [row("matmul", f"mm {s}", 2.0 * s ** 3 / 40e9 + 2e-6, s, s, s, 2.0 * s ** 3, 12.0 * s * s)
             for s in (64, 256, 1024)]
    return pd.DataFrame(rows, columns=list(MEASUREMENT_COLUMNS))


@pytest.fixture
def auto_on(monkeypatch, tmp_path):
    """Auto-calibration turned on, an empty cache of its own, and a fake calibrate that counts its calls."""
    monkeypatch.setenv("PERFCHECK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(auto.AUTO_ENV, "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    from perfcheck.calibrate import sanity

    monkeypatch.setattr(sanity, "busy_now", lambda threads, seconds=0.5: None)  # a quiet machine (the busy case:
    calls = []  # tests/calibrate/test_calibration_trust.py)

    def fake(base=None, **kw):
        calls.append(kw)
        spec = build_spec(load_system(base), _table(), peaks="measured", stamp=STAMP, name=kw.get("name"), kind="cpu")
        return calrun.Calibration(spec, _table(), (), 0.01)

    monkeypatch.setattr(calrun, "calibrate", fake)
    return calls


def test_off_under_the_tests():
    import os

    assert os.environ.get(auto.AUTO_ENV) == "0"  # conftest
    assert not auto.auto_calibration_enabled() and not auto.auto_calibration_allowed("cpu")
    assert auto.cached_spec("cpu") is None
    assert not cache.cache_path("cpu").exists()


@pytest.mark.parametrize("value, enabled", [("0", False), ("off", False), ("False", False), ("no", False),
                                            ("1", True), ("yes", True), ("", True)])
def test_the_switch(monkeypatch, value, enabled):
    monkeypatch.setenv(auto.AUTO_ENV, value)
    assert auto.auto_calibration_enabled() is enabled


def test_measured_once_kept_and_named_in_the_header(auto_on, capsys):
    """The edge of a measuring session (PerfCheck.system_spec: resolve_system(calibrate=True)) calibrates;
    the estimator itself never does (tests/calibrate/test_calibration_trust.py)."""
    from perfcheck.examples.models import JSC_Tiny
    from perfcheck.predict.module_estimator import estimate

    pred = estimate(JSC_Tiny(), (torch.randn(4, 16),), system=auto.resolve_system("cpu", calibrate=True))
    assert len(auto_on) == 1
    kw = auto_on[0]
    # quick, CPU, no collectives (they would start processes), the named spec
    assert kw["mode"] == "quick" and kw["device"] == "cpu" and kw["comm"] is False and kw["name"] == cache.AUTO_NAME
    label = pred.attrs["system_label"]
    assert label.startswith("cpu-auto-calibrated (calibrated: automatic quick calibration, per-user cache ")
    assert pred.attrs["calibrated"] is True
    err = capsys.readouterr().err
    assert "measuring a quick one" in err and "PERFCHECK_AUTO_CALIBRATE=0" in err
    assert cache.cache_path("cpu").is_file()
    assert not list(cache.cache_path("cpu").parent.glob("*.lock")) and not list(cache.cache_path("cpu").parent.glob("*.tmp"))
    # the second prediction reads the cache: no second calibration, the same header
    again = estimate(JSC_Tiny(), (torch.randn(4, 16),), system=auto.resolve_system("cpu", calibrate=True))
    assert len(auto_on) == 1 and again.attrs["system_label"] == label
    # and the ceilings are the measured ones (40 GFLOP/s), not the datasheet's 1 TFLOP/s
    spec = auto.cached_spec("cpu")
    assert spec.matrix_flops_per_s["fp32"] == pytest.approx(40e9, rel=1e-3)
    # a run directory embeds the spec (predicted.json): read back without the cache file, the header still says so
    from perfcheck.hardware.systems import SystemSpec

    embedded = SystemSpec.from_dict(spec.to_json_dict())
    assert cache.spec_label(embedded) == ("cpu-auto-calibrated (calibrated: automatic quick calibration; when and under "
                                          "what load: not recorded)")  # the fake calibration stamps no load record


def test_an_explicit_system_never_calibrates(auto_on):
    from perfcheck.examples.models import JSC_Tiny
    from perfcheck.predict.module_estimator import estimate

    pred = estimate(JSC_Tiny(), (torch.randn(4, 16),), system="cpu")
    assert auto_on == [] and pred.attrs["system_label"] == "cpu (datasheet)"


def test_another_process_calibrating_is_not_waited_for(auto_on, capsys):
    path = cache.cache_path("cpu")
    path.parent.mkdir(parents=True)
    lock = path.with_name(path.name + ".lock")
    lock.write_text("12345")
    assert auto.cached_spec("cpu") is None and auto_on == []
    assert "another process is calibrating" in capsys.readouterr().err
    # a crashed calibration's lock (older than the stale age) is taken over
    import os
    import time

    old = time.time() - auto._STALE_LOCK_S - 10
    os.utime(lock, (old, old))
    assert auto.cached_spec("cpu").name == cache.AUTO_NAME and len(auto_on) == 1 and not lock.exists()


@pytest.mark.parametrize("env", [{"WORLD_SIZE": "2"}, {auto.AUTO_ENV: "0"}])
def test_not_in_a_rank_nor_when_turned_off(auto_on, monkeypatch, env):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert auto.cached_spec("cpu") is None and auto_on == []


@pytest.mark.parametrize("world", ["1", "", "two", " 1 "])
def test_one_process_or_a_malformed_world_size_still_calibrates(auto_on, monkeypatch, world):
    monkeypatch.setenv("WORLD_SIZE", world)
    assert auto.auto_calibration_allowed("cpu")


def test_never_on_a_gpu(auto_on):
    assert not auto.auto_calibration_allowed("cuda")
    assert not auto.auto_calibration_allowed(torch.device("cuda", 0))


def test_a_failed_calibration_falls_back_to_the_datasheet(auto_on, monkeypatch, capsys):
    def broken(base=None, **kw):
        raise RuntimeError("no BLAS today")

    monkeypatch.setattr(calrun, "calibrate", broken)
    assert auto.cached_spec("cpu") is None
    assert "automatic calibration failed (no BLAS today)" in capsys.readouterr().err
    assert not cache.cache_path("cpu").exists()
    assert not list(cache.cache_path("cpu").parent.glob("*.lock"))
    from perfcheck.predict.module_estimator import default_system_name

    assert default_system_name().name == "cpu"


def test_quick_mode_times_other_dtypes_on_two_squares_only(monkeypatch):
    """On a CPU the reference dtype (fp32) gets every quick shape, bf16 only ``other_squares``: its
    GEMMs set a peak, not the curves, and run ~10x slower than fp32 on a CPU without bf16 units."""
    seen = []

    def fake_run(cases, timer, *, repeats, target_s, **kw):
        seen.extend(cases)
        rows = [{"kind": c.kind, "label": c.label, "dtype": c.dtype, "m": c.shape[0], "k": c.shape[1], "n": c.shape[2],
                 "flops": c.flops, "bytes": c.bytes, "world_size": 1, "seconds": 1e-6 + c.flops / 1e10 + c.bytes / 1e10,
                 "seconds_min": 1e-6, "seconds_max": 1e-3, "repeats": repeats, "iters": 1, "flops_per_s": math.nan,
                 "bytes_per_s": math.nan, "busbw_bytes_per_s": math.nan} for c in cases]
        return pd.DataFrame(rows, columns=list(MEASUREMENT_COLUMNS))

    monkeypatch.setattr(calrun, "run_cases", fake_run)
    res = calrun.calibrate("cpu", mode="quick", device="cpu", dtypes=["fp32", "bf16"], comm=False)
    mm = [(c.dtype, c.label) for c in seen if c.kind == "matmul"]
    assert [lab for d, lab in mm if d == "bf16"] == ["mm 128x128x128", "mm 512x512x512"]
    quick = calrun.MODES["quick"]
    assert len([lab for d, lab in mm if d == "fp32"]) == len(quick["squares"]) + len(quick["linear"])
    assert res.spec.matrix_flops_per_s["bf16"] != load_system("cpu").matrix_flops_per_s["bf16"]  # measured


def test_unwritable_cache_says_so(auto_on, monkeypatch, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("PERFCHECK_CACHE_DIR", str(blocker / "sub"))  # a folder under a file: cannot be made
    assert auto.cached_spec("cpu") is None and auto_on == []
    assert "cannot write the calibration cache" in capsys.readouterr().err
    with pytest.raises(UserError, match="PERFCHECK_CACHE_DIR"):
        cache.save_to_cache(load_system("cpu"), "cpu")


def test_the_users_random_stream_and_threads_are_left_as_they_were(auto_on, monkeypatch):
    """The automatic calibration runs inside the user's process (at a PerfCheck's stop): its cases draw
    random inputs, which must not move the user's generator."""
    inner = calrun.calibrate

    def drawing(base=None, **kw):
        torch.randn(1000)  # what the real cases do (cases.py draws its operands with torch.randn)
        return inner(base, **kw)

    monkeypatch.setattr(calrun, "calibrate", drawing)
    torch.manual_seed(1234)
    expected = torch.randn(8)
    torch.manual_seed(1234)
    assert auto.auto_calibrate("cpu") is not None and len(auto_on) == 1
    assert torch.equal(torch.randn(8), expected)

"""The ZeRO sweep's multi-process terms (issue 12, session 4): the slowdown of ranks sharing a host applied
to a constructed prediction by hand, the concurrency case's arithmetic and its real run, and the sweep
measuring DeepSpeed's and the concurrency terms once into the calibration cache."""
import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest

from perfcheck.errors import UserError
from perfcheck.hardware.calibrate import concurrency
from perfcheck.hardware.systems import HOST_KEYS, host_constants, host_source, load_system
from perfcheck.predict import host

MS = 1e-3
US = 1e-6
DATA = Path(__file__).parent / "data" / "deepspeed_sweep"


def _spec(kind="cpu", **values):
    base = load_system("cpu" if kind == "cpu" else "h100-sxm")
    return dataclasses.replace(base, host={**{k: 0.0 for k in host_constants(base)}, **values})


def test_process_slowdown_by_hand():
    spec = _spec(process_slowdown_per_peer=0.25)
    # 1 + (N - 1) x 0.25: one process 1.0, two 1.25, five 2.0
    assert host.process_slowdown(spec, 1) == 1.0
    assert host.process_slowdown(spec, 2) == pytest.approx(1.25)
    assert host.process_slowdown(spec, 5) == pytest.approx(2.0)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(UserError, match="processes"):
            host.process_slowdown(spec, bad)


def test_the_key_has_defaults_and_sources_for_cpu_and_gpu():
    assert "process_slowdown_per_peer" in HOST_KEYS
    cpu, gpu = load_system("cpu"), load_system("h100-sxm")
    assert 0 <= host_constants(cpu)["process_slowdown_per_peer"] < 0.5
    assert "two processes training at once" in host_source(cpu, "process_slowdown_per_peer")
    assert "not measured on a GPU" in host_source(gpu, "process_slowdown_per_peer")


def _stage0():
    from perfcheck.analysis import stages

    st = stages.load_stage(DATA / "stage0")
    facts = next(iter(st["ranks"].values()))["facts"]
    return stages, st, facts


def test_stage_prediction_scales_host_and_cpu_compute_by_the_ranks_on_the_host():
    """Stage 0 of the recorded sweep (LeNet, 10 tensors, dp 2) on a CPU spec with known DeepSpeed terms:
    fwd = factor x (model fwd + 100 us + 10 x 2 us); the collectives (alpha 1 ms here) are not scaled."""
    stages, st, facts = _stage0()
    predicted = st["predicted"]
    model_fwd = float(predicted.loc[predicted["depth"] == 0, "pred_fwd_s"].iloc[0])
    spec = _spec(process_slowdown_per_peer=0.25, zero0_fwd_s=100 * US, zero0_fwd_tensor_s=2 * US,
                 zero0_bwd_s=300 * US, collective_latency_s=1 * MS)
    one = stages.predict({**facts, "ranks_per_node": 1}, predicted, spec)
    two = stages.predict({**facts, "ranks_per_node": 2}, predicted, spec)
    assert one.times["fwd_s"] == pytest.approx(model_fwd + 120 * US)
    assert two.times["fwd_s"] == pytest.approx(1.25 * (model_fwd + 120 * US))
    assert two.times["bwd_host_s"] == pytest.approx(1.25 * 300 * US)
    assert two.times["bwd_comm_s"] == one.times["bwd_comm_s"] > 1 * MS  # 1 all-reduce: alpha + bytes / bandwidth
    # without ranks_per_node: world size / nodes
    assert stages.local_processes({"world_size": 8, "nodes": 2}) == 4
    assert stages.local_processes({"world_size": 2, "nodes": 1, "ranks_per_node": 2}) == 2
    assert stages.local_processes({}) == 1


def test_gpu_host_scales_only_the_host_timeline():
    """factor 1.5. Host-bound forward (10 ms, host 8 ms): 10 + 0.5 x 8 = 14 ms. Device-bound backward
    (20 ms, host 5 ms): max(20, 1.5 x 5) = 20 ms; with host 15 ms: max(20, 22.5) = 22.5 ms. On a CPU both
    scale whole: 15 and 30 ms."""
    from perfcheck.analysis import stages

    frame = pd.DataFrame([{"module": "(root)", "depth": 0, "pred_fwd_s": 10 * MS, "pred_bwd_s": 20 * MS,
                           "host_fwd_s": 8 * MS, "host_bwd_s": 5 * MS, "bound_fwd": "host", "bound_bwd": "compute"}])
    assert stages._compute_times(frame, 1.5, "gpu") == pytest.approx((14 * MS, 20 * MS))
    frame["host_bwd_s"] = 15 * MS
    assert stages._compute_times(frame, 1.5, "gpu") == pytest.approx((14 * MS, 22.5 * MS))
    assert stages._compute_times(frame, 1.5, "cpu") == pytest.approx((15 * MS, 30 * MS))
    assert stages._compute_times(frame, 1.0, "gpu") == pytest.approx((10 * MS, 20 * MS))  # factor 1: unchanged
    assert all(math.isnan(x) for x in stages._compute_times(pd.DataFrame(), 1.5, "cpu"))


def test_summarize_and_apply_by_hand(tmp_path):
    # three rounds at 3 processes: median ratio 1.2 -> per peer (1.2 - 1) / 2 = 0.1
    r = concurrency.summarize([1.1, 1.3, 1.2], 3, 2 * MS, 2.4 * MS)
    assert r["factor"] == pytest.approx(1.2) and r["per_peer"] == pytest.approx(0.1)
    assert concurrency.summarize([0.97, 0.99, 0.98], 2, MS, MS)["per_peer"] == 0.0  # below 1: noise, no speed-up
    spec = concurrency.apply(load_system("cpu"), r, "vm, 2026-11-23")
    assert host_constants(spec)["process_slowdown_per_peer"] == pytest.approx(0.1)
    assert "median ratio 1.200" in spec.sources["host.process_slowdown_per_peer"]
    again = load_system(str(spec.save(tmp_path / "s.json")))
    assert host.process_slowdown(again, 3) == pytest.approx(1.2)
    rows = concurrency.rows_for_table(r)
    assert rows.loc[0, "kind"] == "concurrency" and rows.loc[0, "world_size"] == 3
    with pytest.raises(UserError, match="world_size"):
        concurrency.bench_concurrency(1)
    with pytest.raises(UserError, match="mode"):
        concurrency.bench_concurrency(2, "slow")


@pytest.mark.slow
def test_real_concurrency_case_writes_a_sane_value():
    """Two processes on this machine (quick mode, ~5-15 s): every round measured, a per-step CPU time of a
    few milliseconds, and a factor a shared host can give (two processes neither speed each other up by
    more than noise nor triple each other's CPU time)."""
    r = concurrency.bench_concurrency(2, "quick", threads=1, timeout_s=200)
    assert len(r["rounds"]) == concurrency.MODES["quick"][1]
    assert 1e-4 < r["alone_s"] < 0.1 and 1e-4 < r["together_s"] < 0.1
    assert 0.8 < r["factor"] < 3.0 and 0.0 <= r["per_peer"] < 2.0


def test_sweep_measures_missing_terms_once_into_the_cache(tmp_path, monkeypatch):
    """A cached calibration without DeepSpeed's or the concurrency terms gets both measured (the cases are
    replaced by planted results here), saved to the cache file, and a second sweep measures nothing."""
    from perfcheck.hardware import cache
    from perfcheck.hardware.calibrate import deepspeed_cases
    from perfcheck.integrations.deepspeed import sweep

    monkeypatch.setenv("PERFCHECK_CACHE_DIR", str(tmp_path))
    base = dataclasses.replace(load_system("cpu"), name="cpu-auto-calibrated", calibrated=True)
    path = base.save(cache.cache_path("cpu", threads=1))
    spec = cache.cached_spec("cpu", threads=1, auto=False)
    assert sweep.missing_terms(spec) == ["deepspeed", "concurrency"]
    calls = []

    def fake_ds(mode, *, threads):
        calls.append(("deepspeed", mode, threads))
        return "ds-result"

    def fake_ds_apply(spec, result, stamp):
        return dataclasses.replace(spec, host={**dict(spec.host), "zero0_fwd_s": 123 * US},
                                   sources={**dict(spec.sources), "host.zero0_fwd_s": "measured"})

    def fake_conc(n, mode, *, threads):
        calls.append(("concurrency", n, mode))
        return concurrency.summarize([1.1], n, MS, 1.1 * MS)

    monkeypatch.setattr(deepspeed_cases, "available", lambda: True)
    monkeypatch.setattr(deepspeed_cases, "bench_deepspeed", fake_ds)
    monkeypatch.setattr(deepspeed_cases, "apply", fake_ds_apply)
    monkeypatch.setattr(concurrency, "bench_concurrency", fake_conc)
    said = []
    out = sweep.calibrate_sweep_terms(spec, ranks=2, threads=1, say=said.append)
    assert calls == [("deepspeed", "quick", 1), ("concurrency", 2, "quick")]
    assert host_constants(out)["zero0_fwd_s"] == pytest.approx(123 * US)
    assert host.process_slowdown(out, 2) == pytest.approx(1.1)
    kept = cache.cached_spec("cpu", threads=1, auto=False)
    assert sweep.missing_terms(kept) == [] and kept.name == "cpu-auto-calibrated" and path.is_file()
    assert host_constants(kept)["process_slowdown_per_peer"] == pytest.approx(0.1)
    calls.clear()
    sweep.calibrate_sweep_terms(kept, ranks=2, threads=1, say=said.append)
    assert calls == []
    # one rank per host: nothing to measure for concurrency; a failing case leaves its defaults, one line
    spec = cache.cached_spec("cpu", threads=1, auto=False)
    monkeypatch.setattr(deepspeed_cases, "bench_deepspeed", lambda mode, *, threads: (_ for _ in ()).throw(
        RuntimeError("engine case failed")))
    fresh = dataclasses.replace(load_system("cpu"), name="x", calibrated=True)
    said.clear()
    out = sweep.calibrate_sweep_terms(fresh, ranks=1, threads=1, say=said.append)
    assert calls == [] and any("engine case failed" in m for m in said)
    assert sweep.missing_terms(out) == ["deepspeed", "concurrency"]


def test_comparison_row_names_the_factor_it_applied(monkeypatch):
    """The recorded stage 0 (2 ranks on one host) on a spec with 0.25 per peer: the row carries the factor
    (1 + 1 x 0.25) and the ranks, and the notes say what was multiplied."""
    stages, st, facts = _stage0()
    spec = _spec(process_slowdown_per_peer=0.25)
    data = next(iter(st["ranks"].values()))
    row = stages._row(st, facts["rank"], data, spec)
    assert row["local_processes"] == 2 and row["pred_process_slowdown"] == pytest.approx(1.25)
    assert "terms x1.250: 2 ranks share this host" in row["notes"]
    one = stages._row(st, facts["rank"], {**data, "facts": {**facts, "ranks_per_node": 1}}, spec)
    assert one["pred_process_slowdown"] == 1.0 and "share this host" not in one["notes"]


def test_every_predicted_column_has_a_measured_twin_or_is_declared_predicted_only():
    """The fast twin of the real sweep's CSV check: a new pred_ column of a stage row is either paired with
    its meas_ column or listed in PREDICTED_ONLY (the process slowdown is an input of the prediction)."""
    stages, st, facts = _stage0()
    row = stages._row(st, facts["rank"], next(iter(st["ranks"].values())), _spec(process_slowdown_per_peer=0.1))
    preds = [c for c in row if c.startswith("pred_")]
    missing = [c for c in preds if c not in stages.PREDICTED_ONLY and "meas_" + c[len("pred_"):] not in row]
    assert not missing, missing

"""The ZeRO sweep's multi-process terms (issue 12): the slowdown of ranks sharing a host applied
to a constructed prediction by hand, the concurrency case's arithmetic and its real run, the collectives'
alpha and link from an all-reduce table by hand, and the sweep measuring DeepSpeed's, the collectives' and
the concurrency terms once into the calibration cache."""
import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest

from perfcheck.errors import UserError
from perfcheck.calibrate import concurrency
from perfcheck.hardware.systems import HOST_KEYS, host_constants, host_source, load_system
from perfcheck.predict import host

MS = 1e-3
US = 1e-6
DATA = Path(__file__).resolve().parents[1] / "data" / "deepspeed_sweep"


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
    from perfcheck.analysis import stage_prediction

    _, st, facts = _stage0()
    predicted = st["predicted"]
    model_fwd = float(predicted.loc[predicted["depth"] == 0, "pred_fwd_s"].iloc[0])
    spec = _spec(process_slowdown_per_peer=0.25, zero0_fwd_s=100 * US, zero0_fwd_tensor_s=2 * US,
                 zero0_bwd_s=300 * US, collective_latency_s=1 * MS)
    one = stage_prediction.predict({**facts, "ranks_per_node": 1}, predicted, spec)
    two = stage_prediction.predict({**facts, "ranks_per_node": 2}, predicted, spec)
    assert one.times["fwd_s"] == pytest.approx(model_fwd + 120 * US)
    assert two.times["fwd_s"] == pytest.approx(1.25 * (model_fwd + 120 * US))
    assert two.times["bwd_host_s"] == pytest.approx(1.25 * 300 * US)
    assert two.times["bwd_comm_s"] == one.times["bwd_comm_s"] > 1 * MS  # 1 all-reduce: alpha + bytes / bandwidth
    # without ranks_per_node: world size / nodes
    assert stage_prediction.local_processes({"world_size": 8, "nodes": 2}) == 4
    assert stage_prediction.local_processes({"world_size": 2, "nodes": 1, "ranks_per_node": 2}) == 2
    assert stage_prediction.local_processes({}) == 1


def test_gpu_host_scales_only_the_host_timeline():
    """factor 1.5. Host-bound forward (10 ms, host 8 ms): 10 + 0.5 x 8 = 14 ms. Device-bound backward
    (20 ms, host 5 ms): max(20, 1.5 x 5) = 20 ms; with host 15 ms: max(20, 22.5) = 22.5 ms. On a CPU both
    scale whole: 15 and 30 ms."""
    from perfcheck.analysis import stage_prediction

    frame = pd.DataFrame([{"module": "(root)", "depth": 0, "pred_fwd_s": 10 * MS, "pred_bwd_s": 20 * MS,
                           "host_fwd_s": 8 * MS, "host_bwd_s": 5 * MS, "bound_fwd": "host", "bound_bwd": "compute"}])
    assert stage_prediction.compute_times(frame, 1.5, "gpu") == pytest.approx((14 * MS, 20 * MS))
    frame["host_bwd_s"] = 15 * MS
    assert stage_prediction.compute_times(frame, 1.5, "gpu") == pytest.approx((14 * MS, 22.5 * MS))
    assert stage_prediction.compute_times(frame, 1.5, "cpu") == pytest.approx((15 * MS, 30 * MS))
    assert stage_prediction.compute_times(frame, 1.0, "gpu") == pytest.approx((10 * MS, 20 * MS))  # factor 1: unchanged
    assert all(math.isnan(x) for x in stage_prediction.compute_times(pd.DataFrame(), 1.5, "cpu"))


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


def _allreduce_table(rows):
    """A measurement table of all-reduce rows (bytes S, seconds) across 2 ranks, busbw = S / t (factor 1)."""
    from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS

    return pd.DataFrame([{"kind": "allreduce", "label": f"allreduce {b} B", "dtype": "fp32", "m": 0, "k": 0, "n": 0,
                          "flops": 0.0, "bytes": float(b), "world_size": 2, "seconds": t, "seconds_min": t,
                          "seconds_max": t, "repeats": 3, "iters": 1, "flops_per_s": math.nan,
                          "bytes_per_s": b / t, "busbw_bytes_per_s": b / t} for b, t in rows],
                        columns=list(MEASUREMENT_COLUMNS))


def test_collectives_apply_by_hand():
    """4 KiB 2 ms (a stall), 64 KiB 1.3 ms, 4 MiB 6 ms. Link: 4194304 B / 6 ms = 699 MB/s (bus factor 1 at 2
    ranks), efficiency 1 (a CPU's measured convention). Alpha: the least of each smaller size less its bytes
    at the 4 MiB rate: 4 KiB 2 ms - 6 ms / 1024 = 1.994 ms; 64 KiB 1.3 - 6 / 64 = 1.206 ms -> 1.206 ms.
    A 248024 B all-reduce is then 1.206 ms + 248024 / 699 MB/s (0.355 ms) = 1.561 ms."""
    from perfcheck.calibrate import collectives, fit
    from perfcheck.calibrate import sweep_terms as sweep
    from perfcheck.predict.collectives import collective_time_s

    base = dataclasses.replace(load_system("cpu"), name="cpu-auto-calibrated", calibrated=True,
                               sources={**dict(load_system("cpu").sources),
                                        "intra_node_bandwidth_bytes_per_s": "from base spec 'cpu' (not measured): x"})
    assert not collectives.measured_here(base) and "collectives" in sweep.missing_terms(base)
    table = _allreduce_table([(4096, 2 * MS), (65536, 1.3 * MS), (4194304, 6 * MS)])
    out = fit.apply_collectives(base, table, "vm, 2026-11-23")
    assert out.intra_node_bandwidth_bytes_per_s == pytest.approx(4194304 / 6e-3)
    assert out.efficiency["intra_node"] == 1.0
    assert host_constants(out)["collective_latency_s"] == pytest.approx(1.3e-3 - 6e-3 / 64)
    assert collective_time_s("allreduce", 248024, 2, out) == pytest.approx(1.20625e-3 + 248024 / (4194304 / 6e-3))
    assert collectives.measured_here(out) and "collectives" not in sweep.missing_terms(out)
    assert "64 KiB" in out.sources["host.collective_latency_s"] and "vm, 2026-11-23" in out.sources[
        "intra_node_bandwidth_bytes_per_s"]
    assert host_constants(out)["zero0_fwd_s"] == host_constants(base)["zero0_fwd_s"]  # nothing else moves
    assert out.matrix_flops_per_s == base.matrix_flops_per_s and out.name == base.name
    # one size: a link but no alpha -> still missing (the sweep reports the case as not measured)
    one = fit.apply_collectives(base, _allreduce_table([(4194304, 6 * MS)]), "s")
    assert "collectives" in sweep.missing_terms(one)


def test_sweep_measures_missing_terms_once_into_the_cache(tmp_path, monkeypatch):
    """A cached calibration without DeepSpeed's, the collectives' or the concurrency terms gets all three
    measured (the cases are replaced by planted results here), saved to the cache file, and a second sweep
    measures nothing."""
    from perfcheck.hardware import cache
    from perfcheck.calibrate import collectives, deepspeed_cases
    from perfcheck.calibrate import sweep_terms as sweep
    from perfcheck.predict.collectives import collective_time_s

    monkeypatch.setenv("PERFCHECK_CACHE_DIR", str(tmp_path))
    base = dataclasses.replace(load_system("cpu"), name="cpu-auto-calibrated", calibrated=True)
    path = base.save(cache.cache_path("cpu", threads=1))
    spec = cache.cached_spec("cpu", threads=1)
    assert sweep.missing_terms(spec) == ["concurrency", "deepspeed", "collectives", "collective sync"]
    default_ar = collective_time_s("allreduce", 248024, 2, spec)
    calls = []

    def fake_ds(mode, *, threads, world_size):
        calls.append(("deepspeed", mode, threads, world_size))
        return "ds-result"

    def fake_ds_apply(spec, result, stamp):
        return dataclasses.replace(spec, host={**dict(spec.host), "zero0_fwd_s": 123 * US, "zero_ranks": 2.0}, sources={
            **dict(spec.sources), "host.zero0_fwd_s": "s, DeepSpeed 0.19.8, 2 ranks on this host, ..."})

    def fake_comm(sizes, *, kinds, world_size, device, repeats, target_s, timeout_s):
        calls.append(("collectives", tuple(sizes), tuple(kinds), world_size, device))
        # 64 KiB 1.3 ms, 4 MiB 6 ms: alpha 1.206 ms, link 699 MB/s (test_collectives_apply_by_hand)
        return _allreduce_table([(4096, 2 * MS), (65536, 1.3 * MS), (4194304, 6 * MS)])

    def fake_conc(n, mode, *, threads):
        calls.append(("concurrency", n, mode))
        return concurrency.summarize([1.1], n, MS, 1.1 * MS)

    def fake_sync(n, mode):
        calls.append(("collective sync", n, mode))
        # batch of 10 in 5.5 ms vs one in 1 ms: (5.5 - 1) / 9 = 0.5 ms per further call; waits 0.2, 0.4 -> 0.3 ms
        return collectives.sync_terms([1 * MS], [5.5 * MS], [0.2 * MS, 0.4 * MS], n)

    monkeypatch.setattr(collectives, "bench_sync_terms", fake_sync)
    monkeypatch.setattr(deepspeed_cases, "available", lambda: True)
    monkeypatch.setattr(deepspeed_cases, "bench_deepspeed", fake_ds)
    monkeypatch.setattr(deepspeed_cases, "apply", fake_ds_apply)
    monkeypatch.setattr(collectives, "bench_collectives", fake_comm)
    monkeypatch.setattr(concurrency, "bench_concurrency", fake_conc)
    said = []
    out = sweep.calibrate_sweep_terms(spec, ranks=2, threads=1, say=said.append)
    # the quick calibration's all-reduce sizes (4 KiB, 64 KiB, 4 MiB) at the sweep's 2 ranks
    assert calls == [("concurrency", 2, "quick"), ("deepspeed", "quick", 1, 2),
                     ("collectives", (4096, 65536, 4194304), ("allreduce",), 2, "cpu"), ("collective sync", 2, "quick")]
    assert host_constants(out)["collective_async_call_s"] == pytest.approx(0.5 * MS)
    assert host_constants(out)["collective_straggler_s"] == pytest.approx(0.3 * MS)
    assert host_constants(out)["collective_straggler_ranks"] == 2
    assert host_constants(out)["zero0_fwd_s"] == pytest.approx(123 * US)
    assert host.process_slowdown(out, 2) == pytest.approx(1.1)
    assert host_constants(out)["collective_latency_s"] == pytest.approx(1.20625e-3)
    kept = cache.cached_spec("cpu", threads=1)
    assert sweep.missing_terms(kept) == [] and kept.name == "cpu-auto-calibrated" and path.is_file()
    assert host_constants(kept)["process_slowdown_per_peer"] == pytest.approx(0.1)
    # the predicted 248 KB all-reduce moved from the defaults' to the measured alpha + bytes / link
    assert collective_time_s("allreduce", 248024, 2, kept) == pytest.approx(1.20625e-3 + 248024 / (4194304 / 6e-3))
    assert collective_time_s("allreduce", 248024, 2, kept) != pytest.approx(default_ar)
    calls.clear()
    sweep.calibrate_sweep_terms(kept, ranks=2, threads=1, say=said.append)
    assert calls == []
    # one rank per host: nothing to measure between ranks; a failing case leaves its defaults, one line
    monkeypatch.setattr(deepspeed_cases, "bench_deepspeed", lambda mode, *, threads, world_size: (_ for _ in ()).throw(
        RuntimeError("engine case failed")))
    fresh = dataclasses.replace(load_system("cpu"), name="x", calibrated=True)
    said.clear()
    out = sweep.calibrate_sweep_terms(fresh, ranks=1, threads=1, say=said.append)
    assert calls == [] and [m for m in said if "engine case failed" in m] == [
        "perfcheck sweep: deepspeed case not measured (engine case failed); its host terms stay the defaults"]
    assert sweep.missing_terms(out) == ["concurrency", "deepspeed", "collectives", "collective sync"]


@pytest.mark.deepspeed  # the deepspeed case runs for real (a child engine, ~12 s): not the fast lane
def test_sweep_collectives_failure_leaves_the_defaults_and_says_so_once(tmp_path, monkeypatch):
    """The collectives' processes fail (CollectiveBenchError, a RuntimeError): one line names the case, alpha
    and the link stay the defaults' (the 248 KB all-reduce's prediction is unchanged), the other families are
    still measured, and the cache keeps them without the collectives (the next sweep tries again)."""
    from perfcheck.hardware import cache
    from perfcheck.calibrate import collectives, deepspeed_cases
    from perfcheck.calibrate import sweep_terms as sweep
    from perfcheck.predict.collectives import collective_time_s

    monkeypatch.setenv("PERFCHECK_CACHE_DIR", str(tmp_path))
    spec = dataclasses.replace(load_system("cpu"), name="cpu-auto-calibrated", calibrated=True,
                               sources={**dict(load_system("cpu").sources), "host.zero0_fwd_s": "measured"})
    before = collective_time_s("allreduce", 248024, 2, spec)

    def broken(*a, **k):
        raise collectives.CollectiveBenchError("collective benchmark failed: process 1 terminated with exit code 1")

    monkeypatch.setattr(collectives, "bench_collectives", broken)
    monkeypatch.setattr(collectives, "bench_sync_terms", lambda n, mode: collectives.sync_terms(
        [MS], [MS], [0.0], n))
    monkeypatch.setattr(deepspeed_cases, "available", lambda: True)
    monkeypatch.setattr(concurrency, "bench_concurrency", lambda n, mode, *, threads: concurrency.summarize(
        [1.2], n, MS, 1.2 * MS))
    said = []
    out = sweep.calibrate_sweep_terms(spec, ranks=2, threads=1, say=said.append)
    failed = [m for m in said if "not measured" in m]
    assert failed == ["perfcheck sweep: collectives case not measured (collective benchmark failed: process 1 "
                      "terminated with exit code 1); its host terms stay the defaults"]
    assert collective_time_s("allreduce", 248024, 2, out) == pytest.approx(before)
    assert host.process_slowdown(out, 2) == pytest.approx(1.2)
    kept = cache.cached_spec("cpu", threads=1)
    assert sweep.missing_terms(kept) == ["collectives"]


@pytest.mark.slow
def test_real_collectives_case_of_the_sweep(monkeypatch):
    """The sweep's collectives case for real (2 gloo ranks, ~10 s here): both constants measured, alpha a
    loopback round trip can give (1 us - 50 ms), a link a host's memory can carry (1 MB/s - 200 GB/s)."""
    from perfcheck.calibrate import collectives, fit
    from perfcheck.calibrate import sweep_terms as sweep

    spec = dataclasses.replace(load_system("cpu"), name="x", calibrated=True)
    out = sweep._measure("collectives", spec, ranks=2, threads=1, stamp="test")
    assert collectives.measured_here(out)
    assert 1e-6 < host_constants(out)["collective_latency_s"] < 0.05
    assert 1e6 < out.intra_node_bandwidth_bytes_per_s * out.efficiency["intra_node"] < 2e11


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

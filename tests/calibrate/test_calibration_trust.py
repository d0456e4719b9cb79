"""A calibration that cannot poison predictions, and reports that say what they used (issue 21 part A).

References are independent of the code under test: hand arithmetic on planted repeat times, a fake
loaded machine (planted CPU counters, and in the slow test two real busy loops), the poisoned figures
the issue quotes (35.8 MB/s copies, a 12.7 ms convolution setup, op_cold_s 686 us), a calibrate that
fails the test if it is ever called, and hand-built reconciled rows."""
import dataclasses
import json
import math
import os
import shutil
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

import perfcheck
from perfcheck.analysis import findings, thresholds
from perfcheck.analysis.pipeline import hook_overhead_per_call, reconcile_run
from perfcheck.analysis.reconcile import reconcile
from perfcheck.analysis.stages import measured_exposed
from perfcheck.analysis.system_notes import device_mismatch, system_notes
from perfcheck.commands.cli import main
from perfcheck.calibrate import auto
from perfcheck.hardware import cache, labels
from perfcheck.calibrate import cases, repeats, sanity
from perfcheck.calibrate import run as calrun
from perfcheck.hardware.systems import SystemSpec, load_system
from perfcheck.schema import MEASURED_COLUMNS, PREDICTED_COLUMNS, module_depth

DATA = Path(__file__).resolve().parents[1] / "data"
US = 1e-6


def _record(**kw):
    out = {"taken_utc": "2026-11-26T11:40:00Z", "mode": "quick", "clock": "wall", "cores": 2, "threads": 1,
           "load_1m": 0.3, "others_cores": 0.1, "wall_s": 5.0}
    out.update(kw)
    return out


def _calibrated(**kw):
    """The cpu datasheet as a quiet calibration (plausible figures), with ``kw`` replaced."""
    base = load_system("cpu")
    fields = dict(name="cpu-calibrated", calibrated=True, calibration=_record(), mem_bandwidth_bytes_per_s=15e9,
                  host={"op_dispatch_s": 1.5 * US, "op_cold_s": 0.9 * US},
                  op_fixed_s={"convolution": 59 * US, "addmm": 1.8 * US, "relu": 0.3 * US})
    fields.update(kw)
    return dataclasses.replace(base, **fields)


# ---------------------------------------------------------------------------------------- repeats
def test_fastest_half_by_hand():
    assert repeats.fastest_half([3.0, 1.0, 2.0]) == 1.5  # fastest two of three: (1 + 2) / 2
    assert repeats.fastest_half([5, 1, 4, 2, 3]) == 2  # fastest three of five: median 2
    assert repeats.fastest_half(list(range(9, 0, -1))) == 3  # fastest five of nine: median 3
    # a repeat disturbed three-fold by a neighbour does not move it; the median of all would
    assert repeats.fastest_half([1.0, 1.02, 3.0]) == pytest.approx(1.01)
    assert not repeats.unsteady([1.0, 1.2, 5.0])  # fastest half 1.1: within 1.25x of 1.0
    assert repeats.unsteady([1.0, 2.0, 2.0])  # fastest half 1.5 > 1.25


class _ScriptedTimer:
    """A Timer whose loops take the planted seconds of each case, in order (one value per loop)."""

    def __init__(self, plans):
        self.plans = {k: list(v) for k, v in plans.items()}
        self.calls = {k: 0 for k in plans}

    def loop(self, fn, iters, between=None, host=False):
        label = fn()
        self.calls[label] += 1
        return self.plans[label].pop(0)


def test_unsteady_cases_are_timed_again_and_the_quiet_repeats_kept():
    # case "a": sizing 1e-3, then three repeats two of which a neighbour disturbed (10x), then quiet again
    # case "b": steady at 2e-3. Hand: "a" is unsteady after 3 ([1, 10, 10] ms: fastest half 5.5 ms), so it is timed
    # again; with [10, 1, 10, 1] ms its fastest half is [1, 1]: steady, kept 1 ms after 4 repeats.
    plans = {"a": [1e-3, 10e-3, 1e-3, 10e-3, 1e-3, 1e-3, 1e-3], "b": [2e-3] * 4}
    timer = _ScriptedTimer(plans)
    made = [cases.Case("copy", label, (lambda label=label: label)) for label in ("a", "b")]
    table = cases.run_cases(made, timer, repeats=3, target_s=0.0)
    got = table.set_index("label")
    assert got.loc["a", "seconds"] == pytest.approx(1e-3) and got.loc["a", "repeats"] == 4
    assert got.loc["b", "seconds"] == pytest.approx(2e-3) and got.loc["b", "repeats"] == 3
    assert timer.calls == {"a": 5, "b": 4}  # one sizing loop each, then the repeats


# ---------------------------------------------------------------------------------------- the load
def test_load_watch_counts_other_processes_cores(monkeypatch):
    # a fake loaded machine: over 4 s of wall time the CPUs were busy 10 s, this process used 3 s:
    # others used (10 - 3) / 4 = 1.75 cores
    busy, own, clock = iter([100.0, 110.0]), iter([50.0, 53.0]), iter([0.0, 4.0])
    monkeypatch.setattr(sanity, "_busy_s", lambda: next(busy))
    monkeypatch.setattr(sanity, "_own_s", lambda: next(own))
    monkeypatch.setattr(sanity.time, "monotonic", lambda: next(clock))
    with sanity.LoadWatch() as w:
        pass
    assert w.others_cores == pytest.approx(1.75) and w.wall_s == pytest.approx(4.0)
    rec = sanity.conditions(w, threads=1, mode="quick", clock="wall")
    assert rec["others_cores"] == 1.75 and rec["threads"] == 1 and rec["cores"] >= 1


@pytest.mark.parametrize("cores, threads, others, contended", [
    (2, 1, 1.2, False),   # one core to spare (+ 0.25 slack): 1.2 <= 1.25
    (2, 1, 1.3, True),
    (2, 2, 0.2, False),   # no core to spare: only the 0.25 slack
    (2, 2, 0.3, True),
    (16, 4, 11.0, False),  # 12 to spare
])
def test_contention_by_hand(cores, threads, others, contended):
    why = sanity.contention(_record(cores=cores, threads=threads, others_cores=others))
    assert (why is not None) is contended
    if contended:
        assert f"{others:.2f} of the {cores} cores" in why


def test_one_thread_on_the_process_clock_is_not_refused_for_a_neighbours_load(monkeypatch, tmp_path):
    # its clock stops while the thread waits for a core: a neighbour's load does not enter its timings
    assert sanity.contention(_record(threads=1, clock="process", others_cores=1.9)) is None
    assert sanity.contention(_record(threads=1, clock="wall", others_cores=1.9)) is not None
    assert sanity.contention(_record(threads=2, clock="process", others_cores=1.9)) is not None
    # and the automatic calibration of one thread uses that clock, without a load probe
    monkeypatch.setenv("PERFCHECK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(auto.AUTO_ENV, "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(sanity, "busy_now", _no_benchmark)
    seen = []
    quiet = _calibrated(name=cache.AUTO_NAME, calibration=_record(clock="process", others_cores=1.9))
    monkeypatch.setattr(calrun, "calibrate", lambda base=None, **kw: seen.append(kw) or calrun.Calibration(quiet, None))
    assert auto.resolve_system("cpu", threads=1, calibrate=True).name == cache.AUTO_NAME
    assert seen[0]["clock"] == "process" and seen[0]["threads"] == 1


@pytest.mark.slow
def test_two_busy_loops_are_seen_as_contention():
    """A real loaded machine: two `while :; do :; done` loops beside a 1 s wait use about 2 cores."""
    procs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(2)]
    try:
        time.sleep(0.3)
        with sanity.LoadWatch() as w:
            time.sleep(1.0)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert w.others_cores > 1.5  # two loops on however many cores, less scheduling noise
    assert sanity.contention(_record(cores=2, threads=1, others_cores=w.others_cores)) is not None


# ---------------------------------------------------------------------------------------- physics
def test_the_poisoned_calibration_of_the_issue_is_refused_physically():
    # quoted in issue 21: copy 35.8 MB/s at 256 KiB, 12.7 ms per convolution, op_cold_s 686 us
    bad = _calibrated(mem_bandwidth_bytes_per_s=35.8e6, mem_bandwidth_curve=(),
                      host={"op_dispatch_s": 1.5 * US, "op_cold_s": 686 * US},
                      op_fixed_s={"convolution": 12.7e-3, "relu": 0.3 * US})
    problems = sanity.physical_problems(bad)
    assert any("copy bandwidth 0.0358 GB/s" in p for p in problems)
    assert any(p.startswith("host.op_cold_s 686 us") for p in problems)
    assert any(p.startswith("op_fixed_s.convolution 1.27e+04 us") for p in problems)
    assert sanity.physical_problems(_calibrated()) == []


def test_far_from_the_previous_calibration_is_refused_only_against_a_trusted_one():
    before = _calibrated()
    after = _calibrated(host={"op_dispatch_s": 15 * US, "op_cold_s": 0.9 * US})  # 10x the dispatch
    why = sanity.disagreements(after, before)
    assert len(why) == 1 and why[0].startswith("op dispatch 10x the previous calibration's")
    assert sanity.disagreements(_calibrated(host={"op_dispatch_s": 2.5 * US, "op_cold_s": 0.9 * US}), before) == []
    # a previous one without a load record (or itself contended) is not a reference
    assert sanity.disagreements(after, dataclasses.replace(before, calibration={})) == []
    assert sanity.disagreements(after, _calibrated(calibration=_record(others_cores=1.9))) == []


# ---------------------------------------------------------------------------------------- the cache
@pytest.fixture
def auto_on(monkeypatch, tmp_path):
    monkeypatch.setenv("PERFCHECK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(auto.AUTO_ENV, "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(sanity, "busy_now", lambda threads, seconds=0.5: None)  # a quiet machine unless a test says



def test_a_busy_machine_is_not_calibrated_at_all(monkeypatch, tmp_path, capsys):
    """A fake loaded machine: over the 0.5 s probe, other processes kept every core and one more busy
    (planted CPU counters); the automatic calibration is not even started."""
    monkeypatch.setenv("PERFCHECK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(auto.AUTO_ENV, "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cores = os.cpu_count() or 1
    busy, own, clock = iter([100.0, 100.2 + (cores + 1) * 0.5]), iter([50.0, 50.2]), iter([0.0, 0.5])
    monkeypatch.setattr(sanity, "_busy_s", lambda: next(busy))
    monkeypatch.setattr(sanity, "_own_s", lambda: next(own))
    monkeypatch.setattr(sanity.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(sanity.time, "sleep", lambda s: None)
    monkeypatch.setattr(calrun, "calibrate", _no_benchmark)
    spec = auto.resolve_system("cpu", threads=2, calibrate=True)  # two threads: timed on the wall clock
    assert not spec.calibrated and not cache.cache_path("cpu", threads=2).exists()
    err = capsys.readouterr().err
    assert f"none is measured now (other processes kept {cores + 1:.2f} of the {cores} cores busy" in err


def test_a_contended_automatic_calibration_is_not_kept_and_says_why(auto_on, monkeypatch, capsys):
    loaded = _calibrated(name=cache.AUTO_NAME, calibration=_record(threads=torch.get_num_threads(),
                                                                    others_cores=1.9, cores=2))
    monkeypatch.setattr(calrun, "calibrate", lambda base=None, **kw: calrun.Calibration(loaded, pd.DataFrame()))
    spec = auto.resolve_system("cpu", calibrate=True)
    assert spec.name == "cpu" and not spec.calibrated  # the datasheet, labelled as the default
    assert labels.spec_label(spec) == f"cpu (datasheet: default, {cache.NO_CALIBRATION})"
    err = capsys.readouterr().err
    assert "was not kept: taken under contention: other processes kept 1.90 of the 2 cores" in err
    assert "`perfcheck calibrate` when the machine is quiet" in err
    assert not cache.cache_path("cpu").exists()


def test_a_quiet_calibration_is_kept_and_its_header_says_when_and_under_what_load(auto_on, monkeypatch):
    quiet = _calibrated(name=cache.AUTO_NAME, calibration=_record(threads=torch.get_num_threads()))
    monkeypatch.setattr(calrun, "calibrate", lambda base=None, **kw: calrun.Calibration(quiet, pd.DataFrame()))
    spec = auto.resolve_system("cpu", calibrate=True)
    n = torch.get_num_threads()
    assert labels.spec_label(spec) == (
        f"cpu-auto-calibrated (calibrated: automatic quick calibration, per-user cache {cache.cache_path('cpu')}; "
        f"`perfcheck calibrate` measures more; taken 2026-11-26 11:40:00 UTC with {n} thread{'s' if n != 1 else ''}; "
        f"load 0.3 on 2 cores, other processes used 0.1 core(s))")


def _no_benchmark(*a, **kw):
    raise AssertionError("a prediction or a report ran a benchmark")


def test_estimate_and_report_never_calibrate_on_an_empty_cache(auto_on, monkeypatch, tmp_path, capsys):
    # every entry point of a benchmark: the calibration, the automatic one, and the case runner under both
    monkeypatch.setattr(calrun, "calibrate", _no_benchmark)
    monkeypatch.setattr(auto, "auto_calibrate", _no_benchmark)
    monkeypatch.setattr(calrun, "run_cases", _no_benchmark)
    monkeypatch.setattr(cases, "run_cases", _no_benchmark)
    from perfcheck.examples.models import Net

    pred = perfcheck.estimate(Net(), (torch.randn(8, 3, 32, 32),))
    assert pred.attrs["system_label"] == f"cpu (datasheet: default, {cache.NO_CALIBRATION})"
    # a run directory without predicted rows: re-estimated from meta.json, on the labelled default
    run = tmp_path / "run"
    shutil.copytree(DATA / "run_lenet_cpu", run)
    for f in ("predicted.csv", "predicted.json"):
        (run / f).unlink()
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"system: cpu (datasheet: default, {cache.NO_CALIBRATION})" in out
    assert "note: the predictions use the 'cpu' datasheet default: this machine has no calibration" in out
    assert main(["report", str(DATA / "run_lenet_cpu")]) == 0  # with its saved prediction: that one
    assert not list((tmp_path / "cache").glob("*.json")) if (tmp_path / "cache").exists() else True


def test_calibrate_show_and_clear(auto_on, capsys):
    spec = _calibrated()
    path = cache.save_to_cache(spec, "cpu")
    assert main(["calibrate", "--show"]) == 0
    out = capsys.readouterr().out
    assert str(path) in out and "taken 2026-11-26 11:40:00 UTC with 1 thread" in out and "memory bandwidth 1.5e+10" in out
    assert main(["calibrate", "--clear"]) == 0
    assert f"deleted {path}" in capsys.readouterr().out and not path.exists()
    assert main(["calibrate", "--clear"]) == 0
    assert "nothing to delete" in capsys.readouterr().out
    assert main(["calibrate", "--all"]) == 2  # --all without --clear: one line, exit 2


# ---------------------------------------------------------------------------------------- report notes
def test_a_cached_spec_read_back_from_a_run_is_not_given_as_a_spec(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFCHECK_CACHE_DIR", str(tmp_path / "cache"))
    path = cache.save_to_cache(_calibrated(), "cpu")
    spec = cache.resolve_system("cpu")
    from perfcheck.predict.for_run import load_predicted, save_predicted
    from perfcheck.examples.models import JSC_Tiny

    frame = perfcheck.estimate(JSC_Tiny(), (torch.randn(4, 16),), system=spec)
    save_predicted(tmp_path, frame, system=spec)
    _, info = load_predicted(tmp_path)
    label = labels.spec_label(info["spec"])
    assert "given as a spec" not in label and "a SystemSpec object" not in label
    assert f"(calibrated: per-user cache {path}; taken" in label
    # a predicted.json from before the origin was saved: where the spec is now, never "given as a spec"
    meta = json.loads((tmp_path / "predicted.json").read_text())
    meta.pop("system_origin")
    (tmp_path / "predicted.json").write_text(json.dumps(meta))
    _, info = load_predicted(tmp_path)
    assert f"(calibrated: embedded in {tmp_path / 'predicted.json'}; taken" in labels.spec_label(info["spec"])
    assert "taken 2026-11-26 11:40:00 UTC with 1 thread" in label


def test_thread_and_device_mismatch_notes():
    spec = _calibrated()  # 1 thread
    cpu_run = {"device": {"type": "cpu", "name": "Intel Xeon"}, "torch_threads": 2}
    notes = system_notes(spec, cpu_run)
    assert notes == ["WARNING: the calibration was measured with 1 CPU thread and this run used 2: its rates and "
                     "per-op costs describe 1-thread execution (`perfcheck calibrate --threads 2` measures the run's "
                     "setting)"]
    assert system_notes(spec, {**cpu_run, "torch_threads": 1}) == []
    other = device_mismatch(load_system("h100-sxm"), cpu_run)
    assert other.startswith("measured on a CPU (Intel Xeon) but predicted for 'h100-sxm', a GPU spec")
    assert device_mismatch(load_system("cpu"), cpu_run) is None
    assert any("contention" in n for n in system_notes(_calibrated(calibration=_record(others_cores=1.9)), cpu_run))


def test_a_cpu_run_against_a_gpu_spec_warns_and_calls_no_gap_launch_overhead():
    rec = reconcile_run(DATA / "run_lenet_cpu", system="h100-sxm")
    assert any(n.startswith("WARNING: measured on a CPU (AMD EPYC) but predicted for 'h100-sxm'") for n in rec.notes)
    t = rec.table
    reasons = set(t["reason_fwd"]) | set(t["reason_bwd"])
    assert "launch_overhead" not in reasons and "other_device" in reasons
    big = t[(t["gap_fwd"] > 2) | (t["gap_fwd"] < 0.5)]
    assert len(big) and (big["reason_fwd"] == "other_device").all()


# ---------------------------------------------------------------------------------------- findings
def _pred(module, fwd, bwd=0.0, **kw):
    row = {c: 0.0 for c in PREDICTED_COLUMNS}
    row.update(module=module, type=kw.pop("type", "Linear"), depth=module_depth(module), calls=1, params=10,
               comm_kind="", bound_fwd="overhead", bound_bwd="overhead", source="modeled", pred_fwd_s=fwd, pred_bwd_s=bwd)
    row.update(kw)
    return row


def _meas(module, fwd, bwd=0.0, **kw):
    row = {c: math.nan for c in MEASURED_COLUMNS}
    row.update(module=module, type=kw.pop("type", "Linear"), depth=module_depth(module), calls=1.0, steps=5, rank=0,
               fwd_s_median=fwd, bwd_s_median=bwd, fwd_s_min=fwd, fwd_s_max=fwd, bwd_s_min=bwd, bwd_s_max=bwd,
               recompute_s_median=0.0)
    row.update(kw)
    return row


def _kernels(module, phase, n, each_s):
    return [{"module": module, "phase": phase, "name": f"aten::op{i}", "device": "cpu", "count": 1, "total_s": each_s,
             "self_s": each_s, "rank": 0} for i in range(n)]


def test_launch_overhead_only_near_the_launch_floor():
    # the issue's transformer block: 149 kernels, 29.4 us measured per kernel, launch floor 2.93 us (10x);
    # hand: 3 x 2.93 = 8.79 us < 29.4 us -> not launch_overhead. An 8 us per-kernel module (2.7x) still is.
    # (hook cost 1 us per call: the hook floor, 2 us, is below both)
    spec = dataclasses.replace(load_system("cpu"), launch_overhead_s=2.93 * US)
    p = pd.DataFrame([_pred("blk", 149 * 2 * US, type="Block"), _pred("act", 2 * US, type="ReLU")])
    m = pd.DataFrame([_meas("blk", 149 * 29.4 * US, type="Block"), _meas("act", 8 * US, type="ReLU")])
    k = pd.DataFrame(_kernels("blk", "fwd", 149, 29.4 * US) + _kernels("act", "fwd", 1, 8 * US))
    rec = reconcile(p, m, system=spec, kernels=k, hook_overhead_s=1 * US).set_index("module")
    assert rec.loc["blk", "gap_fwd"] == pytest.approx(14.7)
    assert rec.loc["blk", "reason_fwd"] not in ("launch_overhead", "")
    assert rec.loc["act", "reason_fwd"] == "launch_overhead"


def test_embedding_bag_backward_gap_is_not_launch_overhead():
    # EmbeddingBag's backward: 60x slower than predicted over 4 kernels of 300 us each (a dense gradient and
    # a sort the estimate omits): 300 us per kernel is 30x the cpu spec's 10 us floor
    spec = load_system("cpu")
    p = pd.DataFrame([_pred("emb", 10 * US, 20 * US, type="EmbeddingBag")])
    m = pd.DataFrame([_meas("emb", 12 * US, 1200 * US, type="EmbeddingBag")])
    k = pd.DataFrame(_kernels("emb", "bwd", 4, 300 * US))
    rec = reconcile(p, m, system=spec, kernels=k).set_index("module")
    assert rec.loc["emb", "gap_bwd"] == pytest.approx(60)
    assert rec.loc["emb", "reason_bwd"] != "launch_overhead"


def test_no_measurement_artifact_against_a_peak_taken_under_load():
    # 1e9 FLOPs in 1 ms = 1 TFLOP/s, above a 0.2 TFLOP/s calibrated peak
    row_p = _pred("fc", 10e-3, flops_fwd=1e9, bound_fwd="compute")
    row_m = _meas("fc", 1e-3)
    quiet = _calibrated(matrix_flops_per_s={"fp32": 0.2e12, "bf16": 0.2e12})
    loaded = dataclasses.replace(quiet, calibration=_record(others_cores=1.9))
    got_q = reconcile(pd.DataFrame([row_p]), pd.DataFrame([row_m]), system=quiet, dtype="fp32").iloc[0]
    got_l = reconcile(pd.DataFrame([row_p]), pd.DataFrame([row_m]), system=loaded, dtype="fp32").iloc[0]
    assert got_q["reason_fwd"] == "measurement_artifact"
    assert got_l["reason_fwd"] == "overestimated" and "taken under load" in got_l["evidence_fwd"]


def test_slow_kernels_evidence_names_the_profiled_steps():
    # 450 us of kernels per profiled step against 100 us predicted (4.5x), 500 us measured (median of all steps);
    # not tiny (450 us per kernel), not host-bound (kernels 90% of the time), bound 'overhead' (no roof rule)
    p = pd.DataFrame([_pred("fc", 100 * US)])
    m = pd.DataFrame([_meas("fc", 500 * US)])
    k = pd.DataFrame(_kernels("fc", "fwd", 1, 450 * US))
    r = reconcile(p, m, system="cpu", kernels=k).iloc[0]
    assert r["reason_fwd"] == "slow_kernels"
    assert "in the profiled step(s) the kernels/ops alone take 450 us per step" in r["evidence_fwd"]
    assert "500 us measured (median over all measured steps)" in r["evidence_fwd"]
    assert "profiled steps" in findings.REASONS["slow_kernels"]


def test_hook_overhead_from_the_runs_own_measurement():
    # meta.json overhead: bare step 3.3 ms, 95% interval of the fraction [1.0, 2.5], bookkeeping 0.1 ms;
    # modules.csv: 40 module calls per step. Hand: 1.0 x 3.3 - 0.1 = 3.2 ms per step; / 40 calls / 2 phases = 40 us
    meta = {"rank": 0, "overhead": {"instrumented_step_s_median": 10.9e-3, "bare_step_s_median": 3.3e-3,
                                    "ci95": [1.0, 2.5], "bookkeeping_s_median": 0.1e-3}}
    modules = pd.DataFrame({"rank": [0] * 4, "calls": [10, 10, 10, 10]})
    s, source = hook_overhead_per_call(meta, modules)
    assert s == pytest.approx(40e-6) and source.startswith("measured in this run: at least 3.2 ms per step")
    # an interval whose low end is within the bookkeeping (a busy machine's noisy A/B): not resolved
    noisy = {"rank": 0, "overhead": {**meta["overhead"], "ci95": [0.001, 3.5]}}
    assert hook_overhead_per_call(noisy, modules)[0] is None
    assert hook_overhead_per_call({"overhead": "not measured"}, modules)[0] is None
    # the test run predates the interval: the assumed default, and the report says it is assumed
    rec = reconcile_run(DATA / "run_lenet_cpu")
    assert rec.table.attrs["hook_overhead_s"] == thresholds.DEFAULT_HOOK_OVERHEAD_S
    assert rec.table.attrs["hook_overhead_source"].startswith("assumed (meta.json overhead has no interval")


# ---------------------------------------------------------------------------------------- stages
def test_exposed_communication_on_the_same_steps_as_the_phase():
    # window: bwd ran 10 ms of which 3 ms exposed all-reduce (30%); the median bwd over all steps is 20 ms:
    # comm 0.3 x 20 = 6 ms, compute 14 ms (never negative)
    facts = {"profiled_comm": {"bwd": {"exposed_s": 3e-3, "wall_s": 10e-3}, "fwd": {"exposed_s": 0.0, "wall_s": 5e-3}},
             "perfcheck_block": {"profiler": {"active": 3}}}
    got = measured_exposed(facts, {"meas_fwd_s": 4e-3, "meas_bwd_s": 20e-3, "meas_optim_s": 1e-3})
    assert got["meas_bwd_comm_s"] == pytest.approx(6e-3) and got["meas_fwd_comm_s"] == 0.0
    assert math.isnan(got["meas_optim_comm_s"])
    # a window recorded before wall_s: seconds per active step, capped at the phase's median
    old = {"profiled_comm": {"step": {"exposed_s": 30e-3}}, "perfcheck_block": {"profiler": {"active": 1}}}
    assert measured_exposed(old, {"meas_optim_s": 20e-3})["meas_optim_comm_s"] == pytest.approx(20e-3)


def test_stage_configs_profile_at_least_three_steps():
    base = json.loads((Path(__file__).parents[2] / "configs" / "deepspeed" / "base.json").read_text())
    assert base["perfcheck"]["profiler"]["active"] >= 3


def test_the_spec_record_round_trips_and_is_validated():
    spec = _calibrated()
    back = SystemSpec.from_dict(json.loads(spec.to_json()))
    assert dict(back.calibration) == _record()
    from perfcheck.errors import UserError

    with pytest.raises(UserError, match="calibration has unknown key 'when'"):
        SystemSpec.from_dict({**spec.to_json_dict(), "calibration": {"when": "now"}})
    with pytest.raises(UserError, match="calibration.others_cores must be"):
        SystemSpec.from_dict({**spec.to_json_dict(), "calibration": {"others_cores": [1]}})
    assert "calibration" not in load_system("cpu").to_json_dict()  # datasheets round-trip unchanged


def test_a_run_that_waited_for_a_core_says_contention(tmp_path):
    # planted sampler rows: the process had 0.19 of a core (the issue's encoder stack beside a busy process)
    run = tmp_path / "run"
    shutil.copytree(DATA / "run_lenet_cpu", run)
    samples = pd.read_csv(run / "rank0" / "samples.csv")
    planted = pd.concat([samples] * 5, ignore_index=True).assign(cpu_util=0.19)
    planted.to_csv(run / "rank0" / "samples.csv", index=False)
    rec = reconcile_run(run)
    assert any(n.startswith("WARNING: the process ran on a median 0.19 of a CPU core while it was sampled (5 samples)")
               for n in rec.notes)
    t = rec.table
    slow = t[t["gap_fwd"] > 2]
    assert len(slow) and (slow["reason_fwd"] == "contention").all()
    # the same run with the sampler's original row: no such note, no such reason
    clean = reconcile_run(DATA / "run_lenet_cpu")
    assert not any("of a CPU core" in n for n in clean.notes)
    assert "contention" not in set(clean.table["reason_fwd"])


def test_a_measuring_session_resolves_its_system_once_at_the_edge(auto_on, monkeypatch, tmp_path):
    """PerfCheck (the edge of a measuring session) calibrates once on an empty cache, for the run's thread
    count; the prediction it saves carries that spec, where it came from, and the run's thread count."""
    from perfcheck import PerfCheck
    from perfcheck.examples.models import JSC_Tiny

    seen = []
    quiet = _calibrated(name=cache.AUTO_NAME, calibration=_record(threads=torch.get_num_threads()))

    def fake(base=None, **kw):
        seen.append(kw)
        return calrun.Calibration(quiet, pd.DataFrame())

    monkeypatch.setattr(calrun, "calibrate", fake)
    model = JSC_Tiny()
    out = tmp_path / "run"
    pc = PerfCheck(model, warmup=1, steps=2, profile=False, out_dir=out, sample_interval=None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pc:
        for _ in range(3):
            loss = model(torch.randn(8, 16)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            pc.step()
    assert len(seen) == 1 and seen[0]["threads"] == torch.get_num_threads()
    meta = json.loads((out / "rank0" / "meta.json").read_text())
    assert meta["torch_threads"] == torch.get_num_threads()
    saved = json.loads(next(out.rglob("predicted.json")).read_text())
    assert saved["system"] == cache.AUTO_NAME and saved["system_origin"].startswith("automatic quick calibration")
    assert saved["system_spec"]["calibration"]["taken_utc"] == "2026-11-26T11:40:00Z"
    assert reconcile_run(out).table.attrs["system_label"].startswith("cpu-auto-calibrated (calibrated: automatic")
    assert len(seen) == 1  # the report read the run's own spec: nothing measured again


def test_the_json_report_carries_the_calibration_record(tmp_path, capsys):
    spec_file = tmp_path / "mine.json"
    _calibrated().save(spec_file)
    assert main(["report", str(DATA / "run_lenet_cpu"), "--format", "json", "--system", str(spec_file)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["system_calibration"] == _record()
    assert doc["system_label"].startswith(f"cpu-calibrated (calibrated: file {spec_file}; taken 2026-11-26 11:40:00 UTC")
    assert doc["hook_overhead_source"].startswith("assumed")  # the test run's overhead predates its interval

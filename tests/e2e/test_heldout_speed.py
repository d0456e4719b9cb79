"""bench/heldout.py's run-speed columns and repeats: the prediction at the run's speed on planted reference
readings against hand arithmetic (``perfcheck.predict.run_speed``: host share x host factor + the rest x compute
factor), the references read between steps and never inside a timed window, the merged calibrations' reference
times, the per-model medians, spreads and targets over repeats on a planted table, and bench/repredict.py reading
a file with and without the readings. No timing is asserted."""
import math
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import heldout  # noqa: E402
import repredict  # noqa: E402

MS = 1e-3


def _pred(calibration=None):
    """A planted prediction: fwd 10 ms (4 host), bwd 20 ms (5 host), optim 5 ms (1 host); one Linear module of
    1 + 2 ms (1 host)."""
    return {"phases": {"fwd": 10 * MS, "bwd": 20 * MS, "optim": 5 * MS, "step": 35 * MS},
            "host": {"fwd": 4 * MS, "bwd": 5 * MS, "optim": 1 * MS, "step": 10 * MS},
            "modules": {"lin": (1 * MS, 2 * MS)}, "module_host": {"lin": 1 * MS}, "note": "",
            "calibration": {"reference_s": 2e-6, "compute_reference_s": 40e-6} if calibration is None else calibration}


def _meas(**refs):
    return {"phases": {"fwd": 12 * MS, "bwd": 30 * MS, "optim": 6 * MS, "step": 48 * MS},
            "modules": {"lin": (3 * MS, 2 * MS)}, "classes": {"lin": "Linear"}, **refs}


def test_ratios_at_the_run_speed_are_the_hand_arithmetic_of_planted_readings():
    # run add 3 us over the calibration's 2 us: host factor 1.5; run mm 50 us over 40 us: compute factor 1.25
    row, mods = heldout.compare("m", "design", _meas(ref_s=3e-6, cref_s=50e-6, mod_ref_s=4e-6, mod_cref_s=40e-6),
                                _pred())
    assert row["host_speed"] == pytest.approx(1.5) and row["compute_speed"] == pytest.approx(1.25)
    # fwd 1.5 x 4 + 1.25 x 6 = 13.5 ms; bwd 1.5 x 5 + 1.25 x 15 = 26.25; optim 1.5 x 1 + 1.25 x 4 = 6.5
    assert row["pred_fwd_at_run_ms"] == pytest.approx(13.5)
    assert row["pred_bwd_at_run_ms"] == pytest.approx(26.25)
    assert row["pred_optim_at_run_ms"] == pytest.approx(6.5)
    assert row["pred_step_at_run_ms"] == pytest.approx(46.25)
    assert row["ratio_step_at_run"] == pytest.approx(48 / 46.25)
    assert row["ratio_fwd_at_run"] == pytest.approx(12 / 13.5) and row["ratio_bwd_at_run"] == pytest.approx(30 / 26.25)
    # as calibrated: unchanged by the readings
    assert row["ratio_step"] == pytest.approx(48 / 35) and row["ratio_fwd"] == pytest.approx(1.2)
    assert row["meas_ref_us"] == pytest.approx(3.0) and row["cal_cref_us"] == pytest.approx(40.0)
    # the module at the hooked steps' readings: host 4/2 = 2, compute 40/40 = 1: 2 x 1 + 1 x 2 = 4 ms
    lin = next(m for m in mods if m["module"] == "lin")
    assert lin["pred_at_run_s"] == pytest.approx(4 * MS)
    assert lin["ratio"] == pytest.approx(5 / 3) and lin["ratio_at_run"] == pytest.approx(5 / 4)
    opt = next(m for m in mods if m["class"] == "optimizer")
    assert opt["ratio_at_run"] == pytest.approx(6 / 6.5)


def test_modules_fall_back_to_the_bare_steps_readings_and_no_readings_leave_the_headline_alone():
    row, mods = heldout.compare("m", "design", _meas(ref_s=3e-6, cref_s=50e-6), _pred())
    # the module at the phases' factors 1.5 and 1.25: 1.5 x 1 + 1.25 x 2 = 4 ms
    assert next(m for m in mods if m["module"] == "lin")["pred_at_run_s"] == pytest.approx(4 * MS)
    bare, bare_mods = heldout.compare("m", "design", _meas(), _pred())
    cal_only, _ = heldout.compare("m", "design", _meas(ref_s=3e-6, cref_s=50e-6), _pred(calibration={}))
    for r in (bare, cal_only):
        assert math.isnan(r["ratio_step_at_run"]) and math.isnan(r["host_speed"])
        assert r["ratio_step"] == pytest.approx(48 / 35)
    assert all(math.isnan(m["ratio_at_run"]) for m in bare_mods)


def test_a_speed_at_the_calibrations_level_changes_nothing():
    row, _ = heldout.compare("m", "design", _meas(ref_s=2e-6, cref_s=40e-6), _pred())
    for k in heldout.PHASES:
        assert row[f"ratio_{k}_at_run"] == pytest.approx(row[f"ratio_{k}"])


class _Log:
    """A clock and a probe writing one event list: where the probe reads fall against the timed marks."""

    def __init__(self):
        self.events, self.t = [], 0.0

    def mark(self):
        self.events.append("mark")
        self.t += 1.0
        return self.t

    def settle(self):
        self.events.append("settle")

    def seconds(self, a, b):
        return b - a

    def read(self):
        self.events.append("read")
        return 3e-6, 50e-6


def test_the_references_are_read_after_every_measured_step_outside_its_timed_window():
    log = _Log()
    torch.manual_seed(0)
    w = heldout.Workload("tiny", "", torch.nn.Linear(4, 2), (torch.randn(3, 4),), torch.randn(3, 2),
                         heldout._mse, heldout._sgd)
    meas = heldout.measure(w, steps=3, clock=log, warmup=2, modules=False, probe=log)
    bare = log.events
    # 2 warm-up steps unread, then per step: its 4 marks, the settle, then the reading
    assert bare == ["mark"] * 4 + ["settle"] + ["mark"] * 4 + ["settle"] + (["mark"] * 4 + ["settle", "read"]) * 3
    assert meas["ref_s"] == pytest.approx(3e-6) and meas["cref_s"] == pytest.approx(50e-6)
    reads = []
    heldout.hooked_steps(w, torch.optim.SGD(w.model.parameters(), lr=0.1),
                         heldout.ModuleTimer({"": w.model}), 3, between=lambda: reads.append(1))
    assert len(reads) == 3  # the first hooked step (it attaches the hooks) is not kept, nor read after
    plain = heldout.measure(w, steps=2, clock=_Log(), warmup=0, modules=False)
    assert math.isnan(plain["ref_s"]) and plain["probe_s"] == 0.0


def test_merged_calibrations_sit_at_the_median_of_their_reference_times():
    cals = [types.SimpleNamespace(spec=types.SimpleNamespace(calibration={"reference_s": r, "compute_reference_s": c}))
            for r, c in ((2e-6, 40e-6), (4e-6, 50e-6))]
    assert heldout.merged_references(cals) == pytest.approx({"reference_s": 3e-6, "compute_reference_s": 45e-6})
    cals[1].spec.calibration = {}
    assert heldout.merged_references(cals) == {}


def _planted_runs():
    """Two models of one set, three runs each (ratios as calibrated and at the run's speed)."""
    rows = []
    for run, (a, b, a_run, b_run) in enumerate(((1.10, 0.70, 1.00, 0.90), (1.30, 0.80, 1.05, 0.95),
                                                (1.20, 0.90, 0.95, 1.40))):
        for model, step, at in (("a", a, a_run), ("b", b, b_run)):
            rows.append({"run": run, "set": "scoring", "model": model, "ratio_step": step, "ratio_fwd": step,
                         "ratio_bwd": 1.0, "ratio_optim": 1.0, "ratio_step_at_run": at, "ratio_fwd_at_run": at,
                         "ratio_bwd_at_run": 1.0, "ratio_optim_at_run": 1.0})
    mods = [{"run": run, "set": "scoring", "model": "a", "module": mod, "class": "Linear", "ratio": r,
             "ratio_at_run": r_run}
            for run, vals in enumerate(((1.5, 1.1, 0.9, 1.1), (1.6, 1.2, 1.0, 1.2), (1.7, 1.3, 1.3, 1.0)))
            for mod, r, r_run in (("l1", vals[0], vals[2]), ("l2", vals[1], vals[3]))]
    return pd.DataFrame(rows), pd.DataFrame(mods)


def test_repeats_give_per_model_medians_spreads_and_the_targets_on_them():
    rows, mods = _planted_runs()
    pm = heldout.per_model(rows).set_index("model")
    # model a: 1.10, 1.30, 1.20 -> median 1.20 [1.10-1.30]; b: 0.70, 0.80, 0.90 -> 0.80 [0.70-0.90]
    assert pm.loc["a", "ratio_step"] == pytest.approx(1.20) and pm.loc["b", "ratio_step"] == pytest.approx(0.80)
    assert (pm.loc["a", "ratio_step_min"], pm.loc["a", "ratio_step_max"]) == pytest.approx((1.10, 1.30))
    assert pm.loc["b", "ratio_step_at_run"] == pytest.approx(0.95) and pm.loc["a", "runs"] == 3
    classes = heldout.class_medians(mods)
    # l1: 1.5, 1.6, 1.7 -> 1.6; l2: 1.1, 1.2, 1.3 -> 1.2; the class: median(1.6, 1.2) = 1.4
    # at run: l1 0.9, 1.0, 1.3 -> 1.0; l2 1.1, 1.2, 1.0 -> 1.1; the class 1.05
    lin = classes.set_index("class").loc["Linear"]
    assert lin["ratio"] == pytest.approx(1.4) and lin["ratio_at_run"] == pytest.approx(1.05) and lin["n"] == 2
    cal = heldout.targets(heldout.per_model(rows), classes).iloc[0]
    # |1.20 - 1| = 0.20 and |0.80 - 1| = 0.20: both within 25%, median error 20% > 12%; the class 1.4 outside 30%
    assert cal["steps_within"] == 2 and cal["steps_pass"] and cal["median_error"] == pytest.approx(0.20)
    assert not cal["median_pass"] and cal["fwd_within"] == 2 and cal["classes"] == 1 and cal["classes_within"] == 0
    assert not cal["classes_pass"]
    run = heldout.targets(heldout.per_model(rows), classes, heldout.AT_RUN).iloc[0]
    # at run: a 1.00, b 0.95 -> errors 0.00, 0.05, median 2.5%
    assert run["median_error"] == pytest.approx(0.025) and run["median_pass"] and run["steps_pass"]
    assert run["classes_within"] == 1 and run["classes_pass"]
    text = "\n".join(heldout.repeat_lines(rows) + heldout.target_lines(rows, mods))
    assert "| scoring | a | 3 | 1.20 [1.10-1.30] |" in text
    assert "| scoring | as calibrated | 2/2 pass | 20.0% FAIL |" in text


def test_one_run_summary_carries_both_ratios():
    rows, mods = _planted_runs()
    one = rows[rows["run"] == 0].drop(columns="run")
    lines = heldout.summary_lines(one.assign(meas_step_ms=1.0, pred_step_ms=1.0, note="", host_speed=1.5,
                                             compute_speed=1.25), mods[mods["run"] == 0])
    # step, fwd, bwd, optim as calibrated, then at the run's speed, then the two factors
    row = "| scoring | a | 1.0 | 1.0 | 1.10 | 1.10 | 1.00 | 1.00 | 1.00 | 1.00 | 1.00 | 1.00 | 1.50, 1.25 |  |"
    assert row in lines


def test_repredict_reads_the_readings_where_the_file_has_them(tmp_path):
    base = {"set": "design", "model": "m", "meas_step_ms": 48.0, "meas_fwd_ms": 12.0, "meas_bwd_ms": 30.0,
            "meas_optim_ms": 6.0}
    mods = pd.DataFrame([{"run": r, "set": "design", "model": "m", "module": "lin", "class": "Linear",
                          "meas_s": 5e-3 * (r + 1)} for r in (0, 1)])
    new = pd.DataFrame([{**base, "run": r, "meas_ref_us": 3.0 * (r + 1), "meas_cref_us": 50.0, "meas_mod_ref_us": "",
                         "meas_mod_cref_us": ""} for r in (0, 1)])
    new.to_csv(tmp_path / "new.csv", index=False)
    rows = pd.read_csv(tmp_path / "new.csv", keep_default_na=False)
    got = repredict.measured(rows, mods, "m", run=1)
    assert got["ref_s"] == pytest.approx(6e-6) and got["cref_s"] == pytest.approx(50e-6)
    assert math.isnan(got["mod_ref_s"]) and got["modules"]["lin"] == (pytest.approx(10e-3), 0.0)
    old = repredict.measured(pd.DataFrame([base]), mods.drop(columns="run"), "m")  # a file from before the readings
    assert all(math.isnan(old[k]) for k in ("ref_s", "cref_s", "mod_ref_s", "mod_cref_s"))
    assert old["phases"]["step"] == pytest.approx(0.048)
    row, _ = heldout.compare("m", "design", old, _pred())
    assert math.isnan(row["ratio_step_at_run"]) and row["ratio_step"] == pytest.approx(48 / 35)
    assert np.isfinite(heldout.compare("m", "design", got, _pred())[0]["ratio_step_at_run"])

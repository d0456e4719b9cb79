"""Cases timed in different phases of a shared machine, read against a reference timed beside them
(perfcheck.calibrate.repeats: the machine's phase; cases.run_cases' ``reference``).

A planted timer stands in for the clock (no wall-clock assertion): a phase factor slows every dispatch
(the reference's tiny add, a host case's whole call, a kernel case's one dispatch) and leaves a kernel's
work alone, as the project's VM does (bench/results/calibration_steadiness.md). Expected values are the
planted costs, by hand.
"""
import math

import pandas as pd
import pytest
import torch

from perfcheck.calibrate import case_names as names
from perfcheck.calibrate import repeats
from perfcheck.calibrate.cases import Case, run_cases
from perfcheck.calibrate.phase import reanchor
from perfcheck.calibrate.fit_host import op_cold_excess
from perfcheck.calibrate.run import _at_one_reference, reference_record

US = 1e-6
DISPATCH = 1.7 * US  # the reference's tiny add at the fast phase


class PhaseTimer:
    """``Timer.loop`` stand-in: seconds per call of a planted function at the current ``phase``."""

    def __init__(self):
        self.phase = 1.0
        self.compute_phase = 1.0  # the vector units' own phase (slows a kernel's work)
        self.cost = {}  # fn -> (host seconds, kernel work seconds)

    def plant(self, host_s=0.0, work_s=0.0):
        fn = lambda: None  # noqa: E731
        self.cost[fn] = (host_s, work_s)
        return fn

    def loop(self, fn, iters, between=None, host=False):
        host_s, work_s = self.cost[fn]
        return host_s * self.phase + work_s * self.compute_phase


def _groups(timer, reference):
    """Two groups: the tight loops (two tiny ops, 8 and 10 us) and the launch op at the fast phase; then, in a
    loaded phase (2x), their round-robin (12 us per op: 3 us more than the tight mean) and a 32^3 mm (one
    dispatch + 2.3 us of work)."""
    fast = [Case(names.LAUNCH, names.LAUNCH_OP, timer.plant(host_s=DISPATCH), "fp32"),
            Case(names.OPFIXED, "addmm", timer.plant(host_s=8 * US), "fp32", host=True),
            Case(names.OPFIXED, "relu", timer.plant(host_s=10 * US), "fp32", host=True)]
    slow = [Case(names.OPCOLD, names.round_robin_label(2), timer.plant(host_s=12 * US), "fp32", host=True),
            Case(names.MATMUL, "mm 32x32x32", timer.plant(host_s=DISPATCH, work_s=2.3 * US), "fp32",
                 2.0 * 32 ** 3, 0.0, (32, 32, 32))]
    timer.phase = 1.0
    a = run_cases(fast, timer, repeats=3, target_s=1e-3, reference=reference)
    timer.phase = 2.0
    b = run_cases(slow, timer, repeats=3, target_s=1e-3, reference=reference)
    return a, b


@pytest.fixture(autouse=True)
def _fastest_anchor(monkeypatch):
    """The mechanism's tests read the planted costs back at the fast phase (``repeats.ANCHOR`` "fastest"),
    whichever statistic the calibration uses; the statistics themselves: ``test_anchor_statistics_by_hand``."""
    monkeypatch.setattr(repeats, "ANCHOR", "fastest")


def _sec(table, label):
    return float(table.loc[table["label"] == label, "seconds"].iloc[0])


def test_without_a_reference_the_phase_step_enters_the_differences():
    timer = PhaseTimer()
    a, b = _groups(timer, None)
    table = pd.concat([a, b], ignore_index=True)
    # round-robin read at the loaded phase, 24 us, less the tight mean 9 us: 15 us (the planted excess is 3)
    assert op_cold_excess(table)[0] == pytest.approx(15 * US)
    # the 32^3 mm less the launch op: 3.4 + 2.3 - 1.7 = 4.0 us of "work" (planted 2.3)
    assert _sec(b, "mm 32x32x32") - _sec(a, names.LAUNCH_OP) == pytest.approx(4.0 * US)


def test_read_against_the_reference_the_planted_costs_come_back():
    timer = PhaseTimer()
    ref = timer.plant(host_s=DISPATCH)
    a, b = _groups(timer, ref)
    # each table alone sits at its own reference time: the loaded group at 3.4 us
    assert a.attrs["reference_s"] == pytest.approx(1.7 * US) and b.attrs["reference_s"] == pytest.approx(3.4 * US)
    frames = _at_one_reference([a, b])  # readings: 9 at 1.7 us, 6 at 3.4 us; the fastest is 1.7 us
    table = pd.concat(frames, ignore_index=True)
    assert _sec(table, names.LAUNCH_OP) == pytest.approx(1.7 * US)
    assert _sec(table, names.round_robin_label(2)) == pytest.approx(12 * US)  # 24 / 3.4 x 1.7
    assert op_cold_excess(table)[0] == pytest.approx(3 * US)  # 12 - (8 + 10) / 2
    # the mm: (5.7 - 3.4) + 1.7 = 4.0 us; less the launch op: the planted 2.3 us of work
    assert _sec(table, "mm 32x32x32") - _sec(table, names.LAUNCH_OP) == pytest.approx(2.3 * US)
    assert table.loc[table["label"] == "mm 32x32x32", "flops_per_s"].iloc[0] == pytest.approx(2 * 32 ** 3 / (4 * US))


def test_reference_record_and_spread():
    timer = PhaseTimer()
    a, b = _groups(timer, timer.plant(host_s=DISPATCH))
    rec = reference_record([a, b])
    # 15 readings sorted: 9 x 1.7, 6 x 3.4; p10 = reading 1 (1.7), p90 = reading 12 (3.4): spread 2
    assert rec == {"reference_s": pytest.approx(1.7 * US), "reference_statistic": "fastest", "reference_spread": 2.0}
    assert reference_record([pd.DataFrame(a.to_dict())]) == {}  # a table without readings


def test_a_preempted_repeat_is_dropped_against_the_reference():
    """One repeat of three disturbed (4x: the loop was preempted, the reference before it was not): the
    fastest half of the readings against the reference keeps the two others."""
    timer = PhaseTimer()
    fn = timer.plant(host_s=5 * US)
    ref = timer.plant(host_s=DISPATCH)
    calls = {"n": 0}
    real = timer.loop

    def loop(f, iters, between=None, host=False):
        t = real(f, iters, between, host)
        if f is fn:
            calls["n"] += 1
            if calls["n"] == 4:  # warm-up sizing takes 3 single calls; the first timed repeat is call 4
                return 4 * t
        return t
    timer.loop = loop
    table = run_cases([Case(names.HOST, names.HOST_VIEW, fn, "fp32", host=True)], timer, repeats=3, target_s=1e-3,
                      reference=ref)
    assert _sec(table, names.HOST_VIEW) == pytest.approx(5 * US)
    assert table["seconds_max"].iloc[0] == pytest.approx(20 * US)


def test_statistics_by_hand():
    assert repeats.anchor_s([5, 1, 4, 2, 3, 9, 8, 7, 6, 10, 11]) == 1  # the fastest reading
    assert repeats.anchor_s([4, 3.5, 3, 2]) == 2
    assert repeats.anchor_s([3.0]) == 3.0
    with pytest.raises(ValueError):
        repeats.anchor_s([])
    assert repeats.against_reference([4.0, 6.0], [2.0, 3.0], host=True) == [2.0, 2.0]
    assert repeats.against_reference([4.0, 6.0], [2.0, 3.0], host=False) == [2.0, 3.0]
    assert repeats.anchored(2.0, 1.5, host=True) == 3.0 and repeats.anchored(2.0, 1.5, host=False) == 3.5
    assert repeats.anchored(-1.0, 0.5, host=False) == 0.0
    # kernel with a compute reference: (t - ref) / cref, back as x Rc + R
    assert repeats.against_reference([10.0], [2.0], host=False, compute_refs=[4.0]) == [2.0]
    assert repeats.anchored(2.0, 1.0, host=False, compute_reference_s=3.0) == 7.0
    with pytest.raises(ValueError):
        repeats.against_reference([1.0], [], host=True)


def test_anchor_statistics_by_hand():
    # 1..19 and one reading stretched to 100 (a preemption): 20 readings
    r = list(range(1, 20)) + [100]
    assert repeats.anchor_s(r, "fastest") == 1
    assert repeats.anchor_s(r, "median") == 10  # the lower middle of 20: the 10th reading
    assert repeats.anchor_s(r, "mean") == pytest.approx((19 * 20 / 2 + 100) / 20)  # 14.5
    # 5% of 20 = 1 reading left out at each end (1 and 100): the mean of 2..19
    assert repeats.anchor_s(r, "trimmed_mean") == pytest.approx(10.5)
    assert repeats.anchor_s([2.0, 4.0], "trimmed_mean") == 3.0  # under 20 readings nothing is left out
    with pytest.raises(ValueError, match="statistic 'p10'"):
        repeats.anchor_s(r, "p10")
    assert repeats.ANCHOR_STATISTICS == ("fastest", "median", "mean", "trimmed_mean")


def test_the_mean_anchor_reads_the_calibration_at_its_phase_mix(monkeypatch):
    """The two groups of ``_groups`` (9 readings at the fast phase, 1.7 us; 6 at the loaded one, 3.4 us) anchored
    at the mean reading: (9 x 1.7 + 6 x 3.4) / 15 = 2.38 us; every case is read at that one level."""
    monkeypatch.setattr(repeats, "ANCHOR", "mean")
    timer = PhaseTimer()
    a, b = _groups(timer, timer.plant(host_s=DISPATCH))
    table = pd.concat(_at_one_reference([a, b]), ignore_index=True)
    assert reference_record([a, b])["reference_s"] == pytest.approx(2.38 * US)
    assert _sec(table, names.LAUNCH_OP) == pytest.approx(2.38 * US)
    assert _sec(table, names.round_robin_label(2)) == pytest.approx(16.8 * US)  # 24 / 3.4 x 2.38
    # the tight loops 8 and 10 us at 1.7 -> 11.2 and 14.0: op_cold_s 16.8 - 12.6 = 4.2 us (3 x 2.38 / 1.7)
    assert op_cold_excess(table)[0] == pytest.approx(4.2 * US)
    # the mm, a kernel case without a compute reference: (5.7 - 3.4) + 2.38 us; its work is still the planted 2.3
    assert _sec(table, "mm 32x32x32") - _sec(table, names.LAUNCH_OP) == pytest.approx(2.3 * US)


def test_a_kernel_read_against_the_compute_reference():
    """A LeNet-size convolution (1.7 us dispatch + 170 us of work) timed while the vector units run 1.6x slow,
    the launch op at the fast phases; compute reference: a 40 us mm (its dispatch left out: a few percent)."""
    timer = PhaseTimer()
    ref, cref = timer.plant(host_s=DISPATCH), timer.plant(work_s=40 * US)
    conv = Case(names.OPEFF, "convolution", timer.plant(host_s=DISPATCH, work_s=170 * US), "fp32")
    op = Case(names.LAUNCH, names.LAUNCH_OP, timer.plant(host_s=DISPATCH), "fp32")
    a = run_cases([op], timer, repeats=3, target_s=1e-3, reference=ref, compute_reference=cref)
    timer.compute_phase = 1.6
    b = run_cases([conv], timer, repeats=3, target_s=1e-3, reference=ref, compute_reference=cref)
    raw = run_cases([conv], timer, repeats=3, target_s=1e-3)
    assert _sec(raw, "convolution") == pytest.approx((1.7 + 272) * US)  # 170 x 1.6 of work
    # compute readings: 3 at 40 us (group a), 3 at 64 us (group b): the fastest is 40 us
    table = pd.concat(_at_one_reference([a, b]), ignore_index=True)
    # ((1.7 + 272) - 1.7) / 64 x 40 + 1.7 = 171.7 us: the planted call at the fast compute phase
    assert _sec(table, "convolution") == pytest.approx(171.7 * US)
    assert reference_record([a, b])["compute_reference_s"] == pytest.approx(40 * US)


def test_reanchor_keeps_a_reading_that_would_anchor_at_zero():
    """A small copy timed at 2 us right after a 5 us reading of the tiny-add reference (a slow phase) reads
    (2 - 5) / 40 against the references; at a 1 us reference and a 40 us compute reference that anchors at
    -3 + 1 < 0: no time at the reference exists, so the case keeps its own 2 us (a calibration divided by 0)."""
    t = pd.DataFrame({"seconds": [2e-6], "seconds_min": [2e-6], "seconds_max": [2e-6], "flops": [0.0],
                      "bytes": [8e3]})
    t.attrs["relative"] = [(False, -3e-6 / 40e-6, -3e-6 / 40e-6, -3e-6 / 40e-6)]
    out = reanchor(t, 1e-6, 40e-6)
    assert out["seconds"].iloc[0] == pytest.approx(2e-6) and out["bytes_per_s"].iloc[0] == pytest.approx(4e9)
    t.attrs["relative"] = [(False, 1e-6 / 40e-6, 1e-6 / 40e-6, 1e-6 / 40e-6)]
    assert reanchor(t, 1e-6, 40e-6)["seconds"].iloc[0] == pytest.approx(2e-6)  # (1/40) x 40 + 1 us: anchored


def test_reanchor_leaves_a_table_without_reference_alone():
    t = pd.DataFrame({"seconds": [1.0]})
    assert reanchor(t, 2.0) is t


def test_the_calibration_reads_every_cpu_group_against_the_reference(monkeypatch):
    """The quick calibration's runner passes the reference on a CPU (run._Run.group) and stamps its record."""
    from perfcheck.calibrate import run

    seen = []

    def fake(cases, timer, *, repeats, target_s, max_iters=20000, reference=None, compute_reference=None):
        seen.append(reference is not None and compute_reference is not None)
        t = pd.DataFrame([{"kind": names.LAUNCH, "label": names.LAUNCH_OP, "seconds": 1e-6}])
        return t
    monkeypatch.setattr(run, "run_cases", fake)
    r = run._Run(torch.device("cpu"), dict(run.MODES["quick"]), None, None)
    r.group("x", [])
    assert seen == [True] and not math.isnan(r.frames[0]["seconds"].iloc[0])


def test_unsteady_note_names_the_cases_whose_repeats_disagree():
    from perfcheck.calibrate.run import unsteady_note

    t = pd.DataFrame({"kind": ["host", "host", "opeff"], "label": ["view", "module call", "convolution"],
                      "seconds": [1.0, 1.3, 2.4], "seconds_min": [1.0, 1.0, 2.0]})
    # kept / fastest: 1.0, 1.3 (> 1.25: named), 1.2 (within)
    note = unsteady_note([t])
    assert note.startswith("1 of 3 cases' repeats still disagree") and "host module call" in note
    assert "view" not in note and "convolution" not in note
    assert unsteady_note([t.iloc[[0]]]) is None

"""perfcheck compare with the machine's speed read during the run (perfcheck.measure.speed): planted reference
readings in a copy of the recorded LeNet sweep (tests/data/deepspeed_sweep), checked against hand arithmetic.
Needs neither DeepSpeed nor a GPU."""
import dataclasses
import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from perfcheck.analysis import stages as compare
from perfcheck.analysis.answers import answers
from perfcheck.hardware.systems import load_system

DATA = Path(__file__).resolve().parents[1] / "data" / "deepspeed_sweep"
CAL = {"reference_s": 2e-6, "compute_reference_s": 40e-6}
HOST_SHARE = 0.25


def _spec():
    return dataclasses.replace(load_system("cpu"), calibration=CAL)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """stage0 with every bare/measured step reading the references at 2x (add) and 1.5x (mm) the calibration's,
    the warm-up steps at 10x (left out: not the steps the phases are taken on), and a root host share of 25%."""
    run = tmp_path_factory.mktemp("speed") / "stage0"
    shutil.copytree(DATA / "stage0", run)
    spec_path = run.parent / "calibrated.json"
    _spec().save(spec_path)
    for rank in (0, 1):
        facts_path = run / f"rank{rank}" / "zero.json"
        facts = json.loads(facts_path.read_text())
        facts["perfcheck_block"]["system"] = str(spec_path)  # the block names the calibrated spec the run used
        facts_path.write_text(json.dumps(facts))
        path = run / f"rank{rank}" / "engine_steps.csv"
        steps = pd.read_csv(path)
        warm = steps["role"] == "warmup"
        steps["ref_s"] = [10 * CAL["reference_s"] if w else 2 * CAL["reference_s"] for w in warm]
        steps["cref_s"] = [10 * CAL["compute_reference_s"] if w else 1.5 * CAL["compute_reference_s"] for w in warm]
        for ph in ("fwd", "bwd", "step"):  # process CPU time: half of each phase's elapsed time
            steps[f"{ph}_cpu_s"] = 0.5 * steps[f"{ph}_s"]
        steps["total_cpu_s"] = steps[["fwd_cpu_s", "bwd_cpu_s", "step_cpu_s"]].sum(axis=1)
        steps.to_csv(path, index=False)
    pred = pd.read_csv(run / "predicted.csv")
    for ph in ("fwd", "bwd"):
        pred[f"host_{ph}_s"] = HOST_SHARE * pred[f"pred_{ph}_s"]
    pred.to_csv(run / "predicted.csv", index=False)
    return compare.reconcile_stages([run])


def test_recorded_runs_without_references_have_no_speed():
    table = compare.reconcile_stages([DATA / "stage0"])
    assert table["meas_host_speed"].isna().all() and table["pred_fwd_at_run_s"].isna().all()
    assert not any("calibration's speed" in q for q, _ in answers(table))


def test_speed_factors_are_the_planted_readings(planted):
    assert planted["meas_host_speed"].tolist() == pytest.approx([2.0, 2.0])
    assert planted["meas_compute_speed"].tolist() == pytest.approx([1.5, 1.5])


def test_prediction_at_run_speed_by_hand(planted):
    for _, r in planted.iterrows():
        k = r["pred_process_slowdown"]  # taken out of the compute and host terms: the readings hold the peers' share
        assert k > 1  # the datasheet's per-peer slowdown at 2 ranks: the division below is exercised
        for ph in ("fwd", "bwd"):
            compute = r[f"pred_{ph}_compute_s"] / k
            hand = (2.0 * HOST_SHARE * compute + 1.5 * (1 - HOST_SHARE) * compute + 2.0 * r[f"pred_{ph}_host_s"] / k
                    + r[f"pred_{ph}_comm_s"] + r[f"pred_{ph}_wait_s"])
            assert r[f"pred_{ph}_at_run_s"] == pytest.approx(hand)
        hand = (1.5 * r["pred_optim_compute_s"] + 2.0 * r["pred_optim_host_s"] / k + r["pred_optim_comm_s"]
                + r["pred_optim_wait_s"])
        assert r["pred_optim_at_run_s"] == pytest.approx(hand)
        assert r["pred_step_at_run_s"] == pytest.approx(r["pred_fwd_at_run_s"] + r["pred_bwd_at_run_s"]
                                                        + r["pred_optim_at_run_s"])
        # the plain prediction is the same sum at factor 1
        assert r["pred_fwd_s"] == pytest.approx(r["pred_fwd_compute_s"] + r["pred_fwd_host_s"] + r["pred_fwd_comm_s"]
                                                + r["pred_fwd_wait_s"])


def test_the_answer_gives_both_ratios(planted):
    text = dict(answers(planted))["Did the machine run at the calibration's speed?"]
    r = planted.median(numeric_only=True)  # the answers take each column's median over the ranks
    assert "stage 0: host x2.00, compute x1.50" in text
    assert f"forward {r['meas_fwd_s'] / r['pred_fwd_s']:.2f} -> {r['meas_fwd_s'] / r['pred_fwd_at_run_s']:.2f}" in text
    assert not math.isnan(r["pred_step_at_run_s"])
    # the step's process CPU time against its predicted work (compute and host terms) at the run's speed, by hand
    k = r["pred_process_slowdown"]
    work = ((1.5 * (1 - HOST_SHARE) + 2.0 * HOST_SHARE) * (r["pred_fwd_compute_s"] + r["pred_bwd_compute_s"]) / k
            + 1.5 * r["pred_optim_compute_s"]
            + 2.0 * (r["pred_fwd_host_s"] + r["pred_bwd_host_s"] + r["pred_optim_host_s"]) / k)
    assert r["meas_step_cpu_s"] > 0
    assert f"(CPU time / predicted work {r['meas_step_cpu_s'] / work:.2f})" in text
    assert f"(CPU time {r['meas_fwd_cpu_s'] / r['pred_fwd_at_run_s']:.2f})" in text

"""perfcheck compare on a recorded sweep (tests/data/deepspeed_sweep: LeNet, fp32, 2 CPU ranks, gloo,
DeepSpeed 0.19.8, stages 0 1 2 3 3-gather and one crashed run). Needs neither DeepSpeed nor a GPU."""
import math
from pathlib import Path

import pandas as pd
import pytest

from perfcheck.commands import cli
from perfcheck.analysis import stages as compare
from perfcheck.report import stages_html as compare_report
from perfcheck.analysis.answers import answers

DATA = Path(__file__).resolve().parents[1] / "data" / "deepspeed_sweep"
P = 62006


@pytest.fixture(scope="module")
def table():
    return compare.reconcile_stages([DATA])


def test_recorded_bytes_match_the_model(table):
    ok = table[table["status"] == "ok"].set_index(["run", "rank"])
    assert set(ok.index.get_level_values(0)) == {"stage0", "stage1", "stage2", "stage3", "stage3-gather"}
    assert ok["bytes_ok"].all()
    assert ok.loc[("stage2", 0), "meas_allreduce_bytes"] == 4 * P + 4
    assert ok.loc[("stage3-gather", 1), "meas_fwd_comm_bytes"] == 4 * P  # allgathered before forward
    assert ok.loc[("stage3", 0), "meas_fwd_comm_bytes"] == 0  # persistent: nothing gathered in forward


def test_crashed_run_is_kept_with_its_log(table):
    crashed = table[table["run"] == "stage1-crashed"]
    assert len(crashed) and (crashed["status"] == "failed").all()
    assert crashed["notes"].str.contains("return code").any()


def test_answers_come_from_the_numbers(table):
    text = " ".join(a for _, a in answers(table))
    step3 = table[(table["run"] == "stage3")]["meas_step_s"].median()
    assert f"{step3 * 1e3:.4g} ms" in text  # perfcheck.units: 3-4 significant digits (44.54 ms)
    assert "mp_size" in text and "ds_numel sums to 62006" in text and "stage3-gather" in text


def test_report_outputs(table, tmp_path):
    compare_report.write_csv(table, tmp_path / "c.csv")
    back = pd.read_csv(tmp_path / "c.csv")
    assert list(back.columns) == list(table.columns)
    compare_report.write_html(table, tmp_path / "c.html")
    page = (tmp_path / "c.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "stage1-crashed failed" in page
    assert "predicted / measured" in compare_report.terminal_table(table)


def test_cli_exit_codes(tmp_path, capsys):
    ok_runs = [str(DATA / s) for s in ("stage0", "stage3")]
    assert cli.main(["compare", *ok_runs, "--out", str(tmp_path), "--no-html"]) == 0
    assert cli.main(["compare", str(DATA), "--out", str(tmp_path), "--no-html"]) == 1  # the crashed run
    assert cli.main(["compare", str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_merge_refuses_incomplete_sets(tmp_path):
    import shutil

    shutil.copytree(DATA / "stage0" / "rank0", tmp_path / "node0" / "rank0")  # rank 1 lives on no node
    with pytest.raises(Exception, match=r"ranks \[1\]"):
        compare.merge_node_runs([tmp_path / "node0"], tmp_path / "merged")


def test_measured_times_are_medians(table):
    r = table[(table["run"] == "stage0") & (table["rank"] == 0)].iloc[0]
    steps = pd.read_csv(DATA / "stage0" / "rank0" / "engine_steps.csv")
    quiet = steps[(steps["role"] == "measured") & ~steps["comms_logged"]]
    assert math.isclose(r["meas_fwd_s"], quiet.groupby("step")["fwd_s"].sum().median())

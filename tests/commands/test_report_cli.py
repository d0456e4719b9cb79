"""`perfcheck report RUN_DIR` on recorded run directories: every format, and one-line errors with exit 2."""
import io
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from perfcheck.commands.cli import main
from perfcheck.analysis.columns import RECONCILED_COLUMNS, TOTALS_COLUMNS

DATA = Path(__file__).resolve().parents[1] / "data"
LENET = DATA / "run_lenet_cpu"
JSC2 = DATA / "run_jsc_2ranks"


def _no_constants(name):
    raise ValueError(f"non-standard JSON constant {name}")


def run_cli(capsys, *argv):
    code = main(["report", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def lenet_copy(tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(LENET, dst)
    return dst


def test_table_is_the_default(capsys):
    code, out, err = run_cli(capsys, LENET, "--depth", "1", "--top", "2")
    assert code == 0 and err == ""
    assert "params of model:                            62.01 K" in out
    assert "(conv1): Conv2d" in out and "fwd latency (predicted | measured | gap)" in out


def test_csv_has_the_documented_columns(capsys, tmp_path):
    out_file = tmp_path / "r.csv"
    code, _, err = run_cli(capsys, LENET, "--format", "csv", "--output", out_file)
    assert code == 0 and "wrote" in err
    frame = pd.read_csv(out_file)
    assert list(frame.columns) == list(RECONCILED_COLUMNS)
    assert set(frame["module"]) == {"(root)", "conv1", "pool", "conv2", "fc1", "fc2", "fc3"}
    # gap is measured / predicted, row by row
    assert (frame["gap_fwd"] - frame["meas_fwd_s"] / frame["pred_fwd_s"]).abs().max() < 1e-6


def test_json_is_strict_and_complete(capsys):
    code, out, _ = run_cli(capsys, JSC2, "--format", "json")
    assert code == 0
    doc = json.loads(out, parse_constant=_no_constants)
    assert doc["schema_version"] == 1 and doc["system"] == "cpu"
    assert set(doc["columns"]) == set(RECONCILED_COLUMNS) and set(doc["totals_columns"]) == set(TOTALS_COLUMNS)
    assert len(doc["modules"]) == 12 and {m["rank"] for m in doc["modules"]} == {0, 1}
    assert [t["straggler"] for t in doc["totals"]] == [False, True]
    assert len(doc["rank_summary"]) == 6 and doc["findings"]
    assert all(set(m) == set(RECONCILED_COLUMNS) for m in doc["modules"])


def test_json_writes_inf_and_nan_as_null():
    from perfcheck.analysis.reconcile import reconcile
    from perfcheck.report.tables import render_json
    from _reconcile_rows import meas_row, pred_row

    rec = reconcile(pd.DataFrame([pred_row("drop", 0.0), pred_row("only", 1e-3)]),
                    pd.DataFrame([meas_row("drop", 4e-6)]))
    doc = json.loads(render_json(rec), parse_constant=_no_constants)
    mods = {m["module"]: m for m in doc["modules"]}
    assert mods["drop"]["gap_fwd"] is None and mods["drop"]["reason_fwd"] == "hook_overhead"
    assert mods["only"]["meas_fwd_s"] is None and mods["only"]["side"] == "predicted_only"


def test_html_is_one_self_contained_file(capsys, tmp_path):
    out_file = tmp_path / "r.html"
    code, _, _ = run_cli(capsys, LENET, "--format", "html", "-o", out_file)
    assert code == 0
    page = out_file.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("data:image/png;base64,") == 5
    assert "<script" not in page and "http://" not in page and "https://" not in page
    for fid in ("plot-pred-vs-meas", "plot-top-modules", "plot-roofline", "plot-timeline", "plot-kernels"):
        assert f'id="{fid}"' in page


def test_missing_file_is_one_line_naming_it(capsys, lenet_copy):
    (lenet_copy / "rank0" / "steps.csv").unlink()
    code, out, err = run_cli(capsys, lenet_copy)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "steps.csv" in err and "missing file" in err


def test_other_schema_version_is_one_line_naming_the_file(capsys, lenet_copy):
    meta_path = lenet_copy / "rank0" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["schema_version"] = 99
    meta_path.write_text(json.dumps(meta))
    code, _, err = run_cli(capsys, lenet_copy)
    assert code == 2 and err.count("\n") == 1 and "meta.json" in err and "schema version 99" in err


def test_predicted_json_of_another_schema_version(capsys, lenet_copy):
    (lenet_copy / "predicted.json").write_text(json.dumps({"schema_version": 0, "system": "cpu"}))
    code, _, err = run_cli(capsys, lenet_copy)
    assert code == 2 and "predicted.json" in err and err.count("\n") == 1


def test_broken_predicted_csv_names_the_file_and_column(capsys, lenet_copy):
    frame = pd.read_csv(lenet_copy / "predicted.csv").drop(columns=["pred_bwd_s"])
    frame.to_csv(lenet_copy / "predicted.csv", index=False)
    code, _, err = run_cli(capsys, lenet_copy)
    assert code == 2 and "predicted.csv" in err and "pred_bwd_s" in err


def test_without_predicted_rows_and_no_known_model_exit_2(capsys, lenet_copy):
    (lenet_copy / "predicted.csv").unlink()
    (lenet_copy / "predicted.json").unlink()
    meta_path = lenet_copy / "rank0" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["model"]["type"] = "MyOwnNet"
    meta_path.write_text(json.dumps(meta))
    code, out, err = run_cli(capsys, lenet_copy)
    assert code == 2 and out == "" and err.count("\n") == 1 and "predicted.csv: missing file" in err


def test_without_predicted_rows_a_builtin_example_is_re_estimated(capsys, lenet_copy):
    (lenet_copy / "predicted.csv").unlink()
    (lenet_copy / "predicted.json").unlink()
    code, out, _ = run_cli(capsys, lenet_copy, "--format", "csv")
    assert code == 0
    frame = pd.read_csv(io.StringIO(out))
    from perfcheck.predict.for_run import model_from_meta, predict_for_run

    meta = json.loads((lenet_copy / "rank0" / "meta.json").read_text())
    want = predict_for_run(model_from_meta(meta), meta)  # today's estimator on the recorded shapes, not the recording
    assert frame["pred_fwd_s"].tolist() == pytest.approx(want["pred_fwd_s"].tolist())


def test_bad_options_exit_2(capsys):
    assert run_cli(capsys, LENET, "--depth", "-1")[0] == 2
    assert run_cli(capsys, LENET, "--top", "0")[0] == 2
    code, _, err = run_cli(capsys, LENET, "--system", "no-such-gpu")
    assert code == 2 and "unknown system 'no-such-gpu'" in err
    with pytest.raises(SystemExit) as exc:
        main(["report", str(LENET), "--format", "xml"])
    assert exc.value.code == 2


def test_system_option_changes_the_roofs(capsys):
    code, out, _ = run_cli(capsys, LENET, "--format", "json", "--system", "h100-sxm")
    assert code == 0 and json.loads(out)["system"] == "h100-sxm"


@pytest.mark.slow  # a subprocess or a browser: > 3 s, full suite only
def test_console_entry_point(tmp_path):
    out = subprocess.run([sys.executable, "-m", "perfcheck", "report", str(JSC2), "--format", "csv"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    frame = pd.read_csv(io.StringIO(out.stdout))
    assert sorted(frame["rank"].unique()) == [0, 1] and len(frame) == 12
    assert not math.isnan(frame["meas_fwd_s"].iloc[0])

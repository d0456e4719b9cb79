"""`--system` re-estimates the prediction for that system (or refuses with the fix), and a run predicted with
a calibrated system file reports without that file: predicted.json embeds the whole spec (issue 11)."""
import io
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

import perfcheck
from perfcheck.commands.cli import main
from perfcheck.examples.models import Net
from perfcheck.hardware.systems import load_system
from perfcheck.predict.for_run import save_predicted

LENET = Path(__file__).resolve().parents[1] / "data" / "run_lenet_cpu"


@pytest.fixture
def run(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(LENET, d)
    return d


def _csv(capsys, *argv):
    assert main(["report", *map(str, argv), "--format", "csv"]) == 0, capsys.readouterr().err
    return pd.read_csv(io.StringIO(capsys.readouterr().out)).set_index("module")


def test_system_flag_re_estimates_for_that_system(run, capsys):
    got = _csv(capsys, run, "--system", "h100-sxm")
    want = perfcheck.estimate(Net(), (torch.zeros(8, 3, 32, 32, device="meta"),), system="h100-sxm",
                              dtype="float32").set_index("module")
    saved = pd.read_csv(run / "predicted.csv").set_index("module")
    assert got.loc["conv1", "pred_fwd_s"] == pytest.approx(want.loc["conv1", "pred_fwd_s"], rel=1e-9)
    assert got.loc["conv1", "pred_fwd_s"] != pytest.approx(saved.loc["conv1", "pred_fwd_s"], rel=1e-3)


def test_system_flag_on_a_model_it_cannot_rebuild_is_refused_with_the_fix(run, capsys):
    meta_path = run / "rank0" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["model"]["type"] = "MyOwnNet"
    meta_path.write_text(json.dumps(meta))
    assert main(["report", str(run), "--system", "h100-sxm"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--system h100-sxm" in err and "save_predicted" in err
    assert main(["report", str(run)]) == 0  # without --system the saved prediction is used


def test_calibrated_spec_travels_with_the_run(run, tmp_path, capsys):
    data = load_system("cpu").to_json_dict()
    data.update(name="my-calibrated-box", mem_bandwidth_bytes_per_s=data["mem_bandwidth_bytes_per_s"] / 7)  # a spec no built-in name knows
    spec_file = tmp_path / "box.json"
    spec_file.write_text(json.dumps(data))
    frame = perfcheck.estimate(Net(), (torch.zeros(8, 3, 32, 32),), system=str(spec_file))
    save_predicted(run, frame, system=str(spec_file), dtype="float32")
    spec_file.unlink()  # the report must not need it
    got = _csv(capsys, run)
    assert got.loc["conv1", "pred_fwd_s"] == pytest.approx(frame.set_index("module").loc["conv1", "pred_fwd_s"])
    assert main(["report", str(run), "--format", "json"]) == 0
    assert "my-calibrated-box" in json.loads(capsys.readouterr().out)["system"]


def test_compare_system_flag_refuses_what_it_cannot_re_estimate(tmp_path, capsys):
    """The recorded sweep's rank directories keep no meta.json: nothing to rebuild the model from, so
    `compare --system` for another system says so instead of relabelling the saved numbers."""
    data = Path(__file__).resolve().parents[1] / "data" / "deepspeed_sweep" / "stage0"
    assert main(["compare", str(data), "--out", str(tmp_path / "c"), "--system", "h100-sxm"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--system h100-sxm" in err and "save_predicted" in err
    assert not (tmp_path / "c").exists()

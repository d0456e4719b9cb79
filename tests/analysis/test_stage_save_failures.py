"""A stage whose ranks failed to save their files is failed, with the reason (issue 11: stage 3 showed
"ok" while every rank logged `PerfCheck.stop failed` and left no predicted.csv, an incomplete meta.json)."""
import json
import shutil
from pathlib import Path

from perfcheck.analysis.stages import load_stage, reconcile_stages

DATA = Path(__file__).resolve().parents[1] / "data" / "deepspeed_sweep"


def _copy(tmp_path):
    d = tmp_path / "stage3"
    shutil.copytree(DATA / "stage3", d)
    assert load_stage(d)["status"] == "ok"  # the recorded stage is complete as it is
    return d


def test_perfcheck_stop_failure_fails_the_stage(tmp_path):
    d = _copy(tmp_path)
    z = d / "rank1" / "zero.json"
    facts = json.loads(z.read_text())
    facts["warnings"] = ["PerfCheck.stop failed (AttributeError: 'FakeTensor' object has no attribute 'ds_status')"]
    z.write_text(json.dumps(facts))
    st = load_stage(d)
    assert st["status"] == "failed" and any("rank 1: PerfCheck.stop failed" in p for p in st["problems"])
    row = reconcile_stages([str(d)]).iloc[0]
    assert row["status"] == "failed" and "ds_status" in row["notes"]


def test_rank_tables_without_a_complete_meta_fail_the_stage(tmp_path):
    d = _copy(tmp_path)
    (d / "rank0" / "steps.csv").write_text("step\n")  # PerfCheck ran on the rank ...
    st = load_stage(d)  # ... but never wrote meta.json
    assert st["status"] == "failed" and any("meta.json: missing" in p for p in st["problems"])
    (d / "rank0" / "meta.json").write_text(json.dumps({"complete": False}))
    assert any("marked incomplete" in p for p in load_stage(d)["problems"])

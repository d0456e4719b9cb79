"""One assembly path: a live PerfCheck and its saved run directory reconcile to the same table,
and every file of the run directory is read by one reader that checks its schema version."""
import json
import shutil

import pandas as pd
import pytest

from perfcheck.analysis.pipeline import reconcile_run
from perfcheck.errors import UserError


def test_live_and_saved_paths_give_identical_tables(lenet_session):
    pc, run_dir = lenet_session
    live = pc.reconciled()
    saved = reconcile_run(run_dir).table
    pd.testing.assert_frame_equal(live, saved)
    assert pc.report() == __import__("perfcheck.report.text", fromlist=["render_text"]).render_text(saved)


def test_kernel_counts_are_per_profiled_step_in_both_paths(lenet_session):
    """The profiler window had 2 active steps: both paths divide the kernel table by 2, so the root's
    per-step kernel count is the window's total over 2 (the disagreement the two old assemblies had)."""
    pc, run_dir = lenet_session
    kernels = pc.kernels()
    # on CPU the table's rows are aten ops (named "aten::..."); every module is in the root's subtree
    fwd = kernels[(kernels["phase"] == "fwd") & kernels["name"].str.startswith("aten::")
                  & (kernels["module"] != "unattributed")]
    assert fwd["count"].sum() > 0
    for table in (reconcile_run(run_dir).table, pc.reconciled()):
        root = table[table["module"] == "(root)"].iloc[0]
        assert root["kernels_fwd"] == pytest.approx(fwd["count"].sum() / 2)
        assert root["kernel_fwd_s"] == pytest.approx(fwd["self_s"].sum() / 2)


def _copy(run_dir, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(run_dir, dst)
    return dst


def test_predicted_csv_without_its_json_is_refused_with_the_file_named(lenet_session, tmp_path):
    run = _copy(lenet_session[1], tmp_path)
    (run / "rank0" / "predicted.json").unlink()
    with pytest.raises(UserError, match=r"predicted\.json: missing file"):
        reconcile_run(run)


@pytest.mark.parametrize("name", ["predicted.json", "meta.json"])
def test_another_schema_version_is_refused_with_the_file_named(lenet_session, tmp_path, name):
    run = _copy(lenet_session[1], tmp_path)
    path = run / "rank0" / name
    data = json.loads(path.read_text())
    data["schema_version"] = 999
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match=rf"{name}: schema version 999 does not match"):
        reconcile_run(run)


def test_a_json_file_that_is_not_an_object_is_a_one_line_error(lenet_session, tmp_path):
    run = _copy(lenet_session[1], tmp_path)
    (run / "rank0" / "meta.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="expected a JSON object"):
        reconcile_run(run)


def test_deepspeed_save_prediction_writes_what_the_run_loader_reads(tmp_path):
    """The DeepSpeed integration's prediction goes through the one writer: the loader accepts it."""
    import torch

    from perfcheck.examples.models import Net
    from perfcheck.integrations.deepspeed.api import save_prediction
    from perfcheck.predict.for_run import load_predicted

    path = save_prediction(tmp_path, Net(), (torch.randn(2, 3, 32, 32),), system="cpu")
    frame, info = load_predicted(tmp_path)
    assert path is not None and info["system"] == "cpu" and info["schema_version"] >= 1
    # LeNet: 5,213,760 MACs for a batch of 8 (DeepSpeed's profiler printed 5.21 M), so 1,303,440 for 2
    assert frame.loc[frame["module"] == "(root)", "macs_fwd"].item() == 1_303_440


def test_zero_json_of_another_version_fails_the_stage_with_the_reason(data_dir, tmp_path):
    from perfcheck.analysis.stages import reconcile_stages

    stage = tmp_path / "stage0"
    shutil.copytree(data_dir / "deepspeed_sweep" / "stage0", stage)
    facts = json.loads((stage / "rank1" / "zero.json").read_text())
    facts["schema_version"] = 0
    (stage / "rank1" / "zero.json").write_text(json.dumps(facts))
    table = reconcile_stages([stage])
    assert set(table["status"]) == {"failed"}
    assert table["notes"].str.contains("zero.json: schema version 0 does not match").all()


def test_stage_comparison_reads_module_tables_through_the_same_pipeline(lenet_session, data_dir, tmp_path):
    """A ZeRO stage whose ranks also wrote PerfCheck's module tables gets its per-module view from
    pipeline.reconcile_run: the module it names is the one with the largest measured-minus-predicted
    fwd+bwd time in `perfcheck report`'s table of the same directory."""
    from perfcheck.analysis.stages import reconcile_stages

    stage = tmp_path / "stage0"
    shutil.copytree(data_dir / "deepspeed_sweep" / "stage0", stage)
    src = lenet_session[1] / "rank0"
    for rank in (0, 1):
        for f in src.iterdir():
            if f.suffix == ".csv" and f.name != "predicted.csv":
                frame = pd.read_csv(f)
                if "rank" in frame:
                    frame["rank"] = rank
                frame.to_csv(stage / f"rank{rank}" / f.name, index=False)
            elif f.name == "meta.json":
                meta = json.loads(f.read_text())
                meta.update(rank=rank, world_size=2)
                (stage / f"rank{rank}" / f.name).write_text(json.dumps(meta))
            else:  # predicted.json, trace.json
                shutil.copy(f, stage / f"rank{rank}" / f.name)
    table = reconcile_stages([stage])
    rec = reconcile_run(stage).table
    body = rec[(rec["module"] != "(root)") & (rec["rank"] == 0)]
    gap = body["meas_fwd_s"] + body["meas_bwd_s"] - body["pred_fwd_s"] - body["pred_bwd_s"]
    expected = body.loc[gap.idxmax(), "module"]
    assert table.loc[table["rank"] == 0, "module_top_gap"].iloc[0].startswith(f"{expected} (")


def test_the_optimizer_prediction_reaches_the_totals_and_the_report(lenet_session):
    """The estimator's pred_optim_s (root row) is carried into the totals and named in the report;
    a prediction without it leaves NaN and the report says the optimizer is not predicted."""
    from perfcheck.analysis.reconcile import reconcile
    from perfcheck.analysis.totals import totals_frame

    pc, _ = lenet_session
    pred = pc.predicted()
    assert pred.loc[pred["module"] == "(root)", "pred_optim_s"].item() > 0
    totals = totals_frame(pc.reconciled())
    assert totals["pred_optim_s"].item() == pred.loc[pred["module"] == "(root)", "pred_optim_s"].item()
    assert "optimizer" in pc.report() and "predicted, " in pc.report()
    bare = reconcile(pred.drop(columns=["pred_optim_s"]), pc.measured())
    assert totals_frame(bare)["pred_optim_s"].isna().all()

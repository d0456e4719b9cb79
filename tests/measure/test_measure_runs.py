"""Run directories: files and meta.json, atomic writes, crash recovery, load_run errors, rank merge,
and the `perfcheck run` command."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import torch

from perfcheck import PerfCheck, UserError
import perfcheck.rundir as runs
from perfcheck.commands.cli import main
from perfcheck.examples.models import Net
from perfcheck.schema import KERNEL_COLUMNS, MEASURED_COLUMNS, ROOT, SAMPLE_COLUMNS, SCHEMA_VERSION, STEP_COLUMNS


def _measure(out, steps=2, **kw):
    torch.manual_seed(0)
    model = Net()
    kw.setdefault("profile", False)
    pc = PerfCheck(model, warmup=1, steps=steps, sample_interval=None, out_dir=out, **kw)
    with pc:
        while not pc.done:
            model(torch.randn(2, 3, 32, 32)).sum().backward()
            pc.step()
    return pc


def test_run_directory_files_and_meta(tmp_path):
    pc = _measure(tmp_path, profile=True, overhead_pairs=2)
    d = tmp_path / "rank0"
    assert {p.name for p in d.iterdir()} == {"meta.json", "modules.csv", "steps.csv", "module_steps.csv",
                                            "kernels.csv", "samples.csv", "trace.json", "predicted.csv",
                                            "predicted.json"}
    # The estimator ran on the shapes the run saw (batch 2): LeNet's 5,213,760 MACs at batch 8 / 4.
    predicted = pd.read_csv(d / "predicted.csv").set_index("module")
    assert predicted.loc["(root)", "macs_fwd"] == 5_213_760 // 4
    meta = json.loads((d / "meta.json").read_text())
    assert meta["schema_version"] == SCHEMA_VERSION and meta["complete"] is True
    assert meta["rank"] == 0 and meta["world_size"] == 1 and meta["versions"]["torch"] == torch.__version__
    assert meta["inputs"] == {"args": [{"shape": [2, 3, 32, 32], "dtype": "float32", "device": "cpu",
                                        "requires_grad": False}], "kwargs": {}}
    assert meta["model"] == {"type": "Net", "dtype": "float32", "params": 62006, "wrappers": [], "compiled": [],
                             "factory": "perfcheck.examples.models:Net"}  # what a report rebuilds the model from
    assert meta["dtype"] == "float32" and meta["parallel"]["kind"] == "none"
    assert meta["overhead"]["pairs"] == 2 and "fraction" in meta["overhead"]
    assert meta["measured_steps"] == 2 and meta["step_count"] == len(pc.steps())
    assert "deepspeed" in meta["versions"] and meta["device"]["type"] == "cpu"
    assert pd.read_csv(d / "modules.csv").columns.tolist() == list(MEASURED_COLUMNS)
    assert not [p for p in d.iterdir() if ".tmp-" in p.name]
    run = runs.load_run(tmp_path)
    assert run.complete and run.ranks == [0] and not run.missing_ranks
    pd.testing.assert_frame_equal(run.modules.reset_index(drop=True), pc.measured(), check_dtype=False)
    assert list(run.steps.columns) == list(STEP_COLUMNS) and list(run.kernels.columns) == list(KERNEL_COLUMNS)


def test_overhead_not_measured_is_said_so(tmp_path):
    _measure(tmp_path)
    assert json.loads((tmp_path / "rank0" / "meta.json").read_text())["overhead"] == "not measured"


def test_out_dir_holding_a_run_is_refused(tmp_path):
    _measure(tmp_path)
    with pytest.raises(UserError, match="already holds a run"):
        _measure(tmp_path)


def test_load_run_names_missing_files_and_version_mismatch(tmp_path):
    with pytest.raises(UserError, match="not found"):
        runs.load_run(tmp_path / "nope")
    with pytest.raises(UserError, match="no rank"):
        runs.load_run(tmp_path)
    _measure(tmp_path / "a")
    (tmp_path / "a" / "rank0" / "kernels.csv").unlink()
    with pytest.raises(UserError, match="kernels.csv: missing file"):
        runs.load_run(tmp_path / "a")
    _measure(tmp_path / "b")
    meta_path = tmp_path / "b" / "rank0" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["schema_version"] = SCHEMA_VERSION + 1
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(UserError, match="schema version"):
        runs.load_run(tmp_path / "b")
    meta_path.unlink()
    with pytest.raises(UserError, match="meta.json: missing file"):
        runs.load_run(tmp_path / "b")
    _measure(tmp_path / "c")
    steps = pd.read_csv(tmp_path / "c" / "rank0" / "steps.csv").drop(columns=["step_s"])
    steps.to_csv(tmp_path / "c" / "rank0" / "steps.csv", index=False)
    with pytest.raises(UserError, match="step_s"):
        runs.load_run(tmp_path / "c")


def test_ranks_merge_and_a_missing_rank_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    for rank in (0, 2):
        monkeypatch.setenv("RANK", str(rank))
        _measure(tmp_path)
    with pytest.warns(RuntimeWarning, match=r"ranks \[1\]"):
        run = runs.load_run(tmp_path)
    assert run.ranks == [0, 2] and run.missing_ranks == [1] and run.world_size == 3
    assert sorted(run.modules["rank"].unique()) == [0, 2] and sorted(run.steps["rank"].unique()) == [0, 2]
    assert (run.modules[run.modules.module == ROOT]["rank"].tolist()) == [0, 2]


CRASH_SCRIPT = textwrap.dedent("""
    import os, sys, torch
    from perfcheck import PerfCheck
    from perfcheck.examples.models import Net
    model = Net()
    pc = PerfCheck(model, warmup=1, steps=None, profile=False, sample_interval=0.1, out_dir=sys.argv[1]).start()
    for i in range(5):
        model(torch.randn(2, 3, 32, 32)).sum().backward()
        pc.step()
    model(torch.randn(2, 3, 32, 32))  # a step in flight when the process dies
    os._exit(9)                        # like SIGKILL: no atexit, no finally, no flush
""")


@pytest.mark.slow  # a subprocess or a browser: > 3 s, full suite only
def test_crash_mid_run_loses_at_most_the_step_in_flight(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(CRASH_SCRIPT)
    (tmp_path / "run" / "rank0").mkdir(parents=True)
    stale = tmp_path / "run" / "rank0" / ".modules.csv.tmp-999999-deadbeef"
    stale.write_text("half a file")  # left by a writer that was killed (pid 999999 does not exist)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 9, proc.stderr
    assert not stale.exists()  # cleaned by the next writer
    run = runs.load_run(tmp_path / "run")
    assert run.complete is False
    assert run.steps["step"].tolist() == [0, 1, 2, 3, 4]  # every finished step survived
    assert (run.modules.set_index("module").loc[ROOT, "steps"]) == 4  # rebuilt from module_steps.csv
    assert any("run cut short after step 4" in n and "rebuilt" in n for n in run.notes), run.notes


def test_atomic_write_replaces_whole_files(tmp_path):
    p = tmp_path / "f.json"
    runs.atomic_write_json(p, {"a": 1})
    runs.atomic_write_json(p, {"a": 2})
    assert json.loads(p.read_text()) == {"a": 2} and [x.name for x in tmp_path.iterdir()] == ["f.json"]
    app = runs.CsvAppender(tmp_path / "s.csv", SAMPLE_COLUMNS)
    app.append({"time_s": 0.5, "step": 3})
    assert pd.read_csv(tmp_path / "s.csv")["step"].tolist() == [3]  # readable while still open
    app.close()


def test_new_run_dir_names_are_unique():
    a, b = runs.new_run_dir("runs", "lenet"), runs.new_run_dir("runs", "lenet")
    assert a != b and a.parent.name == "runs" and "lenet" in a.name


def test_cli_run_writes_a_loadable_run(tmp_path, capsys):
    out = tmp_path / "cli"
    code = main(["run", "--model", "jsc", "--steps", "2", "--warmup", "1", "--overhead-pairs", "1",
                 "--sample-interval", "0.1", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "2 measured steps" in text and str(out) in text
    run = runs.load_run(out)
    assert set(run.modules["module"]) == {ROOT, "seq_blocks", "seq_blocks.0", "seq_blocks.1", "seq_blocks.2",
                                          "seq_blocks.3"}
    assert run.modules["flops_fwd_counted"].notna().all() and len(run.kernels) > 0
    assert (out / "rank0" / "trace.json").exists()


def test_cli_run_rejects_bad_input(tmp_path, capsys):
    assert main(["run", "--sample-interval", "0.01", "--out", str(tmp_path / "x")]) == 2
    assert "sample_interval" in capsys.readouterr().err
    assert main(["run", "--profile-window", "1,2", "--out", str(tmp_path / "y")]) == 2


def test_cli_model_names_match_the_examples_and_the_parser_does_not_import_torch():
    from perfcheck.commands import run as run_cmd
    from perfcheck.examples.models import EXAMPLES

    assert sorted(run_cmd.MODELS) == sorted(EXAMPLES)
    code = ("import sys, argparse; from perfcheck.commands import run as r; "
            "r.add_parser(argparse.ArgumentParser().add_subparsers()); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_long_runs_keep_bounded_memory_and_the_csv_keeps_everything(tmp_path, monkeypatch):
    import perfcheck.measure.session as pc_mod

    monkeypatch.setattr(pc_mod, "MAX_MODULE_ROWS", 7 * 3)  # Net: 7 modules per step -> 3 steps in memory
    pc = _measure(tmp_path, steps=6)
    assert pc.module_steps()["step"].nunique() == 3 and pc.meta()["module_steps_dropped"] == 4
    on_disk = pd.read_csv(tmp_path / "rank0" / "module_steps.csv")
    assert on_disk["step"].nunique() == 7  # warm-up + 6 measured, all appended
    assert json.loads((tmp_path / "rank0" / "meta.json").read_text())["module_steps_dropped"] == 4


def test_report_joins_predicted_and_measured_for_every_module(tmp_path):
    pc = _measure(tmp_path)
    text = pc.report(depth=1)
    assert "predicted vs measured" in text and "(conv1): Conv2d" in text
    rec = pc.reconciled()
    assert set(rec.loc[rec["side"] == "both", "module"]) >= {"(root)", "conv1", "fc3"}


def test_a_model_the_estimator_cannot_trace_keeps_its_run(tmp_path):
    """A forward that reads tensor data (here .item()) cannot run under fake tensors: the
    measured files are written anyway and meta.json says why predicted.csv is missing."""

    class DataDependent(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x) * float(x.abs().sum().item() > 0)

    model, x = DataDependent(), torch.randn(3, 4)
    with pytest.warns(RuntimeWarning, match="predicted.csv not written"):
        with PerfCheck(model, warmup=0, steps=2, profile=False, sample_interval=None, out_dir=tmp_path) as pc:
            for _ in range(2):
                model(x).sum().backward()
                pc.step()
    d = tmp_path / "rank0"
    assert (d / "modules.csv").exists() and not (d / "predicted.csv").exists()
    assert any("predicted.csv not written" in w for w in json.loads((d / "meta.json").read_text())["warnings"])

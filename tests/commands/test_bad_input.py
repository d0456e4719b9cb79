"""Bad input, the whole class (issue 11): every CLI command refuses a bad argument up front with one
line naming the field and exit code 2 (no traceback, nothing written, nothing silently wrong), and
the public API raises UserError naming the argument.

The first cases are the ones the issue listed; the table then walks every flag of every command.
Each CLI case runs in this process through ``perfcheck.commands.cli.main`` (fast; a case that started work
before failing would show up as a slow test or a written file).
"""
import shutil
from pathlib import Path

import pytest

from perfcheck.commands.cli import main
from perfcheck.errors import UserError

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A scratch cwd with: a file, an empty dir, a copy of a recorded run, a garbage and an empty modules.csv."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a directory\n")
    (tmp_path / "empty").mkdir()
    shutil.copytree(DATA / "run_lenet_cpu", tmp_path / "run")
    garbage = tmp_path / "garbage"
    shutil.copytree(DATA / "run_lenet_cpu", garbage)
    (garbage / "rank0" / "modules.csv").write_bytes(b"\x00\x01garbage,,,\n\"unterminated\n1,2\n")
    empty_rows = tmp_path / "empty_rows"
    shutil.copytree(DATA / "run_lenet_cpu", empty_rows)
    (empty_rows / "rank0" / "modules.csv").write_text("")
    return tmp_path


def _fails_cleanly(argv, capsys, *words):
    before = {p for p in Path.cwd().rglob("*")}
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse refuses with exit 2
        rc = exc.code
    err = capsys.readouterr().err.strip()
    assert rc == 2, (argv, rc, err)
    lines = [t for t in err.splitlines() if t.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)
    created = {p for p in Path.cwd().rglob("*")} - before
    assert not created, f"{argv} wrote {sorted(map(str, created))}"


# The issue's cases: (argv, words the one line must contain).
ISSUE_CASES = [
    (["report", "garbage"], ["modules.csv"]),
    (["report", "empty_rows"], ["modules.csv"]),
    (["compare", "empty"], ["RUN_DIR", "empty"]),
    (["run", "--batch-size", "0"], ["--batch-size"]),
    (["run", "--system", "nosuch"], ["--system", "nosuch"]),
    (["run", "--out", "afile"], ["--out", "afile"]),
]

# Every other flag of every command that takes a value.
FLAG_CASES = [
    # run
    (["run", "--steps", "0"], ["--steps"]),
    (["run", "--steps", "x"], ["--steps"]),
    (["run", "--warmup", "-1"], ["--warmup"]),
    (["run", "--batch-size", "-3"], ["--batch-size"]),
    (["run", "--sample-interval", "0"], ["--sample-interval"]),
    (["run", "--sample-interval", "0.01"], ["--sample-interval"]),
    (["run", "--sample-interval", "nan"], ["--sample-interval"]),
    (["run", "--overhead-pairs", "-1"], ["--overhead-pairs"]),
    (["run", "--seed", "-1"], ["--seed"]),
    (["run", "--profile-window", "0,1"], ["--profile-window"]),
    (["run", "--profile-window", "0,1,0"], ["--profile-window"]),
    (["run", "--profile-window", "-1,1,1"], ["--profile-window"]),
    (["run", "--model", "resnet"], ["--model"]),
    (["run", "--device", "tpu"], ["--device"]),
    (["run", "--out", "afile/sub"], ["--out", "afile"]),
    (["run", "--system", "afile"], ["--system"]),
    # report
    (["report", "nosuch"], ["nosuch"]),
    (["report", "afile"], ["afile"]),
    (["report", "empty"], ["empty"]),
    (["report", "run", "--depth", "-1"], ["--depth"]),
    (["report", "run", "--top", "0"], ["--top"]),
    (["report", "run", "--format", "pdf"], ["--format"]),
    (["report", "run", "--system", "nosuch"], ["--system", "nosuch"]),
    (["report", "run", "--output", "empty"], ["--output", "empty"]),
    (["report", "run", "--output", "afile/x.txt"], ["--output", "afile"]),
    # compare
    (["compare", "nosuch"], ["RUN_DIR", "nosuch"]),
    (["compare", "afile"], ["RUN_DIR", "afile"]),
    (["compare", "run", "--out", "afile"], ["--out", "afile"]),
    (["compare", "run", "--out", "run/rank0"], ["--out"]),
    (["compare", "run", "--system", "nosuch"], ["--system", "nosuch"]),
    # estimate (the transformer front-end names its fields: tp, zero_stage, ...)
    (["estimate", "--system", "nosuch"], ["nosuch"]),
    (["estimate", "--model", "nosuch-model"], ["nosuch-model"]),
    (["estimate", "--tp", "0"], ["tp must"]),
    (["estimate", "--pp", "0"], ["pp must"]),
    (["estimate", "--dp", "0"], ["dp must"]),
    (["estimate", "--batch", "0"], ["batch must"]),
    (["estimate", "--seq", "0"], ["seq must"]),
    (["estimate", "--micro-batches", "0"], ["micro_batches"]),
    (["estimate", "--grad-accum", "0"], ["grad_accum_steps"]),
    (["estimate", "--zero", "4"], ["zero_stage"]),
    (["estimate", "--tp-overlap", "1.5"], ["tp_overlap"]),
    (["estimate", "--dp-overlap", "-0.1"], ["dp_overlap"]),
    (["estimate", "--recompute", "some"], ["--recompute"]),
    (["estimate", "--format", "xml"], ["--format"]),
    (["estimate", "--output", "empty"], ["--output", "empty"]),
    (["estimate", "--module", "nosuchpkg.mod:Net", "--input-shape", "1,3,32,32"], ["nosuchpkg"]),
    (["estimate", "--module", "perfcheck.examples.models:Net", "--input-shape", "1,x"], ["--input-shape"]),
    (["estimate", "--module", "perfcheck.examples.models:Net"], ["--input-shape"]),
    # whatif
    (["whatif", "run", "--system", "nosuch"], ["nosuch"]),
    (["whatif", "nosuch", "--system", "cpu"], ["nosuch"]),
    (["whatif", "run", "--system", "cpu", "--rank", "-1"], ["--rank"]),
    (["whatif", "run", "--system", "cpu", "--depth", "-1"], ["--depth"]),
    (["whatif", "run", "--system", "cpu", "--output", "empty"], ["--output", "empty"]),
    # systems
    (["systems", "nosuch"], ["nosuch"]),
    (["systems", "--output", "empty"], ["--output", "empty"]),
    # calibrate
    (["calibrate", "--world-size", "0"], ["--world-size"]),
    (["calibrate", "--threads", "0"], ["--threads"]),
    (["calibrate", "--base", "nosuch"], ["nosuch"]),
    (["calibrate", "--output", "empty"], ["--output", "empty"]),
    # sweep
    (["sweep", "--stages", "7"], ["--stages", "7"]),
    (["sweep", "--stages", ""], ["--stages"]),
    (["sweep", "--stages", "1 1"], ["--stages"]),
    (["sweep", "--ranks", "0"], ["--ranks"]),
    (["sweep", "--steps", "0"], ["--steps"]),
    (["sweep", "--micro-batch", "0"], ["--micro-batch"]),
    (["sweep", "--timeout", "0"], ["--timeout"]),
    (["sweep", "--model", "resnet"], ["--model"]),
    (["sweep", "--optimizer", "sgd"], ["--optimizer"]),
    (["sweep", "--hostfile", "nosuch"], ["--hostfile", "nosuch"]),
    (["sweep", "--script", "nosuch.py"], ["--script", "nosuch.py"]),
    (["sweep", "--extra-config", "afile"], ["afile"]),
    (["sweep", "--out", "afile"], ["--out", "afile"]),
    (["sweep", "--resume", "--force"], ["--force"]),
    (["sweep", "--script-args", "'unterminated"], ["--script-args"]),
    # plan
    (["plan", "--gpus", "8"], ["--model"]),
    (["plan", "--model", "gpt2-124m", "--gpus", "0", "--global-batch", "8", "--system", "cpu"], ["--gpus"]),
    (["plan", "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "0", "--system", "cpu"], ["--global-batch"]),
    (["plan", "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "8", "--system", "nosuch"], ["nosuch"]),
]


@pytest.mark.parametrize("argv, words", ISSUE_CASES + FLAG_CASES, ids=lambda v: " ".join(v) if isinstance(v, list)
                         and v and isinstance(v[0], str) and not v[0].startswith("-") else None)
def test_cli_refuses_with_one_line(env, capsys, argv, words):
    _fails_cleanly(argv, capsys, *words)


def test_every_command_has_cases():
    from perfcheck.commands.cli import SUBCOMMANDS

    covered = {argv[0] for argv, _ in ISSUE_CASES + FLAG_CASES}
    assert covered == set(SUBCOMMANDS)


# ------------------------------------------------------------------------------ public API
def test_perfcheck_refuses_unknown_system_when_built():
    from perfcheck import PerfCheck
    from perfcheck.examples.models import Net

    with pytest.raises(UserError, match="system.*nosuch"):
        PerfCheck(Net(), system="nosuch")


def test_perfcheck_refuses_a_file_as_out_dir(tmp_path):
    from perfcheck import PerfCheck
    from perfcheck.examples.models import Net

    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(UserError, match="out_dir.*afile"):
        PerfCheck(Net(), out_dir=f)
    with pytest.raises(UserError, match="out_dir.*afile"):
        PerfCheck(Net(), out_dir=f / "sub")


def test_estimate_refuses_a_name_for_a_model():
    import torch

    import perfcheck

    with pytest.raises(UserError, match="model"):
        perfcheck.estimate("Net", (torch.randn(1, 3, 32, 32),))


def test_deepspeed_block_refuses_zero_sampler_interval():
    from perfcheck.integrations.deepspeed.config import parse_block

    with pytest.raises(UserError, match="sampler_interval_s"):
        parse_block({"perfcheck": {"sampler_interval_s": 0}})
    assert parse_block({"perfcheck": {"sampler_interval_s": None}}).sampler_interval_s is None

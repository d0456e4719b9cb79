"""Fault injection (issue 21): a run directory is untrusted input and a run can be stopped at any time.

Every case below damages a saved run (random bytes, a cell that is not a number, a cut file, an
oversized or deeply nested JSON, a newer schema, a link out of the directory), writes into one from two
places at once, fills the disk, or signals the run. The targets: no traceback (``cli.main`` returns 0
with a note or 2 with one line; anything else escapes and fails the test), no module silently dropped
(every measured module is still on both sides of the report after a cut), no rows mixed, and a signalled
run that wrote every file, says "interrupted" and leaves no process behind.
"""
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from perfcheck import PerfCheck
from perfcheck.commands.cli import main
from perfcheck.errors import UserError
from perfcheck.examples.models import Net
import perfcheck.rundir as rundir

FILES = ("modules.csv", "steps.csv", "module_steps.csv", "kernels.csv", "samples.csv", "predicted.csv",
         "meta.json", "predicted.json")


def _train(model, pc, steps, *, kill_at=None, sig=signal.SIGTERM):
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(steps):
        model(torch.randn(4, 3, 32, 32, generator=gen)).sum().backward()
        if i == kill_at:
            os.kill(os.getpid(), sig)  # arrives mid-step: after the backward, before the optimizer
        opt.step()
        opt.zero_grad()
        pc.step()


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A LeNet run with every file (sampler on, a profiler window, predicted.csv)."""
    out = tmp_path_factory.mktemp("fault") / "run"
    torch.manual_seed(0)
    model = Net()
    pc = PerfCheck(model, warmup=1, steps=4, profile_window=(0, 1, 1), out_dir=out, sample_interval=0.1)
    with pc:
        _train(model, pc, 9)
    d = out / "rank0"
    assert all((d / f).is_file() for f in FILES), sorted(p.name for p in d.iterdir())
    return out


@pytest.fixture
def run(saved_run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(saved_run, dst)
    return dst


def _report(capsys, run_dir, *extra):
    """``perfcheck report`` in-process: 0, or 2 with exactly one line on stderr; never a traceback."""
    code = main(["report", str(run_dir), *map(str, extra)])
    out, err = capsys.readouterr()
    assert code in (0, 2), (code, err[-2000:])
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("perfcheck report: error:"), err
    assert "Traceback" not in out + err
    return code, out, err


def _sides(capsys, run_dir, tmp_path) -> pd.DataFrame:
    target = tmp_path / "rec.csv"
    code, _, err = _report(capsys, run_dir, "--format", "csv", "--output", target)
    assert code == 0, err
    return pd.read_csv(target)


# ----------------------------------------------------------------------- undecodable, not numbers
@pytest.mark.parametrize("name", FILES)
def test_random_bytes_are_one_line_naming_the_file(run, capsys, name):
    (run / "rank0" / name).write_bytes(random.Random(name).randbytes(4096))
    code, _, err = _report(capsys, run)
    assert code == 2 and name in err


@pytest.mark.parametrize("name, column, value", [("steps.csv", "step_s", "abc"), ("predicted.csv", "pred_fwd_s", "lots"),
                                                 ("modules.csv", "fwd_s_median", "fast"),
                                                 ("kernels.csv", "self_s", "1e-3s")])
def test_a_cell_that_is_not_a_number_is_one_line_naming_the_column(run, capsys, name, column, value):
    path = run / "rank0" / name
    frame = pd.read_csv(path, keep_default_na=False)
    frame[column] = frame[column].astype(object)
    frame.loc[len(frame) // 2, column] = value
    path.write_text(frame.to_csv(index=False))
    code, _, err = _report(capsys, run)
    assert code == 2 and name in err and repr(column) in err and repr(value) in err


@pytest.mark.parametrize("field, value, words", [
    ("world_size", "two", ["'world_size'", "integer"]),
    ("world_size", 100_000_000, ["'world_size'", "1..1048576"]),  # would allocate a 10^8-entry rank list
    ("rank", 5, ["'rank'"]),
    ("complete", "yes", ["'complete'"]),
    ("files", "modules.csv", ["'files'"]),
    ("files", ["../../etc/passwd"], ["'files'"]),
    ("schema_version", 99, ["newer perfcheck", "upgrade perfcheck"]),
    ("schema_version", 0, ["re-run"]),
])
def test_a_bad_meta_field_is_one_line_naming_it(run, capsys, field, value, words):
    path = run / "rank0" / "meta.json"
    meta = json.loads(path.read_text())
    meta[field] = value
    path.write_text(json.dumps(meta))
    code, _, err = _report(capsys, run)
    assert code == 2 and all(w in err for w in words), err


def test_deeply_nested_and_oversized_json_are_one_line(run, capsys):
    path = run / "rank0" / "meta.json"
    path.write_text("[" * 100_000 + "]" * 100_000)  # json.loads: RecursionError
    code, _, err = _report(capsys, run)
    assert code == 2 and "nested too deep" in err
    with open(path, "wb") as fh:  # sparse: 17 MiB that are never read into memory
        fh.truncate(rundir.MAX_JSON_BYTES + (1 << 20))
    code, _, err = _report(capsys, run)
    assert code == 2 and "bytes, more than" in err


# ----------------------------------------------------------------------------------- truncation
def _cut(path: Path, fraction: float):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


def test_modules_cut_mid_row_is_noted_and_rebuilt_with_every_module(run, capsys, tmp_path):
    whole = set(pd.read_csv(run / "rank0" / "modules.csv")["module"])
    _cut(run / "rank0" / "modules.csv", 0.6)
    code, out, _ = _report(capsys, run)
    assert code == 0 and "cut mid-row" in out and "modules.csv rebuilt from module_steps.csv" in out, out[-3000:]
    rec = _sides(capsys, run, tmp_path)
    both = set(rec.loc[rec["side"] == "both", "module"])
    assert whole <= both, whole - both  # fc1..fc3 are not "[predicted only]"


def test_modules_cut_at_a_row_boundary_is_told_by_the_row_count(run, capsys, tmp_path):
    path = run / "rank0" / "modules.csv"
    whole = set(pd.read_csv(path)["module"])
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-3]))  # whole rows: only meta.json's row count tells
    code, out, _ = _report(capsys, run)
    assert code == 0 and f"{len(lines) - 4} of the {len(lines) - 1} rows" in out, out[-3000:]
    rec = _sides(capsys, run, tmp_path)
    assert whole <= set(rec.loc[rec["side"] == "both", "module"])


def test_predicted_cut_in_half_is_noted(run, capsys):
    _cut(run / "rank0" / "predicted.csv", 0.5)
    code, out, _ = _report(capsys, run)
    assert code == 0 and "predicted.csv" in out and "have no prediction" in out, out[-3000:]


@pytest.mark.parametrize("name", ["steps.csv", "module_steps.csv", "kernels.csv", "samples.csv"])
def test_other_tables_cut_mid_row_are_noted(run, capsys, name):
    _cut(run / "rank0" / name, 0.7)
    code, out, err = _report(capsys, run)
    assert (code == 0 and name in out and ("cut mid-row" in out or "rows the run wrote" in out)) or \
        (code == 2 and name in err), out[-2000:] + err


def test_mixed_rows_of_two_runs_are_refused(run, capsys):
    path = run / "rank0" / "steps.csv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines + lines[1:4]))  # a second writer's steps 0..2 appended
    code, _, err = _report(capsys, run)
    assert code == 2 and "more than one run wrote" in err


# -------------------------------------------------------------------------------------- links
def test_a_table_linked_out_of_the_run_directory_is_refused(run, capsys, tmp_path):
    outside = tmp_path / "elsewhere.csv"
    shutil.copy(run / "rank0" / "modules.csv", outside)
    (run / "rank0" / "modules.csv").unlink()
    (run / "rank0" / "modules.csv").symlink_to(outside)
    code, _, err = _report(capsys, run)
    assert code == 2 and "outside" in err


def test_a_launcher_log_linked_out_is_never_read(tmp_path):
    from perfcheck.analysis.stages import log_tail

    secret = tmp_path / "secret.txt"
    secret.write_text("Error: the private key is 1234\n")
    stage = tmp_path / "stage1"
    stage.mkdir()
    (stage / "launcher.log").symlink_to(secret)
    tail = log_tail(stage)
    assert "1234" not in tail and "not read" in tail
    (stage / "launcher.log").unlink()
    (stage / "launcher.log").write_bytes(b"\xff\xfe junk\nError: rank 1 died\n")  # undecodable: replaced, not raised
    assert "rank 1 died" in log_tail(stage)


# ---------------------------------------------------------------------------- concurrent writers
def test_a_second_run_into_the_same_directory_is_refused(tmp_path):
    out = tmp_path / "shared"
    first = PerfCheck(Net(), warmup=0, steps=2, profile=False, sample_interval=None, out_dir=out).start()
    try:
        second = PerfCheck(Net(), warmup=0, steps=2, profile=False, sample_interval=None, out_dir=out)
        with pytest.raises(UserError, match=f"another perfcheck run \\(pid {os.getpid()}\\)"):
            second.start()
    finally:
        first.stop()
    assert not (out / "rank0" / rundir.LOCK).exists()  # released and removed at stop
    with pytest.raises(UserError, match="already holds a run"):  # and after the first ended: not mixed either
        PerfCheck(Net(), warmup=0, steps=2, profile=False, sample_interval=None, out_dir=out).start()


def test_a_lock_held_by_another_process_is_refused_and_a_dead_holder_is_not(tmp_path):
    d = tmp_path / "run" / "rank0"
    d.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys, time
        fd = os.open({str(d / rundir.LOCK)!r}, os.O_CREAT | os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, str(os.getpid()).encode()); print("locked", flush=True); time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        pc = PerfCheck(Net(), warmup=0, steps=1, profile=False, sample_interval=None, out_dir=tmp_path / "run")
        with pytest.raises(UserError, match=f"pid {holder.pid}"):
            pc.start()
    finally:
        holder.kill()
        holder.wait()
    # the kernel dropped the dead holder's lock: its file left behind blocks nothing
    pc = PerfCheck(Net(), warmup=0, steps=1, profile=False, sample_interval=None, out_dir=tmp_path / "run")
    with pc:
        _train(Net(), pc, 1)


@pytest.mark.slow
def test_two_cli_runs_into_one_directory_never_mix(tmp_path, capsys):
    out = tmp_path / "race"
    cmd = [sys.executable, "-m", "perfcheck", "run", "--out", str(out), "--steps", "5", "--warmup", "1",
           "--overhead-pairs", "0", "--no-flops", "--no-profile"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(c for c, _ in results)
    assert codes == [0, 2], results
    err = next(e for c, e in results if c == 2)
    lines = [line for line in err.splitlines() if line.strip() and "Warning" not in line and "warn(" not in line]
    assert len(lines) == 1 and ("another perfcheck run" in err or "already holds a run" in err), err
    steps = pd.read_csv(out / "rank0" / "steps.csv")
    assert steps["step"].is_unique
    assert _report(capsys, out)[0] == 0


# ------------------------------------------------------------------------- full or read-only disk
def _no_temps(d: Path):
    return [p.name for p in d.rglob(".*tmp-*")]


def test_a_full_disk_at_save_is_one_line_and_leaves_no_temp_file(tmp_path, monkeypatch):
    out = tmp_path / "full"
    model = Net()
    pc = PerfCheck(model, warmup=1, steps=2, profile_window=(0, 1, 1), out_dir=out, sample_interval=None)
    pc.start()
    _train(model, pc, 5)

    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(UserError, match="No space left on device") as err:
        pc.stop()
    assert "\n" not in str(err.value)
    assert _no_temps(out) == [] and not (out / "rank0" / rundir.LOCK).exists()


def test_a_full_disk_while_writing_the_trace_leaves_no_temp_file(tmp_path, monkeypatch):
    def half_then_full(self, path):
        Path(path).write_text('{"traceEvents": [')
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", half_then_full)
    out = tmp_path / "full"
    model = Net()
    pc = PerfCheck(model, warmup=1, steps=2, profile_window=(0, 1, 1), out_dir=out, sample_interval=None)
    with pytest.warns(RuntimeWarning, match="No space left"):
        with pc:
            _train(model, pc, 5)
    assert _no_temps(out) == [] and not (out / "rank0" / "trace.json").exists()
    assert (out / "rank0" / "modules.csv").is_file()  # the run itself is saved


def test_a_read_only_out_dir_is_one_line(tmp_path, monkeypatch, capsys):
    real_open = os.open

    def read_only(path, flags, *args):
        if str(path).endswith(rundir.LOCK):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    code = main(["run", "--out", str(tmp_path / "ro"), "--steps", "1", "--warmup", "0", "--no-profile", "--no-flops",
                 "--overhead-pairs", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "Read-only file system" in err and "Traceback" not in err
    if os.geteuid() != 0:  # a real read-only directory (root writes through permissions)
        ro = tmp_path / "real-ro"
        ro.mkdir(mode=0o555)
        with pytest.raises(UserError, match="cannot write"):
            PerfCheck(Net(), warmup=0, steps=1, profile=False, sample_interval=None, out_dir=ro).start()


# ----------------------------------------------------------------------------------- signals
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_step_finishes_the_step_and_writes_every_file(tmp_path, capsys, sig):
    out = tmp_path / "sig"
    model = Net()
    pc = PerfCheck(model, warmup=1, steps=50, profile_window=(0, 1, 1), out_dir=out, sample_interval=0.1)
    before = signal.getsignal(sig)
    with pytest.raises(KeyboardInterrupt, match=f"interrupted by {sig.name} after step 5"):
        with pc:
            _train(model, pc, 40, kill_at=5, sig=sig)
    assert signal.getsignal(sig) is before  # the handler is the user's again
    d = out / "rank0"
    meta = json.loads((d / "meta.json").read_text())
    assert meta["complete"] is True and meta["interrupted"] == sig.name
    assert {"modules.csv", "kernels.csv", "predicted.csv", "steps.csv"} <= set(meta["files"])
    steps = pd.read_csv(d / "steps.csv")
    assert steps["step"].tolist() == list(range(6)) and not steps["failed"].any()  # step 5 was finished
    code, text, _ = _report(capsys, out)
    assert code == 0 and f"interrupted ({sig.name}) after step 5" in text


def test_a_second_signal_stops_at_once_and_still_writes(tmp_path):
    out = tmp_path / "twice"
    model = Net()
    pc = PerfCheck(model, warmup=1, steps=50, profile=False, out_dir=out, sample_interval=None)
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(KeyboardInterrupt, match="second signal"):
        with pc:
            for i in range(10):
                model(torch.randn(4, 3, 32, 32, generator=gen)).sum().backward()
                if i == 3:
                    os.kill(os.getpid(), signal.SIGTERM)
                    os.kill(os.getpid(), signal.SIGTERM)  # a hung step: the user insists
                pc.step()
    meta = json.loads((out / "rank0" / "meta.json").read_text())
    assert meta["interrupted"] == "SIGTERM" and (out / "rank0" / "modules.csv").is_file()


def _descendants(pid: int) -> list:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signalling_perfcheck_run_gives_one_line_and_a_reportable_run(tmp_path, capsys, sig):
    out = tmp_path / "cli"
    proc = subprocess.Popen([sys.executable, "-m", "perfcheck", "run", "--out", str(out), "--steps", "100000",
                             "--overhead-pairs", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    steps = out / "rank0" / "steps.csv"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (steps.is_file() and steps.read_text().count("\n") > 12):
        time.sleep(0.2)
    kids = _descendants(proc.pid)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-2000:]
    lines = [line for line in err.splitlines() if "interrupted" in line or "Traceback" in line or "Error" in line]
    assert len(lines) == 1 and lines[0].startswith(f"perfcheck run: interrupted by {sig.name} after step"), err[-2000:]
    assert all(not Path(f"/proc/{k}").exists() for k in kids)
    meta = json.loads((out / "rank0" / "meta.json").read_text())
    assert meta["interrupted"] == sig.name and "predicted.csv" in meta["files"]
    code, text, _ = _report(capsys, out)
    assert code == 0 and f"interrupted ({sig.name})" in text


# ------------------------------------------------------------------------------------- the sweep
def _group_members(pgid: int) -> list:
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.getpgid(int(d)) == pgid:
                    found.append(int(d))
            except OSError:
                pass
    return found


@pytest.mark.slow
@pytest.mark.deepspeed
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signalling_perfcheck_sweep_leaves_no_process_and_says_interrupted(tmp_path, sig):
    pytest.importorskip("deepspeed")
    out = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-m", "perfcheck", "sweep", "--stages", "1", "--out", str(out),
                             "--steps", "400"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "DS_ACCELERATOR": "cpu"})
    progress = out / "stage1" / "rank0" / "engine_steps.csv"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (progress.is_file() and progress.read_text().count("\n") > 8):
        time.sleep(0.5)
    assert progress.is_file(), "the stage never started"
    launcher = [k for k in _descendants(proc.pid) if b"deepspeed.launcher" in Path(f"/proc/{k}/cmdline").read_bytes()]
    pgid = os.getpgid(launcher[0])
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=200)
    assert proc.returncode == 128 + sig, stdout[-2000:] + stderr[-2000:]
    assert _group_members(pgid) == []  # the launcher and both ranks are gone
    assert "Traceback" not in stderr and f"perfcheck sweep: stage 1 interrupted by {sig.name}" in stderr
    assert "interrupted" in (out / "comparison.csv").read_text()
    for r in (0, 1):  # each rank finished its step and wrote its files
        meta = json.loads((out / "stage1" / f"rank{r}" / "meta.json").read_text())
        assert meta["interrupted"] == "SIGTERM" and "modules.csv" in meta["files"]


# ------------------------------------------------------------------------------ hostile models
@pytest.mark.slow  # ~1.4 s: full suite (fast lane < 2 min)
def test_dollar_signs_in_module_names_do_not_break_the_html_report(tmp_path, capsys):
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.d = torch.nn.ModuleDict({"$\\frac$": torch.nn.Linear(8, 8), "a$b": torch.nn.Linear(8, 8)})

        def forward(self, x):
            return self.d["a$b"](self.d["$\\frac$"](x))

    model, out = Odd(), tmp_path / "odd"
    pc = PerfCheck(model, warmup=1, steps=2, profile_window=(0, 1, 1), out_dir=out, sample_interval=None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pc:
        for _ in range(5):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            pc.step()
    code, _, err = _report(capsys, out, "--format", "html", "--output", tmp_path / "r.html")
    assert code == 0, err
    assert "$\\frac$" in (tmp_path / "r.html").read_text()


def test_dollar_signs_in_stage_folder_names_do_not_break_the_comparison_figures():
    from matplotlib.figure import Figure

    from perfcheck.report.stages_html import figure_png

    fig = Figure()
    ax = fig.add_subplot()
    ax.bar([0, 1], [1, 2])
    ax.set_xticks([0, 1], ["stage$\\frac$", "stage$x^$"])
    ax.set_title("runs $\\undefined{$")
    assert len(figure_png(fig)) > 100


def test_a_model_on_the_meta_device_is_refused_at_attach():
    with torch.device("meta"):
        model = Net()
    with pytest.raises(UserError, match="meta device") as err:
        PerfCheck(model)
    assert "\n" not in str(err.value)


def test_a_nested_tensor_input_to_estimate_is_one_line():
    import perfcheck

    nt = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)], layout=torch.jagged)
    with pytest.raises(UserError, match="nested"):
        perfcheck.estimate(torch.nn.Linear(8, 8), (nt,), system="cpu")


def test_a_dataclass_output_keeps_its_backward():
    """The reference: FlopCounterMode over the real backward of the same call."""
    import dataclasses

    from torch.utils.flop_counter import FlopCounterMode

    import perfcheck

    @dataclasses.dataclass
    class Out:
        y: torch.Tensor
        extra: dict

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(64, 64)

        def forward(self, x):
            return Out(self.l(x), {"aux": self.l(x).sum()})

    model, x = M(), torch.randn(32, 64)
    est = perfcheck.estimate(model, (x,), system="cpu").set_index("module")
    out = model(x)
    with FlopCounterMode(display=False) as fc:
        (out.y.sum() + out.extra["aux"]).backward()
    assert est.loc["l", "macs_bwd"] == fc.get_total_flops() // 2 > 0


def test_a_stage_prediction_embeds_a_calibrated_spec(tmp_path, monkeypatch):
    """The stage-level predicted.json of a DeepSpeed run (api.save_prediction) carries the spec itself, so a
    stage whose ranks were SIGKILLed still reports: a calibrated spec's name is no built-in to look up."""
    import dataclasses

    from perfcheck.hardware.systems import load_system
    from perfcheck.integrations.deepspeed.api import save_prediction
    from perfcheck.predict.for_run import load_predicted

    spec = dataclasses.replace(load_system("cpu"), name="cpu-calibrated")
    monkeypatch.setattr("perfcheck.predict.module_estimator.default_system_name", lambda: spec)
    assert save_prediction(tmp_path, Net(), torch.randn(2, 3, 32, 32)) is not None
    info = json.loads((tmp_path / "predicted.json").read_text())
    assert info["system"] == "cpu-calibrated" and info["system_spec"]["name"] == "cpu-calibrated"
    frame, loaded = load_predicted(tmp_path)
    assert loaded["spec"].name == "cpu-calibrated" and len(frame) > 0


def test_user_named_files_get_the_same_reader(tmp_path, capsys, data_dir):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    junk = tmp_path / "p.csv"
    junk.write_bytes(random.Random(1).randbytes(2000))
    lenet = data_dir / "run_lenet_cpu"
    for argv, words in ((["report", lenet, "--system", deep], "nested too deep"),
                        (["whatif", lenet, "--system", "cpu", "--predicted", junk], "not UTF-8")):
        assert main(list(map(str, argv))) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err


# ------------------------------------------------------------------- perfcheck compare on a sweep
def _compare(capsys, sweep, tmp_path, html=False):
    """``perfcheck compare`` in-process: 0 or 1 (a stage that failed or differs), or 2 with one line."""
    code = main(["compare", str(sweep), "--out", str(tmp_path / "cmp")] + ([] if html else ["--no-html"]))
    out, err = capsys.readouterr()
    assert code in (0, 1, 2), err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err
    text = out + err + "".join(p.read_text(errors="replace") for p in (tmp_path / "cmp").glob("*") if p.is_file())
    return code, text


SWEEP_FILES = ("stage2/rank0/zero.json", "stage2/rank0/comms.csv", "stage2/rank1/engine_steps.csv",
               "stage2/rank0/samples.csv", "stage2/run.json", "stage2/predicted.csv", "stage2/predicted.json",
               "stage1-crashed/launcher.log")


#: ~1 s per compare: two cases in the fast lane, all of them in the full suite
FAST_SWEEP_CASES = {("stage2/rank0/zero.json", "bytes"), ("stage1-crashed/launcher.log", "link")}


@pytest.mark.parametrize("name, mode", [pytest.param(n, m, marks=[] if (n, m) in FAST_SWEEP_CASES else [pytest.mark.slow])
                                        for n in SWEEP_FILES for m in ("bytes", "cut", "link")])
def test_compare_of_a_damaged_sweep_is_never_a_traceback(data_dir, tmp_path, capsys, name, mode):
    sweep = tmp_path / "sweep"
    shutil.copytree(data_dir / "deepspeed_sweep", sweep)
    path = sweep / name
    if mode == "bytes":
        path.write_bytes(random.Random(name).randbytes(3000))
    elif mode == "cut":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        secret = tmp_path / "secret.txt"
        secret.write_text("Error: TOPSECRET\n")
        path.unlink()
        path.symlink_to(secret)
    _, text = _compare(capsys, sweep, tmp_path)
    assert "TOPSECRET" not in text


@pytest.mark.slow  # ~1.8 s: full suite (fast lane < 2 min)
def test_dollar_in_a_stage_folder_name_keeps_the_comparison_page(data_dir, tmp_path, capsys):
    sweep = tmp_path / "sweep"
    shutil.copytree(data_dir / "deepspeed_sweep", sweep)
    (sweep / "stage2").rename(sweep / "stage$\\frac$")
    code, text = _compare(capsys, sweep, tmp_path, html=True)
    assert code in (0, 1) and (tmp_path / "cmp" / "comparison.html").is_file() and "stage$\\frac$" in text


def test_a_signal_before_a_direct_stop_is_not_swallowed(tmp_path):
    """start()/stop() without a step() after the signal: stop() writes every file, then the signal is
    sent again with the user's handler back (SIGINT: KeyboardInterrupt from stop())."""
    out = tmp_path / "direct"
    model = Net()
    pc = PerfCheck(model, warmup=1, steps=50, profile=False, out_dir=out, sample_interval=None).start()
    _train(model, pc, 3)
    os.kill(os.getpid(), signal.SIGINT)  # recorded by PerfCheck's handler: nothing raised yet
    with pytest.raises(KeyboardInterrupt):
        pc.stop()
    meta = json.loads((out / "rank0" / "meta.json").read_text())
    assert meta["interrupted"] == "SIGINT" and meta["complete"] is True
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_disk_that_fills_mid_run_is_one_line(tmp_path, capsys, monkeypatch):
    """Appended rows (module_steps.csv) hitting ENOSPC mid-run: the CLI prints one line."""
    import csv

    class Filling:  # a file whose flush fails once a few rows are in
        def __init__(self, fh):
            self.fh, self.flushes = fh, 0

        def write(self, text):
            return self.fh.write(text)

        def flush(self):
            self.flushes += 1
            if self.flushes > 4:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.fh.flush()

        def close(self):
            self.fh.close()

    real_init = rundir.CsvAppender.__init__

    def init(self, path, columns):
        real_init(self, path, columns)
        if Path(path).name == "module_steps.csv":
            self._fh = Filling(self._fh)
            self._writer = csv.writer(self._fh)

    monkeypatch.setattr(rundir.CsvAppender, "__init__", init)
    code = main(["run", "--out", str(tmp_path / "fills"), "--steps", "10", "--warmup", "1", "--no-profile",
                 "--no-flops", "--overhead-pairs", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "No space left on device" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_link_to_a_whole_run_directory_still_reads(run, capsys, tmp_path):
    """``runs/latest -> runs/2026...``: the user's own link to the run is followed; links inside it are not."""
    latest = tmp_path / "latest"
    latest.symlink_to(run, target_is_directory=True)
    assert _report(capsys, latest)[0] == 0

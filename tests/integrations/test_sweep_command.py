"""`perfcheck sweep` (integrations/deepspeed/sweep.py): what it launches, that nothing is JIT-compiled by
default, resume/force, and the per-stage timeout killing a hung stage with all of its ranks."""
import base64
import json
import os
import time
from pathlib import Path

import pytest

from perfcheck.integrations.deepspeed import sweep as S
from perfcheck.integrations.deepspeed import sweep_options as O

DATA = Path(__file__).resolve().parents[1] / "data" / "deepspeed_sweep"


def test_models_and_stages_match_the_training_script():
    from perfcheck.examples.train_ds import MODELS

    assert set(O.MODELS) == set(MODELS)
    assert {"0", "1", "2", "3", "3-gather"} <= set(O.available_stages())


def test_stage_configs_compile_nothing_by_default():
    base = json.loads(S.BASE_CONFIG.read_text())
    assert base["optimizer"]["type"] == "Adam" and base["optimizer"]["params"]["torch_adam"] is True
    from perfcheck.examples.train_ds import parse_args

    assert parse_args(["--config", "c.json", "--out", "o"]).shm_comm is False  # DeepSpeed's CPU shm op not built


def test_local_launch_is_the_per_node_launcher_with_the_package_configs(tmp_path):
    opts = S.SweepOptions(stages=("3",), ranks=3, steps=2, out=str(tmp_path)).validate()
    cmd = S.launch_command(opts, "3", tmp_path / "stage3", 12345, gpus=0)
    assert cmd[1:4] == ["-u", "-m", "deepspeed.launcher.launch"]
    world = json.loads(base64.urlsafe_b64decode(cmd[4].split("=", 1)[1]))
    assert world == {"localhost": [0, 1, 2]} and "--master_port=12345" in cmd
    assert cmd[cmd.index("--config") + 1] == str(S.BASE_CONFIG)
    assert cmd[cmd.index("--overlay") + 1] == str(O.CONFIG_DIR / "stage3.json")
    assert cmd[cmd.index("--steps") + 1] == "2" and cmd[cmd.index("--out") + 1] == str(tmp_path / "stage3")
    host = tmp_path / "hosts"
    host.write_text("localhost slots=2\n")
    cmd = S.launch_command(S.SweepOptions(hostfile=str(host), out=str(tmp_path)).validate(), "0", tmp_path, 1, gpus=0)
    assert "deepspeed.launcher.runner" in cmd and cmd[cmd.index("--hostfile") + 1] == str(host)


def test_fused_optimizer_is_an_overlay(tmp_path):
    opts = S.SweepOptions(out=str(tmp_path), optimizer="fused").validate()
    path = S._optimizer_overlay(opts, tmp_path)
    assert json.loads(path.read_text())["optimizer"]["params"]["torch_adam"] is False


def test_complete_stage_is_skipped_unless_forced(tmp_path, monkeypatch):
    import shutil

    shutil.copytree(DATA / "stage0", tmp_path / "stage0")
    said = []
    res = S.run_stage(S.SweepOptions(stages=("0",), out=str(tmp_path)), "0", 1, 1, gpus=0, say=said.append)
    assert res.status == "skipped" and "skipped" in said[0] and (tmp_path / "stage0" / "rank0").is_dir()
    launched = []
    monkeypatch.setattr(S.subprocess, "Popen", lambda cmd, **kw: launched.append(cmd) or (_ for _ in ()).throw(
        RuntimeError("stop here")))
    with pytest.raises(RuntimeError, match="stop here"):
        S.run_stage(S.SweepOptions(stages=("0",), out=str(tmp_path), force=True), "0", 1, 1, gpus=0, say=said.append)
    assert launched and not (tmp_path / "stage0" / "rank0").exists()  # --force starts the stage afresh


HANG = '''
import os, sys, time
out = sys.argv[sys.argv.index("--out") + 1]
os.makedirs(out, exist_ok=True)
open(os.path.join(out, "pid%s" % os.environ.get("RANK", "x")), "w").write(str(os.getpid()))
time.sleep(600)
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (killed, not yet reaped by its dead parent) is gone
        return f.read().split()[2] != "Z"


@pytest.mark.deepspeed
@pytest.mark.slow
def test_a_hung_stage_is_killed_at_its_timeout_with_its_ranks(tmp_path):
    pytest.importorskip("deepspeed")
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    said = []
    # 15 s: the launcher's own start (it imports deepspeed, ~5 s of CPU) and the two ranks' fit inside it twice
    # over on a machine whose two cores are busy; the stage's kill has 35 s more
    limit = 15
    opts = S.SweepOptions(stages=("0",), out=str(tmp_path / "sweep"), script=str(script), timeout_s=limit).validate()
    t0 = time.monotonic()
    res = S.run_stage(opts, "0", 1, 1, gpus=0, say=said.append)
    took = time.monotonic() - t0
    assert res.status == "timeout" and f"timed out after {limit} s" in res.reason and limit <= took < limit + 35
    pids = [int(p.read_text()) for p in (tmp_path / "sweep" / "stage0").glob("pid*")]
    assert len(pids) == 2  # both ranks had started (they sleep forever)
    time.sleep(1)
    assert not any(_alive(p) for p in pids)
    assert "timed out" in (tmp_path / "sweep" / "stage0" / "launcher.log").read_text()
    assert any("FAILED" in s for s in said)

"""A quiet terminal (issue 11): the profiler's own 'USDT:'/'STAGE:' lines stay out of `perfcheck run`'s
output unless `perfcheck --verbose`."""
import os
import subprocess
import sys

import pytest


def _run(tmp_path, *pre):
    out = tmp_path / f"run{len(pre)}"
    # a fresh environment: the developer's shell may have set KINETO_LOG_LEVEL
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-m", "perfcheck", *pre, "run", "--steps", "2", "--overhead-pairs", "0",
                           "--no-flops", "--out", str(out)], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
def test_profiler_lines_only_with_verbose(tmp_path):
    quiet = _run(tmp_path)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert "USDT:" not in quiet.stdout + quiet.stderr and "FutureWarning" not in quiet.stderr
    assert "perfcheck run:" in quiet.stdout
    loud = _run(tmp_path, "--verbose")
    assert loud.returncode == 0 and "USDT:" in loud.stdout + loud.stderr  # the lines exist; the default hides them


def test_in_process_main_restores_the_environment_and_warning_filters(monkeypatch, capsys):
    """perfcheck.commands.cli.main() called from Python (a notebook, a test) hides the profiler's log lines only while
    the command runs: KINETO_LOG_LEVEL and the FutureWarning filter are as before once it returns."""
    import warnings

    from perfcheck.commands.cli import main

    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    filters_before = list(warnings.filters)
    seen = {}

    def fake_run(args):
        seen["level"] = os.environ.get("KINETO_LOG_LEVEL")
        return 0

    monkeypatch.setattr("perfcheck.commands.systems.run", fake_run)
    assert main(["systems"]) == 0
    assert seen["level"] == "6"  # quiet while the command ran
    assert "KINETO_LOG_LEVEL" not in os.environ and warnings.filters == filters_before
    monkeypatch.setenv("KINETO_LOG_LEVEL", "2")
    assert main(["systems"]) == 0 and seen["level"] == "2" and os.environ["KINETO_LOG_LEVEL"] == "2"

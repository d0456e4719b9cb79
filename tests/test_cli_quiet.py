"""A quiet terminal (issue 11): the profiler's own 'USDT:'/'STAGE:' lines stay out of `perfcheck run`'s
output unless `perfcheck --verbose`."""
import os
import subprocess
import sys

import pytest


def _run(tmp_path, *pre):
    out = tmp_path / f"run{len(pre)}"
    # a fresh environment: an in-process perfcheck.cli.main() call of another test may have set
    # KINETO_LOG_LEVEL in this pytest process, and the child would inherit it
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

"""A run killed with SIGKILL mid-way (issue 11) keeps every finished step and stays reportable: meta.json
carries the input spec from the first step's end, the report rebuilds modules.csv from the rows and
says the run was cut short and after which step."""
import json
import signal
import subprocess
import sys
import textwrap

import pytest

from perfcheck.commands.cli import main

SCRIPT = textwrap.dedent('''
    import os, signal, sys, torch
    from perfcheck import PerfCheck
    from perfcheck.examples.models import Net
    torch.manual_seed(0)
    model, opt = Net(), None
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    pc = PerfCheck(model, warmup=1, steps=50, profile=False, sample_interval=None, out_dir=sys.argv[1])
    pc.start()
    x = torch.randn(4, 3, 32, 32)
    for i in range(6):
        model(x).sum().backward(); opt.step(); opt.zero_grad(); pc.step()
    os.kill(os.getpid(), signal.SIGKILL)   # no stop(), no atexit, no flush beyond what was appended
''')


@pytest.mark.slow
def test_sigkilled_run_is_reported_with_where_it_stopped(tmp_path, capsys):
    run = tmp_path / "killed"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(run)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    meta = json.loads((run / "rank0" / "meta.json").read_text())
    assert meta["complete"] is False and meta["inputs"]["args"][0]["shape"] == [4, 3, 32, 32]
    assert not (run / "rank0" / "modules.csv").exists()
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    # steps 0..5 ended (step() after each of 6 iterations); warm-up 1 -> 5 measured
    assert "run cut short after step 5" in out and "5 measured step(s)" in out, out[:2000]
    assert "conv1" in out and "fc3" in out
    for fmt in ("csv", "json", "html"):
        assert main(["report", str(run), "--format", fmt, "--output", str(tmp_path / f"r.{fmt}")]) == 0

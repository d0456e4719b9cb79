"""DeepSpeed on a GPU, one rank (world size 1, NCCL): ZeRO stages 0-3 driven by the config's
``"perfcheck"`` block (perfcheck.examples.train_ds, the script scripts/zero_sweep.sh launches),
then ``perfcheck compare`` over the four run directories. The rank is started with the
torch.distributed environment variables (no launcher). DeepSpeed's fused Adam would JIT-compile a
CUDA extension; the config asks for torch's Adam (``"torch_adam": true``). Skips without CUDA or
without deepspeed."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.deepspeed,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
pytest.importorskip("deepspeed")
REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "perfcheck" / "integrations" / "deepspeed" / "configs"
STAGES = (0, 1, 2, 3)
GPU = {"optimizer": {"type": "Adam", "params": {"lr": 1e-4, "torch_adam": True}},
       "bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": 8,
       "perfcheck": {"system": None, "warmup_steps": 2, "steps": 3, "sampler_interval_s": 0.1,
                     "profiler": {"enabled": True, "wait": 0, "warmup": 1, "active": 1}}}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stage(out: Path, stage: int, overlay: Path):
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_port()), DS_BUILD_OPS="0",
               PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    d = out / f"stage{stage}"
    cmd = [sys.executable, "-m", "perfcheck.examples.train_ds", "--config", str(CONFIGS / "base.json"),
           "--overlay", str(CONFIGS / f"stage{stage}.json"), "--overlay", str(overlay), "--model", "gpt2",
           "--out", str(d), "--backend", "nccl"]
    d.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    (d / "launcher.log").write_text(res.stdout + res.stderr)
    return res


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds_gpu")
    overlay = out / "gpu.json"
    overlay.write_text(json.dumps(GPU))
    results = {s: _stage(out, s, overlay) for s in STAGES}
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmp = subprocess.run([sys.executable, "-m", "perfcheck", "compare", *[str(out / f"stage{s}") for s in STAGES],
                          "--out", str(out)], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    return out, results, cmp


@pytest.mark.parametrize("stage", STAGES)
def test_stage_runs_on_one_gpu_and_writes_its_run_dir(sweep, stage):
    out, results, _ = sweep
    res = results[stage]
    assert res.returncode == 0, (res.stdout[-2000:] + res.stderr[-4000:])
    rank = out / f"stage{stage}" / "rank0"
    facts = json.loads((rank / "zero.json").read_text())
    assert facts["complete"] and facts["zero_stage"] == stage and facts["device"] == "cuda"
    meta = json.loads((rank / "meta.json").read_text())
    assert meta["device"]["type"] == "cuda" and meta["timing"]["clock"].startswith("cuda events")
    mods = pd.read_csv(rank / "modules.csv").set_index("module")
    assert (mods.loc[["h.0.mlp.c_fc", "lm_head"], "fwd_s_median"] > 0).all()
    assert (mods.loc[["h.0.mlp.c_fc", "lm_head"], "bwd_s_median"] > 0).all()
    eng = pd.read_csv(rank / "engine_steps.csv")
    measured = eng[eng.role == "measured"]
    assert len(measured) == 3 and (measured[["fwd_s", "bwd_s", "step_s"]] > 0).all().all()
    k = pd.read_csv(rank / "kernels.csv")
    assert {"fwd", "bwd"} <= set(k.phase) and (k.device == "cuda").all()


def test_comparison_report_runs_over_the_four_stages(sweep):
    out, _, cmp = sweep
    assert (out / "comparison.csv").is_file(), cmp.stdout[-2000:] + cmp.stderr[-3000:]
    table = pd.read_csv(out / "comparison.csv")
    assert sorted(table["stage"]) == list(STAGES) and (table["status"] == "ok").all(), table.to_string()
    assert (table["meas_step_s"] > 0).all() and (table["pred_step_s"] > 0).all()
    assert cmp.returncode == 0, cmp.stdout[-3000:] + cmp.stderr[-2000:]

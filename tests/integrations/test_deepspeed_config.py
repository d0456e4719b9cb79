"""The "perfcheck" block of a DeepSpeed config: validation, merging, and DeepSpeed 0.19.8 accepting it."""
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perfcheck.errors import UserError
from perfcheck.integrations.deepspeed.config import PerfcheckBlock, merge_configs, parse_block

ROOT = Path(__file__).resolve().parents[2]


def test_block_defaults_and_values():
    b = parse_block({"train_batch_size": 8, "perfcheck": {"steps": 3, "profiler": {"active": 2, "warmup": 0},
                                                          "system": "cpu", "sampler_interval_s": None}})
    assert b.steps == 3 and b.profiler.active == 2 and b.profiler.warmup == 0 and b.sampler_interval_s is None
    assert b.total_steps == b.warmup_steps + 0 + 2 + 3
    assert parse_block({"train_batch_size": 8}) is None
    assert parse_block({"perfcheck": {"profiler": False}}).profiler.enabled is False


@pytest.mark.parametrize("block, word", [
    ({"stepz": 3}, "'stepz'"),
    ({"profiler": {"activ": 1}}, "profiler.'activ'"),
    ({"steps": 0}, "steps"),
    ({"warmup_steps": -1}, "warmup_steps"),
    ({"enabled": "yes"}, "enabled"),
    ({"profiler": {"active": 0}}, "profiler.active"),
    ({"sampler_interval_s": "fast"}, "sampler_interval_s"),
    ({"sampler_interval_s": 0}, "sampler_interval_s"),  # 0 used to turn the sampler off silently; null does
    ({"sampler_interval_s": 0.01}, "sampler_interval_s"),
    ({"system": "no-such-gpu"}, "no-such-gpu"),
])
def test_block_errors_name_the_key(block, word):
    with pytest.raises(UserError, match=word.replace(".", r"\.").replace("'", "'")):
        parse_block({"perfcheck": block})


def test_block_from_file_and_bad_json(tmp_path):
    p = tmp_path / "ds.json"
    p.write_text(json.dumps({"perfcheck": {"steps": 2}}))
    assert parse_block(p).steps == 2
    p.write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        parse_block(p)


def test_merge_configs_is_deep_and_pure():
    base = {"zero_optimization": {"stage": 0, "reduce_bucket_size": 5}, "perfcheck": {"steps": 4}}
    out = merge_configs(base, {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}})
    assert out["zero_optimization"] == {"stage": 3, "reduce_bucket_size": 5} and out["bf16"]["enabled"]
    assert base["zero_optimization"]["stage"] == 0


def test_repo_configs_are_valid():
    base = json.loads((ROOT / "configs/deepspeed/base.json").read_text())
    assert isinstance(parse_block(base), PerfcheckBlock)
    for s in ("0", "1", "2", "3", "3-gather"):
        merged = merge_configs(base, json.loads((ROOT / f"configs/deepspeed/stage{s}.json").read_text()))
        assert merged["zero_optimization"]["stage"] == int(s[0])


@pytest.mark.deepspeed
def test_deepspeed_accepts_the_block(tmp_path):
    """Real deepspeed.initialize (one gloo rank) with the block, and perfcheck.deepspeed.initialize."""
    pytest.importorskip("deepspeed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = textwrap.dedent(f"""
        import json, deepspeed, torch
        import perfcheck.deepspeed as pds
        from perfcheck.examples.models import Net
        from perfcheck.examples.train_ds import _no_shm_comm_build
        _no_shm_comm_build()  # never JIT-compile DeepSpeed's CPU shared-memory comm op
        deepspeed.init_distributed("gloo")
        cfg = json.load(open({str(ROOT / 'configs/deepspeed/base.json')!r}))
        cfg["perfcheck"].update(output_dir={str(tmp_path / 'run')!r}, modules=False, profiler=False,
                                warmup_steps=0, steps=1)
        engine, *_ = deepspeed.initialize(model=Net(), model_parameters=Net().parameters(), config=cfg)
        assert type(engine).__name__ == "DeepSpeedEngine"
        attached = pds.attach(engine, block=dict(cfg["perfcheck"], output_dir={str(tmp_path / 'attached')!r}))
        loss = attached(torch.randn(8, 3, 32, 32)).sum(); attached.backward(loss); attached.step()
        model = Net()
        wrapped, opt, _, _ = pds.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        assert type(wrapped).__name__ == "EngineSession" and wrapped.module is wrapped.engine.module
        loss = wrapped(torch.randn(8, 3, 32, 32)).sum(); wrapped.backward(loss); wrapped.step()
        print("OK", wrapped.run_dir)
    """)
    env = dict(os.environ, DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "OK" in out.stdout, out.stdout[-2000:] + out.stderr[-3000:]
    attached = json.loads((tmp_path / "attached" / "rank0" / "zero.json").read_text())
    assert attached["complete"] and attached["zero_stage"] == 0  # perfcheck.deepspeed.attach(engine) measured it too
    facts = json.loads((tmp_path / "run" / "rank0" / "zero.json").read_text())
    assert facts["complete"] and facts["perfcheck_block"]["steps"] == 1 and facts["zero_stage"] == 0

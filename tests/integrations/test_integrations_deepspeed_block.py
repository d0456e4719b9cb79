"""The DeepSpeed config's "perfcheck" block where perfcheck does not build the engine
(integrations/deepspeed/block.py): its settings as PerfCheck's, the ZeRO layout, and a bare
``deepspeed.initialize`` engine measured by ``perfcheck.deepspeed.perfcheck_for_engine``."""
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from perfcheck.errors import UserError
from perfcheck.integrations.deepspeed.config import parse_block
from perfcheck.integrations.deepspeed.block import perfcheck_settings, settings_for, zero_parallel


def test_block_settings_become_perfcheck_arguments():
    block = parse_block({"perfcheck": {"warmup_steps": 3, "steps": 7, "output_dir": "runs/x", "system": "cpu",
                                       "sampler_interval_s": None, "overhead_pairs": 2,
                                       "profiler": {"wait": 1, "warmup": 2, "active": 3}}})
    assert perfcheck_settings(block) == {"warmup": 3, "steps": 7, "out_dir": "runs/x", "system": "cpu",
                                         "sample_interval": None, "profile": True, "profile_window": (1, 2, 3),
                                         "overhead_pairs": 2}
    off = perfcheck_settings(parse_block({"perfcheck": {"modules": False, "profiler": False}}))
    assert off["depth"] == 0 and off["profile"] is False and "profile_window" not in off and off["overhead_pairs"] == 0


def test_explicit_arguments_win_and_the_warning_says_what_is_not_written():
    cfg = {"perfcheck": {"steps": 4, "output_dir": "runs/block"}, "zero_optimization": {"stage": 2},
           "gradient_accumulation_steps": 4}
    with pytest.warns(RuntimeWarning, match=r"honoured by X; the callback's own arguments win for steps; zero.json"):
        kwargs, block = settings_for(cfg, {"steps": 9}, where="X")
    assert kwargs["steps"] == 9 and kwargs["out_dir"] == "runs/block" and block.steps == 4
    assert zero_parallel(cfg, 2) == {"kind": "deepspeed", "world_size": 2, "dp": 2, "zero_stage": 2,
                                     "gradient_accumulation_steps": 4}
    assert settings_for({"perfcheck": {"enabled": False}}, {"steps": 2}, where="X")[0] == {"steps": 2}
    with pytest.raises(UserError, match="unknown key 'stepz'"):
        settings_for({"perfcheck": {"stepz": 1}}, {}, where="X")


@pytest.mark.deepspeed
def test_bare_deepspeed_initialize_engine_measured_from_its_block(tmp_path):
    pytest.importorskip("deepspeed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "run"
    code = textwrap.dedent(f"""
        import deepspeed, torch
        import perfcheck.deepspeed as pds
        from perfcheck.examples.train_ds import _no_shm_comm_build
        _no_shm_comm_build()  # never JIT-compile DeepSpeed's CPU shared-memory comm op
        deepspeed.init_distributed("gloo")
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        cfg = {{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {{"stage": 1}},
               "zero_allow_untested_optimizer": True,
               "perfcheck": {{"output_dir": {str(out)!r}, "warmup_steps": 1, "steps": 2, "system": "cpu",
                             "sampler_interval_s": None, "profiler": False}}}}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
        pc = pds.perfcheck_for_engine(engine)
        for _ in range(4):
            loss = engine(torch.randn(4, 8)).sum(); engine.backward(loss); engine.step(); pc.step()
        pc.stop()
        print("OK")
    """)
    env = dict(os.environ, DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "OK" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
    meta = json.loads((out / "rank0" / "meta.json").read_text())
    assert meta["complete"] and meta["measured_steps"] == 2 and meta["options"]["warmup"] == 1
    assert meta["parallel"]["kind"] == "deepspeed" and meta["parallel"]["zero_stage"] == 1
    assert meta["model"]["wrappers"] == ["DeepSpeedEngine"] and meta["optimizer"] == "adamw-for-loop"
    # the engine's step outside the model (its host work and collectives) went into the prediction's far rule
    assert json.loads((out / "rank0" / "predicted.json").read_text())["step_other_s"] > 0

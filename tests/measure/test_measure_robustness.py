"""What must never happen: changed numerics, leftover hooks, dirty state after an exception, double
attach; and wrappers (DDP, DeepSpeed's engine, torch.compile) reporting sensible paths."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules import module as module_globals

from perfcheck import PerfCheck, UserError
from perfcheck.examples.models import GPT, JSC_Tiny, Net
from perfcheck.schema import ROOT

HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
              "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks",
              "_state_dict_hooks", "_load_state_dict_pre_hooks")
GLOBAL_DICTS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                "_global_backward_pre_hooks", "_global_forward_hooks_always_called", "_global_forward_hooks_with_kwargs")


def hook_snapshot(model):
    # hooks, and the instance ``_compiled_call_impl`` or ``forward`` PerfCheck times most modules through
    # (measure.timer.forward.TimedForward)
    per_module = {name: {**{d: dict(getattr(m, d, {})) for d in HOOK_DICTS}, "forward": vars(m).get("forward"),
                         "_compiled_call_impl": vars(m).get("_compiled_call_impl")}
                  for name, m in model.named_modules()}
    glob = {d: dict(getattr(module_globals, d, {})) for d in GLOBAL_DICTS}
    return per_module, glob, dict(vars(model)).keys() - {"_modules"}


def train(model, batches, pc=None, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    outs, grads = [], []
    for x, y in batches:
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        outs.append(out.detach().clone())
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
        if pc is not None:
            pc.step()
    return outs, grads, [p.detach().clone() for p in model.parameters()]


CASES = {
    "jsc": (JSC_Tiny, lambda g: (torch.randn(8, 16, generator=g), torch.randint(0, 5, (8,), generator=g))),
    "lenet": (Net, lambda g: (torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g))),
    "gpt": (lambda: GPT(n_layer=2, n_head=2, d_model=32, vocab=64, seq_len=16, use_sdpa=False),
            lambda g: (torch.randint(0, 64, (2, 16), generator=g), torch.randint(0, 64, (2, 16), generator=g))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_numerics_bit_identical_with_everything_on(case):
    build, batch = CASES[case]
    g = torch.Generator().manual_seed(1)
    batches = [batch(g) for _ in range(6)]
    torch.manual_seed(0)
    model_a = build()
    model_b = copy.deepcopy(model_a)
    ref = train(model_a, batches)
    pc = PerfCheck(model_b, warmup=1, steps=2, count_flops=True, profile=True, sample_interval=0.1)
    with pc:
        got = train(model_b, batches, pc)
    for a, b in zip(ref[0], got[0]):
        assert torch.equal(a, b)
    for ga, gb in zip(ref[1], got[1]):
        assert all(torch.equal(x, y) for x, y in zip(ga, gb))
    assert all(torch.equal(x, y) for x, y in zip(ref[2], got[2]))
    assert (pc.steps()["role"] == "flops").any() and (pc.steps()["role"] == "profile").any()


def test_no_leftover_hooks_or_attributes_after_stop():
    torch.manual_seed(0)
    model = GPT(n_layer=1, n_head=2, d_model=16, vocab=32, seq_len=8)
    before = hook_snapshot(model)
    x = torch.randint(0, 32, (2, 8))
    pc = PerfCheck(model, warmup=0, steps=None, count_flops=True, profile=True, profile_window=(0, 0, 1),
                   sample_interval=None)
    with pc:
        for _ in range(3):
            model(x).sum().backward()
            pc.step()
        assert hook_snapshot(model)[0] != before[0]  # the hooks (or timed forwards) were there while running
    assert hook_snapshot(model) == before
    assert torch.autograd.profiler._is_profiler_enabled is False
    # the model runs again without perfcheck and its module calls take the no-hook fast path
    model(x).sum().backward()


def test_no_leftover_hooks_after_exception_exit_and_auto_detach():
    model = Net()
    before = hook_snapshot(model)
    with pytest.raises(ZeroDivisionError):
        with PerfCheck(model, warmup=0, steps=None, profile=False, sample_interval=None):
            model(torch.randn(1, 3, 32, 32)).sum().backward()
            1 / 0
    assert hook_snapshot(model) == before
    pc = PerfCheck(model, warmup=0, steps=1, profile=False, sample_interval=None).start()
    for _ in range(3):  # after 1 measured step the hooks come off by themselves
        model(torch.randn(1, 3, 32, 32)).sum().backward()
        pc.step()
    assert pc.done and hook_snapshot(model) == before
    pc.stop()


class Flaky(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.fail = False

    def forward(self, x):
        x = self.a(x)
        if self.fail:
            raise ValueError("boom in the middle of forward")
        return self.c(self.b(x))


class Inner(nn.Module):
    def __init__(self, flaky):
        super().__init__()
        self.flaky = flaky

    def forward(self, x):
        return self.flaky(x)


def test_exception_in_forward_leaves_clean_state_for_the_next_step():
    model = Inner(Flaky())
    pc = PerfCheck(model, warmup=0, steps=3, profile=False, sample_interval=None).start()
    x = torch.randn(2, 4)
    for i in range(5):
        model.flaky.fail = i == 1
        try:
            model(x).sum().backward()
        except ValueError as exc:
            assert "boom" in str(exc)  # propagates unchanged
        pc.step()
    pc.stop()
    steps = pc.steps().set_index("step")
    assert bool(steps.loc[1, "failed"]) and not steps.drop(index=1)["failed"].any()
    m = pc.measured().set_index("module")
    assert m.loc[:, "steps"].eq(3).all()  # the failed step is left out
    assert (m["calls"] == 1).all() and (m["bwd_s_median"] > 0).all()
    assert set(m.index) == {ROOT, "flaky", "flaky.a", "flaky.b", "flaky.c"}
    assert pc._timer._stack == [] and pc._timer._bstack == []


def test_attaching_twice_is_a_clear_error():
    model = Net()
    first = PerfCheck(model, profile=False, sample_interval=None).start()
    try:
        with pytest.raises(UserError, match="already measured by another running PerfCheck"):
            PerfCheck(model, profile=False, sample_interval=None).start()
        with pytest.raises(UserError, match="Conv2d"):  # a submodule counts too
            PerfCheck(model.conv1, profile=False, sample_interval=None).start()
        with pytest.raises(UserError, match="start"):
            first.start()
    finally:
        first.stop()
    second = PerfCheck(model, profile=False, sample_interval=None).start()
    second.stop()
    assert len(PerfCheck._attached) == 0


@pytest.mark.parametrize("kwargs, match", [
    ({"sample_interval": 0.05}, "minimum"), ({"steps": 0}, "steps"), ({"warmup": -1}, "warmup"),
    ({"profile_window": (0, 1, 0)}, "active"), ({"profile_window": (1, 1)}, "wait, warmup, active"),
])
def test_bad_options_raise_user_error(kwargs, match):
    with pytest.raises(UserError, match=match):
        PerfCheck(Net(), **kwargs)


def test_ddp_wrapped_model_reports_inner_paths(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        ddp = nn.parallel.DistributedDataParallel(Net())
        pc = PerfCheck(ddp, warmup=0, steps=2, profile=False, sample_interval=None)
        with pc:
            while not pc.done:
                ddp(torch.randn(2, 3, 32, 32)).sum().backward()
                pc.step()
        paths = set(pc.measured()["module"])
        assert paths == {ROOT, "conv1", "pool", "conv2", "fc1", "fc2", "fc3"}
        assert pc.meta()["parallel"]["kind"] == "ddp" and pc.meta()["model"]["type"] == "Net"
    finally:
        dist.destroy_process_group()


def test_deepspeed_engine_like_wrapper_is_unwrapped():
    class DeepSpeedEngine(nn.Module):  # same name and .module layout as deepspeed's engine
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *a):
            return self.module(*a)

    engine = DeepSpeedEngine(JSC_Tiny())
    pc = PerfCheck(engine, warmup=0, steps=1, profile=False, sample_interval=None)
    with pc:
        engine(torch.randn(4, 16)).sum().backward()
        pc.step()
    assert set(pc.measured()["module"]) == {ROOT, "seq_blocks", "seq_blocks.0", "seq_blocks.1", "seq_blocks.2",
                                            "seq_blocks.3"}
    assert pc.meta()["model"]["wrappers"] == ["DeepSpeedEngine"]


@pytest.mark.slow  # ~2 s: full suite (fast lane < 2 min)
def test_torch_compiled_model_one_warning_root_timing_no_crash():
    torch.manual_seed(0)
    model = Net()
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(2, 3, 32, 32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pc = PerfCheck(compiled, warmup=1, steps=2, profile=False, sample_interval=None)
        with pc:
            while not pc.done:
                compiled(x).sum().backward()
                pc.step()
    ours = [w for w in caught if "perfcheck" in str(w.message)]
    assert len(ours) == 1 and "torch.compile" in str(ours[0].message)
    m = pc.measured().set_index("module")
    assert list(m.index) == [ROOT] and m.loc[ROOT, "type"] == "Net"
    assert m.loc[ROOT, "fwd_s_median"] > 0 and m.loc[ROOT, "bwd_s_median"] > 0


DS_SCRIPT = """
import os, sys, json
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import torch, deepspeed
from perfcheck import PerfCheck
from perfcheck.examples.models import Net
from perfcheck.examples.train_ds import _no_shm_comm_build
_no_shm_comm_build()  # never JIT-compile DeepSpeed's CPU shared-memory comm op
torch.manual_seed(0)
model = Net()
cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
       "zero_optimization": {"stage": int(sys.argv[1])}, "zero_allow_untested_optimizer": True}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
pc = PerfCheck(engine, warmup=1, steps=2, profile=False, sample_interval=None)
with pc:
    while not pc.done:
        loss = engine(torch.randn(2, 3, 32, 32)).sum()
        engine.backward(loss)
        engine.step()
        pc.step()
m = pc.measured()
print("RESULT" + json.dumps({"paths": sorted(m.module), "bwd": m.bwd_s_median.tolist(), "meta": pc.meta()["model"],
                             "parallel": pc.meta()["parallel"]}))
"""


@pytest.mark.deepspeed
@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 3])
def test_real_deepspeed_engine_zero_stages(tmp_path, stage):
    import json
    import subprocess
    import sys

    script = tmp_path / "ds.py"
    script.write_text(DS_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(stage), str(29600 + stage)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    assert res["paths"] == sorted([ROOT, "conv1", "pool", "conv2", "fc1", "fc2", "fc3"])
    assert all(b > 0 for b in res["bwd"])
    assert res["meta"]["params"] == 62006  # ZeRO-3 partitions: counted with ds_numel
    assert res["parallel"]["kind"] == "deepspeed" and res["parallel"]["zero_stage"] == stage


def test_checkpoint_wrapper_is_transparent_in_paths():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(4, 8)
            self.blk = checkpoint_wrapper(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)))

        def forward(self, x):
            return self.blk(self.inp(x))

    model = M()
    assert "blk._checkpoint_wrapped_module.0" in dict(model.named_modules())
    pc = PerfCheck(model, warmup=0, steps=2, profile=False, sample_interval=None)
    with pc:
        while not pc.done:
            model(torch.randn(2, 4)).sum().backward()
            pc.step()
    m = pc.measured().set_index("module")
    assert set(m.index) == {ROOT, "inp", "blk", "blk.0", "blk.1", "blk.2"}
    assert (m.loc[["blk.0", "blk.2"], "recompute_s_median"] > 0).all() and (m.loc["blk", "calls"] == 1)


def test_multi_device_data_parallel_is_refused_clearly():
    dp = nn.DataParallel(Net())
    dp.device_ids = [0, 1]  # what it holds on a 2-GPU machine; no GPU is touched here
    with pytest.raises(NotImplementedError, match="DataParallel"):
        PerfCheck(dp)
    single = nn.DataParallel(Net())  # no GPU: DataParallel just calls the module
    assert PerfCheck(single, profile=False, sample_interval=None)._view.wrappers == ["DataParallel"]


def test_the_global_random_stream_is_untouched_through_stop_and_its_prediction(tmp_path):
    """Dropout draws from the global generator at every step, and a run directory makes stop() predict
    (the estimator traces a twin of the model): the losses while measured and the first draws after stop()
    equal a run without PerfCheck, so nothing PerfCheck does consumes the user's random numbers."""
    def run(pc_args):
        torch.manual_seed(0)
        model = GPT(n_layer=2, n_head=2, d_model=32, vocab=64, seq_len=16, dropout=0.2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        pc = PerfCheck(model, **pc_args) if pc_args is not None else None
        if pc is not None:
            pc.start()
        losses = []
        for _ in range(5):
            loss = model(torch.randint(0, 64, (2, 16))).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
            if pc is not None:
                pc.step()
        if pc is not None:
            pc.stop()
        return losses, torch.rand(4)

    ref_losses, ref_after = run(None)
    losses, after = run(dict(warmup=1, steps=2, count_flops=True, profile=True, profile_window=(0, 1, 1),
                             sample_interval=None, out_dir=tmp_path / "run"))
    assert (tmp_path / "run" / "rank0" / "predicted.csv").is_file()  # stop() did predict
    assert all(torch.equal(a, b) for a, b in zip(ref_losses, losses))
    assert torch.equal(ref_after, after)

"""meta.json names the optimizer the loop stepped; the prediction costs it; the report names it.

Discovery is torch.optim's global step hook, so the reference is the optimizer the test itself
built; an optimizer perfcheck does not model is named and left unpredicted, never costed as SGD.
"""
import json

import pytest
import torch

from perfcheck import PerfCheck
from perfcheck.commands.cli import main
from perfcheck.errors import UserError


class Lion(torch.optim.Optimizer):
    """A minimal sign-update optimizer: a class perfcheck.predict.host has no cost model for."""

    def __init__(self, params, lr=1e-3):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad.sign(), alpha=-group["lr"])


def _run(tmp_path, make_opt, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    other = torch.nn.Linear(3, 3)  # a second optimizer on another model steps too: not the one recorded
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
    opt = make_opt(model.parameters())
    out = tmp_path / "run"
    with PerfCheck(model, warmup=1, steps=2, out_dir=out, system="cpu", sample_interval=None, profile=False,
                   **kw) as pc:
        for _ in range(4):
            other(torch.randn(2, 3)).sum().backward()
            other_opt.step()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            pc.step()
    return pc, json.loads((out / "rank0" / "meta.json").read_text()), out


def test_the_optimizer_stepping_the_models_parameters_is_recorded_and_reported(tmp_path, capsys):
    pc, meta, out = _run(tmp_path, lambda p: torch.optim.AdamW(p, lr=1e-3, foreach=True))
    assert meta["optimizer"] == "adamw-foreach"
    # the other optimizer's SGD leaves foreach unset: on CPU tensors torch runs the for-loop (host.optimizer_kind)
    assert meta["optimizers_seen"] == ["sgd-for-loop", "adamw-foreach"] and "model's parameters" in meta["optimizer_source"]
    assert pc.predicted().attrs["optimizer"] == "adamw-foreach"
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    assert "optimizer adamw-foreach:" in capsys.readouterr().out


def test_an_unmodelled_optimizer_is_named_and_left_unpredicted(tmp_path, capsys):
    pc, meta, out = _run(tmp_path, Lion)
    assert meta["optimizer"] == "Lion"
    pred = pc.predicted()
    assert pred["pred_optim_s"].isna().all() and pred.attrs["optimizer"] == "optimizer Lion: not modelled"
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    assert "the optimizer is not predicted: optimizer Lion: not modelled" in capsys.readouterr().out


def test_the_optimizer_argument_wins_and_is_checked(tmp_path):
    _, meta, _ = _run(tmp_path, lambda p: torch.optim.SGD(p, lr=0.1), optimizer="adam")
    assert meta["optimizer"] == "adam" and meta["optimizer_source"] == "optimizer= argument"
    with pytest.raises(UserError, match="^optimizer"):
        PerfCheck(torch.nn.Linear(2, 2), optimizer="rmsprop-turbo")
    with pytest.raises(UserError, match="^optimizer: expected a torch.optim optimizer"):
        PerfCheck(torch.nn.Linear(2, 2), optimizer=3)


def test_framework_wrappers_are_unwrapped():
    from perfcheck.measure.optimizers import optimizer_name

    class Wrapper(torch.optim.Optimizer):  # like accelerate's AcceleratedOptimizer: a subclass holding the real one
        def __init__(self, inner):
            self.optimizer = inner
            self.param_groups = inner.param_groups

    class Holder:  # like DeepSpeed's ZeRO optimizers: not an Optimizer, the real one in .optimizer
        def __init__(self, inner):
            self.optimizer = inner

    inner = torch.optim.Adam(torch.nn.Linear(2, 2).parameters(), fused=True)
    assert optimizer_name(Holder(Wrapper(inner))) == "adam-fused"


def test_a_model_the_loop_never_calls_is_said_at_the_second_step():
    model, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    with pytest.warns(RuntimeWarning, match=r"step\(\) called 2 times but no module of the measured model \(Linear\)"):
        with PerfCheck(model, profile=False, sample_interval=None) as pc:
            for _ in range(2):
                other(torch.randn(1, 2)).sum().backward()
                pc.step()

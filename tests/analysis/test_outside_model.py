"""The engine's step outside the model (``stage_prediction.outside_model_s``) and the two-pass estimate that puts it
into the host model's far rule (``for_run.with_step_other``), by hand."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from _host_only_specs import host_only_spec
from perfcheck.analysis.stage_prediction import outside_model_s
from perfcheck.integrations.deepspeed.facts import config_facts
from perfcheck.predict.for_run import with_step_other

US = 1e-6


def _frame(optim_s):
    return pd.DataFrame({"module": ["(root)", "fc"], "depth": [0, 1], "calls": [1, 1],
                         "pred_fwd_s": [1e-3, 1e-3], "pred_bwd_s": [2e-3, 2e-3], "pred_optim_s": [optim_s, optim_s]})


def test_two_passes_the_first_giving_what_the_second_counts():
    calls = []

    def estimate(other):
        calls.append(other)
        return _frame(5 * US)
    out = with_step_other(estimate, lambda frame: 4e-3 if frame["pred_optim_s"].iloc[0] == 5 * US else 0.0)
    assert calls == [0.0, 4e-3] and out.attrs["step_other_s"] == 4e-3
    calls.clear()
    out = with_step_other(estimate, lambda frame: 0.0)  # nothing outside: one estimate
    assert calls == [0.0] and out.attrs["step_other_s"] == 0.0
    assert with_step_other(estimate, None).attrs["step_other_s"] == 0.0  # no engine: one estimate
    with pytest.raises(KeyError):  # without a warn callback a failure is the caller's
        with_step_other(estimate, lambda frame: {}["fact"])


def test_outside_the_model_is_the_engines_host_work_less_the_optimizer_the_estimate_prices():
    """ZeRO-0 on one rank (no collective, no wait), every roofline term ~0: the engine's forward, backward and
    engine.step() host seconds, each a fixed part and one per parameter tensor (2 tensors: a Linear's weight and
    bias), less the 30 us the estimate already priced as the optimizer's step."""
    host = dict(zero0_fwd_s=100 * US, zero0_fwd_tensor_s=1 * US, zero0_bwd_s=200 * US, zero0_bwd_tensor_s=2 * US,
                zero0_step_s=300 * US, zero0_step_tensor_s=3 * US)
    spec = host_only_spec(**host)
    facts = config_facts(torch.nn.Linear(4, 3), {"zero_optimization": {"stage": 0}}, world_size=1)
    assert facts["module_params"] == [["(root)", [12, 3]]] and facts["zero_stage"] == 0 and facts["dp"] == 1
    by_hand = (100 + 2 * 1) + (200 + 2 * 2) + (300 + 2 * 3) - 30
    assert outside_model_s(facts, _frame(30 * US), spec) == pytest.approx(by_hand * US, rel=1e-6, abs=1e-9)
    assert outside_model_s(facts, _frame(1.0), spec) == 0.0  # never below 0


def test_a_failing_engine_fact_leaves_the_prediction_without_it(tmp_path):
    """Instrumentation never loses a prediction: an engine's step that cannot be predicted is left out, said."""
    import perfcheck

    model = torch.nn.Linear(4, 3)
    with pytest.warns(RuntimeWarning, match="outside the model left out"):
        with perfcheck.PerfCheck(model, steps=2, warmup=0, out_dir=tmp_path / "run", system="cpu", profile=False,
                                sample_interval=None, overhead_pairs=0) as pc:
            pc.step_outside = lambda frame, spec: {}["missing fact"]
            while not pc.done:
                model(torch.randn(2, 4)).sum().backward()
                pc.step()
        frame = pc.predicted()
    assert frame.attrs["step_other_s"] == 0.0 and (frame["pred_fwd_s"] > 0).all()

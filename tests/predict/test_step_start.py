"""The step-start term (``host.step_start_s``): calibration's pair, its fit, and what the estimator adds, by hand."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

import perfcheck
from perfcheck.calibrate import case_names, fit, fit_cold, op_cases
from _host_only_specs import cpu_spec_with_host as _spec  # the cpu spec, every host constant 0 but the ones given

US = 1e-6


def _row(kind, label, seconds):
    return {"kind": kind, "label": label, "dtype": "fp32", "m": 0, "k": 0, "n": 0, "flops": 0.0, "bytes": 0.0,
            "world_size": 1, "seconds": seconds}


def test_the_pair_runs_where_the_far_case_does():
    labels = [c.label for c in op_cases.step_start_cases("cpu")]
    far = op_cases.op_cold_far_cases("cpu")
    assert labels == ([case_names.STEP_START, case_names.STEP_START_OP] if far else [])
    assert all(c.between is not None for c in op_cases.step_start_cases("cpu"))


def test_fit_is_the_module_call_less_the_bare_op():
    # a module call after a step of other code 150 us, its bare op after the eviction alone 45 us
    table = pd.DataFrame([_row("opcold", case_names.STEP_START, 150 * US),
                          _row("opcold", case_names.STEP_START_OP, 45 * US)])
    excess, module, op = fit_cold.step_start_excess(table)
    assert (excess, module, op) == (pytest.approx(105 * US), 150 * US, 45 * US)
    assert fit_cold.step_start_excess(table.iloc[:1]) is None  # one of the pair: nothing
    flipped = table.assign(seconds=[40 * US, 45 * US])
    assert fit_cold.step_start_excess(flipped)[0] == 0.0  # floored
    rows = [_row("launch", "op", 4 * US), _row("host", "view", 2 * US), *table.to_dict("records")]
    spec = fit.build_spec("cpu", pd.DataFrame(rows), peaks="measured", stamp="t")
    assert spec.host["step_start_s"] == pytest.approx(105 * US)


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _frame(l3_bytes, **host):
    import dataclasses

    torch.manual_seed(0)
    spec = dataclasses.replace(_spec(op_cold_far_s=0.0, **host), calibration={"l3_bytes": l3_bytes})
    est = perfcheck.estimate(TwoLayers(), (torch.randn(3, 4, requires_grad=True),), system=spec)
    return est.set_index("module")


def test_the_first_op_of_the_forward_pays_it_once_as_far_as_the_step_evicts():
    # an L3 of 64 bytes: the step's data passed through it since the first op's family last ran, so its far share is 1
    base, start = _frame(64), _frame(64, step_start_s=70 * US)
    # the forward's first computing op is a's addmm: its module (and the root) pay 70 us more, nothing else moves
    assert start.loc["a", "host_fwd_s"] - base.loc["a", "host_fwd_s"] == pytest.approx(70 * US)
    assert start.loc["(root)", "host_fwd_s"] - base.loc["(root)", "host_fwd_s"] == pytest.approx(70 * US)
    assert start.loc["b", "host_fwd_s"] == pytest.approx(base.loc["b", "host_fwd_s"])
    assert (start["host_bwd_s"] - base["host_bwd_s"]).abs().max() == pytest.approx(0.0)
    # an L3 of 1 GiB that forgets nothing (no loss curve): the step leaves the first op's code warm, no step start
    kept, kept_start = _frame(2 ** 30), _frame(2 ** 30, step_start_s=70 * US)
    assert kept_start.loc["(root)", "host_fwd_s"] == pytest.approx(kept.loc["(root)", "host_fwd_s"])

"""Per-dtype host terms (issue 24): on the H100 VM a bf16 LeNet forward cost 2.2x the host time of the fp32 one
(bench/gpu_results/2026-11-26-h100/diag_ops.log), which fp32-only op cases cannot price. Checked here: the bf16
cases (op_fixed and round-robin, on tensors needing a gradient), their fit by hand (``<op>@bf16`` = case less
the tiny op and the autograd node; ``op_cold_bf16_s`` = round-robin less the bf16 loops' mean), where the
estimator uses them (a bf16 model only; fp32's where unmeasured), and each optimizer implementation's own
fixed cost per step, by hand on synthetic tables."""
import dataclasses

import pandas as pd
import pytest
import torch

import perfcheck
from perfcheck.calibrate import fit, op_cases
from perfcheck.hardware.systems import host_constants, load_system
from perfcheck.predict import host

US = 1e-6


def _row(kind, label, seconds, dtype="fp32", m=0):
    return {"kind": kind, "label": label, "dtype": dtype, "m": m, "k": 0, "n": 0, "flops": 0.0, "bytes": 0.0,
            "world_size": 1, "seconds": seconds}


def _spec(kind="gpu", **host_values):
    base = load_system("cpu" if kind == "cpu" else "h100-sxm")
    values = {k: 0.0 for k in host_constants(base)}
    values.update(host_values)
    return dataclasses.replace(base, host=values)


# ---------------------------------------------------------------------------- the cases
def test_bf16_cases_run_each_op_in_bf16_with_gradients():
    fixed = op_cases.op_fixed_cases("cpu", ["bf16"])
    n = len(op_cases.tiny_ops(torch.device("cpu")))
    assert [c.dtype for c in fixed] == ["fp32"] * n + ["bf16"] * n
    by = {(c.label, c.dtype): c for c in fixed}
    out = by[("addmm", "bf16")].fn()
    assert out.dtype == torch.bfloat16 and out.grad_fn is not None  # builds its autograd node, as a forward does
    plain = by[("addmm", "fp32")].fn()
    assert plain.dtype == torch.float32 and plain.grad_fn is None  # the fp32 cases stay as before
    cold = op_cases.op_cold_cases("cpu", ["bf16"])
    # the tight round-robins, then the same after the cold filler (op_cases.op_cold_filler_cases)
    assert [(c.kind, c.dtype, c.per_call, c.between is None) for c in cold] == [
        ("opcold", "fp32", n, True), ("opcold", "bf16", n, True), ("opcold", "fp32", n, False),
        ("opcold", "bf16", n, False), ("opcold", "fp32", n - 1, True),  # the near one: test_family_reuse.py
        ("opcold", "fp32", 13, True), ("opcold", "fp32", 13 * 32, True)]  # the light ones: test_family_reuse.py
    cold[1].fn()  # runs
    assert op_cases.op_fixed_cases("cpu") == [] or all(c.dtype == "fp32" for c in op_cases.op_fixed_cases("cpu"))


# ---------------------------------------------------------------------------- the fit, by hand
def test_fit_of_the_bf16_cases_by_hand():
    rows = [_row("launch", "op", 4 * US), _row("host", "autograd forward x32", 7 * US),  # node 7 - 4 = 3 us
            _row("opfixed", "addmm", 6 * US), _row("opfixed", "relu", 4 * US),
            _row("opcold", "round-robin x2", 8 * US),  # fp32: 8 - (6 + 4) / 2 = 3 us
            _row("opfixed", "addmm", 20 * US, "bf16"), _row("opfixed", "relu", 10 * US, "bf16"),
            _row("opcold", "round-robin x2", 25 * US, "bf16")]  # bf16: 25 - (20 + 10) / 2 = 10 us
    spec = fit.build_spec("h100-sxm", pd.DataFrame(rows), peaks="base", stamp="test", kind="gpu")
    assert spec.op_fixed_s["addmm"] == pytest.approx(2 * US)  # 6 - 4
    assert spec.op_fixed_s["addmm@bf16"] == pytest.approx(13 * US)  # 20 - 4 (tiny op) - 3 (autograd node)
    assert spec.op_fixed_s["relu@bf16"] == pytest.approx(3 * US)  # 10 - 4 - 3
    assert spec.host["op_cold_s"] == pytest.approx(3 * US)
    assert spec.host["op_cold_bf16_s"] == pytest.approx(10 * US)
    assert "fp16" not in str(list(spec.host)) or "op_cold_fp16_s" not in spec.host  # not measured: not written


def test_fit_of_each_optimizer_intercept_by_hand():
    rows = [_row("launch", "op", 4 * US),
            _row("host", "optim sgd x2", 40 * US, m=2), _row("host", "optim sgd x16", 110 * US, m=16),  # 30 + 5/t
            _row("host", "optim adam x2", 220 * US, m=2), _row("host", "optim adam x16", 1200 * US, m=16),  # 80 + 70/t
            _row("host", "optim adam_foreach x2", 210 * US, m=2), _row("host", "optim adam_foreach x16", 350 * US, m=16)]
    h = fit.build_spec("h100-sxm", pd.DataFrame(rows), peaks="base", stamp="test", kind="gpu").host
    assert h["optim_step_s"] == pytest.approx(30 * US) and h["optim_sgd_per_tensor_s"] == pytest.approx(5 * US)
    assert h["optim_adam_step_s"] == pytest.approx(80 * US) and h["optim_adam_per_tensor_s"] == pytest.approx(70 * US)
    assert h["optim_adam_foreach_step_s"] == pytest.approx(190 * US)  # 210 - 2 x 10
    assert h["optim_adam_foreach_per_tensor_s"] == pytest.approx(10 * US)


# ---------------------------------------------------------------------------- the estimator, by hand
def _linear():
    return torch.nn.Sequential(torch.nn.Linear(16, 5), torch.nn.ReLU()), (torch.randn(8, 16),)


def test_a_bf16_model_pays_the_bf16_terms_and_an_fp32_one_does_not():
    spec = dataclasses.replace(_spec(op_dispatch_s=4 * US, op_cold_s=1 * US, op_cold_bf16_s=10 * US),
                               op_fixed_s={"addmm": 2 * US, "addmm@bf16": 13 * US})
    model, (x,) = _linear()
    f32 = perfcheck.estimate(model, (x,), system=spec).iloc[0]
    b16 = perfcheck.estimate(model.to(torch.bfloat16), (x.to(torch.bfloat16),), system=spec).iloc[0]
    # forward ops: t (view: 0 here), addmm, relu; every other host constant is 0.
    # fp32: addmm 4 + 2 + cold 1, relu 4 + cold 1 = 12 us; bf16: addmm 4 + 13 + 10, relu 4 + 10 = 41 us
    assert f32["host_fwd_s"] == pytest.approx(12 * US)
    assert b16["host_fwd_s"] == pytest.approx(41 * US)
    # backward: addmm's node runs 2 kernels (the weight's mm and the bias's sum: the input needs no gradient),
    # fixed x 2 / 1 forward kernel; cold once per node
    # fp32: addmm 2 x 4 + 2 x 2 + 1, relu 4 + 1 = 18 us; bf16: 2 x 4 + 13 x 2 + 10, relu 4 + 10 = 58 us
    assert f32["host_bwd_s"] == pytest.approx(18 * US)
    assert b16["host_bwd_s"] == pytest.approx(58 * US)


def test_a_spec_without_bf16_measurements_prices_bf16_like_fp32():
    spec = dataclasses.replace(_spec(op_dispatch_s=4 * US, op_cold_s=1 * US), op_fixed_s={"addmm": 2 * US})
    spec = dataclasses.replace(spec, host={k: v for k, v in spec.host.items() if k != "op_cold_bf16_s"})
    fixed, cold = host.dtype_host_terms(spec, host_constants(spec), torch.bfloat16)
    assert fixed == {"addmm": 2 * US} and cold == pytest.approx(1 * US)
    fixed, cold = host.dtype_host_terms(spec, host_constants(spec), torch.float64)  # no terms of its own
    assert cold == pytest.approx(1 * US)


def test_the_foreach_step_uses_its_own_fixed_cost():
    spec = _spec(optim_step_s=60 * US, optim_sgd_foreach_step_s=140 * US, optim_sgd_foreach_per_tensor_s=1 * US)
    model, x = _linear()
    pred = perfcheck.estimate(model, x, system=spec, optimizer="sgd").set_index("module")
    cost = host.optimizer_time([80, 5], "sgd", spec)
    # GPU default: foreach; host 140 + 2 x 1 = 142 us against the device's few ns: the host's
    assert cost.implementation == "foreach" and cost.host_s == pytest.approx(142 * US)
    assert pred.loc["(root)", "pred_optim_s"] == pytest.approx(cost.time_s)
    # below the root the fixed cost is left out (paid once per step): 142 - 140 = 2 us at most
    assert pred.loc["0", "pred_optim_s"] <= 2 * US + 1e-9


# ---------------------------------------------------------------------------- graph gather/scatter kernel classes
def test_gather_and_scatter_families_trace_to_their_aten_ops_with_hand_bytes():
    from perfcheck.calibrate import gpu_ops

    cs = {c.label: c for c in gpu_ops.gpu_op_cases("cpu", ("bf16",), sizes="tiny",
                                                     families=("index_select", "scatter_add"))}
    assert set(cs) == {"index_select fwd", "index_select bwd", "scatter_add_ fwd", "scatter_add_ bwd"}
    # tiny: 64 edges, 16 nodes, 8 features, bf16: the gather reads 64 rows x 8 x 2 B = 1024 B, writes 1024 B and
    # reads the 64 int64 indices (512 B)
    assert cs["index_select fwd"].bytes == 1024 + 1024 + 512
    for c in cs.values():
        assert c.dtype == "bf16"
        c.fn()  # runs (forward, and the backward of its output alone)


def test_a_spec_calibrated_before_the_foreach_line_keeps_its_optim_step_s():
    spec = _spec(optim_step_s=60 * US, optim_sgd_foreach_per_tensor_s=1 * US)
    spec = dataclasses.replace(spec, host={k: v for k, v in spec.host.items() if k != "optim_sgd_foreach_step_s"})
    assert host.optimizer_time([5, 5], "sgd", spec).host_s == pytest.approx(62 * US)  # 60 + 2 x 1, not the default

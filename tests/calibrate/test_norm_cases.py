"""The row-wise op classes' calibration cases (LayerNorm, GroupNorm, BatchNorm, softmax) and the CPU's efficiency
bound."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

from perfcheck.calibrate import case_names as names
from perfcheck.calibrate.fit_draft import Draft
from perfcheck.calibrate.fit_host import per_op_costs
from perfcheck.calibrate.op_classes import BATCH_NORM, ELEMENTWISE, GROUP_NORM, NORM_ROWS, norm_cases
from perfcheck.errors import UserError
from perfcheck.hardware.systems import SystemSpec, load_system
from perfcheck.predict import roofline


def _by_label():
    return {c.label: c for c in norm_cases(torch.device("cpu"))}


def test_norm_cases_price_the_formulas_flops_by_hand():
    cases = _by_label()
    rows, cols = NORM_ROWS
    n = rows * cols
    assert n == ELEMENTWISE and GROUP_NORM[0] * GROUP_NORM[1] * GROUP_NORM[2] * GROUP_NORM[3] == ELEMENTWISE
    # other FLOPs ride in the shape's third slot (op_classes.opeff_case): LayerNorm 7 per element forward; backward
    # 9 (input gradient) + 3 (weight and bias column sums); GroupNorm the same normalisation plus its per-channel
    # scale and shift (2 forward; the weight's and bias's sums, 3, backward); softmax 5 forward, 4 backward
    other = {label: c.shape[2] for label, c in cases.items()}
    assert other["native_layer_norm"] == 7 * n and other["native_layer_norm:bwd"] == 12 * n
    assert other["native_group_norm"] == 9 * n and other["native_group_norm:bwd"] == 12 * n
    assert other["_softmax"] == 5 * n and other["_softmax:bwd"] == 4 * n
    # bytes: LayerNorm forward reads x, writes y (2 n fp32), the weight and bias, and 2 fp32 statistics per row
    assert cases["native_layer_norm"].bytes == pytest.approx((2 * n + 2 * cols + 2 * rows) * 4)
    assert cases["_softmax:bwd"].bytes == pytest.approx(3 * n * 4)
    assert all(c.kind == names.OPEFF for c in cases.values())


def test_batch_norm_cases_price_the_formula_by_hand():
    """Training BatchNorm over (N, C, H, W): forward 7 FLOPs per element, reads x twice (statistics, then the
    normalisation) and writes y (3 n fp32), the weight and bias (2 C), and the batch mean and invstd with the running
    statistics (4 C); backward 9 per element (input gradient; the weight's and bias's sums fused into it), reads x and
    the gradient and writes the input's (3 n) and the weight and bias (2 C)."""
    cases = _by_label()
    n_, c, h, w = BATCH_NORM
    n = n_ * c * h * w
    assert n == ELEMENTWISE
    assert cases["native_batch_norm"].shape[2] == 7 * n and cases["native_batch_norm:bwd"].shape[2] == 9 * n
    assert cases["native_batch_norm"].bytes == pytest.approx((3 * n + 2 * c + 4 * c) * 4)
    assert cases["native_batch_norm:bwd"].bytes == pytest.approx((3 * n + 2 * c) * 4)
    y, mean, invstd = cases["native_batch_norm"].fn()
    assert y.shape == BATCH_NORM and mean.shape == (c,) and invstd.shape == (c,)
    # a training call returns the batch's statistics: of a standard normal input, 4096 samples per channel
    assert mean.abs().max() < 0.1 and torch.allclose(invstd, torch.ones(c), atol=0.1)
    gx, gw, gb = cases["native_batch_norm:bwd"].fn()
    assert gx.shape == BATCH_NORM and gw.shape == (c,) and gb.shape == (c,)


def test_norm_cases_run_the_aten_calls_they_name():
    cases = _by_label()
    y, _, _ = cases["native_layer_norm"].fn()
    rows, cols = NORM_ROWS
    assert y.shape == (rows, cols)
    gx, gw, gb = cases["native_layer_norm:bwd"].fn()
    assert gx.shape == (rows, cols) and gw.shape == (cols,) and gb.shape == (cols,)
    sm = cases["_softmax"].fn()
    assert torch.allclose(sm.sum(-1), torch.ones(rows), atol=1e-5)
    gx, gw, gb = cases["native_group_norm:bwd"].fn()
    assert gx.shape == GROUP_NORM[:4] and gw.shape == (GROUP_NORM[1],)


def _fit(kind: str, seconds: float) -> float:
    base = load_system("cpu") if kind == "cpu" else load_system("a100-80gb-sxm")
    spec = dataclasses.replace(base, op_efficiency={}, op_fixed_s={})
    case = _by_label()["native_layer_norm"]
    mf, nb, (fk, k, of) = case.flops, case.bytes, case.shape
    roof, _ = roofline.op_time_s(mf, of, nb, k, spec, "fp32", launch_s=0.0)
    table = pd.DataFrame([dict(kind=names.OPEFF, label=case.label, dtype="fp32", m=fk, k=k, n=of, flops=mf, bytes=nb,
                               world_size=1, seconds=roof / seconds, seconds_min=roof / seconds,
                               seconds_max=roof / seconds, repeats=3, iters=10)])
    d = Draft(base=spec, peaks="measured", stamp="test", kind=kind, matrix={}, vector={}, eff={}, sources={})
    return per_op_costs(spec, table, d).op_efficiency["native_layer_norm"]


def test_a_cpu_kernel_may_outrun_the_add_rate_a_gpu_kernel_not_its_datasheet():
    # a case measured 4x faster than its roofline: 4 on a CPU (the roofline is the add's rate), 1 on a GPU
    assert _fit("cpu", 4.0) == pytest.approx(4.0, rel=1e-6)
    assert _fit("gpu", 4.0) == 1.0
    assert _fit("cpu", 0.5) == pytest.approx(0.5, rel=1e-6)


def test_spec_validation_bounds_op_efficiency_by_kind():
    cpu = load_system("cpu").to_json_dict()
    SystemSpec.from_dict({**cpu, "op_efficiency": {"native_layer_norm": 4.0}})
    with pytest.raises(UserError, match="op_efficiency.native_layer_norm"):
        SystemSpec.from_dict({**cpu, "op_efficiency": {"native_layer_norm": 40.0}})
    gpu = load_system("a100-80gb-sxm").to_json_dict()
    with pytest.raises(UserError, match="op_efficiency.native_layer_norm"):
        SystemSpec.from_dict({**gpu, "op_efficiency": {"native_layer_norm": 1.5}})

"""Op classes (perfcheck.predict.aten_costs.op_class), their costs against hand arithmetic, and the calibration
cases that measure them (perfcheck/calibrate/op_classes.py)."""
import dataclasses

import pytest
import torch

import perfcheck
from perfcheck.hardware.systems import load_system
from perfcheck.predict import formulas as F
from perfcheck.predict import host, roofline
from perfcheck.predict import efficiency
from perfcheck.predict.aten_costs import OpCall, TensorMeta, cost_of, op_class

aten = torch.ops.aten
US = 1e-6


def _t(*shape, grad=True, eb=4, is_float=True):
    return TensorMeta(tuple(shape), eb, grad, is_float)


def _conv(x, w, groups=1, transposed=False):
    out = _t(x.shape[0], w.shape[0] if not transposed else w.shape[1] * groups, *x.shape[2:])
    args = (x, w, None, [1] * (len(x.shape) - 2), [0] * (len(x.shape) - 2), [1] * (len(x.shape) - 2), transposed,
            [0] * (len(x.shape) - 2), groups)
    return OpCall(aten.convolution.default, args, {}, (out,))


def test_convolution_classes_by_groups_kernel_and_channels():
    assert op_class(_conv(_t(4, 64, 8, 8), _t(64, 1, 3, 3), groups=64)) == "convolution_depthwise"
    assert op_class(_conv(_t(4, 64, 8, 8), _t(64, 1, 7, 7), groups=64)) == "convolution_depthwise_large"
    assert op_class(_conv(_t(4, 64, 8, 8), _t(64, 8, 3, 3), groups=8)) == "convolution_grouped"
    assert op_class(_conv(_t(4, 64, 8, 8), _t(64, 64, 3, 3))) == "convolution_wide"
    assert op_class(_conv(_t(4, 64, 32), _t(64, 64, 3))) == "convolution_1d"
    assert op_class(_conv(_t(4, 64, 8, 8), _t(64, 32, 4, 4), transposed=True)) == "convolution_transposed"
    assert op_class(_conv(_t(4, 3, 32, 32), _t(6, 3, 5, 5))) == "convolution"  # LeNet's: 3 channels
    # 1x1, stride 1, batch < 16: torch's matrix-product path (ConvParams::use_mkldnn); strided or batch 16: oneDNN
    assert op_class(_conv(_t(4, 16, 1, 1), _t(8, 16, 1, 1))) == "convolution_1x1"
    assert op_class(_conv(_t(16, 16, 8, 8), _t(8, 16, 1, 1))) == "convolution_wide"
    strided = _conv(_t(4, 64, 16, 16), _t(128, 64, 1, 1))
    strided = OpCall(strided.func, (*strided.args[:3], [2, 2], *strided.args[4:]), {}, strided.outputs)
    assert op_class(strided) == "convolution_wide"
    gelu = OpCall(aten.gelu.default, (_t(8, 16),), {"approximate": "tanh"}, (_t(8, 16),))
    assert op_class(gelu) == "gelu_tanh"
    assert op_class(OpCall(aten.gelu.default, (_t(8, 16),), {}, (_t(8, 16),))) == "gelu"


def test_class_efficiency_looks_up_phase_then_class_then_name():
    spec = dataclasses.replace(load_system("cpu"), op_efficiency={
        "convolution": 0.5, "convolution_depthwise": 0.1, "convolution_depthwise:bwd": 0.05})
    assert efficiency.class_efficiency(spec, "convolution_depthwise", "convolution", "fp32", "bwd") == 0.05
    assert efficiency.class_efficiency(spec, "convolution_depthwise", "convolution", "fp32", "fwd") == 0.1
    assert efficiency.class_efficiency(spec, "convolution_wide", "convolution", "fp32", "fwd") == 0.5
    assert efficiency.class_efficiency(spec, "relu", "relu", "fp32", "fwd") == 1.0
    # a calibration from before the 1x1 class existed: its 1x1 convolutions read as convolution_wide, as then
    old = dataclasses.replace(spec, op_efficiency={"convolution": 0.5, "convolution_wide": 0.9})
    assert efficiency.class_efficiency(old, "convolution_1x1", "convolution", "fp32", "fwd") == 0.9


def test_fixed_cost_is_the_class_entry_or_the_name_for_its_own_class():
    fixed = {"convolution": 70 * US}
    assert host._fixed_cost(fixed, "convolution", "convolution") == 70 * US
    assert host._fixed_cost(fixed, "convolution", "convolution_wide") == 0.0  # priced in its class's efficiency
    assert host._fixed_cost({**fixed, "convolution_wide": 5 * US}, "convolution", "convolution_wide") == 5 * US


def test_rng_is_generator_work_per_element():
    # dropout's mask on a CPU: empty_like(x).bernoulli_(0.9): 16 nominal FLOPs and one 4-byte write per element
    c = cost_of(OpCall(aten.bernoulli_.float, (_t(1000, grad=False), 0.9), {}, (_t(1000, grad=False),))).cost
    assert (c.fwd.flops, c.fwd.bytes, c.fwd.kernels) == (16 * 1000, 4000, 1) and c.bwd.bytes == 0
    assert F.dropout(1000).fwd.flops == 2 * 1000  # the fused kernel: the scaling's FLOPs only


def test_embedding_backward_writes_the_dense_gradient_and_prices_each_index():
    # 512 tokens of a 4000 x 128 table: bwd zeroes 4000 x 128 (x2: write-allocate), adds 512 rows (3 streams
    # each), reads 512 int64 indices; 512 rows for the per-index price
    c = F.embedding(512, 128, 4000)
    assert c.bwd.bytes == (3 * 512 * 128 + 2 * 4000 * 128) * 4 + 512 * 8
    assert (c.fwd.rows, c.bwd.rows, c.bwd.kernels) == (512, 512, 2)
    bag = F.embedding_bag(2048, 256, 32, 50000)  # 2048 indices in 256 bags
    assert bag.bwd.bytes == (3 * 2048 * 32 + 256 * 32 + 2 * 50000 * 32) * 4 + 2 * (2048 + 256) * 8
    assert bag.fwd.flops == 2048 * 32 and bag.bwd.rows == 2048


def test_convolution_rows_are_its_weight_elements():
    c = F.conv(4, 64, 64, 9, 256, 256)
    assert c.fwd.rows == 64 * 64 * 9 and c.bwd.rows == 64 * 64 * 9
    assert F.conv(4, 64, 64, 9, 256, 256, x_grad=False, w_grad=False).bwd.rows == 0
    # the 1x1 matrix-product path reorders no weight: no rows (aten_costs decides it by op_class's rule)
    assert F.conv(4, 64, 64, 1, 256, 256, reorder=False).fwd.rows == 0
    one = cost_of(_conv(_t(4, 16, 1, 1), _t(8, 16, 1, 1))).cost
    assert (one.fwd.rows, one.bwd.rows) == (0, 0)
    assert cost_of(_conv(_t(16, 16, 1, 1), _t(8, 16, 1, 1))).cost.fwd.rows == 8 * 16  # batch 16: oneDNN


def test_tied_weights_add_their_gradients_once_per_extra_owner():
    e = torch.nn.Embedding(100, 8)
    lin = torch.nn.Linear(8, 100, bias=False)
    lin.weight = e.weight
    model = torch.nn.Sequential(e, lin)
    spec = load_system("cpu")
    tied = host.tied_gradient_s(dict(model.named_modules()), spec)
    # one extra owner: read two 800-element gradients, write one: 3 x 800 x 4 bytes at the memory ceiling
    assert tied == {"0": pytest.approx(3 * 800 * 4 / (spec.mem_bandwidth_bytes_per_s * spec.efficiency["memory"]))}
    pred = perfcheck.estimate(model, (torch.randint(0, 100, (4,)),), system=spec).set_index("module")
    untied = torch.nn.Sequential(torch.nn.Embedding(100, 8), torch.nn.Linear(8, 100, bias=False))
    base = perfcheck.estimate(untied, (torch.randint(0, 100, (4,)),), system=spec).set_index("module")
    assert pred.loc["0", "pred_bwd_s"] - base.loc["0", "pred_bwd_s"] == pytest.approx(tied["0"], rel=1e-6)


def test_op_class_cases_are_rows_the_fits_read():
    from perfcheck.calibrate.index_cases import index_cases
    from perfcheck.calibrate.op_classes import op_class_cases

    cases = op_class_cases("cpu") + index_cases("cpu")
    labels = {c.label for c in cases}
    assert {"convolution_depthwise", "convolution_depthwise:bwd", "bernoulli_", "gelu_tanh:bwd"} <= labels
    assert {"embedding bwd", "_embedding_bag bwd", "convolution bwd"} <= labels
    for c in cases:
        assert c.kind == "classfixed" or (c.kind in ("opeff", "oprows", "oprate") and (c.flops > 0 or c.bytes > 0 or c.shape[2] > 0))
        c.fn()  # each runs


def test_class_backward_fixed_cost_is_its_measured_call_per_gradient():
    # a tiny depthwise backward (both gradients) measured 130 us: both gradients pay it, a first layer's (weight
    # only) half, a third (bias) kernel no more; without a :bwd entry the forward's 90 us per forward kernel x 2
    fixed = {"convolution_depthwise": 90 * US, "convolution_depthwise:bwd": 130 * US}
    assert host._fixed_bwd(fixed, "convolution_depthwise", 90 * US, 2, 1) == pytest.approx(130 * US)
    assert host._fixed_bwd(fixed, "convolution_depthwise", 90 * US, 1, 1) == pytest.approx(65 * US)
    assert host._fixed_bwd(fixed, "convolution_depthwise", 90 * US, 3, 1) == pytest.approx(130 * US)
    assert host._fixed_bwd(fixed, "convolution_wide", 90 * US, 2, 1) == pytest.approx(180 * US)
    assert host._fixed_bwd(fixed, "convolution_depthwise", 90 * US, 0, 1) == 0.0


def test_class_fixed_case_is_taken_out_before_the_class_efficiency():
    # classfixed row: 90 us (nothing subtracted: no dispatch rows) -> op_fixed_s; the class's mid-size opeff row
    # took 90 us + 4 x its roofline -> efficiency 0.25, not roofline / (90 us + 4 x roofline)
    import pandas as pd

    from perfcheck.calibrate import fit

    base = load_system("cpu")
    roof, _ = roofline.op_time_s(2e6, 0.0, 1e5, 1.0, base, "fp32", launch_s=0.0)
    table = pd.DataFrame({"kind": ["classfixed", "opeff", "classfixed", "opeff"],
                          "label": ["convolution_depthwise", "convolution_depthwise"] * 1
                          + ["convolution_depthwise:bwd", "convolution_depthwise:bwd"],
                          "dtype": ["fp32"] * 4, "flops": [0.0, 2e6, 0.0, 2e6], "bytes": [0.0, 1e5, 0.0, 1e5],
                          "n": [0.0] * 4,
                          "seconds": [90 * US, 90 * US + 4 * float(roof), 130 * US, 130 * US + 2 * float(roof)]})
    out = fit.build_spec(base, table, peaks="base", stamp="test")
    assert out.op_fixed_s["convolution_depthwise"] == pytest.approx(90 * US)
    assert out.op_fixed_s["convolution_depthwise:bwd"] == pytest.approx(130 * US)
    assert out.op_efficiency["convolution_depthwise"] == pytest.approx(0.25)
    assert out.op_efficiency["convolution_depthwise:bwd"] == pytest.approx(0.5)

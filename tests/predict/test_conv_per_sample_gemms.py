"""A 1x1 convolution torch runs on a CPU thread as one GEMM per sample (slow_conv2d), priced as those GEMMs:
the premise against torch itself (its backend choice, the profiler's op list), the cost against hand arithmetic,
the roofline against hand arithmetic on hand-made curves."""
import dataclasses
import math

import pandas as pd
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from perfcheck.hardware.systems import load_system
from perfcheck.predict import formulas as F
from perfcheck.predict import roofline
from perfcheck.predict.aten_costs import OpCall, TensorMeta, cost_of, is_matmul_path_conv, matmul_path_min_dim

aten = torch.ops.aten


@pytest.fixture
def one_thread():
    """torch's rule holds on one intra-op thread (ConvParams::use_mkldnn: oneDNN for a 1x1 when multi-threaded)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _t(*shape):
    return TensorMeta(tuple(shape), 4, True, True)


def _call(x, w, stride=1):
    n = len(x.shape) - 2
    out = _t(x.shape[0], w.shape[0], *[(s - 1) // stride + 1 for s in x.shape[2:]])
    return OpCall(aten.convolution.default, (x, w, None, [stride] * n, [0] * n, [1] * n, False, [0] * n, 1), {},
                  (out,))


@pytest.mark.parametrize("batch,stride,matmul_path", [(4, 1, True), (16, 1, False), (4, 2, False)])
def test_the_matmul_path_is_the_backend_torch_selects(batch, stride, matmul_path, one_thread):
    x = torch.randn(batch, 96, 3, 3, requires_grad=True)
    w = torch.randn(576, 96, 1, 1, requires_grad=True)
    backend = torch._C._select_conv_backend(x, w, None, [stride] * 2, [0, 0], [1, 1], False, [0, 0], 1, None)
    assert (str(backend).split(".")[-1] == "Slow2d") == matmul_path
    assert is_matmul_path_conv(_call(_t(batch, 96, 3, 3), _t(576, 96, 1, 1), stride)) == matmul_path


def test_its_forward_and_backward_are_slow_conv2d_in_the_profiler(one_thread):
    m = torch.nn.Conv2d(96, 576, 1, bias=False)
    x = torch.randn(4, 96, 3, 3, requires_grad=True)
    m(x).sum().backward()
    with profile(activities=[ProfilerActivity.CPU]) as p:
        m(x).sum().backward()
    names = {e.name for e in p.events()}
    assert {"aten::_slow_conv2d_forward", "aten::_slow_conv2d_backward"} <= names
    assert "aten::mkldnn_convolution" not in names


def test_per_sample_cost_hand_arithmetic():
    # 4 samples of 3x3 pixels, 576 -> 96 channels: each sample (9 x 576) @ (576 x 96)
    c = F.conv(4, 576, 96, 1, 9, 9, reorder=False, per_sample=True)
    macs = 4 * 9 * 576 * 96
    x, w, y = 4 * 576 * 9, 96 * 576, 4 * 96 * 9
    assert (c.fwd.macs, c.fwd.gemms, c.fwd.kernels, c.fwd.rows) == (macs, 4, 1, 0)
    assert c.fwd.bytes == (x + 4 * w + y) * 4  # the weight read once per sample
    # backward: grad_input (4 GEMMs, weight read 4 times) + grad_weight (4 GEMMs accumulating: written once,
    # read and written 3 more times)
    assert (c.bwd.macs, c.bwd.gemms, c.bwd.kernels) == (2 * macs, 8, 2)
    assert c.bwd.bytes == ((y + 4 * w + x) + (y + x + 7 * w)) * 4
    # the oneDNN path: one kernel per GEMM phase, the weight once, its reorder's rows
    d = F.conv(4, 576, 96, 1, 9, 9)
    assert (d.fwd.gemms, d.bwd.gemms, d.fwd.bytes, d.fwd.rows) == (0, 0, (x + w + y) * 4, w)


def test_the_traced_call_carries_per_sample_gemms_and_their_smallest_dimension():
    one = _call(_t(4, 96, 3, 3), _t(576, 96, 1, 1))
    cost = cost_of(one).cost
    assert (cost.fwd.gemms, cost.bwd.gemms) == (4, 8)
    assert matmul_path_min_dim(one) == 9  # min(3 x 3 pixels, 96, 576)
    dense = _call(_t(4, 64, 8, 8), _t(64, 64, 1, 1), stride=2)
    assert cost_of(dense).cost.fwd.gemms == 0 and math.isnan(matmul_path_min_dim(dense))


def _spec(kind):
    base = load_system("cpu")
    eff = dict(base.efficiency, matrix=1.0)
    return dataclasses.replace(base, kind=kind, efficiency=eff,
                               matrix_efficiency_curve=((1e5, 0.25), (1e7, 1.0)),
                               matrix_shape_curve=((8.0, 0.5), (128.0, 1.0)), mem_bandwidth_curve=None,
                               op_efficiency={"convolution_1x1": 0.1})


def _ops(gemms):
    return pd.DataFrame([{"name": "convolution", "op_class": "convolution_1x1", "macs_fwd": 2e5, "other_fwd": 0.0,
                          "bytes_fwd": 0.0, "kernels_fwd": 1.0, "macs_bwd": 4e5, "other_bwd": 0.0, "bytes_bwd": 0.0,
                          "kernels_bwd": 2.0, "min_dim": 8.0, "gemms_fwd": gemms, "gemms_bwd": 2 * gemms}])


def test_cpu_prices_each_per_sample_gemm_on_the_matrix_curves_without_the_class_efficiency():
    spec = _spec("cpu")
    peak = spec.matrix_peak("fp32")
    t = roofline.op_device_times(_ops(4.0), spec, "fp32", launch_s=0.0)
    # 4e5 FLOPs as 4 GEMMs of 1e5: the curve's 0.25 there, the shape curve's 0.5 at min_dim 8, no class 0.1
    assert t["t_fwd"].iloc[0] == pytest.approx(4e5 / (peak * 0.25 * 0.5))
    assert t["t_bwd"].iloc[0] == pytest.approx(8e5 / (peak * 0.25 * 0.5))  # 8 GEMMs of 1e5


def test_a_gpu_spec_keeps_one_kernel_and_the_class_efficiency():
    spec = _spec("gpu")
    peak = spec.matrix_peak("fp32")
    t = roofline.op_device_times(_ops(4.0), spec, "fp32", launch_s=0.0)
    # one kernel of 4e5 FLOPs: 0.25 + 0.75 * log(4e5 / 1e5) / log(1e7 / 1e5); no shape factor; the class's 0.1
    eff = 0.25 + 0.75 * math.log(4.0) / math.log(100.0)
    assert t["t_fwd"].iloc[0] == pytest.approx(4e5 / (peak * eff) / 0.1)


def test_a_convolution_class_pays_its_evicted_call_excess_instead_of_op_cold():
    # tiny 1x1 call: 10 us in a loop, 60 us right after the eviction (backward 30 / 100 us); op_cold_s 11 us
    us = 1e-6
    base = load_system("cpu")
    spec = dataclasses.replace(base, host={**dict(base.host), "op_cold_s": 11 * us},
                               op_fixed_s={"convolution_1x1": 10 * us, "convolution_1x1:bwd": 30 * us})
    evicted = dataclasses.replace(spec, op_fixed_s={**spec.op_fixed_s, "convolution_1x1 after eviction": 60 * us,
                                                    "convolution_1x1:bwd after eviction": 100 * us})
    m = torch.nn.Conv2d(16, 8, 1, bias=False)
    x = torch.randn(4, 16, 1, 1, requires_grad=True)
    import perfcheck

    a = perfcheck.estimate(m, (x,), system=spec).set_index("module").loc["(root)"]
    b = perfcheck.estimate(m, (x,), system=evicted).set_index("module").loc["(root)"]
    # the convolution is the step's one computing op: it pays the cold cost once each way, 50 - 11 and 70 - 11 us more
    assert b["host_fwd_s"] - a["host_fwd_s"] == pytest.approx((60 - 10 - 11) * us)
    assert b["host_bwd_s"] - a["host_bwd_s"] == pytest.approx((100 - 30 - 11) * us)


def test_the_calibration_times_each_convolution_class_also_after_an_eviction():
    from perfcheck.calibrate.cases import l2_cache_bytes
    from perfcheck.calibrate.op_classes import CONV_FIXED_CASES, conv_fixed_cases

    cases = {c.label: c for c in conv_fixed_cases("cpu")}
    for label in CONV_FIXED_CASES:
        assert cases[label].between is None and cases[f"{label}:bwd"].between is None
        if l2_cache_bytes() > 0:
            assert cases[f"{label} after eviction"].between is not None
            assert cases[f"{label}:bwd after eviction"].between is not None

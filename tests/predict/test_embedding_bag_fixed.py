"""EmbeddingBag's fixed cost per call: its classes by mode (aten_costs.embedding_bag_class), the calibration cases
that measure them (index_cases.embedding_bag_fixed_cases, layers.tiny_modules' EmbeddingBag), the fit, and the
estimator charging them, each against hand arithmetic on planted numbers."""
import dataclasses

import pandas as pd
import pytest
import torch

import perfcheck
from perfcheck.calibrate import fit
from perfcheck.calibrate.layers import tiny_modules
from perfcheck.calibrate.index_cases import EMBEDDING_BAG_FIXED_CASES, embedding_bag_fixed_cases
from perfcheck.hardware.systems import load_system
from perfcheck.predict.aten_costs import OpCall, TensorMeta, op_class

aten = torch.ops.aten
US = 1e-6


def _bag_call(mode, name=aten._embedding_bag.default):
    w, idx, offs = TensorMeta((16, 4), 4, True, True), TensorMeta((8,), 8, False, False), TensorMeta((2,), 8, False,
                                                                                                         False)
    return OpCall(name, (w, idx, offs, False, mode), {}, (TensorMeta((2, 4), 4, True, True),))


def test_embedding_bag_class_by_mode():
    assert op_class(_bag_call(0)) == "_embedding_bag"
    assert op_class(_bag_call(1)) == "_embedding_bag_mean"
    assert op_class(_bag_call(2)) == "_embedding_bag_max"  # its own scalar loop (test_embedding_bag_max.py)
    assert op_class(_bag_call(1, aten._embedding_bag_forward_only.default)) == "_embedding_bag_mean"


def test_fixed_cases_are_one_aten_call_each_labelled_by_class():
    cases = embedding_bag_fixed_cases(torch.device("cpu"))
    assert {c.label for c in cases} == {f"{k}{s}" for k in EMBEDDING_BAG_FIXED_CASES for s in ("", ":bwd")}
    for c in cases:
        assert c.kind == "classfixed"
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            c.fn()
        top = [e.name for e in prof.events() if e.cpu_parent is None]
        assert top == (["aten::_embedding_bag_backward"] if c.label.endswith(":bwd") else ["aten::_embedding_bag"])
    # the mode each case runs is the one its label's class is for
    for label, mode in EMBEDDING_BAG_FIXED_CASES.items():
        assert op_class(_bag_call(mode)) == label


def test_fit_keeps_each_tiny_call_as_its_class_fixed_cost():
    # no dispatch rows: nothing subtracted (as the convolution classes' fit test); each row's seconds -> op_fixed_s
    table = pd.DataFrame({"kind": ["classfixed"] * 4,
                          "label": ["_embedding_bag", "_embedding_bag:bwd", "_embedding_bag_mean",
                                    "_embedding_bag_mean:bwd"],
                          "dtype": ["fp32"] * 4, "flops": [0.0] * 4, "bytes": [0.0] * 4, "n": [0.0] * 4,
                          "seconds": [11 * US, 17 * US, 19 * US, 12 * US]})
    out = fit.build_spec(load_system("cpu"), table, peaks="base", stamp="test")
    assert out.op_fixed_s["_embedding_bag"] == pytest.approx(11 * US)
    assert out.op_fixed_s["_embedding_bag:bwd"] == pytest.approx(17 * US)
    assert out.op_fixed_s["_embedding_bag_mean"] == pytest.approx(19 * US)
    assert out.op_fixed_s["_embedding_bag_mean:bwd"] == pytest.approx(12 * US)


@pytest.mark.parametrize("mode,cls", [("sum", "_embedding_bag"), ("mean", "_embedding_bag_mean")])
def test_estimator_charges_the_class_fixed_cost_once_each_way(mode, cls):
    # an EmbeddingBag call is one _embedding_bag op: forward + 20 us of host time; its backward (3 kernels, the
    # weight's gradient) + 30 us (host._fixed_bwd: the :bwd entry x min(3, 2) / 2 = x 1); the other class's
    # entries change nothing
    base = load_system("cpu")
    m = torch.nn.EmbeddingBag(1000, 32, mode=mode)
    x = (torch.randint(0, 1000, (64,)), torch.arange(0, 64, 4))
    other = "_embedding_bag_mean" if cls == "_embedding_bag" else "_embedding_bag"
    planted = dataclasses.replace(base, op_fixed_s={**dict(base.op_fixed_s or {}), cls: 20 * US,
                                                    f"{cls}:bwd": 30 * US, other: 500 * US, f"{other}:bwd": 500 * US})
    a = perfcheck.estimate(m, x, system=base).iloc[0]
    b = perfcheck.estimate(m, x, system=planted).iloc[0]
    assert b.pred_fwd_s - a.pred_fwd_s == pytest.approx(20 * US, rel=1e-6)
    assert b.pred_bwd_s - a.pred_bwd_s == pytest.approx(30 * US, rel=1e-6)


def test_embedding_bag_module_fixed_case_takes_indices_and_offsets():
    m, x = tiny_modules("cpu")["EmbeddingBag"]
    assert len(x) == 2 and not any(t.is_floating_point() for t in x)
    assert m(*x).shape == (2, 4) and m.mode == "mean"

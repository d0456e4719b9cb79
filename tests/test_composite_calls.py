"""Composite (CompositeImplicitAutograd) layers of functional calls: the trace sees them (checked against torch's
profiler, which records every dispatcher entry), the host model prices each at ``composite_dispatch_s`` (by
hand), and the calibration measures that price and takes it out of the per-op fixed costs of its cases."""
import dataclasses
import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import perfcheck
from perfcheck.hardware.calibrate.cases import composite_cases
from perfcheck.hardware.calibrate.fit import MEASUREMENT_COLUMNS, build_spec
from perfcheck.hardware.systems import host_constants, load_system
from perfcheck.predict.trace import composite_layers, is_composite, trace_model
from perfcheck.schema import ROOT

US = 1e-6
HUGE = 1e18


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _profiled_aten(fn, *args):
    """Every aten op the dispatcher entered while ``fn(*args)`` ran on real tensors (torch.profiler: RecordFunction
    at each dispatcher call, composite or not), in order."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(*args)
    return [e.name.split("::", 1)[1] for e in prof.events() if e.name.startswith("aten::")]


def test_cross_entropy_layers_match_the_profiler():
    x, t = torch.randn(8, 5, requires_grad=True), torch.randint(0, 5, (8,))
    profiled = _profiled_aten(F.cross_entropy, x, t)
    recorded = [op.call.name for op in trace_model(_Fn(F.cross_entropy), (x, t)).ops
                if op.call.func.namespace == "aten"]
    layers = composite_layers(F.cross_entropy, (x.detach(), t))
    # the profiler's dispatcher entries are the trace's kernels plus the composite layers, in order
    assert [n for n in profiled if n not in recorded] == list(layers)
    assert {"cross_entropy_loss", "log_softmax", "nll_loss_nd", "nll_loss"} <= set(layers)
    assert "_log_softmax" in recorded and "nll_loss_forward" in recorded
    # each one a composite op by the dispatcher's own table; the kernels are not
    assert all(is_composite(getattr(torch.ops.aten, n).default if n != "log_softmax" else torch.ops.aten.log_softmax.int)
               for n in layers if n != "to")
    assert not is_composite(torch.ops.aten._log_softmax.default)


def test_the_trace_puts_each_calls_layers_on_its_first_op():
    x, t = torch.randn(8, 16, requires_grad=True), torch.randint(0, 5, (8,))
    lin = torch.nn.Linear(16, 5)
    trace = trace_model(_Fn(lambda a, b: F.cross_entropy(torch.relu(lin(a)), b)), (x, t))
    ops = [(op.call.name, op.composite) for op in trace.ops if op.call.func.namespace == "aten"]
    ce = len(composite_layers(F.cross_entropy, (torch.randn(8, 5), t)))
    # F.linear: aten::linear (1 layer) before t + addmm; relu none; F.cross_entropy: its layers before _log_softmax
    assert ops == [("t", 1), ("addmm", 0), ("relu", 0), ("_log_softmax", ce), ("nll_loss_forward", 0)]
    # a call that reaches no composite op, and a plain builtin, are not run twice
    assert composite_layers(torch.relu, (torch.randn(2),)) == ()
    assert composite_layers(torch.add, (torch.randn(2), torch.randn(2))) == ()


def _spec(**host_values):
    base = load_system("cpu")
    values = {k: 0.0 for k in host_constants(base)}
    values.update(host_values)
    return dataclasses.replace(base, host=values, matrix_flops_per_s={d: HUGE for d in base.matrix_flops_per_s},
                               vector_flops_per_s={d: HUGE for d in base.vector_flops_per_s},
                               mem_bandwidth_bytes_per_s=HUGE, matrix_efficiency_curve=(), mem_bandwidth_curve=(),
                               op_row_s={"_log_softmax": {"fwd": 0.0, "bwd": 0.0},
                                         "nll_loss_forward": {"fwd": 0.0, "bwd": 0.0}})


def test_host_model_prices_each_layer():
    # composite_dispatch_s 1 us, dispatch 2 us, nothing else: F.cross_entropy's forward is its 2 kernels' dispatch
    # (4 us) + its layers x 1 us; nn.Linear(16, 5): t's view dispatch 0 + addmm 2 us + aten::linear's 1 us;
    # backward does not see the layers (they make no autograd node)
    spec = _spec(composite_dispatch_s=1 * US, op_dispatch_s=2 * US)
    zero = _spec(op_dispatch_s=2 * US)
    x, t = torch.randn(8, 5, requires_grad=True), torch.randint(0, 5, (8,))
    layers = len(composite_layers(F.cross_entropy, (x.detach(), t)))
    root = perfcheck.estimate(_Fn(F.cross_entropy), (x, t), system=spec).set_index("module").loc[ROOT]
    base = perfcheck.estimate(_Fn(F.cross_entropy), (x, t), system=zero).set_index("module").loc[ROOT]
    assert root["pred_fwd_s"] == pytest.approx((4 + layers) * US, rel=1e-6)
    assert root["pred_fwd_s"] - base["pred_fwd_s"] == pytest.approx(layers * US, rel=1e-6)
    assert root["pred_bwd_s"] == pytest.approx(base["pred_bwd_s"], rel=1e-9)
    lin = torch.nn.Linear(16, 5)
    xl = torch.randn(8, 16)
    a = perfcheck.estimate(lin, (xl,), system=spec).set_index("module").loc[ROOT]["pred_fwd_s"]
    b = perfcheck.estimate(lin, (xl,), system=zero).set_index("module").loc[ROOT]["pred_fwd_s"]
    assert a - b == pytest.approx(1 * US, rel=1e-6)


def _row(kind, label, seconds):
    return {"kind": kind, "label": label, "dtype": "fp32", "m": 0, "k": 0, "n": 0, "flops": 0.0, "bytes": 0.0,
            "world_size": 1, "seconds": seconds, "seconds_min": seconds, "seconds_max": seconds, "repeats": 3,
            "iters": 1, "flops_per_s": math.nan, "bytes_per_s": math.nan, "busbw_bytes_per_s": math.nan}


def test_calibration_measures_a_layer_and_takes_it_out_of_the_fixed_costs():
    # composite softmax 3.5 us, leaf _softmax 3.2 us -> 0.3 us per layer; op_fixed "_log_softmax" (F.log_softmax:
    # one layer, log_softmax.int, then _log_softmax) 4 + 2 us, one plain tiny op 4 us -> 2 - 0.3 = 1.7 us;
    # "mm" (torch.mm: no layer) 4 + 1 us -> 1 us
    rows = [_row("launch", "op", 4 * US), _row("composite", "composite softmax", 3.5 * US),
            _row("composite", "leaf _softmax", 3.2 * US), _row("opfixed", "_log_softmax", 6 * US),
            _row("opfixed", "mm", 5 * US)]
    spec = build_spec("cpu", pd.DataFrame(rows, columns=list(MEASUREMENT_COLUMNS)), peaks="measured", stamp="test")
    assert spec.host["composite_dispatch_s"] == pytest.approx(0.3 * US)
    assert spec.op_fixed_s["_log_softmax"] == pytest.approx(1.7 * US)
    assert spec.op_fixed_s["mm"] == pytest.approx(1 * US)
    assert "less torch._softmax" in spec.sources["host.composite_dispatch_s"]
    cases = composite_cases("cpu")
    assert [c.label for c in cases] == ["composite softmax", "leaf _softmax"]
    assert all(c.fn().shape == (1,) for c in cases)

"""Issue 12, an op inside a step costs more than in calibration's tight loops: the host model's per-op cold
cost (``op_cold_s``), its calibration case (the op_fixed ops one after another), its fit (the round-robin's
time per op less the same ops' tight loops), and where the estimator adds it (once per computing op and per
backward node whose family differs from the one before, never a view), by hand; a planted case (ops whose
switch costs a known busy-wait); and the convolution's fixed cost measured on the path a training batch takes."""
import time

import pandas as pd
import pytest
import torch

import perfcheck
from perfcheck.calibrate import fit, fit_cold, op_cases
from perfcheck.calibrate.cases import Case, Timer, run_cases
from perfcheck.hardware.systems import host_constants, host_source, load_system
from _host_only_specs import cpu_spec_with_host as _spec  # the cpu spec, every host constant 0 but the ones given

US = 1e-6


def _row(kind, label, seconds):
    return {"kind": kind, "label": label, "dtype": "fp32", "m": 0, "k": 0, "n": 0, "flops": 0.0, "bytes": 0.0,
            "world_size": 1, "seconds": seconds}


# ---------------------------------------------------------------------------- the fit, by hand
def test_cold_excess_is_round_robin_per_op_less_the_tight_loops_mean():
    # tight loops of 3 ops: 4, 6 and 8 us (mean 6); the three one after another: 16 us per op -> 10 us each
    table = pd.DataFrame([_row("opfixed", "a", 4 * US), _row("opfixed", "b", 6 * US), _row("opfixed", "c", 8 * US),
                          _row("opcold", "round-robin x3", 16 * US)])
    cold, n, rr, tight = fit_cold.op_cold_excess(table)
    assert (n, rr, tight) == (3, pytest.approx(16 * US), pytest.approx(6 * US))
    assert cold == pytest.approx(10 * US)
    # faster in a round-robin than in loops is noise, not a negative cost: floored at 0
    faster = table.assign(seconds=[4 * US, 6 * US, 8 * US, 5 * US])
    assert fit_cold.op_cold_excess(faster)[0] == 0.0
    # another set of ops than the tight loops (a table from another version): no matched subtraction
    assert fit_cold.op_cold_excess(table.iloc[1:]) is None
    assert fit_cold.op_cold_excess(table.iloc[:3]) is None


def test_build_spec_keeps_the_measured_cold_cost_with_its_source():
    rows = [_row("launch", "op", 4 * US), _row("host", "view", 2 * US), _row("host", "module call", 3 * US),
            _row("opfixed", "a", 5 * US), _row("opfixed", "b", 7 * US), _row("opcold", "round-robin x2", 15 * US)]
    spec = fit.build_spec("cpu", pd.DataFrame(rows), peaks="measured", stamp="test stamp")
    assert spec.host["op_cold_s"] == pytest.approx(9 * US)  # 15 - (5 + 7) / 2
    assert "test stamp" in host_source(spec, "op_cold_s") and "round-robin" not in spec.op_fixed_s
    # an uncalibrated CPU spec takes the default, with its source (measured, not a constant fitted to a model)
    cpu = load_system("cpu")
    assert host_constants(cpu)["op_cold_s"] > 0 and "op_fixed cases" in host_source(cpu, "op_cold_s")


def test_round_robin_case_calls_each_op_fixed_op_once_per_call():
    # the near round-robin and the two light cases: tests/predict/test_family_reuse.py
    case, after, _near, _light, _light_tight = op_cases.op_cold_cases("cpu")
    assert after.label == f"round-robin after filler x{case.per_call}" and after.between is not None
    assert case.between is None
    ops = op_cases.tiny_ops(torch.device("cpu"))
    assert case.kind == "opcold" and case.per_call == len(ops) and case.label == f"round-robin x{len(ops)}"
    seen = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        case.fn()
    seen = {e.key for e in prof.key_averages()}
    for name in ("aten::addmm", "aten::mm", "aten::bmm", "aten::relu", "aten::gelu", "aten::embedding"):
        assert name in seen


# ---------------------------------------------------------------------------- where the estimator adds it
def test_switches_by_hand():
    from perfcheck.predict.host import op_switches

    names = ["convolution", "relu", "t", "addmm", "addmm", "relu", "relu", "view"]
    view = [False, False, True, False, False, False, False, True]
    fwd, bwd = op_switches(names, view)
    # forward: conv (first) 1, relu 1, t view 0, addmm after relu 1, addmm after addmm 0, relu 1, relu 0, view 0
    assert list(fwd) == [1, 1, 0, 1, 0, 1, 0, 0]
    # backward runs in reverse: a node pays where the next computing op in forward order is another family
    # (its predecessor in backward); the last computing op's node is backward's first: 1
    assert list(bwd) == [1, 1, 0, 0, 1, 0, 1, 0]
    assert [list(a) for a in op_switches([], [])] == [[], []]


def test_cold_cost_per_op_family_switch_not_per_view_or_repeat():
    X = 7 * US
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.ReLU())
    x = (torch.randn(2, 4),)
    warm = perfcheck.estimate(model, x, system=_spec(op_dispatch_s=1 * US)).set_index("module")
    cold = perfcheck.estimate(model, x, system=_spec(op_dispatch_s=1 * US, op_cold_s=X)).set_index("module")
    d_fwd = (cold["host_fwd_s"] - warm["host_fwd_s"]) / X
    d_bwd = (cold["host_bwd_s"] - warm["host_bwd_s"]) / X
    # forward: Linear records t (a view: 0) and addmm (first computing op: 1); ReLU 1 follows addmm (1),
    # ReLU 2 follows a relu (0): 2 in all
    assert d_fwd["0"] == pytest.approx(1) and d_fwd["1"] == pytest.approx(1) and d_fwd["2"] == pytest.approx(0)
    assert d_fwd["(root)"] == pytest.approx(2)
    # backward: ReLU 2's node first (1), ReLU 1's repeats it (0), addmm's node once for its 2 kernels (1), t (0)
    assert d_bwd["2"] == pytest.approx(1) and d_bwd["1"] == pytest.approx(0) and d_bwd["0"] == pytest.approx(1)
    assert d_bwd["(root)"] == pytest.approx(2)
    # on a CPU host and device add: the predicted times grow by the same
    assert (cold["pred_fwd_s"] - warm["pred_fwd_s"])["(root)"] == pytest.approx(2 * X)


def test_module_fixed_fit_does_not_subtract_the_cold_cost():
    """The module cases are tight loops: their fit estimates them without the step's cold cost, so a larger
    op_cold_s does not eat a layer's measured Python (module_fixed_s)."""
    rows = [_row("launch", "op", 4 * US), _row("host", "module call", 3 * US), _row("modfixed", "BatchNorm1d", 90 * US)]
    base = [_row("opfixed", "a", 5 * US), _row("opfixed", "b", 5 * US)]
    lo = fit.build_spec("cpu", pd.DataFrame(rows + base + [_row("opcold", "round-robin x2", 6 * US)]),
                        peaks="measured", stamp="t")
    hi = fit.build_spec("cpu", pd.DataFrame(rows + base + [_row("opcold", "round-robin x2", 30 * US)]),
                        peaks="measured", stamp="t")
    assert hi.host["op_cold_s"] == pytest.approx(25 * US) and lo.host["op_cold_s"] == pytest.approx(1 * US)
    assert hi.module_fixed_s["BatchNorm1d"] == pytest.approx(lo.module_fixed_s["BatchNorm1d"])
    assert hi.module_fixed_s["BatchNorm1d"] > 0


# ---------------------------------------------------------------------------- a planted switch cost
def _busy(seconds):
    """Spin for ``seconds`` of this process's CPU time (the planted cost holds on a loaded machine too)."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_planted_switch_cost_is_measured_by_the_round_robin():
    """Two "ops" of 60 us each that cost 100 us more whenever the op before was the other one (a planted cold
    start): their tight loops read 60 us, the round-robin 160 us per op, so the fit gives 100 us."""
    last = [None]

    def op(name):
        def fn():
            _busy((60 + (100 if last[0] not in (None, name) else 0)) * US)
            last[0] = name
        return fn
    a, b = op("a"), op("b")

    def round_robin():
        a()
        b()
    planted = [Case("opfixed", "a", a, "fp32"), Case("opfixed", "b", b, "fp32"),
               Case("opcold", "round-robin x2", round_robin, "fp32", per_call=2)]

    def reset():
        last[0] = None
    for c in planted[:2]:
        c.setup = reset  # each tight loop starts without a planted switch from the case before
    table = run_cases(planted, Timer(torch.device("cpu"), clock="process"), repeats=3, target_s=0.005)
    cold, n, rr, tight = fit_cold.op_cold_excess(table)
    assert n == 2 and tight == pytest.approx(60 * US, rel=0.3)
    assert cold == pytest.approx(100 * US, rel=0.3)


def test_convolution_fixed_cost_case_runs_a_batch_of_two():
    """A CPU convolution of batch 1 runs another kernel than batch >= 2 (10 vs 119 us for the tiny case on the
    project's VM): the op_fixed case and the Conv module cases use a batch of 2, the path of a training batch."""
    from perfcheck.calibrate.layers import tiny_modules

    conv = op_cases.tiny_ops(torch.device("cpu"))["convolution"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        conv()
    shapes = [e.input_shapes[0] for e in prof.key_averages(group_by_input_shape=True) if e.key == "aten::conv2d"]
    assert shapes and shapes[0][0] == 2
    mods = tiny_modules("cpu")
    assert mods["Conv2d"][1][0].shape[0] == 2 and mods["Conv1d"][1][0].shape[0] == 2

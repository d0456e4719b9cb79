"""Per-row cost of row-wise ops (``op_row_s``): the estimator's arithmetic by hand on a 256x5 log_softmax and a
cross-entropy, no row term for ops that are not row-wise, the spec field's validation and round trip, the
calibration fit (slope over rows less the roofline's slope, median over row lengths) on hand-made timings,
and the calibration cases costing each call through the estimator's own op path."""
import dataclasses
import math

import pandas as pd
import pytest
import torch

import perfcheck
from perfcheck.errors import UserError
from perfcheck.calibrate.op_cases import ROW_COUNTS, row_cases, row_lengths, row_op_cost
from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS, build_spec
from perfcheck.hardware.systems import SystemSpec, load_system
from perfcheck.predict import roofline
from perfcheck.predict.aten_costs import OpCall, TensorMeta, cost_of
from _host_only_specs import Fn, host_only_spec, root_row

US, NS = 1e-6, 1e-9




def test_log_softmax_256x5_is_rows_times_the_price_plus_its_fixed_costs():
    # fwd: dispatch 2 + autograd node 1 + op_fixed 3 + 256 rows x 100 ns = 6 + 25.6 = 31.6 us
    # bwd: backward node 0.5 + one backward kernel's dispatch 2 + op_fixed x 1/1 kernels 3 + 256 x 60 ns
    #      = 5.5 + 15.36 = 20.86 us
    spec = host_only_spec({"_log_softmax": {"fwd": 100 * NS, "bwd": 60 * NS}}, op_dispatch_s=2 * US, autograd_node_s=1 * US,
                 backward_node_s=0.5 * US)
    spec = dataclasses.replace(spec, op_fixed_s={"_log_softmax": 3 * US})
    x = torch.randn(256, 5, requires_grad=True)
    root = root_row(perfcheck.estimate(Fn(lambda t: torch.nn.functional.log_softmax(t, 1)), (x,), system=spec))
    assert root["pred_fwd_s"] == pytest.approx(31.6 * US, rel=1e-6)
    assert root["pred_bwd_s"] == pytest.approx(20.86 * US, rel=1e-6)
    # the row term is device work (the kernel's), not host work: host columns keep 6 and 5.5 us
    assert root["host_fwd_s"] == pytest.approx(6 * US) and root["host_bwd_s"] == pytest.approx(5.5 * US)


def test_cross_entropy_prices_log_softmax_and_nll_loss_rows():
    # F.cross_entropy = _log_softmax + nll_loss_forward, 256 rows each; only the row terms differ between the specs:
    # fwd 256 x (100 + 10) ns = 28.16 us, bwd 256 x (60 + 20) ns = 20.48 us
    prices = {"_log_softmax": {"fwd": 100 * NS, "bwd": 60 * NS}, "nll_loss_forward": {"fwd": 10 * NS, "bwd": 20 * NS}}
    x, y = torch.randn(256, 5, requires_grad=True), torch.randint(0, 5, (256,))
    model = Fn(lambda a, b: torch.nn.functional.cross_entropy(a, b))
    zero = {n: {"fwd": 0.0, "bwd": 0.0} for n in prices}  # the spec's own entries replace the defaults
    with_rows = root_row(perfcheck.estimate(model, (x, y), system=host_only_spec(prices, op_dispatch_s=1 * US)))
    without = root_row(perfcheck.estimate(model, (x, y), system=host_only_spec(zero, op_dispatch_s=1 * US)))
    assert with_rows["pred_fwd_s"] - without["pred_fwd_s"] == pytest.approx(28.16 * US, rel=1e-6)
    assert with_rows["pred_bwd_s"] - without["pred_bwd_s"] == pytest.approx(20.48 * US, rel=1e-6)


def test_ops_that_are_not_row_wise_get_no_row_term():
    # a price for every op name the model runs: only row-wise formulas carry rows, so nothing changes
    names = ("addmm", "mm", "relu", "add", "sum", "mul", "t", "native_batch_norm")
    prices = {n: {"fwd": 1.0, "bwd": 1.0} for n in names}
    model = torch.nn.Sequential(torch.nn.Linear(5, 5), torch.nn.ReLU())
    x = torch.randn(256, 5)
    a = root_row(perfcheck.estimate(model, (x,), system=host_only_spec(prices, op_dispatch_s=1 * US)))
    b = root_row(perfcheck.estimate(model, (x,), system=host_only_spec(None, op_dispatch_s=1 * US)))
    assert a["pred_fwd_s"] == b["pred_fwd_s"] and a["pred_bwd_s"] == b["pred_bwd_s"]
    # the formulas: rows only on row-wise ops (and on their backward only when the input needs a gradient)
    xm, w = TensorMeta((256, 5), 4, True, True), TensorMeta((5, 5), 4, True, True)
    aten = torch.ops.aten
    assert cost_of(OpCall(aten.mm.default, (xm, w), {}, (xm,))).cost.fwd.rows == 0
    assert cost_of(OpCall(aten.relu.default, (xm,), {}, (xm,))).cost.fwd.rows == 0
    sm = cost_of(OpCall(aten._softmax.default, (xm, 1, False), {}, (xm,))).cost
    assert (sm.fwd.rows, sm.bwd.rows) == (256, 256)
    plain = TensorMeta((256, 5), 4, False, True)
    assert cost_of(OpCall(aten._softmax.default, (plain, 1, False), {}, (plain,))).cost.bwd.rows == 0
    ln = row_op_cost("native_layer_norm", 96, 64)
    assert (ln.fwd.rows, ln.bwd.rows) == (96, 96)  # the weight-gradient kernel (column sums) adds no rows
    # an alias prices with its kernel's entry; an op without an entry costs nothing per row
    spec = host_only_spec({"_softmax": {"fwd": 7 * NS}})
    assert list(roofline.row_prices(spec, ["_safe_softmax", "_softmax", "relu"], "fwd")) == [7 * NS, 7 * NS, 0.0]
    assert list(roofline.row_prices(spec, ["_softmax"], "bwd")) == [0.0]


def test_defaults_price_rows_on_a_cpu_spec_without_its_own_table_and_none_on_a_gpu():
    from perfcheck.hardware.systems import row_costs

    cpu = row_costs(load_system("cpu"))
    assert set(cpu) == {"_log_softmax", "_softmax", "native_layer_norm", "nll_loss_forward"}
    assert all(0 <= v < 1 * US for phases in cpu.values() for v in phases.values())  # tens of ns, not us
    assert all(phases["fwd"] > 0 for phases in cpu.values())
    assert row_costs(load_system("h100-sxm")) == {}
    own = host_only_spec({"_softmax": {"fwd": 1 * NS}})
    assert row_costs(own)["_softmax"] == {"fwd": 1 * NS} and row_costs(own)["_log_softmax"] == cpu["_log_softmax"]
    from perfcheck.hardware.systems import _host_defaults

    assert "row_cases" in _host_defaults()["sources"]["cpu.op_row_s"]


def test_op_row_s_is_validated_and_round_trips():
    spec = host_only_spec({"_softmax": {"fwd": 84 * NS, "bwd": 28 * NS}})
    again = SystemSpec.from_dict(spec.to_json_dict())
    assert dict(again.op_row_s["_softmax"]) == {"fwd": 84 * NS, "bwd": 28 * NS} and again == spec
    assert "op_row_s" not in load_system("cpu").to_json_dict()  # absent when empty: older files unchanged
    with pytest.raises(UserError, match=r"op_row_s\._softmax\.fwd"):
        SystemSpec.from_dict({**spec.to_json_dict(), "op_row_s": {"_softmax": {"fwd": -1.0}}})
    with pytest.raises(UserError, match=r"op_row_s\._softmax has unknown phase 'back'"):
        SystemSpec.from_dict({**spec.to_json_dict(), "op_row_s": {"_softmax": {"back": 1.0}}})
    with pytest.raises(UserError, match=r"op_row_s\._softmax must be an object"):
        SystemSpec.from_dict({**spec.to_json_dict(), "op_row_s": {"_softmax": 1.0}})


def _row(kind, label, seconds, m=0, k=0, n=0, flops=0.0, nbytes=0.0):
    return {"kind": kind, "label": label, "dtype": "fp32", "m": m, "k": k, "n": n, "flops": flops, "bytes": nbytes,
            "world_size": 1, "seconds": seconds, "seconds_min": seconds, "seconds_max": seconds, "repeats": 3,
            "iters": 1, "flops_per_s": math.nan, "bytes_per_s": math.nan, "busbw_bytes_per_s": math.nan}


def test_fit_is_the_slope_over_rows_less_the_roofline_median_over_lengths():
    # _softmax fwd, no FLOPs or bytes (roofline 0): per length 4, 10, 16 the time is 5 us + rows x 50, 80, 200 ns:
    # slopes 50, 80, 200 ns -> fewer than the four lengths the by-length fit needs (tests/predict/test_row_length.py):
    # the median, 80 ns, prices every row alike. bwd: one length whose time falls with the rows -> floored at 0.
    # nll_loss fwd with 1 GB/s of "bytes" per call: 64 rows 4 us + 64 kB, 512 rows 4 us + 512 kB; at the
    # calibrated 10 GB/s copy rate the roofline slope is (512-64) kB / 10 GB/s / 448 rows = 100 ns; the measured
    # slope is 448 kB/1 GB/s / 448 = 1 us per row -> 900 ns per row left.
    rows = [_row("launch", "op", 4 * US), _row("copy", "copy 64 MiB", 2 * 2 ** 26 / 10e9, nbytes=2 * 2 ** 26)]
    for cols, per in zip((4, 10, 16), (50 * NS, 80 * NS, 200 * NS)):
        rows += [_row("oprows", "_softmax fwd", 5 * US + r * per, r, cols, 1) for r in (64, 512)]
    rows += [_row("oprows", "_softmax bwd", 9 * US - r * NS, r, 10, 1) for r in (64, 512)]
    rows += [_row("oprows", "nll_loss_forward fwd", 4 * US + r * 1e3 / 1e9, r, 10, 1, nbytes=r * 1e3)
             for r in (64, 512)]
    spec = build_spec("cpu", pd.DataFrame(rows, columns=list(MEASUREMENT_COLUMNS)), peaks="measured", stamp="test")
    assert spec.op_row_s["_softmax"]["fwd"] == pytest.approx(80 * NS)
    assert spec.op_row_s["_softmax"]["bwd"] == 0.0
    assert spec.op_row_s["nll_loss_forward"]["fwd"] == pytest.approx(900 * NS, rel=1e-6)
    assert set(spec.op_row_s["_softmax"]) == {"fwd", "bwd"}  # no by-length terms from three lengths
    assert "per row length 4, 10, 16" in spec.sources["op_row_s"]
    assert "op_row_s" not in build_spec("cpu", pd.DataFrame(rows[:2]), peaks="measured", stamp="t").to_json_dict()


def test_row_cases_cost_each_call_through_the_op_path():
    cases = row_cases("cpu")
    labels = {c.label for c in cases}
    assert labels == {f"{n} {p}" for n in ("_log_softmax", "_softmax", "native_layer_norm", "nll_loss_forward")
                      for p in ("fwd", "bwd")}
    assert {c.shape[:2] for c in cases if c.label == "_softmax fwd"} == {(r, k) for r in ROW_COUNTS
                                                                         for k in row_lengths()}
    width = row_lengths()[1]  # this machine's SIMD width in fp32 elements (8 on AVX2, 16 on AVX-512)
    case = next(c for c in cases if c.label == "_log_softmax bwd" and c.shape[:2] == (512, width))
    # the formula by hand: 4 FLOPs and 3 x 4 bytes per element of a 512 x width input (formulas.softmax backward)
    assert (case.flops, case.bytes, case.shape[2]) == (4 * 512 * width, 12 * 512 * width, 1)
    for c in cases[:4] + cases[-4:]:  # each call runs (the kernels the labels name, on tensors of that shape)
        c.fn()

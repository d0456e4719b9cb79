"""Per-row prices (``op_row_s``: an embedding's index, a convolution weight's element): the estimator's arithmetic
by hand on an nn.Embedding, no row term for ops without rows, the spec field's validation and round trip, the
calibration fit (slope over rows less the roofline's slope) on hand-made timings, and the op-class row cases
costing each call through the estimator's own op path."""
import math

import pandas as pd
import pytest
import torch

import perfcheck
from perfcheck.errors import UserError
from perfcheck.calibrate.op_cases import ROW_CASE_LENGTH
from perfcheck.calibrate.index_cases import EMBED_COUNTS, embedding_row_cases
from perfcheck.calibrate.op_classes import conv_weight_cases
from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS, build_spec
from perfcheck.hardware.systems import SystemSpec, load_system, row_costs
from perfcheck.predict import roofline
from perfcheck.predict.aten_costs import OpCall, TensorMeta, cost_of
from _host_only_specs import host_only_spec, root_row

US, NS = 1e-6, 1e-9


def test_embedding_rows_are_priced_per_index():
    # nn.Embedding(100, 8) on 256 indices: rows = 256 in each phase (formulas.embedding); only the row prices
    # differ between the specs: fwd 256 x 10 ns = 2.56 us, bwd 256 x 50 ns = 12.8 us
    prices = {"embedding": {"fwd": 10 * NS, "bwd": 50 * NS}}
    model, idx = torch.nn.Embedding(100, 8), torch.randint(0, 100, (256,))
    with_rows = root_row(perfcheck.estimate(model, (idx,), system=host_only_spec(prices, op_dispatch_s=1 * US)))
    without = root_row(perfcheck.estimate(model, (idx,), system=host_only_spec(None, op_dispatch_s=1 * US)))
    assert with_rows["pred_fwd_s"] - without["pred_fwd_s"] == pytest.approx(2.56 * US, rel=1e-6)
    assert with_rows["pred_bwd_s"] - without["pred_bwd_s"] == pytest.approx(12.8 * US, rel=1e-6)
    # the row term is device work (the kernel's), not host work
    assert with_rows["host_fwd_s"] == pytest.approx(without["host_fwd_s"])


def test_ops_without_rows_get_no_row_term():
    # a price for every op name the model runs: only formulas that count rows carry them, so nothing changes
    names = ("addmm", "mm", "relu", "add", "sum", "mul", "t", "native_batch_norm")
    prices = {n: {"fwd": 1.0, "bwd": 1.0} for n in names}
    model = torch.nn.Sequential(torch.nn.Linear(5, 5), torch.nn.ReLU())
    x = torch.randn(256, 5)
    a = root_row(perfcheck.estimate(model, (x,), system=host_only_spec(prices, op_dispatch_s=1 * US)))
    b = root_row(perfcheck.estimate(model, (x,), system=host_only_spec(None, op_dispatch_s=1 * US)))
    assert a["pred_fwd_s"] == b["pred_fwd_s"] and a["pred_bwd_s"] == b["pred_bwd_s"]
    xm, w = TensorMeta((256, 5), 4, True, True), TensorMeta((5, 5), 4, True, True)
    aten = torch.ops.aten
    assert cost_of(OpCall(aten.mm.default, (xm, w), {}, (xm,))).cost.fwd.rows == 0
    assert cost_of(OpCall(aten.relu.default, (xm,), {}, (xm,))).cost.fwd.rows == 0
    # an op without an entry costs nothing per row
    spec = host_only_spec({"embedding": {"fwd": 7 * NS}})
    assert list(roofline.row_prices(spec, ["embedding", "relu"], "fwd")) == [7 * NS, 0.0]
    assert list(roofline.row_prices(spec, ["embedding"], "bwd")) == [0.0]


def test_no_default_row_prices_a_spec_without_its_own_table():
    from perfcheck.hardware.systems import _host_defaults

    assert row_costs(load_system("cpu")) == {} and row_costs(load_system("h100-sxm")) == {}
    own = host_only_spec({"embedding": {"fwd": 1 * NS}})
    assert row_costs(own) == {"embedding": {"fwd": 1 * NS}}
    assert "retired" in _host_defaults()["sources"]["cpu.op_row_s"]


def test_op_row_s_is_validated_and_round_trips():
    spec = host_only_spec({"embedding": {"fwd": 84 * NS, "bwd": 28 * NS}})
    again = SystemSpec.from_dict(spec.to_json_dict())
    assert dict(again.op_row_s["embedding"]) == {"fwd": 84 * NS, "bwd": 28 * NS} and again == spec
    assert "op_row_s" not in load_system("cpu").to_json_dict()  # absent when empty: older files unchanged
    with pytest.raises(UserError, match=r"op_row_s\.embedding\.fwd"):
        SystemSpec.from_dict({**spec.to_json_dict(), "op_row_s": {"embedding": {"fwd": -1.0}}})
    with pytest.raises(UserError, match=r"op_row_s\.embedding has unknown phase 'back'"):
        SystemSpec.from_dict({**spec.to_json_dict(), "op_row_s": {"embedding": {"back": 1.0}}})
    with pytest.raises(UserError, match=r"op_row_s\.embedding must be an object"):
        SystemSpec.from_dict({**spec.to_json_dict(), "op_row_s": {"embedding": 1.0}})


def _row(kind, label, seconds, m=0, k=0, n=0, flops=0.0, nbytes=0.0):
    return {"kind": kind, "label": label, "dtype": "fp32", "m": m, "k": k, "n": n, "flops": flops, "bytes": nbytes,
            "world_size": 1, "seconds": seconds, "seconds_min": seconds, "seconds_max": seconds, "repeats": 3,
            "iters": 1, "flops_per_s": math.nan, "bytes_per_s": math.nan, "busbw_bytes_per_s": math.nan}


def test_fit_is_the_slope_over_rows_less_the_roofline():
    # embedding fwd, no FLOPs or bytes (roofline 0): 5 us + rows x 80 ns -> 80 ns per row.
    # embedding bwd: a time that falls with the rows -> floored at 0.
    # _embedding_bag fwd with 1 kB of "bytes" per row: 64 rows 4 us + 64 kB at 1 GB/s, 512 rows 4 us + 512 kB; at
    # the calibrated 10 GB/s copy rate the roofline slope is (512-64) kB / 10 GB/s / 448 rows = 100 ns; the
    # measured slope is 448 kB / 1 GB/s / 448 = 1 us per row -> 900 ns per row left.
    # An older table's row-wise op rows (_softmax) are skipped: that term is retired.
    rows = [_row("launch", "op", 4 * US), _row("copy", "copy 64 MiB", 2 * 2 ** 26 / 10e9, nbytes=2 * 2 ** 26)]
    rows += [_row("oprows", "embedding fwd", 5 * US + r * 80 * NS, r, 20, 1) for r in (64, 512)]
    rows += [_row("oprows", "embedding bwd", 9 * US - r * NS, r, 20, 1) for r in (64, 512)]
    rows += [_row("oprows", "_embedding_bag fwd", 4 * US + r * 1e3 / 1e9, r, 20, 1, nbytes=r * 1e3)
             for r in (64, 512)]
    rows += [_row("oprows", "_softmax fwd", 5 * US + r * 50 * NS, r, cols, 1) for cols in (4, 8) for r in (64, 512)]
    spec = build_spec("cpu", pd.DataFrame(rows, columns=list(MEASUREMENT_COLUMNS)), peaks="measured", stamp="test")
    assert spec.op_row_s["embedding"]["fwd"] == pytest.approx(80 * NS)
    assert spec.op_row_s["embedding"]["bwd"] == 0.0
    assert spec.op_row_s["_embedding_bag"]["fwd"] == pytest.approx(900 * NS, rel=1e-6)
    assert set(spec.op_row_s) == {"embedding", "_embedding_bag"}
    assert "64 -> 512 rows" in spec.sources["op_row_s"] and "simd_bytes" not in spec.sources
    assert "op_row_s" not in build_spec("cpu", pd.DataFrame(rows[:2]), peaks="measured", stamp="t").to_json_dict()


def test_row_cases_cost_each_call_through_the_op_path():
    emb, conv = embedding_row_cases("cpu"), conv_weight_cases("cpu")
    assert {c.label for c in emb} == {f"{n} {p}" for n in ("embedding", "_embedding_bag") for p in ("fwd", "bwd")}
    assert {c.label for c in conv} == {"convolution fwd", "convolution bwd"}
    assert {c.shape[:2] for c in emb if c.label == "embedding fwd"} == {(r, ROW_CASE_LENGTH) for r in EMBED_COUNTS}
    n = EMBED_COUNTS[-1]
    case = next(c for c in emb if c.label == "embedding fwd" and c.shape[0] == n)
    # formulas.embedding by hand: reads and writes n x ROW_CASE_LENGTH fp32 elements, reads n int64 indices
    assert case.bytes == 2 * n * ROW_CASE_LENGTH * 4 + n * 8
    for c in emb[:4] + conv[:2]:  # each call runs
        c.fn()

"""Memory-bound ops on operands evicted from L2 (``memory_cold_curve``): the calibration cases, their fit, the
memory term's factor and where the estimator applies it; all by hand, on planted specs and planted measurement
tables (no timing)."""
from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch

import perfcheck
from perfcheck.calibrate import case_names as names, fit
from perfcheck.calibrate.cases import l2_cache_bytes
from perfcheck.calibrate.cold_cases import memory_cold_cases
from perfcheck.hardware.systems import host_constants, load_system
from perfcheck.predict import reuse, roofline
from perfcheck.predict.module_estimator import _op_table
from perfcheck.predict.trace import trace_model
from perfcheck.schema import ROOT

from test_cold_operands import NormAfterRelu  # relu of the batch, then a layer norm of what the relu wrote

US = 1e-6
MIB = 2 ** 20


def _row(kind, label, seconds, m=0, nbytes=0.0):
    return {"kind": kind, "label": label, "dtype": "fp32", "m": m, "k": 0, "n": 0, "flops": 0.0, "bytes": nbytes,
            "world_size": 1, "seconds": seconds}


def _table():
    """A 2 us tiny op; copies of 1 MiB (50 us) and 64 MiB (6.4 ms) moved; two memory-bound ops per size, hot and
    cold; the L2 row."""
    code = host_constants(load_system("cpu"))["op_cold_s"] / US  # no opcold rows: the default op_cold_s
    rows = [_row("launch", "op", 2 * US), _row(names.COPY, "copy a", 50 * US, nbytes=MIB),
            _row(names.COPY, "copy b", 6400 * US, nbytes=64 * MIB)]
    # extra cold time beyond op_cold_s: 1 MiB: copy 48 us, fill 16 us; 64 MiB: none (a tight loop streams it too)
    for n, nbytes, hot, extras in ((1 << 17, MIB, 60.0, (48.0, 16.0)), (1 << 23, 64 * MIB, 6400.0, (0.0, -5.0))):
        for op, extra in zip(("copy", "fill"), extras):
            rows += [_row(names.MEMORY_COLD, f"hot {op} {n}", hot * US, n, nbytes),
                     _row(names.MEMORY_COLD, f"{op} {n}", (hot + code + extra) * US, n, nbytes)]
    return pd.DataFrame(rows + [_row(names.MEMORY_COLD, "l2", 0.0, 2 ** 21)])


def test_fit_is_memory_term_over_memory_term_plus_extra():
    """Hand arithmetic: bandwidth 64 MiB / 6.4 ms; the 1 MiB copy's rate (1 MiB / (50 - 2) us) is 6400 / 48 / 64 =
    2.0833 times it, so the roofline memory term of 1 MiB moved is 1 MiB / (bandwidth x 2.0833) = 48 us. Copy:
    48 / (48 + 48) = 0.5; fill: 48 / (48 + 16) = 0.75; median 0.625. At 64 MiB the memory term is 6.4 ms and there is
    no extra (a negative one counts as none): 1.0."""
    spec = fit.build_spec("cpu", _table(), peaks="measured", stamp="test")
    assert [x for x, _ in spec.memory_cold_curve] == [MIB, 64 * MIB]
    assert [f for _, f in spec.memory_cold_curve] == pytest.approx([0.625, 1.0], abs=2e-4)
    assert spec.calibration["l2_bytes"] == 2 ** 21
    assert roofline.cold_cache_bytes(spec) == 2 ** 21
    lines = [v for k, v in fit.summary_rows(spec, _table()) if k == "memory cold"]
    assert len(lines) == 2 and lines[0].startswith("1 MiB moved per kernel, operands evicted from L2 -> 0.6")
    assert lines[1] == "64 MiB moved per kernel, operands evicted from L2 -> 1.00 x its rate"


def test_no_cold_rows_no_curve_and_an_old_spec_loads_unchanged(tmp_path):
    table = _table()
    spec = fit.build_spec("cpu", table[table["kind"] != names.MEMORY_COLD], peaks="measured", stamp="test")
    assert spec.memory_cold_curve == () and "l2_bytes" not in spec.calibration
    old = load_system("cpu").to_json_dict()
    assert "memory_cold_curve" not in old  # absent when empty: older files round-trip unchanged
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    assert load_system(str(path)).memory_cold_curve == ()
    new = dataclasses.replace(load_system("cpu"), memory_cold_curve=((1e5, 0.5), (1e7, 1.0)))
    path.write_text(new.to_json())
    assert load_system(str(path)).memory_cold_curve == ((1e5, 0.5), (1e7, 1.0))


def test_a_factor_above_one_is_a_user_error(tmp_path):
    data = {**load_system("cpu").to_json_dict(), "memory_cold_curve": [[1e5, 1.5]]}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(perfcheck.errors.UserError, match="memory_cold_curve"):
        load_system(str(path))


def test_memory_term_by_hand():
    """f at 1e6 bytes on a curve (1e5, 0.5) -> (1e7, 1.0) is 0.75 (halfway in log bytes); 40% of the bytes far:
    memory x (1 + 0.4 x (1 / 0.75 - 1)) = memory x 1.1333."""
    spec = dataclasses.replace(load_system("cpu"), memory_cold_curve=((1e5, 0.5), (1e7, 1.0)))
    hot = 1e6 / (spec.mem_bandwidth_bytes_per_s * spec.efficiency["memory"])
    assert roofline.memory_cold_factor(spec, 1e6) == pytest.approx(0.75)
    assert roofline.memory_time_s(1e6, spec, kernels=1) == pytest.approx(hot)
    assert roofline.memory_time_s(1e6, spec, kernels=1, cold=0.4) == pytest.approx(hot * (1 + 0.4 / 3))
    assert roofline.memory_time_s(1e6, spec, kernels=1, cold=1.0) == pytest.approx(hot / 0.75)
    # two kernels of 0.5e6 bytes each read the curve at 0.5e6 (log-interpolated), and clamped past its ends
    f = 0.5 + 0.5 * (torch.log(torch.tensor(5.0)) / torch.log(torch.tensor(100.0))).item()
    assert roofline.memory_cold_factor(spec, 5e5) == pytest.approx(f)
    assert roofline.memory_cold_factor(spec, 10.0) == 0.5 and roofline.memory_cold_factor(spec, 1e9) == 1.0
    assert roofline.memory_cold_factor(load_system("cpu"), 1e6) == 1.0  # no curve: no effect


def test_estimator_slows_the_far_share_of_memory_terms_only():
    """A flat f = 0.5 and every operand farther than the 1-byte cache except distance 0: the relu reads the unseen
    batch and writes a fresh output (share 1): its memory term doubles; the norm reads the relu's output (distance
    0), its far 1 KiB weight and bias and writes a fresh 1 MiB output and 8 KiB of fp32 row statistics (1024 rows
    x mean, rstd), far like any new allocation (``reuse.cold_shares(fresh_writes=True)``): share
    (2 KiB + 1 MiB + 8 KiB) / (1 MiB + 2 KiB + 1 MiB + 8 KiB), its memory term grows by that share; on the
    datasheet CPU spec both are memory-bound. The relu's kernel is planted at efficiency 0.5: its hot time
    doubles, the refetch does not (added after the efficiency). With the cache larger than the step nothing
    changes."""
    model, x = NormAfterRelu(256), torch.randn(1024, 256)
    base = dataclasses.replace(load_system("cpu"), memory_cold_curve=((1.0, 0.5), (1e12, 0.5)),
                               host={k: 0.0 for k in load_system("cpu").host}, op_efficiency={"relu": 0.5})
    hot_spec = dataclasses.replace(base, calibration={"l2_bytes": 10 ** 12})
    cold_spec = dataclasses.replace(base, calibration={"l2_bytes": 1})
    hot, cold = (perfcheck.estimate(model, (x,), system=s).set_index("module") for s in (hot_spec, cold_spec))
    ops = _op_table(trace_model(model, (x,)), False)
    norm_bytes = float(ops.loc[ops["name"] == "native_layer_norm", "bytes_fwd"].iloc[0])
    mib = 1024 * 256 * 4
    share = (2048 + mib + 8192) / (mib + 2048 + mib + 8192)
    extra = share * roofline.memory_time_s(norm_bytes, base, kernels=1)
    assert cold.loc["norm", "pred_fwd_s"] - hot.loc["norm", "pred_fwd_s"] == pytest.approx(extra, rel=1e-6)
    relu_bytes = float(ops.loc[ops["name"] == "relu", "bytes_fwd"].iloc[0])
    root_gain = cold.loc[ROOT, "pred_fwd_s"] - hot.loc[ROOT, "pred_fwd_s"]
    assert root_gain == pytest.approx(extra + roofline.memory_time_s(relu_bytes, base, kernels=1), rel=1e-6)


def test_reuse_shares_feed_the_memory_term():
    """The estimator's op table gets the shares of ``reuse.cold_shares`` (one walk for GEMMs and memory ops)."""
    model, x = NormAfterRelu(256), torch.randn(8, 256)
    trace = trace_model(model, (x,))
    ops = _op_table(trace, False)
    fwd, _ = reuse.cold_shares(trace, ops, 1)
    got = dict(zip(ops["name"], fwd))
    assert got["relu"] == 1.0 and got["native_layer_norm"] == pytest.approx(2048 / (2048 + 8 * 256 * 4))


def test_cold_cases_pair_every_op_and_size_and_record_the_l2():
    cases = memory_cold_cases("cpu", sizes=(1 << 10, 1 << 12))
    if l2_cache_bytes() <= 0:
        assert cases == []
        return
    labels = [c.label for c in cases]
    assert labels[:2] == ["hot copy 1024", "copy 1024"] and labels[-1] == "l2" and len(labels) == 2 * 4 * 2 + 1
    assert all(c.kind == names.MEMORY_COLD and c.between is not None for c in cases[:-1])
    # bytes by the estimator's formulas: a copy of 4 KiB reads and writes it
    assert cases[0].bytes == 2 * 4 * 1024 and cases[-1].shape[0] == l2_cache_bytes()
    for c in cases[:-1]:
        c.fn()

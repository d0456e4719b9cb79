"""A CPU BatchNorm backward's serial reduction steps per (sample, channel) plane (predict.batch_norm_cpu), the kernel's
vector width by capability (hardware.cpu_vector), the traced op's rows, and the calibration's per-step fit."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

from perfcheck.calibrate import case_names as names
from perfcheck.calibrate import op_classes
from perfcheck.calibrate.fit_draft import Draft
from perfcheck.calibrate.fit_host import row_costs
from perfcheck.hardware.cpu_vector import kernel_vector_bytes
from perfcheck.hardware.systems import load_system
from perfcheck.predict import aten_costs
from perfcheck.predict.batch_norm_cpu import batch_norm_reduction_steps
from perfcheck.predict.trace import trace_model

NS = 1e-9


def test_steps_by_hand():
    # 8 fp32 per vector: a 2x2 plane (4 < 8) takes the slow path, one step per element: 4 x 512 planes x 4
    assert batch_norm_reduction_steps(4, 512, 4, 8) == 4 * 512 * 4
    # a plane of exactly one vector, or more, ends in one horizontal reduction: one step per plane
    assert batch_norm_reduction_steps(2, 3, 8, 8) == 6
    assert batch_norm_reduction_steps(4, 64, 256, 8) == 256
    assert batch_norm_reduction_steps(2, 3, 7, 8) == 2 * 3 * 7
    # a 1-element plane runs the channels-last kernel; no vector size (not that kernel): no steps
    assert batch_norm_reduction_steps(4, 512, 1, 8) == 0
    assert batch_norm_reduction_steps(4, 512, 4, None) == 0
    # a 16-float vector (a 64-byte SVE kernel) makes the 4x4 plane a slow one
    assert batch_norm_reduction_steps(1, 2, 16, 16) == 2 and batch_norm_reduction_steps(1, 2, 15, 16) == 30


@pytest.mark.parametrize("capability,nbytes", [("AVX512", 32), ("AVX2", 32), ("DEFAULT", 32), ("NO AVX", 32),
                                               ("SVE128", 16), ("SVE256", 32), ("sve512", 64)])
def test_vector_bytes_by_capability(capability, nbytes):
    # REGISTER_DISPATCH kernels run their AVX2 build on an AVX512 machine (DispatchStub.h); SVE builds keep theirs
    assert kernel_vector_bytes(capability) == nbytes


def _bn_rows(monkeypatch, vec_bytes, shape, training=True, dtype=torch.float32):
    monkeypatch.setattr(aten_costs, "kernel_vector_bytes", lambda: vec_bytes)
    bn = torch.nn.BatchNorm2d(shape[1]).to(dtype).train(training)
    trace = trace_model(bn, (torch.randn(*shape, dtype=dtype, requires_grad=True),))
    ops = [op for op in trace.ops if "batch_norm" in op.call.name]
    assert len(ops) == 1
    cost = aten_costs.cost_of(ops[0].call).cost
    return cost.fwd.rows, cost.bwd.rows


def test_traced_batch_norm_counts_its_steps(monkeypatch):
    # 32-byte vectors = 8 fp32: ResNet's last stage (4 x 512 x 2 x 2) takes 4 steps per plane, 8192
    assert _bn_rows(monkeypatch, 32, (4, 512, 2, 2)) == (0, 4 * 512 * 4)
    # 16-byte vectors = 4 fp32: the same planes fill a vector, one step each
    assert _bn_rows(monkeypatch, 16, (4, 512, 2, 2)) == (0, 4 * 512)
    assert _bn_rows(monkeypatch, 32, (2, 8, 4, 4)) == (0, 16)
    # evaluation mode (no per-plane reductions in its backward) and bf16 (another kernel): none
    assert _bn_rows(monkeypatch, 32, (4, 512, 2, 2), training=False) == (0, 0)
    assert _bn_rows(monkeypatch, 32, (4, 512, 2, 2), dtype=torch.bfloat16) == (0, 0)


def test_cases_count_the_steps_they_run(monkeypatch):
    monkeypatch.setattr(op_classes, "kernel_vector_bytes", lambda: 32)
    assert op_classes.batch_norm_step_lengths() == (4, 16)
    cases = op_classes.batch_norm_cases(torch.device("cpu"))
    eff = [c for c in cases if c.kind == names.OPEFF]
    rows = [c for c in cases if c.kind == names.OPROWS]
    assert [c.label for c in eff] == ["native_batch_norm:bwd"]
    n, c, h, w = op_classes.BN_EFFICIENCY
    # backward with an input gradient: 9 FLOPs per element (formulas.batch_norm), x, dY read, dX written + 2 C params
    assert eff[0].shape[2] == 9 * n * c * h * w and eff[0].bytes == (3 * n * c * h * w + 2 * c) * 4
    # m = steps: 4 samples x C planes x 4 steps (half-vector planes), x 1 step (two-vector planes); k = plane length
    got = sorted((r.shape[1], r.shape[0]) for r in rows)
    want = sorted([(4, 4 * ch * 4) for ch in op_classes.BN_STEP_CHANNELS]
                  + [(16, 4 * ch) for ch in op_classes.BN_STEP_CHANNELS])
    assert got == want and all(r.label == "native_batch_norm bwd" for r in rows)
    gx, gw, gb = rows[0].fn()
    assert gx.shape == (4, op_classes.BN_STEP_CHANNELS[0], 4) and gw.shape == (op_classes.BN_STEP_CHANNELS[0],)


def test_fit_takes_the_median_slope_over_plane_lengths():
    # no FLOPs or bytes: the roofline's slope is 0, so each length's price is its time's slope over the steps
    spec = dataclasses.replace(load_system("cpu"), op_efficiency={"native_batch_norm:bwd": 4.0})
    rows = [(4, 1024, 5e-6 + 1024 * 20 * NS), (4, 8192, 5e-6 + 8192 * 20 * NS),
            (16, 256, 3e-6 + 256 * 12 * NS), (16, 2048, 3e-6 + 2048 * 12 * NS)]
    table = pd.DataFrame([dict(kind=names.OPROWS, label="native_batch_norm bwd", dtype="fp32", m=m, k=k, n=2,
                               flops=0.0, bytes=0.0, world_size=1, seconds=s, seconds_min=s, seconds_max=s,
                               repeats=3, iters=10) for k, m, s in rows])
    d = Draft(base=spec, peaks="measured", stamp="test", kind="cpu", matrix={}, vector={}, eff={}, sources={})
    price = row_costs(spec, table, d).op_row_s["native_batch_norm"]["bwd"]
    assert price == pytest.approx((20 + 12) / 2 * NS, rel=1e-6)

"""GPU kernel-class curves (perfcheck.calibrate.gpu_ops): the fit on synthetic measurement tables
against hand arithmetic, the roofline's reading of the curves (per phase, per dtype, between sizes), the
spec round trip, and the cases on a CPU at tiny sizes (the families trace to the ops they are stored under).

Hand arithmetic uses a spec with round numbers: 1e12 B/s at memory efficiency 1 and no bandwidth curve, so
a memory-bound kernel moving B bytes has a roofline time of B / 1e12 s; device_kernel_s = 2 us per kernel."""
from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest
import torch

from perfcheck.calibrate import gpu_ops
from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS
from perfcheck.hardware.systems import SystemSpec, load_system
from perfcheck.predict import roofline
from perfcheck.predict import efficiency

BW, KERNEL_S = 1e12, 2e-6


@pytest.fixture
def spec():
    base = load_system("h100-sxm")
    return dataclasses.replace(base, mem_bandwidth_bytes_per_s=BW, mem_bandwidth_curve=(),
                               efficiency={**dict(base.efficiency), "memory": 1.0},
                               host={"device_kernel_s": KERNEL_S})


def _row(label, dtype, nbytes, kernels, seconds, flops=0.0, other=0):
    row = {c: 0 for c in MEASUREMENT_COLUMNS}
    row.update(kind=gpu_ops.KIND, label=label, dtype=dtype, m=1, k=kernels, n=other, flops=flops, bytes=nbytes,
               seconds=seconds, world_size=1)
    return row


def test_fit_is_roofline_over_measured_less_the_per_kernel_term(spec):
    # LayerNorm forward, bf16: 100 MB in one kernel -> roofline 100 us; measured 202 us -> (100) / (202 - 2) = 0.5
    # its backward: 150 MB in two kernels -> roofline 150 us (75 per kernel); measured 604 us -> 150 / 600 = 0.25
    # a larger forward: 400 MB -> 400 us; measured 502 -> 400 / 500 = 0.8
    table = pd.DataFrame([_row("native_layer_norm fwd", "bf16", 100e6, 1, 202e-6),
                          _row("native_layer_norm bwd", "bf16", 150e6, 2, 604e-6),
                          _row("native_layer_norm fwd", "bf16", 400e6, 1, 502e-6)])
    curves = gpu_ops.fit_curves(spec, table)
    assert set(curves) == {"native_layer_norm@bf16", "native_layer_norm:bwd@bf16"}
    fwd = curves["native_layer_norm@bf16"]
    assert [x for x, _ in fwd] == pytest.approx([100e-6, 400e-6])
    assert [e for _, e in fwd] == pytest.approx([0.5, 0.8])
    (x, e), = curves["native_layer_norm:bwd@bf16"]
    assert x == pytest.approx(75e-6) and e == pytest.approx(0.25)


def test_fit_keys_fp32_by_the_bare_name_and_caps_at_one(spec):
    # a convolution in fp32 measured faster than its roofline (cuDNN's TF32 path) is priced at the roofline
    table = pd.DataFrame([_row("convolution fwd", "fp32", 10e6, 1, 5e-6),
                          _row("convolution fwd", "fp32", 10e6, 1, 14e-6),  # same size twice: median
                          _row("convolution fwd", "fp32", 10e6, 1, 22e-6)])
    curves = gpu_ops.fit_curves(spec, table)
    # efficiencies 10/3 -> 1 (capped), 10/12, 10/20 = 0.5; the median of the three at the one size: 10/12
    assert curves == {"convolution": ((pytest.approx(10e-6), pytest.approx(10 / 12)),)}


def test_roofline_reads_the_curve_by_phase_dtype_and_size(spec):
    curves = {"embedding@bf16": ((10e-6, 0.5), (1000e-6, 0.9)), "embedding:bwd@bf16": ((10e-6, 0.1),)}
    s = dataclasses.replace(spec, op_efficiency_curve=curves, op_efficiency={"embedding": 0.7})
    # log-linear between points: 100 us is halfway in log between 10 and 1000 us -> 0.7
    assert efficiency.op_efficiency(s, "embedding", "bf16", "fwd", 100e-6) == pytest.approx(0.7)
    assert efficiency.op_efficiency(s, "embedding", "bf16", "fwd", 1e-9) == pytest.approx(0.5)  # clamped
    assert efficiency.op_efficiency(s, "embedding", "bf16", "fwd", 1.0) == pytest.approx(0.9)
    assert efficiency.op_efficiency(s, "embedding", "bf16", "bwd", 1.0) == pytest.approx(0.1)  # its own phase
    # fp32 has no curve: the flat fp32 entry (as before curves existed), for both phases
    assert efficiency.op_efficiency(s, "embedding", "fp32", "bwd", 1e-6) == pytest.approx(0.7)
    # an op with nothing measured keeps 1
    assert efficiency.op_efficiency(s, "gelu", "bf16", "bwd", 1e-6) == 1.0


def test_op_device_times_divides_the_roofline_part_by_the_curve(spec):
    """One memory-bound op row: 100 MB forward (1 kernel), 100 MB backward (1 kernel). Roofline 100 us each;
    curve: forward 0.5, backward 0.25 -> forward 200 + 2 us, backward 400 + 2 us (launch_s = 2 us)."""
    s = dataclasses.replace(spec, op_efficiency_curve={"native_layer_norm@bf16": ((100e-6, 0.5),),
                                                       "native_layer_norm:bwd@bf16": ((100e-6, 0.25),)})
    ops = pd.DataFrame([{"name": "native_layer_norm", "macs_fwd": 0.0, "macs_bwd": 0.0, "other_fwd": 0.0,
                         "other_bwd": 0.0, "bytes_fwd": 100e6, "bytes_bwd": 100e6, "kernels_fwd": 1.0,
                         "kernels_bwd": 1.0}])
    out = roofline.op_device_times(ops, s, "bf16", launch_s=KERNEL_S)
    assert out.t_fwd.iloc[0] == pytest.approx(202e-6)
    assert out.t_bwd.iloc[0] == pytest.approx(402e-6)
    plain = roofline.op_device_times(ops.copy(), spec, "bf16", launch_s=KERNEL_S)  # no curve: the roofline
    assert plain.t_fwd.iloc[0] == pytest.approx(102e-6)


def test_apply_writes_curves_that_round_trip_through_the_file_format(spec, tmp_path):
    table = pd.DataFrame([_row("_softmax fwd", "bf16", 100e6, 1, 202e-6)])
    out = gpu_ops.apply(spec, table, "stamp")
    assert dict(out.op_efficiency_curve) == {"_softmax@bf16": ((pytest.approx(100e-6), pytest.approx(0.5)),)}
    assert "op_efficiency_curve" in out.sources and "_softmax@bf16 0.500-0.500" in out.sources["op_efficiency_curve"]
    path = out.save(tmp_path / "s.json")
    back = load_system(str(path))
    assert back.op_efficiency_curve == out.op_efficiency_curve
    assert gpu_ops.apply(spec, pd.DataFrame(columns=list(MEASUREMENT_COLUMNS)), "x") is spec  # nothing measured
    # a curve value outside (0, 1] names the field
    bad = json.loads(out.to_json())
    bad["op_efficiency_curve"]["_softmax@bf16"] = [[1e-4, 1.5]]
    with pytest.raises(Exception, match="op_efficiency_curve"):
        SystemSpec.from_dict(bad)


def test_cases_trace_to_the_ops_their_curves_are_stored_under():
    """At tiny sizes on a CPU every family but a decomposed RMS norm is found in the estimator's trace, with
    the estimator's bytes of that op: LayerNorm forward on 64 x 32 bf16 reads x and writes y (2 x 2048 x 2 B)
    plus its weight and bias and the fp32 mean/rstd (the formulas' count)."""
    cases = gpu_ops.gpu_op_cases("cpu", ("fp32", "bf16"), "tiny")
    labels = {(c.label, c.dtype) for c in cases}
    for name in ("native_layer_norm", "_softmax", "embedding", "_scaled_dot_product_flash_attention_for_cpu"):
        assert {(f"{name} fwd", "bf16"), (f"{name} bwd", "bf16")} <= labels, name
    assert {("convolution fwd", "fp32"), ("convolution fwd", "bf16")} <= labels  # per dtype
    ln = next(c for c in cases if c.label == "native_layer_norm fwd")
    assert ln.bytes >= 2 * 64 * 32 * 2 and ln.shape[0] == 64 * 32
    for c in cases:  # each call runs (harmless on a CPU)
        c.fn()
    assert all(c.kind == gpu_ops.KIND for c in cases)


def test_device_timer_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("CPU-only check")
    with pytest.raises((AssertionError, RuntimeError)):
        gpu_ops.DeviceTimer("cuda").loop(lambda: None, 1)


def test_device_timer_holds_the_device_longer_than_the_host_needs_to_queue_the_calls(monkeypatch):
    """A fake CUDA runtime and host clock: the hold (torch.cuda._sleep cycles) covers twice the host's issue
    time of the loop plus 1 ms; a host slower than the first guess gets the loop timed again with a longer
    hold (the first timing would have carried host gaps). The result is the events' time per call."""
    sleeps, clock = [], [0.0]

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 8.0  # ms for the whole loop

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: sleeps.append(cycles))
    monkeypatch.setattr(gpu_ops.time, "perf_counter", lambda: clock[0])
    timer = gpu_ops.DeviceTimer("cpu")
    timer._cycles_per_s = 1e9  # 1 GHz: cycles = seconds x 1e9

    def slow():  # 5 ms of host time per call: more than the first guess (1 ms)
        clock[0] += 5e-3

    assert timer.loop(slow, 4) == pytest.approx(8e-3 / 4)
    assert len(sleeps) == 2  # the first hold (2 x 1 ms x 4 + 1 ms = 9 ms) was shorter than the 20 ms of queuing
    assert sleeps[0] == pytest.approx(9e-3 * 1e9)
    assert sleeps[1] == pytest.approx((2 * 5e-3 * 4 + 1e-3) * 1e9)  # 41 ms > 20 ms: kept
    sleeps.clear()
    timer.loop(slow, 2)  # the issue time is remembered per function: one hold, long enough at once
    assert len(sleeps) == 1 and sleeps[0] == pytest.approx((2 * 5e-3 * 2 + 1e-3) * 1e9)


def test_curves_reach_a_model_estimate_under_the_keys_its_trace_uses(spec):
    """End to end on a CPU: the tiny cases measured, fitted on the H100-like spec, and a one-block GPT-2-width
    model (d 768, batch 8 x 1024 tokens, on the meta device: device-bound on that spec) estimated in bf16 with
    the result: every family's key is one the model's trace looks up, so LayerNorm, the token embedding's
    backward and attention get slower (a CPU's kernels are far below an H100's roofline: efficiencies < 1),
    while the MLP's GEMMs, which no curve covers, keep their time."""
    import perfcheck
    from perfcheck.examples.models import GPT

    table = gpu_ops.bench_gpu_ops("cpu", ("bf16",), repeats=1, target_s=1e-4, sizes="tiny")
    fitted = gpu_ops.apply(spec, table, "test")
    assert {"native_layer_norm@bf16", "native_layer_norm:bwd@bf16", "embedding:bwd@bf16"} <= set(
        fitted.op_efficiency_curve)
    with torch.device("meta"):
        model = GPT(n_layer=1)
    x = torch.randint(0, 50257, (8, 1024), device="meta")
    before = perfcheck.estimate(model, (x,), system=spec, dtype="bf16").set_index("module")
    after = perfcheck.estimate(model, (x,), system=fitted, dtype="bf16").set_index("module")
    for path in ("h.0.ln_1", "wte", "h.0.attn"):
        assert after.loc[path, "pred_bwd_s"] > 1.5 * before.loc[path, "pred_bwd_s"], path
    assert after.loc["h.0.ln_1", "pred_fwd_s"] > 1.5 * before.loc["h.0.ln_1", "pred_fwd_s"]
    assert after.loc["h.0.mlp.c_fc", "pred_fwd_s"] == pytest.approx(before.loc["h.0.mlp.c_fc", "pred_fwd_s"])


def test_a_measured_attention_curve_replaces_the_public_attention_kernel_curve(spec):
    """The H100 spec ships FlashAttention-2's public rates (``attention_kernel_curve``); a calibration that timed
    this GPU's attention kernel prices it by its own curve, fitted against the roofline without the public one
    (1 TFLOP of matrix work at the 0.8 x 0.904 GEMM rate of 989.4 TFLOP/s = 1.397 ms, measured 2.796 ms less one
    2 us kernel term -> 0.5); a calibration that did not time attention keeps the public curve."""
    assert spec.attention_kernel_curve
    attn = pd.DataFrame([_row("_scaled_dot_product_flash_attention fwd", "bf16", 1e6, 1, 2.796e-3 + KERNEL_S,
                              flops=1e12)])
    fitted = gpu_ops.apply(spec, attn, "stamp")
    assert not fitted.attention_kernel_curve and "attention_kernel_curve" not in fitted.sources
    (_, e), = fitted.op_efficiency_curve["_scaled_dot_product_flash_attention@bf16"]
    assert e == pytest.approx(1e12 / (989.4e12 * 0.8 * 0.904) / 2.796e-3, rel=1e-3)
    norm = pd.DataFrame([_row("native_layer_norm fwd", "bf16", 100e6, 1, 202e-6)])
    assert gpu_ops.apply(spec, norm, "stamp").attention_kernel_curve == spec.attention_kernel_curve

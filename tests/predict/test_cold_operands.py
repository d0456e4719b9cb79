"""GEMMs on operands evicted from L2 (``matrix_cold_curve``): the calibration cases and their fit, each operand's
reuse distance against the L2 record (``predict.reuse``), and where the estimator applies the curve; all by hand,
on planted specs and planted measurement tables (no timing)."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

import perfcheck
from perfcheck.calibrate import case_names as names, fit
from perfcheck.calibrate.cases import l2_cache_bytes, matmul_cold_cases
from perfcheck.hardware.systems import host_constants, load_system
from perfcheck.predict import roofline
from perfcheck.predict import reuse
from perfcheck.predict.aten_costs import OpCall, TensorMeta
from perfcheck.predict.grad_accumulation import ACCUMULATE_OP
from perfcheck.predict.module_estimator import _op_table
from perfcheck.predict.trace import trace_model
from perfcheck.predict.trace_records import TracedOp

US = 1e-6


def _row(kind, label, seconds, m=0, k=0, n=0, flops=0.0):
    return {"kind": kind, "label": label, "dtype": "fp32", "m": m, "k": k, "n": n, "flops": flops, "bytes": 0.0,
            "world_size": 1, "seconds": seconds}


def _table(op_cold_us=0.0):
    """Tiny-op and host rows, three square matmuls, each timed hot and cold, and the L2 row."""
    rows = [_row("launch", "op", 2 * US), _row("host", "view", 1 * US), _row("host", "module call", 1 * US)]
    if op_cold_us:
        rows += [_row("opfixed", "a", 2 * US), _row("opcold", "round-robin x1", (2 + op_cold_us) * US)]
    for s, hot_us, cold_us in ((64, 10.0, 30.0), (256, 102.0, 152.0), (1024, 1002.0, 1012.0)):
        label, flops = f"mm {s}x{s}x{s}", 2.0 * s ** 3
        rows += [_row(names.MATMUL, label, hot_us * US, s, s, s, flops),
                 _row(names.MATMUL_COLD, f"hot {label}", hot_us * US, s, s, s, flops),
                 _row(names.MATMUL_COLD, label, cold_us * US, s, s, s, flops)]
    return pd.DataFrame(rows + [_row(names.MATMUL_COLD, "l2", 0.0, 2 ** 21)])


def test_fit_is_hot_over_cold_compute_time_by_flops():
    spec = fit.build_spec("cpu", _table(), peaks="measured", stamp="test")
    # fixed part = the tiny op's 2 us (no mm op_fixed row); op_cold_s here is the default's, taken out of cold
    code = host_constants(spec)["op_cold_s"]
    expect = [(10 - 2) / (30 - code / US - 2), (102 - 2) / (152 - code / US - 2), (1002 - 2) / (1012 - code / US - 2)]
    got = [f for _, f in spec.matrix_cold_curve]
    assert [x for x, _ in spec.matrix_cold_curve] == [2.0 * 64 ** 3, 2.0 * 256 ** 3, 2.0 * 1024 ** 3]
    # c / (c + e), c = the compute term the fitted curve gives (hot - 2 us here, its efficiencies rounded to 4
    # decimals), e = cold - op_cold_s - hot: the same as (hot - 2) / (cold - op_cold_s - 2)
    assert got == pytest.approx([min(e, 1.0) for e in expect], abs=5e-4)
    assert spec.calibration["l2_bytes"] == 2 ** 21


def test_a_call_timed_near_its_fixed_cost_does_not_blow_the_factor_up():
    # the cold case's call-by-call hot time of the smallest GEMM read 2.05 us, about the tiny op's 2 us (noise): the
    # factor takes the GEMM's compute term from the tight-loop matmul rows (8 us of compute at 10 us measured), not
    # hot - fixed = 0.05 us, which priced it 1 / 0.002 = 500x slower cold
    table = _table()
    table.loc[(table["kind"] == names.MATMUL_COLD) & (table["label"] == "hot mm 64x64x64"), "seconds"] = 2.05 * US
    spec = fit.build_spec("cpu", table, peaks="measured", stamp="test")
    code = host_constants(spec)["op_cold_s"] / US
    assert spec.matrix_cold_curve[0][1] == pytest.approx(8 / (8 + 30 - code - 2.05), abs=5e-4)


def test_the_measured_op_cold_s_is_not_counted_twice():
    spec = fit.build_spec("cpu", _table(op_cold_us=8.0), peaks="measured", stamp="test")
    assert spec.host["op_cold_s"] == pytest.approx(8 * US)
    assert spec.matrix_cold_curve[0][1] == pytest.approx((10 - 2) / (30 - 8 - 2), abs=5e-4)  # curve rounding


def test_no_cold_rows_no_curve():
    table = _table()
    spec = fit.build_spec("cpu", table[table["kind"] != names.MATMUL_COLD], peaks="measured", stamp="test")
    assert spec.matrix_cold_curve == () and "l2_bytes" not in spec.calibration


def test_cold_factor_interpolates_in_log_flops_and_clamps():
    spec = dataclasses.replace(load_system("cpu"), matrix_cold_curve=((1e6, 0.5), (1e8, 1.0)))
    assert roofline.cold_factor(spec, 1e7) == pytest.approx(0.75)
    assert roofline.cold_factor(spec, 1e3) == pytest.approx(0.5) and roofline.cold_factor(spec, 1e10) == 1.0
    assert roofline.cold_factor(load_system("cpu"), 1e7) == 1.0


def test_cold_cache_bytes_needs_a_curve_and_an_l2_record():
    curve = ((1e6, 0.5), (1e8, 1.0))
    assert roofline.cold_cache_bytes(dataclasses.replace(load_system("cpu"), matrix_cold_curve=curve,
                                                         calibration={"l2_bytes": 1000})) == 1000
    assert roofline.cold_cache_bytes(dataclasses.replace(load_system("cpu"), matrix_cold_curve=curve)) == 0
    assert roofline.cold_cache_bytes(dataclasses.replace(load_system("cpu"), calibration={"l2_bytes": 1000})) == 0


def _shares(model, x, cache):
    trace = trace_model(model, (x,))
    ops = _op_table(trace, False)
    fwd, bwd = reuse.cold_shares(trace, ops, cache)
    return ops.assign(cold_fwd=fwd, cold_bwd=bwd)


class Recurrent(torch.nn.Module):
    """One weight applied at every step (an RNN's recurrence), then a second, untouched-since-last-step weight."""

    def __init__(self, d=64, steps=6):
        super().__init__()
        self.w, self.head, self.steps = torch.nn.Linear(d, d, bias=False), torch.nn.Linear(d, d, bias=False), steps

    def forward(self, x):
        for _ in range(self.steps):
            x = torch.tanh(self.w(x))
        return self.head(x)


def test_reuse_distance_by_hand():
    """Hand count: the batch is 8 x 64 fp32 (2 KiB), each weight 64 x 64 (16 KiB); a product moves 20 KiB. A share
    is the far operands' bytes over all the product reads (its input and its weight: 18 KiB). With a cache far
    smaller than a step (1 KiB) the first product reads the batch and the weight, both unseen since the last step:
    share 1. Every later product reads the input the tanh just wrote (distance 0: the writer's bytes are counted
    when it ends) and a weight farther than 1 KiB: 16/18. With a 64 KiB cache the recurrent products re-read the
    weight the product before read (distance: that product's 20 KiB and the tanh's 4 KiB): hot; the head's weight
    is unseen: 16/18."""
    model, x = Recurrent(), torch.randn(8, 64)
    mm = lambda t: t[t["name"] == "mm"]  # noqa: E731
    small, mid = mm(_shares(model, x, 1024)), mm(_shares(model, x, 64 * 1024))
    assert list(small["cold_fwd"]) == pytest.approx([1.0] + [16 / 18] * 6)
    assert list(mid["cold_fwd"]) == pytest.approx([1.0] + [0.0] * 5 + [16 / 18])
    # backward, walked in reverse, distances in distinct bytes (a stack distance; the backward's gradients are
    # buffers recycled by size, reuse._touched): the head's backward runs right after its forward: hot. The last
    # recurrent product's backward (mm5) reads its weight W and input x5, last touched by its forward; since then
    # the tanh forward (y5, x6), the head forward (x6, H, out), the head backward (x6, H, out and a 20 KiB gradient
    # buffer: its 40 KiB less the 20 recorded) and the tanh backward (y5, x6 and a 2 KiB gradient: 6 less 4) touched
    # y5 2 + x6 2 + H 16 + out 2 + 20 + 2 = 44 KiB distinct: hot (counted as traffic, 70 KiB: far). mm4's input
    # x4: those 44 KiB and y4, x5 (its own step's forward) and W: 64 KiB, not beyond the 64 KiB cache: hot; mm3's
    # x3 adds y3 and x4: 68 KiB, far, and so every earlier one: its input's share 2/18 (W: hot, re-read by the
    # later step's backward just before)
    assert list(mid["cold_bwd"]) == pytest.approx([2 / 18] * 4 + [0.0, 0.0, 0.0])
    # a cache larger than the whole step (forward ~0.16 MiB, backward ~0.3 MiB): nothing is cold
    huge = mm(_shares(model, x, 2 ** 20))
    assert huge["cold_fwd"].sum() == 0 and huge["cold_bwd"].sum() == 0
    assert _shares(model, x, 0)["cold_fwd"].sum() == 0


class NormAfterRelu(torch.nn.Module):
    """A memory-bound chain: relu of the batch, then a layer norm of what the relu just wrote."""

    def __init__(self, d=64):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(torch.relu(x))


def test_memory_bound_shares_by_hand():
    """A norm's input is usually hot (the op before just wrote it); only its weight and bias, a step away, are far.
    Hand count, batch 8 x 64 fp32 (2 KiB), LayerNorm(64) (weight, bias 256 B each), cache 1 KiB: the relu reads the
    unseen batch: share 1; the norm reads the relu's output (distance 0) and the far weight and bias:
    512 / (2048 + 512) = 0.2. Backward (reversed): the norm's backward comes right after its forward, which touched
    all three last (distance 0: hot, share 0); the relu's backward reads the batch, last touched by the relu's
    forward, the norm's forward and backward bytes ago (> 4 KiB): share 1."""
    ops = _shares(NormAfterRelu(), torch.randn(8, 64), 1024)
    relu, norm = (ops[ops["name"] == n].iloc[0] for n in ("relu", "native_layer_norm"))
    assert relu["cold_fwd"] == 1.0
    assert norm["cold_fwd"] == pytest.approx(512 / (2048 + 512))
    assert norm["bytes_fwd"] > 4096 and norm["cold_bwd"] == 0.0 and relu["cold_bwd"] == 1.0
    # with a cache of 64 KiB the whole step fits: nothing is far, a step ago included
    assert _shares(NormAfterRelu(), torch.randn(8, 64), 64 * 1024)[["cold_fwd", "cold_bwd"]].to_numpy().sum() == 0


def test_a_view_does_not_refresh_its_storage():
    """F.linear runs t(W) (a view) then addmm: the view moves no bytes, so the weight is still unseen, cold."""
    lin, x = torch.nn.Linear(64, 64), torch.randn(8, 64)
    ops = _shares(lin, x, 1024)
    gemm = ops[ops["name"].isin(["addmm", "mm"])]
    assert list(gemm["cold_fwd"]) == [1.0]


def test_estimator_scales_matrix_products_only_when_cold():
    """A flat factor 0.5: a cold Linear takes twice the compute time, a convolution is untouched."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)
            self.fc = torch.nn.Linear(512, 512)

        def forward(self, x):
            return self.fc(self.conv(x).flatten(1)[:, :512])
    model, x = Net(), torch.randn(64, 8, 8, 8)
    base = dataclasses.replace(load_system("cpu"), matrix_cold_curve=((1.0, 0.5), (1e12, 0.5)),
                               host={k: 0.0 for k in load_system("cpu").host})
    hot = perfcheck.estimate(model, (x,), system=dataclasses.replace(base, calibration={"l2_bytes": 10 ** 12}))
    cold = perfcheck.estimate(model, (x,), system=dataclasses.replace(base, calibration={"l2_bytes": 1}))
    h, c = hot.set_index("module"), cold.set_index("module")
    assert c.loc["conv", "pred_fwd_s"] == pytest.approx(h.loc["conv", "pred_fwd_s"])
    fc_flops = 2 * 64 * 512 * 512
    peak = base.matrix_peak("fp32") * roofline.matrix_efficiency(base, "fp32", fc_flops, 64)
    compute = fc_flops / peak
    assert c.loc["fc", "pred_fwd_s"] - h.loc["fc", "pred_fwd_s"] == pytest.approx(compute, rel=0.02)


def test_l2_size_read_from_a_sysfs_tree(tmp_path):
    for index, level, size in ((0, 1, "48K"), (1, 1, "32K"), (2, 2, "2048K"), (3, 3, "300M")):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "level").write_text(f"{level}\n")
        (folder / "size").write_text(f"{size}\n")
    assert l2_cache_bytes(str(tmp_path)) == 2048 * 1024
    assert l2_cache_bytes(str(tmp_path / "absent")) == 0


def test_cold_cases_pair_every_shape_and_record_the_l2():
    cases = matmul_cold_cases("fp32", (16, 32), ((24, 16, 8),), torch.device("cpu"))
    if l2_cache_bytes() <= 0:
        assert cases == []
        return
    labels = [c.label for c in cases]
    assert labels == ["hot mm 16x16x16", "mm 16x16x16", "hot mm 32x32x32", "mm 32x32x32", "hot linear 24x16x8",
                      "linear 24x16x8", "l2"]
    assert all(c.kind == names.MATMUL_COLD and c.between is not None for c in cases[:-1])
    assert cases[-1].shape[0] == l2_cache_bytes()


class InPlaceBetween(torch.nn.Module):
    """A recurrent product with an in-place op on a 16 KiB buffer between two time steps."""

    def __init__(self, d=64, steps=3):
        super().__init__()
        self.w, self.steps = torch.nn.Linear(d, d, bias=False), steps
        self.register_buffer("buf", torch.zeros(4096))

    def forward(self, x):
        for _ in range(self.steps):
            x = self.w(x)
            self.buf.add_(1.0)
        return x


def test_reuse_distance_counts_distinct_bytes_not_traffic():
    """Hand count, cache 24 KiB: between two recurrent products the in-place add_ reads and writes one 16 KiB buffer
    (its formula moves 32 KiB). Counted as traffic, the weight (16 KiB) and the input (2 KiB) were 32 KiB away, far:
    share 1; counted as distinct bytes (a stack distance), 16 KiB: hot. The first product reads the unseen batch
    and weight: share 1 either way."""
    ops = _shares(InPlaceBetween(), torch.randn(8, 64), 24 * 1024)
    add = ops[ops["name"] == "add_"]
    assert list(add["bytes_fwd"]) == [2 * 4096 * 4] * 3  # the formula's traffic: read + write
    assert list(ops[ops["name"] == "mm"]["cold_fwd"]) == pytest.approx([1.0, 0.0, 0.0])


def test_gradient_accumulation_touches_two_buffers():
    """The engine's accumulation adds the incoming gradient into the buffer in place: a 768 x 256 fp32 gradient
    (786,432 B) moves 3 x that (read both, write one) but touches 2 x that."""
    g = TensorMeta((768, 256), 4, False, True, 768 * 256)
    op = TracedOp(OpCall(ACCUMULATE_OP, (g, g), {}, (g,)), (), grad_accumulate=True)
    assert reuse._footprint(op, 3 * 786_432) == 2 * 786_432 == 1_572_864
    assert reuse._footprint(op, 0.0) == 0.0


def test_fresh_outputs_count_in_the_memory_share_by_hand():
    """``fresh_writes``: a forward op's new output is as far as a step ago (write-allocate of lines last touched
    long ago). Hand count, batch 8 x 64 fp32 (2 KiB), LayerNorm(64), cache 1 KiB. The relu reads the unseen batch
    (2048 B, far) and writes its fresh output (2048 B, far): share 1. The norm reads the relu's output (2048 B,
    distance 0: hot), its far weight and bias (256 B each) and writes its fresh output (2048 B) and its mean and
    rstd (8 rows x 4 B each, far): (512 + 2048 + 64) / (2048 + 512 + 2048 + 64). The backward share is the reads'
    one (the backward's outputs are not traced), and without the flag the forward share is too."""
    model, x = NormAfterRelu(), torch.randn(8, 64)
    trace = trace_model(model, (x,))
    ops = _op_table(trace, False)
    plain_f, plain_b = reuse.cold_shares(trace, ops, 1024)
    fresh_f, fresh_b = reuse.cold_shares(trace, ops, 1024, fresh_writes=True)
    names = list(ops["name"])
    relu, norm = names.index("relu"), names.index("native_layer_norm")
    assert fresh_f[relu] == 1.0
    assert fresh_f[norm] == pytest.approx((512 + 2048 + 64) / (2048 + 512 + 2048 + 64))
    assert plain_f[norm] == pytest.approx(512 / (2048 + 512))
    assert list(fresh_b) == list(plain_b)
    # an output written into storage the step touched just before (an in-place op) stays hot
    inplace = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.ReLU(inplace=True))
    trace = trace_model(inplace, (torch.randn(8, 64),))
    ops = _op_table(trace, False)
    fresh_f, _ = reuse.cold_shares(trace, ops, 1024, fresh_writes=True)
    assert list(fresh_f) == pytest.approx([1.0, 0.0])


def test_estimator_prices_a_norms_fresh_output_as_cold():
    """The estimator's memory term takes the fresh-output share (``cold_memory_fwd``), a matrix product's cold flag
    keeps the reads' share: the op table's columns, read against the reuse module's own arrays."""
    from perfcheck.predict import module_estimator

    model, x = NormAfterRelu(), torch.randn(8, 64)
    trace = trace_model(model, (x,))
    ops = _op_table(trace, False)
    spec = dataclasses.replace(load_system("cpu"), memory_cold_curve=((1e3, 0.5), (1e8, 0.5)),
                               matrix_cold_curve=((1e6, 0.5), (1e8, 1.0)), calibration={"l2_bytes": 1024})
    timed = module_estimator._time_ops(ops.copy(), spec, "fp32", trace)
    norm = timed[timed["name"] == "native_layer_norm"].iloc[0]
    assert norm["cold_memory_fwd"] == pytest.approx((512 + 2048 + 64) / (2048 + 512 + 2048 + 64))
    assert norm["cold_fwd"] == pytest.approx(512 / (2048 + 512))
    # memory term by hand: hot memory m, cold share s, factor 0.5 -> m * (1 + s); the norm is memory-timed here
    hot = module_estimator._time_ops(ops.copy(), spec, "fp32", None)
    hot_norm = hot[hot["name"] == "native_layer_norm"].iloc[0]
    assert norm["t_fwd"] > hot_norm["t_fwd"]

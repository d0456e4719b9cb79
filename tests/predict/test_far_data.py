"""Data from beyond a small L3 (``reuse.far_shares``: by stack distance or by time since the last touch) and its
refetch at memory's rate (``roofline.device_times``'s ``far_memory``), against hand arithmetic."""
import dataclasses
import json

import numpy as np
import pytest
import torch

from perfcheck.errors import UserError
from perfcheck.hardware.systems import load_system
from perfcheck.predict import cold_curves, module_estimator as me
from perfcheck.predict import reuse, roofline
from perfcheck.predict.trace import trace_model

MIB = 2 ** 20


def _relu_chain():
    model = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.ReLU())
    trace = trace_model(model, (torch.randn(64, 1024, requires_grad=True),))
    ops = me._op_table(trace, False)
    return trace, ops.assign(t_fwd=1e-3, t_bwd=1e-3)


def test_far_share_by_time_and_distance():
    trace, ops = _relu_chain()
    first, second = ops.index[0], ops.index[-1]
    # an L3 that holds everything and a residency of 1 s: the second ReLU's input was just written (near), its
    # output is a fresh allocation (a step ago: far) -> half its forward bytes; the first ReLU's backward reads its
    # saved output, last read by the second ReLU's forward 1 ms before the backward began (near)
    fwd, bwd = reuse.far_shares(trace, ops, 1e12, 1.0)
    assert fwd[second] == pytest.approx(0.5) and bwd[first] == pytest.approx(0.0)
    # data forgotten after 0.5 ms: that saved output is far; the second ReLU's, touched by its own forward right
    # before its backward (the last forward op, the first backward one), is not
    fwd, bwd = reuse.far_shares(trace, ops, 1e12, 0.5e-3)
    assert bwd[first] == pytest.approx(1.0) and bwd[second] == pytest.approx(0.0)
    # by distance alone (no residency): an L3 of 64 KiB, less than the second ReLU's backward touches (its saved
    # output and the gradients, 256 KiB each) between the first ReLU's output's last read and its backward: far;
    # one that holds them: near
    assert reuse.far_shares(trace, ops, 64 * 1024, 0.0)[1][first] == pytest.approx(1.0)
    assert reuse.far_shares(trace, ops, 1e12, 0.0)[1][first] == pytest.approx(0.0)
    assert not np.any(reuse.far_shares(trace, ops, 0.0, 1.0)[0])  # no L3 measured: nothing is far


def test_far_share_by_time_follows_the_loss_curve():
    trace, ops = _relu_chain()
    first = ops.index[0]
    # the bytes the first ReLU's backward reads were all last touched more than 0.5 ms and less than 1 s before it
    # (the threshold cases above): a curve at 0.6 from 0.5 ms on (0 below 0.05 ms) makes 0.6 of them far
    curve = cold_curves.loss_curve(((0.5e-3, 0.6), (10.0, 0.6)))
    assert reuse.far_shares(trace, ops, 1e12, curve)[1][first] == pytest.approx(0.6)
    # an L3 too small for the distance: all of them, whatever the curve says
    assert reuse.far_shares(trace, ops, 64 * 1024, curve)[1][first] == pytest.approx(1.0)


def test_loss_curve_by_hand():
    f = cold_curves.loss_curve(((2e-3, 0.4), (8e-3, 0.7)))
    assert [f(a) for a in (0.0, 1e-4, 2e-4, 2e-3, 4e-3, 8e-3)] == pytest.approx([0, 0, 0, 0.4, 0.55, 0.7])
    # beyond 8 ms on the last segment's line (0.3 per factor 4 of age): 16 ms 0.85, 32 ms 1.0, then held at 1
    assert [f(a) for a in (16e-3, 32e-3, 1.0)] == pytest.approx([0.85, 1.0, 1.0])
    assert f(np.sqrt(2e-4 * 2e-3)) == pytest.approx(0.2)  # halfway in log(age) from (0.2 ms, 0) to (2 ms, 0.4)
    # a later re-read that came out cheaper than an earlier one cannot mean the L3 got the data back: held level
    assert cold_curves.loss_curve(((2e-3, 0.6), (8e-3, 0.5)))(8e-3) == pytest.approx(0.6)
    assert cold_curves.loss_curve(((2e-3, 0.5),))(20e-3) == pytest.approx(1.0)  # one sleep: from a tenth of it
    # no points: the residency threshold, else nothing
    assert [cold_curves.loss_curve((), 3e-3)(a) for a in (2e-3, 4e-3)] == [0.0, 1.0]
    assert cold_curves.loss_curve((), 0.0)(1.0) == 0.0


def test_l3_loss_reads_the_calibration_curve_through_the_spec_file(tmp_path):
    spec = load_system("cpu")
    spec = dataclasses.replace(spec, calibration={"l3_bytes": 32 * MIB, "l3_lost": [[2e-3, 0.4], [8e-3, 0.7]]},
                               host={**dict(spec.host), "op_cold_far_s": 3e-5, "l3_residency_s": 5e-3})
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec.to_json_dict()))
    back = load_system(str(path))
    assert back.calibration["l3_lost"] == ((2e-3, 0.4), (8e-3, 0.7))
    assert cold_curves.l3_loss(back)(4e-3) == pytest.approx(0.55)  # the curve, not the 5 ms threshold
    with pytest.raises(UserError, match="calibration.l3_lost"):
        load_system(str(path.with_name("bad.json"))) if path.with_name("bad.json").write_text(
            json.dumps({**spec.to_json_dict(), "calibration": {"l3_lost": [[2e-3, 1.5]]}})) else None


def test_far_bytes_move_at_memory_rate_in_place_of_the_l2_refetch():
    l3 = 32 * MIB
    base = load_system("cpu")
    spec = dataclasses.replace(base, mem_bandwidth_curve=((l3 / 4, 4.0), (4 * l3, 1.0)), calibration={"l3_bytes": l3},
                               host={**dict(base.host), "op_cold_far_s": 30e-6})
    rate = spec.mem_bandwidth_bytes_per_s * spec.efficiency["memory"]
    b = float(l3 / 4)  # a kernel of 8 MiB: 4x the memory rate hot
    args = (np.zeros(1), np.zeros(1), np.array([b]), np.ones(1), spec, "fp32")
    hot = roofline.device_times(*args, launch_s=0.0)
    far = roofline.device_times(*args, launch_s=0.0, cold_memory=np.ones(1), far_memory=np.ones(1))
    assert float(hot["time"][0]) == pytest.approx(b / (4 * rate))
    assert float(far["time"][0]) == pytest.approx(b / rate)  # all of it at memory's rate, no L2 refetch on top
    half = roofline.device_times(*args, launch_s=0.0, far_memory=np.array([0.5]))
    assert float(half["time"][0]) == pytest.approx(b / (4 * rate) + 0.5 * b * (1 / rate - 1 / (4 * rate)))
    assert roofline.far_data(base) == (0.0, 0.0)  # a spec without the far cases: the rule is off

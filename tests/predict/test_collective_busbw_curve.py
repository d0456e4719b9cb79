"""A spec's measured bus bandwidth by message size (``collective_busbw_curve``), checked by hand arithmetic."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest

from perfcheck.errors import UserError
from perfcheck.hardware.systems import SystemSpec, host_constants, load_system
from perfcheck.predict import collectives, ddp, pipeline

#: 50 GB/s at 1 MB and 150 GB/s at 100 MB: 100 GB/s at 10 MB, halfway in log size.
CURVE = {"allreduce": [[1e6, 50e9], [1e8, 150e9]]}


def _spec(curve=CURVE):
    d = load_system("a100-80gb-sxm").to_json_dict()
    return SystemSpec.from_dict({**d, "collective_busbw_curve": curve})


def _flat(spec, kind, size, n):
    """nccl-tests' flat ring time by hand: S x bus factor / (0.8 x 300 GB/s) + the latency."""
    factor = {"allreduce": 2 * (n - 1) / n, "allgather": (n - 1) / n}[kind]
    return size * factor / (spec.intra_node_bandwidth_bytes_per_s * spec.efficiency["intra_node"]) \
        + host_constants(spec)["collective_latency_s"]


def test_inside_a_node_the_measured_busbw_at_that_size_sets_the_time():
    spec = _spec()
    t = collectives.collective_time_s("allreduce", 1e7, 8, spec)
    assert t == pytest.approx(1e7 * 1.75 / 100e9, rel=1e-9)  # 175 us, where the flat figure says 93
    assert _flat(spec, "allreduce", 1e7, 8) < t


def test_the_curve_never_makes_a_collective_faster_and_holds_its_end_points():
    spec = _spec()
    small = collectives.collective_time_s("allreduce", 1e4, 8, spec)  # below the curve: latency-bound, flat
    assert small == pytest.approx(_flat(spec, "allreduce", 1e4, 8), rel=1e-9)
    big = collectives.collective_time_s("allreduce", 1e10, 8, spec)  # above: 150 GB/s, its last point
    assert big == pytest.approx(1e10 * 1.75 / 150e9, rel=1e-9)


def test_other_kinds_groups_across_nodes_and_empty_calls_keep_the_flat_time():
    spec = _spec()
    assert collectives.collective_time_s("allgather", 1e7, 8, spec) == pytest.approx(_flat(spec, "allgather", 1e7, 8))
    across = collectives.collective_time_s("allreduce", 1e7, 16, spec)
    assert across == pytest.approx(collectives.collective_time_s("allreduce", 1e7, 16, load_system("a100-80gb-sxm")))
    assert collectives.collective_time_s("allreduce", 0.0, 8, spec) == 0.0
    assert collectives.collective_time_s("allreduce", 1e7, 8, load_system("a100-80gb-sxm")) == pytest.approx(
        _flat(spec, "allreduce", 1e7, 8))


def test_rings_of_the_transformer_front_end_use_it_only_inside_a_node():
    spec = _spec()
    bw = spec.intra_node_bandwidth_bytes_per_s * spec.efficiency["intra_node"]
    inside = pipeline.ring_time_s("allreduce", 1e7, 8, bw, spec, intra=True)
    assert inside == pytest.approx(1e7 * 1.75 / 100e9, rel=1e-9)
    assert pipeline.ring_time_s("allreduce", 1e7, 8, bw, spec) == pytest.approx(_flat(spec, "allreduce", 1e7, 8))
    assert pipeline.inside_node(8, 8) and not pipeline.inside_node(16, 8)


def test_ddp_prices_each_bucket_at_its_own_size():
    spec = _spec()
    bw = spec.intra_node_bandwidth_bytes_per_s * spec.efficiency["intra_node"]
    size = 2 * ddp.BUCKET_BYTES + 10 * 2**20  # two full 25 MiB buckets and a 10 MiB one
    busbw = [50e9 + 100e9 * math.log(b / 1e6) / math.log(100) for b in (ddp.BUCKET_BYTES, 10 * 2**20)]  # linear in log S
    one = [1.75 * b / g for b, g in zip((ddp.BUCKET_BYTES, 10 * 2**20), busbw)]
    assert ddp.allreduce_buckets_s(size, 8, bw, spec, intra=True) == pytest.approx(2 * one[0] + one[1], rel=1e-9)
    flat = ddp.allreduce_buckets_s(size, 8, bw, spec)  # the flat sum: one ring over all bytes + a latency per bucket
    assert flat == pytest.approx(size * 1.75 / bw + 3 * host_constants(spec)["collective_latency_s"], rel=1e-9)


@pytest.mark.parametrize("curve, field", [
    ({"all_reduce": [[1e6, 5e10]]}, "collective_busbw_curve key 'all_reduce'"),
    ({"allreduce": [[1e8, 5e10], [1e6, 6e10]]}, "collective_busbw_curve.allreduce is not sorted"),
    ({"allreduce": [[1e6, -1.0]]}, "collective_busbw_curve.allreduce[0][1]"),
    ([[1e6, 5e10]], "collective_busbw_curve must be an object"),
])
def test_a_bad_curve_names_the_field(curve, field):
    with pytest.raises(UserError, match=field.replace("[", r"\[").replace("]", r"\]")):
        _spec(curve)


def test_the_curve_round_trips_and_older_files_stay_unchanged():
    spec = _spec()
    again = SystemSpec.from_dict(json.loads(spec.to_json()))
    assert again.collective_busbw_curve == spec.collective_busbw_curve
    assert "collective_busbw_curve" not in load_system("a100-80gb-sxm").to_json_dict()
    assert dataclasses.replace(spec, collective_busbw_curve={}).to_json_dict() == \
        load_system("a100-80gb-sxm").to_json_dict() | {"name": spec.name}

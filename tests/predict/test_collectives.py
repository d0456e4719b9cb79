"""Collectives: nccl-tests bus factors, NVLink-vs-network choice, hand-derived times, name mapping."""
import numpy as np
import pytest

from perfcheck.errors import UserError
from perfcheck.predict.collectives import (COLLECTIVE_KINDS, bus_factor, bytes_from_deepspeed_log,
                                            collective_time_s, link_bandwidth_bytes_per_s, normalize_kind)
from perfcheck.hardware.systems import load_system

#: A collective's latency term (alpha) on a GPU spec without its own measurement: the GPU default
#: collective_latency_s in perfcheck/hardware/host_defaults.json.
GPU_ALPHA = 2e-5

# nccl-tests doc/PERFORMANCE.md factors, written out: 2(n-1)/n, (n-1)/n, 1.
EXPECTED = {
    "allreduce": {2: 1.0, 8: 1.75, 64: 126 / 64},
    "allgather": {2: 0.5, 8: 0.875, 64: 63 / 64},
    "reducescatter": {2: 0.5, 8: 0.875, 64: 63 / 64},
    "alltoall": {2: 0.5, 8: 0.875, 64: 63 / 64},
    "broadcast": {2: 1.0, 8: 1.0, 64: 1.0},
    "reduce": {2: 1.0, 8: 1.0, 64: 1.0},
    "sendrecv": {2: 1.0, 8: 1.0, 64: 1.0},
}


def test_kinds_are_canonical():
    assert COLLECTIVE_KINDS == ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall", "sendrecv")


@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
@pytest.mark.parametrize("n", [1, 2, 8, 64])
def test_bus_factor_table(kind, n):
    assert bus_factor(kind, n) == pytest.approx(0.0 if n == 1 else EXPECTED[kind][n])


def test_bus_factor_vectorised():
    got = bus_factor(np.array(["allreduce", "all_gather_into_tensor", "broadcast"]), np.array([8, 64, 1]))
    assert got.tolist() == pytest.approx([1.75, 63 / 64, 0.0])
    assert bus_factor("allreduce", np.array([2, 4])).tolist() == [1.0, 1.5]
    for bad in (0, -1, 2.5):
        with pytest.raises(UserError, match="group_size"):
            bus_factor("allreduce", bad)


@pytest.mark.parametrize("name,kind", [
    ("all_reduce", "allreduce"), ("all_reduce_coalesced", "allreduce"), ("inference_all_reduce", "allreduce"),
    ("all_gather", "allgather"), ("all_gather_into_tensor", "allgather"), ("all_gather_base", "allgather"),
    ("_all_gather_base", "allgather"), ("allgather_fn", "allgather"),
    ("reduce_scatter", "reducescatter"), ("reduce_scatter_tensor", "reducescatter"), ("_reduce_scatter_base", "reducescatter"),
    ("broadcast", "broadcast"), ("reduce", "reduce"), ("all_to_all_single", "alltoall"),
    ("send", "sendrecv"), ("irecv", "sendrecv"), ("AllReduce", "allreduce"),
    ("ncclDevKernel_AllGather_RING_LL", "allgather"), ("ncclKernel_ReduceScatter_Sum_bf16_RING_SIMPLE", "reducescatter"),
])
def test_normalize_kind(name, kind):
    assert normalize_kind(name) == kind


@pytest.mark.parametrize("name", ["barrier", "all_reduce_sum_foo", "", "gather"])
def test_normalize_kind_unknown(name):
    with pytest.raises(UserError) as info:
        normalize_kind(name)
    assert repr(name) in str(info.value)


def test_link_choice_nvlink_vs_network():
    h100 = load_system("h100-sxm")
    assert link_bandwidth_bytes_per_s(h100, 8) == pytest.approx(0.8 * 450e9)           # fits: NVLink
    assert link_bandwidth_bytes_per_s(h100, 2) == pytest.approx(0.8 * 450e9)
    assert link_bandwidth_bytes_per_s(h100, 16) == pytest.approx(0.8 * 50e9)           # two nodes: IB
    assert link_bandwidth_bytes_per_s(h100, 4, spans_nodes=True) == pytest.approx(0.8 * 50e9)   # 4 ranks on 4 nodes
    assert link_bandwidth_bytes_per_s(h100, 16, spans_nodes=False) == pytest.approx(0.8 * 50e9)  # cannot fit
    got = link_bandwidth_bytes_per_s("a100-80gb-sxm", np.array([8, 9]), np.array([False, False]))
    assert got.tolist() == pytest.approx([0.8 * 300e9, 0.8 * 25e9])


def test_collective_times_by_hand():
    # 1 GB allreduce over 8 H100s on NVLink: 1e9 * 2*7/8 / (0.8 * 450e9) + 5 us.
    assert collective_time_s("allreduce", 1e9, 8, "h100-sxm") == pytest.approx(1e9 * 1.75 / 360e9 + GPU_ALPHA)
    # ZeRO-3 allgather of 1 GB of parameters over 64 H100s (8 nodes): bottleneck is the 400 Gb/s NIC.
    assert collective_time_s("all_gather_into_tensor", 1e9, 64, "h100-sxm") == pytest.approx(1e9 * 63 / 64 / 40e9 + GPU_ALPHA)
    # Pipeline send of 100 MB between nodes on A100 (200 Gb/s HDR).
    assert collective_time_s("send", 1e8, 2, "a100-80gb-sxm", spans_nodes=True) == pytest.approx(1e8 / 20e9 + GPU_ALPHA)


def test_collective_time_matches_nccl_tests_definition():
    # busbw = algbw * factor = (S / t) * factor must equal the link bandwidth (latency removed).
    for kind in COLLECTIVE_KINDS:
        for n in (2, 8):
            t = collective_time_s(kind, 4e9, n, "h200") - GPU_ALPHA
            assert (4e9 / t) * bus_factor(kind, n) == pytest.approx(0.8 * 450e9)


def test_collective_time_zero_cases_and_arrays():
    assert collective_time_s("allreduce", 1e9, 1, "h100-sxm") == 0.0
    assert collective_time_s("allreduce", 0, 8, "h100-sxm") == 0.0
    t = collective_time_s(np.array(["allreduce", "reduce_scatter_tensor", "allreduce"]),
                          np.array([1e9, 1e9, 1e9]), np.array([8, 16, 1]), "h100-sxm")
    assert t.tolist() == pytest.approx([1e9 * 1.75 / 360e9 + GPU_ALPHA, 1e9 * 15 / 16 / 40e9 + GPU_ALPHA, 0.0])
    # An empty kind marks rows without a collective.
    t = collective_time_s(np.array(["", "allreduce", None], dtype=object), np.array([1e9, 1e9, 1e9]), 8, "h100-sxm")
    assert t.tolist() == pytest.approx([0.0, 1e9 * 1.75 / 360e9 + GPU_ALPHA, 0.0])
    with pytest.raises(UserError, match="bytes"):
        collective_time_s("allreduce", -1, 8, "h100-sxm")


def test_bytes_from_deepspeed_log():
    # DeepSpeed logs the per-rank shard for all_gather/reduce_scatter; S is n times that.
    assert bytes_from_deepspeed_log("all_gather_into_tensor", 1e6, 8) == 8e6
    assert bytes_from_deepspeed_log("reduce_scatter_tensor", 1e6, 4) == 1e6  # logged: the full input
    assert bytes_from_deepspeed_log("all_reduce", 1e6, 8) == 1e6
    assert bytes_from_deepspeed_log("all_gather", np.array([1.0, 2.0]), 2).tolist() == [2.0, 4.0]

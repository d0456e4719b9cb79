"""Roofline: hand-derived times, bounds, efficiency curves, vectorisation, op_time >= ideal."""
import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from perfcheck.errors import UserError
from perfcheck.predict.roofline import (compute_time_s, flag_bandwidth_above_peak, flag_rate_above_peak,
                                         ideal_time_s, matrix_efficiency, memory_time_s, op_time_s)
from perfcheck.hardware.systems import list_systems, load_system

H100 = load_system("h100-sxm")
#: h100-sxm's efficiency.matrix_sustained: 657 / 727 TFLOP/s, last 5 s / first second of a 40-second GEMM loop
#: (bench/results/h100_gemm_shapes.json), multiplying every matrix efficiency
SUSTAINED = 0.904


def test_gemm_on_h100_by_hand():
    # 1e12-FLOP bf16 GEMM at 0.8 x 0.904 (sustained) of 989.4e12 FLOP/s; no shape given: no shape factor.
    assert compute_time_s(1e12, 0, "h100-sxm", torch.bfloat16) == pytest.approx(1e12 / (0.8 * SUSTAINED * 989.4e12))
    # FP8 uses its own MAMF efficiency, 0.71 of 1978.9e12, sustained likewise.
    assert compute_time_s(1e12, 0, H100, "fp8") == pytest.approx(1e12 / (0.71 * SUSTAINED * 1978.9e12))
    # Elementwise FLOPs run on the vector units: 1e9 / (0.8 * 133.8e12).
    assert compute_time_s(0, 1e9, H100, "bf16") == pytest.approx(1e9 / (0.8 * 133.8e12))
    assert compute_time_s(1e12, 1e9, H100, "bf16") == pytest.approx(1e12 / (0.8 * SUSTAINED * 989.4e12)
                                                                     + 1e9 / (0.8 * 133.8e12))
    # A GEMM whose smallest dimension is 1024 runs at the measured 0.724 of the reference (shape curve point);
    # 128 (an attention score product's head dim) at 0.29; 8192 (the reference) at 1.
    for dim, ratio in ((1024, 0.724), (128, 0.29), (8192, 1.0)):
        assert compute_time_s(1e12, 0, H100, "bf16", min_dim=dim) == pytest.approx(
            1e12 / (0.8 * SUSTAINED * ratio * 989.4e12))


def test_memory_time_by_hand():
    # 1 GB through A100 80GB HBM2e at 0.88 of 2039e9 B/s.
    assert memory_time_s(1e9, "a100-80gb-sxm") == pytest.approx(1e9 / (0.88 * 2039e9))


def test_op_time_bounds_by_hand():
    # 8192^3 GEMM: 2*8192^3 FLOPs, reads/writes 3 bf16 matrices = 3*2*8192^2 bytes -> compute-bound.
    flops, nbytes = 2 * 8192 ** 3, 3 * 2 * 8192 ** 2
    t, bound = op_time_s(flops, 0, nbytes, 1, H100, "bf16")
    assert bound == "compute" and t == pytest.approx(flops / (0.8 * SUSTAINED * 989.4e12) + 5e-6)
    # LayerNorm-like op: 1 GB moved, 5e8 FLOPs -> memory-bound.
    t, bound = op_time_s(0, 5e8, 1e9, 1, H100, "bf16")
    assert bound == "memory" and t == pytest.approx(1e9 / (0.88 * 3.35e12) + 5e-6)
    # A tiny op: 3 launches of 5 us dominate.
    t, bound = op_time_s(1e3, 1e3, 1e3, 3, H100, "bf16")
    assert bound == "overhead" and t == pytest.approx(15e-6, rel=1e-3)
    assert isinstance(t, float) and isinstance(bound, str)


def test_ideal_time_by_hand_and_both_call_forms():
    expected = max(1e12 / 989.4e12, 1e6 / 3.35e12)
    assert ideal_time_s(1e12, 0, 1e6, H100, "bf16") == pytest.approx(expected)
    assert ideal_time_s(1e12, 0, 1e6, 7, H100, "bf16") == pytest.approx(expected)   # op_time_s's signature
    assert ideal_time_s(0, 0, 3.35e12, system="h100-sxm", dtype="bf16") == pytest.approx(1.0)
    with pytest.raises(UserError):
        ideal_time_s(1, 1, 1)


def test_vectorised_matches_scalar_calls():
    rng = np.random.default_rng(0)
    mf, of, nb = (rng.uniform(0, 1e12, (3, 4)) for _ in range(3))
    k = rng.integers(0, 20, (3, 4))
    t, bound = op_time_s(mf, of, nb, k, H100, "bf16")
    assert t.shape == bound.shape == (3, 4)
    for idx in np.ndindex(3, 4):
        ts, bs = op_time_s(mf[idx], of[idx], nb[idx], k[idx], H100, "bf16")
        assert t[idx] == pytest.approx(ts) and bound[idx] == bs
    ideal = ideal_time_s(mf, of, nb, k, H100, "bf16")
    assert ideal.shape == (3, 4)


def test_large_arrays_are_fast():
    import time

    n = 1_000_000
    start = time.process_time()  # process CPU time: a busy machine's other processes do not count against it
    op_time_s(np.full(n, 1e9), np.full(n, 1e6), np.full(n, 1e7), np.ones(n), H100, "bf16")
    assert time.process_time() - start < 2.0   # a Python loop over 1e6 rows takes far longer


def test_negative_inputs_are_user_errors():
    with pytest.raises(UserError, match="bytes_moved"):
        memory_time_s(np.array([1.0, -1.0]), H100)
    with pytest.raises(UserError, match="matrix_flops"):
        compute_time_s(-1, 0, H100, "bf16")
    with pytest.raises(UserError, match=r"v100-sxm.*bf16"):
        compute_time_s(1, 0, "v100-sxm", "bf16")


CURVED = dataclasses.replace(H100, name="h100-curved", calibrated=True,  # without the sustained factor
                             efficiency={k: v for k, v in H100.efficiency.items() if k != "matrix_sustained"},
                             matrix_efficiency_curve=[[1e6, 0.1], [1e9, 0.5], [1e12, 0.9]])


def test_efficiency_curve_interpolates_in_log_flops():
    assert matrix_efficiency(CURVED, "bf16", 1e9) == pytest.approx(0.5)
    assert matrix_efficiency(CURVED, "bf16", 10 ** 10.5) == pytest.approx(0.7)     # halfway in log10
    assert matrix_efficiency(CURVED, "bf16", 1e3) == pytest.approx(0.1)            # clamped below
    assert matrix_efficiency(CURVED, "bf16", 1e15) == pytest.approx(0.9)           # clamped above
    assert matrix_efficiency(CURVED, "fp8", 1e12) == pytest.approx(0.9 * 0.71 / 0.8)  # per-dtype scale
    assert compute_time_s(1e9, 0, CURVED, "bf16") == pytest.approx(1e9 / (0.5 * 989.4e12))
    # The same FLOPs split over 1000 kernels of 1e6 each run at 0.1.
    assert compute_time_s(1e9, 0, CURVED, "bf16", kernels=1000) == pytest.approx(1e9 / (0.1 * 989.4e12))
    t, _ = op_time_s(1e9, 0, 0, 1000, CURVED, "bf16")
    assert t == pytest.approx(1e9 / (0.1 * 989.4e12) + 1000 * 5e-6)
    # Without a curve the flat figure applies at any size.
    assert matrix_efficiency(H100, "bf16", np.array([1e3, 1e12])).tolist() == pytest.approx([0.8 * SUSTAINED] * 2)


def test_flag_rates_above_peak():
    # DeepSpeed's tutorial printed 1310 and 735 TFLOPS for Linear layers on a 312 TFLOPS A100.
    flags = flag_rate_above_peak(np.array([1310e12, 735e12, 271.2e12, np.nan]), "a100-80gb-sxm", "bf16")
    assert flags.tolist() == [True, True, False, False]
    assert flag_rate_above_peak(989.4e12, H100, "bf16") is False
    assert flag_rate_above_peak(989.5e12, H100, "bf16") is True
    assert flag_bandwidth_above_peak(np.array([3.0e12, 3.4e12]), H100).tolist() == [False, True]


_SYSTEM_DTYPES = [(name, d) for name in list_systems() for d in load_system(name).matrix_flops_per_s] + \
                 [(CURVED, "bf16"), (CURVED, "fp8")]
_values = arrays(np.float64, 8, elements=st.floats(0, 1e18, allow_nan=False, allow_infinity=False))


@settings(max_examples=60, deadline=None)
@given(system_dtype=st.sampled_from(_SYSTEM_DTYPES), mf=_values, of=_values, nb=_values,
       k=arrays(np.int64, 8, elements=st.integers(0, 10_000)))
def test_op_time_never_beats_ideal(system_dtype, mf, of, nb, k):
    system, dtype = system_dtype
    t, bound = op_time_s(mf, of, nb, k, system, dtype)
    ideal = ideal_time_s(mf, of, nb, k, system, dtype)
    assert np.all(t >= ideal)
    assert set(bound.tolist()) <= {"compute", "memory", "overhead"}


# A CPU whose copies run 4x faster when they move 1 MB per kernel than at 100 MB (cache-resident).
CACHED = dataclasses.replace(load_system("cpu"), name="cpu-cached", calibrated=True, mem_bandwidth_bytes_per_s=1e10,
                             efficiency={**load_system("cpu").efficiency, "memory": 1.0},
                             mem_bandwidth_curve=((1e6, 4.0), (1e8, 1.0)))


def test_bandwidth_curve_by_working_set_by_hand():
    # 1 MB in one kernel: 1e6 / (1e10 * 4) = 25 us
    assert memory_time_s(1e6, CACHED, kernels=1) == pytest.approx(25e-6)
    # 10 MB in one kernel: halfway in log(bytes) between the points -> factor 4 + (1 - 4) * 0.5 = 2.5
    assert memory_time_s(1e7, CACHED, kernels=1) == pytest.approx(1e7 / 2.5e10)
    # the same 10 MB as 10 kernels of 1 MB: factor 4
    assert memory_time_s(1e7, CACHED, kernels=10) == pytest.approx(1e7 / 4e10)
    # clamped at the ends: 1 kB -> 4; 1 GB -> 1
    assert memory_time_s(1e3, CACHED, kernels=1) == pytest.approx(1e3 / 4e10)
    assert memory_time_s(1e9, CACHED, kernels=1) == pytest.approx(1e9 / 1e10)
    # without kernels (the optimizer's and ZeRO's streams): the large-copy ceiling, whatever the size
    assert memory_time_s(1e6, CACHED) == pytest.approx(1e6 / 1e10)
    # vectorised like the rest
    np.testing.assert_allclose(memory_time_s(np.array([1e6, 1e7]), CACHED, kernels=np.array([1, 1])),
                               [25e-6, 1e7 / 2.5e10])
    # a spec without a curve: factor 1 (every built-in datasheet)
    assert memory_time_s(1e6, "cpu", kernels=1) == pytest.approx(memory_time_s(1e6, "cpu"))


def test_op_time_uses_the_bandwidth_curve_per_kernel():
    # an elementwise copy of 1 MB per kernel, 2 kernels, no FLOPs: memory-bound at 4x the ceiling
    t, bound = op_time_s(0, 0, 2e6, 2, CACHED, "fp32", launch_s=0.0)
    assert bound == "memory" and t == pytest.approx(2e6 / 4e10)


def test_bandwidth_curve_validation_names_the_field():
    data = CACHED.to_json_dict()
    from perfcheck.hardware.systems import SystemSpec

    assert SystemSpec.from_dict(data).mem_bandwidth_curve == ((1e6, 4.0), (1e8, 1.0))  # round trip
    for bad in ([[1e8, 1.0], [1e6, 4.0]], [[1e6, 0.0]], [[1e6, 100.0]], "fast"):
        with pytest.raises(UserError, match="mem_bandwidth_curve"):
            SystemSpec.from_dict({**data, "mem_bandwidth_curve": bad})

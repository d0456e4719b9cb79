"""Elementwise ops priced at their own measured rate (``op_flop_s``) and the optimizer's tensors fetched from beyond
a small L3 (``host.optimizer_far``): each checked against hand arithmetic on a spec built here."""
import dataclasses

import numpy as np
import pandas as pd
import pytest

from perfcheck.hardware.systems import host_constants, load_system
from perfcheck.predict import efficiency, host, optimizers, roofline

US = 1e-6
MIB = 2 ** 20


def _cpu(**fields):
    base = load_system("cpu")
    values = {k: 0.0 for k in host_constants(base)}
    return dataclasses.replace(base, host=values, **fields)


def test_fit_prices_each_op_per_flop_less_its_fixed_costs():
    # an oprate row: sqrt on 262144 elements (262144 formula FLOPs) took 150 us; no dispatch row here, so nothing
    # but the op's own fixed cost (an opfixed row of 6 us) comes off: (150 - 6) us / 262144 FLOPs
    from perfcheck.calibrate import fit

    table = pd.DataFrame({"kind": ["opfixed", "oprate", "oprate"], "label": ["sqrt", "sqrt", "exp"],
                          "dtype": ["fp32"] * 3, "flops": [0.0] * 3, "bytes": [0.0, 2 * 2 ** 20, 2 * 2 ** 20],
                          "m": [0, 262144, 262144], "n": [0.0, 262144.0, 262144.0],
                          "seconds": [6 * US, 150 * US, 0.0]})
    out = fit.build_spec(load_system("cpu"), table, peaks="base", stamp="test")
    assert out.op_flop_s["sqrt"] == pytest.approx(144 * US / 262144)
    assert "exp" not in out.op_flop_s  # read nothing above its fixed costs: no price, not a zero one


def test_keys_drop_foreach_and_in_place_marks():
    assert [efficiency.op_flop_key(n) for n in ("sqrt", "sqrt_", "_foreach_sqrt", "_foreach_addcdiv_",
                                                "_safe_softmax")] == ["sqrt", "sqrt", "sqrt", "addcdiv",
                                                                      "_safe_softmax"]


def test_an_ops_compute_term_is_at_least_its_flops_at_its_price():
    spec = _cpu(op_flop_s={"sqrt": 2e-9})
    n = 1e6
    args = (np.zeros(1), np.array([n]), np.array([8 * n]), np.ones(1), spec, "fp32")
    plain = roofline.device_times_read(*args, names=np.array(["add"], dtype=object), phase="fwd", launch_s=0.0)
    root = roofline.device_times_read(*args, names=np.array(["sqrt_"], dtype=object), phase="fwd", launch_s=0.0)
    back = roofline.device_times_read(*args, names=np.array(["sqrt"], dtype=object), phase="bwd", launch_s=0.0)
    assert float(root["time"][0]) == pytest.approx(n * 2e-9)  # 2 ms, far above the roofline's bytes and FLOPs
    assert float(plain["time"][0]) < 0.2 * n * 2e-9
    assert float(back["time"][0]) == pytest.approx(float(plain["time"][0]))  # a backward runs other kernels: no floor


def test_optimizer_kernels_carry_their_ops_and_foreach_streams_match_the_for_loop():
    loop, each = optimizers.profile("adamw", "for-loop"), optimizers.profile("adamw", "foreach")
    assert len(loop.names) == len(loop.kernels) and "sqrt" in loop.names
    # torch.sqrt of the second moment reads it and writes a new tensor: 2 streams in both implementations (the
    # foreach op's list output was once counted against its first tensor: 3 / 1 between two tensors)
    assert dict(zip(each.names, each.kernels))["_foreach_sqrt"] == 2 == dict(zip(loop.names, loop.kernels))["sqrt"]
    assert sum(each.kernels) == sum(loop.kernels) == 21
    assert (optimizers.profile("sgd", "for-loop").persistent, optimizers.profile("sgd_momentum", "for-loop").persistent,
            loop.persistent, optimizers.profile("adam_amsgrad", "for-loop").persistent) == (2, 3, 4, 5)


def test_optimizer_sqrt_kernel_runs_at_its_price():
    price, n = 5e-9, 100_000
    cheap, priced = _cpu(), _cpu(op_flop_s={"sqrt": price})
    a = host.optimizer_time([n], "adam-for-loop", cheap)
    b = host.optimizer_time([n], "adam-for-loop", priced)
    sqrt_roof = max(float(roofline.memory_time_s(2 * n * 4, cheap, kernels=1.0)),
                    float(roofline.compute_time_s(0.0, n, cheap, "fp32")))
    assert b.device_s - a.device_s == pytest.approx(n * price - sqrt_roof)


def test_optimizer_far_refetches_the_l3_share_of_its_state_at_memory_speed():
    l3 = 32 * MIB
    # bandwidth curve: 4x the base rate at L3 / 4 (a buffer the L3 holds), 1x at 4 L3 (memory)
    spec = _cpu(mem_bandwidth_curve=((l3 / 4, 4.0), (4 * l3, 1.0)), calibration={"l3_bytes": l3})
    spec = dataclasses.replace(spec, host={**dict(spec.host), "op_cold_far_s": 30 * US, "l3_residency_s": 2e-3})
    rate = spec.mem_bandwidth_bytes_per_s * spec.efficiency["memory"]
    numels, model = [1_000_000, 500_000], 3_000_000
    hot = host.optimizer_time(numels, "sgd", spec, step_s=1e-3, model_numel=model)  # short step, state < L3
    far = host.optimizer_time(numels, "sgd", spec, step_s=5e-3, model_numel=model)  # the step outlasts the L3
    # SGD: parameter + gradient (2 persistent tensors) x 4 B; state 3e6 x 8 B = 24 MB < 32 MiB: share 1
    fetched = sum(numels) * 2 * 4
    assert far.device_s - hot.device_s == pytest.approx(fetched * (1 / rate - 1 / (4 * rate)))
    # a model whose state exceeds the L3: only the L3's share of it is refetched (the rest streams in a tight loop)
    big = 10 * l3 // 8
    a = host.optimizer_time(numels, "sgd", spec, step_s=0.0, model_numel=big)
    b = host.optimizer_time(numels, "sgd", dataclasses.replace(spec, calibration={}), step_s=0.0, model_numel=big)
    assert a.device_s - b.device_s == pytest.approx(fetched * 0.1 * (1 / rate - 1 / (4 * rate)))
    # no far cases in the calibration (an L3 above 64 MiB, a GPU): never far
    assert host.optimizer_far_share(dataclasses.replace(spec, calibration={}), 1.0, 1e12) == 0.0


def test_optimizer_far_share_follows_the_l3_loss_curve():
    l3 = 32 * MIB
    spec = _cpu(mem_bandwidth_curve=((l3 / 4, 4.0), (4 * l3, 1.0)),
                calibration={"l3_bytes": l3, "l3_lost": ((2e-3, 0.4), (8e-3, 0.7))})
    spec = dataclasses.replace(spec, host={**dict(spec.host), "op_cold_far_s": 30 * US, "l3_residency_s": 5e-3})
    rate = spec.mem_bandwidth_bytes_per_s * spec.efficiency["memory"]
    numels, model = [1_000_000, 500_000], 3_000_000
    fetched = sum(numels) * 2 * 4  # SGD's parameter and gradient, fp32
    base = host.optimizer_time(numels, "sgd", spec, step_s=1e-4, model_numel=model)  # under a tenth of 2 ms: 0
    # the curve, not the 5 ms threshold: 0.4 at 2 ms, halfway in log(age) between 2 and 8 ms (4 ms) 0.55
    for step, share in ((2e-3, 0.4), (4e-3, 0.55), (16e-3, 0.85), (1.0, 1.0)):
        t = host.optimizer_time(numels, "sgd", spec, step_s=step, model_numel=model)
        assert host.optimizer_far_share(spec, step, model * 8) == pytest.approx(share)
        assert t.device_s - base.device_s == pytest.approx(share * fetched * (1 / rate - 1 / (4 * rate)))
    assert host.optimizer_far_share(spec, 1e-4, 10 * l3) == 1.0  # state beyond the L3: all of it, whatever the time

"""In-place kernels beyond the L2 stream at 1.5x a copy-calibrated rate on a CPU (write_allocate.WRITE_ALLOCATE_GAIN).

Hand arithmetic: a copy's counted bytes (read n, write n) move 3n under write-allocate, an in-place kernel's move what
they count, so on a spec whose bandwidth a copy measured, an in-place kernel's memory time is 2/3 of an out-of-place
one's of the same bytes; below the L2 (the copy's stores hit cached lines) and on a GPU nothing changes."""
import dataclasses

import numpy as np
import pytest
import torch

from perfcheck.hardware.systems import load_system
from perfcheck.predict import host, roofline, write_allocate

L2 = 2 ** 20


def _cpu(l2=L2):
    return dataclasses.replace(load_system("cpu"), calibration={"l2_bytes": l2})


@pytest.mark.parametrize("name, inplace", [("add_", True), ("relu_", True), ("_foreach_mul_", True),
                                           ("_fused_adamw_", True), ("addcdiv_", True), ("add", False),
                                           ("sqrt", False), ("copy_", False), ("fill_", False), ("zero_", False),
                                           ("_softmax", False), ("__and__", False)])
def test_which_kernels_are_in_place(name, inplace):
    assert write_allocate.is_inplace(name) is inplace


def test_an_in_place_kernel_beyond_the_l2_takes_two_thirds_of_the_time():
    spec, b = _cpu(), 64.0 * L2
    out = float(roofline.memory_time_s(b, spec, kernels=1.0))
    inp = float(roofline.memory_time_s(b, spec, kernels=1.0, inplace=True))
    assert inp == pytest.approx(out * 2 / 3, rel=1e-12)
    # per kernel: two kernels of half the bytes each still exceed the L2
    assert float(roofline.memory_time_s(b, spec, kernels=2.0, inplace=True)) == pytest.approx(
        float(roofline.memory_time_s(b, spec, kernels=2.0)) * 2 / 3, rel=1e-12)


def test_no_gain_below_the_l2_on_a_gpu_or_a_datasheet_cpu():
    b = 0.5 * L2
    assert float(roofline.memory_time_s(b, _cpu(), kernels=1.0, inplace=True)) == \
        float(roofline.memory_time_s(b, _cpu(), kernels=1.0))
    for spec in (load_system("cpu"), dataclasses.replace(load_system("h100-sxm"), calibration={"l2_bytes": L2})):
        assert float(roofline.memory_time_s(64.0 * L2, spec, kernels=1.0, inplace=True)) == \
            float(roofline.memory_time_s(64.0 * L2, spec, kernels=1.0))


def test_the_op_tables_in_place_rows_get_it_forward_only():
    spec = _cpu()
    names = np.array(["add_", "add"])
    b = np.array([64.0 * L2, 64.0 * L2])
    args = (np.zeros(2), np.zeros(2), b, np.ones(2), spec, "fp32")
    fwd = roofline.device_times_read(*args, names=names, phase="fwd", launch_s=0.0)["memory"]
    bwd = roofline.device_times_read(*args, names=names, phase="bwd", launch_s=0.0)["memory"]
    assert fwd[0] == pytest.approx(fwd[1] * 2 / 3, rel=1e-12)
    assert bwd[0] == pytest.approx(bwd[1], rel=1e-12)  # relu_'s backward is threshold_backward, out of place


def test_sgds_step_on_a_large_tensor_streams_at_the_in_place_rate():
    # SGD's for-loop step is one add_ of 3 streams per tensor: its device memory time is 3 n 4 bytes at 1.5x the rate
    spec = _cpu()
    n = 16 * L2  # 64 MiB per stream
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    cost = host.optimizer_time([n], opt, spec)
    hc = host.host_constants(spec)
    expected = float(roofline.memory_time_s(3.0 * n * 4, spec, kernels=1.0)) / 1.5 + hc["device_kernel_s"]
    assert cost.device_s == pytest.approx(expected, rel=1e-9)

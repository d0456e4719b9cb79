"""Every dtype a shipped GPU spec lists builds its calibration cases (a second dtype table without tf32 once
shadowed the first, so `perfcheck calibrate` on an H100 failed at its tf32 matmul cases: KeyError)."""
import pytest
import torch

from perfcheck.calibrate import cases, op_cases
from perfcheck.hardware.systems import load_system, normalize_dtype

GPU_SPECS = ("h100-sxm", "a100-80gb-sxm", "h200")


@pytest.mark.parametrize("name", GPU_SPECS)
def test_matmul_cases_build_for_every_dtype_a_gpu_spec_lists(name):
    cpu = torch.device("cpu")  # the cases' shapes and dtypes are device-independent; the call runs on the CPU
    for dtype in load_system(name).matrix_flops_per_s:
        d = normalize_dtype(dtype)
        if d not in ("fp32", "tf32", "bf16", "fp16"):
            continue  # fp8 has no calibration case
        built = cases.matmul_cases(d, [16], [(4, 8, 16)], cpu)
        assert len(built) == 2 and all(c.dtype == d for c in built)
        built[0].fn()


def test_host_cases_in_bf16_build_with_gradients():
    built = op_cases.op_fixed_cases(torch.device("cpu"), ("bf16",))
    assert any(c.dtype == "bf16" for c in built)

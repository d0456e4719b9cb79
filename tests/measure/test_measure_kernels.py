"""Kernel/op tables: conservation against the profiler's own total, attribution to the innermost
module and phase, the scheduled window only, and the Chrome trace."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from perfcheck import PerfCheck
from perfcheck.examples.models import GPT, Net
from perfcheck.measure.kernel_table import OPTIMIZER, OUTSIDE_OPS, UNATTRIBUTED, kernel_rows
from perfcheck.measure.timer import CpuClock, ModuleTimer
from perfcheck.measure.context import model_view
from perfcheck.schema import KERNEL_COLUMNS, PHASES, ROOT


def _train(model, x, y, pc, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        pc.step()


@pytest.fixture(scope="module")
def lenet_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    torch.manual_seed(0)
    model = Net()
    pc = PerfCheck(model, warmup=1, steps=2, profile=True, profile_window=(1, 1, 2), sample_interval=None,
                   out_dir=out)
    with pc:
        _train(model, torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,)), pc, 8)
    return pc, out


def test_kernel_sum_equals_profiler_total_in_perfcheck(lenet_run):
    pc, _ = lenet_run
    k = pc.kernels()
    assert list(k.columns) == list(KERNEL_COLUMNS) and len(k) > 0
    info = pc.meta()["profile"]
    assert k["self_s"].sum() == pytest.approx(info["total_s"], rel=1e-9, abs=1e-12)
    assert set(k["phase"]) <= set(PHASES) | {UNATTRIBUTED}
    assert (k["device"] == "cpu").all() and (k["self_s"] <= k["total_s"] + 1e-12).all()


def test_kernel_sum_equals_torch_key_averages_independently():
    """The same identity against torch's own aggregation (key_averages), on a window we profile."""
    torch.manual_seed(0)
    model = GPT(n_layer=2, n_head=2, d_model=32, vocab=50, seq_len=16)
    view = model_view(model)
    timer = ModuleTimer(view.modules, CpuClock())
    timer.attach()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randint(0, 50, (2, 16))
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            timer.begin_step()
            model(x).sum().backward()
            opt.step()
            timer.end_step().resolve()
    finally:
        timer.detach()
    k = kernel_rows(prof.events(), "cpu")
    assert k["self_s"].sum() == pytest.approx(prof.key_averages().self_cpu_time_total * 1e-6, rel=1e-9)
    # every module that ran forward owns some time; nothing is lost to unattributed forward work
    owned = set(k["module"])
    assert {ROOT, "wte", "h.0.attn.c_attn", "h.1.mlp.c_proj", "lm_head", OPTIMIZER} <= owned
    assert set(k[k.phase == "bwd"]["module"]) >= {"h.0.attn.c_attn", "h.1.mlp.c_fc", "lm_head", "wte"}


def test_ops_go_to_the_innermost_module_and_phase(lenet_run):
    pc, _ = lenet_run
    k = pc.kernels()

    def names(module, phase):
        return set(k[(k.module == module) & (k.phase == phase)]["name"])

    assert "aten::addmm" in names("fc1", "fwd") and "aten::convolution" in names("conv1", "fwd")
    assert "aten::mm" in names("fc1", "bwd") and "aten::convolution_backward" in names("conv2", "bwd")
    assert "aten::max_pool2d_with_indices_backward" in names("pool", "bwd")
    # F.relu runs in Net.forward itself: the root owns it, forward and backward
    assert "aten::relu" in names(ROOT, "fwd") and "aten::threshold_backward" in names(ROOT, "bwd")
    assert "aten::relu" not in names("conv1", "fwd")
    assert names(OPTIMIZER, "optim")  # torch.optim's Optimizer.step# range
    assert "aten::nll_loss_forward" in names(UNATTRIBUTED, UNATTRIBUTED)  # the loss is outside the model
    assert OUTSIDE_OPS in names("conv1", "fwd")


def test_only_the_scheduled_window_is_profiled(lenet_run):
    pc, _ = lenet_run
    k = pc.kernels()
    # window (wait=1, warmup=1, active=2): exactly 2 steps recorded, one fc1 forward addmm each
    assert k[(k.module == "fc1") & (k.phase == "fwd") & (k.name == "aten::addmm")]["count"].sum() == 2
    steps = pc.steps().set_index("step")
    assert steps.loc[[2, 3, 4], "role"].tolist() == ["profile"] * 3 and steps.loc[1, "role"] == "measured"
    assert pc.meta()["profile"]["steps"] == [3, 4]


def test_chrome_trace_has_named_module_ranges(lenet_run):
    _, out = lenet_run
    trace = json.loads((out / "rank0" / "trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"perfcheck/fwd/conv1", "perfcheck/fwd/(root)", "perfcheck/bwd/fc1/begin", "perfcheck/bwd/fc1/end"} <= names


def test_profiler_off_gives_empty_table_and_no_trace(tmp_path):
    model = Net()
    pc = PerfCheck(model, warmup=0, steps=1, profile=False, sample_interval=None, out_dir=tmp_path)
    with pc:
        _train(model, torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,)), pc, 2)
    assert pc.kernels().empty and not (tmp_path / "rank0" / "trace.json").exists()
    assert pc.meta()["profile"] == "off"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_kernel_sum_equals_device_total():
    model = GPT(n_layer=2, n_head=2, d_model=64, vocab=100, seq_len=32).cuda()
    x = torch.randint(0, 100, (2, 32), device="cuda")
    pc = PerfCheck(model, warmup=1, steps=1, profile=True, sample_interval=None)
    with pc:
        while not pc.done:
            model(x).sum().backward()
            pc.step()
    k = pc.kernels()
    assert (k.device == "cuda").all() and (k.total_s == k.self_s).all()
    assert k["self_s"].sum() == pytest.approx(pc.meta()["profile"]["total_s"], rel=1e-9)
    assert {"h.0.attn.c_attn", "lm_head"} <= set(k[k.phase == "bwd"]["module"])


def test_device_rows_take_the_launching_ops_context_and_conserve_the_device_total():
    """CUDA path on fake events (torch's own Kernel records): kernels go to the op that launched them,
    a runtime call (cudaLaunchKernel) that also lists them is not counted twice, a record_function
    range's device-side copy is no kernel, and device events no op claims stay in the table as
    unattributed, so the rows sum to the device total."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import Kernel

    from perfcheck.measure.kernel_table import _device_rows, profiler_total_s

    def dev(name, us):
        return SimpleNamespace(device_type=DeviceType.CUDA, name=name,
                               time_range=SimpleNamespace(elapsed_us=lambda: us))

    mm = SimpleNamespace(device_type=DeviceType.CPU, name="aten::mm", is_legacy=False,
                         kernels=[Kernel("gemm", 0, 30.0), Kernel("gemm", 0, 30.0)])
    launch = SimpleNamespace(device_type=DeviceType.CPU, name="cudaLaunchKernel", is_legacy=False,
                             kernels=[Kernel("gemm", 0, 30.0)])  # torch 2.11: a correlation-id collision
    rng = SimpleNamespace(device_type=DeviceType.CPU, name="perfcheck/fwd/h.0", is_legacy=False, kernels=[])
    events = [mm, launch, rng, dev("gemm", 30.0), dev("gemm", 30.0), dev("elementwise", 5.0), dev("Memcpy HtoD", 2.0),
              dev("perfcheck/fwd/h.0", 70.0)]  # the range's device-side copy (gpu_user_annotation): not work
    acc = {}

    def add(key, total_us, self_us):
        row = acc.setdefault(key, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += total_us
        row[2] += self_us

    _device_rows(events, {id(mm): ("h.0.mlp.c_fc", "fwd")}, add, acc, {id(mm): 7})
    assert acc[("h.0.mlp.c_fc", "fwd", "gemm", 7)] == [2, 60.0, 60.0]  # the launching op's step
    assert acc[(UNATTRIBUTED, UNATTRIBUTED, "elementwise", -1)] == [1, 5.0, 5.0]  # unclaimed: no step
    assert acc[(UNATTRIBUTED, UNATTRIBUTED, "Memcpy HtoD", -1)] == [1, 2.0, 2.0]
    assert sum(r[1] for r in acc.values()) == 30.0 + 30.0 + 5.0 + 2.0
    assert profiler_total_s(events, "cuda") == pytest.approx((30.0 + 30.0 + 5.0 + 2.0) * 1e-6)

"""PerfCheck on a CUDA device: per-module times from CUDA events against planted GPU delays
(``torch.cuda._sleep`` spins a kernel for a number of clock cycles; the reference is the same spin
timed with a pair of events outside PerfCheck), no device synchronize added, and the awkward
cases: in-place ops, activation checkpointing, shared modules, an exception mid-forward, bf16
autocast, torch.compile and CUDA graphs. Every test here skips without CUDA."""
from __future__ import annotations

import time
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from perfcheck import PerfCheck
from perfcheck.examples.models import GPT, JSC_Tiny
from perfcheck.schema import ROOT

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CYCLES = 4_000_000  # a few ms of GPU time on any current GPU (1-2 GHz SM clock)


def gpu_seconds(fn, repeats=5) -> float:
    """Median device time of ``fn`` by a pair of CUDA events (the independent reference)."""
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e-3)
    return sorted(out)[len(out) // 2]


class SpinFn(torch.autograd.Function):
    """Identity that spins the GPU ``fwd`` cycles in forward and ``bwd`` cycles in backward."""

    @staticmethod
    def forward(ctx, x, fwd, bwd):
        torch.cuda._sleep(fwd)
        ctx.bwd = bwd
        y = x * 1.0
        ctx.save_for_backward(y)  # a saved tensor: checkpoint recompute re-runs this forward
        return y

    @staticmethod
    def backward(ctx, grad):
        ctx.saved_tensors  # noqa: B018 - unpack (triggers non-reentrant recompute)
        torch.cuda._sleep(ctx.bwd)
        return grad, None, None


class Spin(nn.Module):
    def __init__(self, fwd, bwd, width=64):
        super().__init__()
        self.fwd, self.bwd = fwd, bwd
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        return SpinFn.apply(self.lin(x), self.fwd, self.bwd)


def run(model, make_inputs, *, steps=3, warmup=1, opt=None, autocast=None, **kw):
    kw.setdefault("profile", False)
    kw.setdefault("sample_interval", None)
    pc = PerfCheck(model, warmup=warmup, steps=steps, **kw)
    with pc:
        while not pc.done:
            with torch.autocast("cuda", dtype=autocast, enabled=autocast is not None):
                out = model(*make_inputs())
            out.float().sum().backward()
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
            pc.step()
    return pc


def row(pc, path):
    m = pc.measured().set_index("module")
    return m.loc[path]


def within(value, ref, lo=0.9, hi=1.15, what=""):
    assert ref * lo <= value <= ref * hi, f"{what}: {value * 1e3:.3f} ms vs reference {ref * 1e3:.3f} ms"


@pytest.fixture(scope="module")
def spin_s():
    torch.cuda._sleep(CYCLES)  # warm the kernel up
    return gpu_seconds(lambda: torch.cuda._sleep(CYCLES))


def x64():
    return (torch.randn(32, 64, device="cuda", requires_grad=False),)


# ------------------------------------------------------------------ planted delays, fwd and bwd
class TwoSpins(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Spin(2 * CYCLES, CYCLES)
        self.b = Spin(CYCLES, 3 * CYCLES)

    def forward(self, x):
        return self.b(self.a(x))


def test_cuda_events_time_planted_forward_and_backward_delays(spin_s):
    pc = run(TwoSpins().cuda(), x64)
    for path, fwd, bwd in (("a", 2, 1), ("b", 1, 3)):
        r = row(pc, path)
        within(r["fwd_s_median"], fwd * spin_s, what=f"{path} forward")
        within(r["bwd_s_median"], bwd * spin_s, what=f"{path} backward")
    root = row(pc, ROOT)
    assert root["fwd_s_median"] >= 3 * spin_s * 0.95 and root["bwd_s_median"] >= 4 * spin_s * 0.95
    st = pc.steps()
    measured = st[st.role == "measured"]
    assert (measured["step_s"] >= 7 * spin_s * 0.95).all()
    assert pc.meta()["timing"]["clock"].startswith("cuda events")


# ------------------------------------------------------------------ no synchronize added
class SlowGPT(nn.Module):
    """A small GPT whose forward also spins the GPU: the device, not the host, sets the pace."""

    def __init__(self):
        super().__init__()
        self.gpt = GPT(n_layer=1, n_head=2, d_model=64, vocab=128, seq_len=32)
        self.spin = Spin(10 * CYCLES, 10 * CYCLES, width=128)

    def forward(self, idx):
        return self.spin(self.gpt(idx))


def test_whole_measured_step_adds_no_synchronize(spin_s):
    """Under ``set_sync_debug_mode("error")`` (a synchronizing CUDA call raises) with the sampler and
    memory tracking on, and a host that must run ahead of the device: the host issues N steps in
    far less than the device needs for them. A hidden wait (``Event.synchronize``, which the debug
    mode does not flag) would make the host as slow as the device."""
    torch.manual_seed(0)
    model = SlowGPT().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x = torch.randint(0, 128, (4, 32), device="cuda")
    y = torch.randint(0, 128, (4, 32), device="cuda")
    n = 3  # few steps: the launch queue (about a thousand kernels and events) must not fill up

    def step():
        logits = model(x)
        F.cross_entropy(logits.reshape(-1, 128), y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # lazy initialization (cuBLAS handles, optimizer state) outside the check
    torch.cuda.synchronize()

    def issue(after_step=lambda: None):
        """(host seconds to issue n steps, device seconds to run them)."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.set_sync_debug_mode("error")
        try:
            start.record()
            t0 = time.perf_counter()
            for _ in range(n):
                step()
                after_step()
            host = time.perf_counter() - t0
            end.record()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        end.synchronize()
        return host, start.elapsed_time(end) * 1e-3

    bare_host, bare_device = issue()  # the control: without PerfCheck the host runs ahead
    assert bare_host < 0.5 * bare_device, (bare_host, bare_device)
    pc = PerfCheck(model, warmup=1, steps=n, profile=False, sample_interval=0.1, memory=True).start()
    step()
    pc.step()  # the warm-up step
    torch.cuda.synchronize()
    host_s, device_s = issue(pc.step)
    pc.stop()
    assert device_s >= n * 20 * spin_s * 0.9  # the planted 20 spins per step ran
    assert host_s < 0.5 * device_s, (f"host took {host_s * 1e3:.1f} ms to issue {n} steps the device ran in "
                                     f"{device_s * 1e3:.1f} ms: something waited for the device")
    st = pc.steps()
    assert (st.role == "measured").sum() == n and not st["failed"].any()
    within(row(pc, "spin")["fwd_s_median"], 10 * spin_s, what="spin forward")
    within(row(pc, "spin")["bwd_s_median"], 10 * spin_s, what="spin backward")
    assert len(pc.samples()) >= 1 and (st["peak_mem_bytes"] > 0).all()


# ------------------------------------------------------------------ awkward cases
def test_inplace_relu_model_on_cuda_matches_bare_gradients():
    torch.manual_seed(0)
    model = JSC_Tiny().cuda()
    x = torch.randn(64, 16, device="cuda")
    ref = torch.autograd.grad(model(x).sum(), list(model.parameters()))
    pc = run(model, lambda: (x,))
    got = torch.autograd.grad(model(x).sum(), list(model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    m = pc.measured().set_index("module")
    assert {"seq_blocks.1", "seq_blocks.3"} <= set(m.index)
    assert (m["fwd_s_median"] > 0).all() and (m["bwd_s_median"] > 0).all()


class Checkpointed(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.pre = nn.Linear(64, 64)
        self.blk = Spin(2 * CYCLES, 3 * CYCLES)
        self.reentrant = reentrant

    def forward(self, x):
        return checkpoint(self.blk, self.pre(x), use_reentrant=self.reentrant)


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpoint_recompute_apart_on_cuda(spin_s, reentrant):
    pc = run(Checkpointed(reentrant).cuda(), lambda: (torch.randn(32, 64, device="cuda", requires_grad=reentrant),))
    r = row(pc, "blk")
    within(r["fwd_s_median"], 2 * spin_s, what="forward (recompute not added)")
    within(r["recompute_s_median"], 2 * spin_s, what="recompute")
    within(r["bwd_s_median"], 3 * spin_s, what="backward (recompute excluded)")
    st = pc.steps()
    assert (st.loc[st.role == "measured", "recompute_s"] >= 2 * spin_s * 0.9).all()


class Shared(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = Spin(CYCLES, 2 * CYCLES)
        self.mid = Spin(CYCLES // 4, CYCLES)

    def forward(self, x):
        return self.shared(self.mid(self.shared(x)))


def test_shared_module_two_calls_both_timed_on_cuda(spin_s):
    pc = run(Shared().cuda(), x64)
    r = row(pc, "shared")
    assert r["calls"] == 2
    within(r["fwd_s_median"], 2 * spin_s, what="shared forward (2 calls)")
    within(r["bwd_s_median"], 4 * spin_s, what="shared backward (2 calls)")
    within(row(pc, "mid")["bwd_s_median"], spin_s, what="mid backward between the two calls")


class Flaky(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = Spin(CYCLES, CYCLES), Spin(CYCLES, CYCLES)
        self.fail = False

    def forward(self, x):
        x = self.a(x)
        if self.fail:
            raise ValueError("boom")
        return self.b(x)


def test_exception_mid_forward_marks_the_step_failed_and_the_next_ones_are_clean(spin_s):
    model = Flaky().cuda()
    pc = PerfCheck(model, warmup=0, steps=3, profile=False, sample_interval=None).start()
    x = torch.randn(32, 64, device="cuda")
    for i in range(5):
        model.fail = i == 1
        try:
            model(x).sum().backward()
        except ValueError as exc:
            assert "boom" in str(exc)
        pc.step()
    pc.stop()
    steps = pc.steps().set_index("step")
    assert bool(steps.loc[1, "failed"]) and not steps.drop(index=1)["failed"].any()
    m = pc.measured().set_index("module")
    assert m["steps"].eq(3).all()
    within(m.loc["b", "fwd_s_median"], spin_s, what="b forward after the failed step")
    assert pc._timer._stack == [] and pc._timer._bstack == []


def test_bf16_autocast_runs_are_timed_and_predicted_in_bf16():
    torch.manual_seed(0)
    model = GPT(n_layer=2, n_head=4, d_model=256, vocab=512, seq_len=128).cuda()
    x = torch.randint(0, 512, (8, 128), device="cuda")
    pc = run(model, lambda: (x,), autocast=torch.bfloat16, profile=True)
    m = pc.measured().set_index("module")
    lin = [p for p, t in m["type"].items() if t == "Linear"]
    assert lin and (m.loc[lin, "fwd_s_median"] > 0).all() and (m.loc[lin, "bwd_s_median"] > 0).all()
    assert pc.meta()["dtype"] == "bfloat16", "autocast's compute dtype, not the fp32 parameters"
    assert pc.meta()["model"]["dtype"] == "float32"
    assert pc.predicted().attrs["dtype"] == "bfloat16", "predicted at bf16 rates"
    k = pc.kernels()
    assert {"h.0.mlp.c_fc", "lm_head"} <= set(k.loc[k.phase == "fwd", "module"])


def test_torch_compile_is_warned_and_timed_as_a_whole_on_cuda():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).cuda()
    compiled = torch.compile(model)
    x = torch.randn(512, 256, device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pc = run(compiled, lambda: (x,), steps=3, warmup=2, profile=True)
    ours = [w for w in caught if "perfcheck" in str(w.message) and "torch.compile" in str(w.message)]
    assert len(ours) == 1
    m = pc.measured().set_index("module")
    assert list(m.index) == [ROOT] and m.loc[ROOT, "fwd_s_median"] > 0 and m.loc[ROOT, "bwd_s_median"] > 0
    k = pc.kernels()
    root = k[k.module == ROOT]
    assert {"fwd", "bwd"} <= set(root.phase), k[["module", "phase", "name"]].to_string()


class Graphed(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(64, 64)
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))

    def forward(self, x):
        return self.body(self.pre(x))


def test_cuda_graphed_submodule_is_timed_as_a_whole():
    """``make_graphed_callables`` replaces ``body``'s forward with a graph replay: ``body`` itself is
    timed (its hooks fire around the replay; fwd and bwd), its children do not run and get no rows."""
    torch.manual_seed(0)
    model = Graphed().cuda()
    x = torch.randn(32, 64, device="cuda")
    sample = torch.randn(32, 64, device="cuda", requires_grad=True)
    model.body = torch.cuda.make_graphed_callables(model.body, (sample,))
    pc = run(model, lambda: (x,))
    m = pc.measured().set_index("module")
    assert {ROOT, "pre", "body"} <= set(m.index)
    assert m.loc["body", "fwd_s_median"] > 0 and m.loc["body", "bwd_s_median"] > 0
    assert not any(p.startswith("body.") for p in m.index)


def test_graph_captured_while_measuring_does_not_break_the_capture():
    """A capture inside a measured step: the hooks must not break it (events cannot be recorded
    into a graph for timing), and the replayed graph's device time is inside the step time."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU()).cuda()
    static_x = torch.randn(32, 64, device="cuda")
    pc = PerfCheck(model, warmup=0, steps=None, profile=False, sample_interval=None).start()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(s):
        for _ in range(2):
            model(static_x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        static_y = model(static_x)
    pc.step()
    for _ in range(3):
        g.replay()
        with torch.no_grad():
            model(static_x)  # an eager call too, so the step has something timed
        pc.step()
    pc.stop()
    torch.cuda.synchronize()
    assert torch.allclose(static_y, model(static_x))
    st = pc.steps()
    assert (st["step_s"] > 0).all()
    assert any("CUDA graph capture" in w for w in pc.meta()["warnings"])

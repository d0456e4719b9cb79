"""The CUDA kernel table, the Chrome trace, per-module CUDA memory and the NVML sampler, on a GPU.

References are independent of the code under test: the Chrome trace's own kernel events (summed
from the JSON file, not from ``prof.events()``), torch.profiler's ``key_averages`` device total,
hand-computed tensor sizes, and NVML read directly by UUID. Every test here skips without CUDA."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from perfcheck import PerfCheck
from perfcheck.examples.models import GPT
from perfcheck.measure.kernel_table import OPTIMIZER, UNATTRIBUTED
from perfcheck.rundir import load_run
from perfcheck.schema import ROOT

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
REPO = Path(__file__).resolve().parents[2]
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
B, T, D, V = 8, 2048, 4096, 8192  # batch, sequence, width, vocabulary of the GPT below


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
    """A GPU-bound GPT (bf16, 2 layers, d=4096, batch 8 x seq 2048) with Adam: one profiled step,
    eight measured ones (the events' median and spread). Its kernels take far longer than the host needs to issue them (about 10 ms
    of device time per block forward). On the H100 VM of 2026-11-22 a 4-layer d=1024 seq-1024 GPT
    was host-bound (events 5x its kernels): there the events measure the host's pace, not kernels."""
    out = tmp_path_factory.mktemp("gpu_run")
    torch.manual_seed(0)
    model = GPT(n_layer=2, n_head=32, d_model=D, vocab=V, seq_len=T).cuda().to(torch.bfloat16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=True)
    x = torch.randint(0, V, (B, T), device="cuda")
    y = torch.randint(0, V, (B, T), device="cuda")
    pc = PerfCheck(model, warmup=2, steps=8, profile=True, profile_window=(0, 1, 1), sample_interval=0.1, memory=True,
                   out_dir=out)
    with pc:
        while not pc.done:
            logits = model(x)
            F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            pc.step()
    return pc, out


def test_kernel_table_conserves_the_trace_total(gpt_run):
    pc, out = gpt_run
    k = pc.kernels()
    assert len(k) > 0 and (k.device == "cuda").all()
    trace = json.loads((out / "rank0" / "trace.json").read_text())
    events = trace["traceEvents"]
    device_us = sum(e.get("dur", 0) for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS)
    assert device_us > 0
    total = k["total_s"].sum()
    assert total == pytest.approx(device_us * 1e-6, rel=0.01), "attributed + unattributed vs the trace's kernels"
    assert total == pytest.approx(pc.meta()["profile"]["total_s"], rel=1e-9)
    names = {e.get("name") for e in events}
    assert {"perfcheck/fwd/(root)", "perfcheck/fwd/h.0.mlp.c_fc", "perfcheck/bwd/h.0.mlp.c_fc/begin"} <= names


def test_kernels_are_attributed_to_modules_in_every_phase(gpt_run):
    pc, _ = gpt_run
    k = pc.kernels()
    by_phase = k.groupby("phase")["total_s"].sum()
    total = by_phase.sum()
    assert {"fwd", "bwd", "optim"} <= set(by_phase.index)
    opt = k[k.module == OPTIMIZER]
    assert len(opt) and (opt.phase == "optim").all()
    # every Linear has forward and backward kernels of its own
    lin = [p for p, t in pc._view.types.items() if t == "Linear"]
    for p in lin:
        mine = k[k.module == p]
        assert {"fwd", "bwd"} <= set(mine.phase), f"{p}: phases {set(mine.phase)}"
    # what is left unattributed is the loss and the like: small next to the model
    un = k[k.module == UNATTRIBUTED]["total_s"].sum()
    assert un < 0.10 * total, f"unattributed {un / total:.1%} of device time:\n{k[k.module == UNATTRIBUTED]}"
    bwd_un = k[(k.phase == "bwd") & (k.module == UNATTRIBUTED)]["total_s"].sum()
    assert bwd_un < 0.05 * by_phase["bwd"], f"backward unattributed {bwd_un / by_phase['bwd']:.1%}"


def _evk():
    """scripts/gpu_events_vs_kernels.py (the comparison and its bound, shared with the repeated run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_events_vs_kernels", REPO / "scripts" / "gpu_events_vs_kernels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cuda_event_forward_agrees_with_kernel_sum_for_large_modules(gpt_run):
    """Per module, CUDA-event forward (median over the measured steps) vs the sum of that module's kernels in
    the profiled step, for modules whose kernels take >= 100 us: within max(10%, 3 x the events' spread).

    The bound is derived from measured jitter (issue 24): the kernel sum comes from ONE profiled step, so it
    strays from the module's typical time as much as one step does; ``spread`` is half the relative range of
    the module's event forward over the measured steps of this run. With steady events the bound is the plain
    10%; the H100 runs read medians 0.946 and 1.015 and one module at 1.113 (the first layer's first GEMM,
    2026-11-23), which failed the plain 10% once in two runs. scripts/gpu_events_vs_kernels.py repeats this
    check and records ratios and spreads (scripts/gpu_check.sh, step evk)."""
    pc, out = gpt_run
    evk = _evk()
    table = evk.compare(pc)
    table.to_csv(out / "events_vs_kernels.csv", index=False)  # the figures behind the bound
    checked = table[table.checked]
    bad = [f"{r.module}: events {r.events_fwd_s * 1e6:.0f} us, kernels {r.kernels_fwd_s * 1e6:.0f} us "
           f"({r.ratio:.3f}; spread {r.spread:.3f}, bound {r.bound:.3f})" for r in checked.itertuples() if not r.ok]
    assert len(checked) >= 10 and not bad, "\n".join(bad)
    # and the events are not systematically off: the median over modules within the plain 10%
    assert abs(checked.ratio.median() - 1) <= evk.BASE_BOUND


def test_per_module_and_peak_cuda_memory_in_the_run_dir(gpt_run):
    pc, out = gpt_run
    run = load_run(out)
    mods = run.modules.set_index("module")
    # c_fc's output is kept for backward: (B * T) tokens x 4D bf16 = 16384 x 16384 x 2 = 536,870,912 bytes
    assert mods.loc["h.0.mlp.c_fc", "act_mem_bytes"] >= B * T * 4 * D * 2
    # the root's peak covers at least the weights, Adam's two moments and the logits (B * T x V bf16)
    params = sum(p.numel() * p.element_size() for p in pc._view.root.parameters())
    assert mods.loc[ROOT, "peak_mem_bytes"] >= 3 * params + B * T * V * 2
    steps = pd.read_csv(out / "rank0" / "steps.csv")
    measured = steps[steps.role == "measured"]
    assert (measured["peak_mem_bytes"] >= mods.loc[ROOT, "peak_mem_bytes"] * 0.99).all()
    assert (measured["peak_mem_bytes"] <= torch.cuda.get_device_properties(0).total_memory).all()


def test_samples_in_the_run_dir_read_nvml(gpt_run):
    pc, out = gpt_run
    s = pd.read_csv(out / "rank0" / "samples.csv")
    assert len(s) >= 1 and pc.meta()["sampler"]["backend"] == "nvml+psutil"
    for col in ("gpu_util", "mem_used_bytes", "mem_total_bytes", "power_w", "sm_clock_hz", "temperature_c"):
        assert s[col].notna().all(), col


NVML_PROBE = textwrap.dedent("""
    import json, sys, time, torch, pynvml
    from perfcheck.measure.sampler import Sampler
    pynvml.nvmlInit()
    want = pynvml.nvmlDeviceGetHandleByUUID(sys.argv[1])
    total = pynvml.nvmlDeviceGetMemoryInfo(want).total
    dev = torch.device("cuda", 0)
    torch.cuda.init()
    s = Sampler(0.1, device=dev).start()
    time.sleep(0.35)
    idle = s.sample()
    x = torch.empty(4 << 30, dtype=torch.uint8, device=dev)   # 4 GiB more in use
    a = torch.randn(4096, 4096, device=dev)
    t0 = time.time()
    while time.time() - t0 < 1.5:                               # keep a kernel running
        torch.cuda._sleep(20_000_000)
        torch.cuda.synchronize()
    busy = s.sample()
    found = pynvml.nvmlDeviceGetUUID(s._nvml.handle)
    s.stop()
    print("RESULT" + json.dumps({"uuid": found.decode() if isinstance(found, bytes) else found,
                                 "torch_uuid": str(torch.cuda.get_device_properties(0).uuid),
                                 "total": total, "idle": idle, "busy": busy, "rows": len(s.rows),
                                 "warnings": s.warnings, "backend": s.backend}))
""")


def test_nvml_sampler_finds_the_gpu_by_uuid_under_cuda_visible_devices(tmp_path):
    import pynvml

    pynvml.nvmlInit()
    try:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(pynvml.nvmlDeviceGetCount() - 1))
    finally:
        pynvml.nvmlShutdown()
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=uuid, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    res = subprocess.run([sys.executable, "-c", NVML_PROBE, uuid], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(next(line[6:] for line in res.stdout.splitlines() if line.startswith("RESULT")))
    assert r["backend"] == "nvml+psutil" and not r["warnings"], r["warnings"]
    assert r["uuid"] == uuid and r["torch_uuid"].replace("GPU-", "") in uuid
    idle, busy = r["idle"], r["busy"]
    assert idle["mem_total_bytes"] == r["total"] == busy["mem_total_bytes"]
    assert busy["mem_used_bytes"] - idle["mem_used_bytes"] >= 4 * 2**30 * 0.95
    assert busy["gpu_util"] >= 0.5, busy
    for row in (idle, busy):
        assert 0 <= row["gpu_util"] <= 1 and row["power_w"] > 10 and 1e8 < row["sm_clock_hz"] < 5e9
        assert 5 < row["temperature_c"] < 110

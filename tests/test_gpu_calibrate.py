"""``perfcheck calibrate`` on a GPU, end to end through the CLI: bf16 / fp16 / fp32 (TF32) GEMM
curves, HBM copy bandwidth and launch latency, checked against the same operations timed here
with CUDA events; the written system file loads with ``--system FILE``. Skips without CUDA."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
REPO = Path(__file__).resolve().parents[1]


def _cli(*args, timeout=600):
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    res = subprocess.run([sys.executable, "-m", "perfcheck", *args], env=env, capture_output=True, text=True,
                         timeout=timeout, cwd=REPO)
    assert res.returncode == 0, f"perfcheck {' '.join(args)}:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res.stdout


def _event_seconds(fn, iters=20):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e-3 / iters


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    d = tmp_path_factory.mktemp("cal")
    out = _cli("calibrate", "--quick", "--dtypes", "bf16,fp16,tf32,fp32", "--no-comm", "--output",
               str(d / "gpu.json"), "--csv", str(d / "gpu.csv"))
    return d / "gpu.json", pd.read_csv(d / "gpu.csv"), out


def test_gemm_curves_for_every_dtype_agree_with_an_independent_timing(calibrated):
    path, table, _ = calibrated
    mm = table[table.kind == "matmul"]
    assert {"bf16", "fp16", "tf32", "fp32"} <= set(mm.dtype)
    n = 4096  # 2 n^3 FLOPs, timed here with the same torch.mm and events
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b, c = torch.randn_like(a), torch.empty_like(a)
    ref = 2 * n ** 3 / _event_seconds(lambda: torch.mm(a, b, out=c))
    got = mm[(mm.dtype == "bf16") & (mm.m == n) & (mm.k == n) & (mm.n == n)]["flops_per_s"].iloc[0]
    assert got == pytest.approx(ref, rel=0.15)
    big = mm.sort_values("flops").groupby("dtype").tail(1).set_index("dtype")["flops_per_s"]
    assert big["bf16"] > 1.3 * big["tf32"] and big["tf32"] > 2 * big["fp32"], big.to_dict()  # tensor cores
    spec = json.loads(path.read_text())
    assert len(spec["matrix_efficiency_curve"]) >= 3
    assert all(0 < e <= 1 for e in spec["efficiency"].values() if isinstance(e, (int, float)))


def test_hbm_copy_bandwidth_and_launch_latency(calibrated):
    path, table, _ = calibrated
    copy = table[table.kind == "copy"].sort_values("bytes").iloc[-1]
    n = int(copy["m"])
    src, dst = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    ref = 2 * n * 4 / _event_seconds(lambda: dst.copy_(src))  # read + write
    assert copy["bytes_per_s"] == pytest.approx(ref, rel=0.15)
    spec = json.loads(path.read_text())
    assert 0.5 < spec["efficiency"]["memory"] <= 1.0
    assert 1e-6 < spec["launch_overhead_s"] < 5e-5


def test_written_system_file_loads_with_system_file(calibrated):
    path, _, _ = calibrated
    shown = _cli("systems", str(path))
    assert "calibrated" in shown.lower()
    est = _cli("estimate", "--model", "gpt2-124m", "--batch", "8", "--seq", "1024", "--system", str(path),
               "--format", "json")
    assert json.loads(est)

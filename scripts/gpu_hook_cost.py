"""What PerfCheck's timing hooks cost the host per module, forward and backward: the observer effect
inside every per-module measurement (issue 24: GPT-2 small's batch-8 Linear and LayerNorm backwards
measured 20-37 us more than predicted, a constant per module whatever its size).

For each workload it times the host *issue* time of the forward and of the backward (``perf_counter``
around each call, one synchronize per step, outside both), bare and with ``PerfCheck(model,
profile=False, sample_interval=None)`` attached (timing mode, every module timed), interleaved, and
prints the medians and the difference per timed module (``modules`` = the module count PerfCheck times,
the root included). Workloads: ``chain`` (32 tiny ``nn.Linear(16, 16)`` in a Sequential: host-bound, so the
difference is the hooks' host cost alone) and those of bench/accuracy.py named by ``--models``.

    python scripts/gpu_hook_cost.py --models chain,gpt --steps 20 --csv hook_cost.csv
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

import accuracy  # noqa: E402  (bench/accuracy.py: the workloads)
from perfcheck import PerfCheck  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a smoke test of this script


def _sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


class _Chain:
    """32 tiny Linear layers: a host-bound stand-in whose per-module cost is all framework and hooks."""

    def __init__(self, n: int = 32):
        self.model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(n)]).to(DEVICE)
        self.inputs = (torch.randn(8, 16, device=DEVICE),)
        self.target = torch.randn(8, 16, device=DEVICE)
        self.loss = torch.nn.functional.mse_loss


def _issue(w, opt, pc=None) -> tuple:
    """One step; host issue seconds of the forward and of the backward (one sync at the end)."""
    now = time.perf_counter
    t0 = now()
    y = w.model(*w.inputs)
    t1 = now()
    loss = w.loss(y, w.target)
    t2 = now()
    loss.backward()
    t3 = now()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if pc is not None:
        pc.step()
    _sync()
    return t1 - t0, t3 - t2


def run(name: str, steps: int, gpt_batch: int, dtype) -> dict:
    w = _Chain() if name == "chain" else accuracy.build(name, DEVICE, dtype, gpt_batch=gpt_batch)
    opt = torch.optim.SGD(w.model.parameters(), lr=1e-6)
    for _ in range(3):
        _issue(w, opt)
    modules = sum(1 for _ in w.model.modules())  # timing mode times every module, the root included
    bare, hooked = [], []
    for _ in range(steps):  # interleaved pairs; the hooked step is the second under a fresh session
        bare.append(_issue(w, opt))
        pc = PerfCheck(w.model, warmup=0, steps=None, profile=False, sample_interval=None)
        pc.start()
        try:
            _issue(w, opt, pc)
            hooked.append(_issue(w, opt, pc))
        finally:
            pc.stop()
    med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
    row = {"workload": name, "device": str(DEVICE), "modules": modules,
           "bare_fwd_s": med(bare, 0), "bare_bwd_s": med(bare, 1),
           "hooked_fwd_s": med(hooked, 0), "hooked_bwd_s": med(hooked, 1)}
    row["hook_fwd_s_per_module"] = (row["hooked_fwd_s"] - row["bare_fwd_s"]) / modules
    row["hook_bwd_s_per_module"] = (row["hooked_bwd_s"] - row["bare_bwd_s"]) / modules
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="chain,gpt")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--gpt-batch", type=int, default=8)
    ap.add_argument("--csv")
    a = ap.parse_args(argv)
    dtype = torch.bfloat16 if DEVICE.type == "cuda" else torch.float32
    rows = []
    for name in a.models.split(","):
        r = run(name, a.steps, a.gpt_batch, dtype)
        rows.append(r)
        print(f"{name:6s} modules {r['modules']:4d}  fwd bare {r['bare_fwd_s'] * 1e6:9.1f} us hooked "
              f"{r['hooked_fwd_s'] * 1e6:9.1f} us ({r['hook_fwd_s_per_module'] * 1e6:6.2f} us/module)  bwd bare "
              f"{r['bare_bwd_s'] * 1e6:9.1f} us hooked {r['hooked_bwd_s'] * 1e6:9.1f} us "
              f"({r['hook_bwd_s_per_module'] * 1e6:6.2f} us/module)", flush=True)
    if a.csv:
        pd.DataFrame(rows).to_csv(a.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

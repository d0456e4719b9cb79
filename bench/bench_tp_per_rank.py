"""(#14) Cost of the per-rank estimate of a TP model: meta_tp_twin (DTensor ops, local shapes) vs the old
meta_twin (global shapes, tp x the work); 8 FFN blocks d=256 on a fake tp=2 group;
one process, 1 thread, process CPU time, interleaved rounds, medians."""
import os
import statistics
import sys
import time

import torch

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import torch.nn as nn
from perfcheck.predict import distributed as D
from perfcheck.predict import twins as N
from perfcheck.predict.module_estimator import estimate
D.fake_process_group(2)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
import _torch_dist_models as M
blocks = nn.Sequential(*[M.FFN(256) for _ in range(8)])
mesh = init_device_mesh("cpu", (2,))
for b in blocks:
    parallelize_module(b, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
x = torch.empty(16, 256, device="meta")
def run(twin):
    t = time.process_time(); f = estimate(twin(blocks), (x,), system="cpu"); return time.process_time() - t, f
old, new = [], []
for r in range(7):
    for name, tw, acc in (("old", N.meta_twin, old), ("new", N.meta_tp_twin, new)) if r % 2 else (("new", N.meta_tp_twin, new), ("old", N.meta_twin, old)):
        dt, f = run(tw); acc.append(dt)
print("modules", len(f), "old(meta_twin, global) median s", round(statistics.median(old[1:]), 4),
      "new(meta_tp_twin, local) median s", round(statistics.median(new[1:]), 4),
      "ratio", round(statistics.median(new[1:]) / statistics.median(old[1:]), 2))
fo = estimate(N.meta_twin(blocks), (x,), system="cpu").set_index("module"); fn = estimate(N.meta_tp_twin(blocks), (x,), system="cpu").set_index("module")
print("root macs_fwd old", fo.loc["(root)", "macs_fwd"], "new", fn.loc["(root)", "macs_fwd"])

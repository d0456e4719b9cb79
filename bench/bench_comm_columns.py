"""python3 bench/bench_comm_columns.py [UNITS]: Cost of the per-module communication columns in reconcile: a synthetic FSDP2 run of U units
(each unit: forward all-gather + copy-out wait, backward prefetched all-gather + copy-out + synchronous
reduce-scatter), 3 profiled steps, 2 ranks; reconcile with and without collectives, interleaved rounds,
process CPU time, one thread, medians."""
import sys, time
import numpy as np, pandas as pd, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "tests"))
torch.set_num_threads(1)
from test_reconcile import pred_row, meas_row
from test_analysis_comm import issued, waited, COPY_OUT
from perfcheck.analysis.reconcile import reconcile
from perfcheck.measure.collectives import FINALIZE_OP, SYNC_SUFFIX
from perfcheck.schema import ROOT

U = int(sys.argv[1]) if len(sys.argv) > 1 else 200
mods = [ROOT, "layers"] + [m for i in range(U) for m in (f"layers.{i}", f"layers.{i}.lin")]
coll = []
for rank in (0, 1):
    for step in range(3):
        for i in range(U):
            coll += [issued(f"layers.{i}", "fwd", "allgather", 4224, target=f"layers.{i}", rank=rank),
                     waited(f"layers.{i}", "fwd", COPY_OUT, 1e-4, "allgather", f"layers.{i}", rank=rank)]
        for i in reversed(range(U)):
            coll += [waited(f"layers.{i}", "bwd", COPY_OUT, 1e-4, "allgather", f"layers.{i}", rank=rank),
                     issued(f"layers.{i}", "bwd", "allgather", 4224, target=f"layers.{max(i-1,0)}", rank=rank),
                     issued(f"layers.{i}", "bwd", "reducescatter", 4224, target=f"layers.{i}", rank=rank),
                     waited(f"layers.{i}", "bwd", "c10d::_reduce_scatter_base_" + SYNC_SUFFIX, 1e-4, "reducescatter", f"layers.{i}", rank=rank)]
        coll.append(waited(ROOT, "bwd", FINALIZE_OP, 1e-4, rank=rank))
coll = pd.DataFrame(coll)
pred = pd.DataFrame([pred_row(m, 1e-3, 2e-3) for m in mods])
meas = pd.DataFrame([meas_row(m, 1e-3, 2e-3, rank=r) for r in (0, 1) for m in mods])

def run(c):
    t = time.process_time(); reconcile(pred, meas, collectives=c, profile_steps=3); return time.process_time() - t

run(coll); run(None)
a, b = [], []
for _ in range(7):
    a.append(run(None)); b.append(run(coll))
print(f"U={U} modules={len(mods)} collectives.csv rows={len(coll)}: reconcile without {np.median(a):.3f} s, "
      f"with collectives {np.median(b):.3f} s, added {np.median(b) - np.median(a):.3f} s ({np.median(b)/np.median(a):.2f}x)")

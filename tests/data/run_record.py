"""Re-record the run-directory fixtures under tests/data/ (CPU, a few seconds each).

    python tests/data/run_record.py

run_lenet_cpu/  the example LeNet (``Net``), batch 8, one rank, with predicted.csv (estimate on the 'cpu' system).
run_jsc_2ranks/ the example JSC_Tiny (MASE's MLP) recorded twice as ranks 0 and 1 of a world of 2 (RANK/WORLD_SIZE set,
                no process group); rank 1 sleeps 5 ms per step outside the model (a slow data loader), so
                it is the straggler and its extra time is time no module explains. predicted.csv at the top.
Recorded with one intra-op thread (the recording machine has 2 cores shared with other jobs).
trace.json is left out (large) and removed from meta.json's file list.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def record(out: Path, example: str, steps: int, sleep_s: float = 0.0):
    import torch

    from perfcheck.examples.models import EXAMPLES
    from perfcheck.session.api import PerfCheck

    torch.manual_seed(0)
    torch.set_num_threads(1)  # 2 shared cores: OpenMP barriers under contention turned a 16-feature BatchNorm into 70 ms
    ex = EXAMPLES[example]
    model = ex.build()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(0)
    pc = PerfCheck(model, warmup=2, steps=steps, overhead_pairs=3, profile_window=(0, 1, 1), sample_interval=0.1,
                   out_dir=out)
    with pc:
        for _ in range(steps + 12):
            if pc.done:
                break
            (x,), y = ex.batch(ex.default_batch, gen)
            if sleep_s:
                time.sleep(sleep_s)
            ex.loss(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            pc.step()
    return model


def _drop_trace(rank_dir: Path):
    (rank_dir / "trace.json").unlink(missing_ok=True)
    meta_path = rank_dir / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["files"] = [f for f in meta["files"] if f != "trace.json"]
    meta["hostname"], meta["pid"] = "fixture", 0
    meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def main():
    import torch

    from perfcheck import estimate
    from perfcheck.predict.for_run import save_predicted

    if len(sys.argv) == 4:  # child: python run_record.py OUT EXAMPLE SLEEP (RANK/WORLD_SIZE in the environment)
        record(Path(sys.argv[1]), sys.argv[2], 8, float(sys.argv[3]))
        return
    lenet = HERE / "run_lenet_cpu"
    shutil.rmtree(lenet, ignore_errors=True)
    model = record(lenet, "lenet", 8)
    _drop_trace(lenet / "rank0")
    save_predicted(lenet, estimate(model, (torch.randn(8, 3, 32, 32),), system="cpu"), system="cpu", dtype="float32")

    jsc = HERE / "run_jsc_2ranks"
    shutil.rmtree(jsc, ignore_errors=True)
    for rank, sleep in ((0, 0.0), (1, 0.005)):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2")
        subprocess.run([sys.executable, __file__, str(jsc), "jsc", str(sleep)], env=env, check=True)
        _drop_trace(jsc / f"rank{rank}")
    from perfcheck.examples.models import JSC_Tiny

    save_predicted(jsc, estimate(JSC_Tiny(), (torch.randn(8, 16),), system="cpu"), system="cpu", dtype="float32")


if __name__ == "__main__":
    main()

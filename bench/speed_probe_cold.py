"""What a reading of the calibration's references right after a training step reads, against the calibration's.

Why: ``perfcheck.measure.speed.SpeedProbe`` reads the two references (a tiny add, a 128^3 mm) after each step; the
calibration reads them in loops of ~1 ms (``calibrate.phase.REFERENCE_LOOP_S``: ~25 mms) beside its cases. A
training step evicts the mm's operands, so the first call after it is cold; a reading of 4 mms holds one cold call
in 4, the calibration's loop one in ~25. Per round, one training step of the model before each variant, all
variants interleaved (process CPU time, us per call, medians over the rounds):

  cold     100 adds, 4 mms right after the step (SpeedProbe before the warm-up call)
  warm     one untimed call of each first, then 100 adds, 4 mms (SpeedProbe now)
  loop     350 adds, 20 mms right after the step (the calibration's loop length)

with a quick calibration (process clock) before and after the rounds for its ``reference_s`` and
``compute_reference_s``.

    OMP_NUM_THREADS=1 PERFCHECK_CACHE_DIR=<yours> flock /tmp/perfcheck-bench.lock python bench/speed_probe_cold.py tv_resnet18 hf_bert
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout  # noqa: E402  (puts this tree's perfcheck first on the path)
from perfcheck.calibrate.phase import compute_reference_fn, per_call_s, reference_fn  # noqa: E402
from perfcheck.calibrate.run import calibrate  # noqa: E402

ROUNDS = 30


def _variants(add, mm) -> dict:
    def pc(fn, n):
        return per_call_s(fn, n, time.process_time)

    def warm():
        add()
        a = pc(add, 100)
        mm()
        return a, pc(mm, 4)

    return {"cold": lambda: (pc(add, 100), pc(mm, 4)), "warm": warm, "loop": lambda: (pc(add, 350), pc(mm, 20))}


def run(name: str) -> list:
    """Lines: the calibrations' reference times and each variant's median reading after a step of ``name``."""
    def cal():
        return calibrate("cpu", mode="quick", device="cpu", comm=False, threads=1, clock="process").spec.calibration

    before = cal()
    add, mm = reference_fn("cpu"), compute_reference_fn("cpu")
    w = heldout.build(name)
    opt = w.optimizer(w.model.parameters())
    got = {}
    for _ in range(ROUNDS):
        for label, read in _variants(add, mm).items():
            w.loss(w.model(*w.inputs), w.target).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            got.setdefault(label, []).append(read())
    after = cal()
    lines = [f"| {name} | calibration before / after | {before['reference_s'] * 1e6:.2f} / {after['reference_s'] * 1e6:.2f}"
             f" | {before['compute_reference_s'] * 1e6:.1f} / {after['compute_reference_s'] * 1e6:.1f} |"]
    for label, v in got.items():
        a, c = np.median([x[0] for x in v]), np.median([x[1] for x in v])
        lines.append(f"| {name} | {label} | {a * 1e6:.2f} | {c * 1e6:.1f} |")
    return lines


def main(argv=None):
    names = (argv if argv is not None else sys.argv[1:]) or ["tv_resnet18"]
    torch.set_num_threads(1)
    out = ["| model | reading | add us | mm us |", "|---|---|---|---|"]
    for name in names:
        out += run(name)
    print("\n".join(out))


if __name__ == "__main__":
    main()

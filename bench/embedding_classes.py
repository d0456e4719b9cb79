"""Embedding / EmbeddingBag modules alone: measured against perfcheck.estimate on a one-module model, and the backward
taken apart (the dense gradient's zero fill, the aten backward kernel alone, the autograd engine around it).

Per configuration (kind, vocab, dim, indices, bags, mode), interleaved rounds (every configuration once per round,
so a drift of the machine's speed lands on all of them), per round the median of ``--reps`` calls, reported as the
median over rounds, process CPU time, one thread:
  mod_fwd / mod_bwd -- the module's forward, then ``y.backward(g)`` (engine start and AccumulateGrad included; the
                       weight's grad set to None after each call, as a training step's optimizer does),
  kern_bwd          -- the aten backward alone (``embedding_dense_backward`` / ``_embedding_bag_backward``),
  zeros             -- ``torch.zeros(vocab, dim)`` alone (the dense gradient's fill),
  pred_fwd / pred_bwd -- perfcheck.estimate of the module alone (its root row) under a calibration table re-fitted
                       from ``--calibration`` (bench/heldout.py --save-calibration).

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/embedding_classes.py --calibration C.csv --csv M.csv
    python3 bench/embedding_classes.py --calibration C.csv --measured M.csv   # the same rows re-predicted (a paired
                                                                               # comparison: run it from each tree)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout  # noqa: E402  (puts this tree's perfcheck first on the path)
import perfcheck  # noqa: E402
from perfcheck.schema import ROOT  # noqa: E402

aten = torch.ops.aten

#: (kind, vocab, dim, indices, bags, mode): the design models' shapes (wide_deep's wide 50000 x 1 and deep 20000 x
#: 32 mean bags, lstm_lm's 8000 x 128, BERT's 30522 x 768 word table) and a sweep of vocab, dim, indices around them.
CONFIGS = (
    ("emb", 1000, 128, 256, 0, ""), ("emb", 8000, 128, 256, 0, ""), ("emb", 100000, 128, 256, 0, ""),
    ("emb", 8000, 16, 256, 0, ""), ("emb", 8000, 1024, 256, 0, ""), ("emb", 8000, 128, 4096, 0, ""),
    ("emb", 8000, 128, 64, 0, ""), ("emb", 30522, 768, 1024, 0, ""), ("emb", 1000000, 16, 1024, 0, ""),
    ("bag", 50000, 1, 2048, 256, "sum"), ("bag", 20000, 32, 1024, 256, "mean"), ("bag", 1000, 32, 1024, 256, "mean"),
    ("bag", 20000, 32, 1024, 256, "sum"), ("bag", 20000, 32, 1024, 256, "max"), ("bag", 20000, 32, 16384, 256, "sum"),
    ("bag", 1000000, 16, 1024, 256, "sum"), ("bag", 20000, 256, 1024, 256, "sum"), ("bag", 30000, 16, 384, 128, "sum"),
    ("bag", 4096, 4, 4096, 1024, "max"), ("bag", 4096, 128, 4096, 1024, "max"), ("bag", 100000, 128, 1024, 256, "max"),
)


def _setup(cfg, gen):
    """(module, inputs, backward kernel closure, zeros closure) of one configuration."""
    kind, vocab, dim, n, bags, mode = cfg
    idx = torch.randint(0, vocab, (n,), generator=gen)
    if kind == "emb":
        m = torch.nn.Embedding(vocab, dim)
        ins = (idx,)
        g = torch.randn(n, dim)
        kern = lambda: aten.embedding_dense_backward(g, idx, vocab, -1, False)  # noqa: E731
    else:
        m = torch.nn.EmbeddingBag(vocab, dim, mode=mode)
        offs = torch.arange(0, n, n // bags)
        ins = (idx, offs)
        code = {"sum": 0, "mean": 1, "max": 2}[mode]
        _, o2b, bsize, maxi = aten._embedding_bag(m.weight.detach(), idx, offs, False, code)
        g = torch.randn(bags, dim)
        kern = lambda: aten._embedding_bag_backward(g, idx, offs, o2b, bsize, maxi, vocab, False, code,  # noqa: E731
                                                    False, None)
    return m, ins, kern, (lambda: torch.zeros(vocab, dim))


def _round(m, ins, kern, zeros, reps) -> list:
    """Medians of one round: module fwd, module bwd, kernel bwd, zeros (seconds)."""
    now = time.process_time
    out = {k: [] for k in ("f", "b", "k", "z")}
    y = m(*ins)
    g = torch.randn_like(y)
    for _ in range(reps):
        t0 = now()
        y = m(*ins)
        t1 = now()
        y.backward(g)
        t2 = now()
        del y
        m.weight.grad = None
        t3 = now()
        r = kern()
        t4 = now()
        del r
        t5 = now()
        z = zeros()
        t6 = now()
        del z
        out["f"].append(t1 - t0)
        out["b"].append(t2 - t1)
        out["k"].append(t4 - t3)
        out["z"].append(t6 - t5)
    return [float(np.median(v)) for v in out.values()]


def measure(cfgs, rounds: int, reps: int) -> list:
    """Per configuration: (module, inputs, [mod fwd, mod bwd, kern bwd, zeros] medians over rounds, seconds)."""
    gen = torch.Generator().manual_seed(0)
    setups = [_setup(c, gen) for c in cfgs]
    per = [[_round(*s, reps) for s in setups] for _ in range(rounds)]
    return [(s[0], s[1], [float(np.median([r[i][j] for r in per])) for j in range(4)]) for i, s in enumerate(setups)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibration", required=True, help="a saved table (calibrated now and saved there if absent)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--only", default=None, help="comma-separated indices into CONFIGS")
    ap.add_argument("--csv", default=None, help="write the measured rows here")
    ap.add_argument("--measured", default=None, help="re-predict these measured rows (a --csv output) only")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    spec, _ = heldout.calibration(args.calibration, args.calibration, print)
    spec = getattr(spec, "spec", spec)  # a fresh calibration returns its result object
    cfgs = [CONFIGS[int(i)] for i in args.only.split(",")] if args.only else list(CONFIGS)
    if args.measured:
        meas = pd.read_csv(args.measured)
        gen = torch.Generator().manual_seed(0)
        rows = [(*_setup(c, gen)[:2], [float(meas.iloc[i][k]) for k in ("fwd", "bwd", "kern", "zeros")])
                for i, c in enumerate(cfgs)]
    else:
        rows = measure(cfgs, args.rounds, args.reps)
    if args.csv:
        pd.DataFrame([t for _, _, t in rows], columns=["fwd", "bwd", "kern", "zeros"]).to_csv(args.csv, index=False)
    print("us, medians over rounds; ratio = measured / predicted")
    print("| kind | vocab | dim | idx | bags | mode | mod fwd | pred fwd | mod bwd | kern bwd | zeros | pred bwd | "
          "fwd ratio | bwd ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for cfg, (m, ins, t) in zip(cfgs, rows):
        f, b, k, z = (v * 1e6 for v in t)
        p = perfcheck.estimate(m, ins, system=spec)
        root = p[p["module"] == ROOT].iloc[0]
        pf, pb = float(root.pred_fwd_s) * 1e6, float(root.pred_bwd_s) * 1e6
        kind, vocab, dim, n, bags, mode = cfg
        print(f"| {kind} | {vocab} | {dim} | {n} | {bags or '-'} | {mode or '-'} | {f:.1f} | {pf:.1f} | {b:.1f} | "
              f"{k:.1f} | {z:.1f} | {pb:.1f} | {f / pf:.2f} | {b / pb:.2f} |", flush=True)


if __name__ == "__main__":
    main()

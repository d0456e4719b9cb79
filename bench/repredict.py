"""Re-predict one held-out measurement with the code of a given source tree: paired before/after evidence.

Why: single held-out runs differ by up to 2x per model on the shared machine, so what a change to the estimator
did is judged on the SAME measurements (``bench/heldout.py --csv F`` writes F and F.modules.csv) and the SAME
calibration table (``--save-calibration C``), predicted once with the code before the change and once after.

The tree (``--tree``, default this one) supplies both ``perfcheck`` and ``bench/heldout.py`` (models, the loss
and optimizer of each, ``predict``), so the old code is run as the old checkout: e.g. ``--tree /path/to/main``.
Prints the per-model step / forward / backward ratios and the per-module-class medians (fwd+bwd per module) per
set, measured / predicted, as heldout.py does; ``--out`` writes the per-module predictions.

    OMP_NUM_THREADS=1 python bench/repredict.py --csv F --calibration C [--tree DIR] [--models a,b] [--out P.csv]
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", required=True, help="a held-out run's per-model CSV (its .modules.csv beside it)")
    ap.add_argument("--calibration", required=True, help="the calibration table to re-fit (--save-calibration)")
    ap.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]), help="source tree of the code")
    ap.add_argument("--models", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    tree = Path(args.tree).resolve()
    sys.path[:0] = [str(tree), str(tree / "bench")]
    for name in [m for m in sys.modules if m == "perfcheck" or m.startswith("perfcheck.") or m == "heldout"]:
        del sys.modules[name]
    heldout = importlib.import_module("heldout")
    import perfcheck
    import torch

    assert Path(perfcheck.__file__).resolve().is_relative_to(tree), perfcheck.__file__
    torch.set_num_threads(1)
    runs, mods = pd.read_csv(args.csv), pd.read_csv(args.csv + ".modules.csv")
    models = args.models.split(",") if args.models else list(runs["model"])
    spec, _ = heldout.calibration(args.calibration, None, print)
    rows, preds = [], []
    for name in models:
        w = heldout.build(name)
        p = heldout.predict(w, spec, w.optimizer(w.model.parameters()))
        r = runs[runs["model"] == name].iloc[0]
        meas = {ph: float(r[f"meas_{ph}_ms"]) for ph in ("step", "fwd", "bwd")}
        rows.append({"set": r["set"], "model": name,
                     **{ph: meas[ph] / (p["phases"][ph] * 1e3) for ph in ("step", "fwd", "bwd")}})
        m = mods[mods["model"] == name]
        for q in m.itertuples():
            f, b = p["modules"].get(q.module, (np.nan, np.nan))
            preds.append({"model": name, "set": q.set, "module": q.module, "class": q._4, "meas_s": q.meas_s,
                          "pred_s": f + b, "ratio": q.meas_s / (f + b)})
    steps, per_mod = pd.DataFrame(rows), pd.DataFrame(preds)
    print(f"code: {perfcheck.__file__}; calibration: {args.calibration}; measurements: {args.csv}\n")
    print("| set | model | step | fwd | bwd |\n|---|---|---|---|---|")
    for r in steps.itertuples():
        print(f"| {r.set} | {r.model} | {r.step:.2f} | {r.fwd:.2f} | {r.bwd:.2f} |")
    print("\n| set | median abs step error | within 25% |\n|---|---|---|")
    for s, g in steps.groupby("set", sort=False):
        print(f"| {s} | {np.median(np.abs(g['step'] - 1)) * 100:.1f}% | {(np.abs(g['step'] - 1) <= 0.25).sum()}/{len(g)} |")
    print("\n| class | " + " | ".join(f"{s} median [n]" for s in per_mod["set"].unique()) + " |")
    print("|---|" + "---|" * per_mod["set"].nunique())
    for c, g in per_mod.groupby("class"):
        cells = [f"{np.median(h['ratio']):.2f} [{len(h)}]" if len(h := g[g['set'] == s]) else "-"
                 for s in per_mod["set"].unique()]
        print(f"| {c} | " + " | ".join(cells) + " |")
    if args.out:
        per_mod.to_csv(args.out, index=False)


if __name__ == "__main__":
    main()

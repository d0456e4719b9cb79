"""Paired re-prediction of one held-out measurement: the same measured steps and modules (``bench/heldout.py
--csv F``), the same calibration table (``--save-calibration C``), predicted again by the code of this tree.

Why: the machine is noisy (one model moves by up to 30% between two runs), so a change to the estimator is judged
on the same measurements, predicted by the tree before and after it (run this script from each tree; the models
are rebuilt with heldout's seed, so only the code differs).

    OMP_NUM_THREADS=1 python bench/repredict.py --measured F.csv --calibration C.csv [--csv OUT.csv]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout  # noqa: E402  (puts this tree's perfcheck first on the path)


def measured(rows: pd.DataFrame, mods: pd.DataFrame, name: str) -> dict:
    """heldout's measurement dict of model ``name`` from its CSVs (module times as fwd + bwd in one number)."""
    r = rows[rows["model"] == name].iloc[0]
    m = mods[(mods["model"] == name) & (mods["module"] != "(optimizer)")]
    return {"phases": {k: float(r[f"meas_{k}_ms"]) / 1e3 for k in ("step", "fwd", "bwd", "optim")},
            "modules": {p: (float(s), 0.0) for p, s in zip(m["module"], m["meas_s"])},
            "classes": dict(zip(m["module"], m["class"]))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measured", required=True, help="heldout.py --csv output (and its .modules.csv)")
    ap.add_argument("--calibration", required=True, help="heldout.py --save-calibration output")
    ap.add_argument("--set", choices=("design", "scoring", "both"), default="both")
    ap.add_argument("--csv", default=None, help="write the re-predicted rows (and <csv>.modules.csv)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows_in = pd.read_csv(args.measured, keep_default_na=False)
    if args.set != "both":
        rows_in = rows_in[rows_in["set"] == args.set]
    mods_in = pd.read_csv(args.measured + ".modules.csv", keep_default_na=False)
    spec, _ = heldout.calibration(args.calibration, None, print)
    rows, mods = [], []
    for s, name in zip(rows_in["set"], rows_in["model"]):
        w = heldout.build(name)
        pred = heldout.predict(w, spec, w.optimizer(w.model.parameters()))
        row, m = heldout.compare(name, s, measured(rows_in, mods_in, name), pred)
        rows.append(row)
        mods += m
    rows, mods = pd.DataFrame(rows), pd.DataFrame(mods)
    print("\n".join(heldout.summary_lines(rows, mods)))
    if args.csv:
        rows.to_csv(args.csv, index=False)
        mods.to_csv(args.csv + ".modules.csv", index=False)


if __name__ == "__main__":
    main()

"""Paired re-prediction of one held-out measurement: the same measured steps and modules (``bench/heldout.py
--csv F``), the same calibration table (``--save-calibration C``), predicted again by the code of this tree.

Why: the machine is noisy (one model moves by up to 30% between two runs), so a change to the estimator is judged
on the same measurements, predicted by the tree before and after it (run this script from each tree; the models
are rebuilt with heldout's seed, so only the code differs).

    OMP_NUM_THREADS=1 python bench/repredict.py --measured F.csv --calibration C.csv [--csv OUT.csv]

The output carries heldout's columns, the run-speed ones included (``bench/heldout.py``'s docstring): the run's
reference readings come from F.csv, the calibration's reference times from C.csv.reference.json; a file without
either (written before the readings existed) re-predicts as before, its run-speed columns NaN. A file of several
runs (``--repeats``) is re-predicted run by run, with the per-model medians.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import heldout  # noqa: E402  (puts this tree's perfcheck first on the path)


#: The references a run read between its steps (heldout's CSV, microseconds per call) -> heldout's measurement keys
#: (seconds); a file written before the readings existed has none, and its run-speed columns come out NaN.
READINGS = {"meas_ref_us": "ref_s", "meas_cref_us": "cref_s", "meas_mod_ref_us": "mod_ref_s",
            "meas_mod_cref_us": "mod_cref_s"}


def measured(rows: pd.DataFrame, mods: pd.DataFrame, name: str, run: int = 0) -> dict:
    """heldout's measurement dict of model ``name`` (run ``run`` of a file with several) from its CSVs (module
    times as fwd + bwd in one number; the references read between its steps where the file has them)."""
    if "run" in rows:
        rows = rows[rows["run"].astype(int) == run]
    if "run" in mods:
        mods = mods[mods["run"].astype(int) == run]
    r = rows[rows["model"] == name].iloc[0]
    m = mods[(mods["model"] == name) & (mods["module"] != "(optimizer)")]
    refs = {key: _seconds(r.get(col)) for col, key in READINGS.items()}
    return {"phases": {k: float(r[f"meas_{k}_ms"]) / 1e3 for k in ("step", "fwd", "bwd", "optim")},
            "modules": {p: (float(s), 0.0) for p, s in zip(m["module"], m["meas_s"])},
            "classes": dict(zip(m["module"], m["class"])), **refs}


def _seconds(us) -> float:
    """A CSV cell of microseconds in seconds; NaN for an absent or empty one."""
    try:
        return float(us) / 1e6
    except (TypeError, ValueError):
        return math.nan


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measured", required=True, help="heldout.py --csv output (and its .modules.csv)")
    ap.add_argument("--calibration", required=True, help="heldout.py --save-calibration output (its .reference.json "
                                                         "beside it gives the run-speed columns)")
    ap.add_argument("--set", choices=("design", "scoring", "both"), default="both")
    ap.add_argument("--csv", default=None, help="write the re-predicted rows (and <csv>.modules.csv)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows_in = pd.read_csv(args.measured, keep_default_na=False)
    if args.set != "both":
        rows_in = rows_in[rows_in["set"] == args.set]
    mods_in = pd.read_csv(args.measured + ".modules.csv", keep_default_na=False)
    spec, _ = heldout.calibration(args.calibration, None, print)
    runs = rows_in["run"].astype(int) if "run" in rows_in else pd.Series(0, index=rows_in.index)
    rows, mods = [], []
    for run, s, name in zip(runs, rows_in["set"], rows_in["model"]):
        w = heldout.build(name)
        pred = heldout.predict(w, spec, w.optimizer(w.model.parameters()))
        row, m = heldout.compare(name, s, measured(rows_in, mods_in, name, run), pred)
        rows.append({"run": run, **row})
        mods += [{"run": run, **x} for x in m]
    rows, mods = pd.DataFrame(rows), pd.DataFrame(mods)
    print("\n".join(heldout.summary_lines(rows, mods) + [""] + heldout.target_lines(rows, mods)))
    if heldout.run_count(rows) > 1:
        print("\n".join([""] + heldout.repeat_lines(rows)))
    if args.csv:
        rows.to_csv(args.csv, index=False)
        mods.to_csv(args.csv + ".modules.csv", index=False)


if __name__ == "__main__":
    main()

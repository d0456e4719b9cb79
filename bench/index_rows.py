"""The index-taking kernels' calibration rows (``perfcheck/calibrate/index_cases.py``: embedding rows, EmbeddingBag's
fixed costs and max mode) on fresh indices every call, for a calibration table saved when they ran on one index set:
both versions of every case are timed now, interleaved in one ``run_cases`` (the one-set version: ``index_sets``
limited to one set), and each saved row of the same kind, label and m is *scaled* by its case's rotating / one-set
ratio, so the machine's drift since the table was saved (this shared VM's memory-bound kernels moved up to 40%
between two timings an hour apart) does not enter the comparison. The re-predicted held-out measurement
(bench/repredict.py) then differs from the saved table's by the rotation alone.

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/index_rows.py RATIOS.csv [CAL.csv OUT.csv]...

RATIOS.csv: the ratios, measured and written there when it does not exist, else read (one measurement applied to
every table of a paired comparison).
"""
import json
import sys
from pathlib import Path
from unittest import mock

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's perfcheck first
from perfcheck.calibrate import index_cases as ix  # noqa: E402
from perfcheck.calibrate.cases import Timer, run_cases  # noqa: E402

KEY = ["kind", "label", "m"]


def rotation_ratios() -> pd.DataFrame:
    """Per case (kind, label, m): seconds on fresh indices, on one set, and their ratio, timed interleaved."""
    torch.set_num_threads(1)
    dev = torch.device("cpu")
    with mock.patch.object(ix, "ROTATION_SETS", (1, 1)):
        one = ix.index_cases(dev)
    fresh = ix.index_cases(dev)
    table = run_cases(one + fresh, Timer(dev, "process"), repeats=9, target_s=0.01)
    a, b = table.iloc[:len(one)].reset_index(drop=True), table.iloc[len(one):].reset_index(drop=True)
    out = a[KEY].assign(one_set_s=a["seconds"], fresh_s=b["seconds"])
    return out.assign(ratio=out["fresh_s"] / out["one_set_s"])


def main(ratios_csv, pairs):
    if Path(ratios_csv).exists():
        ratios = pd.read_csv(ratios_csv)
    else:
        ratios = rotation_ratios()
        ratios.to_csv(ratios_csv, index=False)
    for r in ratios.itertuples():
        print(f"{r.kind:10s} {r.label:24s} m={r.m:<6d} one set {r.one_set_s * 1e6:8.2f} us  fresh "
              f"{r.fresh_s * 1e6:8.2f} us  x{r.ratio:.3f}")
    for cal, out in zip(pairs[::2], pairs[1::2]):
        scale(cal, out, ratios)


def scale(cal, out, ratios):
    """``out``: the table ``cal`` with its rows of the ratios' cases scaled by them (its references beside it)."""
    saved = pd.read_csv(cal, keep_default_na=True)
    merged = saved.merge(ratios[KEY + ["ratio"]], on=KEY, how="left")
    hit = merged["ratio"].notna()
    for col in ("seconds", "seconds_min", "seconds_max"):
        merged.loc[hit, col] = merged.loc[hit, col] * merged.loc[hit, "ratio"]
    merged.drop(columns="ratio").to_csv(out, index=False)
    Path(out + ".reference.json").write_text(Path(cal + ".reference.json").read_text())
    print(f"{out}: {int(hit.sum())} rows scaled")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

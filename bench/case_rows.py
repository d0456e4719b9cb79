"""New calibration rows for a saved calibration table: cases timed now as calibration times them, placed at the saved
table's reference times (``phase.reanchor``), so a held-out measurement taken before the cases existed can be
re-predicted with them (bench/repredict.py). bench/nhwc_rows.py, bench/light_rows.py and bench/norm_cold_rows.py
each choose their cases and which rows to keep; this module times, prints and writes.
"""
import json
import sys
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's perfcheck first
from perfcheck.calibrate.cases import Timer, run_cases  # noqa: E402
from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS  # noqa: E402
from perfcheck.calibrate.phase import compute_reference_fn, reanchor, reference_fn  # noqa: E402


def measured_beside(cases, cal: str) -> tuple:
    """Time ``cases`` (one thread, process clock, three repeats, each read against the references timed before it),
    put them at ``cal``'s reference times (``cal``.reference.json) and print each beside the saved row of its kind,
    label and m:
    ``(table, saved table, references)``."""
    torch.set_num_threads(1)
    dev = torch.device("cpu")
    table = run_cases(cases, Timer(dev, "process"), repeats=3, target_s=0.01, reference=reference_fn(dev),
                      compute_reference=compute_reference_fn(dev))
    refs = json.loads(Path(cal + ".reference.json").read_text())
    table = reanchor(table, refs["reference_s"], refs.get("compute_reference_s"))
    saved = pd.read_csv(cal, keep_default_na=True)
    old = saved.drop_duplicates(["kind", "label", "m"]).set_index(["kind", "label", "m"])["seconds"]
    width = max((len(str(label)) for label in table["label"]), default=0)
    for r in table.itertuples():
        was = old.get((r.kind, r.label, r.m))
        print(f"{r.kind:10s} {r.label:{width}s} m={r.m:<6d} now {r.seconds * 1e6:9.2f} us"
              + (f"  saved {was * 1e6:9.2f} us" if was else ""))
    return table, saved, refs


def write_extended(saved: pd.DataFrame, new: pd.DataFrame, refs: dict, out: str) -> None:
    """``out``: the saved table with the ``new`` rows appended, and its references beside it."""
    pd.concat([saved, new[list(MEASUREMENT_COLUMNS)]], ignore_index=True).to_csv(out, index=False)
    Path(out + ".reference.json").write_text(json.dumps(refs, indent=1))

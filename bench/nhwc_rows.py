"""The calibration rows of the channels-last depthwise classes (``convolution_depthwise_nhwc``,
``convolution_depthwise_large_nhwc``: op_classes.conv_cases and conv_fixed_cases), measured now and placed at a saved
calibration table's reference times (``phase.reanchor``), so a table taken before the classes existed can be
re-predicted with them (bench/repredict.py). The NCHW twins are timed in the same run and printed beside the saved
table's rows as a check of the anchoring.

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/nhwc_rows.py CAL.csv OUT.csv
(OUT.csv: CAL.csv with the new rows appended.)
"""
import json
import sys
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's perfcheck first
from perfcheck.calibrate.cases import Timer, run_cases  # noqa: E402
from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS  # noqa: E402
from perfcheck.calibrate.op_classes import conv_cases, conv_fixed_cases  # noqa: E402
from perfcheck.calibrate.phase import compute_reference_fn, reanchor, reference_fn  # noqa: E402
from perfcheck.predict.aten_costs import NHWC_SUFFIX  # noqa: E402

CLASSES = ("convolution_depthwise", "convolution_depthwise_large")


def main(cal, out):
    torch.set_num_threads(1)
    dev = torch.device("cpu")
    keep = tuple(c + s for c in CLASSES for s in ("", NHWC_SUFFIX))
    cases = [c for c in conv_cases(dev) + conv_fixed_cases(dev) if c.label.split(":")[0].split(" after")[0] in keep]
    table = run_cases(cases, Timer(dev, "process"), repeats=3, target_s=0.01, reference=reference_fn(dev),
                      compute_reference=compute_reference_fn(dev))
    refs = json.loads(open(cal + ".reference.json").read())
    table = reanchor(table, refs["reference_s"], refs.get("compute_reference_s"))
    saved = pd.read_csv(cal, keep_default_na=True)
    old = saved.set_index(["kind", "label"])["seconds"]
    for r in table.itertuples():
        was = old.get((r.kind, r.label))
        print(f"{r.kind:10s} {r.label:50s} now {r.seconds * 1e6:9.1f} us" + (f"  saved {was * 1e6:9.1f} us" if was else ""))
    new = table[table["label"].str.contains(NHWC_SUFFIX)][list(MEASUREMENT_COLUMNS)]
    pd.concat([saved, new], ignore_index=True).to_csv(out, index=False)
    with open(out + ".reference.json", "w") as f:
        json.dump(refs, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

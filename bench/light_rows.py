"""The calibration rows of the light-cycle switch price (``round-robin light x13`` and ``light tight x13``:
op_cases.op_cold_light_cases), measured now and placed at a saved calibration table's reference times
(``phase.reanchor``), so a table taken before the case existed can be re-predicted with ``op_cold_light_s``
(bench/repredict.py). The near round-robin is timed in the same run and printed beside the saved table's row.

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/light_rows.py CAL.csv OUT.csv
(OUT.csv: CAL.csv with the new rows appended.)
"""
import json
import sys
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's perfcheck first
from perfcheck.calibrate import case_names as names  # noqa: E402
from perfcheck.calibrate.cases import Timer, run_cases  # noqa: E402
from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS  # noqa: E402
from perfcheck.calibrate.fit_host import op_cold_light_excess  # noqa: E402
from perfcheck.calibrate.op_cases import op_cold_light_cases, op_cold_near_cases  # noqa: E402
from perfcheck.calibrate.phase import compute_reference_fn, reanchor, reference_fn  # noqa: E402


def main(cal, out):
    torch.set_num_threads(1)
    dev = torch.device("cpu")
    cases = op_cold_near_cases(dev) + op_cold_light_cases(dev)
    table = run_cases(cases, Timer(dev, "process"), repeats=3, target_s=0.01, reference=reference_fn(dev),
                      compute_reference=compute_reference_fn(dev))
    refs = json.loads(open(cal + ".reference.json").read())
    table = reanchor(table, refs["reference_s"], refs.get("compute_reference_s"))
    saved = pd.read_csv(cal, keep_default_na=True)
    old = saved.set_index(["kind", "label"])["seconds"]
    for r in table.itertuples():
        was = old.get((r.kind, r.label))
        print(f"{r.kind:10s} {r.label:30s} now {r.seconds * 1e6:7.2f} us" + (f"  saved {was * 1e6:7.2f} us" if was else ""))
    new = table[table["label"].str.startswith((names.LIGHT, names.LIGHT_TIGHT))][list(MEASUREMENT_COLUMNS)]
    light = op_cold_light_excess(new)
    print(f"op_cold_light_s {light[0] * 1e6:.2f} us (round-robin {light[2] * 1e6:.2f}, tight {light[3] * 1e6:.2f} us per op)")
    pd.concat([saved, new], ignore_index=True).to_csv(out, index=False)
    with open(out + ".reference.json", "w") as f:
        json.dump(refs, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

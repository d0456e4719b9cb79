"""The calibration rows of the light-cycle switch price (``round-robin light x13`` and ``light tight x13``:
op_cases.op_cold_light_cases), measured now and placed at a saved calibration table's reference times
(``phase.reanchor``), so a table taken before the case existed can be re-predicted with ``op_cold_light_s``
(bench/repredict.py). The near round-robin is timed in the same run and printed beside the saved table's row.

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/light_rows.py CAL.csv OUT.csv
(OUT.csv: CAL.csv with the new rows appended.)
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's perfcheck first
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/case_rows.py
from case_rows import measured_beside, write_extended  # noqa: E402
from perfcheck.calibrate import case_names as names  # noqa: E402
from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS  # noqa: E402
from perfcheck.calibrate.fit_host import op_cold_light_excess  # noqa: E402
from perfcheck.calibrate.op_cases import op_cold_light_cases, op_cold_near_cases  # noqa: E402


def main(cal, out):
    dev = torch.device("cpu")
    table, saved, refs = measured_beside(op_cold_near_cases(dev) + op_cold_light_cases(dev), cal)
    new = table[table["label"].str.startswith((names.LIGHT, names.LIGHT_TIGHT))]
    light = op_cold_light_excess(new[list(MEASUREMENT_COLUMNS)])
    print(f"op_cold_light_s {light[0] * 1e6:.2f} us (round-robin {light[2] * 1e6:.2f}, tight {light[3] * 1e6:.2f} us "
          f"per op)")
    write_extended(saved, new, refs, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

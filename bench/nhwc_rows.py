"""The calibration rows of the channels-last depthwise classes (``convolution_depthwise_nhwc``,
``convolution_depthwise_large_nhwc``: op_classes.conv_cases and conv_fixed_cases), measured now and placed at a saved
calibration table's reference times (``phase.reanchor``), so a table taken before the classes existed can be
re-predicted with them (bench/repredict.py). The NCHW twins are timed in the same run and printed beside the saved
table's rows as a check of the anchoring.

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/nhwc_rows.py CAL.csv OUT.csv
(OUT.csv: CAL.csv with the new rows appended.)
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's perfcheck first
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/case_rows.py
from case_rows import measured_beside, write_extended  # noqa: E402
from perfcheck.calibrate.op_classes import conv_cases, conv_fixed_cases  # noqa: E402
from perfcheck.predict.aten_costs import NHWC_SUFFIX  # noqa: E402

CLASSES = ("convolution_depthwise", "convolution_depthwise_large")


def main(cal, out):
    dev = torch.device("cpu")
    keep = tuple(c + s for c in CLASSES for s in ("", NHWC_SUFFIX))
    cases = [c for c in conv_cases(dev) + conv_fixed_cases(dev) if c.label.split(":")[0].split(" after")[0] in keep]
    table, saved, refs = measured_beside(cases, cal)
    write_extended(saved, table[table["label"].str.contains(NHWC_SUFFIX)], refs, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

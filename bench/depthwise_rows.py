"""Measure the depthwise 5x5 backward's calibration rows (the class's ``opeff`` backward case, its ``classfixed``
backward tiny call and the two ``depthwise_call_cases``) once, as ``perfcheck calibrate`` does (run_cases, quick
mode's repeats, process clock), and write a copy of a saved calibration table with those rows in place of its own:
a table ``bench/repredict.py`` can re-fit with and without the per-call term (bench/results/depthwise_law.md).

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/depthwise_rows.py IN_cal.csv OUT_cal.csv
"""
import sys

import pandas as pd
import torch

from perfcheck.calibrate import case_names as names
from perfcheck.calibrate.cases import Timer, run_cases
from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS
from perfcheck.calibrate.op_classes import conv_cases, conv_fixed_cases, depthwise_call_cases

CLASS = "convolution_depthwise_large"


def main(src, dst):
    torch.set_num_threads(1)
    dev = torch.device("cpu")
    cases = ([c for c in conv_cases(dev) if c.label == f"{CLASS}:bwd"]
             + [c for c in conv_fixed_cases(dev) if c.label == f"{CLASS}:bwd"] + depthwise_call_cases(dev))
    fresh = run_cases(cases, Timer(dev, "process"), repeats=3, target_s=0.01)
    table = pd.read_csv(src)
    keep = ~(((table["kind"] == names.OPEFF) | (table["kind"] == names.CLASSFIXED)) & (table["label"] == f"{CLASS}:bwd"))
    keep &= ~table["label"].astype(str).str.startswith(f"{CLASS}:gemm_call")
    out = pd.concat([table[keep], fresh[[c for c in MEASUREMENT_COLUMNS if c in fresh.columns]]], ignore_index=True)
    out.to_csv(dst, index=False)
    print(fresh[["kind", "label", "shape" if "shape" in fresh else "m", "seconds"]].to_string())


if __name__ == "__main__":
    main(*sys.argv[1:3])

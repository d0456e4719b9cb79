"""Candidate calibration rows for a layer norm's in-step cold start, measured now and placed at a saved calibration
table's reference times (``phase.reanchor``), so a saved held-out measurement can be re-predicted with them
(bench/repredict.py): ``classfixed`` rows of the layer norm's tiny call (the op_fixed case's ``F.layer_norm`` on
8x16, and its ``aten.native_layer_norm_backward``), each in a tight loop and timed call by call right after
streaming ``EVICT_L2_MULTIPLE`` x the L2 (label + ``host.EVICTED_SUFFIX``), as ``op_classes.conv_fixed_cases`` times
a convolution class's. With them the host model prices a layer norm's call in a step at the evicted excess in place
of op_cold_s (``host._class_cold``). bench/results/instep_rates.md reads the outcome; the estimator's calibration
does not run these cases.

    OMP_NUM_THREADS=1 flock /tmp/perfcheck-bench.lock python3 bench/norm_cold_rows.py CAL.csv OUT.csv
(OUT.csv: CAL.csv with the new rows appended; the saved op_fixed row of the forward's tiny call printed beside.)
"""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's perfcheck first
sys.path.insert(1, str(Path(__file__).resolve().parent))  # bench/case_rows.py
from case_rows import measured_beside, write_extended  # noqa: E402
from perfcheck.calibrate import case_names as names  # noqa: E402
from perfcheck.calibrate.cases import Case, l2_cache_bytes  # noqa: E402
from perfcheck.predict.host import EVICTED_SUFFIX  # noqa: E402

LABEL = "native_layer_norm"


def cases(dev):
    y = torch.randn(8, 16, device=dev)
    w, b = torch.ones(16, device=dev), torch.zeros(16, device=dev)
    _, mean, rstd = torch.ops.aten.native_layer_norm(y, [16], w, b, 1e-5)
    g = torch.randn(8, 16, device=dev)
    fwd = lambda: F.layer_norm(y, (16,))  # noqa: E731  (the op_fixed case's call)
    bwd = lambda: torch.ops.aten.native_layer_norm_backward(g, y, [16], mean, rstd, w, b, [True, True, True])  # noqa: E731
    flush = torch.empty(names.EVICT_L2_MULTIPLE * l2_cache_bytes() // 4, device=dev)
    out = [Case(names.CLASSFIXED, f"{LABEL}:bwd", bwd, "fp32", host=True)]
    out += [Case(names.CLASSFIXED, key + EVICTED_SUFFIX, fn, "fp32", host=True, between=lambda: flush.add_(1.0))
            for key, fn in ((LABEL, fwd), (f"{LABEL}:bwd", bwd))]
    out += [Case(names.OPFIXED, LABEL, fwd, "fp32", host=True)]  # the saved row's twin, a check of the anchoring
    return out


def main(cal, out):
    table, saved, refs = measured_beside(cases(torch.device("cpu")), cal)
    write_extended(saved, table[table["kind"] == names.CLASSFIXED], refs, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""bench/gpu_rescore.py: the offline re-score of a recorded GPU visit reproduces the predictions that visit
recorded (computed on the H100 by the code of that day) when given that visit's calibrated.json, which carries
none of the terms added since; so it is faithful, and the new terms change nothing for a spec without them."""
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
VISIT = ROOT / "bench" / "gpu_results" / "2026-11-26-h100"


@pytest.mark.slow
def test_rescore_reproduces_the_recorded_predictions():
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_rescore

    rows, checks = gpu_rescore.rescore(VISIT, ["lenet", "jsc"], progress=lambda m: None)
    assert set(checks["model"]) == {"lenet", "jsc"} and (checks["missing"] == 0).all()
    assert np.nanmax(checks[["module_max", "step"]].to_numpy()) < 1e-6
    lines = gpu_rescore.report(rows)
    # the recorded summary.txt's lines
    assert "STEP lenet: measured 1.27 ms; measured/predicted datasheet 2.21 [2.20-2.51], calibrated 1.37 [1.36-1.56]" \
        in lines
    assert any(line.startswith("STEP jsc: measured 0.71 ms;") and "calibrated 1.50 [1.27-1.56]" in line
               for line in lines)

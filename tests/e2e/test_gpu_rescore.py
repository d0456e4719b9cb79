"""bench/gpu_rescore.py: the offline re-score of a recorded GPU visit reproduces the predictions that visit
recorded (computed on the H100 by the code of that day) when given that visit's calibrated.json, which carries
none of the terms added since; so it is faithful, and the new terms change nothing for a spec without them. The
step row alone moved since: the benchmarks price the loss where the step runs it (bench/step_model.py), not as a
model of its own, which moves these steps by 0.9-2.1%."""
import re
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
    assert np.nanmax(checks["module_max"].to_numpy()) < 1e-6
    assert np.nanmax(checks["step"].to_numpy()) < 0.03
    lines = gpu_rescore.report(rows)
    # the recorded summary.txt's lines: "STEP lenet: measured 1.27 ms; ... datasheet 2.21 [..], calibrated 1.37 [..]"
    # and "STEP jsc: measured 0.71 ms; ... calibrated 1.50 [..]": the same measurements, the ratios within 3%
    for model, measured, datasheet, calibrated in (("lenet", "1.27", 2.21, 1.37), ("jsc", "0.71", None, 1.50)):
        line = next(line for line in lines if line.startswith(f"STEP {model}: measured {measured} ms;"))
        got = dict(re.findall(r"(datasheet|calibrated) ([0-9.]+) \[", line))
        assert float(got["calibrated"]) == pytest.approx(calibrated, rel=0.03)
        if datasheet is not None:
            assert float(got["datasheet"]) == pytest.approx(datasheet, rel=0.03)

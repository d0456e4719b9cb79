"""perfcheck.predict.run_speed: the machine's speed during a run from the calibration's references, and a
prediction set at that speed (hand arithmetic)."""
import math

import pytest

from perfcheck.predict.run_speed import at_run_speed, speed_factors

CAL = {"reference_s": 2e-6, "compute_reference_s": 40e-6}


def test_speed_factors_are_run_over_calibration():
    sh, sc = speed_factors(CAL, 3e-6, 30e-6)
    assert sh == pytest.approx(1.5) and sc == pytest.approx(0.75)


@pytest.mark.parametrize("cal, ref, cref", [
    ({}, 3e-6, 30e-6),                                    # a spec without references (datasheet, GPU, older)
    ({"reference_s": True, "compute_reference_s": 0.0}, 3e-6, 30e-6),
    (CAL, math.nan, math.nan),                            # a run without readings
    (CAL, None, 0.0),
])
def test_speed_factors_nan_without_both_sides(cal, ref, cref):
    assert all(math.isnan(x) for x in speed_factors(cal, ref, cref))


def test_at_run_speed_scales_host_and_kernel_parts_apart():
    # 10 ms of which 4 ms host: 2 x 4 + 0.5 x 6 = 11 ms
    assert at_run_speed(10e-3, 4e-3, 2.0, 0.5) == pytest.approx(11e-3)
    # the host share is clipped to the time: all host
    assert at_run_speed(1e-3, 5e-3, 2.0, 1.0) == pytest.approx(2e-3)
    # at the calibration's level nothing moves
    assert at_run_speed(7e-3, 3e-3, 1.0, 1.0) == pytest.approx(7e-3)
    assert math.isnan(at_run_speed(7e-3, 3e-3, math.nan, 1.0))

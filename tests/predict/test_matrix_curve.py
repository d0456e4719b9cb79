"""The size curve carried across dtypes (perfcheck.predict.matrix_curve): by hand, and against the H200
calibration's own measured matmuls in a dtype the curve was not fitted on."""
import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfcheck.errors import UserError
from perfcheck.hardware.systems import load_system
from perfcheck.predict import roofline

H200 = Path(__file__).resolve().parents[2] / "bench" / "gpu_results" / "2026-11-27-h200"


def _spec(tmp_path, **changes):
    d = json.loads((Path(__file__).resolve().parents[2] / "perfcheck/hardware/specs/h200.json").read_text())
    d.update(name="curve-test", matrix_flops_per_s={"bf16": 1000e12, "fp32": 50e12},
             vector_flops_per_s={"bf16": 100e12, "fp32": 50e12},
             efficiency={**d["efficiency"], "matrix": 0.7, "matrix_fp32": 0.8},
             matrix_efficiency_curve=[[1e6, 0.001], [1e12, 0.7]], matrix_efficiency_curve_dtype="bf16")
    d.pop("matrix_shape_curve", None)
    d["efficiency"].pop("matrix_sustained", None)
    d.update(changes)
    f = tmp_path / "s.json"
    f.write_text(json.dumps(d))
    return load_system(f)


def test_reference_dtype_reads_its_curve_and_another_dtype_adds_its_flat_time_to_the_floor(tmp_path):
    spec = _spec(tmp_path)
    assert roofline.matrix_efficiency(spec, "bf16", 1e6) == pytest.approx(0.001)
    # by hand: t_ref = 1e6 / (1e15 * 0.001) = 1 us; floor = 1 us - 1e6 / (0.7e15); fp32 adds 1e6 / (50e12 * 0.8)
    t32 = 1e-6 - 1e6 / 0.7e15 + 1e6 / 40e12
    assert roofline.matrix_efficiency(spec, "fp32", 1e6) == pytest.approx(1e6 / (50e12 * t32))
    # a large kernel: the curve's end equals the flat rate, so the floor is 0 and fp32 runs at its own flat 0.8
    assert roofline.matrix_efficiency(spec, "fp32", 1e12) == pytest.approx(0.8)


def test_a_spec_whose_curve_names_no_dtype_scales_it_as_before(tmp_path):
    spec = _spec(tmp_path, matrix_efficiency_curve_dtype="")
    assert roofline.matrix_efficiency(spec, "fp32", 1e6) == pytest.approx(0.001 * 0.8 / 0.7)


def test_a_curve_dtype_the_spec_has_no_peak_for_is_refused_naming_the_field(tmp_path):
    with pytest.raises(UserError, match="matrix_efficiency_curve_dtype"):
        _spec(tmp_path, matrix_efficiency_curve_dtype="fp8")


def test_fp32_matmuls_on_the_h200_from_the_bf16_curve_match_their_measured_times(tmp_path):
    """The H200 calibration (2026-11-27) timed square matmuls in bf16 (the curve's dtype) and fp32. The non-device
    part of a measured time (dispatch, the op's fixed cost) is the same in both dtypes, so
    measured_fp32 ~= measured_bf16 + device_fp32 - device_bf16. Scaling the bf16 curve to the fp32 peak by the
    flat ratio (the older rule) gives ~100 us for the 128^3 product measured at 13 us."""
    d = json.loads((H200 / "calibrated.json").read_text())
    d["matrix_efficiency_curve_dtype"] = "bf16"
    (tmp_path / "h200.json").write_text(json.dumps(d))
    spec = load_system(tmp_path / "h200.json")
    with gzip.open(H200 / "calibration.csv.gz", "rt") as f:
        t = pd.read_csv(f)
    mm = t[(t["kind"] == "matmul") & (t["label"].str.startswith("mm "))]
    for n in (128, 256, 512, 1024, 2048, 4096):
        row = mm[mm["m"] == n].set_index("dtype")["seconds"]
        flops = 2.0 * n ** 3
        dev = {dt: float(roofline.compute_time_s(flops, 0.0, spec, dt)) for dt in ("bf16", "fp32")}
        want = row["bf16"] + dev["fp32"] - dev["bf16"]
        assert row["fp32"] == pytest.approx(want, rel=0.25), n
    old = 2 * 128 ** 3 / (spec.matrix_peak("fp32") * np.interp(np.log(2 * 128 ** 3), *zip(
        *[(np.log(x), y) for x, y in spec.matrix_efficiency_curve])) * spec.matrix_efficiency("fp32")
        / spec.efficiency["matrix"])
    assert old > 5 * mm[(mm["m"] == 128) & (mm["dtype"] == "fp32")]["seconds"].iloc[0]

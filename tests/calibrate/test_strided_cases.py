"""The strided-kernel calibration cases (perfcheck/calibrate/strided_cases.py): bytes and elements by hand, the
fit against a hand-made table, and the cases run end to end on the CPU at tiny sizes."""
import pandas as pd
import pytest

from perfcheck.calibrate import strided_cases
from perfcheck.hardware.systems import load_system


def test_cases_count_elements_and_bytes_by_hand():
    cases = {c.label: c for c in strided_cases.strided_cases("cpu", sizes="tiny")}
    T, D = strided_cases.SIZES["tiny"]
    weight = cases["mul by a broadcast weight"]
    assert weight.shape[0] == T * D and weight.bytes == 4 * T * D + 2 * D  # read x and w (bf16), write the product
    assert cases["widening cast bf16 -> fp32"].bytes == 6 * T * D  # read 2, write 4
    assert cases["transpose copy"].shape[0] == T * D and cases["transpose copy"].bytes == 4 * T * D
    for c in cases.values():  # each runs and writes the elements it says
        assert c.fn().numel() == c.shape[0]


def _table(rates):
    return pd.DataFrame([dict(kind="strided", label=f"case {i}", m=1e9, seconds=1e9 / r) for i, r in enumerate(rates)]
                        + [dict(kind="copy", label="other", m=1.0, seconds=1.0)])


def test_fit_is_the_median_rate_and_apply_writes_it_with_a_source():
    table = _table([3e11, 4e11, 5e11, 1e12])
    assert strided_cases.fit_rate(table) == pytest.approx(4.5e11)
    spec = strided_cases.apply(load_system("h100-sxm"), table, "measured here")
    assert spec.strided_elements_per_s == pytest.approx(4.5e11)
    assert spec.sources["strided_elements_per_s"].startswith("measured here")
    untouched = load_system("h100-sxm")
    assert strided_cases.apply(untouched, _table([])[lambda d: d.kind != "strided"], "x") is untouched


def test_bench_runs_on_a_cpu_at_tiny_sizes():
    table = strided_cases.bench_strided("cpu", sizes="tiny", repeats=1, target_s=1e-4)
    assert set(table["kind"]) == {"strided"} and len(table) == 4 and (table["seconds"] > 0).all()

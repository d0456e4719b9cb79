"""A CPU's strided element rate from calibration pairs (perfcheck/calibrate/cpu_strided_fit.py) on a planted table,
and the cases that write them (cpu_strided_cases.py)."""
import pandas as pd
import pytest
import torch

from perfcheck.calibrate import case_names as names, cpu_strided_fit
from perfcheck.calibrate.cpu_strided_cases import SHAPE, cpu_strided_cases
from perfcheck.hardware.systems import load_system

MEM = 50e9 * 0.7  # the cpu spec's bandwidth x memory efficiency


def _pair(label, n, twin_s, extra_s, charged):
    return [dict(kind=names.CPU_STRIDED, label=label, m=n, bytes=charged, seconds=twin_s + extra_s),
            dict(kind=names.CPU_STRIDED, label=label + names.TWIN, m=n, bytes=charged, seconds=twin_s)]


def test_rates_from_a_planted_table():
    """Planted: 1e6 elements at 0.5 G/s (2 ms) in two pairs, one charging 8e6 bytes (its extra over the twin is
    2 ms - 8e6 / 3.5e10), one charging none (extra 2 ms); a third at 1 G/s; a noisy pair (strided faster than
    its twin by more than its bytes) is left out. Median: 0.5 G/s."""
    n = 1e6
    table = pd.DataFrame(_pair("copy", n, 1e-3, 2e-3 - 8e6 / MEM, 8e6) + _pair("norm", n, 5e-3, 2e-3, 0)
                         + _pair("relu", n, 1e-4, 1e-3 - 8e6 / MEM, 8e6) + _pair("noise", n, 1e-3, -1e-3, 0)
                         + [dict(kind="copy", label="x", m=0, bytes=1.0, seconds=1.0)])
    cpu = load_system("cpu")
    rates = cpu_strided_fit.pair_rates(cpu, table)
    assert set(rates) == {"copy", "norm", "relu"}
    assert rates["copy"] == pytest.approx(0.5e9) and rates["norm"] == pytest.approx(0.5e9)
    assert rates["relu"] == pytest.approx(1e9)
    assert cpu_strided_fit.fitted_rate(cpu, table) == pytest.approx(0.5e9)
    on = cpu_strided_fit.apply(cpu, table, "test", in_model=True)
    assert on.strided_elements_per_s == pytest.approx(0.5e9)
    assert "cpu_strided_cases" in on.sources["strided_elements_per_s"]
    # not in the model (IN_MODEL False): the spec keeps its 0
    assert cpu_strided_fit.IN_MODEL is False
    assert cpu_strided_fit.apply(cpu, table, "test").strided_elements_per_s == 0
    assert cpu_strided_fit.apply(cpu, table[table["kind"] != names.CPU_STRIDED], "t", in_model=True) is cpu


def test_cases_come_in_pairs_with_the_bytes_the_estimator_charges():
    """Every strided case has its twin right after it, same elements and bytes; bytes by hand: a copy 2 x 4 bytes
    per element, an add 3 x 4, the layer norm's inner copy none (its bytes are not the norm's), relu 2 x 4."""
    cases = cpu_strided_cases("cpu")
    n = SHAPE[0] * SHAPE[1] * SHAPE[2] * SHAPE[3]
    assert len(cases) == 8
    for strided, twin in zip(cases[::2], cases[1::2]):
        assert twin.label == strided.label + names.TWIN and twin.shape == strided.shape == (n, 0, 0)
        assert twin.bytes == strided.bytes
        strided.fn(), twin.fn()  # both run
    assert [c.bytes for c in cases[::2]] == [8 * n, 12 * n, 0, 8 * n]
    assert (SHAPE[2] * SHAPE[3]) & (SHAPE[2] * SHAPE[3] - 1)  # H * W not a power of two (the cases' docstring)


def test_the_strided_calls_match_their_twins():
    """The strided call and its twin compute the same values (the pair differs in layout only)."""
    cases = cpu_strided_cases("cpu")
    for strided, twin in zip(cases[::2], cases[1::2]):
        a, b = strided.fn(), twin.fn()
        a, b = (a[0], b[0]) if isinstance(a, tuple) else (a, b)
        if "copy" in strided.label:  # a permuted copy against a clone of the original: same numbers, other order
            assert torch.equal(a.flatten().sort().values, b.flatten().sort().values)
        else:
            assert torch.allclose(a, b, atol=1e-5)

"""The round-robin of the op_fixed ops timed after the cold filler (cases.op_cold_filler_cases) and op_cold_s
fitted from it (fit_cold.op_cold_excess): the case is timed after the filler with the filler outside the timing (a
fake clock that only the calls advance), per dtype; the fit prefers it to the tight round-robin (hand
arithmetic); and a table without it fits as before."""
import pandas as pd
import pytest
import torch

from perfcheck.calibrate import fit, fit_cold, op_cases as cases
from perfcheck.calibrate.cases import Timer

US = 1e-6


class _FakeClock:
    """A clock that moves only when the code under test says so: the filler advances it 1000 units, a
    round-robin op 2 units, so a timing that left the filler outside reads 2 per op exactly."""

    def __init__(self):
        self.t = 0.0
        self.log = []

    def __call__(self):
        return self.t


def test_after_filler_case_is_timed_after_the_filler_and_without_it():
    clock = _FakeClock()
    n_ops = 5

    def op():
        clock.log.append("op")
        clock.t += 2.0

    def filler():
        clock.log.append("filler")
        clock.t += 1000.0

    (case,) = cases.op_cold_filler_cases(torch.device("cpu"), [("fp32", [op] * n_ops)])
    case.between = filler  # the real filler runs torch; the fake one moves the clock
    timer = Timer(torch.device("cpu"))
    timer._now = clock
    timer._read = 0.0  # a fake clock costs nothing to read
    per_call = timer.loop(case.fn, 3, case.between, case.host)
    assert clock.log == (["filler"] + ["op"] * n_ops) * 3  # each round right after a filler
    assert per_call / case.per_call == pytest.approx(2.0)  # the filler's 1000 units are not in it
    assert case.label == f"round-robin after filler x{n_ops}" and case.kind == "opcold" and case.host


def test_op_cold_cases_have_a_filler_case_per_dtype():
    got = cases.op_cold_cases("cpu", dtypes=("bf16",))
    labels = [(c.label, c.dtype, c.between is not None) for c in got]
    n = len(cases.tiny_ops(torch.device("cpu")))
    assert labels == [(f"round-robin x{n}", "fp32", False), (f"round-robin x{n}", "bf16", False),
                      (f"round-robin after filler x{n}", "fp32", True),
                      (f"round-robin after filler x{n}", "bf16", True),
                      (f"round-robin near x{n - 1}", "fp32", False),  # tests/predict/test_family_reuse.py
                      ("round-robin light x13", "fp32", False), ("light tight x13", "fp32", False)]
    # the real filler runs (a forward and backward of other layers) and the case's ops run once each
    got[2].between()
    got[2].fn()


def _row(kind, label, seconds, dtype="fp32"):
    return {"kind": kind, "label": label, "dtype": dtype, "m": 0, "k": 0, "n": 0, "flops": 0.0, "bytes": 0.0,
            "world_size": 1, "seconds": seconds}


def test_fit_prefers_the_round_robin_after_the_filler():
    # tight loops 4, 6, 8 us (mean 6); tight round-robin 9 us per op; after the filler 20 us per op
    rows = [_row("opfixed", "a", 4 * US), _row("opfixed", "b", 6 * US), _row("opfixed", "c", 8 * US),
            _row("opcold", "round-robin x3", 9 * US), _row("opcold", "round-robin after filler x3", 20 * US)]
    cold, n, rr, tight = fit_cold.op_cold_excess(pd.DataFrame(rows))
    assert (cold, n, rr, tight) == (pytest.approx(14 * US), 3, pytest.approx(20 * US), pytest.approx(6 * US))
    # in either order, and per dtype (bf16 rows apart)
    bf = [_row(r["kind"], r["label"], r["seconds"] * 2, "bf16") for r in rows]
    table = pd.DataFrame(rows[::-1] + bf)
    assert fit_cold.op_cold_excess(table)[0] == pytest.approx(14 * US)
    assert fit_cold.op_cold_excess(table, "bf16")[0] == pytest.approx(28 * US)
    # a table without it (an older calibration): the tight round-robin, as before
    assert fit_cold.op_cold_excess(pd.DataFrame(rows[:4]))[0] == pytest.approx(3 * US)
    assert fit_cold.op_cold_excess(pd.DataFrame(rows), after_filler=False)[0] == pytest.approx(3 * US)
    # which spec uses which (fit_cold.AFTER_FILLER_KINDS): a GPU the after-filler one, a CPU the tight one
    table = pd.DataFrame([_row("launch", "op", 4 * US), _row("host", "view", 2 * US)] + rows)
    gpu = fit.build_spec("h100-sxm", table, peaks="base", stamp="s")
    cpu = fit.build_spec("cpu", table, peaks="measured", stamp="s")
    assert gpu.host["op_cold_s"] == pytest.approx(14 * US) and "after a cold filler" in gpu.sources["host.op_cold_s"]
    assert cpu.host["op_cold_s"] == pytest.approx(3 * US) and "after a cold filler" not in cpu.sources["host.op_cold_s"]

"""The page_faults step rule (perfcheck.analysis.page_faults, rules.STEP_RULES): its arithmetic by hand, and a
planted run (a fresh 48 MiB mmap first-touched every forward, invisible to the estimator) against a control.
No timing assertion: the planted block's fill is milliseconds of work the prediction does not have."""
import mmap
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from perfcheck import PerfCheck
from perfcheck.analysis import page_faults
from perfcheck.analysis.findings import REASONS, findings_table, step_findings
from perfcheck.analysis.pipeline import reconcile_run
from perfcheck.analysis.thresholds import Context, Thresholds
from perfcheck.report.text import render_text
from perfcheck.schema import ROOT


def _totals(**over):
    row = {"rank": 0, "pred_bwd_s": 1.2e-3, "meas_bwd_s": 2.0e-3, "minor_faults_bwd": 857.0, "page_bytes": 4096.0,
           "fault_cost_s": 0.8e-6, "major_faults_step": 0.0}
    row.update(over)
    return pd.DataFrame([row])


def test_estimate_by_hand():
    faults, touched, seconds = page_faults.estimate(_totals().iloc[0].to_dict(), "bwd")
    assert faults == 857
    assert touched == 857 * 4096 == 3_510_272
    assert seconds == pytest.approx(857 * 0.8e-6)  # 0.6856 ms
    # the time it accounts for: the fault time, at most the excess over the prediction (0.8 ms)
    assert page_faults.lost_seconds(_totals().iloc[0].to_dict(), "bwd") == pytest.approx(0.6856e-3)
    assert page_faults.lost_seconds(_totals(fault_cost_s=2e-6).iloc[0].to_dict(), "bwd") == pytest.approx(0.8e-3)


@pytest.mark.parametrize("over, fires", [
    ({}, True),                                  # 0.69 ms of faults = 34% of a 2 ms phase 1.67x over its prediction
    ({"pred_bwd_s": 2.5e-3}, False),             # faster than predicted: nothing to explain
    ({"pred_bwd_s": np.nan}, False),             # no prediction
    ({"minor_faults_bwd": 255.0}, False),        # under page_fault_min (256)
    ({"minor_faults_bwd": 256.0}, True),         # 256 x 0.8 us = 0.205 ms = 10% >= 5%
    ({"fault_cost_s": 0.3e-6}, True),            # 857 x 0.3 us = 0.257 ms = 12.9% of 2 ms
    ({"fault_cost_s": 0.1e-6}, False),           # 857 x 0.1 us = 0.0857 ms = 4.3% < 5%
    ({"fault_cost_s": np.nan}, True),            # cost not measured: the count alone
    ({"minor_faults_bwd": np.nan}, False),       # no counter
])
def test_match_thresholds_by_hand(over, fires):
    assert bool(page_faults.match(_totals(**over), "bwd", Context())[0]) is fires


def test_evidence_quotes_the_numbers_and_the_remedies():
    text = page_faults.evidence(_totals().iloc[0].to_dict(), "bwd", Context())
    assert text.startswith("backward: 857 minor page faults per step (~3.51 MB first-touched at 4.1 KB per fault; ")
    assert "up to ~685.6 us at this machine's measured 800 ns per fault = 34.3% of the 2 ms measured, 1.2 ms " \
           "predicted" in text, text
    for remedy in ("zero_grad(set_to_none=False)", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "jemalloc",
                   "tcmalloc"):
        assert remedy in text
    unmeasured = page_faults.evidence(_totals(fault_cost_s=np.nan).iloc[0].to_dict(), "bwd", Context())
    assert "not measured" in unmeasured


def test_step_findings_from_the_totals_attrs():
    rec = pd.DataFrame({"module": [ROOT], "type": ["DLRM"], "rank": [0]})
    rec.attrs["totals"] = [_totals().iloc[0].to_dict() | {"pred_fwd_s": 1e-3, "meas_fwd_s": 1.5e-3,
                                                          "minor_faults_fwd": 0.0}]
    f = step_findings(rec)
    assert list(f["phase"]) == ["bwd"] and list(f["reason"]) == ["page_faults"] and f["type"].iloc[0] == "DLRM"
    assert f["gap"].iloc[0] == pytest.approx(2.0 / 1.2)
    assert "page_faults" in REASONS
    # stricter thresholds carried by the table: no finding
    rec.attrs["thresholds"] = {**vars(Thresholds()), "page_fault_min": 1000}
    assert step_findings(rec).empty


def fresh_block(size=48 << 20):
    """Map a fresh anonymous block (4 KiB pages), write every byte, unmap it: what a freed-and-reallocated
    tensor does when glibc returns it to the OS, without depending on this long test process's malloc
    state (a free heap chunk large enough is reused without faults, whatever the mmap threshold)."""
    block = mmap.mmap(-1, size)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        block.madvise(mmap.MADV_NOHUGEPAGE)
    view = np.frombuffer(block, dtype=np.uint8)
    view[:] = 1
    del view
    block.close()


class FreshBlock(torch.nn.Module):
    """A Linear whose forward also first-touches a fresh 48 MiB block (``fresh_block``), outside torch: the
    estimator does not see it, so the forward is slower than predicted by at least the write."""

    def __init__(self, plant: bool):
        super().__init__()
        self.lin, self.plant = torch.nn.Linear(16, 16), plant

    def forward(self, x):
        if self.plant:
            fresh_block()
        return self.lin(x)


def _report(tmp_path, plant):
    model = FreshBlock(plant)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = tmp_path / ("planted" if plant else "control")
    with PerfCheck(model, warmup=1, steps=3, profile=False, sample_interval=None, out_dir=out) as pc:
        for _ in range(4):
            model(torch.randn(8, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
            pc.step()
    return reconcile_run(out).table


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="getrusage fault counts of anonymous mmaps")
def test_planted_fresh_block_is_explained_and_the_control_is_not(tmp_path):
    planted = _report(tmp_path, True)
    t = planted.attrs["totals"][0]
    assert t["minor_faults_fwd"] >= 0.99 * (48 << 20) / t["page_bytes"]
    f = findings_table(planted)
    hit = f[f["reason"] == "page_faults"]
    assert list(hit["phase"]) == ["fwd"], f
    assert hit["evidence"].iloc[0].startswith(f"forward: {t['minor_faults_fwd'] / 1e3:.2f} K minor page faults")
    assert "page faults per step (minor, median):" in render_text(planted)
    control = _report(tmp_path, False)
    assert control.attrs["totals"][0]["minor_faults_step"] < 64
    assert not (findings_table(control)["reason"] == "page_faults").any()

"""Terminal tree and units: DeepSpeed's shape, without DeepSpeed's mistakes."""
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from perfcheck.commands.report import build
from perfcheck.analysis.reconcile import reconcile
from perfcheck.report.text import render_text
from perfcheck.units import fmt_bytes, fmt_count, fmt_gap, fmt_pct, fmt_rate, fmt_time
from perfcheck.schema import ROOT

from _reconcile_rows import meas_row, pred_row

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.mark.parametrize("seconds, text", [(698.8e-6, "698.8 us"), (1.25e-3, "1.25 ms"), (0.10741, "107.4 ms"),
                                           (1.8e9 * 1e-9, "1.8 s"), (1800.0, "1800 s"), (2.5e-9, "2.5 ns"),
                                           (0, "0"), (math.nan, "-"), (None, "-"), (math.inf, "inf")])
def test_fmt_time_never_prefixes_above_seconds(seconds, text):
    assert fmt_time(seconds) == text


def test_other_units():
    assert fmt_count(62006) == "62.01 K" and fmt_count(117) == "117" and fmt_count(5.21376e6, "MACs") == "5.21 MMACs"
    assert fmt_rate(9.51e9) == "9.51 GFLOP/s" and fmt_rate(15e9, "B/s") == "15 GB/s" and fmt_rate(500) == "500 FLOP/s"
    assert fmt_bytes(64e6) == "64 MB" and fmt_bytes(640) == "640 B"
    assert fmt_gap(50) == "50.0x" and fmt_gap(0.413) == "0.41x" and fmt_gap(math.inf) == "inf" and fmt_gap(1234) == "1234x"
    assert fmt_pct(0.3) == "30.0%" and fmt_pct(0.00059) == "0.059%"


def _rec():
    p = pd.DataFrame([pred_row(ROOT, 2e-3, 4e-3, type="Net", params=62006, macs_fwd=5.2e6),
                      pred_row("blk", 1.5e-3, 3e-3, type="Block", params=60000),
                      pred_row("blk.fc", 1e-3, 2e-3, params=48120, flops_fwd=1e12, bound_fwd="compute"),
                      pred_row("blk.act", 1e-6, 1e-6, type="ReLU", params=0),
                      pred_row("head", 1e-4, 2e-4, params=2006)])
    m = pd.DataFrame([meas_row(ROOT, 3e-3, 6e-3, type="Net"), meas_row("blk", 2e-3, 4e-3, type="Block"),
                      meas_row("blk.fc", 0.9e-3, 2.2e-3), meas_row("blk.act", 12e-6, 14e-6, type="ReLU"),
                      meas_row("head", 1e-4, 2e-4), meas_row("extra", 1e-5, 0, type="Dropout")])
    return reconcile(p, m, system="h100-sxm", dtype="bf16")


def test_tree_has_forward_and_backward_per_module_and_plausible_units():
    text = render_text(_rec())
    assert "params of model:                            62.01 K" in text  # from the root row, never 0
    tree = text[text.index("module    "):]
    line = next(l for l in tree.splitlines() if "(fc): Linear" in l)
    # params, MACs, fwd pred/meas/gap/rate, bwd pred/meas/gap/rate, bound, reason
    assert re.search(r"48\.12 K .* 1 ms +900 us +0\.90x .* 2 ms +2\.2 ms +1\.10x", line), line
    act = next(l for l in tree.splitlines() if "(act): ReLU" in l)
    assert "12.0x" in act and "launch_overhead" in act  # 12 us per call: within 3 launch floors (5 us)
    assert "(extra): Dropout [measured only]" in tree and "not_predicted" in tree
    # every time printed is in s/ms/us/ns, never "Gs"/"ks"
    assert not re.search(r"\d (G|M|K|k)s\b", text)
    assert "artifact!" in line  # 1e12 FLOPs in 0.9 ms is above H100's bf16 peak: never shown as a rate


def test_depth_and_top_options():
    rec = _rec()
    shallow = render_text(rec, depth=1, top=1)
    tree = shallow[shallow.index("module    "):shallow.index("Findings")]
    assert "(blk): Block" in tree and "(fc): Linear" not in tree
    assert "depth 2:" not in shallow
    params_line = next(l for l in shallow.splitlines() if l.strip().startswith("params") and "depth" not in l
                       and "{'blk'" in l)
    assert params_line.count(":") == 1  # top 1: a single module per list
    full = render_text(rec, top=2)
    assert "depth 2:" in full and "(fc): Linear" in full
    assert "{'blk.fc': 48.12 K, 'blk.act': 0}" in full


def test_findings_section_lists_reasons_with_evidence():
    text = render_text(_rec(), top=5)
    block = text[text.index("Findings"):]
    assert "blk.act fwd: launch_overhead (12.0x" in block
    assert "launch_overhead: launch- or overhead-bound" in block


def test_multi_rank_run_shows_per_rank_totals_and_the_straggler():
    rec = build(DATA / "run_jsc_2ranks").table
    text = render_text(rec)
    assert "Per-rank totals" in text and "STRAGGLER" in text
    straggler_line = next(l for l in text.splitlines() if "STRAGGLER" in l)
    assert straggler_line.split()[0] == "1"  # rank 1 slept 5 ms per step
    assert "(tree below: rank 1)" in text
    assert "Modules over ranks" in text and " / " in text

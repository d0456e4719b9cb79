"""No negative times anywhere (issue 11: 'loss/data/idle -115.8 us', meas_other_s -5 ms): medians of the
step's parts need not add up; a negative remainder is shown as 0 with the overlap said in words."""

import pytest

from perfcheck.analysis.reconcile import reconcile
from perfcheck.analysis.totals import totals_frame
from perfcheck.report.text import render_text
from perfcheck.schema import ROOT
from _reconcile_rows import frames, meas_row, pred_row, steps_frame as _steps


def test_overlapping_medians_give_zero_other_time_and_a_note():
    # per step: step = fwd + bwd + optim exactly (other = 0 in every step), but the medians of the
    # parts come from different steps: median step 10 ms; fwd 4, bwd 5, optim 2 -> 10 - 4 - 5 - 2 = -1 ms.
    steps = _steps([("measured", 4e-3, 4e-3, 2e-3, 10e-3, False),
                    ("measured", 2e-3, 5e-3, 3e-3, 10e-3, False),
                    ("measured", 5e-3, 5e-3, 1e-3, 11e-3, False),
                    ("measured", 4e-3, 6e-3, 2e-3, 12e-3, False),
                    ("measured", 3e-3, 5e-3, 1e-3, 9e-3, False)])
    p, m = frames([pred_row(ROOT, 2e-3, pred_bwd=4e-3)], [meas_row(ROOT, 4e-3, bwd=5e-3)])
    rec = reconcile(p, m, steps=steps)
    t = totals_frame(rec).iloc[0]
    assert t["unexplained_s"] == pytest.approx(10e-3 - 4e-3 - 5e-3)  # 1 ms, positive
    assert t["other_s"] == 0.0  # 1 ms - optim 2 ms would be -1 ms
    text = render_text(rec)
    assert "overlap by 1" in text and "-1" not in text.split("loss/data/idle")[1].split("\n")[0]


def test_stage_comparison_clamps_other_time(tmp_path):
    from perfcheck.analysis.answers import notes

    row = {f"pred_{k}_bytes": 0 for k in ("allreduce", "allgather", "reducescatter", "reduce")}
    row.update({f"meas_{k}_bytes": 0 for k in ("allreduce", "allgather", "reducescatter", "reduce")})
    row.update({f"{s}_{p}_mem_bytes": 1.0 for s in ("pred", "meas") for p in ("param", "grad", "optim")},
               other_overlap_s=5e-3, compute_predicted=True)

    class Est:
        stage, dp, micro_steps = 0, 2, 1

        class precision:
            param_bytes, grad_bytes = 4, 4

    assert any("overlap by 5 ms" in n for n in notes(row, {}, Est))

"""The comparison page is readable at a glance (issue 11): a designed summary (pred | meas | ratio per
quantity) and a link to the full CSV instead of a raw dump of every column; the step-time figure puts
predicted and measured on a log axis where both show."""
from pathlib import Path


from perfcheck.analysis.stages import reconcile_stages
from perfcheck.report import stages_html

DATA = Path(__file__).resolve().parents[1] / "data" / "deepspeed_sweep"


def test_summary_and_link_instead_of_every_column(tmp_path):
    table = reconcile_stages([str(DATA)])
    stages_html.write_html(table, tmp_path / "comparison.html")
    page = (tmp_path / "comparison.html").read_text()
    assert '<a href="comparison.csv">' in page and f"Every column ({len(table.columns)}" in page
    summary = page[page.index("<h2>Summary"):]
    assert "<th>notes</th>" not in summary and "pred_allgather_bytes" not in summary  # no raw column dump
    r = table[(table["run"] == "stage0") & (table["rank"] == 0)].iloc[0]
    want = f"{r['meas_step_s'] / r['pred_step_s']:.3g}x"  # the ratio cell, computed here from the table
    assert want in summary
    assert summary.count("<tr class=bad>") == int((table["status"] != "ok").sum() + (
        (table["status"] == "ok") & (table["bytes_ok"] == False)).sum())  # noqa: E712


def test_step_figure_uses_a_log_axis_with_both_bars():
    import base64

    import matplotlib

    matplotlib.use("Agg")

    table = reconcile_stages([str(DATA / s) for s in ("stage0", "stage3")])
    captured = {}
    real = stages_html.figure_png

    def keep(fig):
        ax = fig.axes[0]
        captured["scale"] = ax.get_yscale()
        captured["heights"] = sorted(p.get_height() for p in ax.patches)
        captured["ylim"] = ax.get_ylim()
        return real(fig)

    stages_html.figure_png = keep
    try:
        png = stages_html.time_figure(table)
    finally:
        stages_html.figure_png = real
    assert base64.b64decode(png)[:4] == b"\x89PNG"
    assert captured["scale"] == "log"
    lo, hi = captured["ylim"]
    assert all(lo < h < hi for h in captured["heights"] if h > 0)  # every bar inside the axis: none clipped

"""The HTML report in a real browser: headless Chromium renders it, and the plot regions hold plots.

Where are the plots? A probe copy of the page shifts every plot image out of its own box
(``object-position``) and paints the box a pure colour, one colour per plot, so the layout is
unchanged and each plot's box can be found in the probe screenshot by its colour. The real page's
screenshot must then show a drawing inside each box (many non-white pixels, many colours), and a
copy with the images moved out of their boxes must not (the check can fail).
"""
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from perfcheck.commands.report import build, render

DATA = Path(__file__).resolve().parents[1] / "data"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
PLOTS = {"plot-pred-vs-meas": (255, 0, 255), "plot-top-modules": (0, 255, 255), "plot-roofline": (255, 255, 0),
         "plot-timeline": (0, 255, 0), "plot-kernels": (0, 0, 255)}
WINDOW = (1400, 4200)


def _screenshot(page: str, tmp: Path, name: str) -> np.ndarray:
    from PIL import Image

    src, png = tmp / f"{name}.html", tmp / f"{name}.png"
    src.write_text(page)
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    try:
        subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        "--hide-scrollbars", "--force-device-scale-factor=1", f"--user-data-dir={profile}",
                        f"--screenshot={png}", f"--window-size={WINDOW[0]},{WINDOW[1]}", src.as_uri()],
                       check=True, capture_output=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return np.asarray(Image.open(png).convert("RGB")).astype(int)


def _probe(page: str, paint: bool = True) -> str:
    """The page with every plot image moved out of its box (same layout); the box painted its probe colour."""
    css = "".join(f"#{fid} img{{object-position:100000px 0;" + (f"background:rgb{rgb}!important" if paint else "") + "}"
                  for fid, rgb in PLOTS.items())
    return page.replace("</style>", css + "</style>")


def _boxes(img: np.ndarray) -> dict:
    boxes = {}
    for fid, rgb in PLOTS.items():
        ys, xs = np.nonzero((img == np.array(rgb)).all(axis=2))
        if len(ys) > 1000:
            boxes[fid] = (ys.min(), ys.max() + 1, xs.min(), xs.max() + 1)
    return boxes


def _ink(img: np.ndarray, box) -> tuple:
    y0, y1, x0, x1 = box
    region = img[y0:y1, x0:x1].reshape(-1, 3)
    non_white = (region < 235).any(axis=1).mean()
    colours = len(np.unique(region[::7] // 32, axis=0))
    return non_white, colours


@pytest.mark.slow  # a subprocess or a browser: > 3 s, full suite only
@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)")
def test_plots_render_in_chromium(tmp_path):
    result = build(DATA / "run_lenet_cpu")
    page = render(result, "html")
    boxes = _boxes(_screenshot(_probe(page), tmp_path, "probe"))
    assert set(boxes) == set(PLOTS), f"plot boxes found: {sorted(boxes)} (is the window tall enough?)"
    for fid, (y0, y1, x0, x1) in boxes.items():
        assert y1 - y0 > 200 and x1 - x0 > 400, (fid, boxes[fid])
    shot = _screenshot(page, tmp_path, "real")
    for fid, box in boxes.items():
        non_white, colours = _ink(shot, box)
        assert non_white > 0.04 and colours >= 8, (fid, non_white, colours)
    # the check can fail: the same layout without the images' pixels leaves the boxes blank
    blank = _screenshot(_probe(page, paint=False), tmp_path, "blank")
    for fid, box in boxes.items():
        non_white, _ = _ink(blank, box)
        assert non_white < 0.01, (fid, non_white)


def test_missing_inputs_give_a_sentence_not_a_broken_figure():
    import pandas as pd

    from perfcheck.analysis.reconcile import reconcile
    from perfcheck.report.html import render_html
    from _reconcile_rows import meas_row, pred_row

    rec = reconcile(pd.DataFrame([pred_row("(root)", 1e-3, 2e-3, flops_fwd=1e9, bytes_fwd=1e6),
                                  pred_row("a", 1e-3, 2e-3), pred_row("gone", 1e-4)]),
                    pd.DataFrame([meas_row("(root)", 3e-3, 4e-3), meas_row("a", 3e-3, 4e-3), meas_row("new", 1e-4)]))
    page = render_html(rec)  # no system, no kernels, no samples
    assert page.count("data:image/png;base64,") == 3  # pred vs meas, top modules, roofline without roofs
    assert "No utilization samples in this run" in page and "No kernel table in this run" in page
    assert "predicted_only" in page and "measured_only" in page and "not_predicted" in page


def test_multi_rank_page_flags_the_straggler():
    result = build(DATA / "run_jsc_2ranks")
    page = render(result, "html")
    assert "<h2>Ranks</h2>" in page and "STRAGGLER" in page and "slowest rank 1" in page

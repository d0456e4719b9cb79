"""The prediction as its own track in trace.json (perfcheck/measure/predicted_track.py).

Layout checked against hand arithmetic; the saved trace checked against the Chrome Trace Event
Format (complete events "X" with numeric ts/dur in microseconds and integer pid/tid, metadata events
"M" naming the process and thread); HTA's TraceAnalysis loads it when HTA is installed (it is not a
test dependency: it pulls jupyterlab).
"""
import json
import shutil

import pandas as pd
import pytest
import torch

from perfcheck import PerfCheck
from perfcheck.measure.predicted_track import CATEGORY, PROCESS_NAME, add_predicted_track, predicted_events


def _pred():
    # root 10 us fwd / 20 us bwd; children a (3 / 6) with a.x (1 / 2), then b (4 / 8)
    return pd.DataFrame({"module": ["(root)", "a", "a.x", "b"], "type": ["M", "A", "X", "B"], "calls": [1, 1, 2, 1],
                         "pred_fwd_s": [10e-6, 3e-6, 1e-6, 4e-6], "pred_bwd_s": [20e-6, 6e-6, 2e-6, 8e-6],
                         "bound_fwd": ["compute"] * 4, "bound_bwd": ["memory"] * 4})


def test_layout_nests_children_in_call_order_and_reverses_them_in_backward():
    ev = {e["name"]: e for e in predicted_events(_pred(), 100.0, 200.0, pid=7) if e["ph"] == "X"}
    start = {n: ev[n]["ts"] for n in ev}
    dur = {n: round(ev[n]["dur"], 9) for n in ev}
    # forward: root at 100; a at 100 (a.x inside it at 100); b after a: 100 + 3 = 103
    assert start == pytest.approx({"perfcheck/fwd/(root)": 100, "perfcheck/fwd/a": 100, "perfcheck/fwd/a.x": 100,
                                   "perfcheck/fwd/b": 103, "perfcheck/bwd/(root)": 200, "perfcheck/bwd/b": 200,
                                   "perfcheck/bwd/a": 208, "perfcheck/bwd/a.x": 208})  # b first: 200 + 8
    assert dur == pytest.approx({"perfcheck/fwd/(root)": 10, "perfcheck/fwd/a": 3, "perfcheck/fwd/a.x": 1,
                                 "perfcheck/fwd/b": 4, "perfcheck/bwd/(root)": 20, "perfcheck/bwd/b": 8,
                                 "perfcheck/bwd/a": 6, "perfcheck/bwd/a.x": 2})
    assert ev["perfcheck/fwd/a.x"]["args"]["calls"] == 2
    # no measured backward anchor: the backward follows the predicted forward (100 + 10)
    bwd = [e for e in predicted_events(_pred(), 100.0, None, pid=7) if e["name"] == "perfcheck/bwd/(root)"]
    assert bwd[0]["ts"] == pytest.approx(110)


@pytest.fixture(scope="module")
def saved_trace(tmp_path_factory):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = tmp_path_factory.mktemp("track") / "run"
    with PerfCheck(model, warmup=1, steps=2, out_dir=out, system="cpu", sample_interval=None) as pc:
        for _ in range(5):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            pc.step()
    return pc, out / "rank0" / "trace.json"


def _check_chrome_format(events):
    for e in events:
        assert e["ph"] in ("X", "M", "i", "I", "B", "E", "f", "s", "t", "C", "b", "e", "n", "P", "R", "O", "N", "D"), e
        if e["ph"] == "X":
            assert isinstance(e["name"], str) and isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
            assert e["dur"] >= 0 and isinstance(e["pid"], (int, str)) and isinstance(e["tid"], (int, str))
            if e.get("cat") == CATEGORY:  # ours: integer ids, as HTA's parser wants
                assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "M" and e["name"] in ("process_name", "thread_name"):
            assert isinstance(e["args"]["name"], str)


def test_saved_trace_has_the_predicted_track_beside_the_measured_ranges(saved_trace):
    pc, path = saved_trace
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    _check_chrome_format(events)
    ours = [e for e in events if e.get("cat") == CATEGORY]
    pid = ours[0]["pid"]
    assert all(e["pid"] == pid for e in ours) and pid not in {e.get("pid") for e in events if e.get("cat") != CATEGORY
                                                              and e.get("ph") == "X"}
    names = [e["args"]["name"] for e in events if e["ph"] == "M" and e["pid"] == pid and e["name"] == "process_name"]
    assert names == [PROCESS_NAME]
    measured = {e["name"] for e in events if e.get("ph") == "X" and e.get("cat") != CATEGORY}
    fwd = {e["name"] for e in ours if e["name"].startswith("perfcheck/fwd/")}
    assert fwd == {f"perfcheck/fwd/{m}" for m in ("(root)", "0", "1", "2")}
    assert fwd <= measured  # the same names as the measured forward ranges
    assert {n.replace("/fwd/", "/bwd/") for n in fwd} == {e["name"] for e in ours if "/bwd/" in e["name"]}
    root = next(e for e in ours if e["name"] == "perfcheck/fwd/(root)")
    first = min(e["ts"] for e in events if e.get("name") == "perfcheck/fwd/(root)" and e.get("cat") != CATEGORY)
    assert root["ts"] == first  # anchored at the measured root forward
    pred = pc.predicted().set_index("module")
    assert root["dur"] == pytest.approx(pred.loc["(root)", "pred_fwd_s"] * 1e6)


def test_adding_twice_replaces_the_track(saved_trace, tmp_path):
    pc, path = saved_trace
    copy = tmp_path / "trace.json"
    shutil.copy(path, copy)
    before = json.loads(copy.read_text())["traceEvents"]
    assert add_predicted_track(copy, pc.predicted())
    after = json.loads(copy.read_text())["traceEvents"]
    assert len(after) == len(before)


def test_hta_trace_analysis_loads_it(saved_trace, tmp_path):
    pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis

    _, path = saved_trace
    shutil.copy(path, tmp_path / "rank0.json")
    analysis = TraceAnalysis(trace_dir=str(tmp_path))
    symbols = analysis.t.symbol_table.get_sym_table()
    assert "perfcheck/bwd/(root)" in symbols and "perfcheck/fwd/(root)" in symbols
    frame = analysis.t.get_trace(0)
    sym = analysis.t.symbol_table.get_sym_id_map()["perfcheck/bwd/(root)"]
    assert (frame["name"] == sym).sum() == 1  # only the predicted track has a backward range of that name

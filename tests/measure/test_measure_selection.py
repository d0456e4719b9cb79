"""PerfCheck(depth=/modules=): only part of the tree is timed; the rest is inside its nearest timed
ancestor's time (planted sleeps), meta.json records the choice, the reconciler and the text report
say "not timed" instead of "not measured", and bad selections are one-line UserErrors."""
from __future__ import annotations

import time

import pytest
import torch
import torch.nn as nn

from perfcheck import PerfCheck, UserError
from perfcheck.examples.models import GPT
from perfcheck.schema import ROOT, module_depth

from test_measure_timer import SLACK, STRETCH

# planted sleeps stretched and SLACK sized as in test_measure_timer (a busy 2-core machine): a misattribution
# here is off by >= 15 ms nominal, STRETCH x 15 ms of wall clock, well over SLACK


class Sleep(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.s = s
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        time.sleep(self.s * STRETCH)
        return self.lin(x)


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Sleep(0.015)
        self.tail = nn.Linear(4, 4)

    def forward(self, x):
        return self.tail(self.inner(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.outer = Outer()
        self.other = Sleep(0.020)

    def forward(self, x):
        return self.other(self.outer(x))


def run(model, make_input, n=3, **kw):
    pc = PerfCheck(model, warmup=1, steps=n, profile=False, sample_interval=None, **kw)
    with pc:
        while not pc.done:
            model(make_input()).sum().backward()
            pc.step()
    return pc


@pytest.mark.timing  # upper bound on planted wall-clock time: out of the fast lane
def test_untimed_subtree_is_inside_its_parent_time():
    pc = run(Model(), lambda: torch.randn(2, 4), modules=["outer"])
    m = pc.measured().set_index("module")
    assert set(m.index) == {ROOT, "outer"}
    # outer's forward holds inner's planted 15 ms; the root's holds both sleeps (15 + 20 ms)
    assert STRETCH * 0.015 <= m.loc["outer", "fwd_s_median"] <= STRETCH * 0.015 + SLACK
    assert m.loc[ROOT, "fwd_s_median"] >= STRETCH * 0.035
    sel = pc.meta()["selection"]
    assert sel["timed"] == [ROOT, "outer"] and sel["modules"] == ["outer"] and sel["depth"] is None
    assert sel["module_count"] == 7 and sel["timed_count"] == 2


def test_depth_zero_times_the_root_alone():
    model = Model()
    pc = PerfCheck(model, warmup=0, steps=None, profile=False, sample_interval=None, depth=0).start()
    try:
        assert pc._timer.modules == [(ROOT, model)]
        model(torch.randn(2, 4)).sum().backward()
        pc.step()
    finally:
        pc.stop()
    m = pc.measured().set_index("module")
    assert list(m.index) == [ROOT] and m.loc[ROOT, "fwd_s_median"] >= 0.035


def test_depth_and_module_entries_of_every_kind():
    model = GPT(n_layer=2, n_head=2, d_model=32, vocab=50, seq_len=16)

    def timed(**kw):
        pc = PerfCheck(model, profile=False, sample_interval=None, **kw)
        return set(p for p, _ in pc._timed)

    all_paths = {p or ROOT for p, _ in model.named_modules()}
    assert timed(depth=2) == {p for p in all_paths if module_depth(p) <= 2}
    assert timed(modules=[nn.Linear]) == {ROOT} | {p for p, m in model.named_modules() if isinstance(m, nn.Linear)}
    assert timed(modules=["Block"]) == {ROOT, "h.0", "h.1"}  # class name
    assert timed(modules=["h.1.attn"]) == {ROOT, "h.1.attn"}  # path
    assert timed(modules=["h.*.mlp"]) == {ROOT, "h.0.mlp", "h.1.mlp"}  # glob
    assert timed(modules="lm_head") == {ROOT, "lm_head"}  # one entry


@pytest.mark.parametrize("kwargs, match", [
    (dict(depth=1, modules=["h"]), "not both"),
    (dict(depth=-1), "depth"),
    (dict(depth=True), "depth"),
    (dict(modules=["nonexistent"]), "'nonexistent' matches no module"),
    (dict(modules=[]), "modules is empty"),
    (dict(modules=[3]), "modules entries"),
])
def test_bad_selection_is_a_one_line_user_error(kwargs, match):
    with pytest.raises(UserError, match=match) as info:
        PerfCheck(GPT(n_layer=1, n_head=2, d_model=16, vocab=32, seq_len=8), **kwargs)
    assert "\n" not in str(info.value)


def test_reports_say_not_timed_instead_of_not_measured():
    torch.manual_seed(0)
    model = GPT(n_layer=2, n_head=2, d_model=32, vocab=50, seq_len=16)
    pc = run(model, lambda: torch.randint(0, 50, (2, 16)), n=2, depth=1)
    rec = pc.reconciled()
    one_sided = rec[rec["side"] == "predicted_only"]
    assert len(one_sided) > 0 and (one_sided["reason"] == "not_instrumented").all()
    assert set(one_sided["module"]) == {p for p in rec["module"] if module_depth(p) > 1}
    text = pc.report()
    assert "[not timed (depth=/modules=)]" in text and "outside PerfCheck's depth=/modules= selection" in text
    assert "[predicted only]" not in text


def test_full_run_has_no_selection_and_not_instrumented_never_appears():
    torch.manual_seed(0)
    model = GPT(n_layer=1, n_head=2, d_model=16, vocab=32, seq_len=8)
    pc = run(model, lambda: torch.randint(0, 32, (2, 8)), n=1)
    assert pc.meta()["selection"] == "all modules"
    assert "not_instrumented" not in set(pc.reconciled()["reason"])

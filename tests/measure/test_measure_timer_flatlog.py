"""The module timer's lean path (issue #15): per call it appends two tuples to a flat log and the
records are built when the outermost call returns. Checked here against hand-built expectations
(the nesting, phase and order of the calls of a known forward), planted sleeps (forward/backward
per module when the lean path and the general path nest inside each other), an exception caught
inside the forward, hooks added after attach (the direct ``_compiled_call_impl`` route must still
run them), and dynamo tracing through a timed module (no timing, no graph break)."""
from __future__ import annotations

import time

import pytest
import torch
import torch.nn as nn

from perfcheck import PerfCheck
from perfcheck.measure import timer as mt
from perfcheck.measure.timer.forward import TimedForward
from perfcheck.measure.clocks import CpuClock
from perfcheck.schema import ROOT

from test_measure_timer import STRETCH, Sleepy, TwoSleepy, assert_close, route, row, run_steps  # noqa: F401 (route: fixture)

FWD, EVAL = mt.FWD, mt.EVAL


class Double(nn.Module):
    def forward(self, x):
        return x * 2


class Probe(Double):
    """Double that notes (flat log length, records built) each time it runs, while ``seen`` is set."""

    seen = timer = None

    def forward(self, x):
        if self.seen is not None:
            self.seen.append((len(self.timer._flog), len(self.timer._calls)))
        return x * 2


class Mid(nn.Module):
    def __init__(self):
        super().__init__()
        self.p, self.q = Probe(), Double()

    def forward(self, x):
        return self.q(self.p(x)) + 1


class Top(nn.Module):
    """root -> m -> (m.p, m.q); then r twice, once inside a no_grad block."""

    def __init__(self):
        super().__init__()
        self.m, self.r = Mid(), Double()

    def forward(self, x):
        y = self.m(x)
        with torch.no_grad():
            self.r(y)
        return self.r(y)


def _timer(model):
    mods = [(ROOT if n == "" else n, m) for n, m in model.named_modules()]
    timer = mt.ModuleTimer(mods, CpuClock(), ranges=False)
    timer.attach()
    timer.begin_step()  # the first root call goes the general path (it records the input spec)
    model(torch.randn(2, 3, requires_grad=True)).sum().backward()
    timer.end_step().resolve()
    timer.begin_step()
    return timer


def _check_nesting(calls, parent_of):
    """Every call's interval lies inside the interval of its parent's call that encloses it."""
    for i, c in enumerate(calls):
        parent = parent_of.get(c.path)
        if parent is None:
            continue
        enclosing = [p for p in calls[:i] if p.path == parent and p.t0 <= c.t0 and c.t1 <= p.t1]
        assert enclosing, f"{c.path} is not inside a call of {parent}"


def test_flat_log_rebuilds_the_calls_in_order_with_nesting_and_phase(route):
    model = Top()
    timer = _timer(model)
    try:
        seen = model.m.p.seen = []  # inside the forward: the calls so far sit in the flat log, not as records
        model.m.p.timer = timer
        out = model(torch.randn(2, 3, requires_grad=True))
        model.m.p.seen = None
        # hand-built: the order the calls started, each with its phase (a call inside a no_grad block
        # nested in a training forward is still forward: the enclosing call's phase)
        assert [(c.path, c.phase) for c in timer._calls] == [
            (ROOT, FWD), ("m", FWD), ("m.p", FWD), ("m.q", FWD), ("r", FWD), ("r", FWD)]
        assert all(c.t0 is not None and c.t1 is not None and c.t0 <= c.t1 for c in timer._calls)
        _check_nesting(timer._calls, {"m": ROOT, "m.p": "m", "m.q": "m", "r": ROOT})
        # m.p and m.q ran one after the other, inside m; the two r calls after m returned
        calls = {(c.path, i): c for i, c in enumerate(timer._calls)}
        assert calls[("m.p", 2)].t1 <= calls[("m.q", 3)].t0 and calls[("m", 1)].t1 <= calls[("r", 4)].t0
        assert seen[0] == (3, 0)  # m.p's probe: root, m, m.p logged; no record built yet
        assert timer._flog == [] and not timer._stack  # the root returned: all built, nothing open
        out.sum().backward()
        res = timer.end_step().resolve()
        # backward: every grad-enabled call got an interval, each inside its parent's
        mods = res["modules"]
        assert set(mods) == {ROOT, "m", "m.p", "m.q", "r"}
        assert mods["r"][0] == 2 and mods[ROOT][0] == 1
        for child, parent in (("m.p", "m"), ("m.q", "m"), ("m", ROOT), ("r", ROOT)):
            assert 0 < mods[child][2] <= mods[parent][2], (child, mods[child][2], parent, mods[parent][2])
        timer.begin_step()
        with torch.no_grad():  # an outermost call with grad disabled: every call is eval, the root's is top
            model(torch.randn(2, 3))
        assert {c.phase for c in timer._calls} == {EVAL} and [c.top for c in timer._calls] == [True] + [False] * 5
    finally:
        timer.detach()


class KW(nn.Module):
    """Called with a keyword argument: the general path, with a lean-path child inside it."""

    def __init__(self):
        super().__init__()
        self.inner = Sleepy(0.010, 0.005)

    def forward(self, x, scale=1.0):
        return self.inner(x) * scale


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.kw, self.b = Sleepy(0.005, 0.020), KW(), Sleepy(0.015, 0.010)

    def forward(self, x):
        return self.b(self.kw(self.a(x), scale=2.0))


@pytest.mark.timing  # upper bound on planted wall-clock time: out of the fast lane
def test_lean_and_general_path_calls_nested_in_each_other_get_their_planted_times(route):
    pc = run_steps(Mixed(), lambda: (torch.randn(2, 4),))
    for path, fwd, bwd in (("a", 0.005, 0.020), ("kw.inner", 0.010, 0.005), ("kw", 0.010, 0.005), ("b", 0.015, 0.010)):
        assert_close(row(pc, path)["fwd_s_median"], fwd, f"{path} forward")
        assert_close(row(pc, path)["bwd_s_median"], bwd, f"{path} backward")
    assert_close(row(pc, ROOT)["fwd_s_median"], 0.030, "root forward")


class Raiser(nn.Module):
    def forward(self, x):
        raise ValueError("planted")


class Catcher(nn.Module):
    """A child raises inside the forward and the parent catches it and goes on."""

    def __init__(self):
        super().__init__()
        self.r, self.s = Raiser(), Sleepy(0.010, 0.010)

    def forward(self, x):
        try:
            self.r(x)
        except ValueError:
            pass
        return self.s(x)


@pytest.mark.timing  # an upper bound on the raising child's wall-clock time: out of the fast lane
def test_a_child_that_raises_inside_a_forward_that_goes_on(route):
    model = Catcher()
    mods = [(ROOT if n == "" else n, m) for n, m in model.named_modules()]
    timer = mt.ModuleTimer(mods, CpuClock(), ranges=False)
    timer.attach()
    try:
        for _ in range(2):  # the second step takes the lean path (the root's inputs are recorded)
            timer.begin_step()
            model(torch.randn(2, 4)).sum().backward()
            pending = timer.end_step()
            calls = pending.calls
            res = pending.resolve()
        assert [c.path for c in calls] == [ROOT, "r", "s", "s.lin"]
        assert all(c.t1 is not None for c in calls) and not timer._stack
        assert pending.failed  # a forward call raised: the step is marked incomplete
        assert res["modules"]["s"][1] >= 0.010 and res["modules"]["s"][2] >= 0.010  # s still timed both ways
        # r's interval closes at its exception: well under s's planted sleep that follows it (10 ms nominal,
        # 50 ms slept), so a few ms of preemption on a busy machine still pass and an interval left open into s does not
        assert res["modules"]["r"][1] < 0.005
    finally:
        timer.detach()


@pytest.mark.timing  # upper bound on planted wall-clock time: out of the fast lane
def test_hooks_added_after_attach_run_and_are_inside_the_interval():
    model, calls = TwoSleepy(), []

    def pre(mod, args):
        calls.append(1)
        time.sleep(0.012 * STRETCH)

    pc = PerfCheck(model, warmup=1, steps=2, profile=False, sample_interval=None)
    with pc:
        assert "_compiled_call_impl" in vars(model.b)  # the direct route
        handle = model.b.register_forward_pre_hook(pre)  # after attach
        try:
            while not pc.done:
                model(torch.randn(2, 4)).sum().backward()
                pc.step()
        finally:
            handle.remove()
    assert len(calls) == 3  # the hook ran on every call
    assert_close(row(pc, "b")["fwd_s_median"], 0.020 + 0.012, "b forward with the later hook's 12 ms inside")
    assert_close(row(pc, "a")["fwd_s_median"], 0.010, "a forward")


def test_dynamo_traces_through_a_timed_module_without_timing_it_or_breaking_the_graph(route):
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    x = torch.randn(2, 4)
    pc = PerfCheck(model, warmup=0, steps=None, profile=False, sample_interval=None).start()
    try:
        model(x).sum().backward()  # eager, timed: the lean path is on after this
        pc.step()
        timer = pc._timer
        explained = torch._dynamo.explain(lambda t: model(t))(x)
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        compiled = torch.compile(lambda t: model(t), backend="eager", fullgraph=True)
        with torch.no_grad():
            expected = model(x)
        timer.begin_step()
        out = compiled(x)
        assert timer._calls == [] and timer._flog == []  # nothing timed inside the compiled region
        assert torch.equal(out.detach(), expected)
    finally:
        pc.stop()
        torch._dynamo.reset()


class OwnCall(Sleepy):
    """A class with its own ``__call__``: torch's Module.__call__ (which looks at
    ``_compiled_call_impl``) never runs for it, so it is timed through its ``forward``."""

    def __call__(self, *args, **kwargs):
        return super().__call__(*args, **kwargs)


class WithOwnCall(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = OwnCall(0.010, 0.030), Sleepy(0.020, 0.010)

    def forward(self, x):
        return self.b(self.a(x))


@pytest.mark.timing  # upper bound on planted wall-clock time: out of the fast lane
def test_a_class_with_its_own_call_is_timed_through_its_forward():
    model = WithOwnCall()
    pc = PerfCheck(model, warmup=1, steps=2, profile=False, sample_interval=None)
    with pc:
        assert isinstance(vars(model.a).get("forward"), TimedForward)
        assert "_compiled_call_impl" not in vars(model.a) and "_compiled_call_impl" in vars(model.b)
        while not pc.done:
            model(torch.randn(2, 4)).sum().backward()
            pc.step()
    for path, fwd, bwd in (("a", 0.010, 0.030), ("b", 0.020, 0.010)):
        assert_close(row(pc, path)["fwd_s_median"], fwd, f"{path} forward")
        assert_close(row(pc, path)["bwd_s_median"], bwd, f"{path} backward")
    assert "forward" not in vars(model.a) and "_compiled_call_impl" not in vars(model.b)

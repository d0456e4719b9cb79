"""Adversarial review of the module timer's ``_compiled_call_impl`` route (issue #15):
cases a demanding user hits that the other timer tests do not cover. Each test plants sleeps and
checks the rows against them, the training numerics against an uninstrumented twin, and the model's
``__dict__`` after ``stop()``."""
from __future__ import annotations

import time
import warnings

import pytest
import torch
import torch.nn as nn

from perfcheck import PerfCheck
from perfcheck.schema import ROOT

from test_measure_timer import STRETCH, assert_close, row

MS = 1e-3


class SleepLin(nn.Module):
    """A Linear behind a plain ``time.sleep`` (dynamo graph-breaks on the sleep and runs it)."""

    def __init__(self, s):
        super().__init__()
        self.s, self.lin = s, nn.Linear(4, 4)

    def forward(self, x):
        time.sleep(self.s * STRETCH)  # nominal seconds, stretched as test_measure_timer's
        return self.lin(x)


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = SleepLin(0.010), SleepLin(0.020)

    def forward(self, x):
        return self.b(self.a(x))


def _train(model, pc=None, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(1)
    for _ in range(steps):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        if pc is not None:
            pc.step()


@pytest.mark.timing  # upper bound on planted wall-clock time: out of the fast lane
@pytest.mark.parametrize("where", ["root", "child"])
def test_module_compile_before_attach_is_timed_as_a_whole_and_left_as_it_was(where):
    """``nn.Module.compile()`` sets ``_compiled_call_impl`` to a compiled ``_call_impl``: forward hooks
    and a timed ``forward`` both run inside the compiled region, where timing is off. Before the fix
    such a module (and, for the root, the whole step) got no timing at all and no warning saying why."""
    torch._dynamo.reset()
    try:
        torch.manual_seed(0)
        twin, model = Pair(), Pair()
        model.load_state_dict(twin.state_dict())
        target = model if where == "root" else model.a
        target.compile(backend="eager")  # no code generation: dynamo only
        compiled_fn = vars(target)["_compiled_call_impl"]
        _train(twin)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pc = PerfCheck(model, warmup=0, steps=None, profile=False, sample_interval=None).start()
            try:
                _train(model, pc)
            finally:
                pc.stop()
        path = ROOT if where == "root" else "a"
        assert any("timed as a whole" in str(w.message) and f"'{path}'" in str(w.message) for w in caught)
        # numerics bit-identical to the uninstrumented twin
        for (k, v), (_, w) in zip(twin.state_dict().items(), model.state_dict().items()):
            assert torch.equal(v, w), k
        measured = pc.measured().set_index("module")
        if where == "root":
            assert list(measured.index) == [ROOT]  # submodules run inside the compiled region
            assert_close(row(pc, ROOT)["fwd_s_median"], 0.030, "compiled root forward (10 + 20 ms planted)")
        else:
            assert "a.lin" not in measured.index
            assert_close(row(pc, "a")["fwd_s_median"], 0.010, "compiled child forward")
            assert_close(row(pc, "b")["fwd_s_median"], 0.020, "eager sibling forward")
            assert_close(row(pc, ROOT)["fwd_s_median"], 0.030, "root forward")
        # left exactly as it was: the user's compiled call back in place, no other instance attribute
        assert vars(target)["_compiled_call_impl"] is compiled_fn
        for n, m in model.named_modules():
            assert "forward" not in vars(m), n
            if m is not target:
                assert "_compiled_call_impl" not in vars(m), n
    finally:
        torch._dynamo.reset()


def test_module_compile_while_attached_warns_that_its_timing_stopped():
    """``model.a.compile()`` between two steps replaces the timed ``_compiled_call_impl``: from then on
    ``a`` runs untimed (its row shows fewer calls). Before the fix nothing said so; now ``stop()``
    warns naming the module, and leaves the user's compiled call in place."""
    torch._dynamo.reset()
    try:
        model = Pair()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pc = PerfCheck(model, warmup=0, steps=None, profile=False, sample_interval=None).start()
            try:
                model(torch.randn(2, 4)).sum().backward()
                pc.step()
                model.a.compile(backend="eager")
                compiled_fn = vars(model.a)["_compiled_call_impl"]
                model(torch.randn(2, 4)).sum().backward()
                pc.step()
            finally:
                pc.stop()
        msgs = [str(w.message) for w in caught if "compiled" in str(w.message) and "while" in str(w.message)]
        assert len(msgs) == 1 and "'a'" in msgs[0] and "'b'" not in msgs[0], msgs
        assert vars(model.a)["_compiled_call_impl"] is compiled_fn  # the user's, untouched
        assert all("_compiled_call_impl" not in vars(m) for n, m in model.named_modules() if n != "a")
    finally:
        torch._dynamo.reset()


def test_perfchecks_own_timed_call_is_not_taken_for_a_users_compile():
    """PerfCheck's timer sits in the slot ``Module.compile()`` uses (``_compiled_call_impl``): a second
    PerfCheck made while the first is attached must still see an uncompiled model (before: its view took
    the root for compiled and timed only the root)."""
    import warnings

    from perfcheck import PerfCheck
    from perfcheck.measure.context import model_view

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    x = torch.randn(3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = PerfCheck(model, warmup=0, profile=False, sample_interval=None)
        first.start()
        assert model_view(model).compiled == []
        second = PerfCheck(model, warmup=0, profile=False, sample_interval=None)  # made while the first is attached
        first.stop()
        second.start()
        for _ in range(2):
            model(x).sum().backward()
            second.step()
        second.stop()
    rows = second.measured().set_index("module")
    assert {"0", "1", "2"} <= set(rows.index)  # the submodules are timed, not only the root
    assert (rows.loc[["0", "1", "2"], "calls"] == 1).all()

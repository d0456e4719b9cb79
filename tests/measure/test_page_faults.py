"""Page faults per step and phase (perfcheck.measure.page_faults, fault_cost, fault_record).

References: hand counts through a fake counter (the phase arithmetic), the size of a planted buffer over the
page size (a 48 MiB block is above glibc's largest dynamic mmap threshold, 32 MiB on 64-bit, so each allocation
is a fresh mmap whose every page faults on first touch), and a control without it. No timing assertion."""
import json
import subprocess
import sys
import textwrap
import types

import numpy as np
import pandas as pd
import pytest
import torch

import perfcheck.rundir as runs
from perfcheck import PerfCheck
from perfcheck.measure.fault_cost import measure_fault_cost
from perfcheck.measure.page_faults import (BWD, FAULT_COLUMNS, FWD, TAIL, PhaseFaults, fault_reader, page_bytes,
                                           psutil_reader)

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mmap threshold and getrusage")

BIG = 48 << 20  # bytes: above glibc's largest dynamic mmap threshold (32 MiB on 64-bit)


class Counter:
    """A fault counter the test sets by hand: read() -> (minor, major)."""

    def __init__(self):
        self.minor = self.major = 0

    def __call__(self):
        return self.minor, self.major


def test_phase_arithmetic_by_hand():
    c = Counter()
    p = PhaseFaults(c)
    p.begin_step()
    c.minor = 10          # data loading: other
    p.enter(FWD)
    c.minor, c.major = 30, 1   # forward: 20 minor, 1 major
    p.enter(TAIL)
    c.minor = 35          # loss: a tail followed by a backward is "other"
    p.enter(BWD)
    c.minor, c.major = 60, 3   # backward: 25 minor, 2 major
    p.enter(TAIL)
    c.minor = 75          # optimizer: the tail that lasts to the step's end
    out = p.end_step()
    assert out == {"minor_faults_fwd": 20, "minor_faults_bwd": 25, "minor_faults_optim": 15, "minor_faults_step": 75,
                   "major_faults_fwd": 1, "major_faults_bwd": 2, "major_faults_optim": 0, "major_faults_step": 3}
    assert set(out) == set(FAULT_COLUMNS)


def test_two_micro_batches_sum_their_phases_and_only_the_last_tail_is_optimizer():
    c = Counter()
    p = PhaseFaults(c)
    p.begin_step()
    for after_bwd in (2, 100):  # between the micro-batches: 2 faults (other); after the last one: 100
        p.enter(FWD)
        c.minor += 5
        p.enter(TAIL)
        c.minor += 1  # loss
        p.enter(BWD)
        c.minor += 7
        p.enter(TAIL)
        c.minor += after_bwd
    out = p.end_step()
    assert (out["minor_faults_fwd"], out["minor_faults_bwd"], out["minor_faults_optim"]) == (10, 14, 100)
    assert out["minor_faults_step"] == 5 + 1 + 7 + 2 + 5 + 1 + 7 + 100


def test_psutil_fallback_reads_windows_and_macos_fields():
    win = types.SimpleNamespace(memory_info=lambda: types.SimpleNamespace(num_page_faults=42))
    assert psutil_reader(win)() == (42, 0)
    mac = types.SimpleNamespace(memory_info=lambda: types.SimpleNamespace(pfaults=50, pageins=8))
    assert psutil_reader(mac)() == (42, 8)
    linux_like = types.SimpleNamespace(memory_info=lambda: types.SimpleNamespace(rss=1))
    assert psutil_reader(linux_like) is None


@linux
def test_fault_cost_benchmark_counts_one_fault_per_fresh_page():
    cost = measure_fault_cost(size=1 << 20, repeats=2)
    assert cost is not None
    assert cost["faults_per_region"] == pytest.approx((1 << 20) / page_bytes(), rel=0.02)
    assert cost["seconds_per_fault"] >= 0 and cost["repeats"] == 2


#: The planted runs, in a fresh process: whether a freed block goes back to the OS depends on the process's
#: malloc state (in a long test process a 48 MiB torch.empty came back without faults: an mmap refused
#: there falls back to the heap), and a fresh interpreter is the state the reference assumes.
SCRIPT = textwrap.dedent('''
    import json, sys, torch
    from perfcheck import PerfCheck
    BIG = 48 << 20

    class Fresh(torch.autograd.Function):  # identity whose backward first-touches a fresh BIG block
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            torch.empty(BIG, dtype=torch.uint8).fill_(1)
            return g

    class Planted(torch.nn.Module):
        def __init__(self, where):
            super().__init__()
            self.lin, self.where = torch.nn.Linear(16, 16), where

        def forward(self, x):
            if self.where == "fwd":
                torch.empty(BIG, dtype=torch.uint8).fill_(1)  # freed on return: munmap'd, fresh again next step
            if self.where == "bwd":
                x = Fresh.apply(x)
            return self.lin(x)

    out = {}
    for where in ("fwd", "bwd", "optim", None):
        model = Planted(where)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run_dir = sys.argv[1] if where == "fwd" else None
        pc = PerfCheck(model, warmup=1, steps=3, profile=False, sample_interval=None, out_dir=run_dir)
        with pc:
            for _ in range(4):
                model(torch.randn(8, 16, requires_grad=where == "bwd")).sum().backward()
                opt.step()
                if where == "optim":
                    torch.empty(BIG, dtype=torch.uint8).fill_(1)
                opt.zero_grad()
                pc.step()
        st = pc.steps()
        st = st[st["role"] == "measured"]
        out[str(where)] = {"faults": {p: float(st[f"minor_faults_{p}"].median()) for p in ("fwd", "bwd", "optim", "step")},
                           "cost": pc.meta()["page_faults"]["cost"]}
    print(json.dumps(out))
''')


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("faults") / "run"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(run_dir)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), run_dir


@pytest.mark.slow  # a subprocess training run (~6 s): full suite only
@linux
@pytest.mark.parametrize("where", ["fwd", "bwd", "optim"])
def test_planted_fresh_block_faults_in_its_phase(planted, where):
    pages = BIG / page_bytes()
    faults = planted[0][where]["faults"]
    assert faults[where] >= 0.99 * pages, faults
    for other in {"fwd", "bwd", "optim"} - {where}:
        assert faults[other] < 0.05 * pages, faults
    assert faults["step"] >= faults[where]
    cost = planted[0][where]["cost"]  # measured once, at the first measured step that faulted
    assert cost["faults_per_region"] == pytest.approx(cost["region_bytes"] / page_bytes(), rel=0.02)


@pytest.mark.slow  # a subprocess training run (~6 s): full suite only
@linux
def test_control_without_a_fresh_block_has_few_faults_and_no_cost_benchmark(planted):
    assert planted[0]["None"]["faults"]["step"] < 64
    assert planted[0]["None"]["cost"] is None


@pytest.mark.slow  # a subprocess training run (~6 s): full suite only
@linux
def test_fault_columns_are_saved_and_read_back_and_old_files_read_as_nan(planted):
    run_dir = planted[1]
    meta = json.loads((run_dir / "rank0" / "meta.json").read_text())
    assert meta["page_faults"]["page_bytes"] == page_bytes() and meta["page_faults"]["cost"]["seconds_per_fault"] >= 0
    run = runs.load_run(run_dir)
    assert (run.steps.loc[run.steps["role"] == "measured", "minor_faults_fwd"] >= 0.99 * BIG / page_bytes()).all()
    # a steps.csv from before the fault columns reads with them as NaN
    path = run_dir / "rank0" / "steps.csv"
    pd.read_csv(path).drop(columns=list(FAULT_COLUMNS)).to_csv(path, index=False)
    old = runs.load_run(run_dir).steps
    assert old["minor_faults_step"].isna().all()


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.lin(x)


def _run_small(**kw):
    model = Small()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pc = PerfCheck(model, warmup=1, profile=False, sample_interval=None, **{"steps": 3, **kw})
    with pc:
        for _ in range(8):
            model(torch.randn(8, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
            pc.step()
    return pc, pc.steps()


def test_no_counter_leaves_nan_and_says_why(monkeypatch):
    import perfcheck.measure.fault_record as fr

    monkeypatch.setattr(fr, "fault_reader", lambda: (None, "no page-fault counter on this platform"))
    pc, st = _run_small()
    assert st["minor_faults_step"].isna().all() and st["major_faults_fwd"].isna().all()
    info = pc.meta()["page_faults"]
    assert info["counter"] is None and "no page-fault counter" in info["why_none"]


def test_bare_steps_have_a_step_count_and_no_phases():
    if fault_reader()[0] is None:
        pytest.skip("no fault counter here")
    pc, st = _run_small(steps=2, overhead_pairs=2)
    bare = st[st["role"] == "bare"]
    assert len(bare) and bare["minor_faults_fwd"].isna().all() and bare["minor_faults_step"].notna().all()
    assert np.isfinite(st.loc[st["role"] == "measured", "minor_faults_bwd"]).all()

"""The near rule of the per-op cold cost (perfcheck.predict.family_reuse): which ops find their family's code warm
(a reuse distance over op families, by hand), its calibration case (the op_fixed ops less the convolution, one
after another), its fit (that round-robin less the same ops' tight loops, by hand) and what the estimator adds
(op_cold_near_s to a near op, op_cold_s to a far one, by hand on a cell loop); likewise the far rule (a family last
run more than the L3 of data ago: op_cold_far_s)."""

import pandas as pd
import numpy as np
import pytest
import torch

import perfcheck
from perfcheck.calibrate import case_names, fit, fit_cold, op_cases
from perfcheck.predict.family_reuse import NEAR_DISTANCE, far_reuse, is_light, light_reuse, near_reuse
from _host_only_specs import cpu_spec_with_host as _spec  # the cpu spec, every host constant 0 but the ones given

US = 1e-6


def _row(kind, label, seconds):
    return {"kind": kind, "label": label, "dtype": "fp32", "m": 0, "k": 0, "n": 0, "flops": 0.0, "bytes": 0.0,
            "world_size": 1, "seconds": seconds}


# ---------------------------------------------------------------------------- the walk, by hand
def test_near_by_hand():
    names = ["addmm", "sigmoid", "t", "tanh", "addmm", "sigmoid", "tanh", "addmm"]
    view = [False, False, True, False, False, False, False, False]
    fwd, bwd = near_reuse(names, view, [False] * 8)
    # forward: first calls far; addmm at 4 after {tanh, sigmoid} (2 others) near; sigmoid 5, tanh 6 and addmm 7 near
    assert list(fwd) == [False, False, False, False, True, True, True, True]
    # backward walks 7, 6, ..., 0: addmm 7, tanh 6, sigmoid 5 first (far); addmm 4 after {sigmoid, tanh} near, ...
    assert list(bwd) == [True, True, False, True, True, False, False, False]
    assert [list(a) for a in near_reuse([], [], [])] == [[], []]


def test_a_heavy_op_makes_every_op_after_it_far_and_is_never_near():
    names = ["relu", "convolution", "relu", "convolution", "relu"]
    heavy = [False, True, False, True, False]
    fwd, _ = near_reuse(names, [False] * 5, heavy)
    assert list(fwd) == [False] * 5


def test_near_up_to_the_distance_then_far():
    cycle = [f"f{i}" for i in range(NEAR_DISTANCE + 1)]  # each family's second call: NEAR_DISTANCE others ago
    fwd, _ = near_reuse(cycle * 2, [False] * len(cycle) * 2, [False] * len(cycle) * 2)
    assert not fwd[:len(cycle)].any() and fwd[len(cycle):].all()
    longer = cycle + ["g"]  # one family more: NEAR_DISTANCE + 1 others between two calls
    fwd, _ = near_reuse(longer * 2, [False] * len(longer) * 2, [False] * len(longer) * 2)
    assert not fwd.any()


# ---------------------------------------------------------------------------- calibration case and fit
def test_near_case_is_the_round_robin_without_the_convolution():
    near = next(c for c in op_cases.op_cold_cases("cpu") if c.label.startswith(case_names.NEAR))
    ops = op_cases.tiny_ops(torch.device("cpu"))
    assert near.kind == "opcold" and near.per_call == len(ops) - 1 == NEAR_DISTANCE + 1
    assert near.label == f"round-robin near x{len(ops) - 1}"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        near.fn()
    seen = {e.key for e in prof.key_averages()}
    assert "aten::convolution" not in seen and {"aten::addmm", "aten::gelu", "aten::embedding"} <= seen


def test_near_fit_by_hand_and_the_far_fit_unchanged():
    # tight loops: convolution 50, a 4, b 6 us; the 3 ops in turn 30 us per op, the 2 light ones 7 us per op
    table = pd.DataFrame([_row("opfixed", "convolution", 50 * US), _row("opfixed", "a", 4 * US),
                          _row("opfixed", "b", 6 * US), _row("opcold", "round-robin x3", 30 * US),
                          _row("opcold", "round-robin near x2", 7 * US)])
    near, n, rr, tight = fit_cold.op_cold_near_excess(table)
    assert (n, rr, tight) == (2, pytest.approx(7 * US), pytest.approx(5 * US)) and near == pytest.approx(2 * US)
    assert fit_cold.op_cold_excess(table)[0] == pytest.approx(10 * US)  # 30 - (50 + 4 + 6) / 3
    assert fit_cold.op_cold_near_excess(table.iloc[:4]) is None  # no near row: no near price
    rows = [_row("launch", "op", 4 * US), _row("host", "view", 2 * US), *table.to_dict("records")]
    spec = fit.build_spec("cpu", pd.DataFrame(rows), peaks="measured", stamp="t")
    assert spec.host["op_cold_near_s"] == pytest.approx(2 * US) and spec.host["op_cold_s"] == pytest.approx(10 * US)
    assert case_names.NEAR_LEFT_OUT == ("convolution",)


# ---------------------------------------------------------------------------- what the estimator adds
class CellLoop(torch.nn.Module):
    """Three steps of a tiny Elman cell: per step addmm, tanh (2 families, both near from the second step)."""
    def __init__(self):
        super().__init__()
        self.cell = torch.nn.Linear(4, 4)

    def forward(self, h):
        for _ in range(3):
            h = torch.tanh(self.cell(h))
        return h


def test_estimator_charges_near_ops_the_near_price():
    torch.manual_seed(0)
    x = (torch.randn(2, 4, requires_grad=True),)
    m = CellLoop()
    warm = perfcheck.estimate(m, x, system=_spec())
    # (addmm and tanh are light families: the light price is set to the near one here, its own test is below)
    far = perfcheck.estimate(m, x, system=_spec(op_cold_s=10 * US, op_cold_near_s=10 * US, op_cold_light_s=10 * US))
    near = perfcheck.estimate(m, x, system=_spec(op_cold_s=10 * US, op_cold_near_s=1 * US, op_cold_light_s=1 * US))
    root = lambda df, col: float(df.set_index("module").loc["(root)", col])  # noqa: E731
    # forward, computing ops addmm tanh addmm tanh addmm tanh (t is a view): every one a switch; the first two far
    # (first calls), the other four near: 6 x 10 us far, 2 x 10 + 4 x 1 = 24 us near
    assert root(far, "host_fwd_s") - root(warm, "host_fwd_s") == pytest.approx(60 * US)
    assert root(near, "host_fwd_s") - root(warm, "host_fwd_s") == pytest.approx(24 * US)
    # backward: the 6 nodes in reverse, the same pattern
    assert root(near, "host_bwd_s") - root(warm, "host_bwd_s") == pytest.approx(24 * US)


# ---------------------------------------------------------------------------- light cycles (op_cold_light_s)
def test_light_families():
    for name in ("add", "add_", "sub", "mul_", "sigmoid_", "tanh", "relu", "gelu", "sigmoid_backward", "clone",
                 "unsafe_split", "addmm", "mm"):
        assert is_light(name), name
    for name in ("native_layer_norm", "native_batch_norm", "embedding", "convolution", "sum", "mean",
                 "max_pool2d_with_indices", "not_an_aten_op"):
        assert not is_light(name), name


def test_light_by_hand():
    names = ["addmm", "tanh", "addmm", "native_layer_norm", "tanh", "addmm", "tanh"]
    near, _ = near_reuse(names, [False] * 7, [False] * 7)
    light, light_b = light_reuse(names, [False] * 7, [False] * 7)
    assert list(near) == [False, False, True, False, True, True, True]
    # addmm 2 after {tanh}; tanh 6 after {addmm}: light. tanh 4 and addmm 5 have the layer norm in between: near only
    assert list(light) == [False, False, True, False, False, False, True]
    # backward (6, 5, ..., 0): tanh 4 after {addmm 5} light; addmm 2 after {nln, tanh} and tanh 1 after
    # {addmm, nln} near only; addmm 0 after {tanh 1} light
    assert list(light_b) == [True, False, False, False, True, False, False]
    heavy = [False, False, False, True, False, False, False]  # a heavy op: its families' earlier calls forgotten
    assert list(light_reuse(names, [False] * 7, heavy)[0]) == [False, False, True, False, False, False, True]


def test_light_cases_and_fit_by_hand():
    cases = [c for c in op_cases.op_cold_cases("cpu") if c.label.startswith((case_names.LIGHT, case_names.LIGHT_TIGHT))]
    ops = op_cases.light_ops(torch.device("cpu"))
    assert len(ops) == NEAR_DISTANCE + 1 and all(is_light(n) for n in ops)
    assert [c.label for c in cases] == [f"round-robin light x{len(ops)}", f"light tight x{len(ops)}"]
    assert [c.per_call for c in cases] == [len(ops), len(ops) * case_names.LIGHT_TIGHT_RUN]
    for c in cases:
        c.fn()
    # one after another 5 us per op, each 32 in a row 4 us: c (1 - 1/32) = 1 us, c = 32/31 us
    rows = [_row("opfixed", "a", 4 * US), _row("opfixed", "b", 6 * US), _row("opcold", "round-robin x2", 30 * US),
            _row("opcold", "round-robin light x13", 5 * US), _row("opcold", "light tight x13", 4 * US)]
    table = pd.DataFrame(rows)
    light, n, rr, tight = fit_cold.op_cold_light_excess(table)
    assert (n, rr, tight) == (13, pytest.approx(5 * US), pytest.approx(4 * US))
    assert light == pytest.approx(32 / 31 * US)
    assert fit_cold.op_cold_excess(table)[0] == pytest.approx(25 * US)  # 30 - (4 + 6) / 2: the light rows left out
    assert fit_cold.op_cold_light_excess(table.iloc[:4]) is None
    spec = fit.build_spec("cpu", pd.DataFrame([_row("launch", "op", 4 * US), _row("host", "view", 2 * US), *rows]),
                          peaks="measured", stamp="t")
    assert spec.host["op_cold_light_s"] == pytest.approx(32 / 31 * US)


class NormCellLoop(torch.nn.Module):
    """Three steps of addmm, native_layer_norm, tanh: near from the second step, never light (the norm)."""
    def __init__(self):
        super().__init__()
        self.cell, self.norm = torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)

    def forward(self, h):
        for _ in range(3):
            h = torch.tanh(self.norm(self.cell(h)))
        return h


def test_estimator_charges_light_cycles_the_light_price():
    torch.manual_seed(0)
    x = (torch.randn(2, 4, requires_grad=True),)
    root = lambda df, col: float(df.set_index("module").loc["(root)", col])  # noqa: E731
    prices = dict(op_cold_s=10 * US, op_cold_near_s=5 * US, op_cold_light_s=1 * US)
    for m, extra in ((CellLoop(), 2 * 10 + 4 * 1), (NormCellLoop(), 3 * 10 + 6 * 5)):
        # CellLoop: addmm tanh x 3, 2 first calls far, 4 light; NormCellLoop: 3 first calls far, 6 near, none light
        warm = perfcheck.estimate(m, x, system=_spec())
        priced = perfcheck.estimate(m, x, system=_spec(**prices))
        assert root(priced, "host_fwd_s") - root(warm, "host_fwd_s") == pytest.approx(extra * US)
        assert root(priced, "host_bwd_s") - root(warm, "host_bwd_s") == pytest.approx(extra * US)


# ---------------------------------------------------------------------------- beyond the L3 (op_cold_far_s)
def test_far_by_hand():
    nan = float("nan")
    dist_f, dist_b = [nan, 150.0, nan, 50.0, 200.0, 10.0], [300.0, 20.0, nan, 120.0, 100.0, nan]
    skip = [False, False, True, False, False, False]
    fwd, bwd = far_reuse(dist_f, dist_b, skip, 100.0)
    assert list(fwd) == [False, True, False, False, True, False]  # NaN (no bytes moved) and views never far
    assert list(bwd) == [True, False, False, True, False, False]  # 100 is not beyond 100
    assert [list(a) for a in far_reuse(dist_f, dist_b, skip, 0.0)] == [[False] * 6, [False] * 6]


class TwoLayers(torch.nn.Module):
    """mm, relu, mm, relu on fp32: x (4 x 8) 128 B, each weight (8 x 8) 256 B, each activation (4 x 8) 128 B."""
    def __init__(self):
        super().__init__()
        self.w1, self.w2 = torch.nn.Parameter(torch.randn(8, 8)), torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        return torch.relu(torch.relu(x @ self.w1) @ self.w2)


def test_family_distances_are_stack_distances_by_hand():
    from perfcheck.predict import reuse
    from perfcheck.predict import trace as tracing
    from perfcheck.predict.module_estimator import _op_table

    x = torch.randn(4, 8)
    trace = tracing.trace_model(TwoLayers(), (x,))
    ops = _op_table(trace, False)
    dist_f, dist_b = reuse.family_distances(trace, ops)
    names = [trace.ops[i].call.name for i in ops["op"]]
    assert names == ["mm", "relu", "mm", "relu"]
    # forward events mm1 (x, w1, a), relu1 (a, b), mm2 (b, w2, c), relu2 (c, d); distinct bytes since the family's
    # last call: mm2 after relu1, which last touched a and b (256); relu2 after mm2's b, w2, c (512). First calls: the
    # step's footprint, every storage once (the forward's seven: 1152 B, and the backward's gradients)
    assert dist_f[2] == 256 and dist_f[3] == 512
    assert dist_f[0] == dist_f[1] >= 1152
    # backward (relu2, mm2, relu1, mm1): first calls as far as the footprint, repeats nearer
    assert dist_b[3] == dist_b[2] == dist_f[0]
    assert 0 < dist_b[1] < dist_f[0] and 0 < dist_b[0] < dist_f[0]


def test_far_case_evicts_the_l3_and_its_fit_by_hand(monkeypatch):
    monkeypatch.setattr(op_cases, "cache_bytes", lambda level: 8 * 2 ** 20)
    far = op_cases.op_cold_far_cases("cpu")
    assert len(far) == 1 and far[0].label == f"round-robin far x{len(op_cases.tiny_ops(torch.device('cpu')))}"
    assert far[0].shape[0] == 8 * 2 ** 20 and far[0].between is not None and far[0].per_call == 14
    monkeypatch.setattr(op_cases, "cache_bytes", lambda level: 0)
    assert op_cases.op_cold_far_cases("cpu") == []  # no L3 given: no case, no far price
    # tight loops a 4, b 6 us; one after another 9 us per op; after the L3 eviction 40 us per op
    table = pd.DataFrame([_row("opfixed", "a", 4 * US), _row("opfixed", "b", 6 * US),
                          _row("opcold", "round-robin x2", 9 * US),
                          {**_row("opcold", "round-robin far x2", 40 * US), "m": 8 * 2 ** 20}])
    excess, n, per_op, tight, l3 = fit_cold.op_cold_far_excess(table)
    assert (excess, n, l3) == (pytest.approx(35 * US), 2, 8 * 2 ** 20)
    assert fit_cold.op_cold_excess(table)[0] == pytest.approx(4 * US)  # the far row is not the tight round-robin
    rows = [_row("launch", "op", 4 * US), _row("host", "view", 2 * US), *table.to_dict("records")]
    spec = fit.build_spec("cpu", pd.DataFrame(rows), peaks="measured", stamp="t")
    assert spec.host["op_cold_far_s"] == pytest.approx(35 * US) and spec.calibration["l3_bytes"] == 8 * 2 ** 20


#: Host prices of the far-rule estimator tests: every switch 10 us, a far one 50 us.
FAR_HOST = dict(op_cold_s=10 * US, op_cold_near_s=10 * US, op_cold_light_s=10 * US, op_cold_far_s=50 * US)


def _cell_host_times(l3_bytes=None, l3_lost=None, **host) -> dict:
    """The cell loop's root host seconds per phase on the host-only cpu spec with ``FAR_HOST`` and ``host``, its
    calibration holding ``l3_bytes`` (and the L3's loss curve ``l3_lost``) where given."""
    import dataclasses
    torch.manual_seed(0)
    spec = _spec(**FAR_HOST, **host)
    if l3_bytes is not None:
        calibration = {"l3_bytes": l3_bytes, **({"l3_lost": l3_lost} if l3_lost else {})}
        spec = dataclasses.replace(spec, calibration=calibration)
    root = perfcheck.estimate(CellLoop(), (torch.randn(2, 4, requires_grad=True),), system=spec)
    root = root.set_index("module").loc["(root)"]
    return {phase: float(root[phase]) for phase in ("host_fwd_s", "host_bwd_s")}


def test_estimator_charges_far_ops_the_far_price():
    base, tiny, huge = _cell_host_times(), _cell_host_times(1), _cell_host_times(2 ** 40)
    # an L3 of 1 byte: every one of the 6 switching ops per pass is far, 50 us where it paid 10
    for phase in ("host_fwd_s", "host_bwd_s"):
        assert tiny[phase] - base[phase] == pytest.approx(6 * 40 * US)
        assert huge[phase] == pytest.approx(base[phase])  # the step fits in the L3: nothing far


# ---------------------------------------------------------------------------- a shared L3 decays (l3_residency_s)
def test_residency_cases_and_fit_by_hand(monkeypatch):
    monkeypatch.setattr(op_cases, "cache_bytes", lambda level: 8 * 2 ** 20 if level == 3 else 2 ** 20)
    cases = op_cases.l3_residency_cases("cpu")
    assert [c.label for c in cases] == ["l3 residency hot", "l3 residency 2000 us", "l3 residency 8000 us",
                                        "l3 residency evicted"]
    assert all(c.between is not None and c.shape[0] == 8 * 2 ** 20 for c in cases)
    # hot 100 us, evicted 500 us; after 2 ms 200 us (a quarter of the loss), after 8 ms 400 us (three quarters):
    # half lies halfway between 2 and 8 ms in log(sleep): sqrt(2 x 8) = 4 ms
    rows = [{**_row("opcold", lab, s * US), "m": 8 * 2 ** 20, "n": n} for lab, s, n in (
        ("l3 residency hot", 100, 0), ("l3 residency 2000 us", 200, 2000), ("l3 residency 8000 us", 400, 8000),
        ("l3 residency evicted", 500, 0))]
    tau, hot, evicted, points = fit_cold.l3_residency(pd.DataFrame(rows))
    assert tau == pytest.approx(0.004) and (hot, evicted) == (pytest.approx(100 * US), pytest.approx(500 * US))
    rows[2]["seconds"] = 250 * US  # 8 ms loses under half: no decay within the sleeps measured, no residency
    assert fit_cold.l3_residency(pd.DataFrame(rows)) is None
    table = pd.DataFrame([_row("launch", "op", 4 * US), _row("host", "view", 2 * US), *rows[:2],
                          {**rows[2], "seconds": 400 * US}, rows[3]])
    spec = fit.build_spec("cpu", table, peaks="measured", stamp="t")
    assert spec.host["l3_residency_s"] == pytest.approx(0.004)
    assert fit_cold.op_cold_excess(pd.DataFrame(rows)) is None  # the residency rows are not a round-robin


def test_estimator_charges_ops_late_in_a_decaying_l3():
    base, late = _cell_host_times(), _cell_host_times(2 ** 40, l3_residency_s=1e-12)
    # an L3 that holds the step but whose data decays at once: every switching op is far in time (6 per pass)
    for phase in ("host_fwd_s", "host_bwd_s"):
        assert late[phase] - base[phase] == pytest.approx(6 * 40 * US)


def test_family_ages_by_hand():
    from perfcheck.predict.family_reuse import family_ages

    names = ["mm", "relu", "t", "mm", "relu", "mm"]
    skip = [False, False, True, False, False, False]
    fwd_s, bwd_s = [1.0, 1.0, 0.0, 4.0, 1.0, 1.0], [1.0, 2.0, 0.0, 1.0, 2.0, 1.0]
    fwd, bwd = family_ages(names, skip, fwd_s, bwd_s, idle_s=5.0)
    # a first call last ran a step ago: the ops' 8 + 7 s and the 5 s outside them (the optimizer's step)
    assert list(fwd[[0, 1, 3, 4, 5]]) == [20.0, 20.0, 1.0, 4.0, 1.0] and np.isnan(fwd[2])
    assert list(bwd[[5, 4, 3, 1, 0]]) == [20.0, 20.0, 2.0, 1.0, 2.0] and np.isnan(bwd[2])


def test_estimator_charges_the_l3_loss_curves_share_of_the_far_price():
    # the calibration's loss curve (calibration.l3_lost) prices the time rule instead of the residency threshold:
    # lost nothing until 0.1 s (a curve through (0.1 s, 0) and (1 s, 1)), so the cell loop's ops, microseconds apart,
    # pay nothing; lost everything past 1 ns: all 6 switching ops per pass pay the far price, 40 us more each
    base = _cell_host_times()
    slow = _cell_host_times(2 ** 40, l3_residency_s=1e-12, l3_lost=((1.0, 1.0),))
    fast = _cell_host_times(2 ** 40, l3_residency_s=1e-12, l3_lost=((1e-9, 1.0),))
    for phase in ("host_fwd_s", "host_bwd_s"):
        assert slow[phase] == pytest.approx(base[phase])
        assert fast[phase] - base[phase] == pytest.approx(6 * 40 * US)


def test_the_steps_time_outside_the_model_ages_each_familys_first_call():
    """``step_other_s`` (an engine's step outside the model) is time since each family's first call last ran: on
    an L3 that loses nothing in 0.1 s and everything in 1 s, 10 s more makes the first addmm and the first tanh of
    each pass far (2 x 40 us per pass); the other calls ran microseconds before and stay as they were."""
    import dataclasses
    torch.manual_seed(0)
    spec = dataclasses.replace(_spec(**FAR_HOST, l3_residency_s=1e-12),
                               calibration={"l3_bytes": 2 ** 40, "l3_lost": ((1.0, 1.0),)})
    x = (torch.randn(2, 4, requires_grad=True),)
    base, later = (perfcheck.estimate(CellLoop(), x, system=spec, step_other_s=s).set_index("module").loc["(root)"]
                   for s in (0.0, 10.0))
    for phase in ("host_fwd_s", "host_bwd_s"):
        assert later[phase] - base[phase] == pytest.approx(2 * 40 * US)
    with pytest.raises(perfcheck.UserError, match="step_other_s"):
        perfcheck.estimate(CellLoop(), x, system=spec, step_other_s=-1.0)

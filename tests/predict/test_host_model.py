"""The host model (perfcheck.predict.host): the two-timeline rule on constructed host-bound,
device-bound and mixed sequences, the per-op host arithmetic by hand on a one-Linear model, the
optimizer model per implementation, the calibration fit of the host constants and the skinny-GEMM
shape curve, the per-op kernel costs, and the per-user calibration cache."""
import dataclasses

import pandas as pd
import pytest
import torch

import perfcheck
from perfcheck.errors import UserError
from perfcheck.hardware.systems import SystemSpec, host_constants, load_system
from perfcheck.predict import host, roofline
from perfcheck.predict import efficiency

US = 1e-6


def _spec(kind="cpu", **host_values):
    base = load_system("cpu" if kind == "cpu" else "h100-sxm")
    values = {k: 0.0 for k in host_constants(base)}
    values.update(host_values)
    return dataclasses.replace(base, host=values)


# ---------------------------------------------------------------------------- two timelines
def test_timeline_host_bound_device_bound_and_mixed():
    # host-bound: the device idles between ops; E_i = H_i + d_i: 10+1, 20+1, 30+1
    issue, end = host.timeline([10, 10, 10], [1, 1, 1], same_thread=False)
    assert list(issue) == [10, 20, 30] and list(end) == [11, 21, 31]
    # device-bound: after the first issue the device never waits: 1+10, then +10, +10
    issue, end = host.timeline([1, 1, 1], [10, 10, 10], same_thread=False)
    assert list(end) == [11, 21, 31]
    # mixed: E0 = 1+10 = 11; E1 = max(2, 11)+10 = 21; E2 = max(22, 21)+1 = 23; E3 = max(23, 23)+10 = 33
    issue, end = host.timeline([1, 1, 20, 1], [10, 10, 1, 10], same_thread=False)
    assert list(issue) == [1, 2, 22, 23] and list(end) == [11, 21, 23, 33]
    # region [2, 3] starts when its start event runs, max(H1, E1) = max(2, 21) = 21, and ends at E3 = 33
    assert host.region_time(issue, end, [(2, 3)]) == 12
    assert host.region_time(issue, end, [(0, 0), (2, 3)]) == 11 + 12
    # one thread (a CPU): everything adds, 1+10 + 1+10 + 20+1 + 1+10 = 54
    _, end = host.timeline([1, 1, 20, 1], [10, 10, 1, 10], same_thread=True)
    assert end[-1] == 54


def test_timeline_rejects_bad_input():
    with pytest.raises(UserError, match="one length"):
        host.timeline([1, 2], [1], same_thread=False)
    with pytest.raises(UserError, match=">= 0"):
        host.timeline([-1], [1], same_thread=False)


# ---------------------------------------------------------------------------- per-op arithmetic
def _linear_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3)), (torch.randn(2, 4),)


def test_host_terms_of_one_linear_by_hand():
    spec = _spec("cpu", op_dispatch_s=1 * US, view_dispatch_s=0.5 * US, autograd_node_s=0.25 * US,
                 backward_node_s=2 * US, backward_call_s=10 * US, module_call_s=3 * US)
    model, x = _linear_model()
    pred = perfcheck.estimate(model, x, system=spec).set_index("module")
    # Linear forward records t (a view) and addmm, both with an input needing a gradient (the weight):
    #   module call 3 + t (0.5 + 0.25) + addmm (1 + 0.25) = 5.0 us; Sequential adds its own call: 8.0 us
    assert pred.loc["0", "host_fwd_s"] == pytest.approx(5.0 * US)
    assert pred.loc["(root)", "host_fwd_s"] == pytest.approx(8.0 * US)
    # backward: addmm node 2 + 2 kernels (grad W, grad b; x needs none) x 1 = 4; t node 2 + 0.5 = 2.5;
    # AccumulateGrad for weight and bias 2 x (2 + 0.5) = 5: 11.5 us; the root adds backward() 10 us
    assert pred.loc["0", "host_bwd_s"] == pytest.approx(11.5 * US)
    assert pred.loc["(root)", "host_bwd_s"] == pytest.approx(21.5 * US)
    # on a CPU the two timelines are one thread: time = host + device (roofline of addmm, nothing else)
    device = pred.loc["0", "pred_fwd_s"] - pred.loc["0", "host_fwd_s"]
    mf = 2 * 2 * 4 * 3  # 2 x (m=2, k=4, n=3) MACs
    t_addmm, _ = roofline.op_time_s(mf, 2 * 3, (2 * 4 + 4 * 3 + 2 * 3 + 3) * 4, 1, spec, "fp32", launch_s=0.0,
                                    min_dim=2)
    assert device == pytest.approx(t_addmm, rel=1e-6)
    assert pred.loc["0", "bound_fwd"] == ("host" if 5.0 * US > t_addmm else pred.loc["0", "bound_fwd"])


def test_gpu_tiny_model_is_host_bound_and_time_is_the_host_timeline():
    spec = _spec("gpu", op_dispatch_s=10 * US, view_dispatch_s=2 * US, module_call_s=5 * US,
                 device_kernel_s=1 * US)
    model, x = _linear_model()
    pred = perfcheck.estimate(model, x, system=spec).set_index("module")
    # host: 5 + 2 + 10 = 17 us; the device's addmm (~1 us) runs after its issue at 17 us, so the
    # region ends at 17 + ~1 us: host-bound, and the time is the host's plus one kernel
    assert pred.loc["0", "host_fwd_s"] == pytest.approx(17 * US)
    assert pred.loc["0", "bound_fwd"] == "host"
    assert 17 * US < pred.loc["0", "pred_fwd_s"] < 18.1 * US


def test_device_bound_gemm_is_not_host_bound():
    model = torch.nn.Linear(2048, 2048)
    pred = perfcheck.estimate(model, (torch.empty(4096, 2048, device="meta"),), system="cpu")
    root = pred.iloc[0]
    assert root["bound_fwd"] == "compute" and root["host_fwd_s"] < 1e-3 * root["pred_fwd_s"]


# ---------------------------------------------------------------------------- optimizer
def test_optimizer_arithmetic_per_implementation():
    spec = _spec("cpu", optim_step_s=30 * US, optim_sgd_per_tensor_s=5 * US, optim_adam_per_tensor_s=21 * US,
                 optim_sgd_foreach_per_tensor_s=1 * US, optim_adam_foreach_per_tensor_s=7 * US,
                 optim_adam_step_s=60 * US, optim_adam_foreach_step_s=90 * US)
    bw = spec.mem_bandwidth_bytes_per_s * spec.efficiency["memory"]
    cost = host.optimizer_time([100, 50], "sgd", spec)
    # for-loop on a CPU: host 30 + 2 x 5 = 40 us; device: SGD's one add_ (read p, g, write p: 3 streams) x 150
    # elements x 4 B at the copy rate
    assert (cost.implementation, cost.host_s) == ("for-loop", pytest.approx(40 * US))
    assert cost.device_s == pytest.approx(3 * 150 * 4 / bw) and cost.time_s == pytest.approx(40 * US + 3 * 150 * 4 / bw)
    # torch 2.13's Adam for-loop per tensor: add_ on the step counter (1 element), lerp_ (m: rw + g: 3 streams),
    # mul_ (v: 2), addcmul_ (v: rw + g, g: 4), sqrt (v read, new tensor: 2), div (2), add_ (eps, in place: 2),
    # addcdiv_ (p: rw + m + denom: 4) = 19 streams; 9 element-ops per tensor (step counter included)
    adam = host.optimizer_time([100, 50], "adam-for-loop", spec)
    assert adam.device_s == pytest.approx(19 * 150 * 4 / bw) and adam.host_s == pytest.approx(60 * US + 2 * 21 * US)
    # AdamW foreach: one more _foreach_mul_ (decay, p rw: 2 streams) = 21 streams; 11 foreach ops touching each
    # tensor vs SGD's 1 and Adam's 10: per tensor 1 + (7 - 1) x (11 - 1) / (10 - 1) = 7.667 us on the foreach line
    adamw = host.optimizer_time([100, 50], "adamw-foreach", spec)
    # ... after Adam foreach's own intercept (90 us, its calibration line's), not SGD's 30 us
    assert adamw.host_s == pytest.approx(90 * US + 2 * (1 + 6 * 10 / 9) * US)
    assert adamw.device_s == pytest.approx(21 * 150 * 4 / bw)
    gpu = _spec("gpu", optim_step_s=30 * US, optim_sgd_foreach_step_s=130 * US, optim_sgd_foreach_per_tensor_s=1 * US,
                device_kernel_s=2 * US)
    g = host.optimizer_time([10] * 4, "sgd", gpu)  # GPU default: foreach; host and device overlap
    assert g.implementation == "foreach" and g.time_s == pytest.approx(max(g.host_s, g.device_s))
    assert g.host_s == pytest.approx(134 * US) and g.fixed_s == pytest.approx(130 * US)  # 130 + 4 x 1


def test_optimizer_kind_from_instances_and_names():
    p = [torch.nn.Parameter(torch.ones(2))]
    assert host.optimizer_kind(torch.optim.SGD(p, lr=0.1, momentum=0.9)) == ("sgd_momentum", "for-loop")  # CPU
    assert host.optimizer_kind(torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)) == \
        ("sgd_momentum_nesterov_wd", "for-loop")
    assert host.optimizer_kind(torch.optim.Adam(p, foreach=True)) == ("adam", "foreach")
    assert host.optimizer_kind(torch.optim.Adam(p, amsgrad=True, fused=True)) == ("adam_amsgrad", "fused")
    assert host.optimizer_kind(torch.optim.AdamW(p, foreach=False)) == ("adamw", "for-loop")
    assert host.optimizer_kind("Adam-fused") == ("adam", "fused")
    assert host.optimizer_kind("sgd_momentum") == ("sgd_momentum", None)
    with pytest.raises(UserError, match="optimizer: unknown 'lion'"):
        host.optimizer_kind("lion")
    with pytest.raises(UserError, match="unknown variant 'fast'"):
        host.optimizer_kind("adam_fast")


def test_every_torch_optim_optimizer_round_trips_and_is_priced():
    """No torch.optim optimizer is refused: each instance's name maps back to it, and its step is priced."""
    import inspect

    # every implementation's fixed cost 30 us (each optimizer's step pays its family's, host.step_key)
    spec = _spec("cpu", optim_step_s=30 * US, optim_sgd_foreach_step_s=30 * US, optim_adam_step_s=30 * US,
                 optim_adam_foreach_step_s=30 * US)
    p = [torch.nn.Parameter(torch.ones(4, 4))]
    for name, cls in vars(torch.optim).items():
        if not (inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer)) or cls is torch.optim.Optimizer:
            continue
        pair = host.optimizer_kind(cls(p))
        assert host.optimizer_kind("-".join(pair)) == pair, name
        cost = host.optimizer_time([16, 4], "-".join(pair), spec)
        assert cost.device_s > 0 and cost.host_s >= 30 * US, name


def test_optimizer_streams_follow_the_variant():
    # SGD momentum for-loop per tensor (torch 2.13 _single_tensor_sgd): buf.mul_(m) (2), buf.add_(g) (3),
    # p.add_(buf) (3) = 8 streams; Nesterov adds grad.add(buf, alpha=m) (a new tensor: 3) = 11
    from perfcheck.predict import optimizers

    assert optimizers.profile("sgd_momentum", "for-loop").streams == 8
    assert optimizers.profile("sgd_momentum_nesterov", "for-loop").streams == 11
    # fused: one pass, p, m, v read + written and the gradients too (mutable in _fused_adam_'s schema: unscaling)
    assert optimizers.profile("adam", "fused").streams == 8


def test_estimate_predicts_the_optimizer_at_the_root():
    spec = _spec("cpu", optim_step_s=30 * US, optim_sgd_per_tensor_s=5 * US)
    model, x = _linear_model()
    pred = perfcheck.estimate(model, x, system=spec, optimizer="sgd").set_index("module")
    mem = 3 * 15 * 4 / (spec.mem_bandwidth_bytes_per_s * spec.efficiency["memory"])  # 4x3 weight + 3 bias
    assert pred.loc["(root)", "pred_optim_s"] == pytest.approx(30 * US + 2 * 5 * US + mem)
    assert pred.loc["0", "pred_optim_s"] == pytest.approx(2 * 5 * US + mem)  # no fixed step cost below the root


# ---------------------------------------------------------------------------- spec validation
def test_host_block_is_validated():
    data = load_system("cpu").to_json_dict()
    with pytest.raises(UserError, match="host has unknown key 'dispatch'"):
        SystemSpec.from_dict({**data, "host": {"dispatch": 1e-6}}, "x.json")
    with pytest.raises(UserError, match="host.op_dispatch_s"):
        SystemSpec.from_dict({**data, "host": {"op_dispatch_s": -1}}, "x.json")
    with pytest.raises(UserError, match="op_efficiency.convolution"):  # a CPU's bound is 20 (op_efficiency_max)
        SystemSpec.from_dict({**data, "op_efficiency": {"convolution": 25.0}}, "x.json")
    assert "host" not in data  # built-ins carry no host block: the defaults file gives it


# ---------------------------------------------------------------------------- calibration fit
def _row(kind, label, seconds, m=0, k=0, n=0, flops=0.0, nbytes=0.0):
    return {"kind": kind, "label": label, "dtype": "fp32", "m": m, "k": k, "n": n, "flops": flops, "bytes": nbytes,
            "world_size": 1, "seconds": seconds}


def test_fit_host_constants_by_hand():
    from perfcheck.calibrate.fit import build_spec

    rows = [_row("launch", "op", 4 * US), _row("host", "view", 2 * US),
            _row("host", "autograd forward x32", 7 * US), _row("host", "module call", 3 * US),
            # forward 7 us per op; backward 6 us per node + 50 us per call: x8 = 56 + 48 + 50 = 154 us,
            # x32 = 224 + 192 + 50 = 466 us
            _row("host", "forward+backward x8", 154 * US, m=8), _row("host", "forward+backward x32", 466 * US, m=32),
            # SGD for-loop: 30 us + 5 us per tensor: x2 = 40 us, x16 = 110 us
            _row("host", "optim sgd x2", 40 * US, m=2), _row("host", "optim sgd x16", 110 * US, m=16),
            # SGD foreach: 130 us + 1 us per tensor: x2 = 132, x16 = 146 (the H100 VM's shape: 139 + 1.1 per tensor)
            _row("host", "optim sgd_foreach x2", 132 * US, m=2), _row("host", "optim sgd_foreach x16", 146 * US, m=16)]
    spec = build_spec("cpu", pd.DataFrame(rows), peaks="measured", stamp="test")
    h = spec.host
    assert h["optim_sgd_foreach_per_tensor_s"] == pytest.approx(1 * US)
    assert h["optim_sgd_foreach_step_s"] == pytest.approx(130 * US)  # its own intercept, not the for-loop's 30
    assert host_constants(spec)["optim_adam_step_s"] == host_constants(load_system("cpu"))["optim_adam_step_s"]  # no case
    assert h["op_dispatch_s"] == pytest.approx(4 * US) and h["view_dispatch_s"] == pytest.approx(2 * US)
    assert h["autograd_node_s"] == pytest.approx(3 * US)  # 7 - 4
    assert h["backward_node_s"] == pytest.approx(2 * US)  # slope 6 less one grad kernel's dispatch 4
    assert h["backward_call_s"] == pytest.approx(50 * US)
    assert h["optim_sgd_per_tensor_s"] == pytest.approx(5 * US) and h["optim_step_s"] == pytest.approx(30 * US)
    assert h["module_call_s"] == pytest.approx(3 * US) and h["device_kernel_s"] == 0.0
    assert "test" in spec.sources["host.backward_node_s"]


def test_fit_shape_curve_for_skinny_gemms():
    from perfcheck.calibrate.fit import build_spec

    peak = 100e9
    rows = [_row("launch", "op", 0.0)]
    for s in (64, 256, 1024):  # squares at the peak: efficiency 1 everywhere
        f = 2.0 * s ** 3
        rows.append(_row("matmul", f"mm {s}", f / peak, s, s, s, f))
    f = 2.0 * 96 * 1024 * 1024  # a 96-row Linear at 1/1.4 of the rate
    rows.append(_row("matmul", "linear 96x1024x1024", f / (peak / 1.4), 96, 1024, 1024, f))
    spec = build_spec("cpu", pd.DataFrame(rows), peaks="measured", stamp="test")
    # anchored at 1.0 by the next non-skinny shape above 96: the 256 square
    assert spec.matrix_shape_curve == ((96.0, pytest.approx(1 / 1.4, rel=1e-3)), (256.0, 1.0))
    # the roofline applies it by smallest dimension: 96 rows -> 1/1.4 of the square rate at equal FLOPs
    t_skinny = roofline.compute_time_s(f, 0, spec, "fp32", min_dim=96)
    t_square = roofline.compute_time_s(f, 0, spec, "fp32")
    assert t_skinny / t_square == pytest.approx(1.4, rel=1e-3)


def test_per_op_fixed_cost_and_efficiency_enter_the_device_time():
    base = _spec("cpu")
    model, x = _linear_model()
    before = perfcheck.estimate(model, x, system=base).set_index("module")
    spec = dataclasses.replace(base, op_fixed_s={"addmm": 10 * US}, op_efficiency={"addmm": 0.5})
    after = perfcheck.estimate(model, x, system=spec).set_index("module")
    roof = before.loc["0", "pred_fwd_s"]  # host terms are 0 here: the addmm roofline alone
    assert after.loc["0", "pred_fwd_s"] == pytest.approx(roof / 0.5 + 10 * US)
    # backward: 2 kernels vs 1 forward kernel -> twice the fixed cost
    assert after.loc["0", "pred_bwd_s"] == pytest.approx(before.loc["0", "pred_bwd_s"] / 0.5 + 20 * US)


# ---------------------------------------------------------------------------- cache
def test_calibration_cache_round_trip_and_labels(tmp_path, monkeypatch):
    from perfcheck.hardware import cache

    monkeypatch.setenv("PERFCHECK_CACHE_DIR", str(tmp_path))
    assert cache.cached_spec("cpu") is None
    assert cache.spec_label(cache.default_system("cpu")) == f"cpu (datasheet: default, {cache.NO_CALIBRATION})"
    spec = dataclasses.replace(load_system("cpu"), name="mine", calibrated=True, host={"op_dispatch_s": 9 * US})
    path = cache.save_to_cache(spec, "cpu")
    assert path.parent == tmp_path and path.suffix == ".json"
    got = cache.default_system("cpu")
    assert got.name == "mine" and host_constants(got)["op_dispatch_s"] == 9 * US
    assert cache.spec_label(got) == f"mine (calibrated: per-user cache {path}; when and under what load: not recorded)"
    pred = perfcheck.estimate(*_linear_model())  # no system: the cache's spec
    assert pred.attrs["system"] == "mine" and "per-user cache" in pred.attrs["system_label"]
    assert cache.cache_path("cpu") == path  # same machine, same threads: same fingerprint
    other = cache.cache_path("cpu", threads=torch.get_num_threads() + 1)
    assert other != path  # a calibration with other threads does not describe this run


def test_a_calibration_of_another_format_is_not_read(tmp_path, monkeypatch):
    """A cached calibration written before ``perfcheck calibrate`` gained cases (CALIBRATION_FORMAT) is not used:
    the spec it lacks fields for would predict without them (the run-speed columns stayed empty on a 2026-11-26
    cache); the next prediction finds no entry and the automatic calibration measures anew."""
    from perfcheck.hardware import cache

    monkeypatch.setenv("PERFCHECK_CACHE_DIR", str(tmp_path))
    spec = dataclasses.replace(load_system("cpu"), name="older", calibrated=True)
    monkeypatch.setattr(cache, "CALIBRATION_FORMAT", cache.CALIBRATION_FORMAT - 1)
    old = cache.save_to_cache(spec, "cpu")
    assert cache.cached_spec("cpu").name == "older"  # read back by the code of its own format
    monkeypatch.undo()
    monkeypatch.setenv("PERFCHECK_CACHE_DIR", str(tmp_path))
    assert cache.cache_path("cpu") != old and cache.cached_spec("cpu") is None


def test_cache_fingerprint_tells_machines_with_one_host_name_apart(monkeypatch):
    """Lent cloud VMs are all named alike ("vm"): a calibration kept on one must not be found on another
    (its host may be 1.6x faster, bench/RESULTS.md), so the machine id is part of the fingerprint."""
    from perfcheck.hardware import cache

    monkeypatch.setattr(cache.socket, "gethostname", lambda: "vm")
    monkeypatch.setattr(cache, "machine_id", lambda: "a" * 32)
    first = cache.cache_path("cpu", threads=1)
    monkeypatch.setattr(cache, "machine_id", lambda: "b" * 32)
    assert cache.cache_path("cpu", threads=1) != first
    monkeypatch.setattr(cache, "machine_id", lambda: "a" * 32)
    assert cache.cache_path("cpu", threads=1) == first  # the same machine finds its own entry


# ---------------------------------------------------------------------------- findings, DeepSpeed, collectives
def test_predicted_host_bound_finding_before_the_run():
    from perfcheck.analysis.findings import predicted_host_bound

    spec = _spec("gpu", op_dispatch_s=10 * US, module_call_s=5 * US, view_dispatch_s=2 * US, device_kernel_s=1 * US)
    model, x = _linear_model()
    lines = predicted_host_bound(perfcheck.estimate(model, x, system=spec))
    # root forward host: Sequential 5 + Linear 5 + t 2 + addmm 10 = 22 us
    assert lines[0].startswith("(root) fwd: predicted host-bound, host 22 us vs device ")
    big = perfcheck.estimate(torch.nn.Linear(4096, 4096), (torch.empty(8192, 4096, device="meta"),), system=spec)
    assert predicted_host_bound(big) == []  # a large GEMM is device-bound


# DeepSpeed's host terms (host.deepspeed_host_s): tests/predict/test_deepspeed_host_costs.py


def test_collective_alpha_per_call_in_the_zero_model():
    from perfcheck.predict import zero

    spec = _spec("cpu", collective_latency_s=500 * US)
    lines = [zero.Collective("bwd", "allreduce", 3 * 4096.0, 3, "grads")]
    t = zero.comm_time_s(lines, 2, spec)["bwd"]
    # three calls of 4096 B: 3 x (bandwidth term + alpha 500 us); the bandwidth term by hand:
    # S * 2 (n - 1) / n / (link bandwidth * efficiency) with S = 4096 B, n = 2
    bw = 4096.0 * 2 * 1 / 2 / (spec.intra_node_bandwidth_bytes_per_s * spec.efficiency["intra_node"])
    assert t == pytest.approx(3 * (bw + 500 * US))


def test_autograd_node_is_the_grad_chain_less_the_same_chain_without_grad():
    """autograd_node_s comes from two chains of the same ``y * b`` op, with and without autograd: taking
    torch.add's dispatch off instead (another call path) read 1.0 us on the project's VM where the
    matched difference is 1.3 us. Old tables without the plain chain keep the previous rule."""
    from perfcheck.calibrate.fit import build_spec

    rows = [_row("launch", "op", 4 * US), _row("host", "autograd forward x32", 7 * US),
            _row("host", "plain forward x32", 2.5 * US)]
    spec = build_spec("cpu", pd.DataFrame(rows), peaks="measured", stamp="test")
    assert spec.host["autograd_node_s"] == pytest.approx(4.5 * US)  # 7 - 2.5, not 7 - 4
    assert "without autograd" in spec.sources["host.autograd_node_s"]
    old = build_spec("cpu", pd.DataFrame(rows[:2]), peaks="measured", stamp="test")
    assert old.host["autograd_node_s"] == pytest.approx(3 * US)


def test_module_fixed_cost_is_added_per_call_of_that_class():
    """module_fixed_s[class] is host time per forward call of a module of that class, beyond its ops: a planted
    20 us BatchNorm1d cost adds 20 us to that module's and the root's forward host time, nothing to the backward;
    a module called twice pays it twice."""
    spec = _spec("cpu", op_dispatch_s=1 * US, view_dispatch_s=0.5 * US, autograd_node_s=0.25 * US,
                 backward_node_s=2 * US, backward_call_s=10 * US, module_call_s=3 * US)
    with_cost = dataclasses.replace(spec, module_fixed_s={"BatchNorm1d": 20 * US, "Conv2d": 1.0})
    bn = torch.nn.BatchNorm1d(3)
    x = (torch.randn(4, 3, requires_grad=True),)
    a = perfcheck.estimate(torch.nn.Sequential(bn), x, system=with_cost).set_index("module")
    b = perfcheck.estimate(torch.nn.Sequential(bn), x, system=spec).set_index("module")
    for m in ("0", "(root)"):
        assert a.loc[m, "host_fwd_s"] - b.loc[m, "host_fwd_s"] == pytest.approx(20 * US)
        assert a.loc[m, "host_bwd_s"] == pytest.approx(b.loc[m, "host_bwd_s"])
    twice = perfcheck.estimate(torch.nn.Sequential(bn, torch.nn.ReLU(), bn), x, system=with_cost).set_index("module")
    none = perfcheck.estimate(torch.nn.Sequential(bn, torch.nn.ReLU(), bn), x, system=spec).set_index("module")
    assert twice.loc["(root)", "host_fwd_s"] - none.loc["(root)", "host_fwd_s"] == pytest.approx(40 * US)
    # it round-trips through the spec's JSON and is validated like op_fixed_s
    again = SystemSpec.from_dict(with_cost.to_json_dict())
    assert dict(again.module_fixed_s) == {"BatchNorm1d": 20 * US, "Conv2d": 1.0}
    with pytest.raises(UserError, match="module_fixed_s.BatchNorm1d"):
        SystemSpec.from_dict({**spec.to_json_dict(), "module_fixed_s": {"BatchNorm1d": -1.0}})


def test_retired_module_classes_are_dropped_from_an_older_spec():
    """Linear, LayerNorm, Embedding, ReLU, GELU, Dropout and MaxPool2d lost their module_fixed_s entries in the
    held-out pruning (bench/results/pruning.md): an older file's entries load without them, and a Linear model
    predicts as without any entry."""
    spec = _spec("cpu", op_dispatch_s=1 * US, module_call_s=3 * US)
    retired = {"Linear": 20 * US, "LayerNorm": 1 * US, "Embedding": 1 * US, "ReLU": 1 * US, "GELU": 1 * US,
               "Dropout": 1 * US, "MaxPool2d": 1 * US}
    old = SystemSpec.from_dict({**spec.to_json_dict(), "module_fixed_s": {**retired, "Conv1d": 2 * US}})
    assert dict(old.module_fixed_s) == {"Conv1d": 2 * US}
    model, x = _linear_model()
    a = perfcheck.estimate(model, x, system=old).set_index("module")
    b = perfcheck.estimate(model, x, system=spec).set_index("module")
    assert a.loc["(root)", "host_fwd_s"] == b.loc["(root)", "host_fwd_s"]


def test_fit_module_fixed_is_the_measured_call_less_the_estimate():
    """The fit keeps, per layer class, the measured call less the estimator's forward for the same tiny
    module on the spec being fitted (floored at 0); labels it does not know (a retired class's, another
    version's) are skipped."""
    from perfcheck.calibrate.fit import build_spec
    from perfcheck.calibrate.layers import tiny_modules
    from perfcheck.schema import ROOT

    rows = [_row("launch", "op", 4 * US), _row("host", "module call", 3 * US),
            _row("modfixed", "BatchNorm1d", 100 * US), _row("modfixed", "Conv2d", 0.0),
            _row("modfixed", "NoSuchLayer", 1.0), _row("modfixed", "Linear", 100 * US)]
    spec = build_spec("cpu", pd.DataFrame(rows), peaks="measured", stamp="test")
    m, x = tiny_modules("cpu")["BatchNorm1d"]
    # the case is a tight loop: estimated without the step's per-op cold cost (tests/predict/test_host_locality.py)
    tight = dataclasses.replace(spec, module_fixed_s={}, host={**dict(spec.host), "op_cold_s": 0.0})
    bare = perfcheck.estimate(m, x, system=tight)
    est = float(bare.loc[bare["module"] == ROOT, "pred_fwd_s"].iloc[0])
    assert 3 * US < est < 100 * US
    assert spec.module_fixed_s["BatchNorm1d"] == pytest.approx(100 * US - est)
    assert spec.module_fixed_s["Conv2d"] == 0.0 and "NoSuchLayer" not in spec.module_fixed_s
    assert "Linear" not in spec.module_fixed_s and set(tiny_modules("cpu")) == {"Conv1d", "Conv2d", "BatchNorm1d",
                                                                                 "BatchNorm2d", "EmbeddingBag"}
    assert "estimator's forward" in spec.sources["module_fixed_s"]


def test_op_efficiency_is_kept_and_applied_per_dtype():
    """A kernel's efficiency depends on its dtype (an H100's 3->6 channel conv measured 0.029 of its roofline in
    bf16, about twice that in fp32: bench/RESULTS.md, GPU visit 2): a bf16 measurement must not price an fp32
    run. Keys: the op's name for fp32, ``op@bf16`` for bf16; a dtype with no entry of its own takes fp32's."""
    from perfcheck.calibrate import fit
    from perfcheck.predict import roofline

    spec = dataclasses.replace(_spec("cpu"), op_efficiency={"addmm": 0.5, "addmm@bf16": 0.25})
    assert efficiency.op_efficiency(spec, "addmm", "fp32") == 0.5
    assert efficiency.op_efficiency(spec, "addmm", "tf32") == 0.5  # fp32 tensors
    assert efficiency.op_efficiency(spec, "addmm", "bf16") == 0.25
    assert efficiency.op_efficiency(spec, "addmm", "fp16") == 0.5  # none of its own: fp32's
    assert efficiency.op_efficiency(spec, "mm", "bf16") == 1.0
    # in the device time: the roofline part / efficiency (no launch term: kernels' launch set to 0)
    ops = pd.DataFrame({"name": ["addmm"], "macs_fwd": [1e9], "macs_bwd": [0.0], "other_fwd": [0.0], "other_bwd": [0.0],
                        "bytes_fwd": [0.0], "bytes_bwd": [0.0], "kernels_fwd": [1.0], "kernels_bwd": [0.0]})
    plain = dataclasses.replace(spec, op_efficiency={})
    for dtype, eff in (("fp32", 0.5), ("bf16", 0.25)):
        t = roofline.op_device_times(ops.copy(), spec, dtype, launch_s=0.0)["t_fwd"].iloc[0]
        roof = roofline.op_device_times(ops.copy(), plain, dtype, launch_s=0.0)["t_fwd"].iloc[0]
        assert t == pytest.approx(roof / eff)
    # the fit keys each measured row by its dtype: the same case timed 2x slower in bf16 than its fp32 twin's
    # roofline ratio gives a bf16 key of its own, and the fp32 key is the fp32 row's alone
    base = _spec("cpu")
    roof32, _ = roofline.op_time_s(2e6, 0.0, 1e5, 1.0, base, "fp32", launch_s=0.0)
    roof16, _ = roofline.op_time_s(2e6, 0.0, 1e5, 1.0, base, "bf16", launch_s=0.0)
    table = pd.DataFrame({"kind": ["opeff", "opeff"], "label": ["convolution", "convolution"], "dtype": ["fp32", "bf16"],
                          "flops": [2e6, 2e6], "bytes": [1e5, 1e5], "n": [0.0, 0.0],
                          "seconds": [4 * float(roof32), 8 * float(roof16)]})
    out = fit.build_spec(base, table, peaks="base", stamp="test")  # no dispatch rows: nothing subtracted
    assert out.op_efficiency["convolution"] == pytest.approx(0.25)
    assert out.op_efficiency["convolution@bf16"] == pytest.approx(0.125)

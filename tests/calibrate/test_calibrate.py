"""perfcheck calibrate: the spec arithmetic on hand-made measurements (both peak conventions), the
round trip through a system file, the estimator reading the calibrated curve back, a real quick
calibration through the CLI, and bad input naming its field."""
import math

import pandas as pd
import pytest
import torch

from perfcheck.calibrate.run import Timer, calibrate, copy_cases, launch_cases, matmul_cases, run_cases
from perfcheck.calibrate.fit import MEASUREMENT_COLUMNS, build_spec
from perfcheck.calibrate.cases import l2_cache_bytes
from perfcheck.commands.cli import main
from perfcheck.errors import UserError
from perfcheck.predict import roofline
from perfcheck.hardware.systems import load_system

STAMP = "measured by perfcheck calibrate on testhost (test CPU), 2026-01-01 00:00 UTC, torch 2.13.0"


def _row(kind, label, seconds, dtype="fp32", m=0, k=0, n=0, flops=0.0, nbytes=0.0, busbw=math.nan, world=1):
    return {"kind": kind, "label": label, "dtype": dtype, "m": m, "k": k, "n": n, "flops": flops, "bytes": nbytes,
            "world_size": world, "seconds": seconds, "seconds_min": seconds, "seconds_max": seconds, "repeats": 5,
            "iters": 1, "flops_per_s": flops / seconds if flops else math.nan,
            "bytes_per_s": nbytes / seconds if nbytes else math.nan, "busbw_bytes_per_s": busbw}


def _mm(n, rate, dtype="fp32", op_s=2e-6):
    flops = 2.0 * n ** 3
    return _row("matmul", f"mm {n}", flops / rate + op_s, dtype, n, n, n, flops, 3 * n * n * 4)


def _table():
    # Tiny op 2 us; autograd chain 3.5 us per kernel. fp32 matmuls: 50 GFLOP/s at n=64, 100 at n>=256
    # (after the 2 us op time is taken out); bf16 twice as fast at large sizes.
    rows = [_row("launch", "op", 2e-6), _row("launch", "autograd", 3.5e-6),
            _row("copy", "copy 1 MiB", 2 * 2 ** 20 / 80e9, nbytes=2 * 2 ** 20),
            _row("copy", "copy 256 MiB", 2 * 2 ** 28 / 20e9, nbytes=2 * 2 ** 28),
            _row("vector", "add", 2 ** 18 / 5e9 + 2e-6, m=2 ** 18, flops=2 ** 18, nbytes=3 * 4 * 2 ** 18),
            _mm(64, 50e9), _mm(256, 100e9), _mm(512, 100e9), _mm(1024, 100e9),
            _mm(256, 150e9, "bf16"), _mm(512, 200e9, "bf16"), _mm(1024, 200e9, "bf16"), _mm(2048, 200e9, "bf16"),
            _row("allreduce", "ar small", 1e-3, nbytes=4096, busbw=4096 / 1e-3, world=2),
            _row("allreduce", "ar big", 0.02, nbytes=16 * 2 ** 20, busbw=16 * 2 ** 20 / 0.02, world=2)]
    return pd.DataFrame(rows, columns=list(MEASUREMENT_COLUMNS))


def test_measured_peaks_by_hand():
    spec = build_spec("cpu", _table(), peaks="measured", stamp=STAMP, threads=1)
    assert spec.calibrated and spec.name == "cpu-calibrated"
    # Peaks are the best raw rates: 2*1024^3 / (2*1024^3/100e9 + 2e-6) just below 100 GFLOP/s.
    assert spec.matrix_flops_per_s["fp32"] == pytest.approx(2 * 1024 ** 3 / (2 * 1024 ** 3 / 100e9 + 2e-6))
    assert spec.matrix_flops_per_s["bf16"] == pytest.approx(2 * 2048 ** 3 / (2 * 2048 ** 3 / 200e9 + 2e-6))
    # Curve (fp32 is CPU's reference dtype): op time subtracted, then relative to the peak; n=64 at half.
    curve = dict(spec.matrix_efficiency_curve)
    assert list(curve) == [2.0 * 64 ** 3, 2.0 * 256 ** 3, 2.0 * 512 ** 3, 2.0 * 1024 ** 3]
    assert curve[2.0 * 64 ** 3] == pytest.approx(0.5, abs=1e-3)
    assert curve[2.0 * 1024 ** 3] == 1.0  # capped
    assert spec.efficiency["matrix"] == 1.0 and spec.efficiency["matrix_bf16"] == 1.0
    assert "matrix_fp32" not in spec.efficiency  # the reference dtype uses efficiency.matrix
    # Memory: the largest copy, read + write counted; vector: op time subtracted.
    assert spec.mem_bandwidth_bytes_per_s == pytest.approx(20e9) and spec.efficiency["memory"] == 1.0
    assert spec.vector_flops_per_s["fp32"] == pytest.approx(5e9)
    assert spec.launch_overhead_s == 3.5e-6
    assert spec.intra_node_bandwidth_bytes_per_s == pytest.approx(16 * 2 ** 20 / 0.02)  # largest all-reduce busbw
    assert spec.inter_node_bandwidth_bytes_per_s == load_system("cpu").inter_node_bandwidth_bytes_per_s
    for field in ("matrix_flops_per_s.fp32", "matrix_efficiency_curve", "mem_bandwidth_bytes_per_s",
                  "launch_overhead_s", "intra_node_bandwidth_bytes_per_s", "vector_flops_per_s.fp32"):
        assert spec.sources[field].startswith(STAMP), field
    assert spec.sources["inter_node_bandwidth_bytes_per_s"].startswith("from base spec 'cpu' (not measured)")
    assert "4 KiB" in spec.sources["intra_node_bandwidth_bytes_per_s"]  # busbw by size is kept


def test_base_peaks_on_a_gpu_spec():
    # H100 SXM datasheet: bf16 989.4e12, 3.35e12 B/s. Measured 791.5e12 (0.8) and 2.948e12 (0.88).
    h100 = load_system("h100-sxm")
    t = pd.DataFrame([_row("launch", "op", 0.0), _row("launch", "autograd", 6e-6),
                      _row("copy", "copy 2 GiB", 2 * 2 ** 31 / 2.948e12, nbytes=2 * 2 ** 31),
                      _mm(2048, 0.5 * 989.4e12, "bf16", 0), _mm(4096, 0.8 * 989.4e12, "bf16", 0),
                      _mm(8192, 0.8 * 989.4e12, "bf16", 0), _mm(16384, 0.8 * 989.4e12, "bf16", 0),
                      _mm(8192, 1.1 * 66.9e12, "fp32", 0)], columns=list(MEASUREMENT_COLUMNS))
    spec = build_spec(h100, t, peaks="base", stamp=STAMP, kind="gpu")
    assert spec.matrix_flops_per_s == h100.matrix_flops_per_s  # datasheet peaks kept
    assert spec.efficiency["matrix"] == pytest.approx(0.8)
    assert spec.efficiency["matrix_fp32"] == 1.0  # 1.1x the datasheet: capped
    assert spec.efficiency["matrix_fp8"] == 0.71  # not measured: the base's
    assert spec.efficiency["memory"] == pytest.approx(0.88)
    assert spec.mem_bandwidth_bytes_per_s == h100.mem_bandwidth_bytes_per_s
    assert dict(spec.matrix_efficiency_curve)[2.0 * 2048 ** 3] == pytest.approx(0.5)
    assert spec.efficiency["intra_node"] == h100.efficiency["intra_node"]  # no collectives measured


def test_estimator_reads_the_calibrated_curve_back(tmp_path):
    spec = build_spec("cpu", _table(), peaks="measured", stamp=STAMP)
    path = spec.save(tmp_path / "cal.json")
    loaded = load_system(str(path))
    assert loaded == spec and loaded.calibrated
    # A 256^3 fp32 matmul took 2 us of dispatch + its compute; the roofline gives back the compute.
    t = roofline.compute_time_s(2.0 * 256 ** 3, 0, loaded, "fp32")
    assert t == pytest.approx(2.0 * 256 ** 3 / 100e9, rel=1e-3)
    t64 = roofline.compute_time_s(2.0 * 64 ** 3, 0, loaded, "fp32")
    assert t64 == pytest.approx(2.0 * 64 ** 3 / 50e9, rel=1e-2)
    # and op_time adds the calibrated launch overhead per kernel
    assert roofline.op_time_s(2.0 * 256 ** 3, 0, 0, 1, loaded, "fp32")[0] == pytest.approx(t + 3.5e-6)


def test_cases_time_and_interleave():
    dev = torch.device("cpu")
    cases = launch_cases(dev, chain=4) + copy_cases((1,), dev) + matmul_cases("fp32", (32,), ((64, 32, 16),), dev)
    table = run_cases(cases, Timer(dev), repeats=2, target_s=1e-3)
    assert list(table.columns) == list(MEASUREMENT_COLUMNS)
    assert (table["seconds"] > 0).all() and (table["repeats"] == 2).all()
    assert table.loc[table["label"] == "linear 64x32x16", "flops"].item() == 2 * 64 * 32 * 16


def test_process_clock_leaves_out_sleep():
    """The process clock counts this process's CPU time only: a sleeping call costs ~nothing on it
    and its full length on the wall clock (what a shared host's other load does to a wall timer)."""
    import time

    dev = torch.device("cpu")
    nap = lambda: time.sleep(0.01)  # noqa: E731
    assert Timer(dev, "wall").loop(nap, 2) >= 0.009
    assert Timer(dev, "process").loop(nap, 2) < 0.005


@pytest.mark.slow  # a subprocess or a browser: > 3 s, full suite only
def test_quick_calibration_through_the_cli(tmp_path, capsys):
    out, csv = tmp_path / "mine.json", tmp_path / "m.csv"
    # process CPU time (one thread): the figures bounded below hold on a machine whose other cores are busy; on
    # the wall clock a 2-core machine with two busy loops fitted per-row prices to 0 (preemption noise)
    rc = main(["calibrate", "--quick", "--no-comm", "--dtypes", "fp32", "--threads", "1", "--clock", "process",
               "--output", str(out), "--csv", str(csv), "--name", "testbox"])
    assert rc == 0
    spec = load_system(str(out))
    assert spec.name == "testbox" and spec.calibrated and spec.kind == "cpu"
    assert spec.sources["matrix_flops_per_s.fp32"].startswith("measured by perfcheck calibrate on ")
    assert torch.__version__ in spec.sources["launch_overhead_s"]
    assert len(spec.matrix_efficiency_curve) >= 3 and 0 < spec.launch_overhead_s < 1e-3
    assert spec.matrix_flops_per_s["bf16"] == load_system("cpu").matrix_flops_per_s["bf16"]  # not measured
    captured = capsys.readouterr()
    assert "matrix fp32" in captured.out and "calibrate [" in captured.err
    # GEMMs and memory-bound ops after an L2 eviction, where sysfs gives L2
    cold = {"matmul_cold", "memory_cold"} if l2_cache_bytes() > 0 else set()
    assert set(pd.read_csv(csv)["kind"]) == {"launch", "host", "opfixed", "opcold", "modfixed", "oprows", "classfixed",
                                             "opeff", "oprate", "copy", "vector", "matmul", "matmul_wide",
                                             "matmul_narrow"} | cold
    # the elementwise ops' prices per FLOP (op_classes.element_rate_cases) and the wide-output GEMMs' factors
    # (a case that read nothing above its fixed costs on a busy machine sets no price, not a wrong one)
    assert spec.op_flop_s and all(0 < v < 1e-7 for v in spec.op_flop_s.values())
    assert set(spec.matrix_wide_curve) <= {"fwd", "bwd"} and spec.matrix_wide_curve
    assert all(0 < f <= 1 for points in spec.matrix_wide_curve.values() for _, f in points)
    if cold:
        assert len(spec.matrix_cold_curve) >= 3 and spec.calibration["l2_bytes"] == l2_cache_bytes()
        assert all(0 < f <= 1 for _, f in spec.matrix_cold_curve)
        assert len(spec.memory_cold_curve) >= 2 and all(0 < f <= 1 for _, f in spec.memory_cold_curve)
    assert 0 <= spec.host["op_cold_s"] < 1e-3  # the round-robin's excess per op: ~10 us on the project's VM
    assert "gemm_narrow_row_s" not in spec.host  # retired (bench/results/heldout.md)
    # the op-class cases' per-index and per-weight-element prices (op_classes.py); the row-wise ops' per-row terms
    # and the SIMD width are retired (bench/results/pruning.md)
    # (and EmbeddingBag max mode's per-scattered-element price: index_cases.embedding_bag_max_cases; the depthwise 5x5
    # weight gradient's price per sgemm call: op_classes.depthwise_call_cases, predict.gemm_calls)
    assert set(spec.op_row_s) == {"embedding", "_embedding_bag", "_embedding_bag_max", "convolution",
                                  "convolution_depthwise_large:gemm_call"}
    assert "simd_bytes" not in spec.to_json_dict() and "simd_bytes" not in spec.sources
    assert {"convolution_depthwise", "convolution_depthwise:bwd", "bernoulli_"} <= set(spec.op_efficiency)
    assert all(0 <= v < 1e-5 for phases in spec.op_row_s.values() for v in phases.values())  # ns, not tens of us
    # usable wherever a system is
    assert main(["systems", str(out)]) == 0
    assert "testbox (cpu, calibrated)" in capsys.readouterr().out


@pytest.mark.parametrize("kwargs, field", [
    (dict(mode="fast"), "mode"), (dict(peaks="datasheet"), "peaks"), (dict(world_size=1), "world_size"),
    (dict(threads=0), "threads"), (dict(dtypes=["int8"]), "dtype"), (dict(dtypes=["fp16"]), "fp16"),
    (dict(device="meta"), "device"), (dict(base="no-such-system"), "no-such-system"), (dict(clock="cpu"), "clock"),
])
def test_bad_input_names_the_field(kwargs, field):
    with pytest.raises(UserError, match=field):
        calibrate(**{"comm": False, **kwargs})


def test_bad_input_exits_2(tmp_path, capsys):
    assert main(["calibrate", "--quick", "--no-comm", "--base", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not exist" in err[0]
    with pytest.raises(UserError, match="measurements: missing column 'seconds'"):
        build_spec("cpu", _table().drop(columns=["seconds"]), peaks="measured", stamp=STAMP)


def test_collective_bad_input_needs_no_processes():
    from perfcheck.calibrate.collectives import bench_collectives

    with pytest.raises(UserError, match="kinds"):
        bench_collectives([1024], kinds=("all-to-nobody",))
    with pytest.raises(NotImplementedError, match="alltoall is not benchmarked"):
        bench_collectives([1024], kinds=("alltoall",))
    with pytest.raises(NotImplementedError, match="fp8"):
        calibrate("h100-sxm", device="cpu", dtypes=["fp8"], comm=False)
    with pytest.raises(UserError, match="sizes"):
        bench_collectives([0])


@pytest.mark.slow
def test_gloo_collectives_two_ranks():
    from perfcheck.calibrate.collectives import bench_collectives

    t = bench_collectives([4096, 1 << 20], kinds=("allreduce", "allgather", "reducescatter"), repeats=2, target_s=0.002)
    assert list(t["kind"]) == ["allreduce"] * 2 + ["allgather"] * 2 + ["reducescatter"] * 2
    assert (t["busbw_bytes_per_s"] > 0).all() and (t["world_size"] == 2).all()
    # nccl-tests: allreduce busbw = S/t * 2(n-1)/n = S/t for n = 2; allgather (n-1)/n = S/(2t)
    ar = t.iloc[1]
    assert ar["busbw_bytes_per_s"] == pytest.approx(ar["bytes"] / ar["seconds"])
    ag = t.iloc[3]
    assert ag["busbw_bytes_per_s"] == pytest.approx(ag["bytes"] / ag["seconds"] / 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_quick_gpu_calibration_keeps_datasheet_peaks(tmp_path):
    from perfcheck.calibrate.run import default_base

    base = load_system(default_base(torch.device("cuda")))
    res = calibrate(mode="quick", comm=False, dtypes=["bf16"])
    spec = res.spec
    assert spec.matrix_flops_per_s == base.matrix_flops_per_s and spec.calibrated and spec.kind == "gpu"
    assert 0.2 < spec.efficiency["matrix"] <= 1 and 0.3 < spec.efficiency["memory"] <= 1
    assert 1e-7 < spec.launch_overhead_s < 1e-3 and len(spec.matrix_efficiency_curve) >= 2
    assert load_system(str(spec.save(tmp_path / "gpu.json"))) == spec


def test_merge_measurements_takes_the_median_per_case():
    from perfcheck.calibrate.fit import merge_measurements

    t1, t2, t3 = _table(), _table(), _table()
    t2["seconds"] = t2["seconds"] * 2
    t3["seconds"] = t3["seconds"] * 3
    merged = merge_measurements([t1, t2, t3])
    assert list(merged.columns) == list(MEASUREMENT_COLUMNS) and len(merged) == len(t1)
    assert merged["seconds"].to_numpy() == pytest.approx(2 * t1["seconds"].to_numpy())
    assert (merged["repeats"] == 15).all()
    spec = build_spec("cpu", merged, peaks="measured", stamp=STAMP)
    assert spec.launch_overhead_s == pytest.approx(7e-6)


def test_cli_parser_spells_the_peak_conventions_of_the_library():
    from perfcheck.calibrate.run import PEAK_CONVENTIONS
    from perfcheck.commands import calibrate as command

    assert command.PEAK_CONVENTIONS == PEAK_CONVENTIONS


def test_building_the_cli_parser_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, perfcheck.commands.cli as c; c.build_parser(); assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bandwidth_curve_by_hand():
    """Copies of 1 MiB (80 GB/s) and 256 MiB (20 GB/s) with the 2 us tiny-op time taken out first:
    2 MiB moved in 2097152 / 80e9 s = 26.2144 us, less 2 us -> 2097152 / 24.2144e-6 = 86.608 GB/s;
    512 MiB moved in 26.8435 ms, less 2 us -> 20.0015 GB/s; factor 86.608 / 20.0015 = 4.3301."""
    spec = build_spec("cpu", _table(), peaks="measured", stamp=STAMP)
    small = 2 * 2 ** 20 / (2 * 2 ** 20 / 80e9 - 2e-6)
    big = 2 * 2 ** 28 / (2 * 2 ** 28 / 20e9 - 2e-6)
    assert spec.mem_bandwidth_curve[0][0] == 2 * 2 ** 20 and spec.mem_bandwidth_curve[1] == (2 * 2 ** 28, 1.0)
    assert spec.mem_bandwidth_curve[0][1] == pytest.approx(small / big, abs=1e-4)
    assert spec.mem_bandwidth_curve[0][1] == pytest.approx(4.3301, abs=1e-3)
    assert "copies of 1 MiB, 256 MiB" in spec.sources["mem_bandwidth_curve"]
    # a GPU calibration keeps no curve (its copy loop is timed on the device: see fit._memory)
    gpu = build_spec("h100-sxm", _table(), peaks="base", stamp=STAMP)
    assert gpu.mem_bandwidth_curve == ()
    # one copy size: no curve
    one = _table()[lambda t: t["label"] != "copy 1 MiB"]
    assert build_spec("cpu", one, peaks="measured", stamp=STAMP).mem_bandwidth_curve == ()


def test_optimizer_cases_time_step_and_zero_grad():
    """The host model predicts step() + zero_grad(set_to_none=True) (host.optimizer_time): the optimizer
    cases run both, with the gradients put back before each call, so every call really steps."""
    from perfcheck.calibrate.cases import host_cases

    cases = {c.label: c for c in host_cases(torch.device("cpu"))}
    case = cases["optim sgd x2"]
    opt = case.fn.__closure__  # the case's closure holds the optimizer and its parameters
    params = next(c.cell_contents for c in opt if isinstance(c.cell_contents, list)
                  and all(isinstance(p, torch.nn.Parameter) for p in c.cell_contents))
    calls = []
    optimizer = next(c.cell_contents for c in opt if isinstance(c.cell_contents, torch.optim.Optimizer))
    optimizer.register_step_post_hook(lambda o, a, k: calls.append([p.grad is not None for p in params]))
    case.fn()
    case.fn()
    assert calls == [[True, True], [True, True]]  # gradients present at each step
    assert all(p.grad is None for p in params)  # and zero_grad(set_to_none=True) ran after it


def test_a_filler_between_calls_is_not_timed():
    """Case.between runs before each timed call and outside the timing: a planted 5 ms spin between
    ~free calls leaves the per-call time far under it (process clock: the spin is CPU time)."""
    import time

    def spin():
        t0 = time.process_time()
        while time.process_time() - t0 < 5e-3:
            pass
    dev = torch.device("cpu")
    timer = Timer(dev, "process")
    assert timer.loop(lambda: None, 3, between=spin) < 1e-3
    assert timer.loop(spin, 3) >= 4.5e-3  # the same spin, timed, shows up


def test_once_per_step_host_cases_run_cold_and_as_a_cpu_user_gets_the_optimizer():
    """The optimizer and loss.backward() chains run a filler before each call (a step runs them after
    other code); per-op cases do not. The CPU for-loop optimizer case is torch's default (foreach=None)."""
    from perfcheck.calibrate.cases import host_cases

    cases = {c.label: c for c in host_cases(torch.device("cpu"))}
    assert cases["optim sgd x2"].between is not None and cases["forward+backward x8"].between is not None
    assert cases["autograd forward x32"].between is None and cases["module call"].between is None

    def optimizer(case):
        return next(c.cell_contents for c in case.fn.__closure__ if isinstance(c.cell_contents, torch.optim.Optimizer))
    assert optimizer(cases["optim sgd x2"]).defaults["foreach"] is None
    assert optimizer(cases["optim sgd_foreach x2"]).defaults["foreach"] is True


def test_small_gemm_efficiency_takes_out_mm_fixed_cost_on_a_cpu():
    """The curve's small squares are priced as the estimator prices them on a CPU: dispatch + op_fixed_s["mm"] +
    FLOPs / (peak x eff). Squares of 32 and 64 run at 10 and 50 GFLOP/s after 2 us of dispatch and 3 us of mm
    fixed cost (the opfixed "mm" case: 2 + 3 = 5 us), 1024 at 100 GFLOP/s: efficiencies 0.1, 0.5, 1."""
    rows = [_row("launch", "op", 2e-6), _row("opfixed", "mm", 5e-6)]
    for n, rate in ((32, 10e9), (64, 50e9), (1024, 100e9)):
        flops = 2.0 * n ** 3
        rows.append(_row("matmul", f"mm {n}", flops / rate + 5e-6, "fp32", n, n, n, flops, 3 * n * n * 4))
    spec = build_spec("cpu", pd.DataFrame(rows, columns=list(MEASUREMENT_COLUMNS)), peaks="measured", stamp=STAMP)
    curve = dict(spec.matrix_efficiency_curve)
    assert curve[2.0 * 32 ** 3] == pytest.approx(0.1, abs=1e-3) and curve[2.0 * 64 ** 3] == pytest.approx(0.5, abs=1e-3)
    assert "mm's fixed cost (3.00 us" in spec.sources["matrix_efficiency_curve"]
    # the estimator then gives a 32^3 mm back its measured time: 2 + 3 + 65536 / (1e11 x 0.1) us = 11.55 us
    peak = spec.matrix_flops_per_s["fp32"]
    t = roofline.compute_time_s(2.0 * 32 ** 3, 0, spec, "fp32") + 5e-6
    assert t == pytest.approx(2.0 * 32 ** 3 / (peak * 0.1) + 5e-6, rel=1e-3)
    assert t == pytest.approx(2.0 * 32 ** 3 / 10e9 + 5e-6, rel=2e-3)  # peak is the 1024 square's raw rate (~100 GFLOP/s)
    # a GPU's loop is timed on the device: only the tiny-op time comes out there, as before
    gpu = build_spec("h100-sxm", pd.DataFrame(rows, columns=list(MEASUREMENT_COLUMNS)), peaks="measured", stamp=STAMP)
    assert dict(gpu.matrix_efficiency_curve)[2.0 * 32 ** 3] < 0.1


def test_a_matmul_case_read_at_the_floor_is_left_out_not_an_infinite_peak():
    """A busy machine can push a small GEMM's reading against the tiny-op reference to 0 s (``anchored``'s floor):
    the peak is the best of the cases that read a time (the n=1024 one, by hand), the curve leaves the zero row out;
    every matmul at the floor: a one-line error naming the calibration."""
    t = _table()
    t.loc[t["label"] == "mm 64", "seconds"] = 0.0
    spec = build_spec("cpu", t, peaks="measured", stamp=STAMP, threads=1)
    assert spec.matrix_flops_per_s["fp32"] == pytest.approx(2 * 1024 ** 3 / (2 * 1024 ** 3 / 100e9 + 2e-6))
    assert 2.0 * 64 ** 3 not in dict(spec.matrix_efficiency_curve)
    t.loc[(t["kind"] == "matmul") & (t["dtype"] == "fp32"), "seconds"] = 0.0
    with pytest.raises(UserError, match="calibration: no fp32 matmul case") as err:
        build_spec("cpu", t, peaks="measured", stamp=STAMP, threads=1)
    assert len(str(err.value).splitlines()) == 1

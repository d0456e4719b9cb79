"""perfcheck whatif: a run predicted on another system by each module's bound. Two synthetic system
files with known ratios (B has 2x A's compute, 4x its bandwidth, the same launch overhead), a
hand-built run directory whose arithmetic is checked term by term, and a real CPU run measured by
PerfCheck and estimated on A."""
import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

import perfcheck
from perfcheck.predict.for_run import save_predicted
import perfcheck.rundir as runs
from perfcheck.commands.cli import main
from perfcheck.errors import UserError
from perfcheck.rundir import MODULE_STEP_COLUMNS
from perfcheck.schema import (KERNEL_COLUMNS, MEASURED_COLUMNS, PREDICTED_COLUMNS, ROOT, SAMPLE_COLUMNS,
                              SCHEMA_VERSION, STEP_COLUMNS)
from perfcheck.hardware.systems import load_system
from perfcheck.predict.whatif import WHATIF_COLUMNS, speedups, whatif


def _systems(tmp_path, launch=1e-8):
    """A: 100 GFLOP/s matrix, 10 GFLOP/s vector, 10 GB/s (efficiency 0.5, no curve), ``launch`` s per kernel.
    B: 2x, 2x, 4x, the same launch overhead."""
    cpu = load_system("cpu")
    eff = {k: 0.5 for k in ("matrix", "vector", "memory", "intra_node", "inter_node")}
    a = dataclasses.replace(cpu, name="sys-a", matrix_flops_per_s={"fp32": 1e11}, vector_flops_per_s={"fp32": 1e10},
                            mem_bandwidth_bytes_per_s=1e10, launch_overhead_s=launch, efficiency=eff, calibrated=True,
                            intra_node_bandwidth_bytes_per_s=1e9, sources={})
    b = dataclasses.replace(a, name="sys-b", matrix_flops_per_s={"fp32": 2e11, "bf16": 8e11},
                            vector_flops_per_s={"fp32": 2e10, "bf16": 2e10}, mem_bandwidth_bytes_per_s=4e10,
                            calibrated=False)
    return str(a.save(tmp_path / "a.json")), str(b.save(tmp_path / "b.json"))


def test_speedup_by_bound_by_hand(tmp_path):
    a, b = _systems(tmp_path)
    s = speedups(a, b, ["compute", "compute", "memory", "overhead", "unknown"], matrix=[True, False, True, True, True])
    assert list(s) == [2.0, 2.0, 4.0, 1.0, 1.0]
    # bf16 on B against fp32 on A: 8e11 * 0.5 / (1e11 * 0.5)
    assert speedups(a, b, ["compute"], target_dtype="bf16")[0] == pytest.approx(8.0)
    with pytest.raises(UserError, match="bound: unknown value 'disk'"):
        speedups(a, b, ["disk"])


# ------------------------------------------------------------------------ a hand-built run
# path, type, measured fwd s, bwd s; predicted macs, bytes, fwd s, bwd s on A (launch 10 us per kernel):
#   mm:   2*3e8 FLOPs / (1e11 * 0.5) = 12 ms forward, twice that backward: compute-bound
#   act:  1e6 bytes / (1e10 * 0.5) = 0.2 ms forward, 2e6 bytes 0.4 ms backward: memory-bound
#   tiny: 1e3 bytes (0.2 us) and 100 kernels (1 ms): launch-bound
MODS = [
    (ROOT, "Net", 0.010, 0.020, None),
    ("mm", "Linear", 0.006, 0.012, (3e8, 0.0, 12e-3, 24e-3)),
    ("act", "GELU", 0.002, 0.004, (0.0, 1e6, 0.2e-3, 0.4e-3)),
    ("tiny", "Linear", 0.001, 0.002, (10.0, 1e3, 1e-3, 1e-3)),
]


def _write_run(d, modules=MODS, steps=3):
    rd = d / "rank0"
    mrows = []
    for path, typ, f, b, _ in modules:
        mrows.append({"module": path, "type": typ, "depth": 0 if path == ROOT else 1, "calls": 1, "steps": steps,
                      "rank": 0, **{f"fwd_s_{s}": f for s in ("median", "mean", "min", "max")},
                      **{f"bwd_s_{s}": b for s in ("median", "mean", "min", "max")},
                      **{f"recompute_s_{s}": 0.0 for s in ("median", "mean", "min", "max")},
                      "act_mem_bytes": np.nan, "peak_mem_bytes": np.nan, "flops_fwd_counted": np.nan,
                      "flops_bwd_counted": np.nan, "fwd_flops_per_s": np.nan, "bwd_flops_per_s": np.nan})
    srows = [{"step": i, "measured": True, "fwd_s": 0.010, "bwd_s": 0.020, "optim_s": 0.004, "bwd_finalize_s": 0.0,
              "step_s": 0.040, "recompute_s": 0.0, "peak_mem_bytes": np.nan, "role": "measured", "failed": False, "rank": 0}
             for i in range(steps)]
    runs.atomic_write_csv(rd / "modules.csv", pd.DataFrame(mrows), MEASURED_COLUMNS)
    runs.atomic_write_csv(rd / "steps.csv", pd.DataFrame(srows), STEP_COLUMNS)
    for name, cols in (("module_steps.csv", MODULE_STEP_COLUMNS), ("kernels.csv", KERNEL_COLUMNS),
                       ("samples.csv", SAMPLE_COLUMNS)):
        runs.atomic_write_csv(rd / name, pd.DataFrame(columns=list(cols)), cols)
    runs.atomic_write_json(rd / "meta.json", {"schema_version": SCHEMA_VERSION, "complete": True, "files": [],
                                              "rank": 0, "world_size": 1, "dtype": "float32",
                                              "device": {"type": "cpu"}})
    prows = []
    for path, typ, _, _, work in modules:
        macs, nbytes, tf, tb = work or (0.0, 0.0, 0.0, 0.0)
        row = {c: 0.0 for c in PREDICTED_COLUMNS}
        bound = {"mm": "compute", "act": "memory", "tiny": "overhead"}.get(path, "compute")
        row.update(module=path, type=typ, depth=0 if path == ROOT else 1, calls=1, macs_fwd=macs, macs_bwd=2 * macs,
                   flops_fwd=2 * macs, flops_bwd=4 * macs, bytes_fwd=nbytes, bytes_bwd=2 * nbytes, pred_fwd_s=tf,
                   pred_bwd_s=tb, bound_fwd=bound, bound_bwd=bound, comm_kind="", source="modeled")
        prows.append(row)
    pred = pd.DataFrame(prows)
    child = pred[pred["module"] != ROOT]  # the root's totals are its children's: its own part is empty
    for c in ("macs_fwd", "macs_bwd", "flops_fwd", "flops_bwd", "bytes_fwd", "bytes_bwd", "pred_fwd_s", "pred_bwd_s"):
        pred.loc[pred["module"] == ROOT, c] = child[c].sum()
    save_predicted(d, pred)  # the run directory's one writer of predicted.csv/json
    return d


def test_hand_built_run(tmp_path):
    a, b = _systems(tmp_path, launch=1e-5)
    run_dir = _write_run(tmp_path / "run")
    f = whatif(run_dir, b, source=a).set_index("module")
    assert list(f.reset_index().columns) == list(WHATIF_COLUMNS)
    # compute-bound 2x, memory-bound 4x, launch-bound unchanged
    assert f.loc["mm", "speedup_fwd"] == pytest.approx(2.0) and f.loc["mm", "speedup_bwd"] == pytest.approx(2.0)
    assert f.loc["act", "speedup"] == pytest.approx(4.0)
    # tiny: 0.2 us of memory + 1 ms of launches on A; 0.05 us + 1 ms on B
    assert f.loc["tiny", "speedup_fwd"] == pytest.approx((0.2e-6 + 1e-3) / (0.05e-6 + 1e-3))
    assert list(f.loc[["mm", "act", "tiny"], "bound_fwd"]) == ["compute", "memory", "overhead"]
    assert list(f.loc[["mm", "act", "tiny"], "target_bound_fwd"]) == ["compute", "memory", "overhead"]
    # the root's own 1 ms forward (10 - 6 - 2 - 1) has no predicted work: host time, kept
    assert f.loc[ROOT, "bound_fwd"] == "host"
    tiny_f = 0.001 / f.loc["tiny", "speedup_fwd"]
    assert f.loc[ROOT, "pred_fwd_s"] == pytest.approx(0.006 / 2 + 0.002 / 4 + tiny_f + 0.001)
    st = f.attrs["step"]
    assert st["measured_s"] == pytest.approx({"fwd": 0.010, "bwd": 0.020, "recompute": 0.0, "optim": 0.004,
                                              "other": 0.006})
    assert st["predicted_s"]["fwd"] == pytest.approx(f.loc[ROOT, "pred_fwd_s"])
    assert st["predicted_s"]["optim"] == pytest.approx(0.001)  # memory-bound: 4x
    assert st["predicted_s"]["other"] == pytest.approx(0.006)  # host time kept
    assert f.attrs["source"] == "sys-a (calibrated)" and f.attrs["target"] == "sys-b (datasheet)"
    assert f.attrs["ratios"]["matrix"] == pytest.approx(2.0) and f.attrs["ratios"]["memory"] == pytest.approx(4.0)


def test_bound_changes_on_the_target(tmp_path):
    """A GPU-like B: 1000x A's compute and bandwidth but 5 us per launch (A: 10 us). mm (12 ms of compute
    on A, no launches) becomes launch-bound once its one kernel per call is counted."""
    a, _ = _systems(tmp_path, launch=1e-5)
    fast = dataclasses.replace(load_system(a), name="sys-fast", matrix_flops_per_s={"fp32": 1e14},
                               vector_flops_per_s={"fp32": 1e13}, mem_bandwidth_bytes_per_s=1e13,
                               launch_overhead_s=5e-6, calibrated=False)
    b = str(fast.save(tmp_path / "fast.json"))
    run_dir = _write_run(tmp_path / "run")
    pred = pd.read_csv(run_dir / "predicted.csv")
    pred["kernels_fwd"], pred["kernels_bwd"] = [3.0, 1.0, 1.0, 1.0], [6.0, 2.0, 2.0, 2.0]
    f = whatif(run_dir, b, source=a, predicted=pred).set_index("module")
    # A: 12 ms + 10 us; B: 12 us of compute + 5 us of launch
    assert f.loc["mm", "speedup_fwd"] == pytest.approx((12e-3 + 1e-5) / (12e-6 + 5e-6))
    assert f.loc["mm", "target_bound_fwd"] == "compute" and f.loc["act", "target_bound_fwd"] == "overhead"
    # act: 0.2 ms + 10 us on A -> 0.2 us + 5 us on B
    assert f.loc["act", "speedup_fwd"] == pytest.approx((0.2e-3 + 1e-5) / (0.2e-6 + 5e-6))
    assert f.loc["act", "speedup_fwd"] < 1000 / 10  # far from the 1000x bandwidth ratio: B's launch floor


def test_cli_and_bad_input(tmp_path, capsys):
    a, b = _systems(tmp_path)
    run_dir = _write_run(tmp_path / "run")
    assert main(["whatif", str(run_dir), "--system", b, "--from", a]) == 0
    out = capsys.readouterr().out
    assert "from sys-a (calibrated) fp32" in out and "step" in out and "2x" in out and "4x" in out
    assert main(["whatif", str(run_dir), "--system", b, "--from", a, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["step"]["speedup"] > 1 and len(doc["modules"]) == 4
    (run_dir / "predicted.csv").unlink()
    assert main(["whatif", str(run_dir), "--system", b, "--from", a]) == 2
    assert "predicted:" in capsys.readouterr().err
    with pytest.raises(UserError, match="rank: 3"):
        whatif(_write_run(tmp_path / "run2"), b, source=a, rank=3)
    with pytest.raises(UserError, match="predicted: missing column 'macs_fwd'"):
        whatif(tmp_path / "run2", b, source=a, predicted=pd.DataFrame({"module": [ROOT]}))
    with pytest.raises(UserError, match="no matrix peak for dtype 'fp8'"):
        whatif(tmp_path / "run2", b, source=a, target_dtype="fp8")


# ------------------------------------------------------------------------ a real CPU run
def test_cpu_run_across_two_systems(tmp_path):
    a, b = _systems(tmp_path)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
    x = torch.randn(128, 256)
    pc = perfcheck.PerfCheck(model, warmup=1, steps=2, profile=False, sample_interval=None, out_dir=tmp_path / "run",
                             system=a)  # the run saves its prediction on A
    with pc:
        while not pc.done:
            model(x).square().mean().backward()
            pc.step()
    pred = perfcheck.estimate(model, (x,), system=a)
    assert (tmp_path / "run" / "rank0" / "predicted.csv").exists()
    f = whatif(tmp_path / "run", b, source=a).set_index("module")
    expected = {"compute": 2.0, "memory": 4.0}
    leaves = ["0", "1", "2"]
    for m in leaves:
        for phase in ("fwd", "bwd"):
            bound = pred.set_index("module").loc[m, f"bound_{phase}"]
            assert f.loc[m, f"bound_{phase}"] == bound
            assert f.loc[m, f"speedup_{phase}"] == pytest.approx(expected[bound], rel=0.02), (m, phase, bound)
    assert pred.set_index("module").loc["0", "bound_fwd"] == "compute"  # 2*128*256*512 FLOPs at 50 GFLOP/s
    # the root adds its children's scaled times and its own (unscaled: no predicted work of its own)
    own = f.loc[ROOT, "meas_fwd_s"] - f.loc[leaves, "meas_fwd_s"].sum()
    assert f.loc[ROOT, "pred_fwd_s"] == pytest.approx(f.loc[leaves, "pred_fwd_s"].sum() + max(own, 0.0))
    assert 1.0 <= f.loc[ROOT, "speedup"] <= 4.0


def test_run_command_output_needs_no_predicted_file(tmp_path, capsys):
    """`perfcheck run --model jsc` saves its prediction on the cpu spec; asked to scale from A,
    whatif re-estimates the built-in example on A itself."""
    a, b = _systems(tmp_path)
    out = tmp_path / "jsc"
    assert main(["run", "--model", "jsc", "--steps", "2", "--warmup", "1", "--no-profile", "--no-flops",
                 "--overhead-pairs", "0", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["whatif", str(out), "--system", b, "--from", a, "--depth", "1"]) == 0
    text = capsys.readouterr().out
    assert "bounds from: estimated now on sys-a (built-in example JSC_Tiny)" in text
    f = whatif(out, b, source=a).set_index("module")
    assert set(f["bound_fwd"]) <= {"compute", "memory", "overhead", "host"} and (f["pred_fwd_s"] > 0).all()

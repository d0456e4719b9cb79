"""Benchmark: load, reconcile and render a 1,000-module run directory in every format (target: < 2 s).

    python bench/bench_report.py [--modules 1000] [--ranks 1] [--repeat 3] [--cli]

Builds a synthetic run directory from the schema (a tree of blocks, 5 kernels per leaf and phase,
20 measured steps, 200 samples, predicted.csv beside it), then times, in one process with the
imports already done: ``runs.load_run`` + ``reconcile`` + table + csv + json + html. ``--cli`` also
times ``perfcheck report`` end to end in a fresh interpreter per format (imports included).
Prints one line per stage (median of ``--repeat`` runs) and the total.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd


def _tree(n_modules: int):
    """Paths and types of a model with ~n_modules modules: root -> blocks -> (attn(q,k,v,o), mlp(fc1,act,fc2), ln1, ln2, drop)."""
    paths, types = ["(root)", "blocks"], ["Model", "ModuleList"]
    per_block = ["", ".ln1", ".attn", ".attn.q", ".attn.k", ".attn.v", ".attn.o", ".ln2", ".mlp", ".mlp.fc1",
                 ".mlp.act", ".mlp.fc2", ".drop"]
    kinds = ["Block", "LayerNorm", "Attention", "Linear", "Linear", "Linear", "Linear", "LayerNorm", "MLP", "Linear",
             "GELU", "Linear", "Dropout"]
    b = 0
    while len(paths) + len(per_block) <= n_modules:
        for suffix, kind in zip(per_block, kinds):
            paths.append(f"blocks.{b}{suffix}")
            types.append(kind)
        b += 1
    while len(paths) < n_modules:
        paths.append(f"extra{len(paths)}")
        types.append("Identity")
    return paths, types


def make_run_dir(path, n_modules: int = 1000, ranks: int = 1, seed: int = 0) -> Path:
    """A complete run directory (schema v1) with predicted.csv, for n_modules modules and `ranks` ranks."""
    import perfcheck.rundir as runs
    from perfcheck.predict.for_run import save_predicted
    from perfcheck.schema import KERNEL_COLUMNS, PREDICTED_COLUMNS, SCHEMA_VERSION, module_depth

    rng = np.random.default_rng(seed)
    paths, types = _tree(n_modules)
    n = len(paths)
    depth = np.array([module_depth(p) for p in paths])
    leaf = np.array([p not in ("(root)", "blocks") and not any(q.startswith(p + ".") for q in paths[i + 1:i + 14])
                     for i, p in enumerate(paths)])
    flops = np.where(leaf, rng.uniform(1e6, 1e9, n), 0.0)
    pred_f = np.where(leaf, rng.uniform(5e-6, 5e-4, n), 0.0)
    # containers: sum of their leaves (root = everything)
    index = {p: i for i, p in enumerate(paths)}
    for arr in (flops, pred_f):
        own = arr.copy()
        for i, p in enumerate(paths):
            if leaf[i]:
                q = p
                while "." in q:
                    q = q.rsplit(".", 1)[0]
                    arr[index[q]] += own[i]
                arr[0] += own[i]
    pred = pd.DataFrame({"module": paths, "type": types, "depth": depth, "calls": 1, "params": (flops / 1e3).astype(int),
                         "macs_fwd": flops / 2, "macs_bwd": flops, "flops_fwd": flops, "flops_bwd": 2 * flops,
                         "bytes_fwd": flops / 4, "bytes_bwd": flops / 2, "act_mem": flops / 8, "comm_fwd_bytes": 0.0,
                         "comm_bwd_bytes": 0.0, "comm_kind": "", "pred_fwd_s": pred_f, "pred_bwd_s": 2 * pred_f,
                         "bound_fwd": rng.choice(["compute", "memory", "overhead"], n),
                         "bound_bwd": rng.choice(["compute", "memory", "overhead"], n), "source": "modeled",
                         "unmodeled_ops": ""})[list(PREDICTED_COLUMNS) + ["unmodeled_ops"]]
    out = Path(path)
    n_steps = 20
    for r in range(ranks):
        d = runs.rank_dir(out, r)
        slow = 1.0 + 0.3 * (r == ranks - 1)  # the last rank is a straggler
        g = rng.uniform(0.5, 4.0, n) * slow
        meas = pd.DataFrame({"module": paths, "type": types, "depth": depth, "calls": 1.0, "steps": n_steps, "rank": r})
        for ph, base in (("fwd", pred_f), ("bwd", 2 * pred_f)):
            med = base * g
            meas[f"{ph}_s_median"], meas[f"{ph}_s_mean"] = med, med * 1.01
            meas[f"{ph}_s_min"], meas[f"{ph}_s_max"] = med * 0.9, med * 1.3
        for s in ("median", "mean", "min", "max"):
            meas[f"recompute_s_{s}"] = 0.0
        for c in ("act_mem_bytes", "peak_mem_bytes", "flops_fwd_counted", "flops_bwd_counted", "fwd_flops_per_s",
                  "bwd_flops_per_s"):
            meas[c] = np.nan
        root_f, root_b = meas.loc[0, "fwd_s_median"], meas.loc[0, "bwd_s_median"]
        steps = pd.DataFrame({"step": np.arange(n_steps), "measured": True, "fwd_s": root_f * rng.uniform(0.95, 1.05, n_steps),
                              "bwd_s": root_b * rng.uniform(0.95, 1.05, n_steps), "optim_s": 0.1 * root_f,
                              "recompute_s": 0.0, "peak_mem_bytes": np.nan, "role": "measured", "failed": False, "rank": r})
        steps["step_s"] = steps["fwd_s"] + steps["bwd_s"] + steps["optim_s"] + 0.05 * root_f
        leaves = [p for p, lf in zip(paths, leaf) if lf]
        names = ["gemm_kernel", "elementwise_kernel", "reduce_kernel", "index_select_kernel", "nccl_allreduce"]
        krows = [(p, ph, nm, "cuda", 1, t, t, r) for p in leaves for ph in ("fwd", "bwd") for nm in names
                 for t in [float(rng.uniform(1e-6, 1e-4))]]
        kernels = pd.DataFrame(krows, columns=list(KERNEL_COLUMNS))
        t = np.arange(200) * 0.1
        samples = pd.DataFrame({"time_s": t, "step": (t // 0.5).astype(int), "gpu_util": rng.uniform(0.3, 1.0, 200),
                                "mem_used_bytes": 4e9 + 1e8 * np.sin(t), "mem_total_bytes": 80e9, "power_w": 300.0,
                                "sm_clock_hz": 1.98e9, "temperature_c": 60.0, "cpu_util": 1.0, "rss_bytes": 3e9, "rank": r})
        for key, frame in (("modules", meas), ("steps", steps), ("kernels", kernels), ("samples", samples),
                           ("module_steps", pd.DataFrame(columns=list(runs.MODULE_STEP_COLUMNS)))):
            fname, cols = runs.TABLES[key]
            runs.atomic_write_csv(d / fname, frame, cols)
        meta = {"schema_version": SCHEMA_VERSION, "complete": True, "rank": r, "world_size": ranks, "dtype": "bfloat16",
                "files": [f for f, _ in runs.TABLES.values()], "device": {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"},
                "model": {"type": "Model", "params": int(pred["params"][0])}, "profile": {"steps": [3]}}
        runs.atomic_write_json(d / runs.META, meta)
    save_predicted(out, pred, system="h100-sxm", dtype="bf16")
    return out


def _time(fn, repeat):
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modules", type=int, default=1000)
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cli", action="store_true", help="also time `perfcheck report` in a fresh interpreter per format")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    import matplotlib.backends.backend_agg  # noqa: F401  (imported by the first figure otherwise)
    import matplotlib.figure  # noqa: F401

    from perfcheck.commands import report as cmd
    from perfcheck.report import html, tables, text  # noqa: F401
    t_import = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = make_run_dir(Path(tmp) / "run", args.modules, args.ranks)
        stages = {}
        stages["load + reconcile"], result = _time(lambda: cmd.build(run_dir), args.repeat)
        for fmt in ("table", "csv", "json", "html"):
            stages[f"render {fmt}"], text = _time(lambda: cmd.render(result, fmt), args.repeat)
            (Path(tmp) / f"out.{fmt}").write_text(text)
        total = sum(stages.values())
        rec, run = result.table, result.run
        print(f"modules: {rec['module'].nunique()}, ranks: {rec['rank'].nunique()}, rows: {len(rec)}, "
              f"kernel rows: {len(run.kernels)}")
        print(f"imports (perfcheck report + matplotlib): {t_import:.3f} s")
        for k, v in stages.items():
            print(f"{k:<18} {v:.3f} s")
        print(f"{'total (in-process)':<18} {total:.3f} s  (median of {args.repeat} per stage)")
        if args.cli:
            for fmt in ("table", "csv", "json", "html"):
                t1 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "perfcheck", "report", str(run_dir), "--format", fmt, "--output",
                                str(Path(tmp) / f"cli.{fmt}")], check=True, capture_output=True)
                print(f"cli {fmt:<6} {time.perf_counter() - t1:.3f} s (fresh interpreter, imports included)")
    return json.dumps({k: round(v, 4) for k, v in stages.items()})


if __name__ == "__main__":
    main()

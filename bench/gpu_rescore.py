"""Re-score a recorded GPU accuracy run on the CPU: the measured per-module and step times of a
``bench/gpu_results/<visit>/`` folder (written by bench/accuracy.py on the GPU) against predictions
recomputed here, with the current code and that visit's ``calibrated.json`` as the system.

Why: a GPU is lent rarely and briefly; a change to the cost model (host terms, kernel curves) can be
judged against the last visit's measurements without one. The prediction is a fake-tensor estimate, so
it needs no GPU: each workload is rebuilt at its GPU sizes (bench/accuracy.py ``build(gpu_sizes=True)``)
on the CPU, in the run's dtype (bf16), and estimated exactly as bench/accuracy.py ``compare`` does
(``perfcheck.estimate`` + the loss as a one-module model + SGD's step). The measured columns are the
recorded ones, untouched. Output: the same ``STEP`` and ``CLASS`` lines as bench/accuracy.py, and with
``--check`` the largest relative difference between the recorded and recomputed predictions (with the
code the visit ran, it should be ~0: that shows the re-score is faithful).

    python bench/gpu_rescore.py bench/gpu_results/2026-11-26-h100            # STEP / CLASS lines
    python bench/gpu_rescore.py bench/gpu_results/2026-11-26-h100 --check    # + recorded vs recomputed
    ... --csv rescored.csv   (every row with the recomputed predictions)

Limits: only what the prediction reads is rebuilt (shapes, dtype, the system file); torch's version
on this machine may decompose a few ops differently from the GPU machine's (the --check line says by
how much). This is a re-score of recorded measurements, not a new GPU measurement.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import perfcheck  # noqa: E402
from perfcheck.hardware.systems import load_system  # noqa: E402
import accuracy  # noqa: E402  (bench/accuracy.py: build, _step_s, gpt_class_lines, step_lines)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PRED = ["pred_fwd_s", "pred_bwd_s"]


def predict(w, spec) -> pd.DataFrame:
    """module -> (pred_fwd_s, pred_bwd_s), with the "(step)" row as bench/accuracy.py ``compare`` builds it."""
    pred = perfcheck.estimate(w.model, w.inputs, system=spec, optimizer="sgd")
    step = accuracy._step_s(w, spec)
    rows = pred[["module", *PRED]].copy()
    rows.loc[len(rows)] = {"module": "(step)", "pred_fwd_s": step, "pred_bwd_s": 0.0}
    return rows.set_index("module")


def _gpt_batch(csv: Path) -> int:
    """The GPT batch of a run: from its .md's workload line ("GPT-2 small (124 M), batch 32"), else 8."""
    md = Path(str(csv).replace(".csv.gz", ".md").replace(".csv", ".md"))
    if md.exists():
        m = re.search(r"GPT-2 small \(124 M\), batch (\d+)", md.read_text())
        if m:
            return int(m.group(1))
    return 32 if "b32" in csv.name else 8


def refit(folder: Path, base: str = "h100-sxm", standin: bool = False):
    """The visit's calibrated spec fitted again from its recorded cases (calibration.csv[.gz]) with the current
    fit code, as ``perfcheck calibrate`` builds it on CUDA (peaks "base", then the GPU kernel-class curves):
    a change to how cases are fitted is judged offline; cases the visit did not run keep the base's values."""
    from perfcheck.calibrate import gpu_ops
    from perfcheck.calibrate.fit import build_spec

    csv = next((p for p in (folder / "calibration.csv.gz", folder / "calibration.csv") if p.exists()), None)
    if csv is None:
        raise SystemExit(f"--refit: {folder} has no calibration.csv[.gz]")
    table = pd.read_csv(csv, keep_default_na=False, na_values=[""])
    table["dtype"] = table["dtype"].astype(str)
    if standin and not ((table["kind"] == "opfixed") & (table["dtype"] == "bf16")).any():
        table = bf16_standin(folder, table)
    old = load_system(str(folder / "calibrated.json"))
    spec = build_spec(base, table, peaks="base", stamp=f"re-fitted offline from {folder.name}", name=old.name,
                      kind="gpu", mem_capacity_bytes=old.mem_capacity_bytes)
    return gpu_ops.apply(spec, table, f"re-fitted offline from {folder.name}")


#: aten op family of the calibration's op_fixed cases -> the LeNet op of scripts/gpu_phases.py --ops that stands
#: in for it (``bf16_standin``): GEMMs -> the Linear, convolution -> conv1 (LeNet's conv2 cost 2x more in bf16:
#: a shape-specific cuDNN path the tiny case will not see either), max-pool -> max_pool2d, the rest -> relu.
_STANDIN = {"addmm": "linear fc1", "mm": "linear fc1", "bmm": "linear fc1", "convolution": "conv1",
            "max_pool2d_with_indices": "max_pool2d"}
#: LeNet's functional forward in the --ops diagnostic: op -> calls (12 ops: "LeNet forward, functional")
_LENET_OPS = {"conv1": 1, "conv2": 1, "relu": 4, "max_pool2d": 2, "flatten": 1, "linear fc1": 3}


def bf16_standin(folder: Path, table: pd.DataFrame) -> pd.DataFrame:
    """``table`` plus stand-ins for the bf16 host cases a visit before cases.HOST_DTYPES_CUDA did not run, built
    from that visit's per-op diagnostic (phases_ops.csv: LeNet's ops in tight loops, fp32 and bf16, with and
    without gradients, and its functional forward): each bf16 op_fixed case = its fp32 case + (the stand-in op's
    bf16-with-gradient time - its fp32-without time); the bf16 round-robin = the bf16 cases' mean + the bf16
    excess of LeNet's functional forward over the sum of its ops' loops, per op. An estimate of what the new
    cases would measure, designed on LeNet's ops: judge it on the other models."""
    ops = pd.read_csv(folder / "phases_ops.csv.gz")
    ops["grad"] = ops["grad"].astype(str) == "True"
    us = {(r.dtype, bool(r.grad), r.what): float(r.host_us) * 1e-6 for r in ops.itertuples(index=False)}
    fixed = table[(table["kind"] == "opfixed") & (table["dtype"] == "fp32")]
    rows = []
    for r in fixed.to_dict("records"):
        op = _STANDIN.get(r["label"], "relu")
        rows.append({**r, "dtype": "bf16",
                     "seconds": r["seconds"] + us[("bfloat16", True, op)] - us[("float32", False, op)]})
    loops = sum(n * us[("bfloat16", True, op)] for op, n in _LENET_OPS.items())
    excess = (us[("bfloat16", True, "LeNet forward, functional (no modules)")] - loops) / sum(_LENET_OPS.values())
    rr = table[(table["kind"] == "opcold") & (table["dtype"] == "fp32")].iloc[0].to_dict()
    rows.append({**rr, "dtype": "bf16", "seconds": float(np.mean([x["seconds"] for x in rows])) + max(excess, 0.0)})
    return pd.concat([table, pd.DataFrame(rows)], ignore_index=True)


def rescore(folder: Path, models=None, dtype: str = "bf16", progress=print, system=None):
    """(rows, checks): every recorded row with the recomputed predictions and ratios; per (file, model, system)
    the largest |recomputed / recorded - 1| over its modules and of its step. ``system``: the calibrated spec to
    predict with (default: the visit's calibrated.json)."""
    cal = system if system is not None else load_system(str(folder / "calibrated.json"))
    tdt = DTYPES[dtype]
    frames, checks = [], []
    for csv in sorted(folder.glob("accuracy*.csv*")):
        rec = pd.read_csv(csv)
        batch = _gpt_batch(csv)
        for model in rec["model"].unique():
            if models and model not in models:
                continue
            w = accuracy.build(model, torch.device("cpu"), tdt, gpt_batch=batch, gpu_sizes=True)
            for label in rec["system"].unique():
                spec = cal if label == "calibrated" else load_system(rec.loc[rec["system"] == label,
                                                                               "system_name"].iloc[0])
                new = predict(w, spec)
                g = rec[(rec["model"] == model) & (rec["system"] == label)].copy()
                old = g[PRED].sum(axis=1).to_numpy(float)
                joined = new.reindex(g["module"])
                g["pred_fwd_s"], g["pred_bwd_s"] = joined["pred_fwd_s"].to_numpy(), joined["pred_bwd_s"].to_numpy()
                with np.errstate(divide="ignore", invalid="ignore"):  # a module predicted 0 (no op) stays NaN
                    rel = np.abs(g[PRED].sum(axis=1).to_numpy(float) / np.where(old > 0, old, np.nan) - 1)
                st = (g["module"] == "(step)").to_numpy()
                checks.append({"file": csv.name, "model": model, "system": label, "modules": int((~st).sum()),
                               "missing": int(joined["pred_fwd_s"].isna().sum()),
                               "module_max": float(np.nanmax(rel[~st])) if (~st).any() else np.nan,
                               "module_median": float(np.nanmedian(rel[~st])) if (~st).any() else np.nan,
                               "step": float(np.nanmax(rel[st])) if st.any() else np.nan})
                frames.append(g.assign(file=csv.name, gpt_batch=batch))
            progress(f"{csv.name} {model}: re-scored")
    rows = pd.concat(frames, ignore_index=True)
    rows["ratio"] = (rows["meas_fwd_s"] + rows["meas_bwd_s"]) / (rows["pred_fwd_s"] + rows["pred_bwd_s"])
    rows["ratio_fwd"] = rows["meas_fwd_s"] / rows["pred_fwd_s"]
    rows["ratio_bwd"] = rows["meas_bwd_s"] / rows["pred_bwd_s"].where(rows["pred_bwd_s"] > 0)
    return rows, pd.DataFrame(checks)


def report(rows: pd.DataFrame) -> list:
    """The STEP and CLASS lines of bench/accuracy.py, per recorded file."""
    out = []
    for name, g in rows.groupby("file", sort=True):
        out += accuracy.gpt_class_lines(g, int(g["gpt_batch"].iloc[0]))[-5:] if (g["model"] == "gpt").any() else []
        out += accuracy.step_lines(g)
    return [line for line in out if line.startswith(("STEP ", "CLASS "))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", help="a bench/gpu_results/<visit> folder (accuracy*.csv[.gz] and calibrated.json)")
    ap.add_argument("--models", default=None, help="comma-separated subset (default: every model recorded)")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="the run's dtype (GPU runs: bf16)")
    ap.add_argument("--check", action="store_true", help="print recorded vs recomputed predictions per model")
    ap.add_argument("--csv", default=None, help="write every re-scored row")
    ap.add_argument("--refit", action="store_true", help="fit the calibrated spec again from the visit's "
                    "calibration.csv with the current fit code (else: its calibrated.json as recorded)")
    ap.add_argument("--bf16-standin", action="store_true", help="with --refit, on a visit without bf16 host cases: "
                    "stand-ins for them from its per-op diagnostic (bf16_standin; an estimate, not a measurement)")
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    if not (folder / "calibrated.json").exists():
        raise SystemExit(f"folder: {folder} has no calibrated.json")
    models = [m.strip() for m in args.models.split(",")] if args.models else None
    torch.set_num_threads(1)
    rows, checks = rescore(folder, models, args.dtype, progress=lambda m: print(m, file=sys.stderr, flush=True),
                           system=refit(folder, standin=args.bf16_standin) if args.refit else None)
    if args.check:
        print("recorded vs recomputed prediction, |recomputed/recorded - 1| (0: the re-score reproduces the run):")
        print(checks.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"re-scored offline on CPU from the recorded measurements of {folder} (not a new GPU measurement); "
          f"system: {'re-fitted from its calibration.csv' if args.refit else 'its calibrated.json'}"
          f"{' + bf16 host cases stood in from its per-op diagnostic' if args.bf16_standin else ''}:")
    print("\n".join(report(rows)))
    if args.csv:
        rows.to_csv(args.csv, index=False)
    return rows, checks


if __name__ == "__main__":
    main()

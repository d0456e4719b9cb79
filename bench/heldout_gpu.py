"""Held-out accuracy on a GPU: the same public models as ``bench/heldout.py`` (same split, same builds, same
optimizers, fp32 as a user's defaults run them), measured on CUDA and predicted with a GPU system file.

Why: issue 26 asks that the op-class work serve the GPU calibration too. These models are small (CPU-sized),
so on a GPU most of their steps are host-bound: the benchmark scores the GPU host model (launch, per-op
dispatch, op_cold_s, the optimizer's implementation: foreach on CUDA) and the small-kernel side on models none
of those terms was designed on.

Method: per model, 3 warm-up steps, then ``--steps`` bare steps timed per phase with CUDA events on the current
stream (forward+loss, backward, optimizer.step()+zero_grad(set_to_none=True); step = their sum; events need
no device sync inside the step: one ``synchronize`` per step, after it), medians. Then ``--steps`` steps with
per-module CUDA events (forward: pre/post hooks; backward: pre/post hooks on the autograd nodes the module's
forward created, first start to last end), medians per module. A CUDA event's time is when the stream reached
it, so a host-bound module's span holds its host time, as PerfCheck's own timer measures it. Predicted:
``perfcheck.estimate(model, inputs, system=<the system file>, optimizer=<the loop's optimizer>)``, exactly as
``bench/heldout.py`` does (its ``predict`` and ``compare``). Ratios are measured / predicted.

    python bench/heldout_gpu.py --system calibrated.json --csv out.csv            # on the GPU machine
    python bench/heldout_gpu.py --device cpu --models wide_deep --steps 2          # a dry run here (CPU clock)
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import heldout  # noqa: E402
from perfcheck.hardware.systems import load_system  # noqa: E402


def to_device(w: heldout.Workload, device) -> heldout.Workload:
    w.model.to(device)
    w.inputs = tuple(x.to(device) for x in w.inputs)
    w.target = w.target.to(device)
    return w


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--system", default=None, help="system name or file (default: h100-sxm on CUDA, a quick "
                                                   "CPU calibration otherwise)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--set", choices=("design", "scoring", "both"), default="both")
    ap.add_argument("--models", default=None, help="comma-separated subset")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--csv", default=None, help="write per-model rows (and <csv>.modules.csv)")
    ap.add_argument("--no-modules", action="store_true", help="phases only (no per-module hooks)")
    args = ap.parse_args(argv)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    if args.system:
        spec, note = load_system(args.system), f"system {args.system}"
    elif device.type == "cuda":
        spec, note = load_system("h100-sxm"), "system h100-sxm (datasheet)"
    else:
        spec, note = heldout.calibration(None, None, say)[0], "quick CPU calibration"
        spec = heldout.merged([spec])
    clock = heldout.Clock(device)
    sets = ("design", "scoring") if args.set == "both" else (args.set,)
    chosen = [(s, m) for s in sets for m in heldout.SPLIT[s]]
    if args.models:
        keep = set(args.models.split(","))
        chosen = [(s, m) for s, m in chosen if m in keep]
    rows, mods = [], []
    for s, name in chosen:
        t0 = time.perf_counter()
        try:
            w = to_device(heldout.build(name), device)
            meas = heldout.measure(w, args.steps, clock, warmup=3, modules=not args.no_modules)
            t_meas = time.perf_counter() - t0
            pred = heldout.predict(w, spec, meas["optimizer"])
        except Exception as exc:  # a model that fails is reported, not skipped silently
            say(f"{s} {name}: failed: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        row, m = heldout.compare(name, s, meas, pred)
        row["wall_step_ms"] = meas["wall_step_s"] * 1e3
        rows.append(row)
        mods += m
        say(f"{s} {name}: step {row['meas_step_ms']:.2f} ms meas (wall {row['wall_step_ms']:.2f}) / "
            f"{row['pred_step_ms']:.2f} pred = {row['ratio_step']:.2f} (fwd {row['ratio_fwd']:.2f}, "
            f"bwd {row['ratio_bwd']:.2f}, optim {row['ratio_optim']:.2f}) [built and measured in {t_meas:.0f} s, "
            f"predicted in {time.perf_counter() - t0 - t_meas:.0f} s]")
        if args.csv:  # after every model: a run stopped at its time limit keeps what it measured
            pd.DataFrame(rows).to_csv(args.csv, index=False)
            pd.DataFrame(mods).to_csv(args.csv + ".modules.csv", index=False)
    rows, mods = pd.DataFrame(rows), pd.DataFrame(mods)
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out = [f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; torch {torch.__version__}; "
           f"device {dev}; fp32 (user defaults); {note}; {args.steps} steps per model; CUDA-event phases.", ""]
    if len(rows):
        out += heldout.summary_lines(rows, mods)
    print("\n".join(out))
    if args.csv:
        rows.to_csv(args.csv, index=False)
        mods.to_csv(args.csv + ".modules.csv", index=False)
    return rows, mods


if __name__ == "__main__":
    main()

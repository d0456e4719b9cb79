"""Does a calibration taken while other processes saturate the cores poison predictions?

For each CPU thread count, the automatic quick calibration (``perfcheck.calibrate.auto.auto_calibrate``'s
call: quick mode, no collectives) is taken quiet and with ``--busy`` busy loops (``sh -c 'while :; do :;
done'``) running beside it, once with the kept statistic of this perfcheck (median of the fastest half of
the repeats, unsteady cases re-timed: ``perfcheck.calibrate.repeats``) and once with the old one
(median of all repeats, no re-timing). Each spec predicts LeNet's training step (batch 8: forward +
backward + SGD step, host terms included); the table gives the loaded/quiet ratio and what the sanity
checks (``perfcheck.calibrate.sanity.problems``) say about keeping each calibration.

    flock /tmp/perfcheck-bench.lock python bench/calibration_trust.py --threads 1 2 --busy 2
    flock /tmp/perfcheck-bench.lock python bench/calibration_trust.py --auto --threads 1 2 --busy 2
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from perfcheck.examples.models import Net  # noqa: E402
from perfcheck.calibrate import repeats, sanity  # noqa: E402
from perfcheck.calibrate.run import calibrate, cpu_name  # noqa: E402
from perfcheck.hardware.labels import AUTO_NAME  # noqa: E402
from perfcheck.predict.estimate import estimate  # noqa: E402
from perfcheck.schema import ROOT  # noqa: E402


@contextlib.contextmanager
def busy(n: int):
    procs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(n)]
    try:
        time.sleep(0.5 if n else 0)
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()


@contextlib.contextmanager
def old_statistic():
    """The kept number before: the median of all repeats, no re-timing."""
    saved = repeats.fastest_half, repeats.unsteady
    repeats.fastest_half, repeats.unsteady = statistics.median, (lambda s: False)
    try:
        yield
    finally:
        repeats.fastest_half, repeats.unsteady = saved


def lenet_step_s(spec) -> float:
    pred = estimate(Net(), (torch.randn(8, 3, 32, 32),), system=spec, optimizer="sgd")
    root = pred[pred["module"] == ROOT].iloc[0]
    return float(root["pred_fwd_s"] + root["pred_bwd_s"] + root["pred_optim_s"])


def one(threads: int, n_busy: int, stat: str, clock: str = "wall"):
    ctx = old_statistic() if stat == "old" else contextlib.nullcontext()
    with ctx, busy(n_busy), torch.random.fork_rng(devices=[]):
        res = calibrate("cpu", mode="quick", device="cpu", comm=False, threads=threads, name=AUTO_NAME, clock=clock)
    spec = res.spec
    return {"threads": threads, "busy": n_busy, "stat": stat, "clock": clock, "step_s": lenet_step_s(spec),
            "copy_256k": spec.mem_bandwidth_bytes_per_s * max(f for _, f in spec.mem_bandwidth_curve or [(0, 1.0)]),
            "conv_fixed_s": spec.op_fixed_s.get("convolution", float("nan")),
            "op_cold_s": spec.host.get("op_cold_s", float("nan")),
            "others": spec.calibration.get("others_cores"), "wall_s": spec.calibration.get("wall_s"),
            "problems": sanity.problems(spec)}


def auto(threads: int, n_busy: int) -> dict:
    """The automatic path itself (``resolve_system(calibrate=True)`` on an empty cache): what it kept or why not."""
    import os
    import tempfile

    from perfcheck.calibrate import auto

    said = []
    with tempfile.TemporaryDirectory() as tmp, busy(n_busy):
        os.environ["PERFCHECK_CACHE_DIR"] = tmp
        os.environ[auto.AUTO_ENV] = "1"
        t0 = time.perf_counter()
        spec = auto.resolve_system("cpu", threads, calibrate=True, say=said.append)
        took = time.perf_counter() - t0
    rec = dict(spec.calibration) if spec.calibrated else {}
    return {"threads": threads, "busy": n_busy, "kept": spec.calibrated, "took_s": took,
            "clock": rec.get("clock", "-"), "others": rec.get("others_cores"),
            "step_s": lenet_step_s(spec) if spec.calibrated else float("nan"), "said": said[-1] if said else ""}


def main_auto(args):
    rows = [auto(t, n) for t in args.threads for n in (0, args.busy)]
    for r in rows:
        print(r, flush=True)
    quiet = {r["threads"]: r["step_s"] for r in rows if r["busy"] == 0}
    lines = ["| threads | busy loops | clock | others' cores | took | kept? | LeNet step | loaded/quiet | what it said |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["step_s"] / quiet[r["threads"]] if quiet[r["threads"]] == quiet[r["threads"]] else float("nan")
        lines.append(f"| {r['threads']} | {r['busy']} | {r['clock']} | {r['others']} | {r['took_s']:.1f} s | "
                     f"{'yes' if r['kept'] else 'no'} | {r['step_s'] * 1e3:.3f} ms | {ratio:.2f} | {r['said']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--busy", type=int, default=2)
    ap.add_argument("--stats", nargs="+", default=["new", "old"], choices=("new", "old"))
    ap.add_argument("--clocks", nargs="+", default=["wall"], choices=("wall", "process"),
                    help="calibration clocks (process: one thread only)")
    ap.add_argument("--out", default=None, help="write the markdown table here")
    ap.add_argument("--auto", action="store_true",
                    help="run the automatic path itself (resolve_system(calibrate=True) on an empty cache) instead")
    args = ap.parse_args(argv)
    if args.auto:
        return main_auto(args)
    rows = []
    for t in args.threads:
        for clock in args.clocks:
            if clock == "process" and t != 1:
                continue
            for stat in args.stats:
                for n in (0, args.busy):
                    r = one(t, n, stat, clock)
                    print(r, flush=True)
                    rows.append(r)
    quiet = {(r["threads"], r["stat"], r["clock"]): r["step_s"] for r in rows if r["busy"] == 0}
    lines = [f"machine: {cpu_name()}, {torch.__version__}; "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", "",
             "| threads | clock | kept statistic | busy loops | others' cores | LeNet step predicted | loaded/quiet | "
             "copy (cache-resident) | conv fixed | op_cold_s | kept in cache? |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["step_s"] / quiet[(r["threads"], r["stat"], r["clock"])]
        kept = "yes" if not r["problems"] else "refused: " + "; ".join(p.split(":")[0] if "contention" in p else p
                                                                       for p in r["problems"])
        lines.append(f"| {r['threads']} | {r['clock']} | {'fastest half' if r['stat'] == 'new' else 'median (before)'} | {r['busy']} | "
                     f"{r['others']} | {r['step_s'] * 1e3:.3f} ms | {ratio:.2f} | {r['copy_256k'] / 1e9:.1f} GB/s | "
                     f"{r['conv_fixed_s'] * 1e6:.1f} us | {r['op_cold_s'] * 1e6:.2f} us | {kept} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()

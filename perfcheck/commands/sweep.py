"""`perfcheck sweep`: the ZeRO sweep, one DeepSpeed job per stage, then the predicted-vs-measured comparison.

Per stage S a DeepSpeed job trains the example model (perfcheck.examples.train_ds, or --script)
with the package's stage configs (integrations/deepspeed/configs: base.json + stage<S>.json; S may
name any overlay there, e.g. 3-gather) into OUT/stage<S>/ (launcher output in launcher.log), then
`perfcheck compare` writes OUT/comparison.csv and OUT/comparison.html. On a machine without CUDA the
ranks are CPU processes (DS_ACCELERATOR=cpu, gloo); with CUDA one per visible GPU (NCCL).

A line per stage says when it starts and how it ended; a stage running past --timeout is killed
with its ranks and marked failed. Complete stages are skipped (resume, the default) unless
--force. Nothing is JIT-compiled: torch's Adam (--optimizer fused selects DeepSpeed's FusedAdam,
a C++/CUDA build). Exit status: 0 when every stage ran and matched the prediction, 1 when a stage
failed or its collective bytes differ from the prediction, 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import shlex

from perfcheck.errors import UserError

DEFAULT_OUT = "runs/zero_sweep"


def add_parser(subparsers):
    from perfcheck.integrations.deepspeed.sweep_options import DEFAULT_STAGES, DEFAULT_TIMEOUT_S, MODELS

    p = subparsers.add_parser("sweep", help="run the ZeRO stage sweep under DeepSpeed and compare it with the prediction",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stages", default=" ".join(DEFAULT_STAGES),
                   help=f"stages to run, space- or comma-separated (default: {' '.join(DEFAULT_STAGES)}; "
                        "also 3-gather: stage 3 with every parameter gathered)")
    p.add_argument("--model", choices=MODELS, default="lenet", help="example model (default: lenet)")
    p.add_argument("--ranks", type=int, default=None,
                   help="processes on this machine (default: 2 CPU ranks, or every visible GPU)")
    p.add_argument("--hostfile", default=None, help="DeepSpeed hostfile for a multi-node sweep (instead of --ranks)")
    p.add_argument("--steps", type=int, default=None, help="measured optimizer steps per stage (default: the config's, 12)")
    p.add_argument("--micro-batch", type=int, default=None, help="micro-batch per rank (default: the config's, 8)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"sweep directory (default: {DEFAULT_OUT})")
    p.add_argument("--extra-config", action="append", default=[], metavar="JSON",
                   help="DeepSpeed config merged over every stage's (repeatable)")
    p.add_argument("--script", default=None, help="your own training script instead of perfcheck.examples.train_ds "
                                                  "(it gets --config/--overlay/--model/--out)")
    p.add_argument("--script-args", default="", metavar="ARGS",
                   help="extra arguments for every rank's training script, one shell-quoted string "
                        "(e.g. \"--fail-rank 1 --fail-step 1\" to try the failure path)")
    p.add_argument("--optimizer", choices=("torch", "fused"), default="torch",
                   help="torch: torch.optim Adam (default, nothing compiled); fused: DeepSpeed's FusedAdam (JIT-built)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help=f"seconds one stage may run before it is killed and marked failed (default: {DEFAULT_TIMEOUT_S:.0f})")
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", dest="force", action="store_false",
                       help="skip stages whose run directory is complete (the default)")
    again.add_argument("--force", dest="force", action="store_true", help="rerun every stage")
    p.add_argument("--no-compare", action="store_true", help="only run the stages")
    p.add_argument("--verbose", action="store_true", help="keep third-party warnings in the stage logs")
    p.set_defaults(run=run, force=False)


def options_from_args(args):
    from perfcheck.integrations.deepspeed.sweep_options import SweepOptions

    stages = tuple(s for s in args.stages.replace(",", " ").split() if s)
    return SweepOptions(stages=stages, model=args.model, ranks=args.ranks, steps=args.steps,
                        micro_batch=args.micro_batch, out=args.out, hostfile=args.hostfile, script=args.script,
                        extra_configs=tuple(args.extra_config), force=args.force, timeout_s=args.timeout,
                        optimizer=args.optimizer, verbose=args.verbose,
                        script_args=tuple(_split(args.script_args))).validate()


def _split(text: str) -> list:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise UserError(f"--script-args: {exc}") from None


def _calibrate_first(opts):
    """On a CPU, measure this machine's quick calibration for the ranks' thread count before they start,
    when the cache has none (perfcheck.calibrate.auto; ranks never calibrate themselves, and
    PERFCHECK_AUTO_CALIBRATE=0 skips it), and once per machine the three families the sweep's prediction
    needs and the quick calibration (one process) leaves at their defaults: DeepSpeed's own host work per
    ZeRO stage, the collectives' alpha and link (gloo all-reduce between the sweep's ranks) and the slowdown
    of the ranks sharing the host (``calibrate.sweep_terms.calibrate_sweep_terms``). The ranks'
    predictions and the comparison then use them."""
    import os

    import torch

    if torch.cuda.is_available():
        return
    from perfcheck.calibrate.auto import auto_calibration_enabled, cached_spec
    from perfcheck.calibrate.sweep_terms import calibrate_sweep_terms
    from perfcheck.integrations.deepspeed.sweep import local_ranks

    try:
        threads = max(int(os.environ.get("OMP_NUM_THREADS") or 1), 1)  # what integrations.deepspeed.sweep.stage_env gives ranks
    except ValueError:
        threads = 1
    spec = cached_spec("cpu", threads=threads)
    if spec is not None and auto_calibration_enabled():
        # a hostfile's slots per node are the launcher's: the multi-process cases are left to `perfcheck calibrate`
        calibrate_sweep_terms(spec, ranks=1 if opts.hostfile else local_ranks(opts, 0), threads=threads)


def _compare(args, opts, results) -> int:
    """``perfcheck compare`` over the stages that have a directory (an interrupted one included: its
    launcher.log says so); 0 when there is none."""
    from pathlib import Path

    from perfcheck.commands import compare

    dirs = [str(r.run_dir) for r in results if r.run_dir.is_dir()]
    if not dirs:
        return 0
    return compare.run(argparse.Namespace(run_dirs=dirs, out=str(Path(opts.out)), system=None, no_html=False))


def run(args) -> int:
    from perfcheck.integrations.deepspeed.sweep import SweepInterrupted, catch_stop_signals, run_sweep

    opts = options_from_args(args)
    restore = catch_stop_signals()  # SIGTERM too ends the calibration's ranks (its cleanup runs on the exception)
    try:
        _calibrate_first(opts)
    finally:
        restore()
    try:
        results = run_sweep(opts)
    except SweepInterrupted as exc:  # the stage running was stopped: compare what there is, then one line
        if not args.no_compare:
            _compare(args, opts, getattr(exc, "results", []))
        raise
    failed = [r for r in results if r.status in ("failed", "timeout")]
    rc = _compare(args, opts, results) if not args.no_compare else 0
    if failed:
        print(f"perfcheck sweep: stage(s) {' '.join(r.stage for r in failed)} failed: "
              + "; ".join(f"{r.stage}: {r.reason}" for r in failed))
        return 1
    total = sum(r.seconds for r in results)
    print(f"perfcheck sweep: {len(results)} stage(s) in {total:.0f} s; next: perfcheck report {shlex.quote(str(results[-1].run_dir))}"
          if results else "perfcheck sweep: nothing ran")
    return rc

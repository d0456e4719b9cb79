"""`perfcheck report RUN_DIR`: predicted vs measured per module, from a run directory alone.

Reads the run (``rank*/meta.json``, ``modules.csv``, ``steps.csv``, ``kernels.csv``,
``samples.csv``) and the predicted rows saved beside it (``rank<R>/predicted.csv`` or
``predicted.csv``; ``perfcheck.predict.for_run.save_predicted`` writes them). Without them the
estimator is re-run only when the meta describes a built-in example model (class and parameter
count) with its input spec; otherwise the command says so in one line and exits 2. A missing or
unreadable file, or another schema version, is a one-line error naming the file (exit 2).

Formats: table (the terminal tree, default), csv (one row per module and rank), json (modules,
totals, rank summary, findings, column glossary), html (one self-contained file with plots).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perfcheck.commands.checks import check_input_dir, check_output_file, check_system
from perfcheck.errors import UserError

FORMATS = ("table", "csv", "json", "html")


def add_parser(subparsers):
    p = subparsers.add_parser("report", help="predicted vs measured per module for a run directory",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory written by PerfCheck / perfcheck run")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    p.add_argument("--depth", type=int, default=None, help="deepest module depth shown in the tree/tables (default: all)")
    p.add_argument("--top", type=int, default=3, help="modules per depth in the top lists, and findings shown (default: 3)")
    p.add_argument("--system", default=None, help="system name or JSON path for the roofs (default: the prediction's, "
                                                  "else the run's device)")
    p.add_argument("--output", "-o", default=None, metavar="FILE", help="write to FILE instead of standard output")
    p.set_defaults(run=run)


def build(run_dir, *, system=None):
    """The run reconciled (``analysis.pipeline.reconcile_run``, the one assembly path)."""
    from perfcheck.analysis.pipeline import reconcile_run

    return reconcile_run(run_dir, system=system)


def render(result, fmt: str, *, depth=None, top=3) -> str:
    """``result`` (a ``pipeline.ReconciledRun``) in one of FORMATS."""
    rec, run = result.table, result.run
    if fmt == "table":
        from perfcheck.report.text import render_text

        return render_text(rec, depth=depth, top=top)
    if fmt == "csv":
        from perfcheck.report.tables import render_csv

        return render_csv(rec)
    if fmt == "json":
        from perfcheck.report.tables import render_json

        return render_json(rec)
    from perfcheck.report.html import render_html

    return render_html(rec, kernels=run.kernels, samples=run.samples, system=result.system, depth=depth, top=top,
                       profile_steps=result.profile_steps, title=f"perfcheck report: {Path(run.run_dir).name}")


def run(args) -> int:
    if args.depth is not None and args.depth < 0:
        raise UserError(f"--depth must be >= 0, got {args.depth}")
    if args.top < 1:
        raise UserError(f"--top must be >= 1, got {args.top}")
    check_input_dir(args.run_dir, "RUN_DIR")
    check_system(args.system, "--system")
    check_output_file(args.output, "--output")
    text = render(build(args.run_dir, system=args.system), args.format, depth=args.depth, top=args.top)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    from perfcheck.rundir import atomic_write_text

    try:
        atomic_write_text(args.output, text)
    except OSError as exc:
        raise UserError(f"{args.output}: cannot write ({exc.strerror or exc})") from None
    print(f"perfcheck report: wrote {args.output}", file=sys.stderr)
    return 0

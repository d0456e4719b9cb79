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
    p.add_argument("--output", "-o", default=None, help="write to FILE instead of standard output")
    p.set_defaults(run=run)


def _profile_steps(meta: dict) -> int:
    prof = meta.get("profile")
    if isinstance(prof, dict) and isinstance(prof.get("steps"), list) and prof["steps"]:
        return len(prof["steps"])
    return 1


def build(run_dir, *, system=None):
    """Load a run and reconcile it: ``(reconciled frame, run, system spec or None, notes)``."""
    from perfcheck.measure import rundir as runs
    from perfcheck.predict import for_run as predict_run
    from perfcheck.analysis.reconcile import reconcile

    run = runs.load_run(run_dir)
    meta0 = run.meta[run.ranks[0]]
    pred, info = predict_run.load_predicted(run.run_dir, run.ranks)
    notes = list(run.notes)
    if pred is None:
        model = predict_run.model_from_meta(meta0)
        if model is None:
            raise UserError(f"{Path(run_dir) / predict_run.PREDICTED_CSV}: missing file (no predicted rows in the run, "
                            "and meta.json does not name a built-in example model to re-run the estimator; save them "
                            "with perfcheck.predict.for_run.save_predicted(run_dir, perfcheck.estimate(model, inputs)))")
        pred = predict_run.predict_for_run(model, meta0, system=system)
        info = {"system": predict_run.system_from_meta(meta0, system), "dtype": meta0.get("dtype")}
        notes.append(f"predicted rows re-computed from meta.json (model {meta0['model']['type']}, system {info['system']})")
    name = system or info.get("system") or predict_run.system_from_meta(meta0)
    dtype = info.get("dtype") or meta0.get("dtype")
    rec = reconcile(pred, run.modules, system=name, kernels=run.kernels, steps=run.steps, dtype=dtype,
                    profile_steps={r: _profile_steps(m) for r, m in run.meta.items()})
    rec.attrs["notes"] = notes
    return rec, run, name, notes


def render(rec, run, fmt: str, *, depth=None, top=3, system=None) -> str:
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

    steps = max(_profile_steps(m) for m in run.meta.values()) if run.meta else 1
    return render_html(rec, kernels=run.kernels, samples=run.samples, system=system, depth=depth, top=top,
                       profile_steps=steps, title=f"perfcheck report: {Path(run.run_dir).name}")


def run(args) -> int:
    if args.depth is not None and args.depth < 0:
        raise UserError(f"--depth must be >= 0, got {args.depth}")
    if args.top < 1:
        raise UserError(f"--top must be >= 1, got {args.top}")
    rec, loaded, system, _ = build(args.run_dir, system=args.system)
    text = render(rec, loaded, args.format, depth=args.depth, top=args.top, system=system)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    from perfcheck.measure.rundir import atomic_write_text

    try:
        atomic_write_text(args.output, text)
    except OSError as exc:
        raise UserError(f"{args.output}: cannot write ({exc.strerror or exc})") from None
    print(f"perfcheck report: wrote {args.output}", file=sys.stderr)
    return 0

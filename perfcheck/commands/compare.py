"""`perfcheck compare RUN_DIR...`: predicted vs measured per ZeRO stage (bytes, memory, times).

Each RUN_DIR is one DeepSpeed run written by ``perfcheck.deepspeed.initialize`` (rank*/zero.json,
comms.csv, engine_steps.csv), or a sweep directory whose stage*/ sub-directories are such runs.
Prints the table and the answers, writes comparison.csv and comparison.html into --out (default: a
new runs/compare-<time>-<id>/; never into a run directory it reads). Exit code 1 when a stage failed
or its collective bytes differ from the prediction by more than 5%; 2 for bad arguments (a path that
is not a run or sweep directory, --out inside a run directory).
"""
from __future__ import annotations

from pathlib import Path

from perfcheck.commands.checks import check_input_dir, check_out_dir, check_system
from perfcheck.errors import UserError


def add_parser(subparsers):
    p = subparsers.add_parser("compare", help="predicted vs measured per ZeRO stage for DeepSpeed runs",
                              description=__doc__)
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (or a sweep directory)")
    p.add_argument("--out", default=None,
                   help="directory for comparison.csv/.html (default: a new runs/compare-<time>-<id>/)")
    p.add_argument("--system", default=None, help="system spec for the prediction (default: the one each run recorded)")
    p.add_argument("--no-html", action="store_true", help="skip the HTML page")
    p.set_defaults(run=run)


def _is_run_dir(d: Path) -> bool:
    """A run directory, or what is left of one whose ranks died (its launcher log or run.json)."""
    from perfcheck.analysis.stages import LOG_NAMES

    return any(d.glob("rank*")) or (d / "run.json").is_file() or any((d / n).is_file() for n in LOG_NAMES)


def check_run_dirs(paths) -> list:
    """The run directories the arguments name (a sweep directory gives its stage*/), each one checked."""
    from perfcheck.analysis.stages import expand_run_dirs

    for p in paths:
        check_input_dir(p, "RUN_DIR")
    dirs = expand_run_dirs(paths)
    for d in dirs:
        if not _is_run_dir(d):
            raise UserError(f"RUN_DIR: {d} holds no run (no rank*/ directories, run.json or launcher log, and no "
                            "stage*/ sub-directories); give a directory written by perfcheck.deepspeed or perfcheck sweep")
    return dirs


def _check_out(out: Path, dirs) -> Path:
    check_out_dir(out, "--out")
    target = out.resolve()
    for d in dirs:
        d = d.resolve()
        if target == d or d in target.parents:
            raise UserError(f"--out: {out} is inside the run directory {d}, which compare only reads; give another directory")
    return out


def run(args) -> int:
    from perfcheck.analysis import stages as compare
    from perfcheck.rundir import new_run_dir
    from perfcheck.report import stages_html as compare_report

    from perfcheck.analysis import layouts

    dirs = check_run_dirs(args.run_dirs)  # every argument checked before anything is read or written
    check_system(args.system, "--system")
    out = _check_out(Path(args.out) if args.out else new_run_dir("runs", "compare"), dirs)
    if args.run_dirs and all(layouts.is_layout_run(d) for d in args.run_dirs):  # DDP / FSDP2 / TP runs
        table = layouts.reconcile_layouts(args.run_dirs)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "comparison.csv", index=False)
        cols = ["run", "rank", "layout", "dp", "tp", "fsdp"] + [
            c for c in table.columns if c.endswith("_bytes") and not table[c].fillna(0).eq(0).all()] + [
            "pred_step_s", "meas_step_s", "meas_compute_s", "bytes_ok", "notes"]
        print(table[cols].to_string(index=False))
        for q, a in layouts.answers(table):
            print(f"Q: {q}\nA: {a}")
        if not args.no_html:
            from perfcheck.report import layouts_html

            layouts_html.write_html(table, out / "comparison.html")
        print(f"wrote {out / 'comparison.csv'}" + ("" if args.no_html else f" and {out / 'comparison.html'}"))
        return 0 if table["bytes_ok"].astype(bool).all() and (table["status"] == "ok").all() else 1
    from perfcheck.hardware.cache import cached_spec

    # a stage without a recorded system is priced on this machine's cached calibration (the edge reads the cache)
    table = compare.reconcile_stages([str(d) for d in dirs], system=args.system,
                                     local=lambda threads: cached_spec("cpu", threads=threads))
    out.mkdir(parents=True, exist_ok=True)
    compare_report.write_csv(table, out / "comparison.csv")
    if not args.no_html:
        compare_report.write_html(table, out / "comparison.html")
    print(compare_report.terminal_table(table))
    print(f"wrote {out / 'comparison.csv'}" + ("" if args.no_html else f" and {out / 'comparison.html'}"))
    failed = (table["status"] != "ok").any()
    mismatch = not table.loc[table["status"] == "ok", "bytes_ok"].astype(bool).all() if "bytes_ok" in table else False
    return 1 if failed or mismatch else 0

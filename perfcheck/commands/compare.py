"""`perfcheck compare RUN_DIR...`: predicted vs measured per ZeRO stage (bytes, memory, times).

Each RUN_DIR is one DeepSpeed run written by ``perfcheck.deepspeed.initialize`` (rank*/zero.json,
comms.csv, engine_steps.csv), or a sweep directory whose stage*/ sub-directories are such runs.
Prints the table and the answers, writes comparison.csv and comparison.html. Exit code 1 when a
stage failed or its collective bytes differ from the prediction by more than 5%.
"""
from __future__ import annotations

from pathlib import Path


def add_parser(subparsers):
    p = subparsers.add_parser("compare", help="predicted vs measured per ZeRO stage for DeepSpeed runs",
                              description=__doc__)
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (or a sweep directory)")
    p.add_argument("--out", default=None,
                   help="directory for comparison.csv/.html (default: the sweep directory or the first RUN_DIR's parent)")
    p.add_argument("--system", default=None, help="system spec for the prediction (default: the one each run recorded)")
    p.add_argument("--no-html", action="store_true", help="skip the HTML page")
    p.set_defaults(run=run)


def run(args) -> int:
    from perfcheck.analysis import stages as compare
    from perfcheck.report import stages_html as compare_report

    table = compare.reconcile_stages(args.run_dirs, system=args.system)
    first = Path(args.run_dirs[0])
    out = Path(args.out) if args.out else (first if not any(first.glob("rank*")) else first.parent)
    out.mkdir(parents=True, exist_ok=True)
    compare_report.write_csv(table, out / "comparison.csv")
    if not args.no_html:
        compare_report.write_html(table, out / "comparison.html")
    print(compare_report.terminal_table(table))
    print(f"wrote {out / 'comparison.csv'}" + ("" if args.no_html else f" and {out / 'comparison.html'}"))
    failed = (table["status"] != "ok").any()
    mismatch = not table.loc[table["status"] == "ok", "bytes_ok"].astype(bool).all() if "bytes_ok" in table else False
    return 1 if failed or mismatch else 0

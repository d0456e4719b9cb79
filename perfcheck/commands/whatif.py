"""`perfcheck whatif RUN_DIR --system TARGET [--from SYSTEM] [--predicted FILE] [--format table|csv|json]`.

Predicts a measured run on another system: each module's own measured time is divided by the
speed-up of the ceiling that bounds it (compute, memory, launch overhead, communication) between
the run's system (--from; default the run's CPU, or the spec in its meta.json) and --system;
containers and the step add the scaled parts up. The bounds come from the model's prediction on
the run's system: --predicted FILE, RUN_DIR/predicted.csv, or a built-in example named in meta.json
estimated on --from.
"""
from __future__ import annotations

import json
import math

from perfcheck.commands.checks import check_input_dir, check_output_file, check_system, nonneg_int, write_output

FORMATS = ("table", "csv", "json")


def add_parser(subparsers):
    p = subparsers.add_parser("whatif", help="predict a measured run's module and step times on another system",
                              description=__doc__.split("\n\n")[1])
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (perfcheck run / PerfCheck.save)")
    p.add_argument("--system", required=True, metavar="SYSTEM", help="target system: built-in name or JSON file")
    p.add_argument("--from", dest="source", metavar="SYSTEM", help="system the run was measured on (default: the one in its meta.json, else cpu for a CPU run)")
    p.add_argument("--predicted", metavar="FILE", help="the model's predicted table on the run's system (CSV)")
    p.add_argument("--dtype", help="the run's dtype (default: meta.json's)")
    p.add_argument("--target-dtype", help="dtype on the target (default: the run's)")
    p.add_argument("--rank", type=nonneg_int, default=0, help="rank to predict (default 0)")
    p.add_argument("--depth", type=nonneg_int, default=None, help="deepest module level shown in the table")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    p.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of standard output")
    p.set_defaults(run=run)


def run(args) -> int:
    from perfcheck.predict.whatif import whatif

    check_input_dir(args.run_dir, "RUN_DIR")  # every argument checked before any work
    check_system(args.system, "--system")
    check_system(args.source, "--from")
    check_output_file(args.output, "--output")
    frame = whatif(args.run_dir, args.system, source=args.source, predicted=args.predicted, dtype=args.dtype,
                   target_dtype=args.target_dtype, rank=args.rank)
    if args.format == "csv":
        text = frame.to_csv(index=False)
    elif args.format == "json":
        doc = {**frame.attrs, "modules": json.loads(frame.to_json(orient="records"))}
        text = json.dumps(doc, indent=2, default=_json) + "\n"
    else:
        text = render(frame, depth=args.depth)
    write_output(text, args.output)
    return 0


def _json(obj):
    return float(obj) if hasattr(obj, "__float__") else str(obj)


def _speed(x) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.3g}x"


def render(frame, depth=None) -> str:
    """The what-if report as text (presentation only)."""
    from perfcheck.units import fmt_time

    a = frame.attrs
    st = a["step"]
    lines = [f"what-if: {a['run_dir']} (rank {a['rank']}, {st['steps']} measured steps)",
             f"  from {a['source']} {a['dtype']}  ->  to {a['target']} {a['target_dtype']}",
             "  ceiling speed-ups B/A: " + ", ".join(f"{k} {_speed(v)}" for k, v in a["ratios"].items()),
             f"  bounds from: {a['predicted']}", ""]
    head = ["module", "type", "bound fwd/bwd on A", "on B", "measured", "predicted", "speed-up"]
    rows, shown = [], {}
    for r in frame.itertuples(index=False):
        if depth is not None and r.depth > depth:
            continue
        parent = next((shown[q] for q in _ancestors(r.module) if q in shown), None)
        level = 0 if parent is None else parent[0] + 1
        name = r.module if parent is None or parent[1] == "(root)" else r.module[len(parent[1]) + 1:]
        shown[r.module] = (level, r.module)
        rows.append(["  " * level + name, r.type, f"{r.bound_fwd}/{r.bound_bwd}",
                     f"{r.target_bound_fwd}/{r.target_bound_bwd}", fmt_time(r.meas_fwd_s + r.meas_bwd_s),
                     fmt_time(r.pred_fwd_s + r.pred_bwd_s), _speed(r.speedup)])
    lines += _table(head, rows)
    lines += ["", "step (median over measured steps):"]
    parts = [[k, fmt_time(st["measured_s"][k]), fmt_time(st["predicted_s"][k]), _speed(st["speedup_by_part"][k])]
             for k in st["measured_s"]]
    parts.append(["step", fmt_time(st["measured_step_s"]), fmt_time(st["predicted_step_s"]), _speed(st["speedup"])])
    lines += _table(["part", "measured", "predicted", "speed-up"], parts)
    lines.append(f"note: {st['note']}")
    return "\n".join(lines) + "\n"


def _ancestors(path: str):
    from perfcheck.schema import parent_path

    while (path := parent_path(path)) is not None:
        yield path


def _table(head, rows) -> list:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    left = 4 if len(head) > 4 else 1
    out = ["  ".join(str(c).ljust(w) if i < left else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
           .rstrip() for r in [head, *rows]]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out

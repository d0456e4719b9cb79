"""`perfcheck systems [NAME|FILE] [--format table|csv|json] [--output FILE]`.

Without NAME: one row per built-in system. With NAME (a built-in name or a path to a system JSON
file, e.g. one ``perfcheck calibrate`` wrote): every field of that system with its source; the
file is validated on the way, so this doubles as a checker. Unknown names exit 2 (UserError).
"""
from __future__ import annotations

import json
import math
import sys

from perfcheck.hardware.systems import EFFICIENCY_KEYS, list_systems, load_system, systems_table

FORMATS = ("table", "csv", "json")


def add_parser(subparsers):
    p = subparsers.add_parser("systems", help="list the hardware systems (or show one, with sources)",
                              description=__doc__.split("\n\n")[1])
    p.add_argument("name", nargs="?", help="a built-in system name or a path to a system JSON file")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    p.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of standard output")
    p.set_defaults(run=run)


def run(args) -> int:
    from perfcheck.commands.checks import check_output_file

    check_output_file(args.output, "--output")
    if args.name is None:
        text = _render_all(args.format)
    else:
        text = _render_one(load_system(args.name), args.format)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


# ---- formatting (presentation only; numbers come from perfcheck.hardware.systems) ---------------------------
def _scaled(value, scale, unit, digits=4):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value / scale:.{digits}g} {unit}".strip()


def _text_table(header, rows) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def _render_all(fmt: str) -> str:
    if fmt == "json":
        return json.dumps([load_system(n).to_json_dict() for n in list_systems()], indent=2) + "\n"
    frame = systems_table()
    if fmt == "csv":
        return frame.to_csv(index=False)
    header = ["name", "kind", "bf16", "fp16", "fp8", "tf32", "fp32", "memory", "capacity",
              "intra-node", "inter-node", "gpus/node", "eff matrix", "calibrated"]
    rows = []
    for r in frame.itertuples(index=False):
        rows.append([r.name, r.kind,
                     *(_scaled(getattr(r, f"matrix_{d}_flops_per_s"), 1e12, "TF/s") for d in ("bf16", "fp16", "fp8", "tf32", "fp32")),
                     _scaled(r.mem_bandwidth_bytes_per_s, 1e12, "TB/s"), _scaled(r.mem_capacity_bytes, 1e9, "GB"),
                     _scaled(r.intra_node_bandwidth_bytes_per_s, 1e9, "GB/s"), _scaled(r.inter_node_bandwidth_bytes_per_s, 1e9, "GB/s"),
                     r.gpus_per_node, f"{r.efficiency_matrix:g}", "yes" if r.calibrated else "no"])
    note = ("FLOP/s are dense peaks; link bandwidths are per GPU, one direction; 'cpu' is a rough default "
            "(run `perfcheck calibrate`). `perfcheck systems NAME` shows sources.\n")
    return _text_table(header, rows) + "\n" + note


def _fields(spec):
    """(field, SI value, display value, source) for every number of ``spec``."""
    def source(key):
        return spec.sources.get(key) or spec.sources.get(key.split(".", 1)[0]) or ""

    out = []
    for group, unit in (("matrix_flops_per_s", "TFLOP/s"), ("vector_flops_per_s", "TFLOP/s")):
        for dtype, value in getattr(spec, group).items():
            out.append((f"{group}.{dtype}", value, _scaled(value, 1e12, unit), source(f"{group}.{dtype}")))
    for field, scale, unit in (("mem_bandwidth_bytes_per_s", 1e12, "TB/s"), ("mem_capacity_bytes", 1e9, "GB"),
                               ("intra_node_bandwidth_bytes_per_s", 1e9, "GB/s"), ("gpus_per_node", 1, ""),
                               ("inter_node_bandwidth_bytes_per_s", 1e9, "GB/s"), ("launch_overhead_s", 1e-6, "us")):
        value = getattr(spec, field)
        out.append((field, value, _scaled(value, scale, unit), source(field)))
    for key in list(EFFICIENCY_KEYS) + [k for k in spec.efficiency if k not in EFFICIENCY_KEYS]:
        value = spec.efficiency[key]
        out.append((f"efficiency.{key}", value, f"{value:g}", source(f"efficiency.{key}")))
    if spec.matrix_efficiency_curve:
        curve = "; ".join(f"{f:.3g} FLOP -> {e:g}" for f, e in spec.matrix_efficiency_curve)
        out.append(("matrix_efficiency_curve", None, curve, source("matrix_efficiency_curve")))
    return out


def _render_one(spec, fmt: str) -> str:
    if fmt == "json":
        return spec.to_json()
    rows = _fields(spec)
    if fmt == "csv":
        import pandas as pd

        frame = pd.DataFrame([(f, v, s) for f, v, _, s in rows], columns=["field", "value", "source"])
        return frame.to_csv(index=False)
    head = (f"{spec.name} ({spec.kind}{', calibrated' if spec.calibrated else ''})\n"
            f"{spec.description}\n\n")
    return head + _text_table(["field", "value", "source"], [(f, shown, s) for f, _, shown, s in rows])

"""`perfcheck report` (not built yet)."""


def add_parser(subparsers):
    p = subparsers.add_parser("report", help="(not built yet)")
    p.set_defaults(run=run)


def run(args) -> int:
    raise NotImplementedError("perfcheck report is not implemented yet")

"""`perfcheck estimate` (not built yet)."""


def add_parser(subparsers):
    p = subparsers.add_parser("estimate", help="(not built yet)")
    p.set_defaults(run=run)


def run(args) -> int:
    raise NotImplementedError("perfcheck estimate is not implemented yet")

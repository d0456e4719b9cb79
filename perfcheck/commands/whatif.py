"""`perfcheck whatif` (not built yet)."""


def add_parser(subparsers):
    p = subparsers.add_parser("whatif", help="(not built yet)")
    p.set_defaults(run=run)


def run(args) -> int:
    raise NotImplementedError("perfcheck whatif is not implemented yet")

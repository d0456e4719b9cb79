"""`perfcheck systems` (not built yet)."""


def add_parser(subparsers):
    p = subparsers.add_parser("systems", help="(not built yet)")
    p.set_defaults(run=run)


def run(args) -> int:
    raise NotImplementedError("perfcheck systems is not implemented yet")

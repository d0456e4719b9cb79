"""`perfcheck run` (not built yet)."""


def add_parser(subparsers):
    p = subparsers.add_parser("run", help="(not built yet)")
    p.set_defaults(run=run)


def run(args) -> int:
    raise NotImplementedError("perfcheck run is not implemented yet")

"""`perfcheck calibrate` (not built yet)."""


def add_parser(subparsers):
    p = subparsers.add_parser("calibrate", help="(not built yet)")
    p.set_defaults(run=run)


def run(args) -> int:
    raise NotImplementedError("perfcheck calibrate is not implemented yet")

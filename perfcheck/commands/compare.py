"""`perfcheck compare` (not built yet)."""


def add_parser(subparsers):
    p = subparsers.add_parser("compare", help="(not built yet)")
    p.set_defaults(run=run)


def run(args) -> int:
    raise NotImplementedError("perfcheck compare is not implemented yet")

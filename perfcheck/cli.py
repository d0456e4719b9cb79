"""The ``perfcheck`` command: one module per subcommand under perfcheck/commands/.

Each subcommand module provides ``add_parser(subparsers)`` and ``run(args) -> int``. Bad input
raises ``perfcheck.errors.UserError``; it is printed as one line and the exit code is 2.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from perfcheck.errors import UserError

#: Subcommand name -> module under perfcheck.commands (imported only when that command runs).
SUBCOMMANDS = {
    "estimate": "estimate",
    "systems": "systems",
    "run": "run",
    "report": "report",
    "compare": "compare",
    "calibrate": "calibrate",
    "whatif": "whatif",
    "sweep": "sweep",
}


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad arguments as one line with exit code 2 (argparse's own code)."""

    def error(self, message):  # noqa: D401 - argparse API
        self.exit(2, f"perfcheck: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="perfcheck", description="Predict, measure and reconcile PyTorch performance.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, module in SUBCOMMANDS.items():
        importlib.import_module(f"perfcheck.commands.{module}").add_parser(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except UserError as exc:
        print(f"perfcheck {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

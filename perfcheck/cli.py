"""The ``perfcheck`` command: one module per subcommand under perfcheck/commands/.

Each subcommand module provides ``add_parser(subparsers)`` and ``run(args) -> int``. Bad input
raises ``perfcheck.errors.UserError``; it is printed as one line and the exit code is 2.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

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
    parser.add_argument("--verbose", dest="show_third_party", action="store_true",
                        help="let the profiler's own log lines and third-party FutureWarnings through")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, module in SUBCOMMANDS.items():
        importlib.import_module(f"perfcheck.commands.{module}").add_parser(sub)
    return parser


def quiet_third_party():
    """Keep other libraries' chatter out of the user's terminal (``perfcheck --verbose`` keeps it):
    libkineto, torch.profiler's backend, prints ``USDT:``/``STAGE:`` lines to stderr at every profiler
    start and stop (its log level is read when the profiler starts; 6 is above all of its levels), and
    torch/DeepSpeed raise FutureWarnings about their own internals. Only the CLI does this; the library
    leaves the user's logging and warning filters alone."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    warnings.filterwarnings("ignore", category=FutureWarning)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not args.show_third_party:
        quiet_third_party()
    try:
        return int(args.run(args) or 0)
    except UserError as exc:
        print(f"perfcheck {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

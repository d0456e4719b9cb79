"""The ``perfcheck`` command: one module per subcommand under perfcheck/commands/.

Each subcommand module provides ``add_parser(subparsers)`` and ``run(args) -> int``. Bad input
raises ``perfcheck.errors.UserError``; it is printed as one line and the exit code is 2.
"""
from __future__ import annotations

import argparse
import contextlib
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
    "plan": "plan",
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


@contextlib.contextmanager
def quiet_third_party(enabled: bool = True):
    """Keep other libraries' chatter out of the user's terminal while a command runs (``perfcheck
    --verbose`` keeps it): libkineto, torch.profiler's backend, prints ``USDT:``/``STAGE:`` lines to
    stderr at every profiler start and stop (its log level is read when the profiler starts; 6 is above
    all of its levels, and processes the command starts inherit it), and torch/DeepSpeed raise
    FutureWarnings about their own internals. The environment and warning filters are restored when the
    command returns, so an in-process ``main()`` call leaves the caller's process as it found it."""
    if not enabled:
        yield
        return
    before = os.environ.get("KINETO_LOG_LEVEL")
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield
    finally:
        if before is None:
            os.environ.pop("KINETO_LOG_LEVEL", None)
        else:
            os.environ["KINETO_LOG_LEVEL"] = before


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with quiet_third_party(enabled=not args.show_third_party):
            return int(args.run(args) or 0)
    except UserError as exc:
        print(f"perfcheck {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGINT/SIGTERM ending a run (measure.signals.RunInterrupted)
        signum = getattr(exc, "signum", 2)
        print(f"perfcheck {args.command}: {exc or 'interrupted by SIGINT'}", file=sys.stderr)
        return 128 + signum


if __name__ == "__main__":
    sys.exit(main())

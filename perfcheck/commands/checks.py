"""Argument checks shared by the subcommands: argparse ``type=`` callables and up-front file checks, and
``write_output``, the one way a subcommand's text reaches ``--output`` or stdout.

A bad value is refused before any work starts, as one line naming the flag (exit 2): argparse
prints ``perfcheck: error: argument --steps: must be an integer >= 1, got '0'`` for the types below;
the ``check_*`` functions raise ``UserError`` (printed by perfcheck.commands.cli) for what needs the
filesystem or the system registry. Nothing here imports torch.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from perfcheck.errors import UserError


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {text!r}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


positive_int = _int_at_least(1)
nonneg_int = _int_at_least(0)


def _float_check(ok, what: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if not math.isfinite(value) or not ok(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    parse.__name__ = what
    return parse


positive_float = _float_check(lambda v: v > 0, "a number > 0")
fraction = _float_check(lambda v: 0 <= v <= 1, "a number in [0, 1]")


def check_system(value, flag: str = "--system"):
    """``value`` once ``hardware.systems.load_system`` accepts it (None passes)."""
    if value is None:
        return None
    from perfcheck.hardware.systems import load_system

    try:
        load_system(value)
    except UserError as exc:
        raise UserError(f"{flag}: {exc}") from None
    return value


def check_out_dir(value, flag: str = "--out"):
    """A directory to write a run or results into: it, or a directory above it, must not be a file."""
    if value is None:
        return None
    from perfcheck.rundir import check_run_dir

    return check_run_dir(value, flag)


def check_output_file(value, flag: str = "--output"):
    """A file to write: not an existing directory, and its parent (if it exists) a directory."""
    if value is None:
        return None
    p = Path(value)
    if p.is_dir():
        raise UserError(f"{flag}: {p} is a directory; give a file name")
    for q in p.parents:
        if q.exists() and not q.is_dir():
            raise UserError(f"{flag}: {q} exists and is not a directory")
    return p


def write_output(text: str, output, flag: str = "--output") -> None:
    """``text`` into the file ``output`` (a one-line error naming ``flag`` when it cannot be written; "wrote ..."
    on stderr), or onto stdout when ``output`` is None."""
    if not output:
        sys.stdout.write(text)
        return
    try:
        with open(output, "w") as fh:
            fh.write(text)
    except OSError as exc:
        raise UserError(f"{flag}: cannot write {str(output)!r}: {exc.strerror}") from None
    print(f"wrote {output}", file=sys.stderr)


def check_input_dir(value, flag: str) -> Path:
    p = Path(value)
    if not p.exists():
        raise UserError(f"{flag}: {p}: no such directory")
    if not p.is_dir():
        raise UserError(f"{flag}: {p} is not a directory")
    return p

"""Errors perfcheck raises for bad user input: always one line that names the bad field."""


class UserError(ValueError):
    """Bad user input (a config field, a file, a shape). The CLI prints it as one line and exits 2."""


def plain(value):
    """A numpy scalar as the Python value it holds (a DataFrame's cell is one: ``np.int64(8)`` -> 8,
    ``np.bool_(True)`` -> True), so a validator's type checks read it as the same input; anything else unchanged."""
    import numpy as np

    numeric = isinstance(value, (np.integer, np.floating, np.bool_)) and not isinstance(value, np.timedelta64)
    return value.item() if numeric else value  # a timedelta64 is an np.integer that means a duration


def check_keys(value, allowed, required, where: str, what: str) -> None:
    """Raise UserError naming the first unknown or missing key of the JSON object ``value``
    (``what``: how the message names the object, e.g. "efficiency")."""
    unknown = [k for k in value if k not in allowed]
    if unknown:
        raise UserError(f"{where}: {what} has unknown key(s) {', '.join(map(repr, unknown))} "
                        f"(allowed: {', '.join(allowed)})")
    missing = [k for k in required if k not in value]
    if missing:
        raise UserError(f"{where}: {what} is missing key(s) {', '.join(map(repr, missing))}")


def parse_json(text: str, where: str):
    """``json.loads(text)``; malformed JSON is a UserError naming ``where`` and the line and column."""
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:  # nested deeper than Python's stack: damaged or hostile, never a traceback
        raise UserError(f"{where}: JSON nested too deep to read") from None

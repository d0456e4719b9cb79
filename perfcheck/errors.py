"""Errors perfcheck raises for bad user input: always one line that names the bad field."""


class UserError(ValueError):
    """Bad user input (a config field, a file, a shape). The CLI prints it as one line and exits 2."""

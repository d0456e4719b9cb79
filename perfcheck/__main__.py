"""``python -m perfcheck``: the same as the ``perfcheck`` command (perfcheck.commands.cli)."""
import sys

from perfcheck.commands.cli import main

sys.exit(main())

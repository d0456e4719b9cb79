"""``python -m perfcheck``: the same as the ``perfcheck`` command (perfcheck.cli)."""
import sys

from perfcheck.cli import main

sys.exit(main())

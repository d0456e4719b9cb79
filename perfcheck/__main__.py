import sys

from perfcheck.commands.cli import main

sys.exit(main())

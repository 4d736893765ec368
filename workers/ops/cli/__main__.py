"""`python -m workers.ops.cli`: the `pvm` command, as the console script runs it."""

from __future__ import annotations

import sys

from workers.ops.cli import main

# Guarded: a process started by multiprocessing's spawn imports the main module again, and must not run pvm.
if __name__ == "__main__":
    sys.exit(main())

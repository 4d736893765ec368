"""Job functions the worker tests enqueue (importable by worker processes)."""

from __future__ import annotations

import time
from pathlib import Path

from contracts import keys

# Workers in tests run these besides PVM's own: the `settings` fixture's PVM_EXTRA_JOB_FUNCTIONS.
TEST_JOB_FUNCTIONS = ("tests.workers.jobs.slow_marker",)
ALLOWED_IN_TESTS = keys.JOB_FUNCTIONS | set(TEST_JOB_FUNCTIONS)


def slow_marker(path: str, seconds: float) -> str:
    """Sleep, then leave a marker: proves a job ran to its end."""
    Path(path + ".started").touch()
    time.sleep(seconds)
    Path(path).write_text("done")
    return "done"

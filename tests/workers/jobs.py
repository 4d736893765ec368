"""Job functions the worker tests enqueue (importable by worker processes)."""

from __future__ import annotations

import time
from pathlib import Path


def slow_marker(path: str, seconds: float) -> str:
    """Sleep, then leave a marker: proves a job ran to its end."""
    Path(path + ".started").touch()
    time.sleep(seconds)
    Path(path).write_text("done")
    return "done"

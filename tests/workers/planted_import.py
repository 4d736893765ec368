"""A module a planted job names: importing it leaves a marker file, so a test proves no worker imported it.

Never import this module from a test: only a worker that wrongly resolves a
planted job's name would.
"""

from __future__ import annotations

import os
from pathlib import Path

MARKER_ENV = "PVM_TEST_PLANTED_IMPORT_MARKER"

_marker = os.environ.get(MARKER_ENV)
if _marker:
    Path(_marker).write_text(f"imported by pid {os.getpid()}")


def run(*args: object) -> None:
    """What the planted job would call."""


def callback(*args: object) -> None:
    """What a planted job's callback would call."""

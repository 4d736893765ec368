"""Durability calls: a file's written bytes, or a directory's created, renamed or removed entries, survive a crash.

Every fsync of the log goes through here, so a test or a benchmark can count them (`fsync_calls`).
"""

from __future__ import annotations

import os
from pathlib import Path

_calls = 0


def fsync_file(fd: int) -> None:
    """fsync an open file, so the bytes written to it are durable."""
    global _calls
    os.fsync(fd)
    _calls += 1


def fsync_dir(path: Path) -> None:
    """fsync a directory, so the entries created, renamed or removed in it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fsync_file(fd)
    finally:
        os.close(fd)


def fsync_calls() -> int:
    """How many fsyncs this process has made through this module (files and directories)."""
    return _calls

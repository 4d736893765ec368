"""The progress line of long work (replay of a log, a rebuild of threads): one line on stderr, redrawn."""

from __future__ import annotations

import sys
import time


class Progress:
    """A one-line progress display on stderr (a line per update when stderr is not a terminal)."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.started, self.last = label, total, time.monotonic(), 0.0
        self.tty = sys.stderr.isatty()

    def show(self, done: int, note: str = "", force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < (0.2 if self.tty else 2.0):
            return
        self.last = now
        width = 30
        filled = int(width * done / self.total) if self.total else width
        rate = done / max(now - self.started, 1e-6)
        line = f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {done:,}/{self.total:,} {rate:,.0f}/s {note}"
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty:
            print(file=sys.stderr)

"""The clock of change minutes: each one after the one before, so a change never sorts before what it changes."""

from __future__ import annotations

import time


def now_ms() -> int:
    """This process's wall clock, in Unix milliseconds."""
    return int(time.time() * 1000)


class ChangeClock:
    """Times (Unix ms) of a run of change minutes of one slot or project: each later than `after_ms` and than the
    one before.

    The facts of a slot are ordered by their change minutes' times (then ids): a change timed at or before the
    slot's newest one would sort before what it changes. `at(ms)` is `ms` when that is later than every time
    given so far, else the millisecond after the last one.
    """

    def __init__(self, after_ms: int, now_ms: int | None = None) -> None:
        self.last = after_ms
        self.fixed_now = now_ms  # the wall clock `now` reads, when fixed (an import timed once, a test)

    def at(self, ms: int) -> int:
        """The next time: `ms`, or one millisecond after the last time when `ms` is not later."""
        self.last = max(ms, self.last + 1)
        return self.last

    def now(self) -> int:
        """The next time, at the wall clock (`now_ms`, or the fixed one) or just after the last one."""
        return self.at(now_ms() if self.fixed_now is None else self.fixed_now)

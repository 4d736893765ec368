"""The change clock: each time after the one before and after the slot's last change, at the clock or a given time."""

from __future__ import annotations

import time

from workers.runtime.clock import ChangeClock, now_ms


def test_a_time_is_kept_when_later_and_moved_just_after_the_last_one_when_not() -> None:
    clock = ChangeClock(after_ms=1_000)
    assert [clock.at(5_000), clock.at(5_000), clock.at(4_000), clock.at(9_000), clock.at(1)] == [
        5_000,
        5_001,
        5_002,
        9_000,
        9_001,
    ]
    assert ChangeClock(after_ms=7_000).at(7_000) == 7_001  # never at the slot's last change itself


def test_now_reads_the_wall_clock_or_the_fixed_one() -> None:
    before = now_ms()
    assert before <= ChangeClock(0).now() <= now_ms()
    assert abs(before - int(time.time() * 1000)) < 1_000
    fixed = ChangeClock(after_ms=100, now_ms=50)
    assert [fixed.now(), fixed.now(), fixed.now()] == [101, 102, 103]
    assert [ChangeClock(0, now_ms=500).now() for _ in range(2)] == [500, 500]

"""Relative dates grounded against the minute that says them (docs/extraction.md's table), never the wall clock."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from workers.rules.relative_dates import day_of, day_start, ground_in_text

THURSDAY = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)  # tests/workers/minutes.T0


@pytest.mark.parametrize(
    ("phrase", "expected"),
    [
        ("today", date(2026, 11, 26)),
        ("tonight", date(2026, 11, 26)),
        ("yesterday", date(2026, 11, 25)),
        ("Tomorrow", date(2026, 11, 27)),
        ("the day after tomorrow", date(2026, 11, 28)),
        ("the day before yesterday", date(2026, 11, 24)),
        ("in 3 days", date(2026, 11, 29)),
        ("in three days", date(2026, 11, 29)),
        ("in a week", date(2026, 12, 3)),
        ("in two weeks", date(2026, 12, 10)),
        ("2 days ago", date(2026, 11, 24)),
        ("a week ago", date(2026, 11, 19)),
        ("this week", date(2026, 11, 23)),  # Monday of the minute's week
        ("next week", date(2026, 11, 30)),
        ("last week", date(2026, 11, 16)),
        ("next month", date(2026, 12, 1)),
        ("last month", date(2026, 10, 1)),
        ("next Friday", date(2026, 11, 27)),  # the first Friday after the minute's day
        ("next Thursday", date(2026, 12, 3)),  # strictly after: not the minute's own Thursday
        ("last Monday", date(2026, 11, 23)),
        ("last Thursday", date(2026, 11, 19)),
        ("this Thursday", date(2026, 11, 26)),  # on or after
        ("on Monday", date(2026, 11, 30)),
        ("Tuesday", date(2026, 12, 1)),
    ],
)
def test_a_phrase_names_a_day_counted_from_the_minute(phrase: str, expected: date) -> None:
    assert day_of(phrase, THURSDAY) == expected


def test_the_year_and_the_month_roll_over() -> None:
    new_years_eve = datetime(2026, 12, 31, 23, 0, tzinfo=UTC)
    assert day_of("tomorrow", new_years_eve) == date(2027, 1, 1)
    assert day_of("next month", new_years_eve) == date(2027, 1, 1)
    assert day_of("last month", datetime(2026, 1, 5, tzinfo=UTC)) == date(2025, 12, 1)


def test_the_day_is_the_utc_day_of_the_minute() -> None:
    late_in_new_york = datetime.fromisoformat("2026-11-26T22:30:00-05:00")  # already Friday in UTC
    assert day_of("today", late_in_new_york) == date(2026, 11, 27)


def test_an_old_minute_gets_its_own_dates_not_todays() -> None:
    """Replaying a minute from years ago grounds "tomorrow" in its own time: extraction never reads the clock."""
    assert day_of("tomorrow", datetime(2019, 2, 28, tzinfo=UTC)) == date(2019, 3, 1)


@pytest.mark.parametrize("phrase", ["", "someday", "next year", "in many days", "monday mornings", "last"])
def test_a_phrase_that_names_no_day_is_none(phrase: str) -> None:
    assert day_of(phrase, THURSDAY) is None


def test_a_day_starts_at_midnight_utc_in_the_minutes_format() -> None:
    assert day_start(date(2026, 11, 27)) == "2026-11-27T00:00:00.000000Z"


def test_relative_dates_in_a_value_become_iso_dates_and_weekday_schedules_stay() -> None:
    assert ground_in_text("ship the v2 API by next Friday", THURSDAY) == "ship the v2 API by 2026-11-27"
    assert ground_in_text("tomorrow", THURSDAY) == "2026-11-27"
    assert ground_in_text("Tuesday mornings", THURSDAY) == "Tuesday mornings"  # a schedule, not a date
    assert ground_in_text("weekdays before 3pm", THURSDAY) == "weekdays before 3pm"

"""Relative dates ("yesterday", "next week", "in 3 days") grounded against the minute that says them.

The day a phrase names is computed from the stating minute's own timestamp
(in UTC), never from the wall clock, so extracting the same minutes again,
on replay or on another machine, gives the same dates. The table
(docs/extraction.md repeats it):

| phrase                                   | the day                                        |
|------------------------------------------|------------------------------------------------|
| today, tonight                           | the minute's day                               |
| yesterday / tomorrow                     | one day before / after                         |
| the day before yesterday / after tomorrow| two days before / after                        |
| in N days / weeks, N days / weeks ago    | N days (7·N) after / before                    |
| this / next / last week                  | Monday of this / the following / the previous week |
| this / next / last month                 | the 1st of this / the following / the previous month |
| next Friday                              | the first Friday after the minute's day        |
| last Friday                              | the last Friday before the minute's day        |
| this Friday, on Friday, Friday           | the minute's day if a Friday, else the next one |

N is a number (1-999) or a word (a, an, one ... ten). A bare weekday is only
read where a phrase introduces it ("from Monday", "starting on Monday"): in a
value, "Tuesday mornings" is a schedule, not a date.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

from contracts.minute import iso_utc

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
NUMBER_WORDS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
}

_WEEKDAY = "(?:" + "|".join(WEEKDAYS) + ")"
_NUMBER = r"(?:\d{1,3}|" + "|".join(NUMBER_WORDS) + ")"
# A phrase that names a day by itself (no bare weekday).
RELATIVE = (
    r"(?:the\s+day\s+(?:after\s+tomorrow|before\s+yesterday)|today|tonight|yesterday|tomorrow"
    rf"|(?:this|next|last)\s+(?:week|month|{_WEEKDAY})"
    rf"|in\s+{_NUMBER}\s+(?:days?|weeks?)|{_NUMBER}\s+(?:days?|weeks?)\s+ago)"
)
# A phrase after a word that introduces a date ("from", "starting", "since"...): a bare weekday too.
INTRODUCED = rf"(?:{RELATIVE}|(?:on\s+)?{_WEEKDAY})"

_RELATIVE_IN_TEXT = re.compile(rf"\b{RELATIVE}\b", re.IGNORECASE)


def day_of(phrase: str, at: datetime) -> date | None:
    """The UTC day `phrase` names when said at `at`, or None when it names none."""
    words = phrase.lower().split()
    if not words:
        return None
    today = at.astimezone(UTC).date()
    text = " ".join(words)
    fixed = {"today": 0, "tonight": 0, "yesterday": -1, "tomorrow": 1}
    if text in fixed:
        return today + timedelta(days=fixed[text])
    if text == "the day after tomorrow":
        return today + timedelta(days=2)
    if text == "the day before yesterday":
        return today - timedelta(days=2)
    if words[0] == "on" and len(words) == 2:
        words = words[1:]
    if len(words) == 3 and words[0] == "in" and words[2].rstrip("s") in ("day", "week"):
        n = _number(words[1])
        return None if n is None else today + timedelta(days=n * (7 if words[2].startswith("week") else 1))
    if len(words) == 3 and words[2] == "ago" and words[1].rstrip("s") in ("day", "week"):
        n = _number(words[0])
        return None if n is None else today - timedelta(days=n * (7 if words[1].startswith("week") else 1))
    if len(words) == 2 and words[0] in ("this", "next", "last"):
        step = {"this": 0, "next": 1, "last": -1}[words[0]]
        if words[1] == "week":
            return today - timedelta(days=today.weekday()) + timedelta(days=7 * step)
        if words[1] == "month":
            month = today.month - 1 + step
            return date(today.year + month // 12, month % 12 + 1, 1)
        if words[1] in WEEKDAYS:
            return _weekday(today, WEEKDAYS.index(words[1]), words[0])
    if len(words) == 1 and words[0] in WEEKDAYS:
        return _weekday(today, WEEKDAYS.index(words[0]), "this")
    return None


def day_start(day: date) -> str:
    """The start of `day` in UTC as an ISO 8601 timestamp, in the minute's format."""
    return iso_utc(datetime(day.year, day.month, day.day, tzinfo=UTC))


def ground_in_text(text: str, at: datetime) -> str:
    """`text` with every relative date phrase replaced by its ISO date ("by next Friday" -> "by 2026-03-13")."""

    def replace(match: re.Match[str]) -> str:
        day = day_of(match.group(0), at)
        return match.group(0) if day is None else day.isoformat()

    return _RELATIVE_IN_TEXT.sub(replace, text)


def _number(word: str) -> int | None:
    if word.isdigit():
        return int(word)
    return NUMBER_WORDS.get(word)


def _weekday(today: date, target: int, which: str) -> date:
    if which == "next":
        return today + timedelta(days=(target - today.weekday() - 1) % 7 + 1)
    if which == "last":
        return today - timedelta(days=(today.weekday() - target - 1) % 7 + 1)
    return today + timedelta(days=(target - today.weekday()) % 7)

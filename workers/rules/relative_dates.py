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
| the 1st of next month (this, last)       | that day of the following (this, previous) month |
| 15 June, June 15, 15 June 2026, June 15th| that day of the year given, else of the minute's year (¹) |

(¹) or of the next year, when that day is more than half a year before the minute.

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

MONTHS = (
    "january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november",
    "december",
)  # fmt: skip
_WEEKDAY = "(?:" + "|".join(WEEKDAYS) + ")"
_NUMBER = r"(?:\d{1,3}|" + "|".join(NUMBER_WORDS) + ")"
_MONTH = "(?:" + "|".join(f"{m[:3]}(?:{m[3:]})?" if len(m) > 3 else m for m in MONTHS) + r")\.?"
_DAY = r"(?:[12]\d|3[01]|0?[1-9])(?:st|nd|rd|th)?"
# A day of a month: "15 June", "June 15th", "15 June 2026", "June 15, 2026", "the 1st of next month".
ABSOLUTE = (
    rf"(?:(?:the\s+)?{_DAY}\s+(?:of\s+)?{_MONTH}(?:,?\s+\d{{4}})?|{_MONTH}\s+{_DAY}(?:,?\s+\d{{4}})?"
    rf"|the\s+{_DAY}\s+of\s+(?:this|next|last)\s+month)"
)
# A phrase that names a day by itself (no bare weekday).
RELATIVE = (
    r"(?:the\s+day\s+(?:after\s+tomorrow|before\s+yesterday)|today|tonight|yesterday|tomorrow"
    rf"|{ABSOLUTE}"
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
    return _day_of_month(text, today)


_OF_MONTH = re.compile(r"^the\s+(?P<d>\d{1,2})(?:st|nd|rd|th)?\s+of\s+(?P<which>this|next|last)\s+month$")
_DAY_MONTH = re.compile(
    r"^(?:the\s+)?(?P<d>\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<m>[a-z]+)\.?(?:,?\s+(?P<y>\d{4}))?$"
    r"|^(?P<m2>[a-z]+)\.?\s+(?P<d2>\d{1,2})(?:st|nd|rd|th)?(?:,?\s+(?P<y2>\d{4}))?$"
)
_HALF_YEAR = timedelta(days=183)


def _day_of_month(text: str, today: date) -> date | None:
    """ "the 1st of next month", "15 June", "June 15, 2026": the day, or None (a day a month lacks is none)."""
    match = _OF_MONTH.match(text)
    try:
        if match:
            month = today.month - 1 + {"this": 0, "next": 1, "last": -1}[match.group("which")]
            return date(today.year + month // 12, month % 12 + 1, int(match.group("d")))
        match = _DAY_MONTH.match(text)
        if match is None:
            return None
        name = (match.group("m") or match.group("m2")).lower()
        month_no = next((i + 1 for i, m in enumerate(MONTHS) if m.startswith(name) and len(name) >= 3), None)
        if month_no is None:
            return None
        day_no = int(match.group("d") or match.group("d2"))
        year = match.group("y") or match.group("y2")
        if year:
            return date(int(year), month_no, day_no)
        day = date(today.year, month_no, day_no)
        return date(today.year + 1, month_no, day_no) if day < today - _HALF_YEAR else day
    except ValueError:  # "31 June"
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

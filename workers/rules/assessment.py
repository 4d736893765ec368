"""How PVM assesses a minute: its category, outcome, task kind, insights and initial scores.

The rules the index pool applies to every durable minute, and the evaluate
pool revises later: pure functions of the minute (and, for scores, the time),
no I/O. Each table below is a rule; the functions say in which order the
tables apply.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from contracts import Minute
from contracts.memory import Category, Insight, Scores
from contracts.minute import parse_timestamp

# -- the tables -------------------------------------------------------------------
# Tunables of the rules live here, next to the tables they shape; they are rules
# of the assessment rather than deployment settings.

# success_criteria_met at or above this is a success.
SUCCESS_THRESHOLD = 50.0

# Event types whose category does not depend on the data.
CATEGORY_BY_EVENT: dict[str, Category] = {
    "task_assigned": Category.TASK_ASSIGNMENT,
    "task_started": Category.TASK_ASSIGNMENT,  # the assignee took the task up
    "handoff": Category.TASK_ASSIGNMENT,
    "conflict_detected": Category.CONFLICT_RESOLUTION,
    "conflict_resolved": Category.CONFLICT_RESOLUTION,
    "task_failed": Category.FAILURE_PATTERN,
    "capability_observed": Category.AGENT_CAPABILITY,
    "decision": Category.COORDINATION_PATTERN,
    "message": Category.COORDINATION_PATTERN,
    "knowledge": Category.PROJECT_KNOWLEDGE,
}

# Event types that report an outcome: category when it succeeded, failed, or is not stated.
CATEGORY_BY_OUTCOME: dict[str, tuple[Category, Category, Category]] = {
    "task_completed": (Category.AGENT_CAPABILITY, Category.FAILURE_PATTERN, Category.AGENT_CAPABILITY),
    "evaluation": (Category.AGENT_CAPABILITY, Category.FAILURE_PATTERN, Category.PROJECT_KNOWLEDGE),
}

# Any other event type: the first rule whose words start a word of the event type,
# the memory note or the data's keys and text values; else project_knowledge.
KEYWORD_RULES: tuple[tuple[Category, tuple[str, ...]], ...] = (
    (
        Category.FAILURE_PATTERN,
        ("fail", "error", "exception", "crash", "timeout", "timed out", "rollback", "regression", "broken", "abort"),
    ),
    (Category.CONFLICT_RESOLUTION, ("conflict", "contention", "dispute", "deadlock")),
    (Category.TASK_ASSIGNMENT, ("assign", "reassign", "handoff", "hand off", "delegat", "claimed")),
    (Category.AGENT_CAPABILITY, ("capabilit", "skill", "proficien", "learned")),
    (Category.COORDINATION_PATTERN, ("decid", "decision", "agree", "consensus", "vote", "propos", "coordinat")),
)
_KEYWORD_PATTERNS = tuple(
    (category, re.compile(r"\b(?:" + "|".join(re.escape(w) for w in stems) + ")")) for category, stems in KEYWORD_RULES
)

# Scores. impact: how much the event matters to future work; accuracy when the
# minute carries no success_criteria_met: a prior near 0.5 by event type.
IMPACT_BY_EVENT: dict[str, float] = {
    "task_failed": 0.9,
    "conflict_resolved": 0.85,
    "conflict_detected": 0.8,
    "decision": 0.8,
    "evaluation": 0.7,
    "knowledge": 0.7,
    "task_completed": 0.6,
    "capability_observed": 0.6,
    "handoff": 0.6,
    "task_assigned": 0.5,
    "task_started": 0.3,
    "message": 0.2,
}
IMPACT_BY_CATEGORY: dict[Category, float] = {  # event types without an entry above
    Category.FAILURE_PATTERN: 0.8,
    Category.CONFLICT_RESOLUTION: 0.7,
    Category.AGENT_CAPABILITY: 0.5,
    Category.TASK_ASSIGNMENT: 0.5,
    Category.PROJECT_KNOWLEDGE: 0.5,
    Category.COORDINATION_PATTERN: 0.4,
}
ACCURACY_BY_EVENT: dict[str, float] = {
    "task_completed": 0.6,
    "conflict_resolved": 0.6,
    "decision": 0.6,
    "knowledge": 0.6,
    "capability_observed": 0.6,
    "task_failed": 0.4,
}
DEFAULT_ACCURACY = 0.5
NEUTRAL_RELEVANCE = 0.5  # until the reader's access counts move it
RECENCY_HALF_LIFE_S = 7 * 24 * 3600.0  # recency halves every week after the minute's timestamp
# composite = weighted sum: recency is ~1 for every new minute, so impact carries the most weight at index time.
COMPOSITE_WEIGHTS: dict[str, float] = {"recency": 0.3, "relevance": 0.2, "accuracy": 0.2, "impact": 0.3}

# data keys naming what kind of task a minute is about, in order of preference.
TASK_KIND_KEYS = ("task_kind", "kind", "task_type", "capability")
MAX_CAPABILITY_LENGTH = 64  # a task kind or capability is cut to this many characters

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
_NOT_WORD = re.compile(r"[^0-9a-z]+")
_TRAILING_NUMBER = re.compile(r"[^0-9A-Za-z]*[0-9]+$")


# -- the rules ------------------------------------------------------------------


def stated_text(value: Any) -> str | None:
    """`value` when it is a string with something in it; None for anything else (missing, blank, not text)."""
    return value if isinstance(value, str) and value and not value.isspace() else None


def words(name: str) -> str:
    """A name as lower-case words: ``Deploy.Rollback:canary-v2`` -> ``deploy rollback canary v2``."""
    return _NOT_WORD.sub(" ", name.lower()).strip()


@lru_cache(maxsize=1024)
def event_words(event_type: str) -> str:
    """`words` of an event type, cached: event types are few, and every minute of a type shares the result."""
    return words(event_type)


def success_score(minute: Minute) -> float | None:
    """The minute's success_criteria_met (0..100), if it states one."""
    score = minute.data.get("success_criteria_met")
    return float(score) if score is not None else None


def outcome(minute: Minute) -> bool | None:
    """Whether the work a minute reports succeeded: True, False, or None when it does not say.

    task_failed is a failure; otherwise an explicit boolean ``data.success`` wins,
    then success_criteria_met against `SUCCESS_THRESHOLD`; a task_completed
    without either counts as a success.
    """
    if minute.event_type == "task_failed":
        return False
    stated = minute.data.get("success")
    if isinstance(stated, bool):
        return stated
    score = success_score(minute)
    if score is not None:
        return score >= SUCCESS_THRESHOLD
    return True if minute.event_type == "task_completed" else None


def task_kind(minute: Minute) -> str | None:
    """What kind of task the minute is about: a `TASK_KIND_KEYS` value, else the task id's prefix.

    The prefix is the task id without its trailing number (``migration-42`` ->
    ``migration``), used only when it holds at least two letters (``T-1042``
    names no kind).
    """
    data = minute.data
    if not data:
        return None
    for key in TASK_KIND_KEYS:
        value = stated_text(data.get(key))
        if value:
            return _capability_name(value)
    task_id = stated_text(data.get("task_id"))
    if task_id:
        prefix = _TRAILING_NUMBER.sub("", task_id)
        if prefix != task_id and sum(map(str.isalpha, prefix)) >= 2:
            return prefix.lower()[:MAX_CAPABILITY_LENGTH]
    return None


def observed_capability(minute: Minute) -> str | None:
    """The capability a minute names, as agent memory keys it: ``data.capability`` cut to size, else its task kind."""
    stated = stated_text(minute.data.get("capability"))
    return _capability_name(stated) if stated else task_kind(minute)


def _capability_name(text: str) -> str:
    return text.strip().lower()[:MAX_CAPABILITY_LENGTH]


def _keyword_text(minute: Minute) -> str:
    parts = [minute.event_type, minute.memory_note or ""]
    for key, value in minute.data.items():
        parts.append(key)
        if isinstance(value, str):
            parts.append(value)
    return words(" ".join(parts))


def categorize(minute: Minute) -> Category:
    """The category of a minute: `CATEGORY_BY_EVENT`, `CATEGORY_BY_OUTCOME`, then `KEYWORD_RULES`."""
    category = CATEGORY_BY_EVENT.get(minute.event_type)
    if category is not None:
        return category
    by_outcome = CATEGORY_BY_OUTCOME.get(minute.event_type)
    if by_outcome is not None:
        succeeded, failed, unstated = by_outcome
        result = outcome(minute)
        return unstated if result is None else succeeded if result else failed
    text = _keyword_text(minute)
    for category, pattern in _KEYWORD_PATTERNS:
        if pattern.search(text):
            return category
    return Category.PROJECT_KNOWLEDGE


def _contexts(minute: Minute, kind: str | None) -> tuple[str, ...]:
    out = []
    task_id = stated_text(minute.data.get("task_id"))
    if task_id:
        out.append(f"task:{task_id}")
    conflict_type = stated_text(minute.data.get("conflict_type"))
    if conflict_type:
        out.append(f"conflict:{conflict_type}")
    if minute.agent_id:
        out.append(f"agent:{minute.agent_id}")
    if kind:
        out.append(f"kind:{kind}")
    return tuple(out)


def _clamp(value: float, low: float = 0.0, high: float = 1.0) -> float:
    return round(min(high, max(low, value)), 3)


def insights(minute: Minute) -> list[Insight]:
    """Findings a minute supports: its outcome, what it shows about the agent, how a conflict was resolved."""
    return insights_with_kind(minute, task_kind(minute))


# Event types with insights of their own; any other minute has insights only when it states a score.
_INSIGHT_EVENTS = frozenset(("task_completed", "task_failed", "capability_observed", "conflict_resolved"))


def insights_with_kind(minute: Minute, kind: str | None) -> list[Insight]:
    """`insights` given the minute's `task_kind`."""
    score = success_score(minute)
    if score is None and minute.event_type not in _INSIGHT_EVENTS:
        return []
    out: list[Insight] = []
    contexts = _contexts(minute, kind)
    task_id = stated_text(minute.data.get("task_id"))
    if score is not None:
        subject = f"task {task_id}" if task_id else f"the {event_words(minute.event_type)}"
        # 0% and 100% are as decisive as it gets; 50% says little either way.
        confidence = _clamp(0.5 + abs(score - 50.0) / 100.0)
        out.append(
            Insight("outcome", f"{subject} met {round(score, 1):g}% of its success criteria", confidence, contexts)
        )

    agent = minute.agent_id
    what = f"{kind} tasks" if kind else f"task {task_id}" if task_id else "its tasks"
    if agent and minute.event_type in ("task_completed", "task_failed"):
        succeeded = outcome(minute)
        if succeeded:
            confidence = _clamp(score / 100.0, 0.5) if score is not None else 0.6
            out.append(Insight("capability", f"agent {agent} can handle {what}", confidence, contexts))
        else:
            confidence = _clamp(1.0 - score / 100.0, 0.5) if score is not None else 0.7
            reason = stated_text(minute.data.get("error")) or stated_text(minute.data.get("reason"))
            finding = f"agent {agent} struggles with {what}" + (f" ({reason[:120]})" if reason else "")
            out.append(Insight("capability", finding, confidence, contexts))
    if agent and minute.event_type == "capability_observed":
        capability = stated_text(minute.data.get("capability")) or kind
        if capability:
            stated = minute.data.get("confidence")
            confidence = _clamp(stated) if isinstance(stated, (int, float)) and not isinstance(stated, bool) else 0.7
            out.append(Insight("capability", f"agent {agent} is capable of {capability}", confidence, contexts))

    resolution = stated_text(minute.data.get("resolution"))
    if minute.event_type == "conflict_resolved" and resolution:
        conflict_type = stated_text(minute.data.get("conflict_type"))
        subject = f"{words(conflict_type)} conflicts" if conflict_type else "conflicts"
        confidence = _clamp(score / 100.0, 0.3) if score is not None else 0.7
        out.append(Insight("resolution", f"{subject} resolved by {resolution}", confidence, contexts))
    return out


def timestamp_ms(minute: Minute) -> int:
    """The minute's timestamp as integer Unix milliseconds (exact: no float rounding)."""
    return (parse_timestamp(minute.timestamp) - _EPOCH) // _ONE_MS


def initial_scores(minute: Minute, now: float, category: Category | None = None, at_ms: int | None = None) -> Scores:
    """Scores at index time, each 0..1; the evaluate pool decays and revises them later.

    recency: 1.0 at the minute's timestamp, halving every `RECENCY_HALF_LIFE_S`;
    relevance: `NEUTRAL_RELEVANCE`; accuracy: success_criteria_met / 100, else
    `ACCURACY_BY_EVENT`; impact: `IMPACT_BY_EVENT`, else by category;
    composite: `COMPOSITE_WEIGHTS` over the four. `category` and `at_ms` (the
    minute's `timestamp_ms`) save recomputing them when the caller has them.
    """
    return Scores(**initial_score_fields(minute, now, category, at_ms))


def initial_score_fields(
    minute: Minute, now: float, category: Category | None = None, at_ms: int | None = None
) -> dict[str, float]:
    """`initial_scores` as the payload holds them (a dict, field by field: dataclasses.asdict deep-copies)."""
    at_ms = timestamp_ms(minute) if at_ms is None else at_ms
    age_s = max(0.0, now - at_ms / 1000.0)
    recency = 0.5 ** (age_s / RECENCY_HALF_LIFE_S)
    score = success_score(minute)
    accuracy = score / 100.0 if score is not None else ACCURACY_BY_EVENT.get(minute.event_type, DEFAULT_ACCURACY)
    impact = IMPACT_BY_EVENT.get(minute.event_type)
    if impact is None:
        impact = IMPACT_BY_CATEGORY[category or categorize(minute)]
    w = COMPOSITE_WEIGHTS
    composite = (
        w["recency"] * recency + w["relevance"] * NEUTRAL_RELEVANCE + w["accuracy"] * accuracy + w["impact"] * impact
    )
    return {
        "recency": round(recency, 4),
        "relevance": _round_rule(NEUTRAL_RELEVANCE),
        "accuracy": round(accuracy, 4) if score is not None else _round_rule(accuracy),
        "impact": _round_rule(impact),
        "composite": round(composite, 4),
    }


_ROUNDED_RULES: dict[float, float] = {}


def _round_rule(value: float) -> float:
    """``round(value, 4)`` of a value from the rule tables, each rounded once (round() is ~0.5 us a call)."""
    rounded = _ROUNDED_RULES.get(value)
    if rounded is None:
        rounded = _ROUNDED_RULES[value] = round(value, 4)
    return rounded

"""The coordination minute: one thing that happened in a fleet of agents."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from functools import lru_cache
from typing import Any, TypeGuard

from contracts.errors import InvalidMinute
from contracts.ids import new_minute_id
from contracts.json_value import check_json

MAX_ENCODED_BYTES = 64 * 1024
MAX_ID_LENGTH = 64
MAX_NAME_LENGTH = 128
MAX_REFERENCES = 256

ID_PATTERN = re.compile(r"[0-9A-Za-z][0-9A-Za-z_.:\-]*")
# project_id names a directory of the log, so it must be a safe path component.
PROJECT_PATTERN = re.compile(r"[0-9A-Za-z][0-9A-Za-z_.\-]*")
# What a valid project id looks like, for every message that refuses one.
PROJECT_ID_RULE = f"letters, digits and _ . - (starting with a letter or digit, at most {MAX_NAME_LENGTH} chars)"
EVENT_TYPE_PATTERN = re.compile(r"[a-z][a-z0-9_.:\-]*")


class EventType(StrEnum):
    """Event types PVM knows: coordination events it categorizes, then knowledge changes; producers may send others.

    The knowledge changes (``fact_*``, ``task_memory_cleared``) are what the facts
    pool writes to long-term memory; their payloads are `contracts.fact_changes`.
    ``chunk_summarized`` is what the summarize pool writes for a model's chunk
    summary (`contracts.summaries`).
    """

    TASK_ASSIGNED = "task_assigned"
    TASK_STARTED = "task_started"
    TASK_COMPLETED = "task_completed"
    TASK_FAILED = "task_failed"
    CONFLICT_DETECTED = "conflict_detected"
    CONFLICT_RESOLVED = "conflict_resolved"
    DECISION = "decision"
    MESSAGE = "message"
    HANDOFF = "handoff"
    CAPABILITY_OBSERVED = "capability_observed"
    EVALUATION = "evaluation"
    KNOWLEDGE = "knowledge"
    # Knowledge changes: every change to long-term memory is a minute, so replay rebuilds the facts
    # without calling a model. Payloads and their parser: contracts/fact_changes.py.
    FACT_ASSERTED = "fact_asserted"
    FACT_CONFIRMED = "fact_confirmed"
    FACT_PROMOTED = "fact_promoted"
    FACT_TIER_PROMOTED = "fact_tier_promoted"
    FACT_SUPERSEDED = "fact_superseded"
    FACT_CONTRADICTED = "fact_contradicted"
    FACT_RETRACTED = "fact_retracted"
    FACT_EDITED = "fact_edited"
    FACT_LEARNED = "fact_learned"
    TASK_MEMORY_CLEARED = "task_memory_cleared"
    # A chunk summary a model wrote (the summarize pool): replay reads it instead of calling the model again.
    # Payload and parser: contracts/summaries.py.
    CHUNK_SUMMARIZED = "chunk_summarized"
    # A PAIR round (pvm/pair.py): a judge's score and gaps, and a revision. Payloads and parser: contracts/pair.py.
    PAIR_EVALUATION = "pair_evaluation"
    PAIR_REVISION = "pair_revision"


KNOWN_EVENT_TYPES = frozenset(e.value for e in EventType)


class Scope(StrEnum):
    """How widely a minute's memory applies."""

    TASK = "task"
    PROJECT = "project"
    GLOBAL = "global"


_SCOPES = frozenset(s.value for s in Scope)

# data keys with a contract type; any other key is free-form and passes through.
_DATA_TEXT_KEYS = ("task_id", "assignment_reasoning", "conflict_type", "resolution")


def iso_utc(at: datetime, timespec: str = "microseconds") -> str:
    """A time as a minute writes it: ISO 8601 in UTC with a ``Z`` (a naive one is local time, as `astimezone` reads
    it)."""
    return at.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def utc_now_iso() -> str:
    """The current time as an ISO 8601 UTC timestamp with microseconds."""
    return iso_utc(datetime.now(UTC))


def iso_from_ms(ms: int) -> str:
    """Unix milliseconds as an ISO 8601 UTC timestamp with milliseconds (``2026-11-27T10:00:00.000Z``)."""
    return iso_utc(datetime.fromtimestamp(ms / 1000, UTC), "milliseconds")


def parse_timestamp(value: str) -> datetime:
    """Parse a minute timestamp; it must be ISO 8601 with a UTC offset."""
    if not isinstance(value, str):
        raise InvalidMinute("timestamp", f"must be an ISO 8601 string, got {type(value).__name__}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidMinute("timestamp", f"{value[:40]!r} is not ISO 8601 (e.g. 2026-11-26T10:00:00.000Z)") from None
    if parsed.tzinfo is None:
        raise InvalidMinute("timestamp", f"{value[:40]!r} has no UTC offset; append 'Z' or '+00:00'")
    return parsed


def _check_id(field_name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise InvalidMinute(field_name, f"must be a string, got {type(value).__name__}")
    if not value:
        raise InvalidMinute(field_name, "must not be empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidMinute(field_name, f"is {len(value)} characters; the limit is {MAX_ID_LENGTH}")
    if ID_PATTERN.fullmatch(value) is None:
        raise InvalidMinute(
            field_name, f"{value[:40]!r} may only hold letters, digits and _ . : - (and start with a letter or digit)"
        )


def is_valid_project_id(value: object) -> TypeGuard[str]:
    """Whether `value` is a valid project id: the one rule, wherever a project id arrives.

    A minute, an API path, a CLI argument, a tokens file, a durable record, a
    directory name of the log or of the vector engine: every place asks this
    function (or `check_project_id`, which says why not). A project id names a
    directory of the log, so it is a safe path component: `PROJECT_ID_RULE`.
    """
    return isinstance(value, str) and len(value) <= MAX_NAME_LENGTH and _matches_project_pattern(value)


@lru_cache(maxsize=4096)  # asked for every minute and every point; a process sees few projects
def _matches_project_pattern(value: str) -> bool:
    return PROJECT_PATTERN.fullmatch(value) is not None


def check_project_id(value: Any, field: str = "project_id") -> str:
    """Return `value` if it is a valid project id (`is_valid_project_id`), else raise `InvalidMinute` naming `field`."""
    if is_valid_project_id(value):
        return value
    if not isinstance(value, str) or not value:
        raise InvalidMinute(field, "is required: every minute belongs to one project")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidMinute(field, f"is {len(value)} characters; the limit is {MAX_NAME_LENGTH}")
    raise InvalidMinute(field, f"{value[:40]!r} may only hold {PROJECT_ID_RULE}")


def _check_optional_text(field_name: str, value: Any, limit: int = MAX_NAME_LENGTH) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise InvalidMinute(field_name, f"must be a string or null, got {type(value).__name__}")
    if len(value) > limit:
        raise InvalidMinute(field_name, f"is {len(value)} characters; the limit is {limit}")


def validate_data(data: Any) -> None:
    """Check `Minute.data`: JSON at every depth (`contracts.json_value`), and the typed keys."""
    if not isinstance(data, dict):
        raise InvalidMinute("data", f"must be a mapping, got {type(data).__name__}")
    check_json("data", data)
    for key in _DATA_TEXT_KEYS:
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise InvalidMinute(f"data.{key}", f"must be a string or null, got {type(value).__name__}")
    score = data.get("success_criteria_met")
    if score is not None:
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise InvalidMinute(
                "data.success_criteria_met", f"must be a number from 0 to 100, got {type(score).__name__}"
            )
        if not 0 <= score <= 100:
            raise InvalidMinute("data.success_criteria_met", f"{score} is outside 0-100")


@dataclass(frozen=True, slots=True)
class Minute:
    """A coordination minute, validated on construction.

    Build one with keyword arguments; `id` and `timestamp` default to a new
    sortable id and the current UTC time. Any invalid field raises
    `InvalidMinute` naming the field.
    """

    project_id: str
    event_type: str
    id: str = field(default_factory=new_minute_id)
    timestamp: str = field(default_factory=utc_now_iso)
    agent_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    context_references: tuple[str, ...] = ()
    memory_note: str | None = None
    thread_id: str | None = None
    scope: str = Scope.PROJECT.value

    def __post_init__(self) -> None:
        _check_id("id", self.id)
        parse_timestamp(self.timestamp)
        if not isinstance(self.event_type, str) or not self.event_type:
            raise InvalidMinute("event_type", "is required: one of " + ", ".join(sorted(KNOWN_EVENT_TYPES)))
        if self.event_type not in KNOWN_EVENT_TYPES and (
            len(self.event_type) > MAX_ID_LENGTH or EVENT_TYPE_PATTERN.fullmatch(self.event_type) is None
        ):
            raise InvalidMinute(
                "event_type", f"{self.event_type[:40]!r} must be lower_snake_case, at most {MAX_ID_LENGTH} chars"
            )
        check_project_id(self.project_id)
        _check_optional_text("agent_id", self.agent_id)
        _check_optional_text("thread_id", self.thread_id)
        _check_optional_text("memory_note", self.memory_note, limit=MAX_ENCODED_BYTES)
        validate_data(self.data)
        refs = self.context_references
        if isinstance(refs, list):
            refs = tuple(refs)
            object.__setattr__(self, "context_references", refs)
        if not isinstance(refs, tuple):
            raise InvalidMinute("context_references", f"must be a list of minute ids, got {type(refs).__name__}")
        if len(refs) > MAX_REFERENCES:
            raise InvalidMinute("context_references", f"has {len(refs)} ids; the limit is {MAX_REFERENCES}")
        for i, ref in enumerate(refs):
            _check_id(f"context_references[{i}]", ref)
        if not isinstance(self.scope, str) or self.scope not in _SCOPES:
            raise InvalidMinute("scope", f"{self.scope!r} must be one of task, project, global")

    @property
    def known_event_type(self) -> bool:
        """True when PVM has rules for this event type."""
        return self.event_type in KNOWN_EVENT_TYPES

    def to_dict(self) -> dict[str, Any]:
        """The minute as a plain mapping in wire field order, optional fields omitted when null."""
        out: dict[str, Any] = {
            "id": self.id,
            "timestamp": self.timestamp,
            "event_type": self.event_type,
            "project_id": self.project_id,
        }
        if self.agent_id is not None:
            out["agent_id"] = self.agent_id
        out["data"] = self.data
        out["context_references"] = list(self.context_references)
        if self.memory_note is not None:
            out["memory_note"] = self.memory_note
        if self.thread_id is not None:
            out["thread_id"] = self.thread_id
        out["scope"] = self.scope
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> Minute:
        """Build a minute from a mapping (JSON or msgpack), rejecting unknown top-level fields."""
        if not isinstance(raw, dict):
            raise InvalidMinute("minute", f"must be a mapping, got {type(raw).__name__}")
        unknown = set(raw) - _FIELDS
        if unknown:
            name = sorted(str(k) for k in unknown)[0]
            raise InvalidMinute(name, "is not a minute field; put free-form values under 'data'")
        for required in ("id", "timestamp", "event_type", "project_id"):
            if raw.get(required) is None:
                raise InvalidMinute(required, "is required")
        data = raw.get("data")
        if data is not None and not isinstance(data, dict):
            raise InvalidMinute("data", f"must be a mapping, got {type(data).__name__}")
        # As `cls(**fields)` would build it (a null field takes its default), then every check of construction
        # (`__post_init__`): the dataclass's keyword __init__ cost a third of validating a minute.
        minute = object.__new__(cls)
        _assign(minute, raw, refs_as_tuple=False)
        minute.__post_init__()
        return minute

    @classmethod
    def trusted(cls, raw: dict[str, Any]) -> Minute:
        """Build a minute from a mapping that was validated before, without validating it again.

        For minutes PVM itself made durable (the dispatcher validated each one
        before the log took it), read back by a pool that must not spend a
        revalidation per minute. Never for input from outside PVM: producers,
        the HTTP API and anything else untrusted go through `from_dict` (or
        `contracts.decode_minute`). Only the shape is checked: an unknown or
        missing required field raises `InvalidMinute`.
        """
        if not _FIELDS.issuperset(raw):
            name = sorted(str(k) for k in set(raw) - _FIELDS)[0]
            raise InvalidMinute(name, "is not a minute field; put free-form values under 'data'")
        minute = object.__new__(cls)
        try:
            _assign(minute, raw, refs_as_tuple=True)
        except KeyError as missing:
            raise InvalidMinute(str(missing.args[0]), "is required") from None
        return minute


# The slots' own setters, for `Minute.trusted`. A frozen dataclass refuses
# setattr; object.__setattr__ (what its __init__ uses) looks each name up on the
# class first, and ten of those were two thirds of building a trusted minute.
# Calling the slot's descriptor skips the lookup: 2.8 -> 2.1 us a minute.
(
    _set_id,
    _set_timestamp,
    _set_event_type,
    _set_project_id,
    _set_agent_id,
    _set_data,
    _set_context_references,
    _set_memory_note,
    _set_thread_id,
    _set_scope,
) = (
    Minute.__dict__[name].__set__
    for name in (
        "id",
        "timestamp",
        "event_type",
        "project_id",
        "agent_id",
        "data",
        "context_references",
        "memory_note",
        "thread_id",
        "scope",
    )
)
_DEFAULT_SCOPE = Scope.PROJECT.value


def _assign(minute: Minute, raw: dict[str, Any], *, refs_as_tuple: bool) -> None:
    """Set every field of a new `minute` from `raw` as the keyword constructor would (a missing or null optional
    field takes its default); a missing required field raises `KeyError`. No check: `from_dict` runs
    `__post_init__` after, `trusted` none. `refs_as_tuple` makes the references a tuple here (`__post_init__`
    does it, and checks their type, for `from_dict`)."""
    _set_id(minute, raw["id"])
    _set_timestamp(minute, raw["timestamp"])
    _set_event_type(minute, raw["event_type"])
    _set_project_id(minute, raw["project_id"])
    get = raw.get
    _set_agent_id(minute, get("agent_id"))
    data = get("data")
    _set_data(minute, {} if data is None else data)
    refs = get("context_references")
    _set_context_references(minute, () if refs is None else tuple(refs) if refs_as_tuple else refs)
    _set_memory_note(minute, get("memory_note"))
    _set_thread_id(minute, get("thread_id"))
    scope = get("scope")
    _set_scope(minute, _DEFAULT_SCOPE if scope is None else scope)


_FIELDS = frozenset(
    (
        "id",
        "timestamp",
        "event_type",
        "agent_id",
        "project_id",
        "data",
        "context_references",
        "memory_note",
        "thread_id",
        "scope",
    )
)

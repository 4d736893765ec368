"""The fact: one typed thing PVM knows, in one slot of one tier key, with when it holds and where it came from.

Nouns only, like `contracts.minute`. A `Fact` validates itself on construction
and every error names the field (`InvalidFact`). Its identity is deterministic:
`fact_id` of its tier key, its slot and its normalized value, so the same
knowledge stated twice is one fact (a duplicate), a new value in the same slot
is a new fact (which may supersede the old one), and nothing is ever compared
across tier keys. How facts change over time is written as minutes: see
`contracts.fact_changes`.

Rules in one place:

- **Normalization** (`normalize_text`): Unicode NFKC, then case folding, then
  NFKC again (so the result is stable under a second pass), then every run of
  whitespace collapsed to one space and the ends stripped. Subjects,
  attributes and text values use it; `normalize_value` also writes numbers and
  booleans canonically. The fact keeps its text as given for display; only
  identity uses the normalized form.
- **Slots** (`Slot`): subject + attribute, normalized. Conflicts are decided by
  slot only, never by similarity (ARCHITECTURE invariant 10).
- **Tier keys** (`TierKey`): ``task:<project>:<task>``, ``project:<project>``
  or ``global``. Dedupe, supersession and search never cross a key.
- **Ids** (`fact_id`): a UUID (version 5) in `FACT_NAMESPACE` over the
  netstrings of tier key, slot subject, slot attribute and normalized value,
  and for a value's later periods in its slot (`Fact.period` > 0: it held,
  was replaced, and came back) one more netstring, the period.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import re
import unicodedata
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from contracts.errors import InvalidFact, InvalidMinute
from contracts.minute import ID_PATTERN, MAX_ID_LENGTH, MAX_NAME_LENGTH, check_project_id, parse_timestamp, utc_now_iso

# Limits keep the largest valid fact inside one knowledge-change minute (64 KiB encoded,
# `MAX_ENCODED_BYTES`), with the source ids repeated in its context_references and the
# text in its memory_note: tests/contracts/test_fact_changes.py builds that fact and encodes it.
MAX_FACT_TEXT = 2048
MAX_FACT_VALUE = 1024
MAX_TAGS = 16
MAX_TAG_LENGTH = 64
MAX_RELATIONSHIPS = 32
MAX_FACT_SOURCES = 128
MAX_PERIOD = 2**63 - 1  # fits msgpack's and JSON's integers
# A task id in a tier key: the limit the minute puts on its other names (agent_id, thread_id).
MAX_TASK_ID_LENGTH = MAX_NAME_LENGTH

# Fact ids: uuid5 in this namespace. Changing the namespace, the name layout or the
# normalization changes every id, so it is a change of the contract's version.
FACT_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://pvm.dev/contracts/fact/v1")
FACT_ID_PATTERN = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")

# Read statistics: a reader bumps them, no minute records them, so a fact rebuilt by replay
# has them at zero. Compare replayed facts with these fields left out.
READ_FIELDS = ("access_count", "last_accessed_at")


class FactType(StrEnum):
    """What kind of knowledge a fact is."""

    FACT = "fact"
    DECISION = "decision"
    PREFERENCE = "preference"
    ENTITY = "entity"
    PROCEDURE = "procedure"
    CONSTRAINT = "constraint"
    GOAL = "goal"


# How much a fact of each type matters before anyone scores it, 0..1.
DEFAULT_IMPORTANCE: dict[FactType, float] = {
    FactType.FACT: 0.5,
    FactType.DECISION: 0.7,
    FactType.PREFERENCE: 0.6,
    FactType.ENTITY: 0.5,
    FactType.PROCEDURE: 0.5,
    FactType.CONSTRAINT: 0.6,
    FactType.GOAL: 0.8,
}

# Whether a newer value in the slot replaces an older one, by type: the auth service has one
# session TTL and one current decision about retries, but a service may carry many
# constraints ("never deploy on Friday", "never skip review") and a project many goals.
SINGLE_VALUED_BY_TYPE: dict[FactType, bool] = {
    FactType.FACT: True,
    FactType.DECISION: True,
    FactType.PREFERENCE: True,
    FactType.ENTITY: True,
    FactType.PROCEDURE: True,
    FactType.CONSTRAINT: False,
    FactType.GOAL: False,
}

# Attributes that name a collection hold many values whatever the type (normalized form).
MULTI_VALUED_ATTRIBUTES = frozenset(
    {
        "alias",
        "aliases",
        "dependencies",
        "dependency",
        "depends on",
        "depends_on",
        "example",
        "examples",
        "failure_cause",  # a kind of task fails for several reasons at once
        "label",
        "labels",
        "member",
        "members",
        "note",
        "notes",
        "owner",
        "owners",
        "statement",  # what someone said of themselves (workers.rules.statements): each sentence its own value
        "statements",
        "tag",
        "tags",
    }
)


class FactStatus(StrEnum):
    """Where a fact is in its life: pending until promoted; superseded or retracted once it no longer holds."""

    PENDING = "pending"
    PROMOTED = "promoted"
    SUPERSEDED = "superseded"
    RETRACTED = "retracted"


class Tier(StrEnum):
    """How widely a fact applies: one task, one project, or every project of the deployment."""

    TASK = "task"
    PROJECT = "project"
    GLOBAL = "global"


class RelationKind(StrEnum):
    """How one fact relates to another."""

    RELATED_TO = "related_to"
    DEPENDS_ON = "depends_on"
    CONTRADICTS = "contradicts"
    SUPERSEDES = "supersedes"
    # A newer statement about the target's slot whose value PVM could not read as a change: the target is shown
    # with it, not as settled (it retires nothing).
    QUESTIONS = "questions"


def default_single_valued(type: FactType | str, attribute: str) -> bool:
    """Whether a newer value supersedes an older one in a slot with this attribute, for a fact of `type`.

    False for an attribute in `MULTI_VALUED_ATTRIBUTES` (after `normalize_text`),
    else `SINGLE_VALUED_BY_TYPE`. A fact keeps the answer in `single_valued`, so a
    later change of these defaults never changes what a stored fact means.
    """
    if normalize_text(attribute) in MULTI_VALUED_ATTRIBUTES:
        return False
    return SINGLE_VALUED_BY_TYPE[FactType(type)]


# -- normalization ----------------------------------------------------------------------------------------------


def normalize_text(text: str) -> str:
    """`text` in the one form identity uses: NFKC, case-folded, NFKC again, whitespace collapsed and stripped.

    ``"  Service:Auth \\t Session   TTL "`` -> ``"service:auth session ttl"``;
    full-width letters -> their ASCII forms; ``"Straße"`` -> ``"strasse"``.
    Whitespace is what `str.isspace` calls whitespace. Applying it twice changes nothing.
    """
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return " ".join(folded.split())


_ENDED = re.compile(r"[.!?\u2026][\"'\u201d\u2019)\]]*$")


def ends_as_sentence(text: str) -> bool:
    """Whether `text` ends as a sentence: ., !, ? or …, closing quotes or brackets after it allowed."""
    return bool(_ENDED.search(text.strip()))


def as_sentence(text: str) -> str:
    """`text` ending as a sentence: a note written without a stop ("reviewer failed the login fix") gets one, so
    texts set side by side (a summary, a gap's memories) do not run together."""
    text = text.strip()
    return text if not text or ends_as_sentence(text) else text + "."


def sentence_key(text: str) -> str:
    """What makes two sentences the same one: `normalize_text` without the final stop (a summary or a gap's
    memories say each once)."""
    return normalize_text(text).rstrip(" .!?;:\u2026")


def normalize_value(value: str | int | float | bool) -> str:
    """A value in the one text form identity uses.

    Text: `normalize_text`. Booleans: ``true`` / ``false``. Integers: decimal.
    Floats: an integral float as the integer (``16.0`` -> ``16``, ``-0.0`` ->
    ``0``), any other as its shortest round-trip form (``0.25``). NaN and
    infinities have no canonical form and are refused. Text is never read as a
    number: ``"16.0"`` stays ``"16.0"``.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        _check_utf8(value, "value")
        return normalize_text(value)
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidFact("value", f"{value!r} has no canonical form; send a finite number or text")
        return str(int(value)) if value.is_integer() else repr(float(value))
    raise InvalidFact("value", f"must be text, a number or a boolean, got {type(value).__name__}")


def _netstrings(*parts: str) -> str:
    """`len:part,` for each part (length in UTF-8 bytes): an unambiguous join of free text, easy in any language."""
    return "".join(f"{len(p.encode('utf-8'))}:{p}," for p in parts)


# -- slots --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Slot:
    """Where a value lives: a subject and one of its attributes, both normalized (`normalize_text`).

    Two facts conflict only when they share a tier key and a slot. ``Slot("Service:Auth",
    "Session TTL") == Slot("service:auth", "session ttl")``.
    """

    subject: str
    attribute: str

    def __post_init__(self) -> None:
        for name in ("subject", "attribute"):
            raw = getattr(self, name)
            if not isinstance(raw, str):
                raise InvalidFact(name, f"must be a string, got {type(raw).__name__}")
            _check_utf8(raw, name)
            normalized = normalize_text(raw)
            if not normalized:
                raise InvalidFact(name, "must not be empty or blank")
            object.__setattr__(self, name, normalized)

    def __str__(self) -> str:
        return f"{self.subject} / {self.attribute}"

    @property
    def digest(self) -> str:
        """32 hex characters naming the slot in Redis keys: SHA-256 of the netstrings of subject and attribute."""
        return hashlib.sha256(_netstrings(self.subject, self.attribute).encode("utf-8")).hexdigest()[:32]


# -- tier keys ----------------------------------------------------------------------------------------------------


def check_task_id(value: Any, field: str = "tier_key") -> str:
    """Return `value` if it can name a task in a tier key, else raise `InvalidFact` naming `field`.

    The task id a minute states (``data.task_id``: a string with something
    other than whitespace in it), carried verbatim, at most `MAX_TASK_ID_LENGTH`
    characters. A minute naming a longer task keeps its facts at the project tier.
    """
    if not isinstance(value, str) or not value:
        raise InvalidFact(field, "a task key names its task: 'task:<project>:<task id>'")
    if value.isspace():
        raise InvalidFact(field, f"task id {value!r} is blank; name the task")
    if len(value) > MAX_TASK_ID_LENGTH:
        raise InvalidFact(field, f"task id is {len(value)} characters; the limit is {MAX_TASK_ID_LENGTH}")
    _check_utf8(value, field)
    return value


def is_valid_task_id(value: object) -> bool:
    """Whether `value` can name a task in a tier key (`check_task_id`)."""
    try:
        check_task_id(value)
    except InvalidFact:
        return False
    return True


@dataclass(frozen=True, slots=True)
class TierKey:
    """The scope a fact lives in: a task of a project, a project, or the deployment-wide global tier.

    Build one with `for_task`, `for_project`, `GLOBAL_KEY` or `parse`. The
    string form (``task:<project>:<task>``, ``project:<project>``, ``global``)
    is what ids, keys and payloads carry; project ids follow the contract's one
    rule (`check_project_id`), which keeps ``:`` out of them, so the task id is
    everything after the second colon.
    """

    tier: Tier
    project_id: str | None = None
    task_id: str | None = None

    def __post_init__(self) -> None:
        try:
            tier = Tier(self.tier)
        except ValueError:
            raise InvalidFact("tier_key", f"tier {self.tier!r} must be one of task, project, global") from None
        object.__setattr__(self, "tier", tier)
        if tier is Tier.GLOBAL:
            if self.project_id is not None or self.task_id is not None:
                raise InvalidFact("tier_key", "the global tier has no project or task; write 'global'")
            return
        try:
            check_project_id(self.project_id)
        except InvalidMinute as exc:
            raise InvalidFact("tier_key", f"project id: {exc.problem}") from None
        if tier is Tier.TASK:
            check_task_id(self.task_id)
        elif self.task_id is not None:
            raise InvalidFact("tier_key", "only a task key names a task; use 'task:<project>:<task id>'")

    @classmethod
    def for_task(cls, project_id: str, task_id: str) -> TierKey:
        return cls(Tier.TASK, project_id, task_id)

    @classmethod
    def for_project(cls, project_id: str) -> TierKey:
        return cls(Tier.PROJECT, project_id)

    @classmethod
    def parse(cls, text: Any) -> TierKey:
        """The key a string form names; raises `InvalidFact` naming ``tier_key``."""
        if not isinstance(text, str):
            raise InvalidFact("tier_key", f"must be a string such as 'project:<project>', got {type(text).__name__}")
        if text == "global":
            return GLOBAL_KEY
        tier, sep, rest = text.partition(":")
        if tier == "global":
            raise InvalidFact("tier_key", "the global tier has no project or task; write 'global'")
        if not sep or tier not in (Tier.TASK, Tier.PROJECT):
            raise InvalidFact(
                "tier_key", f"{text[:40]!r} must be one of 'task:<project>:<task>', 'project:<project>', 'global'"
            )
        if tier == Tier.PROJECT:
            if ":" in rest:
                raise InvalidFact("tier_key", f"project id {rest[:40]!r} holds ':'; a task key is 'task:<p>:<t>'")
            return cls(Tier.PROJECT, rest)
        project, sep, task = rest.partition(":")
        if not sep:
            raise InvalidFact("tier_key", "a task key names its task id: 'task:<project>:<task id>'")
        return cls(Tier.TASK, project, task)

    def __str__(self) -> str:
        if self.tier is Tier.GLOBAL:
            return "global"
        if self.tier is Tier.PROJECT:
            return f"project:{self.project_id}"
        return f"task:{self.project_id}:{self.task_id}"

    @property
    def parent(self) -> TierKey | None:
        """The key a fact is promoted to from this one: task -> its project -> global -> None."""
        if self.tier is Tier.TASK:
            return TierKey(Tier.PROJECT, self.project_id)
        if self.tier is Tier.PROJECT:
            return GLOBAL_KEY
        return None


GLOBAL_KEY = TierKey(Tier.GLOBAL)

FACT_ID_MEMO = 65_536  # ids remembered by their normalized parts (a fact is validated each time it is made or copied)


# -- ids ----------------------------------------------------------------------------------------------------------


def fact_id(tier_key: TierKey, slot: Slot, value: str | int | float | bool, period: int = 0) -> str:
    """The id of the fact holding `value` in `slot` of `tier_key` for its `period`-th time: a lowercase UUID string.

    ``uuid5(FACT_NAMESPACE, netstrings(str(tier_key), slot.subject,
    slot.attribute, normalize_value(value)))`` where each netstring is
    ``<UTF-8 byte length>:<text>,``. `value` may be raw or normalized (the
    normalization is idempotent). A later period (`period` > 0: the value held,
    was replaced, and came back) appends one more netstring, ``str(period)``;
    period 0 is the name above, so the first period of every value keeps the id
    it always had.

    Why a UUID: the fact is a Qdrant point of its own, and Qdrant point ids are
    unsigned 64-bit integers or UUIDs; a UUID keeps 122 bits of the digest where
    an integer would keep 64. Why uuid5: it is standard (RFC 9562), so a producer in
    any language derives the same id; the namespace keeps fact points apart from
    minute points (`pvm.vectors.MINUTE_NAMESPACE`). Why netstrings: subjects and
    values are free text, so a separator such as ``|`` could turn two different
    facts into one name.
    """
    nth = _period(period)
    return _named_id(str(tier_key), slot.subject, slot.attribute, normalize_value(value), nth)


@functools.lru_cache(maxsize=FACT_ID_MEMO)
def _named_id(tier_key: str, subject: str, attribute: str, value: str, period: int) -> str:
    """`fact_id` on normalized parts; remembered, since a fact checks its id each time it is made or copied."""
    parts = [tier_key, subject, attribute, value] + ([str(period)] if period else [])
    return str(uuid.uuid5(FACT_NAMESPACE, _netstrings(*parts)))


def check_fact_id(value: Any, field: str) -> str:
    """Return `value` if it has the shape of a fact id (`FACT_ID_PATTERN`), else raise `InvalidFact` naming `field`."""
    if not isinstance(value, str):
        raise InvalidFact(field, f"must be a fact id (a lowercase UUID), got {type(value).__name__}")
    if FACT_ID_PATTERN.fullmatch(value) is None:
        raise InvalidFact(field, f"{value[:40]!r} is not a fact id (a lowercase version-5 UUID from fact_id)")
    return value


# -- field rules --------------------------------------------------------------------------------------------------


def _enum(kind: type[StrEnum], field: str) -> Callable[[Any], Any]:
    names = ", ".join(m.value for m in kind)

    def check(value: Any) -> Any:
        try:
            return kind(value)
        except ValueError:
            raise InvalidFact(field, f"{value!r} must be one of {names}") from None

    return check


def _check_utf8(value: str, field: str) -> None:
    # JSON parsers accept "\ud800"; msgpack (UTF-8) cannot carry it, nor can the id's hash.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidFact(
            field, f"holds a lone surrogate ({value[exc.start]!r}) at {exc.start}, which UTF-8 cannot encode"
        ) from None


def _text(field: str, limit: int) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise InvalidFact(field, f"must be a string, got {type(value).__name__}")
        if not value or value.isspace():
            raise InvalidFact(field, "must not be empty or blank")
        if len(value) > limit:
            raise InvalidFact(field, f"is {len(value)} characters; the limit is {limit}")
        _check_utf8(value, field)
        return value

    return check


def _unit(field: str) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidFact(field, f"must be a number from 0 to 1, got {type(value).__name__}")
        if not 0 <= value <= 1:  # NaN fails this too
            raise InvalidFact(field, f"{value!r} is outside 0..1")
        return float(value)

    return check


def check_time(value: Any, field: str) -> datetime:
    """Parse an ISO 8601 timestamp with a UTC offset (the minute's timestamp rule), naming `field` when it is not."""
    try:
        return parse_timestamp(value)
    except InvalidMinute as exc:
        raise InvalidFact(field, exc.problem) from None


def _time(field: str, optional: bool = False) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        check_time(value, field)
        return str(value)

    return check


def _tier_key(value: Any) -> TierKey:
    if isinstance(value, TierKey):
        return value
    return TierKey.parse(value)


def _sequence(value: Any, field: str, noun: str, limit: int) -> tuple[Any, ...]:
    if not isinstance(value, (list, tuple)):
        raise InvalidFact(field, f"must be a list of {noun}, got {type(value).__name__}")
    items = tuple(value)
    if len(items) > limit:
        raise InvalidFact(field, f"has {len(items)} {noun}; the limit is {limit}")
    return items


def _tags(value: Any) -> tuple[str, ...]:
    tags = _sequence(value, "tags", "tags", MAX_TAGS)
    seen: set[str] = set()
    for i, tag in enumerate(tags):
        _text(f"tags[{i}]", MAX_TAG_LENGTH)(tag)
        if tag in seen:
            raise InvalidFact(f"tags[{i}]", f"{tag[:40]!r} appears twice; list each tag once")
        seen.add(tag)
    return tags


def check_minute_ids(value: Any, field: str, limit: int = MAX_FACT_SOURCES) -> tuple[str, ...]:
    """Distinct minute ids (the minute's id rule), 1 to `limit` of them; else `InvalidFact` naming `field`."""
    ids = _sequence(value, field, "minute ids", limit)
    if not ids:
        raise InvalidFact(field, "must name at least one minute: the minute the knowledge came from")
    seen: set[str] = set()
    for i, mid in enumerate(ids):
        if not isinstance(mid, str) or not mid or len(mid) > MAX_ID_LENGTH or ID_PATTERN.fullmatch(mid) is None:
            raise InvalidFact(
                f"{field}[{i}]",
                f"{str(mid)[:40]!r} is not a minute id (1-{MAX_ID_LENGTH} of letters, digits and _ . : -)",
            )
        if mid in seen:
            raise InvalidFact(f"{field}[{i}]", f"{mid!r} appears twice; list each minute once")
        seen.add(mid)
    return ids


def _relationships(value: Any) -> tuple[Relationship, ...]:
    items = _sequence(value, "relationships", "relationships", MAX_RELATIONSHIPS)
    out: list[Relationship] = []
    seen: set[tuple[str, str]] = set()
    for i, item in enumerate(items):
        try:
            rel = item if isinstance(item, Relationship) else Relationship.from_dict(item)
        except InvalidFact as exc:
            path = f"relationships[{i}]" + (f".{exc.field}" if exc.field else "")
            raise InvalidFact(path, exc.problem) from None
        if (rel.kind, rel.fact_id) in seen:
            raise InvalidFact(
                f"relationships[{i}]", f"{rel.kind} {rel.fact_id} appears twice; keep one, with its strength"
            )
        seen.add((rel.kind, rel.fact_id))
        out.append(rel)
    return tuple(out)


def _count(value: Any) -> int:
    # JSON has one number type: 3.0 is the whole number 3 (as JSON Schema's "integer" reads it).
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidFact("access_count", f"must be a whole number, got {type(value).__name__}")
    if not 0 <= value <= 2**63 - 1:
        raise InvalidFact("access_count", f"{value} is outside 0..{2**63 - 1}")
    return int(value)


def _period(value: Any) -> int:
    # JSON has one number type: 1.0 is the whole number 1 (as JSON Schema's "integer" reads it).
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidFact("period", f"must be a whole number (0: the value's first period), got {type(value).__name__}")
    if not 0 <= value <= MAX_PERIOD:
        raise InvalidFact("period", f"{value} is outside 0..{MAX_PERIOD}; 0 is a value's first period in its slot")
    return int(value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidFact("single_valued", f"must be true or false, got {type(value).__name__}")
    return value


def _optional_fact_id(value: Any) -> str | None:
    return None if value is None else check_fact_id(value, "promoted_from")


# Each field's rule: takes the value as given (or as JSON), returns the value the record holds,
# raises `InvalidFact` naming the field. The `id` and the rules across fields come after.
FIELD_RULES: dict[str, Callable[[Any], Any]] = {
    "type": _enum(FactType, "type"),
    "text": _text("text", MAX_FACT_TEXT),
    "subject": _text("subject", MAX_NAME_LENGTH),
    "attribute": _text("attribute", MAX_NAME_LENGTH),
    "value": _text("value", MAX_FACT_VALUE),
    "tier_key": _tier_key,
    "confidence": _unit("confidence"),
    "importance": _unit("importance"),
    "status": _enum(FactStatus, "status"),
    "valid_from": _time("valid_from"),
    "valid_until": _time("valid_until", optional=True),
    "recorded_at": _time("recorded_at"),
    "relationships": _relationships,
    "tags": _tags,
    "source_minute_ids": lambda v: check_minute_ids(v, "source_minute_ids"),
    "access_count": _count,
    "last_accessed_at": _time("last_accessed_at", optional=True),
    "promoted_from": _optional_fact_id,
    "single_valued": _flag,
    "period": _period,
}


# -- records ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Relationship:
    """A typed, weighted link from one fact to another (by id, within the same tier key)."""

    kind: RelationKind
    fact_id: str
    strength: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", _enum(RelationKind, "kind")(self.kind))
        check_fact_id(self.fact_id, "fact_id")
        object.__setattr__(self, "strength", _unit("strength")(self.strength))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "fact_id": self.fact_id, "strength": self.strength}

    @classmethod
    def from_dict(cls, raw: Any) -> Relationship:
        if not isinstance(raw, dict):
            raise InvalidFact("", f"must be a mapping of kind, fact_id and strength, got {type(raw).__name__}")
        unknown = sorted(str(k) for k in set(raw) - {"kind", "fact_id", "strength"})
        if unknown:
            raise InvalidFact(unknown[0], "is not a relationship field (kind, fact_id, strength)")
        for name in ("kind", "fact_id", "strength"):
            if name not in raw:
                raise InvalidFact(name, "is required")
        return cls(raw["kind"], raw["fact_id"], raw["strength"])


# The fields a fact's id is made of (and the id): changing one makes another fact.
_IDENTITY = frozenset({"id", "tier_key", "subject", "attribute", "value", "period"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Fact:
    """One piece of knowledge, validated on construction; build new ones with `Fact.new`.

    `id` must be `fact_id(tier_key, slot, value, period)`. `period` counts the
    times the value held in its slot before this one (0: the first; a value that
    was replaced and comes back is a new fact, its next period). `valid_from` / `valid_until`
    say when the fact holds in the world (``valid_until`` None: it still holds;
    otherwise after ``valid_from``); `recorded_at` says when PVM learned it.
    `source_minute_ids` names at least one minute it came from: the extracted
    minutes, or for a fact asserted by hand or learned, the knowledge-change
    minute that carries it. `single_valued` says whether a newer value in the slot
    supersedes this one (`default_single_valued` unless given). `access_count` and
    `last_accessed_at` are read statistics (`READ_FIELDS`), not knowledge.
    """

    id: str
    type: FactType
    text: str
    subject: str
    attribute: str
    value: str
    tier_key: TierKey
    confidence: float
    importance: float
    status: FactStatus
    valid_from: str
    valid_until: str | None = None
    recorded_at: str
    relationships: tuple[Relationship, ...] = ()
    tags: tuple[str, ...] = ()
    source_minute_ids: tuple[str, ...]
    access_count: int = 0
    last_accessed_at: str | None = None
    promoted_from: str | None = None
    single_valued: bool
    period: int = 0
    _slot: Slot = field(init=False, repr=False, compare=False)

    FIELDS: ClassVar[tuple[str, ...]] = (
        "id",
        "type",
        "text",
        "subject",
        "attribute",
        "value",
        "tier_key",
        "confidence",
        "importance",
        "status",
        "valid_from",
        "valid_until",
        "recorded_at",
        "relationships",
        "tags",
        "source_minute_ids",
        "access_count",
        "last_accessed_at",
        "promoted_from",
        "single_valued",
        "period",
    )
    # Fields `to_dict` writes only when they differ from their default, and `from_dict` may go without.
    OPTIONAL_FIELDS: ClassVar[tuple[str, ...]] = ("period",)

    def __post_init__(self) -> None:
        for name, rule in FIELD_RULES.items():
            object.__setattr__(self, name, rule(getattr(self, name)))
        slot = Slot(self.subject, self.attribute)
        object.__setattr__(self, "_slot", slot)
        check_fact_id(self.id, "id")
        expected = fact_id(self.tier_key, slot, self.value, self.period)
        if self.id != expected:
            raise InvalidFact(
                "id",
                f"{self.id} is not this fact's id; fact_id(tier_key, slot, value, period) is {expected} "
                "(build facts with Fact.new, change them with with_)",
            )
        self._check_across()

    def _check_across(self) -> None:
        """What no one field can say alone: validity that lasts, and no link to the fact itself."""
        if self.valid_until is not None and check_time(self.valid_until, "valid_until") <= check_time(
            self.valid_from, "valid_from"
        ):
            raise InvalidFact(
                "valid_until", f"{self.valid_until} is not after valid_from {self.valid_from}; a fact holds for a while"
            )
        if self.promoted_from == self.id:
            raise InvalidFact("promoted_from", "a fact is not promoted from itself; name the fact it was copied from")
        for i, rel in enumerate(self.relationships):
            if rel.fact_id == self.id:
                raise InvalidFact(f"relationships[{i}].fact_id", "a fact does not relate to itself")

    @classmethod
    def new(
        cls,
        *,
        type: FactType | str,
        text: str,
        subject: str,
        attribute: str,
        value: str | int | float | bool,
        tier_key: TierKey,
        confidence: float,
        source_minute_ids: tuple[str, ...] | list[str],
        importance: float | None = None,
        status: FactStatus | str = FactStatus.PENDING,
        valid_from: str | None = None,
        valid_until: str | None = None,
        recorded_at: str | None = None,
        relationships: tuple[Relationship, ...] | list[Relationship] = (),
        tags: tuple[str, ...] | list[str] = (),
        promoted_from: str | None = None,
        single_valued: bool | None = None,
        period: int = 0,
    ) -> Fact:
        """A fact with its id computed and the defaults filled in.

        `importance` defaults to `DEFAULT_IMPORTANCE` of the type, `single_valued` to
        `default_single_valued`, `recorded_at` to now and `valid_from` to `recorded_at`.
        A value that is not text is written in its canonical form (`normalize_value`).
        """
        kind = FIELD_RULES["type"](type)
        text_value = value if isinstance(value, str) else normalize_value(value)
        recorded = utc_now_iso() if recorded_at is None else recorded_at
        return cls(
            id=fact_id(_tier_key(tier_key), Slot(subject, attribute), text_value, period),
            type=kind,
            text=text,
            subject=subject,
            attribute=attribute,
            value=text_value,
            tier_key=tier_key,
            confidence=confidence,
            importance=DEFAULT_IMPORTANCE[kind] if importance is None else importance,
            status=FactStatus(status),
            valid_from=recorded if valid_from is None else valid_from,
            valid_until=valid_until,
            recorded_at=recorded,
            relationships=tuple(relationships),
            tags=tuple(tags),
            source_minute_ids=tuple(source_minute_ids),
            promoted_from=promoted_from,
            single_valued=default_single_valued(kind, attribute) if single_valued is None else single_valued,
            period=period,
        )

    @property
    def slot(self) -> Slot:
        """The normalized subject and attribute: conflicts are decided here and nowhere else."""
        return self._slot

    @property
    def tier(self) -> Tier:
        return self.tier_key.tier

    @property
    def project_id(self) -> str | None:
        return self.tier_key.project_id

    @property
    def task_id(self) -> str | None:
        return self.tier_key.task_id

    def holds_at(self, time: str | datetime) -> bool:
        """Whether the fact holds at `time`: ``valid_from <= time < valid_until`` (no valid_until: from then on)."""
        when = check_time(time, "time") if isinstance(time, str) else time
        if when.tzinfo is None:
            raise InvalidFact("time", f"{when.isoformat()} has no UTC offset; pass an aware datetime")
        if when < check_time(self.valid_from, "valid_from"):
            return False
        return self.valid_until is None or when < check_time(self.valid_until, "valid_until")

    def with_(self, **changes: Any) -> Fact:
        """A copy with `changes`, validated again.

        Changing the tier key, subject, attribute, value or period makes another fact, so
        its id is recomputed (a promotion copy is ``fact.with_(tier_key=parent,
        promoted_from=fact.id)``); an `id` passed in must be that id.
        """
        unknown = sorted(set(changes) - set(self.FIELDS))
        if unknown:
            raise InvalidFact(unknown[0], "is not a fact field; see Fact.FIELDS")
        if all(
            type(value) is type(getattr(self, name)) and value == getattr(self, name) for name, value in changes.items()
        ):
            return self  # nothing changes (a value's first period placed in its first period): the fact is immutable
        if not _IDENTITY & changes.keys():
            # The id and slot stay as validated: only the changed fields are checked again (a status, validity,
            # sources or links change many times in a fact's life, and a whole validation costs tens of us).
            copy = object.__new__(Fact)
            for name in self.FIELDS:
                object.__setattr__(copy, name, getattr(self, name))
            object.__setattr__(copy, "_slot", self._slot)
            for name, value in changes.items():
                rule = FIELD_RULES.get(name)
                object.__setattr__(copy, name, rule(value) if rule is not None else value)
            copy._check_across()
            return copy
        if "id" not in changes:
            merged = {name: changes.get(name, getattr(self, name)) for name in ("tier_key", "subject", "attribute")}
            slot = Slot(merged["subject"], merged["attribute"])
            value, period = changes.get("value", self.value), changes.get("period", self.period)
            changes["id"] = fact_id(_tier_key(merged["tier_key"]), slot, value, period)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fact as JSON-safe values, in `FIELDS` order: every field (null where absent), `period` only past 0.

        So a value's first period has the form it had before periods existed.
        """
        raw: dict[str, Any] = {
            "id": self.id,
            "type": self.type.value,
            "text": self.text,
            "subject": self.subject,
            "attribute": self.attribute,
            "value": self.value,
            "tier_key": str(self.tier_key),
            "confidence": self.confidence,
            "importance": self.importance,
            "status": self.status.value,
            "valid_from": self.valid_from,
            "valid_until": self.valid_until,
            "recorded_at": self.recorded_at,
            "relationships": [r.to_dict() for r in self.relationships],
            "tags": list(self.tags),
            "source_minute_ids": list(self.source_minute_ids),
            "access_count": self.access_count,
            "last_accessed_at": self.last_accessed_at,
            "promoted_from": self.promoted_from,
            "single_valued": self.single_valued,
        }
        if self.period:
            raw["period"] = self.period
        return raw

    @classmethod
    def from_dict(cls, raw: Any) -> Fact:
        """Build a fact from `to_dict`'s form (JSON or msgpack): every field present (`period` may be), nothing else."""
        if not isinstance(raw, dict):
            raise InvalidFact("fact", f"must be a mapping, got {type(raw).__name__}")
        unknown = sorted(str(k) for k in set(raw) - set(cls.FIELDS))
        if unknown:
            raise InvalidFact(unknown[0], "is not a fact field; see Fact.FIELDS")
        for name in cls.FIELDS:
            if name not in raw and name not in cls.OPTIONAL_FIELDS:
                raise InvalidFact(name, "is required (send null where it has no value)")
        return cls(**raw)

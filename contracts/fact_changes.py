"""Knowledge changes as minutes: the payload of each fact event type, its builder, and the one parser.

Every change to long-term memory is a minute in the log (ARCHITECTURE invariant
3), so the fact store is a projection of the log and replay rebuilds it without
calling a model. The facts pool writes these minutes and reads them back; it
never extracts facts from them (`is_fact_change`).

Each event type, its ``data``, and what it does:

- ``fact_asserted`` ``{"fact"}``: a new fact in a task or project key
  (extracted, or asserted by hand).
- ``fact_confirmed`` ``{"fact_id", "tier_key", "source_minute_ids",
  "confidence"}``: the same value stated again; merge sources, set confidence.
- ``fact_promoted`` ``{"fact_id", "tier_key", "reason"}``: pending -> promoted,
  at the threshold or by hand.
- ``fact_tier_promoted`` ``{"fact", "from_tier_key"}``: a copy one tier up
  (task -> project -> global) with its own id and ``promoted_from``.
- ``fact_superseded`` ``{"fact_id", "tier_key", "superseded_by",
  "valid_until"}``: a newer value in the slot; status superseded, validity closed.
- ``fact_contradicted`` ``{"fact_id", "tier_key", "contradicted_by"}``: two
  values whose validity overlaps, neither newer; both flagged.
- ``fact_retracted`` ``{"fact_id", "tier_key", "reason"}``: withdrawn.
- ``fact_edited`` ``{"fact_id", "tier_key", "changes"}``: a person's edit of
  `EDITABLE_FIELDS`.
- ``fact_learned`` ``{"key", "fact"}``: ``learn(key, value)``, a fact in slot
  (`LEARNED_SUBJECT`, key).
- ``task_memory_cleared`` ``{"tier_key", "reason"}``: a task's facts leave the
  current view (the log keeps them all).

A fact travels as `Fact.to_dict()`, a tier key as its string form. A change
minute lives in the log of the project its tier key names, with the tier as
its ``scope``; a change to a global fact is written to the project that made it
(for a tier promotion, the project it was promoted from). Payload fields are
exact: a missing or unknown key is refused, naming ``data.<field>``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from contracts.errors import InvalidFact, InvalidMinute
from contracts.facts import (
    FIELD_RULES,
    MAX_FACT_SOURCES,
    Fact,
    FactStatus,
    FactType,
    RelationKind,
    Relationship,
    Slot,
    Tier,
    TierKey,
    check_fact_id,
    check_minute_ids,
    check_time,
)
from contracts.ids import new_minute_id
from contracts.minute import EventType, Minute, utc_now_iso

# The subject of every learned key's slot: learn("deploy window", ...) fills slot (learned, deploy window).
LEARNED_SUBJECT = "learned"

# What a person may edit in place. The value, subject, attribute and tier key make the fact's id,
# so changing them is a new fact (retract and assert); status changes have their own minutes.
EDITABLE_FIELDS = ("text", "type", "confidence", "importance", "tags", "valid_from", "valid_until", "single_valued")


class PromotionReason(StrEnum):
    """Why a pending fact was promoted: its confidence reached the threshold, or someone promoted it."""

    THRESHOLD = "threshold"
    BY_HAND = "by_hand"


def learned_slot(key: str) -> Slot:
    """The slot `learn(key, ...)` writes and `recall(key)` reads: (`LEARNED_SUBJECT`, key), normalized."""
    return Slot(LEARNED_SUBJECT, key)


# -- payload fields --------------------------------------------------------------------------------------------


def _fields(data: Any, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """`data` if it holds exactly `required` (and maybe `optional`), else `InvalidFact` naming the key."""
    if not isinstance(data, dict):
        raise InvalidFact("", f"must be a mapping, got {type(data).__name__}")
    allowed = (*required, *optional)
    for key in data:
        if key not in allowed:
            raise InvalidFact(str(key), "is not a field of this change; fields: " + ", ".join(allowed))
    for key in required:
        if key not in data:
            raise InvalidFact(key, "is required")
    return data


def _tier_key(value: Any, field: str = "tier_key") -> TierKey:
    if isinstance(value, TierKey):
        return value
    try:
        return TierKey.parse(value)
    except InvalidFact as exc:
        raise InvalidFact(field, exc.problem) from None


def _fact(value: Any, field: str = "fact") -> Fact:
    if isinstance(value, Fact):
        return value
    try:
        return Fact.from_dict(value)
    except InvalidFact as exc:
        raise InvalidFact(field if exc.field == "fact" else f"{field}.{exc.field}", exc.problem) from None


def _reason(value: Any) -> str | None:
    if value is None:
        return None
    try:
        result: str = FIELD_RULES["text"](value)
    except InvalidFact as exc:
        raise InvalidFact(
            "reason", exc.problem.replace("must not be empty", "must be null or text, not empty")
        ) from None
    return result


def _same_fact(change: Any, fact: Fact, ids: tuple[str, ...]) -> None:
    if fact.id not in ids or fact.tier_key != change.tier_key:
        raise InvalidFact("fact_id", f"this change is for {' or '.join(ids)} in {change.tier_key}, not {fact.id}")


# -- the changes ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FactAsserted:
    """A new fact in a task or project key, extracted from minutes or asserted by hand.

    Never in the global tier (written only by explicit promotion or learning, invariant 5),
    never a copy (`promoted_from`: that is `FactTierPromoted`), never in a learned key's
    slot (subject `LEARNED_SUBJECT`: that is `FactLearned`).
    """

    event_type: ClassVar[EventType] = EventType.FACT_ASSERTED
    fact: Fact

    def __post_init__(self) -> None:
        fact = _fact(self.fact)
        if fact.tier is Tier.GLOBAL:
            raise InvalidFact(
                "fact.tier_key", "the global tier is written only by explicit promotion (fact_tier_promoted) or learn()"
            )
        if fact.promoted_from is not None:
            raise InvalidFact("fact.promoted_from", "a copy from a lower tier is a fact_tier_promoted change")
        if fact.slot.subject == LEARNED_SUBJECT:
            raise InvalidFact(
                "fact.subject", f"{LEARNED_SUBJECT!r} is reserved for keys written with learn() (fact_learned)"
            )

    @property
    def tier_key(self) -> TierKey:
        return self.fact.tier_key

    def to_data(self) -> dict[str, Any]:
        return {"fact": self.fact.to_dict()}

    @classmethod
    def from_data(cls, data: Any) -> FactAsserted:
        return cls(_fact(_fields(data, ("fact",))["fact"]))


@dataclass(frozen=True, slots=True)
class FactConfirmed:
    """The same value stated again: the fact gains these sources and takes this confidence."""

    event_type: ClassVar[EventType] = EventType.FACT_CONFIRMED
    fact_id: str
    tier_key: TierKey
    source_minute_ids: tuple[str, ...]
    confidence: float

    def __post_init__(self) -> None:
        check_fact_id(self.fact_id, "fact_id")
        object.__setattr__(self, "tier_key", _tier_key(self.tier_key))
        object.__setattr__(self, "source_minute_ids", check_minute_ids(self.source_minute_ids, "source_minute_ids"))
        object.__setattr__(self, "confidence", FIELD_RULES["confidence"](self.confidence))

    def to_data(self) -> dict[str, Any]:
        return {
            "fact_id": self.fact_id,
            "tier_key": str(self.tier_key),
            "source_minute_ids": list(self.source_minute_ids),
            "confidence": self.confidence,
        }

    @classmethod
    def from_data(cls, data: Any) -> FactConfirmed:
        d = _fields(data, ("fact_id", "tier_key", "source_minute_ids", "confidence"))
        return cls(d["fact_id"], d["tier_key"], d["source_minute_ids"], d["confidence"])

    def apply_to(self, fact: Fact) -> Fact:
        """`fact` with the new sources appended (each once) and the new confidence.

        Past `MAX_FACT_SOURCES` it keeps the first source (where the fact was first
        seen) and the newest ones.
        """
        _same_fact(self, fact, (self.fact_id,))
        sources = list(fact.source_minute_ids)
        sources.extend(m for m in self.source_minute_ids if m not in fact.source_minute_ids)
        if len(sources) > MAX_FACT_SOURCES:
            sources = sources[:1] + sources[len(sources) - MAX_FACT_SOURCES + 1 :]
        return fact.with_(source_minute_ids=tuple(sources), confidence=self.confidence)


@dataclass(frozen=True, slots=True)
class FactPromoted:
    """A pending fact becomes current: its confidence reached the threshold, or someone promoted it."""

    event_type: ClassVar[EventType] = EventType.FACT_PROMOTED
    fact_id: str
    tier_key: TierKey
    reason: PromotionReason = PromotionReason.THRESHOLD

    def __post_init__(self) -> None:
        check_fact_id(self.fact_id, "fact_id")
        object.__setattr__(self, "tier_key", _tier_key(self.tier_key))
        try:
            object.__setattr__(self, "reason", PromotionReason(self.reason))
        except ValueError:
            raise InvalidFact("reason", f"{self.reason!r} must be one of threshold, by_hand") from None

    def to_data(self) -> dict[str, Any]:
        return {"fact_id": self.fact_id, "tier_key": str(self.tier_key), "reason": self.reason.value}

    @classmethod
    def from_data(cls, data: Any) -> FactPromoted:
        d = _fields(data, ("fact_id", "tier_key", "reason"))
        return cls(d["fact_id"], d["tier_key"], d["reason"])

    def apply_to(self, fact: Fact) -> Fact:
        _same_fact(self, fact, (self.fact_id,))
        return fact.with_(status=FactStatus.PROMOTED)


@dataclass(frozen=True, slots=True)
class FactTierPromoted:
    """A copy of a fact one tier up (task -> its project -> global): its own id, `promoted_from` naming the original.

    Build it with `tier_promoted_minute`, which makes the copy.
    """

    event_type: ClassVar[EventType] = EventType.FACT_TIER_PROMOTED
    fact: Fact
    from_tier_key: TierKey

    def __post_init__(self) -> None:
        fact = _fact(self.fact)
        source = _tier_key(self.from_tier_key, "from_tier_key")
        object.__setattr__(self, "from_tier_key", source)
        if source.parent != fact.tier_key:
            raise InvalidFact(
                "from_tier_key",
                f"a fact of {source} is promoted to {source.parent or 'nothing (global is the top)'}, "
                f"not {fact.tier_key}: one tier up, in the same project",
            )
        if fact.promoted_from is None:
            raise InvalidFact("fact.promoted_from", "a promoted copy names the fact it was copied from")

    @property
    def tier_key(self) -> TierKey:
        return self.fact.tier_key

    def to_data(self) -> dict[str, Any]:
        return {"fact": self.fact.to_dict(), "from_tier_key": str(self.from_tier_key)}

    @classmethod
    def from_data(cls, data: Any) -> FactTierPromoted:
        d = _fields(data, ("fact", "from_tier_key"))
        return cls(_fact(d["fact"]), d["from_tier_key"])


@dataclass(frozen=True, slots=True)
class FactSuperseded:
    """A newer value in the same slot of the same key replaced this fact: it held until `valid_until`."""

    event_type: ClassVar[EventType] = EventType.FACT_SUPERSEDED
    fact_id: str
    tier_key: TierKey
    superseded_by: str
    valid_until: str

    def __post_init__(self) -> None:
        check_fact_id(self.fact_id, "fact_id")
        object.__setattr__(self, "tier_key", _tier_key(self.tier_key))
        check_fact_id(self.superseded_by, "superseded_by")
        if self.superseded_by == self.fact_id:
            raise InvalidFact("superseded_by", "a fact is not superseded by itself; name the newer fact")
        check_time(self.valid_until, "valid_until")

    def to_data(self) -> dict[str, Any]:
        return {
            "fact_id": self.fact_id,
            "tier_key": str(self.tier_key),
            "superseded_by": self.superseded_by,
            "valid_until": self.valid_until,
        }

    @classmethod
    def from_data(cls, data: Any) -> FactSuperseded:
        d = _fields(data, ("fact_id", "tier_key", "superseded_by", "valid_until"))
        return cls(d["fact_id"], d["tier_key"], d["superseded_by"], d["valid_until"])

    def apply_to(self, fact: Fact) -> Fact:
        """`fact` superseded: status superseded and validity closed at `valid_until`; it stays in history."""
        _same_fact(self, fact, (self.fact_id,))
        return fact.with_(status=FactStatus.SUPERSEDED, valid_until=self.valid_until)


@dataclass(frozen=True, slots=True)
class FactContradicted:
    """Two facts in one slot hold different values over overlapping times, neither newer: both are flagged."""

    event_type: ClassVar[EventType] = EventType.FACT_CONTRADICTED
    fact_id: str
    tier_key: TierKey
    contradicted_by: str

    def __post_init__(self) -> None:
        check_fact_id(self.fact_id, "fact_id")
        object.__setattr__(self, "tier_key", _tier_key(self.tier_key))
        check_fact_id(self.contradicted_by, "contradicted_by")
        if self.contradicted_by == self.fact_id:
            raise InvalidFact("contradicted_by", "a fact does not contradict itself; name the other fact")

    def to_data(self) -> dict[str, Any]:
        return {"fact_id": self.fact_id, "tier_key": str(self.tier_key), "contradicted_by": self.contradicted_by}

    @classmethod
    def from_data(cls, data: Any) -> FactContradicted:
        d = _fields(data, ("fact_id", "tier_key", "contradicted_by"))
        return cls(d["fact_id"], d["tier_key"], d["contradicted_by"])

    def apply_to(self, fact: Fact) -> Fact:
        """Either side of the pair with a `contradicts` relationship (strength 1) to the other, once."""
        _same_fact(self, fact, (self.fact_id, self.contradicted_by))
        other = self.contradicted_by if fact.id == self.fact_id else self.fact_id
        flag = Relationship(RelationKind.CONTRADICTS, other, 1.0)
        if flag in fact.relationships:
            return fact
        kept = tuple(r for r in fact.relationships if (r.kind, r.fact_id) != (flag.kind, flag.fact_id))
        return fact.with_(relationships=(*kept, flag))


@dataclass(frozen=True, slots=True)
class FactRetracted:
    """A fact withdrawn: it was never true, or was extracted wrongly. It stays in history."""

    event_type: ClassVar[EventType] = EventType.FACT_RETRACTED
    fact_id: str
    tier_key: TierKey
    reason: str | None = None

    def __post_init__(self) -> None:
        check_fact_id(self.fact_id, "fact_id")
        object.__setattr__(self, "tier_key", _tier_key(self.tier_key))
        _reason(self.reason)

    def to_data(self) -> dict[str, Any]:
        return {"fact_id": self.fact_id, "tier_key": str(self.tier_key), "reason": self.reason}

    @classmethod
    def from_data(cls, data: Any) -> FactRetracted:
        d = _fields(data, ("fact_id", "tier_key", "reason"))
        return cls(d["fact_id"], d["tier_key"], d["reason"])

    def apply_to(self, fact: Fact) -> Fact:
        _same_fact(self, fact, (self.fact_id,))
        return fact.with_(status=FactStatus.RETRACTED)


def _json_form(value: Any) -> Any:
    """A validated field value as the JSON a payload carries (tuples as lists, enums as their text)."""
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    return value


@dataclass(frozen=True, slots=True)
class FactEdited:
    """A person's edit of a fact in place: new values for some of `EDITABLE_FIELDS`."""

    event_type: ClassVar[EventType] = EventType.FACT_EDITED
    fact_id: str
    tier_key: TierKey
    changes: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_fact_id(self.fact_id, "fact_id")
        object.__setattr__(self, "tier_key", _tier_key(self.tier_key))
        if not isinstance(self.changes, dict) or not self.changes:
            raise InvalidFact("changes", "must be a mapping of at least one of " + ", ".join(EDITABLE_FIELDS))
        checked: dict[str, Any] = {}
        for name, value in self.changes.items():
            if name not in EDITABLE_FIELDS:
                raise InvalidFact(
                    f"changes.{name}",
                    "cannot be edited in place; editable: " + ", ".join(EDITABLE_FIELDS) + " "
                    "(a new value, subject, attribute or tier is a new fact: retract this one and assert that)",
                )
            try:
                checked[name] = _json_form(FIELD_RULES[name](value))
            except InvalidFact as exc:
                raise InvalidFact(f"changes.{exc.field}", exc.problem) from None
        object.__setattr__(self, "changes", checked)

    def to_data(self) -> dict[str, Any]:
        return {"fact_id": self.fact_id, "tier_key": str(self.tier_key), "changes": dict(self.changes)}

    @classmethod
    def from_data(cls, data: Any) -> FactEdited:
        d = _fields(data, ("fact_id", "tier_key", "changes"))
        return cls(d["fact_id"], d["tier_key"], d["changes"])

    def apply_to(self, fact: Fact) -> Fact:
        """`fact` with the edits; the rules across fields (valid_until after valid_from) are checked here."""
        _same_fact(self, fact, (self.fact_id,))
        return fact.with_(**self.changes)


@dataclass(frozen=True, slots=True)
class FactLearned:
    """``learn(key, value)``: a single-valued fact in slot (`LEARNED_SUBJECT`, key), in any tier, global included."""

    event_type: ClassVar[EventType] = EventType.FACT_LEARNED
    key: str
    fact: Fact

    def __post_init__(self) -> None:
        try:
            FIELD_RULES["attribute"](self.key)  # a key names the attribute of its slot
            slot = learned_slot(self.key)
        except InvalidFact as exc:
            raise InvalidFact("key", exc.problem) from None
        fact = _fact(self.fact)
        if fact.slot != slot:
            raise InvalidFact("key", f"{self.key!r} names slot {slot}; the fact sits in {fact.slot}")
        if not fact.single_valued:
            raise InvalidFact("fact.single_valued", "a learned key holds one value at a time: true")
        if fact.promoted_from is not None:
            raise InvalidFact("fact.promoted_from", "a learned fact is not a copy; promote it with fact_tier_promoted")

    @property
    def tier_key(self) -> TierKey:
        return self.fact.tier_key

    def to_data(self) -> dict[str, Any]:
        return {"key": self.key, "fact": self.fact.to_dict()}

    @classmethod
    def from_data(cls, data: Any) -> FactLearned:
        d = _fields(data, ("key", "fact"))
        if not isinstance(d["key"], str) or not d["key"].strip():
            raise InvalidFact("key", "must be a non-blank string: the name recall() asks for")
        return cls(d["key"], _fact(d["fact"]))


@dataclass(frozen=True, slots=True)
class TaskMemoryCleared:
    """A task's facts leave the current view (its task ended); the log, and so replay, keep them all."""

    event_type: ClassVar[EventType] = EventType.TASK_MEMORY_CLEARED
    tier_key: TierKey
    reason: str | None = None

    def __post_init__(self) -> None:
        key = _tier_key(self.tier_key)
        if key.tier is not Tier.TASK:
            raise InvalidFact("tier_key", f"{key} is not a task key; only task memory is cleared")
        object.__setattr__(self, "tier_key", key)
        _reason(self.reason)

    def to_data(self) -> dict[str, Any]:
        return {"tier_key": str(self.tier_key), "reason": self.reason}

    @classmethod
    def from_data(cls, data: Any) -> TaskMemoryCleared:
        d = _fields(data, ("tier_key", "reason"))
        return cls(d["tier_key"], d["reason"])


FactChange = (
    FactAsserted
    | FactConfirmed
    | FactPromoted
    | FactTierPromoted
    | FactSuperseded
    | FactContradicted
    | FactRetracted
    | FactEdited
    | FactLearned
    | TaskMemoryCleared
)

# The change class of each knowledge-change event type.
CHANGE_CLASSES: dict[str, type[FactChange]] = {
    cls.event_type.value: cls
    for cls in (
        FactAsserted,
        FactConfirmed,
        FactPromoted,
        FactTierPromoted,
        FactSuperseded,
        FactContradicted,
        FactRetracted,
        FactEdited,
        FactLearned,
        TaskMemoryCleared,
    )
}

FACT_EVENT_TYPES = frozenset(CHANGE_CLASSES)


def is_fact_change(minute: Minute) -> bool:
    """Whether `minute` records a change to long-term memory (the facts pool applies it, never extracts from it)."""
    return minute.event_type in FACT_EVENT_TYPES


def _home_project(change: FactChange) -> str | None:
    """The project whose log carries `change`: its tier key's; for a global one, the promotion's source or None."""
    if isinstance(change, FactTierPromoted):
        return change.from_tier_key.project_id
    return change.tier_key.project_id


# -- the parser -----------------------------------------------------------------------------------------------


# Change minutes built in this process (`change_minute`), by identity: a minute is immutable, so the change it was
# built from is what reading it gives, and the pool that built it does not decode it again. Bounded: cleared when full.
BUILT_KEPT = 4096
_BUILT: dict[int, tuple[Minute, FactChange]] = {}


def fact_change(minute: Minute) -> FactChange:
    """The knowledge change `minute` records, validated; `InvalidMinute` naming the field (``data.fact.confidence``).

    Checks the payload against its event type's shape and the minute against
    the change: it lives in the project its tier key names (``project_id``) and
    carries the tier as its ``scope``, so one project's log never changes
    another project's facts. A minute `change_minute` built in this process is
    read as the change it was built from (checked then).
    """
    built = _BUILT.get(id(minute))
    if built is not None and built[0] is minute:
        return built[1]
    cls = CHANGE_CLASSES.get(minute.event_type)
    if cls is None:
        raise InvalidMinute(
            "event_type",
            f"{minute.event_type!r} is not a knowledge change; one of " + ", ".join(sorted(CHANGE_CLASSES)),
        )
    try:
        change = cls.from_data(minute.data)
    except InvalidFact as exc:
        raise InvalidMinute(f"data.{exc.field}" if exc.field else "data", exc.problem) from None
    _check_home(change, minute.project_id, minute.scope)
    return change


def _check_home(change: FactChange, project_id: str, scope: str) -> None:
    home = _home_project(change)
    if home is not None and project_id != home:
        raise InvalidMinute(
            "project_id", f"a change to {change.tier_key} is written to project {home}'s log, not {project_id}'s"
        )
    if scope != change.tier_key.tier.value:
        raise InvalidMinute("scope", f"a change to {change.tier_key} carries scope {change.tier_key.tier.value!r}")


# -- builders -------------------------------------------------------------------------------------------------


def change_minute(
    change: FactChange,
    *,
    project_id: str | None = None,
    agent_id: str | None = None,
    minute_id: str | None = None,
    timestamp: str | None = None,
    memory_note: str | None = None,
    context_references: tuple[str, ...] = (),
) -> Minute:
    """The minute that records `change`, in its home project with its tier as scope.

    `project_id` is needed only for a global change other than a tier
    promotion (the project that made it); elsewhere it must be the home project
    or None. `minute_id` and `timestamp` default to a new id and now.
    """
    home = _home_project(change)
    if home is None and project_id is None:
        raise InvalidMinute(
            "project_id", f"a change to {change.tier_key} is written to the project that made it; pass project_id"
        )
    project = project_id if project_id is not None else home
    assert project is not None
    _check_home(change, project, change.tier_key.tier.value)
    minute = Minute(
        project_id=project,
        event_type=change.event_type.value,
        id=new_minute_id() if minute_id is None else minute_id,
        timestamp=utc_now_iso() if timestamp is None else timestamp,
        agent_id=agent_id,
        data=change.to_data(),
        context_references=context_references,
        memory_note=memory_note,
        scope=change.tier_key.tier.value,
    )
    if len(_BUILT) >= BUILT_KEPT:
        _BUILT.clear()
    _BUILT[id(minute)] = (minute, change)
    return minute


def _slot_line(fact: Fact) -> str:
    return f"{fact.slot} = {fact.value}"


def asserted_minute(
    fact: Fact, *, agent_id: str | None = None, minute_id: str | None = None, timestamp: str | None = None
) -> Minute:
    """``fact_asserted``: `fact` enters its key; the minute references the minutes it came from.

    A fact asserted by hand names the assertion minute as its source: mint the id
    first (`contracts.new_minute_id`), build the fact with it, and pass it as `minute_id`.
    """
    refs = tuple(m for m in fact.source_minute_ids if m != minute_id)
    return change_minute(
        FactAsserted(fact),
        agent_id=agent_id,
        minute_id=minute_id,
        timestamp=timestamp,
        memory_note=fact.text,
        context_references=refs,
    )


def confirmed_minute(
    fact: Fact,
    source_minute_ids: tuple[str, ...] | list[str],
    confidence: float,
    *,
    agent_id: str | None = None,
    minute_id: str | None = None,
    timestamp: str | None = None,
) -> Minute:
    """``fact_confirmed``: `fact` stated again in `source_minute_ids`, now held with `confidence`."""
    change = FactConfirmed(fact.id, fact.tier_key, tuple(source_minute_ids), confidence)
    return change_minute(
        change,
        agent_id=agent_id,
        minute_id=minute_id,
        timestamp=timestamp,
        memory_note=f"confirmed: {_slot_line(fact)}",
        context_references=change.source_minute_ids,
    )


def promoted_minute(
    fact: Fact,
    reason: PromotionReason | str = PromotionReason.THRESHOLD,
    *,
    agent_id: str | None = None,
    minute_id: str | None = None,
    timestamp: str | None = None,
) -> Minute:
    """``fact_promoted``: pending `fact` becomes current."""
    return change_minute(
        FactPromoted(fact.id, fact.tier_key, PromotionReason(reason)),
        agent_id=agent_id,
        minute_id=minute_id,
        timestamp=timestamp,
        memory_note=f"promoted: {_slot_line(fact)}",
    )


def tier_promoted_minute(
    fact: Fact,
    *,
    agent_id: str | None = None,
    minute_id: str | None = None,
    timestamp: str | None = None,
    period: int = 0,
) -> Minute:
    """``fact_tier_promoted``: a promoted copy of `fact` one tier up (task -> project -> global).

    The copy gets the upper key's id, ``promoted_from`` = `fact`'s id, status
    promoted and ``recorded_at`` = the minute's time; it keeps the text, value,
    validity, confidence and sources. It drops relationships (they name facts of
    the lower key) and read statistics. Its `period` is the value's period in
    the upper key's slot (0 unless the value held there before and was replaced).
    """
    parent = fact.tier_key.parent
    if parent is None:
        raise InvalidFact("tier_key", f"{fact.tier_key} is the top tier; there is nothing to promote it to")
    when = utc_now_iso() if timestamp is None else timestamp
    copy = fact.with_(
        tier_key=parent,
        promoted_from=fact.id,
        status=FactStatus.PROMOTED,
        recorded_at=when,
        relationships=(),
        access_count=0,
        last_accessed_at=None,
        period=period,
    )
    return change_minute(
        FactTierPromoted(copy, fact.tier_key),
        agent_id=agent_id,
        minute_id=minute_id,
        timestamp=when,
        memory_note=f"promoted to {parent}: {_slot_line(fact)}",
    )


def superseded_minute(
    old: Fact,
    by: Fact,
    *,
    valid_until: str | None = None,
    project_id: str | None = None,
    agent_id: str | None = None,
    minute_id: str | None = None,
    timestamp: str | None = None,
) -> Minute:
    """``fact_superseded``: `by` replaces `old` in their slot; `old` held until `valid_until` (default `by.valid_from`).

    Refused unless both facts share a tier key and a slot (invariant 10), and
    unless `old` still holds a while after its own valid_from. A change to the
    global tier names the project whose log it is written to (`project_id`).
    """
    if by.tier_key != old.tier_key:
        raise InvalidFact("superseded_by", f"{by.id} is in tier key {by.tier_key}, not {old.tier_key}")
    if by.slot != old.slot:
        raise InvalidFact(
            "superseded_by", f"{by.id} is in slot {by.slot}, not {old.slot}; only a slot's value supersedes"
        )
    until = by.valid_from if valid_until is None else valid_until
    change = FactSuperseded(old.id, old.tier_key, by.id, until)
    change.apply_to(old)  # valid_until after old.valid_from, or InvalidFact naming it
    return change_minute(
        change,
        project_id=project_id,
        agent_id=agent_id,
        minute_id=minute_id,
        timestamp=timestamp,
        memory_note=f"superseded: {_slot_line(old)} -> {by.value}",
    )


def contradicted_minute(
    fact: Fact,
    other: Fact,
    *,
    project_id: str | None = None,
    agent_id: str | None = None,
    minute_id: str | None = None,
    timestamp: str | None = None,
) -> Minute:
    """``fact_contradicted``: `fact` and `other` (same key and slot) disagree and neither is newer.

    A change to the global tier names the project whose log it is written to (`project_id`).
    """
    if other.tier_key != fact.tier_key or other.slot != fact.slot:
        raise InvalidFact(
            "contradicted_by", f"{other.id} is in {other.tier_key} {other.slot}, not {fact.tier_key} {fact.slot}"
        )
    return change_minute(
        FactContradicted(fact.id, fact.tier_key, other.id),
        project_id=project_id,
        agent_id=agent_id,
        minute_id=minute_id,
        timestamp=timestamp,
        memory_note=f"contradicted: {_slot_line(fact)} vs {other.value}",
    )


def retracted_minute(
    fact: Fact,
    reason: str | None = None,
    *,
    project_id: str | None = None,
    agent_id: str | None = None,
    minute_id: str | None = None,
    timestamp: str | None = None,
) -> Minute:
    """``fact_retracted``: `fact` is withdrawn, with an optional reason (`project_id`: the maker of a global change)."""
    return change_minute(
        FactRetracted(fact.id, fact.tier_key, reason),
        project_id=project_id,
        agent_id=agent_id,
        minute_id=minute_id,
        timestamp=timestamp,
        memory_note=f"retracted: {_slot_line(fact)}" + (f" ({reason})" if reason else ""),
    )


def edited_minute(
    fact: Fact,
    *,
    project_id: str | None = None,
    agent_id: str | None = None,
    minute_id: str | None = None,
    timestamp: str | None = None,
    **changes: Any,
) -> Minute:
    """``fact_edited``: a person's `changes` to `fact` (`EDITABLE_FIELDS`), checked against the fact now.

    `project_id`: for a global fact, the project that made the change (its log keeps the minute).
    """
    change = FactEdited(fact.id, fact.tier_key, changes)
    change.apply_to(fact)
    return change_minute(
        change,
        project_id=project_id,
        agent_id=agent_id,
        minute_id=minute_id,
        timestamp=timestamp,
        memory_note=f"edited {', '.join(change.changes)}: {_slot_line(fact)}",
    )


def learned_minute(
    key: str,
    value: str | int | float | bool,
    tier_key: TierKey,
    *,
    type: FactType | str = FactType.FACT,
    text: str | None = None,
    project_id: str | None = None,
    agent_id: str | None = None,
    minute_id: str | None = None,
    timestamp: str | None = None,
) -> Minute:
    """``fact_learned``: ``learn(key, value)`` into `tier_key`, as a promoted, certain fact.

    The fact sits in `learned_slot(key)`, holds from the minute's time, and names
    the minute itself as its source. A global key needs `project_id`: the
    project that learned it, whose log keeps the minute.
    """
    mid = new_minute_id() if minute_id is None else minute_id
    when = utc_now_iso() if timestamp is None else timestamp
    fact = Fact.new(
        type=type,
        text=f"{key} = {value}" if text is None else text,
        subject=LEARNED_SUBJECT,
        attribute=key,
        value=value,
        tier_key=tier_key,
        confidence=1.0,
        source_minute_ids=(mid,),
        status=FactStatus.PROMOTED,
        valid_from=when,
        recorded_at=when,
        single_valued=True,
    )
    return change_minute(
        FactLearned(key, fact),
        project_id=project_id,
        agent_id=agent_id,
        minute_id=mid,
        timestamp=when,
        memory_note=f"learned: {fact.text}",
    )


def task_memory_cleared_minute(
    tier_key: TierKey,
    reason: str | None = None,
    *,
    agent_id: str | None = None,
    minute_id: str | None = None,
    timestamp: str | None = None,
) -> Minute:
    """``task_memory_cleared``: the facts of task key `tier_key` leave the current view."""
    return change_minute(
        TaskMemoryCleared(tier_key, reason),
        agent_id=agent_id,
        minute_id=minute_id,
        timestamp=timestamp,
        memory_note=f"task memory cleared: {tier_key}" + (f" ({reason})" if reason else ""),
    )

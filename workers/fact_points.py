"""Fact points: every fact as its own vector point beside the minutes, folded from its knowledge-change minutes.

The index pool's fact step. A batch's knowledge-change minutes (``fact_*``,
`contracts.fact_changes`) are indexed as minutes like any other; here each one
is also applied to the point of the fact it changes, so that hybrid search can
return facts (``kind`` = ``fact``) beside the minutes. This module is the pure
core (minutes in, points out); `workers.index_pool` reads the stored points,
calls it and writes the result.

A fact point's state is a function of the *set* of change minutes that
touched the fact, whatever order batches arrive in (several log workers, a
retried job, a replay), so indexing the same minutes again gives the same
point:

- every change minute is kept on the point as a `FactEvent` (its data and its
  place in the order), once per (project, minute id);
- the fact is the fold of those events in order with the contract's
  ``apply_to`` (the one definition of what a change does, which the facts
  pool applies too), from the newest base: ``fact_asserted``,
  ``fact_learned`` or ``fact_tier_promoted``. Events older than the newest
  base change nothing and are dropped; past `FACT_POINT_MAX_CHANGES` the
  oldest fold into one stored state;
- changes to a fact whose assertion is not indexed yet wait on a
  ``fact_pending`` point under the fact's id (found by no search) until it is;
- ``task_memory_cleared`` minutes are kept on a ``tier_cleared`` point of their
  task key; a fact of that key whose base is older than a clear is cleared
  from the clear's time on (`cleared_ms`).

The order: a task or project fact's changes are all in its project's log
(`fact_change` refuses any other), so the log's sequence orders them. A
global fact's changes may come from several projects' logs: they are ordered
by the minute's timestamp, then its id and project.

Tenancy: a task or project fact is a point of its project; a global fact a
point of `GLOBAL_TENANT`, which only a query naming it reads.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contracts import ContractError, Minute
from contracts.errors import InvalidFact
from contracts.fact_changes import (
    CHANGE_CLASSES,
    FACT_EVENT_TYPES,
    FactAsserted,
    FactChange,
    FactContradicted,
    FactLearned,
    FactTierPromoted,
    TaskMemoryCleared,
    fact_change,
)
from contracts.facts import FACT_NAMESPACE, Fact, Tier, TierKey, check_time
from pvm import defaults
from pvm.protocols import FACT, FACT_PENDING, TIER_CLEARED, MemoryPoint, StoredPoint
from pvm.vectors import GLOBAL_TENANT, OPEN_MS

log = logging.getLogger(__name__)

# Where the task_memory_cleared minutes of a task key are kept: uuid5 of the key's string form in this namespace
# (another namespace than the facts', so a marker is never a fact's point).
CLEARS_NAMESPACE = uuid.uuid5(FACT_NAMESPACE, "pvm/index/tier-cleared")

# The event type of a stored state that older events were folded into (never a minute's event type: those are
# lowercase words, this starts with an underscore).
FOLDED = "_folded"

# Changes that set a fact's whole state, and the fact they set.
_BASES = (FactAsserted, FactLearned, FactTierPromoted)


def tenant_of(tier_key: TierKey) -> str:
    """The vector store tenant of a tier key's facts: its project, or `GLOBAL_TENANT` for the global tier."""
    return GLOBAL_TENANT if tier_key.tier is Tier.GLOBAL else str(tier_key.project_id)


def clears_key(tier_key: TierKey | str) -> str:
    """The key of the point keeping a task key's ``task_memory_cleared`` minutes."""
    return str(uuid.uuid5(CLEARS_NAMESPACE, str(tier_key)))


def instant_ms(timestamp: str) -> int:
    """A contract timestamp (ISO 8601 with an offset) as Unix milliseconds."""
    return int(check_time(timestamp, "time").timestamp() * 1000)


# -- events ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FactEvent:
    """One knowledge-change minute as a fact point keeps it: enough to apply it again, in its place in the order."""

    project_id: str  # the log it is in
    minute_id: str
    order: tuple[Any, ...]  # (log seq,) for task and project facts; (timestamp ms, minute id, project) for global
    at_ms: int  # the minute's timestamp
    event_type: str
    data: dict[str, Any]

    @property
    def identity(self) -> tuple[str, str]:
        return self.project_id, self.minute_id

    def change(self) -> FactChange | Fact:
        """The change this event records (`FOLDED`: the state older events were folded into); raises `InvalidFact`."""
        if self.event_type == FOLDED:
            return Fact.from_dict(self.data["fact"])
        return CHANGE_CLASSES[self.event_type].from_data(self.data)

    def to_dict(self) -> dict[str, Any]:
        return {
            "project_id": self.project_id,
            "minute_id": self.minute_id,
            "order": list(self.order),
            "at_ms": self.at_ms,
            "event_type": self.event_type,
            "data": self.data,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> FactEvent:
        return cls(
            str(raw["project_id"]),
            str(raw["minute_id"]),
            tuple(raw["order"]),
            int(raw["at_ms"]),
            str(raw["event_type"]),
            dict(raw["data"]),
        )


@dataclass(frozen=True, slots=True)
class ParsedChange:
    """A knowledge-change minute of a batch, parsed: the event to keep, the change, and where it applies."""

    event: FactEvent
    change: FactChange

    @property
    def tier_key(self) -> TierKey:
        return self.change.tier_key

    @property
    def tenant(self) -> str:
        return tenant_of(self.change.tier_key)

    @property
    def fact_ids(self) -> tuple[str, ...]:
        """The facts whose points it changes (none for a task clear: that reaches its key's facts)."""
        change = self.change
        if isinstance(change, _BASES):
            return (change.fact.id,)
        if isinstance(change, FactContradicted):
            return (change.fact_id, change.contradicted_by)
        if isinstance(change, TaskMemoryCleared):
            return ()
        return (change.fact_id,)


def parse(minutes: Iterable[tuple[Minute, int, int]]) -> tuple[list[ParsedChange], list[str]]:
    """The knowledge changes among ``(minute, log seq, timestamp ms)``, and the ids of those that do not parse.

    Minutes of other event types are passed over. One that does not parse is
    logged and left to be indexed as a plain minute: it never fails its batch.
    """
    changes: list[ParsedChange] = []
    unparsed: list[str] = []
    for minute, seq, at_ms in minutes:
        if minute.event_type not in FACT_EVENT_TYPES:
            continue
        try:
            change = fact_change(minute)
        except (ContractError, TypeError, ValueError) as exc:
            log.warning(
                "index pool: knowledge change %s of project %s does not parse (%s); indexed as a plain minute only",
                minute.id,
                minute.project_id,
                exc,
            )
            unparsed.append(minute.id)
            continue
        if change.tier_key.tier is Tier.GLOBAL:
            order: tuple[Any, ...] = (at_ms, minute.id, minute.project_id)
        else:
            order = (seq,)
        event = FactEvent(minute.project_id, minute.id, order, at_ms, minute.event_type, dict(minute.data))
        changes.append(ParsedChange(event, change))
    return changes, unparsed


def needed(changes: Sequence[ParsedChange]) -> tuple[list[str], list[str]]:
    """What to read back before `plan`: point keys (facts, markers) and the task keys being cleared."""
    point_keys: dict[str, None] = {}
    cleared: dict[str, None] = {}
    for c in changes:
        for fact_id in c.fact_ids:
            point_keys[fact_id] = None
        if c.tier_key.tier is Tier.TASK:
            point_keys[clears_key(c.tier_key)] = None
        if isinstance(c.change, TaskMemoryCleared):
            cleared[str(c.tier_key)] = None
    return list(point_keys), list(cleared)


# -- the fold -------------------------------------------------------------------------------------------------------


@dataclass
class Folded:
    """A fact's state after its events: the fact (None while no base is indexed), the events to keep, the skipped."""

    fact: Fact | None
    events: list[FactEvent]
    base_order: tuple[Any, ...] | None = None
    skipped: list[str] = field(default_factory=list)  # minute ids of changes that did not apply


def _is_base(change: FactChange | Fact, fact_id: str) -> bool:
    if isinstance(change, Fact):
        return change.id == fact_id
    return isinstance(change, _BASES) and change.fact.id == fact_id


def fold(events: Iterable[FactEvent], fact_id: str, max_changes: int = defaults.FACT_POINT_MAX_CHANGES) -> Folded:
    """The state of fact `fact_id` after `events`, applied in order from the newest base (module docstring).

    Events are taken once per (project, minute id). A change that does not
    apply (``apply_to`` refuses it, e.g. a validity that would end before it
    starts) is skipped and named in `Folded.skipped`, and stays kept: the fold
    is the same whenever it runs. Past `max_changes` events after the base,
    the oldest are folded into one stored state.
    """
    unique: dict[tuple[str, str], FactEvent] = {}
    for e in events:
        unique.setdefault(e.identity, e)
    ordered = sorted(unique.values(), key=lambda e: e.order)
    parsed: list[tuple[FactEvent, FactChange | Fact | None]] = []
    base = None
    for e in ordered:
        try:
            change: FactChange | Fact | None = e.change()
        except (InvalidFact, KeyError, TypeError, ValueError) as exc:
            log.warning("index pool: stored change %s of fact %s does not read back (%s)", e.minute_id, fact_id, exc)
            change = None
        if change is not None and _is_base(change, fact_id):
            base = len(parsed)
        parsed.append((e, change))
    if base is None:
        kept = [e for e, _ in parsed][-defaults.FACT_POINT_MAX_PENDING :]
        return Folded(None, kept)
    parsed = parsed[base:]
    state, skipped = _apply(parsed, fact_id)
    first = parsed[0]
    base_order = tuple(first[0].data["base_order"]) if first[0].event_type == FOLDED else first[0].order
    if len(parsed) > max_changes + 1:
        older, newer = parsed[: len(parsed) - max_changes], parsed[len(parsed) - max_changes :]
        folded_state, _ = _apply(older, fact_id)
        assert folded_state is not None
        last = older[-1][0]
        compact = FactEvent(
            last.project_id,
            last.minute_id,
            last.order,
            last.at_ms,
            FOLDED,
            {"fact": folded_state.to_dict(), "base_order": list(base_order)},
        )
        return Folded(state, [compact, *(e for e, _ in newer)], base_order, skipped)
    return Folded(state, [e for e, _ in parsed], base_order, skipped)


def _apply(parsed: Sequence[tuple[FactEvent, FactChange | Fact | None]], fact_id: str) -> tuple[Fact | None, list[str]]:
    state: Fact | None = None
    skipped: list[str] = []
    for event, change in parsed:
        if change is None:
            skipped.append(event.minute_id)
        elif _is_base(change, fact_id):
            state = change if isinstance(change, Fact) else change.fact  # type: ignore[union-attr]
        elif state is not None and not isinstance(change, (Fact, TaskMemoryCleared, *_BASES)):
            try:
                state = change.apply_to(state)
            except InvalidFact as exc:
                log.warning(
                    "index pool: %s %s does not apply to fact %s (%s); skipped",
                    event.event_type,
                    event.minute_id,
                    fact_id,
                    exc,
                )
                skipped.append(event.minute_id)
    return state, skipped


def cleared_ms(base_order: tuple[Any, ...] | None, clears: Iterable[FactEvent]) -> int:
    """When a fact whose base has `base_order` left the current view: the first clear after its base, else open."""
    after = [c.at_ms for c in clears if base_order is None or c.order > base_order]
    return min(after, default=OPEN_MS)


# -- points ---------------------------------------------------------------------------------------------------------


def lexical_text(fact: Mapping[str, Any]) -> str:
    """What the lexical leg indexes of a fact (as `Fact.to_dict()`): its sentence, subject, attribute and value."""
    parts = (fact.get("text"), fact.get("subject"), fact.get("attribute"), fact.get("value"))
    return " ".join(dict.fromkeys(str(p) for p in parts if p))


def fact_payload(tenant: str, fact: Fact, events: Sequence[FactEvent], cleared: int) -> dict[str, Any]:
    """The payload of a fact point: the indexed fields (as numbers for the time bounds), the fact, its events."""
    recorded = instant_ms(fact.recorded_at)
    return {
        "kind": FACT,
        "project_id": tenant,
        "fact_type": fact.type.value,
        "tier": fact.tier.value,
        "tier_key": str(fact.tier_key),
        "task_id": fact.task_id,
        "status": fact.status.value,
        "subject": fact.subject,
        "attribute": fact.attribute,
        "value": fact.value,
        "text": fact.text,
        "confidence": fact.confidence,
        "importance": fact.importance,
        "valid_from_ms": instant_ms(fact.valid_from),
        "valid_until_ms": OPEN_MS if fact.valid_until is None else instant_ms(fact.valid_until),
        "recorded_at_ms": recorded,
        "cleared_ms": cleared,
        "timestamp_ms": recorded,  # what recency ranks by
        "scores": {"composite": fact.importance},  # what importance ranks by
        "fact": fact.to_dict(),
        "changes": [e.to_dict() for e in events],
    }


def _events_of(stored: StoredPoint | None, key: str = "changes") -> list[FactEvent]:
    if stored is None:
        return []
    out = []
    for raw in stored.payload.get(key) or ():
        try:
            out.append(FactEvent.from_dict(raw))
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("index pool: a stored change of point %s does not read back (%s); dropped", stored.key, exc)
    return out


def _unchanged(stored: StoredPoint | None, payload: Mapping[str, Any]) -> bool:
    if stored is None:
        return False
    return {k: v for k, v in stored.payload.items() if k != "minute_id"} == payload


@dataclass
class Plan:
    """What a batch's knowledge changes make of one tenant's points: the points to write and the changes skipped."""

    points: list[MemoryPoint] = field(default_factory=list)  # a fact point with dense None needs embedding
    facts: int = 0  # fact points among them
    skipped: list[str] = field(default_factory=list)


def plan(tenant: str, changes: Sequence[ParsedChange], stored: Mapping[str, StoredPoint]) -> Plan:
    """The points of `tenant` that `changes` (all of this tenant) make, given the stored points `needed` named.

    A point whose payload would not change is left out (indexing the same
    minutes again writes nothing). A fact point keeps its stored dense vector
    while its lexical text stays the same; otherwise its `dense` is None and
    the caller embeds it (when embeddings are on).
    """
    out = Plan()
    clears: dict[str, list[FactEvent]] = {}
    new_clears: set[str] = set()
    for point in stored.values():
        if point.payload.get("kind") == TIER_CLEARED:
            clears.setdefault(str(point.payload.get("tier_key")), []).extend(_events_of(point, "clears"))
    by_fact: dict[str, list[FactEvent]] = {}
    for c in changes:
        if isinstance(c.change, TaskMemoryCleared):
            key = str(c.tier_key)
            clears.setdefault(key, []).append(c.event)
            new_clears.add(key)
        for fact_id in c.fact_ids:
            by_fact.setdefault(fact_id, []).append(c.event)
    for point in stored.values():  # facts of a key cleared now, which no change of the batch names
        if point.payload.get("kind") == FACT and point.payload.get("tier_key") in new_clears:
            by_fact.setdefault(point.key, [])
    for key in sorted(new_clears):
        unique = {e.identity: e for e in clears[key]}
        clears[key] = sorted(unique.values(), key=lambda e: e.order)
        marker_payload: dict[str, Any] = {
            "kind": TIER_CLEARED,
            "project_id": tenant,
            "tier_key": key,
            "clears": [e.to_dict() for e in clears[key]],
        }
        marker = clears_key(key)
        if not _unchanged(stored.get(marker), marker_payload):
            out.points.append(MemoryPoint(marker, tenant, "", marker_payload, kind=TIER_CLEARED))
    for fact_id, new_events in by_fact.items():
        previous = stored.get(fact_id)
        folded = fold([*_events_of(previous), *new_events], fact_id)
        mine = {e.minute_id for e in new_events}
        out.skipped += [m for m in folded.skipped if m in mine]
        if folded.fact is None:
            pending = {"kind": FACT_PENDING, "project_id": tenant, "changes": [e.to_dict() for e in folded.events]}
            if not _unchanged(previous, pending):
                out.points.append(MemoryPoint(fact_id, tenant, "", pending, kind=FACT_PENDING))
            continue
        fact = folded.fact
        cleared = cleared_ms(folded.base_order, clears.get(str(fact.tier_key), ()))
        payload = fact_payload(tenant, fact, folded.events, cleared)
        if _unchanged(previous, payload):
            continue
        text = lexical_text(payload["fact"])
        same_text = (
            previous is not None
            and previous.payload.get("kind") == FACT
            and lexical_text(previous.payload.get("fact") or {}) == text
        )
        dense = previous.dense if same_text and previous is not None else None
        out.points.append(MemoryPoint(fact_id, tenant, text, payload, dense=dense, kind=FACT))
        out.facts += 1
    return out

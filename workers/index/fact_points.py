"""Fact points: every fact as its own vector point beside the minutes, folded from its knowledge-change minutes.

The index pool's fact step. A batch's knowledge-change minutes (``fact_*``,
`contracts.fact_changes`) are indexed as minutes like any other; here each one
is also applied to the point of the fact it changes, so that hybrid search can
return facts (``kind`` = ``fact``) beside the minutes. This module is the pure
core (minutes in, points out); `workers.index.pool` reads the stored points,
calls it and writes the result.

A fact point's state is a function of the *set* of change minutes that
touched the fact, whatever order batches arrive in (several log workers, a
retried job, a replay), so indexing the same minutes again gives the same
point:

- every change minute is kept on the point as a `FactEvent` (its data and its
  place in the order), once per (project, minute id);
- the fact is merged from those events exactly as the facts store merges
  them (`pvm.stores.fact_projection.merge_created` / `merge_change`: each
  field last-writer-wins by the change's order key, sources and relationships
  as sets), the bases (``fact_asserted``, ``fact_learned``,
  ``fact_tier_promoted``) first, then every other change. Past
  `FACT_POINT_MAX_CHANGES` the state is kept as one folded event (with its
  order keys) and the newest changes;
- changes to a fact whose assertion is not indexed yet wait on a
  ``fact_pending`` point under the fact's id (found by no search) until it is;
- ``task_memory_cleared`` minutes are kept on a ``tier_cleared`` point of their
  task key; a fact of that key first asserted before a clear is cleared
  from the clear's time on (`cleared_ms`).

The order is the store's: a change minute's time, then its id
(`pvm.stores.fact_projection.order_key`), which the deciders (the facts pool,
the API) give in the order they decided. The log's sequence is not used: two
log workers or a requeued log job can make a batch's ``fact_superseded``
durable before its ``fact_asserted``, and the point must still equal the
store's record (issue 22; docs/decisions/0015-fact-time.md).

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
from contracts.facts import FACT_NAMESPACE, Fact, FactStatus, Tier, TierKey, check_time
from contracts.minute import iso_from_ms
from pvm import defaults
from pvm.protocols import FACT, FACT_PENDING, TIER_CLEARED, MemoryPoint, StoredPoint
from pvm.stores.fact_projection import LWW_FIELDS, StoredFact, merge_change, merge_created, order_key_at
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
    order: tuple[Any, ...]  # (timestamp ms, minute id, project): informative; `event_key` orders events
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
    for minute, _seq, at_ms in minutes:
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
        order = (at_ms, minute.id, minute.project_id)  # the store's order; the log's seq is not (module docstring)
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
    """A fact's state after its events: the stored record (None while no base is indexed), the events to keep,
    and the minute ids of the changes that did not apply."""

    stored: StoredFact | None
    events: list[FactEvent]
    skipped: list[str] = field(default_factory=list)

    @property
    def fact(self) -> Fact | None:
        return None if self.stored is None else self.stored.fact


def event_key(event: FactEvent) -> str:
    """An event's place in the store's order (`pvm.stores.fact_projection.order_key`): its minute's time, then id."""
    return order_key_at(event.at_ms, event.minute_id)


def _folded_state(event: FactEvent) -> StoredFact:
    """The stored record a `FOLDED` event keeps (points written before the store's merge kept only the fact)."""
    data = event.data
    fact = Fact.from_dict(data["fact"])
    if "v" in data:
        return StoredFact(fact, dict(data["v"]), str(data["created"]), data.get("promoted_at"))
    key = event_key(event)
    promoted = iso_from_ms(event.at_ms) if fact.status is FactStatus.PROMOTED else None
    return StoredFact(fact, {name: key for name in LWW_FIELDS}, key, promoted)


def fold(events: Iterable[FactEvent], fact_id: str, max_changes: int = defaults.FACT_POINT_MAX_CHANGES) -> Folded:
    """The state of fact `fact_id` after `events`, merged as the facts store merges them (module docstring).

    Events are taken once per (project, minute id); the bases first, then every other change, each in the
    store's order and by the store's rule (`merge_created`, `merge_change`), so the point equals the
    store's record whatever order the events reached the log in. A change that does not apply (``apply_to``
    refuses it) is skipped and named in `Folded.skipped`, and stays kept: the fold is the same whenever it
    runs. Past `max_changes` events, the state is kept as one `FOLDED` event with the newest `max_changes`
    events after it (merging an event twice changes nothing).
    """
    unique: dict[tuple[str, str], FactEvent] = {}
    folded: FactEvent | None = None
    for e in events:
        if e.event_type == FOLDED:
            folded = e  # one per point: the newest state written
        else:
            unique.setdefault(e.identity, e)
    ordered = sorted(unique.values(), key=lambda e: (event_key(e), e.project_id))
    state: StoredFact | None = None
    if folded is not None:
        try:
            state = _folded_state(folded)
        except (InvalidFact, KeyError, TypeError, ValueError) as exc:
            log.warning("index pool: the folded state of fact %s does not read back (%s)", fact_id, exc)
            folded = None
    parsed: list[tuple[FactEvent, FactChange | None]] = []
    for e in ordered:
        try:
            change: FactChange | None = CHANGE_CLASSES[e.event_type].from_data(e.data)
        except (InvalidFact, KeyError, TypeError, ValueError) as exc:
            log.warning("index pool: stored change %s of fact %s does not read back (%s)", e.minute_id, fact_id, exc)
            change = None
        parsed.append((e, change))
    skipped = [e.minute_id for e, change in parsed if change is None]
    for e, change in parsed:
        if isinstance(change, _BASES) and change.fact.id == fact_id:
            state = merge_created(state, change.fact, event_key(e), iso_from_ms(e.at_ms))
    if state is None:
        return Folded(None, ordered[-defaults.FACT_POINT_MAX_PENDING :], skipped)
    for e, change in parsed:
        if change is None or isinstance(change, (TaskMemoryCleared, *_BASES)):
            continue
        try:
            state = merge_change(state, change, event_key(e), iso_from_ms(e.at_ms))
        except InvalidFact as exc:
            log.warning(
                "index pool: %s %s does not apply to fact %s (%s); skipped", e.event_type, e.minute_id, fact_id, exc
            )
            skipped.append(e.minute_id)
    if len(ordered) > max_changes:
        last = ordered[-1]
        compact = FactEvent(
            last.project_id,
            FOLDED,
            last.order,
            last.at_ms,
            FOLDED,
            {
                "fact": state.fact.to_dict(),
                "v": dict(state.versions),
                "created": state.created,
                "promoted_at": state.promoted_at,
            },
        )
        return Folded(state, [compact, *ordered[-max_changes:]], skipped)
    return Folded(state, ([folded] if folded is not None else []) + ordered, skipped)


def cleared_ms(created: str | None, clears: Iterable[FactEvent]) -> int:
    """When a fact first asserted at order key `created` left the current view: the first clear after it, else open.

    The store's rule: a task's clearing drops the facts of that task asserted before it.
    """
    after = [c.at_ms for c in clears if created is None or event_key(c) > created]
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
        assert folded.stored is not None
        cleared = cleared_ms(folded.stored.created, clears.get(str(fact.tier_key), ()))
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

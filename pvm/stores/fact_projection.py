"""How knowledge-change minutes change stored facts: in memory, order-free, then written in one transaction.

The rules `pvm.stores.facts.FactStore` applies changes by (its docstring says why):

- every change has an order key, its minute's time then its id (`order_key`);
- each field of a stored fact (`StoredFact`) keeps the order key of the change that set it last, and a
  change sets a field only when its key is newer (last writer wins by key, not by arrival);
- sources and relationships are sets, kept in one canonical order;
- a change naming a fact not held yet waits (`keys.facts_parked`) and is applied when the fact arrives;
- clearing a task's memory drops the facts of that task asserted before the clearing, whenever they arrive.

What a change does to one fact is the contract's `apply_to`; this module decides which of its effects
stand. `Projection` reads the records it needs through a `RecordReader` and writes what changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, cast

import msgpack
import redis

from contracts import decode_durable_minute, encode_minute, keys
from contracts.errors import InvalidFact
from contracts.fact_changes import (
    LEARNED_SUBJECT,
    FactAsserted,
    FactChange,
    FactConfirmed,
    FactContradicted,
    FactEdited,
    FactLearned,
    FactPromoted,
    FactRetracted,
    FactSuperseded,
    FactTierPromoted,
    TaskMemoryCleared,
    fact_change,
)
from contracts.facts import (
    GLOBAL_KEY,
    MAX_FACT_SOURCES,
    READ_FIELDS,
    Fact,
    FactStatus,
    FactType,
    Relationship,
    Slot,
    Tier,
    TierKey,
    check_time,
)
from contracts.minute import Minute, parse_timestamp
from pvm.connection import hash_reply

# Fields a later change overwrites (last writer wins, by order key). The id and the period (part of the
# id) never change; sources and relationships are sets; read statistics are no knowledge (`READ_FIELDS`)
# and live beside the records.
LWW_FIELDS = tuple(
    name for name in Fact.FIELDS if name not in ("id", "period", "source_minute_ids", "relationships", *READ_FIELDS)
)

# The fields each change to an existing fact sets (`FactEdited`: the ones it names).
_SETS: dict[type, tuple[str, ...]] = {
    FactConfirmed: ("confidence",),
    FactPromoted: ("status",),
    FactSuperseded: ("status", "valid_until"),
    FactContradicted: (),
    FactRetracted: ("status",),
}

# Changes to a fact the store already holds.
_Existing = FactConfirmed | FactPromoted | FactSuperseded | FactContradicted | FactRetracted | FactEdited

_ORDER_OFFSET_MS = 10**14  # keeps the time part of an order key positive back to year 1


class Outcome(StrEnum):
    """What applying one change minute did."""

    APPLIED = "applied"  # the store changed
    UNCHANGED = "unchanged"  # applied before (or a newer change already set what it sets)
    PARKED = "parked"  # names a fact the store does not hold yet: applied when the fact arrives
    DROPPED = "dropped"  # asserts a fact of a task whose memory was cleared after it
    REFUSED = "refused"  # contradicts the record it applies to (InvalidFact): not applied


def order_key(minute: Minute) -> str:
    """The order of a change minute among all others: its time (Unix ms), then its id. Compared as text."""
    return order_key_at(time_ms(minute.timestamp), minute.id)


def order_key_at(ms: int, minute_id: str) -> str:
    """`order_key` of a change minute of time `ms` (Unix ms) and id `minute_id`."""
    return f"{ms + _ORDER_OFFSET_MS:015d}|{minute_id}"


def order_key_ms(key: str) -> int:
    """The time (Unix ms) of an order key."""
    return int(key.partition("|")[0]) - _ORDER_OFFSET_MS


def last_change_ms(created: str, versions: Mapping[str, str]) -> int:
    """The time (Unix ms) of the newest of a stored fact's order keys: when it last changed (its version)."""
    return max(order_key_ms(key) for key in (created, *versions.values()))


def time_ms(timestamp: str) -> int:
    """A minute timestamp in Unix ms, as order keys read it."""
    return int(parse_timestamp(timestamp).timestamp() * 1000)


def instant(timestamp: str | datetime) -> datetime:
    return timestamp if isinstance(timestamp, datetime) else check_time(timestamp, "as_of")


def _earliest(first: str | None, second: str | None) -> str | None:
    if first is None or second is None:
        return first if second is None else second
    return first if instant(first) <= instant(second) else second


def _sources(*groups: Iterable[str]) -> tuple[str, ...]:
    """The union of minute ids in canonical order (sorted: minute ids sort by time), at most `MAX_FACT_SOURCES`.

    Past the limit it keeps the first (where the fact was first seen) and the newest, as `FactConfirmed` does.
    """
    ids = sorted({m for group in groups for m in group})
    if len(ids) > MAX_FACT_SOURCES:
        ids = ids[:1] + ids[len(ids) - MAX_FACT_SOURCES + 1 :]
    return tuple(ids)


def _relationships(*groups: Iterable[Relationship]) -> tuple[Relationship, ...]:
    """The union of relationships in canonical order (kind, fact id); the strongest of a kind and fact wins."""
    best: dict[tuple[str, str], Relationship] = {}
    for group in groups:
        for rel in group:
            seen = best.get((rel.kind.value, rel.fact_id))
            if seen is None or rel.strength > seen.strength:
                best[(rel.kind.value, rel.fact_id)] = rel
    return tuple(best[k] for k in sorted(best))


# -- the stored record ---------------------------------------------------------------------------------------------


# Records read back by their bytes (`StoredFact.unpack`): a cache, started over when full. Its records are frozen,
# and what changes one copies its `versions` first.
UNPACKED_MEMO = 8192
_UNPACKED: dict[bytes, StoredFact] = {}


def _keep_unpacked(raw: bytes, stored: StoredFact) -> None:
    if len(_UNPACKED) >= UNPACKED_MEMO:
        _UNPACKED.clear()
    _UNPACKED[raw] = stored


@dataclass(frozen=True, slots=True)
class StoredFact:
    """A fact as the store holds it: the record, and what makes applying its changes order-free.

    `versions` maps each field of `LWW_FIELDS` to the order key of the change that set it last;
    `created` is the order key of the first minute that asserted it; `promoted_at` is when it was
    first promoted (the minute's time), which `current(as_of=...)` reads.
    """

    fact: Fact
    versions: Mapping[str, str]
    created: str
    promoted_at: str | None = None

    def pack(self) -> bytes:
        record = {
            "fact": self.fact.to_dict(),
            "v": dict(self.versions),
            "created": self.created,
            "promoted_at": self.promoted_at,
        }
        raw = cast(bytes, msgpack.packb(record, use_bin_type=True))
        _keep_unpacked(raw, self)  # what this process writes it reads back without validating it again
        return raw

    @classmethod
    def unpack(cls, raw: bytes) -> StoredFact:
        """The record these bytes hold, validated. A record is a value (a change writes new bytes), so the same
        bytes are read and validated once per process while `UNPACKED_MEMO` records are kept."""
        found = _UNPACKED.get(raw)
        if found is not None:
            return found
        record = msgpack.unpackb(raw, raw=False)
        stored = cls(Fact.from_dict(record["fact"]), record["v"], record["created"], record["promoted_at"])
        _keep_unpacked(raw, stored)
        return stored

    @property
    def last_ms(self) -> int:
        """The time (Unix ms) of the newest change applied to it: the largest of its order keys."""
        return last_change_ms(self.created, self.versions)

    def status_at(self, when: datetime) -> FactStatus:
        """Its status as PVM held it at `when`: retracted stays retracted; otherwise promoted once promoted.

        A superseded fact was current knowledge until its ``valid_until``: before then it counts as pending
        or promoted, whichever it was.
        """
        if self.fact.status is FactStatus.RETRACTED:
            return FactStatus.RETRACTED
        if self.promoted_at is not None and instant(self.promoted_at) <= when:
            return FactStatus.PROMOTED
        return FactStatus.PENDING

    def known_at(self, when: datetime, statuses: Sequence[FactStatus]) -> bool:
        """Whether it held at `when`, PVM had recorded it by then, and its status then is one of `statuses`.

        `statuses` of pending or promoted compare `status_at(when)`; superseded or retracted compare
        the status now (what became of it).
        """
        fact = self.fact
        if instant(fact.recorded_at) > when or not fact.holds_at(when):
            return False
        if self.status_at(when) in statuses:
            return True
        return fact.status in statuses and fact.status in (FactStatus.SUPERSEDED, FactStatus.RETRACTED)


# -- merging one change into one fact: the store's rule, and the fact points' (`workers.index.fact_points`) ------------


def merge_created(stored: StoredFact | None, fact: Fact, key: str, when: str) -> StoredFact:
    """`stored` (None: not held yet) with an assertion of `fact` (asserted, learned or promoted a tier up) merged in.

    `key` is the change's order key and `when` its minute's time. Each field takes the asserted value
    where `key` is newer than the change that set it last; sources and relationships are unions; the
    first promotion's time is kept. So merging the same changes in any order gives the same record.
    """
    promoted_at = when if fact.status is FactStatus.PROMOTED else None
    if stored is None:
        return StoredFact(
            fact.with_(
                source_minute_ids=_sources(fact.source_minute_ids),
                relationships=_relationships(fact.relationships),
                access_count=0,
                last_accessed_at=None,
            ),
            {name: key for name in LWW_FIELDS},
            key,
            promoted_at,
        )
    versions = dict(stored.versions)
    values = {}
    for name in LWW_FIELDS:
        if key > versions.get(name, ""):
            values[name], versions[name] = getattr(fact, name), key
    merged = stored.fact.with_(
        **values,
        source_minute_ids=_sources(stored.fact.source_minute_ids, fact.source_minute_ids),
        relationships=_relationships(stored.fact.relationships, fact.relationships),
    )
    return StoredFact(merged, versions, min(stored.created, key), _earliest(stored.promoted_at, promoted_at))


def merge_change(stored: StoredFact, change: _Existing, key: str, when: str) -> StoredFact:
    """`stored` with `change` merged in: the fields it sets where its key is newer, and the sets it adds to.

    Raises `InvalidFact` when the contract's ``apply_to`` refuses the change against `stored`.
    """
    old = stored.fact
    sets = tuple(change.changes) if isinstance(change, FactEdited) else _SETS[type(change)]
    if (
        isinstance(change, (FactSuperseded, FactRetracted, FactEdited))
        and sets
        and all(key <= stored.versions.get(name, "") for name in sets)
    ):
        # Newer changes set everything this one sets (a learned value learned again since, say): it changes
        # nothing, in whatever order the two arrive, so it is not checked against a record it no longer shapes.
        return stored
    proposed = change.apply_to(old)  # the contract's effect, validated
    versions = dict(stored.versions)
    values: dict[str, Any] = {}
    for name in sets:
        if key > versions.get(name, ""):
            values[name], versions[name] = getattr(proposed, name), key
    if isinstance(change, FactConfirmed):
        values["source_minute_ids"] = _sources(old.source_minute_ids, change.source_minute_ids)
    if isinstance(change, FactContradicted):
        values["relationships"] = _relationships(old.relationships, proposed.relationships)
    promoted_at = _earliest(stored.promoted_at, when) if isinstance(change, FactPromoted) else stored.promoted_at
    return StoredFact(old.with_(**values) if values else old, versions, stored.created, promoted_at)


# -- applying changes ----------------------------------------------------------------------------------------------


def tag_key(tier_key: TierKey) -> TierKey:
    """A tier key naming the same per-project (or global) hashes as `tier_key`."""
    return GLOBAL_KEY if tier_key.tier is Tier.GLOBAL else TierKey.for_project(str(tier_key.project_id))


class RecordReader:
    """Reads one tag's records for a projection, in batches, through a connection outside the WATCH."""

    def __init__(self, connection: redis.Redis, anchor: TierKey) -> None:
        self.connection, self.anchor = connection, anchor

    def prefetch(self, ids: Sequence[str], parked_ids: Sequence[str]) -> tuple[list[Any], list[Any], dict[str, str]]:
        pipe = self.connection.pipeline(transaction=False)
        pipe.hmget(keys.facts_by_id(self.anchor), list(ids) or ["-"])
        pipe.hmget(keys.facts_parked(self.anchor), list(parked_ids) or ["-"])
        if self.anchor.tier is not Tier.GLOBAL:
            pipe.hgetall(keys.facts_cleared(str(self.anchor.project_id)))
        replies = pipe.execute()
        cleared = {} if len(replies) < 3 else {k.decode(): v.decode() for k, v in hash_reply(replies[2]).items()}
        return replies[0][: len(ids)], replies[1][: len(parked_ids)], cleared

    def records(self, ids: Sequence[str]) -> list[Any]:
        return list(self.connection.hmget(keys.facts_by_id(self.anchor), list(ids))) if ids else []

    def parked(self, ids: Sequence[str]) -> list[Any]:
        return list(self.connection.hmget(keys.facts_parked(self.anchor), list(ids))) if ids else []

    def members(self, key: str) -> list[str]:
        return [m.decode() for m in cast(list[bytes], self.connection.zrange(key, 0, -1))]


@dataclass
class Projection:
    """Applies change minutes to the records of one tag in memory, then writes what changed in one transaction."""

    reader: RecordReader
    records: dict[str, StoredFact | None] = field(default_factory=dict)
    originals: dict[str, StoredFact | None] = field(default_factory=dict)
    parked: dict[str, list[bytes]] = field(default_factory=dict)
    cleared: dict[str, str] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)
    parked_dirty: set[str] = field(default_factory=set)
    cleared_dirty: set[str] = field(default_factory=set)
    learned: dict[tuple[TierKey, str], str | None] = field(default_factory=dict)

    # -- loading

    def prefetch(self, changes: Sequence[FactChange]) -> None:
        ids: list[str] = []
        created: list[str] = []
        for change in changes:
            if isinstance(change, (FactAsserted, FactTierPromoted, FactLearned)):
                ids.append(change.fact.id)
                created.append(change.fact.id)
            elif isinstance(change, FactContradicted):
                ids += (change.fact_id, change.contradicted_by)
            elif not isinstance(change, TaskMemoryCleared):
                ids.append(change.fact_id)
        ids, created = list(dict.fromkeys(ids)), list(dict.fromkeys(created))
        records, parked, self.cleared = self.reader.prefetch(ids, created)
        self._keep(ids, records)
        for fid, raw in zip(created, parked, strict=True):
            self.parked[fid] = list(msgpack.unpackb(raw)) if raw else []

    def _keep(self, ids: Sequence[str], raws: Sequence[Any]) -> None:
        for fid, raw in zip(ids, raws, strict=True):
            stored = None if raw is None else StoredFact.unpack(raw)
            self.records[fid] = stored
            self.originals[fid] = stored

    def need(self, ids: Iterable[str]) -> None:
        missing = [fid for fid in dict.fromkeys(ids) if fid not in self.records]
        if missing:
            self._keep(missing, self.reader.records(missing))

    def _parked_of(self, fid: str) -> list[bytes]:
        if fid not in self.parked:
            raw = self.reader.parked([fid])[0]
            self.parked[fid] = list(msgpack.unpackb(raw)) if raw else []
        return self.parked[fid]

    # -- applying

    def apply(self, minute: Minute, change: FactChange) -> Outcome:
        key = order_key(minute)
        try:
            if isinstance(change, (FactAsserted, FactTierPromoted, FactLearned)):
                return self._create(change.fact, key, minute.timestamp, isinstance(change, FactLearned))
            if isinstance(change, TaskMemoryCleared):
                return self._clear(change.tier_key, key)
            return self._change(minute, change, key)
        except InvalidFact:
            return Outcome.REFUSED

    def _set(self, fid: str, stored: StoredFact | None) -> bool:
        if self.records.get(fid) == stored:
            return False
        self.records[fid] = stored
        self.changed.add(fid)
        return True

    def _create(self, fact: Fact, key: str, when: str, learned: bool) -> Outcome:
        tier = fact.tier_key
        if tier.tier is Tier.TASK and self.cleared.get(str(tier), "") > key:
            return Outcome.DROPPED
        self.need([fact.id])
        changed = self._set(fact.id, merge_created(self.records[fact.id], fact, key, when))
        waiting = self._parked_of(fact.id)
        if waiting:
            self.parked[fact.id] = []
            self.parked_dirty.add(fact.id)
            for raw in sorted(waiting, key=lambda r: order_key(decode_durable_minute(r))):
                minute = decode_durable_minute(raw)
                if self.apply(minute, fact_change(minute)) is Outcome.APPLIED:
                    changed = True
        if learned or fact.slot.subject == LEARNED_SUBJECT:
            self._relink_learned(tier, fact.slot)
        return Outcome.APPLIED if changed else Outcome.UNCHANGED

    def _change(self, minute: Minute, change: _Existing, key: str) -> Outcome:
        ids = (change.fact_id, change.contradicted_by) if isinstance(change, FactContradicted) else (change.fact_id,)
        self.need(ids)
        missing = [fid for fid in ids if self.records[fid] is None]
        if missing:
            raw = encode_minute(minute)
            for fid in missing:
                waiting = self._parked_of(fid)
                if raw not in waiting:
                    waiting.append(raw)
                    self.parked_dirty.add(fid)
            return Outcome.PARKED
        updates = {fid: merge_change(cast(StoredFact, self.records[fid]), change, key, minute.timestamp) for fid in ids}
        changed = False
        for fid, new in updates.items():
            changed = self._set(fid, new) or changed
        return Outcome.APPLIED if changed else Outcome.UNCHANGED

    def _clear(self, tier: TierKey, key: str) -> Outcome:
        if self.cleared.get(str(tier), "") >= key:
            return Outcome.UNCHANGED
        self.cleared[str(tier)] = key
        self.cleared_dirty.add(str(tier))
        ids = self.reader.members(keys.facts_in_tier(tier))
        ids += [fid for fid in self.changed if (s := self.records[fid]) is not None and s.fact.tier_key == tier]
        self.need(ids)
        learned_slots = set()
        for fid in dict.fromkeys(ids):
            stored = self.records[fid]
            if stored is not None and stored.created < key:
                self._set(fid, None)
                if stored.fact.slot.subject == LEARNED_SUBJECT:
                    learned_slots.add(stored.fact.slot)
        for slot in learned_slots:
            self._relink_learned(tier, slot)
        return Outcome.APPLIED

    def _relink_learned(self, tier: TierKey, slot: Slot) -> None:
        """Point a learned key at its newest value (latest start, then learned last), for `FactStore.learned`.

        Which value supersedes which is decided by the facts pool and written as ``fact_superseded`` minutes
        (`workers.facts.pool.decide_learned`), so the fact points and replay follow it like any change.
        """
        ids = self.reader.members(keys.facts_in_slot(tier, slot))
        ids += [
            fid
            for fid in self.changed
            if (s := self.records[fid]) is not None and s.fact.tier_key == tier and s.fact.slot == slot
        ]
        self.need(ids)
        chain = [
            s
            for fid in dict.fromkeys(ids)
            if (s := self.records[fid]) is not None and s.fact.status is not FactStatus.RETRACTED
        ]
        newest = max(chain, key=lambda s: (instant(s.fact.valid_from), s.versions["value"], s.fact.id), default=None)
        self.learned[(tier, slot.attribute)] = None if newest is None else newest.fact.id

    # -- writing

    @property
    def dirty(self) -> bool:
        return bool(self.changed or self.parked_dirty or self.cleared_dirty or self.learned)

    def write(self, pipe: redis.client.Pipeline, anchor: TierKey) -> None:
        by_id = keys.facts_by_id(anchor)
        for fid in self.changed:
            old, new = self.originals.get(fid), self.records[fid]
            if old is not None and (new is None or (old.fact.type, old.fact.slot) != (new.fact.type, new.fact.slot)):
                self._unindex(pipe, old.fact)
            if new is None:
                pipe.hdel(by_id, fid)
                continue
            fact = new.fact
            pipe.hset(by_id, fid, new.pack())
            pipe.zadd(keys.facts_in_tier(fact.tier_key), {fid: time_ms(fact.recorded_at)})
            pipe.zadd(keys.facts_in_slot(fact.tier_key, fact.slot), {fid: time_ms(fact.valid_from)})
            pipe.sadd(keys.facts_of_type(fact.tier_key, fact.type), fid)
            if fact.type is FactType.PROCEDURE:
                pipe.zadd(keys.procedural_rules(fact.tier_key), {fid: fact.importance})
        for fid in self.parked_dirty:
            if self.parked.get(fid):
                pipe.hset(keys.facts_parked(anchor), fid, cast(bytes, msgpack.packb(self.parked[fid])))
            else:
                pipe.hdel(keys.facts_parked(anchor), fid)
        for cleared in self.cleared_dirty:
            pipe.hset(keys.facts_cleared(str(anchor.project_id)), cleared, self.cleared[cleared])
        for (tier, name), learned in self.learned.items():
            if learned is None:
                pipe.hdel(keys.learned_keys(tier), name)
            else:
                pipe.hset(keys.learned_keys(tier), name, learned)

    @staticmethod
    def _unindex(pipe: redis.client.Pipeline, fact: Fact) -> None:
        pipe.zrem(keys.facts_in_tier(fact.tier_key), fact.id)
        pipe.zrem(keys.facts_in_slot(fact.tier_key, fact.slot), fact.id)
        pipe.srem(keys.facts_of_type(fact.tier_key, fact.type), fact.id)
        pipe.zrem(keys.procedural_rules(fact.tier_key), fact.id)

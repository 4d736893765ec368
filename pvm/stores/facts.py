"""The facts store: the current view of long-term memory in Redis, a projection of knowledge-change minutes.

The store changes only when a knowledge-change minute (`contracts.fact_changes`) is applied to it: the
facts pool applies the minutes it writes, and every such minute the log carries, whoever wrote it. So
`pvm replay` rebuilds the store from the log alone, without calling an extractor or a model.

Applying is idempotent and does not depend on the order minutes arrive in (`pvm.stores.fact_projection`
has the rules: order keys per field, parked changes, cleared tasks). So a minute applied twice changes
nothing, and the same minutes applied in any order give the same records: the live view equals the
replayed one. What conflicts with what (supersession, contradiction, dedupe) is decided before a change
is written, by the facts pool, one slot at a time.

Reads need only Redis and cost one round trip (a script per tier key, pipelined). Every read names its
tier keys; nothing reads across projects. Layout: `contracts.keys` (facts block).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import redis

from contracts import keys
from contracts.errors import InvalidFact, PvmError
from contracts.fact_changes import (
    FactChange,
    fact_change,
    learned_slot,
)
from contracts.facts import (
    Fact,
    FactStatus,
    FactType,
    Slot,
    Tier,
    TierKey,
)
from contracts.minute import Minute
from pvm import defaults
from pvm.connection import hash_reply
from pvm.stores.fact_projection import (
    Outcome,
    Projection,
    RecordReader,
    StoredFact,
    instant,
    order_key,
    tag_key,
    time_ms,
)

# What `current` returns unless asked otherwise: what PVM holds as true.
PROMOTED_ONLY = (FactStatus.PROMOTED,)


class FactStoreBusy(PvmError, RuntimeError):
    """Others kept changing the same project's facts while a change was being applied; the caller retries."""


@dataclass(frozen=True, slots=True)
class SlotView:
    """One slot's history as the facts pool decides against it, and the time of the newest change applied to it.

    `last_ms` (Unix ms) lets the pool give its next changes to the slot later times, so their order keys
    follow the order it decided them in, whatever the times of the minutes they came from.
    """

    facts: list[Fact]
    last_ms: int


@dataclass(frozen=True, slots=True)
class ProceduralRule:
    """A procedure fact read as a rule: when `condition` holds, do `action`; higher `priority` first.

    The condition is the fact's subject, the action its value (docs/extraction.md), and the priority its
    importance, which a person edits (``fact_edited``) to reorder rules.
    """

    condition: str
    action: str
    priority: float
    fact: Fact


# -- reading -------------------------------------------------------------------------------------------------------

_RECORDS = """
-- KEYS[1]: a records hash (facts_by_id); KEYS[2..]: sets (ARGV[1] = 's') or sorted sets ('z') of fact ids
-- Returns the records of every id in them, each once (ids with no record are left out).
local seen, ids = {}, {}
for i = 2, #KEYS do
  local members
  if ARGV[1] == 'z' then
    members = redis.call('ZRANGE', KEYS[i], 0, -1)
  else
    members = redis.call('SMEMBERS', KEYS[i])
  end
  for _, id in ipairs(members) do
    if not seen[id] then seen[id] = true; ids[#ids + 1] = id end
  end
end
local out = {}
for i = 1, #ids, 1000 do
  local records = redis.call('HMGET', KEYS[1], unpack(ids, i, math.min(i + 999, #ids)))
  for j = 1, #records do
    if records[j] then out[#out + 1] = records[j] end
  end
end
return out
"""

_RELEASE = """
-- KEYS: slot leases; ARGV[1]: the owner's token. Deletes those the owner holds; returns how many.
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then n = n + redis.call('DEL', KEYS[i]) end
end
return n
"""


def _now() -> datetime:
    return datetime.now(UTC)


class FactStore:
    """Reads and applies the facts of every tier key, in Redis."""

    def __init__(self, connection: redis.Redis) -> None:
        self.connection = connection

    # -- applying

    def apply(self, minute: Minute) -> Outcome:
        """Apply one knowledge-change minute (validated with `fact_change`; `ContractError` when it is not one)."""
        return self.apply_changes([(minute, fact_change(minute))])[0]

    def apply_changes(self, changes: Sequence[tuple[Minute, FactChange]]) -> list[Outcome]:
        """Apply validated changes (each minute with its `fact_change`); one outcome per change, in order.

        Changes to the facts of one project (and to the global tier) are applied in one transaction,
        optimistic: when another writer changes that project's facts meanwhile, it reads and applies
        again (`FactStoreBusy` after `FACTS_COMMIT_RETRIES` tries).
        """
        outcomes: list[Outcome | None] = [None] * len(changes)
        groups: dict[TierKey, list[int]] = {}
        for i, (_, change) in enumerate(changes):
            groups.setdefault(tag_key(change.tier_key), []).append(i)
        for anchor, indexes in groups.items():
            done = self._commit(anchor, [changes[i] for i in indexes])
            for i, outcome in zip(indexes, done, strict=True):
                outcomes[i] = outcome
        return cast(list[Outcome], outcomes)

    def _commit(self, anchor: TierKey, changes: Sequence[tuple[Minute, FactChange]]) -> list[Outcome]:
        watched = [keys.facts_by_id(anchor), keys.facts_parked(anchor)]
        if anchor.tier is not Tier.GLOBAL:
            watched.append(keys.facts_cleared(str(anchor.project_id)))
        for _ in range(defaults.FACTS_COMMIT_RETRIES):
            with self.connection.pipeline(transaction=True) as txn:
                try:
                    txn.watch(*watched)
                    projection = Projection(RecordReader(self.connection, anchor))
                    projection.prefetch([c for _, c in changes])
                    outcomes = [projection.apply(m, c) for m, c in changes]
                    if projection.dirty:
                        txn.multi()
                        projection.write(txn, anchor)
                        txn.execute()
                    return outcomes
                except redis.WatchError:
                    continue
        raise FactStoreBusy(
            f"the facts of {anchor} changed under {defaults.FACTS_COMMIT_RETRIES} tries in a row; "
            "the job is retried (raise FACTS_COMMIT_RETRIES in pvm/defaults.py if this recurs)"
        )

    # -- slot leases (ARCHITECTURE invariant 8)

    def lease_slots(self, owner: str, slots: Sequence[tuple[TierKey, Slot]], ttl_ms: int) -> list[bool]:
        """Take the lease of each slot `owner` can (SET NX PX, one round trip); which ones it took, in order."""
        if not slots:
            return []
        pipe = self.connection.pipeline(transaction=False)
        for tier, slot in slots:
            pipe.set(keys.facts_slot_lock(tier, slot), owner, nx=True, px=ttl_ms)
        return [bool(r) for r in pipe.execute()]

    def release_slots(self, owner: str, slots: Sequence[tuple[TierKey, Slot]]) -> None:
        """Give back the leases of `slots` that `owner` still holds (one script per project, pipelined)."""
        by_tag: dict[TierKey, list[str]] = {}
        for tier, slot in slots:
            by_tag.setdefault(tag_key(tier), []).append(keys.facts_slot_lock(tier, slot))
        if not by_tag:
            return
        pipe = self.connection.pipeline(transaction=False)
        for names in by_tag.values():
            pipe.eval(_RELEASE, len(names), *names, owner)
        pipe.execute()

    # -- reads

    def get(self, tier_key: TierKey, fact_id: str) -> Fact | None:
        """The fact `fact_id` of `tier_key`'s project (or of the global tier), any status; None when not held."""
        stored = self.stored(tier_key, [fact_id]).get(fact_id)
        return None if stored is None or stored.fact.tier_key != tier_key else stored.fact

    def stored(self, tier_key: TierKey, fact_ids: Sequence[str]) -> dict[str, StoredFact]:
        """The stored records of `fact_ids` in the records of `tier_key`'s project (or the global tier's)."""
        if not fact_ids:
            return {}
        raws = cast(list[bytes | None], self.connection.hmget(keys.facts_by_id(tier_key), list(fact_ids)))
        return {fid: StoredFact.unpack(raw) for fid, raw in zip(fact_ids, raws, strict=True) if raw is not None}

    def in_slot(self, tier_key: TierKey, slot: Slot) -> list[Fact]:
        """A slot's history, superseded and retracted facts included, oldest `valid_from` first."""
        facts = [s.fact for s in self._read(tier_key, "z", [keys.facts_in_slot(tier_key, slot)])]
        return sorted(facts, key=lambda f: (instant(f.valid_from), f.id))

    def slot_views(self, slots: Sequence[tuple[TierKey, Slot]]) -> list[SlotView]:
        """Several slots' histories (as `in_slot`) and when each last changed, in one round trip, in order."""
        pipe = self.connection.pipeline(transaction=False)
        for tier, slot in slots:
            pipe.eval(_RECORDS, 2, keys.facts_by_id(tier), keys.facts_in_slot(tier, slot), "z")
        views = []
        for (tier, slot), raws in zip(slots, pipe.execute() if slots else [], strict=True):
            held = [s for s in (StoredFact.unpack(r) for r in raws) if s.fact.tier_key == tier and s.fact.slot == slot]
            facts = sorted((s.fact for s in held), key=lambda f: (instant(f.valid_from), f.id))
            views.append(SlotView(facts, max((s.last_ms for s in held), default=0)))
        return views

    def in_tier(self, tier_key: TierKey) -> list[Fact]:
        """Every fact of a tier key, any status, oldest `recorded_at` first."""
        facts = [s.fact for s in self._read(tier_key, "z", [keys.facts_in_tier(tier_key)])]
        return sorted(facts, key=lambda f: (instant(f.recorded_at), f.id))

    def by_type(self, tier_key: TierKey, fact_type: FactType | str) -> list[Fact]:
        """Every fact of one type in a tier key, any status, oldest `recorded_at` first."""
        facts = [s.fact for s in self._read(tier_key, "s", [keys.facts_of_type(tier_key, fact_type)])]
        return sorted(facts, key=lambda f: (instant(f.recorded_at), f.id))

    def current(
        self,
        tier_keys: Sequence[TierKey],
        types: Sequence[FactType | str] | None = None,
        statuses: Sequence[FactStatus | str] = PROMOTED_ONLY,
        as_of: str | datetime | None = None,
    ) -> list[Fact]:
        """What PVM held as true at `as_of` (default: now) in `tier_keys`: one round trip.

        A fact is in it when it held then (``valid_from <= as_of < valid_until``), PVM had recorded it
        by then (``recorded_at <= as_of``) and its status then is one of `statuses` (`StoredFact.known_at`):
        a fact superseded since counts as it was until its ``valid_until``, a retracted one never does.
        Ordered by tier key as given, then newest ``valid_from`` first.
        """
        when = _now() if as_of is None else instant(as_of)
        if when.tzinfo is None:
            raise InvalidFact("as_of", f"{when.isoformat()} has no UTC offset; pass an aware datetime")
        wanted = tuple(FactStatus(s) for s in statuses)
        kinds = None if types is None else tuple(FactType(t) for t in types)
        pipe = self.connection.pipeline(transaction=False)
        for tier in tier_keys:
            if kinds is None:
                pipe.eval(_RECORDS, 2, keys.facts_by_id(tier), keys.facts_in_tier(tier), "z")
            else:
                sets = [keys.facts_of_type(tier, t) for t in kinds]
                pipe.eval(_RECORDS, 1 + len(sets), keys.facts_by_id(tier), *sets, "s")
        out: list[Fact] = []
        for tier, raws in zip(tier_keys, pipe.execute() if tier_keys else [], strict=True):
            held = [s for s in (StoredFact.unpack(r) for r in raws) if s.fact.tier_key == tier]
            held = [s for s in held if s.known_at(when, wanted)]
            held.sort(key=lambda s: (instant(s.fact.valid_from), s.fact.id), reverse=True)
            out.extend(s.fact for s in held)
        return out

    def history(self, tier_key: TierKey, of: str | Slot) -> list[Fact]:
        """The history of a slot, or of the slot fact `of` (an id) sits in: `in_slot`. Empty for an unknown id."""
        if isinstance(of, Slot):
            return self.in_slot(tier_key, of)
        fact = self.get(tier_key, of)
        return [] if fact is None else self.in_slot(tier_key, fact.slot)

    def recall(self, tier_key: TierKey, key: str, as_of: str | datetime | None = None) -> Fact | None:
        """The value of learned key `key` (``learn(key, value)``) in `tier_key` that holds at `as_of` (default now).

        One round trip; `recall_first` over one tier key.
        """
        return self.recall_first([tier_key], key, as_of)

    def recall_first(self, tier_keys: Sequence[TierKey], key: str, as_of: str | datetime | None = None) -> Fact | None:
        """The value of a learned key that holds at `as_of` (default: now) in the first of `tier_keys` with one.

        One round trip. Of a key's values, the one that held then, that PVM knew by then and that was current
        knowledge (`StoredFact.known_at`), starting last (then learned last): a value learned with a clock
        running ahead, not holding yet, never hides the one that holds. `ContextReader.recall` asks the task
        tier, then the project, then (when granted) global.
        """
        slot = learned_slot(key)
        when = _now() if as_of is None else instant(as_of)
        pipe = self.connection.pipeline(transaction=False)
        for tier in tier_keys:
            pipe.eval(_RECORDS, 2, keys.facts_by_id(tier), keys.facts_in_slot(tier, slot), "z")
        for tier, raws in zip(tier_keys, pipe.execute() if tier_keys else [], strict=True):
            held = [s for s in (StoredFact.unpack(r) for r in raws) if s.fact.tier_key == tier and s.fact.slot == slot]
            held = [s for s in held if s.known_at(when, PROMOTED_ONLY)]
            if held:
                newest = max(held, key=lambda s: (instant(s.fact.valid_from), s.versions.get("value", ""), s.fact.id))
                return newest.fact
        return None

    def learned(self, tier_key: TierKey) -> dict[str, Fact]:
        """Every learned key of `tier_key` with its current value's fact (two round trips)."""
        names = {
            k.decode(): v.decode() for k, v in hash_reply(self.connection.hgetall(keys.learned_keys(tier_key))).items()
        }
        stored = self.stored(tier_key, list(names.values()))
        return {name: stored[fid].fact for name, fid in sorted(names.items()) if fid in stored}

    def procedural_rules(
        self,
        tier_keys: Sequence[TierKey],
        statuses: Sequence[FactStatus | str] = PROMOTED_ONLY,
        as_of: str | datetime | None = None,
    ) -> list[ProceduralRule]:
        """The procedures that hold at `as_of` in `tier_keys` as rules, highest priority first (one round trip)."""
        when = _now() if as_of is None else instant(as_of)
        wanted = tuple(FactStatus(s) for s in statuses)
        pipe = self.connection.pipeline(transaction=False)
        for tier in tier_keys:
            pipe.eval(_RECORDS, 2, keys.facts_by_id(tier), keys.procedural_rules(tier), "z")
        rules = []
        for tier, raws in zip(tier_keys, pipe.execute() if tier_keys else [], strict=True):
            for stored in (StoredFact.unpack(r) for r in raws):
                fact = stored.fact
                if fact.tier_key == tier and fact.type is FactType.PROCEDURE and stored.known_at(when, wanted):
                    rules.append(ProceduralRule(fact.subject, fact.value, fact.importance, fact))
        rules.sort(key=lambda r: (-r.priority, -r.fact.confidence, r.fact.id))
        return rules

    def _read(self, tier_key: TierKey, kind: str, sets: Sequence[str]) -> list[StoredFact]:
        raws = self.connection.eval(_RECORDS, 1 + len(sets), keys.facts_by_id(tier_key), *sets, kind)
        return [s for s in (StoredFact.unpack(r) for r in cast(list[bytes], raws)) if s.fact.tier_key == tier_key]

    # -- maintenance

    def reset_project(self, project_id: str) -> int:
        """Forget a project's facts (task and project tiers), its bookkeeping and its facts head; returns keys deleted.

        For `pvm replay`, which applies the project's change minutes again. The global tier is not touched:
        other projects' minutes wrote to it too (`reset_global`).
        """
        pattern = f"{keys.PREFIX}:{{p:{project_id}}}:facts:*"
        return self._delete(pattern)

    def reset_global(self) -> int:
        """Forget the global tier's facts; for a replay of every project."""
        return self._delete(f"{keys.PREFIX}:{{g}}:facts:*")

    def _delete(self, pattern: str) -> int:
        deleted = 0
        batch: list[Any] = []
        for name in self.connection.scan_iter(match=pattern, count=1000):
            batch.append(name)
            if len(batch) >= 1000:
                deleted += int(self.connection.delete(*batch))
                batch = []
        if batch:
            deleted += int(self.connection.delete(*batch))
        return deleted


__all__ = [
    "PROMOTED_ONLY",
    "FactStore",
    "FactStoreBusy",
    "Outcome",
    "ProceduralRule",
    "SlotView",
    "StoredFact",
    "order_key",
    "time_ms",
]

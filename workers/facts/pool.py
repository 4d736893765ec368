"""The facts pool: turns durable minutes into long-term memory, typed facts kept current slot by slot.

Fed by the log pool's fan-out (queue ``pvm-facts``) with records ``[minute_id, log_seq, minute_bytes,
entry_ms]`` (``entry_ms``, the stream entry time, is what freshness is measured from; three-element
records are accepted too). For an ordinary minute the extractor (`extractor_from_settings`) reads
candidate facts, and the pure core (`decide`) weighs each against the current view of its slot in its
tier key: a new value is asserted (promoted at once when its confidence reaches PVM_FACT_PROMOTE_AT,
pending below); the same value again is confirmed (sources merged, confidence raised, promoted when it
crosses the threshold); a newer value of a single-valued slot supersedes the old one; a different value
neither newer nor older contradicts it, and both are flagged. Different slots never touch each other.

Every decision is written as a knowledge-change minute (`contracts.fact_changes`): the pool XADDs them
to the shard streams, so they flow through the log like any minute, and applies them to the store
(`pvm.stores.facts`) at once. The store changes only by applying change minutes, so `pvm replay`
rebuilds it from the log without calling an extractor or a model; for the same reason the pool never
extracts from a change minute: it validates one (`fact_change`) and applies it, or refuses it (logged,
counted, never applied; the log keeps it). A learned value (``learn()``, written by whoever calls it)
is fitted into its key's history here, each supersession a minute too (`decide_learned`).

Time (docs/decisions/0015-fact-time.md): every minute is `dated` never later than its record time (its
stream entry, Redis's clock), and a slot's change minutes are timed in the order they were decided, so a
producer's clock can neither freeze nor empty a slot. A decision is written once: its change minutes are
recorded before they are written and until they are applied, and whoever takes the slot next (a retry or
any other job) writes and applies what a dead decider left before deciding (`_unapplied`). Change minute
ids derive from the source minute, the change and the fact (`contracts.ids.derived_minute_id`), and the
log keeps a minute once. One slot's decisions are serialized by a lease on the slot (ARCHITECTURE
invariant 8); different slots are decided in parallel, by one worker or several.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

import msgpack
import redis

from contracts import ContractError, InvalidMinute, Minute, decode_durable_minute, encode_minute, keys
from contracts.errors import InvalidFact
from contracts.fact_changes import (
    LEARNED_SUBJECT,
    FactAsserted,
    FactChange,
    FactConfirmed,
    FactContradicted,
    FactLearned,
    FactPromoted,
    FactSuperseded,
    FactTierPromoted,
    PromotionReason,
    asserted_minute,
    confirmed_minute,
    contradicted_minute,
    fact_change,
    is_fact_change,
    promoted_minute,
    superseded_minute,
)
from contracts.facts import (
    MAX_RELATIONSHIPS,
    Fact,
    FactStatus,
    RelationKind,
    Relationship,
    Slot,
    Tier,
    TierKey,
    check_time,
    is_valid_task_id,
)
from contracts.ids import derived_minute_id
from contracts.minute import iso_from_ms
from contracts.summaries import SYSTEM_EVENT_TYPES
from pvm import defaults
from pvm.config import Settings
from pvm.connection import hash_reply
from pvm.metrics import MetricsRecorder
from pvm.stores.facts import FactStore, Outcome, time_ms
from workers.facts.extraction import (
    Candidate,
    Extractor,
    Known,
    RuleExtractor,
    questioning_candidates,
    reads_known,
    resolve_open_slots,
)
from workers.facts.extraction_llm import llm_extractor_from_settings
from workers.rules.fact_timeline import fit, on_promotion, place
from workers.rules.questioning import may_question
from workers.runtime.clock import ChangeClock
from workers.runtime.context import WorkerContext
from workers.runtime.heads import FRESH, advance_script, runs
from workers.runtime.messages import FannedOut, decode_fanned_out
from workers.runtime.minutes import add_minutes

log = logging.getLogger(__name__)

# -- pure core --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sourced:
    """A candidate fact with the minute that states it (its project, time and id name what it leads to) and that
    minute's record time (`record_ms`, Unix ms: when it entered PVM, `record_time_ms`)."""

    candidate: Candidate
    minute: Minute
    record_ms: int


@dataclass(frozen=True, slots=True)
class Learned:
    """A learned value (``fact_learned``, or a learned value promoted a tier up) to fit into its key's history:
    the change minute that carries it, its fact's id and the minute's record time (Unix ms)."""

    minute: Minute
    fact_id: str
    record_ms: int


@dataclass
class Decision:
    """The change minutes one slot's statements lead to, in the order they apply, with what each kind counted.

    `decided` holds the same minutes by source minute id: what `keys.facts_decided` keeps from before they
    are written until they are applied. `changes`: each minute's `fact_change`, read once from the minute.
    """

    minutes: list[Minute] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    decided: dict[str, list[Minute]] = field(default_factory=dict)
    changes: list[FactChange] = field(default_factory=list)


def record_time_ms(minute: Minute, entry_ms: int | None) -> int:
    """When `minute` entered PVM (Unix ms): its stream entry's time, taken by Redis's clock, not the producer's.

    A record without it (older fan-outs) falls back to the minute's own time, never later than now.
    """
    if entry_ms is not None:
        return entry_ms
    return min(time_ms(minute.timestamp), int(time.time() * 1000))


def dated(minute: Minute, record_ms: int) -> Minute:
    """`minute` as the facts are dated from it: its own time, but never later than its record time.

    A producer's clock may run ahead (a minute stamped 2031 is valid); what it states cannot start holding,
    nor be known, after PVM recorded it (docs/decisions/0015-fact-time.md).
    """
    if time_ms(minute.timestamp) <= record_ms:
        return minute
    return Minute.from_dict({**minute.to_dict(), "timestamp": iso_from_ms(record_ms)})


def tier_key_of(candidate: Candidate, minute: Minute) -> TierKey | None:
    """The tier key a candidate's fact lives in: its minute's project, its task if it names a valid one.

    None when the candidate names another project than the minute that states it (an extractor's bug):
    one project's minutes never make another project's facts.
    """
    if candidate.project_id != minute.project_id:
        return None
    if candidate.tier == Tier.TASK and is_valid_task_id(candidate.task_id):
        return TierKey.for_task(minute.project_id, str(candidate.task_id))
    return TierKey.for_project(minute.project_id)


def confirmed_confidence(held: float, stated: float) -> float:
    """A fact's confidence once stated again: independent evidence (noisy-or), never lower than before."""
    return max(held, round(1.0 - (1.0 - held) * (1.0 - stated), 4))


def decide(
    view: Sequence[Fact],
    sourced: Sequence[Sourced],
    tier_key: TierKey,
    promote_at: float,
    after_ms: int = 0,
) -> Decision:
    """The change minutes that bring one slot of `tier_key` from `view` (its history) up to `sourced`.

    Candidates are taken in the order of their minutes (time, then id), each against the view as the
    changes before it left it:

    - its value is in the slot already, in a period it restates (`workers.rules.fact_timeline.place`):
      ``fact_confirmed`` (its sources, confidence by `confirmed_confidence`), and ``fact_promoted`` when a
      pending fact reaches `promote_at`; nothing when every source is one the fact already has (a retried
      batch), or the fact was retracted;
    - a new value, or one that comes back after every period of it ended (its next ``period``):
      ``fact_asserted`` (promoted at `promote_at`, else pending), fitted into the slot's timeline when
      both are single-valued (`_new_value`): a value holding when it starts is superseded there
      (``fact_superseded``; the new fact carries ``supersedes``), the earliest value starting after it
      supersedes it, a value from the same instant contradicts it.

    Each change minute is timed at its source minute's time (`dated`: never later than the minute's record
    time), or just after the slot's previous change (`after_ms`, then each one written before it) when
    that is later: the store orders a fact's changes by time, so they follow the order they were decided
    in, and a producer's clock running ahead never pushes a slot's changes into the future. Pure: ids
    derive from that time, the source minute, the change and the facts, so the same inputs always give
    the same minutes.
    """
    facts = {f.id: f for f in view}
    clock = ChangeClock(after_ms)
    decision = Decision()
    by_minute: dict[str, list[Sourced]] = {}
    for item in sorted(sourced, key=lambda s: (time_ms(s.minute.timestamp), s.minute.id)):
        by_minute.setdefault(item.minute.id, []).append(item)
    for minute_id, items in by_minute.items():
        mine = decision.decided.setdefault(minute_id, [])
        for item in items:
            fresh = _fact(item, tier_key, promote_at)
            if fresh is None:
                continue
            placing = place(facts.values(), fresh)
            if placing.restates is not None:
                made = _restated(placing.restates, fresh, facts, item, clock, promote_at)
            else:
                made = _new_value(fresh.with_(period=placing.period), facts, item, clock)
            for minute, change, kind in made:
                decision.minutes.append(minute)
                decision.changes.append(change)
                mine.append(minute)
                decision.counts[kind] += 1
                if isinstance(change, FactAsserted) and change.fact.status is FactStatus.PROMOTED:
                    decision.counts["promoted"] += 1  # promoted as it was asserted: at or above the threshold
                _apply_here(facts, change)
    return decision


def decide_learned(
    view: Sequence[Fact],
    learned: Sequence[Learned],
    after_ms: int = 0,
) -> Decision:
    """The ``fact_superseded`` minutes that fit learned values into their key's history (`view`, the slot).

    A learned value is written by whoever calls ``learn()``, an agent's emitter included, with no decider
    in between; here, once the store holds it, it takes its place by the one timeline rule
    (`workers.rules.fact_timeline.fit`): each value holding when it starts is superseded there, and the earliest
    value starting after it supersedes it. Two values learned at the same instant are left as they are
    (`recall` reads the one learned last). Written as minutes, the supersessions reach the fact points and
    replay like every change. Deciding again after they are applied writes nothing.
    """
    facts = {f.id: f for f in view}
    clock = ChangeClock(after_ms)
    decision = Decision()
    for item in sorted(learned, key=lambda i: (i.record_ms, i.minute.id)):
        mine = decision.decided.setdefault(item.minute.id, [])
        fresh = facts.get(item.fact_id)
        if fresh is None or fresh.status is FactStatus.RETRACTED or not fresh.single_valued:
            continue  # not held (a cleared task, a refused change) or withdrawn: nothing to fit
        fitting = fit(facts.values(), fresh)
        pairs = [(old, fresh) for old in fitting.older]
        later = fitting.later
        if later is not None and not (fresh.status is FactStatus.SUPERSEDED and fresh.valid_until == later.valid_from):
            pairs.append((fresh, later))
        for old, new in pairs:
            # A global key's change lives in the log of the project that learned the value (contract rule).
            project = item.minute.project_id if old.tier_key.tier is Tier.GLOBAL else None
            stamp = _stamp(clock, item, "fact_superseded", old.id, new.id)
            minute = superseded_minute(old, new, project_id=project, **stamp)
            change = fact_change(minute)
            decision.minutes.append(minute)
            decision.changes.append(change)
            mine.append(minute)
            decision.counts["superseded"] += 1
            _apply_here(facts, change)
    return decision


def _stamp(clock: ChangeClock, source: Sourced | Learned, kind: str, *parts: str) -> dict[str, str]:
    """The `minute_id` and `timestamp` of the next change minute of a slot decided from `source` (builders' keyword
    arguments): at the source minute's time, never later than its record time, after the slot's change before."""
    stated_ms = time_ms(source.minute.timestamp)
    dated_ms = min(stated_ms, source.record_ms)
    ms = clock.at(dated_ms)
    timestamp = source.minute.timestamp if ms == dated_ms == stated_ms else iso_from_ms(ms)
    return {"minute_id": derived_minute_id(ms, source.minute.id, kind, *parts), "timestamp": timestamp}


def _instant(timestamp: str) -> datetime:
    return check_time(timestamp, "timestamp")


def _fact(item: Sourced, tier_key: TierKey, promote_at: float) -> Fact | None:
    c = item.candidate
    try:
        return Fact.new(
            type=c.type,
            text=c.text,
            subject=c.subject,
            attribute=c.attribute,
            value=c.value,
            tier_key=tier_key,
            confidence=c.confidence,
            source_minute_ids=tuple(dict.fromkeys(c.source_minute_ids or (item.minute.id,))),
            status=FactStatus.PROMOTED if c.confidence >= promote_at else FactStatus.PENDING,
            valid_from=c.valid_from,
            recorded_at=item.minute.timestamp,  # `dated`: never later than the minute's record time
            tags=tuple(dict.fromkeys(c.tags)),
            single_valued=c.single_valued,
            relationships=(Relationship(RelationKind.QUESTIONS, c.questions_fact_id),) if c.questions_fact_id else (),
        )
    except InvalidFact as exc:
        log.warning("facts pool: a candidate of minute %s is not a fact (%s); skipped", item.minute.id, exc)
        return None


_Made = tuple[Minute, FactChange, str]


# What each change counts as (`keys.FACT_CHANGE_COUNTERS`).
_KIND: dict[type, str] = {
    FactAsserted: "asserted",
    FactConfirmed: "confirmed",
    FactPromoted: "promoted",
    FactSuperseded: "superseded",
    FactContradicted: "contradicted",
}


def _made(minute: Minute, kind: str) -> _Made:
    return minute, fact_change(minute), kind


def _restated(
    known: Fact, fresh: Fact, facts: dict[str, Fact], source: Sourced, clock: ChangeClock, promote_at: float
) -> list[_Made]:
    new_sources = [m for m in fresh.source_minute_ids if m not in known.source_minute_ids]
    if not new_sources or known.status is FactStatus.RETRACTED:
        return []
    confidence = confirmed_confidence(known.confidence, fresh.confidence)
    confirmed = confirmed_minute(known, new_sources, confidence, **_stamp(clock, source, "fact_confirmed", known.id))
    made = [_made(confirmed, "confirmed")]
    if known.status is FactStatus.PENDING and confidence >= promote_at:
        promoted = promoted_minute(known, PromotionReason.THRESHOLD, **_stamp(clock, source, "fact_promoted", known.id))
        made.append(_made(promoted, "promoted"))
        for old in on_promotion(facts.values(), known):  # trusted now: it retires what it replaced
            minute = superseded_minute(old, known, **_stamp(clock, source, "fact_superseded", old.id, known.id))
            made.append(_made(minute, "superseded"))
    return made


def _new_value(fresh: Fact, facts: dict[str, Fact], source: Sourced, clock: ChangeClock) -> list[_Made]:
    """A value new to the slot: assert it, and fit it into the slot's timeline (`workers.rules.fact_timeline.fit`).

    Each value it supersedes is superseded where it starts; the value superseding it (a late minute fills
    its place in the history) supersedes it; a value from the same instant contradicts it. A pending value
    leaves promoted ones current until it is promoted itself.
    """
    fitting = fit(facts.values(), fresh)
    supersedes = tuple(Relationship(RelationKind.SUPERSEDES, f.id) for f in fitting.older[-MAX_RELATIONSHIPS:])
    # Its own relationships (a questioning statement's) first.
    asserted = fresh.with_(relationships=(*fresh.relationships, *supersedes)[:MAX_RELATIONSHIPS])
    made = [_made(asserted_minute(asserted, **_stamp(clock, source, "fact_asserted", fresh.id)), "asserted")]
    for old in fitting.older:
        minute = superseded_minute(old, asserted, **_stamp(clock, source, "fact_superseded", old.id, fresh.id))
        made.append(_made(minute, "superseded"))
    if fitting.later is not None:
        later = fitting.later
        minute = superseded_minute(asserted, later, **_stamp(clock, source, "fact_superseded", fresh.id, later.id))
        made.append(_made(minute, "superseded"))
    for other in fitting.same:
        minute = contradicted_minute(asserted, other, **_stamp(clock, source, "fact_contradicted", fresh.id, other.id))
        made.append(_made(minute, "contradicted"))
    return made


def _apply_here(facts: dict[str, Fact], change: FactChange) -> None:
    """What a change does to the slot's view while the rest of the batch is decided (the contract's `apply_to`)."""
    if isinstance(change, FactAsserted):
        facts[change.fact.id] = change.fact
    elif isinstance(change, FactContradicted):
        for fid in (change.fact_id, change.contradicted_by):
            facts[fid] = change.apply_to(facts[fid])
    elif isinstance(change, (FactConfirmed, FactPromoted, FactSuperseded)):
        facts[change.fact_id] = change.apply_to(facts[change.fact_id])


# -- decoding ---------------------------------------------------------------------------------------------------


LoggedMinute = FannedOut  # a fanned-out minute as this pool reads it (workers/runtime/messages.py)


def _data_is_a_mapping(minute: Minute) -> None:
    if not isinstance(minute.data, dict):
        raise InvalidMinute("data", f"must be a mapping, got {type(minute.data).__name__}")


def decode(
    records: Sequence[Sequence[Any]], returning: Returning | None = None
) -> tuple[list[LoggedMinute], list[str]]:
    """Decode fanned-out records (`workers.runtime.messages.decode_fanned_out`); a minute whose data is not a mapping
    does not decode here (the rules read it). A change minute this process wrote comes back as it was written
    (`returning`)."""
    known = returning.minute if returning is not None else None
    return decode_fanned_out(records, "facts", _data_is_a_mapping, known)


RETURNING_KEPT = 8_192  # change minutes written and not yet back from the log, per process (~2 KB each)


class Returning:
    """The change minutes this process wrote and applied, until the log hands them back to it.

    A decided change minute is built here, read as a change (`fact_change`), written to the streams and applied;
    the log then fans it out to this pool like any minute, and the store applies it again (idempotent: the log is
    the truth). A record whose bytes are the very bytes written here is that minute: it is taken as it was built,
    not decoded and read again. Bounded (`RETURNING_KEPT`, oldest first); a minute forgotten, written by another
    process, or changed on the way is decoded as any other.
    """

    def __init__(self, kept: int = RETURNING_KEPT) -> None:
        self._kept = kept
        self._written: OrderedDict[bytes, tuple[Minute, FactChange]] = OrderedDict()
        self._back: dict[tuple[str, str], tuple[Minute, FactChange]] = {}  # taken by `minute`, for `change`

    def add(self, raw: Mapping[tuple[str, str], bytes], changes: Sequence[tuple[Minute, FactChange]]) -> None:
        """Changes written (`raw`: each minute's bytes by (project, minute id)) and applied."""
        for minute, change in changes:
            self._written[raw[(minute.project_id, minute.id)]] = (minute, change)
        while len(self._written) > self._kept:
            self._written.popitem(last=False)

    def minute(self, raw: bytes) -> Minute | None:
        """The minute written as `raw`, if this process wrote it (then `change` gives its change)."""
        found = self._written.pop(raw, None)
        if found is None:
            return None
        self._back[(found[0].project_id, found[0].id)] = found
        return found[0]

    def change(self, minute: Minute) -> FactChange:
        """`fact_change(minute)`: the change read when it was built, for a minute `minute` gave back."""
        found = self._back.pop((minute.project_id, minute.id), None)
        return found[1] if found is not None and found[0] is minute else fact_change(minute)

    def settle(self) -> None:
        """A batch is done: what it took back and did not read as a change is forgotten."""
        self._back.clear()


# -- the extractor ----------------------------------------------------------------------------------------------


def extractor_from_settings(settings: Settings, metrics: MetricsRecorder | None = None) -> Extractor:
    """The extractor the pool runs: the rules (offline, deterministic), or the LLM's when PVM_LLM_MODEL is set.

    The LLM extractor (workers/facts/extraction_llm.py) falls back to the rules itself, chunk by chunk, when the
    model is unavailable or its answer is rejected.
    """
    rules = RuleExtractor(statements=settings.fact_statements == "keep")
    return llm_extractor_from_settings(settings, metrics, fallback=rules) or rules


# -- RQ entry point ---------------------------------------------------------------------------------------------


@dataclass
class FactsContext:
    """What a batch is worked with: settings, the store, the extractor, metrics, and this process's lease token."""

    settings: Settings
    store: FactStore
    extractor: Extractor
    metrics: MetricsRecorder
    owner: str
    returning: Returning = field(default_factory=Returning)

    @classmethod
    def build(cls, connection: redis.Redis, settings: Settings, extractor: Extractor | None = None) -> FactsContext:
        metrics = MetricsRecorder(connection)
        return cls(
            settings=settings,
            store=FactStore(connection),
            extractor=extractor_from_settings(settings, metrics) if extractor is None else extractor,
            metrics=metrics,
            owner=f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
        )


def _context(worker: WorkerContext) -> FactsContext:
    """The facts pool's parts of a worker, built on its first facts job (`WorkerContext.part`)."""
    return FactsContext.build(worker.connection, worker.settings)


class SlotsBusy(RuntimeError):
    """Other workers held some of a batch's slots for longer than the batch waits; the job is retried."""


_ADVANCE_HEAD = advance_script("applied_at")


def facts_batch(ctx: FactsContext, connection: redis.Redis, records: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """Work one batch of ``[minute_id, log_seq, minute_bytes, entry_ms]`` records into the facts; the body of `run`.

    Change minutes are validated and applied; ordinary minutes are extracted and decided slot by slot
    under leases, the resulting change minutes written to the streams and applied. Then the facts heads
    move, and the metrics and the counters are recorded.
    """
    started = time.time()
    logged, undecodable = decode(records, ctx.returning)
    counts: Counter[str] = Counter()
    try:
        changes = [r for r in logged if is_fact_change(r.minute)]
        # A chunk summary restates minutes the facts came from already: nothing to extract from it.
        ordinary = [r for r in logged if r.minute.event_type not in SYSTEM_EVENT_TYPES]
        applied, learned = _apply_from_log(ctx, changes, counts)
        written = _extract_and_decide(ctx, connection, ordinary, learned, counts)
    except Exception:
        ctx.metrics.failure("facts", len(records))  # best-effort: never raises in place of the batch's error
        raise
    finally:
        ctx.returning.settle()
    applied_at = time.time()
    fresh = _advance_heads(ctx, connection, logged, len(records), applied_at - started, counts)
    ctx.metrics.freshness("facts", [applied_at - r.entry_ms / 1000.0 for r in fresh if r.entry_ms is not None])
    return {
        "minutes": len(logged),
        "changes_applied": applied,
        "changes_written": written,
        "counts": dict(sorted(counts.items())),
        "undecodable": undecodable,
        "seconds": round(applied_at - started, 6),
    }


def _apply_from_log(
    ctx: FactsContext, logged: Sequence[LoggedMinute], counts: Counter[str]
) -> tuple[int, dict[tuple[TierKey, Slot], list[Learned]]]:
    """Validate and apply the change minutes the log carries; refuse (log, count, never apply) invalid ones.

    Returns how many changed the store, and the learned values among them by slot, to fit into their keys'
    histories (`decide_learned`).
    """
    valid: list[tuple[Minute, FactChange]] = []
    records: list[LoggedMinute] = []
    for r in logged:
        try:
            valid.append((r.minute, ctx.returning.change(r.minute)))
            records.append(r)
        except ContractError as exc:
            counts["refused"] += 1
            log.warning(
                "facts pool: refused change minute %s of project %s: %s (the log keeps it; nothing applied)",
                r.minute.id,
                r.minute.project_id,
                exc,
            )
    outcomes = ctx.store.apply_changes(valid) if valid else []
    learned: dict[tuple[TierKey, Slot], list[Learned]] = {}
    for r, (minute, change), outcome in zip(records, valid, outcomes, strict=True):
        if outcome is Outcome.REFUSED:
            counts["refused"] += 1
            log.warning(
                "facts pool: refused change minute %s of project %s: it does not fit the fact it names",
                minute.id,
                minute.project_id,
            )
        elif isinstance(change, (FactLearned, FactTierPromoted)) and change.fact.slot.subject == LEARNED_SUBJECT:
            fact = change.fact
            learned.setdefault((fact.tier_key, fact.slot), []).append(
                Learned(minute, fact.id, record_time_ms(minute, r.entry_ms))
            )
    return sum(outcome is Outcome.APPLIED for outcome in outcomes), learned


def _extract_and_decide(
    ctx: FactsContext,
    connection: redis.Redis,
    logged: Sequence[LoggedMinute],
    learned: dict[tuple[TierKey, Slot], list[Learned]],
    counts: Counter[str],
) -> int:
    """Extract candidates from ordinary minutes, then decide, write and apply each slot's changes under its lease
    (the learned values' slots too).

    Each minute is read as `dated` by its record time: a producer's clock ahead of PVM's dates nothing later
    than when PVM recorded the minute.
    """
    work: dict[tuple[TierKey, Slot], _SlotWork] = {slot: _SlotWork(learned=items) for slot, items in learned.items()}
    if logged:
        record_ms = {(r.minute.project_id, r.minute.id): record_time_ms(r.minute, r.entry_ms) for r in logged}
        minutes = [dated(r.minute, record_ms[(r.minute.project_id, r.minute.id)]) for r in logged]
        by_id = {(m.project_id, m.id): m for m in minutes}  # ids are unique within a project only
        known = known_facts(ctx.store, minutes) if reads_known(ctx.extractor) else None
        candidates = ctx.extractor.extract(minutes, known)
        counts["extracted"] += len(candidates)
        if any(
            (c.supersedes_hint and c.rule.startswith("open_")) or c.replaces_value or c.rule == "open_added"
            for c in candidates
        ):
            # An open slot's change finds the slot it changes (`resolve_open_slots`): read only when there is one.
            held = known if known is not None else known_facts(ctx.store, minutes)
            candidates = resolve_open_slots(candidates, held)
        for candidate in candidates:
            key = next(
                (k for k in ((candidate.project_id, m) for m in candidate.source_minute_ids) if k in by_id), None
            )
            if key is None:
                log.warning(
                    "facts pool: a candidate names no minute of its batch (%s); skipped", candidate.source_minute_ids
                )
                continue
            minute = by_id[key]
            tier_key = tier_key_of(candidate, minute)
            if tier_key is None:
                log.warning(
                    "facts pool: a candidate of minute %s names project %r, not the minute's %r; skipped",
                    minute.id,
                    candidate.project_id,
                    minute.project_id,
                )
                continue
            try:
                slot = Slot(candidate.subject, candidate.attribute)
            except InvalidFact as exc:
                log.warning("facts pool: a candidate of minute %s has no slot (%s); skipped", minute.id, exc)
                continue
            work.setdefault((tier_key, slot), _SlotWork()).sourced.append(Sourced(candidate, minute, record_ms[key]))
    written = _decide_under_leases(ctx, connection, work, counts) if work else 0
    if logged and ctx.settings.fact_statements == "keep":
        written += _question_held(ctx, connection, minutes, candidates, record_ms, counts)
    return written


def _question_held(
    ctx: FactsContext,
    connection: redis.Redis,
    minutes: Sequence[Minute],
    candidates: Sequence[Candidate],
    record_ms: Mapping[tuple[str, str], int],
    counts: Counter[str],
) -> int:
    """After a batch's candidates are decided: the statements of its minutes that question a held fact
    (`questioning_candidates`), decided like any other. The current view is read only for minutes whose text
    could question something (`may_question`)."""
    asking = [m for m in minutes if may_question(m.memory_note or "")]
    if not asking:
        return 0
    found = questioning_candidates(asking, candidates, known_facts(ctx.store, asking))
    if not found:
        return 0
    counts["questioning"] += len(found)
    by_id = {(m.project_id, m.id): m for m in asking}
    work: dict[tuple[TierKey, Slot], _SlotWork] = {}
    for candidate in found:
        key = (candidate.project_id, candidate.source_minute_ids[0])
        tier_key = tier_key_of(candidate, by_id[key])
        if tier_key is not None:
            slot = Slot(candidate.subject, candidate.attribute)  # a held fact's subject: a valid slot
            sourced = Sourced(candidate, by_id[key], record_ms[key])
            work.setdefault((tier_key, slot), _SlotWork()).sourced.append(sourced)
    return _decide_under_leases(ctx, connection, work, counts) if work else 0


@dataclass
class _SlotWork:
    """What one slot has to decide in a batch: statements extracted from minutes, and learned values to fit."""

    sourced: list[Sourced] = field(default_factory=list)
    learned: list[Learned] = field(default_factory=list)


def known_facts(store: FactStore, minutes: Sequence[Minute]) -> Known:
    """The facts an extractor weighs `minutes` against: pending or promoted now, by slot, in their tier keys only.

    The tier keys are each minute's project and, when it names a valid one, its task: one round trip, and
    never another project's facts (the global tier is only ever written by promotion, so it is not read).
    """
    tiers: dict[TierKey, None] = {}
    for m in minutes:
        tiers.setdefault(TierKey.for_project(m.project_id))
        task_id = m.data.get("task_id")
        if is_valid_task_id(task_id):
            tiers.setdefault(TierKey.for_task(m.project_id, str(task_id)))
    known: dict[tuple[str, str], list[Fact]] = {}
    for fact in store.current(list(tiers), statuses=(FactStatus.PENDING, FactStatus.PROMOTED)):
        known.setdefault((fact.slot.subject, fact.slot.attribute), []).append(fact)
    return known


def _decide_under_leases(
    ctx: FactsContext,
    connection: redis.Redis,
    by_slot: dict[tuple[TierKey, Slot], _SlotWork],
    counts: Counter[str],
) -> int:
    """Decide every slot's candidates while holding its lease; slots another worker holds are waited for.

    Per round: take the leases that are free (one round trip); finish what an earlier decider of those
    slots wrote and did not apply (`_unapplied`: one round trip, more only when there is some); read the
    slots, decide, record the decisions and XADD their change minutes (one each), apply them (a
    transaction per project), forget the records and give the leases back (one each). A slot stays busy
    at most as long as another worker's round on it; after `FACTS_LEASE_WAIT_S` the batch fails with
    `SlotsBusy` and is retried (every step is idempotent).
    """
    pending = dict(by_slot)
    written = 0
    wait = defaults.FACTS_LEASE_POLL_S
    deadline = time.monotonic() + defaults.FACTS_LEASE_WAIT_S
    while pending:
        slots = list(pending)
        taken = ctx.store.lease_slots(ctx.owner, slots, defaults.FACTS_SLOT_LEASE_MS)
        mine = [slot for slot, ok in zip(slots, taken, strict=True) if ok]
        if mine:
            try:
                written += _unapplied(ctx, connection, mine, counts)
                changes, decided = _decide_slots(ctx, mine, pending, counts)
                written_raw = _write(connection, ctx.settings.shards, [m for m, _ in changes], decided)
                ctx.store.apply_changes(changes)
                ctx.returning.add(written_raw, changes)
                _forget(connection, decided)
                written += len(changes)
            finally:
                ctx.store.release_slots(ctx.owner, mine)
            for slot in mine:
                del pending[slot]
            wait = defaults.FACTS_LEASE_POLL_S
            continue
        if time.monotonic() >= deadline:
            raise SlotsBusy(
                f"{len(pending)} slot(s) stayed leased by other facts workers for {defaults.FACTS_LEASE_WAIT_S} s; "
                "the job is retried (a worker that died holding a lease loses it after "
                f"{defaults.FACTS_SLOT_LEASE_MS} ms)"
            )
        time.sleep(wait)
        wait = min(wait * 2, 0.2)
    return written


# Decisions to record: per slot's key (`keys.facts_decided`), source minute id -> its change minutes.
_Records = dict[str, dict[str, list[Minute]]]


def _unapplied(
    ctx: FactsContext, connection: redis.Redis, slots: Sequence[tuple[TierKey, Slot]], counts: Counter[str]
) -> int:
    """Write again and apply the change minutes an earlier decider of `slots` wrote and did not apply.

    A decider that dies (or loses Redis) between writing a slot's change minutes and applying them leaves
    them recorded (`keys.facts_decided`). Whoever takes the slot next, its own retry or any other job,
    XADDs them again (the log keeps a minute once) and applies them before it reads the slot: so it
    decides against them, and a retry finds its statements held and writes nothing new. A decision is
    written once, under one set of ids, whatever the log applied meanwhile. Returns how many minutes.
    """
    names = [keys.facts_decided(tier_key, slot) for tier_key, slot in slots]
    pipe = connection.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(name)
    found: _Records = {}
    for name, raw in zip(names, pipe.execute(), strict=True):
        for source, packed in hash_reply(raw).items():
            minutes = [decode_durable_minute(b) for b in msgpack.unpackb(packed, raw=False)]
            found.setdefault(name, {})[source.decode()] = minutes
    if not found:
        return 0
    minutes = [m for of_slot in found.values() for made in of_slot.values() for m in made]
    _write(connection, ctx.settings.shards, minutes, {})
    changes = [(m, fact_change(m)) for m in minutes]
    ctx.store.apply_changes(changes)
    for _, change in changes:
        counts[_KIND[type(change)]] += 1
        if isinstance(change, FactAsserted) and change.fact.status is FactStatus.PROMOTED:
            counts["promoted"] += 1
    _forget(connection, found)
    log.warning("facts pool: applied %d change minute(s) an earlier decider wrote and did not apply", len(minutes))
    return len(minutes)


def _decide_slots(
    ctx: FactsContext,
    slots: Sequence[tuple[TierKey, Slot]],
    pending: dict[tuple[TierKey, Slot], _SlotWork],
    counts: Counter[str],
) -> tuple[list[tuple[Minute, FactChange]], _Records]:
    """The change minutes of `slots`, in order, each with its change, and the same by slot and source minute (to
    record)."""
    minutes: list[tuple[Minute, FactChange]] = []
    decided: _Records = {}
    for (tier_key, slot), view in zip(slots, ctx.store.slot_views(slots), strict=True):
        work = pending[(tier_key, slot)]
        decision = decide(view.facts, work.sourced, tier_key, ctx.settings.fact_promote_at, view.last_ms)
        if work.learned:
            after = max([view.last_ms, *(time_ms(m.timestamp) for m in decision.minutes)])
            more = decide_learned(_applied(view.facts, decision.changes), work.learned, after)
            decision.minutes += more.minutes
            decision.changes += more.changes
            decision.counts.update(more.counts)
            decision.decided.update(more.decided)
        minutes.extend(zip(decision.minutes, decision.changes, strict=True))
        counts.update(decision.counts)
        made = {source: of_source for source, of_source in decision.decided.items() if of_source}
        if made:
            decided[keys.facts_decided(tier_key, slot)] = made
    return minutes, decided


def _applied(view: Sequence[Fact], changes: Sequence[FactChange]) -> list[Fact]:
    facts = {f.id: f for f in view}
    for change in changes:
        _apply_here(facts, change)
    return list(facts.values())


def _write(
    connection: redis.Redis, shards: int, minutes: Iterable[Minute], decided: _Records
) -> dict[tuple[str, str], bytes]:
    """Record `decided`, then XADD the change minutes to their projects' shard streams as `emit` would; each
    minute's bytes as written, by (project, minute id).

    One round trip, records first: Redis runs and persists a connection's commands in order, so a minute
    on a stream always has its decision recorded until it is applied (`_unapplied`).
    """
    raw = {(m.project_id, m.id): encode_minute(m) for m in minutes}  # each encoded once, for both
    pipe = connection.pipeline(transaction=False)
    for name, of_slot in decided.items():
        packed = {
            source: cast(bytes, msgpack.packb([raw[(m.project_id, m.id)] for m in made], use_bin_type=True))
            for source, made in of_slot.items()
        }
        pipe.hset(name, mapping=packed)  # type: ignore[arg-type]
        pipe.pexpire(name, defaults.FACTS_DECISION_TTL_MS)
    add_minutes(pipe, shards, ((project_id, encoded) for (project_id, _), encoded in raw.items()))
    if raw or decided:
        pipe.execute()
    return raw


def _forget(connection: redis.Redis, decided: _Records) -> None:
    """Drop the records of decisions now applied: the store holds them (one round trip)."""
    if not decided:
        return
    pipe = connection.pipeline(transaction=False)
    for name, of_slot in decided.items():
        pipe.hdel(name, *of_slot)
    pipe.execute()


def _advance_heads(
    ctx: FactsContext,
    connection: redis.Redis,
    records: Sequence[LoggedMinute],
    batch_minutes: int,
    batch_seconds: float,
    counts: Counter[str],
) -> list[LoggedMinute]:
    """Mark the records applied, raise each project's facts head as far as it is contiguous, count the batch.

    Returns the records applied for the first time (a retried or replayed minute is not fresh again).
    Heads, batch metrics and the change counters share one round trip; a metrics error is only logged,
    a head's error fails the batch (it is retried).
    """
    by_project: dict[str, list[LoggedMinute]] = {}
    for r in records:
        by_project.setdefault(r.minute.project_id, []).append(r)
    pipe = connection.pipeline(transaction=False)
    stamp = repr(time.time())
    for project_id, of_project in by_project.items():
        seqs = runs([r.seq for r in of_project])
        pipe.eval(_ADVANCE_HEAD, 2, keys.facts_head(project_id), keys.facts_done(project_id), stamp, *seqs)
    ctx.metrics.batch("facts", batch_minutes, batch_seconds, pipeline=pipe)
    for name, n in counts.items():
        if n:
            pipe.hincrby(keys.metrics_fact_changes(), name, n)
    replies = pipe.execute(raise_on_error=False)
    heads, metrics = replies[: len(by_project)], replies[len(by_project) :]
    for reply in heads:
        if isinstance(reply, Exception):
            raise reply
    for reply in metrics:
        if isinstance(reply, Exception):
            log.warning("facts pool: metrics not recorded: %s", reply)
            break
    fresh: list[LoggedMinute] = []
    for of_project, (_, _, flags) in zip(by_project.values(), heads, strict=True):
        if isinstance(flags, str):
            flags = flags.encode()
        fresh.extend(r for r, flag in zip(of_project, flags, strict=True) if flag == FRESH)
    return fresh


def run(worker: WorkerContext, records: list[list[Any]]) -> dict[str, Any]:
    """The job `keys.FACTS_JOB`: work one fanned-out batch of durable minutes into the facts (see the module
    docstring)."""
    return facts_batch(worker.part(_context), worker.connection, records)

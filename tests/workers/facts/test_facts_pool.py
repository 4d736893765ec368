"""The facts pool: extraction, decisions by slot, change minutes through the log, the store and replay."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from contracts import Minute, encode_minute, fact_change, keys
from contracts.fact_changes import asserted_minute, learned_minute
from contracts.facts import Fact, FactStatus, RelationKind, Slot, TierKey, fact_id
from contracts.ids import id_timestamp_ms
from pvm.config import Settings
from pvm.stores.facts import FactStore, Outcome, time_ms
from pvm.stores.log import LogReader
from tests.pvm.test_facts_store import state
from workers.facts import pool as facts_pool
from workers.facts.extraction import Candidate, Known, RuleExtractor
from workers.facts.pool import FactsContext, Sourced, decide, facts_batch
from workers.ingest.dispatcher import Dispatcher
from workers.ops.replay import replay_facts
from workers.runtime import messages
from workers.runtime.queues import pool_queue
from workers.runtime.runner import PvmWorker

T0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
P1 = TierKey.for_project("p1")
TTL = Slot("auth service", "session_ttl")


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # as the extractor writes times


def said(
    n: int,
    value: str,
    minutes: float = 0,
    *,
    project: str = "p1",
    subject: str = "auth service",
    attribute: str = "session ttl",
    confidence: float | None = None,
    task: str | None = None,
) -> Minute:
    """Minute `n` stating one fact by the data convention (docs/extraction.md)."""
    stated: dict[str, Any] = {"subject": subject, "attribute": attribute, "value": value}
    if confidence is not None:
        stated["confidence"] = confidence
    data: dict[str, Any] = {"fact": stated}
    if task is not None:
        data["task_id"] = task
    return Minute(
        event_type="knowledge",
        id=f"m{n:05d}",
        project_id=project,
        agent_id="a1",
        timestamp=at(minutes),
        data=data,
        scope="task" if task else "project",
    )


def records(minutes: Sequence[Minute], first_seq: int = 1) -> list[list[object]]:
    """Fanned-out records of `minutes`, each entered PVM (its stream entry time) at the minute's own time."""
    return [[m.id, first_seq + i, encode_minute(m), time_ms(m.timestamp)] for i, m in enumerate(minutes)]


class CountingExtractor:
    """The rules, counting the minutes they read (a replay must read none)."""

    def __init__(self) -> None:
        self.rules = RuleExtractor()
        self.read: list[str] = []

    def extract(self, minutes: Sequence[Minute], known: Known | None = None) -> list[Candidate]:
        self.read += [m.id for m in minutes]
        return self.rules.extract(minutes, known)


@pytest.fixture
def extractor() -> CountingExtractor:
    return CountingExtractor()


@pytest.fixture
def ctx(redis_client: redis.Redis, settings: Settings, extractor: CountingExtractor) -> FactsContext:
    return FactsContext.build(redis_client, settings, extractor=extractor)


def stream_minutes(connection: redis.Redis, settings: Settings, project: str = "p1") -> list[Minute]:
    from contracts import decode_minute

    entries = connection.xrange(keys.stream(keys.shard_of(project, settings.shards)))
    return [decode_minute(fields[keys.MINUTE_FIELD]) for _, fields in entries]


def kinds(minutes: Sequence[Minute]) -> list[str]:
    return [m.event_type for m in minutes]


# -- the pure core ----------------------------------------------------------------------------------------------


def candidates(*minutes: Minute) -> list[Sourced]:
    """Each minute's candidates, the minute recorded at its own time."""
    return [Sourced(c, m, time_ms(m.timestamp)) for m in minutes for c in RuleExtractor().extract([m])]


def held(view: list[Fact], minutes: Sequence[Minute]) -> list[Fact]:
    """`view` with `minutes` applied, as the store would (by the contract's apply_to)."""
    facts = {f.id: f for f in view}
    for m in minutes:
        change = fact_change(m)
        if hasattr(change, "fact"):
            facts[change.fact.id] = change.fact
        for name in ("fact_id", "contradicted_by"):
            fid = getattr(change, name, None)
            if fid in facts and not hasattr(change, "fact"):
                facts[fid] = change.apply_to(facts[fid])  # type: ignore[union-attr]
    return list(facts.values())


def test_a_new_value_is_asserted_pending_below_the_threshold_and_promoted_at_it() -> None:
    low = decide([], candidates(said(1, "30 minutes", confidence=0.6)), P1, promote_at=0.8)
    high = decide([], candidates(said(1, "30 minutes", confidence=0.8)), P1, promote_at=0.8)
    assert kinds(low.minutes) == kinds(high.minutes) == ["fact_asserted"]
    assert low.minutes[0].data["fact"]["status"] == "pending" and high.minutes[0].data["fact"]["status"] == "promoted"
    assert low.counts == Counter(asserted=1) and high.counts == Counter(asserted=1, promoted=1)
    fact = fact_change(high.minutes[0]).fact  # type: ignore[union-attr]
    assert fact.id == fact_id(P1, TTL, "30 minutes") and fact.source_minute_ids == ("m00001",)
    assert fact.recorded_at == at(0) and high.minutes[0].timestamp == at(0)


def test_the_same_value_again_is_confirmed_and_promoted_when_it_crosses_the_threshold() -> None:
    first = decide([], candidates(said(1, "30 minutes", confidence=0.6)), P1, 0.8)
    view = held([], first.minutes)
    again = decide(view, candidates(said(2, "30 Minutes", 5, confidence=0.6)), P1, 0.8)
    assert kinds(again.minutes) == ["fact_confirmed", "fact_promoted"]
    confirmed = again.minutes[0].data
    assert confirmed["source_minute_ids"] == ["m00002"] and confirmed["confidence"] == 0.84
    assert again.counts == Counter(confirmed=1, promoted=1)
    # The same minute again (a retried batch): nothing to write.
    assert decide(held(view, again.minutes), candidates(said(2, "30 Minutes", 5)), P1, 0.8).minutes == []


def test_a_newer_value_supersedes_and_an_older_one_is_superseded_by_the_later() -> None:
    view = held([], decide([], candidates(said(1, "30 minutes", 10)), P1, 0.8).minutes)
    newer = decide(view, candidates(said(2, "8 hours", 20)), P1, 0.8)
    assert kinds(newer.minutes) == ["fact_asserted", "fact_superseded"]
    new_fact = newer.minutes[0].data["fact"]
    old_id = fact_id(P1, TTL, "30 minutes")
    assert new_fact["relationships"] == [{"kind": "supersedes", "fact_id": old_id, "strength": 1.0}]
    assert newer.minutes[1].data == {
        "fact_id": old_id,
        "tier_key": "project:p1",
        "superseded_by": new_fact["id"],
        "valid_until": at(20),
    }
    older = decide(view, candidates(said(3, "1 hour", 0)), P1, 0.8)  # said before 30 minutes held
    assert kinds(older.minutes) == ["fact_asserted", "fact_superseded"]
    assert older.minutes[1].data["fact_id"] == fact_id(P1, TTL, "1 hour")
    assert older.minutes[1].data["superseded_by"] == old_id and older.minutes[1].data["valid_until"] == at(10)


def test_a_pending_newer_value_leaves_the_promoted_one_current_until_it_is_promoted_itself() -> None:
    view = held([], decide([], candidates(said(1, "30 minutes", 10)), P1, 0.8).minutes)
    doubtful = decide(view, candidates(said(2, "8 hours", 20, confidence=0.6)), P1, 0.8)
    assert kinds(doubtful.minutes) == ["fact_asserted"]  # no supersession: a pending value retires nothing trusted
    assert doubtful.minutes[0].data["fact"]["relationships"] == []
    view = held(view, doubtful.minutes)
    assert {f.value: f.status for f in view} == {"30 minutes": FactStatus.PROMOTED, "8 hours": FactStatus.PENDING}
    # Said again, it crosses the threshold: promoted, it supersedes the old value from its own valid_from.
    again = decide(view, candidates(said(3, "8 hours", 30, confidence=0.6)), P1, 0.8)
    assert kinds(again.minutes) == ["fact_confirmed", "fact_promoted", "fact_superseded"]
    assert again.minutes[2].data == {
        "fact_id": fact_id(P1, TTL, "30 minutes"),
        "tier_key": "project:p1",
        "superseded_by": fact_id(P1, TTL, "8 hours"),
        "valid_until": at(20),
    }
    assert again.counts == Counter(confirmed=1, promoted=1, superseded=1)
    view = held(view, again.minutes)
    assert {f.value: (f.status, f.valid_until) for f in view} == {
        "30 minutes": (FactStatus.SUPERSEDED, at(20)),
        "8 hours": (FactStatus.PROMOTED, None),
    }


def test_a_promoted_value_supersedes_pending_and_promoted_ones_and_pending_ones_supersede_each_other() -> None:
    view = held([], decide([], candidates(said(1, "30 minutes", 10)), P1, 0.8).minutes)
    view = held(view, decide(view, candidates(said(2, "8 hours", 20, confidence=0.6)), P1, 0.8).minutes)
    pending_again = decide(view, candidates(said(3, "2 hours", 25, confidence=0.6)), P1, 0.8)
    assert kinds(pending_again.minutes) == ["fact_asserted", "fact_superseded"]  # the pending 8 hours only
    assert pending_again.minutes[1].data["fact_id"] == fact_id(P1, TTL, "8 hours")
    view = held(view, pending_again.minutes)
    sure = decide(view, candidates(said(4, "1 day", 30)), P1, 0.8)
    assert kinds(sure.minutes) == ["fact_asserted", "fact_superseded", "fact_superseded"]
    assert {m.data["fact_id"] for m in sure.minutes[1:]} == {
        fact_id(P1, TTL, "30 minutes"),
        fact_id(P1, TTL, "2 hours"),
    }
    # A pending value said before a promoted one took over is superseded by it; a promoted value said
    # before a pending one is not.
    view = held(view, sure.minutes)
    late_doubt = decide(view, candidates(said(5, "3 days", 27, confidence=0.6)), P1, 0.8)
    assert kinds(late_doubt.minutes) == ["fact_asserted", "fact_superseded"]
    assert late_doubt.minutes[1].data["fact_id"] == fact_id(P1, TTL, "3 days")
    lone = held([], decide([], candidates(said(6, "5 hours", 40, confidence=0.6)), P1, 0.8).minutes)
    early = decide(lone, candidates(said(7, "6 hours", 35)), P1, 0.8)
    assert kinds(early.minutes) == ["fact_asserted"]


def test_two_values_from_the_same_instant_contradict() -> None:
    view = held([], decide([], candidates(said(1, "30 minutes", 10)), P1, 0.8).minutes)
    clash = decide(view, candidates(said(2, "8 hours", 10)), P1, 0.8)
    assert kinds(clash.minutes) == ["fact_asserted", "fact_contradicted"]
    assert clash.counts == Counter(asserted=1, promoted=1, contradicted=1)


def test_a_multi_valued_slot_keeps_every_value() -> None:
    minutes = [said(1, "alice", 0, attribute="owner"), said(2, "bob", 5, attribute="owner")]
    decision = decide([], candidates(*minutes), P1, 0.8)
    assert kinds(decision.minutes) == ["fact_asserted", "fact_asserted"]


def test_decisions_are_deterministic() -> None:
    minutes = [said(1, "30 minutes", 0), said(2, "8 hours", 5), said(3, "30 minutes", 9)]
    first, second = decide([], candidates(*minutes), P1, 0.8), decide([], candidates(*minutes), P1, 0.8)
    assert [m.to_dict() for m in first.minutes] == [m.to_dict() for m in second.minutes]
    assert len({m.id for m in first.minutes}) == len(first.minutes)
    # Each id carries its source minute's time, or a millisecond after the slot's change before it.
    assert [id_timestamp_ms(m.id) for m in first.minutes[:3]] == [T0_MS, T0_MS + 300_000, T0_MS + 300_001]


DB = Slot("auth service", "database")


def test_a_value_that_comes_back_is_its_next_period_and_supersedes_the_one_it_replaces() -> None:
    view = held([], decide([], candidates(said(1, "Postgres", 10, attribute="database")), P1, 0.8).minutes)
    view = held(view, decide(view, candidates(said(2, "MySQL", 20, attribute="database")), P1, 0.8).minutes)
    back = decide(view, candidates(said(3, "postgres", 30, attribute="database")), P1, 0.8)
    assert kinds(back.minutes) == ["fact_asserted", "fact_superseded"]
    again = back.minutes[0].data["fact"]
    assert again["period"] == 1 and again["id"] == fact_id(P1, DB, "postgres", 1) != fact_id(P1, DB, "postgres")
    assert again["status"] == "promoted" and again["valid_from"] == at(30)
    assert back.minutes[1].data == {
        "fact_id": fact_id(P1, DB, "mysql"),
        "tier_key": "project:p1",
        "superseded_by": again["id"],
        "valid_until": at(30),
    }
    view = held(view, back.minutes)
    # Said again while period 1 holds: it is confirmed, no third fact.
    restated = decide(view, candidates(said(4, "Postgres", 40, attribute="database")), P1, 0.8)
    assert kinds(restated.minutes) == ["fact_confirmed"] and restated.minutes[0].data["fact_id"] == again["id"]
    # Said within period 0 (a late minute): period 0 is confirmed.
    late = decide(view, candidates(said(5, "Postgres", 15, attribute="database")), P1, 0.8)
    assert kinds(late.minutes) == ["fact_confirmed"] and late.minutes[0].data["fact_id"] == fact_id(P1, DB, "postgres")
    # Before its first period: the earliest period after it is confirmed, as before periods existed.
    early = decide(view, candidates(said(6, "Postgres", 5, attribute="database")), P1, 0.8)
    assert kinds(early.minutes) == ["fact_confirmed"] and early.minutes[0].data["fact_id"] == fact_id(
        P1, DB, "postgres"
    )
    # Between the two periods (while MySQL held): the later period is confirmed.
    between = decide(view, candidates(said(7, "Postgres", 25, attribute="database")), P1, 0.8)
    assert kinds(between.minutes) == ["fact_confirmed"] and between.minutes[0].data["fact_id"] == again["id"]


def test_a_value_coming_back_in_one_batch_is_decided_as_one_by_one() -> None:
    minutes = [said(n, v, t, attribute="database") for n, v, t in ((1, "Postgres", 10), (2, "MySQL", 20))]
    minutes += [said(3, "Postgres", 30, attribute="database"), said(4, "MySQL", 50, attribute="database")]
    decision = decide([], candidates(*minutes), P1, 0.8)
    asserted = [Fact.from_dict(m.data["fact"]) for m in decision.minutes if m.event_type == "fact_asserted"]
    assert [(f.value, f.period) for f in asserted] == [("Postgres", 0), ("MySQL", 0), ("Postgres", 1), ("MySQL", 1)]
    assert Counter(kinds(decision.minutes)) == Counter(fact_asserted=4, fact_superseded=3)
    current = [f for f in held([], decision.minutes) if f.status is FactStatus.PROMOTED]
    assert [(f.value, f.period) for f in current] == [("MySQL", 1)]


# -- the batch, against Redis ------------------------------------------------------------------------------------


def test_a_batch_writes_its_decisions_to_the_stream_and_the_store(
    ctx: FactsContext, redis_client: redis.Redis, settings: Settings
) -> None:
    batch = [said(1, "30 minutes", 0), said(2, "8 hours", 5), said(3, "Postgres", 6, attribute="database")]
    result = facts_batch(ctx, redis_client, records(batch))
    written = stream_minutes(redis_client, settings)
    assert kinds(written) == ["fact_asserted", "fact_asserted", "fact_superseded", "fact_asserted"]
    assert result["changes_written"] == 4 and result["counts"] == {
        "asserted": 3,
        "extracted": 3,
        "promoted": 3,
        "superseded": 1,
    }
    store = FactStore(redis_client)
    assert {(f.slot.attribute, f.value) for f in store.current([P1])} == {
        ("session_ttl", "8 hours"),
        ("database", "Postgres"),
    }
    assert [f.status for f in store.in_slot(P1, TTL)] == [FactStatus.SUPERSEDED, FactStatus.PROMOTED]
    head = redis_client.hgetall(keys.facts_head("p1"))
    assert (head[b"seq"], head[b"max_seq"], head[b"gaps"]) == (b"3", b"3", b"0")
    counters = redis_client.hgetall(keys.metrics_fact_changes())
    assert counters[b"asserted"] == b"3" and counters[b"superseded"] == b"1" and counters[b"extracted"] == b"3"
    assert redis_client.hget(keys.metrics_stage("facts"), "minutes") == b"3"
    assert redis_client.sismember(keys.metrics_freshness_stages(), "facts")


def test_the_same_job_twice_writes_no_new_minutes(
    ctx: FactsContext, redis_client: redis.Redis, settings: Settings
) -> None:
    batch = records([said(1, "30 minutes", 0), said(2, "8 hours", 5), said(3, "8 hours", 7, confidence=0.5)])
    facts_batch(ctx, redis_client, batch)
    first = stream_minutes(redis_client, settings)
    before = state(redis_client, "p:p1")
    again = facts_batch(ctx, redis_client, batch)
    assert again["changes_written"] == 0 and stream_minutes(redis_client, settings) == first
    assert state(redis_client, "p:p1") == before
    # A retry after the minutes were written but not applied: the same ids, so the log keeps them once.
    FactStore(redis_client).reset_project("p1")
    facts_batch(ctx, redis_client, batch)
    rewritten = stream_minutes(redis_client, settings)[len(first) :]
    assert [m.id for m in rewritten] == [m.id for m in first]


def noted(n: int, note: str, minutes: float) -> Minute:
    return Minute(
        event_type="message", id=f"m{n:05d}", project_id="p1", agent_id="a1", timestamp=at(minutes), memory_note=note
    )


def test_an_open_slots_said_change_finds_the_slot_it_changes_in_the_batch_and_in_the_store(
    ctx: FactsContext, redis_client: redis.Redis
) -> None:
    first = [noted(1, "Kenji owns billing, Ana owns refunds.", 0), noted(2, "Feature flags: LaunchDarkly.", 1)]
    facts_batch(ctx, redis_client, records(first))
    later = [
        noted(3, "I'm off to the search team, so the billing domain is handed over to Bo Lind.", 5),
        noted(4, "The refunds ledger is owned by Dee Park.", 6),  # no change said: a slot of its own
        noted(5, "We're swapping LaunchDarkly for Unleash.", 7),  # named by the old value only
        noted(6, "We're swapping Jenkins for Buildkite.", 8),  # an old value held nowhere: nothing
    ]
    expected = {
        ("billing", "owner", "Bo Lind"),
        ("refunds", "owner", "Ana"),
        ("refunds ledger", "owner", "Dee Park"),
        ("feature flags", "value", "Unleash"),
    }
    facts_batch(ctx, redis_client, records(later, first_seq=3))
    current = {(f.slot.subject, f.slot.attribute, f.value) for f in FactStore(redis_client).current([P1])}
    assert current == expected
    # In one batch, against the candidates before it.
    FactStore(redis_client).reset_project("p1")
    facts_batch(ctx, redis_client, records([*first, *later]))
    current = {(f.slot.subject, f.slot.attribute, f.value) for f in FactStore(redis_client).current([P1])}
    assert current == expected


def test_different_slots_never_invalidate_each_other(ctx: FactsContext, redis_client: redis.Redis) -> None:
    batch = [
        said(1, "30 minutes", 0, subject="auth service", attribute="session ttl"),
        said(2, "5 seconds", 1, subject="auth service", attribute="request timeout"),
        said(3, "2 hours", 2, subject="auth worker", attribute="session ttl"),
        said(4, "45 minutes", 3, subject="auth service", attribute="session ttl"),
    ]
    facts_batch(ctx, redis_client, records(batch))
    current = {(f.subject, f.attribute, f.value) for f in FactStore(redis_client).current([P1])}
    assert current == {
        ("auth service", "session_ttl", "45 minutes"),
        ("auth service", "request_timeout", "5 seconds"),
        ("auth worker", "session_ttl", "2 hours"),
    }


def ttl_fact(value: str, minutes: float) -> Fact:
    """A promoted fact of p1's auth service session TTL, stated at `minutes`."""
    return Fact.new(
        type="fact",
        text=f"the auth service keeps sessions for {value}",
        subject="auth service",
        attribute="session_ttl",
        value=value,
        tier_key=P1,
        confidence=0.9,
        source_minute_ids=["m00001"],
        status="promoted",
        valid_from=at(minutes),
        recorded_at=at(minutes),
    )


def test_change_minutes_are_applied_never_extracted_and_forged_ones_refused(
    ctx: FactsContext, extractor: CountingExtractor, redis_client: redis.Redis
) -> None:
    good = ttl_fact("30 minutes", 0)
    by_hand = asserted_minute(good, minute_id="h00001", timestamp=at(0))
    # Written to p1's log, asserting a fact of p2: one project's log never changes another's facts.
    other = good.with_(tier_key=TierKey.for_project("p2"))
    forged = Minute.from_dict(
        {**asserted_minute(other, minute_id="h00002", timestamp=at(0)).to_dict(), "project_id": "p1"}
    )
    result = facts_batch(ctx, redis_client, records([by_hand, forged]))
    assert extractor.read == []
    assert result["counts"] == {"refused": 1} and result["changes_applied"] == 1
    store = FactStore(redis_client)
    assert store.current([P1]) == [good] and store.current([TierKey.for_project("p2")]) == []
    assert redis_client.hget(keys.metrics_fact_changes(), "refused") == b"1"
    assert redis_client.hget(keys.facts_head("p1"), "seq") == b"2"  # both are accounted for


def test_chunk_summaries_are_never_read_for_facts(
    ctx: FactsContext, extractor: CountingExtractor, redis_client: redis.Redis
) -> None:
    from contracts.summaries import ChunkSummarized, ThreadRef, chunk_summarized_minute

    # A summary restates its minutes (which the facts came from): extracting from it would confirm each fact twice.
    summary = chunk_summarized_minute(
        "p1",
        ChunkSummarized(ThreadRef.parse("project"), 1, 10, "We decided to use Postgres for billing.", (), None, "m"),
        minute_id="cs00001",
        timestamp=at(0),
        context_references=(),
    )
    result = facts_batch(ctx, redis_client, records([summary, said(2, "30 minutes")], first_seq=11))
    assert extractor.read == ["m00002"]
    assert result["minutes"] == 2 and redis_client.hget(keys.facts_head("p1"), "max_seq") == b"12"


@pytest.fixture
def pool_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:

    wired = settings.with_(downstream=("facts",))
    for k, v in wired.to_env().items():
        monkeypatch.setenv(k, v)
    yield wired


def work(connection: redis.Redis, *pools: str) -> None:
    PvmWorker([pool_queue(p, connection) for p in pools], connection).work(burst=True)


def pipeline_rounds(connection: redis.Redis, settings: Settings, rounds: int = 3) -> None:
    """Dispatcher -> log pool -> facts pool, again, until the change minutes came back through the log."""
    dispatcher = Dispatcher(connection, settings, consumer="t", block_ms=10)
    dispatcher.ensure_groups()
    for _ in range(rounds):
        dispatcher.poll_once()
        dispatcher.flush_gathered()
        work(connection, "log", "facts")


@pytest.mark.slow
def test_minutes_flow_from_the_stream_through_the_log_into_facts_and_replay_gives_them_back(
    redis_client: redis.Redis, pool_env: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = [
        said(1, "30 minutes", 0),
        said(2, "30 minutes", 1, confidence=0.6),
        said(3, "Postgres", 2, attribute="database", confidence=0.6),
        said(4, "8 hours", 3),
        said(5, "Friday", 4, attribute="deadline", task="T-1"),
        said(6, "CockroachDB", 5, attribute="database"),
        said(7, "kafka", 6, project="p2", attribute="queue"),
    ]
    for m in session:
        redis_client.xadd(
            keys.stream(keys.shard_of(m.project_id, pool_env.shards)), {keys.MINUTE_FIELD: encode_minute(m)}
        )
    pipeline_rounds(redis_client, pool_env)
    logged = [r.minute for r in LogReader(pool_env.log_dir).history("p1")]
    changes = [m for m in logged if m.event_type.startswith("fact_")]
    # 2 values in each of 2 slots and a task's deadline asserted, 1 restatement confirmed, 2 values superseded.
    assert Counter(kinds(changes)) == Counter(fact_asserted=5, fact_confirmed=1, fact_superseded=2)
    assert redis_client.hget(keys.facts_head("p1"), "seq") == str(len(logged)).encode()
    store = FactStore(redis_client)
    current = {(f.tier_key, f.attribute, f.value) for f in store.current([P1, TierKey.for_task("p1", "T-1")])}
    assert current == {
        (P1, "session_ttl", "8 hours"),
        (P1, "database", "CockroachDB"),
        (TierKey.for_task("p1", "T-1"), "deadline", "Friday"),
    }
    assert [f.value for f in store.current([TierKey.for_project("p2")])] == ["kafka"]

    live = state(redis_client, "p:p1")

    def no_extraction(*_: object, **__: object) -> list[Candidate]:
        raise AssertionError("replay must not extract")

    monkeypatch.setattr(RuleExtractor, "extract", no_extraction)
    rebuilt = replay_facts(redis_client, pool_env, "p1")
    assert (rebuilt.changes, rebuilt.refused) == (8, 0)
    assert state(redis_client, "p:p1") == live
    assert redis_client.hget(keys.facts_head("p1"), "seq") == str(len(logged)).encode()


@pytest.mark.slow
def test_a_value_that_comes_back_is_current_again_and_replay_gives_the_same_history(
    redis_client: redis.Redis, pool_env: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = keys.stream(keys.shard_of("p1", pool_env.shards))
    first = [said(1, "Postgres", 10, attribute="database"), said(2, "MySQL", 20, attribute="database")]
    then = [said(3, "Postgres", 30, attribute="database"), said(4, "postgres", 40, attribute="database")]
    for batch in (first, then):  # the second batch is decided against the store
        for m in batch:
            redis_client.xadd(stream, {keys.MINUTE_FIELD: encode_minute(m)})
        pipeline_rounds(redis_client, pool_env)
    store = FactStore(redis_client)
    history = [(f.value, f.period, f.status, f.valid_from, f.valid_until) for f in store.in_slot(P1, DB)]
    assert history == [
        ("Postgres", 0, FactStatus.SUPERSEDED, at(10), at(20)),
        ("MySQL", 0, FactStatus.SUPERSEDED, at(20), at(30)),
        ("Postgres", 1, FactStatus.PROMOTED, at(30), None),
    ]
    returned = store.get(P1, fact_id(P1, DB, "postgres", 1))
    assert returned is not None and set(returned.source_minute_ids) == {"m00003", "m00004"}  # t40 confirmed it

    def value_at(minutes: float) -> list[tuple[str, int]]:
        return [(f.value, f.period) for f in store.current([P1], as_of=at(minutes)) if f.slot == DB]

    assert value_at(15) == [("Postgres", 0)]
    assert value_at(25) == [("MySQL", 0)]
    assert value_at(35) == value_at(45) == [("Postgres", 1)]
    assert [(f.value, f.period) for f in store.current([P1]) if f.slot == DB] == [("Postgres", 1)]
    logged = [r.minute for r in LogReader(pool_env.log_dir).history("p1")]
    changes = [m for m in logged if m.event_type.startswith("fact_")]
    assert Counter(kinds(changes)) == Counter(fact_asserted=3, fact_superseded=2, fact_confirmed=1)

    live = state(redis_client, "p:p1")

    def no_extraction(*_: object, **__: object) -> list[Candidate]:
        raise AssertionError("replay must not extract")

    monkeypatch.setattr(RuleExtractor, "extract", no_extraction)
    rebuilt = replay_facts(redis_client, pool_env, "p1")
    assert (rebuilt.changes, rebuilt.refused) == (6, 0)
    assert state(redis_client, "p:p1") == live


def test_two_workers_on_one_slot_make_one_chain_and_assert_each_value_once(
    redis_client: redis.Redis, redis_url: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_decide = facts_pool.decide
    inside = Counter[str]()
    overlap = []

    def slow_decide(*args: Any, **kwargs: Any) -> facts_pool.Decision:
        name = threading.current_thread().name
        inside[name] += 1
        overlap.append(sum(1 for v in inside.values() if v))
        time.sleep(0.05)  # long enough for the other worker to try the same slot
        try:
            return real_decide(*args, **kwargs)
        finally:
            inside[name] -= 1

    monkeypatch.setattr(facts_pool, "decide", slow_decide)
    a = [said(i, f"{i} minutes", i) for i in range(0, 20, 2)] + [said(100, "shared", 50)]
    b = [said(i, f"{i} minutes", i) for i in range(1, 20, 2)] + [said(101, "shared", 50)]
    errors: list[BaseException] = []

    def worker(batch: list[Minute], first_seq: int) -> None:
        connection = redis.Redis.from_url(redis_url)
        try:
            facts_batch(FactsContext.build(connection, settings), connection, records(batch, first_seq))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=worker, args=(a, 1), name="A"),
        threading.Thread(target=worker, args=(b, 100), name="B"),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert max(overlap) == 1, "two workers decided the same slot at once"
    written = stream_minutes(redis_client, settings)
    asserted = Counter(m.data["fact"]["id"] for m in written if m.event_type == "fact_asserted")
    assert len(asserted) == 21 and set(asserted.values()) == {1}  # every value once; "shared" confirmed
    assert Counter(kinds(written))["fact_confirmed"] == 1
    history = FactStore(redis_client).in_slot(P1, TTL)
    current = [f for f in history if f.status is not FactStatus.SUPERSEDED]
    assert [f.value for f in current] == ["shared"]
    # One chain, whichever worker came first: each value held until the next one's valid_from.
    ordered = sorted(history, key=lambda f: f.valid_from)
    assert [f.valid_until for f in ordered[:-1]] == [f.valid_from for f in ordered[1:]]
    assert all(f.status is FactStatus.SUPERSEDED for f in ordered[:-1]) and ordered[-1].valid_until is None


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# A value that comes back in one task (a, b, a) is its next period, a fact of its own (a fresh clone's run found it).
@example(
    stated=[("p1", "T-1", "p1", "db", "a", 0), ("p1", "T-1", "p1", "db", "b", 1), ("p1", "T-1", "p1", "db", "a", 2)]
)
@given(
    stated=st.lists(
        st.tuples(
            st.sampled_from(["p1", "p2", "p3"]),
            st.sampled_from([None, "T-1", "T-2"]),
            st.sampled_from(["p1", "p2", "p3"]),  # the project the (buggy) extractor names
            st.sampled_from(["db", "cache", "queue"]),
            st.sampled_from(["a", "b", "c"]),
            st.integers(0, 20),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_no_fact_crosses_a_tier_key_or_a_project(
    redis_client: redis.Redis, settings: Settings, stated: list[tuple[str, str | None, str, str, str, int]]
) -> None:
    redis_client.flushdb()
    minutes, named = [], {}
    for i, (project, task, claimed, attribute, value, minute) in enumerate(stated):
        m = said(i, value, minute, project=project, attribute=attribute, task=task)
        minutes.append(m)
        named[m.id] = claimed

    class Lying:
        """The rules, but some candidates name a project other than their minute's."""

        def extract(self, batch: Sequence[Minute], known: Known | None = None) -> list[Candidate]:
            from dataclasses import replace

            out = RuleExtractor().extract(batch, known)
            return [replace(c, project_id=named[c.source_minute_ids[0]]) for c in out]

    ctx = FactsContext.build(redis_client, settings, extractor=Lying())
    facts_batch(ctx, redis_client, records(minutes))
    by_id = {m.id: m for m in minutes}
    store = FactStore(redis_client)
    seen: set[tuple[str, str | None, str, str]] = set()
    for project in ("p1", "p2", "p3"):
        tiers = [TierKey.for_project(project), TierKey.for_task(project, "T-1"), TierKey.for_task(project, "T-2")]
        for tier in tiers:
            for fact in store.in_tier(tier):
                # A value that comes back after another replaced it is its next period (a fact of its own):
                # count values, not facts.
                seen.add((project, tier.task_id, fact.slot.attribute, fact.value))
                for source in fact.source_minute_ids:
                    m = by_id[source]
                    assert m.project_id == project == named[m.id]
                    assert tier.task_id == m.data.get("task_id")
    assert len(seen) == len(
        {
            (m.project_id, m.data.get("task_id"), m.data["fact"]["attribute"], m.data["fact"]["value"])
            for m in minutes
            if named[m.id] == m.project_id
        }
    )


def test_pvm_worker_facts_serves_the_facts_queue(
    redis_client: redis.Redis, pool_env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    from workers.ops.cli import main

    job = pool_queue("facts", redis_client).enqueue(keys.FACTS_JOB, records([said(1, "30 minutes")]))
    assert job.origin == keys.FACTS_QUEUE == "pvm-facts"
    assert main(["worker", "facts", "--burst"]) == 0
    assert job.get_status(refresh=True) == "finished", job.latest_result()
    assert [f.value for f in FactStore(redis_client).current([P1])] == ["30 minutes"]


def test_pvm_replay_rebuilds_every_projects_facts_from_the_log_without_extracting(
    ctx: FactsContext, redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contracts.fact_changes import tier_promoted_minute
    from contracts.facts import GLOBAL_KEY
    from pvm.stores.log import LogWriter
    from workers.ops.replay import replay

    batch = [
        said(1, "30 minutes", 0),
        said(2, "8 hours", 5),
        said(3, "Friday", 6, attribute="deadline", task="T-1"),
        said(4, "kafka", 7, project="p2", attribute="queue"),
    ]
    facts_batch(ctx, redis_client, records(batch))
    store = FactStore(redis_client)
    (ttl,) = [f for f in store.current([P1]) if f.slot == TTL]
    promotion = tier_promoted_minute(ttl, minute_id="up00001", timestamp=at(9))  # p1's log, global tier
    store.apply(promotion)
    written = {p: stream_minutes(redis_client, settings, p) for p in ("p1", "p2")}
    written["p1"].append(promotion)
    # What the log holds once the change minutes came back through it: the minutes, then the changes.
    LogWriter(settings.log_dir).append_many(
        {
            p: [(m.id, f"{i + 1}-0", encode_minute(m)) for i, m in enumerate([*mine, *written[p]])]
            for p, mine in (("p1", batch[:3]), ("p2", batch[3:]))
        }
    )
    live = state(redis_client, "p:p1", "p:p2", "g")
    assert any(name.startswith("pvm:{g}:") for name in live)
    store.reset_project("p1")
    store.reset_global()
    store.apply(asserted_minute(ttl.with_(value="stale", status="promoted"), minute_id="x00001", timestamp=at(0)))

    def no_extraction(*_: object, **__: object) -> list[Candidate]:
        raise AssertionError("replay must not extract")

    monkeypatch.setattr(RuleExtractor, "extract", no_extraction)
    assert replay(redis_client, settings, None, wait=False) == 0
    assert state(redis_client, "p:p1", "p:p2", "g") == live
    assert redis_client.hget(keys.facts_head("p1"), "seq") == str(3 + len(written["p1"])).encode()
    assert [f.value for f in store.current([GLOBAL_KEY])] == ["8 hours"]


class ReadingKnown(CountingExtractor):
    """The rules, recording the known facts the pool passes (as an LLM extractor wants them)."""

    reads_known = True

    def __init__(self) -> None:
        super().__init__()
        self.known: list[Known | None] = []

    def extract(self, minutes: Sequence[Minute], known: Known | None = None) -> list[Candidate]:
        self.known.append(known)
        return super().extract(minutes, known)


def test_an_extractor_that_reads_known_facts_gets_those_of_its_minutes_tier_keys_only(
    redis_client: redis.Redis, settings: Settings
) -> None:
    reading = ReadingKnown()
    ctx = FactsContext.build(redis_client, settings, extractor=reading)
    facts_batch(
        ctx,
        redis_client,
        records(
            [
                said(1, "30 minutes", 0),
                said(2, "Postgres", 1, attribute="database", task="T-1"),
                said(3, "MySQL", 2, attribute="database", task="T-2"),
                said(4, "1 hour", 3, project="p2"),
                said(5, "low", 4, attribute="priority", confidence=0.3),  # pending: known too
            ]
        ),
    )
    assert reading.known == [{}]  # nothing was known before the first batch
    facts_batch(ctx, redis_client, records([said(6, "8 hours", 10, task="T-1")], first_seq=6))
    known = reading.known[-1]
    assert known is not None
    shown = {(f.tier_key, f.slot.attribute, f.value, f.status) for facts in known.values() for f in facts}
    assert shown == {
        (P1, "session_ttl", "30 minutes", FactStatus.PROMOTED),
        (P1, "priority", "low", FactStatus.PENDING),
        (TierKey.for_task("p1", "T-1"), "database", "Postgres", FactStatus.PROMOTED),
    }  # not T-2's database, not p2's session ttl
    assert all(slot == (f.slot.subject, f.slot.attribute) for slot, facts in known.items() for f in facts)


def test_the_rules_get_no_known_facts_and_their_batches_skip_the_read(
    ctx: FactsContext, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts_batch(ctx, redis_client, records([said(1, "30 minutes", 0)]))
    reads: list[object] = []
    monkeypatch.setattr(facts_pool, "known_facts", lambda *a: reads.append(a) or {})
    facts_batch(ctx, redis_client, records([said(2, "8 hours", 5)], first_seq=2))
    assert reads == []


def test_minutes_of_two_projects_with_the_same_id_in_one_batch_each_make_their_facts(
    ctx: FactsContext, redis_client: redis.Redis
) -> None:
    """Minute ids are unique within a project only: a caller may choose the same id in two projects."""
    first, second = said(1, "30 minutes", 0, project="p1"), said(1, "2 hours", 0, project="p2")
    assert first.id == second.id
    facts_batch(ctx, redis_client, records([first, second]))
    store = FactStore(redis_client)
    assert [f.value for f in store.current([P1])] == ["30 minutes"]
    assert [f.value for f in store.current([TierKey.for_project("p2")])] == ["2 hours"]


# -- issue 22: odd clocks and retries ----------------------------------------------------------------------------


def stamped(minute: Minute, timestamp: str) -> Minute:
    return Minute.from_dict({**minute.to_dict(), "timestamp": timestamp})


def test_one_future_dated_minute_never_empties_its_slot(ctx: FactsContext, redis_client: redis.Redis) -> None:
    """Defect 1: Postgres now, CockroachDB from a producer whose clock says 2031, then MySQL now. The slot's
    changes are timed by PVM's record of each minute, so MySQL is current now (before the fix every later
    value was "promoted in 2031" and the slot held nothing now)."""
    ahead = stamped(said(2, "CockroachDB", attribute="database"), "2031-01-01T00:00:00Z")
    for n, minute, recorded in (
        (1, said(1, "Postgres", 0, attribute="database"), at(0)),
        (2, ahead, at(1)),  # entered PVM at minute 1 (Redis's clock), stamped 2031 by its producer
        (3, said(3, "MySQL", 2, attribute="database"), at(2)),
    ):
        facts_batch(ctx, redis_client, [[minute.id, n, encode_minute(minute), time_ms(recorded)]])
    store = FactStore(redis_client)
    assert [f.value for f in store.current([P1]) if f.slot == DB] == ["MySQL"]
    history = [(f.value, f.status, f.valid_from, f.valid_until) for f in store.in_slot(P1, DB)]
    assert [(v, s) for v, s, _, _ in history] == [
        ("Postgres", FactStatus.SUPERSEDED),
        ("CockroachDB", FactStatus.SUPERSEDED),
        ("MySQL", FactStatus.PROMOTED),
    ]
    cockroach = next(f for f in store.in_slot(P1, DB) if f.value == "CockroachDB")
    assert time_ms(cockroach.valid_from) == time_ms(cockroach.recorded_at) == time_ms(at(1))  # dated by its record
    assert [f.value for f in store.current([P1], as_of=at(1.5)) if f.slot == DB] == ["CockroachDB"]
    # Nothing the pool wrote is dated after the record of the minute it came from.
    changes = stream_minutes(redis_client, Settings.from_env())
    assert max(time_ms(m.timestamp) for m in changes) < time_ms(at(3))


def test_a_retry_writes_what_the_first_try_decided_whatever_the_log_applied_since(
    ctx: FactsContext, redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect 4: a first try writes its change minutes and dies before applying them; the log makes the
    supersession durable (and the pool applies it) before the assertion; the retry must write the same
    minutes, not decide again against the changed slot under new ids."""
    facts_batch(ctx, redis_client, records([said(1, "Postgres", 0, attribute="database")]))
    before = len(stream_minutes(redis_client, settings))
    batch = records([said(2, "MySQL", 5, attribute="database")], first_seq=2)

    def killed(_changes: object) -> list[Outcome]:
        raise redis.ConnectionError("Valkey was killed")

    with monkeypatch.context() as patched:
        patched.setattr(ctx.store, "apply_changes", killed)
        with pytest.raises(redis.ConnectionError):
            facts_batch(ctx, redis_client, batch)
    first_try = stream_minutes(redis_client, settings)[before:]
    assert kinds(first_try) == ["fact_asserted", "fact_superseded"]
    FactStore(redis_client).apply(first_try[1])  # the log made the supersession durable first
    facts_batch(ctx, redis_client, batch)
    retry = stream_minutes(redis_client, settings)[before + len(first_try) :]
    assert [m.id for m in retry] == [m.id for m in first_try] and retry == first_try
    store = FactStore(redis_client)
    assert [(f.value, f.status) for f in store.in_slot(P1, DB)] == [
        ("Postgres", FactStatus.SUPERSEDED),
        ("MySQL", FactStatus.PROMOTED),
    ]
    assert redis_client.hget(keys.metrics_fact_changes(), "asserted") == b"2"  # Postgres, MySQL: each once
    assert list(redis_client.scan_iter(match="*facts:decided:*")) == []  # applied: nothing left to remember


def test_a_learned_key_changed_twice_is_superseded_by_a_minute_of_the_pool(
    ctx: FactsContext, redis_client: redis.Redis, settings: Settings
) -> None:
    """Defect 2: the supersession of a learned value is a change minute of its own, so the fact points and
    replay follow it (the store used to supersede it silently, and the points kept both values promoted).
    A value learned with a clock years ahead takes its place in time and hides nothing now."""
    first = learned_minute("deploy window", "Tuesday", P1, minute_id="m00001", timestamp=at(0))
    second = learned_minute("deploy window", "Thursday", P1, minute_id="m00002", timestamp=at(10))
    ahead = learned_minute("deploy window", "Friday", P1, minute_id="m00003", timestamp="2031-01-01T00:00:00Z")
    facts_batch(ctx, redis_client, records([second, first, ahead]))
    written = stream_minutes(redis_client, settings)
    assert kinds(written) == ["fact_superseded", "fact_superseded"]
    assert {(m.data["fact_id"], m.data["superseded_by"]) for m in written} == {
        (first.data["fact"]["id"], second.data["fact"]["id"]),
        (second.data["fact"]["id"], ahead.data["fact"]["id"]),
    }
    store = FactStore(redis_client)
    assert store.recall(P1, "deploy window").value == "Thursday"  # type: ignore[union-attr]
    assert [f.value for f in store.current([P1])] == ["Thursday"]
    again = facts_batch(ctx, redis_client, records([second, first, ahead]))
    assert again["changes_written"] == 0  # fitted already: nothing to decide again


def test_a_decision_written_and_not_applied_is_applied_by_the_next_decider_of_its_slot(
    ctx: FactsContext, redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect 4, across jobs: a first try writes MySQL's assertion and dies before applying it; before its retry,
    another job states MySQL again. That job must decide against the first try's decision (a confirmation), not
    assert MySQL a second time under another id."""
    facts_batch(ctx, redis_client, records([said(1, "Postgres", 0, attribute="database")]))

    def killed(_changes: object) -> list[Outcome]:
        raise redis.ConnectionError("Valkey was killed")

    with monkeypatch.context() as patched:
        patched.setattr(ctx.store, "apply_changes", killed)
        with pytest.raises(redis.ConnectionError):
            facts_batch(ctx, redis_client, records([said(2, "MySQL", 5, attribute="database")], first_seq=2))
    facts_batch(ctx, redis_client, records([said(3, "MySQL", 6, attribute="database")], first_seq=3))
    asserted = {m.id: m for m in stream_minutes(redis_client, settings) if m.event_type == "fact_asserted"}
    assert Counter(m.data["fact"]["value"] for m in asserted.values()) == Counter(Postgres=1, MySQL=1)
    mysql = FactStore(redis_client).get(P1, fact_id(P1, DB, "MySQL"))
    assert mysql is not None and mysql.source_minute_ids == ("m00002", "m00003")
    assert redis_client.hget(keys.metrics_fact_changes(), "asserted") == b"2"
    assert redis_client.hget(keys.metrics_fact_changes(), "confirmed") == b"1"


def test_a_change_no_rule_reads_questions_the_held_fact_and_retires_nothing(
    ctx: FactsContext, redis_client: redis.Redis, settings: Settings
) -> None:
    first = [
        noted(1, "The release train runs every two weeks.", 0),
        noted(2, "The observation window is 1 April to 30 September 2026.", 1),
    ]
    later = [
        noted(3, "Random thought: should we move to weekly trains? Not a proposal yet.", 5),  # asks: nothing
        noted(4, "OK, we're going weekly. Starting next Monday every train is one week long.", 6),
        noted(5, "Prescott & Lang extended the observation window: it now ends on 31 October 2026.", 7),
        noted(6, "The release train runs every two weeks, hotfixes included.", 8),  # said again: confirmed
    ]

    def questioned() -> dict[str, tuple[str, str]]:
        """Held fact value -> (the statement questioning it, its source minute)."""
        current = FactStore(redis_client).current([P1])
        by_id = {f.id: f for f in current}
        return {
            by_id[r.fact_id].value: (f.value, f.source_minute_ids[0])
            for f in current
            for r in f.relationships
            if r.kind is RelationKind.QUESTIONS and r.fact_id in by_id
        }

    facts_batch(ctx, redis_client, records(first))
    result = facts_batch(ctx, redis_client, records(later, first_seq=3))
    expected = {
        "every two weeks": ("Starting next Monday every train is one week long.", "m00004"),
        "1 April to 30 September 2026": (
            "Prescott & Lang extended the observation window: it now ends on 31 October 2026.",
            "m00005",
        ),
    }
    assert questioned() == expected
    assert result["counts"]["questioning"] == 2
    # Nothing retired: both held values are still current, promoted; the statements sit beside them.
    current = FactStore(redis_client).current([P1])
    typed = {(f.slot.subject, f.slot.attribute, f.value, f.status) for f in current if f.slot.attribute != "statement"}
    assert typed == {
        ("release train", "cadence", "every two weeks", FactStatus.PROMOTED),
        ("observation window", "value", "1 April to 30 September 2026", FactStatus.PROMOTED),
    }
    # A retried job writes nothing new.
    log = stream_minutes(redis_client, settings)
    assert facts_batch(ctx, redis_client, records(later, first_seq=3))["changes_written"] == 0
    assert stream_minutes(redis_client, settings) == log
    # In one batch: the facts decided first, then what questions them.
    FactStore(redis_client).reset_project("p1")
    facts_batch(ctx, redis_client, records([*first, *later]))
    assert questioned() == expected
    # A change the rules read supersedes the value; its questioning statement then stands on its own.
    facts_batch(ctx, redis_client, records([noted(7, "The release train now runs weekly.", 9)], first_seq=7))
    current = FactStore(redis_client).current([P1])
    assert {f.value for f in current if f.slot == Slot("release train", "cadence")} == {"weekly"}
    assert set(questioned()) == {"1 April to 30 September 2026"}


def test_questioning_is_off_with_statements(redis_client: redis.Redis, settings: Settings) -> None:
    off = FactsContext.build(redis_client, replace(settings, fact_statements="off"))
    first = [noted(1, "The release train runs every two weeks.", 0)]
    facts_batch(off, redis_client, records(first))
    result = facts_batch(
        off, redis_client, records([noted(2, "Starting next Monday every train is one week long.", 5)], 2)
    )
    assert "questioning" not in result["counts"]
    assert all(f.slot.attribute != "statement" for f in FactStore(redis_client).current([P1]))


def test_change_minutes_this_process_wrote_come_back_as_written_and_others_are_decoded(
    ctx: FactsContext, redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    facts_batch(ctx, redis_client, records([said(1, "30 minutes", 0), said(2, "8 hours", 5)]))
    written = stream_minutes(redis_client, settings)
    assert kinds(written) == ["fact_asserted", "fact_asserted", "fact_superseded"]
    raws = [encode_minute(m) for m in written]
    before = state(redis_client, "p:p1")
    decoded: list[bytes] = []
    read: list[str] = []
    decode, change = messages.decode_durable_minute, facts_pool.fact_change
    monkeypatch.setattr(messages, "decode_durable_minute", lambda raw: decoded.append(raw) or decode(raw))
    monkeypatch.setattr(facts_pool, "fact_change", lambda minute: read.append(minute.id) or change(minute))
    # The log hands them back with the bytes written: taken as built, not decoded or read as a change again. One
    # whose bytes differ (the same id and change, another note) is decoded and read like any minute.
    other = Minute.from_dict({**written[2].to_dict(), "memory_note": "superseded, said again"})
    back = [[m.id, 3 + i, raw, time_ms(m.timestamp)] for i, (m, raw) in enumerate(zip(written, raws, strict=True))]
    result = facts_batch(ctx, redis_client, [*back[:2], [other.id, 5, encode_minute(other), time_ms(other.timestamp)]])
    assert decoded == [encode_minute(other)] and read == [other.id]
    assert result["changes_applied"] == 0 and state(redis_client, "p:p1") == before  # applied when decided
    # Taken back once: the same bytes again (a replay) are decoded.
    facts_batch(ctx, redis_client, [back[0]])
    assert decoded[-1] == raws[0] and read[-1] == written[0].id


def test_what_waits_to_come_back_is_bounded() -> None:
    returning = facts_pool.Returning(kept=2)
    made = []
    for n in range(3):
        minute = asserted_minute(ttl_fact(f"{n} minutes", n), minute_id=f"h0000{n}", timestamp=at(n))
        made.append((minute, fact_change(minute)))
    raw = {(m.project_id, m.id): encode_minute(m) for m, _ in made}
    returning.add(raw, made)
    assert returning.minute(raw[("p1", "h00000")]) is None  # the oldest, forgotten
    assert returning.minute(raw[("p1", "h00002")]) is made[2][0]
    assert returning.change(made[2][0]) is made[2][1]

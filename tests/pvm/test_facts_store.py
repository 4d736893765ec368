"""The facts store: a projection of knowledge-change minutes in Redis, idempotent and free of arrival order."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import msgpack
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts import fact_change, keys
from contracts.fact_changes import (
    asserted_minute,
    confirmed_minute,
    contradicted_minute,
    edited_minute,
    learned_minute,
    promoted_minute,
    retracted_minute,
    superseded_minute,
    task_memory_cleared_minute,
    tier_promoted_minute,
)
from contracts.facts import GLOBAL_KEY, READ_FIELDS, Fact, FactStatus, FactType, Slot, TierKey
from contracts.minute import Minute
from pvm.stores.facts import FactStore, Outcome, StoredFact, order_key

T0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
P1 = TierKey.for_project("p1")
TASK = TierKey.for_task("p1", "T-1")
TTL = Slot("service:auth", "session_ttl")


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z")


def fact(
    value: str,
    minute: float = 0,
    *,
    tier: TierKey = P1,
    slot: Slot = TTL,
    status: FactStatus = FactStatus.PROMOTED,
    confidence: float = 0.9,
    type: FactType = FactType.FACT,
    source: str | None = None,
) -> Fact:
    return Fact.new(
        type=type,
        text=f"{slot.subject} {slot.attribute} is {value}",
        subject=slot.subject,
        attribute=slot.attribute,
        value=value,
        tier_key=tier,
        confidence=confidence,
        source_minute_ids=(source or f"src{int(minute * 10):05d}",),
        status=status,
        valid_from=at(minute),
        recorded_at=at(minute),
    )


_ids = iter(range(1, 10**9))


def cid() -> str:
    return f"c{next(_ids):07d}"


def state(connection: redis.Redis, *tags: str) -> dict[str, Any]:
    """Everything the store keeps for some tags (``p:<project>``, ``g``), read statistics left out: for equality."""
    out: dict[str, Any] = {}
    for tag in tags:
        for raw_name in connection.scan_iter(match=f"pvm:{{{tag}}}:facts:*"):
            name = raw_name.decode()
            if name.endswith((":facts:head", ":facts:done")) or ":facts:lock:" in name:
                continue  # how far and when the pool got, and who decides now: no knowledge
            kind = connection.type(name).decode()
            if kind == "hash" and name.endswith(":byid"):
                records = {}
                for fid, raw in connection.hgetall(name).items():
                    stored = StoredFact.unpack(raw)
                    record = {k: v for k, v in stored.fact.to_dict().items() if k not in READ_FIELDS}
                    records[fid.decode()] = (record, dict(stored.versions), stored.created, stored.promoted_at)
                out[name] = records
            elif kind == "hash":
                out[name] = {k: v for k, v in connection.hgetall(name).items()}
            elif kind == "zset":
                out[name] = connection.zrange(name, 0, -1, withscores=True)
            elif kind == "set":
                out[name] = sorted(connection.smembers(name))
            else:
                out[name] = connection.get(name)
    return out


@pytest.fixture
def store(redis_client: redis.Redis) -> FactStore:
    return FactStore(redis_client)


def test_an_asserted_fact_is_readable_by_id_slot_tier_type_and_as_current(store: FactStore) -> None:
    f = fact("30 minutes")
    assert store.apply(asserted_minute(f, minute_id=cid(), timestamp=at(0))) is Outcome.APPLIED
    assert store.get(P1, f.id) == f
    assert store.get(TASK, f.id) is None  # same project's hash, another tier key: not this key's fact
    assert store.in_slot(P1, TTL) == [f]
    assert store.in_tier(P1) == [f]
    assert store.by_type(P1, FactType.FACT) == [f] and store.by_type(P1, FactType.GOAL) == []
    assert store.current([P1]) == [f]
    assert store.current([TASK]) == [] and store.current([TierKey.for_project("p2")]) == []


def test_applying_a_minute_twice_changes_nothing(store: FactStore, redis_client: redis.Redis) -> None:
    old, new = fact("30 minutes", 0), fact("8 hours", 10)
    minutes = [
        asserted_minute(old, minute_id=cid(), timestamp=at(0)),
        asserted_minute(new, minute_id=cid(), timestamp=at(10)),
        superseded_minute(old, new, minute_id=cid(), timestamp=at(10)),
        confirmed_minute(new, ["src00200"], 0.97, minute_id=cid(), timestamp=at(20)),
    ]
    assert [store.apply(m) for m in minutes] == [Outcome.APPLIED] * 4
    before = state(redis_client, "p:p1")
    assert [store.apply(m) for m in minutes] == [Outcome.UNCHANGED] * 4
    assert state(redis_client, "p:p1") == before


def test_a_change_that_arrives_before_its_fact_waits_for_it(store: FactStore) -> None:
    f = fact("30 minutes", status=FactStatus.PENDING, confidence=0.6)
    confirm = confirmed_minute(f, ["src00300"], 0.85, minute_id=cid(), timestamp=at(5))
    promote = promoted_minute(f, minute_id=cid(), timestamp=at(5))
    assert store.apply(confirm) is Outcome.PARKED and store.apply(promote) is Outcome.PARKED
    assert store.get(P1, f.id) is None and store.current([P1]) == []
    assert store.apply(asserted_minute(f, minute_id=cid(), timestamp=at(0))) is Outcome.APPLIED
    held = store.get(P1, f.id)
    assert held is not None
    assert (held.status, held.confidence) == (FactStatus.PROMOTED, 0.85)
    assert held.source_minute_ids == ("src00000", "src00300")
    assert store.apply(confirm) is Outcome.UNCHANGED  # parked once, applied once


def changes_of_a_session() -> list[Minute]:
    """Two slots and a task: values change, a restatement, a promotion, a contradiction, an edit, a clearing."""
    db = Slot("billing service", "database")
    a, b, c = fact("30 minutes", 0), fact("1 hour", 10), fact("2 hours", 20)
    pg, crdb = fact("Postgres", 1, slot=db, status=FactStatus.PENDING, confidence=0.6), fact("CockroachDB", 1, slot=db)
    t1, t2 = fact("Friday", 2, tier=TASK, slot=Slot("task", "deadline")), fact("Monday", 30, tier=TASK)
    return [
        asserted_minute(a, minute_id=cid(), timestamp=at(0)),
        asserted_minute(pg, minute_id=cid(), timestamp=at(1)),
        asserted_minute(crdb, minute_id=cid(), timestamp=at(1)),
        contradicted_minute(crdb, pg, minute_id=cid(), timestamp=at(1)),
        asserted_minute(t1, minute_id=cid(), timestamp=at(2)),
        confirmed_minute(pg, ["src00050"], 0.84, minute_id=cid(), timestamp=at(5)),
        promoted_minute(pg, minute_id=cid(), timestamp=at(5)),
        asserted_minute(b, minute_id=cid(), timestamp=at(10)),
        superseded_minute(a, b, minute_id=cid(), timestamp=at(10)),
        edited_minute(b, importance=0.9, tags=["ops"], minute_id=cid(), timestamp=at(12)),
        asserted_minute(c, minute_id=cid(), timestamp=at(20)),
        superseded_minute(b, c, minute_id=cid(), timestamp=at(20)),
        task_memory_cleared_minute(TASK, "done", minute_id=cid(), timestamp=at(25)),
        asserted_minute(t2, minute_id=cid(), timestamp=at(30)),
        retracted_minute(c, "wrong", minute_id=cid(), timestamp=at(40)),
    ]


SESSION = changes_of_a_session()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.permutations(range(len(SESSION))), repeats=st.lists(st.integers(0, len(SESSION) - 1), max_size=5))
def test_the_same_minutes_in_any_order_give_the_same_store(
    redis_client: redis.Redis, order: list[int], repeats: list[int]
) -> None:
    store = FactStore(redis_client)
    redis_client.flushdb()
    for m in SESSION:
        store.apply(m)
    in_order = state(redis_client, "p:p1")
    redis_client.flushdb()
    for i in [*order, *repeats]:
        store.apply(SESSION[i])
    assert state(redis_client, "p:p1") == in_order


def test_what_a_session_leaves_current(store: FactStore) -> None:
    for m in SESSION:
        store.apply(m)
    current = {(f.slot.attribute, f.value) for f in store.current([P1, TASK])}
    # 2 hours was retracted: nothing current in the TTL slot; both database values are flagged and promoted.
    assert current == {("database", "Postgres"), ("database", "CockroachDB"), ("session_ttl", "Monday")}
    pg = next(f for f in store.in_slot(P1, Slot("billing service", "database")) if f.value == "Postgres")
    crdb = fact("CockroachDB", 1, slot=pg.slot)
    assert [(r.kind.value, r.fact_id) for r in pg.relationships] == [("contradicts", crdb.id)]
    history = store.in_slot(P1, TTL)
    assert [(f.value, f.status.value, f.valid_until) for f in history] == [
        ("30 minutes", "superseded", at(10)),
        ("1 hour", "superseded", at(20)),
        ("2 hours", "retracted", None),
    ]
    assert history[1].importance == 0.9 and history[1].tags == ("ops",)
    # The task's deadline asserted before the clearing is gone; the one after stays.
    assert [f.value for f in store.in_tier(TASK)] == ["Monday"]


def test_as_of_returns_what_was_valid_and_known_then(store: FactStore) -> None:
    for m in SESSION:
        store.apply(m)

    def ttl(when: str) -> list[str]:
        return [f.value for f in store.current([P1], as_of=when) if f.slot == TTL]

    assert ttl(at(-1)) == []  # before anything was recorded
    assert ttl(at(5)) == ["30 minutes"]
    assert ttl(at(15)) == ["1 hour"]
    assert ttl(at(25)) == []  # 2 hours was retracted (at 40): a retraction says it was never true
    db = Slot("billing service", "database")
    pending_then = [f.value for f in store.current([P1], as_of=at(3)) if f.slot == db]
    assert pending_then == ["CockroachDB"]  # Postgres was pending until its promotion at 5
    both = [f.value for f in store.current([P1], statuses=("pending", "promoted"), as_of=at(3)) if f.slot == db]
    assert sorted(both) == ["CockroachDB", "Postgres"]
    assert [f.value for f in store.current([P1], statuses=("superseded",)) if f.slot == TTL] == []
    assert store.current([P1], types=["goal"]) == []


def test_a_change_that_does_not_fit_its_fact_is_refused(store: FactStore) -> None:
    f = fact("30 minutes")
    store.apply(asserted_minute(f, minute_id=cid(), timestamp=at(0)))
    before = store.get(P1, f.id)
    # The fact is a project fact; a retraction that says it belongs to the task is refused.
    forged = retracted_minute(f.with_(tier_key=TASK), minute_id=cid(), timestamp=at(1))
    forged_data = dict(forged.data, fact_id=f.id)
    forged = Minute.from_dict({**forged.to_dict(), "data": forged_data})
    assert store.apply(forged) is Outcome.REFUSED
    assert store.get(P1, f.id) == before


def test_learned_keys_recall_their_newest_value(store: FactStore) -> None:
    first = learned_minute("deploy window", "Tuesday", P1, minute_id=cid(), timestamp=at(0))
    second = learned_minute("deploy window", "Thursday", P1, minute_id=cid(), timestamp=at(10))
    for m in (second, first):  # in either order
        assert store.apply(m) is Outcome.APPLIED
    recalled = store.recall(P1, "Deploy  Window")
    assert recalled is not None and recalled.value == "Thursday"
    assert {k: f.value for k, f in store.learned(P1).items()} == {"deploy window": "Thursday"}
    assert store.recall(P1, "deploy window", as_of=at(5)).value == "Tuesday"  # type: ignore[union-attr]
    assert store.recall(TASK, "deploy window") is None
    # Which value supersedes which is the facts pool's decision, a minute of its own (decide_learned).
    old = next(f for f in store.in_tier(P1) if f.value == "Tuesday")
    assert (old.status, old.valid_until) == (FactStatus.PROMOTED, None)


def test_a_learned_value_not_holding_yet_never_hides_the_one_that_holds(store: FactStore) -> None:
    """Issue 22: an agent whose clock runs years ahead learns a value; recall keeps the value that holds now."""
    now = datetime.now(UTC)
    held = learned_minute(
        "deploy window",
        "Tuesday",
        P1,
        minute_id=cid(),
        timestamp=(now - timedelta(hours=1)).isoformat().replace("+00:00", "Z"),
    )
    ahead = learned_minute("deploy window", "Friday", P1, minute_id=cid(), timestamp="2031-01-01T00:00:00Z")
    for m in (held, ahead):
        store.apply(m)
    assert store.recall(P1, "deploy window").value == "Tuesday"  # type: ignore[union-attr]
    assert store.recall(P1, "deploy window", as_of="2031-06-01T00:00:00Z").value == "Friday"  # type: ignore[union-attr]


def test_global_facts_live_apart_and_a_project_reset_keeps_them(store: FactStore, redis_client: redis.Redis) -> None:
    f = fact("30 minutes")
    store.apply(asserted_minute(f, minute_id=cid(), timestamp=at(0)))
    up = tier_promoted_minute(f, minute_id=cid(), timestamp=at(1))  # project -> global, written to p1's log
    assert up.project_id == "p1" and store.apply(up) is Outcome.APPLIED
    copy = store.current([GLOBAL_KEY])
    assert len(copy) == 1 and copy[0].promoted_from == f.id and copy[0].tier_key == GLOBAL_KEY
    other = fact("1 hour", tier=TierKey.for_project("p2"))
    store.apply(asserted_minute(other, minute_id=cid(), timestamp=at(0)))
    assert store.reset_project("p1") > 0
    assert store.current([P1]) == [] and store.current([GLOBAL_KEY]) == copy
    assert store.current([TierKey.for_project("p2")]) == [other]


def test_procedural_rules_come_highest_priority_first(store: FactStore) -> None:
    rules = [
        fact("expand the volume", 0, slot=Slot("disk fills up", "action"), type=FactType.PROCEDURE),
        fact("roll back", 1, slot=Slot("a deploy fails", "action"), type=FactType.PROCEDURE),
    ]
    for r in rules:
        store.apply(asserted_minute(r, minute_id=cid(), timestamp=at(0)))
    store.apply(edited_minute(rules[1], importance=0.9, minute_id=cid(), timestamp=at(2)))
    got = store.procedural_rules([P1])
    assert [(r.condition, r.action, r.priority) for r in got] == [
        ("a deploy fails", "roll back", 0.9),
        ("disk fills up", "expand the volume", 0.5),
    ]
    store.apply(edited_minute(rules[1].with_(importance=0.9), type="fact", minute_id=cid(), timestamp=at(3)))
    assert [r.action for r in store.procedural_rules([P1])] == ["expand the volume"]


def test_order_keys_sort_by_time_then_id() -> None:
    early = asserted_minute(fact("a"), minute_id="zzz", timestamp=at(0))
    late = asserted_minute(fact("a"), minute_id="aaa", timestamp=at(1))
    assert order_key(early) < order_key(late)
    before_1970 = asserted_minute(fact("a"), minute_id="a", timestamp="1969-12-31T23:59:59Z")
    assert order_key(before_1970) < order_key(early)


def test_slot_leases_are_held_by_one_owner_at_a_time(store: FactStore) -> None:
    other = Slot("billing service", "database")
    assert store.lease_slots("w1", [(P1, TTL), (P1, other)], 5_000) == [True, True]
    assert store.lease_slots("w2", [(P1, TTL), (TASK, TTL)], 5_000) == [False, True]
    store.release_slots("w2", [(P1, TTL)])  # not w2's: kept
    assert store.lease_slots("w2", [(P1, TTL)], 5_000) == [False]
    store.release_slots("w1", [(P1, TTL), (P1, other)])
    assert store.lease_slots("w2", [(P1, TTL)], 5_000) == [True]


def test_the_record_is_the_facts_dict_with_its_order_keys(store: FactStore, redis_client: redis.Redis) -> None:
    f = fact("30 minutes")
    m = asserted_minute(f, minute_id=cid(), timestamp=at(0))
    store.apply(m)
    raw = msgpack.unpackb(redis_client.hget(keys.facts_by_id(P1), f.id))
    assert raw["fact"] == f.to_dict() and raw["created"] == order_key(m) and raw["promoted_at"] == at(0)
    assert set(raw["v"]) == set(Fact.FIELDS) - {"id", "period", "source_minute_ids", "relationships", *READ_FIELDS}


def test_many_changes_of_one_project_in_one_call(store: FactStore) -> None:
    rng = random.Random(3)
    facts = [fact(f"value {i}", i, slot=Slot(f"service {i % 7}", "owner")) for i in range(200)]
    minutes = [asserted_minute(f, minute_id=cid(), timestamp=at(0)) for f in facts]
    outcomes = store.apply_changes([(m, fact_change(m)) for m in minutes])
    assert outcomes == [Outcome.APPLIED] * 200
    slot = Slot(f"service {rng.randrange(7)}", "owner")
    assert len(store.in_slot(P1, slot)) == len([f for f in facts if f.slot == slot])


def test_each_read_is_one_round_trip(store: FactStore, monkeypatch: pytest.MonkeyPatch) -> None:
    for m in SESSION:
        store.apply(m)
    store.apply(learned_minute("deploy window", "Tuesday", P1, minute_id=cid(), timestamp=at(0)))
    trips: list[str] = []
    command, execute = redis.Redis.execute_command, redis.client.Pipeline.execute

    def counted_command(self: redis.Redis, *args: Any, **kwargs: Any) -> Any:
        trips.append(str(args[0]))
        return command(self, *args, **kwargs)

    def counted_execute(self: redis.client.Pipeline, *args: Any, **kwargs: Any) -> Any:
        trips.append("pipeline")
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "execute_command", counted_command)
    monkeypatch.setattr(redis.client.Pipeline, "execute", counted_execute)
    reads = {
        "get": lambda: store.get(P1, fact("1 hour", 10).id),
        "in_slot": lambda: store.in_slot(P1, TTL),
        "in_tier": lambda: store.in_tier(P1),
        "by_type": lambda: store.by_type(P1, FactType.FACT),
        "current": lambda: store.current([P1, TASK, GLOBAL_KEY], types=["fact", "decision"], as_of=at(15)),
        "recall": lambda: store.recall(P1, "deploy window"),
        "procedural_rules": lambda: store.procedural_rules([P1, TASK, GLOBAL_KEY]),
        "slot_views": lambda: store.slot_views([(P1, TTL), (TASK, TTL)]),
    }
    for name, read in reads.items():
        trips.clear()
        assert read() is not None
        assert len(trips) == 1, (name, trips)


def test_a_supersession_a_newer_change_overrode_is_no_refusal_in_any_order(store: FactStore) -> None:
    """Issue 22 (chaos): a learned value that comes back is the same fact, learned again from a later start. The
    pool's earlier supersession of it changes nothing any more; applied after the comeback it used to be refused
    (a validity ending before the new start), before it applied, so the live store and its replay differed."""
    first = learned_minute("deploy window", "Tuesday", P1, minute_id=cid(), timestamp=at(0))
    second = learned_minute("deploy window", "Friday", P1, minute_id=cid(), timestamp=at(10))
    tuesday, friday = (Fact.from_dict(m.data["fact"]) for m in (first, second))
    closed = superseded_minute(tuesday, friday, minute_id=cid(), timestamp=at(10.001))
    back = learned_minute("deploy window", "Tuesday", P1, minute_id=cid(), timestamp=at(20))
    records = []
    for order in ((first, second, closed, back), (first, second, back, closed), (back, closed, second, first)):
        for tag in ("p:p1",):
            for name in list(store.connection.scan_iter(match=f"pvm:{{{tag}}}:*")):
                store.connection.delete(name)
        outcomes = [store.apply(m) for m in order]
        assert Outcome.REFUSED not in outcomes
        records.append({f.id: f.to_dict() for f in store.in_tier(P1)})
    assert records[0] == records[1] == records[2]
    assert store.get(P1, tuesday.id).valid_from == at(20)  # type: ignore[union-attr]


def test_a_stored_record_is_unpacked_once_per_process_and_a_change_writes_new_bytes(
    store: FactStore, redis_client: redis.Redis
) -> None:
    from pvm.stores import fact_projection

    held = fact("30 minutes", status=FactStatus.PENDING)
    store.apply(asserted_minute(held, minute_id=cid(), timestamp=held.recorded_at))
    raw = redis_client.hget(keys.facts_by_id(P1), held.id)
    assert raw is not None
    first = StoredFact.unpack(raw)
    assert StoredFact.unpack(raw) is first and first.fact == held  # the memo's, and right
    store.apply(promoted_minute(held, minute_id=cid(), timestamp=at(1)))
    after = redis_client.hget(keys.facts_by_id(P1), held.id)
    assert after != raw and StoredFact.unpack(after) is not first  # new bytes, read anew
    fact_projection._UNPACKED.clear()
    assert StoredFact.unpack(raw) == first and StoredFact.unpack(raw) is not first  # the same record, validated again


def test_a_record_the_store_writes_is_read_back_as_written_and_equals_its_bytes_decoded(
    store: FactStore, redis_client: redis.Redis
) -> None:
    from pvm.stores import fact_projection

    held = fact("30 minutes", status=FactStatus.PENDING)
    fact_projection._UNPACKED.clear()
    store.apply(asserted_minute(held, minute_id=cid(), timestamp=held.recorded_at))
    store.apply(promoted_minute(held, minute_id=cid(), timestamp=at(1)))
    raw = redis_client.hget(keys.facts_by_id(P1), held.id)
    assert raw is not None
    written = fact_projection._UNPACKED.get(raw)
    assert written is not None and StoredFact.unpack(raw) is written  # kept when packed: not decoded again
    fact_projection._UNPACKED.clear()
    decoded = StoredFact.unpack(raw)
    assert decoded is not written and decoded == written  # its bytes say exactly what was kept

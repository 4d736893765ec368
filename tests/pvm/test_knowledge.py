"""learn / recall / promote: an agent's key-value memory, written as minutes, applied by the facts pool, read back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from contracts import InvalidFact, InvalidMinute, Minute, decode_minute, encode_minute, keys
from contracts.facts import GLOBAL_KEY, Fact, FactStatus, TierKey
from pvm import ContextReader, Emitter
from pvm.config import Settings
from pvm.knowledge import learn_minute, promote_minute
from pvm.stores.facts import FactStore
from pvm.stores.log import LogReader
from workers.facts.pool import FactsContext, facts_batch


class Fleet:
    """An agent's emitter and reader, and the facts pool run in-process over what the emitter wrote."""

    def __init__(self, connection: redis.Redis, settings: Settings) -> None:
        self.connection = connection
        self.settings = settings
        self.emitter = Emitter(settings=settings)
        self.reader = ContextReader(connection, LogReader(settings.log_dir))
        self.seen: set[str] = set()
        self.seq = 0

    def written(self) -> list[Minute]:
        """The minutes on the streams not handed to the pool yet."""
        assert self.emitter.flush(10)
        out = []
        for shard in range(self.settings.shards):
            for _, fields in self.connection.xrange(keys.stream(shard)):
                minute = decode_minute(fields[keys.MINUTE_FIELD])
                if minute.id not in self.seen:
                    self.seen.add(minute.id)
                    out.append(minute)
        return out

    def apply(self) -> dict[str, Any]:
        """Hand what was written to the facts pool, as the log pool would."""
        records = []
        for minute in self.written():
            self.seq += 1
            records.append([minute.id, self.seq, encode_minute(minute), None])
        return facts_batch(FactsContext.build(self.connection, self.settings), self.connection, records)


@pytest.fixture
def fleet(redis_client: redis.Redis, settings: Settings) -> Iterator[Fleet]:
    fleet = Fleet(redis_client, settings)
    yield fleet
    fleet.emitter.close()


def test_learn_then_the_pool_applies_then_recall(fleet: Fleet) -> None:
    em, reader = fleet.emitter, fleet.reader
    first = em.learn("p1", "deploy window", "Tuesday 10:00", agent_id="ops")
    assert reader.recall("p1", "deploy window") is None  # not applied yet: the pool makes it knowledge
    assert fleet.apply()["changes_applied"] == 1
    fact = reader.recall("p1", "Deploy  Window")  # keys are normalized like every slot
    assert fact is not None and fact.value == "Tuesday 10:00" and fact.status is FactStatus.PROMOTED
    assert fact.tier_key == TierKey.for_project("p1") and fact.source_minute_ids == (first,)
    em.learn("p1", "deploy window", "Thursday 14:00")
    fleet.apply()
    again = reader.recall("p1", "deploy window")
    assert again is not None and again.value == "Thursday 14:00"
    history = FactStore(fleet.connection).history(TierKey.for_project("p1"), again.id)
    assert [(f.value, f.status) for f in history] == [
        ("Tuesday 10:00", FactStatus.SUPERSEDED),
        ("Thursday 14:00", FactStatus.PROMOTED),
    ]
    # A learned value is knowledge like any other: the context shows it, and only its current value.
    pkg = reader.build_context("p1", "coder", task="when is the deploy window?")
    assert [f["value"] for f in pkg.facts] == ["Thursday 14:00"]


def test_recall_reads_the_task_then_the_project_then_global_when_granted(fleet: Fleet) -> None:
    em, reader = fleet.emitter, fleet.reader
    em.learn("p1", "db", "postgres 15")
    em.learn("p1", "db", "postgres 16 (migration branch)", tier="task", task_id="T-1")
    em.learn("p1", "style", "black, 100 columns", tier="global")
    em.learn("p2", "db", "mysql")
    fleet.apply()
    value = lambda *a, **kw: getattr(reader.recall(*a, **kw), "value", None)  # noqa: E731
    assert value("p1", "db") == "postgres 15"
    assert value("p1", "db", task_id="T-1") == "postgres 16 (migration branch)"
    assert value("p1", "db", task_id="T-2") == "postgres 15"
    assert value("p2", "db", task_id="T-1") == "mysql"  # another project's task T-1 is not p1's
    assert value("p1", "style") is None and value("p2", "style") is None  # global needs the grant
    assert value("p1", "style", include_global=True) == "black, 100 columns"
    assert value("p2", "style", include_global=True) == "black, 100 columns"  # global: every project
    assert value("p3", "db", include_global=True) is None
    global_fact = reader.recall("p2", "style", include_global=True)
    assert global_fact is not None and global_fact.tier_key == GLOBAL_KEY


def test_promote_copies_a_fact_one_tier_up(fleet: Fleet) -> None:
    em, reader = fleet.emitter, fleet.reader
    em.learn("p1", "flaky test", "test_checkout times out on CI", tier="task", task_id="T-1")
    fleet.apply()
    task_fact = reader.recall("p1", "flaky test", task_id="T-1")
    assert task_fact is not None and reader.recall("p1", "flaky test") is None
    em.promote(task_fact, agent_id="lead")
    fleet.apply()
    project_fact = reader.recall("p1", "flaky test")
    assert project_fact is not None and project_fact.value == task_fact.value
    assert project_fact.promoted_from == task_fact.id and project_fact.id != task_fact.id
    # A fact as a context carries it (a dict) is promoted the same way, here on to the global tier.
    pkg = reader.build_context("p1", "lead", task="which test is flaky?")
    em.promote(pkg.facts[0])
    fleet.apply()
    top = reader.recall("p2", "flaky test", include_global=True)
    assert top is not None and top.tier_key == GLOBAL_KEY and top.promoted_from == project_fact.id
    with pytest.raises(InvalidFact, match="global tier, the top one"):
        em.promote(top)


def test_bad_input_is_refused_naming_the_argument_and_nothing_is_written(fleet: Fleet) -> None:
    em, reader = fleet.emitter, fleet.reader
    refused: list[tuple[Any, str]] = [
        (lambda: em.learn("p1", "", "x"), "key: must not be empty"),
        (lambda: em.learn("p1", "   ", "x"), "key: must not be empty or blank"),
        (lambda: em.learn("p1", 42, "x"), "key: must be text"),  # type: ignore[arg-type]
        (lambda: em.learn("p1", "k" * 300, "x"), "key: is 300 characters"),
        (lambda: em.learn("p1", "k", "x", tier="team"), "tier: 'team' must be one of task, project, global"),
        (lambda: em.learn("p1", "k", "x", tier="task"), "task_id: tier='task' remembers for one task"),
        (lambda: em.learn("p1", "k", "x", tier="task", task_id=" "), "task_id: task id ' ' is blank"),
        (lambda: em.learn("p1", "k", "x", task_id="T-1"), "task_id: only tier='task' names a task"),
        (lambda: em.learn("p1", "k", None), "value: must be text, a number or a boolean"),  # type: ignore[arg-type]
        (lambda: em.learn("p1", "k", ""), "value: must not be empty"),
        (lambda: em.learn("p1", "k", float("nan")), "value: nan has no canonical form"),
        (lambda: em.learn("p1", "k", "x", type="rumour"), "type: 'rumour' must be one of fact, decision"),
        (lambda: reader.recall("p1", ""), "key: must not be empty"),
        (lambda: reader.recall("p1", "k", task_id=""), "task_id"),
    ]
    for call, message in refused:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            call()
    with pytest.raises(InvalidMinute, match="project_id"):
        em.learn("bad project!", "k", "x")
    with pytest.raises(ValueError, match="project_id is required"):
        reader.recall("", "k")
    pending = Fact.from_dict(
        {**learn_minute("p1", "k", "x").data["fact"], "status": "pending"}  # as it would be, were it pending
    )
    with pytest.raises(InvalidFact, match=r"status: fact .* is pending"):
        em.promote(pending)
    with pytest.raises(InvalidFact, match=r"status: fact .* is superseded"):
        promote_minute(pending.with_(status=FactStatus.SUPERSEDED))
    with pytest.raises(InvalidFact):
        em.promote({"id": "not a fact"})
    assert fleet.written() == [] and em.stats().emitted == 0


def test_recall_is_one_round_trip(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet.emitter.learn("p1", "db", "postgres 15", tier="global")
    fleet.apply()
    trips: list[str] = []
    execute = redis.client.Pipeline.execute
    command = redis.Redis.execute_command

    def counted_execute(self: redis.client.Pipeline, *args: Any, **kwargs: Any) -> Any:
        trips.append("pipeline")
        return execute(self, *args, **kwargs)

    def counted_command(self: redis.Redis, *args: Any, **kwargs: Any) -> Any:
        trips.append(str(args[0]))
        return command(self, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", counted_execute)
    monkeypatch.setattr(redis.Redis, "execute_command", counted_command)
    found = fleet.reader.recall("p1", "db", task_id="T-1", include_global=True)
    assert found is not None and found.value == "postgres 15"
    assert trips == ["pipeline"]

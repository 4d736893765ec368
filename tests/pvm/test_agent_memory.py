"""Agent memory in Redis: counts, mean success, capabilities, last active; idempotent per minute; per project."""

from __future__ import annotations

import pytest
import redis

from contracts import keys
from pvm.stores.agent_memory import AgentDelta, AgentMemoryStore


def delta(seq: int, agent: str = "a1", project: str = "p1", **fields: object) -> AgentDelta:
    return AgentDelta(project_id=project, agent_id=agent, minute_id=f"m{seq:05d}", seq=seq, **fields)  # type: ignore[arg-type]


def at(second: int) -> dict[str, object]:
    return {"active_ms": 1_700_000_000_000 + second * 1000, "active_at": f"2023-11-14T22:13:{second:02d}.000000Z"}


def test_counts_mean_success_capabilities_and_last_active(redis_client: redis.Redis) -> None:
    store = AgentMemoryStore(redis_client)
    counted = store.apply(
        [
            delta(1, assigned=1, **at(1)),
            delta(2, completed=1, success=90.0, capabilities=("migration",), **at(2)),
            delta(3, completed=1, success=70.0, capabilities=("migration", "sql"), **at(3)),
            delta(4, failed=1, success=20.0, **at(4)),
            delta(5, failed=1, **at(5)),  # a failure without a score does not enter the mean
        ]
    )
    assert counted == 5
    memory = store.get("p1", "a1")
    assert (memory.tasks_assigned, memory.tasks_completed, memory.tasks_failed) == (1, 2, 2)
    assert memory.mean_success == pytest.approx(60.0)
    assert memory.capabilities == ("migration", "sql")
    assert memory.last_active == "2023-11-14T22:13:05.000000Z"
    assert store.agents("p1") == ["a1"]


def test_an_unknown_agent_has_an_empty_record(redis_client: redis.Redis) -> None:
    memory = AgentMemoryStore(redis_client).get("p1", "nobody")
    assert memory.agent_id == "nobody"
    assert (memory.tasks_assigned, memory.tasks_completed, memory.tasks_failed) == (0, 0, 0)
    assert memory.mean_success is None and memory.capabilities == () and memory.last_active is None


def test_reapplying_the_same_minutes_counts_nothing_twice(redis_client: redis.Redis) -> None:
    store = AgentMemoryStore(redis_client)
    batch = [delta(s, completed=1, success=float(10 * s), capabilities=(f"k{s}",), **at(s)) for s in range(1, 6)]
    assert store.apply(batch) == 5
    before = store.get("p1", "a1")
    # A retried job, a redelivered batch, and a replay in reverse order mixed with new minutes.
    assert store.apply(batch) == 0
    assert store.apply([*reversed(batch), delta(6, failed=1, success=0.0, **at(6))]) == 1
    after = store.get("p1", "a1")
    assert after.tasks_completed == before.tasks_completed == 5
    assert after.tasks_failed == 1
    assert after.mean_success == pytest.approx((10 + 20 + 30 + 40 + 50 + 0) / 6)
    assert after.capabilities == before.capabilities


def test_a_batch_holding_a_minute_twice_counts_it_once(redis_client: redis.Redis) -> None:
    store = AgentMemoryStore(redis_client)
    assert store.apply([delta(1, completed=1, success=80.0), delta(1, completed=1, success=80.0)]) == 1
    memory = store.get("p1", "a1")
    assert memory.tasks_completed == 1 and memory.mean_success == 80.0


def test_one_minute_updates_each_of_its_agents(redis_client: redis.Redis) -> None:
    # A planner assigns a task to a builder: one minute, two agents, counted together.
    store = AgentMemoryStore(redis_client)
    minute = [delta(7, agent="planner", **at(7)), delta(7, agent="builder", assigned=1)]
    assert store.apply(minute) == 1
    assert store.apply(minute) == 0
    assert store.get("p1", "builder").tasks_assigned == 1
    assert store.get("p1", "builder").last_active is None  # being assigned is not acting
    assert store.get("p1", "planner").last_active == "2023-11-14T22:13:07.000000Z"
    assert store.agents("p1") == ["builder", "planner"]


def test_last_active_keeps_the_newest_whatever_the_order(redis_client: redis.Redis) -> None:
    store = AgentMemoryStore(redis_client)
    store.apply([delta(2, **at(30))])
    store.apply([delta(1, **at(10))])  # an older minute indexed late
    assert store.get("p1", "a1").last_active == "2023-11-14T22:13:30.000000Z"


def test_capabilities_are_bounded(redis_client: redis.Redis) -> None:
    store = AgentMemoryStore(redis_client, max_capabilities=3)
    store.apply([delta(s, capabilities=(f"cap{s}",)) for s in range(1, 8)])
    store.apply([delta(9, capabilities=("cap1",))])
    assert store.get("p1", "a1").capabilities == ("cap1", "cap2", "cap3")


def test_agent_memory_of_one_project_is_invisible_in_another(redis_client: redis.Redis) -> None:
    store = AgentMemoryStore(redis_client)
    store.apply([delta(1, project="alpha", completed=1, success=100.0, capabilities=("secret-kind",))])
    # Same seq, same agent, other project: counted on its own, not mistaken for alpha's minute.
    store.apply([delta(1, project="beta", failed=1)])
    alpha, beta = store.get("alpha", "a1"), store.get("beta", "a1")
    assert (alpha.tasks_completed, alpha.tasks_failed, alpha.capabilities) == (1, 0, ("secret-kind",))
    assert (beta.tasks_completed, beta.tasks_failed, beta.capabilities, beta.mean_success) == (0, 1, (), None)
    assert store.agents("gamma") == []


@pytest.mark.parametrize("project", ["", None])
def test_every_read_names_a_project(redis_client: redis.Redis, project: object) -> None:
    store = AgentMemoryStore(redis_client)
    with pytest.raises(ValueError, match="project_id"):
        store.get(project, "a1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="project_id"):
        store.agents(project)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="project_id"):
        store.apply([delta(1, project=project)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="agent_id"):
        store.get("p1", "")


def test_keys_share_the_project_hash_tag(redis_client: redis.Redis) -> None:
    store = AgentMemoryStore(redis_client)
    store.apply([delta(1, agent="agent {with} braces", completed=1)])
    names = {k.decode() for k in redis_client.keys("pvm:*")}
    assert names == {
        keys.agents("p1"),
        keys.agent_memory_counted("p1"),
        keys.agent_memory("p1", "agent {with} braces"),
    }
    assert all(n.startswith("pvm:{p:p1}:") for n in names)
    assert store.get("p1", "agent {with} braces").tasks_completed == 1


def test_reset_forgets_the_project_so_a_replay_counts_again(redis_client: redis.Redis) -> None:
    store = AgentMemoryStore(redis_client)
    batch = [delta(1, completed=1, capabilities=("x",)), delta(2, agent="a2", failed=1)]
    store.apply(batch)
    store.apply([delta(1, project="other", completed=1)])
    store.reset("p1")
    assert store.agents("p1") == []
    assert not [k for k in redis_client.keys("pvm:{p:p1}:*")]
    assert store.apply(batch) == 2
    assert store.get("p1", "a1").tasks_completed == 1
    assert store.get("other", "a1").tasks_completed == 1


def test_a_batch_larger_than_one_bitfield_counts_as_minute_by_minute(redis_client: redis.Redis) -> None:
    """The script sets counted bits `BITS_PER_CALL` minutes at a time: across its chunks nothing changes."""
    from pvm.stores.agent_memory import BITS_PER_CALL

    store = AgentMemoryStore(redis_client)
    seqs = [*range(1, 2 * BITS_PER_CALL + 500), 7, BITS_PER_CALL + 3, 2 * BITS_PER_CALL + 1]  # repeats at the end

    def batch(project: str) -> list[AgentDelta]:
        return [
            delta(s, agent=f"a{s % 7}", project=project, completed=s % 2, failed=1 - s % 2, success=float(s % 101))
            for s in seqs
        ]

    store.apply([d for d in batch("whole") if d.seq % 5 == 0])  # some minutes counted before
    store.apply([d for d in batch("single") if d.seq % 5 == 0])
    assert store.apply(batch("whole")) == len(set(seqs)) - len({s for s in seqs if s % 5 == 0})
    for d in batch("single"):
        store.apply([d])
    assert redis_client.get(keys.agent_memory_counted("whole")) == redis_client.get(keys.agent_memory_counted("single"))
    for agent in (f"a{i}" for i in range(7)):
        assert store.get("whole", agent) == store.get("single", agent)

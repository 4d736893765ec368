from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from contracts import Minute, encode_minute, keys
from pvm.config import Settings
from pvm.stores.log import LogReader
from workers.ingest.dispatcher import Dispatcher, triage
from workers.runtime.queues import pool_queue
from workers.runtime.runner import PvmWorker


def minute(project: str = "p1", i: int = 0, **kw: object) -> Minute:
    return Minute(project_id=project, event_type="message", memory_note=f"n{i}", **kw)  # type: ignore[arg-type]


def xadd(r: redis.Redis, shard: int, raw: bytes) -> str:
    return r.xadd(keys.stream(shard), {keys.MINUTE_FIELD: raw}).decode()


def log_jobs(r: redis.Redis) -> list[list[list[object]]]:
    """Entries carried by each job queued on pvm-log."""
    q = pool_queue("log", r)
    return [job.args[0] for job in q.get_jobs()]


def test_triage_sorts_good_poison_and_over_delivered() -> None:
    good = encode_minute(minute())
    out = triage(
        [
            (b"1-0", {b"m": good}),
            (b"2-0", {b"m": b"\xc1junk"}),
            (b"3-0", {b"x": b"no m field"}),
            (b"4-0", None),
            (b"5-0", {b"m": good}),
        ],
        deliveries={"5-0": 9},
        max_deliveries=5,
    )
    assert [e for e, _ in out.good] == ["1-0"]
    assert {d.entry_id: d.reason.split(" ")[0] for d in out.dead} == {"2-0": "not", "3-0": "entry", "5-0": "delivered"}
    assert out.deleted == ["4-0"]


def test_a_batch_becomes_one_job_and_is_acked_with_it(redis_client: redis.Redis, settings: Settings) -> None:
    d = Dispatcher(redis_client, settings, consumer="c1", block_ms=10)
    d.ensure_groups()
    ids = [xadd(redis_client, 0, encode_minute(minute(i=i))) for i in range(20)]
    assert d.poll_once() == 20
    jobs = log_jobs(redis_client)
    assert len(jobs) == 1
    assert [e[0] for e in jobs[0]] == ids
    pending = redis_client.xpending(keys.stream(0), keys.DISPATCH_GROUP)
    assert pending["pending"] == 0


def test_the_job_the_dead_letters_and_the_ack_go_in_one_transaction(
    redis_client: redis.Redis, settings: Settings, redis_url: str
) -> None:
    """Watch the server (MONITOR): the job's push, the dead letter and the XACK sit inside one MULTI/EXEC."""
    d = Dispatcher(redis_client, settings, consumer="c1", block_ms=10)
    d.ensure_groups()
    xadd(redis_client, 0, encode_minute(minute()))
    xadd(redis_client, 0, b"\xc1")
    commands: list[str] = []
    monitor_client = redis.Redis.from_url(redis_url)
    with monitor_client.monitor() as m:
        d.poll_once()
        redis_client.ping()
        for event in m.listen():
            cmd = event["command"].split(" ")[0].upper()
            commands.append(cmd)
            if cmd == "PING":
                break
    monitor_client.close()
    multi, exec_ = commands.index("MULTI"), commands.index("EXEC")
    inside = commands[multi:exec_]
    assert "RPUSH" in inside or "LPUSH" in inside  # the job lands on rq:queue:pvm-log
    assert "XADD" in inside  # the dead letter
    assert "XACK" in inside
    assert "XACK" not in commands[:multi] + commands[exec_:]
    assert len(log_jobs(redis_client)) == 1
    assert redis_client.xlen(keys.dead_letter_stream(0)) == 1


def test_a_restarted_dispatcher_drains_its_own_pending_entries(redis_client: redis.Redis, settings: Settings) -> None:
    d = Dispatcher(redis_client, settings, consumer="c1", block_ms=10)
    d.ensure_groups()
    for i in range(3):
        xadd(redis_client, 2, encode_minute(minute(i=i)))
    # c1 read them and was killed before its transaction
    redis_client.xreadgroup(keys.DISPATCH_GROUP, "c1", {keys.stream(2): ">"}, count=10)
    assert log_jobs(redis_client) == []
    restarted = Dispatcher(redis_client, settings, consumer="c1", block_ms=10)
    assert restarted.drain_own_pending() == 3
    assert sum(len(j) for j in log_jobs(redis_client)) == 3
    assert redis_client.xpending(keys.stream(2), keys.DISPATCH_GROUP)["pending"] == 0


def test_entries_of_a_dead_consumer_are_reclaimed(redis_client: redis.Redis, settings: Settings) -> None:
    settings = settings.with_(claim_idle_ms=50)
    dead = Dispatcher(redis_client, settings, consumer="dead", block_ms=10)
    dead.ensure_groups()
    for i in range(5):
        xadd(redis_client, 1, encode_minute(minute(i=i)))
    # the dead consumer read them and died before its transaction
    redis_client.xreadgroup(keys.DISPATCH_GROUP, "dead", {keys.stream(1): ">"}, count=10)
    import time

    time.sleep(0.1)
    alive = Dispatcher(redis_client, settings, consumer="alive", block_ms=10)
    assert alive.reclaim() == 5
    assert sum(len(j) for j in log_jobs(redis_client)) == 5
    assert redis_client.xpending(keys.stream(1), keys.DISPATCH_GROUP)["pending"] == 0


def test_over_delivered_entries_go_to_dead_letters(redis_client: redis.Redis, settings: Settings) -> None:
    settings = settings.with_(max_deliveries=2)
    d = Dispatcher(redis_client, settings, consumer="crashy", block_ms=10)
    d.ensure_groups()
    xadd(redis_client, 0, encode_minute(minute()))
    for _ in range(3):  # three crashes after reading
        redis_client.xreadgroup(keys.DISPATCH_GROUP, "crashy", {keys.stream(0): "0" if _ else ">"}, count=10)
    d.drain_own_pending()
    dead = redis_client.xrange(keys.dead_letter_stream(0))
    assert len(dead) == 1
    assert b"delivered" in dead[0][1][b"reason"]
    assert log_jobs(redis_client) == []


def test_trim_removes_only_what_every_group_acknowledged(redis_client: redis.Redis, settings: Settings) -> None:
    d = Dispatcher(redis_client, settings, consumer="c1", block_ms=10)
    d.ensure_groups()
    for i in range(10):
        xadd(redis_client, 0, encode_minute(minute(i=i)))
    # a second group (another reader of the stream) has read only 3 and acked 1
    redis_client.xgroup_create(keys.stream(0), "audit", id="0")
    read = redis_client.xreadgroup("audit", "a", {keys.stream(0): ">"}, count=3)[0][1]
    redis_client.xack(keys.stream(0), "audit", read[0][0])
    d.poll_once()
    assert d.trim() == 1  # only the entry both groups are done with
    assert redis_client.xlen(keys.stream(0)) == 9
    info = {g["name"]: g for g in redis_client.xinfo_groups(keys.stream(0))}
    assert info[b"audit"]["lag"] is not None
    redis_client.xack(keys.stream(0), "audit", *[e[0] for e in read[1:]])
    redis_client.xreadgroup("audit", "a", {keys.stream(0): ">"}, count=100)
    redis_client.xack(keys.stream(0), "audit", *[e[0] for e in redis_client.xrange(keys.stream(0))])
    assert d.trim() == 9
    assert redis_client.xlen(keys.stream(0)) == 0


near_valid = st.fixed_dictionaries(
    {
        "v": st.sampled_from([1, 1, 1, 2, "1", None]),
        "id": st.one_of(st.just("ok-id"), st.text(max_size=80), st.integers(-(2**40), 2**40)),
        "timestamp": st.sampled_from(["2026-11-26T10:00:00Z", "2026-11-26T10:00:00", "yesterday", 5]),
        "event_type": st.sampled_from(["message", "", "Bad Type", None]),
        "project_id": st.sampled_from(["p1", "", "../etc", None, "a/b"]),
        "data": st.one_of(
            st.just({}), st.fixed_dictionaries({"success_criteria_met": st.integers(-50, 150)}), st.just([])
        ),
    }
)


def _is_valid(body: dict[str, object]) -> bool:
    try:
        from contracts import decode_minute

        decode_minute(msgpack.packb(body))
        return True
    except ValueError:
        return False


@pytest.mark.slow
def test_a_thousand_malformed_entries_are_dead_lettered_and_neighbours_logged(
    redis_client: redis.Redis, settings: Settings
) -> None:
    poison: list[bytes] = []

    @hsettings(max_examples=500, suppress_health_check=list(HealthCheck), database=None)
    @given(st.binary(max_size=200))
    def collect_bytes(b: bytes) -> None:
        if not _is_valid_bytes(b):
            poison.append(b)

    @hsettings(max_examples=700, suppress_health_check=list(HealthCheck), database=None)
    @given(near_valid)
    def collect_maps(body: dict[str, object]) -> None:
        if not _is_valid(body):
            poison.append(msgpack.packb(body))

    collect_bytes()
    collect_maps()
    poison = poison[:1000]
    while len(poison) < 1000:
        poison.append(b"\xc1" * (len(poison) % 7 + 1))
    d = Dispatcher(redis_client, settings, consumer="c1", block_ms=10)
    d.ensure_groups()
    good_ids = []
    for i, raw in enumerate(poison):
        redis_client.xadd(keys.stream(i % 4), {keys.MINUTE_FIELD: raw})
        if i % 10 == 0:
            m = minute(i=i)
            redis_client.xadd(keys.stream(i % 4), {keys.MINUTE_FIELD: encode_minute(m)})
            good_ids.append(m.id)
    while d.poll_once():
        pass
    dead = [e for s in range(4) for e in redis_client.xrange(keys.dead_letter_stream(s))]
    assert len(dead) == 1000
    assert all(fields[b"reason"] for _, fields in dead)
    assert sorted(fields[b"raw"] for _, fields in dead) == sorted(poison)
    logged = [e[1] for job in log_jobs(redis_client) for e in job]
    assert sorted(msgpack.unpackb(raw)["id"] for raw in logged) == sorted(good_ids)


def _is_valid_bytes(b: bytes) -> bool:
    try:
        from contracts import decode_minute

        decode_minute(b)
        return True
    except ValueError:
        return False


def test_idle_consumers_with_nothing_pending_are_forgotten(redis_client: redis.Redis, settings: Settings) -> None:
    d = Dispatcher(redis_client, settings, consumer="current", block_ms=10)
    d.ensure_groups()
    xadd(redis_client, 0, encode_minute(minute()))
    redis_client.xreadgroup(keys.DISPATCH_GROUP, "holds-one", {keys.stream(0): ">"}, count=1)
    redis_client.xreadgroup(keys.DISPATCH_GROUP, "empty-old", {keys.stream(0): ">"}, count=1)
    import time

    time.sleep(0.05)
    assert d.forget_stale_consumers(idle_ms=10) == ["empty-old"]
    names = {c["name"] for c in redis_client.xinfo_consumers(keys.stream(0), keys.DISPATCH_GROUP)}
    assert names == {b"holds-one"}


def test_under_backlog_entries_of_all_shards_gather_into_one_job(redis_client: redis.Redis, settings: Settings) -> None:
    d = Dispatcher(redis_client, settings, consumer="c1", block_ms=10)
    d.ensure_groups()
    d.linger_s = 0.2
    pool_queue("log", redis_client).enqueue(keys.LOG_JOB, [])  # the log pool is busy
    for i in range(12):
        xadd(redis_client, i % 4, encode_minute(minute(project=f"p{i % 4}", i=i)))
    assert d.poll_once() == 12
    assert len(log_jobs(redis_client)) == 1  # only the planted job: the 12 are gathering
    xadd(redis_client, 0, encode_minute(minute(project="p0", i=99)))
    d.poll_once()
    while len(log_jobs(redis_client)) == 1:
        d.poll_once()  # linger runs out, or a quiet read sends them
    jobs = log_jobs(redis_client)
    assert len(jobs) == 2 and len(jobs[1]) == 13
    for s in range(4):  # per-shard stream order is kept inside the job
        ids = [e[0] for e in jobs[1] if msgpack.unpackb(e[1])["project_id"] == f"p{s}"]
        assert ids
        assert ids == sorted(ids, key=lambda x: tuple(map(int, x.split("-"))))
    assert sum(redis_client.xpending(keys.stream(s), keys.DISPATCH_GROUP)["pending"] for s in range(4)) == 0


def test_entries_gather_while_a_pool_the_log_pool_feeds_is_behind(
    redis_client: redis.Redis, settings: Settings
) -> None:
    d = Dispatcher(redis_client, settings.with_(downstream=("index", "facts")), consumer="c1", block_ms=10)
    d.ensure_groups()
    d.downstream_linger_s = 10.0
    pool_queue("facts", redis_client).enqueue(keys.FACTS_JOB, [])  # the facts pool has a job waiting
    xadd(redis_client, 0, encode_minute(minute()))
    d.poll_once()
    xadd(redis_client, 0, encode_minute(minute(i=1)))
    d.poll_once()
    assert log_jobs(redis_client) == []  # gathering: the log pool is idle, but one it feeds is not
    pool_queue("facts", redis_client).empty()
    xadd(redis_client, 0, encode_minute(minute(i=2)))
    d.poll_once()
    (job,) = log_jobs(redis_client)
    assert len(job) == 3  # the pipeline idle again: all three at once
    # Behind downstream, they wait the downstream linger, not the log pool's.
    d.linger_s, d.downstream_linger_s = 10.0, 0.05
    pool_queue("index", redis_client).enqueue(keys.INDEX_JOB, [])
    xadd(redis_client, 0, encode_minute(minute(i=3)))
    while len(log_jobs(redis_client)) == 1:
        d.poll_once()
    assert len(log_jobs(redis_client)[-1]) == 1


def test_an_idle_log_pool_gets_entries_at_once(redis_client: redis.Redis, settings: Settings) -> None:
    d = Dispatcher(redis_client, settings, consumer="c1", block_ms=10)
    d.ensure_groups()
    d.linger_s = 10.0
    xadd(redis_client, 0, encode_minute(minute()))
    d.poll_once()
    assert len(log_jobs(redis_client)) == 1


def test_a_backlog_becomes_jobs_of_at_most_one_batch_each_in_stream_order(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """COUNT is per stream, so one round reads up to shards x batch; each job still carries at most one batch."""
    settings = settings.with_(dispatch_batch=50, downstream=())
    sizes = {0: 180, 1: 131, 2: 77, 3: 53}  # uneven, so jobs are cut inside shards at varying offsets
    added: dict[int, list[str]] = {s: [] for s in sizes}  # minute ids in stream order
    project_of: dict[str, str] = {}
    for i in range(max(sizes.values())):
        for s, size in sizes.items():
            if i < size:
                m = minute(project=f"p{s}-{i % 2}", i=i)  # two projects per shard
                xadd(redis_client, s, encode_minute(m))
                added[s].append(m.id)
                project_of[m.id] = m.project_id
    for s in sizes:  # dead letters ride in the same transactions, outside any job
        xadd(redis_client, s, b"\xc1")
    d = Dispatcher(redis_client, settings, consumer="c1", block_ms=10)
    d.run(max_idle_s=0.3)

    jobs = log_jobs(redis_client)
    assert jobs and all(0 < len(job) <= settings.dispatch_batch for job in jobs)
    assert len(jobs) < sum(sizes.values())  # still batches, not a job per minute
    shard_of = {minute_id: s for s, ids in added.items() for minute_id in ids}
    dispatched = [msgpack.unpackb(e[1])["id"] for job in jobs for e in job]
    assert len(dispatched) == len(set(dispatched)), "a minute was enqueued twice"
    assert set(dispatched) == set(shard_of), "a minute was lost"
    for s, ids in added.items():  # the jobs, in queue order, carry each shard's minutes in stream order
        assert [m for m in dispatched if shard_of[m] == s] == ids
    assert sum(redis_client.xlen(keys.dead_letter_stream(s)) for s in sizes) == len(sizes)
    assert sum(redis_client.xpending(keys.stream(s), keys.DISPATCH_GROUP)["pending"] for s in sizes) == 0

    # A log worker taking the jobs first in, first out appends each project in stream order.
    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)

    PvmWorker([pool_queue("log", redis_client)], redis_client).work(burst=True)
    reader = LogReader(settings.log_dir)
    for project in sorted(set(project_of.values())):
        expected = [m for ids in added.values() for m in ids if project_of[m] == project]
        assert [r.id for r in reader.history(project)] == expected


def test_the_jobs_of_one_round_go_in_one_transaction(
    redis_client: redis.Redis, settings: Settings, redis_url: str
) -> None:
    """A round that gathered several batches pushes all its jobs, its dead letter and its XACKs in one MULTI/EXEC."""
    settings = settings.with_(dispatch_batch=12)  # COUNT 12 per stream: one read takes all 41 entries
    d = Dispatcher(redis_client, settings, consumer="c1", block_ms=10)
    d.ensure_groups()
    for i in range(40):
        xadd(redis_client, i % 4, encode_minute(minute(project=f"p{i % 4}", i=i)))
    xadd(redis_client, 3, b"\xc1")
    commands: list[str] = []
    monitor_client = redis.Redis.from_url(redis_url)
    with monitor_client.monitor() as m:
        assert d.poll_once() == 41
        redis_client.ping()
        for event in m.listen():
            cmd = event["command"].split(" ")[0].upper()
            commands.append(cmd)
            if cmd == "PING":
                break
    monitor_client.close()
    assert commands.count("MULTI") == 1
    multi, exec_ = commands.index("MULTI"), commands.index("EXEC")
    inside = commands[multi:exec_]
    assert inside.count("RPUSH") == 4  # 40 minutes, at most 12 per job
    assert "XADD" in inside
    assert inside.count("XACK") == 4  # one per shard
    assert "XACK" not in commands[:multi] + commands[exec_:]
    assert [len(job) for job in log_jobs(redis_client)] == [12, 12, 12, 4]


class InterleavingDispatcher(Dispatcher):
    """Runs `between` once at the racy moment of `trim`: after XINFO GROUPS was read, before XPENDING."""

    def __init__(self, *args: object, between: Callable[[], None], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.between: Callable[[], None] | None = between

    def group_floor(self, stream: str, group: dict[str, Any]) -> tuple[int, int]:
        if self.between is not None:
            hook, self.between = self.between, None
            hook()
        return super().group_floor(stream, group)


@pytest.mark.parametrize("reads_more", [False, True], ids=["acks-all", "acks-all-then-reads-more"])
def test_trim_is_safe_when_another_dispatcher_acks_between_xinfo_and_xpending(
    redis_client: redis.Redis, settings: Settings, reads_more: bool
) -> None:
    """XINFO GROUPS reports entries pending; before XPENDING, a second dispatcher acknowledges all of them
    (and, in one variant, reads and holds new entries). Trim neither fails nor removes anything unacknowledged."""
    stream = keys.stream(0)
    other = Dispatcher(redis_client, settings, consumer="other", shards=[0], block_ms=10)
    other.ensure_groups()
    other.linger_s = other.downstream_linger_s = 60.0  # it holds what it reads until flush_gathered()
    pool_queue("log", redis_client).enqueue(keys.LOG_JOB, [])  # the log pool is busy
    first = [minute(i=i) for i in range(10)]
    more = [minute(i=i) for i in range(10, 15)]
    for m in first:
        xadd(redis_client, 0, encode_minute(m))
    assert other.poll_once() == 10
    assert redis_client.xpending(stream, keys.DISPATCH_GROUP)["pending"] == 10  # held, not yet acknowledged

    def other_dispatcher_works() -> None:
        other.flush_gathered()
        if reads_more:
            for m in more:
                xadd(redis_client, 0, encode_minute(m))
            assert other.poll_once() == 5  # held: pending above what XINFO saw as last delivered

    trimmer = InterleavingDispatcher(
        redis_client, settings, consumer="trimmer", shards=[0], between=other_dispatcher_works
    )
    before = [e for e, _ in redis_client.xrange(stream)]
    assert trimmer.trim() == 10
    assert trimmer.between is None  # the interleaving happened

    left = {e for e, _ in redis_client.xrange(stream)}
    pending = [row["message_id"] for row in redis_client.xpending_range(stream, keys.DISPATCH_GROUP, "-", "+", 100)]
    assert len(pending) == (5 if reads_more else 0)
    assert set(pending) <= left, "an unacknowledged entry was trimmed"
    assert set(before) - left == set(before[:10])  # exactly the acknowledged ones went

    other.flush_gathered()
    dispatched = [msgpack.unpackb(e[1])["id"] for job in log_jobs(redis_client) for e in job]
    assert sorted(dispatched) == sorted(m.id for m in first + (more if reads_more else []))
    assert redis_client.xpending(stream, keys.DISPATCH_GROUP)["pending"] == 0


def test_data_that_is_not_json_is_dead_lettered_naming_the_field_and_neighbours_go_on(
    redis_client: redis.Redis, settings: Settings
) -> None:
    """A producer in another language can put NaN, Infinity or bin in msgpack: the same rule as emit() refuses them."""
    d = Dispatcher(redis_client, settings, consumer="c1", block_ms=10)
    d.ensure_groups()
    body = {"v": 1, **minute(i=0).to_dict()}
    before = xadd(redis_client, 0, encode_minute(minute(i=1)))
    bad = {
        xadd(redis_client, 0, msgpack.packb({**body, "data": {"m": {"ratio": float("nan")}}})): "data.m.ratio",
        xadd(redis_client, 0, msgpack.packb({**body, "data": {"xs": [1, float("inf")]}})): "data.xs[1]",
        xadd(redis_client, 0, msgpack.packb({**body, "data": {"blob": b"\x00"}}, use_bin_type=True)): "data.blob",
    }
    after = xadd(redis_client, 0, encode_minute(minute(i=2)))
    assert d.poll_once() == 5
    assert [e[0] for job in log_jobs(redis_client) for e in job] == [before, after]
    dead = {
        fields[b"entry_id"].decode(): fields[b"reason"].decode()
        for _, fields in redis_client.xrange(keys.dead_letter_stream(0))
    }
    assert set(dead) == set(bad)
    for entry_id, field in bad.items():
        assert f"invalid minute: {field}: " in dead[entry_id], dead[entry_id]
    assert redis_client.xpending(keys.stream(0), keys.DISPATCH_GROUP)["pending"] == 0

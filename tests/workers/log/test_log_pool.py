from __future__ import annotations

import os
import pickle
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgpack
import pytest
import redis
from rq.job import Job
from rq.registry import FailedJobRegistry

from contracts import Minute, encode_minute, keys
from pvm import defaults
from pvm.config import Settings
from pvm.metrics import FRESHNESS_BUCKETS, read_histogram
from pvm.stores.cache import MinuteCache
from pvm.stores.log import LogReader, LogWriter
from workers.log.pool import plan, process
from workers.runtime.queues import pool_queue
from workers.runtime.runner import PvmWorker, requeue_orphans
from workers.runtime.serializers import MsgpackSerializer, SerializationError


def batch(n: int, project: str = "p1", agent: str = "a1", start: int = 0) -> list[list[object]]:
    out: list[list[object]] = []
    for i in range(start, start + n):
        m = Minute(project_id=project, event_type="message", agent_id=agent, id=f"id{i:05d}", memory_note=str(i))
        out.append([f"{100 + i}-0", encode_minute(m)])
    return out


def test_plan_groups_by_project_in_stream_order() -> None:
    entries = batch(3, "a") + batch(2, "b", start=3) + batch(1, "a", start=5)
    grouped = plan(entries)
    assert [i.minute_id for i in grouped["a"]] == ["id00000", "id00001", "id00002", "id00005"]
    assert [i.entry_id for i in grouped["b"]] == ["103-0", "104-0"]


def test_process_is_idempotent(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path)
    first = process(writer, batch(5))
    again = process(writer, batch(7))
    assert (first.appended, first.duplicates) == (5, 0)
    assert (again.appended, again.duplicates) == (2, 5)
    assert LogReader(tmp_path).count("p1") == 7


def run_burst(connection: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)

    PvmWorker([pool_queue("log", connection)], connection).work(burst=True)


def enqueue(connection: redis.Redis, entries: list[list[object]], shard: int = 0) -> Job:
    return pool_queue("log", connection).enqueue(keys.LOG_JOB, entries)


def test_worker_logs_a_batch_and_fills_the_caches(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    enqueue(redis_client, batch(30, agent="a1") + batch(10, agent="a2", start=30))
    run_burst(redis_client, settings, monkeypatch)
    reader = LogReader(settings.log_dir)
    assert reader.count("p1") == 40
    cache = MinuteCache(redis_client)
    assert cache.recent_ids("p1", 3) == ["id00037", "id00038", "id00039"]
    assert cache.recent_ids("p1", 2, agent_id="a1") == ["id00028", "id00029"]
    cached = cache.get_many("p1", ["id00000", "id00039"])
    assert msgpack.unpackb(cached["id00039"])["memory_note"] == "39"
    assert cache.head("p1")["seq"] == "40"
    assert redis_client.sismember(keys.projects(), "p1")


def test_knowledge_changes_are_logged_and_cached_by_id_but_stay_out_of_the_recent_windows(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contracts.fact_changes import learned_minute
    from contracts.facts import TierKey

    change = learned_minute("deploy window", "Tue", TierKey.for_project("p1"), agent_id="a1", minute_id="id00005")
    entries = [*batch(5), ["200-0", encode_minute(change)], *batch(2, start=6)]
    enqueue(redis_client, entries)
    run_burst(redis_client, settings, monkeypatch)
    assert LogReader(settings.log_dir).count("p1") == 8
    cache = MinuteCache(redis_client)
    assert cache.recent_ids("p1", 10) == [f"id{i:05d}" for i in (0, 1, 2, 3, 4, 6, 7)]
    assert "id00005" not in cache.recent_ids("p1", 10, agent_id="a1")
    assert cache.get_many("p1", ["id00005"])  # still cached by id, for readers that ask for it
    assert cache.head("p1")["seq"] == "8"  # and the log head counts it


def test_chunk_summaries_are_logged_but_stay_out_of_the_recent_windows(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contracts.summaries import ChunkSummarized, ThreadRef, chunk_summarized_minute

    summary = chunk_summarized_minute(
        "p1",
        ChunkSummarized(ThreadRef.parse("project"), 1, 2, "Two minutes happened.", (), None, "m"),
        minute_id="id00002",
        timestamp="2026-11-26T10:00:00.000Z",
        context_references=(),
    )
    entries = [*batch(2), ["200-0", encode_minute(summary)], *batch(1, start=3)]
    enqueue(redis_client, entries)
    run_burst(redis_client, settings, monkeypatch)
    assert LogReader(settings.log_dir).count("p1") == 4
    cache = MinuteCache(redis_client)
    assert cache.recent_ids("p1", 10) == ["id00000", "id00001", "id00003"]
    assert "id00002" not in cache.recent_ids("p1", 10, agent_id="pvm-summarize")


def test_a_redelivered_batch_adds_nothing(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    enqueue(redis_client, batch(10))
    enqueue(redis_client, batch(10))  # the same entries again (a reclaimed or retried batch)
    run_burst(redis_client, settings, monkeypatch)
    records = list(LogReader(settings.log_dir).history("p1"))
    assert len(records) == 10 and len({r.id for r in records}) == 10
    assert redis_client.zcard(keys.recent_window("p1")) == 10


def test_caches_stay_bounded(redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings.with_(recent_window=5, minute_cache_size=8)
    enqueue(redis_client, batch(30))
    run_burst(redis_client, settings, monkeypatch)
    assert redis_client.zcard(keys.recent_window("p1")) == 5
    assert redis_client.hlen(keys.minute_by_id("p1")) == 8
    assert MinuteCache(redis_client).get_many("p1", ["id00029"])


def test_a_planted_pickle_payload_is_never_unpickled(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    # Someone with write access to Redis plants a job whose data is a pickle.
    job = pool_queue("log", redis_client).enqueue(keys.LOG_JOB, [])
    redis_client.hset(job.key, "data", pickle.dumps(("os.system", None, (Exploit(),), {})))
    with pytest.raises(SerializationError):
        MsgpackSerializer.loads(pickle.dumps(Exploit()))
    run_burst(redis_client, settings, monkeypatch)
    assert not marker.exists()
    failed = FailedJobRegistry("pvm-log", connection=redis_client, serializer=MsgpackSerializer)
    assert job.id in failed.get_job_ids()


def test_jobs_of_a_dead_worker_are_requeued(redis_client: redis.Redis, settings: Settings) -> None:
    queue = pool_queue("log", redis_client)
    job = queue.enqueue(keys.LOG_JOB, batch(2))
    # A worker took the job and died (its alive key is gone): rebuild that state with RQ itself.
    worker = PvmWorker([queue], redis_client, name="pvm-test-dead")
    dequeued = queue.dequeue_any([queue], None, connection=redis_client, serializer=MsgpackSerializer)
    assert dequeued is not None
    worker.prepare_execution(dequeued[0])
    assert redis_client.llen(queue.key) == 0
    assert requeue_orphans(redis_client, [queue]) == [job.id]
    assert queue.job_ids == [job.id]
    assert requeue_orphans(redis_client, [queue]) == []
    assert redis_client.hgetall(keys.metrics_reaper(queue.name)) == {b"dead_worker": b"1"}  # counted once


def test_a_job_stranded_between_dequeue_and_start_is_requeued_after_the_grace(
    redis_client: redis.Redis, settings: Settings
) -> None:
    queue = pool_queue("log", redis_client)
    job = queue.enqueue(keys.LOG_JOB, batch(2))
    # A worker BLMOVEd the job into the intermediate list and died before starting it.
    dequeued = queue.dequeue_any([queue], None, connection=redis_client, serializer=MsgpackSerializer)
    assert dequeued is not None
    assert redis_client.lrange(queue.intermediate_queue_key, 0, -1) == [job.id.encode()]
    grace = defaults.STRANDED_GRACE_S
    assert requeue_orphans(redis_client, [queue], now=1000.0) == []  # first seen
    assert requeue_orphans(redis_client, [queue], now=1000.0 + grace - 0.5) == []
    assert not redis_client.exists(keys.metrics_reaper(queue.name))  # nothing requeued, nothing counted
    assert requeue_orphans(redis_client, [queue], now=1000.0 + grace) == [job.id]
    assert queue.job_ids == [job.id]
    assert redis_client.llen(queue.intermediate_queue_key) == 0
    assert redis_client.hlen(keys.stranded_seen(queue.name)) == 0
    assert requeue_orphans(redis_client, [queue], now=2000.0) == []
    assert redis_client.hgetall(keys.metrics_reaper(queue.name)) == {b"stranded": b"1"}


def test_a_dequeued_job_its_worker_starts_is_not_requeued(redis_client: redis.Redis, settings: Settings) -> None:
    queue = pool_queue("log", redis_client)
    job = queue.enqueue(keys.LOG_JOB, batch(2))
    worker = PvmWorker([queue], redis_client, name="pvm-test-starts")
    redis_client.set(keys.worker_alive("pvm-test-starts"), 1, ex=10)
    dequeued = queue.dequeue_any([queue], None, connection=redis_client, serializer=MsgpackSerializer)
    assert dequeued is not None
    assert requeue_orphans(redis_client, [queue], now=1000.0) == []  # seen in the instant before the start
    worker.prepare_execution(dequeued[0])
    worker.prepare_job_execution(dequeued[0], remove_from_intermediate_queue=True)
    assert requeue_orphans(redis_client, [queue], now=5000.0) == []
    assert queue.job_ids == []
    assert redis_client.hlen(keys.stranded_seen(queue.name)) == 0
    assert not redis_client.exists(keys.metrics_reaper(queue.name))
    assert job.get_status(refresh=True) == "started"


def test_jobs_of_a_live_worker_are_left_alone(redis_client: redis.Redis, settings: Settings) -> None:
    queue = pool_queue("log", redis_client)
    queue.enqueue(keys.LOG_JOB, batch(2))
    worker = PvmWorker([queue], redis_client, name="pvm-test-alive")
    redis_client.set(keys.worker_alive("pvm-test-alive"), 1, ex=10)
    dequeued = queue.dequeue_any([queue], None, connection=redis_client, serializer=MsgpackSerializer)
    assert dequeued is not None
    worker.prepare_execution(dequeued[0])
    assert requeue_orphans(redis_client, [queue]) == []
    assert not redis_client.exists(keys.metrics_reaper(queue.name))


def test_a_logged_batch_fans_out_to_the_downstream_pools(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No downstream pool exists yet; register one for this test the way a pool module will.
    monkeypatch.setitem(keys.QUEUES, "fanout", "pvm-fanout")
    monkeypatch.setitem(keys.POOL_JOBS, "fanout", "workers.fanout_pool.run")
    settings = settings.with_(downstream=("fanout",))
    enqueue(redis_client, batch(5))
    enqueue(redis_client, batch(5))  # a redelivery fans out again: downstream pools are idempotent too
    run_burst(redis_client, settings, monkeypatch)
    jobs = pool_queue("fanout", redis_client).get_jobs()
    assert [j.func_name for j in jobs] == ["workers.fanout_pool.run"] * 2
    records = jobs[0].args[0]
    assert [r[0] for r in records] == [f"id{i:05d}" for i in range(5)]
    assert [r[1] for r in records] == [1, 2, 3, 4, 5]
    assert [r[3] for r in records] == [100, 101, 102, 103, 104]  # each minute's stream entry time (ms)
    assert msgpack.unpackb(records[4][2])["memory_note"] == "4"


def test_a_log_job_larger_than_the_fan_out_batch_reaches_each_pool_in_jobs_of_that_size_in_log_order(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log pool takes `dispatch_batch` minutes a job; the downstream pools get `fanout_batch` at a time, so a
    larger log job leaves the index engine's batches (and what the reader was measured on) as they were."""
    monkeypatch.setitem(keys.QUEUES, "fanout", "pvm-fanout")
    monkeypatch.setitem(keys.POOL_JOBS, "fanout", "workers.fanout_pool.run")
    monkeypatch.setitem(keys.QUEUES, "other", "pvm-other")
    monkeypatch.setitem(keys.POOL_JOBS, "other", "workers.other_pool.run")
    settings = settings.with_(downstream=("fanout", "other"), fanout_batch=4)
    enqueue(redis_client, batch(6, project="p1") + batch(5, project="p2", start=6))
    run_burst(redis_client, settings, monkeypatch)
    for pool in ("fanout", "other"):
        jobs = pool_queue(pool, redis_client).get_jobs()
        sizes = [len(j.args[0]) for j in jobs]
        assert sizes == [4, 4, 3], pool
        ids = [r[0] for j in jobs for r in j.args[0]]
        assert ids == [f"id{i:05d}" for i in range(11)], pool  # each minute once, in log order
        assert [r[1] for j in jobs for r in j.args[0]] == [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5]


def test_a_metrics_error_does_not_fail_a_durable_batch(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    redis_client.set(keys.metrics_stage("log"), "not a hash")  # every metrics write to it fails (WRONGTYPE)
    job = enqueue(redis_client, batch(3))
    run_burst(redis_client, settings, monkeypatch)
    assert job.get_status(refresh=True) == "finished"
    assert [r.id for r in LogReader(settings.log_dir).history("p1")] == ["id00000", "id00001", "id00002"]


def test_the_log_head_is_contiguous_every_seq_at_or_below_it_is_durable(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another log process appended (and fsynced) five minutes under the project lock, then died before its
    # cache update: a later batch's head covers them, and they are durable.
    other = LogWriter(settings.log_dir)
    other.append("p1", [(f"id{i:05d}", str(entry_id), raw) for i, (entry_id, raw) in enumerate(batch(5))])
    other.close()
    enqueue(redis_client, batch(5, start=5))
    run_burst(redis_client, settings, monkeypatch)
    head = int(MinuteCache(redis_client).head("p1")["seq"])
    assert head == 10
    assert [r.seq for r in LogReader(settings.log_dir).history("p1")] == list(range(1, head + 1))


def p99_s(connection: redis.Redis, stage: str) -> tuple[float, float]:
    """The p99 of a freshness histogram (its bucket's upper bound, inf for the last) and its count."""
    h = read_histogram(connection.hgetall(keys.metrics_freshness(stage)), FRESHNESS_BUCKETS)
    label = next(label for label, cumulative in h.buckets if cumulative >= 0.99 * h.count)
    return float("inf") if label == "+Inf" else float(label), h.count


@pytest.mark.parametrize("skew", [timedelta(days=-1), timedelta(days=1)])
def test_freshness_is_measured_from_the_stream_entry_not_the_producer_clock(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, skew: timedelta
) -> None:
    stamp = (datetime.now(UTC) + skew).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # a producer clock a day off
    entries: list[list[object]] = []
    for i in range(5):
        raw = encode_minute(Minute(project_id="p1", event_type="message", id=f"id{i:05d}", timestamp=stamp))
        entry_id = redis_client.xadd(keys.stream(0), {keys.MINUTE_FIELD: raw})  # Redis sets the entry's time
        entries.append([entry_id.decode(), raw])
    enqueue(redis_client, entries)
    run_burst(redis_client, settings, monkeypatch)
    p99, count = p99_s(redis_client, "durable")
    assert count == 5 and p99 <= 30.0
    assert next(LogReader(settings.log_dir).history("p1")).minute.timestamp == stamp  # kept as data


def test_a_job_of_many_projects_makes_one_fsync(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    def spread(start: int) -> list[list[object]]:
        return [row for p in range(64) for row in batch(3, f"p{p:02d}", start=start + 3 * p)]

    enqueue(redis_client, spread(0))  # the worker opens its journal and the 64 projects
    enqueue(redis_client, spread(1_000))
    job = enqueue(redis_client, spread(2_000))
    run_burst(redis_client, settings, monkeypatch)
    result = job.latest_result()
    assert result is not None
    summary = result.return_value
    assert summary["appended"] == 192 and len(summary["projects"]) == 64
    assert summary["fsyncs"] == 1
    reader = LogReader(settings.log_dir)
    assert [reader.count(f"p{p:02d}") for p in range(64)] == [9] * 64

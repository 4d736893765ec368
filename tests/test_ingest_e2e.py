"""End to end through real processes: emitter -> Redis Streams -> dispatcher -> RQ -> log pool -> log."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import redis
from rq.job import Job
from rq.registry import FailedJobRegistry, StartedJobRegistry

from contracts import Minute, keys
from pvm.config import Settings
from pvm.emitter import Emitter
from pvm.stores.log import LogReader
from tests.conftest import free_port
from workers.runtime.embedded import EmbeddedRedis
from workers.runtime.queues import pool_queue
from workers.runtime.serializers import MsgpackSerializer
from workers.runtime.stack import Stack

pytestmark = pytest.mark.slow

PROJECTS = [f"proj-{i}" for i in range(5)]


@pytest.fixture
def stack(settings: Settings) -> Iterator[Stack]:
    # The ingest half: no index fan-out and no API process (tests/test_up.py runs the whole stack).
    s = Stack(settings.with_(downstream=()), api_port=None)
    s.start()
    try:
        yield s
    finally:
        s.stop(timeout=10)


def produce(
    settings: Settings, total: int, threads: int = 3, rate_per_thread: float | None = None, outage: bool = False
) -> list[str]:
    ids: list[list[str]] = [[] for _ in range(threads)]
    with Emitter(settings=settings) as em:

        def run(t: int) -> None:
            for i in range(total // threads + (1 if t < total % threads else 0)):
                m = Minute(project_id=PROJECTS[(i + t) % len(PROJECTS)], event_type="message", agent_id=f"agent-{t}")
                ids[t].append(em.emit(m))
                if rate_per_thread:
                    time.sleep(1 / rate_per_thread)

        workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert em.flush(30)
        stats = em.stats()
        assert stats.dropped == 0 and stats.sent == total
        assert (stats.spooled_total > 0) == outage  # with Redis away the emitter spooled, and only then
    return [i for chunk in ids for i in chunk]


def pipeline_state(settings: Settings) -> dict[str, object]:
    """Where minutes can be held up between the streams and the log: for a failure message."""
    r = redis.Redis.from_url(settings.redis_url or "")
    queue = pool_queue("log", r)
    failed = FailedJobRegistry(queue.name, connection=r, serializer=MsgpackSerializer)
    state: dict[str, object] = {
        "groups": {s: r.xinfo_groups(keys.stream(s)) for s in range(settings.shards)},
        "queued": queue.count,
        "intermediate": r.llen(queue.intermediate_queue_key),
        "started": StartedJobRegistry(queue.name, connection=r).get_job_ids(),
        "failed": {job_id: (r.hget(Job.key_for(job_id), "exc_info") or b"")[-300:] for job_id in failed.get_job_ids()},
        "workers": [w.decode() for w in r.smembers(f"rq:workers:{queue.name}")],
    }
    return state


def wait_for_log(settings: Settings, total: int, timeout: float = 90) -> LogReader:
    reader = LogReader(settings.log_dir)
    deadline = time.monotonic() + timeout
    while sum(reader.count(p) for p in PROJECTS) < total:
        if time.monotonic() >= deadline:
            durable = sum(reader.count(p) for p in PROJECTS)
            raise AssertionError(f"only {durable}/{total} durable; pipeline: {pipeline_state(settings)}")
        time.sleep(0.2)
    time.sleep(0.5)  # anything extra (a duplicate) would land now
    return reader


def assert_exactly_once_in_stream_order(reader: LogReader, ids: list[str]) -> None:
    logged: list[str] = []
    for project in PROJECTS:
        records = list(reader.history(project))
        assert [r.seq for r in records] == list(range(1, len(records) + 1))
        stream_positions = [tuple(map(int, r.stream_id.split("-"))) for r in records]
        assert stream_positions == sorted(stream_positions), f"{project}: log order differs from stream order"
        logged.extend(r.id for r in records)
    assert len(logged) == len(set(logged)), "a minute was logged twice"
    assert sorted(logged) == sorted(ids), "a minute was lost"


def test_ten_thousand_minutes_reach_the_log_exactly_once_in_stream_order(stack: Stack, settings: Settings) -> None:
    ids = produce(settings, 10_000)
    reader = wait_for_log(settings, 10_000)
    assert_exactly_once_in_stream_order(reader, ids)


def test_kill_9_of_the_log_worker_and_the_dispatcher_loses_and_duplicates_nothing(
    stack: Stack, settings: Settings
) -> None:
    total = 10_000
    ids: list[str] = []
    producer = threading.Thread(target=lambda: ids.extend(produce(settings, total, rate_per_thread=1_200)))
    producer.start()
    reader = LogReader(settings.log_dir)
    while sum(reader.count(p) for p in PROJECTS) < 1_500:
        time.sleep(0.05)
    for name in ("worker-log", "dispatcher-0"):
        os.kill(stack.children[name].pid, signal.SIGKILL)
        stack.children[name].wait()
    time.sleep(1.0)  # the stream backs up while both are dead
    assert sorted(stack.restart_dead()) == ["dispatcher-0", "worker-log"]
    producer.join()
    # The replacement worker's reaper requeues the killed worker's job within ~15 s (started registry)
    # or ~15 s after it is first seen stranded (intermediate list); the rest is load.
    reader = wait_for_log(settings, total, timeout=240)
    logged = [r.id for p in PROJECTS for r in reader.history(p)]
    assert len(logged) == len(set(logged)) == total
    assert sorted(logged) == sorted(ids)


def test_redis_down_for_seconds_never_blocks_or_raises_in_emit(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "valkey"
    server = EmbeddedRedis(data_dir=data, port=port).start()
    settings = Settings(
        redis_url=server.url, shards=4, home=tmp_path, log_dir=tmp_path / "log", spool_dir=tmp_path / "spool"
    )
    durations: list[int] = []
    ids: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    minutes = [Minute(project_id=PROJECTS[i % 5], event_type="message") for i in range(20_000)]
    em = Emitter(settings=settings)
    slow: list[tuple[int, float]] = []
    t0 = time.perf_counter()

    def agent() -> None:
        for m in minutes:
            if stop.is_set():
                return
            t = time.perf_counter_ns()
            try:
                ids.append(em.emit(m))
            except BaseException as exc:  # the test is that this never happens
                errors.append(exc)
            durations.append(time.perf_counter_ns() - t)
            if durations[-1] > 500_000:
                slow.append((durations[-1], time.perf_counter() - t0))
            time.sleep(0.0005)

    thread = threading.Thread(target=agent)
    thread.start()
    try:
        time.sleep(1.0)
        server.stop()
        down_at = len(ids)
        time.sleep(3.0)
        server = EmbeddedRedis(data_dir=data, port=port).start()
        up_at = len(ids)
        time.sleep(1.5)
        stop.set()
        thread.join()
        assert em.flush(30)
        stats = em.stats()
        em.close()
        assert not errors
        assert up_at - down_at > 500, "the agent kept emitting while Redis was down"
        assert stats.spooled_total > 0 and stats.dropped == 0
        # Blocking on Redis would cost a socket timeout (EMIT_SOCKET_TIMEOUT_S, 2 s) or at least a connect
        # attempt; 50 ms is far below that and above what a loaded 2-core machine's scheduling adds to a call
        # (1.2 ms seen while another test run shared the CPU). emit()'s latency itself is benchmarked.
        assert max(durations) < 50_000_000, f"slow emit() calls (ns, s since start): {slow}"
        r = redis.Redis.from_url(server.url)
        arrived = [msgpack.unpackb(f[keys.MINUTE_FIELD])["id"] for s in range(4) for _, f in r.xrange(keys.stream(s))]
        assert set(arrived) == set(ids)
    finally:
        stop.set()
        server.stop()


def test_a_redis_restart_under_load_loses_and_duplicates_nothing_and_every_process_rides_it_out(
    tmp_path: Path,
) -> None:
    port = free_port()
    data = tmp_path / "valkey"
    server = EmbeddedRedis(data_dir=data, port=port).start()
    settings = Settings(
        redis_url=server.url, shards=4, home=tmp_path, log_dir=tmp_path / "log", spool_dir=tmp_path / "spool"
    )
    stack = Stack(settings.with_(downstream=()), api_port=None)
    stack.start()
    try:
        total = 6_000
        ids: list[str] = []
        producer = threading.Thread(
            target=lambda: ids.extend(produce(settings, total, rate_per_thread=400, outage=True))
        )
        producer.start()
        reader = LogReader(settings.log_dir)
        while sum(reader.count(p) for p in PROJECTS) < 1_000:
            time.sleep(0.05)
        dispatcher, worker = stack.children["dispatcher-0"], stack.children["worker-log"]
        server.stop()  # a restart or failover: every client's connection breaks
        time.sleep(2.0)
        server = EmbeddedRedis(data_dir=data, port=port).start()
        producer.join()
        restarted: list[str] = []
        deadline = time.monotonic() + 120
        while sum(reader.count(p) for p in PROJECTS) < total and time.monotonic() < deadline:
            restarted += stack.restart_dead()  # what `pvm up` does every second
            time.sleep(0.2)
        reader = wait_for_log(settings, total, timeout=10)
        # Exactly once; not necessarily in stream order: a job requeued after the outage lands after later ones.
        logged = [r.id for p in PROJECTS for r in reader.history(p)]
        assert len(logged) == len(set(logged)) == total
        assert sorted(logged) == sorted(ids)
        assert dispatcher.poll() is None and "dispatcher-0" not in restarted, "the dispatcher died with Redis"
        assert worker.poll() is None and "worker-log" not in restarted, "the log worker process died with Redis"
    finally:
        stack.stop(timeout=10)
        server.stop()

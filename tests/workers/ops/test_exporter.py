from __future__ import annotations

import re
import urllib.request

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from contracts import Minute, encode_minute, keys
from pvm import defaults
from pvm.config import Settings
from pvm.metrics import MetricsRecorder
from tests.conftest import free_port
from workers.ingest.dispatcher import Dispatcher
from workers.ops.exporter import serve, snapshot
from workers.runtime.queues import pool_queue
from workers.runtime.runner import DurableQueue, PvmWorker, requeue_orphans
from workers.runtime.serializers import MsgpackSerializer

NAME = re.compile(r"^pvm_[a-z0-9_]+$")


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_snapshot_reports_lag_pending_age_and_queues(redis_client: redis.Redis, settings: Settings) -> None:
    d = Dispatcher(redis_client, settings, consumer="c1", block_ms=10)
    d.ensure_groups()
    for _i in range(7):
        redis_client.xadd(keys.stream(1), {keys.MINUTE_FIELD: encode_minute(Minute(project_id="p", event_type="m"))})
    redis_client.xreadgroup(keys.DISPATCH_GROUP, "slow", {keys.stream(1): ">"}, count=2)
    pool_queue("log", redis_client).enqueue(keys.LOG_JOB, [])
    snap = snapshot(redis_client, settings)
    group = snap.streams[1].groups[0]
    assert (group.lag, group.pending) == (5, 2)
    assert group.oldest_pending_age_s is not None and group.oldest_pending_age_s >= 0
    log_q = next(q for q in snap.queues if q.pool == "log")
    assert log_q.queued == 1 and log_q.workers == 0 and log_q.oldest_waiting_s is not None


def test_lag_is_computed_when_redis_reports_null(redis_client: redis.Redis, settings: Settings) -> None:
    stream = keys.stream(0)
    ids = [redis_client.xadd(stream, {b"m": b"x"}) for _ in range(10)]
    redis_client.xgroup_create(stream, keys.DISPATCH_GROUP, id="0")
    redis_client.xreadgroup(keys.DISPATCH_GROUP, "c", {stream: ">"}, count=3)
    redis_client.xdel(stream, ids[5])  # a deletion the group has not read past: Redis gives up on lag
    raw = redis_client.xinfo_groups(stream)[0]["lag"]
    group = snapshot(redis_client, settings).streams[0].groups[0]
    if raw is None:
        assert group.lag_source == "computed"
    assert group.lag == 6


def test_metrics_follow_prometheus_conventions_and_carry_recorded_numbers(
    redis_client: redis.Redis, settings: Settings
) -> None:
    Dispatcher(redis_client, settings, consumer="c1").ensure_groups()
    rec = MetricsRecorder(redis_client)
    rec.batch("log", 500, 0.02)
    rec.batch("log", 300, 0.2, failures=3)
    rec.freshness("durable", [0.01, 0.02, 0.3])
    rec.provider_call("openai", "embedding", "ok", 0.12, tokens=900)
    redis_client.hset(keys.schedules(), mapping={"optimize:every": "3600.0", "optimize:last": "1700000000.5"})
    redis_client.set(keys.scheduler_leader(), "sched-a", px=60_000)
    port = free_port()
    server, _ = serve(redis_client, settings, port=port)
    try:
        m = scrape(port)
    finally:
        server.shutdown()
    required = [
        "pvm_stream_length",
        "pvm_stream_lag",
        "pvm_stream_pending",
        "pvm_stream_oldest_pending_age_seconds",
        "pvm_queue_jobs",
        "pvm_queue_workers",
        "pvm_dead_letters",
        "pvm_dead_letters_added_total",
        "pvm_stage_minutes_total",
        "pvm_stage_failures_total",
        "pvm_stage_batch_duration_seconds_bucket",
        "pvm_freshness_seconds_bucket",
        "pvm_provider_calls_total",
        "pvm_provider_tokens_total",
        "pvm_provider_latency_seconds_count",
        "pvm_schedule_last_run_timestamp_seconds",
        "pvm_schedule_interval_seconds",
        "pvm_scheduler_leader",
    ]
    missing = [name for name in required if name not in m]
    assert not missing
    assert ({"stage": "log"}, 800.0) in m["pvm_stage_minutes_total"]
    assert ({"stage": "log"}, 3.0) in m["pvm_stage_failures_total"]
    assert ({"stage": "durable"}, 3.0) in m["pvm_freshness_seconds_count"]
    assert ({"provider": "openai", "kind": "embedding"}, 900.0) in m["pvm_provider_tokens_total"]
    for name in m:
        assert NAME.match(name), name
        base = re.sub(r"_(bucket|sum|count|created)$", "", name)
        if name.endswith("_total"):
            assert not name.endswith("_seconds_total")
        words = set(base.split("_"))
        if words & {"duration", "latency", "age", "freshness", "waiting", "interval", "timestamp"}:
            assert base.endswith("_seconds"), name
    labels = {k for samples in m.values() for lbls, _ in samples for k in lbls}
    assert labels <= {
        *("shard", "group", "queue", "pool", "stage", "status", "provider", "kind", "outcome", "le"),
        *("schedule", "scheduler", "reason", "change", "what", "project"),
    }


def test_the_facts_pools_change_counters_are_served_every_one_from_zero(
    redis_client: redis.Redis, settings: Settings
) -> None:
    def served() -> dict[str, float]:
        port = free_port()
        server, _ = serve(redis_client, settings, port=port)
        try:
            m = scrape(port)
        finally:
            server.shutdown()
        return {labels["change"]: value for labels, value in m["pvm_facts_changes_total"]}

    assert served() == dict.fromkeys(keys.FACT_CHANGE_COUNTERS, 0.0)
    redis_client.hset(keys.metrics_fact_changes(), mapping={"asserted": 7, "superseded": 2, "refused": 1})
    assert served() == {**dict.fromkeys(keys.FACT_CHANGE_COUNTERS, 0.0), "asserted": 7, "superseded": 2, "refused": 1}
    assert keys.FACT_CHANGE_COUNTERS == (
        "extracted",
        "asserted",
        "confirmed",
        "promoted",
        "superseded",
        "contradicted",
        "refused",
    )
    assert snapshot(redis_client, settings).fact_changes["asserted"] == 7


def test_the_summarize_pools_counters_are_served_every_one_from_zero(
    redis_client: redis.Redis, settings: Settings
) -> None:
    def served() -> dict[str, float]:
        port = free_port()
        server, _ = serve(redis_client, settings, port=port)
        try:
            m = scrape(port)
        finally:
            server.shutdown()
        return {labels["what"]: value for labels, value in m["pvm_summaries_total"]}

    assert served() == dict.fromkeys(keys.SUMMARY_COUNTERS, 0.0)
    redis_client.hset(keys.metrics_summaries(), mapping={"chunks": 11, "episodes": 4, "llm_fallbacks": 1})
    assert served() == {**dict.fromkeys(keys.SUMMARY_COUNTERS, 0.0), "chunks": 11, "episodes": 4, "llm_fallbacks": 1}
    assert snapshot(redis_client, settings).summaries["chunks"] == 11


def test_dead_letters_added_keeps_counting_once_the_stream_is_at_its_cap(
    redis_client: redis.Redis, settings: Settings
) -> None:
    """The alert's counter: the dead-letter stream's length stops at MAXLEN, `entries-added` does not."""
    d = Dispatcher(redis_client, settings, consumer="c1", block_ms=10)
    d.ensure_groups()
    redis_client.xadd(keys.stream(2), {keys.MINUTE_FIELD: b"\xc1 junk"})
    d.poll_once()
    d.poll_once()  # a quiet read sends what was gathered: the junk goes to the dead-letter stream
    dead_stream = keys.dead_letter_stream(2)
    assert redis_client.xlen(dead_stream) == 1
    # The dispatcher caps the stream at defaults.DEAD_LETTER_MAXLEN (approximately); the same XADD with a
    # small exact cap trims on every add, without writing a million entries.
    cap = 5

    def dead_letters(n: int) -> None:
        for i in range(n):
            redis_client.xadd(
                dead_stream, {"reason": "test", "raw": b"x", "entry_id": f"{i}-0"}, maxlen=cap, approximate=False
            )

    def scraped() -> tuple[dict[str, float], dict[str, float]]:
        port = free_port()
        server, _ = serve(redis_client, settings, port=port)
        try:
            m = scrape(port)
        finally:
            server.shutdown()
        gauge = {labels["shard"]: value for labels, value in m["pvm_dead_letters"]}
        counter = {labels["shard"]: value for labels, value in m["pvm_dead_letters_added_total"]}
        return gauge, counter

    dead_letters(11)
    gauge, counter = scraped()
    assert gauge["2"] == cap and counter["2"] == 12
    assert counter == {"0": 0.0, "1": 0.0, "2": 12.0, "3": 0.0}  # shards without a dead-letter stream read 0

    dead_letters(3)  # at the cap: the length stays, the counter rises
    gauge, counter = scraped()
    assert (gauge["2"], counter["2"]) == (cap, 15)
    assert snapshot(redis_client, settings).streams[2].dead_letters_added == 15

    redis_client.xdel(dead_stream, *[entry_id for entry_id, _ in redis_client.xrange(dead_stream)])  # pvm dead drop
    gauge, counter = scraped()
    assert (gauge["2"], counter["2"]) == (0, 15)


def test_schedules_and_the_leader_lease_are_read_at_scrape_time(redis_client: redis.Redis, settings: Settings) -> None:
    """What `pvm scheduler` keeps in Redis, as gauges: a schedule that never ran has an interval and no last run."""

    def families() -> dict[str, list[tuple[dict[str, str], float]]]:
        port = free_port()
        server, _ = serve(redis_client, settings, port=port)
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        finally:
            server.shutdown()
        return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(body)}

    # Nothing scheduled yet: every family is served, with no samples.
    m = families()
    assert m["pvm_schedule_last_run_timestamp_seconds"] == []
    assert m["pvm_schedule_interval_seconds"] == []
    assert m["pvm_scheduler_leader"] == []

    redis_client.hset(
        keys.schedules(),
        mapping={
            "optimize:every": "3600.0",
            "optimize:last": "1700000000.25",
            "optimize:job": "job-1",
            "compact:every": "86400",  # written by the leader, never run yet
        },
    )
    redis_client.set(keys.scheduler_leader(), "sched-a", px=60_000)
    m = families()
    assert m["pvm_schedule_last_run_timestamp_seconds"] == [({"schedule": "optimize"}, 1700000000.25)]
    assert m["pvm_schedule_interval_seconds"] == [  # by name
        ({"schedule": "compact"}, 86400.0),
        ({"schedule": "optimize"}, 3600.0),
    ]
    assert m["pvm_scheduler_leader"] == [({"scheduler": "sched-a"}, 1.0)]

    snap = snapshot(redis_client, settings)
    assert snap.scheduler_leader == "sched-a"
    compact, optimize = snap.schedules
    assert (compact.name, compact.every_s, compact.last_run_at, compact.last_job) == ("compact", 86400.0, None, None)
    assert compact.last_run_age_s is None and compact.next_due_in_s is None
    assert (optimize.name, optimize.every_s, optimize.last_run_at, optimize.last_job) == (
        "optimize",
        3600.0,
        1700000000.25,
        "job-1",
    )
    assert optimize.last_run_age_s == snap.taken_at - 1700000000.25
    assert optimize.next_due_in_s == 1700000000.25 + 3600.0 - snap.taken_at  # long overdue: negative

    # The lease expires (or its holder releases it): the family stays, without a sample.
    redis_client.delete(keys.scheduler_leader())
    m = families()
    assert m["pvm_scheduler_leader"] == []
    assert len(m["pvm_schedule_interval_seconds"]) == 2


def test_a_malformed_schedule_field_is_left_out_not_fatal(redis_client: redis.Redis, settings: Settings) -> None:
    redis_client.hset(
        keys.schedules(), mapping={"optimize:every": "hourly", "optimize:last": "1700000000", "stray": "x"}
    )
    (optimize,) = snapshot(redis_client, settings).schedules
    assert (optimize.name, optimize.every_s, optimize.last_run_at) == ("optimize", None, 1700000000.0)
    assert optimize.next_due_in_s is None


def test_dequeued_jobs_and_the_reapers_requeues_are_served(redis_client: redis.Redis, settings: Settings) -> None:
    """A job taken and never started reads `dequeued` until the reaper puts it back; its requeues count by reason."""
    log_queue, index_queue = pool_queue("log", redis_client), pool_queue("index", redis_client)
    stranded = log_queue.enqueue("tests.workers.jobs.slow_marker", "/nonexistent/never-run", 0.0)
    mid_job = index_queue.enqueue("tests.workers.jobs.slow_marker", "/nonexistent/never-run", 0.0)
    # A log worker killed between dequeue and start leaves its job in the intermediate list.
    taken = DurableQueue.dequeue_any([log_queue], None, connection=redis_client, serializer=MsgpackSerializer)
    assert taken is not None and taken[0].id == stranded.id
    # An index worker killed mid-job (no alive key) leaves its job started.
    worker = PvmWorker([index_queue], redis_client, name="pvm-test-exporter-dead")
    taken = DurableQueue.dequeue_any([index_queue], None, connection=redis_client, serializer=MsgpackSerializer)
    assert taken is not None and taken[0].id == mid_job.id
    worker.prepare_execution(taken[0])
    worker.prepare_job_execution(taken[0], remove_from_intermediate_queue=True)

    def served() -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
        port = free_port()
        server, _ = serve(redis_client, settings, port=port)
        try:
            m = scrape(port)
        finally:
            server.shutdown()
        jobs = {(lb["pool"], lb["status"]): v for lb, v in m["pvm_queue_jobs"]}
        requeued = {(lb["queue"], lb["reason"]): v for lb, v in m["pvm_reaper_requeued_total"]}
        return jobs, requeued

    jobs, requeued = served()
    assert (jobs["log", "dequeued"], jobs["log", "queued"], jobs["log", "started"]) == (1, 0, 0)
    assert (jobs["index", "dequeued"], jobs["index", "queued"], jobs["index", "started"]) == (0, 0, 1)
    # Every queue and reason is served before the first requeue, so increase() sees the first one.
    assert requeued == {(q, reason): 0.0 for q in keys.QUEUES.values() for reason in keys.REAPER_REASONS}

    assert requeue_orphans(redis_client, [log_queue, index_queue], now=1000.0) == [mid_job.id]
    assert requeue_orphans(redis_client, [log_queue, index_queue], now=1000.0 + defaults.STRANDED_GRACE_S) == [
        stranded.id
    ]
    jobs, requeued = served()
    assert (jobs["log", "dequeued"], jobs["log", "queued"]) == (0, 1)
    assert (jobs["index", "started"], jobs["index", "queued"]) == (0, 1)
    assert requeued == {
        **{(q, reason): 0.0 for q in keys.QUEUES.values() for reason in keys.REAPER_REASONS},
        ("pvm-log", "stranded"): 1.0,
        ("pvm-index", "dead_worker"): 1.0,
    }
    log_state = next(q for q in snapshot(redis_client, settings).queues if q.pool == "log")
    assert (log_state.dequeued, log_state.requeued) == (0, {"dead_worker": 0, "stranded": 1})


def test_the_exporter_survives_redis_errors(settings: Settings) -> None:
    port = free_port()
    dead = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.2)
    server, _ = serve(dead, settings, port=port)
    try:
        m = scrape(port)
    finally:
        server.shutdown()
    assert m["pvm_exporter_scrape_errors_total"][0][1] >= 1


@pytest.mark.parametrize("with_groups", [True])
def test_status_and_dead_letter_commands(
    redis_client: redis.Redis, settings: Settings, with_groups: bool, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    from workers.ops.cli import main

    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    d = Dispatcher(redis_client, settings, consumer="c1", block_ms=10)
    d.ensure_groups()
    good = encode_minute(Minute(project_id="p", event_type="message"))
    redis_client.xadd(keys.stream(0), {keys.MINUTE_FIELD: b"\xc1 junk"})
    redis_client.xadd(keys.stream(0), {keys.MINUTE_FIELD: good})
    d.poll_once()
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "POOLS" in out and "pvm-log" in out and "1 dead letters" in out
    assert "pvm-facts" in out and "FACTS (what the facts pool did)" in out and "asserted 0" in out
    assert "pvm-summarize" in out and "SUMMARIES (what the summarize pool did)" in out and "chunks 0" in out
    assert main(["dead", "list", "--json"]) == 0
    import json

    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1 and "not valid msgpack" in rows[0]["reason"]
    assert main(["dead", "retry"]) == 2  # refuses without ids or --all
    capsys.readouterr()
    assert main(["dead", "retry", rows[0]["id"]]) == 0
    assert redis_client.xlen(keys.dead_letter_stream(0)) == 0
    d.poll_once()
    d.poll_once()  # (a quiet read sends what was gathered) validated again: still poison, dead again
    assert redis_client.xlen(keys.dead_letter_stream(0)) == 1
    assert main(["dead", "drop", "--all"]) == 0
    assert redis_client.xlen(keys.dead_letter_stream(0)) == 0
    capsys.readouterr()
    assert main(["status", "--json"]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["streams"][0]["dead_letters"] == 0


def test_failed_jobs_are_listed_and_retried(
    redis_client: redis.Redis, settings: Settings, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    import json

    from workers.ops.cli import main
    from workers.runtime.runner import PvmWorker

    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    q = pool_queue("log", redis_client)
    job = q.enqueue(keys.LOG_JOB, [["1-0", b"\xc1"]])  # the log pool cannot decode it
    PvmWorker([q], redis_client).work(burst=True)
    assert main(["failed", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["job"] for r in rows] == [job.id] and rows[0]["function"] == keys.LOG_JOB
    assert main(["failed", "retry", "--pool", "log"]) == 2  # refuses without ids or --all
    assert main(["failed", "retry", "--pool", "log", "--all"]) == 0
    assert q.job_ids == [job.id]


@pytest.mark.slow
def test_a_sigkilled_worker_stops_counting_within_the_alive_ttl(
    redis_client: redis.Redis, settings: Settings, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No other worker is left to clean up after it, and RQ's worker TTL is minutes: only a fresh alive key counts."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from workers.ops.cli import main

    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)

    def counted() -> tuple[int, int, float]:
        [log_q] = [q for q in snapshot(redis_client, settings).queues if q.pool == "log"]
        assert main(["status", "--json"]) == 0
        [status_q] = [q for q in json.loads(capsys.readouterr().out)["queues"] if q["pool"] == "log"]
        port = free_port()
        server, _ = serve(redis_client, settings, port=port)
        try:
            [metric] = [v for lb, v in scrape(port)["pvm_queue_workers"] if lb["pool"] == "log"]
        finally:
            server.shutdown()
        return log_q.workers, status_q["workers"], metric

    env = {**os.environ, **settings.to_env(), "PYTHONPATH": str(Path.cwd())}
    worker = subprocess.Popen([sys.executable, "-m", "workers.ops.cli", "worker", "log"], env=env)
    try:
        deadline = time.monotonic() + 30
        while counted() != (1, 1, 1.0):
            assert time.monotonic() < deadline, "the worker never counted"
            time.sleep(0.1)
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        killed = time.monotonic()
        while counted() != (0, 0, 0.0):
            assert time.monotonic() - killed < defaults.WORKER_ALIVE_TTL_S + 5, "a SIGKILLed worker still counts"
            time.sleep(0.2)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    assert redis_client.scard("rq:workers:pvm-log") == 1  # RQ still lists it: nobody was left to clean up


def _null_lag_stream(connection: redis.Redis, entries: int, payload: int) -> str:
    """Shard 0's stream with `entries` entries, a group that read 3, and a deletion it has not read past (lag NULL)."""
    stream = keys.stream(0)
    ids: list[bytes] = []
    for start in range(0, entries, 2_000):
        pipe = connection.pipeline(transaction=False)
        for _ in range(start, min(start + 2_000, entries)):
            pipe.xadd(stream, {b"m": b"x" * payload})
        ids += pipe.execute()
    connection.xgroup_create(stream, keys.DISPATCH_GROUP, id="0")
    connection.xreadgroup(keys.DISPATCH_GROUP, "c", {stream: ">"}, count=3)
    connection.xdel(stream, ids[10])
    assert connection.xinfo_groups(stream)[0]["lag"] is None, "this server reports the lag: nothing to compute"
    return stream


def _sent_bytes(connection: redis.Redis) -> int:
    return int(connection.info("stats")["total_net_output_bytes"])


def test_a_null_lag_is_counted_without_pulling_the_entries(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    _null_lag_stream(redis_client, 5_000, payload=2_000)  # 10 MB past the group's position
    before = _sent_bytes(redis_client)
    group = snapshot(redis_client, settings).streams[0].groups[0]
    sent = _sent_bytes(redis_client) - before
    assert (group.lag, group.lag_source) == (4_996, "computed")
    assert sent < 200_000, f"the server sent {sent:,} bytes to count a lag"

    # Past the cap a scrape counts no further: the lag is a lower bound, and says so.
    monkeypatch.setattr(defaults, "EXPORTER_LAG_COUNT_CAP", 1_000)
    group = snapshot(redis_client, settings).streams[0].groups[0]
    assert (group.lag, group.lag_source) == (1_000, "lower-bound")
    monkeypatch.setattr(defaults, "EXPORTER_LAG_COUNT_CAP", 4_996)  # exactly the lag: still exact
    group = snapshot(redis_client, settings).streams[0].groups[0]
    assert (group.lag, group.lag_source) == (4_996, "computed")


def test_a_null_lag_behind_every_entry_is_the_stream_length(redis_client: redis.Redis, settings: Settings) -> None:
    stream = _null_lag_stream(redis_client, 30, payload=10)
    # Trimmed past the group's position: every entry left is unread.
    redis_client.xtrim(stream, maxlen=20, approximate=False)
    assert redis_client.xinfo_groups(stream)[0]["lag"] is None
    group = snapshot(redis_client, settings).streams[0].groups[0]
    assert (group.lag, group.lag_source) == (20, "computed")

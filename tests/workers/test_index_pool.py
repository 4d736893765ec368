"""The index pool: points and agent deltas (pure; the rules are `workers.assessment`), then the RQ job on real Redis."""

from __future__ import annotations

import base64
import gc
import json
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis
from rq import Retry

from contracts import Minute, decode_minute, encode_minute, keys
from contracts.memory import SearchFilters
from pvm import defaults, engines
from pvm.config import Settings
from pvm.metrics import FRESHNESS_BUCKETS, read_histogram
from pvm.protocols import Candidate, MemoryPoint
from pvm.stores.agent_memory import AgentMemoryStore
from pvm.stores.cache import CachedMinute, MinuteCache
from pvm.stores.log import LogReader, LogWriter
from tests.workers.minutes import T0, T0_S, VECTORS, golden, minute
from workers import index_pool
from workers.assessment import insights, timestamp_ms
from workers.index_pool import LoggedMinute, agent_updates, build_points, lexical_text
from workers.queues import pool_queue
from workers.runner import PvmWorker

# -- lexical text and points ------------------------------------------------------


def test_lexical_text_holds_what_a_search_would_name() -> None:
    text = lexical_text(golden("conflict_resolved_with_references"))
    for word in ("conflict resolved", "arbiter", "T-1042", "file lock", "rebases after merge"):
        assert word in text
    assigned = lexical_text(golden("task_assigned_full"))
    for word in ("task assigned", "planner-1", "migration specialist", "lowest queue depth", "builder-2"):
        assert word in assigned
    failed = lexical_text(golden("task_failed_zero_score"))
    assert "timeout after 900s" in failed and "task failed" in failed


def test_build_points_payload_shape() -> None:
    m = golden("task_assigned_full")
    other = minute("message", n=2, project_id="p2", memory_note="hi")
    points = build_points([LoggedMinute(41, m), LoggedMinute(42, m), LoggedMinute(7, other)], now=T0_S)
    assert [p.minute_id for p in points] == [m.id, other.id]  # the repeat is dropped
    point = points[0]
    assert point.project_id == "alpha" and point.dense is None
    assert point.text == lexical_text(m)
    assert set(point.payload) == {
        "project_id",
        "minute_id",
        "agent_id",
        "event_type",
        "category",
        "timestamp_ms",
        "task_id",
        "thread_id",
        "insights",
        "scores",
        "minute",
        "seq",
    }
    p = point.payload
    assert (p["project_id"], p["minute_id"], p["agent_id"], p["event_type"]) == (
        "alpha",
        m.id,
        "planner-1",
        "task_assigned",
    )
    assert (p["category"], p["task_id"], p["thread_id"], p["seq"]) == ("task_assignment", "T-1042", "thread-7", 41)
    assert isinstance(p["timestamp_ms"], int) and p["timestamp_ms"] == timestamp_ms(m)
    assert p["minute"] == m.to_dict()
    assert p["insights"] == [i.to_dict() for i in insights(m)]
    assert set(p["scores"]) == {"recency", "relevance", "accuracy", "impact", "composite"}
    # The payload crosses process boundaries: plain msgpack and JSON types only.
    assert msgpack.unpackb(msgpack.packb(p)) == p
    json.dumps(p)
    assert points[1].payload["task_id"] is None and points[1].payload["agent_id"] == "a1"


def _golden_batch() -> dict[str, Any]:
    """Minutes (bench-like sessions plus edge cases) and what the index pool made of them before a speed-up.

    Written by the code as it was (`tests/pvm/data/index_golden.json`): a change that alters a stored payload, a
    point id, a lexical text or an agent-memory write fails here, however fast it is.
    """
    return json.loads((Path(__file__).resolve().parents[1] / "pvm" / "data" / "index_golden.json").read_text())


def test_points_and_agent_memory_writes_are_unchanged() -> None:
    from pvm.vectors import point_id
    from pvm.vectors.edge import _pack

    golden_batch = _golden_batch()
    records = [[m, seq, base64.b64decode(raw)] for m, seq, raw in golden_batch["records"]]
    logged, bad = index_pool.decode(records)
    assert bad == []
    logged = index_pool._unique(logged)
    points = index_pool._points(logged, golden_batch["now"])
    assert len(points) == len(golden_batch["points"])
    for point, expected in zip(points, golden_batch["points"], strict=True):
        assert (point.minute_id, point.project_id, point.text) == (
            expected["minute_id"],
            expected["project_id"],
            expected["text"],
        )
        assert str(point_id(point.project_id, point.minute_id)) == expected["point_id"]
        assert _pack(point) == expected["stored"]  # every payload value: `_msgpack` holds the rest, byte for byte

    deltas = index_pool._deltas(logged)
    assert [
        {f: list(v) if isinstance(v, tuple) else v for f in d.__slots__ for v in [getattr(d, f)]} for d in deltas
    ] == golden_batch["deltas"]

    calls: list[tuple[list[str], list[Any]]] = []

    class Connection:
        def register_script(self, _: str) -> Any:
            return lambda keys, args, client: calls.append((keys, args))

        def pipeline(self, transaction: bool) -> Any:
            class Pipeline:
                def execute(self) -> list[int]:
                    return [0] * len(calls)

            return Pipeline()

    AgentMemoryStore(Connection()).apply(deltas)  # type: ignore[arg-type]
    assert [
        {"keys": k, "args": [a if isinstance(a, int) else base64.b64encode(a).decode() for a in args]}
        for k, args in calls
    ] == golden_batch["agent_memory_calls"]


# -- decode -----------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(VECTORS.glob("*.msgpack")), ids=lambda p: p.stem)
def test_decode_reads_durable_minutes_as_the_strict_decoder_does(path: Path) -> None:
    raw = path.read_bytes()
    [logged], bad = index_pool.decode([["x", 9, raw]])
    assert bad == [] and logged.seq == 9
    assert logged.minute == decode_minute(raw)
    assert logged.at_ms == timestamp_ms(logged.minute)


def test_decode_skips_records_that_would_break_the_batch() -> None:
    good = golden("task_assigned_full")
    body = {"v": 1, **good.to_dict()}

    def packed(**changes: Any) -> bytes:
        return msgpack.packb({k: v for k, v in {**body, **changes}.items() if v is not ...})

    broken = [
        ["junk", 1, b"\xc1 not msgpack"],
        ["list", 2, msgpack.packb([1, 2])],
        ["version", 3, packed(v=2)],
        ["unknown-field", 4, packed(colour="red")],
        ["no-project", 5, packed(project_id=...)],
        ["bad-project", 6, packed(project_id="../etc")],
        ["bad-time", 7, packed(timestamp="yesterday")],
        ["data-list", 8, packed(data=[1])],
    ]
    logged, bad = index_pool.decode([*broken, [good.id, 9, encode_minute(good)]])
    assert bad == [r[0] for r in broken]
    assert [r.minute for r in logged] == [good]


def test_a_logged_minute_works_out_its_time_when_not_given() -> None:
    m = golden("task_failed_zero_score")
    assert LoggedMinute(1, m).at_ms == timestamp_ms(m) == LoggedMinute(1, m, timestamp_ms(m)).at_ms


# -- agent deltas -----------------------------------------------------------------


def test_agent_updates() -> None:
    records = [
        LoggedMinute(1, golden("task_assigned_full")),  # planner-1 assigns T-1042 to builder-2
        LoggedMinute(
            2, minute("task_completed", 2, agent_id="builder-2", data={"task_id": "db-7", "success_criteria_met": 90})
        ),
        LoggedMinute(3, golden("task_failed_zero_score")),
        LoggedMinute(4, minute("capability_observed", 4, data={"capability": "Rust"})),
        LoggedMinute(5, minute("message", 5, agent_id=None)),
        LoggedMinute(1, golden("task_assigned_full")),  # repeated in the batch
    ]
    by = {(d.seq, d.agent_id): d for d in agent_updates(records)}
    assert sorted(by) == [(1, "builder-2"), (1, "planner-1"), (2, "builder-2"), (3, "builder-5"), (4, "a1")]
    assert by[(1, "builder-2")].assigned == 1 and by[(1, "builder-2")].active_ms is None
    assert by[(1, "planner-1")].assigned == 0 and by[(1, "planner-1")].active_at == "2026-11-26T10:01:30.250000Z"
    done = by[(2, "builder-2")]
    assert (done.completed, done.success, done.capabilities) == (1, 90.0, ("db",))
    failed = by[(3, "builder-5")]
    assert (failed.failed, failed.success, failed.capabilities) == (1, 0.0, ())
    assert by[(4, "a1")].capabilities == ("rust",)
    assert all(d.project_id in ("alpha", "p1") for d in by.values())


# -- the RQ job -------------------------------------------------------------------


class RecordingEngine:
    """A vector engine double: keeps upserted points by (project, minute id), so a re-upsert replaces."""

    def __init__(self) -> None:
        self.points: dict[tuple[str, str], MemoryPoint] = {}
        self.upserts = 0

    def upsert(self, points: Sequence[MemoryPoint]) -> None:
        self.upserts += 1
        self.points.update(((p.project_id, p.minute_id), p) for p in points)

    def query(self, project_id: str, text: str, dense: Any, filters: SearchFilters, limit: int) -> list[Candidate]:
        raise NotImplementedError

    def retrieve(self, project_id: str, minute_ids: Sequence[str]) -> list[Candidate]:
        raise NotImplementedError

    def count(self, project_id: str) -> int:
        return sum(p.project_id == project_id for p in self.points.values())

    def delete_project(self, project_id: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


@pytest.fixture
def engine(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingEngine]:
    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    recording = RecordingEngine()
    monkeypatch.setattr(engines, "make_engine", lambda _settings, _dims: recording)
    index_pool._context.cache_clear()
    index_pool.close_engine()
    yield recording
    index_pool._context.cache_clear()
    index_pool.close_engine()


def records(minutes: Sequence[Minute], first_seq: int = 1, entry_ms: int | None = None) -> list[list[object]]:
    """Index job records; with `entry_ms`, each carries that stream entry time as the log pool's fan-out does."""
    if entry_ms is None:
        return [[m.id, first_seq + i, encode_minute(m)] for i, m in enumerate(minutes)]
    return [[m.id, first_seq + i, encode_minute(m), entry_ms] for i, m in enumerate(minutes)]


def session(project: str = "p1") -> list[Minute]:
    return [
        minute("task_assigned", 0, project_id=project, agent_id="planner", data={"task_id": "db-1", "assignee": "b1"}),
        minute(
            "task_completed", 1, project_id=project, agent_id="b1", data={"task_id": "db-1", "success_criteria_met": 80}
        ),
        minute("task_assigned", 2, project_id=project, agent_id="planner", data={"task_id": "api-2", "assignee": "b1"}),
        minute(
            "task_failed", 3, project_id=project, agent_id="b1", data={"task_id": "api-2", "success_criteria_met": 20}
        ),
        minute("message", 4, project_id=project, agent_id="b2", memory_note="on it"),
    ]


def work(connection: redis.Redis, *pools: str) -> None:
    PvmWorker([pool_queue(p, connection) for p in pools], connection).work(burst=True)


def test_a_batch_becomes_points_agent_memory_and_an_index_head(
    redis_client: redis.Redis, engine: RecordingEngine
) -> None:
    batch = records(session())
    queue = pool_queue("index", redis_client)
    assert queue.name == "pvm-index"
    job = queue.enqueue(keys.INDEX_JOB, batch)
    work(redis_client, "index")
    assert job.get_status() == "finished", job.latest_result()
    result = job.return_value()
    assert result["indexed"] == 5 and result["agent_minutes_counted"] == 5 and result["projects"] == ["p1"]
    assert sorted(engine.points) == [("p1", f"id{i:05d}") for i in range(5)]
    assert engine.points[("p1", "id00003")].payload["category"] == "failure_pattern"

    memory = AgentMemoryStore(redis_client)
    b1 = memory.get("p1", "b1")
    assert (b1.tasks_assigned, b1.tasks_completed, b1.tasks_failed, b1.mean_success) == (2, 1, 1, 50.0)
    assert b1.capabilities == ("db",)
    assert memory.agents("p1") == ["b1", "b2", "planner"]
    head = {k.decode(): v.decode() for k, v in redis_client.hgetall(keys.index_head("p1")).items()}
    assert (head["seq"], head["max_seq"], head["gaps"]) == ("5", "5", "0") and float(head["indexed_at"]) > 0

    # The same batch again (a retry, a redelivery, a replay): nothing counts twice, the head stays.
    again = queue.enqueue(keys.INDEX_JOB, batch[::-1])
    work(redis_client, "index")
    assert again.return_value()["agent_minutes_counted"] == 0
    assert memory.get("p1", "b1") == b1
    assert redis_client.hget(keys.index_head("p1"), "indexed_at").decode() == head["indexed_at"]
    assert len(engine.points) == 5 and engine.upserts == 2


def test_index_batch_reports_each_step_when_asked(redis_client: redis.Redis, engine: RecordingEngine) -> None:
    ctx = index_pool.IndexContext.build(redis_client, Settings.from_env())
    timings: dict[str, float] = {}
    result = index_pool.index_batch(ctx, redis_client, records(session()), timings=timings)
    assert result["indexed"] == 5 and result["agent_minutes_counted"] == 5
    assert list(timings) == list(index_pool.STEPS) and all(t >= 0 for t in timings.values())
    index_pool.index_batch(ctx, redis_client, records(session()), timings=timings)  # adds up over batches
    assert engine.upserts == 2
    assert gc.isenabled()  # paused for the batch only


def test_a_failing_batch_leaves_the_garbage_collector_on(redis_client: redis.Redis, engine: RecordingEngine) -> None:
    def fail(points: Sequence[MemoryPoint]) -> None:
        raise ConnectionError("vector store down")

    engine.upsert = fail  # type: ignore[method-assign]
    ctx = index_pool.IndexContext.build(redis_client, Settings.from_env())
    with pytest.raises(ConnectionError):
        index_pool.index_batch(ctx, redis_client, records(session()))
    assert gc.isenabled()


def hash_of(connection: redis.Redis, key: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in connection.hgetall(key).items()}


def test_a_batch_records_its_metrics(redis_client: redis.Redis, engine: RecordingEngine) -> None:
    ctx = index_pool.IndexContext.build(redis_client, Settings.from_env())
    now_ms = int(time.time() * 1000)
    index_pool.index_batch(ctx, redis_client, records(session(), entry_ms=now_ms))
    stage = hash_of(redis_client, keys.metrics_stage("index"))
    assert (stage["minutes"], stage["batches"]) == ("5", "1")
    assert hash_of(redis_client, keys.metrics_stage_duration("index"))["count"] == "1"
    assert hash_of(redis_client, keys.metrics_freshness("indexed"))["count"] == "5"
    index_pool.index_batch(ctx, redis_client, records(session(), entry_ms=now_ms))  # not fresh again
    assert hash_of(redis_client, keys.metrics_stage("index"))["batches"] == "2"
    assert hash_of(redis_client, keys.metrics_freshness("indexed"))["count"] == "5"


@pytest.mark.parametrize(
    "broken",
    [keys.metrics_stage("index"), keys.metrics_stage_duration("index"), keys.metrics_freshness("indexed")],
)
def test_metrics_that_fail_to_record_do_not_fail_the_batch(
    redis_client: redis.Redis, engine: RecordingEngine, broken: str, caplog: pytest.LogCaptureFixture
) -> None:
    redis_client.set(broken, "not a hash")  # every write to it fails (WRONGTYPE)
    ctx = index_pool.IndexContext.build(redis_client, Settings.from_env())
    result = index_pool.index_batch(ctx, redis_client, records(session(), entry_ms=int(time.time() * 1000)))
    assert result["indexed"] == 5
    assert redis_client.hget(keys.index_head("p1"), "seq") == b"5"
    assert "metrics not recorded" in caplog.text


def test_a_head_that_fails_to_advance_fails_the_batch(redis_client: redis.Redis, engine: RecordingEngine) -> None:
    redis_client.set(keys.index_head("p1"), "not a hash")
    ctx = index_pool.IndexContext.build(redis_client, Settings.from_env())
    with pytest.raises(redis.exceptions.ResponseError):
        index_pool.index_batch(ctx, redis_client, records(session()))
    assert hash_of(redis_client, keys.metrics_stage("index"))["batches"] == "1"  # sent alongside, still counted


def test_a_failing_batch_counts_its_failure_even_when_metrics_fail(
    redis_client: redis.Redis, engine: RecordingEngine
) -> None:
    def fail(points: Sequence[MemoryPoint]) -> None:
        raise ConnectionError("vector store down")

    engine.upsert = fail  # type: ignore[method-assign]
    ctx = index_pool.IndexContext.build(redis_client, Settings.from_env())
    with pytest.raises(ConnectionError):  # the batch's own error, not the metrics'
        index_pool.index_batch(ctx, redis_client, records(session()))
    assert hash_of(redis_client, keys.metrics_stage("index"))["failures"] == "5"
    redis_client.set(keys.metrics_stage("index"), "not a hash")
    with pytest.raises(ConnectionError):
        index_pool.index_batch(ctx, redis_client, records(session()))


def test_an_older_batch_indexed_late_does_not_move_the_head_back(
    redis_client: redis.Redis, engine: RecordingEngine
) -> None:
    batch = records(session())
    queue = pool_queue("index", redis_client)
    queue.enqueue(keys.INDEX_JOB, batch[3:])
    queue.enqueue(keys.INDEX_JOB, batch[:3])
    work(redis_client, "index")
    assert redis_client.hget(keys.index_head("p1"), "seq") == b"5"
    assert AgentMemoryStore(redis_client).get("p1", "b1").tasks_assigned == 2


def test_an_undecodable_record_is_skipped_and_its_neighbours_indexed(
    redis_client: redis.Redis, engine: RecordingEngine
) -> None:
    batch = records(session())
    batch[2] = ["broken", 3, b"\xc1 not msgpack"]
    job = pool_queue("index", redis_client).enqueue(keys.INDEX_JOB, batch)
    work(redis_client, "index")
    assert job.return_value()["undecodable"] == ["broken"]
    assert len(engine.points) == 4


def test_projects_stay_apart(redis_client: redis.Redis, engine: RecordingEngine) -> None:
    queue = pool_queue("index", redis_client)
    queue.enqueue(keys.INDEX_JOB, records(session("alpha")) + records(session("beta")[:2]))
    work(redis_client, "index")
    memory = AgentMemoryStore(redis_client)
    assert memory.get("alpha", "b1").tasks_failed == 1
    assert memory.get("beta", "b1").tasks_failed == 0
    assert redis_client.hget(keys.index_head("alpha"), "seq") == b"5"
    assert redis_client.hget(keys.index_head("beta"), "seq") == b"2"
    assert engine.count("alpha") == 5 and engine.count("beta") == 2


def test_the_log_pool_feeds_the_index_pool(
    redis_client: redis.Redis, settings: Settings, engine: RecordingEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers import log_pool

    for k, v in settings.with_(downstream=("index",)).to_env().items():
        monkeypatch.setenv(k, v)
    log_pool._context.cache_clear()
    minutes = session()
    pool_queue("log", redis_client).enqueue(
        keys.LOG_JOB, [[f"{100 + i}-0", encode_minute(m)] for i, m in enumerate(minutes)]
    )
    work(redis_client, "log", "index")
    log_pool._context.cache_clear()
    log_head = MinuteCache(redis_client).head("p1")
    assert redis_client.hget(keys.index_head("p1"), "seq").decode() == log_head["seq"] == "5"
    assert {p.payload["seq"] for p in engine.points.values()} == {1, 2, 3, 4, 5}
    assert AgentMemoryStore(redis_client).get("p1", "b1").tasks_completed == 1


def test_the_embedded_engine_indexes_the_batch(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pvm.vectors.edge import EdgeEngine

    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    index_pool._context.cache_clear()
    index_pool.close_engine()
    try:
        queue = pool_queue("index", redis_client)
        batch = records(session("alpha")) + records(session("beta")[:2])
        queue.enqueue(keys.INDEX_JOB, batch)
        queue.enqueue(keys.INDEX_JOB, batch)  # re-indexed: overwrites, never duplicates
        work(redis_client, "index")
        engine = engines.shared_engine(Settings.from_env())
        assert isinstance(engine, EdgeEngine) and engine.path == settings.home / "var/qdrant"
        assert (engine.count("alpha"), engine.count("beta")) == (5, 2)
        found = engine.query("alpha", "task failed api", None, SearchFilters(), 3)
        assert found and found[0].minute_id == "id00003"
        assert found[0].payload["insights"][0]["finding"] == "task api-2 met 20% of its success criteria"
        assert all(c.payload["project_id"] == "alpha" for c in found)
    finally:
        index_pool._context.cache_clear()
        index_pool.close_engine()


# -- the index head: a contiguous watermark ---------------------------------------


def numbered(n: int, project: str = "p1") -> list[Minute]:
    return [minute("message", i, project_id=project, memory_note=f"note {i}") for i in range(1, n + 1)]


def test_the_index_head_is_a_contiguous_watermark(redis_client: redis.Redis, engine: RecordingEngine) -> None:
    batch = records(numbered(10))  # seqs 1..10
    ctx = index_pool.IndexContext.build(redis_client, Settings.from_env())
    index_pool.index_batch(ctx, redis_client, batch[:4] + batch[5:])  # all but seq 5
    head = hash_of(redis_client, keys.index_head("p1"))
    assert (head["seq"], head["max_seq"], head["gaps"]) == ("4", "10", "1")
    index_pool.index_batch(ctx, redis_client, batch[4:5])  # seq 5 at last
    head = hash_of(redis_client, keys.index_head("p1"))
    assert (head["seq"], head["max_seq"], head["gaps"]) == ("10", "10", "0")


def test_the_reader_shows_a_gap_below_the_index_head_as_a_gap(
    redis_client: redis.Redis, settings: Settings, engine: RecordingEngine
) -> None:
    from pvm.reader import ContextReader

    minutes = numbered(10)
    MinuteCache(redis_client).update(
        "p1", [CachedMinute(m.id, i + 1, encode_minute(m), m.agent_id) for i, m in enumerate(minutes)], T0_S
    )
    batch = records(minutes)
    ctx = index_pool.IndexContext.build(redis_client, Settings.from_env())
    index_pool.index_batch(ctx, redis_client, batch[:2] + batch[3:])  # seq 3 missing
    index = ContextReader(redis_client, LogReader(settings.log_dir)).freshness("p1")["index"]
    assert (index["seq"], index["max_seq"], index["gaps"], index["behind"]) == (2, 10, 1, 1)
    index_pool.index_batch(ctx, redis_client, batch[2:3])
    index = ContextReader(redis_client, LogReader(settings.log_dir)).freshness("p1")["index"]
    assert (index["seq"], index["max_seq"], index["gaps"], index["behind"]) == (10, 10, 0, 0)


def test_a_head_written_as_a_high_water_mark_stays_and_moves_on_from_there(
    redis_client: redis.Redis, engine: RecordingEngine
) -> None:
    # An index head written before the watermark (no bitmap): taken as it is, and advanced contiguously above it.
    redis_client.hset(keys.index_head("p1"), mapping={"id": "id00006", "seq": 6, "indexed_at": 1.0})
    batch = records(numbered(10))
    ctx = index_pool.IndexContext.build(redis_client, Settings.from_env())
    index_pool.index_batch(ctx, redis_client, batch[7:])  # 8..10
    assert hash_of(redis_client, keys.index_head("p1"))["seq"] == "6"
    index_pool.index_batch(ctx, redis_client, batch[6:7])  # 7
    head = hash_of(redis_client, keys.index_head("p1"))
    assert (head["seq"], head["gaps"]) == ("10", "0") and "id" not in head


# -- freshness --------------------------------------------------------------------


def test_index_freshness_is_measured_from_the_stream_entry_not_the_producer_clock(
    redis_client: redis.Redis, engine: RecordingEngine
) -> None:
    # The producer's clock is a day behind (T0 is far from now); the stream entry was made just now.
    ctx = index_pool.IndexContext.build(redis_client, Settings.from_env())
    index_pool.index_batch(ctx, redis_client, records(session(), entry_ms=int(time.time() * 1000)))
    h = read_histogram(redis_client.hgetall(keys.metrics_freshness("indexed")), FRESHNESS_BUCKETS)
    assert h.count == 5 and dict(h.buckets)["30.0"] == 5  # p99 within seconds, not +Inf
    assert engine.points[("p1", "id00001")].payload["minute"]["timestamp"] == T0  # the producer's time kept as data


def test_records_without_a_stream_time_are_indexed_and_not_counted_as_fresh(
    redis_client: redis.Redis, engine: RecordingEngine
) -> None:
    # Jobs queued before records carried the entry time, and rebuilds from the log (replay): indexed, but
    # an old minute re-indexed now is not "fresh" and would only bury the histogram's tail.
    ctx = index_pool.IndexContext.build(redis_client, Settings.from_env())
    result = index_pool.index_batch(ctx, redis_client, records(session()))
    assert result["indexed"] == 5 and redis_client.hget(keys.index_head("p1"), "seq") == b"5"
    assert not redis_client.exists(keys.metrics_freshness("indexed"))


# -- crash-safe shards: one project's failure is its own --------------------------


@pytest.fixture
def edge_settings(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """The pool's settings in the environment, with the real embedded engine (opened on first use, closed after)."""
    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    index_pool._context.cache_clear()
    index_pool.close_engine()
    yield settings
    index_pool._context.cache_clear()
    index_pool.close_engine()


def test_one_projects_engine_error_fails_only_that_project_and_the_retry_redoes_only_it(
    redis_client: redis.Redis, edge_settings: Settings
) -> None:
    vectors = edge_settings.home / defaults.VECTOR_DIR
    vectors.mkdir(parents=True)
    (vectors / "beta").write_text("a file where beta's shard belongs")  # the engine cannot create beta's shard
    queue = pool_queue("index", redis_client)
    job = queue.enqueue(keys.INDEX_JOB, records(session("alpha")) + records(session("beta")[:2]), retry=Retry(max=1))
    work(redis_client, "index")  # the first attempt and its retry
    assert job.get_status(refresh=True) == "failed"
    assert "beta" in (job.latest_result().exc_string or "")  # type: ignore[union-attr]
    alpha = hash_of(redis_client, keys.index_head("alpha"))
    assert alpha["seq"] == "5" and not redis_client.exists(keys.index_head("beta"))
    assert job.get_meta(refresh=True)["indexed_projects"] == ["alpha"]
    engine = engines.shared_engine(Settings.from_env())
    assert engine.count("alpha") == 5

    (vectors / "beta").unlink()
    job.requeue()
    work(redis_client, "index")
    assert job.get_status(refresh=True) == "finished"
    assert job.return_value()["projects"] == ["beta"]  # alpha was not indexed again
    assert hash_of(redis_client, keys.index_head("alpha"))["indexed_at"] == alpha["indexed_at"]
    assert redis_client.hget(keys.index_head("beta"), "seq") == b"2" and engine.count("beta") == 2


def test_a_shard_that_does_not_load_is_rebuilt_from_the_log(redis_client: redis.Redis, edge_settings: Settings) -> None:
    beta = numbered(6, "beta")
    LogWriter(edge_settings.log_dir).append(
        "beta", [(m.id, f"{i + 1}-0", encode_minute(m)) for i, m in enumerate(beta)]
    )
    ctx = index_pool.IndexContext.build(redis_client, Settings.from_env())
    index_pool.index_batch(ctx, redis_client, records(beta[:5]))
    index_pool.close_engine()
    # The shard is lost the way an older version lost it (killed while creating it); its head still says 5.
    vectors = edge_settings.home / defaults.VECTOR_DIR
    shutil.rmtree(vectors / "beta")
    (vectors / "beta" / "segments").mkdir(parents=True)
    assert redis_client.hget(keys.index_head("beta"), "seq") == b"5"

    index_pool.index_batch(ctx, redis_client, records(numbered(3, "alpha")) + records(beta[5:], first_seq=6))
    head = hash_of(redis_client, keys.index_head("beta"))
    assert (head["seq"], head["max_seq"], head["gaps"]) == ("0", "6", "5")  # a gap, not "caught up"
    assert hash_of(redis_client, keys.index_head("alpha"))["seq"] == "3"
    assert [p.name for p in vectors.iterdir() if p.name.startswith(".broken-reindexed-")]  # kept for forensics

    work(redis_client, "index")  # the rebuild the pool queued from the log
    head = hash_of(redis_client, keys.index_head("beta"))
    assert (head["seq"], head["gaps"]) == ("6", "0")
    engine = engines.shared_engine(Settings.from_env())
    assert engine.count("beta") == 6 and engine.broken_projects() == []  # type: ignore[attr-defined]
    found = engine.query("beta", "note 2", None, SearchFilters(), 10)
    assert "id00002" in [c.minute_id for c in found]


def test_only_minutes_indexed_for_the_first_time_count_as_fresh(
    redis_client: redis.Redis, engine: RecordingEngine
) -> None:
    batch = records(numbered(10), entry_ms=int(time.time() * 1000))
    ctx = index_pool.IndexContext.build(redis_client, Settings.from_env())
    index_pool.index_batch(ctx, redis_client, batch[2:5])  # 3..5
    index_pool.index_batch(ctx, redis_client, [batch[8], *batch[:4], batch[9], batch[6]])  # 9, 1..4, 10, 7
    assert hash_of(redis_client, keys.metrics_freshness("indexed"))["count"] == str(3 + 5)  # 1, 2, 7, 9, 10 new
    head = hash_of(redis_client, keys.index_head("p1"))
    assert (head["seq"], head["max_seq"], head["gaps"]) == ("5", "10", "2")  # 6 and 8 missing
    index_pool.index_batch(ctx, redis_client, batch)
    assert hash_of(redis_client, keys.metrics_freshness("indexed"))["count"] == "10"
    assert hash_of(redis_client, keys.index_head("p1"))["seq"] == "10"


def test_long_runs_of_seqs_mark_every_bit(redis_client: redis.Redis, engine: RecordingEngine) -> None:
    batch = records(numbered(150), entry_ms=int(time.time() * 1000))
    ctx = index_pool.IndexContext.build(redis_client, Settings.from_env())
    index_pool.index_batch(ctx, redis_client, batch[40:45])  # 41..45
    index_pool.index_batch(ctx, redis_client, batch[:100])  # 1..100: a run over several 32-bit fields
    assert [redis_client.getbit(keys.index_done("p1"), seq) for seq in range(102)] == [0] + [1] * 100 + [0]
    assert hash_of(redis_client, keys.metrics_freshness("indexed"))["count"] == "100"
    index_pool.index_batch(ctx, redis_client, batch[100:])
    assert hash_of(redis_client, keys.index_head("p1"))["seq"] == "150"

"""The index pool: points and agent deltas (pure; rules: `workers.rules.assessment`), then the RQ job on real Redis."""

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
from contracts import fact_changes as fc
from contracts.facts import GLOBAL_KEY, Fact, FactStatus, TierKey
from contracts.memory import SearchFilters
from pvm import defaults, engines
from pvm.config import Settings
from pvm.metrics import FRESHNESS_BUCKETS, read_histogram
from pvm.protocols import Candidate, MemoryPoint
from pvm.stores.agent_memory import AgentMemoryStore
from pvm.stores.cache import CachedMinute, MinuteCache
from pvm.stores.facts import FactStore, time_ms
from pvm.stores.log import LogReader, LogWriter
from pvm.vectors import GLOBAL_TENANT, OPEN_MS
from tests.workers.minutes import T0_S, VECTORS, golden, minute
from workers.index import fact_points
from workers.index import pool as index_pool
from workers.index.pool import LoggedMinute, agent_updates, build_points, dense_text, lexical_text
from workers.rules.assessment import insights, timestamp_ms
from workers.runtime.queues import pool_queue
from workers.runtime.runner import PvmWorker

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
        "seq",
    }  # not the minute itself: a hit reads it from the Redis cache or the log (`pvm.stores.minutes`)
    p = point.payload
    assert (p["project_id"], p["minute_id"], p["agent_id"], p["event_type"]) == (
        "alpha",
        m.id,
        "planner-1",
        "task_assigned",
    )
    assert (p["category"], p["task_id"], p["thread_id"], p["seq"]) == ("task_assignment", "T-1042", "thread-7", 41)
    assert isinstance(p["timestamp_ms"], int) and p["timestamp_ms"] == timestamp_ms(m)
    assert p["insights"] == [i.to_dict() for i in insights(m)]
    assert set(p["scores"]) == {"recency", "relevance", "accuracy", "impact", "composite"}
    # The payload crosses process boundaries: plain msgpack and JSON types only.
    assert msgpack.unpackb(msgpack.packb(p)) == p
    json.dumps(p)
    assert points[1].payload["task_id"] is None and points[1].payload["agent_id"] == "a1"


def test_the_dense_leg_embeds_the_minutes_own_words_not_its_type_or_agent() -> None:
    m = golden("task_assigned_full")
    [point] = build_points([LoggedMinute(1, m)], now=T0_S)
    assert (
        point.embed_text
        == dense_text(m)
        == (
            "Assigned T-1042 to builder-2 (migration specialist). "
            "builder-2 has the lowest queue depth and passed the last 3 schema-migration tasks"
        )
    )
    assert "task assigned" not in point.embed_text and "planner-1" not in point.embed_text
    assert point.text == lexical_text(m)  # the lexical leg keeps the type, agent and task words
    failed = dense_text(golden("task_failed_zero_score"))
    assert "timeout after 900s" in failed and "task failed" not in failed
    # A minute with no words of its own embeds its lexical text rather than nothing.
    bare = minute("task_started", n=3, data={"task_id": "T-9"})
    assert dense_text(bare) == lexical_text(bare) != ""


def test_the_index_pool_embeds_dense_text_and_a_rebuild_embeds_the_same(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pvm.vectors.edge import EdgeEngine

    calls: list[str] = []

    class Embedder:
        dimensions = 4
        stats = type("Stats", (), {"input_tokens": 0})()

        def embed(self, texts: Sequence[str]) -> list[list[float]]:
            calls.extend(texts)
            return [[1.0, float(len(t) % 7), 0.0, 0.5] for t in texts]

    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    edge = EdgeEngine(settings.home / "var" / "dense", dense_dimensions=4)
    monkeypatch.setattr(engines, "shared", lambda _settings: (edge, Embedder()))
    try:
        m = golden("task_assigned_full")
        index(redis_client, [m])
        index(redis_client, [m])  # a replay of the same minute embeds the same text
        assert calls == [dense_text(m), dense_text(m)]
        assert [c.minute_id for c in edge.retrieve("alpha", [m.id])] == [m.id]
    finally:
        edge.close()


def _golden_batch() -> dict[str, Any]:
    """Minutes (bench-like sessions plus edge cases) and what the index pool made of them before a speed-up.

    Written by the code as it was (`tests/pvm/data/index_golden.json`): a change that alters a stored payload, a
    point id, a lexical text or an agent-memory write fails here, however fast it is.
    """
    return json.loads((Path(__file__).resolve().parents[2] / "pvm" / "data" / "index_golden.json").read_text())


def test_points_and_agent_memory_writes_are_unchanged() -> None:
    from pvm.vectors import point_id
    from pvm.vectors.edge import _pack, _unpack

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
        # Every payload value as it was, less the minute itself (points are light now: hits read it from the log).
        assert _unpack(_pack(point)) == {k: v for k, v in _unpack(expected["stored"]).items() if k != "minute"}
        assert "minute" in _unpack(expected["stored"]) and "minute" not in point.payload

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
    index_pool.close_engine()
    yield recording
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

    for k, v in settings.with_(downstream=("index",)).to_env().items():
        monkeypatch.setenv(k, v)
    minutes = session()
    pool_queue("log", redis_client).enqueue(
        keys.LOG_JOB, [[f"{100 + i}-0", encode_minute(m)] for i, m in enumerate(minutes)]
    )
    work(redis_client, "log", "index")
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
    # the producer's time kept as data
    assert engine.points[("p1", "id00001")].payload["timestamp_ms"] == timestamp_ms(session()[0])


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
    index_pool.close_engine()
    yield settings
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


# -- fact points: knowledge changes folded into each fact's own point (issue 10, item 5) --------------------------

DAY1, DAY2, DAY3 = "2026-09-01T10:00:00Z", "2026-09-02T10:00:00Z", "2026-09-03T10:00:00Z"
SOURCE = "01J0000000000000000000SRC1"


def a_fact(project: str = "alpha", value: str = "30 minutes", *, task: str | None = None, **fields: Any) -> Fact:
    tier_key = TierKey.for_task(project, task) if task else TierKey.for_project(project)
    fields.setdefault("valid_from", DAY1)
    fields.setdefault("recorded_at", fields["valid_from"])
    return Fact.new(
        type=fields.pop("type", "decision"),
        text=f"auth sessions last {value}",
        subject="service:auth",
        attribute="session_ttl",
        value=value,
        tier_key=tier_key,
        confidence=0.8,
        source_minute_ids=(SOURCE,),
        **fields,
    )


@pytest.fixture(params=["edge", "server"])
def fact_engine(request: pytest.FixtureRequest, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The pool's real engine: the embedded one from the settings, or the server engine on qdrant-client local mode."""
    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    if request.param == "server":
        from qdrant_client import QdrantClient

        from pvm.vectors.server import ServerEngine

        server = ServerEngine(QdrantClient(":memory:"))
        monkeypatch.setattr(engines, "make_engine", lambda _settings, _dims: server)
    index_pool.close_engine()
    yield engines.shared_engine(Settings.from_env())
    index_pool.close_engine()


def index(connection: redis.Redis, minutes: Sequence[Minute], first_seq: int = 1) -> dict[str, Any]:
    ctx = index_pool.IndexContext.build(connection, Settings.from_env())
    return index_pool.index_batch(ctx, connection, records(minutes, first_seq))


def stored_fact(engine: Any, fact_id: str, tenant: str = "alpha") -> dict[str, Any]:
    [point] = engine.get_points(tenant, [fact_id])
    return dict(point.payload)


def test_knowledge_changes_make_and_update_fact_points(redis_client: redis.Redis, fact_engine: Any) -> None:
    old = a_fact()
    new = a_fact(value="15 minutes", valid_from=DAY2)
    batch = [
        fc.asserted_minute(old, timestamp=DAY1),
        fc.promoted_minute(old, timestamp=DAY1),
        fc.asserted_minute(new, timestamp=DAY2),
        fc.superseded_minute(old, new, timestamp=DAY2),
        fc.promoted_minute(new, timestamp=DAY2),
        minute("message", 1, project_id="alpha", memory_note="sessions feel short"),
    ]
    result = index(redis_client, batch)
    # Knowledge changes are minutes of the log, counted by the head; each is its fact's point, not a minute point
    # of its own (that would repeat the fact in searches for minutes).
    assert result["indexed"] == 1 and result["fact_changes"] == 5 and result["unparsed_fact_changes"] == []
    assert redis_client.hget(keys.index_head("alpha"), "seq") == b"6"
    assert fact_engine.count("alpha") == 1 and fact_engine.count("alpha", "fact") == 2

    # Each fact's point holds what the contract's apply_to makes of its changes, in log order.
    superseded = fc.FactSuperseded(old.id, old.tier_key, new.id, DAY2).apply_to(old.with_(status=FactStatus.PROMOTED))
    payload = stored_fact(fact_engine, old.id)
    assert payload["fact"] == superseded.to_dict()
    assert (payload["kind"], payload["status"], payload["fact_type"], payload["tier"]) == (
        "fact",
        "superseded",
        "decision",
        "project",
    )
    assert (payload["tier_key"], payload["task_id"], payload["project_id"]) == ("project:alpha", None, "alpha")
    assert (payload["subject"], payload["attribute"], payload["value"]) == ("service:auth", "session_ttl", "30 minutes")
    assert payload["valid_from_ms"] == fact_points.instant_ms(DAY1)
    assert payload["valid_until_ms"] == fact_points.instant_ms(DAY2)
    assert payload["recorded_at_ms"] == payload["timestamp_ms"] == fact_points.instant_ms(DAY1)
    assert payload["cleared_ms"] == OPEN_MS
    assert (payload["confidence"], payload["importance"], payload["scores"]) == (0.8, 0.7, {"composite": 0.7})
    assert payload["text"] == old.text
    current = stored_fact(fact_engine, new.id)
    assert current["fact"] == new.with_(status=FactStatus.PROMOTED).to_dict()
    assert current["valid_until_ms"] == OPEN_MS

    # A retraction later reaches the point; the history stays in its events.
    index(redis_client, [fc.retracted_minute(new, "mistyped", timestamp=DAY3)], first_seq=7)
    assert stored_fact(fact_engine, new.id)["status"] == "retracted"
    assert redis_client.hget(keys.index_head("alpha"), "seq") == b"7"


def test_every_kind_of_change_reaches_the_point(redis_client: redis.Redis, fact_engine: Any) -> None:
    fact = a_fact(task="T-1")
    other = a_fact(value="45 minutes", task="T-1")
    batch = [
        fc.asserted_minute(fact, timestamp=DAY1),
        fc.asserted_minute(other, timestamp=DAY1),
        fc.confirmed_minute(fact, ["01J0000000000000000000SRC2"], 0.95, timestamp=DAY2),
        fc.contradicted_minute(fact, other, timestamp=DAY2),
        fc.edited_minute(fact, importance=0.9, tags=["auth"], timestamp=DAY2),
        fc.promoted_minute(fact, "by_hand", timestamp=DAY2),
    ]
    index(redis_client, batch)
    expected = fact
    for m in batch[2:]:
        change = fc.fact_change(m)
        expected = change.apply_to(expected)  # type: ignore[union-attr]
    payload = stored_fact(fact_engine, fact.id)
    assert payload["fact"] == expected.to_dict()
    assert (payload["confidence"], payload["importance"], payload["status"]) == (0.95, 0.9, "promoted")
    assert (payload["tier"], payload["task_id"], payload["tier_key"]) == ("task", "T-1", "task:alpha:T-1")
    assert stored_fact(fact_engine, other.id)["fact"]["relationships"] == [
        {"kind": "contradicts", "fact_id": fact.id, "strength": 1.0}
    ]


def test_global_facts_are_points_of_the_global_tenant(redis_client: redis.Redis, fact_engine: Any) -> None:
    project_fact = a_fact().with_(status=FactStatus.PROMOTED)
    promoted = fc.tier_promoted_minute(project_fact, timestamp=DAY2)
    learned = fc.learned_minute("deploy window", "friday never", GLOBAL_KEY, project_id="beta", timestamp=DAY2)
    index(redis_client, [fc.asserted_minute(a_fact(), timestamp=DAY1), promoted])
    index(redis_client, [learned])
    copy = fc.fact_change(promoted).fact  # type: ignore[union-attr]
    payload = stored_fact(fact_engine, copy.id, GLOBAL_TENANT)
    assert (payload["tier"], payload["tier_key"], payload["project_id"]) == ("global", "global", GLOBAL_TENANT)
    assert payload["fact"]["promoted_from"] == project_fact.id
    assert fact_engine.count(GLOBAL_TENANT, "fact") == 2
    assert fact_engine.count("alpha", "fact") == 1 and fact_engine.count("beta", "fact") == 0
    assert fact_engine.get_points("alpha", [copy.id]) == []


def snapshot(engine: Any, tenant: str, ids: Sequence[str]) -> dict[str, Any]:
    return {p.key: p.payload for p in engine.get_points(tenant, ids)}


def test_reindexing_the_same_change_minutes_gives_the_same_points(
    redis_client: redis.Redis, fact_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = a_fact(task="T-1"), a_fact(value="15 minutes", task="T-1", valid_from=DAY2)
    batch = [
        fc.asserted_minute(old, timestamp=DAY1),
        fc.promoted_minute(old, timestamp=DAY1),
        fc.confirmed_minute(old, ["01J0000000000000000000SRC2"], 0.9, timestamp=DAY1),
        fc.asserted_minute(new, timestamp=DAY2),
        fc.superseded_minute(old, new, timestamp=DAY2),
        fc.task_memory_cleared_minute(TierKey.for_task("alpha", "T-1"), timestamp=DAY3),
    ]
    ids = [old.id, new.id, fact_points.clears_key("task:alpha:T-1")]
    index(redis_client, batch)
    first = snapshot(fact_engine, "alpha", ids)
    assert len(first) == 3
    writes: list[int] = []
    upsert = fact_engine.upsert
    monkeypatch.setattr(fact_engine, "upsert", lambda points: (writes.append(len(points)), upsert(points)))
    result = index(redis_client, batch)  # a retry, a redelivery, a replay
    assert snapshot(fact_engine, "alpha", ids) == first
    assert writes == [] and result["fact_points"] == 0  # no minute point (each is a change), no fact point changed
    # The same minutes in other batches, in another order: the same points.
    fact_engine.delete_project("alpha")  # what a replay does first
    index(redis_client, batch[3:], first_seq=4)
    index(redis_client, batch[:3])
    assert snapshot(fact_engine, "alpha", ids) == first


def test_changes_indexed_before_their_assertion_wait_for_it(redis_client: redis.Redis, fact_engine: Any) -> None:
    fact = a_fact()
    asserted, promoted = fc.asserted_minute(fact, timestamp=DAY1), fc.promoted_minute(fact, timestamp=DAY1)
    index(redis_client, [promoted], first_seq=2)  # the later seq's batch arrives first
    assert stored_fact(fact_engine, fact.id)["kind"] == "fact_pending"
    assert fact_engine.count("alpha", "fact") == 0
    index(redis_client, [asserted], first_seq=1)
    payload = stored_fact(fact_engine, fact.id)
    assert (payload["kind"], payload["status"]) == ("fact", "promoted")
    assert redis_client.hget(keys.index_head("alpha"), "seq") == b"2"


def test_clearing_a_task_clears_the_facts_it_held_then(redis_client: redis.Redis, fact_engine: Any) -> None:
    key = TierKey.for_task("alpha", "T-1")
    before, late, after = a_fact(task="T-1"), a_fact(value="1 hour", task="T-1"), a_fact(value="2 hours", task="T-1")
    other_task = a_fact(task="T-2")
    early, later = "2026-09-02T12:00:00Z", "2026-09-03T12:00:00Z"  # asserted before the clear (DAY3), and after
    index(redis_client, [fc.asserted_minute(before, timestamp=early), fc.asserted_minute(other_task, timestamp=early)])
    index(redis_client, [fc.task_memory_cleared_minute(key, "done", timestamp=DAY3)], first_seq=4)
    index(redis_client, [fc.asserted_minute(after, timestamp=later)], first_seq=5)
    # Asserted before the clear, indexed after it (and logged after it: the store's order is the changes' time).
    index(redis_client, [fc.asserted_minute(late, timestamp=early)], first_seq=6)
    cleared_at = fact_points.instant_ms(DAY3)
    assert stored_fact(fact_engine, before.id)["cleared_ms"] == cleared_at
    assert stored_fact(fact_engine, late.id)["cleared_ms"] == cleared_at
    assert stored_fact(fact_engine, after.id)["cleared_ms"] == OPEN_MS
    assert stored_fact(fact_engine, other_task.id)["cleared_ms"] == OPEN_MS


def test_a_change_that_does_not_parse_is_indexed_as_a_minute_and_fails_nothing(
    redis_client: redis.Redis, fact_engine: Any
) -> None:
    fact = a_fact()
    broken = minute("fact_promoted", 9, project_id="alpha", data={"fact_id": "not-an-id"}, scope="project")
    foreign = fc.asserted_minute(a_fact("beta"))  # a change to beta's facts in alpha's log
    foreign = Minute.from_dict({**foreign.to_dict(), "project_id": "alpha"})
    result = index(redis_client, [fc.asserted_minute(fact), broken, foreign, fc.promoted_minute(fact)])
    assert result["unparsed_fact_changes"] == [broken.id, foreign.id]
    # The two that do not parse are kept as plain minute points; the two that do are their fact's point.
    assert result["indexed"] == 2 and result["fact_changes"] == 2
    assert redis_client.hget(keys.index_head("alpha"), "seq") == b"4"
    assert fact_engine.count("alpha") == 2 and fact_engine.count("alpha", "fact") == 1
    assert fact_engine.count("beta", "fact") == 0
    assert stored_fact(fact_engine, fact.id)["status"] == "promoted"


def test_a_change_that_does_not_apply_is_skipped_and_the_rest_apply(
    redis_client: redis.Redis, fact_engine: Any
) -> None:
    fact = a_fact(valid_from=DAY2)
    # Valid from day 2, "superseded" on day 1 by a change after the assertion: apply_to refuses a validity that
    # ends before it starts. (One older than the assertion would change nothing, and is not checked: the store's
    # rule, `merge_change`.)
    asserted = fc.asserted_minute(fact, timestamp=DAY2)
    early = fc.change_minute(fc.FactSuperseded(fact.id, fact.tier_key, a_fact(value="x").id, DAY1), timestamp=DAY3)
    result = index(redis_client, [asserted, early, fc.promoted_minute(fact, timestamp=DAY3)])
    assert result["skipped_fact_changes"] == [early.id]
    payload = stored_fact(fact_engine, fact.id)
    assert (payload["status"], payload["valid_until_ms"]) == ("promoted", OPEN_MS)


def test_a_tenant_whose_fact_points_fail_fails_only_its_projects(
    redis_client: redis.Redis, fact_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    get_points = fact_engine.get_points

    def failing(tenant: str, *args: Any, **kwargs: Any) -> Any:
        if tenant == "beta":
            raise ConnectionError("beta's points are unreachable")
        return get_points(tenant, *args, **kwargs)

    monkeypatch.setattr(fact_engine, "get_points", failing)
    ctx = index_pool.IndexContext.build(redis_client, Settings.from_env())
    batch = records([fc.asserted_minute(a_fact("alpha"))]) + records([fc.asserted_minute(a_fact("beta"))])
    with pytest.raises(index_pool.PartialIndexError) as failed:
        index_pool.index_batch(ctx, redis_client, batch)
    assert failed.value.indexed == ["alpha"] and set(failed.value.failed) == {"beta"}
    assert redis_client.hget(keys.index_head("alpha"), "seq") == b"1"
    assert not redis_client.exists(keys.index_head("beta"))
    monkeypatch.setattr(fact_engine, "get_points", get_points)
    index_pool.index_batch(ctx, redis_client, batch, skip_projects={"alpha"})  # the retry
    assert fact_engine.count("beta", "fact") == 1 and redis_client.hget(keys.index_head("beta"), "seq") == b"1"


def test_fact_points_carry_a_dense_vector_kept_while_their_text_stays(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pvm.vectors.edge import EdgeEngine

    calls: list[list[str]] = []

    class Embedder:
        dimensions = 4
        stats = type("Stats", (), {"input_tokens": 0})()

        def embed(self, texts: Sequence[str]) -> list[list[float]]:
            calls.append(list(texts))
            return [[1.0, float(len(t) % 7), 0.0, 0.5] for t in texts]

    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    edge = EdgeEngine(settings.home / "var" / "dense", dense_dimensions=4)
    monkeypatch.setattr(engines, "shared", lambda _settings: (edge, Embedder()))
    try:
        fact = a_fact()
        index(redis_client, [fc.asserted_minute(fact)])
        index(redis_client, [fc.promoted_minute(fact)], first_seq=2)
        index(redis_client, [fc.edited_minute(fact, text="auth sessions are 30 minutes long")], first_seq=3)
        fact_calls = [c for c in calls if any("auth sessions" in t for t in c)]
        # The assertion and the edit of the text embed the fact; the promotion reuses its vector.
        assert [t for c in fact_calls for t in c if t.startswith("auth")] == [
            fact_points.lexical_text(fact.to_dict()),
            fact_points.lexical_text(fact.with_(text="auth sessions are 30 minutes long").to_dict()),
        ]
        [point] = edge.get_points("alpha", [fact.id], with_vectors=True)
        assert point.dense is not None and point.payload["status"] == "promoted"
    finally:
        edge.close()


def test_facts_the_pool_indexes_are_found_by_search_as_they_were_then(
    redis_client: redis.Redis, fact_engine: Any
) -> None:
    from contracts.memory import FactHit
    from pvm.search import HybridSearch

    old, new = a_fact(), a_fact(value="15 minutes", valid_from=DAY2)
    changes = [
        fc.asserted_minute(old, timestamp=DAY1),
        fc.promoted_minute(old, timestamp=DAY1),
        fc.asserted_minute(new, timestamp=DAY2),
        fc.superseded_minute(old, new, timestamp=DAY2),
        fc.promoted_minute(new, timestamp=DAY2),
    ]
    queue = pool_queue("index", redis_client)
    queue.enqueue(keys.INDEX_JOB, records(changes[:2]))
    queue.enqueue(keys.INDEX_JOB, records(changes[2:], first_seq=3))
    work(redis_client, "index")
    search = HybridSearch(fact_engine)

    def value(as_of: str | None) -> list[str]:
        hits = search.search("alpha", "auth session ttl", kinds=("fact",), as_of=as_of)
        return [h.fact["value"] for h in hits if isinstance(h, FactHit)]

    assert value(None) == ["15 minutes"]
    assert value("2026-09-01T18:00:00Z") == ["30 minutes"]
    assert value("2026-09-02T18:00:00Z") == ["15 minutes"]
    # The change minutes are their facts' points only: a minute search finds neither them nor the fact points;
    # a search for both finds the fact.
    assert search.search("alpha", "auth sessions", k=10) == []
    both = search.search("alpha", "auth sessions", k=10, kinds=("minute", "fact"))
    assert [(h.kind, h.fact_id) for h in both] == [("fact", new.id)]  # what holds now


# -- issue 22: a fact point is the store's record, whatever the log's order -----------------------------------------


def agrees(point: dict[str, Any], stored: Fact) -> None:
    """A fact point and the store's record of the fact say the same (status, validity, value, sources, relations)."""
    got = Fact.from_dict(point["fact"])
    assert (got.status, got.valid_from, got.valid_until, got.value) == (
        stored.status,
        stored.valid_from,
        stored.valid_until,
        stored.value,
    )
    assert got.source_minute_ids == stored.source_minute_ids  # the same canonical order, not only the same set
    assert got.relationships == stored.relationships


def test_a_fact_point_takes_the_changes_the_log_holds_before_its_assertion(
    redis_client: redis.Redis, fact_engine: Any
) -> None:
    """Defect 3: a late minute's decision (assert A, A superseded by the newer B) reaches the log with the
    supersession first (two log workers, a requeued log job); the point must still be superseded, as the store is."""
    newer = a_fact(value="15 minutes", valid_from=DAY2)
    late = a_fact(valid_from=DAY1)
    decided = [
        fc.asserted_minute(newer, timestamp=DAY2),
        fc.asserted_minute(late, timestamp="2026-09-02T10:00:00.001Z"),
        fc.superseded_minute(late, newer, timestamp="2026-09-02T10:00:00.002Z"),
    ]
    index(redis_client, [decided[0]], first_seq=1)
    index(redis_client, [decided[2]], first_seq=2)  # durable before the assertion it follows
    index(redis_client, [decided[1]], first_seq=3)
    store = FactStore(redis_client)
    for m in reversed(decided):
        store.apply(m)
    for fact in (late, newer):
        held = store.get(fact.tier_key, fact.id)
        assert held is not None
        agrees(stored_fact(fact_engine, fact.id), held)
    assert Fact.from_dict(stored_fact(fact_engine, late.id)["fact"]).status is FactStatus.SUPERSEDED


def test_a_fact_points_sources_and_relations_are_the_stores_in_its_order(
    redis_client: redis.Redis, fact_engine: Any
) -> None:
    """Defect 5: the point kept sources in the order its changes named them; the store keeps them sorted."""
    fact, other = a_fact(), a_fact(value="1 hour")
    later, earlier = "01J0000000000000000000ZZZ9", "01J0000000000000000000AAA1"
    batch = [
        fc.asserted_minute(fact, timestamp=DAY1),
        fc.asserted_minute(other, timestamp=DAY1),
        fc.confirmed_minute(fact, [later, earlier], 0.9, timestamp=DAY2),
        fc.contradicted_minute(fact, other, timestamp=DAY3),
    ]
    index(redis_client, batch)
    store = FactStore(redis_client)
    for m in batch:
        store.apply(m)
    held = store.get(fact.tier_key, fact.id)
    assert held is not None and held.source_minute_ids == (earlier, SOURCE, later)
    agrees(stored_fact(fact_engine, fact.id), held)


def test_a_learned_value_the_pool_supersedes_is_superseded_in_its_point(
    redis_client: redis.Redis, fact_engine: Any
) -> None:
    """Defect 2: learn(k, a) then learn(k, b): the store marks `a` superseded, and so must `a`'s fact point, so that
    a search of the current facts returns `b` alone."""
    from workers.facts.pool import FactsContext, facts_batch

    tier = TierKey.for_project("alpha")
    first = fc.learned_minute("deploy window", "Tuesday", tier, minute_id="01J0000000000000000000LRN1", timestamp=DAY1)
    second = fc.learned_minute("deploy window", "Friday", tier, minute_id="01J0000000000000000000LRN2", timestamp=DAY2)
    settings = Settings.from_env()
    pool = FactsContext.build(redis_client, settings)
    logged = [[m.id, seq, encode_minute(m), time_ms(m.timestamp)] for seq, m in enumerate([first, second], 1)]
    facts_batch(pool, redis_client, logged)
    stream = keys.stream(keys.shard_of("alpha", settings.shards))
    written = [decode_minute(f[keys.MINUTE_FIELD]) for _, f in redis_client.xrange(stream)]
    assert [m.event_type for m in written] == ["fact_superseded"]
    index(redis_client, [first, second, *written])
    store = FactStore(redis_client)
    for m in (first, second):
        fid = str(m.data["fact"]["id"])
        held = store.get(tier, fid)
        assert held is not None
        agrees(stored_fact(fact_engine, fid), held)
    assert stored_fact(fact_engine, str(first.data["fact"]["id"]))["status"] == "superseded"


def test_a_fact_point_lease_lost_with_a_valkey_restart_is_taken_again_by_its_holder(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Valkey restart can lose the release of a tenant's lease while the worker lives: the same worker takes it
    again at once (it was waited out for FACT_POINTS_LOCK_S, stalling the tenant's fact points); another's holds."""
    name = keys.fact_points_lock("alpha")
    redis_client.set(name, index_pool._lease_owner(), px=60_000)  # this thread's, its release lost
    with index_pool._tenant_lease(redis_client, name):
        assert redis_client.pttl(name) > 50_000
    assert not redis_client.exists(name)
    redis_client.set(name, "another-worker", px=60_000)
    monkeypatch.setattr(defaults, "FACT_POINTS_LOCK_WAIT_S", 0.2)
    with pytest.raises(redis.exceptions.LockError), index_pool._tenant_lease(redis_client, name):
        pass
    assert redis_client.get(name) == b"another-worker"

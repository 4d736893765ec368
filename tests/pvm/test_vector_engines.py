"""The vector engines: one suite run against every backend.

qdrant-edge in tmp_path and qdrant-client local mode always; a real Qdrant
server as well when PVM_QDRANT_URL is set (`backends`), each test on a
collection of its own that it drops afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from qdrant_client import QdrantClient

import pvm.vectors as vectors
import pvm.vectors.edge as edge_module
import pvm.vectors.server as server_module
from contracts.memory import SearchFilters
from pvm.protocols import RANKING_FIELDS, MemoryPoint, VectorEngine
from pvm.vectors import (
    MINUTE_NAMESPACE,
    ShardLockedError,
    VectorConfigError,
    VectorStoreError,
    importance,
    point_id,
    stored_point_id,
)
from pvm.vectors.edge import EdgeEngine
from pvm.vectors.edge import stored_dense_dimensions as edge_dense_dimensions
from pvm.vectors.lexical import LexicalEncoder
from pvm.vectors.server import ServerEngine
from pvm.vectors.server import stored_dense_dimensions as server_dense_dimensions

# qdrant-client's local mode warns that it ignores payload indexes; the server engine creates them anyway.
pytestmark = pytest.mark.filterwarnings("ignore:Payload indexes have no effect")

T0 = 1_790_000_000_000
EngineFactory = Callable[..., Any]


def memory_point(
    project_id: str,
    minute_id: str,
    text: str,
    *,
    dense: list[float] | None = None,
    agent_id: str = "planner",
    event_type: str = "task_completed",
    category: str = "agent_capability",
    timestamp_ms: int = T0,
    task_id: str | None = "T-1",
    thread_id: str | None = "th-1",
    composite: float = 0.5,
) -> MemoryPoint:
    """A point with the payload the index pool writes."""
    minute = {
        "id": minute_id,
        "timestamp": "2026-09-21T12:26:40Z",
        "event_type": event_type,
        "project_id": project_id,
        "agent_id": agent_id,
        "data": {"task_id": task_id, "description": text},
        "context_references": [],
        "scope": "project",
    }
    payload = {
        "project_id": project_id,
        "minute_id": minute_id,
        "agent_id": agent_id,
        "event_type": event_type,
        "category": category,
        "timestamp_ms": timestamp_ms,
        "task_id": task_id,
        "thread_id": thread_id,
        "insights": [{"type": "outcome", "finding": "done", "confidence": 0.9, "applicable_contexts": []}],
        "scores": {"recency": 1.0, "relevance": 0.5, "accuracy": 0.5, "impact": 0.5, "composite": composite},
        "minute": minute,
    }
    return MemoryPoint(minute_id=minute_id, project_id=project_id, text=text, payload=payload, dense=dense)


def ids(candidates: list[Any]) -> list[str]:
    return [c.minute_id for c in candidates]


QDRANT_SERVER = "qdrant-server"  # the backend of a real Qdrant server at PVM_QDRANT_URL


def server_backends(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The server engine's backends: qdrant-client local mode always, a real Qdrant server when PVM_QDRANT_URL is set.

    The real server is a case of its own only where one is configured (no
    skipped case elsewhere): ``PVM_QDRANT_URL=http://localhost:6333 pytest
    tests/pvm/test_vector_engines.py`` runs the whole suite against it too.
    """
    return ["server", *([QDRANT_SERVER] if environ.get("PVM_QDRANT_URL") else [])]


def backends(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Every backend the shared suite runs against: the embedded engine and `server_backends`."""
    return ["edge", *server_backends(environ)]


def server_engine(backend: str, dense_dimensions: int | None = None, **kwargs: Any) -> ServerEngine:
    """A server engine on fresh storage: a local-mode client, or a collection of its own on the real server."""
    if backend == QDRANT_SERVER:
        return ServerEngine.from_url(
            os.environ["PVM_QDRANT_URL"],
            os.environ.get("PVM_QDRANT_API_KEY"),
            collection_prefix=f"pvmtest_{uuid.uuid4().hex[:12]}",  # the server keeps collections between runs
            dense_dimensions=dense_dimensions,
            **kwargs,
        )
    return ServerEngine(QdrantClient(":memory:"), dense_dimensions=dense_dimensions, **kwargs)


def close_engine(engine: Any) -> None:
    """Close an engine; on a real server, drop the test's collection first."""
    if isinstance(engine, ServerEngine) and engine._owns_client:
        with contextlib.suppress(Exception):
            engine.client.delete_collection(engine.collection)
    engine.close()


@pytest.fixture(params=backends())
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_engine(backend: str, tmp_path: Path) -> Iterator[EngineFactory]:
    """Builds engines of the parametrized backend; each call gets fresh storage. All are closed afterwards."""
    made: list[Any] = []

    def make(dense_dimensions: int | None = None, **kwargs: Any) -> Any:
        if backend == "edge":
            engine: Any = EdgeEngine(tmp_path / f"edge{len(made)}", dense_dimensions, **kwargs)
        else:
            engine = server_engine(backend, dense_dimensions, **kwargs)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        close_engine(engine)


def test_a_real_qdrant_server_joins_the_backends_only_when_pvm_qdrant_url_is_set() -> None:
    assert backends({}) == ["edge", "server"]
    assert backends({"PVM_QDRANT_URL": ""}) == ["edge", "server"]
    assert backends({"PVM_QDRANT_URL": "http://qdrant:6333"}) == ["edge", "server", QDRANT_SERVER]
    assert server_backends({"PVM_QDRANT_URL": "http://qdrant:6333"}) == ["server", QDRANT_SERVER]


@pytest.fixture
def engine(make_engine: EngineFactory) -> Any:
    return make_engine()


def test_engines_satisfy_the_protocol(engine: Any) -> None:
    checked: VectorEngine = engine
    assert checked is engine


def test_point_ids_are_uuid5_of_the_minute_id_in_a_namespace_per_project() -> None:
    ns = uuid.uuid5(MINUTE_NAMESPACE, "alpha")
    assert point_id("alpha", "01J0000000000000000000000A") == uuid.uuid5(ns, "01J0000000000000000000000A")
    assert point_id("alpha", "x") != point_id("beta", "x")
    assert point_id("p", "m1") != point_id("p", "m2")


@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=70))
def test_point_ids_equal_uuid5_for_any_names(project_id: str, minute_id: str) -> None:
    try:
        expected = uuid.uuid5(uuid.uuid5(MINUTE_NAMESPACE, project_id), minute_id)
    except UnicodeEncodeError:  # lone surrogates: uuid5 refuses them, and so does point_id
        with pytest.raises(UnicodeEncodeError):
            point_id(project_id, minute_id)
        return
    assert point_id(project_id, minute_id) == expected


def test_upsert_is_idempotent(engine: Any) -> None:
    engine.upsert([memory_point("alpha", "m1", "deploy the gateway")])
    engine.upsert([memory_point("alpha", "m1", "deploy the gateway")])
    assert engine.count("alpha") == 1
    # The same minute re-indexed with a new payload overwrites the point.
    engine.upsert([memory_point("alpha", "m1", "rollback of the gateway", composite=0.9)])
    assert engine.count("alpha") == 1
    [stored] = engine.retrieve("alpha", ["m1"])
    assert stored.payload["scores"]["composite"] == 0.9
    assert ids(engine.query("alpha", "rollback", None, SearchFilters(), 5)) == ["m1"]
    assert engine.query("alpha", "deploy", None, SearchFilters(), 5) == []


def test_a_batch_with_an_invalid_point_writes_nothing(engine: Any) -> None:
    with pytest.raises(ValueError, match="project_id"):
        engine.upsert(
            [memory_point("alpha", "m1", "deploy"), replace(memory_point("beta", "m2", "deploy"), project_id="")]
        )
    assert engine.count("alpha") == 0


def test_points_of_one_project_are_never_returned_for_another(engine: Any) -> None:
    engine.upsert(
        [
            memory_point("alpha", "a1", "database migration failed on the replica"),
            memory_point("alpha", "a2", "database migration retried"),
            memory_point("beta", "b1", "database migration finished"),
        ]
    )
    for project, expected in (("alpha", {"a1", "a2"}), ("beta", {"b1"})):
        found = engine.query(project, "database migration", None, SearchFilters(), 10)
        assert set(ids(found)) == expected
        assert {c.payload["project_id"] for c in found} == {project}
    assert ids(engine.retrieve("beta", ["a1", "a2", "b1"])) == ["b1"]
    assert engine.count("alpha") == 2
    assert engine.count("beta") == 1
    assert engine.query("gamma", "database migration", None, SearchFilters(), 10) == []
    assert engine.count("gamma") == 0


@pytest.mark.parametrize("missing", ["", None])
def test_a_missing_project_is_an_error_not_all_projects(engine: Any, missing: Any) -> None:
    engine.upsert([memory_point("alpha", "a1", "deploy")])
    with pytest.raises(ValueError, match="project_id"):
        engine.query(missing, "deploy", None, SearchFilters(), 5)
    with pytest.raises(ValueError, match="project_id"):
        engine.retrieve(missing, ["a1"])
    with pytest.raises(ValueError, match="project_id"):
        engine.count(missing)
    with pytest.raises(ValueError, match="project_id"):
        engine.delete_project(missing)
    with pytest.raises(ValueError, match="project_id"):
        engine.upsert([replace(memory_point("alpha", "a2", "deploy"), project_id=missing)])
    assert engine.count("alpha") == 1


def test_payload_naming_another_project_is_rejected(engine: Any) -> None:
    point = memory_point("alpha", "a1", "deploy")
    point.payload["project_id"] = "beta"
    with pytest.raises(ValueError, match="project_id"):
        engine.upsert([point])


FILTER_POINTS: list[dict[str, Any]] = [
    dict(minute_id="f1", agent_id="planner", event_type="task_assigned", category="task_assignment",
         timestamp_ms=T0, task_id="T-1", thread_id="th-1", composite=0.2),
    dict(minute_id="f2", agent_id="coder", event_type="task_completed", category="agent_capability",
         timestamp_ms=T0 + 1000, task_id="T-1", thread_id="th-2", composite=0.6),
    dict(minute_id="f3", agent_id="coder", event_type="task_failed", category="failure_pattern",
         timestamp_ms=T0 + 2000, task_id="T-2", thread_id="th-2", composite=0.8),
    dict(minute_id="f4", agent_id="reviewer", event_type="conflict_resolved", category="conflict_resolution",
         timestamp_ms=T0 + 3000, task_id=None, thread_id=None, composite=0.4),
]  # fmt: skip


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (SearchFilters(), {"f1", "f2", "f3", "f4"}),
        (SearchFilters(categories=("failure_pattern", "conflict_resolution")), {"f3", "f4"}),
        (SearchFilters(event_types=("task_completed",)), {"f2"}),
        (SearchFilters(agents=("coder", "reviewer")), {"f2", "f3", "f4"}),
        (SearchFilters(task_id="T-1"), {"f1", "f2"}),
        (SearchFilters(thread_id="th-2"), {"f2", "f3"}),
        (SearchFilters(since_ms=T0 + 1000), {"f2", "f3", "f4"}),
        (SearchFilters(until_ms=T0 + 2000), {"f1", "f2"}),
        (SearchFilters(since_ms=T0 + 1000, until_ms=T0 + 3000), {"f2", "f3"}),
        (SearchFilters(min_composite=0.6), {"f2", "f3"}),
        (SearchFilters(agents=("coder",), event_types=("task_failed",), min_composite=0.5), {"f3"}),
        (SearchFilters(agents=("nobody",)), set()),
    ],
    ids=lambda v: "" if isinstance(v, set) else ",".join(k for k, x in v.to_dict().items() if x not in (None, [])),
)
def test_each_filter(engine: Any, filters: SearchFilters, expected: set[str]) -> None:
    engine.upsert([memory_point("alpha", text="gateway deploy step", **fields) for fields in FILTER_POINTS])
    engine.upsert([memory_point("beta", "x1", "gateway deploy step", agent_id="coder", composite=0.9)])
    assert set(ids(engine.query("alpha", "gateway deploy", None, filters, 10))) == expected


def test_retrieve_by_minute_ids_in_the_order_asked(engine: Any) -> None:
    engine.upsert([memory_point("alpha", f"m{i}", f"step {i}") for i in range(5)])
    found = engine.retrieve("alpha", ["m3", "nope", "m0", "m3", "m4"])
    assert ids(found) == ["m3", "m0", "m4"]
    assert found[0].payload["minute"]["id"] == "m3"
    assert engine.retrieve("alpha", []) == []
    assert engine.retrieve("beta", ["m1"]) == []


@pytest.mark.parametrize(
    ("whole_thread", "long"),
    [(64, False), (2, False), (64, True)],
    ids=["read-whole", "read-in-time-order", "known-long-read-in-time-order"],
)
@pytest.mark.parametrize("reverse", [False, True], ids=["written-in-order", "written-reversed"])
def test_around_reads_a_threads_minutes_either_side_in_time_whatever_the_write_order(
    engine: Any, reverse: bool, whole_thread: int, long: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Thread th-1: m0, m1, then six minutes written in the same millisecond (r0..r5), then m2, m3. Another
    # thread's minutes sit between them in time, and another project has a minute of a thread of the same name.
    # A thread longer than WINDOW_WHOLE_THREAD is read in time order around the minute, and where a read stops
    # inside the run of equal timestamps, the rest of the run is read.
    monkeypatch.setattr(vectors, "WINDOW_WHOLE_THREAD", whole_thread)
    run = [f"r{i}" for i in range(6)]
    points = [
        memory_point("alpha", "m0", "step", timestamp_ms=T0),
        memory_point("alpha", "m1", "step", timestamp_ms=T0 + 1000),
        *(memory_point("alpha", r, "step", timestamp_ms=T0 + 2000) for r in run),
        memory_point("alpha", "m2", "step", timestamp_ms=T0 + 3000),
        memory_point("alpha", "m3", "step", timestamp_ms=T0 + 4000),
        *(memory_point("alpha", f"o{i}", "step", timestamp_ms=T0 + 500 * i, thread_id="th-2") for i in range(10)),
        memory_point("beta", "b0", "step", timestamp_ms=T0 + 2000),
    ]
    engine.upsert(points[::-1] if reverse else points)
    thread = SearchFilters(thread_id="th-1")

    def around(minute_id: str, count: int) -> list[str]:
        (minute,) = engine.retrieve("alpha", [minute_id])
        return ids(engine.around("alpha", thread, minute, count, long=long))

    # Equal timestamps are ordered by minute id, and a read that stops inside the run reads the rest of it.
    assert around("r2", 2) == ["r0", "r1", "r2", "r3", "r4"]
    assert around("r0", 2) == ["m0", "m1", "r0", "r1", "r2"]
    assert around("r5", 1) == ["r4", "r5", "m2"]
    assert around("m1", 3) == ["m0", "m1", "r0", "r1", "r2"]
    assert around("m3", 2) == ["r5", "m2", "m3"]
    assert around("m0", 0) == ["m0"]
    # Within the filters only: other threads and other projects never show.
    (o5,) = engine.retrieve("alpha", ["o5"])
    assert ids(engine.around("alpha", SearchFilters(thread_id="th-2"), o5, 1)) == ["o4", "o5", "o6"]
    (r3,) = engine.retrieve("alpha", ["r3"])
    assert {c.payload["project_id"] for c in engine.around("alpha", thread, r3, 9)} == {"alpha"}


def test_in_threads_reads_several_threads_within_the_filters_and_says_when_it_read_them_all(engine: Any) -> None:
    engine.upsert(
        [
            *(memory_point("alpha", f"a{i}", "step", timestamp_ms=T0 + i, thread_id="th-a") for i in range(3)),
            *(memory_point("alpha", f"b{i}", "step", timestamp_ms=T0 + i, thread_id="th-b") for i in range(4)),
            memory_point("alpha", "c0", "step", timestamp_ms=T0, thread_id="th-c"),
            memory_point("alpha", "late", "step", timestamp_ms=T0 + 60_000, thread_id="th-a"),
            memory_point("beta", "x0", "step", timestamp_ms=T0, thread_id="th-a"),
        ]
    )
    read = engine.in_threads("alpha", SearchFilters(), ["th-b", "th-a", "th-a"], 100)
    assert sorted(ids(read)) == ["a0", "a1", "a2", "b0", "b1", "b2", "b3", "late"]
    assert all(c.payload["project_id"] == "alpha" and "timestamp_ms" in c.payload for c in read)
    # Within the filters: the time bound leaves out th-a's late minute. A read of `limit` may have stopped early.
    early = engine.in_threads("alpha", SearchFilters(until_ms=T0 + 1000), ["th-a"], 100)
    assert sorted(ids(early)) == ["a0", "a1", "a2"]
    assert len(engine.in_threads("alpha", SearchFilters(), ["th-a", "th-b"], 5)) == 5
    assert engine.in_threads("alpha", SearchFilters(), [], 5) == []
    assert engine.in_threads("gamma", SearchFilters(), ["th-a"], 5) == []
    with pytest.raises(ValueError, match="limit"):
        engine.in_threads("alpha", SearchFilters(), ["th-a"], 0)


def test_thread_reads_see_every_write_since_the_last_read(engine: Any) -> None:
    # The embedded engine keeps what it read of a thread (`ThreadReads`); every engine must answer as if it read
    # each time: a minute added, one moved to another thread, one pruned and restored, the project deleted.
    engine.upsert([memory_point("alpha", f"a{i}", "step", timestamp_ms=T0 + i, thread_id="th-a") for i in range(3)])
    engine.upsert([memory_point("alpha", "b0", "step", timestamp_ms=T0, thread_id="th-b")])
    every = SearchFilters()
    th_a = SearchFilters(thread_id="th-a")

    def whole(thread: str) -> list[str]:
        return sorted(ids(engine.in_threads("alpha", every, [thread], 100)))

    def around(minute_id: str) -> list[str]:
        (minute,) = engine.retrieve("alpha", [minute_id])
        return ids(engine.around("alpha", th_a, minute, 1, long=True))

    for _ in range(2):  # read twice: the second may come from what the first kept
        assert whole("th-a") == ["a0", "a1", "a2"]
        assert around("a1") == ["a0", "a1", "a2"]
    engine.upsert([memory_point("alpha", "a3", "step", timestamp_ms=T0 + 1, thread_id="th-a")])
    assert whole("th-a") == ["a0", "a1", "a2", "a3"]
    assert around("a1") == ["a0", "a1", "a3"]
    assert whole("th-b") == ["b0"]
    engine.upsert([memory_point("alpha", "a3", "step", timestamp_ms=T0 + 1, thread_id="th-b")])  # moved
    assert whole("th-a") == ["a0", "a1", "a2"]
    assert whole("th-b") == ["a3", "b0"]
    assert around("a1") == ["a0", "a1", "a2"]
    engine.annotate("alpha", {"a2": {"pruned_ms": T0 + 9}})
    assert whole("th-a") == ["a0", "a1"]
    assert around("a1") == ["a0", "a1"]
    engine.annotate("alpha", {"a2": {"pruned_ms": None}})
    assert whole("th-a") == ["a0", "a1", "a2"]
    assert around("a1") == ["a0", "a1", "a2"]
    engine.delete_project("alpha")
    assert whole("th-a") == []
    engine.upsert([memory_point("alpha", "n0", "step", timestamp_ms=T0, thread_id="th-a")])
    assert whole("th-a") == ["n0"]


def test_ranking_payloads_see_every_write_since_the_last_read(engine: Any) -> None:
    # The embedded engine keeps the candidates' ranking payloads (`RankingMemo`); every engine must answer as if it
    # read them each time: new scores from an annotation, a minute written again with another thread and time, the
    # project deleted and written anew.
    engine.upsert([memory_point("alpha", f"a{i}", "gateway step", timestamp_ms=T0 + i) for i in range(3)])

    def slim() -> dict[str, tuple[Any, ...]]:
        found = engine.query("alpha", "gateway", None, SearchFilters(), 10, with_payload=False)
        return {
            c.minute_id: (c.payload["timestamp_ms"], c.payload.get("thread_id"), c.payload["scores"]["composite"])
            for c in found
        }

    def whole(minute_id: str) -> tuple[Any, ...]:  # a winner's whole payload, read by id
        (found,) = engine.retrieve("alpha", [minute_id])
        return found.payload["timestamp_ms"], found.payload.get("thread_id"), found.payload["scores"]["composite"]

    for _ in range(2):  # read twice: the second may come from what the first kept
        assert slim() == {f"a{i}": (T0 + i, "th-1", 0.5) for i in range(3)}
        assert whole("a1") == (T0 + 1, "th-1", 0.5)
    engine.annotate("alpha", {"a1": {"scores": {"composite": 0.9, "relevance": 0.9}}})
    assert slim()["a1"][2] == 0.9
    assert whole("a1") == (T0 + 1, "th-1", 0.9)
    engine.upsert([memory_point("alpha", "a2", "gateway step", timestamp_ms=T0 + 50, thread_id="th-2")])
    assert slim()["a2"] == (T0 + 50, "th-2", 0.5)
    assert whole("a2") == (T0 + 50, "th-2", 0.5)
    engine.delete_project("alpha")
    assert slim() == {}
    assert engine.retrieve("alpha", ["a1"]) == []
    engine.upsert([memory_point("alpha", "a0", "gateway step", timestamp_ms=T0 + 7, thread_id="th-3", composite=0.2)])
    assert slim() == {"a0": (T0 + 7, "th-3", 0.2)}
    assert whole("a0") == (T0 + 7, "th-3", 0.2)


def test_edge_reads_a_candidates_ranking_payload_once_until_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = EdgeEngine(tmp_path / "edge")
    try:
        engine.upsert([memory_point("alpha", f"a{i}", "gateway step", timestamp_ms=T0 + i) for i in range(3)])
        assert len(engine._ranking) == 3  # the write kept what it wrote
        engine._ranking.forget("alpha")  # as a process that did not write them: read, then kept
        read: list[int] = []
        ranking_of = engine._ranking_of

        def counted(shard: Any, project_id: str, point_ids: Any) -> Any:
            found = ranking_of(shard, project_id, point_ids)
            read.append(len(engine._ranking))
            return found

        monkeypatch.setattr(engine, "_ranking_of", counted)
        first = engine.query("alpha", "gateway", None, SearchFilters(), 10, with_payload=False)
        again = engine.query("alpha", "gateway", None, SearchFilters(), 10, with_payload=False)
        assert [c.payload for c in again] == [c.payload for c in first]
        assert all(a.payload is b.payload for a, b in zip(again, first, strict=True))  # the kept ones, not re-read
        assert read == [3, 3]
        misses = engine._ranking.misses
        engine.set_payloads("alpha", [(point_id("alpha", "a0"), {"_composite": 0.1})])
        assert len(engine._ranking) == 2  # the point whose payload was set is let go; the others stay
        engine.upsert([memory_point("alpha", "a1", "gateway step", timestamp_ms=T0 + 9)])
        after = {
            c.minute_id: (c.payload["timestamp_ms"], c.payload["scores"]["composite"])
            for c in engine.query("alpha", "gateway", None, SearchFilters(), 10, with_payload=False)
        }
        assert after == {"a0": (T0, 0.1), "a1": (T0 + 9, 0.5), "a2": (T0 + 2, 0.5)}
        assert engine._ranking.misses == misses + 1  # a0 read again; a1 as the upsert kept it
    finally:
        engine.close()


def test_what_an_upsert_keeps_is_what_a_read_of_the_point_returns(tmp_path: Path) -> None:
    # The edge engine keeps the ranking payloads of the points it writes, as it packed them (`RankingMemo`); a
    # search must rank them as if it had read them back: minutes (with and without a thread), facts, a point with
    # no scores.
    engine = EdgeEngine(tmp_path / "edge")
    try:
        points = [
            memory_point("alpha", "m1", "gateway step", timestamp_ms=T0 + 1, composite=0.25),
            memory_point("alpha", "m2", "gateway step", timestamp_ms=T0 + 2, thread_id=None, task_id=None),
            fact_point("alpha", 1, "gateway owner", importance=0.9),
            MemoryPoint(minute_id="m3", project_id="alpha", text="gateway bare", payload={}),
        ]
        engine.upsert(points)
        ids = [stored_point_id(p) for p in points]
        kept = engine._ranking.get("alpha", ids)
        assert set(kept) == set(ids)
        engine._ranking.forget("alpha")
        with engine._shard("alpha", create=False) as shard:
            read = engine._ranking_of(shard, "alpha", ids)
        assert read == kept
        assert [type(v) for p in kept.values() for v in p.values()] == [
            type(v) for p in read.values() for v in p.values()
        ]
    finally:
        engine.close()


def test_edge_reads_a_thread_nobody_wrote_since_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = EdgeEngine(tmp_path / "edge")
    try:
        engine.upsert(
            [
                *(memory_point("alpha", f"a{i}", "step", timestamp_ms=T0 + i, thread_id="th-a") for i in range(4)),
                *(memory_point("alpha", f"b{i}", "step", timestamp_ms=T0 + i, thread_id="th-b") for i in range(2)),
            ]
        )
        reads: list[Any] = []
        scrolled = engine._scrolled
        monkeypatch.setattr(engine, "_scrolled", lambda *args: reads.append(args) or scrolled(*args))
        every = SearchFilters()
        first = engine.in_threads("alpha", every, ["th-a", "th-b"], 100)
        assert len(reads) == 1
        assert sorted(ids(engine.in_threads("alpha", every, ["th-b", "th-a"], 100))) == sorted(ids(first))
        assert len(reads) == 1
        # Kept per thread and per filters: another thread, or other filters, is read.
        engine.in_threads("alpha", every, ["th-a", "th-c"], 100)
        assert len(reads) == 2
        engine.in_threads("alpha", SearchFilters(agents=("planner",)), ["th-a"], 100)
        assert len(reads) == 3
        # A read that stopped at its limit did not read its threads whole, so nothing of it is kept.
        assert len(engine.in_threads("alpha", every, ["th-d"], 1)) == 0
        engine.upsert([memory_point("alpha", f"d{i}", "step", thread_id="th-d") for i in range(3)])
        assert len(engine.in_threads("alpha", every, ["th-d"], 2)) == 2
        assert len(engine.in_threads("alpha", every, ["th-d"], 5)) == 3
        # What is kept is cut at `limit` like any read, so a caller still learns that the thread is longer.
        assert len(engine.in_threads("alpha", every, ["th-a"], 2)) == 2
        # A window around a minute of a long thread is kept the same way, and a write to another thread keeps it.
        (a2,) = engine.retrieve("alpha", ["a2"])
        th_a = SearchFilters(thread_id="th-a")
        before = len(reads)
        window = ids(engine.around("alpha", th_a, a2, 1, long=True))
        assert window == ["a1", "a2", "a3"] and len(reads) > before
        engine.upsert([memory_point("alpha", "b9", "step", thread_id="th-b")])
        before = len(reads)
        assert ids(engine.around("alpha", th_a, a2, 1, long=True)) == window
        assert len(reads) == before
    finally:
        engine.close()


def test_delete_project_removes_only_that_project(engine: Any) -> None:
    engine.upsert([memory_point("alpha", "a1", "deploy"), memory_point("beta", "b1", "deploy")])
    engine.delete_project("alpha")
    assert engine.count("alpha") == 0
    assert engine.query("alpha", "deploy", None, SearchFilters(), 5) == []
    assert ids(engine.query("beta", "deploy", None, SearchFilters(), 5)) == ["b1"]
    engine.delete_project("never-existed")
    engine.upsert([memory_point("alpha", "a2", "deploy again")])
    assert ids(engine.query("alpha", "deploy", None, SearchFilters(), 5)) == ["a2"]


def test_lexical_leg_matches_stems_and_skips_stopwords(engine: Any) -> None:
    engine.upsert(
        [
            memory_point("alpha", "m1", "The agents were deploying the new gateways"),
            memory_point("alpha", "m2", "Reviewer approved the schema change"),
        ]
    )
    [hit] = engine.query("alpha", "deployed gateway", None, SearchFilters(), 5)
    assert hit.minute_id == "m1"
    assert hit.keyword > 0 and hit.semantic == 0
    assert hit.extra["keyword_rank"] == 1
    assert engine.query("alpha", "the of and were", None, SearchFilters(), 5) == []
    assert engine.query("alpha", "", None, SearchFilters(), 5) == []


def test_idf_is_computed_per_tenant(engine: Any) -> None:
    # "gateway" is in every minute of alpha but in one minute of beta: rare in beta, so worth more there.
    engine.upsert([memory_point("alpha", f"a{i}", f"gateway timeout number {i}") for i in range(8)])
    engine.upsert([memory_point("alpha", "target-a", "gateway rollback")])
    engine.upsert([memory_point("beta", f"b{i}", f"schema review number {i}") for i in range(8)])
    engine.upsert([memory_point("beta", "target-b", "gateway rollback")])

    def score(project: str, minute_id: str, query: str) -> float:
        hits = {c.minute_id: c.keyword for c in engine.query(project, query, None, SearchFilters(), 20)}
        return hits[minute_id]

    assert score("alpha", "target-a", "gateway") < score("beta", "target-b", "gateway")
    # "rollback" is equally rare in both projects (one minute of nine).
    assert score("alpha", "target-a", "rollback") == pytest.approx(score("beta", "target-b", "rollback"), rel=1e-4)


def test_dense_leg_with_explicit_vectors(make_engine: EngineFactory) -> None:
    engine = make_engine(dense_dimensions=8)
    basis = [[1.0 if i == j else 0.0 for i in range(8)] for j in range(8)]
    engine.upsert(
        [
            memory_point("alpha", "m0", "gateway timeout", dense=basis[0]),
            memory_point("alpha", "m1", "schema review", dense=basis[1]),
            memory_point("alpha", "m2", "cache warmup", dense=[0.9, 0.1, 0, 0, 0, 0, 0, 0]),
            memory_point("alpha", "m3", "lexical only, indexed before the embedder"),
            memory_point("beta", "b0", "gateway timeout", dense=basis[1]),
        ]
    )
    # No lexical match at all: the dense leg alone answers, nearest first.
    found = engine.query("alpha", "zyxwv", basis[1], SearchFilters(), 2)
    assert ids(found) == ["m1", "m2"]
    assert found[0].semantic == pytest.approx(1.0, abs=1e-5) and found[0].keyword == 0
    # Both legs: per-leg scores and ranks plus Qdrant's fused score.
    found = engine.query("alpha", "gateway", basis[0], SearchFilters(), 3)
    assert ids(found)[0] == "m0"
    top = found[0]
    assert top.keyword > 0 and top.semantic == pytest.approx(1.0, abs=1e-5) and top.fused > 0
    assert top.extra == {"keyword_rank": 1.0, "semantic_rank": 1.0}
    assert {c.payload["project_id"] for c in found} == {"alpha"}
    # Filters apply to the dense leg too.
    found = engine.query("alpha", "zyxwv", basis[1], SearchFilters(task_id="T-9"), 3)
    assert found == []
    with pytest.raises(ValueError, match="dimensions"):
        engine.query("alpha", "gateway", [1.0, 0.0], SearchFilters(), 3)
    with pytest.raises(ValueError, match="dimensions"):
        engine.upsert([memory_point("alpha", "m9", "x", dense=[1.0])])


def test_dense_vectors_need_an_engine_with_dense_dimensions(engine: Any) -> None:
    with pytest.raises(ValueError, match="dense_dimensions"):
        engine.upsert([memory_point("alpha", "m1", "gateway", dense=[1.0] * 8)])
    engine.upsert([memory_point("alpha", "m1", "gateway")])
    # A query vector is ignored by a lexical-only engine: the lexical leg answers.
    [hit] = engine.query("alpha", "gateway", [1.0] * 8, SearchFilters(), 5)
    assert hit.minute_id == "m1" and hit.semantic == 0


@pytest.mark.parametrize("server_backend", server_backends())
def test_both_backends_score_alike(tmp_path: Path, server_backend: str) -> None:
    points = [
        memory_point("alpha", "m1", "deploy the gateway to staging", dense=[1, 0, 0, 0]),
        memory_point("alpha", "m2", "gateway timeout during deploy", dense=[0, 1, 0, 0]),
        memory_point("alpha", "m3", "schema review of the gateway", dense=[0.5, 0.5, 0, 0]),
        memory_point("beta", "b1", "deploy deploy deploy", dense=[1, 0, 0, 0]),
    ]
    edge = EdgeEngine(tmp_path / "edge", 4)
    server = server_engine(server_backend, 4)
    try:
        results = []
        for engine in (edge, server):
            engine.upsert(points)
            found = engine.query("alpha", "deploying gateways", [1.0, 0.2, 0.0, 0.0], SearchFilters(), 10)
            results.append({c.minute_id: (c.keyword, c.semantic) for c in found})
        assert results[0].keys() == results[1].keys() == {"m1", "m2", "m3"}
        for minute_id, (keyword, semantic) in results[0].items():
            assert results[1][minute_id][0] == pytest.approx(keyword, rel=1e-4)
            assert results[1][minute_id][1] == pytest.approx(semantic, rel=1e-4)
    finally:
        edge.close()
        close_engine(server)


@pytest.mark.parametrize("bad_limit", [0, -1])
def test_limit_must_be_positive(engine: Any, bad_limit: int) -> None:
    with pytest.raises(ValueError, match="limit"):
        engine.query("alpha", "x", None, SearchFilters(), bad_limit)


# -- embedded engine only --------------------------------------------------------------


def test_edge_keeps_one_shard_directory_per_project(tmp_path: Path) -> None:
    engine = EdgeEngine(tmp_path)
    engine.upsert([memory_point("alpha", "a1", "deploy"), memory_point("beta", "b1", "deploy")])
    engine.query("nobody", "deploy", None, SearchFilters(), 5)
    assert engine.projects() == ["alpha", "beta"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["alpha", "beta"]
    # A name that could never be a project touches nothing on disk.
    assert engine.query("../beta", "deploy", None, SearchFilters(), 5) == []
    assert engine.count("../beta") == 0
    engine.delete_project("alpha")
    assert engine.projects() == ["beta"]
    engine.close()


def test_edge_data_survives_reopen_and_optimize(tmp_path: Path) -> None:
    engine = EdgeEngine(tmp_path)
    engine.upsert([memory_point("alpha", f"a{i}", f"deploy step {i}") for i in range(50)])
    engine.close()
    with pytest.raises(VectorStoreError, match="closed"):
        engine.count("alpha")
    engine = EdgeEngine(tmp_path)
    assert engine.count("alpha") == 50
    assert set(engine.optimize()) == {"alpha"}
    assert engine.optimize("nobody") == {}
    assert len(engine.query("alpha", "deploy", None, SearchFilters(), 10)) == 10
    engine.close()


def test_edge_reads_points_stored_by_earlier_versions(tmp_path: Path) -> None:
    """Before `_msgpack` and `_composite`, shards held the unfiltered payload as `_packed` JSON: it still reads."""
    import qdrant_edge as qe

    point = memory_point("alpha", "old1", "legacy rollback")
    payload = point.payload
    direct = {k: payload[k] for k in ("project_id", "agent_id", "event_type", "category", "timestamp_ms", "task_id")}
    rest = {k: v for k, v in payload.items() if k not in direct}
    stored = {**direct, "scores": {"composite": 0.5}, "_packed": json.dumps(rest)}
    engine = EdgeEngine(tmp_path)
    engine.upsert([memory_point("alpha", "new1", "fresh deploy")])
    with engine._shard("alpha", create=False) as shard:
        vectors = {"lexical": engine._lexical.document(point.text)}
        shard.update(qe.UpdateOperation.upsert_points([qe.Point(point_id("alpha", "old1"), vectors, stored)]))
    [found] = engine.query("alpha", "rollback", None, SearchFilters(), 5)
    assert found.minute_id == "old1" and found.payload == payload
    assert [c.payload for c in engine.retrieve("alpha", ["old1"])] == [payload]
    engine.close()


def _placement(shard: Path) -> tuple[Any, Any]:
    stored = json.loads((shard / edge_module.SHARD_CONFIG_FILE).read_text())
    return stored.get("payload_memory"), stored.get("id_tracker_memory")


def test_edge_warms_the_payloads_and_point_ids_of_the_shards_it_makes(tmp_path: Path) -> None:
    """Cold payloads were dropped from the page cache: each first read of a point was a read from the disk."""
    engine = EdgeEngine(tmp_path)
    engine.upsert([memory_point("alpha", f"a{i}", f"deploy step {i}") for i in range(20)])
    engine.optimize()
    assert _placement(tmp_path / "alpha") == ("cached", "cached")
    segments = [json.loads(p.read_text()) for p in (tmp_path / "alpha").glob("segments/*/segment.json")]
    assert segments and {s["config"]["payload_storage_type"]["type"] for s in segments} == {"in_ram_mmap"}
    engine.close()


@pytest.mark.parametrize(("stored_dense", "engine_dense"), [(4, 4), (None, 4), (None, None)])
def test_edge_warms_a_cold_shard_from_when_it_opens_it(
    tmp_path: Path, stored_dense: int | None, engine_dense: int | None
) -> None:
    """A shard written before the placement (no memory placement in its configuration) opens with it, keeps its
    points and its dense vector, and gains the vector when the engine has one and the shard had none."""
    import qdrant_edge as qe

    dense_config = None
    if stored_dense is not None:
        dense_config = {vectors.DENSE: qe.EdgeVectorParams(size=stored_dense, distance=qe.Distance.Cosine)}
    old = qe.EdgeShard.create(
        str(tmp_path / "alpha"),
        qe.EdgeConfig(
            vectors=dense_config,
            sparse_vectors={"lexical": qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
            wal_enabled=True,
        ),
    )
    old.close()
    assert _placement(tmp_path / "alpha") == (None, None)
    dense = [1.0, 0.0, 0.0, 0.0] if engine_dense else None
    engine = EdgeEngine(tmp_path, dense_dimensions=engine_dense)
    engine.upsert([memory_point("alpha", f"a{i}", f"deploy step {i}", dense=dense) for i in range(5)])
    assert _placement(tmp_path / "alpha") == ("cached", "cached")
    engine.close()
    engine = EdgeEngine(tmp_path, dense_dimensions=engine_dense)
    assert engine.count("alpha") == 5
    assert len(engine.query("alpha", "deploy", dense, SearchFilters(), 10)) == 5
    assert edge_dense_dimensions(tmp_path) == engine_dense
    engine.close()


def test_edge_opens_a_shard_that_refuses_the_placement_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The placement is a speed: a shard the engine will not load with it opens as it is, never set aside."""
    import qdrant_edge as qe

    engine = EdgeEngine(tmp_path)
    engine.upsert([memory_point("alpha", f"a{i}", f"deploy step {i}") for i in range(5)])
    engine.close()
    stored = json.loads((tmp_path / "alpha" / edge_module.SHARD_CONFIG_FILE).read_text())
    del stored["payload_memory"]
    (tmp_path / "alpha" / edge_module.SHARD_CONFIG_FILE).write_text(json.dumps(stored))

    def refused(self: EdgeEngine, directory: Path) -> qe.EdgeConfig:  # a dense vector the shard does not hold
        return EdgeEngine._config(self, 8)

    monkeypatch.setattr(EdgeEngine, "_placed", refused)
    engine = EdgeEngine(tmp_path)
    with caplog.at_level("WARNING", logger=edge_module.__name__):
        assert engine.count("alpha") == 5
    assert "opened as it was" in caplog.text and "pvm replay --project alpha" in caplog.text
    assert engine.broken_projects() == [] and not list(tmp_path.glob(".broken-*"))
    engine.upsert([memory_point("alpha", "a9", "deploy step 9")])
    assert engine.count("alpha") == 6
    engine.close()


def test_edge_allows_one_owner_per_directory(tmp_path: Path) -> None:
    engine = EdgeEngine(tmp_path)
    engine.upsert([memory_point("alpha", "a1", "deploy")])
    with pytest.raises(ShardLockedError, match="one process"):
        EdgeEngine(tmp_path)
    script = (
        "import sys; from pathlib import Path; from pvm.vectors.edge import EdgeEngine; EdgeEngine(Path(sys.argv[1]))"
    )
    other = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert other.returncode != 0 and "ShardLockedError" in other.stderr
    engine.close()
    again = EdgeEngine(tmp_path)  # released on close
    assert again.count("alpha") == 1
    again.close()


def test_edge_closes_least_recently_used_shards(tmp_path: Path) -> None:
    engine = EdgeEngine(tmp_path, max_open_shards=2)
    for project in ("p1", "p2", "p3", "p4"):
        engine.upsert([memory_point(project, f"{project}-m", f"deploy {project}")])
    assert len(engine._open) == 2
    for project in ("p1", "p2", "p3", "p4"):
        assert ids(engine.query(project, "deploy", None, SearchFilters(), 5)) == [f"{project}-m"]
    engine.close()


def test_edge_serves_threads_while_shards_open(tmp_path: Path) -> None:
    """Writers racing to open the same new shards, readers on others, and a delete, from several threads."""
    engine = EdgeEngine(tmp_path, max_open_shards=3)
    engine.upsert([memory_point("steady", "s0", "deploy gateway")])
    errors: list[BaseException] = []

    def write(worker: int) -> None:
        try:
            for i in range(5):
                project = f"p{i}"
                engine.upsert([memory_point(project, f"{project}-w{worker}", "deploy gateway")])
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    def read() -> None:
        try:
            for _ in range(40):
                assert ids(engine.query("steady", "deploy", None, SearchFilters(), 5)) == ["s0"]
                engine.query("p2", "deploy", None, SearchFilters(), 5)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)] + [threading.Thread(target=read)]
    for t in threads:
        t.start()
    engine.delete_project("p4")
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert [engine.count(f"p{i}") for i in range(4)] == [4, 4, 4, 4]
    assert engine.count("p4") <= 4  # the delete raced the writers; whatever came after it stays
    engine.close()


def test_edge_refuses_dense_vectors_of_another_size(tmp_path: Path) -> None:
    engine = EdgeEngine(tmp_path)
    engine.upsert([memory_point("alpha", "a1", "deploy")])
    engine.close()
    # A lexical-only shard gains the dense vector when an embedder is configured later.
    engine = EdgeEngine(tmp_path, 8)
    engine.upsert([memory_point("alpha", "a2", "deploy", dense=[1.0] * 8)])
    assert ids(engine.query("alpha", "zyxwv", [1.0] * 8, SearchFilters(), 5)) == ["a2"]
    engine.close()
    engine = EdgeEngine(tmp_path, 16)
    with pytest.raises(VectorConfigError, match="pvm replay"):
        engine.count("alpha")
    engine.close()


def test_the_stored_dense_length_is_read_back(make_engine: EngineFactory, backend: str) -> None:
    def stored(engine: Any) -> int | None:
        if backend == "edge":
            return edge_dense_dimensions(engine.path)
        return server_dense_dimensions(engine.client, engine.collection.removesuffix("_minutes"))

    lexical = make_engine()
    assert stored(lexical) is None  # nothing stored yet
    lexical.upsert([memory_point("alpha", "a1", "deploy")])
    assert stored(lexical) is None  # lexical-only
    dense = make_engine(dense_dimensions=8)
    dense.upsert([memory_point("alpha", "a1", "deploy", dense=[1.0] * 8)])
    assert stored(dense) == 8


def test_edge_shards_tell_their_dense_length_without_being_opened(tmp_path: Path) -> None:
    engine = EdgeEngine(tmp_path / "store")
    engine.upsert([memory_point("alpha", "a1", "deploy")])
    engine.close()
    engine = EdgeEngine(tmp_path / "store", 8)
    engine.count("alpha")  # opening the lexical-only shard gives it the dense vector
    assert edge_dense_dimensions(tmp_path / "store") == 8  # read while another engine holds the lock
    engine.close()
    assert edge_dense_dimensions(tmp_path / "store") == 8
    assert edge_dense_dimensions(tmp_path / "missing") is None
    # Shards that disagree (a model changed, one project rebuilt) say nothing: the embedder must tell.
    other = EdgeEngine(tmp_path / "other", 16)
    other.upsert([memory_point("beta", "b1", "deploy", dense=[1.0] * 16)])
    other.close()
    shutil.copytree(tmp_path / "other" / "beta", tmp_path / "store" / "beta")
    assert edge_dense_dimensions(tmp_path / "store") is None


def test_server_refuses_dense_vectors_of_another_size() -> None:
    client = QdrantClient(":memory:")
    ServerEngine(client, dense_dimensions=8).upsert([memory_point("alpha", "a1", "deploy", dense=[1.0] * 8)])
    with pytest.raises(VectorConfigError, match="8-dimension"):
        ServerEngine(client, dense_dimensions=16).count("alpha")
    assert ServerEngine(client).count("alpha") == 1  # a lexical-only reader of the same collection is fine
    with pytest.raises(ValueError, match="PVM_QDRANT_URL"):
        ServerEngine.from_url("")


PROJECT_NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,15}", fullmatch=True)
WORDS = st.sampled_from(
    ["deploy", "gateway", "schema", "review", "rollback", "cache", "timeout", "merge", "conflict", "agent"]
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    projects=st.lists(PROJECT_NAMES, min_size=1, max_size=4, unique=True),
    texts=st.lists(st.lists(WORDS, min_size=1, max_size=5).map(" ".join), min_size=1, max_size=12),
    query=st.lists(WORDS, min_size=1, max_size=3).map(" ".join),
    stranger=PROJECT_NAMES,
)
def test_edge_tenancy_property(projects: list[str], texts: list[str], query: str, stranger: str) -> None:
    """Random projects and queries: a query only ever sees its own project's minutes; no project is an error."""
    with tempfile.TemporaryDirectory() as tmp:
        engine = EdgeEngine(Path(tmp))
        try:
            owner = {}
            points = []
            for i, text in enumerate(texts):
                project = projects[i % len(projects)]
                minute_id = f"{project}-{i}"
                owner[minute_id] = project
                points.append(memory_point(project, minute_id, text))
            engine.upsert(points)
            for project in [*projects, stranger]:
                found = engine.query(project, query, None, SearchFilters(), 50)
                assert all(c.payload["project_id"] == project and owner[c.minute_id] == project for c in found)
                mine = {m for m, p in owner.items() if p == project}
                assert set(ids(engine.retrieve(project, list(owner)))) == mine
                assert engine.count(project) == len(mine)
            for missing in ("", None):
                with pytest.raises(ValueError, match="project_id"):
                    engine.query(missing, query, None, SearchFilters(), 5)  # type: ignore[arg-type]
        finally:
            engine.close()


def test_payload_round_trips_exactly(engine: Any) -> None:
    golden = json.loads((Path(__file__).parents[2] / "contracts/vectors/data_value_types.json").read_text())
    golden.pop("v", None)
    point = memory_point("alpha", "m1", "capability observed")
    point.payload["minute"] = golden
    point.payload["seq"] = 7
    point.payload["note"] = "ünïcödé ✓"
    engine.upsert([point])
    [stored] = engine.retrieve("alpha", ["m1"])
    assert stored.payload == point.payload
    [found] = engine.query("alpha", "capability", None, SearchFilters(), 5)
    assert found.payload == point.payload


@pytest.mark.parametrize("minute_id", ["12:34", "7", "ünï:cödé:9", "x" * 64])
def test_any_minute_id_comes_back_from_queries_and_retrieve(engine: Any, minute_id: str) -> None:
    engine.upsert([memory_point("alpha", minute_id, "gateway deploy")])
    [slim] = engine.query("alpha", "gateway", None, SearchFilters(), 5, with_payload=False)
    [whole] = engine.query("alpha", "gateway", None, SearchFilters(), 5)
    [stored] = engine.retrieve("alpha", [minute_id])
    assert slim.minute_id == whole.minute_id == stored.minute_id == minute_id
    assert whole.payload == stored.payload == memory_point("alpha", minute_id, "gateway deploy").payload


def test_candidates_without_payload_carry_what_ranking_reads(engine: Any) -> None:
    engine.upsert(
        [memory_point("alpha", f"m{i}", f"gateway deploy {i}", composite=i / 10, timestamp_ms=T0 + i) for i in range(6)]
    )
    engine.upsert([memory_point("beta", "b1", "gateway deploy")])
    for filters in (SearchFilters(), SearchFilters(min_composite=0.3)):
        whole = engine.query("alpha", "gateway deploy", None, filters, 10)
        slim = engine.query("alpha", "gateway deploy", None, filters, 10, with_payload=False)
        assert [(c.minute_id, c.keyword, c.fused, c.extra) for c in slim] == [
            (c.minute_id, c.keyword, c.fused, c.extra) for c in whole
        ]
        for c, w in zip(slim, whole, strict=True):
            p = w.payload
            assert set(RANKING_FIELDS) == {
                "project_id",
                "minute_id",
                "timestamp_ms",
                "scores.composite",
                "scores.relevance",
                "scores.accuracy",
                "scores.impact",
                "thread_id",
            }
            assert c.payload.get("thread_id") == p.get("thread_id")
            assert {k: v for k, v in c.payload.items() if k not in ("scores", "thread_id")} == {
                "project_id": "alpha",
                "minute_id": p["minute_id"],
                "timestamp_ms": p["timestamp_ms"],
            }
            # The composite, and the importance without recency that ranking reads (stored flat by the edge engine).
            assert c.payload["scores"]["composite"] == p["scores"]["composite"]
            assert importance(c.payload["scores"]) == pytest.approx(importance(p["scores"]))


def test_the_same_minute_id_in_two_projects_keeps_both(tmp_path: Path) -> None:
    """Producers choose minute ids: one project must never overwrite another's point (shared collection)."""
    from qdrant_client import QdrantClient

    from pvm.vectors.server import ServerEngine

    engine = ServerEngine(QdrantClient(":memory:"))
    shared = "01J0000000000000000000SAME"
    for project in ("alpha", "beta"):
        engine.upsert(
            [
                MemoryPoint(
                    shared,
                    project,
                    f"{project} only words",
                    {"project_id": project, "minute_id": shared, "minute": {"id": shared, "project_id": project}},
                )
            ]
        )
    assert engine.count("alpha") == 1 and engine.count("beta") == 1
    assert engine.retrieve("alpha", [shared])[0].payload["minute"]["project_id"] == "alpha"


def _golden_points() -> dict[str, Any]:
    """What the index pool wrote for a batch of sample minutes, recorded before a speed-up (see test_index_pool)."""
    return json.loads((Path(__file__).parent / "data" / "index_golden.json").read_text())


def test_lexical_vectors_are_unchanged() -> None:
    from pvm.vectors.lexical import LexicalEncoder

    golden = _golden_points()
    lexical = LexicalEncoder()
    for entry in [*golden["points"], *golden["texts"]]:
        document = lexical.document(entry["text"])
        assert {"indices": list(document.indices), "values": list(document.values)} == entry["document"]
    for entry in golden["texts"]:
        query = lexical.query(entry["text"])
        assert {"indices": list(query.indices), "values": list(query.values)} == entry["query"]


def test_the_lexical_spread_scales_a_document_by_its_point_id_and_unspread_takes_it_out() -> None:
    encoder, plain = LexicalEncoder(), LexicalEncoder(spread=0.0)
    low, high = uuid.UUID(int=0), uuid.UUID(int=(1 << 128) - 1)
    text = "gateway outage after the rollback"
    base = plain.document(text)
    assert list(plain.document(text, low).values) == list(base.values)  # spread 0: the plain weights
    for point, scale in ((low, 1.0 + encoder.spread), (high, 1.0)):
        spread = encoder.document(text, point)
        assert list(spread.indices) == list(base.indices)
        assert list(spread.values) == pytest.approx([v * scale for v in base.values], rel=1e-6)
    assert encoder.document(text, low).values[0] > encoder.document(text, uuid.uuid4()).values[0]
    assert encoder.unspread(12.3456789 * (1.0 + encoder.spread), low) == 12.346
    assert encoder.unspread(12.3456789, high) == 12.346
    assert encoder.unspread(7.0, str(low)) == pytest.approx(7.0 / (1.0 + encoder.spread), rel=1e-5)
    assert plain.unspread(12.3456789, low) == 12.3456789
    for bad in (-0.001, 0.1):
        with pytest.raises(ValueError, match="spread"):
            LexicalEncoder(spread=bad)


def test_edge_stores_exactly_the_recorded_payloads(tmp_path: Path) -> None:
    """Through `upsert` and qdrant-edge: the payload and the lexical vector each point is stored with."""
    import qdrant_edge as qe

    from pvm.vectors.edge import _unpack

    golden = _golden_points()
    engine = EdgeEngine(tmp_path)
    try:
        by_project: dict[str, list[dict[str, Any]]] = {}
        for entry in golden["points"]:
            by_project.setdefault(entry["project_id"], []).append(entry)
        points = [
            MemoryPoint(
                minute_id=e["minute_id"],
                project_id=e["project_id"],
                text=e["text"],
                payload={"project_id": e["project_id"], "minute_id": e["minute_id"], **_unpack(e["stored"])},
            )
            for e in golden["points"]
        ]
        engine.upsert(points)
        for project_id, entries in by_project.items():
            with engine._shard(project_id, create=False) as shard:
                assert shard is not None
                records, _ = shard.scroll(qe.ScrollRequest(limit=1000, with_payload=True, with_vector=True))
            stored = {str(r.id): r for r in records}
            assert set(stored) == {e["point_id"] for e in entries}
            for e in entries:
                record = stored[e["point_id"]]
                assert record.payload == e["stored"]
                # The encoder's document vector, spread by the point id (equal texts score apart, lowest id first).
                vector = record.vector["lexical"]
                scale = engine._lexical._scale(uuid.UUID(e["point_id"]))
                assert scale > 1.0
                expected = sorted(
                    (i, pytest.approx(v * scale, rel=1e-6))
                    for i, v in zip(e["document"]["indices"], e["document"]["values"], strict=True)
                )
                assert sorted(zip(vector.indices, vector.values, strict=True)) == expected
    finally:
        engine.close()


# -- crash-safe shards (qdrant-edge) --------------------------------------------------

# A process that creates shards for new projects, one after another, until it is killed (or done).
_CREATOR = """
import sys
from pathlib import Path
from pvm.protocols import MemoryPoint
from pvm.vectors.edge import EdgeEngine

engine = EdgeEngine(Path(sys.argv[1]))
print("ready", flush=True)
for n in range(int(sys.argv[2])):
    project = f"p{n}"
    engine.upsert([MemoryPoint(minute_id=f"{project}-m", project_id=project, text=f"deploy {project}", payload={})])
engine.close()
print("done", flush=True)
"""
KILL_ITERATIONS = 16
KILL_PROJECTS = 6


def half_created(path: Path, project: str) -> Path:
    """A shard directory as a process killed early in qdrant-edge's create leaves it (what older versions did)."""
    directory = path / project
    (directory / "segments").mkdir(parents=True)
    (directory / "wal").mkdir()
    return directory


@pytest.mark.slow
def test_edge_shards_survive_kill_9_at_any_instant_of_their_creation(tmp_path: Path) -> None:
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    deadline = time.monotonic() + 240
    for iteration in range(KILL_ITERATIONS):
        assert time.monotonic() < deadline, f"seed {seed}: the kill test ran out of time"
        path = tmp_path / f"run{iteration}"
        creator = subprocess.Popen(
            [sys.executable, "-c", _CREATOR, str(path), str(KILL_PROJECTS)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert creator.stdout is not None and creator.stdout.readline() == "ready\n", f"seed {seed}"
            delay = rng.uniform(0.0, 0.15)
            time.sleep(delay)
            creator.send_signal(signal.SIGKILL)
        finally:
            creator.wait(timeout=60)
            if creator.stdout is not None:
                creator.stdout.close()
        try:
            reopen_and_use(path)
        except Exception as exc:
            raise AssertionError(f"seed {seed}, iteration {iteration}, killed after {delay * 1000:.0f} ms") from exc


def reopen_and_use(path: Path) -> None:
    """Open the store a killed creator left: every shard loads, and upsert and search work in each project."""
    engine = EdgeEngine(path)
    try:
        assert not [p.name for p in path.iterdir() if p.name.startswith(".tmp-")]  # swept at open
        assert engine.broken_projects() == []  # nothing half-made was ever under a project's name
        engine.upsert([memory_point(f"p{n}", f"p{n}-new", f"rollback p{n}") for n in range(KILL_PROJECTS)])
        for n in range(KILL_PROJECTS):
            assert ids(engine.query(f"p{n}", "rollback", None, SearchFilters(), 5)) == [f"p{n}-new"]
    finally:
        engine.close()


def test_edge_sets_aside_and_recreates_a_shard_that_does_not_load(tmp_path: Path) -> None:
    half_created(tmp_path, "alpha")
    engine = EdgeEngine(tmp_path)
    engine.upsert([memory_point("alpha", "a1", "deploy"), memory_point("beta", "b1", "deploy")])
    assert ids(engine.query("alpha", "deploy", None, SearchFilters(), 5)) == ["a1"]
    assert engine.broken_projects() == ["alpha"]  # its points are gone: its index must be rebuilt from the log
    [aside] = [p for p in tmp_path.iterdir() if p.name.startswith(".broken-")]
    assert aside.name.endswith("-alpha") and (aside / "segments").is_dir()  # kept as it was, for forensics
    assert engine.projects() == ["alpha", "beta"]
    engine.close()

    engine = EdgeEngine(tmp_path)  # still pending after a restart: the pool rebuilds it whenever it next runs
    assert engine.broken_projects() == ["alpha"]
    engine.mark_reindexed("alpha")
    assert engine.broken_projects() == []
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".broken-")] == [
        aside.name.replace(".broken-", ".broken-reindexed-", 1)
    ]
    engine.close()
    engine = EdgeEngine(tmp_path)
    assert engine.broken_projects() == [] and engine.count("alpha") == 1
    engine.close()


def test_edge_reads_of_a_shard_that_does_not_load_fail_and_say_what_to_do(tmp_path: Path) -> None:
    half_created(tmp_path, "alpha")
    engine = EdgeEngine(tmp_path)
    with pytest.raises(VectorStoreError, match=r"pvm replay --project alpha"):
        engine.query("alpha", "deploy", None, SearchFilters(), 5)
    assert (tmp_path / "alpha" / "segments").is_dir()  # a read changes nothing
    engine.close()


def test_edge_sweeps_shards_left_half_created_in_their_temporary_directory(tmp_path: Path) -> None:
    (tmp_path / ".tmp-alpha-0123abcd" / "segments").mkdir(parents=True)
    engine = EdgeEngine(tmp_path)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []
    assert engine.projects() == [] and engine.broken_projects() == []
    engine.close()


# -- fact points beside the minutes (issue 10, item 5) ------------------------------------------------------------

OPEN = 2**53 - 1


def fact_point(
    tenant: str,
    n: int,
    text: str,
    *,
    kind: str = "fact",
    fact_type: str = "decision",
    tier: str = "project",
    task_id: str | None = None,
    status: str = "promoted",
    valid_from_ms: int = T0,
    valid_until_ms: int = OPEN,
    recorded_at_ms: int = T0,
    cleared_ms: int = OPEN,
    importance: float = 0.7,
    dense: list[float] | None = None,
) -> MemoryPoint:
    """A point with the indexed fields a fact point carries (workers/index/fact_points.py writes the real ones)."""
    key = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"fact-{tenant}-{n}"))
    tier_key = "global" if tier == "global" else f"task:{tenant}:{task_id}" if tier == "task" else f"project:{tenant}"
    payload = {
        "kind": kind,
        "project_id": tenant,
        "fact_type": fact_type,
        "tier": tier,
        "tier_key": tier_key,
        "task_id": task_id,
        "status": status,
        "valid_from_ms": valid_from_ms,
        "valid_until_ms": valid_until_ms,
        "recorded_at_ms": recorded_at_ms,
        "cleared_ms": cleared_ms,
        "timestamp_ms": recorded_at_ms,
        "scores": {"composite": importance},
        "fact": {"id": key, "text": text},
    }
    return MemoryPoint(key, tenant, text, payload, dense=dense, kind=kind)


def keys_of(candidates: list[Any]) -> set[str]:
    return {c.minute_id for c in candidates}


def test_fact_points_sit_beside_minutes_and_each_query_sees_one_kind(engine: Any) -> None:
    from pvm.protocols import FactFilters

    facts = [fact_point("alpha", i, f"gateway deploy decision {i}") for i in range(3)]
    engine.upsert([memory_point("alpha", f"m{i}", f"gateway deploy step {i}") for i in range(4)] + facts)
    minutes = engine.query("alpha", "gateway deploy", None, SearchFilters(), 20)
    assert keys_of(minutes) == {f"m{i}" for i in range(4)}
    found = engine.query("alpha", "gateway deploy", None, SearchFilters(), 20, facts=FactFilters())
    assert keys_of(found) == {f.minute_id for f in facts}
    assert all(c.payload["kind"] == "fact" and c.payload["fact"]["text"] for c in found)
    # Ranking reads the same fields of a fact as of a minute.
    slim = engine.query("alpha", "gateway deploy", None, SearchFilters(), 20, with_payload=False, facts=FactFilters())
    assert {c.minute_id: c.payload["timestamp_ms"] for c in slim} == {f.minute_id: T0 for f in facts}
    assert {c.payload["scores"]["composite"] for c in slim} == {0.7}
    assert engine.count("alpha") == 4 and engine.count("alpha", "fact") == 3
    # Minutes are read by minute id only; a fact id is no minute of the project.
    assert engine.retrieve("alpha", [f.minute_id for f in facts]) == []


def test_fact_points_are_stored_under_the_fact_id(make_engine: EngineFactory, backend: str) -> None:
    from pvm.vectors import stored_point_id

    engine = make_engine()
    point = fact_point("alpha", 1, "session ttl is 30 minutes")
    assert stored_point_id(point) == uuid.UUID(point.minute_id)
    engine.upsert([point, point])
    assert engine.count("alpha", "fact") == 1
    if backend != "edge":
        [record] = engine.client.retrieve(engine.collection, [point.minute_id])
        assert record.payload["kind"] == "fact"


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        ({}, {0, 1, 3, 5}),
        ({"statuses": ("promoted", "pending")}, {0, 1, 2, 3, 5}),
        ({"statuses": ("superseded", "retracted")}, {4, 6}),
        ({"types": ("constraint",)}, {1}),
        ({"tiers": ("task",)}, {3}),
        ({"tiers": ("task", "project"), "types": ("decision", "goal")}, {0, 3, 5}),
        # as_of: valid then, recorded by then, not cleared by then; the statuses are today's.
        ({"as_of_ms": T0 + 500, "statuses": ("promoted", "superseded")}, {0, 1, 4}),
        ({"as_of_ms": T0 + 1500, "statuses": ("promoted", "superseded")}, {0, 1, 5, 7}),
        ({"as_of_ms": T0 + 2500, "statuses": ("promoted", "superseded")}, {0, 1, 3, 5}),
        ({"as_of_ms": T0 - 1}, set()),
    ],
)
def test_each_fact_filter(engine: Any, facts: dict[str, Any], expected: set[int]) -> None:
    from pvm.protocols import FactFilters

    points = [
        fact_point("alpha", 0, "retry policy", fact_type="decision"),
        fact_point("alpha", 1, "retry policy", fact_type="constraint"),
        fact_point("alpha", 2, "retry policy", status="pending"),
        fact_point("alpha", 3, "retry policy", tier="task", task_id="T-1", recorded_at_ms=T0 + 2000),
        fact_point("alpha", 4, "retry policy", status="superseded", valid_until_ms=T0 + 1000),
        fact_point("alpha", 5, "retry policy", fact_type="goal", valid_from_ms=T0 + 1000),
        fact_point("alpha", 6, "retry policy", status="retracted"),
        fact_point("alpha", 7, "retry policy", cleared_ms=T0 + 2000, valid_from_ms=T0 + 1000),
    ]
    engine.upsert([*points, fact_point("beta", 0, "retry policy")])
    found = engine.query("alpha", "retry policy", None, SearchFilters(), 20, facts=FactFilters(**facts))
    assert keys_of(found) == {points[i].minute_id for i in expected}


def test_fact_queries_take_the_task_and_importance_filters(engine: Any) -> None:
    from pvm.protocols import FactFilters

    points = [
        fact_point("alpha", 0, "retry policy", tier="task", task_id="T-1", importance=0.9),
        fact_point("alpha", 1, "retry policy", tier="task", task_id="T-2", importance=0.3),
    ]
    engine.upsert(points)
    by_task = engine.query("alpha", "retry", None, SearchFilters(task_id="T-1"), 5, facts=FactFilters())
    assert keys_of(by_task) == {points[0].minute_id}
    important = engine.query("alpha", "retry", None, SearchFilters(min_composite=0.5), 5, facts=FactFilters())
    assert keys_of(important) == {points[0].minute_id}
    # Minute-only filters describe minutes: they do not hide facts.
    by_agent = engine.query("alpha", "retry", None, SearchFilters(agents=("nobody",)), 5, facts=FactFilters())
    assert len(by_agent) == 2


def test_global_facts_live_in_their_own_tenant_read_only_by_naming_it(engine: Any) -> None:
    from pvm.protocols import FactFilters
    from pvm.vectors import GLOBAL_TENANT

    shared = fact_point(GLOBAL_TENANT, 0, "never deploy on friday", tier="global")
    mine = fact_point("alpha", 1, "never deploy on friday")
    engine.upsert([shared, mine, memory_point("alpha", "m1", "deploy on friday")])
    assert keys_of(engine.query("alpha", "deploy friday", None, SearchFilters(), 10, facts=FactFilters())) == {
        mine.minute_id
    }
    found = engine.query(GLOBAL_TENANT, "deploy friday", None, SearchFilters(), 10, facts=FactFilters())
    assert keys_of(found) == {shared.minute_id}
    assert engine.query(GLOBAL_TENANT, "deploy friday", None, SearchFilters(), 10) == []  # no minutes there
    assert engine.count(GLOBAL_TENANT, "fact") == 1 and engine.count("alpha", "fact") == 1
    assert [p.key for p in engine.get_points("alpha", [shared.minute_id, mine.minute_id])] == [mine.minute_id]
    # A minute belongs to a project, never to the global tenant.
    with pytest.raises(ValueError, match="project_id"):
        engine.upsert([memory_point(GLOBAL_TENANT, "m2", "deploy")])
    engine.delete_project("alpha")
    assert engine.count(GLOBAL_TENANT, "fact") == 1


def test_points_that_are_not_minutes_state_their_kind_and_a_uuid_key(engine: Any) -> None:
    good = fact_point("alpha", 0, "retry policy")
    with pytest.raises(ValueError, match="UUID"):
        engine.upsert([replace(good, minute_id="not-a-uuid")])
    with pytest.raises(ValueError, match="kind"):
        engine.upsert([replace(good, kind="fact_pending")])
    with pytest.raises(ValueError, match="kind"):
        engine.upsert([replace(memory_point("alpha", "m1", "x"), payload={**good.payload, "kind": "fact"})])
    with pytest.raises(ValueError, match="project_id"):
        engine.upsert([replace(good, project_id="global")])  # a real project may be called that; a fact of it is not
    assert engine.count("alpha", "fact") == 0 and engine.count("alpha") == 0


def test_get_points_reads_by_key_and_by_tier_key_with_vectors(make_engine: EngineFactory) -> None:
    engine = make_engine(dense_dimensions=4)
    a = fact_point("alpha", 0, "retry policy", tier="task", task_id="T-1", dense=[1.0, 0, 0, 0])
    b = fact_point("alpha", 1, "retry policy", tier="task", task_id="T-1")
    c = fact_point("alpha", 2, "retry policy")
    pending_key = str(uuid.uuid4())
    pending_payload = {"kind": "fact_pending", "project_id": "alpha"}
    pending = MemoryPoint(pending_key, "alpha", "", pending_payload, kind="fact_pending")
    engine.upsert([a, b, c, pending, fact_point("beta", 0, "retry policy", tier="task", task_id="T-1")])
    by_key = engine.get_points("alpha", [c.minute_id, pending_key, str(uuid.uuid4())])
    assert {p.key: p.payload["kind"] for p in by_key} == {c.minute_id: "fact", pending_key: "fact_pending"}
    assert all(p.dense is None for p in by_key)
    by_tier = engine.get_points("alpha", [a.minute_id], tier_keys=["task:alpha:T-1"], with_vectors=True)
    assert {p.key: p.dense for p in by_tier} == {a.minute_id: [1.0, 0, 0, 0], b.minute_id: None}
    assert engine.get_points("alpha", []) == [] and engine.get_points("gamma", [a.minute_id]) == []
    [read] = [p for p in by_tier if p.key == a.minute_id]
    assert read.payload == {**a.payload, "minute_id": a.minute_id}
    # Pending points and markers are found by no search.
    assert engine.count("alpha") == 0 and engine.count("alpha", "fact_pending") == 1


def test_many_points_of_a_tier_key_are_read_back_page_by_page(engine: Any) -> None:
    points = [fact_point("alpha", i, "retry policy", tier="task", task_id="T-9") for i in range(300)]
    engine.upsert(points)
    assert {p.key for p in engine.get_points("alpha", [], tier_keys=["task:alpha:T-9"])} == {
        p.minute_id for p in points
    }


@pytest.fixture
def wide_fetches(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many times a leg's cut fell inside a run of equal scores and the run was fetched and put in order."""
    counter: Counter[str] = Counter()
    whole_run = vectors.whole_run

    def counted(*args: Any) -> Any:
        counter["runs"] += 1
        return whole_run(*args)

    for module in (vectors, edge_module, server_module):
        monkeypatch.setattr(module, "whole_run", counted)
    return counter


@pytest.mark.parametrize("leg", ["dense", "lexical written unspread"])
@pytest.mark.parametrize("with_payload", [True, False])
def test_a_cut_inside_a_tie_keeps_the_lowest_point_ids_of_the_run_with_their_payloads(
    make_engine: EngineFactory,
    with_payload: bool,
    leg: str,
    wide_fetches: Counter[str],
) -> None:
    # 40 points share one text and one vector (one score), more than the 5 a leg keeps: the cut falls inside their
    # run. Equal vectors tie in the dense leg; the lexical leg ties where the points were written without the
    # spread (an index from before it). Written in either order, the leg keeps the run's lowest point ids, payloads
    # read for those the first fetch left out.
    plain = {} if leg == "dense" else {"lexical": LexicalEncoder(spread=0.0)}
    query = [1.0] + [0.0] * 7
    tied = [memory_point("alpha", f"t{i:02d}", "gateway outage", dense=[1.0, 0.5] + [0.0] * 6) for i in range(40)]
    best = memory_point("alpha", "best", "gateway outage gateway outage rollback", dense=query)
    expected = ["best", *sorted((p.minute_id for p in tied), key=lambda m: point_id("alpha", m))[:4]]
    for order in (tied, tied[::-1]):
        engine = make_engine(dense_dimensions=8, **plain)
        for point in order:
            engine.upsert([point])
        engine.upsert([best])
        text, dense = ("", query) if leg == "dense" else ("gateway outage rollback", None)
        found = engine.query("alpha", text, dense, SearchFilters(), 5, with_payload=with_payload)
        assert [c.minute_id for c in found] == expected
        assert all(c.payload["project_id"] == "alpha" and "timestamp_ms" in c.payload for c in found)
    assert wide_fetches["runs"] == 2  # each order's cut fell inside the run and was put in order


@pytest.mark.parametrize("with_payload", [True, False])
def test_equal_texts_score_apart_lowest_point_id_first(
    make_engine: EngineFactory, with_payload: bool, wide_fetches: Counter[str]
) -> None:
    # The lexical spread: 40 minutes of one text score apart, lowest point id highest, so the leg's cut takes the
    # same points as the total order with no second fetch, in either write order; the scores handed on are the
    # unspread ones, equal again.
    tied = [memory_point("alpha", f"t{i:02d}", "gateway outage") for i in range(40)]
    best = memory_point("alpha", "best", "gateway outage gateway outage rollback")
    expected = ["best", *sorted((p.minute_id for p in tied), key=lambda m: point_id("alpha", m))[:4]]
    for order in (tied, tied[::-1]):
        engine = make_engine()
        engine.upsert(order)
        engine.upsert([best])
        raw = engine.query("alpha", "gateway outage", None, SearchFilters(), 41, with_payload=with_payload)
        assert len({c.keyword for c in raw if c.minute_id != "best"}) == 1
        found = engine.query("alpha", "gateway outage rollback", None, SearchFilters(), 5, with_payload=with_payload)
        assert [c.minute_id for c in found] == expected
    assert wide_fetches["runs"] == 0  # no cut fell inside a run of equal scores

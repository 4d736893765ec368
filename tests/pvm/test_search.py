"""Hybrid search: candidates from a real engine, ranked by relevance, recency and importance."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from qdrant_client import QdrantClient

from contracts.memory import Insight, RankWeights, Scores, SearchFilters
from pvm.protocols import Candidate, MemoryPoint
from pvm.search import HALF_LIFE_MS, HybridSearch
from pvm.vectors.edge import EdgeEngine
from pvm.vectors.server import ServerEngine

pytestmark = pytest.mark.filterwarnings("ignore:Payload indexes have no effect")

NOW = 1_790_000_000_000
DAY = 24 * 3600 * 1000
DIMS = 8


def memory_point(
    project_id: str,
    minute_id: str,
    text: str,
    *,
    age_ms: int = 0,
    composite: float = 0.5,
    category: str = "project_knowledge",
    dense: list[float] | None = None,
) -> MemoryPoint:
    payload = {
        "project_id": project_id,
        "minute_id": minute_id,
        "agent_id": "planner",
        "event_type": "decision",
        "category": category,
        "timestamp_ms": NOW - age_ms,
        "task_id": None,
        "thread_id": None,
        "insights": [{"type": "outcome", "finding": f"about {text}", "confidence": 0.8, "applicable_contexts": ["x"]}],
        "scores": {"recency": 1.0, "relevance": 0.5, "accuracy": 0.7, "impact": 0.4, "composite": composite},
        "minute": {"id": minute_id, "project_id": project_id, "event_type": "decision", "data": {"text": text}},
    }
    return MemoryPoint(minute_id=minute_id, project_id=project_id, text=text, payload=payload, dense=dense)


class WordEmbedder:
    """A test embedder: each known word is one axis, synonyms share an axis, other words carry no meaning."""

    def __init__(self, axes: dict[str, int] | None = None, fail: bool = False) -> None:
        self.axes = axes or {}
        self.fail = fail
        self.calls = 0

    @property
    def dimensions(self) -> int:
        return DIMS

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls += 1
        if self.fail:
            raise ConnectionError("embedding endpoint unreachable")
        return [self._one(t) for t in texts]

    def _one(self, text: str) -> list[float]:
        vector = [0.01] * DIMS
        for word in text.lower().split():
            if word in self.axes:
                vector[self.axes[word]] += 1.0
        norm = math.sqrt(sum(x * x for x in vector))
        return [x / norm for x in vector]


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[EdgeEngine]:
    engine = EdgeEngine(tmp_path / "vectors")
    yield engine
    engine.close()


@pytest.fixture
def dense_engine(tmp_path: Path) -> Iterator[EdgeEngine]:
    engine = EdgeEngine(tmp_path / "dense", DIMS)
    yield engine
    engine.close()


def test_hits_carry_the_minute_category_insights_and_scores(engine: EdgeEngine) -> None:
    engine.upsert([memory_point("alpha", "m1", "gateway rollback plan", category="conflict_resolution")])
    [hit] = HybridSearch(engine).search("alpha", "rollback", now_ms=NOW)
    assert hit.minute_id == "m1"
    assert hit.minute["data"] == {"text": "gateway rollback plan"}
    assert hit.category == "conflict_resolution"
    assert hit.insights == (Insight("outcome", "about gateway rollback plan", 0.8, ("x",)),)
    assert hit.scores == Scores(recency=1.0, relevance=0.5, accuracy=0.7, impact=0.4, composite=0.5)
    assert set(hit.parts) == {"keyword", "recency", "importance"}
    assert hit.to_dict()["parts"]["keyword"] == 1.0


def test_without_a_dense_leg_the_weights_are_renormalized(engine: EdgeEngine) -> None:
    engine.upsert([memory_point("alpha", "m1", "gateway rollback", composite=1.0)])
    [hit] = HybridSearch(engine).search("alpha", "gateway rollback", now_ms=NOW)
    # keyword, recency and importance all 1: the score is 1, not 0.6 (semantic's 0.4 missing).
    assert hit.parts == {"keyword": 1.0, "recency": 1.0, "importance": 1.0}
    assert hit.score == pytest.approx(1.0)


def test_ranking_honours_the_weights(engine: EdgeEngine) -> None:
    engine.upsert(
        [
            # Strong keyword match, but a month old and unimportant.
            memory_point("alpha", "old", "gateway rollback after gateway timeout", age_ms=30 * DAY, composite=0.1),
            # Weak keyword match, fresh and important.
            memory_point("alpha", "new", "timeout seen while reviewing the schema", composite=0.9),
        ]
    )
    query = "gateway rollback timeout"
    keyword_heavy = HybridSearch(engine, weights=RankWeights(keyword=1.0, recency=0.0, importance=0.0))
    recency_heavy = HybridSearch(engine, weights=RankWeights(keyword=0.1, recency=1.0, importance=0.0))
    importance_heavy = HybridSearch(engine, weights=RankWeights(keyword=0.1, recency=0.0, importance=1.0))
    assert [h.minute_id for h in keyword_heavy.search("alpha", query, now_ms=NOW)] == ["old", "new"]
    assert [h.minute_id for h in recency_heavy.search("alpha", query, now_ms=NOW)] == ["new", "old"]
    assert [h.minute_id for h in importance_heavy.search("alpha", query, now_ms=NOW)] == ["new", "old"]
    hits = HybridSearch(engine).search("alpha", query, now_ms=NOW)
    for hit in hits:
        parts = hit.parts
        expected = (0.3 * parts["keyword"] + 0.2 * parts["recency"] + 0.1 * parts["importance"]) / 0.6
        assert hit.score == pytest.approx(expected)


def test_recency_decays_with_the_half_life(engine: EdgeEngine) -> None:
    engine.upsert(
        [
            memory_point("alpha", "now", "deploy note"),
            memory_point("alpha", "week", "deploy note", age_ms=7 * DAY),
            memory_point("alpha", "fortnight", "deploy note", age_ms=14 * DAY),
        ]
    )
    hits = HybridSearch(engine).search("alpha", "deploy", now_ms=NOW)
    assert [h.minute_id for h in hits] == ["now", "week", "fortnight"]
    recency = {h.minute_id: h.parts["recency"] for h in hits}
    assert recency == pytest.approx({"now": 1.0, "week": 0.5, "fortnight": 0.25})
    assert HALF_LIFE_MS == 7 * DAY
    daily = HybridSearch(engine, half_life_ms=DAY).search("alpha", "deploy", now_ms=NOW)
    assert {h.minute_id: h.parts["recency"] for h in daily}["week"] == pytest.approx(0.5**7)
    # A minute from the future (clock skew) counts as brand new, not more than new.
    future = HybridSearch(engine).search("alpha", "deploy", now_ms=NOW - DAY)
    assert max(h.parts["recency"] for h in future) == 1.0


def test_min_composite_filter_and_importance(engine: EdgeEngine) -> None:
    engine.upsert(
        [
            memory_point("alpha", "low", "cache warmup", composite=0.2),
            memory_point("alpha", "mid", "cache warmup", composite=0.5),
            memory_point("alpha", "high", "cache warmup", composite=0.9),
        ]
    )
    search = HybridSearch(engine)
    assert [h.minute_id for h in search.search("alpha", "cache", now_ms=NOW)] == ["high", "mid", "low"]
    hits = search.search("alpha", "cache", SearchFilters(min_composite=0.5), now_ms=NOW)
    assert [h.minute_id for h in hits] == ["high", "mid"]
    assert [h.parts["importance"] for h in hits] == [0.9, 0.5]


def test_k_and_project_are_checked(engine: EdgeEngine) -> None:
    engine.upsert([memory_point("alpha", f"m{i}", f"deploy step {i}") for i in range(12)])
    search = HybridSearch(engine)
    assert len(search.search("alpha", "deploy", k=3, now_ms=NOW)) == 3
    assert len(search.search("alpha", "deploy", k=50, now_ms=NOW)) == 12
    assert search.search("alpha", "   ", now_ms=NOW) == []
    assert search.search("beta", "deploy", now_ms=NOW) == []
    for missing in ("", None):
        with pytest.raises(ValueError, match="project_id"):
            search.search(missing, "deploy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k must"):
        search.search("alpha", "deploy", k=0)
    with pytest.raises(ValueError, match="weights"):
        HybridSearch(engine, weights=RankWeights(0, 0, 0, 0))
    with pytest.raises(ValueError, match="fusion"):
        HybridSearch(engine, fusion="sum")  # type: ignore[arg-type]


class CountingEngine:
    """Wraps an engine, recording how queries asked for payloads and which minutes were retrieved."""

    def __init__(self, inner: EdgeEngine) -> None:
        self.inner = inner
        self.with_payload: list[bool] = []
        self.retrieved: list[list[str]] = []
        self.forget: set[str] = set()  # minutes that vanish between the query and the retrieve

    def query(self, *args: Any, with_payload: bool = True) -> list[Candidate]:
        self.with_payload.append(with_payload)
        return self.inner.query(*args, with_payload=with_payload)

    def retrieve(self, project_id: str, minute_ids: Sequence[str]) -> list[Candidate]:
        self.retrieved.append(list(minute_ids))
        return [c for c in self.inner.retrieve(project_id, minute_ids) if c.minute_id not in self.forget]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_whole_payloads_are_read_only_for_the_winners(engine: EdgeEngine) -> None:
    engine.upsert([memory_point("alpha", f"m{i}", f"deploy step {i}", composite=i / 20) for i in range(20)])
    counting = CountingEngine(engine)
    search = HybridSearch(counting)  # type: ignore[arg-type]
    hits = search.search("alpha", "deploy step", k=3, now_ms=NOW)
    assert counting.with_payload == [False]
    assert counting.retrieved == [[h.minute_id for h in hits]] and len(hits) == 3
    # The same hits as ranking the candidates with their whole payloads.
    whole = engine.query("alpha", "deploy step", None, SearchFilters(), 50)
    assert HybridSearch(engine).rank(whole, NOW, 50, 3) == hits
    # A winner deleted in between is left out, not returned half-read.
    counting.forget = {hits[0].minute_id}
    fewer = search.search("alpha", "deploy step", k=3, now_ms=NOW)
    assert [h.minute_id for h in fewer] == [h.minute_id for h in hits[1:]]


def test_dense_leg_finds_what_the_words_miss(dense_engine: EdgeEngine) -> None:
    axes = {"downtime": 0, "outage": 0, "incident": 0, "payment": 1, "gateway": 2, "schema": 3, "cache": 4}
    embedder = WordEmbedder(axes)
    texts = {
        "m1": "downtime of the payment gateway",
        "m2": "schema review approved",
        "m3": "cache warmup finished",
    }
    vectors = embedder.embed(list(texts.values()))
    dense_engine.upsert(
        [memory_point("alpha", m, t, dense=v) for (m, t), v in zip(texts.items(), vectors, strict=True)]
    )
    search = HybridSearch(dense_engine, embedder)
    hits = search.search("alpha", "outage", k=1, now_ms=NOW)  # no minute says "outage"
    assert [h.minute_id for h in hits] == ["m1"]
    assert hits[0].parts["semantic"] == 1.0 and hits[0].parts["keyword"] == 0.0
    # With both legs the weights are semantic 0.4, keyword 0.3, recency 0.2, importance 0.1 over 1.0.
    [hit] = search.search("alpha", "payment outage", k=1, now_ms=NOW)
    parts = hit.parts
    assert hit.minute_id == "m1"
    expected = 0.4 * parts["semantic"] + 0.3 * parts["keyword"] + 0.2 * parts["recency"] + 0.1 * parts["importance"]
    assert hit.score == pytest.approx(expected)
    for fusion in ("minmax", "engine"):
        assert (
            HybridSearch(dense_engine, embedder, fusion=fusion).search("alpha", "outage", k=1, now_ms=NOW)[0].minute_id
            == "m1"
        )


def test_embedder_failure_falls_back_to_the_lexical_leg(
    dense_engine: EdgeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    dense_engine.upsert([memory_point("alpha", "m1", "gateway timeout", dense=[1.0] + [0.0] * (DIMS - 1))])
    failing = WordEmbedder(fail=True)
    [hit] = HybridSearch(dense_engine, failing).search("alpha", "gateway", now_ms=NOW)
    assert hit.minute_id == "m1" and "semantic" not in hit.parts
    assert failing.calls == 1 and "lexical leg only" in caplog.text


LABELED_MINUTES = {
    "db1": "Database migration of the orders table failed: lock timeout on the primary",
    "db2": "Retried the orders database migration in a maintenance window; it completed",
    "gw1": "API gateway returned 502 errors after the deploy; rolled back the gateway release",
    "gw2": "Gateway rate limits raised for the partner API after the traffic spike",
    "auth1": "Auth tokens expired early because of clock skew between the login servers",
    "auth2": "Rotated the signing keys for auth tokens; sessions stayed valid",
    "ui1": "Designer and frontend agent disagreed on the checkout button colour; design system wins",
    "ui2": "Checkout page accessibility review: contrast ratios fixed",
    "ci1": "Flaky integration tests in CI quarantined; the build pipeline is green again",
    "ci2": "CI runners ran out of disk; cache cleanup job added to the pipeline",
    "doc1": "Wrote the onboarding guide for new agents joining the fleet",
    "cost1": "Cloud spend report: storage costs doubled this month",
}
LABELED_QUERIES = [
    ("database migrations failing", {"db1", "db2"}),
    ("gateway errors after deploying", {"gw1", "gw2"}),
    ("expired auth token", {"auth1", "auth2"}),
    ("checkout design disagreement", {"ui1", "ui2"}),
    ("flaky tests in the pipeline", {"ci1", "ci2"}),
]


@pytest.mark.parametrize("backend", ["edge", "server"])
def test_labeled_mini_set_ranks_the_right_minutes_first(backend: str, tmp_path: Path) -> None:
    engine: Any = EdgeEngine(tmp_path / "v") if backend == "edge" else ServerEngine(QdrantClient(":memory:"))
    try:
        engine.upsert([memory_point("alpha", m, t) for m, t in LABELED_MINUTES.items()])
        # Another project with the same words must not leak in.
        engine.upsert([memory_point("beta", f"beta-{m}", t) for m, t in LABELED_MINUTES.items()])
        search = HybridSearch(engine)
        for query, relevant in LABELED_QUERIES:
            hits = search.search("alpha", query, k=2, now_ms=NOW)
            assert {h.minute_id for h in hits} == relevant, query
    finally:
        engine.close()

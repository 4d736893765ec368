"""Hybrid search: candidates from a real engine, ranked by relevance, recency and importance."""

from __future__ import annotations

import logging
import math
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from qdrant_client import QdrantClient

from contracts import Minute
from contracts import fact_changes as fc
from contracts.facts import GLOBAL_KEY, Fact, FactStatus, TierKey
from contracts.memory import FactHit, Insight, RankWeights, Scores, SearchFilters, SearchHit
from pvm import defaults, vectors
from pvm.embedders import OpenAIEmbedder
from pvm.protocols import Candidate, MemoryPoint
from pvm.search import (
    DENSE_COOLDOWN_S,
    HALF_LIFE_MS,
    DenseLegBreaker,
    HybridSearch,
    LongThreads,
    SearchResult,
    ThreadWindows,
    _dense_share,
    _thread_lifted,
    _with_adjacent,
)
from pvm.vectors.edge import EdgeEngine
from pvm.vectors.server import ServerEngine
from tests.openai_server import Fault, OpenAIServer, Status, delay, embed_text, status
from workers.index import fact_points

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
    parts: float | None = None,
    score_recency: float = 1.0,
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
        "scores": {
            "recency": score_recency,
            "relevance": 0.5 if parts is None else parts,
            "accuracy": 0.7 if parts is None else parts,
            "impact": 0.4 if parts is None else parts,
            "composite": composite,
        },
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
    engine.upsert([memory_point("alpha", "m1", "gateway rollback", composite=1.0, parts=1.0)])
    [hit] = HybridSearch(engine).search("alpha", "gateway rollback", now_ms=NOW)
    # keyword, recency and importance all 1: the score is 1, not 0.6 (semantic's 0.4 missing).
    assert hit.parts == {"keyword": 1.0, "recency": 1.0, "importance": 1.0}
    assert hit.score == pytest.approx(1.0)


def test_ranking_honours_the_weights(engine: EdgeEngine) -> None:
    engine.upsert(
        [
            # Strong keyword match, but a month old and unimportant.
            memory_point("alpha", "old", "gateway rollback after gateway timeout", age_ms=30 * DAY, parts=0.1),
            # Weak keyword match, fresh and important.
            memory_point("alpha", "new", "timeout seen while reviewing the schema", parts=0.9),
        ]
    )
    query = "gateway rollback timeout"
    keyword_heavy = HybridSearch(engine, weights=RankWeights(keyword=1.0, recency=0.0, importance=0.0))
    recency_heavy = HybridSearch(engine, weights=RankWeights(keyword=0.1, recency=1.0, importance=0.0))
    importance_heavy = HybridSearch(engine, weights=RankWeights(keyword=0.1, recency=0.0, importance=1.0))
    assert [h.minute_id for h in keyword_heavy.search("alpha", query, now_ms=NOW)] == ["old", "new"]
    # Recency and importance are a prior: whatever their weights, the better match stays first ...
    assert [h.minute_id for h in recency_heavy.search("alpha", query, now_ms=NOW)] == ["old", "new"]
    assert [h.minute_id for h in importance_heavy.search("alpha", query, now_ms=NOW)] == ["old", "new"]
    # ... unless the caller asks for the newest.
    assert [h.minute_id for h in recency_heavy.search("alpha", query, now_ms=NOW, prefer="recent")] == ["new", "old"]
    hits = HybridSearch(engine).search("alpha", query, now_ms=NOW)
    share = defaults.SEARCH_PRIOR_SHARE
    for hit in hits:
        parts = hit.parts
        prior = (0.2 * parts["recency"] + 0.1 * parts["importance"]) / 0.3
        assert hit.score == pytest.approx((1 - share) * parts["keyword"] + share * prior)


def test_an_old_minute_that_matches_outranks_a_new_one_that_does_not(engine: EdgeEngine) -> None:
    # Eight months old and the answer, against a minute of yesterday that shares a word of the question.
    engine.upsert(
        [
            memory_point("alpha", "answer", "decided: the billing engine database is PostgreSQL", age_ms=240 * DAY),
            memory_point("alpha", "chatter", "checked the billing engine database dashboards", age_ms=DAY),
        ]
    )
    hits = HybridSearch(engine).search("alpha", "which database did the billing engine use, PostgreSQL?", now_ms=NOW)
    assert [h.minute_id for h in hits] == ["answer", "chatter"]


def test_recency_breaks_near_ties_and_leads_when_the_query_asks_for_the_newest(engine: EdgeEngine) -> None:
    engine.upsert(
        [
            memory_point("alpha", "first", "the billing engine datastore is PostgreSQL", age_ms=200 * DAY),
            memory_point("alpha", "switch", "billing engine datastore switched to CockroachDB", age_ms=20 * DAY),
            memory_point("alpha", "twin", "the billing engine datastore is PostgreSQL", age_ms=100 * DAY),
        ]
    )
    search = HybridSearch(engine, fusion="max")  # with three candidates min-max would put the weakest at 0
    # Equal matches: the newer first.
    assert [h.minute_id for h in search.search("alpha", "billing engine PostgreSQL", now_ms=NOW)][:2] == [
        "twin",
        "first",
    ]
    # "currently" asks for the newest: the switch leads though "is" matches the older minutes' wording better.
    asked = search.search("alpha", "which datastore is the billing engine currently on", now_ms=NOW)
    assert asked[0].minute_id == "switch" and "newness" in asked[0].parts
    plain = search.search("alpha", "which datastore is the billing engine on", now_ms=NOW)
    assert "newness" not in plain[0].parts
    # The caller can ask for the newest, or forbid it whatever the query says.
    assert search.search("alpha", "billing engine datastore", now_ms=NOW, prefer="recent")[0].minute_id == "switch"
    relevant = search.search("alpha", "billing engine datastore now", now_ms=NOW, prefer="relevant")
    assert "newness" not in relevant[0].parts
    with pytest.raises(ValueError, match="prefer='newest' is not one of relevant, recent"):
        search.search("alpha", "billing", now_ms=NOW, prefer="newest")  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["edge", "server"])
def test_importance_does_not_count_recency_twice(tmp_path: Path, kind: str) -> None:
    # Same words, same time, same relevance, accuracy and impact; the stored composite differs only because
    # one was scored while fresh (its recency part 1) and the other long after (0). Ranking reads recency
    # from the timestamp, so the composite's recency must not order them.
    points = [
        memory_point("alpha", "scored-fresh", "deploy note", composite=0.8, score_recency=1.0),
        memory_point("alpha", "scored-late", "deploy note", composite=0.5, score_recency=0.0),
    ]
    engine: Any = EdgeEngine(tmp_path / "v") if kind == "edge" else ServerEngine(QdrantClient(":memory:"))
    try:
        engine.upsert(points)
        hits = HybridSearch(engine).search("alpha", "deploy note", now_ms=NOW)
        assert {h.minute_id: h.parts["importance"] for h in hits} == pytest.approx(
            {"scored-fresh": (0.5 + 0.7 + 0.4) / 3, "scored-late": (0.5 + 0.7 + 0.4) / 3}
        )
        assert hits[0].score == pytest.approx(hits[1].score)
    finally:
        engine.close()


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
            memory_point("alpha", "low", "cache warmup", composite=0.2, parts=0.2),
            memory_point("alpha", "mid", "cache warmup", composite=0.5, parts=0.5),
            memory_point("alpha", "high", "cache warmup", composite=0.9, parts=0.9),
        ]
    )
    search = HybridSearch(engine)
    assert [h.minute_id for h in search.search("alpha", "cache", now_ms=NOW)] == ["high", "mid", "low"]
    hits = search.search("alpha", "cache", SearchFilters(min_composite=0.5), now_ms=NOW)
    assert [h.minute_id for h in hits] == ["high", "mid"]
    assert [h.parts["importance"] for h in hits] == pytest.approx([0.9, 0.5])


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
        self.fused: list[bool] = []  # whether each query asked for Qdrant's fusion of the legs
        self.retrieved: list[list[str]] = []
        self.forget: set[str] = set()  # minutes that vanish between the query and the retrieve

    def query(self, *args: Any, with_payload: bool = True, **kwargs: Any) -> list[Candidate]:
        self.with_payload.append(with_payload)
        self.fused.append(kwargs.get("fused", True))
        return self.inner.query(*args, with_payload=with_payload, **kwargs)

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
    # Relevance is semantic 0.4 and keyword 0.3 over 0.7; recency 0.2 and importance 0.1 are the prior.
    [hit] = search.search("alpha", "payment outage", k=1, now_ms=NOW)
    parts = hit.parts
    assert hit.minute_id == "m1"
    relevance = (0.4 * parts["semantic"] + 0.3 * parts["keyword"]) / 0.7
    prior = (0.2 * parts["recency"] + 0.1 * parts["importance"]) / 0.3
    share = defaults.SEARCH_PRIOR_SHARE
    assert hit.score == pytest.approx((1 - share) * relevance + share * prior)
    for fusion in ("minmax", "engine", "rrf"):
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


# A provider outage at query time ----------------------------------------------------------------------------------

PROVIDER_DIMS = 16
OUTAGE_MINUTES = {
    "g1": "gateway rollback after the deploy",
    "g2": "gateway timeout during the release",
    "s1": "schema review approved",
}


@pytest.fixture
def provider_engine(tmp_path: Path) -> Iterator[EdgeEngine]:
    """An engine holding OUTAGE_MINUTES with the vectors the test server gives them."""
    engine = EdgeEngine(tmp_path / "provider", PROVIDER_DIMS)
    engine.upsert([memory_point("alpha", m, t, dense=embed_text(t, PROVIDER_DIMS)) for m, t in OUTAGE_MINUTES.items()])
    yield engine
    engine.close()


def provider_search(server: OpenAIServer, engine: EdgeEngine, cooldown_s: float = DENSE_COOLDOWN_S) -> HybridSearch:
    """A search embedding queries at the test server, with the index pool's full retry policy configured."""
    embedder = OpenAIEmbedder(
        server.base_url,
        "sk-test",
        "test-embed",
        dimensions=PROVIDER_DIMS,
        max_retries=5,
        backoff_base=0.01,
        backoff_max=0.05,
        query_timeout=0.3,
    )
    return HybridSearch(engine, embedder, dense_cooldown_s=cooldown_s)


@pytest.mark.parametrize("fault", [status(500), delay(30)], ids=["500", "hang"])
def test_a_failing_provider_gets_one_query_request_and_the_answer_is_lexical_and_says_so(
    openai_server: OpenAIServer, provider_engine: EdgeEngine, fault: Fault
) -> None:
    openai_server.fail_next(fault, times=10)
    result = provider_search(openai_server, provider_engine).search_result("alpha", "gateway", now_ms=NOW)
    assert len(openai_server.requests) == 1  # one try, although batches get 5 retries
    assert {h.minute_id for h in result.hits} == {"g1", "g2"}
    assert all("semantic" not in h.parts for h in result.hits)
    assert result.degraded is not None and result.degraded.startswith("dense leg skipped: query embedding failed")
    assert ("HTTP 500" if isinstance(fault, Status) else "timed out after 0.3s") in result.degraded


def test_during_the_cooldown_searches_send_the_provider_nothing(
    openai_server: OpenAIServer, provider_engine: EdgeEngine
) -> None:
    openai_server.fail_next(status(503), times=10)
    search = provider_search(openai_server, provider_engine, cooldown_s=3600)
    first = search.search_result("alpha", "gateway", now_ms=NOW)
    assert len(openai_server.requests) == 1 and search.dense_breaker.is_open
    openai_server.reset()  # the provider is healthy again, but the cool-down is not over
    second = search.search_result("alpha", "gateway rollback", now_ms=NOW)
    assert openai_server.requests == []
    assert second.hits[0].minute_id == "g1" and "semantic" not in second.hits[0].parts
    assert second.degraded is not None and second.degraded.startswith("dense leg skipped: query embedding failed")
    assert "HTTP 503" in second.degraded and "next try in" in second.degraded
    assert first.hits and search.search("alpha", "schema", now_ms=NOW)[0].minute_id == "s1"
    assert openai_server.requests == []


def test_after_the_cooldown_a_search_tries_again_and_dense_results_return(
    openai_server: OpenAIServer, provider_engine: EdgeEngine
) -> None:
    search = provider_search(openai_server, provider_engine, cooldown_s=0.0)  # every search after a failure is a trial
    openai_server.fail_next(status(500), times=2)
    assert search.search_result("alpha", "gateway", now_ms=NOW).degraded
    still_down = search.search_result("alpha", "gateway", now_ms=NOW)
    assert len(openai_server.requests) == 2 and still_down.degraded and search.dense_breaker.is_open
    # The provider is healthy: the next search's trial succeeds and the dense leg is back.
    healed = search.search_result("alpha", "gateway", now_ms=NOW)
    assert len(openai_server.requests) == 3 and healed.degraded is None and not search.dense_breaker.is_open
    assert {h.minute_id for h in healed.hits} >= {"g1", "g2"}
    assert all("semantic" in h.parts for h in healed.hits)
    assert healed.hits[0].parts["semantic"] > 0
    search.search_result("alpha", "schema review", now_ms=NOW)
    assert len(openai_server.requests) == 4  # closed again: every search embeds its query


def test_the_breaker_warns_once_per_opening(
    openai_server: OpenAIServer, provider_engine: EdgeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    search = provider_search(openai_server, provider_engine, cooldown_s=0.0)
    openai_server.fail_next(status(500), times=3)
    with caplog.at_level(logging.INFO, logger="pvm.search"):
        for _ in range(3):
            assert search.search_result("alpha", "gateway", now_ms=NOW).degraded
        assert search.search_result("alpha", "gateway", now_ms=NOW).degraded is None
    warnings = [r.getMessage() for r in caplog.records if r.name == "pvm.search" and r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # the opening, then the recovery; not one per failed search
    assert "lexical leg only" in warnings[0] and "HTTP 500" in warnings[0]
    assert "work again" in warnings[1]


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_breaker_lets_one_search_try_after_the_cooldown() -> None:
    clock = ManualClock()
    breaker = DenseLegBreaker(10.0, clock=clock)
    assert breaker.admit() is None and not breaker.is_open
    assert breaker.failed("query embedding failed: HTTP 500") is True
    assert breaker.failed("query embedding failed: HTTP 502") is False  # already open: no second warning
    clock.now += 4
    assert breaker.admit() == "dense leg skipped: query embedding failed: HTTP 502 (next try in 6.0s)"
    clock.now += 6
    # Many searches at once after the cool-down: exactly one is the trial.
    answers: list[str | None] = []
    start = threading.Barrier(8)

    def ask() -> None:
        start.wait()
        answers.append(breaker.admit())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers.count(None) == 1
    assert all(a is not None and a.startswith("dense leg skipped: ") for a in answers if a is not None)
    # A trial that never reports back holds the others off for one cool-down, no longer.
    clock.now += 10
    assert breaker.admit() is None
    assert breaker.succeeded() is True and breaker.admit() is None and not breaker.is_open
    assert breaker.succeeded() is False
    with pytest.raises(ValueError, match="dense_cooldown_s"):
        DenseLegBreaker(-1)


# -- facts beside the minutes: kinds, fact filters, as_of, tenancy (issue 10, item 5) -----------------------------


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


SOURCE = "01J0000000000000000000SRC1"


def fact(
    project: str = "alpha",
    value: str = "30 minutes",
    *,
    attribute: str = "session_ttl",
    type: str = "decision",
    task: str | None = None,
    at_ms: int = NOW - 3 * DAY,
    text: str | None = None,
) -> Fact:
    tier_key = TierKey.for_task(project, task) if task else TierKey.for_project(project)
    return Fact.new(
        type=type,
        text=text or f"auth sessions last {value}",
        subject="service:auth",
        attribute=attribute,
        value=value,
        tier_key=tier_key,
        confidence=0.9,
        source_minute_ids=(SOURCE,),
        valid_from=iso(at_ms),
        recorded_at=iso(at_ms),
    )


def index_changes(engine: Any, minutes: Sequence[Minute], first_seq: int = 1) -> None:
    """What the index pool's fact step does with a batch of knowledge changes (workers/index/fact_points.py)."""
    changes, unparsed = fact_points.parse(
        (m, first_seq + i, fact_points.instant_ms(m.timestamp)) for i, m in enumerate(minutes)
    )
    assert unparsed == []
    by_tenant: dict[str, list[fact_points.ParsedChange]] = {}
    for c in changes:
        by_tenant.setdefault(c.tenant, []).append(c)
    for tenant, of_tenant in by_tenant.items():
        keys, cleared = fact_points.needed(of_tenant)
        stored = {p.key: p for p in engine.get_points(tenant, keys, tier_keys=cleared, with_vectors=True)}
        planned = fact_points.plan(tenant, of_tenant, stored)
        if planned.points:
            engine.upsert(planned.points)


def promoted(f: Fact, at_ms: int | None = None) -> list[Minute]:
    at = iso(at_ms) if at_ms is not None else f.recorded_at
    return [fc.asserted_minute(f, timestamp=at), fc.promoted_minute(f, timestamp=at)]


@pytest.fixture(params=["edge", "server"])
def both_engines(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    engine: Any = EdgeEngine(tmp_path / "facts") if request.param == "edge" else ServerEngine(QdrantClient(":memory:"))
    yield engine
    engine.close()


def fact_ids(hits: Sequence[Any]) -> list[str]:
    return [h.fact_id for h in hits if isinstance(h, FactHit)]


def test_a_search_returns_minutes_facts_or_both_and_says_which(both_engines: Any) -> None:
    ttl = fact()
    index_changes(both_engines, promoted(ttl))
    both_engines.upsert([memory_point("alpha", "m1", "auth sessions expire too soon", age_ms=DAY)])
    search = HybridSearch(both_engines)
    [minute] = search.search("alpha", "auth sessions", now_ms=NOW)  # minutes by default, as before
    assert isinstance(minute, SearchHit) and minute.kind == "minute" and minute.minute_id == "m1"
    [found] = search.search("alpha", "auth sessions", now_ms=NOW, kinds=("fact",))
    assert isinstance(found, FactHit) and found.kind == "fact" and found.fact_id == ttl.id
    # Facts come back Fact-shaped: the contract reads them.
    assert Fact.from_dict(found.fact) == ttl.with_(status=FactStatus.PROMOTED)
    assert set(found.parts) == {"keyword", "recency", "importance"} and 0 < found.score <= 1
    result = search.search_result("alpha", "auth sessions", k=5, now_ms=NOW, kinds=("minute", "fact"))
    assert [h.minute_id for h in result.hits] == ["m1"] and fact_ids(result.facts) == [ttl.id]
    assert {h.kind for h in result.ranked} == {"minute", "fact"}
    assert [h.score for h in result.ranked] == sorted((h.score for h in result.ranked), reverse=True)
    assert FactHit.from_dict(found.to_dict()) == found and found.to_dict()["kind"] == "fact"


def test_facts_are_narrowed_by_type_tier_and_status(both_engines: Any) -> None:
    decision = fact()
    constraint = fact(value="never on friday", attribute="deploy", type="constraint")
    in_task = fact(value="10 minutes", task="T-1")
    pending = fact(value="5 minutes", attribute="retry", type="preference")
    retracted = fact(value="1 minute", attribute="timeout")
    index_changes(
        both_engines,
        [
            *promoted(decision),
            *promoted(constraint),
            *promoted(in_task),
            fc.asserted_minute(pending),
            *promoted(retracted),
            fc.retracted_minute(retracted, "wrong"),
        ],
    )
    search = HybridSearch(both_engines)

    def found(**kwargs: Any) -> set[str]:
        return set(fact_ids(search.search("alpha", "auth sessions deploy retry timeout", k=20, now_ms=NOW, **kwargs)))

    assert found(kinds=("fact",)) == {decision.id, constraint.id, in_task.id}
    assert found(kinds=("fact",), fact_types=("constraint",)) == {constraint.id}
    assert found(kinds=("fact",), tiers=("task",)) == {in_task.id}
    assert found(kinds=("fact",), statuses=("pending",)) == {pending.id}
    assert found(kinds=("fact",), statuses=("retracted",)) == {retracted.id}
    assert found(kinds=("fact",), statuses=("promoted", "pending"), fact_types=("preference",)) == {pending.id}
    assert found(kinds=("fact",), filters=SearchFilters(task_id="T-1")) == {in_task.id}
    assert found() == set()  # minutes only by default


def test_as_of_returns_what_was_valid_then(both_engines: Any) -> None:
    monday, wednesday = NOW - 4 * DAY, NOW - 2 * DAY
    old = fact(at_ms=monday)
    new = fact(value="15 minutes", at_ms=wednesday)
    index_changes(
        both_engines,
        [
            *promoted(old),
            fc.asserted_minute(new, timestamp=iso(wednesday)),
            fc.superseded_minute(old, new, timestamp=iso(wednesday)),
            fc.promoted_minute(new, timestamp=iso(wednesday)),
        ],
    )
    both_engines.upsert(
        [
            memory_point("alpha", "before", "auth sessions discussed", age_ms=3 * DAY),
            memory_point("alpha", "after", "auth sessions shortened", age_ms=DAY),
        ]
    )
    search = HybridSearch(both_engines)

    def values(as_of: Any, **kwargs: Any) -> list[str]:
        hits = search.search("alpha", "auth sessions", k=10, kinds=("fact",), as_of=as_of, **kwargs)
        return [h.fact["value"] for h in hits if isinstance(h, FactHit)]

    assert values(None) == ["15 minutes"]  # current knowledge
    assert values(iso(monday + DAY)) == ["30 minutes"]  # before the supersession: the old value
    assert values(monday + DAY) == ["30 minutes"]  # Unix ms
    assert values(datetime.fromtimestamp((wednesday + DAY) / 1000, UTC)) == ["15 minutes"]
    assert values(iso(wednesday)) == ["15 minutes"]  # valid_until is exclusive, valid_from inclusive
    assert values(iso(wednesday - 1)) == ["30 minutes"]
    assert values(iso(monday - 1)) == []  # before anything was known
    assert values(iso(monday + DAY), statuses=("promoted",)) == []  # statuses are today's
    # Minutes written after as_of are left out too.
    as_of_tuesday = search.search_result(
        "alpha", "auth sessions", k=10, kinds=("minute", "fact"), as_of=iso(monday + DAY)
    )
    assert [h.minute_id for h in as_of_tuesday.hits] == ["before"]
    assert [h.fact["value"] for h in as_of_tuesday.facts] == ["30 minutes"]
    minutes_then = search.search("alpha", "auth sessions", k=10, as_of=monday + DAY)
    assert [h.minute_id for h in minutes_then if isinstance(h, SearchHit)] == ["before"]


def test_a_fact_recorded_after_as_of_is_not_returned_for_it(both_engines: Any) -> None:
    # Backdated: known on wednesday to hold since monday. On tuesday PVM did not know it.
    backdated = fact(at_ms=NOW - 4 * DAY).with_(recorded_at=iso(NOW - 2 * DAY))
    index_changes(both_engines, promoted(backdated, NOW - 2 * DAY))
    search = HybridSearch(both_engines)
    assert search.search("alpha", "auth sessions", kinds=("fact",), as_of=NOW - 3 * DAY) == []
    assert fact_ids(search.search("alpha", "auth sessions", kinds=("fact",), as_of=NOW - DAY)) == [backdated.id]


def test_cleared_task_memory_leaves_the_current_view_and_stays_in_the_past(both_engines: Any) -> None:
    in_task = fact(task="T-1")
    cleared_at = NOW - DAY
    index_changes(
        both_engines,
        [
            *promoted(in_task),
            fc.task_memory_cleared_minute(TierKey.for_task("alpha", "T-1"), "done", timestamp=iso(cleared_at)),
        ],
    )
    search = HybridSearch(both_engines)
    assert search.search("alpha", "auth sessions", kinds=("fact",)) == []
    assert fact_ids(search.search("alpha", "auth sessions", kinds=("fact",), as_of=cleared_at - 1)) == [in_task.id]
    assert search.search("alpha", "auth sessions", kinds=("fact",), as_of=cleared_at) == []


def test_global_facts_only_when_asked_for(both_engines: Any) -> None:
    mine = fact()
    index_changes(
        both_engines, [*promoted(mine), fc.learned_minute("session ttl", "1 hour", GLOBAL_KEY, project_id="beta")]
    )
    search = HybridSearch(both_engines)
    default = search.search("alpha", "session ttl auth", k=10, kinds=("fact",))
    assert fact_ids(default) == [mine.id]
    asked = search.search("alpha", "session ttl auth", k=10, kinds=("fact",), tiers=("task", "project", "global"))
    assert {h.fact["tier_key"] for h in asked if isinstance(h, FactHit)} == {"project:alpha", "global"}
    only_global = search.search("gamma", "session ttl", k=10, kinds=("fact",), tiers=("global",))
    assert [h.fact["value"] for h in only_global if isinstance(h, FactHit)] == ["1 hour"]
    assert search.search("gamma", "session ttl", k=10, kinds=("fact",)) == []


def test_search_arguments_are_checked_naming_the_argument(engine: EdgeEngine) -> None:
    search = HybridSearch(engine)
    for kwargs, name in (
        ({"kinds": ("chunk",)}, "kinds"),
        ({"kinds": ()}, "kinds"),
        ({"kinds": "fact"}, "kinds"),
        ({"kinds": ("fact",), "tiers": ("galaxy",)}, "tiers"),
        ({"kinds": ("fact",), "tiers": ()}, "tiers"),
        ({"kinds": ("fact",), "fact_types": ("rumour",)}, "fact_types"),
        ({"kinds": ("fact",), "statuses": ("maybe",)}, "statuses"),
        ({"as_of": "yesterday"}, "as_of"),
        ({"as_of": datetime(2026, 1, 1)}, "as_of"),  # naive: no offset
        ({"as_of": True}, "as_of"),
    ):
        with pytest.raises(ValueError, match=name):
            search.search("alpha", "auth", **kwargs)
    with pytest.raises(ValueError, match="project_id"):
        search.search("", "auth", kinds=("fact",))
    assert search.search("alpha", "auth", kinds=("fact",), as_of=datetime.now(UTC) - timedelta(days=1)) == []
    assert SearchResult([]).ranked == []


TENANCY_PROJECTS = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True)


@pytest.mark.parametrize("backend", ["edge", "server"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    projects=st.lists(TENANCY_PROJECTS, min_size=1, max_size=4, unique=True),
    placements=st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from(["task", "project", "global"]), st.integers(0, 2)),
        min_size=1,
        max_size=10,
    ),
    stranger=TENANCY_PROJECTS,
)
def test_fact_search_never_returns_another_projects_facts_and_global_ones_only_when_asked(
    backend: str, projects: list[str], placements: list[tuple[int, str, int]], stranger: str
) -> None:
    """Random facts in random projects and tiers: a project's fact search sees its own facts, and global ones
    only when its tiers name the global tier; never another project's."""
    words = ["deploy window", "retry budget", "session ttl"]
    with tempfile.TemporaryDirectory() as tmp:
        engine: Any = EdgeEngine(Path(tmp)) if backend == "edge" else ServerEngine(QdrantClient(":memory:"))
        try:
            minutes: list[Minute] = []
            for i, (p, tier, w) in enumerate(placements):
                project = projects[p % len(projects)]
                if tier == "global":
                    minutes.append(fc.learned_minute(f"{words[w]} {i}", f"v{i}", GLOBAL_KEY, project_id=project))
                else:
                    f = fact(project, f"v{i}", attribute=f"{words[w]} {i}", task="T-1" if tier == "task" else None)
                    minutes += promoted(f)
            index_changes(engine, minutes)
            query = " ".join(words)
            for project in [*projects, stranger]:
                own = search_facts(engine, project, query, ("task", "project"))
                assert all(h.fact["tier_key"].split(":")[1] == project for h in own)
                with_global = search_facts(engine, project, query, ("task", "project", "global"))
                assert all(
                    h.fact["tier_key"] in ("global", f"project:{project}", f"task:{project}:T-1") for h in with_global
                )
                assert {h.fact_id for h in own} <= {h.fact_id for h in with_global}
                expected_global = sum(t == "global" for _, t, _ in placements)
                assert sum(h.fact["tier_key"] == "global" for h in with_global) == expected_global
                assert sum(h.fact["tier_key"] != "global" for h in with_global) == len(own)
        finally:
            engine.close()


def search_facts(engine: Any, project: str, query: str, tiers: tuple[str, ...]) -> list[FactHit]:
    hits = HybridSearch(engine).search(project, query, k=50, kinds=("fact",), tiers=tiers, now_ms=NOW)
    assert all(isinstance(h, FactHit) for h in hits)
    return [h for h in hits if isinstance(h, FactHit)]


@pytest.mark.parametrize("kind", ["edge", "server"])
def test_an_evaluation_annotation_sets_the_importance_ranking_reads(tmp_path: Path, kind: str) -> None:
    # Indexed with high scores; the evaluate pool then scores it low. Ranking must read the new scores,
    # not the ones the point was written with.
    points = [memory_point("alpha", "rescored", "deploy note", composite=0.8)]
    engine: Any = EdgeEngine(tmp_path / "v") if kind == "edge" else ServerEngine(QdrantClient(":memory:"))
    try:
        engine.upsert(points)
        before = HybridSearch(engine).search("alpha", "deploy note", now_ms=NOW)[0].parts["importance"]
        scores = {"composite": 0.1, "recency": 0.1, "relevance": 0.1, "accuracy": 0.1, "impact": 0.1}
        assert engine.annotate("alpha", {"rescored": {"scores": scores}}) == 1
        after = HybridSearch(engine).search("alpha", "deploy note", now_ms=NOW)[0].parts["importance"]
        assert before > 0.3 and after == pytest.approx(0.1)
    finally:
        engine.close()


NOISE = [0.0] * (DIMS - 1) + [1.0]  # where the noise embedder points every text


class NoiseEmbedder:
    """A dense leg that knows nothing: every text embeds to `NOISE`."""

    dimensions = DIMS

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [NOISE for _ in texts]


def noise_search(engine: EdgeEngine, rollbacks: Sequence[str]) -> HybridSearch:
    """`rollbacks` (texts that say "rollback", ids r0, r1, ...) beside 12 standup notes the noise leg points at."""
    points = [
        memory_point("alpha", f"r{i}", text, dense=[1.0] + [0.0] * (DIMS - 1)) for i, text in enumerate(rollbacks)
    ]
    points += [memory_point("alpha", f"n{i}", f"standup notes {i}", dense=NOISE) for i in range(12)]
    engine.upsert(points)
    return HybridSearch(engine, NoiseEmbedder(), RankWeights(*defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS))


def test_a_dense_leg_that_disagrees_with_the_words_does_not_outvote_them(dense_engine: EdgeEngine) -> None:
    # The dense leg knows nothing here (it points every query at minutes the words do not name): with the default
    # weights (semantic 0.6 : keyword 0.1) it would bury the only minutes that say "rollback". The legs share none of
    # their top candidates, so the default fusion gives the dense leg no more than SEARCH_AGREE_FLOOR of relevance.
    search = noise_search(dense_engine, [f"rollback of release {i}" for i in range(3)])
    hits = search.search("alpha", "rollback", k=3, now_ms=NOW)
    assert {h.minute_id for h in hits} == {"r0", "r1", "r2"}
    assert all(h.parts["agreement"] == 0.0 for h in hits)


def candidate(minute_id: str, keyword: float | None, keyword_rank: int | None, semantic_rank: int | None) -> Candidate:
    extra: dict[str, float] = {}
    if keyword_rank is not None:
        extra["keyword_rank"] = keyword_rank
    if semantic_rank is not None:
        extra["semantic_rank"] = semantic_rank
    return Candidate(minute_id, {}, keyword or 0.0, 0.5 if semantic_rank else 0.0, 0.0, extra)


def share_of(candidates: list[Candidate]) -> float:
    keyword = HybridSearch(None, None)._leg(candidates, "keyword", 50)  # type: ignore[arg-type]
    return _dense_share(candidates, keyword, 0.6 / 0.7).share


def test_the_dense_share_needs_a_reason_from_the_query_and_falls_to_the_floor_without_one() -> None:
    configured = 0.6 / 0.7
    # Words with a clear best (20 falling to 2) and a dense leg whose ten picks the words never found: the floor.
    words = [candidate(f"w{i}", 20.0 - 2 * i, i + 1, None) for i in range(10)]
    dense = [candidate(f"d{i}", None, None, i + 1) for i in range(10)]
    assert share_of(words + dense) == pytest.approx(defaults.SEARCH_AGREE_FLOOR)
    # The same dense picks, each found by the words too (below their top ten, at about half the best score):
    # the words back the dense leg, so it gets its configured share.
    backed = [candidate(f"d{i}", 11.0, 11 + i, i + 1) for i in range(10)]
    assert share_of(words + backed) == pytest.approx(configured)
    # Words tied (a paraphrase matching only its common words, evenly): they single nothing out.
    flat = [candidate(f"w{i}", 7.2, i + 1, None) for i in range(10)]
    assert share_of(flat + dense) == pytest.approx(configured)
    # Half of it: half the way from the floor.
    half_flat = [candidate(f"w{i}", 10.0 - 0.1 * i, i + 1, None) for i in range(10)]  # 9% down: flatness 0.55
    assert share_of(half_flat + dense) == pytest.approx(
        defaults.SEARCH_AGREE_FLOOR + (configured - defaults.SEARCH_AGREE_FLOOR) * (1 - 0.09 / 0.2)
    )
    # The words found nothing: the dense leg is all there is.
    assert share_of(dense) == pytest.approx(configured)


def test_each_legs_best_candidates_are_in_the_answer_by_the_dense_share(dense_engine: EdgeEngine) -> None:
    # A dense leg that points every query at minutes the words do not name gets the floor's share, and the floor's
    # share of the places kept for the legs' own best: the words' best fill the rest, and the hits say which.
    search = noise_search(dense_engine, ["rollback " * (6 - i) + f"release {i}" for i in range(6)])
    hits = search.search("alpha", "rollback", k=10, now_ms=NOW)
    places = round(defaults.SEARCH_LEG_SLOTS * 10)
    dense_places = round(places * defaults.SEARCH_AGREE_FLOOR)
    kept = [h for h in hits if "slot" in h.parts]
    assert len(kept) == places and hits[:places] == kept
    assert sum(h.minute_id.startswith("n") for h in kept) == dense_places
    assert {h.minute_id for h in kept if h.minute_id.startswith("r")} == {f"r{i}" for i in range(places - dense_places)}
    assert all(h.parts["dense_share"] == pytest.approx(defaults.SEARCH_AGREE_FLOOR) for h in hits)
    # What set the share, in every hit's parts: no agreement, no support, and words that single out their minutes.
    assert {(h.parts["agreement"], h.parts["support"], h.parts["flatness"]) for h in hits} == {(0.0, 0.0, 0.0)}
    # With k=3 one place is kept, and it goes to the words: the noise leg's picks never lead.
    assert {h.minute_id for h in search.search("alpha", "rollback", k=3, now_ms=NOW)} == {"r0", "r1", "r2"}


def test_legs_that_agree_keep_the_configured_weights(dense_engine: EdgeEngine) -> None:
    # Ten minutes both legs find, in different orders: agreement 1, so relevance is the configured semantic : keyword.
    axes = {"rollback": 0}
    embedder = WordEmbedder(axes)
    points = []
    for i in range(10):
        vector = [0.0] * DIMS
        vector[0], vector[1 + i % (DIMS - 1)] = 1.0 + i / 10, 1.0
        points.append(memory_point("alpha", f"m{i}", "rollback " + "plan " * i, dense=vector))
    dense_engine.upsert(points)
    weights = RankWeights(*defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS)
    for hit in HybridSearch(dense_engine, embedder, weights).search("alpha", "rollback", k=10, now_ms=NOW):
        p = hit.parts
        assert p["agreement"] == 1.0
        relevance = (weights.semantic * p["semantic"] + weights.keyword * p["keyword"]) / (
            weights.semantic + weights.keyword
        )
        prior = (weights.recency * p["recency"] + weights.importance * p["importance"]) / (
            weights.recency + weights.importance
        )
        share = defaults.SEARCH_PRIOR_SHARE
        slot = 1.0 if "slot" in p else 0.0  # each leg's best few rank above the rest (`HybridSearch._slots`)
        assert hit.score == pytest.approx((1 - share) * relevance + share * prior + slot)
        assert p["dense_share"] == pytest.approx(weights.semantic / (weights.semantic + weights.keyword))


def test_a_hit_lifts_the_minutes_of_its_thread(engine: EdgeEngine) -> None:
    # Multi-hop: the answer spans two minutes of a thread, and only the first says the question's words.
    def threaded(minute_id: str, text: str, thread: str | None) -> MemoryPoint:
        point = memory_point("alpha", minute_id, text)
        point.payload["thread_id"] = thread
        return point

    points = [
        threaded("a", "vendor contract blocked the deploy", "t1"),
        threaded("b", "deploy resumed after the signature", "t1"),
    ]
    points += [threaded(f"c{i}", f"vendor deploy notes {i}", None) for i in range(8)]
    engine.upsert(points)
    hits = HybridSearch(engine).search("alpha", "vendor contract deploy", k=2, now_ms=NOW)
    assert [h.minute_id for h in hits] == ["a", "b"]
    assert hits[1].parts["thread"] == pytest.approx(hits[0].score * defaults.SEARCH_THREAD_DECAY)


def test_a_threads_lifted_minutes_keep_the_order_of_their_own_scores_not_their_age(engine: EdgeEngine) -> None:
    # A long thread (a session of a conversation): the hit lifts its thread's others, and among them the one that
    # says more of the question comes first, though it is the oldest (lifted alike, the newest would have led).
    def threaded(minute_id: str, text: str, age_ms: int) -> MemoryPoint:
        point = memory_point("alpha", minute_id, text, age_ms=age_ms)
        point.payload["thread_id"] = "session-1"
        return point

    engine.upsert(
        [
            threaded("hit", "the vendor contract blocked the deploy on friday", 5_000),
            threaded("older", "the vendor contract was signed", 9_000),
            threaded("newer", "a vendor called", 1_000),
        ]
    )
    hits = HybridSearch(engine).search("alpha", "vendor contract blocked deploy", k=3, now_ms=NOW)
    assert [h.minute_id for h in hits] == ["hit", "older", "newer"]
    assert all("thread" in h.parts for h in hits[1:])
    assert hits[1].score > hits[2].score


def test_a_long_threads_minutes_far_from_the_hit_are_not_lifted(engine: EdgeEngine) -> None:
    # A day's conversation as one thread: a minute at a time, the hit in the middle. What was said within
    # SEARCH_THREAD_NEAR places of the hit (in time, among the thread's candidates) is lifted; the rest of the
    # session keeps its own score, below minutes of other threads that match the question better.
    reach = defaults.SEARCH_THREAD_NEAR
    session = [f"s{i:02d}" for i in range(12)]
    hit_at = 6

    def said(minute_id: str, text: str, age_ms: int, thread: str) -> MemoryPoint:
        point = memory_point("alpha", minute_id, text, age_ms=age_ms)
        point.payload["thread_id"] = thread
        return point

    points = [
        said(
            m,
            "the vendor contract blocked the deploy" if i == hit_at else f"we talked about lunch {i} and the deploy",
            (12 - i) * 60_000,
            "day-1",
        )
        for i, m in enumerate(session)
    ]
    # Four minutes of other threads fill the top five with the hit: no other minute of the day is a top hit.
    points += [said(f"o{i}", f"vendor contract review {i}", 3_600_000 + i, f"other-{i}") for i in range(4)]
    engine.upsert(points)
    hits = HybridSearch(engine).search("alpha", "vendor contract blocked deploy", k=len(points), now_ms=NOW)
    assert hits[0].minute_id == session[hit_at]
    lifted = {h.minute_id for h in hits if "thread" in h.parts}
    assert lifted == {session[i] for i in range(hit_at - reach, hit_at + reach + 1) if i != hit_at}
    order = [h.minute_id for h in hits]
    assert order[1 : 1 + 2 * reach] and set(order[1 : 1 + 2 * reach]) == lifted
    far = [order.index(m) for m in session if m not in lifted and m != session[hit_at]]
    assert min(far) > max(order.index(f"o{i}") for i in range(4))  # the others' better matches come first


def test_the_lift_counts_places_among_all_the_threads_minutes_and_the_hits_next_minutes_come_in(
    engine: EdgeEngine,
) -> None:
    # A day's conversation, a minute at a time. Three of its minutes say the question's words: the hit (s06) and
    # s03 and s09, three turns away. Among the thread's candidates they sit side by side, but in the thread they
    # are three places apart: beyond SEARCH_THREAD_NEAR, so neither is lifted. The turns right before and after
    # the hit (s05, s07) share no word with the question; they come in as its adjacent minutes, below it.
    assert defaults.SEARCH_THREAD_NEAR < 3
    session = [f"s{i:02d}" for i in range(12)]
    hit_at, words_at = 6, {3, 6, 9}

    def said(minute_id: str, text: str, age_ms: int, thread: str) -> MemoryPoint:
        point = memory_point("alpha", minute_id, text, age_ms=age_ms)
        point.payload["thread_id"] = thread
        return point

    text = {hit_at: "the vendor contract blocked the deploy", 3: "a vendor called", 9: "the vendor again"}
    points = [
        said(m, text.get(i, f"we talked about lunch {i}"), (12 - i) * 60_000, "day-1") for i, m in enumerate(session)
    ]
    points += [said(f"o{i}", f"vendor contract review {i}", 3_600_000 + i, f"other-{i}") for i in range(4)]
    engine.upsert(points)
    hits = HybridSearch(engine).search("alpha", "vendor contract blocked deploy", k=len(points), now_ms=NOW)
    by_id = {h.minute_id: h for h in hits}
    assert hits[0].minute_id == session[hit_at]
    assert not any("thread" in h.parts for h in hits)
    adjacent = {h.minute_id for h in hits if "adjacent" in h.parts}
    assert adjacent == {session[hit_at - 1], session[hit_at + 1]}
    for m in adjacent:
        assert by_id[m].score == pytest.approx(hits[0].score * defaults.SEARCH_ADJACENT_DECAY)
    # Minutes two places away are no candidates (no word of the question) and not adjacent: they stay out.
    assert set(by_id) == {session[i] for i in words_at} | adjacent | {f"o{i}" for i in range(4)}


def ranked_candidate(
    minute_id: str,
    keyword: tuple[float, int] | None,
    semantic: tuple[float, int] | None,
    thread: str | None = None,
) -> Candidate:
    """A candidate as the engine returns it: each leg's (score, rank) where that leg found it."""
    extra: dict[str, float] = {}
    if keyword is not None:
        extra["keyword_rank"] = keyword[1]
    if semantic is not None:
        extra["semantic_rank"] = semantic[1]
    payload = {"timestamp_ms": NOW, "thread_id": thread}
    return Candidate(minute_id, payload, keyword[0] if keyword else 0.0, semantic[0] if semantic else 0.0, 0.0, extra)


def test_a_thread_whose_minutes_match_the_words_and_the_meaning_ranks_as_one_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # "w" says the question's words and nothing of its meaning; "m" the meaning in other words; both in thread t1.
    # Ten other minutes match both legs well but not best. Alone, "w" would rank last (the trusted dense leg misses
    # it); as part of its thread it ranks with "m", at SEARCH_THREAD_MATCH of the thread's best of each leg.
    monkeypatch.setattr(defaults, "SEARCH_LEG_SLOTS", 0.0)  # neither the legs' own places ...
    monkeypatch.setattr(defaults, "SEARCH_THREAD_HITS", 0)  # ... nor the lift from top hits: the match alone
    candidates = [
        ranked_candidate("w", (10.0, 1), (0.10, 12), "t1"),
        ranked_candidate("m", (1.0, 12), (0.90, 1), "t1"),
    ]
    candidates += [ranked_candidate(f"x{i}", (9.0 - 0.1 * i, 2 + i), (0.85 - 0.01 * i, 2 + i)) for i in range(10)]
    search = HybridSearch(None, WordEmbedder(), RankWeights(*defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS))  # type: ignore[arg-type]
    hits = search.rank(candidates, NOW, limit=50, k=12)
    assert [h.minute_id for h in hits[:2]] == ["m", "w"] or [h.minute_id for h in hits[:2]] == ["w", "m"]
    for hit in hits[:2]:
        assert hit.parts["thread_match"] == pytest.approx(defaults.SEARCH_THREAD_MATCH)  # both legs' best: 1 and 1
    assert all("thread_match" not in h.parts for h in hits[2:])  # no thread: as they were
    # Without the thread, "w" is what the words alone back: last.
    alone = [replace(c, payload={**c.payload, "thread_id": None}) for c in candidates]
    assert search.rank(alone, NOW, limit=50, k=12)[-1].minute_id == "w"


def test_a_long_threads_match_reaches_only_the_minutes_around_its_best_of_each_leg(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As above, in a day's conversation: "w" (the words) and "m" (the meaning) a minute apart among twelve minutes
    # of session s1 that match neither leg much. The thread's relevance reaches the minutes within
    # SEARCH_THREAD_NEAR places in time of "w" or "m", not the session's far end.
    monkeypatch.setattr(defaults, "SEARCH_LEG_SLOTS", 0.0)
    monkeypatch.setattr(defaults, "SEARCH_THREAD_HITS", 0)
    reach = defaults.SEARCH_THREAD_NEAR

    def at(candidate: Candidate, minute: int) -> Candidate:
        return replace(candidate, payload={**candidate.payload, "timestamp_ms": NOW - (20 - minute) * 60_000})

    candidates = [
        at(ranked_candidate("w", (10.0, 1), (0.10, 14), "s1"), 3),
        at(ranked_candidate("m", (1.0, 14), (0.90, 1), "s1"), 4),
    ]
    others = [n for n in range(12) if n not in (3, 4)]
    candidates += [
        at(ranked_candidate(f"s{n:02d}", (0.5, 4 + i), (0.05, 4 + i), "s1"), n) for i, n in enumerate(others)
    ]
    candidates += [ranked_candidate(f"x{i}", (9.0 - 0.1 * i, 2 + i), (0.85 - 0.01 * i, 2 + i)) for i in range(2)]
    search = HybridSearch(None, WordEmbedder(), RankWeights(*defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS))  # type: ignore[arg-type]
    hits = search.rank(candidates, NOW, limit=50, k=len(candidates))
    matched = {h.minute_id for h in hits if "thread_match" in h.parts}
    near = {f"s{n:02d}" for n in range(3 - reach, 4 + reach + 1) if n not in (3, 4)}
    assert matched == {"w", "m"} | near
    assert all(h.minute_id.startswith("s") for h in hits[-len(others) + len(near) :])  # the far end: last, as it was


def test_words_that_single_nothing_out_get_no_place_of_their_own() -> None:
    # Ten dense picks the words never found; the words' ten tied (a paraphrase matching only common words): the
    # dense leg keeps its configured share and its places, and the words' one place goes to the fused score.
    dense = [ranked_candidate(f"d{i}", None, (0.9 - 0.01 * i, i + 1)) for i in range(10)]
    search = HybridSearch(None, WordEmbedder(), RankWeights(*defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS))  # type: ignore[arg-type]

    def kept(words: list[Candidate]) -> set[str]:
        return {h.minute_id for h in search.rank(words + dense, NOW, limit=50, k=10) if "slot" in h.parts}

    places = round(defaults.SEARCH_LEG_SLOTS * 10)
    dense_places = round(places * 0.6 / 0.7)
    flat = [ranked_candidate(f"w{i}", (7.2, i + 1), None) for i in range(10)]
    assert kept(flat) == {f"d{i}" for i in range(dense_places)}
    # Words with a clear best keep theirs (and there the legs disagree: the floor's share of the places).
    falling = [ranked_candidate(f"w{i}", (20.0 - 2 * i, i + 1), None) for i in range(10)]
    floor_places = round(places * defaults.SEARCH_AGREE_FLOOR)
    assert kept(falling) == {f"d{i}" for i in range(floor_places)} | {f"w{i}" for i in range(places - floor_places)}


class FixedEmbedder:
    """Every text embeds to one vector (the query's direction in these tests)."""

    dimensions = DIMS

    def __init__(self, vector: list[float]) -> None:
        self.vector = vector

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self.vector for _ in texts]


def unit(*pairs: tuple[int, float]) -> list[float]:
    vector = [0.0] * DIMS
    for axis, value in pairs:
        vector[axis] = value
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector]


class ThreadQueryCounter:
    """The real engine, counting the dense queries filtered to one thread (what the neighbours cost)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.thread_queries: list[str] = []

    def query(self, project_id: str, text: str, dense: Any, filters: SearchFilters, limit: int, **kw: Any) -> Any:
        if filters.thread_id is not None:
            self.thread_queries.append(filters.thread_id)
        return self.inner.query(project_id, text, dense, filters, limit, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("kind", ["edge", "server"])
def test_a_top_hit_brings_in_its_thread_neighbours_that_the_dense_leg_finds_near_the_query(
    tmp_path: Path, kind: str
) -> None:
    # Thread t1 in time: a, b, c, d. The question's words are b's; the dense leg finds b and 60 other minutes
    # nearer the query than a, so a is no candidate. a is just before b and near the query (0.8): it comes in. c,
    # just after b, is far from the query (0.3): it stays out. d is not next to b.
    def threaded(minute_id: str, text: str, dense: list[float], minute: int) -> MemoryPoint:
        point = memory_point("alpha", minute_id, text, dense=dense, age_ms=(10 - minute) * 60_000)
        point.payload["thread_id"] = "t1"
        return point

    points = [
        threaded("a", "vendor call scheduled", unit((0, 0.8), (1, 0.6)), 1),
        threaded("b", "rollback of the payments release", unit((0, 1.0)), 2),
        threaded("c", "lunch order placed", unit((0, 0.3), (2, 0.95)), 3),
        threaded("d", "release notes drafted", unit((0, 0.8), (3, 0.6)), 4),
    ]
    points += [
        memory_point("alpha", f"x{i}", f"standup notes {i}", dense=unit((0, 0.9), (4 + i % 4, 0.44))) for i in range(60)
    ]
    inner: Any = (
        EdgeEngine(tmp_path / "v", DIMS)
        if kind == "edge"
        else ServerEngine(QdrantClient(":memory:"), dense_dimensions=DIMS)
    )
    inner.upsert(points)
    engine = ThreadQueryCounter(inner)
    weights = RankWeights(*defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS)
    search = HybridSearch(engine, FixedEmbedder(unit((0, 1.0))), weights)  # type: ignore[arg-type]
    hits = search.search("alpha", "rollback", k=3, now_ms=NOW)
    by_id = {h.minute_id: h for h in hits}
    assert hits[0].minute_id == "b" and "a" in by_id
    assert by_id["a"].score == pytest.approx(hits[0].score * defaults.SEARCH_NEIGHBOUR_DECAY)
    assert by_id["a"].parts["neighbour"] == pytest.approx(by_id["a"].score)
    assert by_id["a"].parts["semantic_similarity"] == pytest.approx(0.8, abs=1e-3)
    wide = {h.minute_id: h for h in search.search("alpha", "rollback", k=10, now_ms=NOW)}  # 50 candidates a leg
    assert "neighbour" in wide["a"].parts and "d" not in wide
    # c is no neighbour the dense leg vouches for; as the minute right after the top hit it comes in all the same,
    # at the lower adjacent decay (below the dense leg's neighbour).
    assert "neighbour" not in wide["c"].parts
    assert wide["c"].score == pytest.approx(wide["b"].score * defaults.SEARCH_ADJACENT_DECAY)
    assert wide["c"].score < wide["a"].score
    assert engine.thread_queries and set(engine.thread_queries) == {"t1"}
    assert len(engine.thread_queries) == 2  # one per search: the thread is read once however many hits it has
    # Lexical only (no dense leg to say what is near the query): no dense neighbours, no thread query; the top
    # hit's adjacent minutes both come in, at the adjacent decay.
    engine.thread_queries.clear()
    lexical = HybridSearch(engine, None, RankWeights(*defaults.SEARCH_WEIGHTS))  # type: ignore[arg-type]
    found = {h.minute_id: h for h in lexical.search("alpha", "rollback", k=3, now_ms=NOW)}
    assert set(found) == {"a", "b", "c"} and all("neighbour" not in h.parts for h in found.values())
    assert found["a"].parts["adjacent"] == pytest.approx(found["b"].score * defaults.SEARCH_ADJACENT_DECAY)
    assert engine.thread_queries == []
    inner.close()


# -- light points: the minute itself comes from the durable minutes, not the engine ------------------------------


class DurableMinutesDouble:
    """A `pvm.protocols.MinuteSource` over a dict, counting its calls (the real one reads Redis, then the log)."""

    def __init__(self, minutes: dict[str, dict[str, Any]]) -> None:
        self.minutes = minutes
        self.calls: list[list[str]] = []

    def minutes_by_id(self, project_id: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        self.calls.append(list(ids))
        mine = {i: m for i, m in self.minutes.items() if m["project_id"] == project_id}
        return {i: dict(mine[i]) for i in ids if i in mine}

    def ask(self, project_id: str, ids: Sequence[str]) -> AskedDouble:
        return AskedDouble(self, project_id, list(ids))


@dataclass
class AskedDouble:
    """What `DurableMinutesDouble.ask` answers: the minutes read when `read` is called (a call of its source)."""

    source: DurableMinutesDouble
    project_id: str
    ids: list[str]

    def read(self, ids: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        wanted = self.ids if ids is None else list(ids)
        return self.source.minutes_by_id(self.project_id, wanted) if wanted else {}

    def drop(self) -> None:
        pass


def light_point(project_id: str, minute_id: str, text: str) -> MemoryPoint:
    """A point as the index pool writes it now: what search filters and ranks on, without the minute."""
    point = memory_point(project_id, minute_id, text)
    payload = {k: v for k, v in point.payload.items() if k != "minute"}
    return MemoryPoint(minute_id=minute_id, project_id=project_id, text=text, payload=payload)


def test_hits_of_light_points_read_the_whole_minute_from_the_durable_minutes_in_one_call(engine: EdgeEngine) -> None:
    engine.upsert([light_point("alpha", f"m{i}", f"gateway rollback step {i}") for i in range(4)])
    whole = {f"m{i}": {"id": f"m{i}", "project_id": "alpha", "memory_note": f"step {i}"} for i in range(4)}
    source = DurableMinutesDouble(whole)
    hits = HybridSearch(engine, minutes=source).search("alpha", "gateway rollback", k=3, now_ms=NOW)
    assert len(hits) == 3
    assert all(isinstance(h, SearchHit) and h.minute == whole[h.minute_id] for h in hits)
    assert len(source.calls) == 1 and sorted(source.calls[0]) == sorted(h.minute_id for h in hits)
    assert hits[0].category == "project_knowledge" and hits[0].scores is not None  # the rest from the point


def test_points_written_with_the_whole_minute_keep_reading_it_from_the_engine(engine: EdgeEngine) -> None:
    engine.upsert(
        [memory_point("alpha", "old", "gateway rollback plan"), light_point("alpha", "new", "gateway rollback")]
    )
    source = DurableMinutesDouble({"new": {"id": "new", "project_id": "alpha"}})
    hits = HybridSearch(engine, minutes=source).search("alpha", "gateway rollback", now_ms=NOW)
    by_id = {h.minute_id: h for h in hits}
    assert by_id["old"].minute["data"] == {"text": "gateway rollback plan"}  # as it was stored
    assert by_id["new"].minute == {"id": "new", "project_id": "alpha"}
    assert source.calls == [["new"]]  # only the light point was looked up


def test_a_light_hit_whose_minute_is_found_nowhere_is_left_out(engine: EdgeEngine) -> None:
    engine.upsert([light_point("alpha", "m1", "gateway rollback"), light_point("alpha", "m2", "gateway rollback")])
    source = DurableMinutesDouble({"m2": {"id": "m2", "project_id": "alpha"}})
    hits = HybridSearch(engine, minutes=source).search("alpha", "gateway rollback", now_ms=NOW)
    assert [h.minute_id for h in hits] == ["m2"]
    # No source (a caller that indexed its own points): ranked as stored, without a minute to show.
    without = HybridSearch(engine).search("alpha", "gateway rollback", now_ms=NOW)
    assert sorted(h.minute_id for h in without) == ["m1", "m2"] and all(h.minute == {} for h in without)


def test_hits_without_payloads_hold_their_minutes_and_with_payloads_reads_only_the_points_of_the_hits_given(
    engine: EdgeEngine,
) -> None:
    engine.upsert([light_point("alpha", f"m{i}", f"gateway rollback step {i}") for i in range(6)])
    engine.upsert([memory_point("alpha", "old", "gateway rollback plan")])  # holds its minute; in no minute source
    source = DurableMinutesDouble(
        {f"m{i}": {"id": f"m{i}", "project_id": "alpha", "memory_note": f"{i}"} for i in range(6)}
    )
    counting = CountingEngine(engine)
    search = HybridSearch(counting, minutes=source)  # type: ignore[arg-type]
    whole = search.search_result("alpha", "gateway rollback", k=7, now_ms=NOW).hits
    counting.retrieved.clear()
    light = search.search_result("alpha", "gateway rollback", k=7, now_ms=NOW, payloads=False).hits
    assert len(whole) == 7
    assert [(h.minute_id, h.score, h.parts, h.minute) for h in light] == [
        (h.minute_id, h.score, h.parts, h.minute) for h in whole
    ]
    assert all(h.category == "" and h.insights == () and h.scores is None for h in light)
    assert counting.retrieved == [["old"]]  # only the point that holds its minute, for the minute
    chosen = [light[4], light[1]]
    counting.retrieved.clear()
    assert search.with_payloads("alpha", chosen) == [whole[4], whole[1]]
    assert counting.retrieved == [[light[4].minute_id, light[1].minute_id]]
    # A point deleted in between is left out, not returned half-read.
    counting.forget = {light[4].minute_id}
    assert search.with_payloads("alpha", chosen) == [whole[1]]
    assert search.with_payloads("alpha", []) == []
    # No minute source (a caller that indexed its own points): the hits as stored, whole.
    plain = HybridSearch(engine)
    assert (
        plain.search_result("alpha", "gateway rollback", k=7, now_ms=NOW, payloads=False).hits
        == plain.search_result("alpha", "gateway rollback", k=7, now_ms=NOW).hits
    )


@pytest.mark.parametrize("kind", ["edge", "server"])
def test_only_fusion_engine_asks_the_engine_to_fuse_and_the_legs_alone_find_the_same(tmp_path: Path, kind: str) -> None:
    # Qdrant's fusion runs each leg a second time inside the engine; only fusion "engine" reads its score.
    inner: Any = (
        EdgeEngine(tmp_path / "e", DIMS)
        if kind == "edge"
        else ServerEngine(QdrantClient(":memory:"), dense_dimensions=DIMS)
    )
    try:
        embedder = WordEmbedder({"outage": 0, "incident": 0, "deploy": 1})
        texts = ["outage on the gateway", "deploy of the gateway", "incident review notes", "gateway cache tuning"]
        inner.upsert([memory_point("alpha", f"m{i}", t, dense=embedder.embed([t])[0]) for i, t in enumerate(texts * 3)])
        query = embedder.embed(["gateway incident"])[0]
        legs = inner.query("alpha", "gateway incident", query, SearchFilters(), 5, fused=False)
        both = inner.query("alpha", "gateway incident", query, SearchFilters(), 5)
        assert {c.minute_id for c in legs} == {c.minute_id for c in both}
        by_id = {c.minute_id: c for c in both}
        for c in legs:
            assert (c.keyword, c.semantic, c.extra) == (by_id[c.minute_id].keyword, by_id[c.minute_id].semantic,
                                                        by_id[c.minute_id].extra)  # fmt: skip
            assert c.fused == max(c.keyword, c.semantic) and c.payload == by_id[c.minute_id].payload
        counting = CountingEngine(inner)
        for fusion in ("agree", "minmax", "max", "rrf", "engine"):
            HybridSearch(counting, embedder, fusion=fusion).search("alpha", "gateway incident", now_ms=NOW)  # type: ignore[arg-type]
        assert counting.fused == [False, False, False, False, True]
    finally:
        inner.close()


class ReadCountingEngine:
    """Wraps an engine, counting the thread reads a search makes."""

    def __init__(self, inner: EdgeEngine) -> None:
        self.inner = inner
        self.in_threads_calls: list[list[str]] = []
        self.around_calls = 0
        self.around_long: list[bool] = []  # whether each around read was told the thread is long

    def in_threads(self, project_id: str, filters: SearchFilters, thread_ids: Sequence[str], limit: int) -> Any:
        self.in_threads_calls.append(sorted(thread_ids))
        return self.inner.in_threads(project_id, filters, thread_ids, limit)

    def around(self, *args: Any, long: bool = False) -> Any:
        self.around_calls += 1
        self.around_long.append(long)
        return self.inner.around(*args, long=long)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_thread_windows_read_the_hits_threads_together_and_cut_the_windows_around_cuts(
    engine: EdgeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Three short threads and one longer than WINDOW_WHOLE_THREAD (here 4), with a run of equal timestamps. Each
    # window is the one `around` reads, whether the threads were read together, one at a time, or the long one
    # was known long; short threads are read in one call, and a thread found long is not tried whole again.
    monkeypatch.setattr(vectors, "WINDOW_WHOLE_THREAD", 4)

    def said(minute_id: str, thread: str, ms: int) -> MemoryPoint:
        point = memory_point("alpha", minute_id, "step", age_ms=0)
        point.payload.update(thread_id=thread, timestamp_ms=NOW - 100_000 + ms)
        return point

    points = [said(f"{t}{i}", f"th-{t}", 1000 * i) for t in "abc" for i in range(3)]
    points += [said(f"l{i}", "th-long", 1000 * min(i, 4)) for i in range(9)]  # l4..l8 written in one millisecond
    engine.upsert(points)
    minutes = engine.retrieve("alpha", [p.minute_id for p in points])
    reach = max(defaults.SEARCH_THREAD_NEAR, 1)
    expected = {
        m.minute_id: [
            c.minute_id for c in engine.around("alpha", SearchFilters(thread_id=m.payload["thread_id"]), m, reach)
        ]
        for m in minutes
    }
    long = LongThreads()

    def windows_of(read_first: Sequence[Any]) -> tuple[dict[str, list[str]], ReadCountingEngine]:
        counting = ReadCountingEngine(engine)
        window = ThreadWindows(counting, "alpha", SearchFilters(), long)  # type: ignore[arg-type]
        window.read(read_first)
        return {m.minute_id: [c.minute_id for c in window(m)] for m in minutes}, counting

    shorts = [m for m in minutes if m.payload["thread_id"] != "th-long"]
    together, counting = windows_of(shorts)
    assert together == expected
    assert counting.in_threads_calls[0] == ["th-a", "th-b", "th-c"]
    assert len(counting.in_threads_calls) == 2  # the short threads in one read; the long one found long alone
    assert ("alpha", "th-long") in long
    assert counting.around_calls == 9  # each of the long thread's minutes read in time order ...
    assert all(counting.around_long)  # ... at once, not tried whole again
    alone, _ = windows_of([])
    assert alone == expected
    everything, counting = windows_of(minutes)
    assert everything == expected
    assert counting.in_threads_calls == [["th-a", "th-b", "th-c"]]  # the known long thread is not tried whole
    # A read that stops inside the long thread tells nothing of the others: each is read alone, and still cut right.
    fresh = LongThreads()
    counting = ReadCountingEngine(engine)
    window = ThreadWindows(counting, "alpha", SearchFilters(), fresh)  # type: ignore[arg-type]
    window.read([m for m in minutes if m.minute_id in ("a0", "l0")])
    assert counting.in_threads_calls[:2] == [["th-a", "th-long"], ["th-a"]]  # th-long alone only if not seen long
    assert ("alpha", "th-long") in fresh and ("alpha", "th-a") not in fresh
    assert {m.minute_id: [c.minute_id for c in window(m)] for m in minutes} == expected


def test_thread_windows_are_read_only_where_they_could_change_the_best_k(engine: EdgeEngine) -> None:
    # Thread th-a holds a0..a5 one second apart; only a0, a3 and a5 are candidates (a3 is next to a0 among the
    # candidates, three places from it among all the thread's minutes). Thread th-b: b0 alone among the candidates.
    # A window is read only when what it decides could reach the best k; the best k are those of a search that
    # reads every window.
    def said(minute_id: str, thread: str, ms: int) -> MemoryPoint:
        point = memory_point("alpha", minute_id, "step", age_ms=0)
        point.payload.update(thread_id=thread, timestamp_ms=NOW - 100_000 + ms)
        return point

    points = [said(f"a{i}", "th-a", 1000 * i) for i in range(6)] + [said(f"b{i}", "th-b", 1000 * i) for i in range(3)]
    others = [f"o{i}" for i in range(3)]  # no thread
    engine.upsert([*points, *(memory_point("alpha", m, "other") for m in others)])
    by_id = {c.minute_id: c for c in engine.retrieve("alpha", ["a0", "a3", "a5", "b0", *others])}

    def scored_as(scores: dict[str, float]) -> list[tuple[float, int, str, Candidate, dict[str, float]]]:
        ranked = [(s, int(by_id[m].payload["timestamp_ms"]), m, by_id[m], {"keyword": s}) for m, s in scores.items()]
        return sorted(ranked, key=lambda s: (-s[0], -s[1], s[2]))

    def lifted(scores: dict[str, float], k: int | None) -> tuple[list[tuple[str, float]], list[list[str]]]:
        counting = ReadCountingEngine(engine)
        window = ThreadWindows(counting, "alpha", SearchFilters(), LongThreads())  # type: ignore[arg-type]
        out = _thread_lifted(scored_as(scores), window, k)
        return [(m, score) for score, _, m, _, _ in out], counting.in_threads_calls

    # Below the best SEARCH_THREAD_HITS (5), a3 and a5 would be lifted to 0.97 at most, below b0 (0.99): with
    # k = 2 no window is read, and the best 2 agree.
    scores = {"a0": 1.0, "b0": 0.99, "o0": 0.95, "o1": 0.94, "o2": 0.93, "a3": 0.5, "a5": 0.4}
    skipped, reads = lifted(scores, 2)
    every, every_reads = lifted(scores, None)
    assert reads == [] and every_reads == [["th-a"]]
    assert skipped[:2] == every[:2] == [("a0", 1.0), ("b0", 0.99)]
    assert skipped == every  # read, a3 is three places from a0 among all the thread's minutes: it is not lifted
    # With k = 3, a3 lifted (0.97) would outrank the 3rd (o0, 0.95): th-a is read, and a3 stays where it was.
    read_k3, reads = lifted(scores, 3)
    assert reads == [["th-a"]]
    assert read_k3[:3] == every[:3]
    # A hit lifts itself to its thread's lift (a3, a second hit of th-a, to 0.97 of a0's 0.95), but only as an
    # anchor whose window is read: read where a3 is among the best k (k >= 3), not where it could not reach them.
    scores = {"b0": 1.0, "a0": 0.95, "a3": 0.9, "o0": 0.8, "o1": 0.7}
    want, _ = lifted(scores, None)
    assert dict(want)["a3"] == pytest.approx(0.95 * defaults.SEARCH_THREAD_DECAY, abs=1e-5)
    for k in (1, 2, 3, 4, 5):
        got, reads = lifted(scores, k)
        assert got[:k] == want[:k], k
        assert reads == ([["th-a"]] if k >= 3 else []), k

    # The adjacent minutes: brought in at SEARCH_ADJACENT_DECAY of a hit's score, at or below the k-th they never
    # show, and the hit's window is not read.
    best = [(s, by_id[m], {"keyword": s}) for m, s in (("a3", 1.0), ("b0", 0.95), ("o0", 0.9), ("o1", 0.85))]
    counting = ReadCountingEngine(engine)
    window = ThreadWindows(counting, "alpha", SearchFilters(), LongThreads())  # type: ignore[arg-type]
    assert _with_adjacent(best, 4, window) == best
    assert counting.in_threads_calls == []
    floor_low = [*best[:3], (0.68, by_id["o1"], {"keyword": 0.68})]  # 0.7 of a3's 1.0 above the 4th: a2 comes in
    with_all = _with_adjacent(floor_low, 4 + 10, window)[:4]
    counting.in_threads_calls.clear()
    fresh = ThreadWindows(counting, "alpha", SearchFilters(), LongThreads())  # type: ignore[arg-type]
    got = _with_adjacent(floor_low, 4, fresh)
    assert got == with_all
    assert [c.minute_id for _, c, parts in got if "adjacent" in parts] == ["a2"]  # a4 ties it, below the best 4
    assert counting.in_threads_calls == [["th-a"]]  # b0's (0.665) would not reach the 4th (0.68): not read

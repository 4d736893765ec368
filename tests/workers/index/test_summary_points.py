"""Summary points: a thread's chunks and episodes found by search, with the minutes they stand for (issue 12 item 6).

Real Redis (the summarize pool's batches), the real index queue (the job the pool hands over) and the real
embedded engine (qdrant-edge) the job writes to and the search reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from contracts import Minute, encode_minute, keys
from contracts.memory import SearchHit, SummaryHit
from pvm.config import Settings
from pvm.protocols import SUMMARY, SUMMARY_RETIRED
from pvm.search import HybridSearch
from pvm.stores.log import LogWriter
from pvm.vectors.edge import EdgeEngine
from tests.workers.summarize.test_summarize_pool import conversation, records, said
from workers.index import pool as index_pool
from workers.index import summary_points
from workers.ops.replay import index_replayed_summaries, replay_summaries
from workers.runtime.jobs import job_function
from workers.runtime.queues import pool_queue
from workers.summarize.pool import SummarizeContext, summarize_batch
from workers.summarize.threads import ThreadShape

NOW_MS = 1_800_000_000_000


@pytest.fixture
def ctx(redis_client: redis.Redis, settings: Settings) -> SummarizeContext:
    return SummarizeContext.build(redis_client, settings)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[EdgeEngine]:
    e = EdgeEngine(tmp_path / "vectors")
    yield e
    e.close()


def handed_over(connection: redis.Redis) -> list[tuple[str, list[dict[str, Any]]]]:
    """The summary-point jobs on the index queue, oldest first, as (project, threads); the queue emptied."""
    queue = pool_queue("index", connection)
    jobs = [j for j in queue.jobs if j.func_name == keys.SUMMARY_POINTS_JOB]
    queue.empty()
    return [(j.args[0], j.args[1]) for j in jobs]


def index_handed_over(connection: redis.Redis, engine: EdgeEngine) -> int:
    """Run every handed-over job as the index worker would (its body, on the real engine); how many ran."""
    jobs = handed_over(connection)
    for project_id, threads in jobs:
        summary_points.index_summaries(engine, None, project_id, threads)
    return len(jobs)


def summarize(ctx: SummarizeContext, connection: redis.Redis, minutes: Sequence[Minute], batch: int = 30) -> None:
    for start in range(0, len(minutes), batch):
        summarize_batch(ctx, connection, records(minutes[start : start + batch], start + 1))


def test_a_search_returns_chunk_and_episode_summaries_with_their_source_minutes_when_asked(
    ctx: SummarizeContext, redis_client: redis.Redis, engine: EdgeEngine
) -> None:
    minutes = conversation(40)  # 20 stay verbatim: one chunk of the first 10 ... and the next 10
    summarize(ctx, redis_client, minutes)
    assert index_handed_over(redis_client, engine) >= 1
    assert engine.count("p1", kind=SUMMARY) > 0
    search = HybridSearch(engine)

    # the default stays minutes only (none are indexed here): no summary answers
    assert search.search("p1", "pin the cache layer canary", k=10, now_ms=NOW_MS) == []

    found = search.search("p1", "pin the cache layer canary", k=10, now_ms=NOW_MS, kinds=("summary",))
    assert found and all(isinstance(h, SummaryHit) and h.kind == "summary" for h in found)
    chunks = [h for h in found if isinstance(h, SummaryHit) and h.of == "chunk"]
    episodes = [h for h in found if isinstance(h, SummaryHit) and h.of == "episode"]
    assert {tuple(h.sources) for h in chunks} == {
        tuple(m.id for m in minutes[:10]),
        tuple(m.id for m in minutes[10:20]),
    }
    decisions = {m.id for m in minutes if m.event_type == "decision"}
    assert episodes and all(set(h.sources) <= decisions and h.sources for h in episodes)
    assert all(h.thread == "thread:deploy-42" and h.text and h.record["id"] for h in found if isinstance(h, SummaryHit))
    assert SummaryHit.from_dict(chunks[0].to_dict()) == chunks[0]
    # recency is the newest source's: the chunk of minutes 11-20 is newer than that of 1-10
    by_first = {h.sources[0]: h for h in chunks}
    assert by_first[minutes[10].id].parts["recency"] > by_first[minutes[0].id].parts["recency"]

    # minutes and summaries ranked together
    engine.upsert(index_pool.build_points(index_pool.decode(records(minutes))[0]))
    result = search.search_result("p1", "pin the cache layer canary", k=10, now_ms=NOW_MS, kinds=("minute", "summary"))
    assert result.hits and result.summaries
    assert {type(h) for h in result.ranked} == {SearchHit, SummaryHit}
    assert [h.score for h in result.ranked] == sorted((h.score for h in result.ranked), reverse=True)


def test_a_merged_chunk_keeps_its_sources_and_the_chunks_it_merged_never_answer(
    ctx: SummarizeContext, redis_client: redis.Redis, engine: EdgeEngine
) -> None:
    ctx.shape = ThreadShape(recent=20, chunk=10, max_chunks=2)
    minutes = conversation(70)  # 5 chunks of 10: the oldest merge down to 2
    for start in range(0, 70, 10):  # batch by batch, each handed-over job run before the next batch
        summarize_batch(ctx, redis_client, records(minutes[start : start + 10], start + 1))
        index_handed_over(redis_client, engine)
    search = HybridSearch(engine)
    found = [
        h
        for h in search.search("p1", "rollout canary cache latency", k=50, now_ms=NOW_MS, kinds=("summary",))
        if isinstance(h, SummaryHit) and h.of == "chunk"
    ]
    assert len(found) == 2  # the chunks merged away left retired points, found by no search
    covered = sorted(i for h in found for i in h.sources)
    assert covered == sorted(m.id for m in minutes[:50])
    merged = next(h for h in found if h.record["merged"] > 1)
    assert len(merged.sources) == 10 * merged.record["merged"]


def test_nothing_changed_hands_nothing_over_and_a_retried_batch_writes_the_same_points(
    ctx: SummarizeContext, redis_client: redis.Redis, engine: EdgeEngine
) -> None:
    minutes = conversation(40)
    summarize(ctx, redis_client, minutes)
    index_handed_over(redis_client, engine)
    before = engine.get_points("p1", [summary_points.summary_key("p1", "chunk", "x")])
    assert before == []
    summarize_batch(ctx, redis_client, records(minutes[:30], 1))  # retried: the threads do not change
    assert handed_over(redis_client) == []


def test_replay_hands_every_threads_summaries_over_with_their_sources(
    ctx: SummarizeContext, redis_client: redis.Redis, settings: Settings, engine: EdgeEngine
) -> None:
    minutes = [*conversation(40), *(said(100 + i, thread_id="other") for i in range(3))]
    LogWriter(settings.log_dir).append_many({"p1": [(m.id, f"{i}-0", encode_minute(m)) for i, m in enumerate(minutes)]})
    done = replay_summaries(redis_client, settings, "p1")
    index_replayed_summaries(redis_client, settings, "p1", done)
    assert index_handed_over(redis_client, engine) == 1
    found = HybridSearch(engine).search("p1", "rollout canary cache", k=20, now_ms=NOW_MS, kinds=("summary",))
    chunks = sorted(tuple(h.sources) for h in found if isinstance(h, SummaryHit) and h.of == "chunk")
    assert chunks == [tuple(m.id for m in minutes[:10]), tuple(m.id for m in minutes[10:20])]


def test_replay_recreates_the_retired_points_the_live_pipeline_left(
    ctx: SummarizeContext, redis_client: redis.Redis, settings: Settings, tmp_path: Path
) -> None:
    """Issue 22 item 5: the index reset deletes the retired points too, so the rebuild must make them again."""
    settings = dataclasses.replace(settings, summary_max_chunks=2)
    ctx.shape = ThreadShape(recent=20, chunk=10, max_chunks=2)
    minutes = conversation(70)  # 5 chunks of 10, the oldest merged down to 2; episodes merged as tasks are fixed
    LogWriter(settings.log_dir).append_many({"p1": [(m.id, f"{i}-0", encode_minute(m)) for i, m in enumerate(minutes)]})
    live, rebuilt = EdgeEngine(tmp_path / "live"), EdgeEngine(tmp_path / "rebuilt")
    try:
        written: list[str] = []  # every summary point key the live pipeline wrote
        for start in range(0, 70, 10):  # batch by batch, each handed-over job run before the next batch
            summarize_batch(ctx, redis_client, records(minutes[start : start + 10], start + 1))
            for project_id, threads in handed_over(redis_client):
                written += [k for message in threads for k in summary_points.needed(project_id, message)]
                summary_points.index_summaries(live, None, project_id, threads)
        assert live.count("p1", kind=SUMMARY_RETIRED) > 0

        index_replayed_summaries(redis_client, settings, "p1", replay_summaries(redis_client, settings, "p1"))
        assert index_handed_over(redis_client, rebuilt) == 1

        def points(engine: EdgeEngine) -> dict[str, tuple[str, list[str]]]:
            found = engine.get_points("p1", list(dict.fromkeys(written)))
            return {p.key: (p.payload["kind"], p.payload.get("sources") or []) for p in found}

        assert points(rebuilt) == points(live)
        for kind in (SUMMARY, SUMMARY_RETIRED):
            assert rebuilt.count("p1", kind=kind) == live.count("p1", kind=kind)
    finally:
        live.close()
        rebuilt.close()


def test_the_summary_points_job_is_one_a_worker_may_run() -> None:
    assert keys.SUMMARY_POINTS_JOB in keys.JOB_FUNCTIONS
    assert job_function(keys.SUMMARY_POINTS_JOB) is index_pool.run_summaries


def test_pair_retrieves_thread_summaries_beside_minutes_for_a_gap(
    ctx: SummarizeContext, redis_client: redis.Redis, engine: EdgeEngine
) -> None:
    from pvm.pair import SearchRetriever

    minutes = conversation(40)
    summarize(ctx, redis_client, minutes)
    index_handed_over(redis_client, engine)
    found = SearchRetriever(HybridSearch(engine)).retrieve("p1", "pin the cache layer canary", 5)
    assert len(found) == 5 and {m.kind for m in found} == {"summary"}  # no minute is indexed here
    summaries = [m for m in found if m.kind == "summary"]
    assert all(m.text.endswith((".", "!", "?")) and m.id for m in summaries)

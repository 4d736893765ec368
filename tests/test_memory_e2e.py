"""Semantic memory end to end: a failing embedding provider, the failed registry, and `pvm replay` recovering."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import pytest
import redis
from rq.registry import FailedJobRegistry

from contracts import encode_minute, keys
from contracts.memory import SearchFilters
from pvm import engines
from pvm.config import Settings
from pvm.emitter import Emitter
from pvm.stores.log import LogReader
from tests.conftest import free_port
from tests.memory_helpers import log_minutes, run_index_worker, use_settings
from tests.openai_server import status
from workers.ops.demo import sample_session
from workers.ops.replay import replay
from workers.runtime.queues import pool_queue
from workers.runtime.serializers import MsgpackSerializer
from workers.runtime.stack import Stack
from workers.summarize.pool import SummarizeContext, summarize_batch

pytestmark = pytest.mark.slow


def test_an_embedding_outage_fails_the_batch_and_replay_recovers_it(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, openai_server
) -> None:
    settings = settings.with_(
        embed_model="test-embed",
        openai_base_url=openai_server.base_url,
        openai_api_key="test-key",
        embed_dimensions=32,
        embed_max_retries=1,
    )
    use_settings(settings, monkeypatch)
    minutes = list(sample_session("apollo", 60, seed=9))
    openai_server.fail_next(status(500), times=1_000)  # the provider is down for good
    log_minutes(redis_client, settings, minutes)  # the log pool made them durable; indexing fails
    failed = FailedJobRegistry("pvm-index", connection=redis_client, serializer=MsgpackSerializer)
    assert len(failed.get_job_ids()) == 1
    assert LogReader(settings.log_dir).count("apollo") == 60  # nothing lost: the log has every minute
    engine = engines.shared_engine(settings)
    assert engine.count("apollo") == 0

    openai_server.reset()  # the provider is back
    replay(redis_client, settings, "apollo", wait=False)
    run_index_worker(redis_client)
    assert engine.count("apollo") == 60
    hits = engines.searcher_for(settings).search("apollo", "login bug finished", SearchFilters(), 5)  # type: ignore[attr-defined]
    assert hits and all(h.minute["project_id"] == "apollo" for h in hits)
    assert any(h.parts.get("semantic", 0) > 0 for h in hits), "the dense leg took part after the replay"
    # the provider calls reached the exporter's Redis-held metrics: the failed one and the good ones
    calls = redis_client.hgetall("pvm:metrics:provider:openai|embedding")
    assert int(calls[b"calls:error"]) >= 1 and int(calls[b"calls:ok"]) >= 1 and int(calls[b"tokens"]) > 0
    engines.close_shared()


def test_replay_rebuilds_an_index_that_answers_as_before(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_settings(settings, monkeypatch)
    log_minutes(redis_client, settings, list(sample_session("apollo", 300, seed=11)))
    # as a live stack: the summarize pool's threads, whose summary points the index worker writes (they share the
    # project's shard, so the lexical leg's IDF counts them; replay writes them again)
    history = LogReader(settings.log_dir).history("apollo")
    summarize_batch(
        SummarizeContext.build(redis_client, settings),
        redis_client,
        [[r.minute.id, r.seq, encode_minute(r.minute), 0] for r in history],
    )
    run_index_worker(redis_client)
    searcher = engines.searcher_for(settings)
    queries = ["conflict resolved serialized the writers", "migrate-db failed", "handed write-docs", "tune the cache"]
    now = 1_900_000_000_000
    before = [[(h.minute_id, round(h.score, 4)) for h in searcher.search("apollo", q, None, 10, now)] for q in queries]  # type: ignore[attr-defined]
    recent_before = redis_client.zrange("pvm:{p:apollo}:recent", 0, -1, withscores=True)
    agent_before = redis_client.hgetall("pvm:{p:apollo}:agent:coder")

    # lose every derived store of the project, then rebuild from the log alone
    redis_client.delete("pvm:{p:apollo}:recent", "pvm:{p:apollo}:byid", "pvm:{p:apollo}:agent:coder")
    replay(redis_client, settings, "apollo", wait=False)
    assert pool_queue("index", redis_client).count > 0
    run_index_worker(redis_client)

    after = [[(h.minute_id, round(h.score, 4)) for h in searcher.search("apollo", q, None, 10, now)] for q in queries]  # type: ignore[attr-defined]
    assert after == before
    assert redis_client.zrange("pvm:{p:apollo}:recent", 0, -1, withscores=True) == recent_before
    assert redis_client.hgetall("pvm:{p:apollo}:agent:coder") == agent_before
    engines.close_shared()


def test_pvm_optimize_is_run_by_the_index_worker_that_owns_the_engine(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from workers.ops.cli import main

    use_settings(settings, monkeypatch)
    log_minutes(redis_client, settings, list(sample_session("apollo", 40, seed=3)))
    assert main(["optimize", "--project", "apollo"]) == 0
    assert "queued" in capsys.readouterr().out
    job = pool_queue("index", redis_client).jobs[0]
    run_index_worker(redis_client)
    job.refresh()
    assert job.get_status() == "finished"
    assert "apollo" in job.return_value()["optimized"]
    engines.close_shared()


def _agent_memories(connection: redis.Redis, projects: list[str]) -> dict[tuple[str, str], dict[bytes, bytes]]:
    out = {}
    for project in projects:
        for agent in sorted(a.decode() for a in connection.smembers(keys.agents(project))):
            fields = connection.hgetall(keys.agent_memory(project, agent))
            caps = sorted(connection.smembers(keys.agent_capabilities(project, agent)))
            out[(project, agent)] = {**fields, b"capabilities": b",".join(caps)}
    return out


def test_kill_9_of_the_index_owner_indexes_and_counts_every_minute_once(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    projects = ["apollo", "borealis"]
    total = 3_000
    # The index alone: the facts pool would add its change minutes to these projects' logs (the demo's session
    # states decisions), and this test counts minutes and points against what was emitted.
    settings = dataclasses.replace(settings, downstream=("index",))
    stack = Stack(settings, api_port=free_port())  # with the embedded engine, `pvm serve` is the index pool
    stack.start()
    try:
        minutes = [m for p in projects for m in sample_session(p, total, seed=len(p))]
        minutes.sort(key=lambda m: m.timestamp)

        def produce() -> None:
            with Emitter(settings=settings) as em:
                for i, m in enumerate(minutes):
                    em.emit(m)
                    if i % 100 == 99:
                        time.sleep(0.05)  # ~2,000 minutes/s

        producer = threading.Thread(target=produce)
        producer.start()
        deadline = time.monotonic() + 120
        while int(redis_client.hget(keys.index_head("apollo"), "seq") or 0) < 500:
            assert time.monotonic() < deadline, "indexing never started"
            time.sleep(0.02)
        serve = stack.children["serve"]
        os.kill(serve.pid, signal.SIGKILL)  # the index owner dies mid-batch, engine files and all
        serve.wait()
        assert stack.restart_dead() == ["serve"]
        producer.join()
        log = LogReader(settings.log_dir)
        index_queue = pool_queue("index", redis_client)
        deadline = time.monotonic() + 180

        def caught_up() -> bool:
            heads = [int(redis_client.hget(keys.index_head(p), "seq") or 0) for p in projects]
            return (
                [log.count(p) for p in projects] == [total, total]
                and heads == [total, total]
                and index_queue.count == 0
                and redis_client.llen(index_queue.intermediate_queue_key) == 0
                and not index_queue.started_job_registry.get_job_ids()
            )

        while not caught_up():
            stack.restart_dead()
            assert time.monotonic() < deadline, "the index never caught up after the kill"
            time.sleep(0.2)
    finally:
        stack.stop(timeout=30)
    # Every minute is one point; the WAL of the killed process recovered what it had written.
    use_settings(settings, monkeypatch)
    engine = engines.shared_engine(settings)
    assert [engine.count(p) for p in projects] == [total, total]
    # Agent memory counted each minute once although a batch ran twice: a rebuild from the log agrees.
    before = _agent_memories(redis_client, projects)
    assert before
    replay(redis_client, settings, None, wait=False)
    run_index_worker(redis_client)
    assert _agent_memories(redis_client, projects) == before
    assert [engine.count(p) for p in projects] == [total, total]
    engines.close_shared()

"""The evaluate pool against real Valkey, RQ, the durable log and qdrant-edge: runs, slices, prune, replay, dry run."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis
from starlette.testclient import TestClient

from contracts import Minute, keys
from contracts.fact_changes import asserted_minute, fact_change, tier_promoted_minute
from contracts.facts import GLOBAL_KEY, Fact, FactStatus, FactType, TierKey
from contracts.memory import SearchFilters
from pvm import engines
from pvm.client import PVMClient
from pvm.config import Settings
from pvm.protocols import FACT, FACT_PRUNED
from pvm.reader import ContextReader
from pvm.search import HybridSearch
from pvm.stores.facts import FactStore
from pvm.stores.log import LogReader
from pvm.vectors import GLOBAL_TENANT
from tests.memory_helpers import log_minutes, use_settings
from tests.pvm.test_client import serving
from workers.api.app import create_app
from workers.api.stats import project_stats
from workers.evaluate import pool as evaluate_pool
from workers.ops import cli, replay
from workers.runtime.queues import pool_queue
from workers.runtime.runner import PvmWorker
from workers.runtime.scheduler import Scheduler, default_schedules

NOW = datetime.now(UTC)
P = "evalp"


def at(days_ago: float) -> str:
    return (NOW - timedelta(days=days_ago)).isoformat(timespec="microseconds").replace("+00:00", "Z")


def m(n: int, event_type: str = "message", days_ago: float = 0.0, **fields: Any) -> Minute:
    fields.setdefault("agent_id", "a1")
    return Minute(project_id=P, event_type=event_type, id=f"ev{n:05d}", timestamp=at(days_ago), **fields)


STALE = [
    m(1, days_ago=60, memory_note="looked at the dashboard colours for the quarterly report"),
    m(2, days_ago=50, memory_note="someone asked about lunch options near the office"),
    m(3, days_ago=45, memory_note="the printer on floor three jammed twice this morning"),
]
KEPT = [
    m(
        4,
        "task_completed",
        days_ago=60,
        data={"task_id": "mig-1", "success_criteria_met": 100},
        memory_note="migrated the billing schema with zero downtime",
    ),
    m(5, days_ago=1, memory_note="reviewing the payments retry policy for the checkout flow"),
    m(6, "decision", days_ago=2, memory_note="we keep the nightly backup window at two am"),
]


@pytest.fixture
def stack(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    use_settings(settings, monkeypatch)
    yield settings
    engines.close_shared()


def log_bytes(settings: Settings) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(Path(settings.log_dir).rglob("*")) if p.is_file()}


def search(settings: Settings, text: str, include_pruned: bool = False) -> list[str]:
    searcher = engines.searcher_for(settings)
    assert isinstance(searcher, HybridSearch)
    hits = searcher.search(P, text, SearchFilters(include_pruned=include_pruned), 10)
    return [h.minute_id for h in hits]


def run_worker(connection: redis.Redis, *pools: str) -> None:
    PvmWorker([pool_queue(p, connection) for p in pools], connection).work(burst=True)


def test_a_run_scores_prunes_stale_memories_and_never_changes_the_log(
    redis_client: redis.Redis, stack: Settings
) -> None:
    log_minutes(redis_client, stack, [*STALE, *KEPT])
    before = log_bytes(stack)
    assert "ev00001" in search(stack, "dashboard colours quarterly report")

    report = evaluate_pool.evaluate_here(redis_client, stack, P, apply=True, engine=engines.shared_engine(stack))

    assert sorted(p["id"] for p in report.pruned) == ["ev00001", "ev00002", "ev00003"]
    assert report.scored == 6 and report.tokens_reclaimed > 0
    assert log_bytes(stack) == before  # the log is never changed
    # Out of search, out of the hot caches; found by a search that opts in.
    assert "ev00001" not in search(stack, "dashboard colours quarterly report")
    assert "ev00001" in search(stack, "dashboard colours quarterly report", include_pruned=True)
    assert redis_client.hget(keys.minute_by_id(P), "ev00001") is None
    assert redis_client.zscore(keys.recent_window(P), "ev00001") is None
    assert redis_client.hget(keys.minute_by_id(P), "ev00005") is not None
    # Recorded: each prune, the totals; the scores in Redis and on the points ranking reads.
    record = msgpack.unpackb(redis_client.hget(keys.evaluation_pruned(P), "ev00002"))
    assert record["why"] == "score" and record["composite"] < 0.3 and record["tokens"] > 0
    totals = {k.decode(): float(v) for k, v in redis_client.hgetall(keys.evaluation_totals(P)).items()}
    assert totals["pruned"] == 3 and totals["tokens_reclaimed"] == report.tokens_reclaimed
    scores = msgpack.unpackb(redis_client.hget(keys.evaluation_scores(P), "ev00004"))
    assert scores["accuracy"] == 1.0 and scores["recency"] == 0.0 and scores["composite"] >= 0.3
    [point] = engines.shared_engine(stack).retrieve(P, ["ev00004"])
    assert point.payload["scores"] == scores
    state = evaluate_pool.run_state(redis_client, P)
    assert state["status"] == "done" and state["scored"] == 6 and state["pruned"] == 3
    assert redis_client.hget(keys.evaluated_projects(), P) is not None
    assert not list(redis_client.scan_iter(match=keys.evaluation_scratch(P, "*", "*")))
    assert redis_client.sismember(keys.metrics_freshness_stages(), "evaluated")  # emit -> first scored
    counters = {k.decode(): int(v) for k, v in redis_client.hgetall(keys.metrics_evaluate()).items()}
    assert counters["scored"] == 6 and counters["pruned"] == 3 and counters["runs"] == 1
    # A second run judges the pruned ones no more.
    again = evaluate_pool.evaluate_here(redis_client, stack, P, apply=True, engine=engines.shared_engine(stack))
    assert again.pruned == [] and again.scored == 3


def test_a_dry_run_reports_and_writes_nothing(redis_client: redis.Redis, stack: Settings) -> None:
    log_minutes(redis_client, stack, [*STALE, *KEPT])
    report = evaluate_pool.evaluate_here(redis_client, stack, P)
    assert sorted(p["id"] for p in report.pruned) == ["ev00001", "ev00002", "ev00003"]
    assert len(report.rescored) == 6  # never scored before: every composite is new
    assert not redis_client.exists(keys.evaluation_scores(P), keys.evaluation_pruned(P), keys.evaluation_run(P))
    assert not list(redis_client.scan_iter(match=keys.evaluation_scratch(P, "*", "*")))
    assert "ev00001" in search(stack, "dashboard colours quarterly report")


def test_replay_restores_pruned_memories_and_rebuilds_their_scores(redis_client: redis.Redis, stack: Settings) -> None:
    log_minutes(redis_client, stack, [*STALE, *KEPT])
    evaluate_pool.evaluate_here(redis_client, stack, P, apply=True, engine=engines.shared_engine(stack))
    assert "ev00001" not in search(stack, "dashboard colours quarterly report")
    scored = msgpack.unpackb(redis_client.hget(keys.evaluation_scores(P), "ev00001"))

    assert replay.replay(redis_client, stack, P, wait=False) == 0
    run_worker(redis_client, "index", "evaluate")

    assert "ev00001" in search(stack, "dashboard colours quarterly report")
    assert redis_client.hlen(keys.evaluation_pruned(P)) == 0
    assert not redis_client.hexists(keys.evaluation_totals(P), "pruned")
    assert redis_client.hget(keys.minute_by_id(P), "ev00001") is not None
    state = evaluate_pool.run_state(redis_client, P)
    assert state["mode"] == evaluate_pool.RESCORE and state["status"] == "done"
    rebuilt = msgpack.unpackb(redis_client.hget(keys.evaluation_scores(P), "ev00001"))
    assert rebuilt["composite"] == pytest.approx(scored["composite"], abs=0.01)  # recency moved a few ms
    [point] = engines.shared_engine(stack).retrieve(P, ["ev00001"])
    assert point.payload["scores"]["composite"] == rebuilt["composite"]


def test_the_scheduler_starts_runs_that_go_slice_by_slice(
    redis_client: redis.Redis, stack: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = stack.with_(evaluate_slice=4, evaluate_every_s=60)
    use_settings(small, monkeypatch)
    cited = m(1, days_ago=40, memory_note="the cache key must include the tenant id")
    later = [
        m(n, days_ago=1, memory_note=f"following up on the cache key note {n}", context_references=(cited.id,))
        for n in range(2, 11)
    ]
    log_minutes(redis_client, small, [cited, *later])
    redis_client.sadd(keys.projects(), P)
    [schedule] = [s for s in default_schedules(small) if s.name == "evaluate"]
    assert schedule.pool == "evaluate" and schedule.func == keys.EVALUATE_PLAN_JOB
    scheduler = Scheduler(redis_client, [schedule], name="t")
    assert scheduler.tick(now=1000.0) == []  # not with the stack's start: one interval later
    assert scheduler.tick(now=1060.0) == ["evaluate"]

    run_worker(redis_client, "evaluate")

    state = evaluate_pool.run_state(redis_client, P)
    assert state["status"] == "done" and state["minute_slices"] == 3  # 10 minutes in slices of 4
    assert state["slices_done"] == 3 and state["scored"] == 10
    finished = pool_queue("evaluate", redis_client).finished_job_registry.get_job_ids()
    assert len(finished) == 1 + 3 + 1  # the plan, three log slices, one page of facts
    # The oldest slice saw the references of the newest: the same scores as one slice of everything.
    sliced = msgpack.unpackb(redis_client.hget(keys.evaluation_scores(P), cited.id))
    assert sliced["impact"] == 0.75  # min(1, 9 / 3) references, task unknown
    whole = evaluate_pool.evaluate_here(redis_client, small.with_(evaluate_slice=100), P)
    assert whole.slices == 2 and cited.id not in [r["id"] for r in whole.rescored]  # one slice: the same score
    assert not redis_client.exists(keys.evaluation_lock(P))


def test_one_run_per_project_at_a_time(redis_client: redis.Redis, stack: Settings) -> None:
    log_minutes(redis_client, stack, KEPT, index=False)
    first = evaluate_pool.enqueue_run(redis_client, stack, P)
    assert first is not None
    assert evaluate_pool.enqueue_run(redis_client, stack, P) is None
    run_worker(redis_client, "evaluate")
    assert evaluate_pool.run_state(redis_client, P)["status"] == "done"
    assert evaluate_pool.enqueue_run(redis_client, stack, P) is not None


def test_near_duplicates_merge_with_provenance(redis_client: redis.Redis, stack: Settings) -> None:
    task = {"task_id": "deploy-7"}
    dupes = [
        m(1, days_ago=3, data=task, memory_note="the deploy of the payments service failed on the canary host"),
        m(
            2,
            days_ago=2,
            data=task,
            memory_note="payments service deploy failed on the canary host",
            context_references=(),
        ),
        m(3, days_ago=1, data=task, memory_note="deploy of payments service failed on canary host again"),
        m(4, days_ago=1, data=task, memory_note="rotated the database credentials for the reporting job"),
    ]
    reads = {"ev00002": 4}
    log_minutes(redis_client, stack, dupes)
    for memory_id, n in reads.items():
        redis_client.hset(keys.access_counts(P), memory_id, n)

    report = evaluate_pool.evaluate_here(redis_client, stack, P, apply=True, engine=engines.shared_engine(stack))

    assert report.merged == [
        {"survivor": "ev00002", "absorbed": ["ev00001", "ev00003"], "similarity": report.merged[0]["similarity"]}
    ]
    assert {k.decode(): v.decode() for k, v in redis_client.hgetall(keys.evaluation_merged(P)).items()} == {
        "ev00001": "ev00002",
        "ev00003": "ev00002",
    }
    [survivor] = engines.shared_engine(stack).retrieve(P, ["ev00002"])
    assert survivor.payload["merged_from"] == ["ev00001", "ev00003"]
    found = search(stack, "payments deploy canary")
    assert "ev00002" in found and "ev00001" not in found and "ev00003" not in found
    assert "ev00001" in search(stack, "payments deploy canary", include_pruned=True)
    assert int(redis_client.hget(keys.evaluation_totals(P), "merged")) == 2


def test_contradicting_patterns_are_flagged_and_the_better_outcome_ranks_first(
    redis_client: redis.Redis, stack: Settings
) -> None:
    worse = m(
        1,
        "decision",
        days_ago=1,
        data={
            "situation": "flaky integration tests",
            "success_criteria_met": 20,
            "recommendation": "retry the integration test job",
        },
        memory_note="for flaky integration tests: retry the integration test job",
    )
    better = m(
        2,
        "decision",
        days_ago=1,
        data={
            "situation": "flaky integration tests",
            "success_criteria_met": 90,
            "recommendation": "do not retry the integration test job",
        },
        memory_note="for flaky integration tests: do not retry the integration test job, quarantine it",
    )
    log_minutes(redis_client, stack, [worse, better])

    report = evaluate_pool.evaluate_here(redis_client, stack, P, apply=True, engine=engines.shared_engine(stack))

    assert report.conflicts == [{"winner": better.id, "loser": worse.id}]
    assert redis_client.hget(keys.evaluation_conflicts(P), worse.id) == better.id.encode()
    [loser] = engines.shared_engine(stack).retrieve(P, [worse.id])
    assert loser.payload["conflict_with"] == better.id
    [winner] = engines.shared_engine(stack).retrieve(P, [better.id])
    assert loser.payload["scores"]["composite"] < winner.payload["scores"]["composite"] / 2
    assert search(stack, "retry the integration test job")[0] == better.id


def test_settings_refuse_bad_evaluate_values() -> None:
    with pytest.raises(ValueError, match="PVM_SCORE_WEIGHTS"):
        Settings.from_env({"PVM_SCORE_WEIGHTS": "1,1,1"})
    with pytest.raises(ValueError, match="PVM_PRUNE_BELOW"):
        Settings.from_env({"PVM_PRUNE_BELOW": "2"})
    assert Settings.from_env({"PVM_EVALUATE_EVERY": "0"}).evaluate_every_s == 0
    assert not [s for s in default_schedules(Settings(evaluate_every_s=0)) if s.name == "evaluate"]


def _fact(subject: str, days_ago: float, fact_type: FactType = FactType.FACT) -> Fact:
    return Fact.new(
        type=fact_type,
        text=f"{subject} runs on postgres",
        subject=subject,
        attribute="database",
        value="postgres",
        tier_key=TierKey.for_project(P),
        confidence=0.9,
        source_minute_ids=(f"src-{subject}",),
        status=FactStatus.PROMOTED,
        recorded_at=at(days_ago),
    )


def test_decayed_facts_leave_search_and_contexts_and_stats_count_what_is_left(
    redis_client: redis.Redis, stack: Settings
) -> None:
    old, fresh = _fact("billing", 200), _fact("ledger", 1, FactType.DECISION)
    changes = [asserted_minute(f, minute_id=f"fa-{f.subject}", timestamp=f.recorded_at) for f in (old, fresh)]
    store = FactStore(redis_client)
    for change in changes:
        store.apply(change)
    log_minutes(redis_client, stack, [*STALE, *KEPT, *changes])
    engine = engines.shared_engine(stack)
    assert engine.count(P, FACT) == 2

    report = evaluate_pool.evaluate_here(redis_client, stack, P, apply=True, engine=engine)

    assert [p["id"] for p in report.pruned if p["kind"] == FACT] == [old.id] and report.facts_scored == 2
    assert engine.count(P, FACT) == 1 and engine.count(P, FACT_PRUNED) == 1  # out of fact searches
    assert [f.id for f in store.current([TierKey.for_project(P)])] == [fresh.id]  # out of contexts' facts
    assert store.current([TierKey.for_project(P)], types=["fact"]) == []  # and out of reads by type
    assert [f.id for f in store.current([TierKey.for_project(P)], types=["fact", "decision"])] == [fresh.id]
    scores = msgpack.unpackb(redis_client.hget(keys.evaluation_scores(P), old.id))
    assert scores["importance"] == 0.5 and scores["composite"] < 0.3

    stats = project_stats(redis_client, P)
    assert stats["minutes"] == 8 and stats["indexed"] == 8
    assert stats["facts"] == {
        "total": 1,
        "by_type": {**{t.value: 0 for t in FactType}, "decision": 1},
        "by_tier": {"task": 0, "project": 1},
    }
    assert (stats["pruned"], stats["merged"], stats["chunks"], stats["episodes"]) == (4, 0, 0, 0)
    assert stats["tokens_reclaimed"] == report.tokens_reclaimed > 0
    kept = [msgpack.unpackb(redis_client.hget(keys.evaluation_scores(P), k.id)) for k in KEPT]
    assert stats["average_scores"]["composite"] == pytest.approx(sum(s["composite"] for s in kept) / 3, abs=1e-3)
    assert stats["average_scores"]["fact_composite"] == pytest.approx(0.7 * 0.5 ** (1 / 30), abs=1e-3)
    assert stats["last_evaluated"] is not None


def test_stats_of_a_project_never_evaluated(redis_client: redis.Redis) -> None:
    stats = project_stats(redis_client, "nothing-here")
    assert stats["minutes"] == 0 and stats["pruned"] == 0 and stats["last_evaluated"] is None
    assert set(stats["average_scores"].values()) == {None}


def test_the_cli_dry_run_prints_what_it_would_do_and_evaluate_waits_for_the_run(
    redis_client: redis.Redis, stack: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    log_minutes(redis_client, stack, [*STALE, *KEPT])
    assert cli.main(["evaluate", "--project", P, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "WOULD PRUNE (3;" in out and "ev00002" in out and "WOULD RESCORE (6 composites change)" in out
    assert cli.main(["evaluate", "--project", P, "--dry-run", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["pruned"]) == 3
    assert not redis_client.exists(keys.evaluation_pruned(P))
    # Without a worker, a real run is refused with what to start; queued, a worker runs it.
    with pytest.raises(SystemExit, match="no evaluate worker"):
        cli.main(["evaluate", "--project", P])
    assert cli.main(["evaluate", "--project", P, "--no-wait"]) == 0
    assert "queued" in capsys.readouterr().out
    run_worker(redis_client, "evaluate")
    assert cli.main(["stats", "--project", P, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pruned"] == 3
    assert cli.main(["stats", "--project", P]) == 0
    assert "pruned, merged    3, 0" in capsys.readouterr().out
    # pvm status: each project's run, its slices and its last completion.
    assert cli.main(["status"]) == 0
    section = capsys.readouterr().out.split("EVALUATION", 1)[1].split("\n\n", 1)[0]
    [row] = [line.split() for line in section.splitlines() if line.startswith(P)]
    assert row[1:5] == ["done", "full", "1/1+facts", "6"] and row[5] == "3" and "ago" in row
    assert cli.main(["status", "--json"]) == 0
    [run] = json.loads(capsys.readouterr().out)["evaluations"]
    assert run["status"] == "done" and run["last_completed"] is not None


def test_stats_over_http_and_the_client(redis_client: redis.Redis, stack: Settings) -> None:
    log_minutes(redis_client, stack, [*STALE, *KEPT])
    evaluate_pool.evaluate_here(redis_client, stack, P, apply=True, engine=engines.shared_engine(stack))
    reader = ContextReader(redis_client, LogReader(stack.log_dir), engines.searcher_for(stack))  # type: ignore[arg-type]
    app = create_app(reader, redis_client, stack.shards)
    with TestClient(app) as http:
        answer = http.get(f"/v1/projects/{P}/stats")
        assert answer.status_code == 200 and answer.json() == project_stats(redis_client, P)
        found = http.get(f"/v1/projects/{P}/search", params={"q": "dashboard colours", "include_pruned": "true"})
        assert "ev00001" in [h["minute_id"] for h in found.json()["hits"]]
    with serving(app) as url, PVMClient(url, "") as client:
        assert client.stats(P)["pruned"] == 3
        assert client.global_stats() == project_stats(redis_client, GLOBAL_TENANT)  # no token: every tier
        hits = client.search(P, "dashboard colours", include_pruned=True)["hits"]
        assert "ev00001" in [h["minute_id"] for h in hits]
        assert "ev00001" not in [h["minute_id"] for h in client.search(P, "dashboard colours")["hits"]]


# -- fact near-duplicates -------------------------------------------------------------------------------------------


def _stated(subject: str, attribute: str, value: str, tier: TierKey | None = None, days_ago: float = 1) -> Fact:
    return Fact.new(
        type=FactType.FACT,
        text=f"{subject} {attribute} is {value}",
        subject=subject,
        attribute=attribute,
        value=value,
        tier_key=tier or TierKey.for_project(P),
        confidence=0.9,
        source_minute_ids=("src-" + "-".join(f"{subject} {value}".split()),),
        status=FactStatus.PROMOTED,
        recorded_at=at(days_ago),
    )


def _hold(redis_client: redis.Redis, stack: Settings, facts: list[Fact]) -> FactStore:
    """Facts as the facts pool leaves them: in the store (contexts read it), in the log, indexed as fact points."""
    changes = [asserted_minute(f, minute_id=f"fd-{n:03d}", timestamp=f.recorded_at) for n, f in enumerate(facts)]
    store = FactStore(redis_client)
    for change in changes:
        store.apply(change)
    log_minutes(redis_client, stack, changes)
    return store


REWORDED = [
    _stated("billing service", "database", "Postgres cluster"),  # read most: the survivor
    _stated("billing service", "database", "the postgres cluster"),  # an article
    _stated("billing service", "database", "primary Postgres cluster"),  # an extra adjective
    _stated("the billing service api", "database", "Postgres cluster"),  # the same value, a near-equal subject
    _stated("billing service", "session ttl", "8 hours"),  # another slot: not a duplicate of any
]


def test_near_duplicate_facts_of_one_tier_key_merge_with_provenance_and_leave_the_context(
    redis_client: redis.Redis, stack: Settings
) -> None:
    store = _hold(redis_client, stack, REWORDED)
    survivor, *twins = (f.id for f in REWORDED[:4])
    redis_client.hset(keys.fact_reads(TierKey.for_project(P)), survivor, 3)
    engine = engines.shared_engine(stack)
    assert engine.count(P, FACT) == 5

    report = evaluate_pool.evaluate_here(redis_client, stack, P, apply=True, engine=engine)

    [merge] = report.merged
    assert merge["survivor"] == survivor and merge["absorbed"] == sorted(twins) and merge["kind"] == FACT
    assert sorted(p["id"] for p in report.pruned if p["why"] == "merged") == sorted(twins)
    merged = {k.decode(): v.decode() for k, v in redis_client.hgetall(keys.evaluation_merged(P)).items()}
    assert merged == dict.fromkeys(twins, survivor)
    assert {f.id for f in store.current([TierKey.for_project(P)])} == {survivor, REWORDED[4].id}
    assert engine.count(P, FACT) == 2 and engine.count(P, FACT_PRUNED) == 3
    points = {point.key: point.payload for point in engine.get_points(P, [survivor, twins[0]])}
    assert points[survivor]["merged_from"] == sorted(twins) and points[twins[0]]["merged_into"] == survivor
    record = msgpack.unpackb(redis_client.hget(keys.evaluation_pruned(P), twins[0]))
    assert record["why"] == "merged" and record["into"] == survivor and record["kind"] == FACT
    assert project_stats(redis_client, P)["merged"] == 3


def test_different_values_of_a_single_valued_slot_never_merge(redis_client: redis.Redis, stack: Settings) -> None:
    rivals = [
        _stated("billing service", "database", "Postgres"),
        _stated("billing service", "database", "MySQL"),
        _stated("ledger", "database", "postgres 15"),
        _stated("ledger", "database", "postgres 16"),
        _stated("ledger", "retry policy", "retry three times on timeout"),
        _stated("ledger", "retry policy", "retry five times on timeout"),
    ]
    _hold(redis_client, stack, rivals)
    report = evaluate_pool.evaluate_here(redis_client, stack, P, apply=True, engine=engines.shared_engine(stack))
    assert report.merged == [] and report.facts_scored == 6
    assert not redis_client.exists(keys.evaluation_merged(P))


def test_facts_of_two_tier_keys_never_merge(redis_client: redis.Redis, stack: Settings) -> None:
    task = TierKey.for_task(P, "deploy-7")
    twins = [
        _stated("billing service", "database", "Postgres cluster"),
        _stated("billing service", "database", "the postgres cluster", task),
    ]
    store = _hold(redis_client, stack, twins)
    report = evaluate_pool.evaluate_here(redis_client, stack, P, apply=True, engine=engines.shared_engine(stack))
    assert report.merged == [] and report.facts_scored == 2
    assert len(store.current([TierKey.for_project(P), task])) == 2


def test_replay_restores_a_merged_fact(redis_client: redis.Redis, stack: Settings) -> None:
    store = _hold(redis_client, stack, REWORDED)
    redis_client.hset(keys.fact_reads(TierKey.for_project(P)), REWORDED[0].id, 3)
    engine = engines.shared_engine(stack)
    evaluate_pool.evaluate_here(redis_client, stack, P, apply=True, engine=engine)
    assert len(store.current([TierKey.for_project(P)])) == 2

    assert replay.replay(redis_client, stack, P, wait=False) == 0
    run_worker(redis_client, "index", "evaluate")

    assert {f.id for f in store.current([TierKey.for_project(P)])} == {f.id for f in REWORDED}
    assert engine.count(P, FACT) == 5 and engine.count(P, FACT_PRUNED) == 0
    assert not redis_client.exists(keys.evaluation_merged(P), keys.evaluation_pruned(P))
    assert not redis_client.hexists(keys.evaluation_totals(P), "merged")


def test_a_dry_run_reports_fact_merges_and_writes_nothing(redis_client: redis.Redis, stack: Settings) -> None:
    store = _hold(redis_client, stack, REWORDED)
    redis_client.hset(keys.fact_reads(TierKey.for_project(P)), REWORDED[0].id, 3)
    report = evaluate_pool.evaluate_here(redis_client, stack, P)
    assert [m["survivor"] for m in report.merged] == [REWORDED[0].id] and len(report.merged[0]["absorbed"]) == 3
    assert not redis_client.exists(keys.evaluation_merged(P), keys.evaluation_pruned(P), keys.evaluation_scores(P))
    assert len(store.current([TierKey.for_project(P)])) == 5
    assert engines.shared_engine(stack).count(P, FACT) == 5


# -- near-duplicates across pages of a run ---------------------------------------------------------------------------


def test_near_duplicate_minutes_on_different_pages_of_a_run_merge(redis_client: redis.Redis, stack: Settings) -> None:
    small = stack.with_(evaluate_slice=2)
    task = {"task_id": "deploy-9"}
    minutes = [
        m(1, days_ago=3, data=task, memory_note="the deploy of the payments service failed on the canary host"),
        m(2, days_ago=3, data=task, memory_note="rotated the database credentials for the reporting job"),
        m(3, days_ago=2, data=task, memory_note="the flaky login test was quarantined by the platform team"),
        m(4, days_ago=2, data=task, memory_note="upgraded the queue workers to the new runtime image"),
        m(5, days_ago=1, data=task, memory_note="payments service deploy failed on the canary host"),
        m(6, days_ago=1, data={"task_id": "other"}, memory_note="payments service deploy failed on the canary host"),
    ]
    log_minutes(redis_client, small, minutes)
    redis_client.hset(keys.access_counts(P), "ev00001", 5)  # the oldest is read most: it survives

    report = evaluate_pool.evaluate_here(redis_client, small, P, apply=True, engine=engines.shared_engine(small))

    assert report.slices == 4  # three pages of minutes, one of facts: the twins sit two pages apart
    assert [(x["survivor"], x["absorbed"]) for x in report.merged] == [("ev00001", ["ev00005"])]  # not ev00006
    assert redis_client.hget(keys.evaluation_merged(P), "ev00005") == b"ev00001"
    record = msgpack.unpackb(redis_client.hget(keys.evaluation_pruned(P), "ev00005"))
    assert record["why"] == "merged" and record["into"] == "ev00001" and record["tokens"] > 0
    points = {p.minute_id: p.payload for p in engines.shared_engine(small).retrieve(P, ["ev00001", "ev00005"])}
    assert points["ev00001"]["merged_from"] == ["ev00005"] and points["ev00005"]["merged_into"] == "ev00001"
    found = search(small, "payments deploy canary")
    assert "ev00001" in found and "ev00005" not in found and "ev00006" in found
    assert redis_client.hget(keys.minute_by_id(P), "ev00005") is None
    assert int(redis_client.hget(keys.evaluation_totals(P), "merged")) == 1
    assert not list(redis_client.scan_iter(match=keys.evaluation_scratch(P, "*", "*")))


def test_a_newer_page_survivor_is_absorbed_by_a_better_twin_on_an_older_page(
    redis_client: redis.Redis, stack: Settings
) -> None:
    small = stack.with_(evaluate_slice=2)
    task = {"task_id": "deploy-9"}
    minutes = [
        m(1, days_ago=3, data=task, memory_note="the deploy of the payments service failed on the canary host"),
        m(2, days_ago=3, data=task, memory_note="rotated the database credentials for the reporting job"),
        m(3, days_ago=1, data=task, memory_note="payments service deploy failed on the canary host"),
    ]
    log_minutes(redis_client, small, minutes)
    redis_client.hset(keys.access_counts(P), "ev00001", 5)

    dry = evaluate_pool.evaluate_here(redis_client, small, P)  # the newer one is judged first and kept, then absorbed
    assert [(x["survivor"], x["absorbed"]) for x in dry.merged] == [("ev00001", ["ev00003"])]
    assert [(p["id"], p["why"], p["into"]) for p in dry.pruned] == [("ev00003", "merged", "ev00001")]
    assert dry.pruned[0]["tokens"] > 0 and not redis_client.exists(keys.evaluation_merged(P))

    evaluate_pool.evaluate_here(redis_client, small, P, apply=True, engine=engines.shared_engine(small))

    assert redis_client.hget(keys.evaluation_merged(P), "ev00003") == b"ev00001"
    points = {p.minute_id: p.payload for p in engines.shared_engine(small).retrieve(P, ["ev00001", "ev00003"])}
    assert points["ev00003"]["merged_into"] == "ev00001" and points["ev00003"]["scores"]["composite"] > 0
    assert points["ev00001"]["merged_from"] == ["ev00003"]
    assert "ev00003" not in search(small, "payments deploy canary")
    assert redis_client.zscore(keys.recent_window(P), "ev00003") is None
    assert redis_client.zscore(keys.agent_recent_window(P, "a1"), "ev00003") is None


@pytest.fixture
def paged_hashes(redis_client: redis.Redis) -> Any:
    """Hashes in the hashtable encoding from their first field, so HSCAN pages them (a small hash is one page)."""
    before = redis_client.config_get("hash-max-listpack-entries")["hash-max-listpack-entries"]
    redis_client.config_set("hash-max-listpack-entries", 0)
    yield
    redis_client.config_set("hash-max-listpack-entries", before)


def test_near_duplicate_facts_on_different_pages_of_a_run_merge(
    redis_client: redis.Redis, stack: Settings, paged_hashes: None
) -> None:
    small = stack.with_(evaluate_slice=1)
    twins = [
        _stated("billing service", "database", "Postgres cluster"),
        _stated("billing service", "database", "the postgres cluster"),
        _stated("billing service", "database", "primary Postgres cluster"),
        _stated("ledger", "database", "MySQL"),
        _stated("ledger", "database", "Postgres"),  # another value of a single-valued slot: never merges
        _stated("billing service", "database", "Postgres cluster", TierKey.for_task(P, "t1")),  # another tier key
    ]
    store = _hold(redis_client, small, twins)
    redis_client.hset(keys.fact_reads(TierKey.for_project(P)), twins[0].id, 3)
    # Other facts of the project until the three twins sit on three pages of the run's HSCAN (its pages are the
    # hash's buckets, placed by the server's random hash seed; two twins whose hashes share their low bits stay in
    # one bucket until the table outgrows those bits, so the fillers may run to a few thousand buckets).
    # Fillers go in 256 at a time, the pages read in one pass each time; up to 16,384 (two twins sharing their low 12
    # bits, 1 in ~1,400 seeds, outlasted the 3,000 added one by one there were before).
    for start in range(0, 16_384, 256):
        if len(set(_pages_of(redis_client, small, [twin.id for twin in twins[:3]]).values())) == 3:
            break
        fillers = [_stated(f"filler {n}", "owner", f"team {n}") for n in range(start, start + 256)]
        minutes = [asserted_minute(f, minute_id=f"x{n}") for n, f in enumerate(fillers, start)]
        FactStore(redis_client).apply_changes([(m, fact_change(m)) for m in minutes])
    assert len(set(_pages_of(redis_client, small, [twin.id for twin in twins[:3]]).values())) == 3

    report = evaluate_pool.evaluate_here(redis_client, small, P, apply=True, engine=engines.shared_engine(small))

    absorbed = sorted(a for x in report.merged for a in x["absorbed"])
    assert absorbed == sorted([twins[1].id, twins[2].id])
    merged = {k.decode(): v.decode() for k, v in redis_client.hgetall(keys.evaluation_merged(P)).items()}
    assert sorted(merged) == absorbed

    def final(fact_id: str) -> str:  # a survivor absorbed on a later page passes its twins on: follow the chain
        while fact_id in merged:
            fact_id = merged[fact_id]
        return fact_id

    assert final(twins[1].id) == final(twins[2].id) == twins[0].id  # the best scored, wherever its page
    current = {f.id for f in store.current([TierKey.for_project(P), TierKey.for_task(P, "t1")])}
    assert {twins[0].id, twins[3].id, twins[4].id, twins[5].id} <= current
    assert not {twins[1].id, twins[2].id} & current
    [survivor] = engines.shared_engine(small).get_points(P, [twins[0].id])
    assert survivor.payload["merged_from"] == sorted(i for i, into in merged.items() if into == twins[0].id)


def _pages_of(connection: redis.Redis, settings: Settings, fact_ids: list[str]) -> dict[str, int]:
    """Which HSCAN page (of `PVM_EVALUATE_SLICE`) of the project's facts holds each of `fact_ids`, as a run reads
    them (one pass)."""
    wanted = {f.encode(): f for f in fact_ids}
    pages: dict[str, int] = {}
    cursor, page = 0, 0
    while True:
        cursor, raw = connection.hscan(keys.facts_by_id(TierKey.for_project(P)), cursor, count=settings.evaluate_slice)
        pages.update({wanted[k]: page for k in raw if k in wanted})
        if not cursor:
            break
        page += 1
    missing = set(fact_ids) - set(pages)
    if missing:
        raise AssertionError(f"{sorted(missing)} are not facts of {P}")
    return pages


# -- the global tier ---------------------------------------------------------------------------------------------------


def _promoted(subject: str, days_ago: float) -> list[Minute]:
    """A project fact and its promotion to the global tier, both `days_ago`: the minutes a project's log holds."""
    fact = _fact(subject, days_ago)
    asserted = asserted_minute(fact, minute_id=f"gl-{subject}", timestamp=fact.recorded_at)
    return [asserted, tier_promoted_minute(fact, minute_id=f"gu-{subject}", timestamp=fact.recorded_at)]


def test_stale_global_facts_are_evaluated_pruned_and_restored_by_replay(
    redis_client: redis.Redis, stack: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    changes = [*_promoted("billing", 200), *_promoted("ledger", 1)]
    store = FactStore(redis_client)
    for change in changes:
        store.apply(change)
    log_minutes(redis_client, stack, [*KEPT, *changes])  # a change to the global tier is a minute of some project
    by_subject = {f.slot.subject: f for f in store.current([GLOBAL_KEY])}
    stale, fresh = by_subject["billing"], by_subject["ledger"]
    engine = engines.shared_engine(stack)
    assert engine.count(GLOBAL_TENANT, FACT) == 2

    dry = evaluate_pool.evaluate_here(redis_client, stack, evaluate_pool.GLOBAL_RUN)
    assert [(p["id"], p["why"], p["kind"]) for p in dry.pruned] == [(stale.id, "decayed", FACT)]
    assert dry.facts_scored == 2 and len(store.current([GLOBAL_KEY])) == 2  # a dry run writes nothing
    capsys.readouterr()
    assert cli.main(["evaluate", "--global", "--dry-run", "--json"]) == 0
    assert [p["id"] for p in json.loads(capsys.readouterr().out)["pruned"]] == [stale.id]
    # A project's run leaves the global tier alone.
    evaluate_pool.evaluate_here(redis_client, stack, P, apply=True, engine=engine)
    assert len(store.current([GLOBAL_KEY])) == 2

    # The scheduler's plan starts the global tier's run beside the projects'.
    redis_client.sadd(keys.projects(), P)
    pool_queue("evaluate", redis_client).enqueue(keys.EVALUATE_PLAN_JOB)
    run_worker(redis_client, "evaluate")

    state = evaluate_pool.run_state(redis_client, evaluate_pool.GLOBAL_RUN)
    assert state["status"] == "done" and state["scored"] == 2 and state["pruned"] == 1
    assert [f.id for f in store.current([GLOBAL_KEY])] == [fresh.id]
    assert [f.id for f in store.current([GLOBAL_KEY], types=["fact"])] == [fresh.id]
    assert engine.count(GLOBAL_TENANT, FACT) == 1 and engine.count(GLOBAL_TENANT, FACT_PRUNED) == 1
    record = msgpack.unpackb(redis_client.hget(keys.evaluation_pruned(evaluate_pool.GLOBAL_RUN), stale.id))
    assert record["why"] == "decayed" and record["tier_key"] == "global"
    stats = project_stats(redis_client, evaluate_pool.GLOBAL_RUN)
    assert stats["pruned"] == 1 and stats["facts"]["by_tier"] == {"global": 1} and stats["last_evaluated"]
    capsys.readouterr()
    assert cli.main(["stats", "--global", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == stats
    assert cli.main(["status", "--json"]) == 0
    assert evaluate_pool.GLOBAL_RUN in [run["project_id"] for run in json.loads(capsys.readouterr().out)["evaluations"]]

    assert replay.replay(redis_client, stack, P, wait=False) == 0
    run_worker(redis_client, "index", "evaluate")

    assert {f.id for f in store.current([GLOBAL_KEY])} == {stale.id, fresh.id}
    assert {f.id for f in store.current([GLOBAL_KEY], types=["fact"])} == {stale.id, fresh.id}
    assert engine.count(GLOBAL_TENANT, FACT) == 2 and engine.count(GLOBAL_TENANT, FACT_PRUNED) == 0
    assert not redis_client.exists(keys.evaluation_pruned(evaluate_pool.GLOBAL_RUN))

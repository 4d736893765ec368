"""The demo's session: decisions that later change flow through the facts pool; the current view keeps the newest."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from contracts import encode_minute, keys
from contracts.facts import FactStatus, Slot, TierKey
from pvm import defaults
from pvm.config import Settings
from pvm.stores.facts import FactStore
from workers.facts.extraction import RuleExtractor
from workers.ingest.dispatcher import Dispatcher
from workers.ops.demo import TASK_DECISIONS, decision_lines, sample_session, shown_decision
from workers.runtime.queues import pool_queue
from workers.runtime.runner import PvmWorker

PROJECT = "apollo"


@pytest.fixture
def demo_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """The workers' environment as `pvm demo` gives it: the default downstream pools."""
    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PVM_DOWNSTREAM", raising=False)
    yield settings


def test_every_task_states_a_decision_then_changes_it_in_one_slot() -> None:
    rules = RuleExtractor()
    minutes = [m for m in sample_session(PROJECT, 400, seed=7) if m.event_type == "decision"]
    for task, statements in TASK_DECISIONS.items():
        said = [m for m in minutes if m.data["task_id"] == task]
        assert [m.memory_note for m in said[: len(statements)]] == list(statements), task
        read = [c for m in said[: len(statements)] for c in rules.extract([m])]
        assert len(read) == len(statements) and len({c.slot for c in read}) == 1, task
        assert len({c.value for c in read}) == len(statements), task


def test_the_demo_session_is_the_same_for_the_same_seed() -> None:
    first = [(m.event_type, m.memory_note, m.data) for m in sample_session(PROJECT, 200, seed=3)]
    again = [(m.event_type, m.memory_note, m.data) for m in sample_session(PROJECT, 200, seed=3)]
    assert first == again


def test_the_demo_session_through_the_pools_keeps_the_new_value_current_and_the_old_in_history(
    redis_client: redis.Redis, demo_env: Settings
) -> None:
    assert "facts" in Settings.from_env({}).downstream  # `pvm demo`'s pools fan out to the facts pool
    session = list(sample_session(PROJECT, defaults.DEMO_MINUTES, seed=7))
    for m in session:
        redis_client.xadd(keys.stream(keys.shard_of(PROJECT, demo_env.shards)), {keys.MINUTE_FIELD: encode_minute(m)})
    dispatcher = Dispatcher(redis_client, demo_env, consumer="t", block_ms=10)
    dispatcher.ensure_groups()
    for _ in range(3):  # the minutes, then the change minutes the facts pool wrote, back through the log
        dispatcher.poll_once()
        dispatcher.flush_gathered()
        PvmWorker([pool_queue(p, redis_client) for p in ("log", "facts")], redis_client).work(burst=True)

    store = FactStore(redis_client)
    tier = TierKey.for_project(PROJECT)
    rules = RuleExtractor()
    changed = 0
    shown: list[tuple[str, list[str]]] = []
    for task, statements in TASK_DECISIONS.items():
        stated = [m for m in session if m.event_type == "decision" and m.data["task_id"] == task]
        if len(stated) < len(statements):
            continue
        first, last = rules.extract([stated[0]])[0], rules.extract([stated[len(statements) - 1]])[0]
        history = store.history(tier, Slot(first.subject, first.attribute))
        current = [f for f in history if f.status is FactStatus.PROMOTED and f.valid_until is None]
        assert [f.value for f in current] == [last.value], task
        old = next(f for f in history if f.value == first.value)
        assert old.status is FactStatus.SUPERSEDED and old.valid_until == current[0].valid_from, task
        assert any(r.fact_id == old.id for r in current[0].relationships), task
        # What `pvm demo` prints: the new value as current, the old one only in history, with its valid_until.
        lines = decision_lines(store, PROJECT, session, task)
        assert lines is not None, task
        now = [line for line in lines if line.startswith("  current:")]
        was = [line for line in lines if line.startswith("  history:")]
        assert len(now) == 1 and last.value in now[0] and first.value not in now[0], lines
        assert any(first.value in line and f"until {old.valid_until}" in line for line in was), lines
        assert all(last.value not in line for line in was), lines
        shown.append((task, lines))
        changed += 1
    assert changed >= 4  # most tasks reach their change in a demo-sized session
    # The demo shows its reader task's decision when it changed, else the first task's that did.
    assert shown_decision(store, PROJECT, session) == next(
        (lines for task, lines in shown if task == "fix-login-bug"), shown[0][1]
    )


def test_the_demo_pair_step_fills_the_coders_gaps_from_the_session_and_prints_every_stage(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pvm import engines
    from pvm.pair import Pair, SearchRetriever
    from tests.memory_helpers import log_minutes, use_settings
    from workers.ops.demo import PAIR_CRITERIA, PAIR_OUTPUT, PAIR_TASK, pair_lines

    use_settings(settings, monkeypatch)
    log_minutes(redis_client, settings, list(sample_session(PROJECT, defaults.DEMO_MINUTES, seed=7)))
    try:
        pair = Pair(retriever=SearchRetriever(engines.searcher_for(settings)))  # type: ignore[arg-type]
        run = pair.run(PROJECT, PAIR_TASK, PAIR_CRITERIA, PAIR_OUTPUT, task_id="fix-login-bug").to_dict()
    finally:
        engines.close_shared()
    first, last = run["rounds"][0], run["rounds"][-1]
    assert len(first["gaps"]) == len(PAIR_CRITERIA) and last["score"] > first["score"]
    assert "Safari" not in run["output"] and "SameSite=Lax" in run["output"]
    text = "\n".join(pair_lines(run))
    for stage in ("judge, round 1", "gap: Does not mention Safari -- holds safari", "memories for", "revision by",
                  "judge (re-judge), round 2", "stopped:"):  # fmt: skip
        assert stage in text, stage

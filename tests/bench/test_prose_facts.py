"""bench/prose_facts.py: the prose split reads the set's format, and its scores come from what PVM holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.facts_llm import FIXED_ANSWER
from bench.harness import BenchError, Progress
from bench.prose_facts import (
    TARGETS,
    GoldProseFact,
    ProseRun,
    llm_extractor,
    load,
    match,
    run_split,
    score,
    slot_likeness,
    value_matches,
)
from contracts import Fact
from contracts.facts import FactStatus, FactType, TierKey
from pvm.llm import LLMClient
from tests.openai_server import OpenAIServer, openai_server_fixture  # noqa: F401  (the `openai_server` fixture)
from workers.facts.extraction_llm import LLMExtractor

T0 = "2026-03-02T09:00:00.000000Z"
T1 = "2026-03-03T09:00:00.000000Z"
T2 = "2026-03-04T09:00:00.000000Z"
T3 = "2026-03-05T09:00:00.000000Z"
END = "2026-03-06T09:00:00.000000Z"
IDS = {  # ULIDs whose time part is the minute's timestamp, as the set's README asks
    T0: "01KJP6FR00AAAAAAAAAAAAAAAA",
    T1: "01KJRV0V00BBBBBBBBBBBBBBBB",
    T2: "01KJVFKC00CCCCCCCCCCCCCCCC",
    T3: "01KJY44E00DDDDDDDDDDDDDDDD",
}


def minute(at: str, note: str, event_type: str = "message") -> dict[str, Any]:
    return {
        "id": IDS[at],
        "timestamp": at,
        "event_type": event_type,
        "project_id": "billing",
        "agent_id": "ada",
        "data": {},
        "context_references": [],
        "memory_note": note,
        "thread_id": "billing/db",
        "scope": "project",
    }


def gold(fid: str, value: str, source: str, valid_from: str, valid_until: str | None, **more: Any) -> dict[str, Any]:
    return {
        "id": fid,
        "project_id": "billing",
        "tier": "project",
        "task_id": None,
        "type": more.get("type", "fact"),
        "subject": more.get("subject", "billing service"),
        "attribute": more.get("attribute", "database"),
        "value": value,
        "value_aliases": more.get("aliases", []),
        "single_valued": True,
        "source_minute_ids": [source],
        "valid_from": valid_from,
        "valid_until": valid_until,
        "supersedes": None,
        "superseded_by": None,
        "promoted_from": None,
        "note": "",
    }


SLOT = {
    "tier": "project",
    "project_id": "billing",
    "task_id": None,
    "subject": "billing service",
    "attribute": "database",
}


def write_set(path: Path) -> Path:
    """Three minutes of one project: a fact, a question (a distractor), and the fact's new value."""
    data = {
        "minutes": [
            minute(T0, "The billing service's database is Postgres."),
            minute(T1, "Should we cache the invoices?"),
            minute(T2, "The billing service's database is CockroachDB.", "decision"),
        ],
        "facts": [
            gold("b-1", "Postgres", IDS[T0], T0, T2, aliases=["PostgreSQL"]),
            gold("b-2", "CockroachDB", IDS[T2], T2, None),
        ],
        "annotations": {
            "supersessions": [],
            "restatements": [],
            "cross_slot_traps": [],
            "multi_valued_additions": [],
            "relative_dates": [],
            "promotions": [],
            "distractor_minute_ids": [IDS[T1]],
            "question_slots": {"q1": SLOT, "q2": SLOT},
        },
        "questions": [
            {
                "id": "q1",
                "project_id": "billing",
                "question": "Which database now?",
                "gold_fact_ids": ["b-2"],
                "expected_value": "CockroachDB",
            },
            {
                "id": "q2",
                "project_id": "billing",
                "question": "Which database on 3 March?",
                "as_of": T1,
                "gold_fact_ids": ["b-1"],
                "expected_value": "Postgres",
            },
        ],
        "current_as_of": END,
    }
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def stored(value: str, subject: str = "billing service", attribute: str = "database", **more: Any) -> Fact:
    return Fact.new(
        type=more.get("type", FactType.FACT),
        text=f"{subject} {attribute} is {value}",
        subject=subject,
        attribute=attribute,
        value=value,
        tier_key=TierKey.for_project(more.get("project", "billing")),
        confidence=0.9,
        source_minute_ids=(more.get("source", IDS[T0]),),
        status=more.get("status", FactStatus.PROMOTED),
        valid_from=more.get("valid_from", T0),
        valid_until=more.get("valid_until"),
        recorded_at=more.get("valid_from", T0),
    )


def test_values_and_slots_match_as_the_docstring_says() -> None:
    g = GoldProseFact("g", "p", "project", None, "fact", "Android app", "minSdk", "26", ("API 26",), True, (), T0, None)
    assert value_matches("26", g) and value_matches("api 26", g) and value_matches("minSdk 26 now", g)
    assert not value_matches("24", g) and not value_matches("26 on main since last week", g)
    assert slot_likeness("android app minSdk", "min SDK android") >= 0.5  # shared words
    assert slot_likeness("minsdk", "min sdk") >= 0.5  # shared spelling
    assert slot_likeness("billing database", "deploy window") < 0.5


def test_matching_is_one_to_one_so_a_fact_stored_twice_is_a_false_positive(tmp_path: Path) -> None:
    data = load(write_set(tmp_path / "set.json"))
    twice = [stored("Postgres"), stored("PostgreSQL", subject="billing svc"), stored("MySQL")]
    pairs = match(twice, data.facts)
    assert list(pairs.values()) == ["b-1"]  # the better slot likeness wins the one gold fact
    assert pairs == {twice[0].id: "b-1"}


def test_scores_are_the_ratios_of_what_the_store_holds(tmp_path: Path) -> None:
    data = load(write_set(tmp_path / "set.json"))
    old = stored("Postgres", valid_until=T2, status=FactStatus.SUPERSEDED)
    new = stored("CockroachDB", valid_from=T2, source=IDS[T2])
    noise = stored("invoices cache", subject="invoices", attribute="cache", source=IDS[T1])
    run = ProseRun(facts=[old, new, noise], in_force={"q1": [new], "q2": [old]})
    metrics, counts = score(data, run)
    assert metrics["prose_precision"] == round(2 / 3, 4) and metrics["prose_recall"] == 1.0
    assert metrics["prose_current_view_accuracy"] == 1.0 and metrics["prose_stale_current_rate"] == 0.0
    assert (
        metrics["prose_distractor_facts"] == 1 and counts["unmatched_stored_examples"][0]["value"] == "invoices cache"
    )
    # The old value still in force at the end: the current question is wrong, and stale.
    stale = ProseRun(facts=[stored("Postgres")], in_force={"q1": [stored("Postgres")], "q2": [stored("Postgres")]})
    metrics, counts = score(data, stale)
    assert metrics["prose_current_view_accuracy"] == 0.5 and metrics["prose_stale_current_rate"] == 0.5
    assert counts["wrong_questions"] == [
        {"question": "q1", "text": "Which database now?", "expected": "CockroachDB", "stale": True}
    ]
    assert counts["missed_examples"][0]["fact"] == "b-2"


def test_a_question_is_answered_from_the_likest_slot_and_a_stale_value_counts_in_any_near_one(tmp_path: Path) -> None:
    data = load(write_set(tmp_path / "set.json"))
    new = stored("CockroachDB", valid_from=T2, source=IDS[T2])
    near = stored("Redis", subject="billing", attribute="database cache")  # like the slot, less than the answer
    run = ProseRun(facts=[new, near], in_force={"q1": [new, near], "q2": []})
    metrics, _ = score(data, run)
    assert metrics["prose_current_view_accuracy"] == 0.5  # q1 right: the likest slot holds exactly the answer
    # An old value of the slot in force under other words is stale even where the likest slot is right.
    old = stored("Postgres", subject="billing", attribute="database cache")
    metrics, _ = score(data, ProseRun(facts=[new, old], in_force={"q1": [new, old], "q2": []}))
    assert metrics["prose_current_view_accuracy"] == 0.5 and metrics["prose_stale_current_rate"] == 0.5
    # "Said" statements are knowledge, not typed facts: counted apart, never a false positive.
    said = stored("I moved the invoices to the new cluster last week", subject="ada", attribute="statement")
    metrics, counts = score(data, ProseRun(facts=[new, said], in_force={"q1": [new], "q2": []}))
    assert metrics["prose_precision"] == 1.0 and counts["said_held"] == 1 and counts["held_facts"] == 1


@pytest.mark.integration
def test_the_split_runs_the_set_through_the_facts_pool_and_reads_pvms_own_views(tmp_path: Path) -> None:
    result = run_split(Progress(), write_set(tmp_path / "set.json"), repeats=1)
    metrics = {k: cell["value"] for k, cell in result["metrics"].items()}
    counts = result["counts"]
    assert counts["minutes"] == 3 and counts["gold_facts"] == 2 and counts["questions"] == 2
    # The rules read both statements of the slot, and the newer retires the older: every question answered.
    assert metrics["prose_recall"] == 1.0 and metrics["prose_current_view_accuracy"] == 1.0
    assert metrics["prose_precision"] == round(counts["matched"] / counts["held_facts"], 4)
    assert metrics["facts_per_s"] > 0 and result["metrics"]["prose_recall"]["met"] is True
    skipped = run_split(Progress(), tmp_path / "absent.json")
    assert set(skipped) == {"skipped"} and skipped["skipped"].startswith(f"{tmp_path / 'absent.json'} is absent")


@pytest.mark.integration
def test_the_split_runs_through_an_llm_when_one_is_named(tmp_path: Path, openai_server: OpenAIServer) -> None:
    openai_server.queue_chat_reply(*[FIXED_ANSWER] * 3)
    llm = LLMClient(openai_server.base_url, "sk-test", "test-chat", backoff_base=0.01, backoff_max=0.05)
    result = run_split(Progress(), write_set(tmp_path / "set.json"), repeats=1, extractor=LLMExtractor(llm))
    assert result["extractor"] == "LLMExtractor" and len(openai_server.chat_requests()) >= 1
    assert set(TARGETS) <= set(result["metrics"]) and result["counts"]["minutes"] == 3
    # The scripted answer states the billing service's database is Postgres, as the set's first minute does.
    assert result["metrics"]["prose_recall"]["value"] >= 0.5
    assert run_split(Progress(), write_set(tmp_path / "set.json"), repeats=1)["extractor"] == "rules"


def test_llm_extractor_reads_the_callers_pvm_llm_settings_and_says_what_is_missing(
    openai_server: OpenAIServer,
) -> None:
    with pytest.raises(BenchError, match="set PVM_LLM_MODEL"):
        llm_extractor({"HOME": "/tmp"})
    named = llm_extractor({"PVM_LLM_MODEL": "test-chat", "PVM_LLM_BASE_URL": openai_server.base_url, "OTHER": "x"})
    assert isinstance(named, LLMExtractor)

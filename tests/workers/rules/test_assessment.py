"""How PVM assesses a minute: categories, outcome, task kind, insights and scores (pure rules, no I/O)."""

from __future__ import annotations

from typing import Any

import pytest

from contracts import KNOWN_EVENT_TYPES
from contracts.memory import Category
from tests.workers.minutes import T0_S, golden, minute
from workers.rules import assessment
from workers.rules.assessment import (
    COMPOSITE_WEIGHTS,
    categorize,
    initial_score_fields,
    initial_scores,
    insights,
    insights_with_kind,
    task_kind,
    timestamp_ms,
)

# -- categorize -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event_type", "data", "note", "expected"),
    [
        ("task_assigned", {}, None, Category.TASK_ASSIGNMENT),
        ("handoff", {}, None, Category.TASK_ASSIGNMENT),
        ("task_started", {}, None, Category.TASK_ASSIGNMENT),
        ("conflict_detected", {}, None, Category.CONFLICT_RESOLUTION),
        ("conflict_resolved", {}, None, Category.CONFLICT_RESOLUTION),
        ("task_failed", {"success_criteria_met": 95}, None, Category.FAILURE_PATTERN),  # failed is failed
        ("task_completed", {}, None, Category.AGENT_CAPABILITY),
        ("task_completed", {"success_criteria_met": 85}, None, Category.AGENT_CAPABILITY),
        ("task_completed", {"success_criteria_met": 20}, None, Category.FAILURE_PATTERN),
        ("task_completed", {"success": False}, None, Category.FAILURE_PATTERN),
        ("capability_observed", {"capability": "sql"}, None, Category.AGENT_CAPABILITY),
        ("decision", {}, None, Category.COORDINATION_PATTERN),
        ("message", {}, "this failed badly", Category.COORDINATION_PATTERN),  # known types ignore keywords
        ("knowledge", {}, None, Category.PROJECT_KNOWLEDGE),
        ("evaluation", {"success_criteria_met": 90}, None, Category.AGENT_CAPABILITY),
        ("evaluation", {"success_criteria_met": 10}, None, Category.FAILURE_PATTERN),
        ("evaluation", {}, None, Category.PROJECT_KNOWLEDGE),
        # Unknown event types: keyword rules over the type, the note and the data, first match wins.
        ("deploy.rollback:canary-v2", {}, None, Category.FAILURE_PATTERN),
        ("build_report", {"error": "linker died"}, None, Category.FAILURE_PATTERN),  # a data key
        ("build_report", {"status": "Timed out after 5m"}, None, Category.FAILURE_PATTERN),  # a data value
        ("merge.conflict", {}, None, Category.CONFLICT_RESOLUTION),
        ("lock_report", {}, "Conflict over schema.sql; also an error", Category.FAILURE_PATTERN),
        ("work_delegated", {}, None, Category.TASK_ASSIGNMENT),
        ("skill_learned", {}, None, Category.AGENT_CAPABILITY),
        ("vote_cast", {}, "reached consensus", Category.COORDINATION_PATTERN),
        ("weather.report", {"city": "Oslo"}, "sunny", Category.PROJECT_KNOWLEDGE),
        ("news", {}, "a terror of a mirror", Category.PROJECT_KNOWLEDGE),  # "error" only at a word start
    ],
)
def test_categorize(event_type: str, data: dict[str, Any], note: str | None, expected: Category) -> None:
    assert categorize(minute(event_type, data=data, memory_note=note)) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("task_assigned_full", Category.TASK_ASSIGNMENT),
        ("conflict_resolved_with_references", Category.CONFLICT_RESOLUTION),
        ("task_failed_zero_score", Category.FAILURE_PATTERN),
        ("unknown_event_type", Category.FAILURE_PATTERN),  # deploy.rollback:canary-v2
        ("minimal", None),
    ],
)
def test_every_golden_vector_gets_a_category(name: str, expected: Category | None) -> None:
    category = categorize(golden(name))
    assert isinstance(category, Category)
    if expected is not None:
        assert category == expected


def test_task_kind() -> None:
    assert task_kind(minute("task_completed", data={"task_id": "migration-42"})) == "migration"
    assert task_kind(minute("task_completed", data={"task_id": "T-1042"})) is None  # "T" names no kind
    assert task_kind(minute("task_completed", data={"task_id": "fix-login"})) is None  # no number: an id, not a kind
    assert task_kind(minute("task_completed", data={"task_id": "T-1", "task_kind": "Schema Migration"})) == (
        "schema migration"
    )


def test_observed_capability_is_keyed_as_agent_memory_keys_it() -> None:
    assert assessment.observed_capability(minute("capability_observed", data={"capability": "  Postgres Tuning "})) == (
        "postgres tuning"
    )
    assert assessment.observed_capability(minute("capability_observed", data={"capability": "x" * 100})) == "x" * 64
    assert assessment.observed_capability(minute("capability_observed", data={"task_id": "etl-9"})) == "etl"
    assert assessment.observed_capability(minute("capability_observed", data={"capability": " "})) is None


# -- insights ---------------------------------------------------------------------


def test_outcome_insight_confidence_follows_how_decisive_the_score_is() -> None:
    def outcome_of(score: float) -> Any:
        found = insights(minute("evaluation", data={"task_id": "T-9", "success_criteria_met": score}))
        return next(i for i in found if i.type == "outcome")

    high = outcome_of(85)
    assert high.finding == "task T-9 met 85% of its success criteria"
    assert "task:T-9" in high.applicable_contexts and "agent:a1" in high.applicable_contexts
    assert outcome_of(87.5).finding == "task T-9 met 87.5% of its success criteria"
    assert outcome_of(50).confidence == 0.5
    assert outcome_of(100).confidence == outcome_of(0).confidence == 1.0
    assert 0.5 < outcome_of(70).confidence < high.confidence < 1.0


def test_capability_insights_from_completed_and_failed_tasks() -> None:
    done = insights(minute("task_completed", agent_id="builder-2", data={"task_id": "migration-42"}))
    assert [(i.type, i.finding) for i in done] == [("capability", "agent builder-2 can handle migration tasks")]
    assert set(done[0].applicable_contexts) == {"task:migration-42", "agent:builder-2", "kind:migration"}

    failed = insights(golden("task_failed_zero_score"))
    by_type = {i.type: i for i in failed}
    assert by_type["outcome"].finding == "task T-1043 met 0% of its success criteria"
    assert by_type["capability"].finding == "agent builder-5 struggles with task T-1043 (timeout after 900s)"
    assert by_type["capability"].confidence == 1.0

    weak = insights(minute("task_completed", data={"task_id": "api-3", "success_criteria_met": 30}))
    assert next(i for i in weak if i.type == "capability").finding == "agent a1 struggles with api tasks"


def test_capability_observed_and_resolution_insights() -> None:
    seen = insights(minute("capability_observed", data={"capability": "postgres tuning", "confidence": 0.9}))
    assert [(i.type, i.finding, i.confidence) for i in seen] == [
        ("capability", "agent a1 is capable of postgres tuning", 0.9)
    ]
    resolved = insights(golden("conflict_resolved_with_references"))
    assert [i.type for i in resolved] == ["resolution"]
    assert (
        resolved[0].finding
        == "file lock conflicts resolved by builder-2 keeps schema.sql; builder-5 rebases after merge"
    )
    assert set(resolved[0].applicable_contexts) == {"task:T-1042", "conflict:file_lock", "agent:arbiter"}
    assert 0 < resolved[0].confidence <= 1


def test_plain_messages_teach_nothing_yet() -> None:
    assert insights(minute("message", memory_note="hello")) == []
    assert insights(minute("conflict_resolved", data={"conflict_type": "x"})) == []  # no resolution stated


# -- scores ---------------------------------------------------------------------


ALL_TYPES = [*sorted(KNOWN_EVENT_TYPES), "deploy.rollback", "weather.report"]  # known types, then two others


@pytest.mark.parametrize("event_type", ALL_TYPES)
@pytest.mark.parametrize("score", [None, 0, 55.5, 100])
def test_scores_are_between_0_and_1(event_type: str, score: float | None) -> None:
    data = {} if score is None else {"success_criteria_met": score}
    for now in (T0_S - 60, T0_S, T0_S + 3600, T0_S + 10 * 365 * 86400):
        s = initial_scores(minute(event_type, data=data), now)
        for value in s.to_dict().values():
            assert 0.0 <= value <= 1.0


def test_scores_order_sensibly() -> None:
    failure = initial_scores(minute("task_failed"), T0_S)
    message = initial_scores(minute("message"), T0_S)
    decision = initial_scores(minute("decision"), T0_S)
    assert failure.impact > message.impact and decision.impact > message.impact
    assert failure.composite > message.composite
    assert failure.recency == 1.0 and failure.relevance == 0.5
    unknown_failure = initial_scores(minute("deploy.rollback"), T0_S)
    assert unknown_failure.impact > message.impact


def test_recency_decays_and_accuracy_follows_the_score() -> None:
    week = assessment.RECENCY_HALF_LIFE_S
    m = minute("task_completed", data={"success_criteria_met": 85})
    assert initial_scores(m, T0_S).recency == 1.0
    assert initial_scores(m, T0_S - 3600).recency == 1.0  # a clock ahead of ours is not "newer than new"
    assert initial_scores(m, T0_S + week).recency == pytest.approx(0.5)
    assert initial_scores(m, T0_S + 2 * week).recency == pytest.approx(0.25)
    assert initial_scores(m, T0_S).accuracy == 0.85
    assert initial_scores(minute("message"), T0_S).accuracy == 0.5
    s = initial_scores(m, T0_S + week)
    assert s.composite == pytest.approx(sum(COMPOSITE_WEIGHTS[k] * getattr(s, k) for k in COMPOSITE_WEIGHTS), abs=1e-3)
    assert sum(COMPOSITE_WEIGHTS.values()) == pytest.approx(1.0)


def test_timestamp_ms_is_exact() -> None:
    assert timestamp_ms(minute("message")) == int(T0_S * 1000)
    assert timestamp_ms(minute("message", timestamp="2026-11-26T10:00:00.250999Z")) == int(T0_S * 1000) + 250
    # 15:30:00.123456789+05:30 is 10:00:00.123 UTC (nanoseconds truncated to ms, never rounded up)
    assert timestamp_ms(golden("timestamp_offset_nanoseconds")) == int(T0_S * 1000) + 123


# -- the forms the index pool uses ------------------------------------------------


@pytest.mark.parametrize("event_type", ALL_TYPES)
@pytest.mark.parametrize("data", [{}, {"task_id": "migration-42", "success_criteria_met": 70}, {"task_kind": "SQL"}])
def test_the_forms_given_a_known_kind_and_category_agree_with_the_plain_ones(
    event_type: str, data: dict[str, Any]
) -> None:
    m = minute(event_type, data=data, memory_note="rolled back after an error")
    assert insights_with_kind(m, task_kind(m)) == insights(m)
    fields = initial_score_fields(m, T0_S + 3600, categorize(m), timestamp_ms(m))
    assert fields == initial_score_fields(m, T0_S + 3600, None, None) == initial_scores(m, T0_S + 3600).to_dict()

"""The rule extractor: each rule read and refused, slots, values, dates, tiers, the data convention, determinism."""

from __future__ import annotations

import random
from typing import Any

import pytest

from bench.sessions import stream
from contracts import Minute
from tests.workers.minutes import T0, minute
from workers.facts.extraction import (
    ATTRIBUTES,
    RULE_CONFIDENCE,
    Candidate,
    Extractor,
    RuleExtractor,
    normalize_subject,
    parse_slot,
    value_key,
)
from workers.ops.demo import TASK_DECISIONS, sample_session
from workers.rules.statements import STATEMENT

TOMORROW = "2026-11-27T00:00:00.000000Z"  # T0 is Thursday 2026-11-26 10:00 UTC
YESTERDAY = "2026-11-25T00:00:00.000000Z"


def extract(note: str | None, event_type: str = "message", n: int = 0, **fields: Any) -> list[Candidate]:
    return RuleExtractor().extract([minute(event_type, n, memory_note=note, **fields)])


def one(note: str, event_type: str = "message", **fields: Any) -> Candidate:
    found = extract(note, event_type, **fields)
    assert len(found) == 1, (note, found)
    return found[0]


def reads(note: str, event_type: str = "message", **fields: Any) -> tuple[str, str, str, str]:
    """(type, subject, attribute, value) of the one candidate `note` states."""
    c = one(note, event_type, **fields)
    return (c.type, c.subject, c.attribute, c.value)


# -- constraints ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("note", "expected"),
    [
        ("we must not deploy on Fridays", ("constraint", "scope", "must_not", "deploy on Fridays")),
        ("We must never deploy on Fridays.", ("constraint", "scope", "must_not", "deploy on Fridays")),
        ("never push directly to main", ("constraint", "scope", "must_not", "push directly to main")),
        (
            "do not run migrations during business hours",
            ("constraint", "scope", "must_not", "run migrations during business hours"),
        ),
        ("don't skip code review", ("constraint", "scope", "must_not", "skip code review")),
        ("nobody may share customer data in chat", ("constraint", "scope", "must_not", "share customer data in chat")),
        (
            "it's forbidden to store secrets in the repo",
            ("constraint", "scope", "must_not", "store secrets in the repo"),
        ),
        ("rule: always tag every release", ("constraint", "scope", "must", "tag every release")),
        (
            "every agent must run the test suite before merging",
            ("constraint", "scope", "must", "run the test suite before merging"),
        ),
        (
            "the payments API must never log card numbers",
            ("constraint", "payments api", "must_not", "log card numbers"),
        ),
        ("backups must be encrypted at rest", ("constraint", "backups", "must", "be encrypted at rest")),
        (
            "Lesson learned: we must not run migrations during business hours",
            ("constraint", "scope", "must_not", "run migrations during business hours"),
        ),
    ],
)
def test_constraints_are_read(note: str, expected: tuple[str, str, str, str]) -> None:
    assert reads(note) == expected


@pytest.mark.parametrize(
    "note",
    [
        "a must-have for the next release: dark mode",
        "must-have features are listed in the doc",
        "the deploy must have failed overnight",
        "we must be careful with the cache",
        "I cannot reproduce the flaky test on my machine",
        "we cannot find the root cause",
        "the tester cannot log in to staging",
        # "X cannot Y" is not read at all (DROPPED_RULES): it was an ability far more often than a rule
        "the mobile app cannot call the admin API",
        "never mind, found it",
        "don't worry about the lint warnings",
        "the reviewer must finish the review today",
        "should we never deploy on Fridays?",
        "maybe we must not deploy on Fridays",
        # encouragement between people (issue 25: LoCoMo's "Don't give up" became a project-wide must_not)
        "Don't give up!",
        "never stop trying, you will get there",
        "never lose hope",
        "don't be afraid to ask",
        "always believe in yourself",
        "You must love seeing how you've grown as an artist",  # a guess at a feeling (LoCoMo)
        "you must really enjoy having them around",
        # a question however it is punctuated after its mark (issue 25: a closing quote slipped past the check)
        '"We must not deploy on Fridays?" she asked.',
        '"We must not deploy on Fridays?"',
        "We must not deploy on Fridays?)",
        "We must not deploy on Fridays? ”",
    ],
)
def test_chatter_that_sounds_like_a_rule_is_no_constraint(note: str) -> None:
    assert extract(note) == []


def test_constraints_are_multi_valued() -> None:
    assert not one("never deploy on Fridays").single_valued
    assert one("the auth service's session TTL is 8 hours").single_valued


# -- procedures -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("note", "condition", "action"),
    [
        ("to rotate the TLS certificates, run certbot renew", "rotate the tls certificates", "run certbot renew"),
        (
            "To rotate the TLS certificates, always run certbot renew.",
            "rotate the tls certificates",
            "run certbot renew",
        ),
        ("how to restore a backup: use the point-in-time restore", "restore a backup", "use the point-in-time restore"),
        (
            "if you need to restore a backup, use the point-in-time restore",
            "restore a backup",
            "use the point-in-time restore",
        ),
        ("when the disk fills up, expand the volume", "disk fills up", "expand the volume"),
        ("if the disk fills up, expand the volume", "disk fills up", "expand the volume"),
        ("whenever the disk fills up, then expand the volume", "disk fills up", "expand the volume"),
        ("expand the volume whenever the disk fills up", "disk fills up", "expand the volume"),
        (
            "runbook: when a deploy fails, roll back to the previous release",
            "deploy fails",
            "roll back to the previous release",
        ),
        (
            "before deploying the billing service, run the smoke tests",
            "before deploying the billing service",
            "run the smoke tests",
        ),
    ],
)
def test_procedures_keep_the_condition_as_subject_and_the_action_as_value(
    note: str, condition: str, action: str
) -> None:
    assert reads(note) == ("procedure", condition, "action", action)


@pytest.mark.parametrize(
    "note",
    [
        "when I got in, the build was red",
        "if you have a minute, review my pull request",
        "to be fair, the tests were flaky last week",
        "once the coffee kicks in, I will look at it",
        "when in the office, the coffee is free",
        "restart it if needed",
    ],
)
def test_a_clause_without_an_instruction_is_no_procedure(note: str) -> None:
    # "when I got in, the build was red" is what its speaker saw: kept as said (a statement), no procedure.
    assert [c for c in extract(note) if c.attribute != STATEMENT] == []


# -- preferences and goals -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("note", "topic", "value"),
    [
        ("we prefer gRPC for internal APIs", "internal apis", "gRPC"),
        ("we prefer gRPC over REST for internal APIs", "internal apis", "gRPC"),
        ("the team prefers gRPC for internal APIs over REST", "internal apis", "gRPC"),
        ("for internal APIs, we prefer gRPC", "internal apis", "gRPC"),
        ("we'd rather use gRPC for internal APIs", "internal apis", "gRPC"),
        ("our preference for internal APIs is gRPC", "internal apis", "gRPC"),
        ("gRPC is preferred for internal APIs", "internal apis", "gRPC"),
    ],
)
def test_preferences_are_per_topic(note: str, topic: str, value: str) -> None:
    assert reads(note) == ("preference", topic, "preference", value)


@pytest.mark.parametrize(
    "note", ["I'd prefer a quick call over chat for this", "we prefer to wait", "I would rather not touch it today"]
)
def test_a_personal_or_topicless_preference_is_not_read(note: str) -> None:
    assert extract(note) == []


@pytest.mark.parametrize(
    ("note", "subject", "value"),
    [
        (
            "our goal for the search API is to cut p99 latency below 200 ms",
            "search api",
            "cut p99 latency below 200 ms",
        ),
        ("goal for the search API: cut p99 latency below 200 ms", "search api", "cut p99 latency below 200 ms"),
        ("search api target: cut p99 latency below 200 ms", "search api", "cut p99 latency below 200 ms"),
        ("the objective for the search api is to reach 99.9% uptime", "search api", "reach 99.9% uptime"),
        ("we aim to reach 99.9% uptime on the search api", "search api", "reach 99.9% uptime"),
        ("our goal is to ship the v2 API by next Friday", "scope", "ship the v2 API by 2026-11-27"),
        ("Goal: ship the v2 API by next Friday", "scope", "ship the v2 API by 2026-11-27"),
    ],
)
def test_goals_are_read_with_their_dates_grounded(note: str, subject: str, value: str) -> None:
    assert reads(note) == ("goal", subject, "goal", value)


@pytest.mark.parametrize(
    "note", ["the goal is clear enough", "what's the target for the search api?", "goal!", "we aim high"]
)
def test_talk_about_goals_is_no_goal(note: str) -> None:
    assert extract(note) == []


# -- attributes, decisions, tools, entities ------------------------------------------------------


RESTATEMENTS = [
    "the auth service's session TTL is 8 hours",
    "The session time-to-live of the auth service is 8h.",
    "auth service session TTL: eight hours",
    "Auth Service session ttl = 8 hours",
    "the session TTL for the auth service is 8 hours",
    "FYI, the auth service's session TTL is 8 hours",
    "note: the auth service uses 8 hours as its session TTL",
]


@pytest.mark.parametrize("note", RESTATEMENTS)
def test_restatements_land_in_one_slot_with_one_value(note: str) -> None:
    c = one(note, "knowledge")
    assert (c.type, c.slot, value_key(c.value)) == ("fact", ("auth service", "session_ttl"), "8 hours")


def test_lookalikes_land_in_different_slots() -> None:
    ttl = one("the auth service's session TTL is 8 hours")
    timeout = one("the auth service's request timeout is 30 seconds")
    other = one("the auth gateway's session TTL is 8 hours")
    assert len({ttl.slot, timeout.slot, other.slot}) == 3
    assert one("the billing worker DB is MySQL").slot != one("the billing service DB is MySQL").slot


@pytest.mark.parametrize(
    "note",
    [
        "the billing service DB is slow again today",
        "the billing service's database migration is done",
        "is the billing service's database still Postgres?",
        "what is the database of the billing service again?",
        "should we move the billing service DB to MySQL?",
        "maybe MySQL would be a better database for the billing service",
        "we could use MySQL for the billing service database",
        "someone said the billing service database might be MySQL",
        "the billing service database is not MySQL",
        "the database is Postgres",  # whose?
        "it is Postgres",
        "the standup is at 10",
        "the billing service is having a bad day",
    ],
)
def test_questions_hedges_and_passing_states_state_no_fact(note: str) -> None:
    assert extract(note) == []


def test_a_plain_statement_in_a_decision_minute_is_a_decision() -> None:
    plain = one("the billing service's database is CockroachDB", "decision")
    assert (plain.type, plain.slot, plain.value) == ("decision", ("billing service", "database"), "CockroachDB")
    assert plain.confidence > one("the billing service's database is CockroachDB").confidence
    assert one("decision: the billing service's database is CockroachDB").type == "decision"


@pytest.mark.parametrize(
    ("note", "supersedes"),
    [
        ("we decided to use CockroachDB for the billing service database", False),
        ("we're going with CockroachDB for the database of the billing service", False),
        ("going forward, the billing service's database will be CockroachDB", True),
        ("we'll switch the billing service DB from Postgres to CockroachDB", True),
        ("the billing service's database moves from Postgres to CockroachDB", True),
        ("use CockroachDB instead of Postgres for the billing service DB", True),
        ("we decided to replace Postgres with CockroachDB as the billing service's database", True),
    ],
)
def test_decisions_and_the_hint_that_they_replace_a_value(note: str, supersedes: bool) -> None:
    c = one(note)
    assert (c.type, c.slot, c.value) == ("decision", ("billing service", "database"), "CockroachDB")
    assert c.supersedes_hint is supersedes


def test_a_decision_with_before_in_its_value_is_no_procedure() -> None:
    note = "use weekdays before 3pm instead of Tuesday mornings for the search indexer deploy window"
    assert reads(note) == ("decision", "search indexer", "deploy_window", "weekdays before 3pm")


def test_a_resolved_conflict_states_a_decision_that_may_supersede() -> None:
    c = one(
        "the resource conflict over the billing service is resolved",
        "conflict_resolved",
        data={"conflict_type": "resource", "resolution": "the billing service's database is CockroachDB"},
    )
    assert (c.type, c.slot, c.value, c.supersedes_hint) == (
        "decision",
        ("billing service", "database"),
        "CockroachDB",
        True,
    )


def test_a_changed_value_is_a_fact_that_hints_it_replaces_one() -> None:
    for note in (
        "we set the session TTL of the auth service to 8 hours",
        "the auth service session TTL was changed to 8 hours",
        "the auth service's session TTL is now 8 hours",
        "auth service session TTL: moving to 8 hours (was 2 hours)",
    ):
        c = one(note)
        assert (c.type, c.slot, c.value, c.supersedes_hint) == (
            "fact",
            ("auth service", "session_ttl"),
            "8 hours",
            True,
        ), note


@pytest.mark.parametrize(
    "note",
    [
        "we use Sentry for error tracking",
        "the team uses Sentry for error tracking",
        "for error tracking, we use Sentry",
        "error tracking tool: Sentry",
        "our error tracking tool is Sentry",
    ],
)
def test_the_tool_for_a_purpose(note: str) -> None:
    assert reads(note) == ("fact", "error tracking", "tool", "Sentry")


def test_we_use_with_an_attribute_phrase_is_that_attribute() -> None:
    assert reads("we use Postgres for the billing service database") == (
        "fact",
        "billing service",
        "database",
        "Postgres",
    )


def test_entities_and_aliases() -> None:
    assert reads("Acme is a payment provider") == ("entity", "acme", "kind", "payment provider")
    assert reads("pg-main is our PostgreSQL cluster") == ("entity", "pg-main", "kind", "PostgreSQL cluster")
    alias = one("pg-main is also known as the main database")
    assert (alias.type, alias.slot, alias.value, alias.single_valued) == (
        "entity",
        ("pg-main", "alias"),
        "main database",
        False,
    )


@pytest.mark.parametrize(
    "note",
    ["this is a known issue", "coder is a bit behind on reviews", "the standup is a mess", "that is a good idea"],
)
def test_judging_something_is_no_entity(note: str) -> None:
    assert extract(note) == []


def test_an_inverted_statement_is_the_attribute_not_an_entity() -> None:
    assert reads("Postgres is the database of the billing service") == (
        "fact",
        "billing service",
        "database",
        "Postgres",
    )


# -- dates, tiers, provenance -----------------------------------------------------------------


def test_valid_from_is_the_minutes_time_unless_a_date_phrase_says_otherwise() -> None:
    assert one("the auth service's session TTL is 8 hours").valid_from == T0
    assert one("the auth service's session TTL is 8 hours starting tomorrow").valid_from == TOMORROW
    assert one("the auth service's session TTL is 8 hours, as of tomorrow").valid_from == TOMORROW
    assert one("since yesterday, the auth service's session TTL is 8 hours").valid_from == YESTERDAY
    assert one("tomorrow we switch the auth service DB from Postgres to MySQL").valid_from == TOMORROW
    shifted = one("the auth service's session TTL is 8 hours", timestamp="2026-11-26T23:30:00-05:00")
    assert shifted.valid_from == "2026-11-27T04:30:00.000000Z"  # the minute's instant, in UTC


def test_a_deadline_is_a_grounded_date_in_the_task_tier() -> None:
    c = one("this task is due next Friday", "task_assigned", data={"task_id": "launch-7"}, scope="task")
    assert (c.type, c.slot, c.value, c.tier, c.task_id) == (
        "fact",
        ("task", "deadline"),
        "2026-11-27",
        "task",
        "launch-7",
    )
    for note in (
        "deadline for this task: in 1 day",
        "this task's deadline is tomorrow",
        "the deadline of this task is 2026-11-27",
    ):
        assert one(note, data={"task_id": "launch-7"}, scope="task").value == "2026-11-27", note


@pytest.mark.parametrize(
    ("scope", "data", "tier", "task_id"),
    [
        ("task", {"task_id": "t-1"}, "task", "t-1"),
        ("task", {}, "project", None),  # a task tier needs its task
        ("project", {"task_id": "t-1"}, "project", None),  # said while on a task, about the project
        ("global", {"task_id": "t-1"}, "project", None),  # never global: promotion is explicit
    ],
)
def test_the_tier_follows_the_minutes_scope_and_task(
    scope: str, data: dict[str, Any], tier: str, task_id: str | None
) -> None:
    c = one("never deploy on Fridays", scope=scope, data=data)
    assert (c.tier, c.task_id, c.project_id) == (tier, task_id, "p1")


def test_a_candidate_names_its_minute_rule_and_sentence() -> None:
    c = one("FYI, the auth service's session TTL is 8h", "knowledge", n=7, data={"task_kind": "tuning"})
    assert c.source_minute_ids == ("id00007",)
    assert c.rule == "attribute" and c.confidence == pytest.approx(RULE_CONFIDENCE["attribute"] + 0.05)  # knowledge
    assert not c.supersedes_hint  # a plain statement says nothing of an earlier value
    assert c.text == "FYI, the auth service's session TTL is 8h."
    assert c.value == "8 hours"
    assert c.tags == ("kind:tuning",)


def test_several_sentences_several_candidates_and_one_per_statement() -> None:
    note = "We must not deploy on Fridays. Never deploy on Fridays! Acme is a payment provider; is it?"
    found = extract(note)
    assert [(c.type, c.slot) for c in found] == [("constraint", ("scope", "must_not")), ("entity", ("acme", "kind"))]


# -- events and data -----------------------------------------------------------------------------


def test_a_failed_task_states_why_its_kind_of_task_fails() -> None:
    c = one(
        "deployer failed deploy-12: out of disk space",
        "task_failed",
        data={"task_id": "deploy-12", "error": "out of disk space on the runner"},
    )
    assert (c.type, c.slot, c.value, c.single_valued, c.tier) == (
        "fact",
        ("deploy", "failure_cause"),
        "out of disk space on the runner",
        False,
        "project",
    )
    assert extract("it broke", "task_failed", data={"task_id": "T-1042", "error": "boom"}) == []  # no kind of task
    assert extract("it broke", "task_completed", data={"task_id": "deploy-12", "error": "boom"}) == []


def test_the_data_convention_states_exact_slots_and_the_note_is_not_read() -> None:
    data = {"fact": {"subject": "The Billing Service", "attribute": "DB", "value": "Postgres"}}
    c = one("we must not deploy on Fridays (not read)", data=data)
    assert (c.type, c.slot, c.value, c.rule, c.confidence) == (
        "fact",
        ("billing service", "database"),
        "Postgres",
        "data",
        RULE_CONFIDENCE["data"],
    )
    assert c.text == "billing service database: Postgres."


@pytest.mark.parametrize(
    ("event_type", "data", "expected"),
    [
        (
            "decision",
            {"fact": {"subject": "billing service", "attribute": "database", "value": "Postgres"}},
            "decision",
        ),
        (
            "message",
            {"decision": {"subject": "billing service", "attribute": "database", "value": "Postgres"}},
            "decision",
        ),
        (
            "decision",
            {"fact": {"type": "fact", "subject": "billing service", "attribute": "database", "value": "Postgres"}},
            "fact",
        ),
        (
            "message",
            {"constraint": {"subject": "everyone", "attribute": "must not", "value": "deploy on Fridays"}},
            "constraint",
        ),
    ],
)
def test_the_conventions_type_comes_from_the_object_the_key_or_the_event(
    event_type: str, data: dict[str, Any], expected: str
) -> None:
    assert one("x", event_type, data=data).type == expected


def test_the_convention_takes_lists_procedures_dates_tiers_and_skips_what_it_cannot_read() -> None:
    data = {
        "facts": [
            {"type": "procedure", "condition": "the disk fills up", "action": "expand the volume"},
            {"type": "goal", "subject": "search api", "attribute": "goal", "value": "ship v2 by next Friday"},
            {"subject": "this task", "attribute": "deadline", "value": "tomorrow", "tier": "task"},
            {"subject": "search api", "attribute": "replicas", "value": 3, "valid_from": "starting tomorrow"},
            {
                "subject": "search api",
                "attribute": "owner",
                "value": "team-search",
                "valid_from": "2026-11-20T08:00:00+01:00",
            },
            {"subject": "search api", "attribute": "owner"},  # no value
            {"type": "rumour", "subject": "search api", "attribute": "owner", "value": "x"},  # no such type
            "not an object",
        ]
    }
    found = one_by_slot(RuleExtractor().extract([minute("message", data={**data, "task_id": "t-9"})]))
    assert set(found) == {
        ("disk fills up", "action"),
        ("search api", "goal"),
        ("task", "deadline"),
        ("search api", "replicas"),
        ("search api", "owner"),
    }
    assert found["search api", "goal"].value == "ship v2 by 2026-11-27"
    assert (found["task", "deadline"].value, found["task", "deadline"].tier) == ("2026-11-27", "task")
    assert (found["search api", "replicas"].value, found["search api", "replicas"].valid_from) == (
        "3",
        "2026-11-27T00:00:00.000000Z",
    )
    assert found["search api", "owner"].valid_from == "2026-11-20T07:00:00.000000Z"
    assert found["search api", "owner"].tier == "project"


def one_by_slot(candidates: list[Candidate]) -> dict[tuple[str, str], Candidate]:
    out = {c.slot: c for c in candidates}
    assert len(out) == len(candidates)
    return out


def test_text_under_a_convention_key_is_read_as_text() -> None:
    c = one("noted", "decision", data={"decision": "we'll switch the billing service DB from Postgres to MySQL"})
    assert (c.type, c.slot, c.value) == ("decision", ("billing service", "database"), "MySQL")


# -- the extractor as a whole ---------------------------------------------------------------------


def test_the_same_minutes_give_the_same_candidates_in_any_batch() -> None:
    from bench.fact_sessions import fact_session

    minutes = fact_session(seed=3).minutes
    first = RuleExtractor().extract(minutes)
    assert first == RuleExtractor().extract(minutes)
    assert first == [c for m in minutes for c in RuleExtractor().extract([m])]
    shuffled = random.Random(1).sample(minutes, len(minutes))
    assert sorted(RuleExtractor().extract(shuffled), key=repr) == sorted(first, key=repr)
    assert {c.rule for c in first} <= set(RULE_CONFIDENCE)
    assert all(0.0 <= c.confidence <= 1.0 for c in first)


def test_chatter_it_was_not_written_against_states_nothing() -> None:
    """bench/sessions.py's failures, conflicts and chatter, and the demo's session (its decisions aside): nothing."""
    decisions = {s for said in TASK_DECISIONS.values() for s in said}  # the demo states these on purpose
    demo = [m for m in sample_session("p", 1000, seed=3) if m.memory_note not in decisions]
    minutes = [*stream({"p": 1.0}, 2000, seed=3, end_ms=1_800_000_000_000), *demo]
    assert RuleExtractor().extract(minutes) == []
    assert RuleExtractor(statements=False).extract(minutes) == []


def test_more_attributes_can_be_taught() -> None:
    note = "the web app's flag provider is Unleash"
    (untaught,) = extract(note)  # an open slot, named as said (workers.rules.open_slots)
    assert (untaught.slot, untaught.value, untaught.rule) == (("web app", "flag provider"), "Unleash", "open_copula")
    taught = RuleExtractor(attributes={"flag_provider": ("flag provider", "feature flag provider")})
    (c,) = taught.extract([minute("message", memory_note=note)])
    assert (c.slot, c.value) == (("web app", "flag_provider"), "Unleash")
    assert ATTRIBUTES.get("flag_provider") is None  # the table itself is untouched


def test_the_rule_extractor_is_an_extractor() -> None:
    extractor: Extractor = RuleExtractor()
    assert extractor.extract([], known={("a", "b"): []}) == []


def test_normalization() -> None:
    assert normalize_subject("The Billing Service's") == "billing service"
    assert normalize_subject("we") == normalize_subject("Everyone") == "scope"
    assert normalize_subject("this task") == "task"
    assert parse_slot("the billing service's DB") == ("billing service", "database")
    assert parse_slot("the number of replicas of the search api") == ("search api", "replicas")
    assert parse_slot("search api number of replicas") == ("search api", "replicas")
    assert parse_slot("billing service") is None
    assert parse_slot("reporting job queue") == ("reporting job", "queue")  # a component's head stays with it
    assert parse_slot("auth service session TTL") == ("auth service", "session_ttl")
    assert value_key("Eight hours") == value_key("8h") == value_key("8 hours.") == "8 hours"
    assert value_key("the main database") == "main database"
    assert value_key("Postgres for now") == "postgres"


def test_an_empty_or_unreadable_minute_states_nothing() -> None:
    assert extract(None) == []
    assert extract("   ") == []
    assert RuleExtractor().extract([Minute(project_id="p", event_type="custom.event", data={"x": [1, 2]})]) == []


def test_an_overlong_sentence_is_not_read_and_the_next_one_is() -> None:
    """A fact is said in a few words; a sentence of hundreds of characters is no statement, and the regexes must
    not spend quadratic time on a hostile 64 KB note."""
    rambling = "the auth service's session TTL is 8 hours, " + "x" * 600
    assert extract(rambling) == []
    hostile = "switch the db " + "from a " * 8000
    assert extract(hostile + ". Never deploy on Fridays.") == [one("never deploy on Fridays", timestamp=T0)]


def test_a_convention_object_of_any_shape_never_fails_the_minute() -> None:
    odd = [
        {"type": {"nested": 1}, "subject": "s", "attribute": "db", "value": "x"},
        {"type": ["fact"], "subject": "s", "attribute": "db", "value": "x"},
        {"subject": {"a": 1}, "attribute": "db", "value": "x"},
        {"subject": "s", "attribute": "db", "value": ["x"]},
        {"subject": "s", "attribute": "db", "value": "x", "tier": ["task"], "valid_from": {"d": 1}},
    ]
    found = RuleExtractor().extract([minute("message", data={"facts": odd})])
    assert [(c.slot, c.value, c.tier) for c in found] == [(("s", "database"), "x", "project")]


def test_single_valued_follows_the_fact_contracts_defaults() -> None:
    """contracts/facts.py decides by type and by collection-like attribute; a kind's failure causes add up."""
    assert not one("our goal for the search API is to halve the error rate").single_valued  # a project has many
    assert not one("the payments api's owner is team-payments").single_valued  # an owners list
    assert one("the payments api's database is Postgres").single_valued
    assert one("we prefer gRPC for internal APIs").single_valued
    failed = one("x", "task_failed", data={"task_id": "deploy-12", "error": "out of disk space"})
    assert not failed.single_valued


def test_what_the_fact_contract_would_refuse_is_not_a_candidate() -> None:
    """The reserved subject of learn(), and values or tags over the contract's limits."""
    learned = {"fact": {"subject": "learned", "attribute": "deploy window", "value": "Tuesday"}}
    assert extract("x", data=learned) == []
    huge = {"fact": {"subject": "search api", "attribute": "owner", "value": "t" * 2000}}
    assert extract("x", data=huge) == []
    tags = [f"tag{i}" for i in range(30)] + ["x" * 100]
    c = one("never deploy on Fridays", data={"tags": tags, "task_kind": "ops"})
    assert len(c.tags) == 16 and all(len(t) <= 64 for t in c.tags) and c.tags[0] == "kind:ops"
    long_text = {"fact": {"subject": "s", "attribute": "db", "value": "x", "text": "y" * 5000}}
    assert len(one("x", data=long_text).text) <= 2048


# -- what the dev wording showed the rules cutting wrong (bench/fact_sessions.py DEV_TEMPLATES) ----------------------


@pytest.mark.parametrize(
    ("note", "expected"),
    [
        # a report of a check before the statement, an attribution or an aside after it
        ("Just confirmed the user service's database is Postgres", ("fact", "user service", "database", "Postgres")),
        ("I double-checked that the API's timeout is 30s", ("fact", "api", "timeout", "30 seconds")),
        ("The auth gateway's replica count is 5, per the runbook", ("fact", "auth gateway", "replicas", "5")),
        ("the API's timeout is 30s, according to the config repo", ("fact", "api", "timeout", "30 seconds")),
        ("Hermes is an email relay, for anyone new", ("entity", "hermes", "kind", "email relay")),
        ("Billing service language is Go since the last deploy", ("fact", "billing service", "language", "Go")),
        (
            "changed the region of the billing service to eu-central-1 this morning",
            ("fact", "billing service", "region", "eu-central-1"),
        ),
        # what a name is, not who runs it
        ("Hermes is the name of our email relay", ("entity", "hermes", "kind", "email relay")),
        ("Ledgerd is a ledger daemon we run", ("entity", "ledgerd", "kind", "ledger daemon")),
        # the chosen value, not the alternative
        (
            "decided to go with SQS rather than NATS for the auth service's message broker",
            ("decision", "auth service", "queue", "SQS"),
        ),
        (
            "the team would rather have Redux than signals for frontend state",
            ("preference", "frontend state", "preference", "Redux"),
        ),
        ("we like fixtures better than factories for test data", ("preference", "test data", "preference", "fixtures")),
        # a team's pick, default or instruction is its preference
        ("TOML is our pick for config files", ("preference", "config files", "preference", "TOML")),
        ("our default for logging is JSON logs", ("preference", "logging", "preference", "JSON logs")),
        (
            "prefer squash merges for merging pull requests",
            ("preference", "merging pull requests", "preference", "squash merges"),
        ),
        ("JSON is the preferred choice for config files here", ("preference", "config files", "preference", "JSON")),
        # "must not be allowed to X" is "must not X"; "if ever C" is "if C"
        (
            "the search api must not be allowed to cache personal data",
            ("constraint", "search api", "must_not", "cache personal data"),
        ),
        (
            "the web frontend must not call the admin API (policy)",
            ("constraint", "web frontend", "must_not", "call the admin API"),
        ),
        (
            "if ever the disk fills up, delete old snapshots first",
            ("procedure", "disk fills up", "action", "delete old snapshots first"),
        ),
    ],
)
def test_asides_alternatives_and_reports_of_a_check_are_cut_from_what_is_stated(
    note: str, expected: tuple[str, str, str, str]
) -> None:
    assert reads(note) == expected


@pytest.mark.parametrize(
    ("note", "valid_from"),
    [
        ("the billing service's region is eu-west-1 - takes effect tomorrow", TOMORROW),
        ("the billing service's region is eu-west-1, valid from tomorrow", TOMORROW),
        ("the billing service's region is eu-west-1, in effect from next Monday", "2026-11-30T00:00:00.000000Z"),
    ],
)
def test_valid_from_and_takes_effect_name_the_day_a_statement_holds_from(note: str, valid_from: str) -> None:
    assert reads(note) == ("fact", "billing service", "region", "eu-west-1")
    assert one(note).valid_from == valid_from


@pytest.mark.parametrize(
    "note",
    [
        "the goal of this PR is cleanup",  # what the conversation points at, not a named thing
        "reviewer is the on-call this week",  # a role for a while
        "I can't get the billing service to start locally",
        "the billing service cannot write to the primary database",  # "cannot" is dropped: an ability, not a rule
    ],
)
def test_what_the_dev_wording_showed_is_no_fact_states_none(note: str) -> None:
    assert extract(note) == []


@pytest.mark.parametrize(
    ("note", "expected"),
    [
        (
            "the data pipeline is configured with Python as the programming language",
            ("fact", "data pipeline", "language", "Python"),
        ),
        (
            "the notification service runs Memcached for its cache",
            ("fact", "notification service", "cache", "Memcached"),
        ),
        ("the billing service is on Postgres for its DB", ("fact", "billing service", "database", "Postgres")),
        ("mobile app request timeout moved to 30 seconds", ("fact", "mobile app", "request_timeout", "30 seconds")),
        (
            "the current session TTL for the notification service is 2 hours",
            ("fact", "notification service", "session_ttl", "2 hours"),
        ),
        (
            "For the record, the search indexer's session TTL is 8 hours",
            ("fact", "search indexer", "session_ttl", "8 hours"),
        ),
        ("We're using OpenTofu for infrastructure as code", ("fact", "infrastructure as code", "tool", "OpenTofu")),
        (
            "All our continuous integration goes through CircleCI",
            ("fact", "continuous integration", "tool", "CircleCI"),
        ),
        ("Bugsnag is what we use for error tracking", ("fact", "error tracking", "tool", "Bugsnag")),
        ("we do metrics with Datadog", ("fact", "metrics", "tool", "Datadog")),
        ("Postgres it is for the DB of the auth gateway", ("decision", "auth gateway", "database", "Postgres")),
        ("Auth gateway datastore: SQLite is out, DynamoDB is in", ("decision", "auth gateway", "database", "DynamoDB")),
        (
            "Memcached replaces Valkey as the cache backend of the auth gateway, agreed",
            ("decision", "auth gateway", "cache", "Memcached"),
        ),
        (
            "we agreed that the admin console's rate limit will be 500 requests per second",
            ("decision", "admin console", "rate_limit", "500 requests per second"),
        ),
        (
            "the data pipeline will use 3 for its number of replicas, decided in the sync",
            ("decision", "data pipeline", "replicas", "3"),
        ),
        (
            "The call is five seconds for the user service's request timeout",
            ("decision", "user service", "request_timeout", "5 seconds"),
        ),
        (
            "changing course: auth service language goes to Kotlin instead of Rust",
            ("decision", "auth service", "language", "Kotlin"),
        ),
        (
            "we switched continuous integration to Buildkite",
            ("decision", "continuous integration", "tool", "Buildkite"),
        ),
        ("Hermes is basically an email relay", ("entity", "hermes", "kind", "email relay")),
        ("Quartz goes by the scheduler too", ("entity", "quartz", "alias", "scheduler")),
        ("AcmePay is what some folks call Acme", ("entity", "acme", "alias", "AcmePay")),
        ("Acme, also known as AcmePay", ("entity", "acme", "alias", "AcmePay")),
        ("we tend to prefer TOML for config files", ("preference", "config files", "preference", "TOML")),
        ("for test data, fixtures please", ("preference", "test data", "preference", "fixtures")),
        (
            "Everyone has to run the test suite before merging",
            ("constraint", "scope", "must", "run the test suite before merging"),
        ),
        (
            "Please never share customer data in chat",
            ("constraint", "scope", "must_not", "share customer data in chat"),
        ),
        (
            "we can never store secrets in the repository",
            ("constraint", "scope", "must_not", "store secrets in the repository"),
        ),
        (
            "The search indexer always needs to support offline mode",
            ("constraint", "search indexer", "must", "support offline mode"),
        ),
        (
            "The auth gateway needs to retry idempotently, always",
            ("constraint", "auth gateway", "must", "retry idempotently"),
        ),
        (
            "For the auth gateway, the aim is to reach 99.9% uptime",
            ("goal", "auth gateway", "goal", "reach 99.9% uptime"),
        ),
        (
            "Our objective with the auth gateway: handle 10k requests per second",
            ("goal", "auth gateway", "goal", "handle 10k requests per second"),
        ),
        (
            "We're trying to get test coverage above 80% on the web frontend",
            ("goal", "web frontend", "goal", "get test coverage above 80%"),
        ),
        (
            "the plan for the web frontend is to get test coverage above 80%",
            ("goal", "web frontend", "goal", "get test coverage above 80%"),
        ),
        (
            "for the web frontend we want to halve the error rate",
            ("goal", "web frontend", "goal", "halve the error rate"),
        ),
        (
            "Here's how to restore a backup: use the point-in-time restore in the console",
            ("procedure", "restore a backup", "action", "use the point-in-time restore in the console"),
        ),
        (
            "When replication lag exceeds 30 seconds: fail over to the replica",
            ("procedure", "replication lag exceeds 30 seconds", "action", "fail over to the replica"),
        ),
        (
            "to rotate the TLS certificates, you run certbot renew",
            ("procedure", "rotate the tls certificates", "action", "run certbot renew"),
        ),
    ],
)
def test_shapes_the_dev_wording_uses_are_read(note: str, expected: tuple[str, str, str, str]) -> None:
    assert reads(note) == expected


def test_a_task_that_needs_to_be_done_by_a_day_has_that_deadline() -> None:
    for note in ("this task needs to be done tomorrow", "please get this task done tomorrow"):
        c = one(note, "task_assigned", data={"task_id": "launch-7"}, scope="task")
        assert (c.type, c.slot, c.value, c.tier, c.task_id) == (
            "fact",
            ("task", "deadline"),
            "2026-11-27",
            "task",
            "launch-7",
        )


def test_a_value_keeps_the_parenthesis_that_closes_its_own() -> None:
    from workers.rules.fact_text import clean_value

    assert clean_value("the iPhone SE (3rd gen).") == "iPhone SE (3rd gen)"
    assert clean_value("(Postgres)") == "Postgres"
    assert clean_value('"Redis")') == "Redis"

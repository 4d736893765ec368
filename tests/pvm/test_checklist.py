"""The checklist judge (pvm/checklist.py): criteria read as checks, scores and gaps named by criterion."""

from __future__ import annotations

import pytest

from pvm.checklist import ChecklistJudge, parse

JUDGE = ChecklistJudge()


def kinds(criterion: str) -> list[tuple[str, str]]:
    return [(c.kind, c.label) for c in parse(criterion).checks]


def test_a_criterion_is_read_into_terms_phrases_numbers_bounds_and_negations() -> None:
    assert kinds("Mentions the rollback plan") == [("term", "rollback"), ("term", "plan")]
    assert kinds('Quotes "feature flag" by name') == [("phrase", "feature flag")]
    assert kinds("Names Postgres or MySQL as the store") == [("term", "postgres or mysql"), ("term", "store")]
    assert kinds("Gives the deadline, 2026-12-01") == [
        ("term", "deadline"),
        ("number", "2026"),
        ("number", "12"),
        ("number", "01"),
    ]
    assert kinds("p99 latency under 200 ms") == [("bound", "under 200 ms"), ("term", "p99"), ("term", "latency")]
    assert kinds("Does not mention the staging database") == [("forbidden", "staging database")]
    assert kinds("Answer in at most 40 words") == [("length", "at most 40 words")]
    assert kinds("Be clear") == []


def test_an_output_meeting_every_criterion_scores_100_with_no_gaps() -> None:
    verdict = JUDGE.judge(
        "Plan the rollout",
        ["Mentions the rollback plan", "p99 latency under 200 ms", "Does not mention the staging database"],
        "Rollout on Monday behind a flag; the rollback plan is to flip it off. Measured p99 latency: 180 ms.",
    )
    assert (verdict.score, verdict.gaps, verdict.judge) == (100, (), "checklist")


def test_gaps_name_their_criterion_what_is_missing_and_what_is_forbidden() -> None:
    verdict = JUDGE.judge(
        "Plan the rollout",
        [
            "Mentions the rollback plan",
            "p99 latency under 200 ms",
            "Does not mention the staging database",
            "At least 3 replicas",
        ],
        "We have a plan. p99 latency is 240 ms; the staging database was used. We run 2 replicas.",
    )
    by = {g.criterion: g for g in verdict.gaps}
    assert by["Mentions the rollback plan"].missing == ("rollback",) and by["Mentions the rollback plan"].score == 50
    assert by["p99 latency under 200 ms"].missing == ("under 200 ms",) and by["p99 latency under 200 ms"].score == 67
    assert by["Does not mention the staging database"].forbidden == ("staging database",)
    assert by["At least 3 replicas"].missing == ("at least 3 replicas",)
    assert verdict.score == round((50 + 200 / 3 + 0 + 0) / 4)


@pytest.mark.parametrize(
    ("output", "met"),
    [
        ("We chose MySQL for the store.", True),
        ("We chose postgres for our stores.", True),  # plural and case
        ("We chose SQLite for the store.", False),
    ],
)
def test_alternatives_and_stems(output: str, met: bool) -> None:
    verdict = JUDGE.judge("t", ["Names Postgres or MySQL as the store"], output)
    assert (verdict.score == 100) is met


def test_numbers_bounds_and_length() -> None:
    assert JUDGE.judge("t", ["uptime >= 99.9%"], "Uptime last month: 99.95%.").score == 100
    assert JUDGE.judge("t", ["uptime >= 99.9%"], "Uptime last month: 99.5%.").score == 50
    assert JUDGE.judge("t", ["Costs 1,000 dollars"], "It costs 1000 dollars.").score == 100
    assert JUDGE.judge("t", ["Answer in at most 5 words"], "one two three four five six").gaps[0].missing == (
        "at most 5 words (has 6)",
    )
    # a forbidden phrase in quotes must be absent as written; the words apart are fine
    assert JUDGE.judge("t", ['Never says "drop table"'], "We never drop a table.").score == 100
    assert JUDGE.judge("t", ['Never says "drop table"'], "Then drop table users.").score == 0


def test_the_same_output_gets_the_same_verdict() -> None:
    criteria = ["Mentions the rollback plan", "p99 latency under 200 ms"]
    assert JUDGE.judge("t", criteria, "a plan") == JUDGE.judge("t", criteria, "a plan")


@pytest.mark.parametrize(
    "forms",
    [("rotate", "rotated", "rotates", "rotating"), ("cookie", "cookies"), ("entry", "entries"), ("fix", "fixes")],
)
def test_the_forms_of_a_word_share_one_stem(forms: tuple[str, ...]) -> None:
    from pvm.checklist import stem

    assert len({stem(f) for f in forms}) == 1, {f: stem(f) for f in forms}

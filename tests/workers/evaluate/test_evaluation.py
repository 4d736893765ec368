"""The evaluate pool's rules (pure): scores, fact decay, prune, near-duplicates and contradictions."""

from __future__ import annotations

from typing import Any

import pytest

from pvm import defaults
from tests.workers.minutes import minute
from workers.evaluate import evaluation
from workers.evaluate.evaluation import Judged, ScorePolicy, TaskOutcome
from workers.facts.extraction import value_key

DAY_MS = 24 * 3600 * 1000
NOW = 1_795_687_200_000


def test_recency_is_linear_over_four_weeks() -> None:
    assert evaluation.recency(NOW, NOW) == 1.0
    assert evaluation.recency(NOW - 7 * DAY_MS, NOW) == pytest.approx(0.75)
    assert evaluation.recency(NOW - 14 * DAY_MS, NOW) == pytest.approx(0.5)
    assert evaluation.recency(NOW - 28 * DAY_MS, NOW) == 0.0
    assert evaluation.recency(NOW - 90 * DAY_MS, NOW) == 0.0
    assert evaluation.recency(NOW + DAY_MS, NOW) == 1.0  # a clock ahead counts as now


def test_relevance_grows_with_reads_and_saturates() -> None:
    assert evaluation.relevance(0) == 0.0
    assert evaluation.relevance(1) == pytest.approx(1 / defaults.SCORE_RELEVANCE_FULL)
    assert evaluation.relevance(500) == 1.0


def test_accuracy_from_own_outcome_else_task_else_prior_less_corrections() -> None:
    assert evaluation.accuracy(0.9, 0.1, "task_completed", 0) == 0.9
    assert evaluation.accuracy(None, 0.2, "message", 0) == 0.2
    assert evaluation.accuracy(None, None, "decision", 0) == 0.6  # the event type's prior
    assert evaluation.accuracy(None, None, "decision", 1) == pytest.approx(0.35)
    assert evaluation.accuracy(0.3, None, "decision", 5) == 0.0


def test_impact_mixes_later_references_and_task_success() -> None:
    assert evaluation.impact(0, None) == 0.25
    assert evaluation.impact(3, True) == 1.0
    assert evaluation.impact(0, False) == 0.0
    assert evaluation.impact(1, True) == pytest.approx((1 / 3 + 1) / 2)


def test_composite_is_the_weighted_mean() -> None:
    parts = {"recency": 1.0, "relevance": 0.0, "accuracy": 0.5, "impact": 0.5}
    assert evaluation.composite(parts, (1, 1, 1, 1)) == 0.5
    assert evaluation.composite(parts, (2, 0, 0, 0)) == 1.0
    assert evaluation.composite(parts, (0, 1, 0, 1)) == 0.25


def test_minute_scores_read_success_criteria_and_the_task() -> None:
    m = minute("task_completed", data={"task_id": "T-1", "success_criteria_met": 80})
    scores = evaluation.minute_scores(
        m, NOW - 14 * DAY_MS, NOW, accesses=5, later_references=3, corrections=0, task=TaskOutcome(True, 0.8)
    )
    assert scores == {"recency": 0.5, "relevance": 1.0, "accuracy": 0.8, "impact": 1.0, "composite": 0.825}
    note = minute("message", data={"task_id": "T-1"})
    failed = evaluation.minute_scores(
        note, NOW, NOW, accesses=0, later_references=0, corrections=0, task=TaskOutcome(False, 0.0)
    )
    assert failed["accuracy"] == 0.0 and failed["impact"] == 0.0


def test_fact_decay_halves_every_thirty_days_with_a_capped_read_boost() -> None:
    assert evaluation.fact_decay(NOW, 0, NOW) == 1.0
    assert evaluation.fact_decay(NOW - 30 * DAY_MS, 0, NOW) == pytest.approx(0.5)
    assert evaluation.fact_decay(NOW - 60 * DAY_MS, 0, NOW) == pytest.approx(0.25)
    assert evaluation.fact_decay(NOW - 60 * DAY_MS, 2, NOW) == pytest.approx(0.45)
    assert evaluation.fact_decay(NOW - 60 * DAY_MS, 50, NOW) == pytest.approx(0.75)  # the boost stops at 0.5
    assert evaluation.fact_decay(NOW - 10 * DAY_MS, 50, NOW) == 1.0  # capped
    scores = evaluation.fact_scores(0.8, NOW - 30 * DAY_MS, 0, NOW)
    assert scores == {"importance": 0.8, "decay": 0.5, "composite": 0.4}


def test_prune_needs_a_low_score_and_an_age_past_the_grace() -> None:
    policy = ScorePolicy(prune_below=0.3, prune_grace_s=10.0)
    assert evaluation.prunable(0.29, 11.0, policy)
    assert not evaluation.prunable(0.29, 9.0, policy)
    assert not evaluation.prunable(0.3, 11.0, policy)
    assert not evaluation.prunable(0.0, 11.0, ScorePolicy(prune_below=0.0, prune_grace_s=0.0))


def test_corrections_and_references() -> None:
    later = minute("task_failed", n=2, context_references=("id00001",))
    assert evaluation.is_correction(later, "id00001")
    said = minute("message", n=3, data={"corrects": "id00001"})
    assert list(evaluation.references(said)) == ["id00001"] and evaluation.is_correction(said, "id00001")
    cited = minute("message", n=4, context_references=("id00001",))
    assert not evaluation.is_correction(cited, "id00001")


def _judged(memory_id: str, text: str, composite: float, group: str = "task:T|message") -> Judged:
    m = minute("message", memory_note=text)
    return Judged(memory_id, group, evaluation.note_words(m), composite, 0, 0.5)


def test_near_duplicates_merge_into_the_best_scored() -> None:
    items = [
        _judged("a", "deploy of the payments service failed on the canary host", 0.4),
        _judged("b", "the payments service deploy failed on a canary host", 0.7),
        _judged("c", "payments service deploy failed on canary host again", 0.5),
        _judged("d", "rotated the database credentials for the reporting job", 0.9),
        _judged("e", "deploy of the payments service failed on the canary host", 0.9, group="task:U|message"),
    ]
    merges = evaluation.near_duplicates(items, 0.6)
    assert len(merges) == 1
    assert merges[0].survivor == "b" and sorted(merges[0].absorbed) == ["a", "c"]
    assert merges[0].similarity >= 0.6
    assert evaluation.near_duplicates(items, 1.01) == []


def test_contradicting_recommendations_are_flagged_and_the_better_outcome_wins() -> None:
    use = minute("decision", n=1, data={"situation": "flaky integration tests", "recommendation": "retry the test job"})
    avoid = minute(
        "decision", n=2, data={"situation": "flaky integration tests", "recommendation": "do not retry the test job"}
    )
    other = minute("decision", n=3, data={"situation": "slow builds", "recommendation": "do not retry the test job"})
    judged = []
    for m, acc in ((use, 0.2), (avoid, 0.9), (other, 0.1)):
        situation, action, negative = evaluation.recommended_action(m) or ("", frozenset(), False)
        judged.append(Judged(m.id, "g", frozenset(), 0.5, 0, acc, situation, action, negative))
    conflicts = evaluation.contradictions(judged)
    assert [(c.winner, c.loser) for c in conflicts] == [(avoid.id, use.id)]
    assert evaluation.recommended_action(minute("decision", memory_note="retry it")) is None  # no situation named


def _twin(n: int, subject: str, value: str, composite: float = 0.5, group: str = "project:p|fact|database") -> Any:
    return evaluation.FactTwin(
        f"f{n}",
        group,
        subject,
        value_key(value),
        evaluation.fact_words(subject),
        evaluation.fact_words(value),
        composite,
        n,
    )


def test_fact_words_read_one_value_however_it_is_worded() -> None:
    same = ["512 MB", "512 megabytes", "the 512mb", "512 MB."]
    assert len({evaluation.fact_words(v) for v in same}) == 1
    assert evaluation.fact_words("Eight hours") == evaluation.fact_words("8h")


def test_fact_near_duplicates_merge_rewordings_into_the_best_and_never_different_values() -> None:
    twins = [
        _twin(1, "billing service", "Postgres cluster", composite=0.9),
        _twin(2, "billing service", "the postgres cluster"),
        _twin(3, "billing service", "primary Postgres cluster"),
        _twin(4, "billing service api", "postgres cluster"),
        _twin(5, "billing service", "MySQL cluster"),  # a word each side the other lacks: another value
        _twin(6, "billing service", "Postgres cluster", group="task:p:t|fact|database"),  # another tier key
        _twin(7, "ledger service", "postgres cluster"),  # another subject, a word each side
    ]
    [merge] = evaluation.fact_near_duplicates(twins, 0.5)
    assert merge.survivor == "f1" and merge.absorbed == ("f2", "f3", "f4")
    assert evaluation.fact_near_duplicates(twins, 1.0)[0].absorbed == ("f2",)  # only the same words
    rivals = [_twin(1, "ledger", "retry three times on timeout"), _twin(2, "ledger", "retry five times on timeout")]
    assert evaluation.fact_near_duplicates(rivals, 0.0) == []


def test_a_pair_evaluation_is_its_tasks_outcome_and_sets_the_accuracy_of_the_tasks_minutes() -> None:
    from contracts.pair import PairEvaluation, pair_minute
    from workers.evaluate.pool import RESCORE, Carry, SliceMinute, judge_minutes

    def judged(score: int, round: int = 1) -> Any:
        change = PairEvaluation("run1", round, score, 95, "checklist", "Plan it", ("Names the owner",), "out")
        return pair_minute("p1", change, task_id="T-1")

    assert evaluation.task_outcome(judged(40)) == TaskOutcome(False, 0.4)
    assert evaluation.task_outcome(judged(96)) == TaskOutcome(True, 0.96)  # met its run's target
    assert evaluation.task_outcome(minute("pair_evaluation", data={"task_id": "T-1", "score": "forged"})) is None
    done = minute("task_completed", 1, data={"task_id": "T-1"})  # alone: a success, accuracy 1
    first, last = judged(40), judged(70, round=2)
    at = NOW - DAY_MS
    verdict, _ = judge_minutes(
        [SliceMinute(1, done, at), SliceMinute(2, first, at), SliceMinute(3, last, at)],
        Carry(),
        {},
        frozenset(),
        NOW,
        ScorePolicy(),
        RESCORE,
    )
    assert verdict.scores[done.id]["accuracy"] == 0.7  # the newest PAIR score is the task's final outcome


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.6, 0.75, 0.9])
def test_near_duplicates_always_share_a_bucket_of_the_prefix_filter(threshold: float) -> None:
    import random

    rng = random.Random(7)
    vocabulary = [f"w{i}" for i in range(60)]
    checked = 0
    for _ in range(3000):
        a = frozenset(rng.sample(vocabulary, rng.randint(4, 14)))
        b = frozenset(rng.sample(sorted(a), rng.randint(max(1, len(a) - 3), len(a))) + rng.sample(vocabulary, 2))
        x, y = Judged("a", "g", a, 0.5, 0, 0.5), Judged("b", "g", b, 0.5, 0, 0.5)
        if evaluation.minute_similarity(x, y) >= threshold:
            checked += 1
            assert set(evaluation.minute_buckets(x, threshold)) & set(evaluation.minute_buckets(y, threshold))
    assert checked > 100
    other = Judged("c", "h", a, 0.5, 0, 0.5)  # another group (tier key or event type): never a shared bucket
    assert not set(evaluation.minute_buckets(x, threshold)) & set(evaluation.minute_buckets(other, threshold))


def test_merge_across_keeps_the_best_wherever_it_sits() -> None:
    words = frozenset(["deploy", "payments", "service", "failed", "canary", "host"])
    head = Judged("new", "g", words, 0.4, 2, 0.5)
    earlier = {"old": Judged("old", "g", words | {"again"}, 0.7, 1, 0.5), "far": Judged("far", "h", words, 0.9, 1, 0.5)}
    merges = evaluation.merge_across([head], earlier, {"new": ["old", "far"]}, evaluation.minute_similarity, 0.6)
    assert [(m.survivor, m.absorbed) for m in merges] == [("old", ("new",))]  # not "far": another group
    better = Judged("new", "g", words, 0.9, 2, 0.5)
    merges = evaluation.merge_across([better], earlier, {"new": ["old"]}, evaluation.minute_similarity, 0.6)
    assert [(m.survivor, m.absorbed) for m in merges] == [("new", ("old",))]

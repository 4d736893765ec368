"""bench/lifecycle_evaluate.py: the planted set is what it says, and a quick run gives the JSON the issue asks for."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from bench import lifecycle_evaluate as bench
from pvm import defaults
from workers.evaluate.evaluation import ScorePolicy

NOW = datetime(2026, 11, 26, tzinfo=UTC)


def test_the_planted_set_holds_each_kind_and_a_run_finds_them() -> None:
    minutes, reads, planted = bench.planted(2_000, 3, NOW)
    assert len(minutes) >= 2_000 and [m.seq for m in minutes] == list(range(1, len(minutes) + 1))
    kinds = set(planted.values())
    assert kinds == {"stale", "duplicate", "superseded"}
    assert all(reads.get(i, 0) == 0 for i, why in planted.items() if why != "duplicate")
    now_ms = int(NOW.timestamp() * 1000)
    pruned, merged, scored = bench.judge_all(minutes, reads, now_ms, ScorePolicy(), defaults.EVALUATE_SLICE)
    assert scored == len(minutes)
    precision, recall = bench._precision_recall(pruned | merged, set(planted))
    assert precision >= 0.9 and recall >= 0.9
    # Nothing pruned: a threshold of 0 and no merges.
    none, unmerged, _ = bench.judge_all(minutes, reads, now_ms, ScorePolicy(prune_below=0.0, dedupe_at=1.01), 500)
    assert none == set() and unmerged == set()


@pytest.mark.slow
def test_a_quick_run_prints_every_number_of_the_issue(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quick", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("evaluate_per_s", "prune_precision", "prune_recall", "context_p99_ms_2k", "machine"):
        assert key in result, key
    assert result["prune_precision"] >= 0.9 and result["prune_recall"] >= 0.9
    assert [r["threshold"] for r in result["dedupe_sweep"]] == list(bench.THRESHOLDS)
    assert result["evaluate_end_to_end"]["scored"] > 0 and result["machine"]["cores"] >= 1


def test_the_planted_facts_merge_their_rewordings_and_keep_their_look_alikes() -> None:
    facts, reads, duplicates = bench.planted_facts(600, 3, NOW)
    assert len(facts) >= 600 and 0 < len(duplicates) < len(facts) and len({f.fact.id for f in facts}) == len(facts)
    now_ms = int(NOW.timestamp() * 1000)
    merged = bench.fact_merges(facts, reads, now_ms, defaults.FACT_DEDUPE_AT)
    assert len(merged & duplicates) >= 0.95 * len(duplicates) and len(merged - duplicates) <= 0.02 * len(merged)
    assert bench.fact_merges(facts, reads, now_ms, 0.2) - duplicates  # a low threshold merges different values


def test_duplicates_pages_apart_merge_only_with_the_candidate_index() -> None:
    across = bench.dedupe_across_pages(6_000, NOW)["dedupe_across_pages"]
    assert across["on_another_page"] > 20  # pages of ACROSS_SLICE spread the planted duplicates
    assert across["before"]["recall_across_pages"] < 0.2 <= 0.9 <= across["after"]["recall_across_pages"]
    assert across["after"]["precision"] >= 0.95

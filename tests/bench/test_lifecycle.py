"""bench/lifecycle.py: the summarize and evaluate parts joined into one result with every issue-11 target."""

from __future__ import annotations

import pytest

from bench import lifecycle


@pytest.mark.slow
def test_a_quick_run_reports_every_target_of_both_parts_from_their_results() -> None:
    result = lifecycle.run(quick=True)
    assert set(result["parts"]) == {"summaries", "evaluate"}
    assert set(result["metrics"]) == set(lifecycle.TARGETS)
    summaries, evaluate = result["parts"]["summaries"], result["parts"]["evaluate"]
    for key, cell in result["metrics"].items():
        own = summaries["metrics"][key]["value"] if key in summaries["metrics"] else evaluate.get(key)
        assert cell["value"] == own, key
        assert cell["met"] is (None if own is None else cell["met"]), key
    assert result["metrics"]["context_p99_ms_100k"]["value"] is None  # a quick run does not load 100k
    assert result["machine"]["cores"]


def test_one_part_reports_only_its_targets() -> None:
    figures = lifecycle.values({"evaluate": {"evaluate_per_s": 12_000, "prune_precision": 0.95}})
    assert figures == {"evaluate_per_s": 12_000, "prune_precision": 0.95, "prune_recall": None,
                       "context_p99_ms_100k": None}  # fmt: skip

"""bench/latency_ab.py: trees compared on one index, query by query; figures as its docstring defines them; clear
errors for a rev that does not check out and an index that is not there."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.latency_ab import ROOT, figures, main


def test_a_query_counts_its_fastest_pass_and_every_search_counts_in_the_plain_percentiles() -> None:
    # Three queries, two passes: query 0 was slow in pass 1, query 2 in pass 2.
    runs = [[9.0, 2.0, 3.0], [1.0, 2.5, 8.0]]
    out = figures(runs)
    assert out["best_median_ms"] == 2.0 and out["best_p99_ms"] == 3.0  # best: 1.0, 2.0, 3.0
    assert out["p50_ms"] == 2.5 and out["p99_ms"] == 9.0  # every search: 1, 2, 2.5, 3, 8, 9
    assert out["pass_p99_median_ms"] == 8.5  # the passes' p99s: 9 and 8


def test_two_trees_answer_the_same_queries_on_one_index(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--points", "300", "--queries", "12", "--passes", "2", "--json", ".", "HEAD"]) == 0
    result = json.loads(capsys.readouterr().out)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    assert [t["rev"] for t in result["trees"]] == [".", "HEAD"]
    assert result["trees"][1]["commit"] == head.stdout.strip()
    for tree in result["trees"]:
        assert 0 < tree["best_median_ms"] <= tree["best_p99_ms"] <= tree["p99_ms"]
    assert (result["points"], result["queries"], result["passes"]) == (300, 12, 2)
    assert result["machine"]["cores"] >= 1
    listed = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    assert "pvm-latency-ab-" not in listed  # the worktree is gone


def test_a_rev_that_does_not_check_out_and_a_missing_index_fail_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--index", str(tmp_path), "--queries", "1", "--passes", "1", "no-such-rev-anywhere"]) == 1
    assert "cannot check out 'no-such-rev-anywhere'" in capsys.readouterr().err
    assert main(["--index", str(tmp_path / "absent"), "."]) == 1
    assert "is not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--passes", "0", "."])

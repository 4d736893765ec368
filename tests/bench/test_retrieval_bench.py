"""bench/retrieval.py on small sets with the tests' hashing embeddings: the per-set figures, and the sets drawn with
more seeds (their worst hybrid - best leg over all seeds)."""

from __future__ import annotations

import json

import pytest

from bench import retrieval

SETS = {"sessions", "timeline", "multihop"}


def test_the_json_report_gives_every_set_and_the_worst_over_more_seeds(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--embedder", "hash", "--second-embedder", "none", "--scale", "0.05", "--p99-points", "0", "--json"]
    assert retrieval.main([*argv, "--more-seeds", "11"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["sets"]) == SETS and out["held_out"] == ["multihop"] and out["seed"] == 7
    for r in out["sets"].values():
        best = max(r["lexical_recall_at_10"], r["dense_recall_at_10"])
        assert r["hybrid_minus_best_leg"] == pytest.approx(r["hybrid_recall_at_10"] - best, abs=0.0015)
    assert set(out["seeds"]) == {"7", "11"} and set(out["seeds"]["11"]["hash"]) == SETS
    assert out["seeds"]["7"]["hash"] == {name: r["hybrid_minus_best_leg"] for name, r in out["sets"].items()}
    worst = out["hybrid_minus_best_leg_over_seeds"]["hash"]
    assert worst == {name: min(out["seeds"][s]["hash"][name] for s in ("7", "11")) for name in SETS}
    assert out["hybrid_minus_best_leg_worst_over_seeds"]["hash"] == min(worst.values())
    assert "search_p99_ms_100k" not in out  # --p99-points 0 skips the latency part


def test_seeds_that_are_not_numbers_are_refused_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        retrieval.main(["--embedder", "hash", "--more-seeds", "11,x"])
    assert "is not a comma-separated list of whole numbers" in capsys.readouterr().err


def test_the_order_cost_searches_an_index_with_and_one_without_the_lexical_spread(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--embedder", "hash", "--second-embedder", "none", "--scale", "0.05", "--p99-points", "0"]
    assert retrieval.main([*argv, "--order-cost", "400"]) == 0
    assert "with the spread p50" in capsys.readouterr().out
    cost = retrieval.order_cost(400, queries=5, passes=2)
    assert cost["points"] == 400 and cost["searches_each"] == 10
    for kind in ("spread", "plain"):
        assert 0 < cost[f"lexical_{kind}_p50_ms"] <= cost[f"lexical_{kind}_p99_ms"]

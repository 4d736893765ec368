"""bench/lifecycle_summaries.py: a quick run gives the JSON the issue asks for, and its numbers are ratios of counts."""

from __future__ import annotations

import json
import math

import pytest

from bench.lifecycle_summaries import TARGETS, long_thread_phase, main


@pytest.mark.slow
def test_a_quick_run_reports_every_metric_from_its_counts_with_the_machine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["benchmark"] == "lifecycle_summaries" and result["quick"] is True
    assert set(result["metrics"]) == set(TARGETS) == {"summarize_per_s", "summary_ratio", "thread_250_decisions_kept"}
    for key, cell in result["metrics"].items():
        assert isinstance(cell["value"], int | float) and not math.isnan(cell["value"]), key
        assert cell["met"] in (True, False) and cell["target"] == result["targets"][key], key
    box = result["machine"]
    assert box["cores"] and box["redis_server"]["redis_version"] and len(box["load_average_before"]) == 3
    assert result["elapsed_s"] > 0
    # The numbers are the counts' ratios, not constants.
    metrics, throughput, ratio, thread = (result[k] for k in ("metrics", "throughput", "ratio", "thread_250"))
    assert throughput["minutes"] == 4 * 250 and throughput["seconds"] > 0
    assert metrics["summarize_per_s"]["value"] == round(throughput["minutes"] / throughput["seconds"])
    assert ratio["chunks"] == ratio["pool_counts"]["chunks"] == 4 * (250 - 20) // 10
    assert 0 < ratio["summary_tokens"] < ratio["summary_line_tokens"] < ratio["chunk_tokens"]
    assert metrics["summary_ratio"]["value"] == round(ratio["summary_tokens"] / ratio["chunk_tokens"], 4)
    assert thread["minutes"] == 250 and thread["decisions"] == 25
    assert metrics["thread_250_decisions_kept"]["value"] == round(thread["decisions_named"] / thread["decisions"], 4)
    assert len(thread["missing"]) == thread["decisions"] - thread["decisions_named"]
    assert sum(thread["named_first_in"].values()) == thread["decisions_named"]
    assert thread["used_tokens"] <= thread["budget_tokens"] == 2_000


@pytest.mark.slow
def test_decisions_kept_counts_what_the_context_names() -> None:
    # The newest 20 minutes alone (two decisions) in a budget that holds them and nothing older.
    short = long_thread_phase(11, budget=100_000, minutes=20)
    assert short["thread_250_decisions_kept"] == 1.0 and short["thread_250"]["decisions"] == 2
    assert short["thread_250"]["named_first_in"] == {"recent": 2}
    tight = long_thread_phase(11, budget=300)
    assert tight["thread_250_decisions_kept"] < 1.0 and tight["thread_250"]["missing"]

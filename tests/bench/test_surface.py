"""bench/surface.py: one function per metric in a registry; a quick run reports each value, target and the machine."""

from __future__ import annotations

import json

import pytest

from bench import surface


def test_every_registered_metric_has_a_target_and_a_description() -> None:
    assert "pair_round_p99_ms" in surface.METRICS
    for name, metric in surface.METRICS.items():
        op, bound, unit = metric.target
        assert op in ("<=", ">=") and bound > 0 and unit and metric.what, name
        assert callable(metric.measure)


@pytest.mark.slow
def test_a_quick_pair_run_reports_its_rounds_and_the_machine(capsys: pytest.CaptureFixture[str]) -> None:
    assert surface.main(["--only", "pair_round_p99_ms", "--minutes-scale", "0.02", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["pair_round_p99_ms"] > 0 and result["targets"] == {"pair_round_p99_ms": "<= 50"}
    assert result["met"]["pair_round_p99_ms"] in (True, False)
    pair = result["pair"]
    assert pair["project_minutes"] == 200 and pair["rounds"] >= pair["runs"] >= 20
    assert pair["memories_per_gap_mean"] > 0 and pair["final_score_mean"] >= pair["first_score_mean"]
    assert result["machine"]["cores"] and "elapsed_s" in result


def test_the_table_names_each_metric_with_its_verdict() -> None:
    result = {
        "minutes_scale": 1.0,
        "pair_round_p99_ms": 12.5,
        "targets": {"pair_round_p99_ms": "<= 50"},
        "met": {"pair_round_p99_ms": True},
        "machine": {"cores": 2, "cpu_model": "x", "python": "3.11", "redis_server": {"redis_version": "8"}},
        "elapsed_s": 3.0,
    }
    text = surface.table(result)
    assert "pair_round_p99_ms" in text and "12.500" in text and "ok" in text

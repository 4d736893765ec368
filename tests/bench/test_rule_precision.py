"""bench/rule_precision.py: per-rule precision of the rule extractor on one wording of the labeled sessions."""

from __future__ import annotations

import json

import pytest

from bench import rule_precision
from bench.rule_precision import tally, wilson_lower
from workers.facts.extraction import DROPPED_RULES


def test_the_wilson_lower_bound_is_below_the_precision_and_tightens_with_more_readings() -> None:
    assert wilson_lower(0, 0) == 0.0
    assert wilson_lower(0, 10) == 0.0
    assert wilson_lower(20, 20) == pytest.approx(0.8389, abs=1e-4)
    assert wilson_lower(200, 200) == pytest.approx(0.9812, abs=1e-4)
    assert wilson_lower(50, 100) == pytest.approx(0.4038, abs=1e-4)


def test_every_rule_reads_the_wording_it_was_written_against_right() -> None:
    rules = tally("default", [11])
    assert {"attribute", "decision", "preference", "goal", "tool", "entity"} <= set(rules)
    assert all(r.right == r.readings for r in rules.values()), {n: r.as_dict() for n, r in rules.items()}


def test_a_dropped_rule_is_still_tallied_so_its_evidence_stays_visible() -> None:
    rules = tally("heldout", [11], keep_wrong=2)
    for name in DROPPED_RULES:
        assert rules[name].readings > 0 and rules[name].right == 0
        assert len(rules[name].wrong) == 2 and " cannot " in rules[name].wrong[0]["note"].lower()


def test_the_json_report_names_the_wording_seeds_and_each_rule(capsys: pytest.CaptureFixture[str]) -> None:
    assert rule_precision.main(["--wording", "calibration", "--seeds", "11", "--json", "--wrong", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["wording"] == "calibration" and out["seeds"] == [11]
    assert 0.0 < out["precision"] < 1.0
    wrong = [r for r in out["rules"].values() if r["right"] < r["readings"]]
    assert wrong and all(len(r["wrong"]) == 1 for r in wrong)

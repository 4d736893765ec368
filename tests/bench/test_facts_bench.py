"""bench/facts.py: a bounded run gives the JSON the issue asks for, and its scores come from what the pool did."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import pytest

from bench.fact_sessions import SPLITS, FactSession, fact_session
from bench.facts import (
    TARGETS,
    Planted,
    PoolRun,
    cross_slot,
    invalidations,
    main,
    quality,
    run_pool,
    table,
)
from bench.harness import Progress
from contracts import FactChange, Minute
from contracts.fact_changes import FactSuperseded
from pvm.stores.fact_projection import Outcome
from pvm.stores.facts import FactStore


class NeverRetires(FactStore):
    """A broken store: it takes every change but a supersession, so an old value stays current beside the new."""

    def apply_changes(self, changes: Sequence[tuple[Minute, FactChange]]) -> list[Outcome]:
        kept = [i for i, (_, change) in enumerate(changes) if not isinstance(change, FactSuperseded)]
        applied = iter(super().apply_changes([changes[i] for i in kept]))
        keep = set(kept)
        return [next(applied) if i in keep else Outcome.UNCHANGED for i in range(len(changes))]


@pytest.fixture(scope="module")
def session_run() -> tuple[FactSession, PoolRun]:
    session = fact_session("default", projects=1)
    return session, run_pool(session, 0, Progress())


@pytest.mark.slow
def test_a_quick_run_reports_every_metric_for_both_splits_with_the_machine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--json", "--split", "both"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["benchmark"] == "facts" and result["config"]["minutes_scale"] == 0.1
    assert set(result["splits"]) == set(SPLITS) == {"default", "heldout"}
    assert result["machine"]["cores"] and "load_average_after" in result["machine"]
    for name, split in result["splits"].items():
        assert set(split["metrics"]) == set(TARGETS), name
        for key, cell in split["metrics"].items():
            value = cell["value"]
            assert isinstance(value, int | float) and not math.isnan(value), (name, key)
            assert cell["met"] in (True, False) and cell["target"] == result["targets"][key], (name, key)
        assert split["machine"]["cores"] and len(split["machine"]["load_average_before"]) == 3, name
        counts, metrics = split["counts"], split["metrics"]
        # The scores are the counts' ratios, not constants.
        assert metrics["current_view_accuracy"]["value"] == round(
            counts["gold_slots_current_right"] / counts["gold_slots"], 4
        ), name
        assert counts["current_precision"] == round(counts["current_facts_right"] / counts["current_facts"], 4), name
        assert 0 < counts["current_facts_right"] <= counts["current_facts"], name
        assert counts["gold_slots"] == counts["gold_slots_current_right"] + sum(
            counts[f"gold_slots_wrong_{why}"] for why in ("newest_pending", "old_value_kept", "missing")
        ), name
        assert metrics["dedupe_rate"]["value"] == round(
            counts["restated_merged"] / counts["restated_read_twice_or_more"], 4
        ), name
        assert metrics["cross_slot_invalidations"]["value"] == (
            counts["cross_slot_by_store_slot"] + counts["cross_slot_by_planted_slot"]
        ), name
        throughput = split["throughput"]
        seconds = throughput["seconds_minutes"] + throughput["seconds_change_minutes"]
        assert metrics["facts_per_s"]["value"] == pytest.approx(throughput["minutes"] / seconds, rel=0.01), name
        assert throughput["cpu_seconds"] > 0 and throughput["facts_per_cpu_s"] == pytest.approx(
            throughput["minutes"] / throughput["cpu_seconds"], rel=0.01
        ), name
        searchable = split["searchable"]
        assert searchable["facts_timed"] > 0 and metrics["fact_searchable_p99_ms"]["value"] > 0, name
        assert searchable["at_first_rate"]["facts_timed"] > 0, name
        # The second offer runs at half the max the first one measured.
        assert searchable["offered_target_per_s"] == pytest.approx(searchable["pipeline_max_per_s"] / 2, abs=1), name
        assert split["llm"]["calls"] > 0, name
    shown = table(result).splitlines()
    assert all(any(line.startswith(key) for line in shown) for key in TARGETS)
    assert "None" not in shown[-1] and f"{result['machine']['cores']} cores" in shown[-1]
    # The held-out phrasing is one the rules never saw: it must not score like the default one.
    recall = {name: split["metrics"]["fact_recall"]["value"] for name, split in result["splits"].items()}
    assert recall["heldout"] < recall["default"]


def test_a_store_that_never_retires_an_old_value_scores_a_lower_current_view(
    session_run: tuple[FactSession, PoolRun],
) -> None:
    session, honest = session_run
    broken = run_pool(session, 0, Progress(), store=NeverRetires)
    good, good_counts = quality(session, honest)
    bad, bad_counts = quality(session, broken)
    assert good_counts["superseded"] > 0  # the session changes values, so there is something to retire
    assert bad["current_view_accuracy"] < good["current_view_accuracy"]
    assert bad_counts["gold_slots_wrong_old_value_kept"] > good_counts["gold_slots_wrong_old_value_kept"]


def test_an_empty_store_scores_no_current_view_and_no_recall_of_stored_facts(
    session_run: tuple[FactSession, PoolRun],
) -> None:
    session, honest = session_run
    empty = PoolRun(honest.candidates, [], [], [], honest.counts)
    metrics, counts = quality(session, empty)
    assert metrics["current_view_accuracy"] == 0.0 and counts["stored_facts"] == 0
    assert metrics["fact_precision"] == quality(session, honest)[0]["fact_precision"]  # scored on candidates


def test_a_supersession_across_two_slots_counts_as_a_cross_slot_invalidation(
    session_run: tuple[FactSession, PoolRun],
) -> None:
    session, run = session_run
    planted = Planted.read(session.facts, run.facts)
    by_id = {f.id: f for f in run.facts}
    gold = {g.key: g for g in session.facts}
    pairs = invalidations(run.changes)
    assert cross_slot(pairs, by_id, gold, planted)["store_slots"] == 0
    a, b = next((a, b) for a in run.facts for b in run.facts if a.tier_key == b.tier_key and a.slot != b.slot)
    wrong = FactSuperseded(fact_id=a.id, tier_key=a.tier_key, superseded_by=b.id, valid_until=b.valid_from)
    crossing = cross_slot(invalidations([*run.changes, wrong]), by_id, gold, planted)
    assert crossing["store_slots"] == 1

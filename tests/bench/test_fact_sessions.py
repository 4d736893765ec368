"""The labeled fact sessions: what they plant, that their gold is consistent, `score()`, and the rule path's targets."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from datetime import datetime

import pytest

from bench.fact_sessions import (
    FACT_TYPES,
    SPLITS,
    TEMPLATES,
    WORDINGS,
    FactSession,
    GoldFact,
    fact_session,
    score,
    summary,
)
from workers.facts.extraction import Candidate, RuleExtractor, value_key


@pytest.fixture(scope="module")
def session() -> FactSession:
    return fact_session()


def test_a_session_is_reproducible_from_its_seed() -> None:
    first, again, other = fact_session(seed=5), fact_session(seed=5), fact_session(seed=6)
    assert [m.to_dict() for m in first.minutes] == [m.to_dict() for m in again.minutes]
    assert first.facts == again.facts
    assert [m.to_dict() for m in first.minutes] != [m.to_dict() for m in other.minutes]


def test_it_plants_at_least_300_facts_of_every_type_over_several_projects_and_tasks(session: FactSession) -> None:
    assert len(session.facts) >= 300
    assert set(Counter(f.type for f in session.facts)) == set(FACT_TYPES)
    assert min(Counter(f.type for f in session.facts).values()) >= 10
    assert len({f.project_id for f in session.facts}) >= 3
    task_facts = [f for f in session.facts if f.task_id]
    assert len({(f.project_id, f.task_id) for f in task_facts}) >= 6
    assert {f.tier for f in session.facts} == {"task", "project"}


def test_the_gold_points_at_real_minutes_of_its_project_and_tier(session: FactSession) -> None:
    by_id = {m.id: m for m in session.minutes}
    assert len(by_id) == len(session.minutes)
    assert [m.timestamp for m in session.minutes] == sorted(m.timestamp for m in session.minutes)
    for fact in session.facts:
        assert fact.minute_ids and len(fact.minute_ids) == len(fact.statement_valid_from)
        assert fact.valid_from == min(fact.statement_valid_from)
        for minute_id in fact.minute_ids:
            minute = by_id[minute_id]
            assert minute.project_id == fact.project_id
            if fact.task_id:
                assert (minute.scope, minute.data.get("task_id")) == ("task", fact.task_id)
            else:
                assert minute.scope == "project"


def test_values_change_over_time_and_each_value_is_said_before_the_next(session: FactSession) -> None:
    by_key = {f.key: f for f in session.facts}
    by_id = {m.id: m for m in session.minutes}
    changes = [f for f in session.facts if f.replaces]
    assert len(changes) >= 60
    assert any(f.type == "decision" for f in changes) and any(f.type == "fact" for f in changes)
    for fact in changes:
        old = by_key[fact.replaces or ""]
        assert (old.tier_key, old.slot) == (fact.tier_key, fact.slot)
        assert value_key(old.value) != value_key(fact.value)
        last_old = max(by_id[i].timestamp for i in old.minute_ids)
        assert last_old < by_id[fact.minute_ids[0]].timestamp


def test_restatements_say_the_same_fact_in_other_words(session: FactSession) -> None:
    by_id = {m.id: m for m in session.minutes}
    restated = session.restated
    assert len(restated) >= 100
    worded_apart = 0
    for fact in restated:
        notes = {by_id[i].memory_note for i in fact.minute_ids}
        worded_apart += len(notes) == len(fact.minute_ids)
    assert worded_apart / len(restated) >= 0.8


def test_lookalikes_are_in_different_slots_of_one_tier(session: FactSession) -> None:
    by_key = {f.key: f for f in session.facts}
    assert len(session.lookalikes) >= 30
    for a, b in session.lookalikes:
        fa, fb = by_key[a], by_key[b]
        assert fa.tier_key == fb.tier_key and fa.slot != fb.slot
        assert fa.subject == fb.subject or fa.attribute == fb.attribute
    same_subject_pairs = [p for p in session.lookalikes if by_key[p[0]].subject == by_key[p[1]].subject]
    same_attribute_pairs = [p for p in session.lookalikes if by_key[p[0]].attribute == by_key[p[1]].attribute]
    assert same_subject_pairs and same_attribute_pairs


def test_filler_states_nothing_and_some_statements_use_the_data_convention(session: FactSession) -> None:
    stated = {i for f in session.facts for i in f.minute_ids}
    filler = [m for m in session.minutes if m.id not in stated]
    assert 0.2 <= len(filler) / len(session.minutes) <= 0.5
    structured = [m for m in session.minutes if m.id in stated and {"fact", *FACT_TYPES} & set(m.data)]
    assert 0.05 <= len(structured) / len(stated) <= 0.3


def test_relative_dates_are_planted_and_grounded_in_the_gold(session: FactSession) -> None:
    by_id = {m.id: m for m in session.minutes}
    deadlines = [f for f in session.facts if f.attribute == "deadline"]
    assert deadlines and all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", f.value) for f in deadlines)
    relative = re.compile(r"\b(tomorrow|today|yesterday|next \w+|last \w+|in \w+ (days|weeks)|\d+ days ago)\b", re.I)
    said_relatively = [f for f in deadlines if any(relative.search(by_id[i].memory_note or "") for i in f.minute_ids)]
    assert said_relatively
    dated_later = [  # "starting tomorrow", "since yesterday": valid_from is not the minute's time
        f
        for f in session.facts
        for i, valid_from in zip(f.minute_ids, f.statement_valid_from, strict=True)
        if datetime.fromisoformat(valid_from) != datetime.fromisoformat(by_id[i].timestamp)
    ]
    assert len(dated_later) >= 10


def test_the_current_view_holds_the_newest_value_of_each_slot(session: FactSession) -> None:
    view = session.current_view()
    for fact in session.facts:
        slot = (fact.tier_key, fact.subject, fact.attribute)
        rivals = [f for f in session.facts if (f.tier_key, f.subject, f.attribute) == slot]
        if fact.single_valued:
            newest = max(rivals, key=lambda f: f.valid_from)
            assert view[slot] == {value_key(newest.value)}
        else:
            assert view[slot] == {value_key(f.value) for f in rivals}
    assert len(view) == summary(session)["slots"]


def test_every_wording_plants_the_same_facts_in_templates_of_its_own() -> None:
    default, heldout = fact_session("default"), fact_session("heldout")
    planted = [(f.key, f.type, f.tier_key, f.slot) for f in default.facts]
    for wording in WORDINGS:
        assert [(f.key, f.type, f.tier_key, f.slot) for f in fact_session(wording).facts] == planted, wording
    for family, splits in TEMPLATES.items():
        assert set(splits) == set(WORDINGS) == {*SPLITS, "dev", "calibration"}, family
        for a, b in itertools.combinations(WORDINGS, 2):
            assert not set(splits[a]) & set(splits[b]), (family, a, b)
    notes = {m.memory_note for m in default.minutes}
    stated = {i for f in heldout.facts for i in f.minute_ids}
    shared = [m.memory_note for m in heldout.minutes if m.id in stated and m.memory_note in notes]
    assert len(shared) <= 0.2 * len(stated)  # only the convention's short notes and failure notes repeat
    with pytest.raises(ValueError, match="split"):
        fact_session("easy")


# -- score ----------------------------------------------------------------------------------


def _gold(key: str, type_: str, subject: str, attribute: str, value: str, *minute_ids: str) -> GoldFact:
    return GoldFact(
        key=key,
        type=type_,
        project_id="p",
        task_id=None,
        subject=subject,
        attribute=attribute,
        value=value,
        single_valued=True,
        valid_from="2026-03-02T09:00:00.000000Z",
        minute_ids=minute_ids,
        statement_valid_from=("2026-03-02T09:00:00.000000Z",) * len(minute_ids),
    )


def _candidate(type_: str, subject: str, attribute: str, value: str, minute_id: str, **fields: object) -> Candidate:
    base: dict[str, object] = {
        "type": type_,
        "subject": subject,
        "attribute": attribute,
        "value": value,
        "text": "",
        "confidence": 0.8,
        "valid_from": "2026-03-02T09:00:00Z",
        "tier": "project",
        "project_id": "p",
        "source_minute_ids": (minute_id,),
    }
    base.update(fields)
    return Candidate(**base)  # type: ignore[arg-type]


def test_score_counts_matches_by_type_slot_value_and_minute() -> None:
    gold = [
        _gold("a", "fact", "billing service", "database", "Postgres", "m1", "m2"),
        _gold("b", "decision", "billing service", "database", "MySQL", "m3"),
        _gold("c", "constraint", "scope", "must_not", "deploy on Fridays", "m4"),
        _gold("d", "goal", "search api", "goal", "halve the error rate", "m5"),
    ]
    candidates = [
        _candidate("fact", "billing service", "database", "postgres", "m1"),  # right (values compare as value_key)
        _candidate("fact", "billing service", "database", "Postgres", "m2", confidence=0.6, tier="task", task_id="t"),
        _candidate("fact", "billing service", "database", "MySQL", "m3"),  # wrong type
        _candidate("constraint", "scope", "must_not", "deploy on Fridays", "m1"),  # not a minute that states it
        _candidate("entity", "acme", "kind", "vendor", "m9"),  # stated nowhere
    ]
    result = score(candidates, gold)
    assert (result["candidates"], result["facts"], result["statements"]) == (5, 4, 5)
    assert result["precision"] == 0.4
    assert result["recall"] == 0.25
    assert result["statement_recall"] == 0.4  # both statements of "a"
    assert result["type_accuracy"] == round(2 / 3, 4)  # 3 candidates have a stated fact's slot and value
    assert result["tier_accuracy"] == 0.5
    assert result["valid_from_accuracy"] == 1.0  # "...Z" and "....000000Z" are one instant
    assert result["by_type"]["fact"] == {"facts": 1, "candidates": 3, "precision": round(2 / 3, 4), "recall": 1.0}
    assert result["by_type"]["decision"]["recall"] == 0.0
    assert result["precision_at"]["0.7"] == {"precision": 0.25, "recall": 0.25}
    assert score([], gold)["precision"] == 0.0 and score([], [])["recall"] == 0.0


# -- the rule path's targets -------------------------------------------------------------------


@pytest.mark.parametrize("seed", [11, 3])
def test_the_rule_extractor_meets_its_targets_on_the_default_split(seed: int) -> None:
    """Issue 10's rule-path targets: precision >= 0.90, recall >= 0.70, type accuracy >= 0.90."""
    session = fact_session("default", seed=seed)
    result = score(RuleExtractor().extract(session.minutes), session.facts)
    assert result["precision"] >= 0.90, result
    assert result["recall"] >= 0.70, result
    assert result["type_accuracy"] >= 0.90, result
    assert result["tier_accuracy"] >= 0.95, result
    assert result["valid_from_accuracy"] >= 0.95, result

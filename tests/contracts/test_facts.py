"""The fact record of `contracts.facts`: tiers, slots, normalization, deterministic ids, validation and round trips."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts import ContractError, InvalidFact
from contracts.fact_changes import tier_promoted_minute
from contracts.facts import (
    DEFAULT_IMPORTANCE,
    FACT_ID_PATTERN,
    FACT_NAMESPACE,
    GLOBAL_KEY,
    MAX_FACT_SOURCES,
    MAX_FACT_TEXT,
    MAX_FACT_VALUE,
    MAX_RELATIONSHIPS,
    MAX_TAG_LENGTH,
    MAX_TAGS,
    MAX_TASK_ID_LENGTH,
    MULTI_VALUED_ATTRIBUTES,
    READ_FIELDS,
    Fact,
    FactStatus,
    FactType,
    RelationKind,
    Relationship,
    Slot,
    Tier,
    TierKey,
    default_single_valued,
    fact_id,
    normalize_text,
    normalize_value,
)
from contracts.minute import MAX_NAME_LENGTH

SOURCE = "01M8BMRD8028T5CY4TQKFF04HM"
T0 = "2026-11-26T10:00:00.000000Z"
T1 = "2026-11-27T10:00:00.000000Z"
OTHER = "6b1f3c52-6a0e-5d2b-9c7e-0f4a2d8e5b31"  # a fact id of the right shape
PROJECT = TierKey.for_project("alpha")
TASK = TierKey.for_task("alpha", "T-1042")


def make(**changes: Any) -> Fact:
    fields: dict[str, Any] = {
        "type": FactType.DECISION,
        "text": "The auth service keeps sessions for 30 minutes.",
        "subject": "service:auth",
        "attribute": "session_ttl",
        "value": "30m",
        "tier_key": PROJECT,
        "confidence": 0.8,
        "valid_from": T0,
        "recorded_at": T0,
        "source_minute_ids": (SOURCE,),
    }
    fields.update(changes)
    return Fact.new(**fields)


def invalid_field(**changes: Any) -> str:
    """The field a fact built from `make()`'s dict with `changes` is refused for."""
    raw = {**make().to_dict(), **changes}
    with pytest.raises(InvalidFact) as info:
        Fact.from_dict(raw)
    return info.value.field


# -- the enums and their defaults -----------------------------------------------------------------


def test_fact_types_and_default_importance() -> None:
    assert [t.value for t in FactType] == [
        "fact",
        "decision",
        "preference",
        "entity",
        "procedure",
        "constraint",
        "goal",
    ]
    assert [DEFAULT_IMPORTANCE[t] for t in FactType] == [0.5, 0.7, 0.6, 0.5, 0.5, 0.6, 0.8]
    for t in FactType:
        assert make(type=t).importance == DEFAULT_IMPORTANCE[t]
    assert make(type=FactType.GOAL, importance=0.1).importance == 0.1


def test_statuses_tiers_and_relation_kinds() -> None:
    assert [s.value for s in FactStatus] == ["pending", "promoted", "superseded", "retracted"]
    assert [t.value for t in Tier] == ["task", "project", "global"]
    assert [k.value for k in RelationKind] == ["related_to", "depends_on", "contradicts", "supersedes", "questions"]
    assert make().status == FactStatus.PENDING


def test_invalid_fact_is_a_contract_error_naming_the_field() -> None:
    assert issubclass(InvalidFact, ContractError) and issubclass(InvalidFact, ValueError)
    err = InvalidFact("confidence", "1.5 is outside 0..1")
    assert (err.field, err.problem) == ("confidence", "1.5 is outside 0..1")
    assert str(err) == "invalid fact: confidence: 1.5 is outside 0..1"


# -- tier keys ------------------------------------------------------------------------------------


def test_tier_key_string_forms_and_parse() -> None:
    assert str(TASK) == "task:alpha:T-1042"
    assert str(PROJECT) == "project:alpha"
    assert str(GLOBAL_KEY) == "global"
    for key in (TASK, PROJECT, GLOBAL_KEY, TierKey.for_task("alpha", "deploy: step 2 {x}")):
        assert TierKey.parse(str(key)) == key
    # The project id cannot hold ':', so everything after it is the task id, colons included.
    assert TierKey.parse("task:alpha:a:b:c").task_id == "a:b:c"
    assert (TASK.tier, TASK.project_id, TASK.task_id) == (Tier.TASK, "alpha", "T-1042")
    assert (GLOBAL_KEY.project_id, GLOBAL_KEY.task_id) == (None, None)


def test_tier_key_parents_run_task_project_global() -> None:
    assert TASK.parent == PROJECT
    assert PROJECT.parent == GLOBAL_KEY
    assert GLOBAL_KEY.parent is None


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("task:alpha", "task id"),
        ("task:alpha:", "task id"),
        ("task:alpha:   ", "blank"),
        ("task::T-1", "project"),
        ("project:", "project"),
        ("project:al/pha", "project"),
        ("project:alpha:T-1", "project"),
        ("global:alpha", "global"),
        ("Global", "one of"),
        ("tenant:alpha", "one of"),
        ("", "one of"),
        ("task:alpha:" + "t" * (MAX_TASK_ID_LENGTH + 1), f"{MAX_TASK_ID_LENGTH}"),
    ],
)
def test_bad_tier_keys_are_refused_naming_tier_key(text: str, hint: str) -> None:
    with pytest.raises(InvalidFact) as info:
        TierKey.parse(text)
    assert info.value.field == "tier_key"
    assert hint in info.value.problem


def test_tier_key_constructor_rules() -> None:
    with pytest.raises(InvalidFact, match="global tier has no project"):
        TierKey(Tier.GLOBAL, "alpha")
    with pytest.raises(InvalidFact, match="task id"):
        TierKey(Tier.TASK, "alpha")
    with pytest.raises(InvalidFact, match="only a task key"):
        TierKey(Tier.PROJECT, "alpha", "T-1")
    with pytest.raises(InvalidFact, match="project"):
        TierKey(Tier.PROJECT)
    with pytest.raises(InvalidFact, match="tier"):
        TierKey("tenant", "alpha")  # type: ignore[arg-type]
    assert TierKey("project", "alpha") == PROJECT  # type: ignore[arg-type]
    assert TierKey.for_task("alpha", "x" * MAX_TASK_ID_LENGTH).task_id == "x" * MAX_TASK_ID_LENGTH


# -- slots and normalization ----------------------------------------------------------------------


def test_normalization_rule() -> None:
    assert normalize_text("  Service:Auth \t\n  Session   TTL ") == "service:auth session ttl"
    assert normalize_text("Straße") == "strasse"  # casefold, not lower
    full_width = "\uff30\uff4f\uff53\uff54\uff47\uff52\uff45\uff33"
    assert normalize_text(full_width) == "postgres"  # NFKC folds full-width forms
    assert normalize_text("e\u0301") == "\u00e9"  # composed
    assert normalize_value("  Postgres 16 ") == "postgres 16"
    assert normalize_value(True) == "true" and normalize_value(False) == "false"
    assert normalize_value(16) == normalize_value(16.0) == "16"
    assert normalize_value(-0.0) == "0"
    assert normalize_value(0.25) == "0.25"
    assert normalize_value(10**30) == str(10**30)
    for bad in (float("nan"), float("inf"), None, b"x", ["x"]):
        with pytest.raises(InvalidFact) as info:
            normalize_value(bad)  # type: ignore[arg-type]
        assert info.value.field == "value"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=20))
def test_normalization_is_idempotent(text: str) -> None:
    once = normalize_text(text)
    assert normalize_text(once) == once
    assert once == once.strip() and "  " not in once


def test_slots_normalize_and_compare() -> None:
    slot = Slot(" Service:Auth", "SESSION  ttl ")
    assert (slot.subject, slot.attribute) == ("service:auth", "session ttl")
    assert slot == Slot("service:auth", "session ttl")
    assert str(slot) == "service:auth / session ttl"
    assert slot.digest == Slot("SERVICE:AUTH", "Session TTL").digest
    assert len(slot.digest) == 32 and int(slot.digest, 16) >= 0
    # Subject and attribute are told apart however their text splits.
    assert Slot("a b", "c").digest != Slot("a", "b c").digest
    with pytest.raises(InvalidFact) as info:
        Slot("  ", "x")
    assert info.value.field == "subject"
    with pytest.raises(InvalidFact) as info:
        Slot("x", "")
    assert info.value.field == "attribute"


# -- ids ------------------------------------------------------------------------------------------


def test_fact_id_is_a_uuid5_over_netstrings_of_key_slot_and_value() -> None:
    slot = Slot("service:auth", "session_ttl")
    fid = fact_id(PROJECT, slot, "30m")
    parts = ["project:alpha", "service:auth", "session_ttl", "30m"]
    name = "".join(f"{len(p.encode())}:{p}," for p in parts)
    assert fid == str(uuid.uuid5(FACT_NAMESPACE, name))
    assert FACT_ID_PATTERN.fullmatch(fid) and uuid.UUID(fid).version == 5
    # The value is normalized inside, so the raw and the normalized forms give one id.
    assert fact_id(PROJECT, slot, "  30M ") == fid
    assert fact_id(PROJECT, slot, 16) == fact_id(PROJECT, slot, "16")


def test_fact_ids_differ_per_key_slot_and_value() -> None:
    slot = Slot("db", "engine")
    ids = {
        fact_id(TASK, slot, "postgres"),
        fact_id(PROJECT, slot, "postgres"),
        fact_id(TierKey.for_project("beta"), slot, "postgres"),
        fact_id(GLOBAL_KEY, slot, "postgres"),
        fact_id(PROJECT, Slot("db", "engines"), "postgres"),
        fact_id(PROJECT, Slot("dbe", "ngine"), "postgres"),
        fact_id(PROJECT, slot, "mysql"),
    }
    assert len(ids) == 7


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=6), st.text(min_size=1, max_size=6), st.text(min_size=1, max_size=6))
def test_fact_ids_never_collide_across_splits(a: str, b: str, c: str) -> None:
    # "|"-joined names would collide for ("x|y", "z") and ("x", "y|z"); netstrings cannot.
    if not all(normalize_text(p) for p in (a, b, c)):
        return
    one, other = Slot(a + "|" + b, c), Slot(a, b + "|" + c)
    assert (fact_id(PROJECT, one, "v") == fact_id(PROJECT, other, "v")) == (one == other)


# -- the fact record ------------------------------------------------------------------------------


def test_new_fills_the_id_and_defaults() -> None:
    fact = make()
    assert fact.id == fact_id(PROJECT, Slot("service:auth", "session_ttl"), "30m")
    assert fact.slot == Slot("service:auth", "session_ttl")
    assert fact.importance == DEFAULT_IMPORTANCE[FactType.DECISION]
    assert fact.status == FactStatus.PENDING
    assert fact.valid_until is None and fact.last_accessed_at is None and fact.promoted_from is None
    assert fact.access_count == 0 and fact.relationships == () and fact.tags == ()
    assert fact.single_valued is True
    assert (fact.project_id, fact.task_id, fact.tier) == ("alpha", None, Tier.PROJECT)
    # Display text is kept as given; identity uses the normalized forms.
    assert make(subject="Service:Auth", value="30M").id == fact.id
    assert make(subject="Service:Auth").subject == "Service:Auth"


def test_new_defaults_recorded_at_to_now_and_valid_from_to_recorded_at() -> None:
    before = datetime.now(UTC)
    fact = Fact.new(
        type="fact",
        text="x",
        subject="s",
        attribute="a",
        value=3,
        tier_key=PROJECT,
        confidence=1,
        source_minute_ids=[SOURCE],
    )
    assert fact.valid_from == fact.recorded_at
    assert before <= datetime.fromisoformat(fact.recorded_at) <= datetime.now(UTC)
    assert fact.value == "3" and fact.confidence == 1.0 and isinstance(fact.confidence, float)
    assert fact.type is FactType.FACT and fact.source_minute_ids == (SOURCE,)


def test_single_valued_default_by_type_and_attribute() -> None:
    for t in (FactType.FACT, FactType.DECISION, FactType.PREFERENCE, FactType.ENTITY, FactType.PROCEDURE):
        assert default_single_valued(t, "engine") is True
    for t in (FactType.CONSTRAINT, FactType.GOAL):
        assert default_single_valued(t, "engine") is False
    assert "tags" in MULTI_VALUED_ATTRIBUTES
    assert default_single_valued(FactType.FACT, " Tags ") is False  # the attribute is normalized first
    assert make(attribute="members").single_valued is False
    assert make(attribute="members", single_valued=True).single_valued is True  # explicit wins


def test_to_dict_is_json_and_round_trips_exactly() -> None:
    fact = make(
        tier_key=TASK,
        valid_until=T1,
        relationships=[Relationship(RelationKind.DEPENDS_ON, make(value="60m").id, 0.5)],
        tags=["auth", "sessions"],
        promoted_from=None,
    )
    raw = fact.to_dict()
    fields = [f.name for f in dataclasses.fields(Fact) if not f.name.startswith("_")]
    assert list(raw) == [name for name in fields if name not in Fact.OPTIONAL_FIELDS]  # period 0: left out
    assert list(fact.with_(period=1).to_dict()) == fields == list(Fact.FIELDS)
    assert raw["tier_key"] == "task:alpha:T-1042"
    assert raw["relationships"] == [{"kind": "depends_on", "fact_id": make(value="60m").id, "strength": 0.5}]
    text = json.dumps(raw)
    back = Fact.from_dict(json.loads(text))
    assert back == fact
    assert back.to_dict() == raw and json.dumps(back.to_dict()) == text


def test_from_dict_refuses_unknown_and_missing_fields() -> None:
    raw = make().to_dict()
    with pytest.raises(InvalidFact) as info:
        Fact.from_dict({**raw, "scope": "project"})
    assert info.value.field == "scope"
    for name in raw:
        partial = {k: v for k, v in raw.items() if k != name}
        with pytest.raises(InvalidFact) as info:
            Fact.from_dict(partial)
        assert info.value.field == name and "required" in info.value.problem
    with pytest.raises(InvalidFact) as info:
        Fact.from_dict(["not", "a", "map"])
    assert info.value.field == "fact"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"type": "opinion"}, "type"),
        ({"type": None}, "type"),
        ({"status": "done"}, "status"),
        ({"text": "   "}, "text"),
        ({"text": "x" * (MAX_FACT_TEXT + 1)}, "text"),
        ({"text": 5}, "text"),
        ({"text": "ok \ud800"}, "text"),  # a lone surrogate: UTF-8 (msgpack, the id's hash) cannot carry it
        ({"subject": "\udfff"}, "subject"),
        ({"tier_key": "task:alpha:\ud800"}, "tier_key"),
        ({"tags": ["\ud800"]}, "tags[0]"),
        ({"subject": ""}, "subject"),
        ({"subject": "s" * (MAX_NAME_LENGTH + 1)}, "subject"),
        ({"attribute": "\t"}, "attribute"),
        ({"value": ""}, "value"),
        ({"value": 30}, "value"),
        ({"value": "v" * (MAX_FACT_VALUE + 1)}, "value"),
        ({"tier_key": "task:alpha"}, "tier_key"),
        ({"tier_key": "global:alpha"}, "tier_key"),
        ({"tier_key": 7}, "tier_key"),
        ({"confidence": 1.5}, "confidence"),
        ({"confidence": -0.1}, "confidence"),
        ({"confidence": True}, "confidence"),
        ({"confidence": "0.5"}, "confidence"),
        ({"confidence": float("nan")}, "confidence"),
        ({"importance": 2}, "importance"),
        ({"valid_from": "yesterday"}, "valid_from"),
        ({"valid_from": "2026-11-26T10:00:00"}, "valid_from"),
        ({"valid_until": T0}, "valid_until"),  # not after valid_from
        ({"valid_until": "2026-11-25T10:00:00Z"}, "valid_until"),
        ({"recorded_at": None}, "recorded_at"),
        ({"relationships": "x"}, "relationships"),
        ({"relationships": [{"kind": "likes", "fact_id": OTHER, "strength": 1.0}]}, "relationships[0].kind"),
        ({"relationships": [{"kind": "related_to", "fact_id": "abc", "strength": 1.0}]}, "relationships[0].fact_id"),
        ({"relationships": [{"kind": "related_to", "fact_id": OTHER, "strength": 2}]}, "relationships[0].strength"),
        ({"relationships": [{"kind": "related_to", "fact_id": OTHER}]}, "relationships[0].strength"),
        (
            {"relationships": [{"kind": "related_to", "fact_id": OTHER, "strength": 1.0, "why": "x"}]},
            "relationships[0].why",
        ),
        ({"relationships": ["related_to"]}, "relationships[0]"),
        ({"relationships": [{"kind": "related_to", "fact_id": OTHER}] * (MAX_RELATIONSHIPS + 1)}, "relationships"),
        ({"tags": "auth"}, "tags"),
        ({"tags": ["ok", ""]}, "tags[1]"),
        ({"tags": ["ok", "ok"]}, "tags[1]"),
        ({"tags": ["t" * (MAX_TAG_LENGTH + 1)]}, "tags[0]"),
        ({"tags": [f"t{n}" for n in range(MAX_TAGS + 1)]}, "tags"),
        ({"source_minute_ids": []}, "source_minute_ids"),
        ({"source_minute_ids": ["bad id"]}, "source_minute_ids[0]"),
        ({"source_minute_ids": [SOURCE, SOURCE]}, "source_minute_ids[1]"),
        ({"source_minute_ids": [f"m{n}" for n in range(MAX_FACT_SOURCES + 1)]}, "source_minute_ids"),
        ({"access_count": -1}, "access_count"),
        ({"access_count": 1.5}, "access_count"),
        ({"access_count": "1"}, "access_count"),
        ({"last_accessed_at": "soon"}, "last_accessed_at"),
        ({"promoted_from": "T-1"}, "promoted_from"),
        ({"single_valued": "yes"}, "single_valued"),
        ({"period": -1}, "period"),
        ({"period": True}, "period"),
        ({"period": 1.5}, "period"),
        ({"period": "1"}, "period"),
        ({"period": None}, "period"),
        ({"period": 1}, "id"),  # period 0's id with period 1
        ({"id": "not-a-uuid"}, "id"),
        ({"id": str(uuid.uuid5(FACT_NAMESPACE, "other"))}, "id"),  # a well-formed id that is not this fact's
    ],
)
def test_invalid_fields_are_named(changes: dict[str, Any], field: str) -> None:
    assert invalid_field(**changes) == field


def test_the_id_must_follow_the_content() -> None:
    raw = make().to_dict()
    with pytest.raises(InvalidFact, match="fact_id") as info:
        Fact.from_dict({**raw, "value": "45m"})  # the id of 30m with the value 45m
    assert info.value.field == "id"


def test_a_fact_cannot_relate_to_or_come_from_itself() -> None:
    fact = make()
    with pytest.raises(InvalidFact) as info:
        fact.with_(relationships=(Relationship(RelationKind.RELATED_TO, fact.id),))
    assert info.value.field == "relationships[0].fact_id"
    with pytest.raises(InvalidFact) as info:
        fact.with_(promoted_from=fact.id)
    assert info.value.field == "promoted_from"
    duplicate = Relationship(RelationKind.RELATED_TO, make(value="1").id)
    with pytest.raises(InvalidFact) as info:
        fact.with_(relationships=(duplicate, dataclasses.replace(duplicate, strength=0.2)))
    assert info.value.field == "relationships[1]"


def test_holds_at_is_half_open() -> None:
    fact = make(valid_until=T1)
    assert not fact.holds_at("2026-11-26T09:59:59.999999Z")
    assert fact.holds_at(T0)
    assert fact.holds_at("2026-11-26T15:30:00+05:30")  # offsets compare as instants
    assert fact.holds_at(datetime(2026, 11, 27, 9, 59, tzinfo=UTC))
    assert not fact.holds_at(T1)
    assert make().holds_at("2999-01-01T00:00:00Z")  # no valid_until: still holds
    with pytest.raises(InvalidFact):
        fact.holds_at("2026-11-26T10:00:00")  # no offset
    with pytest.raises(InvalidFact):
        fact.holds_at(datetime(2026, 11, 27))  # naive


def test_a_first_period_keeps_the_id_and_the_dict_it_always_had() -> None:
    fact = make()
    name = "13:project:alpha,12:service:auth,11:session_ttl,3:30m,"
    assert fact.period == 0
    assert fact.id == fact_id(PROJECT, fact.slot, "30m", 0) == fact_id(PROJECT, fact.slot, "30m")
    assert fact.id == str(uuid.uuid5(FACT_NAMESPACE, name))
    assert "period" not in fact.to_dict() and list(fact.to_dict()) == list(Fact.FIELDS[:-1])
    assert Fact.from_dict(fact.to_dict()) == fact
    assert Fact.from_dict({**fact.to_dict(), "period": 0}) == fact  # written out, 0 is the same fact


def test_a_later_period_of_a_value_is_another_fact() -> None:
    first, again = make(), make(period=1)
    name = "13:project:alpha,12:service:auth,11:session_ttl,3:30m,1:1,"
    assert again.period == 1 and again.id == str(uuid.uuid5(FACT_NAMESPACE, name)) != first.id
    assert again.id == fact_id(PROJECT, again.slot, " 30M ", 1)
    assert make(period=10).id == str(uuid.uuid5(FACT_NAMESPACE, name.replace("1:1,", "2:10,")))
    raw = again.to_dict()
    assert list(raw) == list(Fact.FIELDS) and raw["period"] == 1
    assert Fact.from_dict(raw) == again and Fact.from_dict(json.loads(json.dumps(raw))) == again
    assert Fact.from_dict({**raw, "period": 1.0}).period == 1  # JSON's whole number
    assert first.with_(period=1) == again and again.with_(period=0) == first
    assert again.with_(value="45m").id == make(value="45m", period=1).id  # the period stays with the record
    # Nothing changed, nothing to check again: the same fact. A value of another type is checked (and fails here).
    assert first.with_(period=0) is first and first.with_(value=first.value, status=first.status) is first
    with pytest.raises(InvalidFact):
        first.with_(period=0.5)
    with pytest.raises(InvalidFact) as info:
        fact_id(PROJECT, first.slot, "30m", -1)
    assert info.value.field == "period"


def test_a_tier_promoted_copy_starts_its_own_periods() -> None:
    again = make(tier_key=TASK, period=2)
    copy = Fact.from_dict(tier_promoted_minute(again).data["fact"])
    assert copy.period == 0 and copy.id == fact_id(PROJECT, again.slot, again.value)
    copy = Fact.from_dict(tier_promoted_minute(again, period=3).data["fact"])
    assert copy.period == 3 and copy.id == fact_id(PROJECT, again.slot, again.value, 3)


def test_with_recomputes_the_id_when_identity_changes() -> None:
    fact = make()
    copied = fact.with_(tier_key=GLOBAL_KEY, promoted_from=fact.id, status=FactStatus.PROMOTED)
    assert copied.id == fact_id(GLOBAL_KEY, fact.slot, fact.value) != fact.id
    assert copied.promoted_from == fact.id and copied.status == FactStatus.PROMOTED
    assert fact.with_(text="reworded").id == fact.id
    assert fact.with_(value="45m").id == make(value="45m").id
    with pytest.raises(InvalidFact) as info:
        fact.with_(confidence=3)
    assert info.value.field == "confidence"
    with pytest.raises(InvalidFact) as info:
        fact.with_(colour="red")
    assert info.value.field == "colour"
    with pytest.raises(InvalidFact) as info:
        fact.with_(id=make(value="45m").id)
    assert info.value.field == "id"


def test_facts_are_frozen_and_hashable() -> None:
    fact = make(tags=("a",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        fact.value = "x"  # type: ignore[misc]
    assert {fact, make(tags=("a",))} == {fact}
    assert READ_FIELDS == ("access_count", "last_accessed_at")


def test_lists_become_tuples_and_numbers_floats() -> None:
    fact = Fact.from_dict({**make().to_dict(), "tags": ["a"], "confidence": 1, "importance": 0, "access_count": 3.0})
    assert fact.access_count == 3 and type(fact.access_count) is int
    assert fact.tags == ("a",) and fact.source_minute_ids == (SOURCE,)
    assert fact.confidence == 1.0 and type(fact.confidence) is float
    assert fact.importance == 0.0 and type(fact.importance) is float


def test_with_keeps_the_id_and_checks_what_changed() -> None:
    fact = make(confidence=0.7)
    promoted = fact.with_(status="promoted", confidence=0.9)
    assert (promoted.id, promoted.slot, promoted.status, promoted.confidence) == (
        fact.id,
        fact.slot,
        FactStatus.PROMOTED,
        0.9,
    )
    assert promoted == Fact.from_dict(promoted.to_dict())  # what a whole validation makes of it
    with pytest.raises(InvalidFact, match="confidence"):
        fact.with_(confidence=1.5)
    with pytest.raises(InvalidFact, match="valid_until"):
        fact.with_(valid_until=T0)  # not after valid_from
    with pytest.raises(InvalidFact, match="relationships"):
        fact.with_(relationships=(Relationship(RelationKind.RELATED_TO, fact.id),))
    assert fact.with_(value="valkey").id != fact.id  # the value makes another fact

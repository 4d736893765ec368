"""Knowledge changes as minutes (`contracts.fact_changes`): builders, payloads, the parser and what each change does."""

from __future__ import annotations

from typing import Any

import pytest

from contracts import EventType, InvalidFact, InvalidMinute, Minute, decode_minute, encode_minute
from contracts.fact_changes import (
    EDITABLE_FIELDS,
    FACT_EVENT_TYPES,
    LEARNED_SUBJECT,
    FactAsserted,
    FactConfirmed,
    FactContradicted,
    FactEdited,
    FactLearned,
    FactPromoted,
    FactRetracted,
    FactSuperseded,
    FactTierPromoted,
    PromotionReason,
    TaskMemoryCleared,
    asserted_minute,
    change_minute,
    confirmed_minute,
    contradicted_minute,
    edited_minute,
    fact_change,
    is_fact_change,
    learned_minute,
    learned_slot,
    promoted_minute,
    retracted_minute,
    superseded_minute,
    task_memory_cleared_minute,
    tier_promoted_minute,
)
from contracts.facts import (
    GLOBAL_KEY,
    MAX_FACT_SOURCES,
    MAX_FACT_TEXT,
    MAX_FACT_VALUE,
    MAX_RELATIONSHIPS,
    MAX_TAG_LENGTH,
    MAX_TAGS,
    MAX_TASK_ID_LENGTH,
    Fact,
    FactStatus,
    FactType,
    RelationKind,
    Relationship,
    Slot,
    TierKey,
    fact_id,
)
from contracts.minute import MAX_ID_LENGTH, MAX_NAME_LENGTH

SOURCE = "01M8BMRD8028T5CY4TQKFF04HM"
LATER = "01M8BNA1B8T1EXJ0Y2QAYA4H4B"
T0 = "2026-11-26T10:00:00.000000Z"
T1 = "2026-11-27T10:00:00.000000Z"
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


def through_the_wire(minute: Minute) -> Minute:
    """The minute as the facts pool reads it back from the log: encoded and decoded."""
    return decode_minute(encode_minute(minute))


def refused(minute: Minute) -> InvalidMinute:
    with pytest.raises(InvalidMinute) as info:
        fact_change(minute)
    return info.value


def with_data(minute: Minute, **data: Any) -> Minute:
    """`minute` with its payload changed (a producer writing a bad knowledge change)."""
    return Minute.from_dict({**minute.to_dict(), "data": {**minute.data, **data}})


# -- the event types ------------------------------------------------------------------------------


def test_every_knowledge_change_is_an_event_type() -> None:
    assert {
        "fact_asserted",
        "fact_confirmed",
        "fact_promoted",
        "fact_tier_promoted",
        "fact_superseded",
        "fact_contradicted",
        "fact_retracted",
        "fact_edited",
        "fact_learned",
        "task_memory_cleared",
    } == FACT_EVENT_TYPES
    for name in FACT_EVENT_TYPES:
        assert EventType(name).value == name
        assert Minute(project_id="alpha", event_type=name).known_event_type


def test_is_fact_change() -> None:
    assert is_fact_change(asserted_minute(make()))
    assert not is_fact_change(Minute(project_id="alpha", event_type="decision"))
    assert not is_fact_change(Minute(project_id="alpha", event_type="fact_asserted_by_someone"))


def test_a_minute_that_is_not_a_knowledge_change_is_refused_naming_event_type() -> None:
    err = refused(Minute(project_id="alpha", event_type="decision", data={"fact": make().to_dict()}))
    assert err.field == "event_type" and "fact_asserted" in err.problem


# -- each change: builder, payload, parse, apply ---------------------------------------------------


def test_asserted() -> None:
    fact = make(tier_key=TASK, tags=("auth",))
    minute = asserted_minute(fact, agent_id="extractor", timestamp=T1)
    assert minute.event_type == "fact_asserted"
    assert minute.data == {"fact": fact.to_dict()}
    assert (minute.project_id, minute.scope, minute.agent_id, minute.timestamp) == ("alpha", "task", "extractor", T1)
    assert minute.memory_note == fact.text
    assert minute.context_references == (SOURCE,)  # the minutes it came from
    change = fact_change(through_the_wire(minute))
    assert change == FactAsserted(fact)
    assert change.tier_key == TASK


def test_asserted_by_hand_names_its_own_minute_as_the_source() -> None:
    mid = "01M8BP0000000000000000HAND"
    fact = make(source_minute_ids=(mid,), status=FactStatus.PROMOTED)
    minute = asserted_minute(fact, minute_id=mid)
    assert minute.id == mid and minute.context_references == ()
    assert fact_change(minute) == FactAsserted(fact)


def test_asserting_into_the_global_tier_is_refused() -> None:
    # Global memory is written only by explicit promotion (or an explicit learn), never by extraction.
    fact = make(tier_key=GLOBAL_KEY)
    with pytest.raises(InvalidFact) as info:
        FactAsserted(fact)
    assert info.value.field == "fact.tier_key"
    minute = asserted_minute(make(), timestamp=T0)
    err = refused(with_data(minute, fact=fact.to_dict()))
    assert err.field == "data.fact.tier_key" and "promot" in err.problem


def test_an_asserted_copy_must_go_through_tier_promotion() -> None:
    fact = make(promoted_from=make(value="1").id)
    with pytest.raises(InvalidFact) as info:
        FactAsserted(fact)
    assert info.value.field == "fact.promoted_from"


def test_confirmed_merges_sources_and_sets_confidence() -> None:
    fact = make()
    minute = confirmed_minute(fact, [LATER], confidence=0.9)
    assert minute.data == {
        "fact_id": fact.id,
        "tier_key": "project:alpha",
        "source_minute_ids": [LATER],
        "confidence": 0.9,
    }
    assert minute.context_references == (LATER,)
    change = fact_change(through_the_wire(minute))
    assert isinstance(change, FactConfirmed)
    merged = change.apply_to(fact)
    assert merged.source_minute_ids == (SOURCE, LATER) and merged.confidence == 0.9
    assert merged.id == fact.id
    # A source it already has is not listed twice.
    assert change.apply_to(merged) == merged


def test_confirmed_keeps_the_first_source_and_the_newest_within_the_limit() -> None:
    many = tuple(f"m{n:04d}" for n in range(MAX_FACT_SOURCES))
    fact = make(source_minute_ids=many)
    merged = FactConfirmed(fact.id, PROJECT, ("new1", "new2"), 0.9).apply_to(fact)
    assert len(merged.source_minute_ids) == MAX_FACT_SOURCES
    assert merged.source_minute_ids[0] == "m0000"
    assert merged.source_minute_ids[-2:] == ("new1", "new2")
    assert "m0001" not in merged.source_minute_ids and "m0002" not in merged.source_minute_ids


def test_promoted() -> None:
    fact = make()
    minute = promoted_minute(fact, PromotionReason.BY_HAND, agent_id="alice")
    assert minute.data == {"fact_id": fact.id, "tier_key": "project:alpha", "reason": "by_hand"}
    change = fact_change(through_the_wire(minute))
    assert change == FactPromoted(fact.id, PROJECT, PromotionReason.BY_HAND)
    assert isinstance(change, FactPromoted)
    assert change.apply_to(fact) == fact.with_(status=FactStatus.PROMOTED)
    assert fact_change(promoted_minute(fact)).reason == PromotionReason.THRESHOLD  # type: ignore[union-attr]


def test_tier_promotion_copies_up_one_tier_with_a_new_id() -> None:
    fact = make(tier_key=TASK, relationships=(Relationship(RelationKind.RELATED_TO, make(value="1").id),))
    fact = fact.with_(access_count=4, last_accessed_at=T1)
    minute = tier_promoted_minute(fact, agent_id="alice", timestamp=T1)
    assert (minute.project_id, minute.scope) == ("alpha", "project")
    change = fact_change(through_the_wire(minute))
    assert isinstance(change, FactTierPromoted)
    copy = change.fact
    assert copy.tier_key == PROJECT and copy.id == fact_id(PROJECT, fact.slot, fact.value) != fact.id
    assert copy.promoted_from == fact.id and copy.status == FactStatus.PROMOTED
    assert (copy.text, copy.value, copy.valid_from, copy.source_minute_ids) == (
        fact.text,
        fact.value,
        fact.valid_from,
        fact.source_minute_ids,
    )
    assert copy.recorded_at == T1  # when the upper tier learned it
    assert copy.relationships == () and copy.access_count == 0 and copy.last_accessed_at is None
    assert change.from_tier_key == TASK and minute.data["from_tier_key"] == "task:alpha:T-1042"

    to_global = tier_promoted_minute(copy)
    assert (to_global.project_id, to_global.scope) == ("alpha", "global")
    top = fact_change(to_global)
    assert top.tier_key == GLOBAL_KEY and top.fact.promoted_from == copy.id  # type: ignore[union-attr]
    with pytest.raises(InvalidFact) as info:
        tier_promoted_minute(top.fact)  # type: ignore[union-attr]
    assert info.value.field == "tier_key" and "top" in info.value.problem


def test_tier_promotion_goes_one_step_up_within_the_project() -> None:
    fact = make(tier_key=TASK)
    copy = fact.with_(tier_key=GLOBAL_KEY, promoted_from=fact.id)
    with pytest.raises(InvalidFact) as info:
        FactTierPromoted(copy, TASK)  # task -> global skips the project
    assert info.value.field == "from_tier_key"
    other = fact.with_(tier_key=TierKey.for_project("beta"), promoted_from=fact.id)
    with pytest.raises(InvalidFact) as info:
        FactTierPromoted(other, TASK)  # into another project
    assert info.value.field == "from_tier_key"
    with pytest.raises(InvalidFact) as info:
        FactTierPromoted(fact.with_(tier_key=PROJECT), TASK)  # a copy names what it was copied from
    assert info.value.field == "fact.promoted_from"


def test_superseded() -> None:
    old, new = make(), make(value="45m", valid_from=T1, recorded_at=T1)
    minute = superseded_minute(old, by=new)
    assert minute.data == {"fact_id": old.id, "tier_key": "project:alpha", "superseded_by": new.id, "valid_until": T1}
    change = fact_change(through_the_wire(minute))
    assert isinstance(change, FactSuperseded)
    closed = change.apply_to(old)
    assert closed.status == FactStatus.SUPERSEDED and closed.valid_until == T1 and closed.id == old.id
    assert not closed.holds_at(T1) and closed.holds_at(T0)


def test_supersession_stays_in_one_slot_of_one_key() -> None:
    old = make()
    with pytest.raises(InvalidFact) as info:
        superseded_minute(old, by=make(attribute="session_idle", valid_from=T1))
    assert info.value.field == "superseded_by" and "slot" in info.value.problem
    with pytest.raises(InvalidFact) as info:
        superseded_minute(old, by=make(tier_key=TASK, value="45m", valid_from=T1))
    assert info.value.field == "superseded_by" and "tier key" in info.value.problem
    with pytest.raises(InvalidFact) as info:
        superseded_minute(old, by=make(value="45m"))  # valid_until == valid_from: it never held
    assert info.value.field == "valid_until"
    with pytest.raises(InvalidFact) as info:
        FactSuperseded(old.id, PROJECT, old.id, T1)
    assert info.value.field == "superseded_by"


def test_contradicted_flags_both_sides() -> None:
    one, other = make(), make(value="45m")
    minute = contradicted_minute(one, other)
    assert minute.data == {"fact_id": one.id, "tier_key": "project:alpha", "contradicted_by": other.id}
    change = fact_change(through_the_wire(minute))
    assert isinstance(change, FactContradicted)
    flagged = change.apply_to(one)
    assert flagged.relationships == (Relationship(RelationKind.CONTRADICTS, other.id, 1.0),)
    assert change.apply_to(other).relationships == (Relationship(RelationKind.CONTRADICTS, one.id, 1.0),)
    assert change.apply_to(flagged) == flagged  # once
    with pytest.raises(InvalidFact) as info:
        change.apply_to(make(value="60m"))
    assert info.value.field == "fact_id"
    with pytest.raises(InvalidFact) as info:
        contradicted_minute(one, make(attribute="other"))
    assert info.value.field == "contradicted_by"


def test_retracted() -> None:
    fact = make()
    minute = retracted_minute(fact, reason="was a typo", agent_id="alice")
    assert minute.data == {"fact_id": fact.id, "tier_key": "project:alpha", "reason": "was a typo"}
    change = fact_change(through_the_wire(minute))
    assert change == FactRetracted(fact.id, PROJECT, "was a typo")
    assert isinstance(change, FactRetracted)
    assert change.apply_to(fact).status == FactStatus.RETRACTED
    assert fact_change(retracted_minute(fact)).reason is None  # type: ignore[union-attr]


def test_edited() -> None:
    fact = make()
    minute = edited_minute(fact, text="Sessions last 30 minutes.", tags=("auth",), confidence=1, agent_id="alice")
    assert minute.data == {
        "fact_id": fact.id,
        "tier_key": "project:alpha",
        "changes": {"text": "Sessions last 30 minutes.", "tags": ["auth"], "confidence": 1.0},
    }
    change = fact_change(through_the_wire(minute))
    assert isinstance(change, FactEdited)
    edited = change.apply_to(fact)
    assert (edited.text, edited.tags, edited.confidence, edited.id) == (
        "Sessions last 30 minutes.",
        ("auth",),
        1.0,
        fact.id,
    )


def test_edits_never_change_identity_or_status() -> None:
    assert "value" not in EDITABLE_FIELDS and "status" not in EDITABLE_FIELDS and "id" not in EDITABLE_FIELDS
    fact = make()
    for name in ("value", "subject", "attribute", "tier_key", "status", "id", "source_minute_ids"):
        with pytest.raises(InvalidFact) as info:
            edited_minute(fact, **{name: "x"})
        assert info.value.field == f"changes.{name}"
    with pytest.raises(InvalidFact) as info:
        edited_minute(fact)
    assert info.value.field == "changes"
    with pytest.raises(InvalidFact) as info:
        edited_minute(fact, confidence=7)
    assert info.value.field == "changes.confidence"
    with pytest.raises(InvalidFact) as info:
        edited_minute(fact, valid_until="2026-11-25T00:00:00Z")  # before valid_from: checked against the fact
    assert info.value.field == "valid_until"


def test_learned() -> None:
    minute = learned_minute("Deploy Window", "Tuesdays", TASK, agent_id="alice", timestamp=T0)
    change = fact_change(through_the_wire(minute))
    assert isinstance(change, FactLearned)
    fact = change.fact
    assert change.key == "Deploy Window" and minute.data["key"] == "Deploy Window"
    assert fact.slot == learned_slot("deploy window") == Slot(LEARNED_SUBJECT, "Deploy Window")
    assert (fact.value, fact.tier_key, fact.status, fact.confidence) == ("Tuesdays", TASK, FactStatus.PROMOTED, 1.0)
    assert fact.source_minute_ids == (minute.id,) and fact.valid_from == fact.recorded_at == T0
    assert fact.single_valued is True and fact.type == FactType.FACT
    assert (minute.project_id, minute.scope, minute.context_references) == ("alpha", "task", ())
    assert fact_change(learned_minute("max_retries", 3, PROJECT)).fact.value == "3"  # type: ignore[union-attr]
    # An explicit learn may write the global tier; it is written to the learner's project.
    top = learned_minute("house style", "black", GLOBAL_KEY, project_id="alpha")
    assert (top.project_id, top.scope) == ("alpha", "global")
    assert fact_change(top).tier_key == GLOBAL_KEY
    with pytest.raises(InvalidMinute) as err:
        learned_minute("house style", "black", GLOBAL_KEY)
    assert err.value.field == "project_id"


def test_a_learned_fact_sits_in_its_key_slot_and_holds_one_value() -> None:
    fact = fact_change(learned_minute("k", "v", PROJECT)).fact  # type: ignore[union-attr]
    with pytest.raises(InvalidFact) as info:
        FactLearned("other key", fact)
    assert info.value.field == "key"
    with pytest.raises(InvalidFact) as info:
        FactLearned("k", fact.with_(single_valued=False))
    assert info.value.field == "fact.single_valued"


def test_task_memory_cleared() -> None:
    minute = task_memory_cleared_minute(TASK, reason="task done", agent_id="planner")
    assert minute.data == {"tier_key": "task:alpha:T-1042", "reason": "task done"}
    assert (minute.project_id, minute.scope) == ("alpha", "task")
    assert fact_change(through_the_wire(minute)) == TaskMemoryCleared(TASK, "task done")
    with pytest.raises(InvalidFact) as info:
        TaskMemoryCleared(PROJECT)
    assert info.value.field == "tier_key"


# -- the parser refuses what the pool must not apply ------------------------------------------------


def test_payload_fields_are_exact() -> None:
    minute = promoted_minute(make())
    err = refused(with_data(minute, extra=1))
    assert err.field == "data.extra" and "not a field" in err.problem
    err = refused(Minute.from_dict({**minute.to_dict(), "data": {"fact_id": make().id, "tier_key": "project:alpha"}}))
    assert err.field == "data.reason" and "required" in err.problem


@pytest.mark.parametrize(
    ("build", "data", "field"),
    [
        (lambda: asserted_minute(make()), {"fact": {**make().to_dict(), "confidence": 1.5}}, "data.fact.confidence"),
        (lambda: asserted_minute(make()), {"fact": "x"}, "data.fact"),
        (lambda: asserted_minute(make()), {"fact": {**make().to_dict(), "value": "45m"}}, "data.fact.id"),
        (lambda: promoted_minute(make()), {"fact_id": "nope"}, "data.fact_id"),
        (lambda: promoted_minute(make()), {"reason": "because"}, "data.reason"),
        (lambda: promoted_minute(make()), {"tier_key": "task:alpha"}, "data.tier_key"),
        (lambda: confirmed_minute(make(), [LATER], 0.9), {"source_minute_ids": []}, "data.source_minute_ids"),
        (lambda: confirmed_minute(make(), [LATER], 0.9), {"confidence": True}, "data.confidence"),
        (
            lambda: superseded_minute(make(), by=make(value="2", valid_from=T1)),
            {"valid_until": "x"},
            "data.valid_until",
        ),
        (lambda: contradicted_minute(make(), make(value="2")), {"contradicted_by": make().id}, "data.contradicted_by"),
        (lambda: retracted_minute(make()), {"reason": 5}, "data.reason"),
        (lambda: retracted_minute(make()), {"reason": " "}, "data.reason"),
        (lambda: edited_minute(make(), text="t"), {"changes": {"value": "x"}}, "data.changes.value"),
        (lambda: edited_minute(make(), text="t"), {"changes": {"tags": [""]}}, "data.changes.tags[0]"),
        (lambda: edited_minute(make(), text="t"), {"changes": []}, "data.changes"),
        (lambda: learned_minute("k", "v", PROJECT), {"key": ""}, "data.key"),
        (lambda: task_memory_cleared_minute(TASK), {"tier_key": "project:alpha"}, "data.tier_key"),
        (
            lambda: tier_promoted_minute(make(tier_key=TASK)),
            {"from_tier_key": "project:alpha"},
            "data.from_tier_key",
        ),
    ],
)
def test_bad_payloads_are_refused_naming_the_field(build: Any, data: dict[str, Any], field: str) -> None:
    assert refused(with_data(build(), **data)).field == field


def test_a_change_is_written_to_its_own_project_with_its_tier_as_scope() -> None:
    # Tenancy: project beta's log cannot carry a change to project alpha's facts.
    minute = asserted_minute(make())
    err = refused(Minute.from_dict({**minute.to_dict(), "project_id": "beta"}))
    assert err.field == "project_id" and "alpha" in err.problem
    err = refused(Minute.from_dict({**minute.to_dict(), "scope": "global"}))
    assert err.field == "scope"
    promoted = tier_promoted_minute(make(tier_key=PROJECT))
    err = refused(Minute.from_dict({**promoted.to_dict(), "project_id": "beta"}))
    assert err.field == "project_id"
    # A global change other than a promotion may come from any project that made it.
    learned = learned_minute("k", "v", GLOBAL_KEY, project_id="beta")
    assert fact_change(learned).tier_key == GLOBAL_KEY
    with pytest.raises(InvalidMinute) as info:
        change_minute(FactPromoted(make().id, PROJECT), project_id="beta")
    assert info.value.field == "project_id"


def test_the_largest_valid_fact_fits_in_a_change_minute() -> None:
    # Every limit at once, in 4-byte UTF-8 where text is free: the minute must still encode (64 KiB).
    wide = "\U0001f680"
    sources = tuple(f"{n:03d}".ljust(MAX_ID_LENGTH, "x") for n in range(MAX_FACT_SOURCES))
    big = Fact.new(
        type=FactType.PROCEDURE,
        text=wide * MAX_FACT_TEXT,
        subject=wide * MAX_NAME_LENGTH,
        attribute=wide * (MAX_NAME_LENGTH - 1) + "a",
        value=wide * MAX_FACT_VALUE,
        tier_key=TierKey.for_task("p" * MAX_NAME_LENGTH, wide * MAX_TASK_ID_LENGTH),
        confidence=0.123456789,
        source_minute_ids=sources,
        relationships=[
            Relationship(RelationKind.RELATED_TO, fact_id(PROJECT, Slot("s", str(n)), "v"), 0.123456789)
            for n in range(MAX_RELATIONSHIPS)
        ],
        tags=[f"{n:02d}" + wide * (MAX_TAG_LENGTH - 2) for n in range(MAX_TAGS)],
        valid_from="2026-11-26T15:30:00.123456789+05:30",
        recorded_at="2026-11-26T15:30:00.123456789+05:30",
        valid_until="2026-11-27T15:30:00.123456789+05:30",
        promoted_from=fact_id(PROJECT, Slot("s", "t"), "v"),
    )
    big = big.with_(access_count=2**63 - 1, last_accessed_at="2026-11-27T15:30:00.123456789+05:30")
    for minute in (
        asserted_minute(big.with_(promoted_from=None), agent_id="a" * MAX_NAME_LENGTH),
        change_minute(FactTierPromoted(big.with_(tier_key=big.tier_key.parent), big.tier_key)),
        change_minute(FactLearned(big.attribute, big.with_(subject=LEARNED_SUBJECT, promoted_from=None))),
    ):
        assert fact_change(through_the_wire(minute)) == fact_change(minute)


def test_the_learned_subject_is_reserved_for_learn() -> None:
    # recall(key) reads slot (learned, key): an extracted or hand-asserted fact never lands there.
    for subject in ("learned", " Learned ", "LEARNED"):
        with pytest.raises(InvalidFact) as info:
            FactAsserted(make(subject=subject))
        assert info.value.field == "fact.subject" and "learn()" in info.value.problem
    learned = fact_change(learned_minute("k", "v", TASK)).fact  # type: ignore[union-attr]
    assert fact_change(tier_promoted_minute(learned)).fact.slot == learned.slot  # type: ignore[union-attr]


def test_a_change_minute_built_here_reads_as_the_change_it_was_built_from_and_as_its_bytes_say() -> None:
    from contracts import fact_changes

    held, other = make(), make(value="45m", valid_from=T1, recorded_at=T1)
    built = [
        asserted_minute(held, minute_id=LATER, timestamp=T1),
        confirmed_minute(held, [LATER], 0.9, minute_id=LATER, timestamp=T1),
        promoted_minute(held, minute_id=LATER, timestamp=T1),
        superseded_minute(held, other, minute_id=LATER, timestamp=T1),
        contradicted_minute(held, other, minute_id=LATER, timestamp=T1),
        retracted_minute(held, "wrong", minute_id=LATER, timestamp=T1),
    ]
    for minute in built:
        change = fact_change(minute)
        assert fact_change(minute) is change  # not decoded again
        assert fact_change(through_the_wire(minute)) == change  # what the log gives back reads the same
    # An equal minute that is not the one built (decoded, or a producer's copy) is decoded and checked.
    copy = with_data(built[0], fact={**built[0].data["fact"], "confidence": 7})
    assert refused(copy).field == "data.fact.confidence"
    # What is kept is bounded.
    for _ in range(fact_changes.BUILT_KEPT + 1):
        promoted_minute(held, minute_id=LATER, timestamp=T1)
    assert len(fact_changes._BUILT) <= fact_changes.BUILT_KEPT

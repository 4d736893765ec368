"""Validation, defaults and mapping round trips of `contracts.minute.Minute`."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from contracts import KNOWN_EVENT_TYPES, ContractError, EventType, InvalidMinute, Minute, Scope
from contracts.ids import id_timestamp_ms
from contracts.minute import (
    EVENT_TYPE_PATTERN,
    MAX_ENCODED_BYTES,
    MAX_ID_LENGTH,
    MAX_NAME_LENGTH,
    MAX_REFERENCES,
    parse_timestamp,
    utc_now_iso,
)

REF = "01M8BMRD8028T5CY4TQKFF04HM"


def base(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "id": "01M8BMV54G1W7GY3RF1W7GY3RF",
        "timestamp": "2026-11-26T10:00:00.000000Z",
        "event_type": "task_assigned",
        "project_id": "alpha",
    }
    fields.update(changes)
    return fields


def invalid_field(**changes: Any) -> str:
    with pytest.raises(InvalidMinute) as info:
        Minute(**base(**changes))
    return info.value.field


# -- errors ---------------------------------------------------------------------------------------


def test_invalid_minute_is_a_value_error_and_contract_error() -> None:
    assert issubclass(InvalidMinute, ContractError)
    assert issubclass(InvalidMinute, ValueError)
    with pytest.raises(ValueError):
        Minute(**base(scope="nope"))


def test_invalid_minute_carries_field_and_problem() -> None:
    err = InvalidMinute("data.task_id", "must be a string")
    assert err.field == "data.task_id"
    assert err.problem == "must be a string"
    assert str(err) == "invalid minute: data.task_id: must be a string"


# -- defaults -------------------------------------------------------------------------------------


def test_defaults() -> None:
    m = Minute(project_id="alpha", event_type="message")
    assert m.agent_id is None
    assert m.data == {}
    assert m.context_references == ()
    assert m.memory_note is None
    assert m.thread_id is None
    assert m.scope == "project" == Scope.PROJECT


def test_default_id_is_a_fresh_ulid() -> None:
    before = int(datetime.now(UTC).timestamp() * 1000)
    a = Minute(project_id="alpha", event_type="message")
    b = Minute(project_id="alpha", event_type="message")
    assert a.id != b.id
    assert a.id < b.id
    assert len(a.id) == 26
    ms = id_timestamp_ms(a.id)
    assert ms is not None and ms >= before - 1


def test_default_timestamp_is_utc_now_with_z() -> None:
    before = datetime.now(UTC)
    m = Minute(project_id="alpha", event_type="message")
    after = datetime.now(UTC)
    assert m.timestamp.endswith("Z")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", m.timestamp)
    assert before - timedelta(milliseconds=1) <= parse_timestamp(m.timestamp) <= after
    assert re.fullmatch(r".*\.\d{6}Z", utc_now_iso())


def test_default_data_is_not_shared() -> None:
    a = Minute(project_id="alpha", event_type="message")
    b = Minute(project_id="alpha", event_type="message")
    assert a.data is not b.data


def test_minute_is_frozen() -> None:
    m = Minute(**base())
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.scope = "global"  # type: ignore[misc]


def test_list_references_become_a_tuple() -> None:
    m = Minute(**base(context_references=[REF, "ext:jira.PVM-1"]))
    assert m.context_references == (REF, "ext:jira.PVM-1")


def test_enum_values_are_accepted() -> None:
    m = Minute(**base(event_type=EventType.KNOWLEDGE, scope=Scope.GLOBAL))
    assert m.event_type == "knowledge"
    assert m.scope == "global"
    assert m.known_event_type


# -- event types ----------------------------------------------------------------------------------


def test_known_event_types() -> None:
    assert {
        "task_assigned",
        "task_started",
        "task_completed",
        "task_failed",
        "conflict_detected",
        "conflict_resolved",
        "decision",
        "message",
        "handoff",
        "capability_observed",
        "evaluation",
        "knowledge",
        # knowledge changes (contracts/fact_changes.py)
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
        # the summarize pool's model-written summaries (contracts/summaries.py)
        "chunk_summarized",
        # PAIR rounds (contracts/pair.py)
        "pair_evaluation",
        "pair_revision",
    } == KNOWN_EVENT_TYPES
    for name in KNOWN_EVENT_TYPES:
        # Known types also satisfy the rule for unknown ones, so the JSON Schema can use one pattern.
        assert EVENT_TYPE_PATTERN.fullmatch(name) and len(name) <= MAX_ID_LENGTH
        assert Minute(**base(event_type=name)).known_event_type


@pytest.mark.parametrize("event_type", ["deploy", "deploy.rollback:canary-v2", "x", "a" * MAX_ID_LENGTH, "k8s_pod-2"])
def test_unknown_event_types_are_accepted(event_type: str) -> None:
    m = Minute(**base(event_type=event_type))
    assert m.event_type == event_type
    assert not m.known_event_type


@pytest.mark.parametrize(
    "event_type", ["", None, 7, "Task", "task assigned", "1task", "_task", "a" * (MAX_ID_LENGTH + 1), "tâche"]
)
def test_bad_event_type(event_type: Any) -> None:
    assert invalid_field(event_type=event_type) == "event_type"


# -- id and references ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["a", "A" * MAX_ID_LENGTH, "01M8BMRD8028T5CY4TQKFF04HM", "ext:jira.PVM-12", "x_y.z:w-1"]
)
def test_good_ids(value: str) -> None:
    assert Minute(**base(id=value)).id == value
    assert Minute(**base(context_references=[value])).context_references == (value,)


@pytest.mark.parametrize(
    "value",
    ["", "A" * (MAX_ID_LENGTH + 1), "-abc", ".abc", "a b", "a/b", "a\nb", "abc\n", "é", "a{b}", 12, None, b"ab"],
)
def test_bad_ids(value: Any) -> None:
    assert invalid_field(id=value) == "id"


def test_bad_reference_names_its_index() -> None:
    assert invalid_field(context_references=[REF, REF, "bad id"]) == "context_references[2]"
    assert invalid_field(context_references=[None]) == "context_references[0]"


def test_reference_count_limit() -> None:
    refs = [f"r{n}" for n in range(MAX_REFERENCES)]
    assert len(Minute(**base(context_references=refs)).context_references) == MAX_REFERENCES
    assert invalid_field(context_references=[*refs, "one-more"]) == "context_references"


@pytest.mark.parametrize("value", [REF, {REF}, {"a": REF}, 5])
def test_references_must_be_a_sequence_of_ids(value: Any) -> None:
    assert invalid_field(context_references=value) == "context_references"


# -- timestamp ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "2026-11-26T10:00:00Z",
        "2026-11-26T10:00:00.000000Z",
        "2026-11-26T10:00:00.123+00:00",
        "2026-11-26T15:30:00.123456789+05:30",
        "2026-11-26T02:00:00-08:00",
    ],
)
def test_good_timestamps(value: str) -> None:
    assert Minute(**base(timestamp=value)).timestamp == value  # carried verbatim


@pytest.mark.parametrize(
    "value",
    [
        "2026-11-26T10:00:00",  # naive
        "2026-11-26",  # a date is naive too
        "yesterday",
        "",
        "2026-13-01T00:00:00Z",
        "2026-02-30T00:00:00Z",
        "2026-11-26T24:00:00Z",
        "2026-11-26T10:00:00+24:00",
        1764151200,
        None,
        datetime(2026, 11, 26, tzinfo=UTC),
    ],
)
def test_bad_timestamps(value: Any) -> None:
    assert invalid_field(timestamp=value) == "timestamp"


# -- project_id -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["alpha", "Alpha-2", "beta_svc.v2", "7", "p" * MAX_NAME_LENGTH])
def test_good_project_ids(value: str) -> None:
    assert Minute(**base(project_id=value)).project_id == value


@pytest.mark.parametrize(
    "value",
    ["", None, 3, "..", "../etc", "a/b", "a\\b", ".hidden", "-x", "team:alpha", "a b", "p" * (MAX_NAME_LENGTH + 1)],
)
def test_bad_project_ids(value: Any) -> None:
    assert invalid_field(project_id=value) == "project_id"


# -- optional text --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["agent_id", "thread_id"])
def test_optional_names(name: str) -> None:
    for ok in (None, "", "agent 7 / ü", "n" * MAX_NAME_LENGTH):
        assert getattr(Minute(**base(**{name: ok})), name) == ok
    for bad in ("n" * (MAX_NAME_LENGTH + 1), 7, ["a"], b"a"):
        assert invalid_field(**{name: bad}) == name


def test_memory_note() -> None:
    assert Minute(**base(memory_note="n" * MAX_ENCODED_BYTES)).memory_note == "n" * MAX_ENCODED_BYTES
    assert invalid_field(memory_note="n" * (MAX_ENCODED_BYTES + 1)) == "memory_note"
    assert invalid_field(memory_note=42) == "memory_note"


# -- scope ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["task", "project", "global"])
def test_good_scopes(value: str) -> None:
    assert Minute(**base(scope=value)).scope == value


@pytest.mark.parametrize("value", ["team", "GLOBAL", "", None, 1, ["global"], {"global": 1}])
def test_bad_scopes(value: Any) -> None:
    assert invalid_field(scope=value) == "scope"


# -- data -----------------------------------------------------------------------------------------


def test_data_free_keys_pass_through() -> None:
    data = {"anything": [1, {"x": None}], "n": 3.5, "flag": True, "task_id": None, "success_criteria_met": None}
    assert Minute(**base(data=data)).data == data


@pytest.mark.parametrize("key", ["task_id", "assignment_reasoning", "conflict_type", "resolution"])
def test_data_text_keys(key: str) -> None:
    assert Minute(**base(data={key: "text"})).data[key] == "text"
    for bad in (1, 1.5, True, ["a"], {"a": "b"}):
        assert invalid_field(data={key: bad}) == f"data.{key}"


@pytest.mark.parametrize("score", [0, 0.0, 50, 87.5, 100, 100.0])
def test_success_criteria_met_in_range(score: float) -> None:
    assert Minute(**base(data={"success_criteria_met": score})).data["success_criteria_met"] == score


@pytest.mark.parametrize(
    "score", [-1, -0.001, 100.001, 101, float("nan"), float("inf"), float("-inf"), True, False, "90", [50]]
)
def test_success_criteria_met_out_of_range_or_mistyped(score: Any) -> None:
    assert invalid_field(data={"success_criteria_met": score}) == "data.success_criteria_met"


@pytest.mark.parametrize("data", [[], "x", 1, ("a", 1), {1: "x"}, {b"k": "x"}])
def test_data_must_be_a_string_keyed_mapping(data: Any) -> None:
    assert invalid_field(data=data) == "data"


# -- to_dict / from_dict --------------------------------------------------------------------------


def full() -> Minute:
    return Minute(
        **base(
            agent_id="planner-1",
            data={"task_id": "T-1", "success_criteria_met": 42, "extra": {"nested": [1, 2]}},
            context_references=[REF, "ext:1"],
            memory_note="note",
            thread_id="thread-7",
            scope="task",
        )
    )


def test_to_dict_wire_order_and_contents() -> None:
    d = full().to_dict()
    assert list(d) == [
        "id",
        "timestamp",
        "event_type",
        "project_id",
        "agent_id",
        "data",
        "context_references",
        "memory_note",
        "thread_id",
        "scope",
    ]
    assert d["context_references"] == [REF, "ext:1"]  # a list, not a tuple


def test_to_dict_omits_null_optional_fields() -> None:
    d = Minute(**base()).to_dict()
    assert list(d) == ["id", "timestamp", "event_type", "project_id", "data", "context_references", "scope"]
    assert d["data"] == {} and d["context_references"] == [] and d["scope"] == "project"


@pytest.mark.parametrize("minute", [full(), Minute(**base())], ids=["full", "minimal"])
def test_round_trip(minute: Minute) -> None:
    assert Minute.from_dict(minute.to_dict()) == minute
    assert Minute.from_dict(minute.to_dict()).to_dict() == minute.to_dict()


def test_from_dict_applies_defaults_and_treats_null_as_absent() -> None:
    m = Minute.from_dict(
        {**base(), "agent_id": None, "data": None, "context_references": None, "memory_note": None, "scope": None}
    )
    assert m == Minute(**base())


@pytest.mark.parametrize("required", ["id", "timestamp", "event_type", "project_id"])
def test_from_dict_requires(required: str) -> None:
    raw = base()
    del raw[required]
    with pytest.raises(InvalidMinute) as info:
        Minute.from_dict(raw)
    assert info.value.field == required
    with pytest.raises(InvalidMinute) as info:
        Minute.from_dict({**raw, required: None})
    assert info.value.field == required


def test_from_dict_rejects_unknown_fields_by_name() -> None:
    with pytest.raises(InvalidMinute) as info:
        Minute.from_dict({**base(), "priority": 1})
    assert info.value.field == "priority"
    with pytest.raises(InvalidMinute) as info:  # the schema version belongs to the codec, not the minute
        Minute.from_dict({**base(), "v": 1})
    assert info.value.field == "v"


@pytest.mark.parametrize("raw", [[], "x", None, 1, [("id", "a")]])
def test_from_dict_needs_a_mapping(raw: Any) -> None:
    with pytest.raises(InvalidMinute) as info:
        Minute.from_dict(raw)
    assert info.value.field == "minute"


def test_from_dict_rejects_non_mapping_data() -> None:
    with pytest.raises(InvalidMinute) as info:
        Minute.from_dict({**base(), "data": ["x"]})
    assert info.value.field == "data"


# -- data is JSON at every depth ------------------------------------------------------------------


def nested(levels: int, leaf: Any = 1) -> dict[str, Any]:
    """A `data` mapping `levels` containers deep, counting `data` itself."""
    value: Any = leaf
    for _ in range(levels - 1):
        value = {"n": value}
    return {"n": value} if levels else value


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        ({"a": {"b": {3: "x"}}}, "data.a.b", ["key 3", "string"]),
        ({"a": {b"k": "x"}}, "data.a", ["key b'k'", "string"]),
        ({"a": [{(1, 2): 1}]}, "data.a[0]", ["key (1, 2)", "string"]),
        ({"ratio": float("nan")}, "data.ratio", ["NaN", "null"]),
        ({"limits": {"max": float("inf")}}, "data.limits.max", ["Infinity", "null"]),
        ({"samples": [1.0, float("-inf")]}, "data.samples[1]", ["-Infinity"]),
        ({"blob": b"\x00\x01"}, "data.blob", ["bytes", "base64"]),
        ({"blob": [bytearray(b"x")]}, "data.blob[0]", ["bytearray", "base64"]),
        ({"tags": {"a", "b"}}, "data.tags", ["set", "list"]),
        ({"when": datetime(2026, 1, 1, tzinfo=UTC)}, "data.when", ["datetime", "JSON"]),
        ({"obj": object()}, "data.obj", ["object", "JSON"]),
        ({"big": 2**64}, "data.big", ["18446744073709551616", "string"]),
        ({"small": [-(2**63) - 1]}, "data.small[0]", ["-9223372036854775809", "string"]),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_data_must_be_json_at_every_depth(data: dict[str, Any], field: str, words: list[str]) -> None:
    with pytest.raises(InvalidMinute) as info:
        Minute(**base(data=data))
    assert info.value.field == field
    for word in words:
        assert word in info.value.problem, (word, info.value.problem)


def test_data_accepts_every_json_value_and_its_python_spellings() -> None:
    data = {
        "s": "x",
        "i": 2**64 - 1,
        "neg": -(2**63),
        "f": 1e308,
        "b": True,
        "none": None,
        "list": [1, "a", None, {"k": [0.5]}],
        "tuple": (1, 2),
        "enum": Scope.TASK,
        "nested": {"a": {"b": {"c": []}}},
    }
    assert Minute(**base(data=data)).data == data


def test_data_nests_at_most_max_depth_levels() -> None:
    from contracts.json_value import MAX_JSON_DEPTH

    assert MAX_JSON_DEPTH == 32
    assert Minute(**base(data=nested(MAX_JSON_DEPTH))).data == nested(MAX_JSON_DEPTH)
    with pytest.raises(InvalidMinute):  # an empty container is a level too
        Minute(**base(data=nested(MAX_JSON_DEPTH, leaf=[])))
    with pytest.raises(InvalidMinute) as info:
        Minute(**base(data=nested(MAX_JSON_DEPTH, leaf=[1])))
    assert info.value.field == "data" + ".n" * MAX_JSON_DEPTH
    assert "32 levels" in info.value.problem
    # A list counts as a level like a map does; depth is checked before the walk goes deeper.
    with pytest.raises(InvalidMinute) as info:
        Minute(**base(data={"deep": nested(10_000)}))
    assert info.value.field.startswith("data.deep.n")

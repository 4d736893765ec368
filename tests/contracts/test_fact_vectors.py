"""The fact JSON Schema and golden vectors against contracts/facts.py and contracts/fact_changes.py.

Mirrors tests/contracts/test_vectors.py for the minute: every vector passes
both the schema and the Python validation, every invalid one fails both (or is
marked ``beyond_schema`` where the schema cannot express the rule, and then the
schema must accept it), and property tests check the two agree field by field.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from contracts import EventType, InvalidFact, InvalidMinute, Minute
from contracts.fact_changes import EDITABLE_FIELDS, FACT_EVENT_TYPES, change_minute, fact_change
from contracts.facts import (
    DEFAULT_IMPORTANCE,
    FACT_NAMESPACE,
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
    Slot,
    Tier,
    TierKey,
    fact_id,
    normalize_value,
)
from contracts.minute import MAX_NAME_LENGTH
from contracts.vectors import generate

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"
SCHEMA = json.loads((CONTRACTS / "schema" / "fact.schema.json").read_text(encoding="utf-8"))
MINUTE_SCHEMA = json.loads((CONTRACTS / "schema" / "minute.schema.json").read_text(encoding="utf-8"))
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
VECTORS = CONTRACTS / "vectors"
FACTS = VECTORS / "facts"
VALID = generate.fact_vector_paths()
INVALID = sorted((FACTS / "invalid").glob("*.json"))
CHANGES = [p for p in sorted(VECTORS.glob("*.json")) if json.loads(p.read_text())["event_type"] in FACT_EVENT_TYPES]
INVALID_CHANGES = sorted((FACTS / "invalid_changes").glob("*.json"))


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def names(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


REGISTRY: Registry[Any] = Registry().with_resource(SCHEMA["$id"], DRAFT202012.create_resource(SCHEMA))


def payload_validator(event_type: str) -> Draft202012Validator:
    """The schema of one knowledge change's data: ``fact.schema.json#/$defs/<event type>`` (its "#" is the fact)."""
    return Draft202012Validator(
        {"$ref": f"{SCHEMA['$id']}#/$defs/{event_type}"},
        registry=REGISTRY,
        format_checker=Draft202012Validator.FORMAT_CHECKER,
    )


def without_v(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "v"}


# -- the schema mirrors facts.py ------------------------------------------------------------------


def test_schema_is_valid_draft_2020_12() -> None:
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(SCHEMA)


def test_schema_mirrors_facts_py() -> None:
    props = SCHEMA["properties"]
    assert list(props) == list(Fact.FIELDS)
    assert SCHEMA["required"] == [name for name in Fact.FIELDS if name not in Fact.OPTIONAL_FIELDS]
    assert SCHEMA["additionalProperties"] is False
    assert props["type"]["enum"] == [t.value for t in FactType]
    assert props["status"]["enum"] == [s.value for s in FactStatus]
    assert SCHEMA["$defs"]["relationship"]["properties"]["kind"]["enum"] == [k.value for k in RelationKind]
    assert props["text"]["maxLength"] == MAX_FACT_TEXT
    assert props["value"]["maxLength"] == MAX_FACT_VALUE
    assert props["subject"]["maxLength"] == props["attribute"]["maxLength"] == MAX_NAME_LENGTH
    assert props["tags"]["maxItems"] == MAX_TAGS and props["tags"]["items"]["maxLength"] == MAX_TAG_LENGTH
    assert props["relationships"]["maxItems"] == MAX_RELATIONSHIPS
    assert props["source_minute_ids"]["maxItems"] == MAX_FACT_SOURCES
    assert SCHEMA["$defs"]["minute_id"] == MINUTE_SCHEMA["$defs"]["minute_id"]
    assert SCHEMA["$defs"]["timestamp"]["pattern"] == MINUTE_SCHEMA["properties"]["timestamp"]["pattern"]
    assert f"{{1,{MAX_TASK_ID_LENGTH}}}" in SCHEMA["$defs"]["tier_key"]["pattern"]
    description = props["type"]["description"]
    for t in FactType:
        assert f"{t.value} {DEFAULT_IMPORTANCE[t]}" in description


def test_schema_describes_every_knowledge_change_payload() -> None:
    assert set(SCHEMA["$defs"]) >= FACT_EVENT_TYPES
    edits = SCHEMA["$defs"]["fact_edited"]["properties"]["changes"]["properties"]
    assert list(edits) == list(EDITABLE_FIELDS)
    for name in FACT_EVENT_TYPES:
        assert SCHEMA["$defs"][name]["additionalProperties"] is False
        Draft202012Validator.check_schema(SCHEMA["$defs"][name])


# -- valid facts ----------------------------------------------------------------------------------


def test_vectors_cover_every_type_tier_and_status() -> None:
    facts = [Fact.from_dict(load(p)) for p in VALID]
    assert {f.type for f in facts} == set(FactType)
    assert {f.tier for f in facts} == set(Tier)
    assert {f.status for f in facts} == set(FactStatus)
    assert {r.kind for f in facts for r in f.relationships} == set(RelationKind)
    assert any(f.valid_until for f in facts) and any(f.promoted_from for f in facts)
    assert any(not f.single_valued for f in facts) and any(f.access_count for f in facts)
    assert any(":" in (f.task_id or "") for f in facts)
    assert any(f.period for f in facts)


@pytest.mark.parametrize("path", VALID, ids=names(VALID))
def test_fact_vector_passes_schema_and_python_in_canonical_form(path: Path) -> None:
    doc = load(path)
    VALIDATOR.validate(doc)
    fact = Fact.from_dict(doc)
    assert fact.to_dict() == doc and list(fact.to_dict()) == list(doc)
    assert fact.id == fact_id(fact.tier_key, fact.slot, fact.value, fact.period)


def test_ids_vector_pins_normalization_and_ids() -> None:
    doc = load(FACTS / "ids.json")
    assert doc == generate.id_vector()
    assert doc["namespace"] == str(FACT_NAMESPACE)
    for case in doc["cases"]:
        # Recomputed from the description alone, as an implementation in another language would.
        parts = [case["tier_key"], case["slot"]["subject"], case["slot"]["attribute"], case["normalized_value"]]
        if "period" in case:
            parts.append(str(case["period"]))
        name = "".join(f"{len(p.encode())}:{p}," for p in parts)
        assert case["uuid5_name"] == name
        assert case["fact_id"] == str(uuid.uuid5(uuid.UUID(doc["namespace"]), name))
        slot = f"{len(case['slot']['subject'].encode())}:{case['slot']['subject']},"
        slot += f"{len(case['slot']['attribute'].encode())}:{case['slot']['attribute']},"
        assert case["slot_digest"] == hashlib.sha256(slot.encode()).hexdigest()[:32]
    ids = [c["fact_id"] for c in doc["cases"]]
    assert ids[0] == ids[1]  # the same fact spelled two ways
    assert len(set(ids)) == len(ids) - 1  # another period of a value is another fact
    assert any(c.get("period") for c in doc["cases"]) and all(c.get("period", 1) > 0 for c in doc["cases"])


# -- invalid facts --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", INVALID, ids=names(INVALID))
def test_invalid_fact_is_refused_naming_the_field(path: Path) -> None:
    case = load(path)
    assert set(case) <= {"description", "field", "fact", "beyond_schema"}
    with pytest.raises(InvalidFact) as info:
        Fact.from_dict(case["fact"])
    assert info.value.field == case["field"]
    # The schema refuses it too, unless the rule is one it cannot express (and then it must accept it).
    assert VALIDATOR.is_valid(case["fact"]) == bool(case.get("beyond_schema"))


def test_invalid_facts_cover_the_brief() -> None:
    fields = {load(p)["field"] for p in INVALID}
    stems = set(names(INVALID))
    assert {"type", "confidence", "valid_until", "tier_key", "id", "source_minute_ids", "period"} <= fields
    assert {
        "type_unknown",
        "confidence_above_1",
        "valid_until_before_valid_from",
        "task_tier_without_task_id",
        "global_tier_with_project",
        "period_negative",
        "period_boolean",
        "id_not_of_its_period",
    } <= stems


# -- knowledge-change minutes ---------------------------------------------------------------------


def test_every_knowledge_change_has_a_golden_minute() -> None:
    assert {load(p)["event_type"] for p in CHANGES} == FACT_EVENT_TYPES
    for path in CHANGES:
        assert path.with_suffix(".msgpack").exists()


@pytest.mark.parametrize("path", CHANGES, ids=names(CHANGES))
def test_change_vector_parses_and_rebuilds_byte_for_byte(path: Path) -> None:
    doc = load(path)
    minute = Minute.from_dict(without_v(doc))
    change = fact_change(minute)
    assert change.event_type == EventType(doc["event_type"])
    payload_validator(doc["event_type"]).validate(doc["data"])
    rebuilt = change_minute(
        change,
        project_id=minute.project_id,
        agent_id=minute.agent_id,
        minute_id=minute.id,
        timestamp=minute.timestamp,
        memory_note=minute.memory_note,
        context_references=minute.context_references,
    )
    assert rebuilt == minute


@pytest.mark.parametrize("path", INVALID_CHANGES, ids=names(INVALID_CHANGES))
def test_invalid_change_is_a_valid_minute_refused_as_a_change(path: Path) -> None:
    case = load(path)
    assert set(case) <= {"description", "field", "minute", "beyond_schema"}
    minute = Minute.from_dict(without_v(case["minute"]))  # a valid minute: the dispatcher passes it
    with pytest.raises(InvalidMinute) as info:
        fact_change(minute)
    assert info.value.field == case["field"]
    valid_payload = payload_validator(minute.event_type).is_valid(minute.data)
    assert valid_payload == bool(case.get("beyond_schema"))


# -- the schema and facts.py agree ----------------------------------------------------------------

BASE = load(FACTS / "fact_project_pending.json")
IDENTITY = ("tier_key", "subject", "attribute", "value", "period")
EARLIEST = "0001-01-01T00:00:00+23:59"  # no instant the schema's pattern writes is earlier


def _python_ok(raw: dict[str, Any]) -> bool:
    try:
        Fact.from_dict(raw)
    except InvalidFact:
        return False
    return True


def _has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list):
        return any(map(_has_surrogate, value))
    if isinstance(value, dict):
        return any(map(_has_surrogate, value.values()))
    return False


def _beyond_schema(raw: dict[str, Any]) -> bool:
    """Whether `raw` breaks a rule the schema documents but cannot express."""
    if _has_surrogate(raw):  # text UTF-8 cannot encode: the JSON Schema sees only code points
        return True
    until = raw.get("valid_until")
    if isinstance(until, str):
        try:
            if datetime.fromisoformat(until) <= datetime.fromisoformat(raw["valid_from"]):
                return True
        except ValueError:
            return False
    rels = raw.get("relationships")
    if isinstance(rels, list) and all(isinstance(r, dict) for r in rels):
        pairs = [(r.get("kind"), r.get("fact_id")) for r in rels]
        if len(set(map(str, pairs))) < len(pairs):
            return True
    return False


def _agree(field: str, value: Any) -> None:
    raw = {**BASE, "valid_from": EARLIEST, field: value}
    if field in IDENTITY:
        with contextlib.suppress(InvalidFact):  # the field is invalid, so the id is beside the point
            slot = Slot(raw["subject"], raw["attribute"])
            raw["id"] = fact_id(TierKey.parse(raw["tier_key"]), slot, raw["value"], raw.get("period", 0))
    schema_ok = VALIDATOR.is_valid(raw)
    python_ok = _python_ok(raw)
    assert python_ok == (schema_ok and not _beyond_schema(raw)), (field, value, schema_ok, python_ok)


def _no_trailing_newline(value: Any) -> bool:
    # Python's `re` (which the jsonschema library uses) lets `$` match before a final "\n";
    # ECMA-262 regexes, which JSON Schema specifies, do not. facts.py uses fullmatch.
    return not (isinstance(value, str) and value.endswith("\n"))


text = st.text(alphabet=st.sampled_from("ab:Z9_.-/ \t\n\u00a0\u3000é日\U0001f680{}|") | st.characters(), max_size=12)
long_text = st.builds(lambda c, n: c * n, st.sampled_from(["a", " ", "\U0001f680", "é"]), st.integers(0, 2100))
numbers = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.floats(-2, 2, allow_nan=False), st.text(max_size=2)
)
timestamps = st.from_regex(SCHEMA["$defs"]["timestamp"]["pattern"].replace("$", r"\Z"), fullmatch=True)
fact_ids = st.one_of(st.sampled_from([BASE["id"].replace("5", "4", 1), BASE["id"].upper()]), st.uuids().map(str))
tier_keys = st.builds(
    lambda tier, project, sep, task: tier + project + sep + task,
    st.sampled_from(["task:", "project:", "global", "global:", "", "Task:"]),
    st.sampled_from(["alpha", "", "a/b", "p" * 128, "p" * 129, "x.y-z_1"]) | text,
    st.sampled_from(["", ":", "::"]),
    st.sampled_from(["T-1", "", " ", "t" * 128, "t" * 129, "a:b"]) | text,
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["text", "subject", "attribute", "value"]),
    st.one_of(text, long_text, st.integers(), st.none()).filter(_no_trailing_newline),
)
def test_schema_and_facts_agree_on_text(field: str, value: Any) -> None:
    _agree(field, value)


@settings(max_examples=300, deadline=None)
@given(tier_keys.filter(_no_trailing_newline))
def test_schema_and_facts_agree_on_tier_keys(value: str) -> None:
    _agree("tier_key", value)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["confidence", "importance"]), numbers)
def test_schema_and_facts_agree_on_unit_numbers(field: str, value: Any) -> None:
    _agree(field, value)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["type", "status", "single_valued", "access_count", "period"]),
    st.one_of(
        st.sampled_from([*FactType, *FactStatus, "Fact", "opinion"]).map(str),
        st.booleans(),
        st.integers(-2, 2**64),
        st.floats(-2, 5, allow_nan=False),
        st.none(),
    ),
)
def test_schema_and_facts_agree_on_enums_flags_and_counts(field: str, value: Any) -> None:
    _agree(field, value)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["valid_from", "valid_until", "recorded_at", "last_accessed_at", "promoted_from"]),
    st.one_of(timestamps, fact_ids, text, st.none(), st.integers()).filter(_no_trailing_newline),
)
def test_schema_and_facts_agree_on_times_and_references(field: str, value: Any) -> None:
    _agree(field, value)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["tags", "source_minute_ids"]),
    st.lists(st.one_of(text, st.sampled_from(["auth", "01M8BMRD8028T5CY4TQKFF04HM", "x" * 65])), max_size=4).filter(
        lambda items: all(map(_no_trailing_newline, items))
    ),
    st.integers(0, 140),
)
def test_schema_and_facts_agree_on_lists(field: str, items: list[str], padding: int) -> None:
    _agree(field, items + [f"m{n}" for n in range(padding)])


relationships = st.fixed_dictionaries(
    {
        "kind": st.sampled_from([*RelationKind, "likes"]).map(str),
        "fact_id": st.sampled_from([fact_id(TierKey.for_project("alpha"), Slot("s", "a"), v) for v in "xy"]) | fact_ids,
        "strength": numbers,
    },
    optional={"why": st.just("x")},
)


@settings(max_examples=200, deadline=None)
@given(st.lists(relationships, max_size=4), st.integers(0, 33))
def test_schema_and_facts_agree_on_relationships(items: list[dict[str, Any]], padding: int) -> None:
    extra = [
        {
            "kind": "related_to",
            "fact_id": fact_id(TierKey.for_project("alpha"), Slot("pad", str(n)), "v"),
            "strength": 1,
        }
        for n in range(padding)
    ]
    _agree("relationships", items + extra)


def test_normalized_values_have_one_form() -> None:
    for case in load(FACTS / "ids.json")["cases"]:
        assert normalize_value(case["value"]) == case["normalized_value"]

"""The golden vectors against the JSON Schema and the codec, and the schema against minute.py."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from contracts import KNOWN_EVENT_TYPES, InvalidMinute, Minute, decode_minute, encode_minute
from contracts.json_value import MAX_INT, MAX_JSON_DEPTH, MIN_INT
from contracts.minute import MAX_ENCODED_BYTES, MAX_ID_LENGTH, MAX_NAME_LENGTH, MAX_REFERENCES, parse_timestamp
from contracts.vectors import generate

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"
SCHEMA_PATH = CONTRACTS / "schema" / "minute.schema.json"
VECTORS = CONTRACTS / "vectors"
VALID = sorted(VECTORS.glob("*.json"))
INVALID_ALL = sorted((VECTORS / "invalid").glob("*.json"))
# Cases JSON can write: {"description", "field", "minute"}; the schema and the contract both refuse them.
INVALID = [p for p in INVALID_ALL if "minute" in json.loads(p.read_text(encoding="utf-8"))]
# Cases only msgpack can write (NaN, Infinity, bin, extensions) or the schema cannot express (nesting depth):
# {"description", "field", "msgpack": "<name>.msgpack"} beside the bytes.
INVALID_WIRE = [p for p in INVALID_ALL if p not in INVALID]
WIRE_ORDER = [
    "v",
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

SCHEMA = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def without_v(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "v"}


def names(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


# -- the schema itself ----------------------------------------------------------------------------


def test_schema_is_valid_draft_2020_12() -> None:
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(SCHEMA)


def test_schema_limits_mirror_minute_py() -> None:
    props = SCHEMA["properties"]
    minute_id = SCHEMA["$defs"]["minute_id"]
    assert minute_id["maxLength"] == MAX_ID_LENGTH
    assert props["event_type"]["maxLength"] == MAX_ID_LENGTH
    assert props["project_id"]["maxLength"] == MAX_NAME_LENGTH
    assert props["agent_id"]["maxLength"] == MAX_NAME_LENGTH
    assert props["thread_id"]["maxLength"] == MAX_NAME_LENGTH
    assert props["memory_note"]["maxLength"] == MAX_ENCODED_BYTES
    assert props["context_references"]["maxItems"] == MAX_REFERENCES
    assert SCHEMA["additionalProperties"] is False
    assert set(props) == set(WIRE_ORDER)
    assert set(SCHEMA["required"]) == {"v", "id", "timestamp", "event_type", "project_id"}
    data = props["data"]["description"]
    assert f"at most {MAX_JSON_DEPTH} levels" in data and f"{MIN_INT}..{MAX_INT}" in data


def test_schema_lists_every_known_event_type() -> None:
    description = SCHEMA["properties"]["event_type"]["description"]
    for name in KNOWN_EVENT_TYPES:
        assert re.search(rf"\b{name}\b", description), name


# -- valid vectors --------------------------------------------------------------------------------


def test_enough_vectors() -> None:
    assert len(VALID) >= 6
    assert len(INVALID) >= 7
    for stem in (
        "minimal",
        "task_assigned_full",
        "conflict_resolved_with_references",
        "task_failed_zero_score",
        "unknown_event_type",
        "unicode_memory_note",
        "global_knowledge",
    ):
        assert (VECTORS / f"{stem}.json").exists() and (VECTORS / f"{stem}.msgpack").exists(), stem


def test_every_msgpack_has_a_json() -> None:
    assert sorted(p.stem for p in VECTORS.glob("*.msgpack")) == names(VALID)


@pytest.mark.parametrize("path", VALID, ids=names(VALID))
def test_vector_validates_against_schema(path: Path) -> None:
    VALIDATOR.validate(load(path))


@pytest.mark.parametrize("path", VALID, ids=names(VALID))
def test_vector_json_is_canonical_wire_form(path: Path) -> None:
    doc = load(path)
    minute = Minute.from_dict(without_v(doc))
    canonical = {"v": 1, **minute.to_dict()}
    assert list(doc) == list(canonical)
    assert doc == canonical
    assert [k for k in WIRE_ORDER if k in doc] == list(doc)


@pytest.mark.parametrize("path", VALID, ids=names(VALID))
def test_encode_matches_golden_bytes(path: Path) -> None:
    golden = path.with_suffix(".msgpack").read_bytes()
    assert encode_minute(Minute.from_dict(without_v(load(path)))) == golden


@pytest.mark.parametrize("path", VALID, ids=names(VALID))
def test_decode_golden_bytes(path: Path) -> None:
    golden = path.with_suffix(".msgpack").read_bytes()
    doc = load(path)
    assert decode_minute(golden) == Minute.from_dict(without_v(doc))
    # The raw map, read by any msgpack library, is the JSON document key for key and in order.
    body = msgpack.unpackb(golden, raw=False)
    assert body == doc
    assert list(body) == list(doc)


@pytest.mark.parametrize("path", VALID, ids=names(VALID))
def test_trusted_builds_the_minute_the_validating_constructor_does(path: Path) -> None:
    body = without_v(msgpack.unpackb(path.with_suffix(".msgpack").read_bytes(), raw=False))
    validated = Minute.from_dict(body)
    trusted = Minute.trusted(body)
    assert trusted == validated
    assert [type(getattr(trusted, f)) for f in WIRE_ORDER[1:]] == [type(getattr(validated, f)) for f in WIRE_ORDER[1:]]
    # Optional fields sent as null read as absent, as from_dict reads them.
    nulls = {**body, **dict.fromkeys(("agent_id", "data", "context_references", "memory_note", "thread_id", "scope"))}
    assert Minute.trusted(nulls) == Minute.from_dict(nulls)


def test_specific_vectors() -> None:
    by_name = {p.stem: load(p) for p in VALID}
    assert by_name["task_failed_zero_score"]["data"]["success_criteria_met"] == 0
    assert by_name["unknown_event_type"]["event_type"] not in KNOWN_EVENT_TYPES
    assert by_name["global_knowledge"]["scope"] == "global"
    assert by_name["global_knowledge"]["event_type"] == "knowledge"
    assert by_name["conflict_resolved_with_references"]["context_references"]
    note = by_name["unicode_memory_note"]["memory_note"]
    assert any(ord(ch) > 0xFFFF for ch in note)  # outside the BMP: 4-byte UTF-8, a surrogate pair in UTF-16
    full = by_name["task_assigned_full"]
    assert {"task_id", "assignment_reasoning", "conflict_type", "resolution", "success_criteria_met"} < set(
        full["data"]
    )
    assert set(full) == set(WIRE_ORDER)


def test_generator_is_up_to_date() -> None:
    assert generate.problems() == []


def test_generator_check_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert generate.main(["--check"]) == 0
    assert "0 problem(s)" in capsys.readouterr().out


def test_generator_detects_stale_and_missing_files(tmp_path: Path) -> None:
    for path in VALID[:2]:
        (tmp_path / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    wire = sorted(
        tmp_path / "invalid" / p.name for p in VECTORS.glob("invalid/*") if p in INVALID_WIRE or p.suffix == ".msgpack"
    )
    ids = tmp_path / "facts" / "ids.json"
    written = sorted(generate.generate(tmp_path))
    assert written == sorted([*(tmp_path / f"{p.stem}.msgpack" for p in VALID[:2]), *wire, ids])
    assert ids.read_bytes() == (VECTORS / "facts" / "ids.json").read_bytes()
    assert generate.problems(tmp_path) == []
    assert generate.generate(tmp_path) == []  # nothing to rewrite
    stale = tmp_path / f"{VALID[0].stem}.msgpack"
    stale.write_bytes(b"\x80")
    (tmp_path / "orphan.msgpack").write_bytes(b"\x80")
    (tmp_path / "invalid" / "data_nan.msgpack").write_bytes(b"\x80")
    (tmp_path / "invalid" / "stray.msgpack").write_bytes(b"\x80")
    found = generate.problems(tmp_path)
    assert any("stale" in p for p in found) and any("orphan" in p for p in found)
    assert "invalid/data_nan.msgpack: stale" in found and any(p.startswith("invalid/stray.msgpack") for p in found)


def test_generator_fills_fact_ids_and_reports_wrong_ones(tmp_path: Path) -> None:
    (tmp_path / "facts").mkdir()
    golden = json.loads((VECTORS / "facts" / "fact_project_pending.json").read_text(encoding="utf-8"))
    new = tmp_path / "facts" / "new_fact.json"
    new.write_text(json.dumps({k: v for k, v in golden.items() if k != "id"}), encoding="utf-8")
    assert "facts/new_fact.json: no id (run the generator to fill it in)" in generate.problems(tmp_path)
    generate.generate(tmp_path)
    assert json.loads(new.read_text(encoding="utf-8")) == golden  # the id filled in, in canonical order
    assert generate.problems(tmp_path) == []
    # A wrong id is reported and left alone: the golden ids are what other languages check against.
    wrong = {**golden, "value": "45m"}
    new.write_text(json.dumps(wrong), encoding="utf-8")
    assert generate.generate(tmp_path) == []
    assert any(p.startswith("facts/new_fact.json: invalid fact: id:") for p in generate.problems(tmp_path))
    new.write_text(json.dumps(golden, indent=1), encoding="utf-8")
    (tmp_path / "facts" / "ids.json").write_text("{}", encoding="utf-8")
    assert generate.problems(tmp_path) == ["facts/ids.json: stale (normalization or ids changed?)"]
    order = {"type": golden["type"], **golden}
    new.write_text(json.dumps(order), encoding="utf-8")
    generate.generate(tmp_path)
    assert generate.problems(tmp_path) == [
        "facts/new_fact.json: not in canonical form (Fact.to_dict(): every field, in order)"
    ]


# -- msgpack format coverage ----------------------------------------------------------------------

_FIXED = {
    0xC0: ("nil", 0),
    0xC2: ("false", 0),
    0xC3: ("true", 0),
    0xCA: ("float32", 4),
    0xCB: ("float64", 8),
    0xCC: ("uint8", 1),
    0xCD: ("uint16", 2),
    0xCE: ("uint32", 4),
    0xCF: ("uint64", 8),
    0xD0: ("int8", 1),
    0xD1: ("int16", 2),
    0xD2: ("int32", 4),
    0xD3: ("int64", 8),
}
_SIZED = {
    0xD9: ("str8", 1),
    0xDA: ("str16", 2),
    0xDB: ("str32", 4),
    0xC4: ("bin8", 1),
    0xC5: ("bin16", 2),
    0xC6: ("bin32", 4),
}
_CONTAINERS = {0xDC: ("array16", 2, 1), 0xDD: ("array32", 4, 1), 0xDE: ("map16", 2, 2), 0xDF: ("map32", 4, 2)}


def _formats(raw: bytes, i: int, seen: Counter[str]) -> int:
    """Walk one msgpack object at `i`, counting the format families it uses; returns the next offset."""
    t = raw[i]
    if t <= 0x7F or t >= 0xE0:
        seen["fixint"] += 1
        return i + 1
    if 0xA0 <= t <= 0xBF:
        seen["fixstr"] += 1
        return i + 1 + (t & 0x1F)
    if t in _FIXED:
        name, width = _FIXED[t]
        seen[name] += 1
        return i + 1 + width
    if t in _SIZED:
        name, width = _SIZED[t]
        seen[name] += 1
        return i + 1 + width + int.from_bytes(raw[i + 1 : i + 1 + width], "big")
    if 0x80 <= t <= 0x9F:
        name, count, per, i = ("fixmap", t & 0x0F, 2, i + 1) if t <= 0x8F else ("fixarray", t & 0x0F, 1, i + 1)
    elif t in _CONTAINERS:
        name, width, per = _CONTAINERS[t]
        count = int.from_bytes(raw[i + 1 : i + 1 + width], "big")
        i += 1 + width
    else:
        raise AssertionError(f"unexpected msgpack type byte {t:#x}")
    seen[name] += 1
    for _ in range(count * per):
        i = _formats(raw, i, seen)
    return i


def test_vectors_cover_the_msgpack_formats_a_minute_uses() -> None:
    seen: Counter[str] = Counter()
    for path in VALID:
        raw = path.with_suffix(".msgpack").read_bytes()
        assert _formats(raw, 0, seen) == len(raw)
        assert raw[1:4] == b"\xa1v\x01"  # a fixmap header, then "v": 1 first
    expected = {
        "fixint",
        "fixstr",
        "str8",
        "str16",
        "fixmap",
        "map16",
        "fixarray",
        "array16",
        "nil",
        "true",
        "false",
        "float64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "int8",
        "int16",
        "int32",
        "int64",
    }
    assert expected <= set(seen), expected - set(seen)
    assert "float32" not in seen and not {"bin8", "bin16", "bin32"} & set(seen)


# -- invalid cases --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", INVALID, ids=names(INVALID))
def test_invalid_case_fails_schema_and_minute(path: Path) -> None:
    case = load(path)
    assert set(case) <= {"minute", "field", "description"}
    minute, field = case["minute"], case["field"]
    assert minute.get("v") == 1  # only the minute is wrong, never the envelope
    assert not VALIDATOR.is_valid(minute), f"schema accepts {path.name}"
    with pytest.raises(InvalidMinute) as info:
        Minute.from_dict(without_v(minute))
    assert info.value.field == field
    # The same map on the wire is refused by the codec, naming the same field.
    with pytest.raises(InvalidMinute) as info:
        decode_minute(msgpack.packb(minute, use_bin_type=True))
    assert info.value.field == field


@pytest.mark.parametrize("path", INVALID_WIRE, ids=names(INVALID_WIRE))
def test_wire_only_invalid_case_is_refused_by_the_decoder_naming_the_field(path: Path) -> None:
    case = load(path)
    assert set(case) == {"description", "field", "msgpack"}
    raw = (path.parent / case["msgpack"]).read_bytes()
    body = msgpack.unpackb(raw, raw=False, timestamp=0)
    assert body["v"] == 1  # only the data is wrong, never the envelope
    assert set(body) == set(VALID_BASE) | {"v"}
    with pytest.raises(InvalidMinute) as info:
        decode_minute(raw)
    assert info.value.field == case["field"]


def test_wire_only_invalid_cases_cover_what_json_cannot_write() -> None:
    assert {p.stem for p in INVALID_WIRE} >= {
        "data_nan",
        "data_infinity",
        "data_negative_infinity",
        "data_bin_value",
        "data_bin_key",
        "data_ext_timestamp",
        "data_too_deep",
    }
    assert sorted(p.stem for p in (VECTORS / "invalid").glob("*.msgpack")) == names(INVALID_WIRE)


def test_the_nesting_vector_sits_exactly_at_the_limit() -> None:
    doc = load(VECTORS / "data_nesting_at_the_limit.json")

    def depth(value: Any) -> int:
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        return 0 if children is None else 1 + max((depth(c) for c in children), default=0)

    assert depth(doc["data"]) == MAX_JSON_DEPTH
    deeper = json.loads(json.dumps(doc).replace('"n": 1', '"n": [1]'))
    with pytest.raises(InvalidMinute) as info:
        Minute.from_dict(without_v(deeper))
    assert info.value.field.startswith("data.n[0].n") and f"{MAX_JSON_DEPTH} levels" in info.value.problem


def test_invalid_cases_cover_the_brief() -> None:
    fields = Counter(load(p)["field"] for p in INVALID)
    for field in (
        "id",
        "timestamp",
        "event_type",
        "project_id",
        "scope",
        "data",
        "data.success_criteria_met",
        "context_references",
        "agent_id",
        "thread_id",
        "memory_note",
    ):
        assert fields[field], field


# -- the schema and minute.py agree ---------------------------------------------------------------

VALID_BASE = without_v(load(VECTORS / "minimal.json"))
text = st.text(
    alphabet=st.sampled_from("abcxyzABCXYZ0189_.:-/ {}\téü日\U0001f680") | st.characters(codec="utf-8"),
    max_size=70,
)


def _agree(field: str, value: Any) -> None:
    raw = {**VALID_BASE, field: value}
    schema_ok = VALIDATOR.is_valid({"v": 1, **raw})
    try:
        Minute.from_dict(raw)
        python_ok = True
    except InvalidMinute:
        python_ok = False
    assert schema_ok == python_ok, (field, value, schema_ok, python_ok)


def _no_trailing_newline(value: str) -> bool:
    # Python's `re` (which the jsonschema library uses) lets `$` match before a final "\n";
    # ECMA-262 regexes, which JSON Schema specifies, do not. minute.py uses fullmatch.
    return not value.endswith("\n")


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["id", "project_id", "event_type", "agent_id", "thread_id"]), text.filter(_no_trailing_newline))
def test_schema_and_minute_agree_on_names(field: str, value: str) -> None:
    _agree(field, value)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["id", "project_id", "event_type", "agent_id", "thread_id"]), st.integers(1, 200))
def test_schema_and_minute_agree_on_lengths(field: str, length: int) -> None:
    _agree(field, ("a" if field != "event_type" else "e") * length)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.none(), st.booleans(), st.integers(-1000, 1000), st.floats(-1000, 1000), st.text(max_size=3)))
def test_schema_and_minute_agree_on_success_criteria_met(score: Any) -> None:
    _agree("data", {"success_criteria_met": score})


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(MIN_INT, MAX_INT)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["task_id", "resolution", "free", "x", ""]) | st.text(max_size=5), json_values))
def test_schema_and_minute_agree_on_nested_json_data(data: dict[str, Any]) -> None:
    # Within MAX_JSON_DEPTH and msgpack's integer range, which the schema describes but cannot enforce.
    _agree("data", data)


@settings(max_examples=200, deadline=None)
@given(st.lists(text.filter(_no_trailing_newline), max_size=3), st.integers(0, 300))
def test_schema_and_minute_agree_on_references(refs: list[str], padding: int) -> None:
    _agree("context_references", refs + [f"r{n}" for n in range(padding)])


TIMESTAMP_PATTERN = SCHEMA["properties"]["timestamp"]["pattern"]


@settings(max_examples=300, deadline=None)
@given(st.from_regex(TIMESTAMP_PATTERN.replace("$", r"\Z"), fullmatch=True))
def test_every_schema_timestamp_is_accepted_by_minute(value: str) -> None:
    # The schema's pattern is a subset of what minute.py reads; it cannot rule out impossible
    # calendar days (February 30), which minute.py rejects.
    try:
        parse_timestamp(value)
    except InvalidMinute:
        day = int(value[8:10])
        assert day > 28, value


@pytest.mark.parametrize(
    "value",
    [
        "2026-11-26T10:00:00",
        "2026-11-26T10:00:00z",
        "2026-11-26t10:00:00Z",
        "2026-11-26 10:00:00Z",
        "20261126T100000Z",
        "2026-11-26T10:00Z",
        "2026-11-26T10:00:00+0530",
        "2026-11-26T10:00:60Z",
        "0000-01-01T00:00:00Z",
        "2026-11-26T10:00:00.Z",
        "2026-11-26T10:00:00,5Z",
    ],
)
def test_schema_timestamp_is_strict(value: str) -> None:
    assert not VALIDATOR.is_valid({"v": 1, **VALID_BASE, "timestamp": value})

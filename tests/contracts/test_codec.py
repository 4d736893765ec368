"""The msgpack codec: round trips, versioning, size limit and typed errors for any input."""

from __future__ import annotations

import ast
import contextlib
import json
import math
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts import (
    MAX_ENCODED_BYTES,
    SCHEMA_VERSION,
    ContractError,
    DecodeError,
    InvalidMinute,
    MalformedMinute,
    Minute,
    UnsupportedSchemaVersion,
    decode_durable_fields,
    decode_durable_minute,
    decode_minute,
    encode_minute,
)
from contracts.codec import MinuteTooLarge

REF = "01M8BMRD8028T5CY4TQKFF04HM"

WIRE: dict[str, Any] = {
    "v": 1,
    "id": "01M8BMV54G1W7GY3RF1W7GY3RF",
    "timestamp": "2026-11-26T10:00:00.000000Z",
    "event_type": "task_assigned",
    "project_id": "alpha",
    "agent_id": "planner-1",
    "data": {"task_id": "T-1", "success_criteria_met": 50},
    "context_references": [REF],
    "memory_note": "note",
    "thread_id": "thread-7",
    "scope": "task",
}


def pack(body: Any) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def decode_error(raw: bytes) -> ContractError:
    with pytest.raises(ContractError) as info:
        decode_minute(raw)
    return info.value


# -- round trips ----------------------------------------------------------------------------------


def test_round_trip_full() -> None:
    m = Minute.from_dict({k: v for k, v in WIRE.items() if k != "v"})
    raw = encode_minute(m)
    assert decode_minute(raw) == m
    assert msgpack.unpackb(raw) == WIRE
    assert list(msgpack.unpackb(raw)) == list(WIRE)  # "v" first, then wire order


def test_round_trip_defaults() -> None:
    m = Minute(project_id="alpha", event_type="message")
    raw = encode_minute(m)
    assert decode_minute(raw) == m
    assert set(msgpack.unpackb(raw)) == {
        "v",
        "id",
        "timestamp",
        "event_type",
        "project_id",
        "data",
        "context_references",
        "scope",
    }


def test_decode_accepts_bytearray_and_memoryview() -> None:
    raw = pack(WIRE)
    assert decode_minute(bytearray(raw)) == decode_minute(memoryview(raw)) == decode_minute(raw)


def test_decode_accepts_any_key_order_and_minimal_maps() -> None:
    shuffled = dict(reversed(list(WIRE.items())))
    assert decode_minute(pack(shuffled)) == decode_minute(pack(WIRE))
    minimal = {k: WIRE[k] for k in ("id", "timestamp", "event_type", "project_id", "v")}
    m = decode_minute(pack(minimal))
    assert m.data == {} and m.context_references == () and m.scope == "project" and m.agent_id is None


def test_decode_accepts_non_canonical_numbers() -> None:
    # Other encoders may use float32 or wider ints than needed; the values still decode.
    body = {**WIRE, "data": {"success_criteria_met": 50.0}}
    packer = msgpack.Packer(use_single_float=True, use_bin_type=True)
    assert decode_minute(packer.pack(body)).data["success_criteria_met"] == 50.0
    # A 5-entry map whose "v" is a uint64 (0xcf) rather than a fixint.
    rest = pack({k: WIRE[k] for k in ("id", "timestamp", "event_type", "project_id")})
    assert rest[0] == 0x84  # fixmap of 4; drop its header and prepend one for 5
    raw = b"\x85" + pack("v") + b"\xcf" + (1).to_bytes(8, "big") + rest[1:]
    assert decode_minute(raw).id == WIRE["id"]


def test_free_data_values_round_trip() -> None:
    data = {"big": 2**64 - 1, "neg": -(2**63), "f": 0.1, "nested": {"a": [None, True, {"b": "x"}]}}
    m = Minute(project_id="alpha", event_type="message", data=data)
    assert decode_minute(encode_minute(m)).data == data


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"blob": b"\x00\xff"}, "data.blob"),
        ({"a": {"b": [float("nan")]}}, "data.a.b[0]"),
        ({"a": {b"k": 1}}, "data.a"),
        ({"when": msgpack.Timestamp(1, 0)}, "data.when"),
        ({"ext": msgpack.ExtType(5, b"x")}, "data.ext"),
    ],
)
def test_data_that_is_not_json_is_refused_on_the_wire_naming_its_path(value: dict[str, Any], field: str) -> None:
    """What a producer in another language can put in msgpack but JSON cannot hold: the decoder names the path."""
    err = decode_error(pack({**WIRE, "data": value}))
    assert isinstance(err, InvalidMinute)
    assert err.field == field


def test_non_string_keys_below_the_top_are_refused_by_the_decoder() -> None:
    # msgpack's strict_map_key refuses them while unpacking (a defence against hash flooding), before any path is known.
    raw = msgpack.packb({**WIRE, "data": {"a": {3: "x"}}}, use_bin_type=True, strict_types=False)
    assert isinstance(decode_error(raw), MalformedMinute)


def test_encode_rejects_unencodable_data_naming_the_path() -> None:
    # Minute() refuses such data; a minute built without validation (Minute.trusted) still cannot be encoded.
    body = {k: v for k, v in WIRE.items() if k != "v"}
    for data, field in (({"x": {"y": object()}}, "data.x.y"), ({"x": [2**64]}, "data.x[0]")):
        with pytest.raises(InvalidMinute) as info:
            encode_minute(Minute.trusted({**body, "data": data}))
        assert info.value.field == field
    with pytest.raises(InvalidMinute) as info:
        encode_minute(Minute.trusted({**body, "memory_note": "\ud800 a lone surrogate"}))
    assert info.value.field == "memory_note"


# -- schema version -------------------------------------------------------------------------------


def test_schema_version_is_one() -> None:
    assert SCHEMA_VERSION == 1
    assert msgpack.unpackb(encode_minute(Minute(project_id="a", event_type="message")))["v"] == 1


@pytest.mark.parametrize("version", [0, 2, 99, -1, "1", 1.0, True, None, [1], {"v": 1}, b"\x01"])
def test_unsupported_schema_versions(version: Any) -> None:
    err = decode_error(pack({**WIRE, "v": version}))
    assert isinstance(err, UnsupportedSchemaVersion)
    assert isinstance(err, DecodeError)


def test_missing_schema_version() -> None:
    body = {k: v for k, v in WIRE.items() if k != "v"}
    assert isinstance(decode_error(pack(body)), UnsupportedSchemaVersion)


# -- size limit -----------------------------------------------------------------------------------


def test_encode_over_64_kib_names_minute() -> None:
    m = Minute(project_id="alpha", event_type="message", data={"blob": "x" * MAX_ENCODED_BYTES})
    with pytest.raises(InvalidMinute) as info:
        encode_minute(m)
    assert info.value.field == "minute"
    assert isinstance(info.value, MinuteTooLarge)


def test_encode_exactly_at_the_limit() -> None:
    m = Minute(project_id="alpha", event_type="message", data={"blob": ""})
    overhead = len(encode_minute(m)) + 2  # the blob grows from fixstr to str16: 2 more header bytes
    fits = Minute(
        project_id="alpha",
        event_type="message",
        id=m.id,
        timestamp=m.timestamp,
        data={"blob": "x" * (MAX_ENCODED_BYTES - overhead)},
    )
    assert len(encode_minute(fits)) == MAX_ENCODED_BYTES
    over = Minute(
        project_id="alpha",
        event_type="message",
        id=m.id,
        timestamp=m.timestamp,
        data={"blob": "x" * (MAX_ENCODED_BYTES - overhead + 1)},
    )
    with pytest.raises(InvalidMinute) as info:
        encode_minute(over)
    assert info.value.field == "minute"


def test_decode_over_64_kib_names_minute() -> None:
    raw = pack({**WIRE, "data": {"blob": "x" * MAX_ENCODED_BYTES}})
    assert len(raw) > MAX_ENCODED_BYTES
    err = decode_error(raw)
    assert isinstance(err, InvalidMinute)
    assert err.field == "minute"
    # Oversized junk is refused before any parsing.
    assert isinstance(decode_error(b"\xc1" * (MAX_ENCODED_BYTES + 1)), InvalidMinute)


# -- malformed input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xc1",
        b"\x81",
        b"\xd9\x05ab",
        b"\x80\x00",
        pack(WIRE) + b"\x00",
        pack([WIRE]),
        pack("minute"),
        pack(None),
        pack(1),
        b"\xa2\xff\xfe",
        pack({**WIRE})[:-1],
    ],
    ids=[
        "empty",
        "reserved-byte",
        "truncated-map",
        "truncated-str",
        "trailing-byte",
        "trailing-after-minute",
        "array",
        "string",
        "nil",
        "int",
        "bad-utf8",
        "truncated-minute",
    ],
)
def test_malformed_bytes(raw: bytes) -> None:
    assert isinstance(decode_error(raw), MalformedMinute)


@pytest.mark.parametrize("raw", ["text", None, 12, [1, 2]])
def test_decode_requires_bytes(raw: Any) -> None:
    with pytest.raises(MalformedMinute):
        decode_minute(raw)


def test_non_string_map_keys_are_malformed() -> None:
    raw = msgpack.packb({1: "x", "v": 1}, strict_types=False)
    assert isinstance(decode_error(raw), MalformedMinute)


def test_bin_field_names_are_rejected() -> None:
    body = {(k.encode() if k == "id" else k): v for k, v in WIRE.items()}
    err = decode_error(pack(body))
    assert isinstance(err, InvalidMinute)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"id": b"01M8BMV54G1W7GY3RF1W7GY3RF"}, "id"),
        ({"id": None}, "id"),
        ({"timestamp": "2026-11-26T10:00:00"}, "timestamp"),
        ({"event_type": 5}, "event_type"),
        ({"project_id": ["alpha"]}, "project_id"),
        ({"agent_id": {"name": "x"}}, "agent_id"),
        ({"data": [1]}, "data"),
        ({"data": {b"k": 1}}, "data"),
        ({"data": {"success_criteria_met": 100.5}}, "data.success_criteria_met"),
        ({"data": {"resolution": b"text"}}, "data.resolution"),
        ({"context_references": "x"}, "context_references"),
        ({"context_references": [REF, 7]}, "context_references[1]"),
        ({"memory_note": 1.5}, "memory_note"),
        ({"thread_id": True}, "thread_id"),
        ({"scope": ["task"]}, "scope"),
        ({"scope": {"task": 1}}, "scope"),
        ({"scope": "Task"}, "scope"),
        ({"extra": 1}, "extra"),
    ],
)
def test_near_valid_maps_name_the_field(changes: dict[str, Any], field: str) -> None:
    err = decode_error(pack({**WIRE, **changes}))
    assert isinstance(err, InvalidMinute)
    assert err.field == field


# -- fuzzing --------------------------------------------------------------------------------------

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=512))
def test_arbitrary_bytes_raise_only_contract_errors(raw: bytes) -> None:
    with contextlib.suppress(ContractError):
        decode_minute(raw)


@FUZZ
@given(st.binary(max_size=256))
def test_arbitrary_bytes_after_a_map_header_raise_only_contract_errors(tail: bytes) -> None:
    # Start like a real minute so the fuzzer gets past "not a map" more often.
    for head in (b"\x8b\xa1v\x01", b"\x85", b"\xde\x00\x03"):
        with contextlib.suppress(ContractError):
            decode_minute(head + tail)


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=80)
    | st.binary(max_size=16)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8) | st.binary(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
fields = st.sampled_from([*sorted(WIRE), "extra", "V", ""])


@FUZZ
@given(st.dictionaries(fields, values, max_size=4), st.lists(fields, max_size=2))
def test_near_valid_maps_raise_invalid_minute_or_decode_error(changes: dict[str, Any], drop: list[str]) -> None:
    body = {k: v for k, v in {**WIRE, **changes}.items() if k not in drop}
    try:
        raw = pack(body)
    except (TypeError, ValueError, OverflowError):
        return
    try:
        m = decode_minute(raw)
    except (InvalidMinute, DecodeError):
        return
    # Anything accepted is JSON and survives a round trip unchanged.
    assert isinstance(m, Minute)
    assert decode_minute(encode_minute(m)) == m
    assert json.loads(json.dumps(m.to_dict(), allow_nan=False)) == m.to_dict()


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(
            ["task_id", "assignment_reasoning", "conflict_type", "resolution", "success_criteria_met", "free"]
        ),
        values,
        max_size=4,
    )
)
def test_fuzzed_data_raises_only_data_errors(data: dict[str, Any]) -> None:
    try:
        raw = pack({**WIRE, "data": data})
    except (TypeError, ValueError, OverflowError):
        return
    try:
        decode_minute(raw)
    except InvalidMinute as exc:
        assert exc.field.startswith("data")


# -- validation matches the codec -----------------------------------------------------------------

any_scalar = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**65), max_value=2**65)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.binary(max_size=4)
    | st.just(msgpack.ExtType(1, b"x"))
)
any_key = st.text(max_size=4) | st.integers(-3, 3) | st.binary(max_size=2) | st.none()
any_value = st.recursive(
    any_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner) | st.dictionaries(any_key, inner, max_size=3),
    max_leaves=10,
)


def _is_json(value: Any) -> bool:
    """The rule, written out independently: what json and msgpack both carry, unchanged."""
    if value is None or isinstance(value, (bool, str)):
        return True
    if isinstance(value, int):
        return -(2**63) <= value <= 2**64 - 1
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


@FUZZ
@given(st.dictionaries(st.text(max_size=4), any_value, max_size=3))
def test_minute_accepts_data_exactly_when_the_codec_and_json_carry_it(data: dict[str, Any]) -> None:
    """Whatever Minute() accepts, emit() encodes and the dispatcher decodes to the same minute; nothing else passes."""
    try:
        m = Minute(project_id="alpha", event_type="message", data=data)
    except InvalidMinute as exc:
        assert exc.field.startswith("data")
        assert not _is_json(data)
        return
    assert _is_json(data)
    decoded = decode_minute(encode_minute(m))
    assert decoded.data == json.loads(json.dumps(data, allow_nan=False))
    assert decoded == Minute.from_dict(json.loads(json.dumps(m.to_dict(), allow_nan=False)))


# -- durable minutes: one decoder for bytes PVM validated before ----------------------------------

VECTORS = Path(__file__).resolve().parents[2] / "contracts" / "vectors"


@pytest.mark.parametrize(
    "body",
    [
        WIRE,
        {k: v for k, v in WIRE.items() if k in ("v", "id", "timestamp", "event_type", "project_id")},  # bare
        {**WIRE, "agent_id": None, "memory_note": None, "thread_id": None, "scope": None, "data": None},  # nils
        {**WIRE, "context_references": None},
        dict(reversed(WIRE.items())),  # another producer's key order
        *(msgpack.unpackb(p.read_bytes()) for p in sorted(VECTORS.glob("*.msgpack"))),
    ],
)
def test_the_fields_of_a_durable_minute_are_the_minute_as_a_mapping(body: dict[str, Any]) -> None:
    """What a reader answers from the cache (fields) is what it answers from the log (the minute's to_dict)."""
    raw = msgpack.packb(body, use_bin_type=True, datetime=False)
    assert decode_durable_fields(raw) == decode_durable_minute(raw).to_dict() == decode_minute(raw).to_dict()


@pytest.mark.parametrize("version", [0, 2, None, "1"])
def test_the_fields_of_a_durable_minute_carry_a_readable_schema_version(version: Any) -> None:
    with pytest.raises(UnsupportedSchemaVersion):
        decode_durable_fields(pack({**WIRE, "v": version}))
    with pytest.raises(MalformedMinute):
        decode_durable_fields(b"\xc1 not msgpack")


# Modules that unpack msgpack that is not a minute, and what they unpack.
NOT_MINUTES = {
    "contracts/codec.py": "the codec itself",
    "pvm/context_facts.py": "stored fact records (StoredFact.unpack), and msgpack's bytes of a status marker",
    "pvm/stores/fact_projection.py": "stored fact records (a fact's dict with its order keys) and lists of parked "
    "change minutes' bytes (each decoded with decode_durable_minute)",
    "pvm/stores/log.py": "the log's record frames (seq, id, stream id, time, and the minute's bytes untouched)",
    "pvm/stores/summaries.py": "a thread's chunk and episode records (lists of their dicts)",
    "pvm/vectors/edge.py": "point payloads the engine stores",
    "workers/runtime/serializers.py": "RQ job data",
    "workers/facts/pool.py": "a decision record: a list of change minutes' bytes (each decoded with "
    "decode_durable_minute)",
    "workers/evaluate/pool.py": "the evaluate pool's records: scores, prune records, a task's outcome in a run",
    "workers/evaluate/candidate_index.py": "an evaluation run's candidate index: bucket id lists and dedupe records",
    "workers/agent/memory_snapshot.py": "stored fact records (StoredFact.pack's bytes), read for the Markdown export",
    "workers/summarize/pool.py": "a thread's open episode patterns (OpenPatterns.to_dict); its minutes' bytes are "
    "decoded with decode_durable_minute",
}


def test_minutes_are_decoded_by_the_codec_alone() -> None:
    """No module but the codec turns a minute's bytes into values: one decoder, one schema-version check."""
    root = Path(__file__).resolve().parents[2]
    unpacking = set()
    for package in ("contracts", "pvm", "workers", "bench"):
        for path in (root / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            called = {
                n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            }
            if called & {"unpackb", "unpack", "Unpacker"} and "msgpack" in path.read_text():
                unpacking.add(str(path.relative_to(root)))
    assert unpacking <= set(NOT_MINUTES), (
        f"{sorted(unpacking - set(NOT_MINUTES))} unpack msgpack themselves: decode a minute with "
        "contracts.decode_minute (untrusted bytes), decode_durable_minute or decode_durable_fields (bytes PVM "
        "validated); if these bytes are not a minute, add the module to NOT_MINUTES saying what they are"
    )

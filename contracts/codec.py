"""The msgpack wire codec for minutes, with a schema version and typed errors.

Wire form: a msgpack map holding ``"v"`` (the schema version) and the minute's
fields by name (see ``contracts/schema/minute.schema.json``). Producers in other
languages follow the golden vectors in ``contracts/vectors``.
"""

from __future__ import annotations

from typing import Any

import msgpack

from contracts.errors import ContractError, InvalidMinute
from contracts.json_value import check_json, first_unencodable_text
from contracts.minute import MAX_ENCODED_BYTES, Minute, Scope

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})
_DEFAULT_SCOPE = Scope.PROJECT.value


class DecodeError(ContractError):
    """Bytes that cannot be turned into a minute."""


class MalformedMinute(DecodeError):
    """The bytes are not a msgpack map."""


class UnsupportedSchemaVersion(DecodeError):
    """The map carries a schema version this build does not read."""


class MinuteTooLarge(InvalidMinute):
    """The encoded minute exceeds the 64 KiB limit."""

    def __init__(self, size: int) -> None:
        super().__init__(
            "minute", f"encodes to {size} bytes; the limit is {MAX_ENCODED_BYTES} (move bulk data out of the minute)"
        )


def encode_minute(minute: Minute) -> bytes:
    """Encode a validated minute; raises `InvalidMinute` for unencodable data or excess size.

    Packs field by field instead of building a dict first: `emit()` runs this in
    the agent's thread, and allocating no containers here keeps the garbage
    collector (and its pauses) out of the agent's way. The bytes are identical
    to packing `{"v": 1, **minute.to_dict()}` (see the golden vectors).
    """
    packer = msgpack.Packer(use_bin_type=True, autoreset=False)
    pack = packer.pack
    agent_id, memory_note, thread_id = minute.agent_id, minute.memory_note, minute.thread_id
    fields = 8 + (agent_id is not None) + (memory_note is not None) + (thread_id is not None)
    try:
        packer.pack_map_header(fields)
        pack("v")
        pack(SCHEMA_VERSION)
        pack("id")
        pack(minute.id)
        pack("timestamp")
        pack(minute.timestamp)
        pack("event_type")
        pack(minute.event_type)
        pack("project_id")
        pack(minute.project_id)
        if agent_id is not None:
            pack("agent_id")
            pack(agent_id)
        pack("data")
        pack(minute.data)
        pack("context_references")
        packer.pack_array_header(len(minute.context_references))
        for ref in minute.context_references:
            pack(ref)
        if memory_note is not None:
            pack("memory_note")
            pack(memory_note)
        if thread_id is not None:
            pack("thread_id")
            pack(thread_id)
        pack("scope")
        pack(minute.scope)
        raw: bytes = packer.bytes()
    except (TypeError, ValueError, OverflowError) as exc:
        raise _unencodable(minute, exc) from None
    if len(raw) > MAX_ENCODED_BYTES:
        raise MinuteTooLarge(len(raw))
    return raw


def _unencodable(minute: Minute, exc: Exception) -> InvalidMinute:
    """Why `minute` could not be packed, naming the field: only a minute built without validation gets here."""
    try:
        check_json("data", minute.data)
    except InvalidMinute as found:
        return found
    for name in ("id", "timestamp", "event_type", "project_id", "agent_id", "data", "memory_note", "thread_id"):
        path = first_unencodable_text(name, getattr(minute, name))
        if path is not None:
            return InvalidMinute(path, "holds a lone surrogate, which UTF-8 cannot encode; send valid Unicode text")
    path = first_unencodable_text("context_references", list(minute.context_references))
    if path is not None:
        return InvalidMinute(path, "holds a lone surrogate, which UTF-8 cannot encode; send valid Unicode text")
    return InvalidMinute("minute", f"holds a value msgpack cannot encode ({exc})")


def decode_minute(raw: bytes) -> Minute:
    """Decode and validate wire bytes; raises a `ContractError` subclass naming the problem."""
    return Minute.from_dict(_unpack(raw))


def decode_durable_minute(raw: bytes) -> Minute:
    """Decode bytes PVM itself validated (the log, a stream entry the dispatcher passed), checking the shape only.

    The dispatcher validated every minute before the log took it, under the
    rules of its day: a minute logged before a rule tightened (data holding
    NaN or bytes, before data had to be JSON) must still read back, or one old
    record would fail every read, replay and export that meets it. Readers
    that answer in JSON encode such values safely. Never for input from
    outside PVM: that goes through `decode_minute`.
    """
    return Minute.trusted(_unpack(raw))


def decode_durable_fields(raw: bytes) -> dict[str, Any]:
    """The fields of bytes PVM itself validated, as `Minute.to_dict` gives them, without building a `Minute`.

    For readers that pass a minute on as JSON and pools that read a few of its
    fields, where building a `Minute` would double the cost of decoding. The
    schema version is checked, the fields are not (see `decode_durable_minute`):
    null optional fields are left out and absent ones get their defaults, so a
    minute a producer sent without them reads the same from the cache as from
    the log.
    """
    body = _unpack(raw)
    if None in body.values():
        body = {k: v for k, v in body.items() if v is not None}
    if "data" not in body:
        body["data"] = {}
    if "context_references" not in body:
        body["context_references"] = []
    if "scope" not in body:
        body["scope"] = _DEFAULT_SCOPE
    return body


def _unpack(raw: bytes) -> dict[str, Any]:
    """The minute map of wire bytes, without "v"; raises `DecodeError` for anything but a supported version's map."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise MalformedMinute(f"expected bytes, got {type(raw).__name__}")
    if len(raw) > MAX_ENCODED_BYTES:
        raise MinuteTooLarge(len(raw))
    try:
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for junk input
        raise MalformedMinute(f"not valid msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(body, dict):
        raise MalformedMinute(f"expected a msgpack map, got {type(body).__name__}")
    version = body.pop("v", None)
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        raise UnsupportedSchemaVersion(
            f"schema version {version!r} is not supported (this build reads {sorted(SUPPORTED_VERSIONS)})"
        )
    return body

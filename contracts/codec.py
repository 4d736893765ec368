"""The msgpack wire codec for minutes, with a schema version and typed errors.

Wire form: a msgpack map holding ``"v"`` (the schema version) and the minute's
fields by name (see ``contracts/schema/minute.schema.json``). Producers in other
languages follow the golden vectors in ``contracts/vectors``.
"""

from __future__ import annotations

from typing import Any

import msgpack

from contracts.errors import ContractError, InvalidMinute
from contracts.minute import MAX_ENCODED_BYTES, Minute

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})


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
    """Encode a validated minute; raises `InvalidMinute` for unencodable data or excess size."""
    body: dict[str, Any] = {"v": SCHEMA_VERSION}
    body.update(minute.to_dict())
    try:
        raw: bytes = msgpack.packb(body, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidMinute("data", f"holds a value msgpack cannot encode ({exc})") from None
    if len(raw) > MAX_ENCODED_BYTES:
        raise MinuteTooLarge(len(raw))
    return raw


def decode_minute(raw: bytes) -> Minute:
    """Decode and validate wire bytes; raises a `ContractError` subclass naming the problem."""
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
    return Minute.from_dict(body)

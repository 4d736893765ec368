"""The PVM wire contract: nouns only, no I/O.

Everything a producer in any language needs to speak to PVM lives here: the
`Minute`, its validation rules, the msgpack codec with a schema version, the
`Fact` record of long-term memory, and every Redis key, stream and queue name.
"""

from __future__ import annotations

from contracts.codec import (
    SCHEMA_VERSION,
    DecodeError,
    MalformedMinute,
    UnsupportedSchemaVersion,
    decode_durable_fields,
    decode_durable_minute,
    decode_minute,
    encode_minute,
)
from contracts.errors import ContractError, InvalidFact, InvalidMinute
from contracts.fact_changes import FACT_EVENT_TYPES, FactChange, fact_change, is_fact_change
from contracts.facts import (
    DEFAULT_IMPORTANCE,
    GLOBAL_KEY,
    Fact,
    FactStatus,
    FactType,
    RelationKind,
    Relationship,
    Slot,
    Tier,
    TierKey,
    fact_id,
    normalize_value,
)
from contracts.ids import new_minute_id
from contracts.minute import (
    KNOWN_EVENT_TYPES,
    MAX_ENCODED_BYTES,
    PROJECT_ID_RULE,
    EventType,
    Minute,
    Scope,
    check_project_id,
    is_valid_project_id,
)

__all__ = [
    "DEFAULT_IMPORTANCE",
    "FACT_EVENT_TYPES",
    "GLOBAL_KEY",
    "KNOWN_EVENT_TYPES",
    "MAX_ENCODED_BYTES",
    "PROJECT_ID_RULE",
    "SCHEMA_VERSION",
    "ContractError",
    "DecodeError",
    "EventType",
    "Fact",
    "FactChange",
    "FactStatus",
    "FactType",
    "InvalidFact",
    "InvalidMinute",
    "MalformedMinute",
    "Minute",
    "RelationKind",
    "Relationship",
    "Scope",
    "Slot",
    "Tier",
    "TierKey",
    "UnsupportedSchemaVersion",
    "check_project_id",
    "decode_durable_fields",
    "decode_durable_minute",
    "decode_minute",
    "encode_minute",
    "fact_change",
    "fact_id",
    "is_fact_change",
    "is_valid_project_id",
    "new_minute_id",
    "normalize_value",
]

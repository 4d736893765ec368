"""Redis connections from settings (a clear error when none is configured) and the bytes shapes of their replies."""

from __future__ import annotations

from typing import cast

import redis

from contracts.errors import PvmError
from pvm import defaults
from pvm.config import Settings


class NoRedisConfigured(PvmError, RuntimeError):
    """Neither PVM_REDIS_URL nor an explicit URL names a Redis server."""

    def __init__(self) -> None:
        super().__init__(
            f"no Redis configured: set PVM_REDIS_URL (e.g. {defaults.REDIS_URL_EXAMPLE}), "
            "or run `pvm up` to start the embedded stack"
        )


def redis_from_settings(settings: Settings, **kwargs: object) -> redis.Redis:
    """A client for the configured Redis (bytes responses, health checks on)."""
    if not settings.redis_url:
        raise NoRedisConfigured()
    options: dict[str, object] = {"health_check_interval": 30, "socket_keepalive": True}
    options.update(kwargs)
    return redis.Redis.from_url(settings.redis_url, **options)


# PVM's clients never set decode_responses, so every string in a reply is bytes; redis-py's sync
# stubs type each reply for either mode (``bytes | str``). These state the bytes case once for the
# reply shapes several modules read.

StreamEntry = tuple[bytes, dict[bytes, bytes]]
# An entry read through a consumer group: fields are None for a pending entry that was deleted (trimmed).
GroupEntry = tuple[bytes, dict[bytes, bytes] | None]


def group_reply(reply: object) -> list[tuple[bytes, list[GroupEntry]]]:
    """An XREADGROUP reply (RESP2): [(stream name, entries), ...]; empty when the read timed out."""
    return cast(list[tuple[bytes, list[GroupEntry]]], reply or [])


def hash_reply(reply: dict[bytes | str, bytes | str]) -> dict[bytes, bytes]:
    """An HGETALL reply: field -> value."""
    return cast(dict[bytes, bytes], reply)


def bulk_reply(reply: bytes | str | None) -> bytes | None:
    """A bulk-string reply (GET, HGET, LMOVE, ...): None when the key or field is missing."""
    return cast(bytes | None, reply)


def stream_entries(
    reply: list[tuple[bytes | str | None, dict[bytes | str, bytes | str] | None]] | None,
) -> list[StreamEntry]:
    """An XRANGE/XREVRANGE reply: (entry id, fields), in range order.

    Redis answers a range with a list (empty when nothing is in it), and every entry in
    a range exists, so neither the reply nor an entry's id or fields is ever nil.
    """
    return cast(list[StreamEntry], reply)

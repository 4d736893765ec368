"""Minute ids: unique, lexicographically sortable by creation time (ULID layout).

26 characters of Crockford base32: 48 bits of Unix milliseconds then 80 bits
that are random per millisecond and incremented within one, so ids made by one
process are strictly increasing and ids from different processes sort by time.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_RANDOM_BITS = 80
_RANDOM_MAX = (1 << _RANDOM_BITS) - 1

_lock = threading.Lock()
_last_ms = -1
_last_random = 0


def _encode(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_minute_id(now_ms: int | None = None) -> str:
    """Return a new unique, sortable minute id."""
    global _last_ms, _last_random
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    with _lock:
        if ms <= _last_ms:
            # Same (or a backwards-stepping) clock: stay on the last ms and count up,
            # so ids from this process never go backwards.
            ms = _last_ms
            rnd = _last_random + 1
            if rnd > _RANDOM_MAX:
                ms += 1
                rnd = int.from_bytes(os.urandom(10), "big") >> 1
        else:
            rnd = int.from_bytes(os.urandom(10), "big") >> 1
        _last_ms, _last_random = ms, rnd
    return _encode(ms, 10) + _encode(rnd, 16)


def keyed_minute_id(at_ms: int, key: str) -> str:
    """A ULID-shaped id for `at_ms` whose random part is derived from `key`: the same time and key give the same id.

    For generated data that must come out the same in every run (benchmarks): unique only as far as the keys are,
    and not increasing within a millisecond. Live minutes take `new_minute_id`.
    """
    if at_ms < 0:
        raise ValueError(f"at_ms must be Unix milliseconds >= 0, got {at_ms}")
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=10).digest()
    return _encode(at_ms, 10) + _encode(int.from_bytes(digest, "big") >> 1, 16)


def id_timestamp_ms(minute_id: str) -> int | None:
    """The creation time of a ULID-shaped id in Unix ms, or None for other id shapes."""
    if len(minute_id) != 26:
        return None
    value = 0
    for ch in minute_id[:10].upper():
        idx = _ALPHABET.find(ch)
        if idx < 0:
            return None
        value = value * 32 + idx
    return value


def derived_minute_id(ms: int, *parts: str) -> str:
    """The id of a minute PVM derives from others: the same inputs give the same id, every time, in any process.

    ULID layout like `new_minute_id`: 48 bits of `ms` (clamped to 0 .. 2**48-1), then
    80 bits of SHA-256 over the netstrings of `parts` (``<UTF-8 length>:<part>,``, so
    no two lists of parts share a name). A knowledge change the facts pool derives
    from a source minute takes that minute's time and names the minute ids, the
    change and the fact in `parts`: a retried job or a second run derives the same
    id, and the log, idempotent by id, keeps the minute once.
    """
    name = "".join(f"{len(p.encode('utf-8'))}:{p}," for p in parts).encode("utf-8")
    rnd = int.from_bytes(hashlib.sha256(name).digest()[:10], "big")
    return _encode(min(max(ms, 0), (1 << 48) - 1), 10) + _encode(rnd, 16)


class RequestIds:
    """The ids of one request's minutes, in order: given the caller's `first`, `first` and then ids derived from it
    under `kind` (`derived_minute_id`); without it, new ids. A retried request (the same `first`, the store
    unchanged) makes the same minutes with the same ids, and the log, idempotent by id, keeps each once."""

    def __init__(self, first: str | None, kind: str) -> None:
        self.first, self.kind, self.count = first, kind, 0

    def next(self) -> str:
        n, self.count = self.count, self.count + 1
        if self.first is None:
            return new_minute_id()
        if n == 0:
            return self.first
        return derived_minute_id(id_timestamp_ms(self.first) or 0, self.first, self.kind, str(n))

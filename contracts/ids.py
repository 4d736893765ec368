"""Minute ids: unique, lexicographically sortable by creation time (ULID layout).

26 characters of Crockford base32: 48 bits of Unix milliseconds then 80 bits
that are random per millisecond and incremented within one, so ids made by one
process are strictly increasing and ids from different processes sort by time.
"""

from __future__ import annotations

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

"""Dead letters for operators: read a page newest first, find entries by id, retry or drop them in batches.

Every read is bounded: a page reads at most `limit` entries per shard (XREVRANGE
... COUNT), ids are looked up one entry each (XRANGE key ID ID), and `--all`
walks a shard `defaults.DEAD_LETTER_PAGE` entries at a time. Nothing ever
reads a whole dead-letter stream at once, however long it has grown.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import redis

from contracts import keys
from pvm import defaults
from pvm.connection import StreamEntry, stream_entries

STREAM_ID = re.compile(r"^\d+(-\d+)?$")


@dataclass(frozen=True)
class DeadLetter:
    """One entry of a shard's dead-letter stream: why the dispatcher refused it, and its original bytes."""

    shard: int
    id: str
    reason: str
    raw: bytes
    entry_id: str  # the entry's id on the minutes stream it came from

    @classmethod
    def from_entry(cls, shard: int, entry: StreamEntry) -> DeadLetter:
        entry_id, fields = entry
        return cls(
            shard,
            entry_id.decode(),
            fields.get(b"reason", b"").decode(errors="replace"),
            fields.get(b"raw", b""),
            fields.get(b"entry_id", b"").decode(errors="replace"),
        )


def _order(letter: DeadLetter) -> tuple[int, int, int]:
    ms, _, seq = letter.id.partition("-")
    return int(ms), int(seq or 0), letter.shard


def page(connection: redis.Redis, shards: Sequence[int], limit: int, before: str | None = None) -> list[DeadLetter]:
    """The newest `limit` dead letters of these shards (older than `before` when given), newest first.

    Reads at most `limit` entries of each shard, in one round trip. Entries of
    different shards with the same id are kept together: a page that would end
    inside such a tie takes the rest of it, so the next page, `before` the last
    id shown, skips nothing.
    """
    pipe = connection.pipeline(transaction=False)
    for shard in shards:
        pipe.xrevrange(keys.dead_letter_stream(shard), max=f"({before}" if before else "+", min="-", count=limit)
    letters = [
        DeadLetter.from_entry(shard, entry)
        for shard, reply in zip(shards, pipe.execute(), strict=True)
        for entry in stream_entries(reply)
    ]
    letters.sort(key=_order, reverse=True)
    end = min(limit, len(letters))
    while 0 < end < len(letters) and letters[end].id == letters[end - 1].id:
        end += 1
    return letters[:end]


def find(connection: redis.Redis, shards: Sequence[int], ids: Sequence[str]) -> list[DeadLetter]:
    """The dead letters with these ids on these shards (one entry read per id and shard), in the order asked."""
    pipe = connection.pipeline(transaction=False)
    asked = [(shard, entry_id) for entry_id in ids for shard in shards]
    for shard, entry_id in asked:
        pipe.xrange(keys.dead_letter_stream(shard), min=entry_id, max=entry_id, count=1)
    return [
        DeadLetter.from_entry(shard, entry)
        for (shard, _), reply in zip(asked, pipe.execute(), strict=True)
        for entry in stream_entries(reply)
    ]


def batches(connection: redis.Redis, shards: Sequence[int], size: int = 0) -> Iterator[list[DeadLetter]]:
    """Every dead letter of these shards, oldest first, `size` (default `DEAD_LETTER_PAGE`) at a time.

    A caller may delete what a batch holds before asking for the next one.
    """
    size = size or defaults.DEAD_LETTER_PAGE
    for shard in shards:
        after = "-"
        while True:
            reply = connection.xrange(keys.dead_letter_stream(shard), min=after, max="+", count=size)
            batch = [DeadLetter.from_entry(shard, entry) for entry in stream_entries(reply)]
            if batch:
                yield batch
            if len(batch) < size:
                break
            after = f"({batch[-1].id}"


def retry(connection: redis.Redis, letters: Sequence[DeadLetter]) -> int:
    """Put dead letters back on their minutes streams and delete them, one MULTI/EXEC per shard; returns how many.

    The dispatcher validates each again like any new entry.
    """
    for shard, group in _by_shard(letters).items():
        with connection.pipeline(transaction=True) as pipe:
            for letter in group:
                pipe.xadd(keys.stream(shard), {keys.MINUTE_FIELD: letter.raw})
            pipe.xdel(keys.dead_letter_stream(shard), *(letter.id for letter in group))
            pipe.execute()
    return len(letters)


def drop(connection: redis.Redis, letters: Sequence[DeadLetter]) -> int:
    """Delete dead letters, one XDEL per shard; returns how many were deleted."""
    grouped = _by_shard(letters)
    if not grouped:
        return 0
    pipe = connection.pipeline(transaction=False)
    for shard, group in grouped.items():
        pipe.xdel(keys.dead_letter_stream(shard), *(letter.id for letter in group))
    return sum(int(n) for n in pipe.execute())


def _by_shard(letters: Sequence[DeadLetter]) -> dict[int, list[DeadLetter]]:
    """Letters grouped by shard: a shard's two streams share a hash tag, so one transaction may hold both."""
    grouped: dict[int, list[DeadLetter]] = {}
    for letter in letters:
        grouped.setdefault(letter.shard, []).append(letter)
    return grouped

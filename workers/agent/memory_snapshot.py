"""What a project's memory holds now, read from Redis: its stored facts, threads' chunks and episodes, version.

`read_snapshot` reads a `MemorySnapshot` in a few round trips (an HSCAN of the project's fact records, one of
the global tier's with the grant, the summary store's threads); `written_before` asks the log's minute cache
whether a retried write's minute is in already. A snapshot's version (`MemorySnapshot.last_ms`, the newest
change it holds) is what an export hands out and an import checks (`is_export_version`,
`check_export_version`). Redis reads only: no writes, no file system.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeGuard, cast

import msgpack
import redis

from contracts import keys
from contracts.facts import GLOBAL_KEY, Fact, TierKey
from contracts.summaries import Chunk, Episode
from pvm.stores.fact_projection import StoredFact, last_change_ms
from pvm.stores.summaries import SummaryStore
from workers.agent.memory_errors import MemoryFileError
from workers.agent.memory_front_matter import fact_front, render
from workers.agent.memory_paths import GLOBAL_TIER


class FactRecord:
    """A stored fact as the memory reads it: its record (`Fact.to_dict` form, what a file shows) and its version
    (`last_change_ms`); the validated `Fact` is built only when a change needs it."""

    __slots__ = ("_fact", "last_ms", "raw")

    def __init__(self, raw: dict[str, Any], last_ms: int, fact: Fact | None = None) -> None:
        self.raw, self.last_ms, self._fact = raw, last_ms, fact

    @classmethod
    def unpack(cls, packed: bytes) -> FactRecord:
        """From the facts store's record bytes (`StoredFact.pack`)."""
        record = msgpack.unpackb(packed, raw=False)
        return cls(record["fact"], last_change_ms(record["created"], record["v"]))

    @classmethod
    def of(cls, stored: StoredFact) -> FactRecord:
        return cls(stored.fact.to_dict(), stored.last_ms, stored.fact)

    @property
    def id(self) -> str:
        return str(self.raw["id"])

    @property
    def fact(self) -> Fact:
        if self._fact is None:
            self._fact = Fact.from_dict(self.raw)
        return self._fact

    def render(self) -> str:
        return render(fact_front(self.raw, self.last_ms), self.raw["text"])


@dataclass(frozen=True)
class MemorySnapshot:
    """What one project's memory holds now: its task and project facts (stored records), the global tier's when
    read with the grant (`include_global`), and its threads' records."""

    project_id: str
    records: dict[str, FactRecord]
    chunks: tuple[Chunk, ...] = ()
    episodes: tuple[Episode, ...] = ()
    include_global: bool = False

    @property
    def last_ms(self) -> int:
        return max((s.last_ms for s in self.records.values()), default=0)


def read_snapshot(connection: redis.Redis, project_id: str, *, include_global: bool = False) -> MemorySnapshot:
    """The project's stored facts (one HSCAN of its records hash), with `include_global` the global tier's too
    (one HSCAN of its hash: the caller holds the global grant), and every thread's chunks and episodes."""
    anchor = TierKey.for_project(project_id)
    own = (f"project:{project_id}", f"task:{project_id}:")
    records: dict[str, FactRecord] = {}
    for _, packed in connection.hscan_iter(keys.facts_by_id(anchor), count=1000):
        record = FactRecord.unpack(cast(bytes, packed))
        tier_key = str(record.raw["tier_key"])
        if tier_key == own[0] or tier_key.startswith(own[1]):
            records[record.id] = record
    if include_global:
        for _, packed in connection.hscan_iter(keys.facts_by_id(GLOBAL_KEY), count=1000):
            record = FactRecord.unpack(cast(bytes, packed))
            if record.raw["tier_key"] == GLOBAL_TIER:
                records[record.id] = record
    threads = SummaryStore(connection)
    chunks: list[Chunk] = []
    episodes: list[Episode] = []
    for thread in threads.threads(project_id):
        view = threads.thread_view(project_id, thread, 0)
        chunks.extend(view.chunks)
        episodes.extend(view.episodes)
    return MemorySnapshot(project_id, records, tuple(chunks), tuple(episodes), include_global)


def written_before(connection: redis.Redis, project_id: str, minute_id: str) -> bool:
    """Whether the project's log holds `minute_id` (its minute cache, which the log pool fills as it makes minutes
    durable): a retried write whose first try was written, and perhaps applied, already."""
    return bool(connection.hexists(keys.minute_by_id(project_id), minute_id))


def is_export_version(value: object) -> TypeGuard[int]:
    """Whether `value` can be an export's version: a whole number of Unix ms, not negative (and not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_export_version(given: Any, name: str) -> int:
    """`given` as an export's version (None: 0, no export known), else `MemoryFileError` naming `name`."""
    if given is None:
        return 0
    if not is_export_version(given):
        raise MemoryFileError(f"{name} {str(given)[:40]!r} must be the whole number the export gave (Unix ms)")
    return given

"""A run's candidate index: the kept memories of the pages a run has judged, filed by bucket, for dedupe across pages.

An evaluation run judges a project a page at a time (`PVM_EVALUATE_SLICE`).
Near-duplicates on one page are found by the page itself; to find one on
another page, every memory a page keeps is filed here under its buckets
(`workers.evaluate.evaluation.minute_buckets`, `fact_buckets`: exact for the dedupe
rules, so a twin anywhere in the tier key shares a bucket), with the record
its writer needs should a later page absorb it (scores, tokens, what it
absorbed). A page reads only its own memories' buckets and the records they
name: at most `DEDUPE_BUCKET_CAP` ids a bucket, so a page's work stays bounded
whatever the project's size.

It lives in the run's scratch (`keys.evaluation_scratch`: ``buckets`` and
``records``), deleted when the run ends: nothing to keep in step when a memory
is pruned, merged or restored by `pvm replay`, and a change of
`PVM_DEDUPE_AT` applies from the next run. Without a connection it is held in
memory (the benchmark's judging core).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast

import msgpack
import redis

from pvm import defaults

Item = TypeVar("Item")


class CandidateIndex:
    """Bucket -> ids of kept memories, id -> record; in the run's scratch hashes, or in memory without a connection."""

    def __init__(
        self,
        connection: redis.Redis | None = None,
        buckets_key: str = "",
        records_key: str = "",
        cap: int = defaults.DEDUPE_BUCKET_CAP,
    ) -> None:
        self.connection = connection
        self.buckets_key, self.records_key = buckets_key, records_key
        self.cap = cap
        self._buckets: dict[str, list[str]] = {}  # in memory; or, with a connection, the buckets read last
        self._records: dict[str, dict[str, Any]] = {}
        self._parsed: dict[str, Any] = {}  # id -> its record as the dedupe rules read it (`lookup`'s `parse`)

    def keys(self) -> list[str]:
        return [self.buckets_key, self.records_key]

    def lookup(
        self, wanted: Mapping[str, Sequence[str]], parse: Callable[[str, dict[str, Any]], Item]
    ) -> tuple[dict[str, set[str]], dict[str, dict[str, Any]], dict[str, Item]]:
        """For memory id -> its buckets: (memory id -> candidate ids, candidate id -> record, and -> `parse`d).

        Dropped ids are left out. Parsed items are kept for the index's life (one slice job, or a whole run
        in memory): a record's parsed fields never change while it is filed.
        """
        names = sorted({b for buckets in wanted.values() for b in buckets})
        if self.connection is not None:
            raws = cast(list[bytes | None], self.connection.hmget(self.buckets_key, names)) if names else []
            self._buckets = {n: _unpack_list(raw) for n, raw in zip(names, raws, strict=True) if raw is not None}
        buckets = self._buckets
        by_memory: dict[str, set[str]] = {}
        every: set[str] = set()
        for memory_id, names_of in wanted.items():
            found: set[str] = set()
            for name in names_of:
                ids = buckets.get(name)
                if ids:
                    found.update(ids)
            if found:
                by_memory[memory_id] = found
                every |= found
        records = self.records(sorted(every))
        items: dict[str, Item] = {}
        for memory_id, record in records.items():
            item = self._parsed.get(memory_id)
            if item is None:
                item = self._parsed[memory_id] = parse(memory_id, record)
            items[memory_id] = item
        return by_memory, records, items

    def records(self, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        if self.connection is None:
            return {i: self._records[i] for i in ids if i in self._records}
        raws = cast(list[bytes | None], self.connection.hmget(self.records_key, list(ids))) if ids else []
        return {i: _unpack(raw) for i, raw in zip(ids, raws, strict=True) if raw is not None}

    def file(
        self,
        entries: Iterable[tuple[str, Sequence[str], Mapping[str, Any]]],
        updated: Mapping[str, Mapping[str, Any]] | None = None,
        dropped: Iterable[str] = (),
    ) -> None:
        """File kept memories (id, buckets, record), replace the records of `updated`, drop the ids absorbed.

        With a connection, the buckets changed must be the ones the last `lookup` read (a page looks its own
        memories up, then files them): one run at a time writes them (the run's lease).
        """
        gone = set(dropped)
        changed: set[str] = set()
        records: dict[str, Mapping[str, Any]] = dict(updated or {})
        for memory_id in gone:
            self._parsed.pop(memory_id, None)
        for memory_id, buckets, record in entries:
            records[memory_id] = record
            for name in buckets:
                ids = self._buckets.setdefault(name, [])
                ids.append(memory_id)
                if len(ids) > self.cap:
                    if gone:  # absorbed ids leave a full bucket before live ones (lookups skip them anyway)
                        ids[:] = [i for i in ids if i not in gone]
                    del ids[: len(ids) - self.cap]  # then the oldest filed
                changed.add(name)
        if self.connection is None:
            self._records.update(records)  # type: ignore[arg-type]
            for memory_id in gone:
                self._records.pop(memory_id, None)
            return
        pipe = self.connection.pipeline(transaction=False)
        if changed:
            pipe.hset(self.buckets_key, mapping={n: _pack(self._buckets[n]) for n in sorted(changed)})
        if records:
            pipe.hset(self.records_key, mapping={i: _pack(r) for i, r in records.items()})
        if gone:
            pipe.hdel(self.records_key, *sorted(gone))
        for name in self.keys():
            pipe.expire(name, defaults.EVALUATE_LOCK_S)
        pipe.execute()


def _pack(value: object) -> bytes:
    return cast(bytes, msgpack.packb(value, use_bin_type=True, default=_plain))


def _plain(value: object) -> object:
    """A record's word sets, as msgpack packs them: sorted lists."""
    if isinstance(value, frozenset | set):
        return sorted(value)
    raise TypeError(f"a candidate record holds a {type(value).__name__}")


def _unpack(raw: bytes) -> dict[str, Any]:
    return cast(dict[str, Any], msgpack.unpackb(raw, raw=False))


def _unpack_list(raw: bytes) -> list[str]:
    return cast(list[str], msgpack.unpackb(raw, raw=False))

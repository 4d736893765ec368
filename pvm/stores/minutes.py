"""Whole durable minutes by id: the Redis minute cache first, the log for the rest (`pvm.protocols.MinuteSource`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from contracts.codec import decode_durable_fields
from pvm.stores.cache import MinuteCache
from pvm.stores.log import LogReader


class DurableMinutes:
    """Reads minutes by id where the log pool made them durable: one HMGET of the cache, the log for what it lacks.

    Search hits read their minute here (minute points do not carry it):
    the cache holds the newest `PVM_MINUTE_CACHE_SIZE` of each project, the
    log every minute. `decode` turns the cached bytes into the minute's fields
    (`decode_durable_fields`, or a reader's memo of it).
    """

    def __init__(
        self,
        cache: MinuteCache,
        log: LogReader,
        decode: Callable[[bytes], dict[str, Any]] = decode_durable_fields,
    ) -> None:
        self.cache = cache
        self.log = log
        self._decode = decode

    def minutes_by_id(self, project_id: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The minutes of the project with these ids (`Minute.to_dict` fields); ids found nowhere are absent."""
        return self.found(project_id, ids, self.cache.get_many(project_id, list(ids)))

    def found(self, project_id: str, ids: Sequence[str], cached: dict[str, bytes]) -> dict[str, dict[str, Any]]:
        """`minutes_by_id` given the cached bytes already read for the ids (a reader reads them with other keys)."""
        out = {i: self._decode(b) for i, b in cached.items()}
        missing = [i for i in ids if i not in out]
        if missing:
            for minute_id, record in self.log.get_by_ids(project_id, missing).items():
                out[minute_id] = record.fields
        return out

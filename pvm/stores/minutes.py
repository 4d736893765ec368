"""Whole durable minutes by id: the Redis minute cache first, the log for the rest (`pvm.protocols.MinuteSource`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from contracts import keys
from contracts.codec import decode_durable_fields
from pvm.stores.cache import MinuteCache
from pvm.stores.log import LogReader
from pvm.wire import Sent


class DurableMinutes:
    """Reads minutes by id where the log pool made them durable: the log for those its reader has indexed, one
    HMGET of the cache for the rest, and the log, looked at again, for what the cache lacks.

    Search hits read their minute here (minute points do not carry it):
    the cache holds the newest `PVM_MINUTE_CACHE_SIZE` of each project, the
    log every minute. A minute the `LogReader` has indexed is a read of a
    local file at a known offset (~10 µs), where asking the cache is a
    round trip (0.1 to 0.2 ms on the 2-core host), and a large project's winners
    are mostly older than the cache holds: so the log goes first for what it
    knows, and the cache answers for the minutes written since the reader
    last looked (a reader without the log reads them all from the cache).
    `decode` turns the cached bytes into the minute's fields
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
        out = self.logged(project_id, ids)
        rest = [i for i in ids if i not in out]
        if rest:
            out.update(self.from_cache(project_id, rest))
        return out

    def from_cache(self, project_id: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The minutes of these ids from the cache's HMGET, and from the log (looked at again) for what it lacks."""
        return self.found(project_id, ids, self.cache.get_many(project_id, list(ids)))

    def logged(self, project_id: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The minutes of these ids that the log's reader has indexed already, read from the log."""
        return {i: record.fields for i, record in self.log.get_by_ids(project_id, ids, refresh=False).items()}

    def ask(self, project_id: str, ids: Sequence[str]) -> Asked:
        """`minutes_by_id` in two steps: the cache's HMGET is sent now and its reply read by `Asked.read`, so Redis
        answers while the caller works (search reads its winners' points meanwhile)."""
        return Asked(self, project_id, ids)

    def found(self, project_id: str, ids: Sequence[str], cached: dict[str, bytes]) -> dict[str, dict[str, Any]]:
        """`minutes_by_id` given the cached bytes already read for the ids (a reader reads them with other keys)."""
        out = {i: self._decode(b) for i, b in cached.items()}
        missing = [i for i in ids if i not in out]
        if missing:
            for minute_id, record in self.log.get_by_ids(project_id, missing).items():
                out[minute_id] = record.fields
        return out


class Asked:
    """Minutes asked of `DurableMinutes`: those the log's reader has indexed read at once, the cache's HMGET sent for
    the rest (`pvm.wire.Sent`), its reply read by `read`.

    Where nothing could be sent, the connection was lost in between, or the cache answered an error, `read` reads
    the rest the plain way (an error raises there). `drop` closes the connection holding the reply.
    """

    def __init__(self, source: DurableMinutes, project_id: str, ids: Sequence[str]) -> None:
        self._source = source
        self.project_id = project_id
        self.ids = list(ids)
        self._logged = source.logged(project_id, self.ids) if self.ids else {}
        self._asked = [i for i in self.ids if i not in self._logged]  # of the cache
        command = ("HMGET", keys.minute_by_id(project_id), *self._asked)
        self._sent: Sent | None = Sent(source.cache.connection, [command]) if self._asked else None
        self._unread = True

    def read(self, ids: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """The minutes of `ids` (every id asked, by default), as `DurableMinutes.minutes_by_id` gives them. Once: a
        second read, or one naming an id not asked, reads the plain way."""
        wanted = self.ids if ids is None else list(ids)
        sent, self._sent = self._sent, None
        replies = sent.replies() if sent is not None else None  # taken off the connection, wanted or not
        unread, self._unread = self._unread, False
        if not unread or not set(self.ids) >= set(wanted):
            return self._source.minutes_by_id(self.project_id, wanted)
        out = {i: self._logged[i] for i in wanted if i in self._logged}
        rest = [i for i in wanted if i not in out]
        if not rest:
            return out
        if not (replies and isinstance(replies[0], list)):
            out.update(self._source.from_cache(self.project_id, rest))  # the plain way
            return out
        answered = dict(zip(self._asked, replies[0], strict=True))
        cached = {i: answered[i] for i in rest if answered[i] is not None}
        out.update(self._source.found(self.project_id, rest, cached))
        return out

    def drop(self) -> None:
        """Leave the reply unread: its connection is closed."""
        sent, self._sent = self._sent, None
        if sent is not None:
            sent.drop()

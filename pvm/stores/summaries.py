"""The summarize pool's store in Redis: each thread's chunks, episodes and newest minutes (`contracts.keys`, summarize).

Per thread (named by `ThreadRef.digest`; all keys carry the project's tag): a state hash (`keys.thread_state`)
with ``chunks`` and ``episodes`` as msgpack lists of their records' dicts, the open episode patterns
(``open``, the pool's) and its counters; a sorted set of the minute ids not in a chunk yet, by log seq
(`keys.thread_pending`), with their bytes (`keys.thread_bodies`): the thread's newest minutes, which a
reader shows verbatim. The summarize pool writes all of it; readers read one thread in one script call
(`THREAD_READ`), which `pvm.reader` runs in its own round trip with the rest of a context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import redis

from contracts import decode_durable_fields, keys
from contracts.summaries import Chunk, Episode, SummaryError, ThreadRef

# KEYS: thread state, pending, bodies; ARGV[1]: how many of the newest minutes. Returns {the state's chunks,
# episodes, minutes and chunked_seq fields, the newest minutes' bytes oldest first (nil when missing)}.
THREAD_READ = """
local n = tonumber(ARGV[1])
local ids = {}
if n > 0 then ids = redis.call('ZRANGE', KEYS[2], -n, -1) end
local bodies = {}
if #ids > 0 then bodies = redis.call('HMGET', KEYS[3], unpack(ids)) end
return {redis.call('HMGET', KEYS[1], 'chunks', 'episodes', 'minutes', 'chunked_seq'), bodies}
"""


def thread_keys(project_id: str, thread: ThreadRef) -> list[str]:
    """The keys `THREAD_READ` takes for one thread."""
    digest = thread.digest
    return [
        keys.thread_state(project_id, digest),
        keys.thread_pending(project_id, digest),
        keys.thread_bodies(project_id, digest),
    ]


def encode_records(records: Sequence[Chunk | Episode]) -> bytes:
    return msgpack.packb([r.to_dict() for r in records], use_bin_type=True)  # type: ignore[no-any-return]


def decode_chunks(raw: bytes | None) -> list[Chunk]:
    return [Chunk.from_dict(d) for d in _unpacked(raw)]


def decode_episodes(raw: bytes | None) -> list[Episode]:
    return [Episode.from_dict(d) for d in _unpacked(raw)]


def _length(raw: bytes | None) -> int:
    """How many records a msgpack list holds, from its header alone (0 for none or not a list)."""
    if not raw:
        return 0
    unpacker = msgpack.Unpacker()
    unpacker.feed(raw)
    try:
        return int(unpacker.read_array_header())
    except (msgpack.UnpackException, ValueError):
        return 0


def _unpacked(raw: bytes | None) -> list[Any]:
    if not raw:
        return []
    value = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    return value if isinstance(value, list) else []


@dataclass(frozen=True, slots=True)
class ThreadView:
    """What a reader sees of one thread: its newest minutes (oldest first), its chunks and episodes (in log order)."""

    project_id: str
    thread: ThreadRef
    recent: tuple[dict[str, Any], ...]
    chunks: tuple[Chunk, ...]
    episodes: tuple[Episode, ...]
    minutes: int  # minutes of the thread the pool has read as final
    chunked_seq: int

    @property
    def exists(self) -> bool:
        return bool(self.recent or self.chunks or self.episodes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "project_id": self.project_id,
            "thread": str(self.thread),
            "minutes": self.minutes,
            "chunked_seq": self.chunked_seq,
            "recent": list(self.recent),
            "chunks": [c.to_dict() for c in self.chunks],
            "episodes": [e.to_dict() for e in self.episodes],
        }


def parse_thread_read(project_id: str, thread: ThreadRef, reply: Sequence[Any]) -> ThreadView:
    """A `ThreadView` from `THREAD_READ`'s reply; a record that no longer validates is skipped, not raised."""
    (chunks_raw, episodes_raw, minutes, chunked_seq), bodies = reply
    try:
        chunks = decode_chunks(chunks_raw)
    except (SummaryError, ValueError, TypeError, KeyError):
        chunks = []
    try:
        episodes = decode_episodes(episodes_raw)
    except (SummaryError, ValueError, TypeError, KeyError):
        episodes = []
    recent = tuple(decode_durable_fields(b) for b in bodies if b is not None)
    return ThreadView(
        project_id=project_id,
        thread=thread,
        recent=recent,
        chunks=tuple(chunks),
        episodes=tuple(episodes),
        minutes=int(minutes or 0),
        chunked_seq=int(chunked_seq or 0),
    )


class SummaryStore:
    """Reads threads for readers, the API and the CLI; forgets a project's for replay."""

    def __init__(self, connection: redis.Redis) -> None:
        self.connection = connection
        self._read = connection.register_script(THREAD_READ)

    def thread_view(self, project_id: str, thread: ThreadRef, recent: int) -> ThreadView:
        """One thread: its `recent` newest minutes, chunks and episodes, in one round trip."""
        reply = self._read(keys=thread_keys(project_id, thread), args=[max(0, recent)])
        return parse_thread_read(project_id, thread, reply)

    def threads(self, project_id: str) -> list[ThreadRef]:
        """Every thread of a project the pool has seen, by name."""
        names = self.connection.hvals(keys.summary_threads(project_id))
        out = []
        for raw in names:
            try:
                out.append(ThreadRef.parse(raw.decode() if isinstance(raw, bytes) else raw))
            except SummaryError:
                continue
        return sorted(out, key=str)

    def counts(self, project_id: str) -> tuple[int, int]:
        """(chunks, episodes) of every thread of a project: two round trips, record lists not decoded (their
        msgpack array headers say how long they are)."""
        digests = [
            d.decode() if isinstance(d, bytes) else d for d in self.connection.hkeys(keys.summary_threads(project_id))
        ]
        if not digests:
            return 0, 0
        pipe = self.connection.pipeline(transaction=False)
        for digest in digests:
            pipe.hmget(keys.thread_state(project_id, digest), "chunks", "episodes")
        chunks = episodes = 0
        for raw_chunks, raw_episodes in pipe.execute():
            chunks += _length(raw_chunks)
            episodes += _length(raw_episodes)
        return chunks, episodes

    def reset_project(self, project_id: str) -> int:
        """Delete every summarize key of a project (its threads, head and bookkeeping); how many keys went."""
        doomed = list(self.connection.scan_iter(match=f"{keys.PREFIX}:{{p:{project_id}}}:summ:*", count=1000))
        for start in range(0, len(doomed), 500):
            self.connection.delete(*doomed[start : start + 500])
        return len(doomed)

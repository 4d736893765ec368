"""The minutes PVM writes itself, onto the shard streams as `emit` puts an agent's: the one rule for their XADD.

Knowledge changes are minutes (a fact the facts pool decided, a summary a model wrote, an edit of the Markdown
memory, a fact changed through the API): each goes onto its project's shard stream, the dispatcher hands it
to the log like any other minute, and replay finds it there. `write_minutes` is that write; `add_minutes`
queues the same XADDs on a caller's pipeline, for a writer that must send something else in the same round
trip first (the facts pool records its decisions before their minutes).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import redis

from contracts import Minute, encode_minute, keys
from pvm import defaults


def stream_for(project_id: str, shards: int) -> str:
    """The shard stream a project's minutes go to (`keys.shard_of`, as the emitter picks it)."""
    return keys.stream(keys.shard_of(project_id, shards))


def add_minutes(pipe: Any, shards: int, encoded: Iterable[tuple[str, bytes]]) -> None:
    """Queue the XADD of each ``(project_id, encoded minute)`` to its shard stream on `pipe` (a redis pipeline)."""
    for project_id, data in encoded:
        pipe.xadd(stream_for(project_id, shards), {keys.MINUTE_FIELD: data})


def write_minutes(
    connection: redis.Redis, shards: int, minutes: Sequence[Minute], chunk: int = defaults.MEMORY_WRITE_CHUNK
) -> list[str]:
    """XADD `minutes` to their projects' shard streams, `chunk` per MULTI/EXEC (all of a chunk or none of it).

    Returns the stream entry ids, in the order of `minutes`.
    """
    ids: list[str] = []
    for start in range(0, len(minutes), chunk):
        with connection.pipeline(transaction=True) as pipe:
            add_minutes(pipe, shards, ((m.project_id, encode_minute(m)) for m in minutes[start : start + chunk]))
            ids.extend(e.decode() if isinstance(e, bytes) else str(e) for e in pipe.execute())
    return ids

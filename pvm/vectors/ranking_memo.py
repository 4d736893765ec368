"""Ranking payloads kept by the embedded engine until a write could change them (`EdgeEngine.query`).

A search's candidate query returns each point with the fields ranking reads
(`RANKING_FIELDS`: its minute id, time, thread and scores). qdrant-edge converts
a payload field by field (a few µs a point), and at 75 candidates that was about
two thirds of the engine's query and a sixth of a context at 100k minutes. A
project's candidates recur from search to search (the points that say the
project's common words), so the engine asks for ids and scores alone and reads
the payloads of the points it has not kept, by id, in one call.

`EdgeEngine` is the only writer of its shards (it holds the directory's lock),
so it knows every write, and this never serves a payload older than the point:

- an upsert or a payload update drops the points written;
- a project deleted or its shard set aside drops the project;
- a read is kept only if no write to its project landed while it ran: each
  write bumps the project's generation, and payloads read at an older one are
  used for that search and not kept;
- an upsert keeps the ranking payloads of the points it wrote, as written
  (`keep_written`): a search finds new minutes most, and reading them back
  point by point was most of what a search paid for its candidates' payloads.
  Writers hold `writes` across their write and its bookkeeping, so the memo
  sees the points' writes in the order the shards did.

Points are kept by their id's integer (a UUID's `int`): a UUID hashes and compares
in Python (`uuid.UUID.__hash__`, `__eq__`), and looking up ~80 candidates in a
memo of ~100k by (project, UUID) was 6% of a context at 100k minutes (py-spy);
by (project, int) the lookups run in C, and the keys hold no object the garbage
collector walks.

At most `RANKING_PAYLOADS_KEPT` points are kept (~0.9 KB each with their
payloads: ~90 MB), least recently used dropped first. The hot window's
generations (`pvm.vectors.hot`) share their archive's memo: they hold copies
of the same points, and a write to any of them drops the point for all. The payloads are shared
by every search that finds the point: read them, never write them (as the
thread reads' candidates, `pvm.vectors.thread_reads`).
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

RANKING_PAYLOADS_KEPT = 100_000
_UUID = uuid.UUID


def _key(point_id: Any) -> Any:
    """A point id as the memo keeps it: a UUID's integer, any other id as it is."""
    return point_id.int if type(point_id) is _UUID else point_id


class RankingMemo:
    """Ranking payloads of one engine's points by (project, point id); see the module docstring. Thread-safe."""

    def __init__(self, kept: int = RANKING_PAYLOADS_KEPT) -> None:
        self._kept = max(0, kept)
        self._lock = threading.Lock()
        self._payloads: OrderedDict[tuple[str, Any], dict[str, Any]] = OrderedDict()  # by (project, `_key`)
        self._generation: dict[str, int] = {}  # project -> writes seen
        # Held by every writer of the shards sharing this memo across a write and its `written` / `keep_written`.
        self.writes = threading.RLock()
        self.hits = 0  # points asked for that were kept, since the memo was made
        self.misses = 0  # ... and that were not (read from the shard)

    def __len__(self) -> int:
        return len(self._payloads)

    def generation(self, project_id: str) -> int:
        """Take before a read; pass to `keep` after it."""
        with self._lock:
            return self._generation.get(project_id, 0)

    def get(self, project_id: str, point_ids: Iterable[Any]) -> dict[Any, dict[str, Any]]:
        """The kept payloads of these points, by point id (the others absent), now the most recently used."""
        return self.lookup(project_id, point_ids)[0]

    def lookup(self, project_id: str, point_ids: Iterable[Any]) -> tuple[dict[Any, dict[str, Any]], list[Any]]:
        """`get`, and the points that were not kept (each once, in the order asked)."""
        out: dict[Any, dict[str, Any]] = {}
        missing: list[Any] = []
        with self._lock:
            payloads = self._payloads
            for pid in point_ids:
                key = (project_id, _key(pid))
                payload = payloads.get(key)
                if payload is not None:
                    payloads.move_to_end(key)
                    out[pid] = payload
                else:
                    missing.append(pid)
            if len(missing) > 1:
                missing = list(dict.fromkeys(missing))  # a point both legs found
            self.hits += len(out)
            self.misses += len(missing)
        return out, missing

    def keep(self, project_id: str, generation: int, payloads: Mapping[Any, dict[str, Any]]) -> None:
        """Keep these payloads (by point id), read at `generation`: not when a write has landed since."""
        if not self._kept or not payloads:
            return
        with self._lock:
            if self._generation.get(project_id, 0) != generation:
                return
            for pid, payload in payloads.items():
                self._payloads[(project_id, _key(pid))] = payload
            while len(self._payloads) > self._kept:
                self._payloads.popitem(last=False)

    def keep_written(self, project_id: str, payloads: Mapping[Any, dict[str, Any]]) -> None:
        """Keep the ranking payloads of points just written (by point id), as written. The caller holds `writes`
        across the write and this call, and the write has called `written`."""
        if not self._kept or not payloads:
            return
        with self._lock:
            for pid, payload in payloads.items():
                key = (project_id, _key(pid))
                self._payloads[key] = payload
                self._payloads.move_to_end(key)
            while len(self._payloads) > self._kept:
                self._payloads.popitem(last=False)

    def written(self, project_id: str, point_ids: Iterable[Any]) -> None:
        """These points of the project were written (upserted or their payload set): drop them."""
        with self._lock:
            self._generation[project_id] = self._generation.get(project_id, 0) + 1
            for pid in point_ids:
                self._payloads.pop((project_id, _key(pid)), None)

    def forget(self, project_id: str) -> None:
        """Drop every point of the project (deleted, or its shard set aside)."""
        with self._lock:
            self._generation[project_id] = self._generation.get(project_id, 0) + 1
            for key in [key for key in self._payloads if key[0] == project_id]:
                del self._payloads[key]

"""The hot window: the newest minutes of a large project again, so that its search looks at a bounded set.

A sparse (lexical) search costs what the posting lists of the query's words
hold, and those grow with the project: at a million generated minutes the
engine's own query took 2.1 ms at the median and 6.5 ms at p99, against 0.64
and 0.94 ms on a shard of 28k points (`docs/performance.md`, "The hot
window"). A range filter on the time does not help: the engine still walks
the whole lists, checking each point against the filter (5.4 to 7.6 ms).

So `EdgeEngine` writes each minute point twice: to the project's shard (the
archive: every minute, what everything else reads) and to the hot window (the
same built point: qdrant-edge converted its payload once, and the copy costs
only the engine's insert). The window is two generations, each
a directory of shards (``<path>/.hot/0`` and ``.../1``); writes go to the
current one, and when it holds `minutes` points the other, older one is
dropped whole (a directory removal: nothing to vacuum) and becomes the
current. The window so holds the newest `minutes` to twice `minutes` minutes
of each project, and a query costs two searches of at most that.

A lexical-only candidate query (`EdgeEngine.query` without a dense vector,
facts or whole payloads, and with no upper time bound: the reader's and the
API's search) of a project whose archive holds minutes the window does not is
answered from the window when the window finds `limit` candidates; when it
finds fewer ("short"), from the archive, as before. A project smaller than
that never dropped a generation: its searches read the archive and answer
exactly as without the window. What the window changes for a large project is
that an older minute that matches better than the window's `limit`th is not
seen unless the window runs short; each generation's IDF is its own points'.

The window is derived: a failed write drops the project's window (the archive
answers until it has grown again), `delete_project` drops it, and nothing in
it is needed to rebuild anything.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contracts.memory import SearchFilters
from pvm.vectors import Hit, cut_leg

if TYPE_CHECKING:
    import qdrant_edge as qe

    from pvm.vectors.edge import EdgeEngine

log = logging.getLogger(__name__)

HOT_DIRECTORY = ".hot"  # under the engine's path; a name no project can have
GENERATIONS = 2
# The payload fields a generation indexes: what every search filters on. Indexing every filtered field, as the
# archive does, made each minute's second insert cost as much as the first (index 6,866 -> 4,291 minutes/s);
# with these three, 6,234/s. A search filtering on another field reads it from each candidate's payload.
HOT_INDEXED = ("project_id", "kind", "timestamp_ms")


@dataclass
class _Window:
    """One project's window: points written to each generation, which one is being written, and whether search
    reads it (`active`: it holds at least `minutes` of the newest and the archive holds minutes it does not;
    `checked`: that was looked at once it held `minutes`)."""

    counts: list[int]
    current: int
    active: bool = False
    checked: bool = False


class HotWindow:
    """The newest `minutes` to twice `minutes` minute points of each project, in `generations` (two engines).

    `archive_count(project)` is how many minutes the archive holds. Thread-safe: the writes and searches of the
    generations run outside the window's lock, which guards only its counts."""

    def __init__(self, generations: Sequence[EdgeEngine], minutes: int, archive_count: Callable[[str], int]) -> None:
        if len(generations) != GENERATIONS:
            raise ValueError(f"a hot window has {GENERATIONS} generations, got {len(generations)}")
        if minutes < 1:
            raise ValueError(f"a hot window holds at least 1 minute, got {minutes}")
        self.generations = list(generations)
        self.minutes = minutes
        self._archive_count = archive_count
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def write(self, project_id: str, points: Sequence[qe.Point]) -> None:
        """Add the points of minutes just written to the archive; rotate when the current generation is full.

        A write that fails drops the project's window (logged): the archive answers until the window holds
        `minutes` again, never a window missing minutes."""
        if not points:
            return
        try:
            with self._lock:
                target = self._window(project_id).current
            self.generations[target].write_points(project_id, points)
            with self._lock:
                window = self._windows.get(project_id)
                if window is None or window.current != target:
                    return  # dropped or rotated meanwhile: the next write counts again
                window.counts[target] += len(points)
                if not window.checked and sum(window.counts) >= self.minutes:
                    window.checked = True
                    window.active = self._archive_count(project_id) > sum(window.counts)
                if window.counts[target] >= self.minutes:
                    self._rotate(project_id, window)
        except Exception as exc:  # derived data: never fail the archive's write for it
            log.warning("hot window of %s dropped after a failed write (%s): search reads the archive", project_id, exc)
            self.drop(project_id)

    def annotate(self, project_id: str, updates: Sequence[tuple[Any, dict[str, Any]]]) -> None:
        """Set on the window's copies the payload fields an annotation set on the archive's points."""
        if not updates:
            return
        try:
            for generation in self.generations:
                generation.set_payloads(project_id, updates)
        except Exception as exc:
            log.warning("hot window of %s dropped after a failed annotation (%s)", project_id, exc)
            self.drop(project_id)

    def lexical(self, project_id: str, text: str, filters: SearchFilters, limit: int) -> list[Hit] | None:
        """The project's best `limit` lexical hits in the window (ranking payloads, total order), or None when the
        archive must answer: the window is not `active` for the project, or it holds fewer than `limit` hits."""
        try:
            with self._lock:
                if not self._window(project_id).active:
                    return None
            # Ids and scores from each generation, the best `limit` of both, then the ranking payloads of those
            # alone: converting payloads is most of what a leg costs in Python.
            found: dict[str, int] = {}  # point id -> its generation
            hits: list[Hit] = []
            for g, generation in enumerate(self.generations):
                for hit in generation.lexical_hits(project_id, text, filters, limit):
                    found[str(hit[0])] = g
                    hits.append(hit)
            if len(hits) < limit:
                return None
            kept = cut_leg(hits, limit)
            payloads: dict[str, dict[str, Any]] = {}
            for g, generation in enumerate(self.generations):
                ids = [pid for pid, _, _ in kept if found[str(pid)] == g]
                if ids:
                    payloads.update(generation.ranking_payloads(project_id, ids))
        except Exception as exc:  # a generation that does not load: the archive answers, the window regrows
            log.warning("hot window of %s dropped after a failed search (%s): the archive answers", project_id, exc)
            self.drop(project_id)
            return None
        return [(pid, score, payloads.get(str(pid))) for pid, score, _ in kept]

    def drop(self, project_id: str) -> None:
        """Remove the project's window (its project was deleted, or is being rebuilt)."""
        with self._lock:
            self._drop(project_id)

    def optimize(self, project_id: str | None = None) -> None:
        for generation in self.generations:
            projects = generation.tenants() if project_id is None else [project_id]
            for project in projects:
                generation.optimize(project)

    def close(self) -> None:
        for generation in self.generations:
            generation.close()

    def _window(self, project_id: str) -> _Window:
        window = self._windows.get(project_id)
        if window is None:
            counts = [generation.count(project_id) for generation in self.generations]
            filling = [g for g in range(GENERATIONS) if counts[g] < self.minutes]
            current = max(filling, key=lambda g: (counts[g], -g)) if filling else 0
            window = self._windows[project_id] = _Window(counts, current)
            if sum(counts) >= self.minutes:
                window.checked = True
                window.active = self._archive_count(project_id) > sum(counts)
        return window

    def _rotate(self, project_id: str, window: _Window) -> None:
        older = (window.current + 1) % GENERATIONS
        if window.counts[older]:
            self.generations[older].delete_project(project_id)
            window.active = window.checked = True  # the archive now holds minutes the window does not
        window.counts[window.current] = self.generations[window.current].count(project_id)  # rewrites count once
        window.counts[older] = 0
        window.current = older

    def _drop(self, project_id: str) -> None:
        self._windows.pop(project_id, None)
        for generation in self.generations:
            try:
                generation.delete_project(project_id)
            except Exception as exc:
                log.error("hot window of %s: cannot remove it under %s: %s", project_id, generation.path, exc)

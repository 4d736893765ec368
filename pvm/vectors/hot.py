"""The hot window: the newest minutes of a large project again, so that its search looks at a bounded set.

A sparse (lexical) search costs what the posting lists of the query's words
hold, and those grow with the project: at a million generated minutes the
engine's own query took 2.1 ms at the median and 6.5 ms at p99, against 0.64
and 0.94 ms on a shard of 28k points (`docs/performance.md`, "The hot
window"). A range filter on the time does not help: the engine still walks
the whole lists, checking each point against the filter (5.4 to 7.6 ms).

So once a project's shard (the archive: every minute, what everything else
reads) holds `ARCHIVE_FACTOR` times `minutes`, `EdgeEngine` keeps a hot window
of it: seeded with the archive's newest `minutes` minute points, then written
each minute point again (the same built point: qdrant-edge converted its
payload once, and the copy costs only the engine's insert; the window indexes
only `HOT_INDEXED`). The window is two generations, each a directory of shards
(``<path>/.hot/0`` and ``.../1``); writes go to the current one, and when it
holds `minutes` points the other, older one is dropped whole (a directory
removal: nothing to vacuum) and becomes the current. The window so holds the
newest `minutes` to twice `minutes` minutes, and a query costs two searches
of at most that.

A lexical-only candidate query (`EdgeEngine.query` without a dense vector,
facts or whole payloads, and with no upper time bound: the reader's and the
API's search) of a project that keeps a window is answered from the window
when the window finds `limit` candidates; when it finds fewer ("short"), from
the archive, as before. A smaller project keeps no window: its searches read
the archive and answer exactly as without one. What the window changes for a
large project is that an older minute that matches better than the window's
`limit`th is not seen unless the window runs short; each generation's IDF is
its own points'.

The window is derived: a failed write drops the project's window (the archive
answers until it is seeded again), `delete_project` drops it, and nothing in
it is needed to rebuild anything.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from contracts.memory import SearchFilters
from pvm.vectors import Hit, cut_leg

if TYPE_CHECKING:
    from pathlib import Path

    import qdrant_edge as qe

log = logging.getLogger(__name__)

HOT_DIRECTORY = ".hot"  # under the engine's path; a name no project can have
GENERATIONS = 2
# The payload fields a generation indexes: what every search filters on. Indexing every filtered field, as the
# archive does, made each minute's second insert cost as much as the first (index 6,866 -> 4,291 minutes/s);
# with these three, 6,234/s. A search filtering on another field reads it from each candidate's payload.
HOT_INDEXED = ("project_id", "kind", "timestamp_ms")
# A project gets a window once its archive holds this many times `minutes` (200k at the default 25k): below that,
# one search of the archive cost about what the window's two do (at 100k the window read 4.5 ms at the median
# against 1.9-2.9 without it), and its second insert of every minute bought nothing.
ARCHIVE_FACTOR = 8


class Generation(Protocol):
    """What the window asks of a generation: an `EdgeEngine` of its own directory."""

    path: Path

    def write_points(self, project_id: str, points: Sequence[qe.Point]) -> None: ...

    def set_payloads(self, project_id: str, updates: Sequence[tuple[Any, dict[str, Any]]]) -> int: ...

    def lexical_hits(self, project_id: str, text: str, filters: SearchFilters, limit: int) -> list[Hit]: ...

    def ranking_payloads(self, project_id: str, point_ids: Sequence[Any]) -> dict[Any, dict[str, Any]]: ...

    def count(self, project_id: str) -> int: ...

    def delete_project(self, project_id: str) -> None: ...

    def optimize(self, project_id: str | None = None) -> dict[str, bool]: ...

    def tenants(self) -> list[str]: ...

    def close(self) -> None: ...


@dataclass
class _Window:
    """One project's window: `kept` once the archive reached `ARCHIVE_FACTOR` times the window (then it holds the
    newest minutes and search reads it); the points written to each generation, and which one is being written;
    before that, how many minutes the archive holds (read once, then counted as written)."""

    archive: int = 0
    counts: list[int] = field(default_factory=lambda: [0] * GENERATIONS)
    current: int = 0
    kept: bool = False
    retry_at: int = 0  # after a failed seeding, the archive size at which to try again


class HotWindow:
    """The newest `minutes` to twice `minutes` minute points of each project past `ARCHIVE_FACTOR` times `minutes`, in
    `generations` (two engines).

    `archive_count(project)` is how many minutes the archive holds, `newest(project, n)` its newest `n` minute
    points as built points. Thread-safe: the writes and searches of the generations run outside the window's
    lock, which guards only its counts."""

    def __init__(
        self,
        generations: Sequence[Generation],
        minutes: int,
        archive_count: Callable[[str], int],
        newest: Callable[[str, int], list[qe.Point]],
    ) -> None:
        if len(generations) != GENERATIONS:
            raise ValueError(f"a hot window has {GENERATIONS} generations, got {len(generations)}")
        if minutes < 1:
            raise ValueError(f"a hot window holds at least 1 minute, got {minutes}")
        self.generations = list(generations)
        self.minutes = minutes
        self.from_size = ARCHIVE_FACTOR * minutes
        self._archive_count = archive_count
        self._newest = newest
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()
        # Searches of kept windows, by what answered: "window", or "archive" (the window found too few).
        self.searches: Counter[str] = Counter()

    def write(self, project_id: str, points: Sequence[qe.Point]) -> None:
        """Add the points of minutes just written to the archive, once the project is large enough to keep a window
        (the first time, the window is seeded with the archive's newest); rotate when the current generation is
        full. A write that fails drops the project's window (logged): the archive answers until it is seeded
        again, never a window missing minutes."""
        if not points:
            return
        with self._lock:
            counted = project_id in self._windows  # a window read now counts the archive with these points in it
            window = self._window(project_id)
            target, kept = window.current, window.kept
            if not kept:
                window.archive += len(points) if counted else 0
                due = window.archive >= max(self.from_size, window.retry_at)
        if not kept:
            if due:
                self._seed(project_id)
            return
        try:
            self.generations[target].write_points(project_id, points)
            with self._lock:
                now = self._windows.get(project_id)
                if now is None or now.current != target:
                    return  # dropped or rotated meanwhile: the next write counts again
                now.counts[target] += len(points)
                if now.counts[target] >= self.minutes:
                    self._rotate(project_id, now)
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
        archive must answer: no window is kept for the project, or it holds fewer than `limit` hits."""
        try:
            with self._lock:
                if not self._window(project_id).kept:
                    return None
            # Ids and scores from each generation, the best `limit` of both, then the ranking payloads of those
            # alone: converting payloads is most of what a leg costs in Python.
            # Keyed by the point ids as the generations return them (a UUID's string costs ~1 us, and a search at a
            # million minutes took ~450 of them here).
            found: dict[Any, int] = {}  # point id -> its generation
            hits: list[Hit] = []
            for g, generation in enumerate(self.generations):
                for hit in generation.lexical_hits(project_id, text, filters, limit):
                    found[hit[0]] = g
                    hits.append(hit)
            if len(hits) < limit:
                self.searches["archive"] += 1
                return None
            self.searches["window"] += 1
            kept = cut_leg(hits, limit)
            of_generation: list[list[Any]] = [[] for _ in self.generations]
            for pid, _, _ in kept:
                of_generation[found[pid]].append(pid)
            payloads: dict[Any, dict[str, Any]] = {}
            for generation, ids in zip(self.generations, of_generation, strict=True):
                if ids:
                    payloads.update(generation.ranking_payloads(project_id, ids))
        except Exception as exc:  # a generation that does not load: the archive answers, the window regrows
            log.warning("hot window of %s dropped after a failed search (%s): the archive answers", project_id, exc)
            self.drop(project_id)
            return None
        return [(pid, score, payloads.get(pid)) for pid, score, _ in kept]

    def drop(self, project_id: str) -> None:
        """Remove the project's window (its project was deleted, or is being rebuilt)."""
        with self._lock:
            self._drop(project_id)

    def optimize(self, project_id: str | None = None) -> None:
        """Optimize the project's shards of each generation (every project's, for None)."""
        for generation in self.generations:
            generation.optimize(project_id)

    def close(self) -> None:
        for generation in self.generations:
            generation.close()

    def _window(self, project_id: str) -> _Window:
        window = self._windows.get(project_id)
        if window is None:
            counts = [generation.count(project_id) for generation in self.generations]
            if any(counts):  # kept before this process: the generations say where it stands
                filling = [g for g in range(GENERATIONS) if counts[g] < self.minutes]
                current = max(filling, key=lambda g: (counts[g], -g)) if filling else 0
                window = _Window(counts=counts, current=current, kept=True)
            else:
                window = _Window(archive=self._archive_count(project_id))
            self._windows[project_id] = window
        return window

    def _seed(self, project_id: str) -> None:
        """Start the project's window with the archive's newest `minutes` minute points (one read of them)."""
        try:
            newest = self._newest(project_id, self.minutes)
            for generation in self.generations:
                generation.delete_project(project_id)
            self.generations[0].write_points(project_id, newest)
        except Exception as exc:
            log.warning("hot window of %s not seeded (%s): search reads the archive", project_id, exc)
            with self._lock:
                window = self._windows.get(project_id)
                if window is not None:
                    window.retry_at = window.archive + self.minutes
            return
        with self._lock:
            window = self._windows[project_id] = _Window(counts=[len(newest), 0], current=0, kept=True)
            if len(newest) >= self.minutes:
                window.current = 1
        log.info("hot window of %s seeded with its newest %d minutes", project_id, len(newest))

    def _rotate(self, project_id: str, window: _Window) -> None:
        older = (window.current + 1) % GENERATIONS
        if window.counts[older]:
            self.generations[older].delete_project(project_id)
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

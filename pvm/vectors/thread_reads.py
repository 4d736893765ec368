"""Thread reads kept by the embedded engine until a write could change them (`EdgeEngine.in_threads`, `around`).

Search reads the threads of its best hits (`pvm.search.ThreadWindows`): a
short thread whole, a long one around each hit in time order. Each read is a
qdrant-edge scroll that decodes every point it returns (~5 µs a point), about
a tenth of a search at 100k minutes. An agent asks about the same task, and so
the same threads, turn after turn; a thread that nobody writes reads the same
every time.

`EdgeEngine` is the only writer of its shards (it holds the directory's lock),
so it knows every write: it keeps what it read of a thread here and drops it
when anything could change it, never serving an older read:

- an upsert drops the threads of the points written, and the thread each
  written minute was kept under (a minute that moved thread);
- an annotation (pruned, restored, new scores) drops every thread of the
  project: what a filter lets through may change for any minute in it;
- a project deleted or its shard set aside drops the project.

A read is kept only if no write to its project landed while it ran: each write
bumps the project's generation, and a read taken at an older one is not kept.
What is kept is bounded (`THREAD_READS_KEPT` minutes and `THREADS_KEPT`
threads, least recently used threads dropped first), so the cost stays a scroll for threads not asked about
lately, however large the project.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from contracts.memory import SearchFilters
from pvm.protocols import Candidate

# Minutes kept across every thread (a whole thread or a window counts each of its minutes): ~1.3 KB each with
# their ranking payloads (measured: 31,280 kept minutes held 39 MB), so at most ~25 MB.
THREAD_READS_KEPT = 20_000
THREADS_KEPT = 4_096  # threads kept, however few minutes each holds (a read of a thread with none holds none)


@dataclass
class _Thread:
    """What was read of one thread: whole within some filters, or a window around a minute."""

    whole: dict[SearchFilters, tuple[Candidate, ...]] = field(default_factory=dict)
    windows: dict[Hashable, tuple[Candidate, ...]] = field(default_factory=dict)
    size: int = 0  # minutes held in both


class ThreadReads:
    """Thread reads of one engine, by (project, thread); see the module docstring. Safe across threads."""

    def __init__(self, kept: int = THREAD_READS_KEPT, threads: int = THREADS_KEPT) -> None:
        self._kept = kept
        self._threads_kept = threads
        self._lock = threading.Lock()
        self._threads: OrderedDict[tuple[str, str], _Thread] = OrderedDict()
        self._where: dict[tuple[str, str], str] = {}  # (project, minute id) -> the thread it is kept under
        self._generation: dict[str, int] = {}  # project -> writes seen
        self._size = 0

    def generation(self, project_id: str) -> int:
        """Take before a read; pass to `keep_*` after it."""
        with self._lock:
            return self._generation.get(project_id, 0)

    def whole(self, project_id: str, thread_id: str, filters: SearchFilters) -> tuple[Candidate, ...] | None:
        """Every minute of the thread within `filters`, when kept."""
        with self._lock:
            kept = self._used(project_id, thread_id)
            return kept.whole.get(filters) if kept is not None else None

    def window(self, project_id: str, thread_id: str, key: Hashable) -> tuple[Candidate, ...] | None:
        """A window of the thread read before under `key`, when kept."""
        with self._lock:
            kept = self._used(project_id, thread_id)
            return kept.windows.get(key) if kept is not None else None

    def keep_whole(
        self, project_id: str, generation: int, filters: SearchFilters, threads: dict[str, list[Candidate]]
    ) -> None:
        """Keep each thread's every minute within `filters` (`threads`: thread -> its minutes), read at
        `generation`."""
        with self._lock:
            if self._generation.get(project_id, 0) != generation:
                return
            for thread, members in threads.items():
                kept = self._entry(project_id, thread)
                if filters not in kept.whole:  # a read kept at this generation already holds the same
                    kept.whole[filters] = self._add(project_id, thread, kept, members)
            self._bound()

    def keep_window(
        self, project_id: str, generation: int, thread_id: str, key: Hashable, window: Sequence[Candidate]
    ) -> None:
        """Keep a window of the thread read at `generation` under `key`."""
        with self._lock:
            if self._generation.get(project_id, 0) != generation:
                return
            kept = self._entry(project_id, thread_id)
            if key not in kept.windows:
                kept.windows[key] = self._add(project_id, thread_id, kept, window)
            self._bound()

    def written(self, project_id: str, minutes: Iterable[tuple[str, str]]) -> None:
        """Points (minute id, thread id or "") were written to the project: their threads, old and new, are dropped."""
        with self._lock:
            self._generation[project_id] = self._generation.get(project_id, 0) + 1
            for minute_id, thread_id in minutes:
                moved_from = self._where.get((project_id, minute_id))
                for thread in (thread_id, moved_from):
                    if thread:
                        self._drop(project_id, thread)

    def forget(self, project_id: str) -> None:
        """Drop every read of the project (annotated, deleted, or its shard replaced)."""
        with self._lock:
            self._generation[project_id] = self._generation.get(project_id, 0) + 1
            for project, thread in [key for key in self._threads if key[0] == project_id]:
                self._drop(project, thread)

    def sizes(self) -> tuple[int, int]:
        """(threads, minutes) kept."""
        with self._lock:
            return len(self._threads), self._size

    # -- under the lock ------------------------------------------------------------

    def _used(self, project_id: str, thread_id: str) -> _Thread | None:
        """The thread's reads, now the most recently used; None when none are kept."""
        kept = self._threads.get((project_id, thread_id))
        if kept is not None:
            self._threads.move_to_end((project_id, thread_id))
        return kept

    def _entry(self, project_id: str, thread_id: str) -> _Thread:
        kept = self._used(project_id, thread_id)
        if kept is None:
            kept = self._threads[(project_id, thread_id)] = _Thread()
        return kept

    def _add(self, project_id: str, thread_id: str, kept: _Thread, read: Sequence[Candidate]) -> tuple[Candidate, ...]:
        kept.size += len(read)
        self._size += len(read)
        for minute in read:
            self._where[(project_id, minute.minute_id)] = thread_id
        return tuple(read)

    def _drop(self, project_id: str, thread_id: str) -> None:
        kept = self._threads.pop((project_id, thread_id), None)
        if kept is None:
            return
        self._size -= kept.size
        for reads in (*kept.whole.values(), *kept.windows.values()):
            for minute in reads:
                if self._where.get((project_id, minute.minute_id)) == thread_id:
                    del self._where[(project_id, minute.minute_id)]

    def _bound(self) -> None:
        while self._threads and (self._size > self._kept or len(self._threads) > self._threads_kept):
            project_id, thread_id = next(iter(self._threads))
            self._drop(project_id, thread_id)

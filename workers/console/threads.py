"""The console's threads pages: a project's threads as the summarize pool keeps them, and one thread's newest
minutes, chunk summaries and episodes, newest first.

A thread is named as in the API (`contracts.summaries.ThreadRef`: ``thread:<id>``, ``task:<task id>`` or
``project``; a bare id is a thread id). The list reads the project's thread names (one HVALS, names only) and the
state of the page's threads in one pipeline; a thread page is one `SummaryStore.thread_view` (one script call).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.routing import Route

from contracts import keys
from contracts.summaries import Chunk, Episode, ThreadKind, ThreadRef
from pvm.stores.summaries import decode_chunks, decode_episodes
from workers.api import fields
from workers.api.app import thread_param
from workers.api.request import NotFound, int_param
from workers.console.site import Page, Site, Visit, segment

PAGE_SIZE = 100  # threads a page lists unless `n` says otherwise
MAX_PAGE_SIZE = 1_000


@dataclass(frozen=True)
class ThreadRow:
    """A thread as the threads page lists it."""

    name: str  # the ThreadRef as text, what the thread page's path takes
    kind: str  # thread, task or project
    minutes: int  # minutes of the thread the pool has read as final
    pending: int  # its newest minutes, not in a chunk yet
    chunks: int
    episodes: int
    topics: tuple[str, ...]  # the newest chunk's key topics: what the thread is about lately

    @property
    def path(self) -> str:
        return segment(self.name)


def thread_rows(visit: Visit, threads: list[ThreadRef]) -> list[ThreadRow]:
    """Each thread's row, from its state hash and pending set, in one round trip for the page."""
    project_id = visit.project_id
    pipe = visit.stores.connection.pipeline(transaction=False)
    for thread in threads:
        pipe.hmget(keys.thread_state(project_id, thread.digest), ["chunks", "episodes", "minutes"])
        pipe.zcard(keys.thread_pending(project_id, thread.digest))
    replies = iter(pipe.execute())
    rows = []
    for thread in threads:
        chunks_raw, episodes_raw, minutes_raw = next(replies)
        pending = int(next(replies))
        chunks = _records(decode_chunks, chunks_raw)
        rows.append(
            ThreadRow(
                name=str(thread),
                kind=thread.kind.value,
                minutes=int(minutes_raw or 0),
                pending=pending,
                chunks=len(chunks),
                episodes=len(_records(decode_episodes, episodes_raw)),
                topics=chunks[-1].key_topics if chunks else (),
            )
        )
    return rows


def _records(decode: Any, raw: bytes | None) -> list[Any]:
    """A state field's records; none when they no longer validate (as `parse_thread_read` skips them)."""
    try:
        return list(decode(raw))
    except (ValueError, TypeError, KeyError):  # SummaryError is a ValueError
        return []


def threads_page(visit: Visit) -> Page:
    """The project's threads by name, those whose name holds `contains`, a page at a time (`after`: the last name
    of the page before)."""
    n = int_param(visit.request, "n", PAGE_SIZE, 1, MAX_PAGE_SIZE)
    after = visit.param("after")
    contains = visit.param("contains")
    every = visit.stores.summaries.threads(visit.project_id)  # sorted by name
    if contains:
        every = [t for t in every if contains.casefold() in str(t).casefold()]
    following = [t for t in every if str(t) > after] if after else every
    shown = following[:n]
    more = len(following) > n
    return Page(
        "threads.html",
        "Threads",
        {
            "rows": thread_rows(visit, shown),
            "total": len(every),
            "n": n,
            "after": after,
            "contains": contains,
            "next_after": str(shown[-1]) if more and shown else "",
        },
    )


def timeline_filter(thread: ThreadRef) -> dict[str, str]:
    """The timeline's filter that shows a thread's minutes: its thread id, its task (the timeline shows that task's
    minutes of other threads too), or none for the project's thread."""
    if thread.kind is ThreadKind.THREAD:
        return {"thread": thread.name}
    if thread.kind is ThreadKind.TASK:
        return {"task": thread.name}
    return {}


def thread_page(visit: Visit) -> Page:
    """One thread: its newest minutes (newest first), its chunks with their summaries and its episodes, newest first."""
    thread = thread_param(visit.request, visit.request.path_params["thread"])
    assert thread is not None  # a path segment is never empty
    project_id = visit.project_id
    recent = fields.THREAD_RECENT.integer(visit.request, visit.stores.reader.thread_recent)
    if not visit.stores.connection.hexists(keys.summary_threads(project_id), thread.digest):
        raise NotFound(
            f"project {project_id} has no thread {thread}: the summarize pool has not seen a minute of it "
            "(yet); the threads page lists those it has"
        )
    view = visit.stores.summaries.thread_view(project_id, thread, recent)
    chunks: list[Chunk] = list(reversed(view.chunks))  # the store keeps them in log order
    episodes: list[Episode] = sorted(view.episodes, key=lambda e: (-e.last_seq, -e.first_seq))
    return Page(
        "thread.html",
        f"Thread {thread}",
        {
            "thread": str(thread),
            "thread_path": segment(str(thread)),
            "view": view,
            "recent_minutes": list(reversed(view.recent)),
            "recent": recent,
            "chunks": chunks,
            "episodes": episodes,
            "timeline": timeline_filter(thread),
        },
    )


def routes(site: Site) -> list[Route]:
    return [
        Route("/ui/projects/{project_id}/threads", site.page(threads_page)),
        # A thread id is free text: a '/' in it reaches the handler whole.
        Route("/ui/projects/{project_id}/threads/{thread:path}", site.page(thread_page)),
    ]

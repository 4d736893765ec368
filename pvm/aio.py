"""The emitter and the reader for asyncio agents: `AsyncEmitter` and `AsyncContextReader`.

`AsyncEmitter.emit()` is the sync emitter's `emit()`: it validates, buffers
and returns the minute's id in microseconds, never waiting on Redis, so it is
a plain (non-async) method that is safe on the event loop; what can wait
(`flush`, `emit_now`, `aclose`) runs in a worker thread.

`AsyncContextReader` runs each read of a `ContextReader` in a thread pool
(the loop's default executor, or one given): the reader's reads are a Redis
round trip or two and a search, short blocking calls that a thread keeps off
the event loop. It is the sync reader underneath, so both answer the same;
redis.asyncio would save the thread hop but would be a second reader to keep
in step.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Executor
from typing import Any, Concatenate, ParamSpec, TypeVar

from contracts import Minute
from contracts.facts import Fact
from pvm.config import Settings
from pvm.emitter import Emitter, EmitterStats
from pvm.reader import ContextReader

_P = ParamSpec("_P")
_T = TypeVar("_T")


class AsyncEmitter:
    """Fire-and-forget producer for asyncio code: `Emitter` underneath (same buffer, spool and flusher thread).

    `AsyncEmitter(...)` takes `Emitter`'s arguments, or wraps one given as `emitter=`.
    """

    def __init__(self, *args: Any, emitter: Emitter | None = None, **kwargs: Any) -> None:
        self.emitter = emitter if emitter is not None else Emitter(*args, **kwargs)

    def emit(self, minute: Minute | Mapping[str, Any]) -> str:
        """Queue a minute for delivery and return its id; never waits. Raises only `InvalidMinute`."""
        return self.emitter.emit(minute)

    def learn(self, project_id: str, key: str, value: str | int | float | bool, *args: Any, **kwargs: Any) -> str:
        """`Emitter.learn`: remember `value` under `key`; the ``fact_learned`` minute's id. Never waits."""
        return self.emitter.learn(project_id, key, value, *args, **kwargs)

    def promote(self, fact: Fact | Mapping[str, Any], *, agent_id: str | None = None) -> str:
        """`Emitter.promote`: copy a current fact one tier up; the minute's id. Never waits."""
        return self.emitter.promote(fact, agent_id=agent_id)

    def stats(self) -> EmitterStats:
        return self.emitter.stats()

    async def emit_now(self, minute: Minute | Mapping[str, Any]) -> str:
        """`Emitter.emit_sync` in a thread: XADD one minute now; its stream entry id (redis errors are raised)."""
        return await asyncio.to_thread(self.emitter.emit_sync, minute)

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait (in a thread) until nothing is buffered or in flight; True if that happened within `timeout`."""
        return await asyncio.to_thread(self.emitter.flush, timeout)

    async def aclose(self, timeout: float = 5.0) -> None:
        """Send what is buffered (waiting up to `timeout`, in a thread), spool the rest, stop the flusher."""
        await asyncio.to_thread(self.emitter.close, timeout)

    async def __aenter__(self) -> AsyncEmitter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _in_thread(
    read: Callable[Concatenate[ContextReader, _P], _T],
) -> Callable[Concatenate[AsyncContextReader, _P], Awaitable[_T]]:
    """An `AsyncContextReader` method: the `ContextReader` method of the same name, run in the reader's executor."""

    @functools.wraps(read)
    async def method(self: AsyncContextReader, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        call = functools.partial(read, self.reader, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self.executor, call)

    return method


class AsyncContextReader:
    """`ContextReader` for asyncio: the same reads, each a coroutine run in a thread pool.

    `executor`: where the reads run (None: the event loop's default executor).
    """

    def __init__(self, reader: ContextReader, executor: Executor | None = None) -> None:
        self.reader = reader
        self.executor = executor

    @classmethod
    def from_settings(
        cls, settings: Settings | None = None, *, search: bool | None = None, executor: Executor | None = None
    ) -> AsyncContextReader:
        """`ContextReader.from_settings` (same `search` rule), read from asyncio; `aclose()` releases it."""
        return cls(ContextReader.from_settings(settings, search=search), executor)

    async def aclose(self) -> None:
        """Close the reader (what `from_settings` opened)."""
        await asyncio.to_thread(self.reader.close)

    async def __aenter__(self) -> AsyncContextReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    build_context = _in_thread(ContextReader.build_context)
    search = _in_thread(ContextReader.search)
    search_result = _in_thread(ContextReader.search_result)
    get_recent = _in_thread(ContextReader.get_recent)
    get_by_ids = _in_thread(ContextReader.get_by_ids)
    recall = _in_thread(ContextReader.recall)
    freshness = _in_thread(ContextReader.freshness)

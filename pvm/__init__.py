"""PVM: the memory layer for fleets of AI agents.

Agents write with `Emitter` (to Redis) and read with `ContextReader` (from
Redis; `ContextReader.from_settings()` builds one) or, over HTTP, with
`Client` (the reader API of `pvm serve`; `PVMClient` is its earlier name).
asyncio agents use `AsyncEmitter`, `AsyncContextReader` and `AsyncClient`.
Every error PVM raises to its caller is a `PvmError`. Their
key-value memory: `Emitter.learn(project, key, value, tier=...)`,
`ContextReader.recall(project, key)` (a `Fact`, or None) and
`Emitter.promote(fact)` (one tier up). This
package needs only redis, msgpack and httpx (`pip install pvm`); the pools, the
API server and the vector engines come with `pip install 'pvm[server]'`.
"""

from __future__ import annotations

from contracts import InvalidFact, InvalidMinute, Minute, new_minute_id
from contracts.errors import PvmError
from contracts.facts import Fact, Tier
from pvm.aio import AsyncContextReader, AsyncEmitter
from pvm.client import AsyncClient, Client, PVMAPIError, PVMClient, PVMRequestError, PVMServerError
from pvm.config import ConfigError, Settings
from pvm.emitter import Emitter, EmitterStats
from pvm.reader import ContextReader, ReaderError, SearchUnavailable

__all__ = [
    "AsyncClient",
    "AsyncContextReader",
    "AsyncEmitter",
    "Client",
    "ConfigError",
    "ContextReader",
    "Emitter",
    "EmitterStats",
    "Fact",
    "InvalidFact",
    "InvalidMinute",
    "Minute",
    "PVMAPIError",
    "PVMClient",
    "PVMRequestError",
    "PVMServerError",
    "PvmError",
    "ReaderError",
    "SearchUnavailable",
    "Settings",
    "Tier",
    "new_minute_id",
]

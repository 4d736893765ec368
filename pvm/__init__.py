"""PVM: the memory layer for fleets of AI agents.

Agents write with `Emitter` (to Redis) and read with `ContextReader` (from
Redis) or, over HTTP, with `PVMClient` (the reader API of `pvm serve`). Their
key-value memory: `Emitter.learn(project, key, value, tier=...)`,
`ContextReader.recall(project, key)` (a `Fact`, or None) and
`Emitter.promote(fact)` (one tier up). This
package needs only redis, msgpack and httpx (`pip install pvm`); the pools, the
API server and the vector engines come with `pip install 'pvm[server]'`.
"""

from __future__ import annotations

from contracts import InvalidFact, InvalidMinute, Minute, new_minute_id
from contracts.facts import Fact, Tier
from pvm.client import PVMAPIError, PVMClient, PVMRequestError, PVMServerError
from pvm.config import Settings
from pvm.emitter import Emitter, EmitterStats
from pvm.reader import ContextReader

__all__ = [
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
    "Settings",
    "Tier",
    "new_minute_id",
]

"""PVM: the memory layer for fleets of AI agents.

Agents write with `Emitter` (to Redis) and read with `ContextReader` (from
Redis) or, over HTTP, with `PVMClient` (the reader API of `pvm serve`). This
package needs only redis, msgpack and httpx (`pip install pvm`); the pools, the
API server and the vector engines come with `pip install 'pvm[server]'`.
"""

from __future__ import annotations

from contracts import InvalidMinute, Minute, new_minute_id
from pvm.client import PVMAPIError, PVMClient, PVMRequestError, PVMServerError
from pvm.config import Settings
from pvm.emitter import Emitter, EmitterStats
from pvm.reader import ContextReader

__all__ = [
    "ContextReader",
    "Emitter",
    "EmitterStats",
    "InvalidMinute",
    "Minute",
    "PVMAPIError",
    "PVMClient",
    "PVMRequestError",
    "PVMServerError",
    "Settings",
    "new_minute_id",
]

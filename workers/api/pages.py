"""Pages for people served beside the API (the web console, workers/console): what the API hands them, and how a
browser signs in to them.

The API does not know the pages: `pvm serve` passes a `BrowserPages` to `create_app`, which mounts its routes over
the API's own stores and route handlers (`AppParts`), so a change made from a page is the API's change. With tokens
required, the API's auth takes a browser's token from the pages' cookie under their prefix, leaves their login
path and static files open, and sends a visitor without an accepted token to the login path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis
from starlette.requests import Request
from starlette.routing import BaseRoute

from pvm.config import Settings
from pvm.reader import ContextReader
from pvm.stores.summaries import SummaryStore
from workers.api.auth import TokenScope
from workers.api.fact_routes import FactRoutes
from workers.api.memory_routes import MemoryRoutes


@dataclass(frozen=True)
class AppParts:
    """What `create_app` built that pages read and call: the reader, the stores and the API's route handlers."""

    reader: ContextReader
    connection: redis.Redis
    facts: FactRoutes
    memory: MemoryRoutes
    summaries: SummaryStore
    shards: int
    settings: Settings | None
    granted: Callable[[Request], TokenScope | None]  # the scope the API's auth left on a request
    check_token: Callable[[str], TokenScope | None]  # the scope of a token typed into a login form, or None
    guarded: bool  # whether tokens are required at all


@dataclass(frozen=True)
class BrowserPages:
    """Pages under `prefix`: their routes, their login path and open (static) prefixes, and the cookie that
    carries a browser's token."""

    prefix: str
    login_path: str
    open_prefixes: tuple[str, ...]
    cookie: str
    routes: Callable[[AppParts], Sequence[BaseRoute]]

    def holds(self, path: str) -> bool:
        return path == self.prefix or path.startswith(self.prefix + "/")

    def is_open(self, path: str) -> bool:
        return path == self.login_path or path.startswith(self.open_prefixes)

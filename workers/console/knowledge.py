"""The console's knowledge pages (being built this session)."""

from __future__ import annotations

from starlette.routing import Route

from workers.console.site import Site


def routes(site: Site) -> list[Route]:
    return []

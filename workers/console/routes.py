"""Every route of the console under /ui (its pages, login and logout, its static files), and `CONSOLE`, which
`pvm serve` hands the API to mount them."""

from __future__ import annotations

from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from workers.api.pages import AppParts, BrowserPages
from workers.console import agents, knowledge, login, pools, preview, projects, search, threads, timeline
from workers.console.site import LOGIN_PATH, STATIC_DIR, STATIC_PATH, TOKEN_COOKIE, UI_PATH, Site


def console_routes(parts: AppParts) -> list[BaseRoute]:
    """The console's routes over the API's parts."""
    site = Site(parts)
    return [
        Mount(STATIC_PATH, StaticFiles(directory=STATIC_DIR), name="console-static"),
        *login.routes(site),
        *projects.routes(site),
        *timeline.routes(site),
        *knowledge.routes(site),
        *threads.routes(site),
        *agents.routes(site),
        *preview.routes(site),
        *search.routes(site),
        *pools.routes(site),
    ]


CONSOLE = BrowserPages(UI_PATH, LOGIN_PATH, (STATIC_PATH + "/",), TOKEN_COOKIE, console_routes)

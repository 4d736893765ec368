"""The console's frame: what a page handler gets (`Visit`: the request, the token's scope, the API's stores) and
returns (`Page`), and `Site`, which checks the scope, renders, and turns every error into a page that says so.

A page handler is a plain function `(visit) -> Page | Response`, run in the thread pool (the stores block). A
project in the path is checked against the token's scope before the handler runs, as the API's route wrapper
does, so a new page cannot forget to. `BadRequest` and its kinds (the API's own: 400, 403, 404, 409, 422) become
an error page with their status; a store outage (`workers.api.request.OUTAGES`) a 503 page that names the store;
anything else a 500 page with a request id the server log has the traceback under, never a traceback.
"""

from __future__ import annotations

import logging
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
import redis
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from contracts import InvalidMinute, keys
from contracts.minute import check_project_id
from workers.api.auth import TokenScope
from workers.api.pages import AppParts
from workers.api.request import OUTAGES, BadRequest, Forbidden

log = logging.getLogger(__name__)

UI_PATH = "/ui"
LOGIN_PATH = f"{UI_PATH}/login"
STATIC_PATH = f"{UI_PATH}/static"
STATIC_DIR = Path(__file__).parent / "static"
# The console's cookie: the token, HttpOnly and SameSite=Strict, sent only to /ui (never put in a URL).
TOKEN_COOKIE = "pvm_console_token"
MAX_FORM_BYTES = 256 * 1024


@dataclass(frozen=True)
class Visit:
    """One request to a page: the request, the token's scope, the stores and (for a POST) its form fields."""

    request: Request
    scope: TokenScope
    stores: AppParts
    form: Mapping[str, str] = field(default_factory=dict)

    @property
    def project_id(self) -> str:
        """The project in the path (checked against the scope before the handler runs); '' when none."""
        return str(self.request.path_params.get("project_id", ""))

    def param(self, name: str, default: str = "") -> str:
        """A query parameter, stripped; `default` when absent or empty."""
        return (self.request.query_params.get(name) or "").strip() or default

    def projects(self) -> list[str]:
        """The projects this token may see, sorted: those PVM has minutes for, filtered by the token's scope."""
        members = self.stores.connection.smembers(keys.projects())
        known = {p.decode() if isinstance(p, bytes) else str(p) for p in members}
        return sorted(p for p in known if self.scope.allows(p))


@dataclass(frozen=True)
class Page:
    """What a page handler returns: the template, the page's title and what the template shows."""

    template: str
    title: str
    values: dict[str, Any] = field(default_factory=dict)
    status: int = 200


Handler = Callable[[Visit], "Page | Response"]


def since(unix_s: float | None, now: float | None = None) -> str:
    """How long ago a Unix time was, for people: '4 s ago', '3 min ago', '2 h ago', '5 d ago'; '—' for None."""
    if unix_s is None:
        return "—"
    age = max(0.0, (time.time() if now is None else now) - unix_s)
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if age >= size:
            return f"{age / size:.0f} {unit} ago"
    return f"{age:.0f} s ago"


def utc(value: float | int | str | None, millis: bool = False) -> str:
    """A time as 'YYYY-MM-DD HH:MM:SS' UTC: Unix seconds (or milliseconds with `millis`), or an ISO string."""
    if value is None or value == "":
        return "—"
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).strftime("%Y-%m-%d %H:%M:%S")
        except ValueError:
            return value
    seconds = value / 1000 if millis else value
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


def segment(text: str) -> str:
    """A free-text id (an agent, a thread, a minute) as one segment of a console path: '/' and ':' quoted too."""
    return urllib.parse.quote(text, safe="")


def query(**params: Any) -> str:
    """A query string of the parameters that are set ('' when none), for links that keep a page's filters."""
    kept = {k: v for k, v in params.items() if v not in (None, "", ())}
    return "?" + urllib.parse.urlencode(kept, doseq=True) if kept else ""


def environment() -> jinja2.Environment:
    """The templates, autoescaped (every value a minute carries is text an agent wrote), strict about names."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("workers.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(since=since, utc=utc)
    env.globals.update(ui=UI_PATH, static=STATIC_PATH, query=query)
    return env


class Site:
    """Wraps page handlers into Starlette endpoints: scope check, thread pool, rendering and error pages, over the
    API's parts (`granted`: the scope of the token a request carried; `guarded`: whether tokens are required)."""

    def __init__(self, stores: AppParts) -> None:
        self.stores = stores
        self.granted = stores.granted
        self.guarded = stores.guarded
        self.env = environment()

    def page(self, handler: Handler) -> Callable[[Request], Any]:
        """A GET page."""

        async def endpoint(request: Request) -> Response:
            return await self._serve(handler, request, {})

        return endpoint

    def action(self, handler: Handler) -> Callable[[Request], Any]:
        """A POST from a console form: refused unless it comes from a page of this origin (the cookie is
        SameSite=Strict too); its fields reach the handler as `visit.form`. A handler answers with a redirect
        (post/redirect/get) or a page."""

        async def endpoint(request: Request) -> Response:
            if not same_origin(request):
                return self.error(request, 403, "Refused", "a change must come from a form of this console")
            body = await request.body()
            if len(body) > MAX_FORM_BYTES:
                return self.error(request, 413, "Too large", f"a form may send at most {MAX_FORM_BYTES} bytes")
            form = {k: v for k, v in urllib.parse.parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)}
            return await self._serve(handler, request, form)

        return endpoint

    async def _serve(self, handler: Handler, request: Request, form: dict[str, str]) -> Response:
        scope = self.granted(request)
        if scope is None:  # BearerAuth sends a visitor without a token to the login page; never reached
            return RedirectResponse(LOGIN_PATH, status_code=303)
        project_id = request.path_params.get("project_id")
        if project_id is not None:
            try:
                check_project_id(project_id)
            except InvalidMinute as exc:
                return self.error(request, 400, "Not a project", f"the project in the path {exc.problem}")
            if not scope.allows(project_id):
                return self.error(request, 403, "Not your project", f"this token may not read project {project_id}")
        visit = Visit(request, scope, self.stores, form)
        try:
            return await run_in_threadpool(self._respond, handler, visit)
        except BadRequest as exc:
            return self.error(request, exc.status, _title(exc), str(exc))
        except OUTAGES as exc:
            store = "Redis" if isinstance(exc, redis.exceptions.RedisError) else "a store"
            log.warning("console %s %s: 503 %s", request.method, request.url.path, exc)
            return self.error(request, 503, "A store is unavailable", f"{store} did not answer: {exc}")
        except Exception:
            request_id = uuid.uuid4().hex
            log.exception("console request %s %s %s failed", request_id, request.method, request.url.path)
            return self.error(
                request, 500, "Internal error", f"the page failed (request id {request_id}); the server log has why"
            )

    def _respond(self, handler: Handler, visit: Visit) -> Response:
        result = handler(visit)
        if isinstance(result, Response):
            return result
        return self.render(visit.request, result, visit.scope)

    def render(self, request: Request, page: Page, scope: TokenScope | None) -> HTMLResponse:
        """A page in the console's frame: the nav names the project in the path, and the token when there is one."""
        html = self.env.get_template(page.template).render(
            title=page.title,
            project_id=request.path_params.get("project_id", ""),
            token_name=scope.name if scope is not None and self.guarded else "",
            guarded=self.guarded,
            path=request.url.path,
            **page.values,
        )
        return HTMLResponse(html, status_code=page.status, headers=SECURITY_HEADERS)

    def error(self, request: Request, status: int, title: str, message: str) -> HTMLResponse:
        """An error as a page: what went wrong and, where the visitor can do something, what."""
        page = Page("error.html", title, {"status": status, "message": message}, status=status)
        return self.render(request, page, self.granted(request))


# Everything the console loads is its own: no script, style, font or image from anywhere else.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def same_origin(request: Request) -> bool:
    """Whether a POST comes from a page of this origin: its Origin (or, without one, its Referer) names our host."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if not source:
        return False
    host = request.headers.get("host", "")
    return urllib.parse.urlsplit(source).netloc == host


def _title(exc: BadRequest) -> str:
    return {400: "Bad request", 403: "Not allowed", 404: "Not found", 409: "Conflict", 422: "Refused"}.get(
        exc.status, "Bad request"
    )


def forbid_global(visit: Visit) -> None:
    """Raise Forbidden unless the token may reach the global tier of facts."""
    if not visit.scope.allows_global:
        raise Forbidden("this token may not reach the global tier; that needs a token with the global grant")

"""The reader over HTTP: context, search, recent and by-id reads, and minute ingestion, for agents in any language.

A Starlette app (served by uvicorn in `pvm serve`): every route names its
project in the path, so no request can read across projects. `POST /v1/minutes`
validates a whole batch against the contract and appends it to the shard
streams in one script (all of it or none) before answering 202 with the ids; an
invalid batch is refused whole with 422 and every error names its minute and
field. A client that sets each minute's `id` can resend a batch whose answer it
never saw: the log keeps each id once. The OpenAPI description, generated
from the contract by workers/api/openapi.py, is served at `/openapi.json`. With
PVM_API_TOKEN or PVM_API_TOKENS_FILE set, every route but `/healthz` needs
`Authorization: Bearer <token>`; without either the API is open, and `pvm
serve` warns when it binds beyond loopback. A token from the tokens file
reaches only its projects: any other project in a path, or in a posted minute,
is refused with 403 before anything is read or written.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import re
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import redis
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request, cookie_parser
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from contracts import InvalidMinute, Minute, encode_minute, keys, new_minute_id
from contracts.codec import SCHEMA_VERSION, SUPPORTED_VERSIONS
from contracts.errors import InvalidFact
from contracts.facts import check_task_id
from contracts.json_value import json_safe
from contracts.memory import SearchFilters, SearchHit
from contracts.minute import check_project_id, is_valid_project_id, utc_now_iso
from contracts.summaries import SUMMARY_EVENT_TYPES, SYSTEM_EVENT_TYPES, SummaryError, ThreadRef
from pvm import defaults
from pvm.config import Settings
from pvm.pair import Pair
from pvm.reader import ContextReader
from pvm.search import DEFAULT_KINDS, PREFERENCES, Hit
from pvm.stores.facts import FactStore
from pvm.stores.summaries import SummaryStore
from pvm.vectors import GLOBAL_TENANT
from workers.api import fields
from workers.api.auth import EVERY_PROJECT, TokenFile, TokenScope
from workers.api.fact_routes import FactRoutes
from workers.api.memory_routes import MemoryRoutes
from workers.api.openapi import openapi_document
from workers.api.pages import AppParts, BrowserPages
from workers.api.pair_routes import PairRoute
from workers.api.request import (
    OUTAGES,
    BadRequest,
    Forbidden,
    Unavailable,
    json_body,
    list_param,
)
from workers.api.stats import project_stats
from workers.runtime.minutes import write_minutes

log = logging.getLogger(__name__)

MAX_BATCH = defaults.API_MAX_BATCH
MAX_BODY_BYTES = defaults.API_MAX_BODY_BYTES
# Open without a token: orchestrators probe it and it tells nothing about any project.
HEALTH_PATH = "/healthz"
# The ASGI scope key under which BearerAuth leaves the scope of the token a request carried.
TOKEN_SCOPE_KEY = "pvm.token_scope"


class PayloadTooLarge(BadRequest):
    """A body over MAX_BODY_BYTES: refused by its Content-Length before it is read, or as soon as it passes the cap."""

    status = 413

    def __init__(self, size: int | None) -> None:
        told = f"is {size} bytes" if size is not None else f"passed {MAX_BODY_BYTES} bytes before it ended"
        super().__init__(
            f"request body {told}; the limit is {MAX_BODY_BYTES} bytes (and {MAX_BATCH} minutes): split the batch"
        )


async def read_body(request: Request) -> bytes:
    """The request body, at most MAX_BODY_BYTES: a larger Content-Length is refused unread, a chunked body cut off."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequest(f"header Content-Length: {declared[:40]!r} is not a whole number of bytes")
        if int(declared) > MAX_BODY_BYTES:
            raise PayloadTooLarge(int(declared))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise PayloadTooLarge(None)
        chunks.append(chunk)
    return b"".join(chunks)


REQUEST_ID_HEADER = "X-Request-ID"
_REQUEST_ID = re.compile(r"[0-9A-Za-z._:-]{1,64}")


def request_id_of(request: Request) -> str:
    """The client's X-Request-ID when it is a plain token, else a new one: it ties an error answer to the log."""
    given = request.headers.get(REQUEST_ID_HEADER, "")
    return given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex


class SafeJSONResponse(JSONResponse):
    """A JSON answer that stays valid JSON whatever a store held.

    Minutes logged before data had to be JSON may hold NaN, ±Infinity or
    bytes: `contracts.json_value.json_safe` writes NaN and ±Infinity as null
    and bytes as base64 text. Valid content takes the fast path unchanged.
    """

    def render(self, content: Any) -> bytes:
        try:
            text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        except (ValueError, TypeError, RecursionError):
            text = json.dumps(json_safe(content), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return text.encode("utf-8")


# A POST's minutes go to their shard streams in one script, so a batch is appended whole or not at
# all. MULTI/EXEC would not do: Redis runs every command of a transaction even when one fails at EXEC
# (a stream key holding another type answers WRONGTYPE), leaving the rest of the batch written. The
# script checks every key's type before its first XADD, and Redis refuses a script for want of memory
# at its first write, so nothing else fails midway. With one Redis (or a primary and its replicas)
# that is atomic. On Redis Cluster the shard streams live in different slots and one script cannot
# span them: a batch over several shards would have to be split into one script per shard, atomic
# per shard only.
APPEND_BATCH = """
for _, key in ipairs(KEYS) do
    local kind = redis.call('TYPE', key)['ok']
    if kind ~= 'stream' and kind ~= 'none' then
        return redis.error_reply('WRONGTYPE ' .. key .. ' holds a ' .. kind .. ', not a stream')
    end
end
local ids = {}
for i = 2, #ARGV, 2 do
    ids[#ids + 1] = redis.call('XADD', KEYS[tonumber(ARGV[i])], '*', ARGV[1], ARGV[i + 1])
end
return ids
"""


def filters_from_query(request: Request) -> SearchFilters:
    """SearchFilters from query parameters (repeatable or comma-separated lists)."""
    min_composite = request.query_params.get("min_composite")
    try:
        composite = float(min_composite) if min_composite else None
    except ValueError:
        raise BadRequest(f"min_composite={min_composite!r} is not a number") from None
    if composite is not None and not 0 <= composite <= 1:
        raise BadRequest(f"min_composite={min_composite!r} must be a number from 0 to 1")
    return SearchFilters(
        categories=list_param(request, "category"),
        event_types=list_param(request, "event_type"),
        agents=list_param(request, "agent"),
        task_id=request.query_params.get("task_id") or None,
        thread_id=request.query_params.get("thread_id") or None,
        since_ms=fields.SINCE_MS.integer(request, 0) or None,
        until_ms=fields.UNTIL_MS.integer(request, 0) or None,
        min_composite=composite,
        include_pruned=request.query_params.get("include_pruned", "").lower() in ("1", "true", "yes"),
    )


def ranked_hit(hit: Hit) -> dict[str, Any]:
    """A search hit of any kind as JSON, with its ``kind`` and, for a fact or a summary, its ``sources``."""
    out = hit.to_dict()
    out["kind"] = hit.kind
    if not isinstance(hit, SearchHit):
        out["sources"] = list(hit.sources)
    return out


def knowledge_change_refused(event_type: str) -> str:
    """Why POST /v1/minutes refuses a knowledge-change minute, and where such a change is made instead."""
    if event_type in SUMMARY_EVENT_TYPES:
        return (
            f"{event_type!r} is a chunk summary, which only the summarize pool writes (a forged one would reach "
            "the log and replace a thread's summary): read threads at /v1/projects/{project_id}/threads/{thread}"
        )
    return (
        f"{event_type!r} is a knowledge change, which only PVM writes (a forged one would reach the log): "
        "change facts through /v1/projects/{project_id}/facts (POST to assert; .../facts/{fact_id}/promote, "
        ".../facts/{fact_id}/retract) and /v1/projects/{project_id}/learn"
    )


def prefer_param(request: Request) -> str | None:
    """The `prefer` query parameter: one of `pvm.search.PREFERENCES`, or None when absent; 400 naming it otherwise."""
    prefer = request.query_params.get("prefer") or None
    if prefer is not None and prefer not in PREFERENCES:
        raise BadRequest(f"query parameter prefer={prefer!r} is not one of {', '.join(PREFERENCES)} (or absent)")
    return prefer


def thread_param(request: Request, value: str | None = None) -> ThreadRef | None:
    """The thread a request names (the `thread` query parameter unless given), or None; 400 naming it otherwise."""
    raw = request.query_params.get("thread") if value is None else value
    if not raw:
        return None
    try:
        return ThreadRef.parse(raw)
    except SummaryError as exc:
        raise BadRequest(f"thread: {exc.problem}") from None


def bearer_credential(authorization: str | None) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` header, as the bytes the client sent; None for any other."""
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return None
    # Starlette decodes header bytes as latin-1: encoding back gives the bytes the client sent.
    return given.strip().encode("latin-1")


def bearer_token_matches(authorization: str | None, token: str) -> bool:
    """Whether an Authorization header carries `Bearer <token>` (compared in constant time)."""
    given = bearer_credential(authorization)
    return given is not None and hmac.compare_digest(given, token.encode())


def forbidden(project_id: str, verb: str = "read") -> str:
    """The 403 message: it names only the project the client asked for, never which projects exist."""
    return f"this token may not {verb} project {project_id}"


class BearerAuth:
    """Refuses every request but the health check unless it carries a token the server knows.

    The token is PVM_API_TOKEN (every project) or one in the tokens file (its
    projects); the scope of the token is left in the ASGI scope for the routes,
    which refuse a project outside it. The 401 body never repeats what the
    client sent, so neither a right token nor a near miss ends up in a client's
    logs or error reports.
    """

    def __init__(
        self, app: ASGIApp, token: str | None = None, tokens: TokenFile | None = None, pages: BrowserPages | None = None
    ) -> None:
        self.app = app
        self.token = token
        self.tokens = tokens
        self.pages = pages

    def scope_of(self, authorization: str | None) -> TokenScope | None:
        """The scope of the token in an Authorization header, or None when no token the server knows is there."""
        if self.token is not None and bearer_token_matches(authorization, self.token):
            return EVERY_PROJECT
        given = bearer_credential(authorization)
        if self.tokens is None or given is None:
            return None
        # A lookup by the token's hash: its timing depends on the hash, which tells nothing of a stored token.
        return self.tokens.lookup(given)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == HEALTH_PATH:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        authorization = headers.get("authorization")
        if self.pages is not None and self.pages.holds(scope["path"]):
            await self.browser(scope, receive, send, headers, self.pages)
            return
        granted = self.scope_of(authorization)
        if granted is not None:
            scope[TOKEN_SCOPE_KEY] = granted
            await self.app(scope, receive, send)
            return
        if authorization is None:
            error = "this API requires a bearer token: send the header Authorization: Bearer <PVM_API_TOKEN>"
            challenge = 'Bearer realm="pvm"'
        else:
            error = "the bearer token in the Authorization header was not accepted"
            challenge = 'Bearer realm="pvm", error="invalid_token"'
        response = JSONResponse({"error": error}, status_code=401, headers={"WWW-Authenticate": challenge})
        await response(scope, receive, send)

    async def browser(self, scope: Scope, receive: Receive, send: Send, headers: Headers, pages: BrowserPages) -> None:
        """Pages for people (the console): their login page and static files are open; every other page takes
        the token from the pages' cookie (or an Authorization header) and, without an accepted one, sends the
        browser to the login page, which comes back to the page asked for."""
        path = scope["path"]
        if pages.is_open(path):
            await self.app(scope, receive, send)
            return
        cookie = cookie_parser(headers.get("cookie", "")).get(pages.cookie)
        granted = self.scope_of(headers.get("authorization"))
        if granted is None and cookie:
            granted = self.scope_of(f"Bearer {cookie}")
        if granted is not None:
            scope[TOKEN_SCOPE_KEY] = granted
            await self.app(scope, receive, send)
            return
        back = path if scope["method"] == "GET" else pages.prefix
        response = RedirectResponse(f"{pages.login_path}?{urllib.parse.urlencode({'next': back})}", status_code=303)
        await response(scope, receive, send)


def is_loopback(addr: str) -> bool:
    """Whether a bind address only accepts connections from this machine."""
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def create_app(
    reader: ContextReader,
    connection: redis.Redis,
    shards: int,
    api_token: str | None = None,
    tokens: TokenFile | None = None,
    pair: Pair | None = None,
    pages: BrowserPages | None = None,
    settings: Settings | None = None,
) -> Starlette:
    """The API over one reader and one Redis, and `pages` for people (the web console) beside it.

    With `api_token` and/or `tokens`, every route but the health check needs a
    bearer token: `api_token` reaches every project, a token in `tokens` only
    its own. `pair` gives the PAIR route its judge, reviser and limits (default:
    the checklist judge and the extractive reviser); it searches with the
    reader's searcher and writes its minutes as the facts routes do.
    """
    # A token read from a file-backed secret often ends in a newline no client will send.
    token = (api_token or "").strip() or None
    guarded = token is not None or tokens is not None

    def granted(request: Request) -> TokenScope | None:
        # Fails closed: with auth on, a request BearerAuth did not mark reaches no project.
        found = request.scope.get(TOKEN_SCOPE_KEY)
        if isinstance(found, TokenScope):
            return found
        return None if guarded else EVERY_PROJECT

    def route(fn: Callable[[Request, bytes], Any]) -> Callable[[Request], Any]:
        async def handler(request: Request) -> Response:
            # Every route with a project in its path is checked here, so a new route cannot forget to.
            project_id = request.path_params.get("project_id")
            if project_id is not None:
                try:
                    check_project_id(project_id)
                except InvalidMinute as exc:
                    return JSONResponse({"error": f"path parameter {exc.field} {exc.problem}"}, status_code=400)
                scope = granted(request)
                if scope is None or not scope.allows(project_id):
                    return JSONResponse({"error": forbidden(project_id)}, status_code=403)
            # Reads block (Redis, the vector engine) and so does encoding a large answer: both run in the
            # thread pool, not on the event loop, and both inside the error handling.
            try:
                body = await read_body(request) if request.method in ("POST", "PUT") else b""
                return await run_in_threadpool(respond, fn, request, body)
            except BadRequest as exc:
                return JSONResponse(exc.body(), status_code=exc.status)
            except OUTAGES as exc:
                return unavailable(request, exc)
            except Exception:
                return internal_error(request)

        return handler

    def respond(fn: Callable[[Request, bytes], Any], request: Request, body: bytes) -> Response:
        result = fn(request, body)
        return result if isinstance(result, Response) else SafeJSONResponse(result)

    def unavailable(request: Request, exc: Exception) -> Response:
        request_id = request_id_of(request)
        error = f"Redis unavailable: {exc}" if isinstance(exc, redis.exceptions.RedisError) else str(exc)
        log.warning("request %s %s %s: 503 %s", request_id, request.method, request.url.path, error)
        return JSONResponse(
            {"error": error, "request_id": request_id}, status_code=503, headers={REQUEST_ID_HEADER: request_id}
        )

    def internal_error(request: Request) -> Response:
        request_id = request_id_of(request)
        log.exception("request %s %s %s failed", request_id, request.method, request.url.path)
        return JSONResponse(
            {
                "error": f"internal error (request id {request_id}); the server log has the details",
                "request_id": request_id,
            },
            status_code=500,
            headers={REQUEST_ID_HEADER: request_id},
        )

    def health(request: Request, body: bytes) -> Any:
        connection.ping()
        return {"status": "ok"}

    def context(request: Request, body: bytes) -> Any:
        agent_id = request.query_params.get("agent_id")
        if not agent_id:
            raise BadRequest("query parameter agent_id is required")
        task_id = request.query_params.get("task_id") or None
        if task_id is not None:
            try:
                check_task_id(task_id)
            except InvalidFact as exc:
                raise BadRequest(f"query parameter task_id: {exc.problem}") from None
        scope = granted(request)
        package = reader.build_context(
            request.path_params["project_id"],
            agent_id,
            task=request.query_params.get("task") or None,
            budget_tokens=fields.BUDGET_TOKENS.integer(request),
            task_id=task_id,
            tags=list_param(request, "tag"),
            include_global=scope is not None and scope.allows_global,  # the global tier only with the grant
            thread=None if (thread := thread_param(request)) is None else str(thread),
        )
        if request.query_params.get("format") == "text":
            return Response(package.render(), media_type="text/plain; charset=utf-8")
        return package.to_dict()

    def search(request: Request, body: bytes) -> Any:
        query = request.query_params.get("q")
        if not query:
            raise BadRequest("query parameter q (the search text) is required")
        if reader.searcher is None:
            raise Unavailable("this server has no vector store configured; semantic search is unavailable")
        kinds = fields.SEARCH_KINDS.choices(request) or DEFAULT_KINDS
        result = reader.search_result(
            request.path_params["project_id"],
            query,
            filters_from_query(request),
            fields.SEARCH_K.integer(request),
            prefer=prefer_param(request),
            kinds=kinds,
        )
        # degraded: None, or why the answer is lexical-only (the query could not be embedded).
        answer: dict[str, Any] = {"hits": [h.to_dict() for h in result.hits], "degraded": result.degraded}
        if any(kind != "minute" for kind in kinds):
            # every kind asked for, best first, each saying its kind (and a fact or summary its source minute ids)
            answer["ranked"] = [ranked_hit(h) for h in result.ranked]
        return answer

    def thread_show(request: Request, body: bytes) -> Any:
        project_id = request.path_params["project_id"]
        thread = thread_param(request, request.path_params["thread"])
        assert thread is not None
        recent = fields.THREAD_RECENT.integer(request, reader.thread_recent)
        # A thread the pool has not seen (yet) is an empty one, as a project with no minutes has an empty context.
        return threads.thread_view(project_id, thread, recent).to_dict()

    def recent(request: Request, body: bytes) -> Any:
        minutes = reader.get_recent(request.path_params["project_id"], fields.RECENT_N.integer(request))
        return {"minutes": minutes}

    def stats(request: Request, body: bytes) -> Any:
        return project_stats(connection, request.path_params["project_id"])

    def global_stats(request: Request, body: bytes) -> Any:
        """The global tier's numbers (`pvm stats --global`): its facts, what its evaluation runs pruned and merged."""
        scope = granted(request)
        if scope is None or not scope.allows_global:
            raise Forbidden(
                "this token may not read the global tier; its stats need a token with the global grant "
                "(pvm token new --global)"
            )
        return project_stats(connection, GLOBAL_TENANT)

    def by_ids(request: Request, body: bytes) -> Any:
        ids = list_param(request, "ids")
        if not ids:
            raise BadRequest("query parameter ids (comma-separated minute ids) is required")
        if len(ids) > MAX_BATCH:
            raise BadRequest(f"at most {MAX_BATCH} ids per request")
        return {"minutes": reader.get_by_ids(request.path_params["project_id"], ids)}

    def ingest(request: Request, body: bytes) -> Any:
        payload = json_body(body)
        raw_minutes = payload.get("minutes") if isinstance(payload, dict) else payload
        if not isinstance(raw_minutes, list) or not raw_minutes:
            raise BadRequest('body must be {"minutes": [minute, ...]} (or a JSON array of minutes)')
        if len(raw_minutes) > MAX_BATCH:
            raise BadRequest(f"at most {MAX_BATCH} minutes per request, got {len(raw_minutes)}")
        # Scope before contract: a batch that writes anywhere this token may not go is refused whole (403),
        # whatever else is wrong with it; a project id that is not a valid id is left to the contract (422).
        scope = granted(request)
        foreign: dict[str, list[int]] = {}
        for i, raw in enumerate(raw_minutes):
            project_id = raw.get("project_id") if isinstance(raw, dict) else None
            if is_valid_project_id(project_id) and (scope is None or not scope.allows(project_id)):
                foreign.setdefault(project_id, []).append(i)
        if foreign:
            return JSONResponse(
                {
                    "error": forbidden(", ".join(sorted(foreign)), "write") + "; nothing was accepted",
                    "errors": [
                        {"index": i, "field": "project_id", "problem": forbidden(project_id, "write")}
                        for project_id, indexes in foreign.items()
                        for i in indexes
                    ],
                },
                status_code=403,
            )
        errors = []
        encoded: list[tuple[int, bytes, str]] = []
        first_of: dict[str, int] = {}
        for i, raw in enumerate(raw_minutes):
            try:
                if not isinstance(raw, dict):
                    raise InvalidMinute("minute", f"must be a JSON object, got {type(raw).__name__}")
                # The wire form's schema version may come along (the golden vectors carry it), if this build reads it.
                version = raw.get("v", SCHEMA_VERSION)
                if type(version) is not int or version not in SUPPORTED_VERSIONS:
                    raise InvalidMinute(
                        "v",
                        f"is the schema version: {version!r} is not one this server reads "
                        f"({sorted(SUPPORTED_VERSIONS)}); leave it out or send {SCHEMA_VERSION}",
                    )
                event_type = raw.get("event_type")
                if isinstance(event_type, str) and event_type in SYSTEM_EVENT_TYPES:  # a list is Minute's to refuse
                    raise InvalidMinute("event_type", knowledge_change_refused(str(raw["event_type"])))
                # A client's own id makes a retry idempotent (the log keeps each id once); without one, one is minted.
                raw = {"id": new_minute_id(), "timestamp": utc_now_iso(), **{k: x for k, x in raw.items() if k != "v"}}
                minute = Minute.from_dict(raw)
                first = first_of.setdefault(minute.id, i)
                if first != i:
                    raise InvalidMinute(
                        "id", f"repeats the id of minute {first} ({minute.id}); ids are unique in a batch"
                    )
                encoded.append((keys.shard_of(minute.project_id, shards), encode_minute(minute), minute.id))
            except InvalidMinute as exc:
                errors.append({"index": i, "field": exc.field, "problem": exc.problem})
        if errors:
            return JSONResponse({"error": "invalid minutes; nothing was accepted", "errors": errors}, status_code=422)
        ids = [minute_id for _, _, minute_id in encoded]
        try:
            entry_ids = append_batch(encoded)
        except redis.exceptions.RedisError as exc:
            wrong_type = str(exc).startswith("WRONGTYPE")
            error = (
                f"{exc}: nothing of the batch was written; an operator must move that key away"
                if wrong_type
                else f"Redis unavailable: {exc}; resend the batch with these ids (the log keeps each id once)"
            )
            request_id = request_id_of(request)
            log.warning("request %s POST /v1/minutes: 503 %s", request_id, error)
            return JSONResponse(
                {"error": error, "ids": ids, "request_id": request_id},
                status_code=503,
                headers={REQUEST_ID_HEADER: request_id},
            )
        return JSONResponse(
            {
                "accepted": len(encoded),
                "ids": ids,
                "stream_ids": [e.decode() if isinstance(e, bytes) else e for e in entry_ids],
            },
            status_code=202,
        )

    append_script = connection.register_script(APPEND_BATCH)

    def append_batch(encoded: list[tuple[int, bytes, str]]) -> list[bytes]:
        """XADD every minute of a batch to its shard stream in one script: all of them or, on an error, none."""
        streams = sorted({keys.stream(shard) for shard, _, _ in encoded})
        position = {stream: str(i + 1) for i, stream in enumerate(streams)}
        args: list[bytes | str] = [keys.MINUTE_FIELD]
        for shard, data, _ in encoded:
            args.extend((position[keys.stream(shard)], data))
        return list(append_script(keys=streams, args=args))

    def write(minutes: Sequence[Minute]) -> list[str]:
        """Knowledge-change minutes the routes built (facts, PAIR, memory), to their streams (`write_minutes`)."""
        return write_minutes(connection, shards, minutes)

    facts = FactRoutes(FactStore(connection), reader.searcher, write)
    pairs = PairRoute(pair or Pair(), reader.searcher, write)
    threads = SummaryStore(connection)
    memory = MemoryRoutes(connection, write)

    def scoped(handler: Callable[[Request, bytes, TokenScope], Any]) -> Callable[[Request], Any]:
        """A facts route: its handler also gets the token's scope, which says whether it reaches the global tier."""

        def with_scope(request: Request, body: bytes) -> Any:
            scope = granted(request)
            if scope is None:  # the route wrapper has refused such a request already; never reached
                raise Forbidden(forbidden(request.path_params.get("project_id", "")))
            return handler(request, body, scope)

        return route(with_scope)

    document = openapi_document(token_required=guarded, scoped=tokens is not None)

    def openapi(request: Request, body: bytes) -> Any:
        return document

    beside: list[BaseRoute] = []
    if pages is not None:
        checker = BearerAuth(lambda *_: None, token=token, tokens=tokens)  # type: ignore[arg-type]
        parts = AppParts(
            reader,
            connection,
            facts,
            memory,
            threads,
            shards,
            settings,
            granted,
            lambda given: checker.scope_of(f"Bearer {given}"),
            guarded,
        )
        beside = list(pages.routes(parts))

    return Starlette(
        routes=[
            *beside,
            Route(HEALTH_PATH, route(health)),
            Route("/openapi.json", route(openapi)),
            Route("/v1/minutes", route(ingest), methods=["POST"]),
            Route("/v1/projects/{project_id}/context", route(context)),
            Route("/v1/projects/{project_id}/search", route(search)),
            Route("/v1/projects/{project_id}/recent", route(recent)),
            Route("/v1/projects/{project_id}/threads/{thread}", route(thread_show)),
            Route("/v1/projects/{project_id}/minutes", route(by_ids)),
            Route("/v1/projects/{project_id}/stats", route(stats)),
            Route("/v1/global/stats", route(global_stats)),
            Route("/v1/projects/{project_id}/facts", scoped(facts.list_facts), methods=["GET"]),
            Route("/v1/projects/{project_id}/facts", scoped(facts.assert_fact), methods=["POST"]),
            Route("/v1/projects/{project_id}/facts/{fact_id}", scoped(facts.show)),
            Route("/v1/projects/{project_id}/facts/{fact_id}/history", scoped(facts.history)),
            Route("/v1/projects/{project_id}/facts/{fact_id}/promote", scoped(facts.promote), methods=["POST"]),
            Route("/v1/projects/{project_id}/facts/{fact_id}/retract", scoped(facts.retract), methods=["POST"]),
            Route("/v1/projects/{project_id}/learn", scoped(facts.learn), methods=["POST"]),
            Route("/v1/projects/{project_id}/recall", scoped(facts.recall)),
            Route("/v1/projects/{project_id}/recall/{key}", scoped(facts.recall)),
            Route("/v1/projects/{project_id}/memory/export", scoped(memory.export), methods=["GET"]),
            Route("/v1/projects/{project_id}/memory/export", scoped(memory.import_files), methods=["PUT"]),
            Route("/v1/projects/{project_id}/memory/files", scoped(memory.list_files), methods=["GET"]),
            Route("/v1/projects/{project_id}/memory/file", scoped(memory.read), methods=["GET"]),
            Route("/v1/projects/{project_id}/memory/file", scoped(memory.write_file), methods=["PUT"]),
            Route("/v1/projects/{project_id}/memory/patch", scoped(memory.patch), methods=["POST"]),
            Route("/v1/projects/{project_id}/memory/append", scoped(memory.append), methods=["POST"]),
            Route("/v1/projects/{project_id}/pair", route(pairs.run), methods=["POST"]),
        ],
        middleware=[Middleware(BearerAuth, token=token, tokens=tokens, pages=pages)] if guarded else [],
    )


def run_server(
    settings: Settings,
    addr: str,
    port: int,
    index_worker: bool,
    tokens: TokenFile | None = None,
    mcp: bool = False,
    pages: BrowserPages | None = None,
) -> None:
    """`pvm serve`: the API under uvicorn; with the embedded engine also the index and evaluate pools, in this process.

    The embedded engine's files belong to one process, so the process that
    answers searches is the one that indexes: the RQ worker for the index queue
    runs in the main thread (it needs signals for a warm shutdown) and uvicorn
    in a second thread. With a Qdrant server the API is stateless and index
    workers run anywhere (`pvm worker index`).
    """
    import threading

    import uvicorn

    from pvm.connection import redis_from_settings
    from pvm.engines import close_shared, searcher_for
    from pvm.pair import SearchRetriever
    from pvm.stores.log import LogReader

    # Before anything else: a tokens file that cannot be used stops the server (TokenFileError), never opens it.
    if tokens is None and settings.api_tokens_file is not None:
        tokens = TokenFile(settings.api_tokens_file)
    connection = redis_from_settings(settings)
    reader = ContextReader(
        connection,
        LogReader(settings.log_dir),
        searcher_for(settings),  # type: ignore[arg-type]
        fact_tier_split=settings.fact_tier_split,
        thread_recent=settings.summary_recent,
        recent_share=settings.context_recent_share,
        retrieved_share=settings.context_retrieved_share,
    )
    # The judge and reviser PVM_PAIR_* ask for; the route gives the loop the reader's search and the API's writes.
    pair = Pair.from_settings(settings, retriever=SearchRetriever(reader.searcher), record=lambda minute: None)  # type: ignore[arg-type]
    app: Any = create_app(
        reader,
        connection,
        settings.shards,
        api_token=settings.api_token,
        tokens=tokens,
        pair=pair,
        pages=pages,
        settings=settings,
    )
    if mcp:  # `pvm serve --mcp`: the MCP tools at /mcp, calling this app in-process
        from workers.agent.mcp_server import beside_api

        app = beside_api(app, host=addr)
    if settings.api_token is None and tokens is None and not is_loopback(addr):
        log.warning(
            "the reader API on %s:%d is unauthenticated: anyone who reaches it can read and write every project; "
            "set PVM_API_TOKEN or PVM_API_TOKENS_FILE to require a bearer token",
            addr,
            port,
        )
    server = uvicorn.Server(uvicorn.Config(app, host=addr, port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name="pvm-api", daemon=True)
    thread.start()
    try:
        if index_worker:
            from workers.runtime.runner import run_worker

            run_worker(["index", "evaluate"], settings)  # the evaluate pool writes scores onto the engine too
        else:
            import signal

            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            signal.signal(signal.SIGINT, lambda *_: stop.set())
            stop.wait()
    finally:
        server.should_exit = True
        thread.join(10)
        close_shared()

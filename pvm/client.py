"""The reader API over HTTP (`pvm serve`): an agent's context, search, reads and writes without Redis access.

    from pvm import Client, Minute

    with Client() as api:  # PVM_API_URL (default: pvm.defaults.API_URL, this machine), PVM_API_TOKEN
        api.post_minutes([Minute(project_id="apollo", event_type="task_assigned", agent_id="planner")])
        prompt = api.context_text("apollo", "coder", task="fix the session cookie")
        newest = api.recent("apollo", 20, as_minutes=True)  # `Minute` records, not JSON objects

    async with AsyncClient() as api:  # the same methods, each a coroutine
        hits = (await api.search("apollo", "cookie expiry"))["hits"]

Each method is one route of the API (`pvm.routes` builds its requests, for
both clients) and returns its JSON answer as plain Python values
(`/openapi.json` describes them); reads of minutes take `as_minutes=True`
for `Minute` records. `PVMClient` is `Client`'s earlier name. Errors are
`PVMAPIError` (a `pvm.PvmError`):
`PVMRequestError` for a 4xx (the request must change: a parameter, the token,
the project, a minute), `PVMServerError` for a 5xx or no answer at all (status
None: unreachable, timed out), which a later try may get past. Each carries the
status, the server's message and the request id the server logged it under.

Every call is idempotent, so every call is retried (`retries` times, with
backoff) when it could not connect or was answered 503: reads change nothing,
and `post_minutes` sends each minute with its id (chosen here when the caller
gave none), which the log keeps once however often it arrives. A call that
timed out or lost its connection after sending is not retried: the caller
decides (resending the same `Minute` objects is safe).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from contracts.errors import PvmError
from pvm import defaults, routes
from pvm.config import ConfigError, Settings
from pvm.routes import Call, Request, project_path

__all__ = [
    "AsyncClient",
    "Client",
    "PVMAPIError",
    "PVMClient",
    "PVMRequestError",
    "PVMServerError",
    "project_path",
]

_T = TypeVar("_T")

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-ID"  # the server logs an error under the id a client sends


class PVMAPIError(PvmError):
    """The reader API did not do what was asked. `str()` is a sentence for a person; the fields are for code."""

    def __init__(
        self,
        summary: str,
        *,
        status: int | None,
        message: str,
        request_id: str | None,
        errors: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        super().__init__(summary)
        self.status = status  # the HTTP status; None when no answer came (unreachable, timed out)
        self.message = message  # the server's own error text (or the transport's)
        self.request_id = request_id  # find the server's log line with it
        # per-minute problems of a refused batch: {"index", "field", "problem"}; a facts change's: {"field", "problem"};
        # a refused memory import's: {"problem"} for each refused file
        self.errors = list(errors)


class PVMRequestError(PVMAPIError):
    """A 4xx: the API refused the request as sent (a parameter, the token, the project, a minute); fix it first."""


class PVMServerError(PVMAPIError):
    """A 5xx, or no answer (status None): the server or a store behind it is down or failing; try again later."""


# -- the two clients: one sends with httpx.Client, the other with httpx.AsyncClient -----------------------------


class _Connection:
    """What both clients share: the URL, the token, the retry policy, and reading answers and failures."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        settings: Settings | None = None,
        timeout: float = defaults.API_TIMEOUT_S,
        connect_timeout: float = defaults.API_CONNECT_TIMEOUT_S,
        retries: int = defaults.API_RETRIES,
        retry_backoff: float = defaults.API_RETRY_BACKOFF_S,
        transport: Any = None,
    ) -> None:
        """`base_url` and `token` default to PVM_API_URL and PVM_API_TOKEN (from `settings`, else the environment).

        `transport`: an httpx transport to send through (`httpx.ASGITransport(app)` serves an app in-process).
        """
        if base_url is None or token is None:
            settings = settings or Settings.from_env()
            base_url = base_url or settings.api_url
            token = settings.api_token if token is None else token
        self.base_url = (base_url or defaults.API_URL).strip().rstrip("/")
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"PVM_API_URL={self.base_url!r} is not an http(s) URL: set it to the reader API, "
                f"e.g. {defaults.API_URL}"
            )
        if retries < 0 or retry_backoff < 0:
            raise ValueError(f"retries={retries} and retry_backoff={retry_backoff} must be 0 or more")
        # A token read from a file-backed secret often ends in a newline the server would not accept.
        self._token = (token or "").strip() or None
        self.retries = retries
        self.retry_backoff = retry_backoff
        self._options: dict[str, Any] = {
            "base_url": self.base_url,
            "headers": {"Authorization": f"Bearer {self._token}"} if self._token else {},
            "timeout": httpx.Timeout(timeout, connect=connect_timeout),
        }
        if transport is not None:
            self._options["transport"] = transport

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r}, token={'set' if self._token else 'unset'})"

    @staticmethod
    def _arguments(request: Request, request_id: str) -> dict[str, Any]:
        """httpx's arguments for one try of a request: parameters left unset are left out of the query."""
        query = {k: v for k, v in (request.params or {}).items() if v is not None and v != "" and v != []}
        return {
            "method": request.method,
            "url": request.path,
            "params": query,
            "json": request.body,
            "headers": {REQUEST_ID_HEADER: request_id},
        }

    def _settle(
        self, sent: httpx.Response | httpx.TransportError, attempt: int, request: Request, request_id: str
    ) -> httpx.Response | float:
        """What one try came to: the answer, or how long to wait before the next try; raises when none is due.

        Retried while it cannot connect or is answered 503; a call that timed out or lost its connection after
        sending is not (it may have been processed: the caller decides whether to resend).
        """
        failure: PVMAPIError
        if isinstance(sent, httpx.Response):
            if sent.status_code < 400:
                return sent
            failure = self._refused(sent, request_id)
            if sent.status_code != 503:
                raise failure
        else:
            failure = self._unreachable(sent, request_id)
            if not isinstance(sent, httpx.ConnectError | httpx.ConnectTimeout):
                raise failure from sent
        if attempt >= self.retries:
            raise failure
        wait = float(self.retry_backoff * 2**attempt)
        log.info(
            "%s %s: %s; try %d of %d in %.2fs",
            request.method,
            request.path,
            failure,
            attempt + 2,
            self.retries + 1,
            wait,
        )
        return wait

    def _answer(self, request: Request, response: httpx.Response) -> Any:
        """The answer of a request that succeeded: its text, or its JSON object (`PVMServerError` if it has none)."""
        if request.text:
            return response.text
        where = f"{request.method} {request.path}"
        try:
            answer = response.json()
        except ValueError:
            raise PVMServerError(
                f"the server at {self.base_url} answered {where} with something that is not JSON "
                f"({_excerpt(response.text)!r}): is PVM_API_URL the reader API?",
                status=response.status_code,
                message=_excerpt(response.text),
                request_id=response.request.headers.get(REQUEST_ID_HEADER),
            ) from None
        if not isinstance(answer, dict):
            raise PVMServerError(
                f"the reader API answered {where} with JSON that is not an object: is PVM_API_URL the reader API?",
                status=response.status_code,
                message=_excerpt(response.text),
                request_id=response.request.headers.get(REQUEST_ID_HEADER),
            )
        return answer

    def _unreachable(self, exc: httpx.TransportError, request_id: str) -> PVMServerError:
        reason = str(exc) or type(exc).__name__
        return PVMServerError(
            f"cannot reach the reader API at {self.base_url} ({reason}); "
            "start it with `pvm up` or `pvm serve`, or point PVM_API_URL at it",
            status=None,
            message=reason,
            request_id=request_id,
        )

    def _refused(self, response: httpx.Response, sent_id: str) -> PVMAPIError:
        status = response.status_code
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {"error": _excerpt(response.text) or response.reason_phrase}
        message = str(body.get("error") or response.reason_phrase)
        request_id = str(body.get("request_id") or response.headers.get(REQUEST_ID_HEADER) or sent_id)
        errors = body.get("errors")
        errors = [e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else []
        if not errors and isinstance(body.get("field"), str):  # a facts route's 422 names one body field
            errors = [{"field": body["field"], "problem": message}]
        if not errors and isinstance(body.get("problems"), list):  # a refused memory import: each refused file
            errors = [{"problem": str(problem)} for problem in body["problems"]]
        if status == 401:
            refused = "refused the token" if self._token else "requires a token"
            summary = f"the reader API {refused}: set PVM_API_TOKEN to the server's token (API at {self.base_url})"
        elif status < 500:
            summary = f"the reader API refused the request ({status}): {message}"
        else:
            failed = "is unavailable" if status == 503 else "failed"
            summary = f"the reader API {failed} ({status}): {message}"
            if request_id not in message:
                summary += f" (request id {request_id})"
        kind = PVMRequestError if status < 500 else PVMServerError
        return kind(summary, status=status, message=message, request_id=request_id, errors=errors)


_P = ParamSpec("_P")


def _sync(build: Callable[_P, Call[_T]]) -> Callable[Concatenate[Client, _P], _T]:
    """A `Client` method from a route's request builder: it sends the requests and returns the result."""

    @functools.wraps(build)
    def method(self: Client, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        return self.perform(build(*args, **kwargs))

    return method


def _async(build: Callable[_P, Call[_T]]) -> Callable[Concatenate[AsyncClient, _P], Awaitable[_T]]:
    """An `AsyncClient` method from a route's request builder: a coroutine that sends and returns the result."""

    @functools.wraps(build)
    async def method(self: AsyncClient, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        return await self.perform(build(*args, **kwargs))

    return method


class Client(_Connection):
    """A client of one reader API. Thread-safe (one connection pool); keep one per process, `close()` at the end.

    `Client(base_url=None, token=None, *, settings=None, timeout, connect_timeout, retries, retry_backoff,
    transport=None)`: see the module's docstring.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._http = httpx.Client(**self._options)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def perform(self, call: Call[_T]) -> _T:
        """Send a call's requests in order and make its result (each method is one call)."""
        return call.result([self._send(request) for request in call.requests])

    def _send(self, request: Request) -> Any:
        request_id = uuid.uuid4().hex  # one id for every try: the server's log lines of one call share it
        for attempt in itertools.count():
            settled = self._settle(self._try(request, request_id), attempt, request, request_id)
            if isinstance(settled, httpx.Response):
                return self._answer(request, settled)
            time.sleep(settled)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _try(self, request: Request, request_id: str) -> httpx.Response | httpx.TransportError:
        try:
            return self._http.request(**self._arguments(request, request_id))
        except httpx.TransportError as exc:
            return exc

    health = _sync(routes.health)
    openapi = _sync(routes.openapi)
    context = _sync(routes.context)
    context_text = _sync(routes.context_text)
    thread = _sync(routes.thread)
    search = _sync(routes.search)
    stats = _sync(routes.stats)
    global_stats = _sync(routes.global_stats)
    recent = _sync(routes.recent)
    minutes = _sync(routes.minutes)
    post_minutes = _sync(routes.post_minutes)
    facts = _sync(routes.facts)
    fact = _sync(routes.fact)
    fact_history = _sync(routes.fact_history)
    assert_fact = _sync(routes.assert_fact)
    promote = _sync(routes.promote)
    retract = _sync(routes.retract)
    learn = _sync(routes.learn)
    recall = _sync(routes.recall)
    pair = _sync(routes.pair)
    memory_list = _sync(routes.memory_list)
    memory_read = _sync(routes.memory_read)
    memory_write = _sync(routes.memory_write)
    memory_patch = _sync(routes.memory_patch)
    memory_append = _sync(routes.memory_append)
    memory_export = _sync(routes.memory_export)
    memory_export_versioned = _sync(routes.memory_export_versioned)
    memory_import = _sync(routes.memory_import)


class AsyncClient(_Connection):
    """`Client` for asyncio: the same methods, arguments and errors, each a coroutine (httpx.AsyncClient).

    Close it with `await client.aclose()` or `async with AsyncClient() as api:`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._http = httpx.AsyncClient(**self._options)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def perform(self, call: Call[_T]) -> _T:
        """Send a call's requests in order and make its result (each method is one call)."""
        return call.result([await self._send(request) for request in call.requests])

    async def _send(self, request: Request) -> Any:
        request_id = uuid.uuid4().hex
        for attempt in itertools.count():
            settled = self._settle(await self._try(request, request_id), attempt, request, request_id)
            if isinstance(settled, httpx.Response):
                return self._answer(request, settled)
            await asyncio.sleep(settled)
        raise AssertionError("unreachable")

    async def _try(self, request: Request, request_id: str) -> httpx.Response | httpx.TransportError:
        try:
            return await self._http.request(**self._arguments(request, request_id))
        except httpx.TransportError as exc:
            return exc

    health = _async(routes.health)
    openapi = _async(routes.openapi)
    context = _async(routes.context)
    context_text = _async(routes.context_text)
    thread = _async(routes.thread)
    search = _async(routes.search)
    stats = _async(routes.stats)
    global_stats = _async(routes.global_stats)
    recent = _async(routes.recent)
    minutes = _async(routes.minutes)
    post_minutes = _async(routes.post_minutes)
    facts = _async(routes.facts)
    fact = _async(routes.fact)
    fact_history = _async(routes.fact_history)
    assert_fact = _async(routes.assert_fact)
    promote = _async(routes.promote)
    retract = _async(routes.retract)
    learn = _async(routes.learn)
    recall = _async(routes.recall)
    pair = _async(routes.pair)
    memory_list = _async(routes.memory_list)
    memory_read = _async(routes.memory_read)
    memory_write = _async(routes.memory_write)
    memory_patch = _async(routes.memory_patch)
    memory_append = _async(routes.memory_append)
    memory_export = _async(routes.memory_export)
    memory_export_versioned = _async(routes.memory_export_versioned)
    memory_import = _async(routes.memory_import)


PVMClient = Client  # the name before `Client`; both stay


def _excerpt(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"

"""The reader API over HTTP (`pvm serve`): an agent's context, search, reads and writes without Redis access.

    from pvm import Minute, PVMClient

    with PVMClient() as api:  # PVM_API_URL (default: pvm.defaults.API_URL, this machine), PVM_API_TOKEN
        api.post_minutes([Minute(project_id="apollo", event_type="task_assigned", agent_id="planner")])
        prompt = api.context_text("apollo", "coder", task="fix the session cookie")

Each method is one route of the API and returns its JSON answer as plain
Python values (`/openapi.json` describes them). Errors are `PVMAPIError`:
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

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from contracts import InvalidMinute, Minute, new_minute_id
from contracts.minute import check_project_id, utc_now_iso
from pvm import defaults
from pvm.config import ConfigError, Settings

_T = TypeVar("_T")

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-ID"  # the server logs an error under the id a client sends


class PVMAPIError(Exception):
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
        # per-minute problems of a refused batch: {"index", "field", "problem"}; a facts change's: {"field", "problem"}
        self.errors = list(errors)


class PVMRequestError(PVMAPIError):
    """A 4xx: the API refused the request as sent (a parameter, the token, the project, a minute); fix it first."""


class PVMServerError(PVMAPIError):
    """A 5xx, or no answer (status None): the server or a store behind it is down or failing; try again later."""


def project_path(project_id: str, route: str) -> str:
    """The path of a project's route, the project id quoted (it is one path segment, whatever it holds)."""
    return f"/v1/projects/{quote(project_id, safe='')}/{route}"


class PVMClient:
    """A client of one reader API. Thread-safe (one connection pool); keep one per process, `close()` at the end."""

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
    ) -> None:
        """`base_url` and `token` default to PVM_API_URL and PVM_API_TOKEN (from `settings`, else the environment)."""
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
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self._token}"} if self._token else {},
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
        )

    def __repr__(self) -> str:
        return f"PVMClient({self.base_url!r}, token={'set' if self._token else 'unset'})"

    def __enter__(self) -> PVMClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    # -- the routes ---------------------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """`{"status": "ok"}` when the API and its Redis answer; `PVMServerError` (503) when Redis does not."""
        return self._json("GET", "/healthz")

    def context(
        self,
        project_id: str,
        agent_id: str,
        task: str | None = None,
        budget_tokens: int | None = None,
        *,
        task_id: str | None = None,
        tags: Sequence[str] = (),
        thread: str | None = None,
    ) -> dict[str, Any]:
        """An agent's context package (recent, referenced, own track record, what we know, the rules that apply,
        relevant experience for `task`). `task_id` adds that task's facts; `tags` match rules too. Global facts
        come with a token that grants them. `thread` (a thread id, ``task:<id>`` or ``project``) builds it for one
        thread: its newest minutes, then its chunk summaries and episodes.

        `contracts.memory.ContextPackage.from_dict()` turns it into the typed record.
        """
        params: dict[str, Any] = {
            "agent_id": agent_id,
            "task": task,
            "budget_tokens": budget_tokens,
            "task_id": task_id,
            "thread": thread,
        }
        params["tag"] = _tags(tags)
        return self._json("GET", self._project(project_id, "context"), params)

    def thread(self, project_id: str, thread: str, recent: int | None = None) -> dict[str, Any]:
        """One thread of a project (a thread id, ``task:<id>`` or ``project``): its newest minutes, its chunk
        summaries and its episodes (`pvm.stores.summaries.ThreadView.to_dict()`); empty for a thread not seen yet."""
        if not isinstance(thread, str) or not thread.strip():
            raise ValueError("thread is required: a thread id, 'task:<task id>' or 'project'")
        path = self._project(project_id, "threads/" + quote(thread.strip(), safe=":"))
        return self._json("GET", path, {"recent": recent})

    def context_text(
        self,
        project_id: str,
        agent_id: str,
        task: str | None = None,
        budget_tokens: int | None = None,
        *,
        task_id: str | None = None,
        tags: Sequence[str] = (),
        thread: str | None = None,
    ) -> str:
        """The same context rendered as the text to put in a prompt."""
        params: dict[str, Any] = {
            "agent_id": agent_id,
            "task": task,
            "budget_tokens": budget_tokens,
            "task_id": task_id,
            "thread": thread,
        }
        params |= {"tag": _tags(tags), "format": "text"}
        return self._send("GET", self._project(project_id, "context"), params).text

    def search(
        self,
        project_id: str,
        query: str,
        k: int | None = None,
        *,
        categories: Sequence[str] = (),
        event_types: Sequence[str] = (),
        agents: Sequence[str] = (),
        task_id: str | None = None,
        thread_id: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        min_composite: float | None = None,
        prefer: str | None = None,
        include_pruned: bool = False,
        kinds: Sequence[str] = (),
    ) -> dict[str, Any]:
        """`{"hits": [...], "degraded": None | why the answer is lexical-only}`, best hit first.

        `kinds`: minutes only by default; with any of "minute", "fact", "summary", also ``ranked``: every
        kind asked for, best first, each with its ``kind`` (a fact or a summary with its source minute ids,
        ``sources``).

        `prefer`: "recent" lets recency lead, "relevant" keeps it a tie-breaker;
        None lets the query's words decide ("latest", "current", "now"...).
        `include_pruned`: also minutes the evaluate pool pruned (they stay in the log).
        """
        params = {
            "q": query,
            "k": k,
            "category": list(categories),
            "event_type": list(event_types),
            "agent": list(agents),
            "task_id": task_id,
            "thread_id": thread_id,
            "since_ms": since_ms,
            "until_ms": until_ms,
            "min_composite": min_composite,
            "prefer": prefer,
            "include_pruned": "true" if include_pruned else None,
            "kinds": ",".join(kinds) or None,
        }
        return self._json("GET", self._project(project_id, "search"), params)

    def stats(self, project_id: str) -> dict[str, Any]:
        """The project's memory in numbers: minutes, facts by type and tier, chunks, episodes, pruned, merged,
        tokens reclaimed and average scores (`GET /v1/projects/{p}/stats`)."""
        return dict(self._json("GET", self._project(project_id, "stats"), {}))

    def recent(self, project_id: str, n: int | None = None) -> list[dict[str, Any]]:
        """The project's newest `n` minutes (the server's default: 50), oldest first."""
        return list(self._json("GET", self._project(project_id, "recent"), {"n": n})["minutes"])

    def minutes(self, project_id: str, ids: Iterable[str]) -> list[dict[str, Any]]:
        """The project's minutes with these ids, in the order asked; ids it does not hold are left out."""
        path = self._project(project_id, "minutes")
        found: list[dict[str, Any]] = []
        for chunk in _id_chunks(list(ids)):
            found.extend(self._json("GET", path, {"ids": ",".join(chunk)})["minutes"])
        return found

    def post_minutes(self, minutes: Iterable[Minute | Mapping[str, Any]]) -> dict[str, Any]:
        """Append minutes to the streams: `{"accepted": n, "ids": [...], "stream_ids": [...]}`, in the order given.

        Each minute is validated here first (`InvalidMinute` names the minute and
        the field) and sent with its id: a mapping without one gets a new id and
        timestamp once, before the first try. Large inputs go in several requests;
        when one fails, those before it were accepted, and sending the same
        `Minute` objects (or mappings with ids) again is safe.
        """
        wire = [_wire_minute(i, m) for i, m in enumerate(minutes)]
        answer: dict[str, Any] = {"accepted": 0, "ids": [], "stream_ids": []}
        for batch in _post_batches(wire):
            part = self._json("POST", "/v1/minutes", body={"minutes": batch})
            answer["accepted"] += part["accepted"]
            answer["ids"] += part["ids"]
            answer["stream_ids"] += part["stream_ids"]
        return answer

    # -- facts: long-term memory (docs/http-api.md, "Facts") ---------------------------------------------------

    def facts(
        self,
        project_id: str,
        *,
        tiers: Sequence[str] = (),
        task: str | None = None,
        types: Sequence[str] = (),
        statuses: Sequence[str] = (),
        subject: str | None = None,
        attribute: str | None = None,
        q: str | None = None,
        as_of: str | datetime | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> dict[str, Any]:
        """A page of the project's facts: `{"facts": [...], "next_offset": int | None, "degraded": ...}`.

        Current (promoted) facts of the task's tier (with `task`) and the project's by default; `tiers` may
        name ``global`` (the token must grant it), `statuses` pending, superseded or retracted ones; `as_of`
        (ISO 8601 with an offset, or an aware datetime) gives what held then; `q` searches them, best first.
        """
        params = {
            "tier": list(tiers),
            "task": task,
            "type": list(types),
            "status": list(statuses),
            "subject": subject,
            "attribute": attribute,
            "q": q,
            "as_of": _instant(as_of),
            "limit": limit,
            "offset": offset,
        }
        return self._json("GET", self._project(project_id, "facts"), params)

    def fact(self, project_id: str, fact_id: str) -> dict[str, Any]:
        """One fact, any status (`contracts.Fact.from_dict()` types it); `PVMRequestError` 404 when not there."""
        return self._json("GET", self._fact(project_id, fact_id))

    def fact_history(self, project_id: str, fact_id: str) -> list[dict[str, Any]]:
        """Every value the fact's slot has held, superseded and retracted ones too, oldest `valid_from` first."""
        return list(self._json("GET", self._fact(project_id, fact_id, "history"))["facts"])

    def assert_fact(
        self, project_id: str, subject: str, attribute: str, value: str | int | float | bool, **fields: Any
    ) -> dict[str, Any]:
        """Assert a fact by hand: `{"fact_id", "minute_id", "stream_id", "also"?}` (202: the facts pool applies it).

        `fields`: type, text, tier ("task" or "project"), task_id, confidence, importance, status,
        valid_from, valid_until, tags, single_valued, agent_id. An older value of the slot is superseded.
        """
        body = {"subject": subject, "attribute": attribute, "value": value, **fields}
        return self._change(self._project(project_id, "facts"), body)

    def promote(
        self, project_id: str, fact_id: str, to_tier: str | None = None, *, agent_id: str | None = None
    ) -> dict[str, Any]:
        """Promote a pending fact, or with `to_tier` ("project", "global") copy it one tier up (a new fact id)."""
        return self._change(self._fact(project_id, fact_id, "promote"), {"to_tier": to_tier, "agent_id": agent_id})

    def retract(
        self, project_id: str, fact_id: str, reason: str | None = None, *, agent_id: str | None = None
    ) -> dict[str, Any]:
        """Retract a fact: it leaves the current view and stays in its slot's history."""
        return self._change(self._fact(project_id, fact_id, "retract"), {"reason": reason, "agent_id": agent_id})

    def learn(
        self,
        project_id: str,
        key: str,
        value: str | int | float | bool,
        *,
        tier: str | None = None,
        task_id: str | None = None,
        type: str | None = None,
        text: str | None = None,
        agent_id: str | None = None,
    ) -> dict[str, Any]:
        """`learn(key, value)`: a certain, promoted fact in the slot ``learned`` / `key` (task, project or global)."""
        body = {"key": key, "value": value, "tier": tier, "task_id": task_id, "type": type, "text": text}
        return self._change(self._project(project_id, "learn"), {**body, "agent_id": agent_id})

    def recall(
        self, project_id: str, key: str, *, task: str | None = None, tiers: Sequence[str] = ()
    ) -> dict[str, Any]:
        """`{"key", "fact": the learned value's fact or None, "searched": [tier keys]}`: task, project, then global.

        The global tier is looked in when the token grants it, or only the `tiers` named.
        """
        params = {"key": key, "task": task, "tier": list(tiers)}
        return self._json("GET", self._project(project_id, "recall"), params)

    def _change(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a change with a minute id chosen here: every retry writes the same minute (the log keeps it once)."""
        sent = {k: v for k, v in body.items() if v is not None}
        sent.setdefault("minute_id", new_minute_id())
        return self._json("POST", path, body=sent)

    def _fact(self, project_id: str, fact_id: str, action: str | None = None) -> str:
        path = self._project(project_id, "facts/" + quote(fact_id, safe=""))
        return path if action is None else f"{path}/{action}"

    @staticmethod
    def _project(project_id: str, route: str) -> str:
        """A project's route, the id checked first: `InvalidMinute` names it before anything is sent."""
        check_project_id(project_id)
        return project_path(project_id, route)

    # -- one call -------------------------------------------------------------------------------------------------

    def _json(
        self, method: str, path: str, params: Mapping[str, Any] | None = None, body: Any = None
    ) -> dict[str, Any]:
        response = self._send(method, path, params, body)
        try:
            answer = response.json()
        except ValueError:
            raise PVMServerError(
                f"the server at {self.base_url} answered {method} {path} with something that is not JSON "
                f"({_excerpt(response.text)!r}): is PVM_API_URL the reader API?",
                status=response.status_code,
                message=_excerpt(response.text),
                request_id=response.request.headers.get(REQUEST_ID_HEADER),
            ) from None
        if not isinstance(answer, dict):
            raise PVMServerError(
                f"the reader API answered {method} {path} with JSON that is not an object: is PVM_API_URL the "
                "reader API?",
                status=response.status_code,
                message=_excerpt(response.text),
                request_id=response.request.headers.get(REQUEST_ID_HEADER),
            )
        return answer

    def _send(
        self, method: str, path: str, params: Mapping[str, Any] | None = None, body: Any = None
    ) -> httpx.Response:
        """One call, retried while it cannot connect or is answered 503; any other error raises `PVMAPIError`."""
        request_id = uuid.uuid4().hex  # one id for every try: the server's log lines of one call share it
        query = {k: v for k, v in (params or {}).items() if v is not None and v != "" and v != []}
        for attempt in range(self.retries + 1):
            failure: PVMAPIError
            try:
                response = self._http.request(
                    method, path, params=query, json=body, headers={REQUEST_ID_HEADER: request_id}
                )
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                failure = self._unreachable(exc, request_id)
            except httpx.TransportError as exc:  # sent, perhaps processed: the caller decides whether to resend
                raise self._unreachable(exc, request_id) from exc
            else:
                if response.status_code < 400:
                    return response
                failure = self._refused(response, request_id)
                if response.status_code != 503:
                    raise failure
            if attempt == self.retries:
                raise failure
            wait = self.retry_backoff * 2**attempt
            log.info("%s %s: %s; try %d of %d in %.2fs", method, path, failure, attempt + 2, self.retries + 1, wait)
            time.sleep(wait)
        raise AssertionError("unreachable")  # the loop returns or raises

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


def _instant(when: str | datetime | None) -> str | None:
    """`as_of` as the API takes it: ISO 8601 with an offset (an aware datetime is written so)."""
    if isinstance(when, datetime):
        if when.tzinfo is None:
            raise ValueError(f"as_of={when.isoformat()} has no UTC offset; pass an aware datetime")
        return when.isoformat()
    return when


def _wire_minute(index: int, minute: Minute | Mapping[str, Any]) -> dict[str, Any]:
    """A minute as `POST /v1/minutes` takes it, validated, with its id and timestamp fixed now."""
    if isinstance(minute, Minute):
        return minute.to_dict()
    if not isinstance(minute, Mapping):
        raise InvalidMinute(f"minutes[{index}]", f"must be a Minute or a mapping, got {type(minute).__name__}")
    try:
        return Minute.from_dict({"id": new_minute_id(), "timestamp": utc_now_iso(), **minute}).to_dict()
    except InvalidMinute as exc:
        raise InvalidMinute(f"minutes[{index}].{exc.field}", exc.problem) from None


def _post_batches(wire: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """The minutes in requests the server takes: at most API_MAX_BATCH minutes and about API_POST_BYTES each."""
    return _runs(wire, lambda minute: len(json.dumps(minute).encode()) + 1, defaults.API_POST_BYTES)


def _id_chunks(ids: list[str]) -> Iterator[list[str]]:
    """Ids in runs that fit one request line (API_QUERY_BYTES once quoted) and the server's API_MAX_BATCH."""
    return _runs(ids, lambda minute_id: len(quote(minute_id, safe="")) + 3, defaults.API_QUERY_BYTES)  # +3: ","


def _runs(items: list[_T], cost: Callable[[_T], int], max_bytes: int) -> Iterator[list[_T]]:
    """`items` in order, in runs of at most API_MAX_BATCH items whose costs add up to at most `max_bytes`."""
    run: list[_T] = []
    size = 0
    for item in items:
        c = cost(item)
        if run and (len(run) == defaults.API_MAX_BATCH or size + c > max_bytes):
            yield run
            run, size = [], 0
        run.append(item)
        size += c
    if run:
        yield run


def _excerpt(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _tags(tags: Sequence[str]) -> list[str]:
    if isinstance(tags, str):
        raise TypeError(f"tags must be a sequence of tags, not one string ({tags!r}): pass [{tags!r}]")
    return list(tags)

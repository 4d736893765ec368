"""What a request to the reader API carries, read and checked: query parameters, JSON bodies, and the 4xx they lead to.

Every answer a client can fix is one of these exceptions: the API's route
wrapper (workers/api/app.py) turns it into its status and JSON body, so a handler
only raises. Each message names the parameter or field and the fix.
"""

from __future__ import annotations

import json
from typing import Any

import redis
from starlette.requests import Request

from contracts import InvalidMinute, Minute
from contracts.json_value import MAX_JSON_DEPTH
from pvm.stores.log import LogError
from pvm.vectors import VectorStoreError


class BadRequest(ValueError):
    """A request a client can fix: the message says how. The only exception a handler's 4xx comes from."""

    status = 400

    def body(self) -> dict[str, Any]:
        """The JSON answer."""
        return {"error": str(self)}


class Forbidden(BadRequest):
    """The token does not reach what was asked for: a project, or the global tier of facts."""

    status = 403


class NotFound(BadRequest):
    """The thing a path names (a fact) is not there, or not where this token may look."""

    status = 404


class Conflict(BadRequest):
    """The request is well formed but the thing it changes is not in a state it applies to (a retracted fact)."""

    status = 409


class InvalidField(BadRequest):
    """A body field the contract refuses: 422, naming the field."""

    status = 422

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"body field {field}: {problem}")
        self.field = field
        self.problem = problem

    def body(self) -> dict[str, Any]:
        return {"error": str(self), "field": self.field}


class Unavailable(RuntimeError):
    """Something the request needs is down or not configured: 503, and the client may retry."""


# Errors of the stores behind the API (and the console) that mean an outage, not a bug: 503. Anything
# else a handler raises is a bug: logged with its traceback and answered 500.
OUTAGES: tuple[type[Exception], ...] = (Unavailable, redis.exceptions.RedisError, VectorStoreError, LogError)


def int_param(request: Request, name: str, default: int, low: int = 1, high: int = 100_000) -> int:
    """An integer query parameter within [low, high]; `default` when absent or empty."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name}={raw!r} is not a whole number") from None
    if not low <= value <= high:
        raise BadRequest(f"query parameter {name}={value} must be between {low} and {high}")
    return value


def list_param(request: Request, name: str) -> tuple[str, ...]:
    """A list query parameter: repeated, comma-separated, or both; empty entries are ignored."""
    values: list[str] = []
    for raw in request.query_params.getlist(name):
        values.extend(v for v in raw.split(",") if v)
    return tuple(values)


def choices_param(request: Request, name: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A list query parameter whose every value is one of `allowed` (each once, in the order given)."""
    values = tuple(dict.fromkeys(list_param(request, name)))
    for value in values:
        if value not in allowed:
            raise BadRequest(f"query parameter {name}={value[:40]!r} must be one of {', '.join(allowed)}")
    return values


def json_body(body: bytes) -> Any:
    """The request body as JSON; NaN and Infinity parse to floats, which the minute contract refuses by path (422)."""
    try:
        return json.loads(body or b"null")
    except json.JSONDecodeError as exc:
        raise BadRequest(f"request body is not JSON: {exc}") from None
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request body is not JSON in UTF-8: {exc.reason} at byte {exc.start}") from None
    except RecursionError:
        raise BadRequest(
            f"request body nests too deeply to parse; a minute's data may nest at most {MAX_JSON_DEPTH} levels"
        ) from None


def json_object(body: bytes, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """A JSON object body holding every `required` field and nothing but those and `optional` ones (else 400 / 422).

    An empty body is `{}` when nothing is required. A field sent as null is taken as left out.
    """
    parsed = json_body(body) if body.strip() else {}
    if not isinstance(parsed, dict):
        shown = ", ".join(f'"{name}": ...' for name in required) or "..."
        raise BadRequest(f"request body must be a JSON object {{{shown}}}, got {type(parsed).__name__}")
    allowed = (*required, *optional)
    for name in parsed:
        if name not in allowed:
            raise InvalidField(str(name)[:64], "is not a field of this request; fields: " + ", ".join(allowed))
    for name in required:
        if parsed.get(name) is None:
            raise InvalidField(name, "is required")
    return {k: v for k, v in parsed.items() if v is not None}


def agent_field(given: dict[str, Any]) -> str | None:
    """The ``agent_id`` a change request names (who makes the change), or None when left out; an empty or
    non-text one is refused, as the document says (minLength 1)."""
    agent = given.get("agent_id")
    if agent is None:
        return None
    if not isinstance(agent, str) or not agent:
        raise InvalidField(
            "agent_id", f"must name the agent making the change (a non-empty string) or be left out; got {agent!r}"
        )
    return agent


def minute_id_field(given: dict[str, Any]) -> str | None:
    """The ``minute_id`` a change request carries (checked as a minute id), or None: the client's id for the change's
    minute, so a retry is written once (the log keeps an id once)."""
    chosen = given.get("minute_id")
    if chosen is None:
        return None
    try:
        Minute(project_id="p", event_type="x", id=chosen)
    except InvalidMinute as exc:
        raise InvalidField("minute_id", exc.problem) from None
    return str(chosen)

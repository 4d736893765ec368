"""The reader API's routes as requests: one builder per route, which both `pvm.Client` and `pvm.AsyncClient` send.

A builder checks its arguments (a project id, each minute to post) and returns
a `Call`: the HTTP requests of one client method, in order, and how their
answers make its result. It does no I/O, so the sync client (httpx.Client) and
the asyncio one (httpx.AsyncClient) share every route's parameters, bodies,
batching and answer shapes, and differ only in how they send.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Generic, ParamSpec, TypeVar
from urllib.parse import quote

from contracts import InvalidMinute, Minute, new_minute_id
from contracts.minute import check_project_id, utc_now_iso
from pvm import defaults

_T = TypeVar("_T")
_P = ParamSpec("_P")


def project_path(project_id: str, route: str) -> str:
    """The path of a project's route, the project id quoted (it is one path segment, whatever it holds)."""
    return f"/v1/projects/{quote(project_id, safe='')}/{route}"


# -- the requests of each route, built once for both clients ---------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One HTTP request of a call; `text` when its answer is text, not a JSON object."""

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    body: Any = None
    text: bool = False


@dataclass(frozen=True)
class Call(Generic[_T]):
    """What one client method does: its requests, sent in order (the first failure ends the call), and how their
    answers (JSON objects, or text for a `text` request) make its result."""

    requests: Sequence[Request]
    result: Callable[[list[Any]], _T]


def _one(request: Request, shape: Callable[[Any], _T]) -> Call[_T]:
    return Call([request], lambda answers: shape(answers[0]))


def _as_is(answer: _T) -> _T:
    return answer


def _project(project_id: str, route: str) -> str:
    """A project's route, the id checked first: `InvalidMinute` names it before anything is sent."""
    check_project_id(project_id)
    return project_path(project_id, route)


def _fact(project_id: str, fact_id: str, action: str | None = None) -> str:
    path = _project(project_id, "facts/" + quote(fact_id, safe=""))
    return path if action is None else f"{path}/{action}"


def _change(path: str, body: dict[str, Any]) -> Call[dict[str, Any]]:
    """POST a change with a minute id chosen here: every retry writes the same minute (the log keeps it once)."""
    sent = {k: v for k, v in body.items() if v is not None}
    sent.setdefault("minute_id", new_minute_id())
    return _one(Request("POST", path, body=sent), _as_is)


def _minute_list(as_minutes: bool) -> Callable[[list[dict[str, Any]]], list[Any]]:
    """How a read's minutes come back: the JSON objects, or `Minute` records with `as_minutes`."""
    return (lambda found: [minute_record(m) for m in found]) if as_minutes else _as_is


def minute_record(fields: Mapping[str, Any]) -> Minute:
    """A minute the API answered with (`Minute.to_dict()`'s shape) as the `Minute` record."""
    return Minute.from_dict(dict(fields))


def health() -> Call[dict[str, Any]]:
    """`{"status": "ok"}` when the API and its Redis answer; `PVMServerError` (503) when Redis does not."""
    return _one(Request("GET", "/healthz"), _as_is)


def openapi() -> Call[dict[str, Any]]:
    """The API's OpenAPI 3.1 description (`GET /openapi.json`): every route, parameter and answer."""
    return _one(Request("GET", "/openapi.json"), _as_is)


def context(
    project_id: str,
    agent_id: str,
    task: str | None = None,
    budget_tokens: int | None = None,
    *,
    task_id: str | None = None,
    tags: Sequence[str] = (),
    thread: str | None = None,
) -> Call[dict[str, Any]]:
    """An agent's context package (recent, referenced, own track record, what we know, the rules that apply,
    relevant experience for `task`). `task_id` adds that task's facts; `tags` match rules too. Global facts
    come with a token that grants them. `thread` (a thread id, ``task:<id>`` or ``project``) builds it for one
    thread: its newest minutes, then its chunk summaries and episodes.

    `contracts.memory.ContextPackage.from_dict()` turns it into the typed record.
    """
    params = {
        "agent_id": agent_id,
        "task": task,
        "budget_tokens": budget_tokens,
        "task_id": task_id,
        "thread": thread,
        "tag": _tags(tags),
    }
    return _one(Request("GET", _project(project_id, "context"), params), _as_is)


def _rendered(build: Callable[_P, Call[Any]]) -> Callable[_P, Call[str]]:
    """A route's text form: the same request with ``format=text``, answered with the text itself."""

    @functools.wraps(build)
    def as_text(*args: _P.args, **kwargs: _P.kwargs) -> Call[str]:
        [request] = build(*args, **kwargs).requests
        return _one(replace(request, params={**(request.params or {}), "format": "text"}, text=True), str)

    as_text.__doc__ = f"The text of `{build.__name__}` for a prompt (``format=text``): the same arguments."
    return as_text


context_text = _rendered(context)


def thread(project_id: str, thread: str, recent: int | None = None) -> Call[dict[str, Any]]:
    """One thread of a project (a thread id, ``task:<id>`` or ``project``): its newest minutes, its chunk
    summaries and its episodes (`pvm.stores.summaries.ThreadView.to_dict()`); empty for a thread not seen yet."""
    if not isinstance(thread, str) or not thread.strip():
        raise ValueError("thread is required: a thread id, 'task:<task id>' or 'project'")
    path = _project(project_id, "threads/" + quote(thread.strip(), safe=":"))
    return _one(Request("GET", path, {"recent": recent}), _as_is)


def search(
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
    as_minutes: bool = False,
) -> Call[dict[str, Any]]:
    """`{"hits": [...], "degraded": None | why the answer is lexical-only}`, best hit first.

    `kinds`: minutes only by default; with any of "minute", "fact", "summary", also ``ranked``: every
    kind, best first, each with its ``kind`` and ``sources`` (the minute ids a fact or summary stands for).

    `prefer`: "recent" lets recency lead, "relevant" keeps it a tie-breaker;
    None lets the query's words decide ("latest", "current", "now"...).
    `include_pruned`: also minutes the evaluate pool pruned (they stay in the log).
    `as_minutes`: each hit's ``minute`` is a `Minute` record, not its JSON object.
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

    def shaped(answer: dict[str, Any]) -> dict[str, Any]:
        if as_minutes:
            answer["hits"] = [{**hit, "minute": minute_record(hit["minute"])} for hit in answer["hits"]]
        return answer

    return _one(Request("GET", _project(project_id, "search"), params), shaped)


def stats(project_id: str) -> Call[dict[str, Any]]:
    """The project's memory in numbers: minutes, facts by type and tier, chunks, episodes, pruned, merged,
    tokens reclaimed and average scores (`GET /v1/projects/{p}/stats`)."""
    return _one(Request("GET", _project(project_id, "stats"), {}), dict)


def global_stats() -> Call[dict[str, Any]]:
    """The global tier's memory in numbers, as `stats` gives a project's (`GET /v1/global/stats`; the token needs
    the global grant)."""
    return _one(Request("GET", "/v1/global/stats", {}), dict)


def recent(project_id: str, n: int | None = None, *, as_minutes: bool = False) -> Call[list[Any]]:
    """The project's newest `n` minutes (the server's default: 50), oldest first: JSON objects, or `Minute`
    records with `as_minutes`."""
    shape = _minute_list(as_minutes)
    return _one(Request("GET", _project(project_id, "recent"), {"n": n}), lambda a: shape(list(a["minutes"])))


def minutes(project_id: str, ids: Iterable[str], *, as_minutes: bool = False) -> Call[list[Any]]:
    """The project's minutes with these ids, in the order asked; ids it does not hold are left out. JSON
    objects, or `Minute` records with `as_minutes`."""
    path = _project(project_id, "minutes")
    requests = [Request("GET", path, {"ids": ",".join(chunk)}) for chunk in _id_chunks(list(ids))]
    shape = _minute_list(as_minutes)
    return Call(requests, lambda answers: shape([m for a in answers for m in a["minutes"]]))


def post_minutes(minutes: Iterable[Minute | Mapping[str, Any]]) -> Call[dict[str, Any]]:
    """Append minutes to the streams: `{"accepted": n, "ids": [...], "stream_ids": [...]}`, in the order given.

    Each minute is validated here first (`InvalidMinute` names the minute and
    the field) and sent with its id: a mapping without one gets a new id and
    timestamp once, before the first try. Large inputs go in several requests;
    when one fails, those before it were accepted, and sending the same
    `Minute` objects (or mappings with ids) again is safe.
    """
    wire = [_wire_minute(i, m) for i, m in enumerate(minutes)]
    requests = [Request("POST", "/v1/minutes", body={"minutes": batch}) for batch in _post_batches(wire)]

    def summed(answers: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "accepted": sum(a["accepted"] for a in answers),
            "ids": [i for a in answers for i in a["ids"]],
            "stream_ids": [i for a in answers for i in a["stream_ids"]],
        }

    return Call(requests, summed)


# -- facts: long-term memory (docs/http-api.md, "Facts") -------------------------------------------------------


def facts(
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
) -> Call[dict[str, Any]]:
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
    return _one(Request("GET", _project(project_id, "facts"), params), _as_is)


def fact(project_id: str, fact_id: str) -> Call[dict[str, Any]]:
    """One fact, any status (`contracts.Fact.from_dict()` types it); `PVMRequestError` 404 when not there."""
    return _one(Request("GET", _fact(project_id, fact_id)), _as_is)


def fact_history(project_id: str, fact_id: str) -> Call[list[dict[str, Any]]]:
    """Every value the fact's slot has held, superseded and retracted ones too, oldest `valid_from` first."""
    return _one(Request("GET", _fact(project_id, fact_id, "history")), lambda a: list(a["facts"]))


def assert_fact(
    project_id: str, subject: str, attribute: str, value: str | int | float | bool, **fields: Any
) -> Call[dict[str, Any]]:
    """Assert a fact by hand: `{"fact_id", "minute_id", "stream_id", "also"?}` (202: the facts pool applies it).

    `fields`: type, text, tier ("task" or "project"), task_id, confidence, importance, status,
    valid_from, valid_until, tags, single_valued, agent_id. An older value of the slot is superseded.
    """
    body = {"subject": subject, "attribute": attribute, "value": value, **fields}
    return _change(_project(project_id, "facts"), body)


def promote(
    project_id: str, fact_id: str, to_tier: str | None = None, *, agent_id: str | None = None
) -> Call[dict[str, Any]]:
    """Promote a pending fact, or with `to_tier` ("project", "global") copy it one tier up (a new fact id)."""
    return _change(_fact(project_id, fact_id, "promote"), {"to_tier": to_tier, "agent_id": agent_id})


def retract(
    project_id: str, fact_id: str, reason: str | None = None, *, agent_id: str | None = None
) -> Call[dict[str, Any]]:
    """Retract a fact: it leaves the current view and stays in its slot's history."""
    return _change(_fact(project_id, fact_id, "retract"), {"reason": reason, "agent_id": agent_id})


def learn(
    project_id: str,
    key: str,
    value: str | int | float | bool,
    *,
    tier: str | None = None,
    task_id: str | None = None,
    type: str | None = None,
    text: str | None = None,
    agent_id: str | None = None,
) -> Call[dict[str, Any]]:
    """`learn(key, value)`: a certain, promoted fact in the slot ``learned`` / `key` (task, project or global)."""
    body = {"key": key, "value": value, "tier": tier, "task_id": task_id, "type": type, "text": text}
    return _change(_project(project_id, "learn"), {**body, "agent_id": agent_id})


def recall(project_id: str, key: str, *, task: str | None = None, tiers: Sequence[str] = ()) -> Call[dict[str, Any]]:
    """`{"key", "fact": the learned value's fact or None, "searched": [tier keys]}`: task, project, then global.

    The global tier is looked in when the token grants it, or only the `tiers` named.
    """
    params = {"key": key, "task": task, "tier": list(tiers)}
    return _one(Request("GET", _project(project_id, "recall"), params), _as_is)


def pair(
    project_id: str,
    task: str,
    criteria: Sequence[str],
    output: str,
    *,
    task_id: str | None = None,
    agent_id: str | None = None,
    rounds: int | None = None,
    target: int | None = None,
) -> Call[dict[str, Any]]:
    """A PAIR run (docs/pair.md): `output` judged against `criteria`, revised from the project's memory.

    Answers the run: ``score`` (the best seen), ``output`` (the best-scored
    text), ``stopped`` and ``rounds`` (each with its score, gaps, retrieved
    memories and revision). `rounds` and `target` override the server's
    PVM_PAIR_ROUNDS and PVM_PAIR_TARGET for this run.
    """
    body: dict[str, Any] = {"task": task, "criteria": list(criteria), "output": output, "task_id": task_id}
    body.update(agent_id=agent_id, rounds=rounds, target=target)
    sent = {k: v for k, v in body.items() if v is not None}
    return _one(Request("POST", _project(project_id, "pair"), body=sent), _as_is)


# -- the Markdown memory and the memory tools (docs/memory-files.md) -------------------------------------------


def _memory(project_id: str, route: str) -> str:
    return _project(project_id, "memory/" + route)


def memory_list(project_id: str, prefix: str | None = None) -> Call[list[dict[str, Any]]]:
    """The project's memory files under `prefix` (a folder such as ``facts/project``; None: all), sorted by path:
    ``[{"path", "bytes", "read_only"}]``."""
    return _one(Request("GET", _memory(project_id, "files"), {"prefix": prefix}), lambda a: list(a["files"]))


def memory_read(project_id: str, path: str) -> Call[dict[str, Any]]:
    """One memory file: ``{"path", "text", "read_only"}``; `PVMRequestError` 404 when there is none, 400 for a path
    outside the project's memory root."""
    return _one(Request("GET", _memory(project_id, "file"), {"path": path}), _as_is)


def _memory_change(method: str, path: str, body: dict[str, Any]) -> Call[dict[str, Any]]:
    """A memory write with a minute id chosen here, from which the API derives the ids of every minute it writes:
    a retry (after a 503) writes the same minutes, which the log keeps once (docs/memory-files.md, "Retries")."""
    return _one(Request(method, path, body={**body, "minute_id": new_minute_id()}), _as_is)


def memory_write(project_id: str, path: str, text: str) -> Call[dict[str, Any]]:
    """Make `path` hold `text` (Markdown, front-matter first): a new file asserts a fact, an edited one edits it.

    ``{"path", "changed", "minutes", "stream_ids"}``: each change one minute, applied by the facts pool.
    """
    return _memory_change("PUT", _memory(project_id, "file"), {"path": path, "text": text})


def memory_patch(project_id: str, path: str, old: str, new: str) -> Call[dict[str, Any]]:
    """Replace the one occurrence of `old` in the file with `new`; refused (422) when `old` occurs 0 or 2+ times."""
    return _memory_change("POST", _memory(project_id, "patch"), {"path": path, "old": old, "new": new})


def memory_append(project_id: str, path: str, text: str) -> Call[dict[str, Any]]:
    """Add `text` to the end of an existing file's body (a fact's text)."""
    return _memory_change("POST", _memory(project_id, "append"), {"path": path, "text": text})


def memory_export(project_id: str) -> Call[dict[str, str]]:
    """Every file of the project's Markdown memory: path -> text (`memory_import` takes it back;
    `memory_export_versioned` also answers the export's version)."""
    return _one(Request("GET", _memory(project_id, "export")), lambda a: dict(a["files"]))


def memory_export_versioned(project_id: str) -> Call[tuple[dict[str, str], int]]:
    """`memory_export` and the export's version (Unix ms of the newest change it holds): pass the version to
    `memory_import` with the edited files, so a file removed from them retracts its fact whatever the other
    files' versions say."""
    return _one(Request("GET", _memory(project_id, "export")), lambda a: (dict(a["files"]), int(a["version"])))


def memory_import(
    project_id: str, files: Mapping[str, str], *, dry_run: bool = False, version: int | None = None
) -> Call[dict[str, Any]]:
    """Make the project's memory the `files` given (path -> text, as `memory_export` answers them): each change
    one minute, a fact whose file is gone retracted (unless it changed after `version`, the export's, or, without
    it, after the newest file). ``{"minutes", "unchanged", "changes", "dry_run", "stream_ids"}``; `dry_run` plans
    and writes nothing. A file edited from a stale export is refused (409)."""
    body: dict[str, Any] = {"files": dict(files)}
    if version is not None:
        body["version"] = version
    if dry_run:
        return _one(Request("PUT", _memory(project_id, "export"), {"dry_run": "true"}, body=body), _as_is)
    return _memory_change("PUT", _memory(project_id, "export"), body)


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


def _tags(tags: Sequence[str]) -> list[str]:
    if isinstance(tags, str):
        raise TypeError(f"tags must be a sequence of tags, not one string ({tags!r}): pass [{tags!r}]")
    return list(tags)

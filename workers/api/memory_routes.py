"""The memory routes of the reader API: a project's Markdown memory exported and imported, and the memory tools.

``GET /v1/projects/{p}/memory/export`` answers every file (path -> text),
the global tier's under ``facts/global/`` and ``learned/global/`` when the
token holds the global grant (as the reader's ``include_global``);
``PUT`` on the same path imports a whole folder's files (``?dry_run=true``
plans without writing). ``/memory/files`` lists, ``/memory/file`` reads (GET)
and writes (PUT), ``/memory/patch`` and ``/memory/append`` edit one file. Every
change is a knowledge-change minute appended to the shard streams by the API's
one writer (`workers.agent.memory_files`, `workers.agent.memory_tools`); the facts pool
applies it, so a write answers 202 and shows in reads a moment later.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from starlette.requests import Request
from starlette.responses import JSONResponse

from contracts.minute import Minute
from pvm import defaults
from workers.agent.memory_errors import MemoryFileError
from workers.agent.memory_files import export_files, plan_import
from workers.agent.memory_paths import ROOTS, SEGMENT, SUFFIX, check_memory_path
from workers.agent.memory_snapshot import is_export_version, read_snapshot, written_before
from workers.agent.memory_tools import MemoryTools
from workers.api.auth import TokenScope
from workers.api.fields import BOOLEAN, STRING, Body, Field, Value, body_field, query_param
from workers.api.request import BadRequest, InvalidField, minute_id_field

Write = Callable[[Sequence[Minute]], list[str]]

# -- the fields each route reads (workers/api/openapi.py describes the routes from these) ------------------------------

_ROOTS = f"({'|'.join(ROOTS)})"
_SEGMENT = SEGMENT.pattern  # a segment as `check_memory_path` takes it: letters, digits and ._-, not starting with .
PATH = Value(
    "string",
    max_length=defaults.MEMORY_PATH_MAX_CHARS,
    pattern=f"^{_ROOTS}(/{_SEGMENT})*/{_SEGMENT}{re.escape(SUFFIX)}$",
    description="a file of the project's Markdown memory, relative to its root (facts/..., learned/..., "
    "episodes/..., summaries/...; .md)",
    example="facts/project/decision/service-db-engine-61e5cb4a.md",
)
# The export's version, which GET answers and PUT may send back.
VERSION = Value(
    "integer",
    minimum=0,
    description="the export's version (Unix ms of the newest change it holds): a fact changed after it is not "
    "retracted for a missing file",
)
FILE = query_param("path", PATH, "the file", "facts/project/fact/x-12345678.md")
# `MemoryTools.list` checks a folder as the path of a file in it (folder/x.md), so the path limit bounds it too.
PREFIX = query_param(
    "prefix",
    Value(
        "string",
        pattern=f"^{_ROOTS}(/{_SEGMENT})*/?$",
        max_length=defaults.MEMORY_PATH_MAX_CHARS - len("/x" + SUFFIX),
    ),
    "a folder such as facts/project",
)
DRY_RUN = query_param("dry_run", BOOLEAN, "plan only: answer the minutes, write none")

_MINUTE_ID = body_field(
    "minute_id",
    Value(ref="MinuteId"),
    "the first change minute's id, the others derived from it: set it to make a retry idempotent (the clients do; "
    "default: new ids)",
)
FILES = Value("object", values=STRING)
IMPORT_BODY = Body(
    (body_field("files", FILES, required=True), _MINUTE_ID, body_field("version", VERSION)),
    "the files, as GET answers them",
)
_FILE_PATH = body_field("path", PATH, required=True)
WRITE_BODY = Body(
    (
        _FILE_PATH,
        body_field(
            "text",
            Value("string", max_length=defaults.MEMORY_FILE_MAX_BYTES, description="Markdown with front-matter"),
            required=True,
        ),
        _MINUTE_ID,
    ),
    "the file and the change",
)
PATCH_BODY = Body(
    (
        _FILE_PATH,
        body_field("old", Value("string", min_length=1), required=True),
        body_field("new", STRING, required=True),
        _MINUTE_ID,
    ),
    "the file and the change",
)
APPEND_BODY = Body((_FILE_PATH, body_field("text", STRING, required=True), _MINUTE_ID), "the file and the change")


class MemoryRefused(BadRequest):
    """A `MemoryFileError` as an answer: its status, its message and every refused file."""

    def __init__(self, error: MemoryFileError) -> None:
        super().__init__(str(error))
        self.status = error.status
        self.problems = error.problems

    def body(self) -> dict[str, Any]:
        return {"error": str(self), "problems": self.problems} if len(self.problems) > 1 else {"error": str(self)}


def _flag(request: Request, field: Field) -> bool:
    sent = field.raw(request)
    raw = "false" if sent is None else sent.lower()
    if raw not in ("true", "false", "1", "0", ""):
        raise BadRequest(f"query parameter {field.name}={raw!r} must be true or false")
    return raw in ("true", "1")


@dataclass(frozen=True)
class MemoryRoutes:
    """The handlers, over one Redis and the API's stream writer."""

    connection: redis.Redis
    write: Write

    def _tools(self, request: Request, scope: TokenScope) -> MemoryTools:
        return MemoryTools(
            request.path_params["project_id"],
            connection=self.connection,
            write=self.write,
            include_global=scope.allows_global,
        )

    def export(self, request: Request, body: bytes, scope: TokenScope) -> Any:
        """``GET …/memory/export``: every memory file of the project, path -> text."""
        project_id = request.path_params["project_id"]
        snapshot = read_snapshot(self.connection, project_id, include_global=scope.allows_global)
        return {"project_id": project_id, "files": export_files(snapshot), "version": snapshot.last_ms}

    def import_files(self, request: Request, body: bytes, scope: TokenScope) -> Any:
        """``PUT …/memory/export``: make the project's memory the files sent (a fact with no file is retracted, if
        the export's ``version``, when sent, or else the files' newest, is not older than its last change)."""
        project_id = request.path_params["project_id"]
        given = IMPORT_BODY.parse(body)
        files = given["files"]
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            raise InvalidField("files", "must be an object of path -> file text, as GET …/memory/export answers")
        version = given.get("version")
        if version is not None and not is_export_version(version):
            raise InvalidField("version", "must be the whole number GET …/memory/export answered as version")
        dry_run = _flag(request, DRY_RUN)
        minute_id = minute_id_field(given)
        snapshot = read_snapshot(self.connection, project_id, include_global=scope.allows_global)
        try:
            plan = plan_import(snapshot, files, minute_id=minute_id, exported_version=version)
        except MemoryFileError as exc:
            if dry_run or minute_id is None or not written_before(self.connection, project_id, minute_id):
                raise MemoryRefused(exc) from None
            # A retry of an import the log holds already (its first try's minutes perhaps applied): nothing to write.
            return {
                "project_id": project_id,
                "minutes": 0,
                "unchanged": 0,
                "changes": [],
                "dry_run": False,
                "stream_ids": [],
                "written_before": minute_id,
            }
        answer = plan.to_dict()
        answer["dry_run"] = dry_run
        answer["stream_ids"] = [] if dry_run or not plan.changes else self.write(plan.minutes)
        return JSONResponse(answer, status_code=200 if dry_run or not plan.changes else 202)

    def list_files(self, request: Request, body: bytes, scope: TokenScope) -> Any:
        """``GET …/memory/files``: the files under ``prefix`` (all without it)."""
        try:
            return {"files": self._tools(request, scope).list(PREFIX.raw(request) or "")}
        except MemoryFileError as exc:
            raise MemoryRefused(exc) from None

    def read(self, request: Request, body: bytes, scope: TokenScope) -> Any:
        """``GET …/memory/file?path=``: one file."""
        path = FILE.text(request)
        if not path:
            raise BadRequest("query parameter path is required: GET …/memory/file?path=facts/...")
        try:
            return self._tools(request, scope).read(path)
        except MemoryFileError as exc:
            raise MemoryRefused(exc) from None

    def _written(
        self, change: Callable[[MemoryTools], dict[str, Any]], request: Request, scope: TokenScope
    ) -> JSONResponse:
        try:
            answer = change(self._tools(request, scope))
        except MemoryFileError as exc:
            raise MemoryRefused(exc) from None
        return JSONResponse(answer, status_code=202 if answer["changed"] else 200)

    def write_file(self, request: Request, body: bytes, scope: TokenScope) -> Any:
        """``PUT …/memory/file`` ``{"path", "text"}``: write one file (assert or edit a fact)."""
        given = WRITE_BODY.parse(body)
        path, minute_id = _path_field(given), minute_id_field(given)
        return self._written(lambda tools: tools.write(path, given["text"], minute_id=minute_id), request, scope)

    def patch(self, request: Request, body: bytes, scope: TokenScope) -> Any:
        """``POST …/memory/patch`` ``{"path", "old", "new"}``: replace the one occurrence of ``old``."""
        given = PATCH_BODY.parse(body)
        path, minute_id = _path_field(given), minute_id_field(given)
        return self._written(
            lambda tools: tools.patch(path, given["old"], given["new"], minute_id=minute_id), request, scope
        )

    def append(self, request: Request, body: bytes, scope: TokenScope) -> Any:
        """``POST …/memory/append`` ``{"path", "text"}``: add to the end of a file's body."""
        given = APPEND_BODY.parse(body)
        path, minute_id = _path_field(given), minute_id_field(given)
        return self._written(lambda tools: tools.append(path, given["text"], minute_id=minute_id), request, scope)


def _path_field(given: dict[str, Any]) -> str:
    try:
        return check_memory_path(given["path"])
    except MemoryFileError as exc:
        raise MemoryRefused(exc) from None

"""Memory tools for agents: list, read, write, patch and append the files of a project's Markdown memory.

The files are the view `workers.agent.memory_files` renders; nothing is stored as a
file. Every path is checked against the sandbox (`check_memory_path`: inside
the project's memory root, no ``..``, no absolute or encoded paths, no control
characters, size limits in `pvm.defaults`), and a write becomes the minutes an
import of that one file would write (`plan_import` with ``partial``): each
human or agent change is a knowledge-change minute, through the streams. A
write that changes nothing writes no minute. Episodes and summaries are
read-only. The global tier's facts are shown and editable only for a caller with the global grant
(`include_global`). Every failure a caller can fix is a `MemoryFileError`.

One class, `MemoryTools`, serves the HTTP routes (``/v1/projects/{p}/memory/...``)
and the MCP server; each method returns plain JSON-able values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis

from contracts.minute import Minute, check_project_id
from pvm import defaults
from pvm.config import Settings
from workers.agent.memory_errors import MemoryConflict, MemoryFileError, MemoryNotFound, MemoryPathError
from workers.agent.memory_files import export_files, plan_import, stream_writer
from workers.agent.memory_front_matter import parse
from workers.agent.memory_paths import (
    DERIVED_ROOTS,
    check_global_grant,
    check_global_visible,
    check_memory_path,
    check_size,
)
from workers.agent.memory_snapshot import MemorySnapshot, read_snapshot, written_before

Write = Callable[[Sequence[Minute]], list[str]]

TOOL_AGENT = "memory-tools"


class MemoryTools:
    """The memory tools over one project: `list`, `read`, `write`, `patch`, `append`.

    Build it with `MemoryTools(project_id, settings)` (its own Redis connection, minutes to the settings'
    shard streams) or, inside a server, with a `connection` and a `write` function of its own. `include_global`:
    the caller holds the global grant, so the files show (and may edit) the global tier too.
    """

    def __init__(
        self,
        project_id: str,
        settings: Settings | None = None,
        *,
        connection: redis.Redis | None = None,
        write: Write | None = None,
        agent_id: str = TOOL_AGENT,
        include_global: bool = False,
    ) -> None:
        try:
            self.project_id = check_project_id(project_id)
        except ValueError as exc:
            raise MemoryFileError(f"project_id: {exc}") from None
        self._owned = connection is None
        if connection is None:
            if settings is None:
                raise MemoryFileError("MemoryTools needs settings (PVM_REDIS_URL) or a connection")
            from pvm.connection import redis_from_settings

            connection = redis_from_settings(settings)
        self.connection = connection
        if write is None:
            shards = settings.shards if settings is not None else defaults.SHARDS
            write = stream_writer(connection, shards)
        self._write = write
        self.agent_id = agent_id
        self.include_global = include_global

    def close(self) -> None:
        """Close the Redis connection it opened (one it was given stays open)."""
        if self._owned:
            self.connection.close()

    def __enter__(self) -> MemoryTools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reads

    def _snapshot(self) -> MemorySnapshot:
        return read_snapshot(self.connection, self.project_id, include_global=self.include_global)

    def _files(self) -> dict[str, str]:
        return export_files(self._snapshot())

    def list(self, prefix: str = "") -> list[dict[str, Any]]:
        """The memory files under `prefix` (a folder such as ``facts/project``; empty: all), sorted by path."""
        if not isinstance(prefix, str):
            raise MemoryPathError("prefix must be text such as 'facts/project'")
        if prefix:
            folder = prefix.rstrip("/")
            check_memory_path(f"{folder}/x.md", "prefix")
            check_global_visible(folder, self.include_global)
            folder += "/"
        else:
            folder = ""
        return [
            {"path": path, "bytes": len(text.encode("utf-8")), "read_only": path.split("/", 1)[0] in DERIVED_ROOTS}
            for path, text in self._files().items()
            if path.startswith(folder)
        ]

    def read(self, path: str) -> dict[str, Any]:
        """One file: ``{"path", "text", "read_only"}``; `MemoryNotFound` when there is none."""
        check_memory_path(path)
        check_global_visible(path, self.include_global)
        text = self._files().get(path)
        if text is None:
            raise MemoryNotFound(f"{path}: no such memory file in project {self.project_id}; list shows the files")
        return {"path": path, "text": text, "read_only": path.split("/", 1)[0] in DERIVED_ROOTS}

    # -- writes: each change a minute

    def _retried(self, path: str, minute_id: str | None, change: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """`change()`, or, when it is refused but the log holds `minute_id` already, the answer to a retry of a write
        made before (its first try's minutes written, perhaps applied): nothing written, ``written_before`` set."""
        try:
            return change()
        except MemoryFileError:
            if minute_id is None or not written_before(self.connection, self.project_id, minute_id):
                raise
        return {"path": path, "changed": False, "minutes": [], "stream_ids": [], "written_before": minute_id}

    def write(self, path: str, text: str, *, minute_id: str | None = None) -> dict[str, Any]:
        """Make `path` hold `text`: a new file (no ``id``) asserts a fact, an edited one edits it.

        `minute_id`: the caller's id for the write's first minute (the others are derived from it), so a retry
        writes the same minutes, which the log keeps once; a retry of a write the log holds writes nothing.
        """
        return self._retried(path, minute_id, lambda: self._write_file(path, text, minute_id))

    def _write_file(self, path: str, text: str, minute_id: str | None) -> dict[str, Any]:
        check_memory_path(path)
        if not isinstance(text, str):
            raise MemoryFileError("text must be the file's Markdown, front-matter first")
        check_size(path, text)
        check_global_grant(path, self.include_global)
        snapshot = self._snapshot()
        current = export_files(snapshot)
        held = current.get(path)
        named = parse(path, text)[0].get("id")
        if held is None and named is not None:
            raise MemoryConflict(
                f"{path}: no file here; fact {str(named)[:40]} lives at its own path (list shows it). "
                "Drop the id (and version, sources, relations, recorded_at, promoted_from, period) to assert a new fact"
            )
        if held is not None and named != parse(path, held)[0].get("id"):
            raise MemoryConflict(f"{path}: this file is fact {parse(path, held)[0].get('id')}; keep its id line")
        plan = plan_import(snapshot, {path: text}, partial=True, agent_id=self.agent_id, minute_id=minute_id)
        stream_ids = self._write(plan.minutes) if plan.changes else []
        return {
            "path": path,
            "changed": bool(plan.changes),
            "minutes": [c.to_dict() for c in plan.changes],
            "stream_ids": stream_ids,
        }

    def patch(self, path: str, old: str, new: str, *, minute_id: str | None = None) -> dict[str, Any]:
        """Replace the one occurrence of `old` in the file with `new`; refused when `old` occurs 0 or 2+ times."""
        return self._retried(path, minute_id, lambda: self._patch(path, old, new, minute_id))

    def _patch(self, path: str, old: str, new: str, minute_id: str | None) -> dict[str, Any]:
        if not isinstance(old, str) or not isinstance(new, str):
            raise MemoryFileError("old and new must be text")
        if not old:
            raise MemoryFileError("old must not be empty: name the exact text to replace")
        text = self.read(path)["text"]
        count = text.count(old)
        if count == 0:
            raise MemoryFileError(f"{path}: old text not found; read the file and copy the exact text to replace")
        if count > 1:
            raise MemoryFileError(
                f"{path}: old text occurs {count} times; include more of the surrounding text so it occurs once"
            )
        return self._write_file(path, text.replace(old, new, 1), minute_id)

    def append(self, path: str, text: str, *, minute_id: str | None = None) -> dict[str, Any]:
        """Add `text` to the end of an existing file's body (a fact's text)."""
        if not isinstance(text, str):
            raise MemoryFileError("text must be text")

        def appended() -> dict[str, Any]:
            current = self.read(path)["text"]
            return self._write_file(path, current.rstrip("\n") + "\n" + text.strip("\n") + "\n", minute_id)

        return self._retried(path, minute_id, appended)


__all__ = ["MemoryConflict", "MemoryFileError", "MemoryNotFound", "MemoryPathError", "MemoryTools"]

"""The Markdown memory's front door: export a project's memory as Markdown files, import edited files as minutes.

A project's memory is a folder of Markdown files, each a YAML front-matter
block and a body (docs/memory-files.md has the layout and every field):

- ``facts/<tier>/<type>/<slug>-<id8>.md``: one fact of the task or project
  tier, or (read with the global grant) of the global tier; the body is its text.
- ``learned/<tier>/<slug>-<id8>.md``: one learned key (``learn(key, value)``).
- ``episodes/<thread>/...md`` and ``summaries/<thread>/...md``: what the
  summarize pool derived from the log; read-only.

`export_files` renders a `MemorySnapshot` (read in a few round trips by
`read_snapshot`); `plan_import` diffs edited files against the snapshot and
builds the knowledge-change minutes (`contracts.fact_changes`) that make each
human change: a new file asserts (``fact_asserted``, ``fact_learned``), an
edited field edits (``fact_edited``), ``status: promoted`` promotes
(``fact_promoted``), ``status: retracted`` or a deleted file retracts
(``fact_retracted``). The minutes go through the streams like every other
(`stream_writer`), so the facts pool applies them, the log keeps them and
replay reproduces them. An unedited export plans no minute.

Optimistic concurrency: every fact file carries the ``version`` of the fact
it was rendered from (the time, Unix ms, of the newest change applied to it);
an edited file whose version is not the store's is refused, naming the file
and both versions, and nothing of that import is written.

The pieces, each its own module of `workers.agent`: `memory_errors` (the refusals), `memory_paths` (the layout
and the sandbox rule `check_memory_path`), `memory_front_matter` (a file's text, rendered and parsed),
`memory_snapshot` (reading the stores from Redis), `memory_plan` (the import planner) and `memory_folders`
(reading and writing a folder: the only module that touches the file system). `export_files` and `plan_import`
read and write nothing; `stream_writer` writes to Redis. None imports starlette: the API, the CLI and the
memory tools share them. The names the CLI and the demo use are re-exported here (`__all__`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

import redis

from contracts.ids import RequestIds
from contracts.minute import Minute
from pvm import defaults
from workers.agent.memory_errors import MemoryConflict, MemoryFileError, MemoryForbidden
from workers.agent.memory_folders import read_export_version, read_folder, write_folder
from workers.agent.memory_front_matter import render_chunk, render_episode
from workers.agent.memory_paths import check_memory_path, check_size, chunk_path, episode_path, fact_path, tree_lines
from workers.agent.memory_plan import IMPORT_AGENT, ImportPlan, ImportPlanner
from workers.agent.memory_snapshot import MemorySnapshot, check_export_version, read_snapshot
from workers.runtime.clock import ChangeClock
from workers.runtime.minutes import write_minutes

__all__ = [
    "MemoryFileError",
    "Write",
    "export_files",
    "plan_import",
    "read_export_version",
    "read_folder",
    "read_snapshot",
    "stream_writer",
    "tree_lines",
    "write_folder",
]

Write = Callable[[Sequence[Minute]], list[str]]


def export_files(snapshot: MemorySnapshot) -> dict[str, str]:
    """Every memory file of `snapshot`, path -> text, sorted by path."""
    files = {fact_path(r.raw): r.render() for r in snapshot.records.values()}
    files.update((chunk_path(c), render_chunk(c)) for c in snapshot.chunks)
    files.update((episode_path(e), render_episode(e)) for e in snapshot.episodes)
    return dict(sorted(files.items()))


def plan_import(
    snapshot: MemorySnapshot,
    files: Mapping[str, str],
    *,
    partial: bool = False,
    agent_id: str = IMPORT_AGENT,
    now_ms: int | None = None,
    minute_id: str | None = None,
    exported_version: int | None = None,
) -> ImportPlan:
    """The minutes that make `files` (path -> text) the memory of `snapshot`'s project; nothing is written.

    `exported_version` (`MemorySnapshot.last_ms` of the export the files came from: `write_folder` keeps it in
    `EXPORT_MARK`, the API answers it as ``version``) tells which facts the person who removed a file could have
    seen; without it the newest ``version`` among the files stands in, which cannot tell a removed file of the
    newest fact from a fact made after the export, and keeps that fact.

    `partial` (the memory tools' writes): the files are some of the memory, so a fact with no file is left
    alone; otherwise (an import of a whole folder) a fact whose file is gone is retracted. `minute_id` (the
    caller's, for retries) is the first minute's id and the others are derived from it (`RequestIds`). Every
    refused file is named in one `MemoryFileError` (a `MemoryForbidden` when one is of the global tier and
    `snapshot` was read without the grant, else a `MemoryConflict` when one is a stale version or an edited
    derived file), and then the plan writes nothing.
    """
    if len(files) > defaults.MEMORY_IMPORT_MAX_FILES:
        raise MemoryFileError(
            f"{len(files)} files; an import takes at most {defaults.MEMORY_IMPORT_MAX_FILES} (MEMORY_IMPORT_MAX_FILES)"
        )
    rendered: dict[str, str] = {}
    exported_ids: dict[str, str] = {}
    for record in snapshot.records.values():
        path = fact_path(record.raw)
        rendered[path] = record.render()
        exported_ids[path] = record.id
    rendered.update((chunk_path(c), render_chunk(c)) for c in snapshot.chunks)
    rendered.update((episode_path(e), render_episode(e)) for e in snapshot.episodes)
    planner = ImportPlanner(
        snapshot,
        agent_id,
        ChangeClock(snapshot.last_ms, now_ms),
        ImportPlan(snapshot.project_id),
        RequestIds(minute_id, "memory-change"),
        exported_ids=exported_ids,
        exported_at=check_export_version(exported_version, "exported_version"),
    )
    refused: list[MemoryFileError] = []
    for path, text in sorted(files.items()):
        try:
            check_memory_path(path)
            check_size(path, text)
            planner.file(path, text, rendered)
        except MemoryFileError as exc:
            refused.append(exc)
    if len(refused) == 1:
        raise refused[0]
    if refused:
        problems = [str(exc) for exc in refused]
        message = f"{len(refused)} files refused; nothing was written:\n" + "\n".join(problems)
        kinds = [MemoryForbidden, MemoryConflict]  # the first any refusal is of, else MemoryFileError
        kind = next((k for k in kinds if any(isinstance(exc, k) for exc in refused)), MemoryFileError)
        raise kind(message, problems)
    if not partial:
        planner.removed()
    return planner.plan


def stream_writer(connection: redis.Redis, shards: int) -> Write:
    """Appends minutes to their shard streams, as `emit` and ``POST /v1/minutes`` do (`write_minutes`:
    `MEMORY_WRITE_CHUNK` per MULTI/EXEC; one project's minutes share one stream). Returns the stream entry ids."""
    return functools.partial(write_minutes, connection, shards)

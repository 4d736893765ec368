"""The Markdown memory: a project's facts, learned keys, episodes and summaries as files a person can edit.

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

Nothing here reads the file system (`read_folder` / `write_folder` do, with
the sandbox rules of `check_memory_path`) or imports starlette: the API, the
CLI and the memory tools share it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any, TypeGuard, cast
from urllib.parse import unquote

import msgpack
import redis
import yaml

from contracts import keys
from contracts.errors import ContractError
from contracts.fact_changes import (
    LEARNED_SUBJECT,
    PromotionReason,
    asserted_minute,
    contradicted_minute,
    edited_minute,
    learned_minute,
    promoted_minute,
    retracted_minute,
    superseded_minute,
)
from contracts.facts import (
    GLOBAL_KEY,
    MAX_RELATIONSHIPS,
    Fact,
    FactStatus,
    FactType,
    RelationKind,
    Relationship,
    Tier,
    TierKey,
    check_time,
    normalize_text,
    normalize_value,
)
from contracts.ids import RequestIds
from contracts.minute import Minute, iso_from_ms
from contracts.summaries import Chunk, Episode
from pvm import defaults
from pvm.stores.fact_projection import StoredFact, last_change_ms
from pvm.stores.summaries import SummaryStore
from workers.rules.fact_timeline import fit, on_promotion, place
from workers.runtime.clock import ChangeClock
from workers.runtime.minutes import write_minutes

FACTS_ROOT = "facts"
LEARNED_ROOT = "learned"
EPISODES_ROOT = "episodes"
SUMMARIES_ROOT = "summaries"
EDITABLE_ROOTS = (FACTS_ROOT, LEARNED_ROOT)
DERIVED_ROOTS = (EPISODES_ROOT, SUMMARIES_ROOT)
ROOTS = (*EDITABLE_ROOTS, *DERIVED_ROOTS)
SUFFIX = ".md"
# Beside the folders: the version of the snapshot an export wrote, so an import knows what its files saw.
EXPORT_MARK = ".pvm-export.json"

# The front-matter of a fact file, in the order it is written. `sources` and `relations` are the fact's
# source_minute_ids and relationships; `tier` and `task` its tier key.
FACT_KEYS = (
    "id",
    "type",
    "tier",
    "task",
    "subject",
    "attribute",
    "value",
    "status",
    "importance",
    "confidence",
    "valid_from",
    "valid_until",
    "single_valued",
    "tags",
    "sources",
    "relations",
    "recorded_at",
    "promoted_from",
    "period",
    "version",
)
# What a new file (no `id`) may say: the rest PVM sets.
SET_BY_PVM = ("id", "sources", "relations", "recorded_at", "promoted_from", "period", "version")
NEW_FACT_KEYS = tuple(key for key in FACT_KEYS if key not in SET_BY_PVM)
# Front-matter an existing fact's file may change, each with the fact field it edits (`EDITABLE_FIELDS`).
EDITED_KEYS = {
    "type": "type",
    "importance": "importance",
    "confidence": "confidence",
    "valid_from": "valid_from",
    "valid_until": "valid_until",
    "single_valued": "single_valued",
    "tags": "tags",
}
# ... and what it may not: they make the fact's identity or record its history.
FIXED_KEYS = (
    "tier",
    "task",
    "subject",
    "attribute",
    "value",
    "sources",
    "relations",
    "recorded_at",
    "promoted_from",
    "period",
)

IMPORT_AGENT = "memory-import"
RETRACTED_BY_DELETION = "its file was removed from the Markdown memory"
RETRACTED_BY_STATUS = "retracted in the Markdown memory"
GLOBAL_TIER = Tier.GLOBAL.value

Write = Callable[[Sequence[Minute]], list[str]]


# -- errors -------------------------------------------------------------------------------------------------------


class MemoryFileError(ValueError):
    """A Markdown memory request a caller can fix; the message names the file (and field) and the fix.

    `status` is the HTTP status the API answers with; `problems` lists every refused file when there are several.
    """

    status = 422

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = list(problems) or [message]


class MemoryPathError(MemoryFileError):
    """A path outside the project's memory root, or one no memory file can have."""

    status = 400


class MemoryNotFound(MemoryFileError):
    """No memory file at that path."""

    status = 404


class MemoryForbidden(MemoryFileError):
    """A file of the global tier in a request without the global grant (a token's ``"global": true``, ``--global``)."""

    status = 403


class MemoryConflict(MemoryFileError):
    """An edit of a fact that changed since the file was exported (its `version` is not the store's), or a derived
    (read-only) file edited."""

    status = 409


# -- paths --------------------------------------------------------------------------------------------------------

_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
# Every path `check_memory_path` accepts, and nothing else: checked first, the detailed checks only say why not.
_MEMORY_PATH = re.compile(rf"(?:{'|'.join(ROOTS)})(?:/{_SEGMENT.pattern})+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # Unicode category Cc


def check_memory_path(path: Any, field: str = "path") -> str:
    """`path` if it names a file inside a project's memory root, else `MemoryPathError` naming `field`.

    Relative, ``/``-separated, segments of letters, digits and ``._-`` (none starting with a dot, so no
    ``..``), under one of `ROOTS`, ending in ``.md``, at most `MEMORY_PATH_MAX_CHARS`. A percent-encoded
    path is refused outright: the API decodes a URL once, so a ``%`` left over is an attempt at a second.
    """
    if not isinstance(path, str):
        raise MemoryPathError(f"{field} must be text such as 'facts/project/decision/x-1234abcd.md'")
    if len(path) <= defaults.MEMORY_PATH_MAX_CHARS and path.endswith(SUFFIX) and _MEMORY_PATH.fullmatch(path):
        return path
    shown = repr(path[:80])
    if len(path) > defaults.MEMORY_PATH_MAX_CHARS:
        raise MemoryPathError(
            f"{field} is {len(path)} characters; the limit is {defaults.MEMORY_PATH_MAX_CHARS} (MEMORY_PATH_MAX_CHARS)"
        )
    if _CONTROL.search(path):
        raise MemoryPathError(f"{field} {shown} holds a control character (NUL, newline, ...); name a memory file")
    if "%" in path or unquote(path) != path:
        raise MemoryPathError(f"{field} {shown} is percent-encoded; send the path itself, such as 'facts/...'")
    if path.startswith(("/", "\\")) or "\\" in path or re.match(r"[A-Za-z]:", path):
        raise MemoryPathError(f"{field} {shown} must be relative to the project's memory root, '/'-separated")
    segments = path.split("/")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise MemoryPathError(
                f"{field} {shown} has an empty, '.' or '..' segment; paths stay inside the project's memory root"
            )
        if _SEGMENT.fullmatch(segment) is None:
            raise MemoryPathError(
                f"{field} {shown}: segment {segment[:40]!r} may hold only letters, digits and ._- (not starting with .)"
            )
    if segments[0] not in ROOTS or len(segments) < 2:
        raise MemoryPathError(f"{field} {shown} must be under one of {', '.join(r + '/' for r in ROOTS)}")
    raise MemoryPathError(f"{field} {shown} must name a Markdown file ({SUFFIX})")


def in_global_tier(path: str) -> bool:
    """Whether a memory path (a file or folder) lies in the global tier: ``<root>/global/...``."""
    return path.split("/")[1:2] == [GLOBAL_TIER]


def check_global_grant(path: str, include_global: bool, *, by_path: bool = True) -> None:
    """`MemoryForbidden` naming `path` when it is a file of the global tier (``<root>/global/...``; with not
    `by_path`, a file the caller said is global) and the caller has no global grant (`include_global`)."""
    if include_global or (by_path and not in_global_tier(path)):
        return
    raise MemoryForbidden(
        f"{path}: the global tier is read-only without the global grant; leave its files out, or use the grant "
        '(API: a token with "global": true; CLI: --global)'
    )


def check_global_visible(path: str, include_global: bool) -> None:
    """`MemoryForbidden` naming `path` (a file or folder) when it lies in the global tier (``<root>/global/...``)
    and the caller has no global grant: those files are shown only with it, so a read or listing of one is refused
    as such rather than answered "no such file" or an empty list."""
    if include_global or not in_global_tier(path):
        return
    raise MemoryForbidden(
        f"{path}: the global tier's files are shown only with the global grant "
        '(API: a token with "global": true; CLI: --global)'
    )


def _slug(text: str) -> str:
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii").lower()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_text).strip("-")[: defaults.MEMORY_SLUG_CHARS].strip("-")
    return slug or "x"


def fact_path(fact: Fact | Mapping[str, Any]) -> str:
    """Where a fact's file lives: ``facts/<tier>/<type>/<slug>-<id8>.md`` (``learned/<tier>/...`` for a key).

    `fact` is a `Fact` or its `Fact.to_dict` form.
    """
    d = fact.to_dict() if isinstance(fact, Fact) else fact
    tier = str(d["tier_key"]).partition(":")[0]
    if normalize_text(d["subject"]) == LEARNED_SUBJECT:
        return f"{LEARNED_ROOT}/{tier}/{_slug(d['attribute'])}-{d['id'][:8]}{SUFFIX}"
    name = _slug(f"{d['subject']} {d['attribute']}")
    return f"{FACTS_ROOT}/{tier}/{d['type']}/{name}-{d['id'][:8]}{SUFFIX}"


def _thread_dir(thread: str) -> str:
    from hashlib import sha1

    return f"{_slug(thread)}-{sha1(thread.encode('utf-8')).hexdigest()[:8]}"


def chunk_path(chunk: Chunk) -> str:
    return f"{SUMMARIES_ROOT}/{_thread_dir(str(chunk.thread))}/chunk-{chunk.first_seq:06d}-{str(chunk.id)[:8]}{SUFFIX}"


def episode_path(episode: Episode) -> str:
    name = _slug(episode.title)[:40].strip("-") or "episode"
    folder = f"{EPISODES_ROOT}/{_thread_dir(str(episode.thread))}"
    return f"{folder}/{episode.first_seq:06d}-{name}-{str(episode.id)[:8]}{SUFFIX}"


# -- rendering and parsing ----------------------------------------------------------------------------------------


_quoted = json.encoder.encode_basestring
_quoted_ascii = json.encoder.encode_basestring_ascii


def _scalar(value: Any) -> str:
    """One front-matter value as JSON, which YAML reads as the same value; escaped where YAML would stumble.

    The JSON encoder's own string quoting (its C function), called directly: an export renders every field
    of every fact, and `json.dumps` per field costs several times more.
    """
    if isinstance(value, str):
        return _quoted(value) if value.isprintable() else _quoted_ascii(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return json.dumps(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=True)


def render(front: Mapping[str, Any], body: str) -> str:
    """A memory file: ``---``, one ``key: <JSON value>`` line per field, ``---``, the body and a newline."""
    lines = ["---", *(f"{k}: {_scalar(v)}" for k, v in front.items()), "---", body.strip("\n"), ""]
    return "\n".join(lines)


def fact_front(fact: Fact | Mapping[str, Any], version: int) -> dict[str, Any]:
    """A fact file's front-matter, in `FACT_KEYS` order, from a `Fact` or its `Fact.to_dict` form."""
    d = fact.to_dict() if isinstance(fact, Fact) else fact
    tier, _, rest = str(d["tier_key"]).partition(":")
    front: dict[str, Any] = {"id": d["id"], "type": d["type"], "tier": tier}
    if tier == Tier.TASK.value:
        front["task"] = rest.partition(":")[2]
    front.update(
        subject=d["subject"],
        attribute=d["attribute"],
        value=d["value"],
        status=d["status"],
        importance=d["importance"],
        confidence=d["confidence"],
        valid_from=d["valid_from"],
        valid_until=d["valid_until"],
        single_valued=d["single_valued"],
        tags=d["tags"],
        sources=d["source_minute_ids"],
        relations=d["relationships"],
        recorded_at=d["recorded_at"],
        promoted_from=d["promoted_from"],
        period=d.get("period", 0),
        version=version,
    )
    return front


class FactRecord:
    """A stored fact as the memory reads it: its record (`Fact.to_dict` form, what a file shows) and its version
    (`last_change_ms`); the validated `Fact` is built only when a change needs it."""

    __slots__ = ("_fact", "last_ms", "raw")

    def __init__(self, raw: dict[str, Any], last_ms: int, fact: Fact | None = None) -> None:
        self.raw, self.last_ms, self._fact = raw, last_ms, fact

    @classmethod
    def unpack(cls, packed: bytes) -> FactRecord:
        """From the facts store's record bytes (`StoredFact.pack`)."""
        record = msgpack.unpackb(packed, raw=False)
        return cls(record["fact"], last_change_ms(record["created"], record["v"]))

    @classmethod
    def of(cls, stored: StoredFact) -> FactRecord:
        return cls(stored.fact.to_dict(), stored.last_ms, stored.fact)

    @property
    def id(self) -> str:
        return str(self.raw["id"])

    @property
    def fact(self) -> Fact:
        if self._fact is None:
            self._fact = Fact.from_dict(self.raw)
        return self._fact

    def render(self) -> str:
        return render(fact_front(self.raw, self.last_ms), self.raw["text"])


def _derived_front(record: dict[str, Any], kind: str) -> dict[str, Any]:
    front = {"kind": kind, "read_only": True}
    front.update((k, v) for k, v in record.items() if k != "summary")
    return front


def render_chunk(chunk: Chunk) -> str:
    return render(_derived_front(chunk.to_dict(), "summary"), chunk.summary)


def render_episode(episode: Episode) -> str:
    return render(_derived_front(episode.to_dict(), "episode"), episode.summary)


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse(path: str, text: str) -> tuple[dict[str, Any], str]:
    """The front-matter (a mapping) and the body of a memory file; `MemoryFileError` naming `path` when malformed.

    Lines PVM wrote (``key: <JSON>``) are read as JSON; anything else a person wrote is read as YAML.
    Timestamps YAML reads as dates come back as ISO 8601 text.
    """
    if not text.startswith("---\n"):
        raise MemoryFileError(f"{path}: a memory file starts with a '---' line, then its front-matter, then '---'")
    end = text.find("\n---\n", 3)
    if end < 0:
        end = text.find("\n---", 3)
        if end < 0 or text[end + 4 :].strip():
            raise MemoryFileError(f"{path}: the front-matter has no closing '---' line")
    head, body = text[4:end], text[end + 5 :]
    front = _json_front(head)
    if front is None:
        try:
            loaded = yaml.load(head, Loader=_LOADER)
        except yaml.YAMLError as exc:
            raise MemoryFileError(f"{path}: the front-matter is not YAML: {str(exc)[:200]}") from None
        if not isinstance(loaded, dict):
            raise MemoryFileError(f"{path}: the front-matter must be a mapping of fields (key: value lines)")
        front = {str(k): _plain(v) for k, v in loaded.items()}
    return front, body.strip("\n")


def _json_front(head: str) -> dict[str, Any] | None:
    """The front-matter as PVM writes it (``key: <JSON>`` lines), or None when a person wrote some other YAML."""
    front: dict[str, Any] = {}
    for line in head.split("\n"):
        if not line.strip():
            continue
        key, sep, raw = line.partition(": ")
        if not sep or not key.isidentifier():
            return None
        try:
            front[key] = json.loads(raw)
        except ValueError:
            return None
    return front


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return f"{value.isoformat()}T00:00:00Z"
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


# -- the snapshot and the export ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemorySnapshot:
    """What one project's memory holds now: its task and project facts (stored records), the global tier's when
    read with the grant (`include_global`), and its threads' records."""

    project_id: str
    records: dict[str, FactRecord]
    chunks: tuple[Chunk, ...] = ()
    episodes: tuple[Episode, ...] = ()
    include_global: bool = False

    @property
    def last_ms(self) -> int:
        return max((s.last_ms for s in self.records.values()), default=0)


def read_snapshot(connection: redis.Redis, project_id: str, *, include_global: bool = False) -> MemorySnapshot:
    """The project's stored facts (one HSCAN of its records hash), with `include_global` the global tier's too
    (one HSCAN of its hash: the caller holds the global grant), and every thread's chunks and episodes."""
    anchor = TierKey.for_project(project_id)
    own = (f"project:{project_id}", f"task:{project_id}:")
    records: dict[str, FactRecord] = {}
    for _, packed in connection.hscan_iter(keys.facts_by_id(anchor), count=1000):
        record = FactRecord.unpack(cast(bytes, packed))
        tier_key = str(record.raw["tier_key"])
        if tier_key == own[0] or tier_key.startswith(own[1]):
            records[record.id] = record
    if include_global:
        for _, packed in connection.hscan_iter(keys.facts_by_id(GLOBAL_KEY), count=1000):
            record = FactRecord.unpack(cast(bytes, packed))
            if record.raw["tier_key"] == GLOBAL_TIER:
                records[record.id] = record
    threads = SummaryStore(connection)
    chunks: list[Chunk] = []
    episodes: list[Episode] = []
    for thread in threads.threads(project_id):
        view = threads.thread_view(project_id, thread, 0)
        chunks.extend(view.chunks)
        episodes.extend(view.episodes)
    return MemorySnapshot(project_id, records, tuple(chunks), tuple(episodes), include_global)


def export_files(snapshot: MemorySnapshot) -> dict[str, str]:
    """Every memory file of `snapshot`, path -> text, sorted by path."""
    files = {fact_path(r.raw): r.render() for r in snapshot.records.values()}
    files.update((chunk_path(c), render_chunk(c)) for c in snapshot.chunks)
    files.update((episode_path(e), render_episode(e)) for e in snapshot.episodes)
    return dict(sorted(files.items()))


# -- the import ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedChange:
    """One minute an import writes: which file asked for it and what it does to which fact."""

    path: str
    fact_id: str
    minute: Minute

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "event_type": self.minute.event_type,
            "fact_id": self.fact_id,
            "minute_id": self.minute.id,
            "note": self.minute.memory_note,
        }


@dataclass
class ImportPlan:
    """The minutes an import writes, in order, and how many files it found unchanged."""

    project_id: str
    changes: list[PlannedChange] = field(default_factory=list)
    unchanged: int = 0

    @property
    def minutes(self) -> list[Minute]:
        return [c.minute for c in self.changes]

    def to_dict(self) -> dict[str, Any]:
        return {
            "project_id": self.project_id,
            "minutes": len(self.changes),
            "unchanged": self.unchanged,
            "changes": [c.to_dict() for c in self.changes],
        }


def written_before(connection: redis.Redis, project_id: str, minute_id: str) -> bool:
    """Whether the project's log holds `minute_id` (its minute cache, which the log pool fills as it makes minutes
    durable): a retried write whose first try was written, and perhaps applied, already."""
    return bool(connection.hexists(keys.minute_by_id(project_id), minute_id))


@dataclass
class _Planner:
    snapshot: MemorySnapshot
    agent_id: str
    clock: ChangeClock
    plan: ImportPlan
    ids: RequestIds
    seen: dict[str, str] = field(default_factory=dict)  # fact id -> the file that names it
    # New facts of this import, by tier key and slot, so two new files in one slot see each other.
    fresh: list[Fact] = field(default_factory=list)
    exported_ids: dict[str, str] = field(default_factory=dict)  # path -> the fact id the export put there
    # The newest version among the files: when the folder was exported, as far as the import can tell.
    exported_at: int = 0

    def add(self, path: str, fact_id: str, minute: Minute) -> None:
        self.plan.changes.append(PlannedChange(path, fact_id, minute))

    def file(self, path: str, text: str, rendered: Mapping[str, str]) -> None:
        root = path.split("/", 1)[0]
        check_global_grant(path, self.snapshot.include_global)
        if root in DERIVED_ROOTS:
            if rendered.get(path, "").strip() != text.strip():
                kind = "an episode" if root == EPISODES_ROOT else "a thread summary"
                raise MemoryConflict(
                    f"{path}: {kind} is derived from the log by the summarize pool and is read-only here; "
                    "leave it as exported (edit the facts under facts/ or learned/ instead)"
                )
            self.plan.unchanged += 1
            return
        if rendered.get(path) == text:  # as exported: nothing to compare
            front_id = self.exported_ids.get(path)
            if front_id is not None:
                self._claim(path, front_id)
                self.exported_at = max(self.exported_at, self.snapshot.records[front_id].last_ms)
                self.plan.unchanged += 1
                return
        front, body = parse(path, text)
        fact_id = front.get("id")
        if fact_id is None:
            self._new(path, front, body)
        else:
            self._existing(path, str(fact_id), front, body)

    def _claim(self, path: str, fact_id: str) -> None:
        other = self.seen.get(fact_id)
        if other is not None:
            raise MemoryFileError(f"{path}: fact {fact_id} is also the fact of {other}; keep one file per fact")
        self.seen[fact_id] = path

    # -- an existing fact

    def _existing(self, path: str, fact_id: str, front: dict[str, Any], body: str) -> None:
        stored = self.snapshot.records.get(fact_id)
        if stored is None:
            raise MemoryFileError(
                f"{path}: id {fact_id[:40]!r} is not a fact of project {self.snapshot.project_id}; "
                "remove the id line (and version, sources, relations, recorded_at, promoted_from, period) "
                "to assert a new fact"
            )
        self._claim(path, fact_id)
        unknown = sorted(set(front) - set(FACT_KEYS))
        if unknown:
            raise MemoryFileError(
                f"{path}: {unknown[0]!r} is not a field of a fact file; fields: {', '.join(FACT_KEYS)}"
            )
        version = front.get("version")
        if isinstance(version, int) and not isinstance(version, bool):
            self.exported_at = max(self.exported_at, version)
        expected = fact_front(stored.raw, stored.last_ms)
        if _same(expected, front, stored.raw["text"], body):
            self.plan.unchanged += 1
            return
        if version != stored.last_ms:
            if isinstance(version, bool) or not isinstance(version, int):
                raise MemoryFileError(
                    f"{path}: version {version!r} must be the whole number the export wrote; export again and "
                    "redo the edit"
                )
            older = "older than" if version < stored.last_ms else "not"
            raise MemoryConflict(
                f"{path}: version {version} is {older} the store's version {stored.last_ms} of fact {fact_id}: "
                "it changed since this file was exported. Export again, redo the edit, then import"
            )
        fact = stored.fact
        for key in FIXED_KEYS:
            if key in front and not _equal(key, expected.get(key), front[key]):
                raise MemoryFileError(
                    f"{path}: {key} cannot change in place (it names the fact or records its history): to state "
                    "another value, add a new file without an id and set this one's status to retracted"
                )
        changes: dict[str, Any] = {}
        for key, name in EDITED_KEYS.items():
            if key in front and not _equal(key, expected[key], front[key]):
                changes[name] = front[key]
        if body.strip() != fact.text.strip():
            changes["text"] = body
        status = front.get("status", fact.status.value)
        if changes:
            try:
                minute = edited_minute(
                    fact, project_id=self._maker(fact), agent_id=self.agent_id, **self._stamp(), **changes
                )
            except ContractError as exc:
                raise MemoryFileError(f"{path}: {_field_problem(exc)}") from None
            self.add(path, fact.id, minute)
        if status != fact.status.value:
            self._status(path, fact, status)

    def _status(self, path: str, fact: Fact, status: Any) -> None:
        if status == FactStatus.RETRACTED.value:
            self.add(
                path,
                fact.id,
                retracted_minute(
                    fact,
                    RETRACTED_BY_STATUS,
                    project_id=self._maker(fact),
                    agent_id=self.agent_id,
                    **self._stamp(),
                ),
            )
        elif status == FactStatus.PROMOTED.value and fact.status is FactStatus.PENDING:
            promoted = fact.with_(status=FactStatus.PROMOTED)
            self.add(
                path,
                fact.id,
                promoted_minute(fact, PromotionReason.BY_HAND, agent_id=self.agent_id, **self._stamp()),
            )
            for old in on_promotion(self._slot_view(fact), promoted):
                minute = superseded_minute(old, promoted, agent_id=self.agent_id, **self._stamp())
                self.add(path, old.id, minute)
        else:
            raise MemoryFileError(
                f"{path}: status {str(status)[:40]!r}: a {fact.status.value} fact can become "
                + ("promoted or retracted" if fact.status is FactStatus.PENDING else "retracted")
                + " here (supersession follows from a new value in the slot)"
            )

    def _stamp(self) -> dict[str, str]:
        """The next change minute's id and time."""
        return {"minute_id": self.ids.next(), "timestamp": iso_from_ms(self.clock.now())}

    def _maker(self, fact: Fact) -> str | None:
        """The project whose log keeps a change to `fact`: this one for a global fact, else the fact's own."""
        return self.snapshot.project_id if fact.tier is Tier.GLOBAL else None

    def _slot_view(self, fact: Fact) -> list[Fact]:
        tier_key = str(fact.tier_key)
        held = [r.fact for r in self.snapshot.records.values() if r.raw["tier_key"] == tier_key]
        return [f for f in (*held, *self.fresh) if f.slot == fact.slot]

    # -- a new fact

    def _new(self, path: str, front: dict[str, Any], body: str) -> None:
        if path.split("/", 1)[0] not in EDITABLE_ROOTS:
            raise MemoryPathError(f"{path}: a new fact goes under facts/ (or learned/ for a learned key)")
        unknown = sorted(set(front) - set(NEW_FACT_KEYS))
        if unknown:
            set_by_pvm = set(FACT_KEYS) - set(NEW_FACT_KEYS)
            why = "is set by PVM" if unknown[0] in set_by_pvm else "is not a field of a fact file"
            raise MemoryFileError(
                f"{path}: {unknown[0]!r} {why}; a new fact (no id) may give: {', '.join(NEW_FACT_KEYS)}"
            )
        for key in ("subject", "attribute", "value"):
            if front.get(key) is None:
                raise MemoryFileError(f"{path}: {key} is required for a new fact (subject, attribute, value)")
        project_id = self.snapshot.project_id
        try:
            tier = Tier(front.get("tier", Tier.PROJECT.value))
            learned = normalize_text(str(front["subject"])) == LEARNED_SUBJECT
            if tier is Tier.GLOBAL:
                check_global_grant(path, self.snapshot.include_global, by_path=False)
                if not learned:
                    raise MemoryFileError(
                        f"{path}: tier global: a new global fact comes only by promotion (POST "
                        ".../facts/{id}/promote) or as a learned key (subject: learned); assert it in the project"
                    )
            task = front.get("task")
            if tier is Tier.GLOBAL:
                if task is not None:
                    raise MemoryFileError(f"{path}: task is for tier task only; drop it or set 'tier: task'")
                tier_key = GLOBAL_KEY
            elif tier is Tier.TASK:
                if task is None:
                    raise MemoryFileError(f"{path}: tier task names its task: add 'task: <task id>'")
                tier_key = TierKey.for_task(project_id, str(task))
            elif task is not None:
                raise MemoryFileError(f"{path}: task is for tier task only; drop it or set 'tier: task'")
            else:
                tier_key = TierKey.for_project(project_id)
        except ValueError as exc:
            if isinstance(exc, MemoryFileError):
                raise
            raise MemoryFileError(f"{path}: tier {front.get('tier')!r} must be task, project or global") from None
        value = front["value"]
        if isinstance(value, (dict, list)) or value is None:
            raise MemoryFileError(f"{path}: value must be text, a number or true/false")
        text = body.strip() or None
        tags = front.get("tags") or []
        if not isinstance(tags, list):
            raise MemoryFileError(f'{path}: tags must be a list such as ["db", "ops"], not {type(tags).__name__}')
        status = front.get("status", FactStatus.PROMOTED.value)
        when = iso_from_ms(self.clock.now())
        try:
            if learned:
                minute = learned_minute(
                    str(front["attribute"]),
                    value,
                    tier_key,
                    type=front.get("type", FactType.FACT.value),
                    text=text,
                    project_id=project_id if tier is Tier.GLOBAL else None,
                    agent_id=self.agent_id,
                    minute_id=self.ids.next(),
                    timestamp=when,
                )
                key_fact = Fact.from_dict(minute.data["fact"])
                self._claim(path, key_fact.id)
                self.fresh.append(key_fact)
                self.add(path, key_fact.id, minute)
                return
            if status not in (FactStatus.PENDING.value, FactStatus.PROMOTED.value):
                raise MemoryFileError(f"{path}: status {status!r}: a new fact is pending or promoted")
            minute_id = self.ids.next()
            fact = Fact.new(
                type=front.get("type", FactType.FACT.value),
                text=text or f"{front['subject']} {front['attribute']}: {value}",
                subject=str(front["subject"]),
                attribute=str(front["attribute"]),
                value=value,
                tier_key=tier_key,
                confidence=front.get("confidence", 1.0),
                source_minute_ids=(minute_id,),
                importance=front.get("importance"),
                status=status,
                valid_from=front.get("valid_from"),
                valid_until=front.get("valid_until"),
                recorded_at=when,
                tags=tuple(tags),
                single_valued=front.get("single_valued"),
            )
            view = self._slot_view(fact)
            placing = place(view, fact)
            if placing.restates is not None:
                held = placing.restates
                where = self.seen.get(held.id) or fact_path(held)
                raise MemoryFileError(
                    f"{path}: the slot {fact.slot} of {tier_key} holds the value {fact.value!r} already, as fact "
                    f"{held.id} ({where}); edit that file instead (or export again after an import)"
                )
            if placing.period:
                fact = fact.with_(period=placing.period)
            fitting = fit(view, fact)
            fact = fact.with_(
                relationships=tuple(
                    Relationship(RelationKind.SUPERSEDES, f.id) for f in fitting.older[-MAX_RELATIONSHIPS:]
                )
            )
            self._claim(path, fact.id)
            self.fresh.append(fact)
            self.add(path, fact.id, asserted_minute(fact, agent_id=self.agent_id, minute_id=minute_id, timestamp=when))
            for old in fitting.older:
                minute = superseded_minute(old, fact, agent_id=self.agent_id, **self._stamp())
                self.add(path, old.id, minute)
            if fitting.later is not None:
                minute = superseded_minute(fact, fitting.later, agent_id=self.agent_id, **self._stamp())
                self.add(path, fact.id, minute)
            for other in fitting.same:
                minute = contradicted_minute(fact, other, agent_id=self.agent_id, **self._stamp())
                self.add(path, fact.id, minute)
        except ContractError as exc:
            raise MemoryFileError(f"{path}: {_field_problem(exc)}") from None

    # -- files that went away

    def removed(self) -> None:
        """Retract each fact whose file is gone, if the folder was exported after its last change."""
        for fid, stored in sorted(self.snapshot.records.items()):
            if fid in self.seen or stored.raw["status"] == FactStatus.RETRACTED.value:
                continue
            if stored.raw["tier_key"] == GLOBAL_TIER:
                # Shared by every project: retracted by `status: retracted`, never by a file missing from a folder
                # that may have been exported without the grant.
                continue
            if stored.last_ms > self.exported_at:
                # Made or changed after the newest file of the folder: whoever removed its file never saw it.
                continue
            minute = retracted_minute(stored.fact, RETRACTED_BY_DELETION, agent_id=self.agent_id, **self._stamp())
            self.add(fact_path(stored.raw), fid, minute)


def _field_problem(exc: ContractError) -> str:
    field_name = getattr(exc, "field", "")
    problem = getattr(exc, "problem", str(exc))
    field_name = field_name.removeprefix("changes.")
    renamed = {"source_minute_ids": "sources", "relationships": "relations", "tier_key": "tier"}
    return f"{renamed.get(field_name, field_name)} {problem}" if field_name else str(problem)


def _equal(key: str, stored: Any, given: Any) -> bool:
    if stored == given:
        return True
    if key == "value":
        try:
            return bool(normalize_value(stored) == normalize_value(given))
        except (ContractError, TypeError):
            return False
    if key in ("valid_from", "valid_until", "recorded_at") and stored is not None and given is not None:
        try:
            return check_time(stored, key) == check_time(given, key)
        except ContractError:
            return False
    if key in ("importance", "confidence") and isinstance(given, (int, float)) and not isinstance(given, bool):
        return float(stored) == float(given)
    return False


def _same(expected: Mapping[str, Any], front: Mapping[str, Any], text: str, body: str) -> bool:
    """Whether a parsed file says what `expected` (the store's rendering) says: an unedited file, reformatted."""
    if body.strip() != text.strip() or set(front) - set(expected):
        return False
    return all(key in front and _equal(key, value, front[key]) for key, value in expected.items())


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
    planner = _Planner(
        snapshot,
        agent_id,
        ChangeClock(snapshot.last_ms, now_ms),
        ImportPlan(snapshot.project_id),
        RequestIds(minute_id, "memory-change"),
        exported_ids=exported_ids,
        exported_at=_version(exported_version, "exported_version"),
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


def is_export_version(value: object) -> TypeGuard[int]:
    """Whether `value` can be an export's version: a whole number of Unix ms, not negative (and not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _version(given: Any, name: str) -> int:
    if given is None:
        return 0
    if not is_export_version(given):
        raise MemoryFileError(f"{name} {str(given)[:40]!r} must be the whole number the export gave (Unix ms)")
    return given


def check_size(path: str, text: str) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > defaults.MEMORY_FILE_MAX_BYTES:
        raise MemoryFileError(
            f"{path}: {size} bytes; a memory file holds at most {defaults.MEMORY_FILE_MAX_BYTES} "
            "(MEMORY_FILE_MAX_BYTES)"
        )


def tree_lines(paths: Iterable[str], per_folder: int | None = None) -> list[str]:
    """`paths` as an indented tree, each folder once; with `per_folder`, at most that many files shown per folder."""
    lines: list[str] = []
    shown: set[str] = set()
    files_in: dict[str, int] = {}
    for path in sorted(paths):
        parts = path.split("/")
        for depth in range(len(parts) - 1):
            folder = "/".join(parts[: depth + 1])
            if folder not in shown:
                shown.add(folder)
                lines.append("  " * depth + parts[depth] + "/")
        folder = "/".join(parts[:-1])
        files_in[folder] = files_in.get(folder, 0) + 1
        if per_folder is None or files_in[folder] <= per_folder:
            lines.append("  " * (len(parts) - 1) + parts[-1])
        elif files_in[folder] == per_folder + 1:
            lines.append("  " * (len(parts) - 1) + "...")
    return lines


# -- writing the minutes ------------------------------------------------------------------------------------------


def stream_writer(connection: redis.Redis, shards: int) -> Write:
    """Appends minutes to their shard streams, as `emit` and ``POST /v1/minutes`` do (`write_minutes`:
    `MEMORY_WRITE_CHUNK` per MULTI/EXEC; one project's minutes share one stream). Returns the stream entry ids."""
    return functools.partial(write_minutes, connection, shards)


# -- folders ------------------------------------------------------------------------------------------------------


def read_folder(root: str | os.PathLike[str]) -> dict[str, str]:
    """The memory files under `root` (only ``*.md`` under `ROOTS`; anything else is not memory and is skipped).

    Refused (`MemoryPathError` naming the file): a symlink that leads outside `root`, a name no memory path
    can have, a file over `MEMORY_FILE_MAX_BYTES`, more than `MEMORY_IMPORT_MAX_FILES` files or
    `MEMORY_IMPORT_MAX_BYTES` in all, text that is not UTF-8.
    """
    base = os.fspath(root)
    if not os.path.isdir(base):
        raise MemoryPathError(f"{base}: not a folder; pass the folder `pvm export` wrote")
    limit = defaults.MEMORY_FILE_MAX_BYTES
    files: dict[str, str] = {}
    total = 0
    for rel, full in _walk(base):
        if not rel.endswith(SUFFIX):
            continue
        check_memory_path(rel)
        with open(full, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise MemoryFileError(
                f"{rel}: over {limit} bytes; a memory file holds at most that (MEMORY_FILE_MAX_BYTES)"
            )
        total += len(data)
        if total > defaults.MEMORY_IMPORT_MAX_BYTES or len(files) >= defaults.MEMORY_IMPORT_MAX_FILES:
            raise MemoryFileError(
                f"{base}: more than {defaults.MEMORY_IMPORT_MAX_FILES} files or "
                f"{defaults.MEMORY_IMPORT_MAX_BYTES} bytes (MEMORY_IMPORT_MAX_FILES, MEMORY_IMPORT_MAX_BYTES)"
            )
        try:
            files[rel] = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MemoryFileError(f"{rel}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return files


def _inside(target: str, real_base: str) -> bool:
    return target == real_base or target.startswith(real_base.rstrip(os.sep) + os.sep)


def _walk(base: str) -> Iterable[tuple[str, str]]:
    """(path relative to `base`, full path) of the files under `base`'s `ROOTS`, depth first.

    A symlink is followed only when its target stays inside `base` (else `MemoryPathError`), each folder once.
    """
    real_base = os.path.realpath(base)
    stack: list[tuple[str, str]] = []
    for top in ROOTS:
        full = os.path.join(base, top)
        if os.path.islink(full) and not _inside(os.path.realpath(full), real_base):
            raise MemoryPathError(
                f"{full}: a symlink to {os.path.realpath(full)}, outside the memory folder {real_base}; "
                "memory files live inside it"
            )
        if os.path.isdir(full):
            stack.append((top, full))
    seen: set[str] = set()
    while stack:
        rel_dir, dir_path = stack.pop()
        real_dir = os.path.realpath(dir_path)
        if real_dir in seen:
            continue
        seen.add(real_dir)
        with os.scandir(dir_path) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                rel = f"{rel_dir}/{entry.name}"
                if entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if not _inside(target, real_base):
                        raise MemoryPathError(
                            f"{entry.path}: a symlink to {target}, outside the memory folder {real_base}; "
                            "memory files live inside it"
                        )
                    if os.path.isdir(target):
                        stack.append((rel, entry.path))
                    elif os.path.isfile(target):
                        yield rel, entry.path
                elif entry.is_dir(follow_symlinks=False):
                    stack.append((rel, entry.path))
                elif entry.is_file(follow_symlinks=False):
                    yield rel, entry.path


def write_folder(root: str | os.PathLike[str], files: Mapping[str, str], version: int | None = None) -> int:
    """Write `files` under `root` (created as needed); old ``*.md`` files under `ROOTS` not in `files` go, so the
    folder is the export. A symlink out of `root` is refused before anything is written. `version` (the snapshot's
    `last_ms`) goes in `EXPORT_MARK`, where `read_export_version` finds it for the import. Returns the files
    written.
    """
    base = os.fspath(root)
    os.makedirs(base, exist_ok=True)
    for top in ROOTS:
        if os.path.islink(os.path.join(base, top)):
            raise MemoryPathError(f"{os.path.join(base, top)}: a symlink; the export writes real folders in {base}")
    for path in files:
        check_memory_path(path)
    for rel, full in list(_walk(base)):  # refuses a symlink out of `root` before anything changes
        if rel.endswith(SUFFIX) and rel not in files:
            os.unlink(full)
    for folder in sorted({path.rpartition("/")[0] for path in files}):
        os.makedirs(os.path.join(base, folder), exist_ok=True)
    for path, text in files.items():
        _write_file(os.path.join(base, path), text.encode("utf-8"))
    mark = os.path.join(base, EXPORT_MARK)
    if version is not None:
        _write_file(mark, (json.dumps({"version": version}) + "\n").encode())
    elif os.path.lexists(mark):
        os.unlink(mark)
    return len(files)


def read_export_version(root: str | os.PathLike[str]) -> int | None:
    """The version `write_folder` kept in `root`'s `EXPORT_MARK`, or None when there is none (a folder written by
    hand or by an older PVM: the import then goes by the files' own versions)."""
    mark = os.path.join(os.fspath(root), EXPORT_MARK)
    if not os.path.lexists(mark):
        return None
    if os.path.islink(mark) or not os.path.isfile(mark):
        raise MemoryPathError(f"{mark}: not a plain file; the export writes it (remove it to import without it)")
    with open(mark, "rb") as f:
        data = f.read(4096)
    try:
        version = json.loads(data)["version"]
    except (ValueError, KeyError, TypeError):
        raise MemoryFileError(
            f'{mark}: not what the export wrote ({{"version": <Unix ms>}}); remove it or export again'
        ) from None
    return _version(version, f"{mark}: version")


def _write_file(path: str, data: bytes) -> None:
    # os.open / os.write: a text-mode open() per file costs more than the write itself, over thousands of files.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)

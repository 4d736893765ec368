"""Threads, chunks and episodes: the nouns of the summarize pool, and the ``chunk_summarized`` minute with its parser.

A *thread* is the conversation a minute belongs to (`ThreadRef`): its ``thread_id``, else its task
(``data.task_id``), else its project; which of these count, and in what order, is a setting
(`THREAD_SOURCES`). The summarize pool keeps a thread's newest minutes verbatim and folds older ones,
in log order, into `Chunk` records; it reads `Episode` records (a decision, a problem solved, ...) from
minute patterns. Both are projections of the log: replay rebuilds them.

An LLM-written chunk summary is a knowledge change, so it is a minute (``chunk_summarized``,
`ChunkSummarized`): replay reads it back instead of calling the model. Its payload is exact, and it
names its chunk by an id derived from the project, the thread and the chunk's seq range
(`chunk_id`): a minute naming a range that is not its chunk's is refused (`chunk_summarized`). Like the
``fact_*`` changes, producers may not send one (`SYSTEM_EVENT_TYPES`: the API refuses them).

No I/O here: records validate themselves, and errors name the field.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from contracts.errors import ContractError, InvalidMinute
from contracts.fact_changes import FACT_EVENT_TYPES
from contracts.facts import is_valid_task_id
from contracts.minute import MAX_NAME_LENGTH, EventType, Minute, Scope, check_project_id
from contracts.pair import PAIR_EVENT_TYPES

MAX_SUMMARY_CHARS = 2_000  # one chunk's summary (a merged chunk's too)
MAX_TOPICS = 12
MAX_TOPIC_CHARS = 64
MAX_PARTICIPANTS = 32
MAX_OUTCOME_CHARS = 300
MAX_TITLE_CHARS = 160
MAX_SEQ_RANGES = 64  # past this a merged chunk joins its two oldest ranges into one span
MAX_EPISODE_MINUTES = 64  # minute ids one episode links (the first and the newest ones are kept)
MAX_MODEL_CHARS = 128
MAX_DECISIONS = 32  # decisions one chunk names (a merged chunk keeps its newest)
MAX_DECISION_CHARS = 300

SUMMARY_EVENT_TYPES = frozenset({EventType.CHUNK_SUMMARIZED.value})
# Event types only PVM writes (the facts pool's changes, the summarize pool's summaries, PAIR rounds): producers may
# not send them, recent windows and threads leave them out (their view is the facts and the thread's chunks).
SYSTEM_EVENT_TYPES = FACT_EVENT_TYPES | SUMMARY_EVENT_TYPES | PAIR_EVENT_TYPES


class SummaryError(ContractError):
    """A chunk or episode field is missing, mistyped or out of range; `field` names it."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"invalid summary record: {field}: {problem}")


# -- threads ---------------------------------------------------------------------------------------------------


class ThreadKind(StrEnum):
    """What names a thread: a minute's ``thread_id``, its task, or its whole project."""

    THREAD = "thread"
    TASK = "task"
    PROJECT = "project"


THREAD_SOURCES = (ThreadKind.THREAD.value, ThreadKind.TASK.value, ThreadKind.PROJECT.value)


@dataclass(frozen=True, slots=True)
class ThreadRef:
    """One thread of a project: ``thread:<thread_id>``, ``task:<task_id>`` or ``project``.

    `parse` also takes a bare thread id (``deploy-42`` is ``thread:deploy-42``); a thread id that itself
    starts with ``task:`` or ``thread:``, or is ``project``, is written with the ``thread:`` prefix.
    """

    kind: ThreadKind
    name: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ThreadKind(self.kind))
        if self.kind is ThreadKind.PROJECT:
            if self.name:
                raise SummaryError("thread", "the project thread has no name; write 'project'")
            return
        if not isinstance(self.name, str) or not self.name or len(self.name) > MAX_NAME_LENGTH:
            raise SummaryError(
                "thread", f"a {self.kind.value} thread needs a name of 1 to {MAX_NAME_LENGTH} characters"
            )
        if self.kind is ThreadKind.TASK and not is_valid_task_id(self.name):
            raise SummaryError("thread", f"{self.name[:40]!r} is not a task id")

    def __str__(self) -> str:
        return self.kind.value if self.kind is ThreadKind.PROJECT else f"{self.kind.value}:{self.name}"

    @property
    def digest(self) -> str:
        """A fixed-shape name for Redis keys (thread ids are free text)."""
        return hashlib.sha1(str(self).encode("utf-8")).hexdigest()[:20]

    @classmethod
    def parse(cls, text: Any, field: str = "thread") -> ThreadRef:
        """The thread `text` names; `SummaryError` naming `field` when it names none."""
        if isinstance(text, ThreadRef):
            return text
        if not isinstance(text, str) or not text.strip():
            raise SummaryError(field, "is required: a thread id, 'task:<task id>' or 'project'")
        text = text.strip()
        try:
            if text == ThreadKind.PROJECT.value:
                return cls(ThreadKind.PROJECT)
            for kind in (ThreadKind.TASK, ThreadKind.THREAD):
                if text.startswith(f"{kind.value}:"):
                    return cls(kind, text[len(kind.value) + 1 :])
            return cls(ThreadKind.THREAD, text)
        except SummaryError as exc:
            raise SummaryError(field, exc.problem) from None


def check_thread_sources(sources: Sequence[str]) -> tuple[str, ...]:
    """`sources` if each is a `ThreadKind` and none repeats; ValueError naming PVM_THREAD_BY otherwise."""
    out = tuple(sources)
    if not out or len(set(out)) != len(out) or not set(out) <= set(THREAD_SOURCES):
        raise ValueError(
            f"PVM_THREAD_BY={','.join(out)!r} must list some of {', '.join(THREAD_SOURCES)}, each once, in the "
            "order a minute's thread is looked for (default: thread,task,project)"
        )
    return out


def thread_of(minute: Minute, sources: Sequence[str] = THREAD_SOURCES) -> ThreadRef | None:
    """The thread `minute` belongs to: the first of `sources` it has; None for a system minute or none found."""
    if minute.event_type in SYSTEM_EVENT_TYPES:
        return None
    for source in sources:
        if source == "thread" and minute.thread_id:
            return ThreadRef(ThreadKind.THREAD, minute.thread_id)
        if source == "task":
            task_id = minute.data.get("task_id")
            if is_valid_task_id(task_id):
                return ThreadRef(ThreadKind.TASK, str(task_id))
        if source == "project":
            return ThreadRef(ThreadKind.PROJECT)
    return None


# -- field rules -----------------------------------------------------------------------------------------------


def _text(value: Any, field: str, limit: int, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise SummaryError(field, "must be non-empty text" + (" or null" if optional else ""))
    if len(value) > limit:
        raise SummaryError(field, f"is {len(value)} characters; the limit is {limit}")
    return value


def _texts(value: Any, field: str, most: int, limit: int) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise SummaryError(field, f"must be a list of text, got {type(value).__name__}")
    if len(value) > most:
        raise SummaryError(field, f"has {len(value)} items; the limit is {most}")
    return tuple(str(_text(v, f"{field}[{i}]", limit)) for i, v in enumerate(value))


def _seq(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SummaryError(field, f"must be a log seq (an integer from 1), got {value!r}")
    return value


def _unit(value: Any, field: str, low: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SummaryError(field, f"must be a number, got {value!r}")
    if not low <= value <= 1:
        raise SummaryError(field, f"{value} is outside {low:g}..1")
    return float(value)


def _ranges(value: Any, field: str) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, (list, tuple)) or not value or len(value) > MAX_SEQ_RANGES:
        raise SummaryError(field, f"must be a list of 1 to {MAX_SEQ_RANGES} [first, last] seq pairs")
    out: list[tuple[int, int]] = []
    for i, pair in enumerate(value):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise SummaryError(f"{field}[{i}]", "must be a [first, last] pair")
        first, last = _seq(pair[0], f"{field}[{i}][0]"), _seq(pair[1], f"{field}[{i}][1]")
        if last < first or (out and first <= out[-1][1]):
            raise SummaryError(f"{field}[{i}]", "ranges run upwards, each after the one before")
        out.append((first, last))
    return tuple(out)


def chunk_id(project_id: str, thread: ThreadRef, first_seq: int, last_seq: int) -> str:
    """The id of the chunk of `thread` whose minutes run from log seq `first_seq` to `last_seq`."""
    raw = f"{project_id}\x1f{thread}\x1f{first_seq}\x1f{last_seq}".encode()
    return hashlib.sha1(raw).hexdigest()[:24]


# -- chunks ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Chunk:
    """Older minutes of a thread in log order, as a summary: what happened, its key topics, who, and how it ended.

    ``seq_ranges``: the log seqs of the minutes it stands for, one range per chunk merged into it
    (`merged`). ``tokens``: what those minutes cost verbatim in a prompt (the summary's ratio is
    measured against it). ``summarizer``: ``extractive``, or ``llm:<model>``.
    """

    project_id: str
    thread: ThreadRef
    seq_ranges: tuple[tuple[int, int], ...]
    minute_count: int
    summary: str
    key_topics: tuple[str, ...] = ()
    participants: tuple[str, ...] = ()
    outcome: str | None = None
    summarizer: str = "extractive"
    tokens: int = 0
    merged: int = 1
    decisions: tuple[str, ...] = ()  # what its decision minutes decided, one line each, in log order

    def __post_init__(self) -> None:
        try:
            check_project_id(self.project_id)
        except InvalidMinute as exc:
            raise SummaryError("project_id", exc.problem) from None
        object.__setattr__(self, "thread", ThreadRef.parse(self.thread))
        object.__setattr__(self, "seq_ranges", _ranges(self.seq_ranges, "seq_ranges"))
        object.__setattr__(self, "summary", _text(self.summary, "summary", MAX_SUMMARY_CHARS))
        object.__setattr__(self, "key_topics", _texts(self.key_topics, "key_topics", MAX_TOPICS, MAX_TOPIC_CHARS))
        object.__setattr__(
            self, "participants", _texts(self.participants, "participants", MAX_PARTICIPANTS, MAX_NAME_LENGTH)
        )
        object.__setattr__(self, "outcome", _text(self.outcome, "outcome", MAX_OUTCOME_CHARS, optional=True))
        object.__setattr__(self, "decisions", _texts(self.decisions, "decisions", MAX_DECISIONS, MAX_DECISION_CHARS))
        _text(self.summarizer, "summarizer", MAX_MODEL_CHARS + 4)
        for name in ("minute_count", "tokens", "merged"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "tokens" else 1):
                raise SummaryError(name, f"must be a positive integer, got {value!r}")

    @property
    def first_seq(self) -> int:
        return self.seq_ranges[0][0]

    @property
    def last_seq(self) -> int:
        return self.seq_ranges[-1][1]

    @property
    def id(self) -> str:
        """`chunk_id` of its whole span (a merged chunk's id changes with each merge)."""
        return chunk_id(self.project_id, self.thread, self.first_seq, self.last_seq)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "project_id": self.project_id,
            "thread": str(self.thread),
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "seq_ranges": [list(r) for r in self.seq_ranges],
            "minute_count": self.minute_count,
            "summary": self.summary,
            "key_topics": list(self.key_topics),
            "participants": list(self.participants),
            "outcome": self.outcome,
            "summarizer": self.summarizer,
            "tokens": self.tokens,
            "merged": self.merged,
            "decisions": list(self.decisions),
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Chunk:
        if not isinstance(raw, dict):
            raise SummaryError("chunk", f"must be a mapping, got {type(raw).__name__}")
        try:
            return cls(
                project_id=raw["project_id"],
                thread=raw["thread"],
                seq_ranges=raw["seq_ranges"],
                minute_count=raw["minute_count"],
                summary=raw["summary"],
                key_topics=raw.get("key_topics") or (),
                participants=raw.get("participants") or (),
                outcome=raw.get("outcome"),
                summarizer=raw.get("summarizer", "extractive"),
                tokens=raw.get("tokens", 0),
                merged=raw.get("merged", 1),
                decisions=raw.get("decisions") or (),
            )
        except KeyError as missing:
            raise SummaryError(str(missing.args[0]), "is required") from None


# -- episodes --------------------------------------------------------------------------------------------------


class EpisodeKind(StrEnum):
    """The minute patterns that make an episode."""

    DECISION_MADE = "decision_made"  # a decision minute
    PROBLEM_SOLVED = "problem_solved"  # a task failed, then completed
    BREAKTHROUGH = "breakthrough"  # said so, or success after repeated failures
    ISSUE_IDENTIFIED = "issue_identified"  # a task failed, a conflict was detected
    TASK_COMPLETED = "task_completed"
    PIVOT = "pivot"  # a decision that supersedes an earlier one


@dataclass(frozen=True, slots=True)
class Episode:
    """Something that happened in a thread worth remembering as one story, with the minutes it links.

    ``significance`` 0..1 (how much it matters), ``valence`` -1..1 (how it went). Episodes that share
    a minute merge into one (their ``kinds`` together, the most significant first).
    """

    project_id: str
    thread: ThreadRef
    kinds: tuple[EpisodeKind, ...]
    title: str
    summary: str
    minute_ids: tuple[str, ...]
    first_seq: int
    last_seq: int
    participants: tuple[str, ...] = ()
    outcome: str | None = None
    significance: float = 0.5
    valence: float = 0.0

    def __post_init__(self) -> None:
        try:
            check_project_id(self.project_id)
        except InvalidMinute as exc:
            raise SummaryError("project_id", exc.problem) from None
        object.__setattr__(self, "thread", ThreadRef.parse(self.thread))
        if not isinstance(self.kinds, (list, tuple)) or not self.kinds:
            raise SummaryError("kinds", "must list at least one of " + ", ".join(k.value for k in EpisodeKind))
        try:
            object.__setattr__(self, "kinds", tuple(dict.fromkeys(EpisodeKind(k) for k in self.kinds)))
        except ValueError:
            raise SummaryError("kinds", "must each be one of " + ", ".join(k.value for k in EpisodeKind)) from None
        object.__setattr__(self, "title", _text(self.title, "title", MAX_TITLE_CHARS))
        object.__setattr__(self, "summary", _text(self.summary, "summary", MAX_SUMMARY_CHARS))
        ids = _texts(self.minute_ids, "minute_ids", MAX_EPISODE_MINUTES, MAX_NAME_LENGTH)
        if not ids:
            raise SummaryError("minute_ids", "must link at least one minute")
        object.__setattr__(self, "minute_ids", ids)
        first, last = _seq(self.first_seq, "first_seq"), _seq(self.last_seq, "last_seq")
        if last < first:
            raise SummaryError("last_seq", f"{last} is before first_seq {first}")
        object.__setattr__(
            self, "participants", _texts(self.participants, "participants", MAX_PARTICIPANTS, MAX_NAME_LENGTH)
        )
        object.__setattr__(self, "outcome", _text(self.outcome, "outcome", MAX_OUTCOME_CHARS, optional=True))
        object.__setattr__(self, "significance", _unit(self.significance, "significance", 0.0))
        object.__setattr__(self, "valence", _unit(self.valence, "valence", -1.0))

    @property
    def id(self) -> str:
        """Derived from the thread and its first minute: an episode keeps its id as later minutes merge into it."""
        raw = f"{self.project_id}\x1f{self.thread}\x1f{self.minute_ids[0]}".encode()
        return hashlib.sha1(raw).hexdigest()[:24]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "project_id": self.project_id,
            "thread": str(self.thread),
            "kinds": [k.value for k in self.kinds],
            "title": self.title,
            "summary": self.summary,
            "participants": list(self.participants),
            "outcome": self.outcome,
            "significance": self.significance,
            "valence": self.valence,
            "minute_ids": list(self.minute_ids),
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Episode:
        if not isinstance(raw, dict):
            raise SummaryError("episode", f"must be a mapping, got {type(raw).__name__}")
        try:
            return cls(
                project_id=raw["project_id"],
                thread=raw["thread"],
                kinds=raw["kinds"],
                title=raw["title"],
                summary=raw["summary"],
                minute_ids=raw["minute_ids"],
                first_seq=raw["first_seq"],
                last_seq=raw["last_seq"],
                participants=raw.get("participants") or (),
                outcome=raw.get("outcome"),
                significance=raw.get("significance", 0.5),
                valence=raw.get("valence", 0.0),
            )
        except KeyError as missing:
            raise SummaryError(str(missing.args[0]), "is required") from None


# -- the chunk_summarized minute -------------------------------------------------------------------------------

_SUMMARIZED_FIELDS = ("chunk_id", "thread", "first_seq", "last_seq", "summary", "key_topics", "outcome", "model")


@dataclass(frozen=True, slots=True)
class ChunkSummarized:
    """What a model said about one chunk: the payload of a ``chunk_summarized`` minute."""

    thread: ThreadRef
    first_seq: int
    last_seq: int
    summary: str
    key_topics: tuple[str, ...] = ()
    outcome: str | None = None
    model: str = "llm"
    chunk_id: str = field(default="")

    def check(self, project_id: str) -> ChunkSummarized:
        """This payload, validated, for a minute of `project_id`; `SummaryError` naming the field."""
        thread = ThreadRef.parse(self.thread)
        first, last = _seq(self.first_seq, "first_seq"), _seq(self.last_seq, "last_seq")
        if last < first:
            raise SummaryError("last_seq", f"{last} is before first_seq {first}")
        expected = chunk_id(project_id, thread, first, last)
        if self.chunk_id and self.chunk_id != expected:
            raise SummaryError("chunk_id", f"does not name the chunk of {thread} from seq {first} to {last}")
        return ChunkSummarized(
            thread=thread,
            first_seq=first,
            last_seq=last,
            summary=str(_text(self.summary, "summary", MAX_SUMMARY_CHARS)),
            key_topics=_texts(self.key_topics, "key_topics", MAX_TOPICS, MAX_TOPIC_CHARS),
            outcome=_text(self.outcome, "outcome", MAX_OUTCOME_CHARS, optional=True),
            model=str(_text(self.model, "model", MAX_MODEL_CHARS)),
            chunk_id=expected,
        )

    def to_data(self) -> dict[str, Any]:
        return {
            "chunk_id": self.chunk_id,
            "thread": str(self.thread),
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "summary": self.summary,
            "key_topics": list(self.key_topics),
            "outcome": self.outcome,
            "model": self.model,
        }


def chunk_summarized_minute(
    project_id: str, summarized: ChunkSummarized, *, minute_id: str, timestamp: str, context_references: tuple[str, ...]
) -> Minute:
    """The ``chunk_summarized`` minute that records `summarized` in `project_id`'s log (scope project, no thread)."""
    checked = summarized.check(project_id)
    return Minute(
        project_id=project_id,
        event_type=EventType.CHUNK_SUMMARIZED.value,
        id=minute_id,
        timestamp=timestamp,
        agent_id="pvm-summarize",
        data=checked.to_data(),
        context_references=context_references,
        memory_note=checked.summary,
        scope=Scope.PROJECT.value,
    )


def chunk_summarized(minute: Minute) -> ChunkSummarized:
    """The summary a ``chunk_summarized`` minute records, validated; `InvalidMinute` naming ``data.<field>``.

    Refuses another event type, a payload with a missing or unknown key, a thread or scope that is not
    the minute's project's, and a ``chunk_id`` that is not the id of the range it names (a forged or
    mangled minute): the pool applies a summary only to the chunk it names.
    """
    if minute.event_type != EventType.CHUNK_SUMMARIZED.value:
        raise InvalidMinute("event_type", f"{minute.event_type!r} is not {EventType.CHUNK_SUMMARIZED.value!r}")
    if minute.scope != Scope.PROJECT.value:
        raise InvalidMinute("scope", "a chunk_summarized minute carries scope 'project'")
    data = minute.data
    for key in data:
        if key not in _SUMMARIZED_FIELDS:
            raise InvalidMinute(
                f"data.{key}", "is not a field of chunk_summarized; fields: " + ", ".join(_SUMMARIZED_FIELDS)
            )
    for key in _SUMMARIZED_FIELDS:
        if key not in data:
            raise InvalidMinute(f"data.{key}", "is required")
    if not isinstance(data["chunk_id"], str) or not data["chunk_id"]:
        raise InvalidMinute("data.chunk_id", "must name the chunk (its id)")
    try:
        return ChunkSummarized(
            thread=ThreadRef.parse(data["thread"]),
            first_seq=data["first_seq"],
            last_seq=data["last_seq"],
            summary=data["summary"],
            key_topics=data["key_topics"],
            outcome=data["outcome"],
            model=data["model"],
            chunk_id=data["chunk_id"],
        ).check(minute.project_id)
    except SummaryError as exc:
        raise InvalidMinute(f"data.{exc.field}", exc.problem) from None


# -- prompt text -------------------------------------------------------------------------------------------------


def chunk_line(chunk: dict[str, Any]) -> str:
    """One chunk (`Chunk.to_dict()`) as one prompt line: its seq span, summary, topics and outcome.

    A chunk marked ``compact`` (a context too small for its summary) is its span and its decisions only.
    """
    span = f"seq {chunk.get('first_seq')}-{chunk.get('last_seq')}"
    if int(chunk.get("merged") or 1) > 1:
        span += f", {chunk['merged']} chunks"
    if chunk.get("compact"):
        return f"- [{span}] decided: " + "; ".join(chunk.get("decisions") or ())
    extras = []
    if chunk.get("key_topics"):
        extras.append("topics: " + ", ".join(chunk["key_topics"]))
    if chunk.get("outcome"):
        extras.append(f"outcome: {chunk['outcome']}")
    tail = f" ({'; '.join(extras)})" if extras else ""
    return f"- [{span}] {chunk.get('summary', '')}{tail}"


def episode_line(episode: dict[str, Any]) -> str:
    """One episode (`Episode.to_dict()`) as one prompt line: kinds, title, outcome, significance and valence."""
    kinds = ", ".join(episode.get("kinds") or ())
    outcome = f" -> {episode['outcome']}" if episode.get("outcome") else ""
    return (
        f"- [{kinds}] {episode.get('title', '')}{outcome} "
        f"(significance {float(episode.get('significance', 0)):.2f}, valence {float(episode.get('valence', 0)):+.2f})"
    )

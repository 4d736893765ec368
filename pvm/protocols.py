"""The pluggable parts of PVM as Protocols: a test double is a few lines, a new backend one class."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from contracts.memory import SearchFilters


class Embedder(Protocol):
    """Turns texts into dense vectors (or declines: `dimensions` is None for lexical-only)."""

    @property
    def dimensions(self) -> int | None: ...

    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


# Kinds of points. A minute point carries no ``kind`` in its payload (every minute point written so far, and
# every one written now: the minute path stays as it was); every other point names its kind.
MINUTE = "minute"
FACT = "fact"  # a fact (`contracts.Fact`), folded from its knowledge-change minutes (workers/index/fact_points.py)
FACT_PENDING = "fact_pending"  # changes to a fact whose assertion is not indexed yet: found by no search
TIER_CLEARED = "tier_cleared"  # the task_memory_cleared minutes of one task key: found by no search
# A minute or fact the evaluate pool pruned: out of every search but those that opt in (minutes), never written
# by an upsert (only `VectorEngine.annotate` sets it); re-indexing the memory (`pvm replay`) restores it.
PRUNED = "pruned"
FACT_PRUNED = "fact_pruned"
# A thread's chunk or episode summary (workers/index/summary_points.py), with the minute ids it stands for ("sources"),
# and the point a summary that merged into another or was dropped leaves behind (found by no search).
SUMMARY = "summary"
SUMMARY_RETIRED = "summary_retired"
POINT_KINDS = (MINUTE, FACT, FACT_PENDING, TIER_CLEARED, SUMMARY, SUMMARY_RETIRED)

# The evaluate pool's annotation of a point (`VectorEngine.annotate`): always written whole, absent ones as None.
ANNOTATION_FIELDS = ("scores", "pruned_ms", "merged_into", "merged_from", "conflict_with")


@dataclass(frozen=True, slots=True)
class MemoryPoint:
    """One minute, or one fact (or its bookkeeping), as the vector store holds it.

    `minute_id` is the point's key: for a minute, its id (the point id is
    derived from it and the project); for every other kind a UUID string, which
    is the point id as it is (a fact's id). `project_id` is the tenant: a
    project, or `pvm.vectors.GLOBAL_TENANT` for global-tier facts.
    """

    minute_id: str
    project_id: str
    text: str  # what the lexical leg indexes
    payload: dict[
        str, Any
    ]  # agent_id, event_type, category, timestamp_ms, task_id, thread_id, insights, scores, seq (not the minute)
    dense: list[float] | None = None
    kind: str = MINUTE
    dense_text: str | None = None  # what the dense leg embeds; None: `text`

    @property
    def embed_text(self) -> str:
        """The text the embedder gets: `dense_text` when the point has one, else the lexical `text`."""
        return self.text if self.dense_text is None else self.dense_text


@dataclass(frozen=True, slots=True)
class StoredPoint:
    """A point read back whole: its key (`MemoryPoint.minute_id`), payload and dense vector (None when not read)."""

    key: str
    payload: dict[str, Any]
    dense: list[float] | None = None


@dataclass(frozen=True, slots=True)
class FactFilters:
    """Narrowing of a query to fact points (`kind` fact); every tuple is "any of these", an empty one "any".

    `as_of_ms` (Unix ms) keeps the facts that held then and that PVM knew by
    then: ``valid_from <= t < valid_until``, ``recorded_at <= t``, and not
    cleared by then. Without it, facts cleared from the current view are left
    out and validity is not read. The statuses are the facts' statuses now.
    """

    types: tuple[str, ...] = ()
    tiers: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ("promoted",)
    as_of_ms: int | None = None


@dataclass(frozen=True, slots=True)
class SummaryFilters:
    """Narrowing of a query to summary points (`kind` summary): with `as_of_ms`, those whose newest source minute
    was written by then. Of the query's `SearchFilters`, `thread_id`, `since_ms` and `until_ms` apply."""

    as_of_ms: int | None = None


# What ranking reads of a candidate. A query with with_payload=False returns payloads holding only these
# (the composite nested as written, ``{"scores": {"composite": ...}}``): fetching and unpacking whole payloads
# for every candidate cost more than the search; `retrieve` fetches them for the few that rank highest.
RANKING_FIELDS = (
    "project_id",
    "minute_id",
    "timestamp_ms",
    "scores.composite",
    # importance without recency (`pvm.vectors.importance`); the embedded engine stores it flat instead
    "scores.relevance",
    "scores.accuracy",
    "scores.impact",
    "thread_id",  # a top hit lifts the candidates of its thread (`pvm.search`, multi-hop)
)


@dataclass(slots=True)
class Candidate:
    """A point a vector query returned, before the final re-ranking. Read it, never write it.

    Not frozen: a context at 100k minutes builds ~100 (its candidates, its winners, the threads around them), and
    a frozen dataclass's constructor cost ~3x as much (~0.8 against ~0.25 µs, an `object.__setattr__` a field):
    ~50 µs a context. Nothing sets a field after it is built.
    """

    minute_id: str
    payload: dict[str, Any]
    keyword: float = 0.0  # lexical leg score (0 when the leg did not find it)
    semantic: float = 0.0  # dense leg score
    fused: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


class MinuteSource(Protocol):
    """Whole minutes by id, read where they are durable (the Redis minute cache, then the log): search hits' minutes.

    Minute points hold what search filters and ranks on, not the minute
    itself (`workers.index.pool`); `pvm.stores.minutes.DurableMinutes` is the
    one the reader uses.
    """

    def minutes_by_id(self, project_id: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The minutes of the project with these ids, as `Minute.to_dict` gives them; ids found nowhere are absent."""
        ...

    def ask(self, project_id: str, ids: Sequence[str]) -> AskedMinutes:
        """`minutes_by_id` in two steps: asked now, read later (`AskedMinutes.read`); the caller works meanwhile."""
        ...


class AskedMinutes(Protocol):
    """Minutes asked of a `MinuteSource` and not read yet: `read` them once, or `drop` them."""

    def read(self, ids: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """`minutes_by_id` of `ids` (every id asked, by default)."""
        ...

    def drop(self) -> None:
        """Leave the answer unread (the caller failed in between)."""
        ...


class VectorEngine(Protocol):
    """A vector store. Every read names a project and filters on it; a missing project is an error."""

    def upsert(self, points: Sequence[MemoryPoint]) -> None: ...

    def query(
        self,
        project_id: str,
        text: str,
        dense: list[float] | None,
        filters: SearchFilters,
        limit: int,
        *,
        with_payload: bool = True,
        facts: FactFilters | SummaryFilters | None = None,
        fused: bool = True,
    ) -> list[Candidate]:
        """Candidates for a text (and dense vector); with_payload=False: payloads of `RANKING_FIELDS` only.

        `fused`: with both legs, also Qdrant's fusion of them (`Candidate.fused`); without it the legs alone
        (a candidate's `fused` is its better leg score), which saves running each leg a second time.

        Minutes, or with `facts` given, fact points (or with `SummaryFilters`, summary points) within those
        filters instead.
        """
        ...

    def around(
        self, project_id: str, filters: SearchFilters, minute: Candidate, count: int, *, long: bool = False
    ) -> list[Candidate]:
        """`minute` (a candidate) and up to `count` minutes within `filters` each side of it, oldest first, in the
        order (timestamp, minute id), with `RANKING_FIELDS` payloads: a thread's minutes around a hit, when
        `filters` names the thread. `long`: the caller knows the thread holds more than `WINDOW_WHOLE_THREAD`
        minutes, so the engine reads in time order at once instead of trying the thread whole first."""
        ...

    def in_threads(
        self, project_id: str, filters: SearchFilters, thread_ids: Sequence[str], limit: int
    ) -> list[Candidate]:
        """Up to `limit` minutes of these threads within `filters`, in no particular order, with `RANKING_FIELDS`
        payloads: fewer than `limit` is every one of them (several short threads read in one call)."""
        ...

    def retrieve(self, project_id: str, minute_ids: Sequence[str]) -> list[Candidate]:
        """The stored points of these minutes with their whole payloads, in the order asked."""
        ...

    def get_points(
        self, project_id: str, keys: Sequence[str], *, tier_keys: Sequence[str] = (), with_vectors: bool = False
    ) -> list[StoredPoint]:
        """Points of any kind but minutes by key (UUID strings), and every point of these tier keys; unknown skipped."""
        ...

    def count(self, project_id: str, kind: str = MINUTE) -> int:
        """Points of one kind stored for the project (its minutes by default)."""
        ...

    def annotate(self, project_id: str, annotations: Mapping[str, Mapping[str, Any]], *, kind: str = MINUTE) -> int:
        """Set the evaluate pool's annotation (`ANNOTATION_FIELDS`) on points that exist; returns how many did.

        Keys are minute ids (`kind` MINUTE) or fact ids (`kind` FACT). ``scores``
        replaces the point's scores (ranking reads their composite); a non-null
        ``pruned_ms`` moves the point out of searches (kind `PRUNED` or
        `FACT_PRUNED`). Vectors and the rest of the payload are untouched.
        """
        ...

    def delete_project(self, project_id: str) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class JSONResult:
    """A chat model's answer: a JSON object, parsed and valid against the schema the caller gave."""

    data: dict[str, Any]
    model: str  # the model that answered, as configured (for provenance)
    repaired: bool = False  # the first answer was invalid and one follow-up fixed it
    prompt_tokens: int = 0  # as the endpoint reported them, over every request of the call
    completion_tokens: int = 0
    requests: int = 1  # HTTP requests the call took: retries and the repair included


class ChatModel(Protocol):
    """An LLM that answers a conversation with one JSON object valid against a JSON Schema, or raises."""

    def complete_json(
        self, messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any], *, name: str
    ) -> JSONResult:
        """`messages`: {"role": "system" | "user" | "assistant", "content": str}; `name`: the schema's purpose."""
        ...

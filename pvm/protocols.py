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


@dataclass(frozen=True, slots=True)
class MemoryPoint:
    """One minute as the vector store holds it."""

    minute_id: str
    project_id: str
    text: str  # what the lexical leg indexes
    payload: dict[
        str, Any
    ]  # agent_id, event_type, category, timestamp_ms, task_id, thread_id, insights, scores, minute
    dense: list[float] | None = None


# What ranking reads of a candidate. A query with with_payload=False returns payloads holding only these
# (the composite nested as written, ``{"scores": {"composite": ...}}``): fetching and unpacking whole payloads
# for every candidate cost more than the search; `retrieve` fetches them for the few that rank highest.
RANKING_FIELDS = ("project_id", "minute_id", "timestamp_ms", "scores.composite")


@dataclass(frozen=True, slots=True)
class Candidate:
    """A point a vector query returned, before the final re-ranking."""

    minute_id: str
    payload: dict[str, Any]
    keyword: float = 0.0  # lexical leg score (0 when the leg did not find it)
    semantic: float = 0.0  # dense leg score
    fused: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


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
    ) -> list[Candidate]:
        """Candidates for a text (and dense vector); with_payload=False: payloads of `RANKING_FIELDS` only."""
        ...

    def retrieve(self, project_id: str, minute_ids: Sequence[str]) -> list[Candidate]:
        """The stored points of these minutes with their whole payloads, in the order asked."""
        ...

    def count(self, project_id: str) -> int: ...

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

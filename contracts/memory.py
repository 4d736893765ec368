"""Memory records derived from minutes: categories, insights, scores, search hits and the context package.

Nouns only. Stores and pools build these; the reader returns them; the HTTP API
serves them as JSON through `to_dict()`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from contracts.summaries import chunk_line, episode_line


class Category(StrEnum):
    """What a minute teaches, for filtering and for the agent's context."""

    AGENT_CAPABILITY = "agent_capability"
    COORDINATION_PATTERN = "coordination_pattern"
    CONFLICT_RESOLUTION = "conflict_resolution"
    TASK_ASSIGNMENT = "task_assignment"
    FAILURE_PATTERN = "failure_pattern"
    PROJECT_KNOWLEDGE = "project_knowledge"


@dataclass(frozen=True, slots=True)
class Insight:
    """A finding drawn from a minute, with how sure we are and where it applies."""

    type: str  # outcome | capability | resolution | ...
    finding: str
    confidence: float  # 0..1
    applicable_contexts: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "finding": self.finding,
            "confidence": self.confidence,
            "applicable_contexts": list(self.applicable_contexts),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Insight:
        return cls(raw["type"], raw["finding"], float(raw["confidence"]), tuple(raw.get("applicable_contexts", ())))


@dataclass(frozen=True, slots=True)
class Scores:
    """How much a memory is worth, each 0..1; `composite` combines the others."""

    recency: float
    relevance: float
    accuracy: float
    impact: float
    composite: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Scores:
        return cls(**{k: float(raw[k]) for k in ("recency", "relevance", "accuracy", "impact", "composite")})


@dataclass(frozen=True, slots=True)
class SearchFilters:
    """Narrowing of a search. Every field is optional; the project is always required separately."""

    categories: tuple[str, ...] = ()
    event_types: tuple[str, ...] = ()
    agents: tuple[str, ...] = ()
    task_id: str | None = None
    thread_id: str | None = None
    since_ms: int | None = None  # minute timestamp, Unix ms, inclusive
    until_ms: int | None = None  # exclusive
    min_composite: float | None = None
    include_pruned: bool = False  # also minutes the evaluate pool pruned (they stay in the log; replay restores them)

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True, slots=True)
class RankWeights:
    """Weights of the final ranking (default semantic 0.4, keyword 0.3, recency 0.2, importance 0.1)."""

    semantic: float = 0.4
    keyword: float = 0.3
    recency: float = 0.2
    importance: float = 0.1


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One minute found by a search, with its final score and the parts it was made of."""

    kind: ClassVar[str] = "minute"  # what a search found; a fact is a `FactHit`
    minute_id: str
    score: float
    minute: dict[str, Any]  # the minute as Minute.to_dict()
    category: str
    insights: tuple[Insight, ...] = ()
    scores: Scores | None = None
    parts: dict[str, float] = field(default_factory=dict)  # semantic, keyword, recency, importance

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SearchHit:
        return cls(
            minute_id=raw["minute_id"],
            score=float(raw["score"]),
            minute=raw["minute"],
            category=raw["category"],
            insights=tuple(Insight.from_dict(i) for i in raw.get("insights") or ()),
            scores=Scores.from_dict(raw["scores"]) if raw.get("scores") else None,
            parts=dict(raw.get("parts") or {}),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "minute_id": self.minute_id,
            "score": self.score,
            "minute": self.minute,
            "category": self.category,
            "insights": [i.to_dict() for i in self.insights],
            "scores": self.scores.to_dict() if self.scores else None,
            "parts": dict(self.parts),
        }


@dataclass(frozen=True, slots=True)
class FactHit:
    """One fact found by a search: the fact as `contracts.Fact.to_dict()`, its final score and the parts of it."""

    kind: ClassVar[str] = "fact"
    fact_id: str
    score: float
    fact: dict[str, Any]  # every field of the fact: type, text, value, status, valid_from / valid_until, tier_key, ...
    parts: dict[str, float] = field(default_factory=dict)  # semantic, keyword, recency, importance

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> FactHit:
        return cls(
            fact_id=raw["fact_id"], score=float(raw["score"]), fact=raw["fact"], parts=dict(raw.get("parts") or {})
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "fact_id": self.fact_id,
            "score": self.score,
            "fact": self.fact,
            "parts": dict(self.parts),
        }

    @property
    def sources(self) -> tuple[str, ...]:
        """The minutes the fact was read from."""
        return tuple(str(i) for i in self.fact.get("source_minute_ids") or ())


@dataclass(frozen=True, slots=True)
class SummaryHit:
    """One thread summary found by a search: a chunk or an episode (`of`), as its record's ``to_dict()``, the
    minute ids it stands for (`sources`), its final score and the parts of it."""

    kind: ClassVar[str] = "summary"
    summary_id: str  # the point's key
    score: float
    of: str  # "chunk" or "episode"
    thread: str
    text: str  # what was searched: the summary with its topics (a chunk) or title and outcome (an episode)
    sources: tuple[str, ...]
    record: dict[str, Any]  # contracts.summaries.Chunk.to_dict() or Episode.to_dict()
    parts: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SummaryHit:
        return cls(
            summary_id=raw["summary_id"],
            score=float(raw["score"]),
            of=raw["of"],
            thread=raw["thread"],
            text=raw["text"],
            sources=tuple(raw.get("sources") or ()),
            record=raw.get("record") or {},
            parts=dict(raw.get("parts") or {}),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "summary_id": self.summary_id,
            "score": self.score,
            "of": self.of,
            "thread": self.thread,
            "text": self.text,
            "sources": list(self.sources),
            "record": self.record,
            "parts": dict(self.parts),
        }


@dataclass(frozen=True, slots=True)
class AgentMemory:
    """An agent's track record in one project."""

    agent_id: str
    tasks_assigned: int = 0
    tasks_completed: int = 0
    tasks_failed: int = 0
    mean_success: float | None = None  # mean success_criteria_met of finished tasks, 0..100
    capabilities: tuple[str, ...] = ()
    last_active: str | None = None  # timestamp of the agent's newest minute

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["capabilities"] = list(self.capabilities)
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> AgentMemory:
        return cls(**{**raw, "capabilities": tuple(raw.get("capabilities") or ())})


@dataclass(frozen=True, slots=True)
class BudgetReport:
    """How the token budget was spent: tokens per section and what was cut to fit, and the facts' tiers likewise."""

    budget_tokens: int
    used_tokens: int
    sections: dict[str, int]  # section -> tokens
    cut: dict[str, int]  # section -> items left out
    tiers: dict[str, int] = field(default_factory=dict)  # facts section: tier (task, project, global) -> tokens
    tier_cut: dict[str, int] = field(default_factory=dict)  # facts section: tier -> facts left out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BudgetReport:
        return cls(
            int(raw["budget_tokens"]),
            int(raw["used_tokens"]),
            dict(raw["sections"]),
            dict(raw["cut"]),
            dict(raw.get("tiers") or {}),
            dict(raw.get("tier_cut") or {}),
        )


@dataclass(frozen=True, slots=True)
class ContextPackage:
    """What an agent gets to think with: bounded, relevant, and honest about how fresh it is."""

    project_id: str
    agent_id: str
    task: str | None
    recent: tuple[dict[str, Any], ...]  # newest minutes of the project (minute dicts, oldest first)
    referenced: tuple[dict[str, Any], ...]  # minutes the recent ones reference
    agent_memory: AgentMemory
    relevant_experience: tuple[SearchHit, ...]
    budget: BudgetReport
    freshness: dict[str, Any]  # per stage: how far behind the newest minute it is
    full_log_available: bool
    # What we know: current, promoted facts (Fact.to_dict()) of the task, project and granted global tiers, in
    # that order, each tier's most important to the task first (constraints and goals, then by relevance). A fact
    # a newer statement questions carries it under QUESTIONED_BY (`questioned`), beside it, not on its own.
    facts: tuple[dict[str, Any], ...] = ()
    # Procedure facts (Fact.to_dict()) whose condition (subject) matches the task: do the action (value); highest
    # priority (importance) first.
    rules: tuple[dict[str, Any], ...] = ()
    # A context built for a thread (`thread`, its name): `recent` is then the thread's newest minutes, followed by
    # its chunk summaries (Chunk.to_dict(), newest first) and its episodes (Episode.to_dict(), most significant
    # first).
    thread: str | None = None
    summaries: tuple[dict[str, Any], ...] = ()
    episodes: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "project_id": self.project_id,
            "agent_id": self.agent_id,
            "task": self.task,
            "recent": list(self.recent),
            "referenced": list(self.referenced),
            "agent_memory": self.agent_memory.to_dict(),
            "relevant_experience": [h.to_dict() for h in self.relevant_experience],
            "budget": self.budget.to_dict(),
            "freshness": self.freshness,
            "full_log_available": self.full_log_available,
            "facts": list(self.facts),
            "rules": list(self.rules),
            "thread": self.thread,
            "summaries": list(self.summaries),
            "episodes": list(self.episodes),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ContextPackage:
        return cls(
            project_id=raw["project_id"],
            agent_id=raw["agent_id"],
            task=raw.get("task"),
            recent=tuple(raw["recent"]),
            referenced=tuple(raw["referenced"]),
            agent_memory=AgentMemory.from_dict(raw["agent_memory"]),
            relevant_experience=tuple(SearchHit.from_dict(h) for h in raw["relevant_experience"]),
            budget=BudgetReport.from_dict(raw["budget"]),
            freshness=raw["freshness"],
            full_log_available=bool(raw["full_log_available"]),
            facts=tuple(raw.get("facts") or ()),
            rules=tuple(raw.get("rules") or ()),
            thread=raw.get("thread"),
            summaries=tuple(raw.get("summaries") or ()),
            episodes=tuple(raw.get("episodes") or ()),
        )

    def render(self) -> str:
        """The package as prompt-ready text."""
        out = [f"# Context for {self.agent_id} in project {self.project_id}"]
        if self.task:
            out.append(f"Task: {self.task}")
        out.append("\n## Your track record")
        out.extend(agent_lines(self.agent_memory))
        if self.facts:
            out.append("\n## What we know")
            tier = None
            for fact in self.facts:
                if fact.get("tier_key") != tier:
                    tier = fact.get("tier_key")
                    out.append(tier_heading(str(tier)))
                out.append(fact_line(fact))
        if self.rules:
            out.append("\n## Rules that apply")
            out.extend(rule_line(r) for r in self.rules)
        if self.relevant_experience:
            out.append("\n## Relevant past experience")
            out.extend(hit_line(h) for h in self.relevant_experience)
        if self.episodes:
            out.append("\n## Episodes of this thread")
            out.extend(episode_line(e) for e in self.episodes)
        if self.summaries:
            out.append("\n## Earlier in this thread (summaries, newest first)")
            out.extend(chunk_line(c) for c in self.summaries)
        where = f" in thread {self.thread}" if self.thread else ""
        out.append(f"\n## Recent activity{where} (newest {len(self.recent)}, oldest first)")
        out.extend(minute_line(m) for m in self.recent)
        if self.referenced:
            out.append("\n## Referenced earlier minutes")
            out.extend(minute_line(m) for m in self.referenced)
        index = self.freshness.get("index", {}) if isinstance(self.freshness, dict) else {}
        notes = index_notes(index) if isinstance(index, dict) else []
        if notes:
            out.append("\n" + "\n".join(notes))
        cut = ", ".join(f"{n} {s}" for s, n in self.budget.cut.items() if s != "facts")
        if self.budget.tier_cut:
            facts = ", ".join(f"{n} {tier}" for tier, n in self.budget.tier_cut.items())
            cut = ", ".join(part for part in (cut, f"facts ({facts})") if part)
        if cut:
            out.append(f"(budget {self.budget.budget_tokens} tokens: left out {cut})")
        return "\n".join(out)


# -- prompt text ------------------------------------------------------------------


def minute_line(minute: dict[str, Any]) -> str:
    """One minute as one prompt line."""
    data = minute.get("data") or {}
    parts = [minute.get("timestamp", "")[:19], minute.get("event_type", "")]
    if minute.get("agent_id"):
        parts.append(f"by {minute['agent_id']}")
    if data.get("task_id"):
        parts.append(f"task {data['task_id']}")
    if data.get("success_criteria_met") is not None:
        parts.append(f"success {data['success_criteria_met']}%")
    text = minute.get("memory_note") or data.get("resolution") or data.get("assignment_reasoning") or ""
    line = " | ".join(p for p in parts if p)
    return f"- [{minute.get('id', '')}] {line}: {text}" if text else f"- [{minute.get('id', '')}] {line}"


def index_notes(index: dict[str, Any]) -> list[str]:
    """What the prompt should know about the search behind the package: how far behind it is, whether it fell short.

    Fixed sentences only: the reasons in `freshness` name endpoints and exceptions, which are for operators.
    """
    notes = []
    if index.get("behind"):
        notes.append(f"(note: search is {index['behind']} minutes behind the log)")
    if index.get("error"):
        notes.append("(note: relevant past experience is missing: search is unavailable)")
    elif index.get("degraded"):
        notes.append("(note: relevant past experience matched by keywords only: the embedding provider is unavailable)")
    return notes


def tier_heading(tier_key: str) -> str:
    """The line above a tier's facts: which task, the project, or every project."""
    tier, _, rest = tier_key.partition(":")
    if tier == "task":
        return f"### This task ({rest.partition(':')[2]})"
    if tier == "project":
        return "### This project"
    return "### Every project"


# The key of a context's fact record (`ContextPackage.facts`) holding the newest statement that questions it: a
# newer minute said its slot changed in words PVM could not read as a value (`RelationKind.QUESTIONS`).
QUESTIONED_BY = "questioned_by"


def questioned(fact: Mapping[str, Any], statement: Mapping[str, Any]) -> dict[str, Any]:
    """A context's fact record (`Fact.to_dict()`) with the statement (`Fact.to_dict()`) that questions it beside
    it: its id, words (its value), since when, and the minutes it came from."""
    return {
        **fact,
        QUESTIONED_BY: {
            "fact_id": statement.get("id"),
            "text": statement.get("value"),
            "valid_from": statement.get("valid_from"),
            "source_minute_ids": list(statement.get("source_minute_ids") or ()),
        },
    }


def as_fact_record(fact: Mapping[str, Any]) -> dict[str, Any]:
    """A context's fact record as `Fact.to_dict()` wrote it (what `questioned` added taken off)."""
    return {k: v for k, v in fact.items() if k != QUESTIONED_BY}


def fact_line(fact: Mapping[str, Any]) -> str:
    """One fact (`Fact.to_dict()`) as one prompt line: its type, its sentence, and since when it holds; a
    questioned one (`questioned`) with the newer statement after it."""
    since = str(fact.get("valid_from") or "")[:10]
    line = f"- {fact.get('type', 'fact')}: {fact.get('text', '')}" + (f" (since {since})" if since else "")
    newer = fact.get(QUESTIONED_BY)
    if isinstance(newer, Mapping):
        line += f" - questioned by a newer minute ({str(newer.get('valid_from') or '')[:10]}): {newer.get('text', '')}"
    return line


def rule_line(rule: dict[str, Any]) -> str:
    """One procedure fact (`Fact.to_dict()`) as a rule: when its subject holds, do its value."""
    return f"- when {rule.get('subject', '')}: {rule.get('value', '')} (priority {float(rule.get('importance', 0)):g})"


def hit_line(hit: SearchHit) -> str:
    insight = f" (insight: {hit.insights[0].finding})" if hit.insights else ""
    return f"{minute_line(hit.minute)} [{hit.category}, score {hit.score:.2f}]{insight}"


def agent_lines(memory: AgentMemory) -> list[str]:
    mean = "n/a" if memory.mean_success is None else f"{memory.mean_success:.0f}%"
    lines = [
        f"- {memory.agent_id}: {memory.tasks_assigned} tasks assigned, {memory.tasks_completed} completed, "
        f"{memory.tasks_failed} failed, mean success {mean}"
    ]
    if memory.capabilities:
        lines.append("- capabilities: " + ", ".join(memory.capabilities[:20]))
    if memory.last_active:
        lines.append(f"- last active {memory.last_active}")
    return lines

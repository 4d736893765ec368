"""The LLM fact extractor: candidates a chat model reads, one call per chunk of a project's minutes, rules as fallback.

`LLMExtractor` implements `workers.facts.extraction.Extractor` with any
OpenAI-compatible chat endpoint (`pvm.llm.LLMClient`, the PVM_LLM_* settings).
Per batch of minutes:

1. **What goes to the model.** A knowledge-change minute (``fact_*``) never:
   the pool applies those, it never extracts from them. A minute of the data
   convention neither: the producer said exactly what it means, and the rules
   take it as said. Nor a minute with no text to read.
2. **Chunks.** The rest, grouped by project (one project per prompt, never
   two), in order, `LLM_EXTRACT_CHUNK_MINUTES` (10) to a call.
3. **The prompt.** The minutes' text fields, numbered M1..Mn; the known facts
   of the chunk's project in the slots the caller passed, numbered F1..Fk (the
   model never sees a fact id, so it cannot mangle one); what the seven types,
   slots and single- or multi-valued attributes mean; date phrases copied as
   written, which PVM grounds against the stating minute's timestamp.
4. **The answer** is a JSON object valid against `FACTS_SCHEMA`
   (`LLMClient.complete_json`: repaired once, else rejected). Each item is read
   back: its refs mapped to minutes and facts (an unknown ref drops the item),
   its fields read by the data convention's rules (`RuleExtractor.from_object`:
   slot normalized, value cleaned, dates grounded), its confidence capped at
   `LLM_EXTRACT_MAX_CONFIDENCE`, and the result checked against the Fact
   contract (what it refuses is dropped). Every drop is counted.
5. **Fallback.** When the call raises `LLMAnswerRejected`, `LLMUnavailable`
   (retries spent, or the circuit breaker open: no request made) or another
   `LLMError`, that chunk's candidates are the rule extractor's.

Nothing here writes anything: candidates become knowledge only as change
minutes the facts pool writes, and replay applies those minutes without
calling a model. The same answer gives the same candidates.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from contracts import Minute
from contracts.errors import InvalidFact
from contracts.fact_changes import is_fact_change
from contracts.facts import (
    MAX_FACT_TEXT,
    MAX_FACT_VALUE,
    Fact,
    FactStatus,
    FactType,
    Slot,
    Tier,
    TierKey,
    normalize_text,
    normalize_value,
)
from contracts.minute import MAX_NAME_LENGTH
from pvm.defaults import (
    LLM_EXTRACT_CHUNK_MINUTES,
    LLM_EXTRACT_MAX_CONFIDENCE,
    LLM_EXTRACT_MAX_FIELD_CHARS,
    LLM_EXTRACT_MAX_KNOWN,
)
from pvm.llm import LLMAnswerRejected, LLMConfigError, LLMError, LLMUnavailable, llm_from_settings
from workers.facts.extraction import TEXT_KEYS, Candidate, Extractor, Known, RuleExtractor, structured_facts, value_key
from workers.rules.assessment import stated_text, task_kind

if TYPE_CHECKING:
    from pvm.config import Settings
    from pvm.metrics import MetricsRecorder
    from pvm.protocols import ChatModel

log = logging.getLogger(__name__)

CALL_NAME = "facts"  # the schema's name and the metrics' kind: chat:facts
EXTRACTOR = "llm"  # the `extractor` label of the extraction metrics, and every candidate's `rule`
# data keys read as text besides the memory note: the rules' (TEXT_KEYS), and a failed task's error.
FIELD_KEYS = (*TEXT_KEYS, "error", "reason")
CHUNK_OUTCOMES = ("answered", "rejected", "unavailable", "error")
# What became of an answer's items: kept, or dropped for a reason; supersedes_ignored counts kept items whose
# supersedes_ref named a fact of another slot or key, or a multi-valued one (the item stays, the link goes).
ITEM_OUTCOMES = ("kept", "unknown_ref", "refused", "duplicate", "supersedes_ignored")

FACT_TYPES = tuple(t.value for t in FactType)

SYSTEM_PROMPT = """\
You read coordination minutes that AI agents wrote while working on one project, and list the long-term \
facts they state: what is true, decided, preferred, required or aimed for, that an agent should still know \
next week.

Each fact has a type:
- fact: a property of a thing ("the billing service's database is Postgres"); also why a kind of task \
fails (subject: the task kind, attribute: failure_cause).
- decision: a choice the team made ("we switched the billing service's database to CockroachDB").
- preference: what the team prefers for a topic (subject: the topic, attribute: preference).
- entity: what a named thing is (attribute: kind, value: what it is) or another name for it (attribute: alias).
- procedure: what to do in a situation (subject: the condition, e.g. "disk fills up"; attribute: action; \
value: the instruction).
- constraint: what must or must never be done (subject: the component, or "scope" for everyone; attribute: \
must or must_not; value: the action).
- goal: what a component or the team aims for (attribute: goal).

The slot is subject + attribute: subject is the thing in lower case without articles ("billing service"; \
"scope" for the team or project as a whole; "task" for the current task); attribute is a short snake_case \
property name (database, session_ttl, owner, max_retries). Use the exact subject and attribute of a known \
fact when a minute speaks of the same property. value is the value as stated, short.

Most attributes hold one value: a new value replaces the old one. When a minute replaces the value of a \
known fact (marked "one value") in the same slot, set supersedes_ref to that fact's number. Constraints, \
goals and collections (owner, alias, members, tags, failure_cause) hold many values: never supersede them.

minute_refs: the numbers of the minutes that state the fact (M2 -> 2); only numbers shown below. \
valid_from: only when a minute says when the fact starts to hold: copy the date phrase as written \
("tomorrow", "next Monday", "2026-12-01"); it is read against that minute's own time. Never compute a date: \
in a deadline or a goal, copy the phrase into the value ("ship v2 by next Friday").
text: one sentence that states the fact. confidence: 0 to 1, how plainly the minute states it.

Skip what is not a lasting fact: questions, guesses, proposals, plans someone might make, passing states \
(slow, down, done), and what one person cannot do or will do today. If the minutes state nothing, answer \
{"facts": []}."""


def facts_schema(chunk_minutes: int = LLM_EXTRACT_CHUNK_MINUTES) -> dict[str, Any]:
    """The JSON Schema of an answer: the same for every call (refs are checked when read, not by the schema).

    A ref out of range is the model's mistake in one item; refused by the
    schema, it would cost a repair and could send the whole chunk to the rules.
    """
    return {
        "type": "object",
        "properties": {
            "facts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "type": {"enum": list(FACT_TYPES)},
                        "subject": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_LENGTH},
                        "attribute": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_LENGTH},
                        "value": {
                            "type": ["string", "number", "boolean"],
                            "minLength": 1,
                            "maxLength": MAX_FACT_VALUE,
                        },
                        "text": {"type": "string", "minLength": 1, "maxLength": MAX_FACT_TEXT},
                        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                        "minute_refs": {
                            "type": "array",
                            "items": {"type": "integer", "minimum": 1},
                            "minItems": 1,
                            "maxItems": chunk_minutes,
                            "description": "the numbers of the minutes that state it (M3 -> 3)",
                        },
                        "supersedes_ref": {
                            "type": ["integer", "null"],
                            "minimum": 1,
                            "description": "the number of the known fact it replaces (F2 -> 2)",
                        },
                        "valid_from": {
                            "type": ["string", "null"],
                            "maxLength": 64,
                            "description": "the date phrase as written, when the minute says when it starts",
                        },
                    },
                    "required": ["type", "subject", "attribute", "value", "text", "confidence", "minute_refs"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["facts"],
        "additionalProperties": False,
    }


FACTS_SCHEMA = facts_schema()


@dataclass(frozen=True, slots=True)
class ExtractionStats:
    """What an LLM extractor did since it was made (a snapshot); the metrics hold the same counts."""

    minutes: int = 0  # minutes it was given
    sent: int = 0  # ... of them shown to the model
    by_rules: int = 0  # ... read by the rules directly (the data convention)
    chunks: int = 0  # calls asked of the model (one per chunk)
    answered: int = 0  # ... answered validly (repaired included)
    rejected: int = 0  # ... fell back to the rules: LLMAnswerRejected
    unavailable: int = 0  # ... fell back: LLMUnavailable (the breaker's refusals included)
    error: int = 0  # ... fell back: another LLMError
    kept: int = 0  # answer items that became candidates
    unknown_ref: int = 0  # items dropped: a minute or fact ref not shown
    refused: int = 0  # items dropped: the convention or the Fact contract refuses what the schema allowed
    duplicate: int = 0  # items dropped: the same type, slot, value and minutes as an earlier item
    supersedes_ignored: int = 0  # items kept, their supersedes_ref ignored (another slot or key, a multi-valued slot)

    @property
    def fallbacks(self) -> int:
        return self.rejected + self.unavailable + self.error


@dataclass(frozen=True, slots=True)
class Chunk:
    """Minutes of one project shown to the model in one call, and the known facts shown with them."""

    project_id: str
    minutes: tuple[Minute, ...]
    known: tuple[Fact, ...]


class LLMExtractor:
    """Candidate facts read by a chat model (`ChatModel`), chunk by chunk; the rules where it fails (an `Extractor`)."""

    reads_known = True  # the facts pool passes the current facts of a batch's tier keys (shown as F1..Fk)

    def __init__(
        self,
        llm: ChatModel,
        fallback: Extractor | None = None,
        *,
        metrics: MetricsRecorder | None = None,
        chunk_minutes: int = LLM_EXTRACT_CHUNK_MINUTES,
        max_known: int = LLM_EXTRACT_MAX_KNOWN,
        max_confidence: float = LLM_EXTRACT_MAX_CONFIDENCE,
    ) -> None:
        """`fallback` (default `RuleExtractor()`) reads a chunk the model did not answer, and convention minutes."""
        if not 1 <= chunk_minutes <= LLM_EXTRACT_CHUNK_MINUTES:
            raise ValueError(f"chunk_minutes={chunk_minutes} must be 1..{LLM_EXTRACT_CHUNK_MINUTES} (issue 10)")
        if max_known < 0:
            raise ValueError(f"max_known={max_known} must be 0 or more")
        if not 0 <= max_confidence <= 1:
            raise ValueError(f"max_confidence={max_confidence} must be from 0 to 1")
        self.llm = llm
        self.fallback: Extractor = fallback if fallback is not None else RuleExtractor()
        # Answer items are read by the data convention's rules, with the fallback's vocabulary when it has one.
        self._reader = self.fallback if isinstance(self.fallback, RuleExtractor) else RuleExtractor()
        self.metrics = metrics
        self.chunk_minutes = chunk_minutes
        self.max_known = max_known
        self.max_confidence = max_confidence
        self.schema = facts_schema(chunk_minutes)
        self._stats = ExtractionStats()
        self._lock = threading.Lock()  # a pool's threads may share one extractor (and its client's breaker)

    @property
    def stats(self) -> ExtractionStats:
        with self._lock:
            return self._stats

    def extract(self, minutes: Sequence[Minute], known: Known | None = None) -> list[Candidate]:
        """The candidates `minutes` state, in minute order; `known`: existing facts by slot, shown as F1..Fk."""
        position = {m.id: i for i, m in enumerate(minutes)}
        counts: Counter[str] = Counter(minutes=len(minutes))
        found: list[Candidate] = []
        direct = [m for m in minutes if not is_fact_change(m) and structured_facts(m)]
        if direct:
            counts["by_rules"] += len(direct)
            found += self.fallback.extract(direct, known)
        facts = _known_facts(known)
        for chunk in self.chunks(minutes, facts):
            counts["sent"] += len(chunk.minutes)
            found += self._chunk(chunk, known, counts)
        found.sort(key=lambda c: position.get(c.source_minute_ids[0], len(position)))  # stable: answer order kept
        self._add(counts)
        return found

    def chunks(self, minutes: Sequence[Minute], facts: Sequence[Fact] = ()) -> list[Chunk]:
        """The calls `minutes` need: the minutes to read grouped by project (first seen first), `chunk_minutes` each."""
        by_project: dict[str, list[Minute]] = {}
        for m in minutes:
            if not is_fact_change(m) and not structured_facts(m) and _fields(m):
                by_project.setdefault(m.project_id, []).append(m)
        out = []
        for project_id, readable in by_project.items():
            for start in range(0, len(readable), self.chunk_minutes):
                part = tuple(readable[start : start + self.chunk_minutes])
                out.append(Chunk(project_id, part, tuple(self._known_for(project_id, part, facts))))
        return out

    def messages(self, chunk: Chunk) -> list[dict[str, str]]:
        """The conversation asked for one chunk: the instructions, then its known facts and minutes."""
        lines = [f"Project: {chunk.project_id}", ""]
        if chunk.known:
            lines.append("Known facts (refer to one by its number: F2 -> supersedes_ref 2):")
            lines += [f"F{i} {_known_line(f)}" for i, f in enumerate(chunk.known, start=1)]
        else:
            lines.append("Known facts: none.")
        lines += ["", "Minutes (refer to them by number: M3 -> 3 in minute_refs):"]
        for i, m in enumerate(chunk.minutes, start=1):
            lines.append(f"M{i} {_minute_header(m)}")
            lines += [f"  {name}: {text}" for name, text in _fields(m)]
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(lines)}]

    # -- one chunk --

    def _chunk(self, chunk: Chunk, known: Known | None, counts: Counter[str]) -> list[Candidate]:
        counts["chunks"] += 1
        try:
            result = self.llm.complete_json(self.messages(chunk), self.schema, name=CALL_NAME)
        except (LLMAnswerRejected, LLMUnavailable, LLMError) as error:
            counts[_outcome(error)] += 1
            level = logging.ERROR if isinstance(error, LLMConfigError) else logging.WARNING
            log.log(
                level,
                "LLM extraction of %d minutes of %s fell back to the rules: %s",
                len(chunk.minutes),
                chunk.project_id,
                error,
            )
            return self.fallback.extract(chunk.minutes, known)
        counts["answered"] += 1
        return self.read_answer(chunk, result.data, counts)

    def read_answer(self, chunk: Chunk, data: Mapping[str, Any], counts: Counter[str] | None = None) -> list[Candidate]:
        """The candidates of a valid answer for `chunk`: refs mapped back, items read and checked (pure)."""
        counts = counts if counts is not None else Counter()
        out: list[Candidate] = []
        seen: set[tuple[str, str, str, str, tuple[str, ...]]] = set()
        for item in data.get("facts", ()):
            candidate, outcome = self._item(chunk, item, counts)
            if candidate is not None:
                key = (
                    candidate.type,
                    candidate.subject,
                    candidate.attribute,
                    value_key(candidate.value),
                    candidate.source_minute_ids,
                )
                if key in seen:
                    outcome = "duplicate"
                else:
                    seen.add(key)
                    out.append(candidate)
            counts[outcome] += 1
        return out

    def _item(self, chunk: Chunk, item: Mapping[str, Any], counts: Counter[str]) -> tuple[Candidate | None, str]:
        """One answer item as a candidate, and what became of it: kept, unknown_ref or refused."""
        refs = list(dict.fromkeys(item["minute_refs"]))
        if not all(1 <= r <= len(chunk.minutes) for r in refs):
            return None, "unknown_ref"
        replaced: Fact | None = None
        ref = item.get("supersedes_ref")
        if ref is not None:
            if not 1 <= ref <= len(chunk.known):
                return None, "unknown_ref"
            replaced = chunk.known[ref - 1]
        sources = [chunk.minutes[r - 1] for r in sorted(refs)]
        value = item["value"]
        stated = {
            "type": item["type"],
            "subject": item["subject"],
            "attribute": item["attribute"],
            "value": value if isinstance(value, str) else normalize_value(value),
            "text": item["text"],
            "confidence": item["confidence"],
            "valid_from": item.get("valid_from"),
        }
        first = self._reader.from_object(sources[0], stated)  # grounded against the earliest stating minute's time
        if first is None:
            return None, "refused"
        candidate = replace(
            first,
            confidence=min(self.max_confidence, first.confidence),
            source_minute_ids=tuple(m.id for m in sources),
            rule=EXTRACTOR,
        )
        if candidate.task_id is not None and any(
            stated_text(m.data.get("task_id")) != candidate.task_id for m in sources[1:]
        ):
            candidate = replace(candidate, tier=Tier.PROJECT.value, task_id=None)  # minutes of several tasks
        tier_key = _tier_key(candidate)
        if not _contract_accepts(candidate, tier_key):
            return None, "refused"
        if replaced is None:
            return candidate, "kept"
        if (
            replaced.tier_key != tier_key
            or replaced.slot != Slot(candidate.subject, candidate.attribute)
            or not candidate.single_valued
            or not replaced.single_valued
        ):
            counts["supersedes_ignored"] += 1  # slot by slot, key by key: never by what the model thinks
            return candidate, "kept"
        return replace(candidate, supersedes_hint=True, supersedes_fact_id=replaced.id), "kept"

    def _known_for(self, project_id: str, minutes: Sequence[Minute], facts: Sequence[Fact]) -> list[Fact]:
        """The known facts shown with a chunk: current, of its project or its tasks; those its text names first."""
        tasks = {stated_text(m.data.get("task_id")) for m in minutes}
        mine = [
            f
            for f in facts
            if f.project_id == project_id
            and (f.tier is Tier.PROJECT or (f.tier is Tier.TASK and f.task_id in tasks))
            and f.status in (FactStatus.PENDING, FactStatus.PROMOTED)
            and f.valid_until is None
        ]
        text = normalize_text(" ".join(t for m in minutes for _, t in _fields(m)))
        named = [f for f in mine if f.slot.subject in text or f.slot.attribute.replace("_", " ") in text]
        shown = {f.id for f in named}
        rest = [f for f in mine if f.id not in shown]
        return (named + rest)[: self.max_known]

    def _add(self, counts: Counter[str]) -> None:
        with self._lock:
            s = self._stats
            self._stats = replace(s, **{f: getattr(s, f) + counts[f] for f in ExtractionStats.__dataclass_fields__})
        if self.metrics is not None:
            recorded = {f"chunks:{o}": counts[o] for o in CHUNK_OUTCOMES}
            recorded |= {f"items:{o}": counts[o] for o in ITEM_OUTCOMES}
            self.metrics.extraction(EXTRACTOR, recorded)


def llm_extractor_from_settings(
    settings: Settings, metrics: MetricsRecorder | None = None, fallback: Extractor | None = None
) -> Extractor | None:
    """The LLM extractor PVM_LLM_* ask for (`fallback`, the rules by default, as its fallback); None when
    PVM_LLM_MODEL is unset."""
    llm = llm_from_settings(settings, metrics)
    return None if llm is None else LLMExtractor(llm, metrics=metrics, fallback=fallback)


# -- the prompt ----------------------------------------------------------------------------------------------------


def _fields(minute: Minute) -> list[tuple[str, str]]:
    """The minute's text a reader reads: its memory note and the text data keys, each cut to a bound."""
    out = []
    for name, raw in (("note", minute.memory_note), *((k, minute.data.get(k)) for k in FIELD_KEYS)):
        text = stated_text(raw)
        if text is not None:
            text = " ".join(text.split())
            if len(text) > LLM_EXTRACT_MAX_FIELD_CHARS:
                text = text[:LLM_EXTRACT_MAX_FIELD_CHARS] + " …"
            out.append((name, text))
    return out


def _minute_header(minute: Minute) -> str:
    parts = [minute.timestamp, minute.event_type, f"by {minute.agent_id}"]
    task_id = stated_text(minute.data.get("task_id"))
    if task_id:
        parts.append(f"task {task_id}" + (" (task memory)" if minute.scope == "task" else ""))
    kind = task_kind(minute)
    if kind:
        parts.append(f"task kind {kind}")
    return " | ".join(parts)


def _known_line(fact: Fact) -> str:
    values = "one value" if fact.single_valued else "many values"
    where = f"task {fact.task_id}" if fact.tier is Tier.TASK else "project"
    return (
        f"{fact.type.value} | {fact.subject} / {fact.attribute} = {fact.value} | since {fact.valid_from[:10]} | "
        f"{values} | {where}"
    )


# -- reading back --------------------------------------------------------------------------------------------------


def _known_facts(known: Known | None) -> list[Fact]:
    """The facts in `known` (records or their dicts), each once, in a fixed order (the prompt depends on no other)."""
    if not known:
        return []
    facts: dict[str, Fact] = {}
    for slot in sorted(known, key=lambda s: tuple(map(str, s))):
        for item in known[slot]:
            fact = item if isinstance(item, Fact) else _fact_of(item)
            if fact is not None:
                facts.setdefault(fact.id, fact)
    return sorted(facts.values(), key=lambda f: (f.slot.subject, f.slot.attribute, f.valid_from, f.id))


def _fact_of(item: object) -> Fact | None:
    if not isinstance(item, Mapping):
        return None
    try:
        return Fact.from_dict(item)
    except InvalidFact:
        return None


def _tier_key(candidate: Candidate) -> TierKey:
    if candidate.tier == Tier.TASK and candidate.task_id is not None:
        return TierKey.for_task(candidate.project_id, candidate.task_id)
    return TierKey.for_project(candidate.project_id)


def _contract_accepts(candidate: Candidate, tier_key: TierKey) -> bool:
    """Whether the Fact contract takes the candidate as a fact (what the schema cannot say: blank after
    normalization, text that is no UTF-8, a reserved subject)."""
    try:
        Fact.new(
            type=candidate.type,
            text=candidate.text,
            subject=candidate.subject,
            attribute=candidate.attribute,
            value=candidate.value,
            tier_key=tier_key,
            confidence=candidate.confidence,
            source_minute_ids=candidate.source_minute_ids,
            valid_from=candidate.valid_from,
            recorded_at=candidate.valid_from,
            tags=candidate.tags,
            single_valued=candidate.single_valued,
        )
    except (InvalidFact, ValueError):
        return False
    return True


def _outcome(error: LLMError) -> str:
    if isinstance(error, LLMAnswerRejected):
        return "rejected"
    if isinstance(error, LLMUnavailable):
        return "unavailable"
    return "error"

"""Chunk summarizers behind one protocol: extractive (default: offline, deterministic) and LLM (one call per chunk).

**Extractive.** A chunk's text is its minutes' memory notes and reasoning (`TEXT_KEYS`), split into
sentences. Key topics come from a small TF-IDF over the chunk (each minute a document: a word that
recurs in a few minutes outranks one every minute says), stop words and short words left out. Each
sentence is worth the summed weight of its distinct key words over the square root of its length, times
its minute's event weight (`EVENT_WEIGHTS`: decisions, failures, completions and resolutions matter
most); decisions are kept whatever their worth (a thread's context must name every decision), then,
while they fit `ratio` of the chunk's tokens, the sentence that adds the most to what is kept: a key
word a kept sentence says already counts nothing (a summary says a thing once, SumBasic's idea:
Nenkova & Vanderwende, 2005), and once every sentence left says only what is said, none is added. The
kept sentences read in log order. The same chunk always gives the same summary.

Why our own TF-IDF and not a package: the maintained keyword extractors here (yake 0.7, rake-nltk,
KeyBERT, sumy) cost dependencies the server does not have (networkx, nltk with its downloaded punkt
data, torch) and milliseconds per document, against a budget of 0.5 ms per minute
(`summarize_per_s` >= 2,000); the chunk is ten short notes, where TF-IDF over the chunk does what is
needed in ~40 lines and ~50 µs.

**LLM.** `LLMSummarizer` asks any OpenAI-compatible chat model through `pvm.llm.LLMClient` (its
timeouts, retries, breaker and metrics, as the facts pool's extractor) for one JSON answer per chunk,
valid against `SUMMARY_SCHEMA` (repaired once, else rejected). Any failure (rejected, unavailable,
refused) makes that chunk the extractive summarizer's. A model's summary is written to the log as a
``chunk_summarized`` minute by the pool, so replay never calls the model again.
"""

from __future__ import annotations

import heapq
import logging
import math
import re
import threading
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from contracts import Minute
from contracts.facts import as_sentence, sentence_key
from contracts.memory import minute_line
from contracts.summaries import (
    MAX_DECISION_CHARS,
    MAX_DECISIONS,
    MAX_OUTCOME_CHARS,
    MAX_SUMMARY_CHARS,
    MAX_TOPIC_CHARS,
    MAX_TOPICS,
    ThreadRef,
)
from pvm import defaults
from pvm.llm import LLMConfigError, LLMError, llm_from_settings
from pvm.reader import estimate_tokens
from workers.rules.statements import in_third_person, is_statement, reported, to_the_listener

if TYPE_CHECKING:
    from pvm.config import Settings
    from pvm.metrics import MetricsRecorder
    from pvm.protocols import ChatModel

log = logging.getLogger(__name__)

EXTRACTIVE = "extractive"
CALL_NAME = "summary"  # the schema's name and the metrics' kind: chat:summary

# data keys read as text besides the memory note: a minute's reasoning, resolution, decision, error.
TEXT_KEYS = ("assignment_reasoning", "reasoning", "resolution", "decision", "error", "reason")
# How much a sentence of each event type counts (others: 1.0). Decisions are kept whatever their score.
EVENT_WEIGHTS = {
    "decision": 3.0,
    "task_failed": 1.6,
    "conflict_resolved": 1.5,
    "task_completed": 1.3,
    "conflict_detected": 1.3,
}
_WORD = re.compile(r"[a-z][a-z0-9_\-]+")
SENTENCE_BREAK = re.compile(r"(?<=[.!?;])\s+")
_STOP_TEXT = """a about above after again against all also am an and any are as at be because been before being
below between both but by can could did do does doing done down during each few for from further had has have
having he her here hers him his how i if in into is it its itself just let me more most my no nor not now of off on
once only or other our out over own same she should so some such than that the their them then there these they
this those through to too under until up very was we were what when where which while who whom why will with
would you your yours us new get got use used using one two three per via still next"""
STOP_WORDS = frozenset(_STOP_TEXT.split())


@dataclass(frozen=True, slots=True)
class Logged:
    """A minute of a thread and its seq in the project's log."""

    seq: int
    minute: Minute


@dataclass(frozen=True, slots=True)
class ChunkText:
    """What a summarizer says about a chunk. ``summarizer``: ``extractive`` or ``llm:<model>``."""

    summary: str
    key_topics: tuple[str, ...]
    outcome: str | None
    summarizer: str = EXTRACTIVE
    participants: tuple[str, ...] = ()
    tokens: int = 0  # what the chunk's minutes cost verbatim
    fell_back: bool = False  # a model was asked and failed: this is the extractive summary in its place

    @property
    def by_model(self) -> bool:
        return self.summarizer != EXTRACTIVE


class Summarizer(Protocol):
    """Summarizes one chunk of a thread (its minutes in log order)."""

    def summarize(self, project_id: str, thread: ThreadRef, minutes: Sequence[Logged]) -> ChunkText: ...


# -- what every summarizer reads ---------------------------------------------------------------------------------


def minute_texts(minute: Minute) -> list[str]:
    """The text a summary is made from: the memory note, then the reasoning keys of `data`."""
    out = [minute.memory_note] if minute.memory_note else []
    for key in TEXT_KEYS:
        value = minute.data.get(key)
        if isinstance(value, str) and value.strip() and value not in out:
            out.append(value)
    return [t.strip() for t in out]


def participants(minutes: Sequence[Logged]) -> tuple[str, ...]:
    """The agents of the chunk, in order of first appearance."""
    return tuple(dict.fromkeys(m.minute.agent_id for m in minutes if m.minute.agent_id))[:32]


def decision_lines(minutes: Sequence[Logged], most_words: int = defaults.SUMMARY_DECISION_WORDS) -> tuple[str, ...]:
    """What the chunk's decision minutes decided, one line each in log order: the first sentence of each one's note
    (else of its ``data.decision``), cut to `most_words` words. From the minutes alone, whoever summarizes."""
    out: list[str] = []
    for logged in minutes:
        m = logged.minute
        if m.event_type != "decision":
            continue
        said = m.memory_note or m.data.get("decision")
        if isinstance(said, str) and said.strip():
            first = next((s.strip() for s in SENTENCE_BREAK.split(said.strip()) if s.strip()), said.strip())
            out.append(_clip(first, most_words)[:MAX_DECISION_CHARS])
    return tuple(out[-MAX_DECISIONS:])


def chunk_tokens(minutes: Sequence[Logged]) -> int:
    """What the chunk's minutes cost verbatim in a context (the reader's line for each)."""
    return sum(estimate_tokens(minute_line(m.minute.to_dict())) + 1 for m in minutes)


def outcome_of(minutes: Sequence[Logged]) -> str | None:
    """How the chunk ended, from its task and conflict events: ``completed T-1 (90%); failed T-2``; None if silent."""
    completed: list[str] = []
    failed: list[str] = []
    resolved = decided = 0
    for logged in minutes:
        m = logged.minute
        task = m.data.get("task_id")
        name = str(task) if isinstance(task, str) and task else "a task"
        if m.event_type == "task_completed":
            score = m.data.get("success_criteria_met")
            completed.append(f"{name} ({score:g}%)" if isinstance(score, (int, float)) else name)
        elif m.event_type == "task_failed":
            failed.append(name)
        elif m.event_type == "conflict_resolved":
            resolved += 1
        elif m.event_type == "decision":
            decided += 1
    parts = []
    if completed:
        parts.append("completed " + ", ".join(dict.fromkeys(completed)))
    if failed:
        parts.append("failed " + ", ".join(dict.fromkeys(failed)))
    if resolved:
        parts.append(f"{resolved} conflict(s) resolved")
    if decided:
        parts.append(f"{decided} decision(s)")
    text = "; ".join(parts)
    return text[:MAX_OUTCOME_CHARS] if text else None


def words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if len(w) > 2 and w not in STOP_WORDS]


def keyword_weights(documents: Sequence[Sequence[str]]) -> dict[str, float]:
    """TF-IDF over `documents` (word lists): term count x (1 + ln((1 + n) / (1 + document frequency)))."""
    n = len(documents)
    tf: Counter[str] = Counter()
    df: Counter[str] = Counter()
    for doc in documents:
        tf.update(doc)
        df.update(set(doc))
    return {w: count * (1.0 + math.log((1 + n) / (1 + df[w]))) for w, count in tf.items()}


TOPIC_MOST = 0.6  # a word in more than this share of a chunk's minutes is how they talk, not what about
# Words that carry the talk, not its subject: never a key topic (they stay in sentence scoring).
CHATTER_WORDS = frozenset(
    {
        "said", "says", "told", "asked", "really", "great", "wow", "yeah", "yes", "okay", "thanks", "thank",
        "awesome", "cool", "nice", "good", "glad", "sure", "lot", "lots", "pretty", "totally", "definitely",
        "amazing", "love", "hey", "hi", "hello",
    }
)  # fmt: skip


def common_words(documents: Sequence[Sequence[str]], participants: Sequence[str] = ()) -> frozenset[str]:
    """Words no topic is made of: those in most of the chunk's minutes (more than `TOPIC_MOST` of a chunk of four or
    more: "said", the speakers), the participants' names, and `CHATTER_WORDS`."""
    df: Counter[str] = Counter(w for doc in documents for w in set(doc))
    most = TOPIC_MOST * len(documents)
    everywhere = {w for w, n in df.items() if n > most} if len(documents) >= 4 else set()
    names = {part for p in participants for part in words(p.replace("-", " ").replace("_", " ").replace(".", " "))}
    return frozenset(everywhere | names | CHATTER_WORDS)


def key_topics(
    weights: dict[str, float], k: int = defaults.SUMMARY_TOPICS, common: Collection[str] = frozenset()
) -> tuple[str, ...]:
    """The `k` heaviest words that are not `common` (`common_words`), ties broken alphabetically (deterministic)."""
    ranked = sorted(((w, v) for w, v in weights.items() if w not in common), key=lambda kv: (-kv[1], kv[0]))
    return tuple(w[:MAX_TOPIC_CHARS] for w, _ in ranked[: min(k, MAX_TOPICS)])


def balanced(sentence: str) -> str:
    """`sentence` with its quotes closed: split out of a quoted turn ('Caroline said, "Hey Mel! Good to see you!"'),
    a first sentence keeps an open quote and a later one a stray closing one. The open quote is closed; a stray
    closing one is dropped, or opened where the turn goes on after it, so a sentence set beside others in a
    summary reads whole."""
    if sentence.count("\u201c") > sentence.count("\u201d"):
        return sentence + "\u201d"
    if sentence.count("\u201d") > sentence.count("\u201c"):
        at = sentence.rfind("\u201d")
        return sentence[:at] + sentence[at + 1 :]
    if sentence.count('"') % 2 == 0:
        return sentence
    at = sentence.find('"')
    if at == 0 or sentence[at - 1].isspace():  # it opens a quote: close it
        return sentence + '"'
    if sentence[at + 1 :].strip():  # it closes a quote and the turn goes on ('ours." and shared a photo'): open it
        return '"' + sentence
    return sentence[:at]  # it closes a quote and nothing follows: drop it


STATEMENT_WEIGHT = 2.0  # what a speaker says of themselves that lasts (`workers.rules.statements`)


def _said_weight(sentence: str) -> float:
    """How much a sentence of reported speech ("Dana said, "…"") is worth to a summary beside its words: what the
    speaker says of themselves that lasts counts double; a question, or talk to the listener (thanks,
    encouragement, "sounds great") is no part of what happened (0)."""
    if sentence.rstrip("\"'\u201d)").endswith("?"):
        return 0.0
    if is_statement(sentence):
        return STATEMENT_WEIGHT
    return 0.0 if to_the_listener(sentence) else 1.0


@dataclass(frozen=True, slots=True)
class _Sentence:
    """A sentence a summary may keep: its place in the chunk, its text as kept, its distinct key words (sorted) and
    what each of them is worth in it (its event's weight and `_said_weight`, over the root of its length)."""

    order: int
    text: str
    words: tuple[str, ...]
    weight: float

    def adds(self, weights: dict[str, float], covered: set[str]) -> float:
        """What the sentence adds to a summary whose sentences say the key words `covered`: its words' weights that
        are not said yet."""
        return math.fsum(weights[w] for w in self.words if w not in covered) * self.weight


def _clip(sentence: str, most_words: int) -> str:
    parts = sentence.split()
    return sentence if len(parts) <= most_words else " ".join(parts[:most_words]) + " …"


# -- extractive ------------------------------------------------------------------------------------------------


@dataclass
class ExtractiveSummarizer:
    """Sentence ranking over the chunk's notes and reasoning, key topics by TF-IDF (see the module docstring)."""

    ratio: float = defaults.SUMMARY_RATIO
    min_tokens: int = defaults.SUMMARY_MIN_TOKENS
    sentence_words: int = defaults.SUMMARY_SENTENCE_WORDS
    topics: int = defaults.SUMMARY_TOPICS

    def summarize(self, project_id: str, thread: ThreadRef, minutes: Sequence[Logged]) -> ChunkText:
        sentences: list[tuple[int, str, str, list[str]]] = []  # (minute position, event type, sentence, its words)
        documents: list[list[str]] = []
        worth: dict[int, float] = {}  # sentence order -> its weight beside its words' (`_said_weight`)
        speakers: dict[int, str] = {}  # sentence order -> who said it, for reported speech
        for position, logged in enumerate(minutes):
            doc: list[str] = []
            for text in minute_texts(logged.minute):
                who, said = reported(text)
                for sentence in SENTENCE_BREAK.split(said):
                    sentence = sentence.strip()
                    if who is not None:  # the quotes around what was said go with "said, "
                        sentence = sentence.strip('"\u201c\u201d').strip()
                    if sentence:
                        found = words(sentence)
                        doc += found
                        if who is not None:  # reported speech: "Dana moved to Lisbon.", "Dana: The lake froze."
                            worth[len(sentences)] = _said_weight(sentence)
                            speakers[len(sentences)] = who
                            sentence = in_third_person(who, sentence) or f"{who}: {sentence}"
                        sentences.append((position, logged.minute.event_type, sentence, found))
            documents.append(doc)
        weights = keyword_weights(documents)
        tokens = chunk_tokens(minutes)
        room = max(self.min_tokens, math.floor(tokens * self.ratio))
        decisions: list[_Sentence] = []
        rest: list[_Sentence] = []
        seen: set[str] = set()
        for order, (position, event_type, sentence, found) in enumerate(sentences):
            key = sentence_key(sentence)
            if key in seen or worth.get(order) == 0.0:  # agents repeat one another: a sentence once
                continue
            seen.add(key)
            first_of_decision = event_type == "decision" and (order == 0 or sentences[order - 1][0] != position)
            text = as_sentence(balanced(_clip(sentence, self.sentence_words)))
            # Sorted: `_adds` sums in one order whatever order the set yields (the hash seed's).
            weight = EVENT_WEIGHTS.get(event_type, 1.0) * worth.get(order, 1.0) / math.sqrt(1 + len(found))
            (decisions if first_of_decision else rest).append(_Sentence(order, text, tuple(sorted(set(found))), weight))
        kept: list[tuple[int, str]] = []
        covered: set[str] = set()  # key words the kept sentences say
        used = 0
        for decision in decisions:  # every decision, whatever it costs
            kept.append((decision.order, decision.text))
            used += estimate_tokens(decision.text) + 1
            covered.update(decision.words)
        # The sentence that adds the most to what is kept (ties: the earliest), a key word said already counting
        # nothing. What a sentence adds only falls as more is said, so a heap of what each added when last looked
        # at is read lazily: the top is taken when it still adds that much, else it goes back with what it adds now.
        heap = [(-c.adds(weights, covered), c.order, c) for c in rest]
        heapq.heapify(heap)
        while heap:
            bound, _, best = heapq.heappop(heap)
            adds = best.adds(weights, covered)
            if adds < -bound:
                heapq.heappush(heap, (-adds, best.order, best))
                continue
            if kept and adds == 0.0:
                break  # every sentence left says what is said already
            cost = estimate_tokens(best.text) + 1
            if used + cost <= room:
                kept.append((best.order, best.text))
                used += cost
                covered.update(best.words)
        pieces: list[str] = []
        previous = (-1, "")
        for order, text in sorted(kept):
            position, speaker = sentences[order][0], speakers.get(order, "")
            if speaker and previous == (position, speaker) and text.startswith(f"{speaker}: "):
                text = text[len(speaker) + 2 :]  # the same turn goes on: its speaker named once
            pieces.append(text)
            previous = (position, speaker)
        summary = " ".join(pieces)[:MAX_SUMMARY_CHARS]
        if not summary:
            kinds = Counter(m.minute.event_type for m in minutes)
            summary = f"{len(minutes)} minutes: " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        return ChunkText(
            summary=summary,
            key_topics=key_topics(weights, self.topics, common_words(documents, participants(minutes))),
            outcome=outcome_of(minutes),
            summarizer=EXTRACTIVE,
            participants=participants(minutes),
            tokens=tokens,
        )


# -- LLM -------------------------------------------------------------------------------------------------------

SYSTEM_PROMPT = """\
You summarize a stretch of coordination minutes that AI agents wrote while working together, so that an agent \
joining the thread later knows what happened. Write a short summary (two to four sentences, far shorter than the \
minutes) that names every decision made, every problem and how it ended; list the key topics (a few words each); \
say the outcome in a short phrase, or null when nothing ended. Use only what the minutes say."""

SUMMARY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "summary": {"type": "string", "minLength": 1, "maxLength": MAX_SUMMARY_CHARS},
        "key_topics": {
            "type": "array",
            "items": {"type": "string", "minLength": 1, "maxLength": MAX_TOPIC_CHARS},
            "maxItems": MAX_TOPICS,
        },
        "outcome": {"type": ["string", "null"], "maxLength": MAX_OUTCOME_CHARS},
    },
    "required": ["summary", "key_topics", "outcome"],
    "additionalProperties": False,
}

CHUNK_OUTCOMES = ("answered", "rejected", "unavailable", "error")


@dataclass
class LLMSummarizer:
    """A chat model's summary of each chunk (one call), the extractive summarizer's where the call fails."""

    llm: ChatModel
    fallback: ExtractiveSummarizer = field(default_factory=ExtractiveSummarizer)
    max_field_chars: int = defaults.SUMMARY_LLM_MAX_FIELD_CHARS
    counts: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def messages(self, project_id: str, thread: ThreadRef, minutes: Sequence[Logged]) -> list[dict[str, str]]:
        """The conversation asked for one chunk: the instructions, then its minutes in log order."""
        lines = [f"Project: {project_id}", f"Thread: {thread}", "", "Minutes, oldest first:"]
        for i, logged in enumerate(minutes, start=1):
            m = logged.minute
            head = f"M{i} {m.timestamp[:19]} {m.event_type}" + (f" by {m.agent_id}" if m.agent_id else "")
            task = m.data.get("task_id")
            if isinstance(task, str):
                head += f" task {task}"
            lines.append(head)
            lines += [f"  {text[: self.max_field_chars]}" for text in minute_texts(m)]
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(lines)}]

    def summarize(self, project_id: str, thread: ThreadRef, minutes: Sequence[Logged]) -> ChunkText:
        try:
            result = self.llm.complete_json(self.messages(project_id, thread, minutes), SUMMARY_SCHEMA, name=CALL_NAME)
        except LLMError as error:
            self._count(_outcome(error))
            level = logging.ERROR if isinstance(error, LLMConfigError) else logging.WARNING
            log.log(level, "LLM summary of a chunk of %s/%s fell back to extractive: %s", project_id, thread, error)
            return replace(self.fallback.summarize(project_id, thread, minutes), fell_back=True)
        self._count("answered")
        data = result.data
        topics = tuple(dict.fromkeys(t.strip() for t in data["key_topics"] if t.strip()))
        outcome = data["outcome"].strip() if isinstance(data["outcome"], str) and data["outcome"].strip() else None
        summary = data["summary"].strip()
        if not summary:
            self._count("rejected")
            return replace(self.fallback.summarize(project_id, thread, minutes), fell_back=True)
        return ChunkText(
            summary=summary,
            key_topics=topics,
            outcome=outcome,
            summarizer=f"llm:{result.model}"[: defaults.SUMMARY_MODEL_NAME_CHARS],
            participants=participants(minutes),
            tokens=chunk_tokens(minutes),
        )

    def _count(self, outcome: str) -> None:
        with self._lock:
            self.counts[outcome] += 1


def _outcome(error: LLMError) -> str:
    from pvm.llm import LLMAnswerRejected, LLMUnavailable

    if isinstance(error, LLMAnswerRejected):
        return "rejected"
    if isinstance(error, LLMUnavailable):
        return "unavailable"
    return "error"


def summarizer_from_settings(settings: Settings, metrics: MetricsRecorder | None = None) -> Summarizer:
    """The summarizer PVM_SUMMARIZER names: extractive, or the LLM's (PVM_LLM_MODEL must be set for it)."""
    extractive = ExtractiveSummarizer(ratio=settings.summary_ratio)
    if settings.summarizer != "llm":
        return extractive
    llm = llm_from_settings(settings, metrics)
    if llm is None:
        raise LLMConfigError(
            "PVM_SUMMARIZER=llm needs a chat model and PVM_LLM_MODEL is not set: set PVM_LLM_MODEL (and "
            "PVM_LLM_BASE_URL or OPENAI_BASE_URL), or PVM_SUMMARIZER=extractive"
        )
    return LLMSummarizer(llm, fallback=extractive)

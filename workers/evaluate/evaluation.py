"""How the evaluate pool judges memories: scores, fact decay, prune, near-duplicates and contradictions.

Pure functions of what one slice of a project's log (and Redis' read counts)
says about its minutes and facts: no I/O, so the rules are tested without
Redis and the same code serves a run and a dry run (`workers.evaluate.pool`).

Scores (each 0..1, the design's four):

- recency: 1 at the minute's timestamp, falling linearly to 0 over
  `SCORE_RECENCY_SPAN_S` (four weeks);
- relevance: how often agents were given it (the reader's access counts),
  1 at `SCORE_RELEVANCE_FULL` reads;
- accuracy: the minute's own ``success_criteria_met`` / 100, else its task's
  final outcome (a PAIR judge's score of the task counts: `task_outcome`),
  else the event type's prior (`workers.rules.assessment`); minus
  `SCORE_CORRECTION_PENALTY` for each later minute that corrects it;
- impact: the mean of min(1, later references / `SCORE_IMPACT_REFS_FULL`)
  and whether its task succeeded (1, 0, or 0.5 unknown). A correction is not
  an endorsement: it counts against accuracy, never as a reference, and a
  corrected memory takes no credit from its task's outcome;
- composite: their weighted mean (`PVM_SCORE_WEIGHTS`, equal by default).

A fact's worth is its importance times its decay: 0.5 ** (days since it was
last read, else since recorded / 30) plus min(0.1 x reads, 0.5), capped at 1.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from contracts import Minute
from contracts.minute import EventType
from contracts.pair import PairError, PairEvaluation
from pvm import defaults
from pvm.context_facts import words
from workers.rules.assessment import ACCURACY_BY_EVENT, DEFAULT_ACCURACY, outcome, stated_text, success_score
from workers.rules.fact_text import value_key

SCORE_PARTS = ("recency", "relevance", "accuracy", "impact")

# A later minute corrects an earlier one it references when it says so (``data.corrects`` names it) or is one of
# these event types; a later failure that references it counts as a correction too (`is_correction`).
CORRECTION_EVENTS = frozenset(("correction", "fact_retracted", "fact_contradicted"))

# Where a minute states the action it recommends, in order of preference; else its memory note.
ACTION_KEYS = ("recommendation", "recommended_action", "action", "resolution", "decision")
# Where it names the situation the action is for; minutes naming none are never judged contradicting.
SITUATION_KEYS = ("situation", "conflict_type", "problem", "task_kind")
# Words that turn an action into its opposite ("use X" / "do not use X", "avoid X").
NEGATORS = frozenset(("not", "never", "avoid", "don", "dont", "no", "stop", "without", "cannot", "shouldn", "mustn"))
# Two actions are the same action (before their polarity) when their other words overlap this much.
SAME_ACTION_AT = 0.7
# A note's prose for near-duplicate detection: the memory note and these data texts.
DEDUPE_TEXT_KEYS = ("assignment_reasoning", "resolution", "error", "reason", "decision", "recommendation")


@dataclass(frozen=True, slots=True)
class ScorePolicy:
    """The tunables of a run: composite weights, prune threshold and grace, dedupe threshold."""

    weights: tuple[float, float, float, float] = defaults.SCORE_WEIGHTS
    prune_below: float = defaults.PRUNE_BELOW
    prune_grace_s: float = defaults.PRUNE_GRACE_S
    dedupe_at: float = defaults.DEDUPE_AT
    fact_dedupe_at: float = defaults.FACT_DEDUPE_AT


# -- minute scores -----------------------------------------------------------------------------------------------


def recency(at_ms: int, now_ms: int, span_s: float = defaults.SCORE_RECENCY_SPAN_S) -> float:
    """1 at `at_ms`, 0 once `span_s` has passed, linear between (a future timestamp counts as now)."""
    age_s = max(0.0, (now_ms - at_ms) / 1000.0)
    return max(0.0, 1.0 - age_s / span_s)


def relevance(accesses: int) -> float:
    """How often agents were given the memory: reads / `SCORE_RELEVANCE_FULL`, at most 1."""
    return min(1.0, max(0, accesses) / defaults.SCORE_RELEVANCE_FULL)


def accuracy(own: float | None, task: float | None, event_type: str, corrections: int) -> float:
    """The outcome's success (own ``success_criteria_met``, else the task's, 0..1, else the prior) less corrections."""
    if own is not None:
        base = own
    elif task is not None:
        base = task
    else:
        base = ACCURACY_BY_EVENT.get(event_type, DEFAULT_ACCURACY)
    return max(0.0, base - defaults.SCORE_CORRECTION_PENALTY * max(0, corrections))


def impact(later_references: int, task_succeeded: bool | None) -> float:
    """Mean of how often later minutes reference it (saturating) and whether its task succeeded."""
    referenced = min(1.0, max(0, later_references) / defaults.SCORE_IMPACT_REFS_FULL)
    success = 0.5 if task_succeeded is None else 1.0 if task_succeeded else 0.0
    return (referenced + success) / 2.0


def composite(parts: Mapping[str, float], weights: Sequence[float]) -> float:
    """The weighted mean of `SCORE_PARTS`."""
    total = sum(weights)
    return sum(w * parts[name] for name, w in zip(SCORE_PARTS, weights, strict=True)) / total if total else 0.0


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """A task's final outcome as its newest outcome minute states it: succeeded, and its success 0..1 if stated."""

    succeeded: bool
    success: float | None


def task_outcome(minute: Minute) -> TaskOutcome | None:
    """The outcome a minute reports for its task (`workers.rules.assessment.outcome`), None when it reports none.

    A ``pair_evaluation`` reports its score (0-100) as the task's success, and success as reaching its run's
    target: a PAIR judge checked the task's output against its criteria. One whose data is not a valid
    evaluation reports nothing.
    """
    if minute.event_type == EventType.PAIR_EVALUATION.value:
        try:
            judged = PairEvaluation.from_data(minute.data)
        except PairError:
            return None
        return TaskOutcome(judged.score >= judged.target, judged.score / 100.0)
    result = outcome(minute)
    if result is None:
        return None
    score = success_score(minute)
    return TaskOutcome(result, score / 100.0 if score is not None else (1.0 if result else 0.0))


def minute_scores(
    minute: Minute,
    at_ms: int,
    now_ms: int,
    *,
    accesses: int,
    later_references: int,
    corrections: int,
    task: TaskOutcome | None,
    weights: Sequence[float] = defaults.SCORE_WEIGHTS,
) -> dict[str, float]:
    """A minute's four scores and their composite, rounded to 4 places (what the payload and Redis hold)."""
    own = success_score(minute)
    if corrections:
        task = None  # a corrected memory was wrong: its task's success is not its own
    parts = {
        "recency": recency(at_ms, now_ms),
        "relevance": relevance(accesses),
        "accuracy": accuracy(
            own / 100.0 if own is not None else None, task.success if task else None, minute.event_type, corrections
        ),
        "impact": impact(later_references, task.succeeded if task else None),
    }
    parts["composite"] = composite(parts, weights)
    return {k: round(v, 4) for k, v in parts.items()}


def is_correction(later: Minute, of_id: str) -> bool:
    """Whether `later` (which references `of_id`) corrects it."""
    if stated_text(later.data.get("corrects")) == of_id:
        return True
    return later.event_type in CORRECTION_EVENTS or outcome(later) is False


def references(minute: Minute) -> Iterable[str]:
    """The ids a minute references: its context references and a ``data.corrects`` id."""
    seen = set(minute.context_references)
    yield from minute.context_references
    corrects = stated_text(minute.data.get("corrects"))
    if corrects and corrects not in seen:
        yield corrects


# -- facts -------------------------------------------------------------------------------------------------------


def fact_decay(last_ms: int, reads: int, now_ms: int) -> float:
    """0.5 ** (days since `last_ms` / 30-day half-life) + min(0.1 x reads, 0.5), capped at 1."""
    age_s = max(0.0, (now_ms - last_ms) / 1000.0)
    boost = min(defaults.FACT_ACCESS_BOOST * max(0, reads), defaults.FACT_ACCESS_BOOST_MAX)
    return min(1.0, math.pow(0.5, age_s / defaults.FACT_HALF_LIFE_S) + boost)


def fact_scores(importance: float, last_ms: int, reads: int, now_ms: int) -> dict[str, float]:
    """A fact's importance, decay and composite (importance x decay), rounded to 4 places."""
    decay = fact_decay(last_ms, reads, now_ms)
    return {"importance": round(importance, 4), "decay": round(decay, 4), "composite": round(importance * decay, 4)}


# -- prune -------------------------------------------------------------------------------------------------------


def prunable(composite_score: float, age_s: float, policy: ScorePolicy) -> bool:
    """Whether a memory leaves the vector store: its composite below the threshold, and older than the grace."""
    return composite_score < policy.prune_below and age_s > policy.prune_grace_s


# -- near-duplicates and contradictions ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Judged:
    """A minute as dedupe and conflict detection see it: its group, words, worth and outcome."""

    memory_id: str
    group: str  # its tier key and event type: only memories of one group are compared
    words: frozenset[str]
    composite: float
    at_ms: int
    accuracy: float
    situation: str | None = None  # tier key and situation, when the minute recommends an action for one
    action: frozenset[str] = frozenset()  # the action's words, negators left out
    negative: bool = False  # the action says not to


@dataclass(frozen=True, slots=True)
class Merge:
    """Near-duplicates folded into the best-scored memory of their group."""

    survivor: str
    absorbed: tuple[str, ...]
    similarity: float  # the lowest similarity of an absorbed memory to the survivor


@dataclass(frozen=True, slots=True)
class Conflict:
    """Two memories recommending opposite actions for one situation: the better outcome wins."""

    winner: str
    loser: str


def tier_key(minute: Minute) -> str:
    """The tier key a minute belongs to: its task, else its project."""
    task_id = stated_text(minute.data.get("task_id"))
    return f"task:{task_id}" if task_id else "project"


def note_words(minute: Minute) -> frozenset[str]:
    """The content words of what a minute says (its note and prose data), for near-duplicate detection."""
    texts = [minute.memory_note or ""]
    texts += [v for k in DEDUPE_TEXT_KEYS if isinstance(v := minute.data.get(k), str)]
    return words(*texts)


def recommended_action(minute: Minute) -> tuple[str, frozenset[str], bool] | None:
    """(situation, action words, says-not-to) when a minute recommends an action for a named situation."""
    situation = next((s for k in SITUATION_KEYS if (s := stated_text(minute.data.get(k)))), None)
    if situation is None:
        return None
    text = next((a for k in ACTION_KEYS if (a := stated_text(minute.data.get(k)))), None) or minute.memory_note
    if not text:
        return None
    said = words(text)
    action = said - NEGATORS
    if not action:
        return None
    return " ".join(sorted(words(situation))), action, bool(said & NEGATORS)


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def _better(a: Judged, b: Judged) -> bool:
    """Whether `a` ranks before `b` as the one to keep: higher composite, then newer, then id."""
    return (a.composite, a.at_ms, a.memory_id) > (b.composite, b.at_ms, b.memory_id)


def near_duplicates(items: Sequence[Judged], threshold: float) -> list[Merge]:
    """Groups of near-duplicates (Jaccard of words >= `threshold`, same group), each into its best-scored member.

    Candidates are found through each memory's rarest words (an inverted
    index), so a slice's work stays near-linear: two memories sharing none of
    their three rarest words share too little to be duplicates at any useful
    threshold. Greedy from the best: a memory absorbs every later one close
    enough to it, and an absorbed memory absorbs nothing.
    """
    by_group: dict[str, list[Judged]] = {}
    for item in items:
        if len(item.words) >= defaults.DEDUPE_MIN_WORDS:
            by_group.setdefault(item.group, []).append(item)
    merges: list[Merge] = []
    for members in by_group.values():
        if len(members) < 2:
            continue
        frequency: dict[str, int] = {}
        for m in members:
            for w in m.words:
                frequency[w] = frequency.get(w, 0) + 1
        postings: dict[str, list[int]] = {}
        rare: list[list[str]] = []
        for i, m in enumerate(members):
            chosen = sorted(m.words, key=lambda w: (frequency[w], w))[:3]
            rare.append(chosen)
            for w in chosen:
                postings.setdefault(w, []).append(i)
        order = sorted(
            range(len(members)), key=lambda i: (-members[i].composite, -members[i].at_ms, members[i].memory_id)
        )
        taken: set[int] = set()
        for i in order:
            if i in taken:
                continue
            survivor = members[i]
            absorbed: list[tuple[str, float]] = []
            candidates = {j for w in survivor.words if w in postings for j in postings[w]}
            for j in sorted(candidates):
                if j == i or j in taken or _better(members[j], survivor):
                    continue
                similarity = jaccard(survivor.words, members[j].words)
                if similarity >= threshold:
                    taken.add(j)
                    absorbed.append((members[j].memory_id, similarity))
            if absorbed:
                taken.add(i)
                merges.append(
                    Merge(
                        survivor.memory_id, tuple(sorted(a for a, _ in absorbed)), round(min(s for _, s in absorbed), 4)
                    )
                )
    return merges


# -- fact near-duplicates ------------------------------------------------------------------------------------------

# Units as fact dedupe compares them (after `words`' stemming): "512 MB" and "512 megabytes" are one value.
UNIT_WORDS = {
    "ms": "millisecond",
    "msec": "millisecond",
    "s": "second",
    "sec": "second",
    "secs": "second",
    "min": "minute",
    "mins": "minute",
    "h": "hour",
    "hr": "hour",
    "hrs": "hour",
    "d": "day",
    "days": "day",
    "kb": "kilobyte",
    "mb": "megabyte",
    "gb": "gigabyte",
    "tb": "terabyte",
    "pct": "percent",
}
_NUMBER_UNIT = re.compile(r"(\d+(?:\.\d+)?)([a-z]+)")


@dataclass(frozen=True, slots=True)
class FactTwin:
    """A current fact as fact dedupe sees it: its group, slot subject, value and their words, and its worth."""

    memory_id: str
    group: str  # tier key, type and attribute: only facts of one group are compared
    subject: str
    value: str  # `value_key` of its value
    subject_words: frozenset[str]
    value_words: frozenset[str]
    composite: float  # importance x decay
    at_ms: int


def fact_words(text: str) -> frozenset[str]:
    """A value's (or subject's) words as dedupe compares them: `value_key`, content words, one spelling per unit."""
    out: set[str] = set()
    for word in words(value_key(text)):
        split = _NUMBER_UNIT.fullmatch(word)
        for part in (split.group(1), split.group(2)) if split else (word,):
            out.add(UNIT_WORDS.get(part, part))
    return frozenset(out)


def fact_similarity(a: FactTwin, b: FactTwin) -> float:
    """How near two facts are to one statement: 0 unless one group and either one slot or one value.

    One slot: the Jaccard of their values' words; one value: of their
    subjects' words. Only when one side's words hold the other's: a word on
    each side that the other lacks ("Postgres 15" / "Postgres 16", "three
    times" / "five times") is two different values, whatever the overlap.
    """
    if a.group != b.group:
        return 0.0
    if a.subject == b.subject:
        x, y = a.value_words, b.value_words
    elif a.value == b.value:
        x, y = a.subject_words, b.subject_words
    else:
        return 0.0
    if not x or not y or not (x <= y or y <= x):
        return 0.0
    return jaccard(x, y)


def fact_near_duplicates(items: Sequence[FactTwin], threshold: float) -> list[Merge]:
    """Near-duplicate facts (`fact_similarity` >= `threshold`), each group into its best-scored member.

    Candidates share the group and the slot subject or the value (two hash
    lookups); greedy from the best, as `near_duplicates`.
    """
    by_subject: dict[tuple[str, str], list[int]] = {}
    by_value: dict[tuple[str, str], list[int]] = {}
    for i, item in enumerate(items):
        by_subject.setdefault((item.group, item.subject), []).append(i)
        by_value.setdefault((item.group, item.value), []).append(i)
    order = sorted(range(len(items)), key=lambda i: (-items[i].composite, -items[i].at_ms, items[i].memory_id))
    taken: set[int] = set()
    merges: list[Merge] = []
    for i in order:
        if i in taken:
            continue
        survivor = items[i]
        candidates = {*by_subject[(survivor.group, survivor.subject)], *by_value[(survivor.group, survivor.value)]}
        absorbed: list[tuple[str, float]] = []
        for j in sorted(candidates):
            if j == i or j in taken or _fact_better(items[j], survivor):
                continue
            similarity = fact_similarity(survivor, items[j])
            if similarity and similarity >= threshold:  # 0: never near, whatever the threshold
                taken.add(j)
                absorbed.append((items[j].memory_id, similarity))
        if absorbed:
            taken.add(i)
            merges.append(
                Merge(survivor.memory_id, tuple(sorted(a for a, _ in absorbed)), round(min(s for _, s in absorbed), 4))
            )
    return merges


def _fact_better(a: FactTwin, b: FactTwin) -> bool:
    return (a.composite, a.at_ms, a.memory_id) > (b.composite, b.at_ms, b.memory_id)


# -- near-duplicates across the pages of a run ---------------------------------------------------------------------
#
# A run judges a tier key's memories a page at a time; a near-duplicate on another page is found through the run's
# candidate index (`workers.evaluate.candidate_index`): every kept memory of the pages judged so far, filed under a few
# bucket names, so a page looks up only its own memories' buckets. Buckets are exact for the rules above:
#
# - minutes: the prefix filter of set-similarity joins. Order all words by a fixed hash (crc32: the same order in
#   every process and run); two word sets with Jaccard >= t share a word among the first |x| - ceil(t |x|) + 1
#   words of each (|x ∩ y| >= t max(|x|, |y|)), so a memory files itself under those words of its group and finds
#   every twin at the threshold;
# - facts: one group and one slot subject or one value, two exact buckets.


_ORDER: dict[str, tuple[int, str]] = {}  # word -> its place in the order (crc32, then the word: a total order)


def prefix_words(words: frozenset[str], threshold: float) -> list[str]:
    """The words a memory is filed and looked up under: its first |w| - ceil(t |w|) + 1 in crc32 order."""
    if not words:
        return []
    if len(_ORDER) >= defaults.DEDUPE_ORDER_CACHE:
        _ORDER.clear()
    for word in words:
        if word not in _ORDER:
            _ORDER[word] = (zlib.crc32(word.encode()), word)
    keep = len(words) - math.ceil(threshold * len(words) - 1e-9) + 1
    return sorted(words, key=_ORDER.__getitem__)[: max(1, keep)]


def minute_buckets(item: Judged, threshold: float) -> list[str]:
    """Where a minute's near-duplicates of other pages are filed: its group and each of its prefix words."""
    if len(item.words) < defaults.DEDUPE_MIN_WORDS:
        return []
    group = f"m|{item.group}|"
    return [group + word for word in prefix_words(item.words, threshold)]


def fact_buckets(item: FactTwin) -> list[str]:
    """Where a fact's near-duplicates of other pages are filed: its group with its slot subject, and with its value."""
    return [f"s|{item.group}|{item.subject}", f"v|{item.group}|{item.value}"]


def minute_similarity(a: Judged, b: Judged) -> float:
    """`near_duplicates`' rule for two minutes: the Jaccard of their words, 0 across groups or for short notes."""
    x, y = a.words, b.words
    if a.group != b.group or len(x) < defaults.DEDUPE_MIN_WORDS or len(y) < defaults.DEDUPE_MIN_WORDS:
        return 0.0
    shared = len(x & y)
    return shared / (len(x) + len(y) - shared)


Item = TypeVar("Item", Judged, FactTwin)


def merge_across(
    heads: Sequence[Item],
    earlier: Mapping[str, Item],
    candidates: Mapping[str, Iterable[str]],
    similarity: Callable[[Item, Item], float],
    threshold: float,
) -> list[Merge]:
    """Merges of this page's `heads` (what in-page dedupe kept) with the kept memories of earlier pages.

    `candidates`: head id -> ids of `earlier` filed under its buckets. Greedy from the best head: a head and
    its twins of earlier pages (similarity >= `threshold`) merge into the best of them (composite, then newer,
    then id), as in one page; an earlier memory absorbed here is absorbed once. A merge's survivor or absorbed
    ids may be of earlier pages; the caller writes those from the index's records.
    """
    order = sorted((h for h in heads if h.memory_id in candidates), key=lambda h: (-h.composite, -h.at_ms, h.memory_id))
    taken: set[str] = set()
    into: dict[str, list[tuple[str, float]]] = {}
    for head in order:
        twins: list[tuple[Item, float]] = []
        for other_id in candidates[head.memory_id]:
            other = earlier.get(other_id)
            if other is None or other_id in taken or other_id == head.memory_id:
                continue
            score = similarity(head, other)
            if score >= threshold and score:
                twins.append((other, score))
        if not twins:
            continue
        group: list[Item] = [head]
        group += [t for t, _ in twins]
        best = max(group, key=lambda x: (x.composite, x.at_ms, x.memory_id))
        if best is head:
            for other, score in twins:
                taken.add(other.memory_id)
                into.setdefault(head.memory_id, []).append((other.memory_id, score))
        else:
            taken.add(head.memory_id)
            into.setdefault(best.memory_id, []).append((head.memory_id, similarity(head, best)))
    return [
        Merge(survivor, tuple(sorted(a for a, _ in absorbed)), round(min(s for _, s in absorbed), 4))
        for survivor, absorbed in sorted(into.items())
    ]


def contradictions(items: Sequence[Judged]) -> list[Conflict]:
    """Pairs recommending opposite actions for one situation; the better outcome (accuracy, then newer) wins."""
    by_situation: dict[str, list[Judged]] = {}
    for item in items:
        if item.situation is not None and item.action:
            by_situation.setdefault(item.situation, []).append(item)
    out: list[Conflict] = []
    lost: set[str] = set()
    for members in by_situation.values():
        positive = [m for m in members if not m.negative]
        negative = [m for m in members if m.negative]
        for p in positive:
            for n in negative:
                if p.memory_id in lost or n.memory_id in lost:
                    continue
                if jaccard(p.action, n.action) < SAME_ACTION_AT:
                    continue
                winner, loser = (p, n) if (p.accuracy, p.at_ms) >= (n.accuracy, n.at_ms) else (n, p)
                lost.add(loser.memory_id)
                out.append(Conflict(winner.memory_id, loser.memory_id))
    return out


@dataclass
class SliceVerdict:
    """What evaluating one slice decided: scores, prunes, merges and conflicts, by memory id."""

    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    pruned: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> why, composite, tokens, kind
    merges: list[Merge] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    fact_scores: dict[str, dict[str, float]] = field(default_factory=dict)
    # Memories of earlier pages that this page's merges changed (absorbed, or a survivor gaining duplicates): id ->
    # their record in the run's candidate index (scores, tokens, what they absorbed before...), for the writer.
    elsewhere: dict[str, dict[str, Any]] = field(default_factory=dict)
    # What this page keeps, to file in the run's candidate index: (id, buckets, record).
    filed: list[tuple[str, list[str], dict[str, Any]]] = field(default_factory=list)


def mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return math.fsum(values) / len(values) if values else None

"""The facts and rules of an agent's context: what holds now in the tiers it may read, fitted to a share of its budget.

`ContextReader.build_context` reads the current view of the facts store
(`pvm.stores.facts`) for the context's tier keys — its task's, its project's,
and the global tier's only when the caller is granted it — and makes two
sections of it:

- **facts** ("What we know"): facts promoted and holding now, procedures
  aside. Constraints and goals come first (always kept while the section has
  room), then the rest split across tiers task / project / global by weight
  (`PVM_FACT_TIER_SPLIT`, 40 / 40 / 20), each tier's facts most relevant to the
  task first. A tier not read, or needing less than its share, leaves it to the
  others (`split_by_tier`).
- **rules**: procedure facts (condition → action, with a priority) whose
  condition matches the task text or one of its tags, highest priority first.

Relevance is local and lexical: the share of the task's words a fact's words
cover (`relevance`). It costs a set intersection per fact; the words, prompt
line and times of each record are worked out once and kept by the record's
bytes (`FactMemo`), so a context pays a record's validation only the first time
it sees that version of it.

The store keeps every version of every fact; a context needs only what holds
now. The read script (`CURRENT_READ`) sends back only records whose status is
promoted (a byte marker test inside Redis), so history stays on the server; the
exact test (`KnownFact.holds_at`, the store's `known_at` for promoted facts)
runs here.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import msgpack

from contracts import keys
from contracts.facts import Fact, FactStatus, FactType, RelationKind, Tier, TierKey
from contracts.memory import fact_line, questioned, rule_line
from pvm import defaults
from pvm.stores.fact_projection import instant
from pvm.stores.facts import StoredFact

TIERS = (Tier.TASK, Tier.PROJECT, Tier.GLOBAL)

# Kept ahead of the tier split, while the facts section has room: what must not be done, and what we aim for.
ALWAYS_KEPT = frozenset({FactType.CONSTRAINT, FactType.GOAL})

# Bytes every stored record of a promoted fact holds (`StoredFact.pack` writes the fact's fields as a map, each key
# before its value), so Redis can leave out superseded, retracted and pending records without decoding them.
PROMOTED_MARKER = msgpack.packb("status") + msgpack.packb(FactStatus.PROMOTED.value)

# KEYS[1]: a records hash (facts_by_id); KEYS[2..]: sorted sets of fact ids (facts_in_tier).
# ARGV[1]: bytes a wanted record holds ('' for every record). Returns the records of the ids in the sets that hold
# them, each once. HMGET is chunked: Lua's unpack() takes a few thousand values at most.
CURRENT_READ = """
local seen, ids = {}, {}
for i = 2, #KEYS do
  for _, id in ipairs(redis.call('ZRANGE', KEYS[i], 0, -1)) do
    if not seen[id] then seen[id] = true; ids[#ids + 1] = id end
  end
end
local marker, out = ARGV[1], {}
for start = 1, #ids, 1000 do
  local records = redis.call('HMGET', KEYS[1], unpack(ids, start, math.min(start + 999, #ids)))
  for _, record in ipairs(records) do
    if record and (marker == '' or string.find(record, marker, 1, true)) then out[#out + 1] = record end
  end
end
return out
"""


def read_keys(tier_keys: Sequence[TierKey]) -> list[list[str]]:
    """The KEYS of `CURRENT_READ` calls that read `tier_keys`: one call per records hash (per project, and global)."""
    calls: dict[str, list[str]] = {}
    for tier in tier_keys:
        calls.setdefault(keys.facts_by_id(tier), [keys.facts_by_id(tier)]).append(keys.facts_in_tier(tier))
    return list(calls.values())


# -- words ---------------------------------------------------------------------------------------------------------

_WORD = re.compile(r"[^\W_]+")
_STOPWORD_TEXT = (
    "a an and are as at be by do does for from has have how i in is it its of on or our so that the their "
    "them then there these this to was we were what when where which who why will with you your"
)
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def _stem(word: str) -> str:
    """A crude stem, enough to meet "fails" with "failed" and "deploys" with "deploying"."""
    if len(word) > 4:
        for suffix, repl in (("ies", "y"), ("ing", ""), ("ed", ""), ("s", "")):
            if word.endswith(suffix) and len(word) - len(suffix) >= 3:
                return word[: len(word) - len(suffix)] + repl
    return word


_STEMS: dict[str, str] = {}  # word -> its stem ("" for a stopword): most words of a fleet's notes recur
_STEMS_SIZE = 65_536  # past this many words the memo starts over


def words(*texts: str) -> frozenset[str]:
    """The content words of `texts`, lowercased and stemmed, stopwords left out."""
    out: set[str] = set()
    stems = _STEMS
    for text in texts:
        for word in _WORD.findall(text.casefold()):
            stem = stems.get(word)
            if stem is None:
                if len(stems) >= _STEMS_SIZE:
                    stems.clear()
                stem = stems[word] = "" if word in _STOPWORDS else _stem(word)
            if stem:
                out.add(stem)
    return frozenset(out)


def relevance(task: frozenset[str], fact: frozenset[str]) -> float:
    """The share of the task's words the fact's words cover (0 with no task words)."""
    return len(task & fact) / len(task) if task else 0.0


def rule_matches(
    condition: frozenset[str], rule_tags: frozenset[str], task: frozenset[str], tags: frozenset[str]
) -> bool:
    """Whether a rule applies to a task: the task holds `RULE_MATCH_AT` of its condition's words, or a tag meets it.

    A task tag meets a rule when it is one of the rule's tags or a word of its condition.
    """
    if tags and (tags & rule_tags or tags & condition):
        return True
    return bool(condition) and len(condition & task) / len(condition) >= defaults.RULE_MATCH_AT


# -- records -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KnownFact:
    """A stored fact as a context uses it: the fact, its words, its prompt line and cost, its times (Unix s)."""

    fact: Fact
    record: dict[str, Any]  # fact.to_dict(), as the package carries it
    words: frozenset[str]
    tags: frozenset[str]
    condition: frozenset[str]  # a procedure's condition (its subject), in words
    line: str
    cost: int  # tokens of `line` in the budget
    recorded_at: float
    valid_from: float
    valid_until: float | None
    promoted_at: float | None
    questions: str | None = None  # the fact this statement questions (`RelationKind.QUESTIONS`), if any

    @classmethod
    def of(cls, stored: StoredFact, record: dict[str, Any], line: str, cost: int) -> KnownFact:
        fact = stored.fact
        questions = next((r.fact_id for r in fact.relationships if r.kind is RelationKind.QUESTIONS), None)
        return cls(
            fact=fact,
            record=record,
            words=words(fact.text, fact.subject, fact.attribute, fact.value, *fact.tags),
            tags=words(*fact.tags),
            condition=words(fact.subject) if fact.type is FactType.PROCEDURE else frozenset(),
            line=line,
            cost=cost,
            recorded_at=_seconds(fact.recorded_at),
            valid_from=_seconds(fact.valid_from),
            valid_until=None if fact.valid_until is None else _seconds(fact.valid_until),
            promoted_at=None if stored.promoted_at is None else _seconds(stored.promoted_at),
            questions=questions,
        )

    def holds_at(self, when: float) -> bool:
        """Whether it is current knowledge at `when`: promoted (by then), recorded by then, and holding then.

        `StoredFact.known_at(when, ("promoted",))` for a fact whose status is promoted, on precomputed times.
        """
        if self.fact.status is not FactStatus.PROMOTED or self.promoted_at is None or self.promoted_at > when:
            return False
        if self.recorded_at > when or self.valid_from > when:
            return False
        return self.valid_until is None or when < self.valid_until


def _seconds(timestamp: str | datetime) -> float:
    return instant(timestamp).timestamp()


class FactMemo:
    """Parsed records by their stored bytes: a record changes only by being written anew, so bytes name a version.

    `cost` is the budget's price of a prompt line. Thread-safe (one reader serves many threads). Past `size`
    entries it starts over: a cache, not a store.
    """

    def __init__(self, cost: Callable[[str], int], size: int = defaults.CONTEXT_FACT_MEMO) -> None:
        self.cost = cost
        self.size = size
        self._known: dict[bytes, KnownFact] = {}
        self._lock = threading.Lock()

    def known(self, raw: bytes) -> KnownFact:
        found = self._known.get(raw)
        if found is not None:
            return found
        stored = StoredFact.unpack(raw)
        record = stored.fact.to_dict()
        line = rule_line(record) if stored.fact.type is FactType.PROCEDURE else fact_line(record)
        known = KnownFact.of(stored, record, line, self.cost(line))
        with self._lock:
            if len(self._known) >= self.size:
                self._known.clear()
            self._known[raw] = known
        return known


def questioned_beside(facts: Sequence[KnownFact], cost: Callable[[str], int]) -> list[KnownFact]:
    """`facts` with each statement that questions another of them (`workers.rules.questioning`: a newer minute
    said the slot changed, in words no rule read a value from) shown beside that fact, not on its own line: the
    fact's record carries the newest such statement (`contracts.memory.questioned`) and its line ends with it and
    its day, so the older value never reads as settled.
    A statement whose fact is not among `facts` (superseded since, or not current) stays a line of its own."""
    ids = {k.fact.id for k in facts}
    newest: dict[str, KnownFact] = {}
    for k in facts:
        if k.questions in ids and (k.questions not in newest or k.valid_from > newest[k.questions].valid_from):
            newest[k.questions] = k
    if not newest:
        return list(facts)
    out = []
    for k in facts:
        if k.questions in ids:
            continue  # shown beside the fact it questions
        statement = newest.get(k.fact.id)
        if statement is not None:
            record = questioned(k.record, statement.record)
            line = fact_line(record)
            k = replace(k, record=record, line=line, cost=cost(line), words=k.words | statement.words)
        out.append(k)
    return out


# -- choosing ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Chosen:
    """What the facts section keeps: facts in tier order, and per tier the tokens used and the facts left out."""

    facts: list[KnownFact]
    tokens: dict[str, int]
    cut: dict[str, int]

    @property
    def used(self) -> int:
        return sum(self.tokens.values())


def by_tier(facts: Iterable[KnownFact], tier_keys: Sequence[TierKey]) -> dict[Tier, list[KnownFact]]:
    """`facts` grouped by the tier of `tier_keys` they are in (every tier read, even empty); others left out."""
    wanted = {key: key.tier for key in tier_keys}
    out: dict[Tier, list[KnownFact]] = {key.tier: [] for key in tier_keys}
    for known in facts:
        tier = wanted.get(known.fact.tier_key)
        if tier is not None:
            out[tier].append(known)
    return out


def choose_facts(
    tiers: Mapping[Tier, Sequence[KnownFact]],
    task: frozenset[str],
    allowance: int,
    split: Sequence[float] = defaults.FACT_TIER_SPLIT,
) -> Chosen:
    """The facts that fit `allowance` tokens: constraints and goals first, then the rest split across tiers.

    Constraints and goals go first, tier by tier (task, project, global), in
    the same order as the rest, while they fit. The tokens left split across the tiers
    by `split` (task, project, global weights) among the tiers that still have
    facts: each takes its facts most relevant to the task first (then most
    important, then newest) while they fit its share; what a tier leaves goes
    to the others, by weight, until nothing more fits. A tier of weight 0
    takes only what the others leave once they have every fact. Within a tier
    a fact that does not fit stops the tier (its less relevant facts never
    jump it).
    """
    weights = dict(zip(TIERS, split, strict=True))
    first: list[tuple[Tier, KnownFact]] = []
    queues: dict[Tier, list[KnownFact]] = {}
    for tier in TIERS:
        facts = tiers.get(tier, ())
        kept = sorted((k for k in facts if k.fact.type in ALWAYS_KEPT), key=lambda k: _order(k, task))
        first.extend((tier, k) for k in kept)
        queues[tier] = sorted((k for k in facts if k.fact.type not in ALWAYS_KEPT), key=lambda k: _order(k, task))
    taken: dict[Tier, list[KnownFact]] = {tier: [] for tier in TIERS}
    used = dict.fromkeys(TIERS, 0)
    cut = dict.fromkeys(TIERS, 0)
    left = allowance
    for i, (tier, known) in enumerate(first):
        if known.cost > left:
            for later_tier, _ in first[i:]:
                cut[later_tier] += 1
            break
        taken[tier].append(known)
        used[tier] += known.cost
        left -= known.cost
    position = dict.fromkeys(TIERS, 0)
    spent = dict.fromkeys(TIERS, 0)

    def take(tier: Tier, limit: float) -> bool:
        queue, moved = queues[tier], False
        while position[tier] < len(queue) and spent[tier] + queue[position[tier]].cost <= limit:
            spent[tier] += queue[position[tier]].cost
            position[tier] += 1
            moved = True
        return moved

    while True:
        hungry = [t for t in TIERS if position[t] < len(queues[t])]
        remaining = left - sum(spent.values())
        if not hungry or remaining <= 0:
            break
        # A tier of weight 0 takes only what the weighted tiers leave once they have every fact.
        eligible = [t for t in hungry if weights[t] > 0] or hungry
        total = sum(weights[t] for t in eligible)
        moved = False
        for tier in eligible:
            share = remaining * weights[tier] / total if total else remaining / len(eligible)
            moved |= take(tier, spent[tier] + share)
        if not moved:  # no tier's next fact fits its share of what is left: the first one it fits, whole
            for tier in sorted(eligible, key=lambda t: -weights[t]):
                if take(tier, spent[tier] + left - sum(spent.values())):
                    moved = True
                    break
        if not moved:
            break
    for tier in TIERS:
        taken[tier].extend(queues[tier][: position[tier]])
        used[tier] += spent[tier]
        cut[tier] += len(queues[tier]) - position[tier]
    present = [t for t in TIERS if t in tiers]
    return Chosen(
        facts=[k for tier in TIERS for k in taken[tier]],
        tokens={t.value: used[t] for t in present},
        cut={t.value: cut[t] for t in present if cut[t]},
    )


def _order(known: KnownFact, task: frozenset[str]) -> tuple[float, float, float, str]:
    """Most relevant to the task first, then most important, then newest; the id breaks ties."""
    return (-relevance(task, known.words), -known.fact.importance, -known.valid_from, known.fact.id)


def choose_rules(procedures: Iterable[KnownFact], task: frozenset[str], tags: frozenset[str]) -> list[KnownFact]:
    """The procedures whose condition matches the task, highest priority (importance) first, task tier first on ties."""
    rank = {tier: i for i, tier in enumerate(TIERS)}
    matched = [k for k in procedures if rule_matches(k.condition, k.tags, task, tags)]
    return sorted(matched, key=lambda k: (-k.fact.importance, -k.fact.confidence, rank[k.fact.tier], k.fact.id))

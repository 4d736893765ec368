"""The prose split of bench/facts.py: hand-worded coordination minutes through the facts pool, scored on its gold.

The set is ``../shared/data/prose_facts/prose_facts.json`` beside this checkout
(its README gives the format and the labelling rules): 150 minutes written by
hand in several voices across three projects, 139 gold facts with their
validity, and 86 questions about what held when. It is a development set:
read it, step through failures, and pair every figure with the generated
splits and with the held-out set run against main. Where it is absent the
split is skipped with a note.

The minutes go through `workers.facts.pool.facts_batch` in time order (the
rule path, one process, a fresh embedded Valkey), and the change minutes the
pool writes come back as the next batch, as they do through the log
(`bench.facts.run_pool`'s loop). Then PVM's own views are read back:
`FactStore.in_tier` for every tier key of the three projects (their tasks,
and the global tier), and `FactStore.current(..., as_of)` for each question.

Matching is deterministic, without a judge:

- text is compared normalized: lower case, anything but letters and digits a
  space, runs of spaces one;
- a **slot** is like a gold slot when the words of "subject attribute" overlap
  (shared content words over the smaller side's) or their spelling does
  (Dice of character trigrams, spaces dropped: "minSdk" and "min SDK"), the
  larger of the two at least `SLOT_LIKE` (0.5);
- a **value** matches a gold fact's value or one of its `value_aliases` when
  equal normalized, or when it holds all of the gold's content words and at
  most `VALUE_EXTRA_WORDS` (2) more;
- a stored fact matches a gold fact of its project (a global one: the global
  tier) when both do; matching is one to one, best slot likeness first, so a
  restatement stored again is a false positive, as the README scores it.

Metrics (over stored facts PVM holds or held: promoted or superseded; pending
and retracted ones are counted apart):

    prose_precision       matched stored facts / stored facts
    prose_recall          gold facts matched / gold facts
    prose_type_accuracy   matched pairs with the gold's type / matched pairs
    prose_current_view_accuracy
        questions whose answer PVM holds in force at ``as_of`` (default the set's
        ``current_as_of``): the facts of the project's tier keys and the global
        tier in `FactStore.current` whose slot is like the question's slot
        (`SLOT_LIKE`), those of the likest slot among them (all its values),
        must match exactly the gold's values (none where the gold is null)
    prose_stale_current_rate
        questions where a fact held in force in any slot like the question's
        holds a value of that slot that no longer held at ``as_of``, and no
        statement in force questions it (an older value shown as current with
        no newer minute beside it: `workers.rules.questioning`)
    prose_distractor_facts   stored facts whose every source is a distractor minute
    prose_cross_slot_invalidations
        `must_not_invalidate` gold facts of the cross-slot traps whose matched
        stored fact PVM retired (retracted, or valid_until before the gold's)
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.harness import BenchError, Progress, target_texts, verdicts, workspace
from contracts import Fact, Minute, decode_minute
from contracts.facts import GLOBAL_KEY, FactStatus, RelationKind, Tier, TierKey, is_valid_task_id
from pvm import defaults
from pvm.stores.facts import FactStore
from workers.facts.extraction import Extractor, RuleExtractor
from workers.facts.pool import FactsContext, facts_batch
from workers.rules.statements import STATEMENT

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "prose_facts" / "prose_facts.json"
SLOT_LIKE = 0.5
VALUE_EXTRA_WORDS = 2
HELD = (FactStatus.PROMOTED, FactStatus.SUPERSEDED)
EXAMPLES = 10  # missed gold facts and unmatched stored facts kept in the result
TIMING_REPEATS = 3  # the set again under renamed projects, for facts_per_s (scale 1.0)
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "for",
        "to",
        "in",
        "on",
        "at",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "and",
        "or",
        "with",
        "by",
        "from",
        "as",
        "it",
        "its",
        "this",
        "that",
        "our",
        "we",
        "their",
        "they",
    ]
)

TARGETS: dict[str, tuple[str, float]] = {
    "prose_precision": (">=", 0.85),
    "prose_recall": (">=", 0.6),
    "prose_current_view_accuracy": (">=", 0.7),
    "prose_stale_current_rate": ("<=", 0.05),
}


@dataclass(frozen=True)
class GoldProseFact:
    id: str
    project_id: str
    tier: str
    task_id: str | None
    type: str
    subject: str
    attribute: str
    value: str
    aliases: tuple[str, ...]
    single_valued: bool
    sources: tuple[str, ...]
    valid_from: str
    valid_until: str | None

    @property
    def slot(self) -> tuple[str, str | None, str | None, str, str]:
        return (
            self.tier,
            None if self.tier == "global" else self.project_id,
            self.task_id,
            self.subject,
            self.attribute,
        )

    def held_at(self, when: datetime) -> bool:
        return _instant(self.valid_from) <= when and (self.valid_until is None or when < _instant(self.valid_until))


@dataclass(frozen=True)
class Question:
    id: str
    project_id: str
    text: str
    as_of: str
    gold_fact_ids: tuple[str, ...]
    expected: str | list[str] | None
    slot: tuple[str, str | None, str | None, str, str]


@dataclass
class ProseSet:
    minutes: list[Minute]
    facts: list[GoldProseFact]
    questions: list[Question]
    distractors: frozenset[str]
    traps: list[dict[str, Any]]
    current_as_of: str

    @property
    def projects(self) -> list[str]:
        return sorted({m.project_id for m in self.minutes})


def load(path: Path = DEFAULT_DATA) -> ProseSet:
    """The set as its README describes it; a clear error where it does not read so."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: no prose facts set there (see ../shared/data/prose_facts/README.md)"
        ) from None
    minutes = [Minute.from_dict(m) for m in raw["minutes"]]
    facts = [
        GoldProseFact(
            id=f["id"],
            project_id=f["project_id"],
            tier=f["tier"],
            task_id=f.get("task_id"),
            type=f["type"],
            subject=f["subject"],
            attribute=f["attribute"],
            value=f["value"],
            aliases=tuple(f.get("value_aliases") or ()),
            single_valued=bool(f["single_valued"]),
            sources=tuple(f["source_minute_ids"]),
            valid_from=f["valid_from"],
            valid_until=f.get("valid_until"),
        )
        for f in raw["facts"]
    ]
    slots = raw["annotations"]["question_slots"]
    questions = []
    for q in raw["questions"]:
        s = slots[q["id"]]
        tier = s["tier"]
        questions.append(
            Question(
                id=q["id"],
                project_id=q["project_id"],
                text=q["question"],
                as_of=q.get("as_of") or raw["current_as_of"],
                gold_fact_ids=tuple(q["gold_fact_ids"]),
                expected=q["expected_value"],
                slot=(
                    tier,
                    None if tier == "global" else s["project_id"],
                    s.get("task_id"),
                    s["subject"],
                    s["attribute"],
                ),
            )
        )
    return ProseSet(
        minutes=sorted(minutes, key=lambda m: (m.timestamp, m.id)),
        facts=facts,
        questions=questions,
        distractors=frozenset(raw["annotations"]["distractor_minute_ids"]),
        traps=list(raw["annotations"]["cross_slot_traps"]),
        current_as_of=raw["current_as_of"],
    )


# -- matching ------------------------------------------------------------------------------------


def normalized(text: str) -> str:
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


def words(text: str) -> set[str]:
    return {w for w in normalized(text).split() if w not in STOPWORDS}


def _trigrams(text: str) -> set[str]:
    joined = normalized(text).replace(" ", "")
    return {joined[i : i + 3] for i in range(max(1, len(joined) - 2))}


def slot_likeness(a: str, b: str) -> float:
    """How alike two "subject attribute" texts are, 0..1: shared words, or shared spelling."""
    wa, wb = words(a), words(b)
    shared = len(wa & wb) / min(len(wa), len(wb)) if wa and wb else 0.0
    ta, tb = _trigrams(a), _trigrams(b)
    dice = 2 * len(ta & tb) / (len(ta) + len(tb)) if ta and tb else 0.0
    return max(shared, dice)


def value_matches(value: str, gold: GoldProseFact) -> bool:
    said = normalized(value)
    said_words = words(value)
    for wanted in (gold.value, *gold.aliases):
        if said == normalized(wanted):
            return True
        needed = words(wanted)
        if needed and needed <= said_words and len(said_words) <= len(needed) + VALUE_EXTRA_WORDS:
            return True
    return False


def _slot_text(subject: str, attribute: str) -> str:
    return f"{subject} {attribute}"


def _same_scope(fact: Fact, gold: GoldProseFact) -> bool:
    if gold.tier == "global":
        return fact.tier_key.tier == Tier.GLOBAL
    return fact.tier_key.project_id == gold.project_id


def match(stored: Sequence[Fact], gold: Sequence[GoldProseFact]) -> dict[str, str]:
    """Stored fact id -> gold fact id, one to one, best slot likeness first (then ids: the same every run)."""
    pairs: list[tuple[float, str, str]] = []
    for f in stored:
        for g in gold:
            if not _same_scope(f, g) or not value_matches(f.value, g):
                continue
            like = slot_likeness(_slot_text(f.subject, f.attribute), _slot_text(g.subject, g.attribute))
            if like >= SLOT_LIKE:
                pairs.append((like, f.id, g.id))
    out: dict[str, str] = {}
    taken: set[str] = set()
    for _, fid, gid in sorted(pairs, key=lambda p: (-p[0], p[1], p[2])):
        if fid not in out and gid not in taken:
            out[fid] = gid
            taken.add(gid)
    return out


# -- running the pool ----------------------------------------------------------------------------


@dataclass
class ProseRun:
    facts: list[Fact]  # every fact of the projects' tier keys and the global tier, any status
    in_force: dict[str, list[Fact]]  # question id -> FactStore.current at its as_of
    counts: Counter[str] = field(default_factory=Counter)
    minutes: int = 0
    seconds: float = 0.0


class PoolFeed:
    """Minutes through `facts_batch` (the rule path) as the log hands them, the change minutes the pool writes fed
    back as the next batch; what it took and counted."""

    def __init__(self, ws: Any, extractor: Extractor | None = None) -> None:
        from bench.facts import _Log

        self.ws = ws
        self.ctx = FactsContext.build(ws.connection, ws.settings, extractor=extractor or RuleExtractor())
        self.log = _Log()
        self.tail: dict[str, bytes] = {}
        self.counts: Counter[str] = Counter()
        self.minutes = 0
        self.seconds = 0.0

    def feed(self, minutes: Sequence[Minute]) -> None:
        from bench.facts import _new_entries

        for start in range(0, len(minutes), defaults.FANOUT_BATCH_SIZE):
            part = minutes[start : start + defaults.FANOUT_BATCH_SIZE]
            batch = self.log.records(part)
            while batch:
                began = time.perf_counter()
                out = facts_batch(self.ctx, self.ws.connection, batch)
                self.seconds += time.perf_counter() - began
                self.counts.update(out["counts"])
                echo = _new_entries(self.ws.connection, self.ws.settings.shards, self.tail)
                batch = self.log.records([decode_minute(raw) for raw in echo], echo) if echo else []
            self.minutes += len(part)


def run_pool(data: ProseSet, progress: Progress, repeats: int = 1, extractor: Extractor | None = None) -> ProseRun:
    """The minutes through the facts pool (`PoolFeed`, the rules unless `extractor` is given); `repeats` timed
    rounds after the labeled one (the same minutes under renamed projects)."""
    from bench.facts import renamed

    run = ProseRun([], {})
    with workspace("facts-prose") as ws:
        pool = PoolFeed(ws, extractor)
        rounds = [data.minutes, *(renamed(data.minutes, f"r{i}") for i in range(1, repeats + 1))]
        for n, minutes in enumerate(rounds):
            progress.tick(f"prose round {n + 1}/{len(rounds)}: {len(minutes)} minutes", force=True)
            pool.feed(minutes)
        run.counts, run.minutes, run.seconds = pool.counts, pool.minutes, pool.seconds
        store = FactStore(ws.connection)
        keys = tier_keys(data.minutes)
        run.facts = [f for key in keys for f in store.in_tier(key)]
        for q in data.questions:
            run.in_force[q.id] = store.current(tier_keys_of(keys, q.project_id), as_of=q.as_of)
    return run


def tier_keys(minutes: Iterable[Minute]) -> list[TierKey]:
    """The tier keys the minutes' facts can live in: each project, each task a minute names, and the global tier."""
    out: dict[TierKey, None] = {}
    for m in minutes:
        out[TierKey.for_project(m.project_id)] = None
        task = m.data.get("task_id")
        if is_valid_task_id(task):
            out[TierKey.for_task(m.project_id, str(task))] = None
    out[GLOBAL_KEY] = None
    return list(out)


def tier_keys_of(keys: Sequence[TierKey], project_id: str) -> list[TierKey]:
    return [k for k in keys if k.tier == Tier.GLOBAL or k.project_id == project_id]


# -- scoring -------------------------------------------------------------------------------------


def score(data: ProseSet, run: ProseRun) -> tuple[dict[str, Any], dict[str, Any]]:
    """The metrics of the module docstring, and the counts and examples behind them."""
    # What a speaker said of themselves (`workers.rules.statements`) is knowledge kept as said, not a typed fact:
    # counted apart (said_held), not matched against the gold facts.
    said = [f for f in run.facts if f.status in HELD and f.attribute == STATEMENT]
    held = [f for f in run.facts if f.status in HELD and f.attribute != STATEMENT]
    gold_by_id = {g.id: g for g in data.facts}
    held_by_id = {f.id: f for f in held}
    matched = match(held, data.facts)
    typed = sum(1 for fid, gid in matched.items() if held_by_id[fid].type.value == gold_by_id[gid].type)
    right = stale = 0
    wrong: list[dict[str, Any]] = []
    for q in data.questions:
        ok, old = _answer(q, run.in_force.get(q.id, []), data.facts)
        right += ok
        stale += old
        if not ok and len(wrong) < EXAMPLES:
            wrong.append({"question": q.id, "text": q.text, "expected": q.expected, "stale": old})
    distractor = [f for f in held if f.source_minute_ids and set(f.source_minute_ids) <= data.distractors]
    retired = _cross_slot(data, run.facts, gold_by_id)
    metrics = {
        "prose_precision": _ratio(len(matched), len(held)),
        "prose_recall": _ratio(len(set(matched.values())), len(data.facts)),
        "prose_type_accuracy": _ratio(typed, len(matched)),
        "prose_current_view_accuracy": _ratio(right, len(data.questions)),
        "prose_stale_current_rate": _ratio(stale, len(data.questions)),
        "prose_distractor_facts": len(distractor),
        "prose_cross_slot_invalidations": retired,
    }
    found = set(matched.values())
    notes = {m.id: (m.memory_note or "") for m in data.minutes}
    counts = {
        "minutes": len(data.minutes),
        "gold_facts": len(data.facts),
        "questions": len(data.questions),
        "stored_facts": len(run.facts),
        "stored_by_status": dict(sorted(Counter(f.status.value for f in run.facts).items())),
        "held_facts": len(held),
        "said_held": len(said),
        "matched": len(matched),
        "questions_right": right,
        "questions_stale": stale,
        "questioning_statements": sum(1 for f in said for r in f.relationships if r.kind is RelationKind.QUESTIONS),
        "pool_changes": dict(sorted(run.counts.items())),
        "missed_examples": [
            {
                "fact": g.id,
                "type": g.type,
                "slot": _slot_text(g.subject, g.attribute),
                "value": g.value,
                "minute": (notes.get(g.sources[0], "") if g.sources else "")[:160],
            }
            for g in data.facts
            if g.id not in found
        ][:EXAMPLES],
        "unmatched_stored_examples": [
            {
                "slot": _slot_text(f.subject, f.attribute),
                "value": f.value,
                "type": f.type.value,
                "minute": (notes.get(f.source_minute_ids[0], "") if f.source_minute_ids else "")[:160],
            }
            for f in held
            if f.id not in matched
        ][:EXAMPLES],
        "wrong_questions": wrong,
    }
    return metrics, counts


def _answer(question: Question, in_force: Sequence[Fact], gold: Sequence[GoldProseFact]) -> tuple[bool, bool]:
    """(PVM holds exactly the answer at as_of, PVM holds an old value of the slot as current)."""
    when = _instant(question.as_of)
    slot_text = _slot_text(question.slot[3], question.slot[4])
    tier, project = question.slot[0], question.slot[1]
    likeness = {
        f.id: slot_likeness(_slot_text(f.subject, f.attribute), slot_text)
        for f in in_force
        if (f.tier_key.tier == Tier.GLOBAL) == (tier == "global")
        and (tier == "global" or f.tier_key.project_id == project)
    }
    near = [f for f in in_force if likeness.get(f.id, 0.0) >= SLOT_LIKE]
    # The answer is read from the slot most like the question's (all its values): "trains / cadence" is near
    # "user access reviews / cadence" but no answer to it. A stale value counts in any near slot.
    best = max((likeness[f.id] for f in near), default=0.0)
    about = [f for f in near if likeness[f.id] == best]
    of_slot = [g for g in gold if g.slot == question.slot]
    wanted = [g for g in of_slot if g.id in question.gold_fact_ids]
    gone = [g for g in of_slot if not g.held_at(when) and _instant(g.valid_from) <= when]
    # A fact a statement in force questions is shown with the newer minute beside it, not as settled.
    questioned = {r.fact_id for f in in_force for r in f.relationships if r.kind is RelationKind.QUESTIONS}
    old = any(
        any(value_matches(f.value, g) for g in gone) and not any(value_matches(f.value, w) for w in wanted)
        for f in near
        if f.id not in questioned
    )
    if not wanted:
        return not about, old
    each_found = all(any(value_matches(f.value, w) for f in about) for w in wanted)
    nothing_else = all(any(value_matches(f.value, w) for w in wanted) for f in about)
    return each_found and nothing_else, old


def _cross_slot(data: ProseSet, stored: Sequence[Fact], gold_by_id: Mapping[str, GoldProseFact]) -> int:
    """Gold facts a cross-slot trap must not retire that PVM retired: a stored fact of theirs (any status) retracted,
    or ended before the gold's own end."""
    retired = 0
    for gid in sorted({g for trap in data.traps for g in trap.get("must_not_invalidate", ())}):
        gold = gold_by_id.get(gid)
        if gold is None:
            continue
        theirs = [
            f
            for f in stored
            if _same_scope(f, gold)
            and value_matches(f.value, gold)
            and slot_likeness(_slot_text(f.subject, f.attribute), _slot_text(gold.subject, gold.attribute)) >= SLOT_LIKE
        ]
        if any(
            f.status == FactStatus.RETRACTED
            or (
                f.valid_until is not None
                and (gold.valid_until is None or _instant(f.valid_until) < _instant(gold.valid_until))
            )
            for f in theirs
        ):
            retired += 1
    return retired


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _ratio(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


def run_split(
    progress: Progress, path: Path = DEFAULT_DATA, repeats: int = 3, extractor: Extractor | None = None
) -> dict[str, Any]:
    """The prose split for bench/facts.py: metrics (with `TARGETS`), counts, and the pool's rate over the set and
    `repeats` renamed copies of it; ``{"skipped": why}`` where the set is absent. `extractor`: what the pool
    extracts with (`llm_extractor`), the rules when None."""
    if not path.is_file():
        return {"skipped": f"{path} is absent (the prose facts set lives in ../shared/data beside the checkout)"}
    data = load(path)
    progress.start("prose: pool", f"{len(data.minutes)} hand-worded minutes, then {repeats} timing repeat(s)")
    run = run_pool(data, progress, repeats, extractor)
    values, counts = score(data, run)
    values["facts_per_s"] = round(run.minutes / run.seconds) if run.seconds else 0
    met = verdicts(values, TARGETS)
    texts = target_texts(TARGETS)
    table = {k: {"value": v, "target": texts.get(k), "met": met.get(k)} for k, v in values.items()}
    extracted_by = "rules" if extractor is None or isinstance(extractor, RuleExtractor) else type(extractor).__name__
    return {"metrics": table, "counts": counts, "data": str(path), "extractor": extracted_by}


def llm_extractor(environ: Mapping[str, str]) -> Extractor:
    """The LLM extractor the caller's PVM_LLM_* ask for (the rules its fallback, as in the pool), for `--llm`;
    a clear error when PVM_LLM_MODEL is unset."""
    from pvm.config import Settings
    from workers.facts.extraction_llm import llm_extractor_from_settings

    extractor = llm_extractor_from_settings(
        Settings.from_env({k: v for k, v in environ.items() if k.startswith("PVM_")})
    )
    if extractor is None:
        raise BenchError("--llm needs an LLM: set PVM_LLM_MODEL (and PVM_LLM_BASE_URL, PVM_LLM_API_KEY; docs/llm.md)")
    return extractor

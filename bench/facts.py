#!/usr/bin/env python
"""Facts benchmark: what the facts pool makes of labeled sessions, how fast, and how soon a fact is searchable.

The labeled set is `bench/fact_sessions.py` (seed 11 by default): six
projects, about 970 minutes and 350 planted facts of all seven types, with
value changes, restatements, look-alikes in other slots, task-tier facts and
filler. The default split is phrased with the templates the rules were
written against; the held-out split phrases the same facts with templates
they never saw, so it is the honest one. Each split gets three phases:

1. pool       The session's minutes go through `workers.facts.pool.facts_batch`
              (the body of the facts pool's RQ job, rule path, one process) in
              batches of 500, on a fresh embedded Valkey. The change minutes the
              pool writes to the streams come back as the next batch, as they do
              through the log. The session runs once under its own projects (the
              labeled run), then again under renamed projects for timing.
              Scored against the gold:
                fact_precision, fact_recall, type_accuracy
                    the pool's extracted candidates (`fact_sessions.score`);
                current_view_accuracy
                    share of gold slots whose current promoted values in the
                    store (status promoted, no valid_until) are exactly the gold
                    newest value (all values of a multi-valued slot);
                cross_slot_invalidations
                    supersessions and contradictions (read from the change
                    minutes) between facts of different slots or tier keys, in
                    the store or in the gold (a misread look-alike that retires
                    another slot's fact counts);
                dedupe_rate
                    of planted facts stated more than once and read from two or
                    more of those minutes, the share whose statements all ended
                    in one stored fact;
                false_merge_rate
                    of stored facts that hold a planted statement, the share
                    whose sources state two or more different planted facts;
                facts_per_s
                    session minutes / seconds inside facts_batch, the batches of
                    returning change minutes included (1 process); beside it
                    (`throughput`), facts_per_cpu_s: the same minutes / this
                    process's CPU seconds inside facts_batch, which moves less
                    with the neighbours' load (Valkey's share is not in it).
2. searchable The real pipeline on a fresh home: `workers.runtime.stack.Stack` runs
              embedded Valkey, a dispatcher, a log worker, a facts worker and the
              scheduler as processes; this process is the index owner, as `pvm
              serve` is with the embedded engine (the index pool's RQ worker in
              the main thread, searches in another thread over the same engine).
              After a warm-up, the session's minutes (under renamed projects) are
              emitted with `Emitter` at 50% of this split's facts_per_s; for a
              sample of the facts the labeled run stored, a search with
              kinds=("fact",) is polled until it returns the fact. Per fact:
              emit of its first source minute -> the search that finds it.
              When the whole pipeline (log, facts and index pools, on the same
              cores) cannot keep up with that rate, the latency is a backlog that
              grows with the run's length, so that offer measures the pipeline's
              max load instead (its minutes / seconds from the first emit until
              the streams, the pools' queues and every head were done with it),
              and the session is offered again, renamed anew, at 50% of that max:
                fact_searchable_p99_ms (also p50, p90, max) of the second offer;
                the first offer's figures are under searchable.at_first_rate.
                A fact not found within the drain wait counts with the time
                waited (censored).
3. llm        `bench/facts_llm.py`'s measurement on this split: the LLM extractor
              against the tests' scripted OpenAI-compatible server, batches of 500.
                llm_calls_per_100_minutes

The prose split (`--split prose`, in the default `all`): the hand-worded
set in ``../shared/data/prose_facts`` through the same pool, scored on its
own gold by `bench/prose_facts.py` (precision, recall, current view over its
86 questions, stale "current" values; pool phase only). Where the set is
absent the split is skipped with a note.

Targets (issue 10): precision >= 0.90, recall >= 0.70, type accuracy >= 0.90,
current view >= 0.95, cross-slot invalidations 0, dedupe >= 0.9, false merges
<= 0.01, >= 2,000 minutes/s, searchable p99 <= 2,000 ms, <= 10 LLM calls per
100 minutes. A missed target is reported as missed; nothing is tuned to pass.

    .venv/bin/python bench/facts.py --json > bench/results/facts.json
    .venv/bin/python bench/facts.py --split prose --json > bench/results/facts-prose.json
    .venv/bin/python bench/facts.py --split heldout --minutes-scale 0.2
    .venv/bin/python bench/facts.py --quick --json    # a smoke run, seconds
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import redis
from rq.command import send_shutdown_command
from rq.utils import as_text

from bench.fact_sessions import SPLITS, FactSession, GoldFact, fact_session, score, summary
from bench.harness import (
    VERDICT_WORDS,
    BenchError,
    Progress,
    add_minutes_scale,
    argument_parser,
    footer,
    measuring,
    parse,
    percentile,
    polls,
    report,
    target_texts,
    temp_home,
    verdicts,
    workspace,
)
from bench.machine import machine
from contracts import Fact, FactChange, Minute, decode_minute, encode_minute, fact_change, fact_id, is_fact_change, keys
from contracts.fact_changes import FactContradicted, FactSuperseded
from contracts.facts import FactStatus, Slot, Tier, TierKey
from contracts.memory import FactHit
from pvm import defaults
from pvm.config import Settings
from pvm.emitter import Emitter
from pvm.engines import close_shared, searcher_for
from pvm.search import HybridSearch
from pvm.stores.facts import FactStore
from workers.facts.extraction import Candidate, Extractor, Known, RuleExtractor, value_key
from workers.facts.pool import FactsContext, facts_batch
from workers.runtime.queues import pool_queue
from workers.runtime.runner import run_worker
from workers.runtime.stack import Stack

TARGETS: dict[str, tuple[str, float]] = {
    "fact_precision": (">=", 0.90),
    "fact_recall": (">=", 0.70),
    "type_accuracy": (">=", 0.90),
    "current_view_accuracy": (">=", 0.95),
    "cross_slot_invalidations": ("<=", 0),
    "dedupe_rate": (">=", 0.9),
    "false_merge_rate": ("<=", 0.01),
    "facts_per_s": (">=", 2000),
    "fact_searchable_p99_ms": ("<=", 2000),
    "llm_calls_per_100_minutes": ("<=", 10),
}
SPLIT_CHOICES = ("default", "heldout", "prose", "both", "all")
SEED = 11
PROJECTS = 6  # the labeled set's projects at scale 1.0
TIMING_REPEATS = 5  # the session again under renamed projects, for facts_per_s (scale 1.0)
SEARCHABLE_REPEATS = 4  # the session under renamed projects, offered to the pipeline (scale 1.0)
SEARCHABLE_SAMPLE = 200  # facts whose searchability is polled (scale 1.0): a sample keeps each poll round short
OFFERED_SHARE = 0.5  # of the split's facts_per_s
WARMUP_MINUTES = 60
DRAIN_S = 60.0  # wait after the last emit for facts still not searchable (scale 1.0; at least 20 s)
# Pause between poll rounds: the searches share the index worker's process (and GIL), as `pvm serve`'s API does;
# 5 ms pauses kept this thread busy ~60% of the time and made facts ~10x slower to become searchable (p50 2.1 s
# against 0.13 s at 50 ms, scale 0.5). 50 ms adds at most that to a measured latency.
POLL_PAUSE_S = 0.05
DRAINED_FOR_S = 1.0  # the pipeline idle this long counts as done with an offer
SEARCH_K = 20
ALL_STATUSES = tuple(s.value for s in FactStatus)
QUICK_SCALE = 0.1  # --quick


# -- the pool on the labeled set ------------------------------------------------------------------


class RecordingExtractor:
    """The rule extractor, keeping every candidate it hands the pool (what precision and recall score)."""

    def __init__(self, inner: Extractor) -> None:
        self.inner = inner
        self.candidates: list[Candidate] = []

    def extract(self, minutes: Sequence[Minute], known: Known | None = None) -> list[Candidate]:
        found = self.inner.extract(minutes, known)
        self.candidates.extend(found)
        return found


def renamed(minutes: Sequence[Minute], suffix: str) -> list[Minute]:
    """The minutes under projects `<project>-<suffix>`, with ids (and references) `<id>-<suffix>`.

    New ids, as a fresh session would have: one batch of the pool may hold copies from several projects.
    """
    return [
        Minute.from_dict(
            {
                **m.to_dict(),
                "project_id": f"{m.project_id}-{suffix}",
                "id": renamed_id(m.id, suffix),
                "context_references": [renamed_id(r, suffix) for r in m.context_references],
            }
        )
        for m in minutes
    ]


def renamed_id(minute_id: str, suffix: str) -> str:
    return f"{minute_id}-{suffix}"


@dataclass
class PoolRun:
    """What one run of the facts pool over a session left: the labeled run's facts and changes, and its timing."""

    candidates: list[Candidate]
    facts: list[Fact]  # every fact of the labeled projects' tier keys, any status
    current: list[Fact]  # what the store holds as true now in those tier keys (`FactStore.current`)
    changes: list[FactChange]
    counts: Counter[str]
    minutes: int = 0  # ordinary minutes through the pool, every repeat
    change_minutes: int = 0  # change minutes that came back
    minute_seconds: float = 0.0
    change_seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process's CPU inside facts_batch, both kinds of batch
    batches: int = 0

    @property
    def facts_per_s(self) -> float:
        return self.minutes / (self.minute_seconds + self.change_seconds)


class _Log:
    """Hands the pool records as the log would: a per-project seq, the stream entry time now."""

    def __init__(self) -> None:
        self.seqs: Counter[str] = Counter()

    def records(self, minutes: Sequence[Minute], raws: Sequence[bytes] | None = None) -> list[list[Any]]:
        out: list[list[Any]] = []
        now_ms = int(time.time() * 1000)
        for i, m in enumerate(minutes):
            self.seqs[m.project_id] += 1
            out.append([m.id, self.seqs[m.project_id], raws[i] if raws else encode_minute(m), now_ms])
        return out


def _new_entries(connection: redis.Redis, shards: int, last: dict[str, bytes]) -> list[bytes]:
    """Minute bytes XADDed to the shard streams since the last call (the pool's change minutes)."""
    raws: list[bytes] = []
    for shard in range(shards):
        name = keys.stream(shard)
        start = b"(" + last[name] if name in last else b"-"
        for entry_id, fields in connection.xrange(name, min=start, max="+"):
            last[name] = entry_id
            raws.append(fields[keys.MINUTE_FIELD])
    return raws


def run_pool(
    session: FactSession,
    repeats: int,
    progress: Progress,
    batch: int = defaults.FANOUT_BATCH_SIZE,
    store: Callable[[redis.Redis], FactStore] = FactStore,
) -> PoolRun:
    """The session through `facts_batch` once under its own projects, then `repeats` times renamed; timed.

    `store` makes the store the pool writes through (the tests hand it a broken one); the facts and the
    current view are read back with a plain `FactStore`.
    """
    labeled = {m.project_id for m in session.minutes}
    with workspace("facts-pool") as ws:
        recorder = RecordingExtractor(RuleExtractor())
        ctx = replace(FactsContext.build(ws.connection, ws.settings, extractor=recorder), store=store(ws.connection))
        log = _Log()
        tail: dict[str, bytes] = {}
        run = PoolRun([], [], [], [], Counter())
        changes: list[FactChange] = []
        rounds = [session.minutes, *(renamed(session.minutes, f"r{i}") for i in range(1, repeats + 1))]
        for n, minutes in enumerate(rounds):
            progress.tick(f"round {n + 1}/{len(rounds)}: {len(minutes):,} minutes", force=True)
            for start in range(0, len(minutes), batch):
                chunk = log.records(minutes[start : start + batch])
                began, cpu = time.perf_counter(), time.process_time()
                out = facts_batch(ctx, ws.connection, chunk)
                run.minute_seconds += time.perf_counter() - began
                run.cpu_seconds += time.process_time() - cpu
                run.minutes += len(chunk)
                run.counts.update(out["counts"])
                run.batches += 1
                echo = _new_entries(ws.connection, ws.settings.shards, tail)
                if not echo:
                    continue
                echoed = [decode_minute(raw) for raw in echo]
                records = log.records(echoed, echo)
                began, cpu = time.perf_counter(), time.process_time()
                out = facts_batch(ctx, ws.connection, records)
                run.change_seconds += time.perf_counter() - began
                run.cpu_seconds += time.process_time() - cpu
                run.change_minutes += len(records)
                run.batches += 1
                if out["counts"].get("refused"):
                    raise BenchError(f"the pool refused {out['counts']['refused']} of its own change minutes")
                changes += [fact_change(m) for m in echoed if m.project_id in labeled and is_fact_change(m)]
        run.candidates = [c for c in recorder.candidates if c.project_id in labeled]
        run.changes = changes
        reader = FactStore(ws.connection)
        held = tier_keys(run.candidates)
        run.facts = stored_facts(reader, held)
        run.current = reader.current(held)
    return run


def tier_keys(candidates: Sequence[Candidate]) -> list[TierKey]:
    """Every tier key the candidates' facts can live in (their projects, and the tasks they name)."""
    found: dict[TierKey, None] = {}
    for c in candidates:
        found[TierKey.for_project(c.project_id)] = None
        if c.tier == Tier.TASK and c.task_id:
            found[TierKey.for_task(c.project_id, c.task_id)] = None
    return list(found)


def stored_facts(store: FactStore, keys_: Sequence[TierKey]) -> list[Fact]:
    return [f for key in keys_ for f in store.in_tier(key)]


# -- scoring the store against the gold -----------------------------------------------------------


def gold_tier_key(fact: GoldFact) -> TierKey:
    return TierKey.for_task(fact.project_id, fact.task_id) if fact.task_id else TierKey.for_project(fact.project_id)


def gold_slot(fact: GoldFact) -> tuple[TierKey, Slot]:
    return gold_tier_key(fact), Slot(fact.subject, fact.attribute)


@dataclass
class Planted:
    """Which planted facts each stored fact holds statements of."""

    statements: dict[str, list[GoldFact]]  # minute id -> the planted facts it states
    of: dict[str, set[str]] = field(default_factory=dict)  # stored fact id -> planted keys its sources state
    valued: dict[str, set[str]] = field(default_factory=dict)  # ... of those, the ones with its value

    @classmethod
    def read(cls, gold: Sequence[GoldFact], facts: Sequence[Fact]) -> Planted:
        statements: dict[str, list[GoldFact]] = {}
        for g in gold:
            for minute_id in g.minute_ids:
                statements.setdefault(minute_id, []).append(g)
        planted = cls(statements)
        for f in facts:
            stated = {g.key: g for m in f.source_minute_ids for g in statements.get(m, ())}
            planted.of[f.id] = set(stated)
            planted.valued[f.id] = {k for k, g in stated.items() if value_key(g.value) == value_key(f.value)}
        return planted


@dataclass(frozen=True)
class CurrentView:
    """How the store's current view compares with the gold's, slot by slot."""

    accuracy: float
    right: int
    slots: int
    newest_pending: int  # wrong slots whose gold newest value is stored, but pending (below PVM_FACT_PROMOTE_AT)
    old_value_kept: int  # wrong slots whose current view holds a value the gold does not (an old one, a misread)
    missing: int  # wrong slots the current view holds nothing for (and the newest value is not pending)
    current: int = 0  # facts the store holds as current
    current_right: int = 0  # ... of them, a gold slot's newest value

    @property
    def precision(self) -> float:
        """Of what the store tells an agent is true now, the share that is: a gold slot's newest value."""
        return ratio(self.current_right, self.current)


def current_view_accuracy(session: FactSession, current: Sequence[Fact], facts: Sequence[Fact]) -> CurrentView:
    """Share of gold slots whose values in the store's current view (`FactStore.current`: promoted, valid now)
    are exactly the gold's newest (all of a multi-valued slot's); and why the others are wrong."""
    held: dict[tuple[TierKey, Slot], set[str]] = {}
    for f in current:
        held.setdefault((f.tier_key, f.slot), set()).add(value_key(f.value))
    pending = {(f.tier_key, f.slot, value_key(f.value)) for f in facts if f.status is FactStatus.PENDING}
    view = session.current_view()
    gold_now = {
        (TierKey.for_task(*tier) if len(tier) == 2 else TierKey.for_project(tier[0]), Slot(subject, attribute), v)
        for (tier, subject, attribute), values in view.items()
        for v in values
    }
    current_right = sum(1 for f in current if (f.tier_key, f.slot, value_key(f.value)) in gold_now)
    right = newest_pending = old_kept = missing = 0
    for (tier, subject, attribute), values in view.items():
        key = TierKey.for_task(*tier) if len(tier) == 2 else TierKey.for_project(tier[0])
        slot = Slot(subject, attribute)
        now = held.get((key, slot), set())
        if now == set(values):
            right += 1
        elif now - set(values):
            old_kept += 1
        elif any((key, slot, v) in pending for v in values):
            newest_pending += 1
        else:
            missing += 1
    return CurrentView(
        ratio(right, len(view)), right, len(view), newest_pending, old_kept, missing, len(current), current_right
    )


def invalidations(changes: Sequence[FactChange]) -> list[tuple[str, str, str]]:
    """(kind, fact id, by fact id) of every supersession and contradiction (each contradicted pair once)."""
    out: dict[tuple[str, str, str], None] = {}
    for change in changes:
        if isinstance(change, FactSuperseded):
            out[("superseded", change.fact_id, change.superseded_by)] = None
        elif isinstance(change, FactContradicted):
            a, b = sorted((change.fact_id, change.contradicted_by))
            out[("contradicted", a, b)] = None
    return list(out)


def cross_slot(
    pairs: Sequence[tuple[str, str, str]], facts: Mapping[str, Fact], gold: Mapping[str, GoldFact], planted: Planted
) -> dict[str, int]:
    """How many invalidations join different slots: in the store, or by the planted facts the two hold."""
    by_store = by_gold = unplanted = 0
    for _, a_id, b_id in pairs:
        a, b = facts.get(a_id), facts.get(b_id)
        if a is None or b is None:
            raise BenchError(f"a change names a fact the store does not hold ({a_id if a is None else b_id})")
        if (a.tier_key, a.slot) != (b.tier_key, b.slot):
            by_store += 1
            continue
        slots_a = {gold_slot(gold[k]) for k in planted.valued[a_id]}
        slots_b = {gold_slot(gold[k]) for k in planted.valued[b_id]}
        if slots_a and slots_b and not slots_a & slots_b:
            by_gold += 1
        elif not slots_a or not slots_b:
            unplanted += 1
    return {"store_slots": by_store, "planted_slots": by_gold, "with_unplanted_fact": unplanted}


def dedupe(gold: Sequence[GoldFact], facts: Sequence[Fact], planted: Planted) -> tuple[float, int, int]:
    """Of planted facts stated more than once and read from 2+ of those minutes: the share kept in one stored fact."""
    holders: dict[str, list[Fact]] = {}
    for f in facts:
        for key in planted.valued[f.id]:
            holders.setdefault(key, []).append(f)
    eligible = merged = 0
    for g in gold:
        if len(g.minute_ids) < 2:
            continue
        read = [{m for m in f.source_minute_ids if m in g.minute_ids} for f in holders.get(g.key, ())]
        read = [r for r in read if r]
        if len(set().union(*read)) < 2:
            continue
        eligible += 1
        merged += len(read) == 1
    return ratio(merged, eligible), merged, eligible


def false_merges(facts: Sequence[Fact], planted: Planted) -> tuple[float, int, int]:
    """Of stored facts holding a planted statement: the share whose sources state 2+ different planted facts."""
    holding = [f for f in facts if planted.of[f.id]]
    merged = sum(1 for f in holding if len(planted.of[f.id]) > 1)
    return ratio(merged, len(holding)), merged, len(holding)


def quality(session: FactSession, run: PoolRun) -> tuple[dict[str, Any], dict[str, Any]]:
    """The quality metrics of a pool run on the labeled session, and their counts."""
    scored = score(run.candidates, session.facts)
    planted = Planted.read(session.facts, run.facts)
    by_id = {f.id: f for f in run.facts}
    gold = {g.key: g for g in session.facts}
    pairs = invalidations(run.changes)
    crossing = cross_slot(pairs, by_id, gold, planted)
    view = current_view_accuracy(session, run.current, run.facts)
    dedupe_rate, merged, restated = dedupe(session.facts, run.facts, planted)
    false_rate, falsely, holding = false_merges(run.facts, planted)
    metrics = {
        "fact_precision": scored["precision"],
        "fact_recall": scored["recall"],
        "type_accuracy": scored["type_accuracy"],
        "current_view_accuracy": view.accuracy,
        "cross_slot_invalidations": crossing["store_slots"] + crossing["planted_slots"],
        "dedupe_rate": dedupe_rate,
        "false_merge_rate": false_rate,
    }
    statuses = Counter(f.status.value for f in run.facts)
    counts = {
        "minutes": len(session.minutes),
        "planted_facts": len(session.facts),
        "planted_statements": scored["statements"],
        "candidates": scored["candidates"],
        "stored_facts": len(run.facts),
        "stored_by_status": dict(sorted(statuses.items())),
        "gold_slots": view.slots,
        "gold_slots_current_right": view.right,
        "gold_slots_wrong_newest_pending": view.newest_pending,
        "current_facts": view.current,
        "current_facts_right": view.current_right,
        "current_precision": view.precision,  # no target in issue 10: the guard on PVM_FACT_PROMOTE_AT
        "gold_slots_wrong_old_value_kept": view.old_value_kept,
        "gold_slots_wrong_missing": view.missing,
        "invalidations": len(pairs),
        "superseded": sum(1 for p in pairs if p[0] == "superseded"),
        "contradicted_pairs": sum(1 for p in pairs if p[0] == "contradicted"),
        "cross_slot_by_store_slot": crossing["store_slots"],
        "cross_slot_by_planted_slot": crossing["planted_slots"],
        "invalidations_with_an_unplanted_fact": crossing["with_unplanted_fact"],
        "restated_facts": len(session.restated),
        "restated_read_twice_or_more": restated,
        "restated_merged": merged,
        "stored_facts_holding_a_statement": holding,
        "false_merges": falsely,
        "pool_changes": dict(sorted(run.counts.items())),
    }
    detail = {
        "statement_recall": scored["statement_recall"],
        "tier_accuracy": scored["tier_accuracy"],
        "valid_from_accuracy": scored["valid_from_accuracy"],
        "by_type": scored["by_type"],
    }
    counts["score_detail"] = detail
    return metrics, counts


def ratio(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else math.nan


# -- minute emitted -> fact searchable ------------------------------------------------------------


@dataclass(frozen=True)
class Tracked:
    """A stored fact of the labeled run, to be found again in a renamed project: the minute that first states it."""

    first_minute: str
    tier: Tier
    task_id: str | None
    project_id: str
    slot: Slot
    value: str
    type: str
    period: int = 0  # a value that came back in its slot is another fact, its next period

    def key_in(self, suffix: str) -> tuple[str, str]:
        """(project, fact id) of this fact under the project renamed with `suffix`."""
        project = f"{self.project_id}-{suffix}"
        tier = TierKey.for_task(project, self.task_id) if self.tier is Tier.TASK and self.task_id else None
        return project, fact_id(tier or TierKey.for_project(project), self.slot, self.value, self.period)

    @property
    def query(self) -> str:
        return f"{self.slot.subject} {self.slot.attribute.replace('_', ' ')} {self.value}"


def trackable(session: FactSession, run: PoolRun) -> list[Tracked]:
    """The labeled run's stored facts that hold a planted statement, each with the minute that asserted it."""
    planted = Planted.read(session.facts, run.facts)
    order = {m.id: i for i, m in enumerate(session.minutes)}
    out = []
    for f in run.facts:
        if not planted.valued[f.id]:
            continue
        first = min((m for m in f.source_minute_ids if m in order), key=order.__getitem__)
        out.append(
            Tracked(
                first,
                f.tier_key.tier,
                f.tier_key.task_id,
                str(f.tier_key.project_id),
                f.slot,
                f.value,
                f.type.value,
                f.period,
            )
        )
    out.sort(key=lambda t: order[t.first_minute])
    return out


@contextmanager
def environment(settings: Settings) -> Iterator[None]:
    """os.environ as the stack's processes get it: `settings`, and no other PVM_ or OPENAI_ variable (rule path)."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith(("PVM_", "OPENAI_")):
            del os.environ[name]
    os.environ.update(settings.to_env())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@dataclass
class Searchability:
    """What the driver saw: per tracked fact, when its minute was emitted and when a search first returned it."""

    emitted: dict[tuple[str, str], float] = field(default_factory=dict)  # (project, fact id) -> emit time
    found: dict[tuple[str, str], float] = field(default_factory=dict)
    through: dict[tuple[str, str], int] = field(default_factory=dict)  # ... -> minutes emitted up to its minute
    rounds: list[float] = field(default_factory=list)  # seconds per poll round
    first_emit: float | None = None
    drained_at: float | None = None  # when the pipeline had done everything the offer gave it
    offered_s: float = 0.0
    gave_up_at: float | None = None
    error: BaseException | None = None

    def pipeline_per_s(self, minutes: int) -> float | None:
        """The offer's minutes over the seconds from its first emit until the pipeline had done all of it: the
        pipeline's max when the offer was faster than it."""
        if self.drained_at is None or self.first_emit is None:
            return None
        return minutes / max(1e-6, self.drained_at - self.first_emit)


@dataclass(frozen=True)
class Offer:
    """Minutes to offer the pipeline, and the facts to watch among them."""

    minutes: Sequence[Minute]
    watch: Watch
    stride: int
    stored: int  # facts the labeled run stored, times the renamed copies (what the watched ones sample)

    @property
    def polled(self) -> int:
        return sum(len(v) for v in self.watch.values())


Watch = Mapping[tuple[str, str], Sequence[tuple[tuple[str, str], Tracked]]]  # (project, minute id) -> its facts


class Driver:
    """The searchable phase's second thread: warm the pipeline up, offer the minutes, poll searches, stop the worker.

    The index pool's RQ worker runs in the main thread (it needs signals), as in `pvm serve`; this thread
    searches the same engine, as `pvm serve`'s API thread does, and asks the worker to stop (RQ's shutdown
    command) when it is done, or when the main thread's `done` says the worker already stopped.
    """

    def __init__(self, live: Settings, worker: str, stack: Stack, progress: Progress) -> None:
        self.live = live
        self.worker = worker
        self.stack = stack
        self.progress = progress
        self.done = threading.Event()
        self.seen = Searchability()  # the offer at the first rate
        self.half = Searchability()  # the offer at the share of the max the first one measured
        self.half_rate: float | None = None

    def run(
        self, warm: Sequence[Minute], warm_facts: Watch, first: Offer, then: Offer, rate: float, drain_s: float
    ) -> None:
        connection = redis.Redis.from_url(str(self.live.redis_url))
        try:
            self._wait_for_worker(connection)
            search = searcher_for(Settings.from_env())  # the engine the index worker writes (one per process)
            assert isinstance(search, HybridSearch)
            with Emitter(settings=self.live) as emitter:
                count = sum(len(v) for v in warm_facts.values())
                self.progress.tick(f"warm-up: {len(warm)} minutes, waiting for {count} of their facts", force=True)
                self._offer(emitter, search, warm, warm_facts, rate, 120.0, Searchability())
                self._offer(emitter, search, first.minutes, first.watch, rate, drain_s, self.seen)
                self._drain(connection, first, self.seen, drain_s)
                most = self.seen.pipeline_per_s(len(first.minutes))
                if most is None:
                    raise BenchError(f"searchable: the pipeline still had work {drain_s:.0f} s after the last watch")
                self.half_rate = OFFERED_SHARE * most
                self.progress.tick(
                    f"the pipeline's max: {most:,.0f} minutes/s; now offering {self.half_rate:,.0f}/s", force=True
                )
                self._offer(emitter, search, then.minutes, then.watch, self.half_rate, drain_s, self.half)
                self._drain(connection, then, self.half, drain_s)
        except BaseException as exc:  # reported by the main thread once the worker stopped
            self.seen.error = exc
        finally:
            while not self.done.is_set():
                send_shutdown_command(connection, self.worker)
                self.done.wait(0.5)
            connection.close()

    def _drain(self, connection: redis.Redis, offered: Offer, seen: Searchability, wait_s: float) -> None:
        """Wait until the pipeline has done all the offer gave it; `seen.drained_at`: since when (None: it had not).

        Done: nothing left in the shard streams or the pools' queues, and every offered project's index and
        facts heads at its log head; held for `DRAINED_FOR_S` (a change minute is written before its head moves).
        """
        projects = sorted({m.project_id for m in offered.minutes})
        since: float | None = None
        for _ in polls(wait_s, 0.05, alive=self._check):
            if not pipeline_idle(connection, self.live.shards, projects):
                since = None
                continue
            since = since or time.time()
            if time.time() - since >= DRAINED_FOR_S:
                seen.drained_at = since
                return
        self.progress.tick(f"the pipeline still had work {wait_s:.0f} s after the offer", force=True)

    def _wait_for_worker(self, connection: redis.Redis) -> None:
        for _ in polls(60.0, 0.05, alive=self._check):
            if connection.exists(keys.worker_alive(self.worker)):
                return
        raise BenchError("searchable: the index worker did not start in 60 s")

    def _check(self) -> None:
        if self.done.is_set():
            raise BenchError("searchable: the index worker stopped")
        for name, child in self.stack.children.items():
            if child.poll() is not None:
                raise BenchError(f"searchable: {name} (pid {child.pid}) exited with {child.returncode}")

    def _offer(
        self,
        emitter: Emitter,
        search: HybridSearch,
        minutes: Sequence[Minute],
        watch: Watch,
        rate: float,
        drain_s: float,
        seen: Searchability,
    ) -> None:
        """Emit `minutes` at `rate` while polling a search per watched fact in flight, until all are found."""
        in_flight: dict[tuple[str, str], Tracked] = {}
        interval = 1.0 / rate
        n = len(minutes)
        i = 0
        start = time.perf_counter()
        last_emit: float | None = None
        while True:
            now = time.perf_counter()
            while i < n and start + i * interval <= now:
                m = minutes[i]
                at = time.time()
                if seen.first_emit is None:
                    seen.first_emit = at
                emitter.emit(m)
                for key, t in watch.get((m.project_id, m.id), ()):
                    seen.emitted[key] = at
                    seen.through[key] = i + 1
                    in_flight[key] = t
                i += 1
            if i == n and last_emit is None:
                seen.offered_s = time.perf_counter() - start
                last_emit = time.monotonic()
                emitter.flush(30)
            began = time.perf_counter()
            for key, t in list(in_flight.items()):
                if found(search, key, t):
                    seen.found[key] = time.time()
                    del in_flight[key]
            seen.rounds.append(time.perf_counter() - began)
            self.progress.tick(f"{i:,}/{n:,} emitted; {len(seen.found):,} facts found, {len(in_flight):,} in flight")
            self._check()
            if last_emit is not None:
                if not in_flight:
                    return
                if time.monotonic() - last_emit > drain_s:
                    seen.gave_up_at = time.time()
                    self.progress.tick(f"{len(in_flight):,} facts not searchable after {drain_s:.0f} s", force=True)
                    return
            time.sleep(POLL_PAUSE_S)


def pipeline_idle(connection: redis.Redis, shards: int, projects: Sequence[str]) -> bool:
    """No entry waiting in a shard stream, no job in a pool's queue or running, and every project's index
    and facts heads at its log head."""
    for shard in range(shards):
        try:
            groups = connection.xinfo_groups(keys.stream(shard))
        except redis.ResponseError:  # no such stream: nothing waits in it
            continue
        for group in groups:
            if as_text(group["name"]) == keys.DISPATCH_GROUP and (group.get("lag") or group["pending"]):
                return False
    for pool in ("log", "facts", "index"):
        queue = pool_queue(pool, connection)
        if queue.count or queue.started_job_registry.count:
            return False
    pipe = connection.pipeline(transaction=False)
    for project in projects:
        for head in (keys.log_head(project), keys.index_head(project), keys.facts_head(project)):
            pipe.hget(head, "seq")
    seqs = [int(raw or 0) for raw in pipe.execute()]
    return all(seqs[i] <= min(seqs[i + 1], seqs[i + 2]) for i in range(0, len(seqs), 3))


def found(search: HybridSearch, key: tuple[str, str], tracked: Tracked) -> bool:
    """Whether a search for the fact's words, facts only (any status), returns the fact `key` names."""
    project, wanted = key
    hits = search.search(
        project,
        tracked.query,
        k=SEARCH_K,
        kinds=("fact",),
        fact_types=(tracked.type,),
        tiers=("task", "project"),
        statuses=ALL_STATUSES,
    )
    return any(isinstance(h, FactHit) and h.fact_id == wanted for h in hits)


def watching(
    tracked: Sequence[Tracked], suffixes: Sequence[str], sample: int
) -> tuple[dict[tuple[str, str], list[tuple[tuple[str, str], Tracked]]], int, int]:
    """Every `stride`-th tracked fact of the renamed sessions, by the minute first stating it; stride; how many."""
    wanted = [(s, t) for s in suffixes for t in tracked]
    stride = max(1, math.ceil(len(wanted) / sample))
    watch: dict[tuple[str, str], list[tuple[tuple[str, str], Tracked]]] = {}
    for suffix, t in wanted[::stride]:
        minute = (f"{t.project_id}-{suffix}", renamed_id(t.first_minute, suffix))
        watch.setdefault(minute, []).append((t.key_in(suffix), t))
    return watch, stride, len(wanted)


def offer(session: FactSession, tracked: Sequence[Tracked], prefix: str, repeats: int, sample: int) -> Offer:
    """The session renamed `repeats` times (`<prefix>1`, ...), and a sample of its facts to watch."""
    suffixes = [f"{prefix}{i}" for i in range(1, repeats + 1)]
    watch, stride, total = watching(tracked, suffixes, sample)
    return Offer([m for s in suffixes for m in renamed(session.minutes, s)], watch, stride, total)


def searchable_latency(
    session: FactSession,
    tracked: Sequence[Tracked],
    rate: float,
    repeats: int,
    sample: int,
    drain_s: float,
    progress: Progress,
) -> dict[str, Any]:
    """Time fact searchability in the running pipeline, twice: the session offered at `rate` (renamed, `repeats`
    times), which measures the pipeline's max load when it cannot keep up; then offered again (renamed anew)
    at `OFFERED_SHARE` of that max."""
    first, then = offer(session, tracked, "s", repeats, sample), offer(session, tracked, "h", repeats, sample)
    first_project = session.minutes[0].project_id
    warm_originals = [m for m in session.minutes if m.project_id == first_project][:WARMUP_MINUTES]
    warm = renamed(warm_originals, "w")
    warm_ids = {m.id for m in warm_originals}
    warm_facts, _, _ = watching(
        [t for t in tracked if t.project_id == first_project and t.first_minute in warm_ids], ["w"], 10**9
    )
    with temp_home("facts-searchable") as home, environment(home):
        stack = Stack(home, api_port=None)
        live = stack.start()
        driver = Driver(live, f"bench-facts-index-{os.getpid()}", stack, progress)
        try:
            with environment(live):
                thread = threading.Thread(
                    target=driver.run, args=(warm, warm_facts, first, then, rate, drain_s), daemon=True
                )
                handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
                thread.start()
                try:
                    run_worker(["index"], live, name=driver.worker)  # the index owner, as `pvm serve` runs it
                finally:
                    driver.done.set()
                    for s, h in handlers.items():
                        signal.signal(s, h)
                    thread.join(30)
                    close_shared()
        finally:
            stack.stop()
    error = driver.seen.error
    if error is not None:
        if isinstance(error, BenchError | KeyboardInterrupt):
            raise error
        raise BenchError(f"searchable: {type(error).__name__}: {error}") from error
    assert driver.half_rate is not None
    at_first = latency_result(driver.seen, first, rate)
    most = driver.seen.pipeline_per_s(len(first.minutes))
    return {
        **latency_result(driver.half, then, driver.half_rate),
        "pipeline_max_per_s": round(most) if most else None,
        "pipeline_saturated": bool(most and at_first["offered_per_s"] and at_first["offered_per_s"] > 1.1 * most),
        "at_first_rate": at_first,
        "basis": (
            f"the session offered at {OFFERED_SHARE:.0%} of facts_per_s (at_first_rate) gives the pipeline's max: "
            "its minutes / seconds from the first emit until streams, queues and heads were done with all of it; "
            f"fact_searchable_* are of a second offer, renamed anew, at {OFFERED_SHARE:.0%} of that max"
        ),
    }


def latency_result(seen: Searchability, offered: Offer, rate: float) -> dict[str, Any]:
    """Percentiles of emit -> searchable; facts never found count with the time waited for them (censored)."""
    ms = [(seen.found[k] - at) * 1000 for k, at in seen.emitted.items() if k in seen.found]
    end = seen.gave_up_at or time.time()
    censored = [(end - at) * 1000 for k, at in seen.emitted.items() if k not in seen.found]
    ms = sorted(ms + censored)
    if not ms:
        raise BenchError("searchable: no tracked fact was emitted")
    rounds = sorted(seen.rounds)
    return {
        "fact_searchable_p50_ms": round(percentile(ms, 50), 1),
        "fact_searchable_p90_ms": round(percentile(ms, 90), 1),
        "fact_searchable_p99_ms": round(percentile(ms, 99), 1),
        "fact_searchable_max_ms": round(ms[-1], 1),
        "facts_timed": len(ms),
        "facts_censored": len(censored),
        "facts_polled": offered.polled,
        "facts_stored_in_the_sessions": offered.stored,
        "sample_stride": offered.stride,
        "minutes_offered": len(offered.minutes),
        "offered_target_per_s": round(rate),
        "offered_per_s": round(len(offered.minutes) / seen.offered_s) if seen.offered_s else None,
        "poll_round_p50_ms": round(percentile(rounds, 50) * 1000, 1) if rounds else None,
        "poll_round_p99_ms": round(percentile(rounds, 99) * 1000, 1) if rounds else None,
    }


# -- the run --------------------------------------------------------------------------------------


def metric_table(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each targeted metric as {"value", "target", "met"} (met None when there is no value)."""
    met = verdicts(values, TARGETS)
    texts = target_texts(TARGETS)
    return {k: {"value": values.get(k), "target": texts[k], "met": met[k]} for k in TARGETS}


def run_split(split: str, seed: int, scale: float, llm_server: Any, progress: Progress) -> dict[str, Any]:
    load_before = os.getloadavg()
    projects = max(1, min(PROJECTS, round(PROJECTS * scale)))
    session = fact_session(split, seed, projects=projects)
    repeats = max(1, round(TIMING_REPEATS * scale))
    progress.start(f"{split}: pool", f"{len(session.minutes):,} labeled minutes, then {repeats} timing repeat(s)")
    pool = run_pool(session, repeats, progress)
    values, counts = quality(session, pool)
    values["facts_per_s"] = round(pool.facts_per_s)
    throughput = {
        "minutes": pool.minutes,
        "change_minutes": pool.change_minutes,
        "batches": pool.batches,
        "seconds_minutes": round(pool.minute_seconds, 6),
        "seconds_change_minutes": round(pool.change_seconds, 6),
        "facts_per_s_without_returning_changes": round(pool.minutes / pool.minute_seconds),
        "cpu_seconds": round(pool.cpu_seconds, 6),
        "facts_per_cpu_s": round(pool.minutes / pool.cpu_seconds) if pool.cpu_seconds else None,
        "basis": "session minutes / seconds inside facts_batch (their returning change minutes included)",
    }
    progress.tick(f"facts_per_s {values['facts_per_s']:,}", force=True)

    tracked = trackable(session, pool)
    rate = OFFERED_SHARE * pool.facts_per_s
    latency_repeats = max(1, round(SEARCHABLE_REPEATS * scale))
    progress.start(
        f"{split}: searchable",
        f"{latency_repeats} session(s) offered at {rate:,.0f} minutes/s to the running pipeline, then as many at "
        f"{OFFERED_SHARE:.0%} of the max it measures; polling about "
        f"{min(len(tracked) * latency_repeats, max(1, round(SEARCHABLE_SAMPLE * scale)))} facts in each",
    )
    latency = searchable_latency(
        session,
        tracked,
        rate,
        latency_repeats,
        max(1, round(SEARCHABLE_SAMPLE * scale)),
        max(20.0, DRAIN_S * scale),
        progress,
    )
    values["fact_searchable_p99_ms"] = latency["fact_searchable_p99_ms"]

    progress.start(f"{split}: llm", "the LLM extractor against the scripted server")
    from bench.facts_llm import calls_per_100_minutes

    llm = calls_per_100_minutes(session, llm_server, defaults.FANOUT_BATCH_SIZE)
    if llm["fallbacks"] or llm["calls"] != llm["chunks"]:
        raise BenchError(f"llm: a call failed against the scripted server: {llm}")
    values["llm_calls_per_100_minutes"] = llm["llm_calls_per_100_minutes"]
    return {
        "metrics": metric_table(values),
        "counts": counts,
        "session": summary(session),
        "throughput": throughput,
        "searchable": latency,
        "llm": llm,
        "machine": split_machine(load_before),
    }


def split_machine(load_before: tuple[float, float, float]) -> dict[str, Any]:
    """This machine, with its load averages before and after a split (others sharing the cores show here)."""
    box = machine()
    box["load_average_before"] = [round(x, 2) for x in load_before]
    box["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return box


def run(
    splits: Sequence[str], seed: int, scale: float, progress: Progress, prose_extractor: Any = None
) -> dict[str, Any]:
    from bench import prose_facts
    from tests.openai_server import OpenAIServer  # the tests' server: scripted answers over real HTTP

    results: dict[str, Any] = {}
    generated = [s for s in splits if s != "prose"]
    if generated:
        server = OpenAIServer().start()
        try:
            results = {split: run_split(split, seed, scale, server, progress) for split in generated}
        finally:
            server.stop()
    notes: list[str] = []
    if "prose" in splits:
        repeats = max(1, round(prose_facts.TIMING_REPEATS * scale))
        prose = prose_facts.run_split(progress, repeats=repeats, extractor=prose_extractor)
        if "skipped" in prose:
            notes.append(f"prose split skipped: {prose['skipped']}")
        else:
            results["prose"] = prose
    return {
        "benchmark": "facts",
        "seed": seed,
        "splits": results,
        "met": {s: {k: v["met"] for k, v in r["metrics"].items() if v["met"] is not None} for s, r in results.items()},
        "targets": {**target_texts(TARGETS), **target_texts(prose_facts.TARGETS)},
        "skipped": notes,
        "config": {
            "minutes_scale": scale,
            "projects": max(1, min(PROJECTS, round(PROJECTS * scale))),
            "labeled_set_full": scale >= 1.0,
            "batch": defaults.FANOUT_BATCH_SIZE,
            "promote_at": Settings.from_env({}).fact_promote_at,
            "extractor": "rules (RuleExtractor); LLM only in the llm phase",
            "offered_share_of_facts_per_s": OFFERED_SHARE,
            "searchable_basis": "emit of a fact's first source minute -> the first search (kinds=fact) that returns it",
        },
    }


def table(result: dict[str, Any]) -> str:
    splits = list(result["splits"])
    lines = [f"{'METRIC':<32}{'TARGET':<12}" + "".join(f"{s:>18}" for s in splits)]
    metrics = {k: None for r in result["splits"].values() for k in r["metrics"]}
    for key in metrics:
        target = next((r["metrics"][key]["target"] for r in result["splits"].values() if key in r["metrics"]), None)
        row = f"{key:<32}{target or '':<12}"
        for s in splits:
            cell = result["splits"][s]["metrics"].get(key)
            row += f"{'':>18}" if cell is None else f"{_fmt(cell['value']):>10} {VERDICT_WORDS[cell['met']]:>7}"
        lines.append(row)
    notes = [*(result.get("skipped") or []), *(result.get("notes") or [])]
    lines += [
        "",
        *(f"note: {n}" for n in notes),
        footer(result, f"seed {result['seed']}, scale {result['config']['minutes_scale']}", server=False),
    ]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(
        "bench/facts.py",
        __doc__,
        epilog=(
            f"Counts at scale 1.0: the {PROJECTS}-project session, {TIMING_REPEATS} timing repeats, "
            f"{SEARCHABLE_REPEATS} sessions offered to the pipeline, {SEARCHABLE_SAMPLE} facts polled. "
            "Progress goes to stderr; the result (a JSON object with --json) to stdout. Exit status 0 when every "
            "phase measured (targets missed or not), 1 when a phase failed, 130 on Ctrl-C."
        ),
    )
    parser.add_argument(
        "--split",
        choices=SPLIT_CHOICES,
        default="all",
        help="which set: the generated session's default or held-out phrasing, the hand-worded prose set "
        "(../shared/data/prose_facts; skipped with a note where absent), both generated, or all (default)",
    )
    parser.add_argument("--seed", type=int, default=SEED, help="the labeled session's seed (default %(default)s)")
    add_minutes_scale(
        parser,
        "multiply the repeats, the facts polled and the drain wait by X; below 1 the session also has fewer "
        "projects (round(6 X), at least 1): a quick run, not the labeled set (default 1.0)",
    )
    parser.add_argument(
        "--note", action="append", default=[], metavar="TEXT", help="a note to keep in the result (repeatable)"
    )
    parser.add_argument(
        "--llm",
        action="store_true",
        help="the prose split through the LLM extractor your PVM_LLM_* name (the rules its fallback), not the rules; "
        "an error when PVM_LLM_MODEL is unset",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a bounded smoke run: --minutes-scale {QUICK_SCALE} (one project, one timing repeat; not the full set)",
    )
    args = parse(parser, argv)
    scale = min(args.minutes_scale, QUICK_SCALE) if args.quick else args.minutes_scale
    splits = {"both": list(SPLITS), "all": [*SPLITS, "prose"]}.get(args.split, [args.split])
    progress = Progress()
    started = time.monotonic()
    load_before = os.getloadavg()
    with measuring("facts bench", "interrupted; processes and Valkey stopped") as outcome:
        from bench.prose_facts import llm_extractor

        prose_extractor = llm_extractor(os.environ) if args.llm else None
        result = run(splits, args.seed, scale, progress, prose_extractor)
    if outcome.exit_code is not None:
        return outcome.exit_code
    box = split_machine(load_before)
    result["notes"] = list(args.note)
    return report(result, started, args.json, table, box)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Evaluate-pool benchmark: memories scored per second, prune precision and recall, context latency with scores.

1. evaluate_per_s   the evaluate pool's judging core (`evaluate_pool.judge_minutes`: scores, contradictions,
                    near-duplicates, prune decisions) over generated minutes in slices of PVM_EVALUATE_SLICE,
                    newest slice first with the carry between slices, in one process.
                                                        target: 100k in <= 10 s (>= 10,000/s)
2. prune            a planted set (`planted`): minutes that should stay (used, referenced, of tasks that
                    succeeded, or within the grace period) and minutes that should go: stale (old, never read,
                    never referenced), near-duplicates of kept minutes (paraphrases: words dropped, swapped,
                    added) and superseded ones (a later minute corrects them). What a run prunes or merges away
                    is compared with what was planted: prune_precision, prune_recall.
                                                        target: >= 0.9 each
                    The near-duplicate threshold is measured here: `dedupe_sweep` is precision and recall of the
                    merges alone at each threshold on a tuning seed, and `dedupe_heldout` the chosen default
                    (PVM_DEDUPE_AT) on another seed. `dedupe_across_pages`: on pages of ACROSS_SLICE, the
                    planted duplicates a page or more from their original, merged within a page only (before)
                    and with the run's candidate index (after; workers/evaluate/candidate_index.py).
3. context          bench/reader.py's load (the log pool's and index pool's steps, one process) to N minutes,
                    `ContextReader.build_context` p99 (``..._before_evaluation``), then a real evaluation run
                    over them (`evaluate_here`, applying: scores written onto every point, prunes), then
                    build_context p99 again with the scores present: both under the same load of the machine.
                    evaluate_end_to_end_per_s is that run's memories / s (log, Redis, engine writes included).
                                                        target: context_p99_ms_100k <= 10

    .venv/bin/python bench/lifecycle_evaluate.py --json
    .venv/bin/python bench/lifecycle_evaluate.py --quick      # seconds: a test runs it
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import BenchError, Progress, argument_parser, parse, report, target_texts, verdicts, workspace
from bench.machine import machine
from contracts import Minute
from contracts.facts import Fact, FactStatus, FactType, TierKey
from pvm import defaults, engines
from pvm.reader import ContextReader
from pvm.stores.fact_projection import StoredFact
from pvm.stores.log import LogReader
from workers.evaluate import pool as evaluate_pool
from workers.evaluate.candidate_index import CandidateIndex
from workers.evaluate.evaluation import ScorePolicy
from workers.evaluate.pool import Carry, SliceMinute
from workers.rules.assessment import timestamp_ms
from workers.runtime.collector import cyclic_gc_paused

TARGETS: dict[str, tuple[Any, ...]] = {
    "evaluate_per_s": (">=", 10_000.0),
    "prune_precision": (">=", 0.9),
    "prune_recall": (">=", 0.9),
    "context_p99_ms_100k": ("<=", 10.0),
}
PROJECT = "lifecycle"
DAY = timedelta(days=1)
THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
PARAPHRASED: dict[str, str] = {}  # a planted duplicate's id -> the id of the minute it paraphrases
ACROSS_SLICE = 500  # pages of the dedupe-across-pages figure: small, so many duplicates sit a page or more away
TUNE_SEED, HELDOUT_SEED = 11, 23


# -- the planted set --------------------------------------------------------------------------------------------


def _vocabulary(rng: random.Random, n: int) -> list[str]:
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    out: set[str] = set()
    while len(out) < n:
        out.add("".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.randint(2, 3))))
    return sorted(out)


def planted(n: int, seed: int, now: datetime) -> tuple[list[SliceMinute], dict[str, int], dict[str, str]]:
    """`n` minutes in log order, their read counts, and the planted ones: id -> stale | duplicate | superseded.

    The original a duplicate paraphrases is in `PARAPHRASED` (duplicate id -> original id).

    About 70% should stay: minutes of tasks that succeeded, read 3-10 times or within the grace period, some
    referenced by later ones. The rest should go: 15% stale (chatter of no task, 20-120 days old, never read or
    cited), 10% near-duplicates of kept minutes (paraphrased: 1-3 of 10-14 words dropped, swapped or added,
    fewer reads), 5% decisions a later minute corrects.
    """
    rng = random.Random(seed)
    vocabulary = _vocabulary(rng, 4000)
    tasks = [f"task-{i}" for i in range(max(1, n // 40))]
    task_words = {t: rng.sample(vocabulary, 3) for t in tasks}
    events: list[tuple[float, Minute, int]] = []  # (days ago, minute, reads)
    planted_ids: dict[str, str] = {}
    kept_notes: list[tuple[str, str, float, str]] = []  # (task, note, days ago, id)
    counter = 0

    def new_id() -> str:
        nonlocal counter
        counter += 1
        return f"m{seed}-{counter:07d}"

    def note(task: str) -> str:
        return " ".join(task_words[task] + rng.sample(vocabulary, rng.randint(7, 11)))

    def stamp(days_ago: float) -> str:
        return (now - days_ago * DAY).isoformat(timespec="microseconds").replace("+00:00", "Z")

    while len(events) < n:
        roll = rng.random()
        task = rng.choice(tasks)
        if roll < 0.70:
            days = rng.uniform(0, 90)
            kind = rng.random()
            if kind < 0.2:
                m = Minute(
                    project_id=PROJECT,
                    event_type="task_completed",
                    id=new_id(),
                    timestamp=stamp(days),
                    agent_id=f"agent-{rng.randint(1, 8)}",
                    data={"task_id": task, "success_criteria_met": rng.randint(70, 100)},
                    memory_note=note(task),
                )
            else:
                refs = tuple(i for _, _, _, i in rng.sample(kept_notes, min(len(kept_notes), rng.randint(0, 2))))
                m = Minute(
                    project_id=PROJECT,
                    event_type="message",
                    id=new_id(),
                    timestamp=stamp(days),
                    agent_id=f"agent-{rng.randint(1, 8)}",
                    data={"task_id": task},
                    memory_note=note(task),
                    context_references=refs,
                )
            read = rng.randint(3, 10) if days > defaults.PRUNE_GRACE_S / 86400 else rng.randint(0, 10)
            events.append((days, m, read))
            if m.event_type == "message":
                kept_notes.append((task, m.memory_note or "", days, m.id))
        elif roll < 0.85:
            days = rng.uniform(20, 120)
            m = Minute(  # chatter of no task: nobody read it, nobody cited it
                project_id=PROJECT,
                event_type="message",
                id=new_id(),
                timestamp=stamp(days),
                agent_id=f"agent-{rng.randint(1, 8)}",
                memory_note=note(task),
            )
            events.append((days, m, 0))
            planted_ids[m.id] = "stale"
        elif roll < 0.95 and kept_notes:
            original_task, text, original_days, original_id = rng.choice(kept_notes)
            words = text.split()
            for _ in range(rng.randint(1, 3)):
                op = rng.random()
                if op < 0.4 and len(words) > 6:
                    words.pop(rng.randrange(len(words)))
                elif op < 0.8:
                    words[rng.randrange(len(words))] = rng.choice(vocabulary)
                else:
                    words.insert(rng.randrange(len(words) + 1), rng.choice(vocabulary))
            days = max(0.0, original_days + rng.uniform(-2, 2))
            m = Minute(
                project_id=PROJECT,
                event_type="message",
                id=new_id(),
                timestamp=stamp(days),
                agent_id=f"agent-{rng.randint(1, 8)}",
                data={"task_id": original_task},
                memory_note=" ".join(words),
            )
            events.append((days, m, rng.randint(0, 1)))
            planted_ids[m.id] = "duplicate"
            PARAPHRASED[m.id] = original_id
        else:
            days = rng.uniform(20, 80)
            wrong = Minute(
                project_id=PROJECT,
                event_type="decision",
                id=new_id(),
                timestamp=stamp(days),
                agent_id=f"agent-{rng.randint(1, 8)}",
                data={"task_id": task},
                memory_note=note(task),
            )
            fix = Minute(
                project_id=PROJECT,
                event_type="correction",
                id=new_id(),
                timestamp=stamp(max(0.0, days - rng.uniform(1, 10))),
                agent_id=f"agent-{rng.randint(1, 8)}",
                data={"task_id": task, "corrects": wrong.id},
                memory_note=note(task),
            )
            events.append((days, wrong, 0))
            events.append((max(0.0, days - 5), fix, rng.randint(3, 10)))
            planted_ids[wrong.id] = "superseded"
    events.sort(key=lambda e: -e[0])  # log order: oldest first
    minutes = [SliceMinute(seq, m, timestamp_ms(m)) for seq, (_, m, _) in enumerate(events, start=1)]
    read_counts = {m.id: r for _, m, r in events if r}
    return minutes, read_counts, planted_ids


def judge_all(
    minutes: Sequence[SliceMinute],
    reads: dict[str, int],
    now_ms: int,
    policy: ScorePolicy,
    slice_size: int,
    across: bool = True,
) -> tuple[set[str], set[str], int]:
    """A run of the judging core over every slice, newest first: (pruned for their score, merged away, scored).

    `across`: with the run's candidate index (in memory), as the pool runs; without it, dedupe within a slice
    only (the pool before it had one).
    """
    carry = Carry()
    index = CandidateIndex() if across else None
    pruned: set[str] = set()
    merged: set[str] = set()
    scored = 0
    for high in range(len(minutes), 0, -slice_size):
        part = minutes[max(0, high - slice_size) : high]
        # What the carry holds for this slice, as the pool reads its scratch (only this slice's ids and tasks);
        # the collector paused per slice, as the pool's slice job pauses it.
        with cyclic_gc_paused():
            verdict, carry = evaluate_pool.judge_minutes(part, carry, reads, frozenset(), now_ms, policy, index=index)
            if index is not None:
                gone = [i for i in verdict.elsewhere if i in verdict.pruned]
                index.file(verdict.filed, evaluate_pool.survivors_elsewhere(verdict), gone)
        scored += len(verdict.scores)
        for memory_id, why in verdict.pruned.items():
            (merged if why["why"] == "merged" else pruned).add(memory_id)
    return pruned, merged, scored


def dedupe_across_pages(n: int, now: datetime) -> dict[str, Any]:
    """Planted duplicates whose original sits on another page (pages of `ACROSS_SLICE`): merged before and after.

    Before: dedupe within a page only (no candidate index). After: the pool's run, with it. Recall over the
    duplicates a page or more away from their original, and over all; precision of all merges (held-out seed).
    """
    now_ms = int(now.timestamp() * 1000)
    minutes, reads, planted_ids = planted(n, HELDOUT_SEED, now)
    page = {m.minute.id: (len(minutes) - m.seq) // ACROSS_SLICE for m in minutes}  # pages go newest first
    duplicates = {i for i, why in planted_ids.items() if why == "duplicate"}
    apart = {i for i in duplicates if page[i] != page[PARAPHRASED[i]]}
    out: dict[str, Any] = {"slice": ACROSS_SLICE, "duplicates": len(duplicates), "on_another_page": len(apart)}
    for label, across in (("before", False), ("after", True)):
        started = time.perf_counter()
        _, merged, scored = judge_all(minutes, reads, now_ms, ScorePolicy(), ACROSS_SLICE, across)
        seconds = time.perf_counter() - started
        precision, recall = _precision_recall(merged, duplicates)
        out[label] = {
            "recall_across_pages": round(len(merged & apart) / max(1, len(apart)), 4),
            "recall": round(recall, 4),
            "precision": round(precision, 4),
            "judged_per_s": round(scored / seconds),
        }
    return {"dedupe_across_pages": out}


def _precision_recall(predicted: set[str], actual: set[str]) -> tuple[float, float]:
    hit = len(predicted & actual)
    return (hit / len(predicted) if predicted else 1.0), (hit / len(actual) if actual else 1.0)


def prune_quality(n: int, now: datetime) -> dict[str, Any]:
    """Precision and recall of a run on the planted set; the dedupe threshold swept on one seed, held out on another."""
    now_ms = int(now.timestamp() * 1000)
    sweep = []
    minutes, reads, planted_ids = planted(n, TUNE_SEED, now)
    duplicates = {i for i, why in planted_ids.items() if why == "duplicate"}
    for threshold in THRESHOLDS:
        _, merged, _ = judge_all(minutes, reads, now_ms, ScorePolicy(dedupe_at=threshold), defaults.EVALUATE_SLICE)
        precision, recall = _precision_recall(merged, duplicates)
        sweep.append({"threshold": threshold, "precision": round(precision, 4), "recall": round(recall, 4)})
    minutes, reads, planted_ids = planted(n, HELDOUT_SEED, now)
    pruned, merged, _ = judge_all(minutes, reads, now_ms, ScorePolicy(), defaults.EVALUATE_SLICE)
    precision, recall = _precision_recall(pruned | merged, set(planted_ids))
    by_kind = {}
    for kind in ("stale", "duplicate", "superseded"):
        planted_kind = {i for i, why in planted_ids.items() if why == kind}
        by_kind[kind] = round(len(planted_kind & (pruned | merged)) / max(1, len(planted_kind)), 4)
    duplicates = {i for i, why in planted_ids.items() if why == "duplicate"}
    dedupe_precision, dedupe_recall = _precision_recall(merged, duplicates)
    return {
        "prune_precision": round(precision, 4),
        "prune_recall": round(recall, 4),
        "prune_recall_by_kind": by_kind,
        "planted": {"minutes": len(minutes), "to_go": len(planted_ids), "predicted": len(pruned | merged)},
        "dedupe_sweep": sweep,
        "dedupe_heldout": {
            "threshold": defaults.DEDUPE_AT,
            "precision": round(dedupe_precision, 4),
            "recall": round(dedupe_recall, 4),
        },
    }


# -- fact near-duplicates -----------------------------------------------------------------------------------------

FACT_THRESHOLDS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
ADJECTIVES = ("primary", "managed", "shared", "new", "main", "internal")
UNITS = (("s", "seconds"), ("ms", "milliseconds"), ("MB", "megabytes"), ("GB", "gigabytes"), ("h", "hours"))
NUMBERS = ("2", "3", "5", "8", "15", "30", "64", "512")


def planted_facts(n: int, seed: int, now: datetime) -> tuple[list[StoredFact], dict[str, tuple[int, int]], set[str]]:
    """About `n` current facts of one project tier: (facts, reads, the ids that should merge away).

    Groups of one slot (or one value): a base fact (read three times, so it is the best scored) with reworded
    near-duplicates of it, planted to merge away: case, an article, word order, a unit spelled out, an extra
    adjective, a near-equal subject ("<s>" / "the <s> api"); and distinct facts that look alike, planted to stay:
    another value one word apart, the value with two more words (a different value that holds this one's words:
    only the threshold keeps it), another number, another subject one word apart with the same value, and
    constraints (multi-valued) one word apart.
    """
    rng = random.Random(seed)
    words = _vocabulary(rng, 400)
    tier = TierKey.for_project(PROJECT)
    recorded = (now - DAY).isoformat(timespec="microseconds").replace("+00:00", "Z")
    facts: list[StoredFact] = []
    reads: dict[str, tuple[int, int]] = {}
    duplicates: set[str] = set()
    seen: set[str] = set()

    def add(fact_type: FactType, subject: str, attribute: str, value: str, why: str) -> None:
        fact = Fact.new(
            type=fact_type,
            text=f"{subject} {attribute}: {value}",
            subject=subject,
            attribute=attribute,
            value=value,
            tier_key=tier,
            confidence=0.9,
            source_minute_ids=(f"m{len(facts)}",),
            status=FactStatus.PROMOTED,
            recorded_at=recorded,
        )
        if fact.id in seen:  # a rewording identity already folds (same normalized value): not a dedupe case
            return
        seen.add(fact.id)
        facts.append(StoredFact(fact, {}, "0", None))
        if why == "base":
            reads[fact.id] = (3, int(now.timestamp() * 1000))
        elif why == "duplicate":
            duplicates.add(fact.id)

    while len(facts) < n:
        subject = f"{rng.choice(words)} service"
        kind = rng.random()
        if kind < 0.4:  # a named value in a single-valued slot
            a, b = rng.sample(words, 2)
            value = f"{a} {b}"
            add(FactType.FACT, subject, "database", value, "base")
            add(FactType.FACT, subject, "database", value.upper(), "duplicate")
            add(FactType.FACT, subject, "database", f"the {value}", "duplicate")
            add(FactType.FACT, subject, "database", f"{b} {a}", "duplicate")
            add(FactType.FACT, subject, "database", f"{rng.choice(ADJECTIVES)} {value}", "duplicate")
            add(FactType.FACT, f"the {subject} api", "database", value, "duplicate")
            add(FactType.FACT, subject, "database", f"{a} {rng.choice(words)}", "distinct")
            add(FactType.FACT, subject, "database", f"{value} {rng.choice(words)} {rng.choice(words)}", "distinct")
            add(FactType.FACT, f"{rng.choice(words)} service", "database", value, "distinct")
        elif kind < 0.7:  # a number with a unit
            number, (short, long) = rng.choice(NUMBERS), rng.choice(UNITS)
            attribute = f"{rng.choice(words)} limit"
            add(FactType.FACT, subject, attribute, f"{number} {short}", "base")
            add(FactType.FACT, subject, attribute, f"{number} {long}", "duplicate")
            add(FactType.FACT, subject, attribute, f"{number}{short}", "duplicate")
            other = rng.choice([x for x in NUMBERS if x != number])
            add(FactType.FACT, subject, attribute, f"{other} {short}", "distinct")
        else:  # constraints: many values per slot, near-duplicates only when the values are near-equal
            verb, noun, day = rng.sample(words, 3)
            value = f"never {verb} {noun} on {day}"
            add(FactType.CONSTRAINT, subject, "rule", value, "base")
            add(FactType.CONSTRAINT, subject, "rule", f"Never {verb} the {noun} on {day}.", "duplicate")
            add(FactType.CONSTRAINT, subject, "rule", f"never {verb} {noun} on {rng.choice(words)}", "distinct")
            add(FactType.CONSTRAINT, subject, "rule", f"always {verb} {noun} on {day}", "distinct")
    return facts, reads, duplicates


def fact_merges(facts: Sequence[StoredFact], reads: dict[str, tuple[int, int]], now_ms: int, at: float) -> set[str]:
    verdict = evaluate_pool.judge_facts(facts, reads, frozenset(), now_ms, ScorePolicy(fact_dedupe_at=at))
    return {i for i, why in verdict.pruned.items() if why["why"] == "merged"}


def fact_dedupe_quality(n: int, now: datetime) -> dict[str, Any]:
    """Precision and recall of fact merges: the threshold swept on one seed, the default held out on another."""
    now_ms = int(now.timestamp() * 1000)
    facts, reads, duplicates = planted_facts(n, TUNE_SEED, now)
    sweep = []
    for threshold in FACT_THRESHOLDS:
        precision, recall = _precision_recall(fact_merges(facts, reads, now_ms, threshold), duplicates)
        sweep.append({"threshold": threshold, "precision": round(precision, 4), "recall": round(recall, 4)})
    facts, reads, duplicates = planted_facts(n, HELDOUT_SEED, now)
    precision, recall = _precision_recall(fact_merges(facts, reads, now_ms, defaults.FACT_DEDUPE_AT), duplicates)
    return {
        "fact_dedupe_planted": {"facts": len(facts), "duplicates": len(duplicates)},
        "fact_dedupe_sweep": sweep,
        "fact_dedupe_heldout": {
            "threshold": defaults.FACT_DEDUPE_AT,
            "precision": round(precision, 4),
            "recall": round(recall, 4),
        },
    }


def evaluate_speed(n: int, now: datetime) -> dict[str, Any]:
    """Memories judged per second by the core, one process, slices of PVM_EVALUATE_SLICE."""
    minutes, reads, _ = planted(n, 5, now)
    now_ms = int(now.timestamp() * 1000)
    started = time.perf_counter()
    _, _, scored = judge_all(minutes, reads, now_ms, ScorePolicy(), defaults.EVALUATE_SLICE)
    seconds = time.perf_counter() - started
    return {"evaluate_per_s": round(scored / seconds), "evaluate_memories": scored, "evaluate_s": round(seconds, 3)}


def thread_contexts(
    reader: ContextReader, threads: Sequence[str], calls: int, seed: int, label: str, progress: Progress
) -> dict[str, Any]:
    """build_context latency for one thread at a time (its newest minutes, chunk summaries and episodes read)."""
    from bench import reader as reader_bench
    from bench.sessions import AGENTS, task_texts

    rng = random.Random(seed)
    tasks = task_texts(rng, calls + reader_bench.WARMUP_CALLS)
    chosen = [(rng.choice(AGENTS), t, rng.choice(threads)) for t in tasks]
    contexts = [
        (
            lambda a=a, t=t, th=th: reader.build_context(
                reader_bench.MAIN_PROJECT, a, task=t, budget_tokens=reader_bench.BUDGET_TOKENS, thread=th
            )
        )
        for a, t, th in chosen
    ]
    for call in contexts[: reader_bench.WARMUP_CALLS]:
        call()
    progress.tick(f"{label}: timing {calls:,} build_context calls in a thread", force=True)
    cpu: list[float] = []
    timed = reader_bench.timed_calls(contexts[reader_bench.WARMUP_CALLS :], cpu)
    sample = contexts[0]()
    out = {
        f"context_thread_p50_ms_{label}": round(reader_bench.percentile(timed, 50), 3),
        f"context_thread_p99_ms_{label}": round(reader_bench.percentile(timed, 99), 3),
        f"context_thread_reader_cpu_p99_ms_{label}": round(reader_bench.percentile(cpu, 99), 3),
        f"context_thread_sample_{label}": {
            "thread": chosen[0][2],
            "recent": len(sample.recent),
            "sections": dict(sample.budget.sections),
            "used_tokens": sample.budget.used_tokens,
        },
    }
    progress.tick(f"{label}: thread build_context p99 {out[f'context_thread_p99_ms_{label}']} ms", force=True)
    return out


def context_with_scores(n: int, calls: int, progress: Progress) -> dict[str, Any]:
    """bench/reader.py's load to `n` minutes, through the summarize pool too; an evaluation run over them; then
    build_context latency: plain (recent, facts, experience) and in a thread (chunk summaries and episodes read)."""
    from bench import reader as reader_bench
    from pvm.stores.summaries import SummaryStore
    from workers.summarize.pool import SummarizeContext, summarize_batch

    minutes = reader_bench.build_minutes(n, 3)
    out: dict[str, Any] = {}
    with workspace("lifecycle") as ws:
        loader = reader_bench.Loader(ws.settings, ws.connection)
        summarize = SummarizeContext.build(ws.connection, ws.settings)
        index = loader._index
        summarize_s = [0.0]

        def index_and_summarize(records: list[list[Any]]) -> None:  # the log pool fans out to both
            index(records)
            started = time.perf_counter()
            summarize_batch(summarize, ws.connection, records)
            summarize_s[0] += time.perf_counter() - started

        loader._index = index_and_summarize  # type: ignore[method-assign]
        try:
            reader = ContextReader(ws.connection, LogReader(ws.settings.log_dir), engines.searcher_for(ws.settings))  # type: ignore[arg-type]
            engine = engines.shared_engine(ws.settings)
            reader_bench.load(loader, reader_bench.Feed(iter(minutes)), n, progress)
            store = SummaryStore(ws.connection)
            every = store.threads(reader_bench.MAIN_PROJECT)
            chunks, episodes = store.counts(reader_bench.MAIN_PROJECT)
            # The timed thread contexts are of threads with chunk summaries: those read the most.
            threads = [str(t) for t in every if store.thread_view(reader_bench.MAIN_PROJECT, t, 0).chunks]
            out["summaries_present"] = {
                "threads": len(every),
                "threads_with_chunks": len(threads),
                "chunks": chunks,
                "episodes": episodes,
                "summarize_s": round(summarize_s[0], 2),
            }
            if not threads or not chunks:
                raise BenchError("the summarize pool made no chunks: the context would read no summaries")
            # The same reader before any evaluation, under the same load of the machine: what the scores cost.
            reader_bench.optimize(engine, "unscored", progress)
            before = reader_bench.measure(reader, calls, 5, "unscored", progress)
            progress.tick(f"evaluating {reader_bench.MAIN_PROJECT} ({n:,} minutes)", force=True)
            started = time.perf_counter()
            run = evaluate_pool.evaluate_here(
                ws.connection, ws.settings, reader_bench.MAIN_PROJECT, apply=True, engine=engine
            )
            seconds = time.perf_counter() - started
            out["evaluate_end_to_end_per_s"] = round(run.scored / seconds)
            out["evaluate_end_to_end"] = {"scored": run.scored, "pruned": len(run.pruned), "seconds": round(seconds, 2)}
            reader_bench.optimize(engine, "scored", progress)
            measured = reader_bench.measure(reader, calls, 5, "scored", progress)
            in_thread = thread_contexts(reader, threads, calls, 6, "scored", progress)
            label = reader_bench._label(n)
            # The target's figure: the slower of a plain context and one in a thread (summaries read), scores present.
            out[f"context_p99_ms_{label}"] = max(
                measured["context_p99_ms_scored"], in_thread["context_thread_p99_ms_scored"]
            )
            out[f"context_plain_p99_ms_{label}"] = measured["context_p99_ms_scored"]
            out[f"context_thread_p99_ms_{label}"] = in_thread["context_thread_p99_ms_scored"]
            out[f"context_thread_p50_ms_{label}"] = in_thread["context_thread_p50_ms_scored"]
            out["context_thread_sample"] = in_thread["context_thread_sample_scored"]
            out[f"context_p50_ms_{label}"] = measured["context_p50_ms_scored"]
            # Beside the wall-time target: the reader thread's own CPU per call (the slower kind of context).
            out[f"context_reader_cpu_p99_ms_{label}"] = max(
                measured["context_reader_cpu_p99_ms_scored"], in_thread["context_thread_reader_cpu_p99_ms_scored"]
            )
            out["context_load_avg"] = measured["load_avg_scored"]
            out[f"context_p99_ms_{label}_before_evaluation"] = before["context_p99_ms_unscored"]
            out[f"context_p50_ms_{label}_before_evaluation"] = before["context_p50_ms_unscored"]
            out["machine"] = machine(ws.connection)
        finally:
            engines.close_shared()
            loader.writer.close()
    return out


def run(quick: bool = False, progress: Progress | None = None) -> dict[str, Any]:
    """The benchmark's result: one dict (see the module docstring); `quick`: small sizes, seconds."""
    progress = progress or Progress("lifecycle-evaluate")
    now = datetime.now(UTC)
    speed_n, planted_n, context_n, calls = (5_000, 4_000, 2_000, 100) if quick else (100_000, 20_000, 100_000, 1_000)
    result: dict[str, Any] = {"quick": quick}
    progress.tick(f"judging {speed_n:,} generated memories", force=True)
    result.update(evaluate_speed(speed_n, now))
    progress.tick(f"prune precision and recall on {planted_n:,} planted minutes", force=True)
    result.update(prune_quality(planted_n, now))
    progress.tick(f"dedupe across pages of {ACROSS_SLICE} on {planted_n:,} planted minutes", force=True)
    result.update(dedupe_across_pages(planted_n, now))
    progress.tick(f"fact dedupe precision and recall on {planted_n // 4:,} planted facts", force=True)
    result.update(fact_dedupe_quality(planted_n // 4, now))
    result.update(context_with_scores(context_n, calls, progress))
    if quick:  # named as the full run's, so the lead's join reads one key
        result.setdefault("context_p99_ms_100k", None)
    result["targets"] = target_texts(TARGETS)
    result["verdicts"] = verdicts(result, TARGETS)
    return result


def table(result: dict[str, Any]) -> str:
    rows = [
        f"evaluate_per_s            {result['evaluate_per_s']:>10,}  (core; {result['evaluate_memories']:,} memories)",
        f"evaluate_end_to_end_per_s {result['evaluate_end_to_end_per_s']:>10,}",
        f"prune_precision           {result['prune_precision']:>10}",
        f"prune_recall              {result['prune_recall']:>10}  {result['prune_recall_by_kind']}",
        f"context_p99_ms_100k       {result.get('context_p99_ms_100k')!s:>10}",
        "dedupe sweep (threshold: precision / recall): "
        + ", ".join(f"{r['threshold']}: {r['precision']}/{r['recall']}" for r in result["dedupe_sweep"]),
        "dedupe across pages of {slice} ({on_another_page:,} of {duplicates:,} duplicates a page or more away): "
        "recall there {b[recall_across_pages]} -> {a[recall_across_pages]}, all {b[recall]} -> {a[recall]}, "
        "precision {b[precision]} -> {a[precision]}".format(
            **result["dedupe_across_pages"],
            b=result["dedupe_across_pages"]["before"],
            a=result["dedupe_across_pages"]["after"],
        ),
        "fact dedupe sweep (threshold: precision / recall): "
        + ", ".join(f"{r['threshold']}: {r['precision']}/{r['recall']}" for r in result["fact_dedupe_sweep"]),
        f"fact dedupe held out at {result['fact_dedupe_heldout']['threshold']}: "
        f"{result['fact_dedupe_heldout']['precision']} / {result['fact_dedupe_heldout']['recall']}",
    ]
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser: argparse.ArgumentParser = argument_parser("lifecycle_evaluate.py", __doc__ or "")
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds), for a test")
    args = parse(parser, argv)
    started = time.monotonic()
    result = run(args.quick, Progress("lifecycle-evaluate"))
    return report(result, started, args.json, table, result.get("machine"))


if __name__ == "__main__":
    raise SystemExit(main())

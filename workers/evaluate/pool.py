"""The evaluate pool: scores, dedupes, resolves and prunes a project's memories, one bounded slice per job.

Run by `pvm scheduler` (queue ``pvm-evaluate``), never by the log pool's
fan-out. The schedule's job (`plan`) starts a run for every project; a run is
a chain of slice jobs (`run_slice`), each evaluating at most
`PVM_EVALUATE_SLICE` log minutes (then facts), so a project of a million
memories is two hundred jobs, never one. Slices go from the newest minute to
the oldest: what a minute's score needs from later minutes (how often they
reference it, whether they correct it, how its task ended) is known by the
time its slice runs, carried between slices in the run's scratch hashes
(`keys.evaluation_scratch`). One run per project at a time (a lease,
invariant 8); projects run in parallel.

Each slice reads the log (the truth) and the reader's read counts, judges its
memories with the rules of `workers.evaluate.evaluation`, and writes what it decided:
the scores onto the vector points (ranking reads their composite) and into
Redis (`keys.evaluation_scores`); merges, conflicts and prunes into their
hashes and counters. A pruned or merged-away memory leaves the searches
(`VectorEngine.annotate` marks its point pruned; searches may opt in) and the
hot caches (recent windows, minutes by id; a fact leaves its tier's read set),
never the log: `pvm replay` re-indexes it and deletes these records.

A dry run (`pvm evaluate --dry-run`) runs the same slices in the calling
process and writes nothing but its own scratch, which it deletes.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import msgpack
import redis
from rq import Queue, get_current_job

from contracts import Minute, keys
from contracts.fact_changes import FACT_EVENT_TYPES
from contracts.facts import GLOBAL_KEY, Fact, FactStatus, Tier, TierKey
from contracts.memory import minute_line
from pvm import defaults
from pvm.config import Settings
from pvm.connection import bulk_reply, hash_reply
from pvm.metrics import MetricsRecorder, entry_time_ms
from pvm.protocols import FACT, VectorEngine
from pvm.reader import estimate_tokens
from pvm.stores.fact_projection import StoredFact, time_ms
from pvm.stores.log import LogReader
from pvm.vectors import GLOBAL_TENANT
from workers.evaluate import evaluation
from workers.evaluate.candidate_index import CandidateIndex
from workers.evaluate.evaluation import Judged, ScorePolicy, SliceVerdict, TaskOutcome
from workers.rules.assessment import stated_text, timestamp_ms
from workers.rules.fact_text import value_key
from workers.runtime.collector import cyclic_gc_paused
from workers.runtime.context import WorkerContext
from workers.runtime.queues import pool_job, pool_queue

log = logging.getLogger(__name__)

FULL = "full"  # score, resolve conflicts, merge near-duplicates, prune
RESCORE = "rescore"  # score and resolve conflicts only: what a replay runs, so what it restored stays
MODES = (FULL, RESCORE)
# A run's scratch hashes: later references and corrections by minute id, final outcomes by task, slices pushed.
# The run's candidate index for dedupe across pages (`workers.evaluate.candidate_index`): ``buckets`` and ``records``.
SCRATCH = ("refs", "corrections", "tasks", "pushed", "buckets", "records")
# The global tier's run: its facts, evaluated like a project's (no minutes: no project's log is the global tier's).
# Its records are kept under this name, the vector store's tenant of global facts (a name no project can have).
GLOBAL_RUN = GLOBAL_TENANT
# Which tiers of a facts hash a run judges: a project's run its project and task tiers, the global run the global.
_TIERS = {Tier.PROJECT: (Tier.PROJECT, Tier.TASK), Tier.GLOBAL: (Tier.GLOBAL,)}
MINUTES, FACTS = "minutes", "facts"  # the phases of a run: log slices newest first, then the facts (HSCAN pages)


# -- pure core -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SliceMinute:
    """A minute of the log as a slice sees it: its seq, the minute, its timestamp in Unix ms."""

    seq: int
    minute: Minute
    at_ms: int
    entry_ms: int | None = None  # its stream entry time, which freshness is measured from


@dataclass
class Carry:
    """What newer slices learned for older minutes: later references, corrections, and tasks' final outcomes."""

    references: dict[str, int] = field(default_factory=dict)
    corrections: dict[str, int] = field(default_factory=dict)
    tasks: dict[str, TaskOutcome] = field(default_factory=dict)


def judge_minutes(
    minutes: Sequence[SliceMinute],
    carry: Carry,
    reads: Mapping[str, int],
    skip: frozenset[str],
    now_ms: int,
    policy: ScorePolicy,
    mode: str = FULL,
    index: CandidateIndex | None = None,
) -> tuple[SliceVerdict, Carry]:
    """Judge one slice (`minutes` in log order); returns the verdict and what to carry to older slices.

    `carry` holds what newer slices learned (it is updated in place for the
    slice's own minutes); `reads` the reader's access counts; `skip` the
    minutes already pruned or merged (not judged again; their references
    still count). The returned `Carry` holds only what concerns minutes older
    than the slice. With the run's candidate `index` (full mode), the slice's
    memories also merge with their near-duplicates of the slices judged
    before, and `verdict.filed` lists what the caller files for the next ones.
    """
    in_slice = {m.minute.id for m in minutes}
    for m in reversed(minutes):  # the newest outcome of a task is its final one
        task_id = stated_text(m.minute.data.get("task_id"))
        if task_id and task_id not in carry.tasks:
            result = evaluation.task_outcome(m.minute)
            if result is not None:
                carry.tasks[task_id] = result
    older = Carry(tasks={})
    verdict = SliceVerdict()
    judged: list[Judged] = []
    for m in reversed(minutes):  # newest first: every later reference is counted before a minute is scored
        minute = m.minute
        if minute.event_type not in FACT_EVENT_TYPES and minute.id not in skip:
            task_id = stated_text(minute.data.get("task_id"))
            task = carry.tasks.get(task_id) if task_id else None
            scores = evaluation.minute_scores(
                minute,
                m.at_ms,
                now_ms,
                accesses=reads.get(minute.id, 0),
                later_references=carry.references.get(minute.id, 0),
                corrections=carry.corrections.get(minute.id, 0),
                task=task,
                weights=policy.weights,
            )
            verdict.scores[minute.id] = scores
            recommended = evaluation.recommended_action(minute)
            group = evaluation.tier_key(minute)
            judged.append(
                Judged(
                    minute.id,
                    f"{group}|{minute.event_type}",
                    evaluation.note_words(minute),
                    scores["composite"],
                    m.at_ms,
                    scores["accuracy"],
                    f"{group}|{recommended[0]}" if recommended else None,
                    recommended[1] if recommended else frozenset(),
                    recommended[2] if recommended else False,
                )
            )
        for ref in evaluation.references(minute):
            target = carry if ref in in_slice else older
            counts = target.corrections if evaluation.is_correction(minute, ref) else target.references
            counts[ref] = counts.get(ref, 0) + 1
    older.tasks = carry.tasks
    verdict.conflicts = evaluation.contradictions(judged)
    for conflict in verdict.conflicts:
        scores = verdict.scores[conflict.loser]
        scores["composite"] = round(scores["composite"] * defaults.CONFLICT_PENALTY, 4)
    if mode == FULL:
        by_id = {j.memory_id: j for j in judged}
        # Merge on the composite after the conflicts: a loser is not the survivor of its duplicates.
        current = [
            Judged(j.memory_id, j.group, j.words, verdict.scores[j.memory_id]["composite"], j.at_ms, j.accuracy)
            for j in judged
        ]
        verdict.merges = evaluation.near_duplicates(current, policy.dedupe_at)
        in_page = {a for merge in verdict.merges for a in merge.absorbed}
        heads = [j for j in current if j.memory_id not in in_page]
        if index is not None:
            wanted = {h.memory_id: b for h in heads if (b := evaluation.minute_buckets(h, policy.dedupe_at))}
            candidates, records, earlier = index.lookup(wanted, _judged)
            across = evaluation.merge_across(
                [h for h in heads if h.memory_id in wanted],
                earlier,
                candidates,
                evaluation.minute_similarity,
                policy.dedupe_at,
            )
            verdict.merges += across
            verdict.elsewhere = {i: records[i] for m in across for i in (m.survivor, *m.absorbed) if i in records}
        merged = {a for merge in verdict.merges for a in merge.absorbed}
        for merge in verdict.merges:
            for absorbed in merge.absorbed:
                verdict.pruned[absorbed] = {"why": "merged", "into": merge.survivor}
        for memory_id, scores in verdict.scores.items():
            age_s = (now_ms - by_id[memory_id].at_ms) / 1000.0
            if memory_id not in merged and evaluation.prunable(scores["composite"], age_s, policy):
                verdict.pruned[memory_id] = {"why": "score"}
        if index is not None:
            absorbed_by = _absorbed_by(verdict.merges)
            losers = {c.loser: c.winner for c in verdict.conflicts}
            verdict.filed = [
                (
                    h.memory_id,
                    wanted[h.memory_id],
                    {
                        "g": h.group,
                        "w": h.words,  # packed as a list (`workers.evaluate.candidate_index`)
                        "c": h.composite,
                        "t": h.at_ms,
                        "s": verdict.scores[h.memory_id],
                        "f": absorbed_by.get(h.memory_id, []),
                        "x": losers.get(h.memory_id),
                    },
                )
                for h in heads
                if h.memory_id in wanted and h.memory_id not in verdict.pruned
            ]
    return verdict, older


def _judged(memory_id: str, record: Mapping[str, Any]) -> Judged:
    """A minute of an earlier page as the candidate index holds it."""
    return Judged(memory_id, record["g"], frozenset(record["w"]), record["c"], record["t"], 0.0)


def _twin(fact_id: str, record: Mapping[str, Any]) -> evaluation.FactTwin:
    """A fact of an earlier page as the candidate index holds it."""
    return evaluation.FactTwin(
        fact_id,
        record["g"],
        record["sub"],
        record["val"],
        frozenset(record["sw"]),
        frozenset(record["vw"]),
        record["c"],
        record["t"],
    )


def _absorbed_by(merges: Sequence[evaluation.Merge]) -> dict[str, list[str]]:
    """Survivor -> every id merged into it (a survivor may have merges on its page and across pages)."""
    out: dict[str, list[str]] = {}
    for merge in merges:
        out.setdefault(merge.survivor, []).extend(merge.absorbed)
    return {survivor: sorted(set(absorbed)) for survivor, absorbed in out.items()}


def judge_facts(
    facts: Sequence[StoredFact],
    reads: Mapping[str, tuple[int, int | None]],
    skip: frozenset[str],
    now_ms: int,
    policy: ScorePolicy,
    mode: str = FULL,
    index: CandidateIndex | None = None,
) -> SliceVerdict:
    """Score current facts (importance x decay), merge near-duplicates of one tier key and pick those to prune.

    `reads`: id -> (count, last read ms). A merged-away fact leaves as a pruned one does (why ``merged``,
    ``into`` its survivor); the survivor may still be pruned for its own score. With the run's candidate
    `index`, facts also merge with their near-duplicates of the pages judged before (as `judge_minutes`).
    """
    verdict = SliceVerdict()
    twins: list[evaluation.FactTwin] = []
    age_s: dict[str, float] = {}
    for stored in facts:
        fact = stored.fact
        if fact.id in skip or fact.status not in (FactStatus.PROMOTED, FactStatus.PENDING):
            continue
        recorded_ms = time_ms(fact.recorded_at)
        count, last_read_ms = reads.get(fact.id, (0, None))
        last_ms = max(recorded_ms, last_read_ms or 0)
        scores = evaluation.fact_scores(fact.importance, last_ms, count, now_ms)
        verdict.fact_scores[fact.id] = scores
        age_s[fact.id] = (now_ms - recorded_ms) / 1000.0
        twins.append(
            evaluation.FactTwin(
                fact.id,
                f"{fact.tier_key}|{fact.type}|{fact.slot.attribute}",
                fact.slot.subject,
                value_key(fact.value),
                evaluation.fact_words(fact.slot.subject),
                evaluation.fact_words(fact.value),
                scores["composite"],
                last_ms,
            )
        )
    if mode != FULL:
        return verdict
    tiers = {stored.fact.id: str(stored.fact.tier_key) for stored in facts}
    types = {stored.fact.id: stored.fact.type.value for stored in facts}
    verdict.merges = evaluation.fact_near_duplicates(twins, policy.fact_dedupe_at)
    in_page = {a for merge in verdict.merges for a in merge.absorbed}
    heads = [t for t in twins if t.memory_id not in in_page]
    if index is not None:
        wanted = {h.memory_id: evaluation.fact_buckets(h) for h in heads}
        candidates, records, earlier = index.lookup(wanted, _twin)
        across = evaluation.merge_across(heads, earlier, candidates, evaluation.fact_similarity, policy.fact_dedupe_at)
        verdict.merges += across
        verdict.elsewhere = {i: records[i] for m in across for i in (m.survivor, *m.absorbed) if i in records}
        tiers.update({i: r["tk"] for i, r in verdict.elsewhere.items()})
    for merge in verdict.merges:
        for absorbed in merge.absorbed:
            why = {"why": "merged", "into": merge.survivor, "kind": FACT, "tier_key": tiers[absorbed]}
            verdict.pruned[absorbed] = why
    for fact_id, scores in verdict.fact_scores.items():
        if fact_id not in verdict.pruned and evaluation.prunable(scores["composite"], age_s[fact_id], policy):
            verdict.pruned[fact_id] = {"why": "decayed", "kind": FACT, "tier_key": tiers[fact_id]}
    if index is not None:
        absorbed_by = _absorbed_by(verdict.merges)
        verdict.filed = [
            (
                h.memory_id,
                wanted[h.memory_id],
                {
                    "g": h.group,
                    "sub": h.subject,
                    "val": h.value,
                    "sw": h.subject_words,
                    "vw": h.value_words,
                    "c": h.composite,
                    "t": h.at_ms,
                    "s": verdict.fact_scores[h.memory_id],
                    "tk": tiers[h.memory_id],
                    "ty": types[h.memory_id],
                    "f": absorbed_by.get(h.memory_id, []),
                },
            )
            for h in heads
            if h.memory_id not in verdict.pruned
        ]
    return verdict


# -- a run ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Step:
    """Where a run is: a log slice ending at seq `position` (minutes), or an HSCAN cursor of the facts."""

    phase: str
    position: int


@dataclass
class Report:
    """What a run (or a dry run) decided, summed over its slices."""

    project_id: str
    mode: str = FULL
    slices: int = 0
    scored: int = 0
    facts_scored: int = 0
    pruned: list[dict[str, Any]] = field(default_factory=list)  # id, kind, why, composite, tokens
    merged: list[dict[str, Any]] = field(default_factory=list)  # survivor, absorbed, similarity
    conflicts: list[dict[str, str]] = field(default_factory=list)  # winner, loser
    rescored: list[dict[str, Any]] = field(default_factory=list)  # id, before, after (composite) - dry runs
    tokens_reclaimed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "project_id": self.project_id,
            "mode": self.mode,
            "slices": self.slices,
            "scored": self.scored,
            "facts_scored": self.facts_scored,
            "pruned": self.pruned,
            "merged": self.merged,
            "conflicts": self.conflicts,
            "rescored": self.rescored,
            "tokens_reclaimed": self.tokens_reclaimed,
        }


def policy_of(settings: Settings) -> ScorePolicy:
    return ScorePolicy(
        settings.score_weights,
        settings.prune_below,
        settings.prune_grace_s,
        settings.dedupe_at,
        settings.fact_dedupe_at,
    )


class Evaluation:
    """Evaluates one project's slices against Redis, the log and (when applying) the vector engine."""

    def __init__(
        self,
        connection: redis.Redis,
        settings: Settings,
        project_id: str,
        run_id: str,
        mode: str = FULL,
        *,
        engine: VectorEngine | None = None,
        apply: bool = True,
        now_ms: int | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} must be one of {', '.join(MODES)}")
        self.connection = connection
        self.settings = settings
        self.project_id = project_id
        self.run_id = run_id
        self.mode = mode
        self.apply = apply
        self._engine = engine
        self.policy = policy_of(settings)
        self.slice = settings.evaluate_slice
        self.now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        self.log = LogReader(settings.log_dir)
        self._first_scored: set[str] = set()  # minutes of the last slice written that had no score before
        self.tenant = GLOBAL_TENANT if project_id == GLOBAL_RUN else project_id  # where its fact points live
        *_, buckets, records = self.scratch()
        self.index = CandidateIndex(connection, buckets, records) if mode == FULL else None

    @property
    def engine(self) -> VectorEngine:
        if self._engine is None:
            from pvm.engines import shared_engine

            self._engine = shared_engine(self.settings)
        return self._engine

    def first_step(self) -> Step:
        return Step(MINUTES, self.log.count(self.project_id))

    def step(self, at: Step, report: Report | None = None) -> Step | None:
        """Evaluate one slice; returns the next step (None: the run is complete)."""
        with cyclic_gc_paused():
            if at.phase == MINUTES:
                low = max(0, at.position - self.slice)
                if at.position > 0:
                    self._minutes_slice(low, at.position, report)
                return Step(MINUTES, low) if low > 0 else Step(FACTS, 0)
            cursor = self._facts_slice(at.position, report)
            return Step(FACTS, cursor) if cursor else None

    def scratch(self) -> list[str]:
        return [keys.evaluation_scratch(self.project_id, self.run_id, w) for w in SCRATCH]

    # -- minutes --

    def _read_log(self, low: int, high: int) -> list[SliceMinute]:
        out: list[SliceMinute] = []
        for record in self.log.history(self.project_id, after_seq=low):
            if record.seq > high:
                break
            try:
                minute = record.minute
                out.append(SliceMinute(record.seq, minute, timestamp_ms(minute), entry_time_ms(record.stream_id)))
            except Exception as exc:  # a record the contract no longer reads: its neighbours are still judged
                log.warning("evaluate pool: %s seq %d does not decode: %s", self.project_id, record.seq, exc)
        return out

    def _minutes_slice(self, low: int, high: int, report: Report | None) -> None:
        minutes = self._read_log(low, high)
        if not minutes:
            return
        ids = [m.minute.id for m in minutes]
        tasks = sorted({t for m in minutes if (t := stated_text(m.minute.data.get("task_id")))})
        refs_key, corrections_key, tasks_key, pushed_key, *_ = self.scratch()
        pipe = self.connection.pipeline(transaction=False)
        for name in (refs_key, corrections_key, keys.access_counts(self.project_id)):
            pipe.hmget(name, ids)
        pipe.hmget(keys.evaluation_pruned(self.project_id), ids)
        pipe.hmget(tasks_key, tasks or [""])
        refs, corrections, reads, pruned, outcomes = pipe.execute()
        carry = Carry(
            _counts(ids, refs),
            _counts(ids, corrections),
            {t: _outcome(raw) for t, raw in zip(tasks, outcomes[: len(tasks)], strict=True) if raw is not None},
        )
        skip = frozenset(i for i, raw in zip(ids, pruned, strict=True) if raw is not None)
        verdict, older = judge_minutes(
            minutes, carry, _counts(ids, reads), skip, self.now_ms, self.policy, self.mode, self.index
        )
        by_id = {m.minute.id: m.minute for m in minutes}
        tokens = {i: _line_tokens(by_id[i]) for i in verdict.pruned if i in by_id}
        tokens.update({i: int(r.get("k", 0)) for i, r in verdict.elsewhere.items() if i in verdict.pruned})
        if self.index is not None:
            filed = [(i, b, {**r, "k": _line_tokens(by_id[i]), "a": by_id[i].agent_id}) for i, b, r in verdict.filed]
            self.index.file(filed, survivors_elsewhere(verdict), [i for i in verdict.elsewhere if i in verdict.pruned])
        # Once per slice, even when its job is retried: a second push would count every reference twice.
        if self.connection.hsetnx(pushed_key, str(high), 1):
            pipe = self.connection.pipeline(transaction=False)
            for ref, n in older.references.items():
                pipe.hincrby(refs_key, ref, n)
            for ref, n in older.corrections.items():
                pipe.hincrby(corrections_key, ref, n)
            for task_id, result in older.tasks.items():
                pipe.hsetnx(tasks_key, task_id, _outcome_bytes(result))
            for name in self.scratch():
                pipe.expire(name, defaults.EVALUATE_LOCK_S)
            pipe.execute()
        if self.apply:
            self._write_minutes(verdict, by_id, tokens)
            self._freshness([m for m in minutes if m.minute.id in self._first_scored])
        if report is not None:
            self._report_minutes(report, verdict, tokens)

    def _freshness(self, scored: Sequence[SliceMinute]) -> None:
        """Emit -> evaluated seconds of the minutes this run scored for the first time (stage ``evaluated``)."""
        now_s = time.time()
        lags = [now_s - m.entry_ms / 1000.0 for m in scored if m.entry_ms is not None]
        if lags:
            MetricsRecorder(self.connection).freshness("evaluated", lags)

    def _write_minutes(self, verdict: SliceVerdict, by_id: Mapping[str, Minute], tokens: Mapping[str, int]) -> None:
        p = self.project_id
        merged_from = _absorbed_by(verdict.merges)
        losers = {c.loser: c.winner for c in verdict.conflicts}
        annotations: dict[str, dict[str, Any]] = {}
        for memory_id, scores in verdict.scores.items():
            pruned = verdict.pruned.get(memory_id)
            annotations[memory_id] = {
                "scores": scores,
                "pruned_ms": self.now_ms if pruned else None,
                "merged_into": pruned.get("into") if pruned else None,
                "merged_from": merged_from.get(memory_id),
                "conflict_with": losers.get(memory_id),
            }
        annotations.update(self._annotations_elsewhere(verdict, merged_from))
        self.engine.annotate(p, annotations)
        known = (
            cast(list[bytes | None], self.connection.hmget(keys.evaluation_scores(p), list(verdict.scores)))
            if verdict.scores
            else []
        )
        self._first_scored = {i for i, raw in zip(verdict.scores, known, strict=True) if raw is None}
        pipe = self.connection.pipeline(transaction=False)
        if verdict.scores:
            pipe.hset(keys.evaluation_scores(p), mapping={i: _pack(s) for i, s in verdict.scores.items()})
        if losers:
            pipe.hset(keys.evaluation_conflicts(p), mapping=losers)  # type: ignore[arg-type]
        reclaimed = 0
        for memory_id, why in verdict.pruned.items():
            earlier = verdict.elsewhere.get(memory_id)
            agent_id = by_id[memory_id].agent_id if earlier is None else earlier.get("a")
            record = {
                **why,
                "at_ms": self.now_ms,
                "composite": _composite(verdict, memory_id),
                "tokens": tokens[memory_id],
                "kind": "minute",
            }
            pipe.hset(keys.evaluation_pruned(p), memory_id, _pack(record))
            if why.get("into"):
                pipe.hset(keys.evaluation_merged(p), memory_id, why["into"])
            pipe.zrem(keys.recent_window(p), memory_id)
            pipe.hdel(keys.minute_by_id(p), memory_id)
            pipe.zrem(keys.minute_by_id_order(p), memory_id)
            if agent_id:
                pipe.zrem(keys.agent_recent_window(p, agent_id), memory_id)
            reclaimed += tokens[memory_id]
        merged = sum(len(m.absorbed) for m in verdict.merges)
        self._count(pipe, len(verdict.scores), len(verdict.pruned) - merged, merged, len(verdict.conflicts), reclaimed)
        kept = [scores for memory_id, scores in verdict.scores.items() if memory_id not in verdict.pruned]
        # Kept by an earlier page and absorbed by this one: out of the run's sums again.
        gone = [r["s"] for i, r in verdict.elsewhere.items() if i in verdict.pruned]
        for part in (*evaluation.SCORE_PARTS, "composite"):
            total = math.fsum(s[part] for s in kept) - math.fsum(s[part] for s in gone)
            pipe.hincrbyfloat(keys.evaluation_run(p), f"sum_{part}", total)
        pipe.hincrby(keys.evaluation_run(p), "kept_minutes", len(kept) - len(gone))
        pipe.execute()

    def _annotations_elsewhere(
        self, verdict: SliceVerdict, merged_from: Mapping[str, list[str]]
    ) -> dict[str, dict[str, Any]]:
        """The annotations of earlier pages' memories this page's merges changed, from their index records."""
        out: dict[str, dict[str, Any]] = {}
        for memory_id, record in verdict.elsewhere.items():
            pruned = verdict.pruned.get(memory_id)
            absorbed = sorted({*record.get("f", []), *merged_from.get(memory_id, [])})
            out[memory_id] = {
                "scores": record["s"],
                "pruned_ms": self.now_ms if pruned else None,
                "merged_into": pruned.get("into") if pruned else None,
                "merged_from": absorbed or None,
                "conflict_with": record.get("x"),
            }
        return out

    # -- facts --

    def _facts_slice(self, cursor: int, report: Report | None) -> int:
        tier = GLOBAL_KEY if self.project_id == GLOBAL_RUN else TierKey.for_project(self.project_id)
        cursor, raw = cast(
            tuple[int, dict[bytes, bytes]],
            self.connection.hscan(keys.facts_by_id(tier), cursor, count=self.slice),
        )
        facts = []
        for value in raw.values():
            try:
                stored = StoredFact.unpack(value)
            except Exception as exc:
                log.warning("evaluate pool: a fact record of %s does not decode: %s", self.project_id, exc)
                continue
            if stored.fact.tier_key.project_id == tier.project_id and stored.fact.tier_key.tier in _TIERS[tier.tier]:
                facts.append(stored)
        ids = [s.fact.id for s in facts]
        reads: dict[str, tuple[int, int | None]] = {}
        skip: frozenset[str] = frozenset()
        if ids:
            pipe = self.connection.pipeline(transaction=False)
            pipe.hmget(keys.evaluation_pruned(self.project_id), ids)
            pipe.hmget(keys.fact_reads(tier), [f for i in ids for f in (i, f"{i}:at")])
            pruned, counts = pipe.execute()
            skip = frozenset(i for i, r in zip(ids, pruned, strict=True) if r is not None)
            for n, fact_id in enumerate(ids):
                count, at = counts[2 * n], counts[2 * n + 1]
                reads[fact_id] = (int(count) if count else 0, time_ms(at.decode()) if at else None)
        verdict = judge_facts(facts, reads, skip, self.now_ms, self.policy, self.mode, self.index)
        if self.index is not None:
            dropped = [i for i in verdict.elsewhere if i in verdict.pruned]
            self.index.file(verdict.filed, survivors_elsewhere(verdict), dropped)
        if self.apply and (verdict.fact_scores or verdict.pruned):
            self._write_facts(verdict, {s.fact.id: s for s in facts})
        if report is not None:
            report.slices += 1
            report.facts_scored += len(verdict.fact_scores)
            for fact_id, why in verdict.pruned.items():
                entry = {
                    "id": fact_id,
                    "kind": FACT,
                    "why": why["why"],
                    "composite": _composite(verdict, fact_id),
                    "tokens": 0,
                }
                if why.get("into"):
                    entry["into"] = why["into"]
                report.pruned.append(entry)
            report.merged += [
                {"survivor": m.survivor, "absorbed": list(m.absorbed), "similarity": m.similarity, "kind": FACT}
                for m in verdict.merges
            ]
        return int(cursor)

    def _write_facts(self, verdict: SliceVerdict, by_id: Mapping[str, StoredFact]) -> None:
        p = self.project_id
        merged_from = _absorbed_by(verdict.merges)

        def scores_of(fact_id: str) -> dict[str, float]:
            return verdict.fact_scores.get(fact_id) or verdict.elsewhere[fact_id]["s"]

        annotations: dict[str, dict[str, Any]] = {
            i: {"scores": scores_of(i), "pruned_ms": self.now_ms, "merged_into": why.get("into")}
            for i, why in verdict.pruned.items()
        }
        for survivor, absorbed in merged_from.items():
            earlier = verdict.elsewhere.get(survivor, {}).get("f", [])
            annotations.setdefault(survivor, {"scores": scores_of(survivor)})["merged_from"] = sorted(
                {*earlier, *absorbed}
            )
        if self.mode == RESCORE and self.tenant == GLOBAL_TENANT:
            # No replay re-indexes the global tier's points (every project's log feeds them): the rescoring run a
            # replay queues brings back the ones a run had pruned or merged away (`restore_global`).
            annotations = {i: {"pruned_ms": None} for i in verdict.fact_scores}
        if annotations:
            self.engine.annotate(self.tenant, annotations, kind=FACT)
        pipe = self.connection.pipeline(transaction=False)
        if verdict.fact_scores:
            pipe.hset(keys.evaluation_scores(p), mapping={i: _pack(s) for i, s in verdict.fact_scores.items()})
        for fact_id, why in verdict.pruned.items():
            record = {**why, "at_ms": self.now_ms, "composite": _composite(verdict, fact_id), "tokens": 0}
            pipe.hset(keys.evaluation_pruned(p), fact_id, _pack(record))
            if why.get("into"):
                pipe.hset(keys.evaluation_merged(p), fact_id, why["into"])
            tier = by_id[fact_id].fact.tier_key if fact_id in by_id else TierKey.parse(why["tier_key"])
            pipe.zrem(keys.facts_in_tier(tier), fact_id)  # out of every context's facts section
            fact_type = by_id[fact_id].fact.type if fact_id in by_id else verdict.elsewhere[fact_id]["ty"]
            pipe.srem(keys.facts_of_type(tier, fact_type), fact_id)  # and out of reads by type (`pvm facts --type`)
        merged = sum(len(m.absorbed) for m in verdict.merges)
        self._count(pipe, len(verdict.fact_scores), len(verdict.pruned) - merged, merged, 0, 0)
        kept = [scores for fact_id, scores in verdict.fact_scores.items() if fact_id not in verdict.pruned]
        gone = [r["s"] for i, r in verdict.elsewhere.items() if i in verdict.pruned]
        total = math.fsum(s["composite"] for s in kept) - math.fsum(s["composite"] for s in gone)
        pipe.hincrbyfloat(keys.evaluation_run(p), "sum_fact_composite", total)
        pipe.hincrby(keys.evaluation_run(p), "kept_facts", len(kept) - len(gone))
        pipe.execute()

    # -- bookkeeping --

    def _count(
        self, pipe: redis.client.Pipeline, scored: int, pruned: int, merged: int, conflicts: int, tokens: int
    ) -> None:
        p = self.project_id
        for name, n in (("pruned", pruned), ("merged", merged), ("conflicts", conflicts), ("tokens_reclaimed", tokens)):
            if n:
                pipe.hincrby(keys.evaluation_totals(p), name, n)
                pipe.hincrby(keys.metrics_evaluate(), name, n)
        pipe.hincrby(keys.metrics_evaluate(), "scored", scored)
        pipe.hincrby(keys.metrics_evaluate(), "slices", 1)
        pipe.hincrby(keys.evaluation_run(p), "slices_done", 1)
        pipe.hincrby(keys.evaluation_run(p), "scored", scored)
        pipe.hincrby(keys.evaluation_run(p), "pruned", pruned + merged)

    def _report_minutes(self, report: Report, verdict: SliceVerdict, tokens: Mapping[str, int]) -> None:
        report.slices += 1
        report.scored += len(verdict.scores)
        for memory_id, why in verdict.pruned.items():
            entry = {
                "id": memory_id,
                "kind": "minute",
                "why": why["why"],
                "composite": _composite(verdict, memory_id),
                "tokens": tokens[memory_id],
            }
            if why.get("into"):
                entry["into"] = why["into"]
            report.pruned.append(entry)
            report.tokens_reclaimed += tokens[memory_id]
        report.merged += [
            {"survivor": m.survivor, "absorbed": list(m.absorbed), "similarity": m.similarity} for m in verdict.merges
        ]
        report.conflicts += [{"winner": c.winner, "loser": c.loser} for c in verdict.conflicts]
        if not self.apply and verdict.scores:
            before = cast(
                list[bytes | None], self.connection.hmget(keys.evaluation_scores(self.project_id), list(verdict.scores))
            )
            for (memory_id, scores), raw in zip(verdict.scores.items(), before, strict=True):
                old = _unpack(raw)["composite"] if raw is not None else None
                if old != scores["composite"]:
                    report.rescored.append({"id": memory_id, "before": old, "after": scores["composite"]})


def _line_tokens(minute: Minute) -> int:
    """What a minute costs in a context: the tokens of its rendered line."""
    return estimate_tokens(minute_line(minute.to_dict()))


def _composite(verdict: SliceVerdict, memory_id: str) -> float:
    """A judged memory's composite: of this page's scores, else of its record in the run's candidate index."""
    scores = verdict.scores.get(memory_id) or verdict.fact_scores.get(memory_id)
    return float(scores["composite"] if scores else verdict.elsewhere[memory_id]["c"])


def survivors_elsewhere(verdict: SliceVerdict) -> dict[str, dict[str, Any]]:
    """Earlier pages' survivors of this page's merges, their index records listing what they absorbed now."""
    merged_from = _absorbed_by(verdict.merges)
    return {
        i: {**r, "f": sorted({*r.get("f", []), *merged_from.get(i, [])})}
        for i, r in verdict.elsewhere.items()
        if i not in verdict.pruned
    }


def _counts(ids: Sequence[str], raws: Sequence[bytes | None]) -> dict[str, int]:
    return {i: int(raw) for i, raw in zip(ids, raws, strict=True) if raw}


def _outcome_bytes(result: TaskOutcome) -> bytes:
    return _pack({"ok": result.succeeded, "success": result.success})


def _outcome(raw: bytes) -> TaskOutcome:
    fields = _unpack(raw)
    return TaskOutcome(bool(fields["ok"]), fields.get("success"))


def _pack(value: Mapping[str, Any]) -> bytes:
    return cast(bytes, msgpack.packb(dict(value), use_bin_type=True))


def _unpack(raw: bytes) -> dict[str, Any]:
    return cast(dict[str, Any], msgpack.unpackb(raw, raw=False))


# -- runs: start, slices, completion -------------------------------------------------------------------------------


def start_run(connection: redis.Redis, settings: Settings, project_id: str, mode: str = FULL) -> str | None:
    """Take the project's run lease and record a new run; its id, or None when a run of the project is going."""
    run_id = uuid.uuid4().hex[:16]
    if not connection.set(keys.evaluation_lock(project_id), run_id, nx=True, ex=defaults.EVALUATE_LOCK_S):
        return None
    head = LogReader(settings.log_dir).count(project_id)
    connection.delete(keys.evaluation_run(project_id))
    connection.hset(
        keys.evaluation_run(project_id),
        mapping={
            "run_id": run_id,
            "mode": mode,
            "status": "running",
            "started": repr(time.time()),
            "head_seq": head,
            "minute_slices": math.ceil(head / settings.evaluate_slice),
            "slices_done": 0,
            "scored": 0,
            "pruned": 0,
        },
    )
    return run_id


def enqueue_run(
    connection: redis.Redis, settings: Settings, project_id: str, mode: str = FULL, after: str | None = None
) -> str | None:
    """Start a run of a project and queue its first slice (once job `after` finished, when given).

    The run id, or None when a run of the project is already going.
    """
    run_id = start_run(connection, settings, project_id, mode)
    if run_id is None:
        return None
    step = Step(MINUTES, LogReader(settings.log_dir).count(project_id))
    _enqueue_slice(pool_queue("evaluate", connection), project_id, run_id, step, mode, after)
    return run_id


def _enqueue_slice(queue: Queue, project_id: str, run_id: str, step: Step, mode: str, after: str | None = None) -> None:
    queue.enqueue_many(
        [
            pool_job(
                keys.EVALUATE_SLICE_JOB,
                (project_id, run_id, step.phase, step.position, mode),
                timeout=defaults.EVALUATE_JOB_TIMEOUT_S,
                retries=0,
                description=f"evaluate {project_id} ({step.phase} at {step.position})",
                depends_on=after,
            )
        ]
    )


def finish_run(connection: redis.Redis, project_id: str, run_id: str, status: str = "done") -> None:
    """Record the run's end, drop its scratch and release the project's lease (if the run still holds it)."""
    now = time.time()
    run = {k.decode(): v.decode() for k, v in hash_reply(connection.hgetall(keys.evaluation_run(project_id))).items()}
    pipe = connection.pipeline(transaction=False)
    pipe.hset(keys.evaluation_run(project_id), mapping={"status": status, "finished": repr(now)})
    if status == "done":
        pipe.hset(keys.evaluated_projects(), project_id, repr(now))
        pipe.hincrby(keys.metrics_evaluate(), "runs", 1)
        averages = _averages(run)
        if averages:
            pipe.hset(keys.evaluation_totals(project_id), mapping=averages)  # type: ignore[arg-type]
    pipe.delete(*[keys.evaluation_scratch(project_id, run_id, w) for w in SCRATCH])
    pipe.execute()
    if bulk_reply(connection.get(keys.evaluation_lock(project_id))) == run_id.encode():
        connection.delete(keys.evaluation_lock(project_id))


def _averages(run: Mapping[str, str]) -> dict[str, str]:
    """The mean scores of what a run kept (minutes' parts and composite, facts' composite), as totals hold them."""
    out = {}
    minutes, facts = int(run.get("kept_minutes", 0)), int(run.get("kept_facts", 0))
    if minutes:
        for part in (*evaluation.SCORE_PARTS, "composite"):
            out[f"avg_{part}"] = repr(round(float(run.get(f"sum_{part}", 0.0)) / minutes, 4))
    if facts:
        out["avg_fact_composite"] = repr(round(float(run.get("sum_fact_composite", 0.0)) / facts, 4))
    return out


def _current_run(connection: redis.Redis, project_id: str) -> str | None:
    raw = bulk_reply(connection.hget(keys.evaluation_run(project_id), "run_id"))
    return raw.decode() if raw is not None else None


def plan(worker: WorkerContext) -> dict[str, Any]:
    """The job `keys.EVALUATE_PLAN_JOB` (the ``evaluate`` schedule): start a run of every project that has none
    going, and of the global tier.

    The global tier's facts are shared by every project, so one run of their own judges them (`GLOBAL_RUN`),
    once a schedule and under one lease, rather than every project's run racing over them.
    """
    connection, settings = worker.connection, worker.settings
    projects = sorted(p.decode() for p in cast(set[bytes], connection.smembers(keys.projects())))
    if connection.exists(keys.facts_by_id(GLOBAL_KEY)):
        projects.append(GLOBAL_RUN)
    started: list[str] = []
    busy: list[str] = []
    for project_id in projects:
        (started if enqueue_run(connection, settings, project_id) else busy).append(project_id)
    return {"started": started, "busy": busy}


def run_slice(
    worker: WorkerContext, project_id: str, run_id: str, phase: str, position: int, mode: str = FULL
) -> dict[str, Any]:
    """The job `keys.EVALUATE_SLICE_JOB`: evaluate one slice of a project's run, then queue the next (or complete
    the run)."""
    job = get_current_job()
    assert job is not None, f"{keys.EVALUATE_SLICE_JOB} runs inside an RQ worker"
    connection = worker.connection
    if _current_run(connection, project_id) != run_id:
        return {"project_id": project_id, "run_id": run_id, "skipped": "the run was replaced by a newer one"}
    settings = worker.settings
    evaluation_ = Evaluation(connection, settings, project_id, run_id, mode)
    report = Report(project_id, mode)
    try:
        following = evaluation_.step(Step(phase, position), report)
    except Exception:
        if job.retries_left == 0 or job.retries_left is None:
            finish_run(connection, project_id, run_id, status="failed")
        raise
    if following is None:
        finish_run(connection, project_id, run_id)
    else:
        _enqueue_slice(pool_queue("evaluate", connection), project_id, run_id, following, mode)
    return {
        "project_id": project_id,
        "run_id": run_id,
        "scored": report.scored + report.facts_scored,
        "pruned": len(report.pruned),
        "next": None if following is None else [following.phase, following.position],
    }


def evaluate_here(
    connection: redis.Redis,
    settings: Settings,
    project_id: str,
    *,
    mode: str = FULL,
    apply: bool = False,
    engine: VectorEngine | None = None,
    now_ms: int | None = None,
) -> Report:
    """Every slice of a run in this process (a dry run unless `apply`): the report of what it decided.

    Applying here needs the engine: with the embedded one only in the process that owns it (tests, benchmarks).
    """
    run_id = f"here-{uuid.uuid4().hex[:12]}"
    if apply:
        taken = start_run(connection, settings, project_id, mode)
        if taken is None:
            raise RuntimeError(f"an evaluation of {project_id} is running; wait for it (`pvm status`)")
        run_id = taken
    ev = Evaluation(connection, settings, project_id, run_id, mode, engine=engine, apply=apply, now_ms=now_ms)
    report = Report(project_id, mode)
    try:
        for _ in _steps(ev, report):
            pass
    except Exception:
        if apply:
            finish_run(connection, project_id, run_id, status="failed")
        else:
            connection.delete(*ev.scratch())
        raise
    if apply:
        finish_run(connection, project_id, run_id)
    else:
        connection.delete(*ev.scratch())
    return report


def _steps(ev: Evaluation, report: Report) -> Iterator[Step]:
    step: Step | None = ev.first_step()
    while step is not None:
        yield step
        step = ev.step(step, report)


def forget(connection: redis.Redis, project_id: str) -> None:
    """Delete a project's evaluation records (scores, prunes, merges, conflicts, counters): `pvm replay` does."""
    connection.delete(
        keys.evaluation_scores(project_id),
        keys.evaluation_pruned(project_id),
        keys.evaluation_merged(project_id),
        keys.evaluation_conflicts(project_id),
        keys.evaluation_totals(project_id),
    )


def restore_global(connection: redis.Redis) -> int:
    """Undo the global tier's prunes and merges in Redis for a replay; how many facts come back.

    The global tier is fed by every project's log, so a replay of any project restores it: its pruned facts
    return to the tier's read set and type sets, and `forget` drops the run's records; their points come back
    with the rescoring run of `GLOBAL_RUN` the replay queues.
    """
    pruned = [i.decode() for i in cast(list[bytes], connection.hkeys(keys.evaluation_pruned(GLOBAL_RUN)))]
    raws = cast(list[bytes | None], connection.hmget(keys.facts_by_id(GLOBAL_KEY), pruned)) if pruned else []
    pipe = connection.pipeline(transaction=False)
    restored = 0
    for raw in raws:
        if raw is None:
            continue  # forgotten since (a replay of every project resets the tier and applies it again)
        fact = StoredFact.unpack(raw).fact
        _restore_fact(pipe, fact)
        restored += 1
    pipe.execute()
    forget(connection, GLOBAL_RUN)
    return restored


def _restore_fact(pipe: redis.client.Pipeline, fact: Fact) -> None:
    """Put a pruned fact back where a prune took it from (`Evaluation._write_facts`)."""
    pipe.zadd(keys.facts_in_tier(fact.tier_key), {fact.id: time_ms(fact.recorded_at)})
    pipe.sadd(keys.facts_of_type(fact.tier_key, fact.type), fact.id)


def run_state(connection: redis.Redis, project_id: str) -> dict[str, Any]:
    """A project's current or last run as `pvm status` shows it ({} when it never ran)."""
    raw = {k.decode(): v.decode() for k, v in hash_reply(connection.hgetall(keys.evaluation_run(project_id))).items()}
    if not raw:
        return {}
    out: dict[str, Any] = dict(raw)
    for name in ("head_seq", "minute_slices", "slices_done", "scored", "pruned"):
        if name in out:
            out[name] = int(out[name])
    for name in ("started", "finished"):
        if name in out:
            out[name] = float(out[name])
    return out

"""The index pool: makes durable minutes searchable (category, insights, scores, vector points); keeps agent memory.

Fed by the log pool's fan-out (queue ``pvm-index``) with records
``[minute_id, log_seq, minute_bytes, entry_ms]`` (the stream entry time, which
freshness is measured from; three-element records are accepted too). The pure core below turns a batch into
vector points and agent-memory deltas, judging each minute by the rules of
`workers.rules.assessment` (category, insights, scores); `run` wires it to agent
memory in Redis, the vector engine, and the project's index head (how far the
index has caught up with the log). Every step is idempotent by minute id, so a retried or replayed
batch changes nothing.

Knowledge-change minutes (``fact_*``) are minutes of the log like any other:
indexed as minutes, counted by the head. Each one is also applied to the
point of the fact it changes (`workers.index.fact_points`, the fact step), so search
can return facts beside minutes; one that does not parse is indexed as a
plain minute only.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import redis
from rq import get_current_job

from contracts import (
    FACT_EVENT_TYPES,
    ContractError,
    InvalidMinute,
    Minute,
    check_project_id,
    decode_durable_minute,
    keys,
)
from contracts.memory import Category
from pvm import defaults
from pvm.config import Settings
from pvm.metrics import MetricsRecorder
from pvm.protocols import FACT, Embedder, MemoryPoint, VectorEngine
from pvm.stores.agent_memory import AgentDelta, AgentMemoryStore
from pvm.stores.log import LogReader
from pvm.vectors import GLOBAL_TENANT
from workers.index import fact_points
from workers.rules.assessment import (
    categorize,
    event_words,
    initial_score_fields,
    insights_with_kind,
    observed_capability,
    outcome,
    stated_text,
    success_score,
    task_kind,
    timestamp_ms,
    words,
)
from workers.runtime.collector import cyclic_gc_paused
from workers.runtime.context import WorkerContext
from workers.runtime.heads import FRESH, advance_script, runs
from workers.runtime.messages import LoggedRecord
from workers.runtime.queues import pool_job, pool_queue

log = logging.getLogger(__name__)

# -- pure core ------------------------------------------------------------------

# data keys naming the agent a task_assigned / handoff minute gives the task to.
ASSIGNEE_KEYS = ("assignee", "assigned_to", "to_agent")


@dataclass(frozen=True, slots=True)
class LoggedMinute:
    """A minute as the log made it durable: the decoded minute, its sequence in the project's log, its times.

    `at_ms` is the minute's `timestamp_ms`, parsed once for every step of the
    batch (worked out from the minute when not given): the producer's time,
    data of the minute. `entry_ms` is its stream entry time (set by Redis),
    which freshness is measured from; None when the record does not carry it
    (a rebuild from the log, or a job queued before records carried it).
    """

    seq: int
    minute: Minute
    at_ms: int = None  # type: ignore[assignment]  # always an int once constructed
    entry_ms: int | None = None

    def __post_init__(self) -> None:
        if self.at_ms is None:
            object.__setattr__(self, "at_ms", timestamp_ms(self.minute))


def decode(records: Sequence[Sequence[Any]]) -> tuple[list[LoggedMinute], list[str]]:
    """Decode ``[minute_id, seq, minute_bytes, entry_ms]`` records; returns the minutes and the ids that would not.

    ``entry_ms`` (the stream entry time) may be missing or None: records of
    older jobs and of rebuilds from the log have three elements.

    The dispatcher validated every minute before the log took it, so the bytes
    are read as trusted (`Minute.trusted`: no second validation, which cost as
    much as the rest of decoding). What would still break the whole batch is
    checked: the shape, the schema version, the project name (it names a vector
    shard), the data mapping and the timestamp (parsed here once for every
    later step). A failure means a contract change between writer and reader:
    the record is skipped (it stays in the log for a replay) and its neighbours
    are indexed.
    """
    good: list[LoggedMinute] = []
    bad: list[str] = []
    for record in records:
        minute_id, seq, raw, entry_ms = LoggedRecord.read(record)
        try:
            minute = _durable_minute(raw)
            good.append(LoggedMinute(int(seq), minute, timestamp_ms(minute), entry_ms))
        except ContractError as exc:
            log.warning("index pool: minute %s (log seq %s) does not decode: %s", minute_id, seq, exc)
            bad.append(str(minute_id))
    return good, bad


def _durable_minute(raw: bytes) -> Minute:
    """A minute from bytes the log holds (validated when they were written); `ContractError` when they are not one.

    The project id and the data's shape are checked again: the project names a shard
    directory, and the rules read the data as a mapping.
    """
    minute = decode_durable_minute(raw)
    check_project_id(minute.project_id)
    if not isinstance(minute.data, dict):
        raise InvalidMinute("data", f"must be a mapping, got {type(minute.data).__name__}")
    return minute


def _unique(records: Iterable[LoggedMinute]) -> list[LoggedMinute]:
    """Records without repeats of a minute (a batch may carry a minute twice); first one wins."""
    seen: set[tuple[str, str]] = set()
    out = []
    for r in records:
        key = (r.minute.project_id, r.minute.id)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def lexical_text(minute: Minute) -> str:
    """The text the lexical leg indexes: event type words, agent, task, the note and the data's prose."""
    return _lexical_text(minute, task_kind(minute))


# data keys whose text the lexical leg indexes, after the note.
_LEXICAL_DATA_KEYS = ("assignment_reasoning", "resolution", "error", "reason", "capability", *ASSIGNEE_KEYS)


def _lexical_text(minute: Minute, kind: str | None) -> str:
    """`lexical_text` given the minute's `task_kind`."""
    data = minute.data
    parts = [event_words(minute.event_type)]
    if minute.agent_id:
        parts.append(minute.agent_id)
    if data:
        task_id = stated_text(data.get("task_id"))
        if task_id:
            parts.append(task_id)
        conflict_type = stated_text(data.get("conflict_type"))
        if conflict_type:
            parts.append(words(conflict_type))
    if minute.memory_note:
        parts.append(minute.memory_note)
    if data:
        for key in _LEXICAL_DATA_KEYS:
            value = data.get(key)
            if isinstance(value, str) and value and not value.isspace():
                parts.append(value)
    if kind and kind not in parts:
        parts.append(kind)
    return " ".join([stripped for part in parts if (stripped := part.strip())])


# data keys holding the minute's own words, which the dense leg embeds after the note.
_DENSE_DATA_KEYS = (
    "reasoning",
    "assignment_reasoning",
    "rationale",
    "decision",
    "resolution",
    "error",
    "reason",
    "summary",
    "description",
    "capability",
)


def dense_text(minute: Minute) -> str:
    """The text the dense leg embeds: the minute's own words (note, reasoning, key data), as a person would embed it.

    Event type, agent and task id stay out: they are filters and payload, and
    in the embedded text they pull every minute of one type or agent together.
    A minute with no words of its own embeds its lexical text.
    """
    parts = [minute.memory_note] if stated_text(minute.memory_note) else []
    data = minute.data
    if data:
        for key in _DENSE_DATA_KEYS:
            value = stated_text(data.get(key))
            if value and value not in parts:
                parts.append(value)
    text = " ".join(p.strip() for p in parts if p)
    return text or lexical_text(minute)


def build_points(records: Sequence[LoggedMinute], now: float | None = None) -> list[MemoryPoint]:
    """Vector-store points for a batch, one per minute, with their `dense_text`; `dense` is left for the embedder."""
    return _points(_unique(records), time.time() if now is None else now)


# An Enum's .value is a property call (~0.2 us); a dict lookup costs a seventh of it.
_CATEGORY_VALUES: dict[Category, str] = {c: c.value for c in Category}


def _points(records: Sequence[LoggedMinute], now: float, dense: bool = True) -> list[MemoryPoint]:
    """`build_points` for records without repeats, in their order; without `dense`, no `dense_text` (the index
    pool adds it with `_with_dense_text` only when an embedder will read it: ~5 us a minute otherwise spent).

    A point holds what search filters and ranks on and what a hit shows
    beside the minute (category, insights, scores), not the minute itself:
    the engine converts every payload byte on upsert, and the minute was most
    of them. A hit reads its whole minute from the Redis minute cache or the
    log (`pvm.stores.minutes`); `seq` places it in the log.
    """
    points = []
    for r in records:
        m = r.minute
        category = categorize(m)
        kind = task_kind(m)
        payload = {
            "project_id": m.project_id,
            "minute_id": m.id,
            "agent_id": m.agent_id,
            "event_type": m.event_type,
            "category": _CATEGORY_VALUES[category],
            "timestamp_ms": r.at_ms,
            "task_id": stated_text(m.data.get("task_id")),
            "thread_id": m.thread_id,
            "insights": [i.to_dict() for i in insights_with_kind(m, kind)],
            "scores": initial_score_fields(m, now, category, r.at_ms),
            "seq": r.seq,
        }
        points.append(
            MemoryPoint(
                minute_id=m.id,
                project_id=m.project_id,
                text=_lexical_text(m, kind),
                payload=payload,
                dense_text=dense_text(m) if dense else None,
            )
        )
    return points


def _with_dense_text(
    ctx: IndexContext, points: list[MemoryPoint], records: Sequence[LoggedMinute]
) -> list[MemoryPoint]:
    """`points` (made by `_points` from `records`, in order, without dense text) with their minutes' `dense_text`
    when the process embeds; as they are when it does not (lexical only)."""
    if ctx.embedder.dimensions is None:
        return points
    return [replace(p, dense_text=dense_text(r.minute)) for p, r in zip(points, records, strict=True)]


def _assignee(minute: Minute) -> str | None:
    for key in ASSIGNEE_KEYS:
        value = stated_text(minute.data.get(key))
        if value:
            return value
    return minute.agent_id


def agent_updates(records: Sequence[LoggedMinute]) -> list[AgentDelta]:
    """What a batch adds to agent memory: at most one delta per (minute, agent).

    | event | agent | adds |
    |---|---|---|
    | any, with agent_id | agent_id | last active |
    | task_assigned, handoff | `ASSIGNEE_KEYS` value, else agent_id | tasks assigned |
    | task_completed | agent_id | tasks completed; success; the task kind as a capability if it succeeded |
    | task_failed | agent_id | tasks failed; success |
    | capability_observed | agent_id | data.capability (else the task kind) as a capability |

    "success" is success_criteria_met when the minute states it; mean success is
    the mean over the finished tasks that state one.
    """
    return _deltas(_unique(records))


def _deltas(records: Sequence[LoggedMinute]) -> list[AgentDelta]:
    """`agent_updates` for records without repeats."""
    out: list[AgentDelta] = []
    for r in records:
        m = r.minute
        agent, event = m.agent_id, m.event_type
        mine: dict[str, Any] | None = {"active_ms": r.at_ms, "active_at": m.timestamp} if agent else None
        assignee = None  # another agent given the task
        if event in ("task_assigned", "handoff"):
            assignee = _assignee(m)
            if mine is not None and assignee == agent:
                mine["assigned"] = 1
                assignee = None
        elif mine is not None and event in ("task_completed", "task_failed"):
            mine["completed" if event == "task_completed" else "failed"] = 1
            mine["success"] = success_score(m)
            kind = task_kind(m)
            if kind and outcome(m):
                mine["capabilities"] = (kind,)
        elif mine is not None and event == "capability_observed":
            capability = observed_capability(m)
            if capability:
                mine["capabilities"] = (capability,)
        if agent and mine is not None:
            out.append(AgentDelta(project_id=m.project_id, agent_id=agent, minute_id=m.id, seq=r.seq, **mine))
        if assignee:
            out.append(AgentDelta(project_id=m.project_id, agent_id=assignee, minute_id=m.id, seq=r.seq, assigned=1))
    return out


# -- RQ entry point -------------------------------------------------------------

_ADVANCE_HEAD = advance_script("indexed_at")  # the contiguous head (workers/runtime/heads.py), as the facts pool keeps


def close_engine() -> None:
    """Close the process's engine (flushing it and releasing its lock), if one is open."""
    from pvm.engines import close_shared

    close_shared()


@dataclass
class IndexContext:
    """What a batch is indexed with: settings, agent memory, metrics, and the process's engine."""

    settings: Settings
    memory: AgentMemoryStore
    metrics: MetricsRecorder

    @classmethod
    def build(cls, connection: redis.Redis, settings: Settings) -> IndexContext:
        return cls(
            settings=settings,
            memory=AgentMemoryStore(connection),
            metrics=MetricsRecorder(connection),
        )

    @property
    def engine(self) -> VectorEngine:
        """The process's shared engine, created on first use (agent memory is kept even before one is reachable)."""
        from pvm.engines import shared_engine

        return shared_engine(self.settings)

    @property
    def embedder(self) -> Embedder:
        from pvm.engines import shared

        return shared(self.settings)[1]


def _context(worker: WorkerContext) -> IndexContext:
    """The index pool's parts of a worker, built on its first index job (`WorkerContext.part`)."""
    return IndexContext.build(worker.connection, worker.settings)


class PartialIndexError(RuntimeError):
    """Some projects of a batch were indexed (heads advanced) and the vector store failed for the others."""

    def __init__(self, indexed: Iterable[str], failed: dict[str, Exception]) -> None:
        self.indexed = sorted(indexed)
        self.failed = failed
        why = "; ".join(f"{project}: {error}" for project, error in sorted(failed.items()))
        super().__init__(
            f"the vector store failed for {len(failed)} project(s) of the batch ({why}); "
            f"{len(self.indexed)} other project(s) are indexed, and a retry of the job redoes only the failed ones"
        )


def _upsert(ctx: IndexContext, points: Sequence[MemoryPoint]) -> dict[str, Exception]:
    """Embed (when an embedder is configured) and write points to the vector store (idempotent by minute id).

    Returns the projects whose points the vector store refused, with why: one
    project's error (a shard that cannot be created, say) costs the others
    nothing. The batch is written in one call, and only when that fails, again
    project by project to find whose it was (re-writing a point is idempotent).
    When every project fails, the first error raises as it came.

    An embedding failure raises: the job is retried, then lands in the failed
    registry; the minutes stay in the log and `pvm replay` indexes them again.
    """
    if not points:
        return {}
    engine, embedder = ctx.engine, ctx.embedder
    if embedder.dimensions is not None:
        tokens_before = embedder.stats.input_tokens  # type: ignore[attr-defined]
        started = time.monotonic()
        outcome = "error"
        try:
            vectors = embedder.embed([p.embed_text for p in points])
            outcome = "ok"
        finally:
            ctx.metrics.provider_call(
                "openai",
                "embedding",
                outcome,
                time.monotonic() - started,
                tokens=embedder.stats.input_tokens - tokens_before,  # type: ignore[attr-defined]
            )
        points = [replace(p, dense=v) for p, v in zip(points, vectors, strict=True)]
    try:
        engine.upsert(points)
        return {}
    except Exception as exc:
        by_project: dict[str, list[MemoryPoint]] = {}
        for p in points:
            by_project.setdefault(p.project_id, []).append(p)
        if len(by_project) == 1:
            raise
        first = exc
    failed: dict[str, Exception] = {}
    for project_id, of_project in by_project.items():
        try:
            engine.upsert(of_project)
        except Exception as exc:
            log.error("index pool: the vector store failed for project %s: %s", project_id, exc)
            failed[project_id] = exc
    if len(failed) == len(by_project):
        raise first
    return failed


def _rebuild_broken_shards(ctx: IndexContext, connection: redis.Redis) -> list[str]:
    """Rebuild from the log every project whose shard the engine had to replace by an empty one; returns them.

    The embedded engine sets aside a shard that does not load and starts an
    empty one (`pvm.vectors.edge`). Its points are gone, so its index head
    and done-bitmap are reset at once (freshness shows the whole project as
    behind, never "caught up") and every minute of its log is queued for
    indexing again, as `pvm replay` does for the index alone (agent memory
    and caches did not lose anything). Only then is the shard marked
    re-indexed: a crash in between queues the rebuild again at the next batch
    (idempotent), never leaves it undone.
    """
    broken_projects = getattr(ctx.engine, "broken_projects", None)
    if broken_projects is None:
        return []
    projects: list[str] = broken_projects()
    for project_id in projects:
        if project_id == GLOBAL_TENANT:
            # Global facts come from every project's log: all of them are fed again (their minute points and heads
            # are whole, so the heads stay; re-indexing is idempotent).
            queued = sum(
                _queue_from_log(connection, ctx.settings, p) for p in LogReader(ctx.settings.log_dir).projects()
            )
            log.error(
                "index pool: the vector shard of the global facts was lost and replaced; %d minutes of every "
                "project's log queued for indexing again",
                queued,
            )
            ctx.engine.mark_reindexed(project_id)  # type: ignore[attr-defined]
            continue
        connection.delete(keys.index_head(project_id), keys.index_done(project_id))
        queued = _queue_from_log(connection, ctx.settings, project_id)
        log.error(
            "index pool: the vector shard of project %s was lost and replaced; %d minutes of its log queued for "
            "indexing again",
            project_id,
            queued,
        )
        ctx.engine.mark_reindexed(project_id)  # type: ignore[attr-defined]
    return projects


def _queue_from_log(connection: redis.Redis, settings: Settings, project_id: str) -> int:
    """Queue index jobs for every minute of a project's log (three-element records: no freshness); returns them."""
    queue = pool_queue("index", connection)
    sent = 0
    batch: list[list[Any]] = []

    def flush() -> None:
        nonlocal sent, batch
        if batch:
            queue.enqueue_many(
                [pool_job(keys.INDEX_JOB, (batch,), description=f"rebuild the index of {project_id} from its log")]
            )
            sent += len(batch)
            batch = []

    for record in LogReader(settings.log_dir).history(project_id):
        batch.append([record.id, record.seq, record.minute_bytes])
        if len(batch) >= defaults.REPLAY_BATCH:
            flush()
    flush()
    if not sent:
        log.error(
            "index pool: no log of project %s in %s to rebuild its index from; run `pvm replay --project %s` "
            "where its log is",
            project_id,
            settings.log_dir,
            project_id,
        )
    return sent


def _advance_heads(
    ctx: IndexContext,
    connection: redis.Redis,
    records: Sequence[LoggedMinute],
    batch_minutes: int,
    batch_seconds: float,
    indexed_at: float,
) -> tuple[list[str], list[LoggedMinute]]:
    """Mark the records indexed, raise each project's head as far as it is contiguous, count the batch.

    Returns the projects and the records indexed for the first time (a
    retried or replayed minute is not fresh again).

    The head is a contiguous watermark: every log seq at or below its ``seq``
    is indexed. A bitmap per project (`keys.index_done`) holds which seqs
    are; with several index workers, or a batch that failed for one project,
    a later seq can be indexed before an earlier one, and the head then waits
    at the gap (``max_seq`` and ``gaps`` say what lies above it). So a
    project never shows caught up while a minute below its head is missing.
    A record that does not decode is never marked: its gap stays until a
    replay with a reader that decodes it.

    The heads and the batch metrics share one round trip, in a pipeline without
    MULTI: nothing gains from running them as a unit (each head script is atomic
    by itself and only ever sets bits, so a retry changes nothing; the
    metrics are counters that add up in any order). Every command runs whatever
    its neighbours reply, and the replies are read one by one: a metrics error
    is only logged (metrics never fail a batch), a head's error raises (the job
    is retried). A lost connection raises, as the head advance alone did.
    EVAL rather than a registered `Script`: in a pipeline a Script costs a
    SCRIPT EXISTS round trip per batch, while Redis caches the compiled script
    by its SHA, so sending its text again is the cheaper path.
    """
    by_project: dict[str, list[LoggedMinute]] = {}
    for r in records:
        of_project = by_project.get(r.minute.project_id)
        if of_project is None:
            of_project = by_project[r.minute.project_id] = []
        of_project.append(r)
    pipe = connection.pipeline(transaction=False)
    stamp = repr(indexed_at)
    for project_id, of_project in by_project.items():
        seqs = runs([r.seq for r in of_project])
        pipe.eval(_ADVANCE_HEAD, 2, keys.index_head(project_id), keys.index_done(project_id), stamp, *seqs)
    ctx.metrics.batch("index", batch_minutes, batch_seconds, pipeline=pipe)
    replies = pipe.execute(raise_on_error=False)
    heads, metrics = replies[: len(by_project)], replies[len(by_project) :]
    for reply in heads:
        if isinstance(reply, Exception):
            raise reply
    _log_metrics_errors(metrics)
    fresh: list[LoggedMinute] = []
    for of_project, (_, _, flags) in zip(by_project.values(), heads, strict=True):
        if isinstance(flags, str):  # a connection that decodes replies
            flags = flags.encode()
        fresh.extend(r for r, flag in zip(of_project, flags, strict=True) if flag == FRESH)
    return list(by_project), fresh


def _log_metrics_errors(replies: Iterable[Any]) -> None:
    for reply in replies:
        if isinstance(reply, Exception):
            log.warning("index pool: metrics not recorded: %s", reply)
            return


def _lags(fresh: Sequence[LoggedMinute], indexed_at: float) -> list[float]:
    """Stream entry -> indexed seconds of minutes indexed for the first time (not of re-indexed ones).

    From the entry time Redis set (`pvm.metrics.entry_time_ms`), not the
    producer's timestamp, whose clock may be off by any amount; records
    without an entry time are not counted.
    """
    return [indexed_at - r.entry_ms / 1000.0 for r in fresh if r.entry_ms is not None]


@dataclass
class FactStep:
    """What the fact step did with a batch: knowledge changes applied, fact points written, what failed."""

    changes: int = 0
    points: int = 0
    unparsed: list[str] = field(default_factory=list)  # minute ids indexed as plain minutes only
    skipped: list[str] = field(default_factory=list)  # changes that parse but do not apply to their fact
    failed: dict[str, Exception] = field(default_factory=dict)  # project -> why its changes were not written


def _index_facts(
    ctx: IndexContext, connection: redis.Redis, changes: Sequence[fact_points.ParsedChange], unparsed: list[str]
) -> FactStep:
    """Apply the batch's knowledge changes (parsed by `fact_points.parse`) to their facts' points, tenant by tenant.

    Each tenant's points are read, folded with the changes and written back
    under a lease (`keys.fact_points_lock`): two index workers never
    interleave on one tenant. A tenant whose points cannot be written fails
    the projects whose minutes carried its changes (their heads wait, the job
    is retried); the others go on. A batch without knowledge changes costs
    one pass over its event types.
    """
    step = FactStep(unparsed=unparsed)
    step.changes = len(changes)
    by_tenant: dict[str, list[fact_points.ParsedChange]] = {}
    for change in changes:
        by_tenant.setdefault(change.tenant, []).append(change)
    for tenant, of_tenant in by_tenant.items():
        try:
            with _tenant_lease(connection, keys.fact_points_lock(None if tenant == GLOBAL_TENANT else tenant)):
                point_keys, cleared = fact_points.needed(of_tenant)
                stored = ctx.engine.get_points(tenant, point_keys, tier_keys=cleared, with_vectors=True)
                planned = fact_points.plan(tenant, of_tenant, {p.key: p for p in stored})
                if planned.points:
                    ctx.engine.upsert(_embedded(ctx, planned.points))
            step.points += planned.facts
            step.skipped += planned.skipped
        except Exception as exc:
            log.error("index pool: the fact points of %s were not written: %s", tenant, exc)
            for change in of_tenant:
                step.failed.setdefault(change.event.project_id, exc)
    return step


_RELEASE_LEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


_OWNER_NONCE = uuid.uuid4().hex[:8]


def _lease_owner() -> str:
    """This process's and thread's token on the fact-point leases (a forked child's differs by its pid)."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{_OWNER_NONCE}"


@contextmanager
def _tenant_lease(connection: redis.Redis, name: str) -> Iterator[None]:
    """Hold the lease `name` (SET NX PX, `FACT_POINTS_LOCK_S`) while folding a tenant's fact points.

    Waits up to `FACT_POINTS_LOCK_WAIT_S` for another worker's lease, then raises `redis.exceptions.LockError`
    (the batch is retried). A lease that this very thread still holds, because its release was lost with a
    Valkey restart, is taken again at once instead of waited out: no other job of this thread can be in it.
    """
    owner = _lease_owner()
    deadline = time.monotonic() + defaults.FACT_POINTS_LOCK_WAIT_S
    ttl_ms = int(defaults.FACT_POINTS_LOCK_S * 1000)
    wait = 0.005
    while not connection.set(name, owner, nx=True, px=ttl_ms):
        if connection.get(name) == owner.encode() and connection.set(name, owner, xx=True, px=ttl_ms):
            break
        if time.monotonic() >= deadline:
            raise redis.exceptions.LockError("Unable to acquire lock within the time specified")
        time.sleep(wait)
        wait = min(wait * 2, 0.1)
    try:
        yield
    finally:
        connection.eval(_RELEASE_LEASE, 1, name, owner)


def _embedded(ctx: IndexContext, points: Sequence[MemoryPoint]) -> list[MemoryPoint]:
    """`points` with a dense vector for every fact point that has none, when embeddings are on."""
    embedder = ctx.embedder
    todo = [i for i, p in enumerate(points) if p.kind == FACT and p.dense is None]
    if embedder.dimensions is None or not todo:
        return list(points)
    vectors = embedder.embed([points[i].embed_text for i in todo])
    out = list(points)
    for i, vector in zip(todo, vectors, strict=True):
        out[i] = replace(out[i], dense=list(vector))
    return out


# Steps of `index_batch`, as named in its `timings`.
STEPS = ("decode", "build_points", "agent_memory", "upsert", "facts", "head_metrics")


def index_batch(
    ctx: IndexContext,
    connection: redis.Redis,
    records: Sequence[Sequence[Any]],
    timings: dict[str, float] | None = None,
    skip_projects: Collection[str] = (),
) -> dict[str, Any]:
    """Index one batch of ``[minute_id, log_seq, minute_bytes, entry_ms]`` records: agent memory, points, index head.

    The body of the RQ job `run`. Records of `skip_projects` (indexed by an
    earlier attempt of the same job) are left out. When the vector store
    fails for some projects only, the others are indexed and their heads
    advanced, then `PartialIndexError` names both. `timings`, when given, gets
    the seconds each of `STEPS` took added to it (the reader benchmark reports
    them).
    """
    clock = time.perf_counter
    marks = [clock()]
    started = time.time()
    with cyclic_gc_paused():
        logged, undecodable = decode(records)
        logged = _unique(logged)
        if skip_projects:
            logged = [r for r in logged if r.minute.project_id not in skip_projects]
        marks.append(clock())
        try:
            # A knowledge change is its fact's point, not a minute point of its own (it would only repeat, in
            # searches for minutes, what the fact point says); one that does not parse is kept as a plain minute.
            changes, unparsed = fact_points.parse((r.minute, r.seq, r.at_ms) for r in logged)
            kept_plain = set(unparsed)
            of_points = [r for r in logged if r.minute.event_type not in FACT_EVENT_TYPES or r.minute.id in kept_plain]
            points = _points(of_points, started, dense=False)
            marks.append(clock())
            counted = ctx.memory.apply(_deltas(logged))
            marks.append(clock())
            try:
                if points:  # the engine (and embedder) made on first use, as `_upsert` would
                    points = _with_dense_text(ctx, points, of_points)
                failed = _upsert(ctx, points)
                marks.append(clock())
                facts = _index_facts(
                    ctx, connection, [c for c in changes if c.event.project_id not in failed], unparsed
                )
                for project_id, error in facts.failed.items():
                    failed.setdefault(project_id, error)
            finally:  # also after a failed upsert: a shard set aside must not wait for a batch that succeeds
                if points:
                    _rebuild_broken_shards(ctx, connection)  # before the heads: this batch's points are in the new one
            marks.append(clock())
        except Exception:
            ctx.metrics.failure("index", len(records))  # best-effort: never raises in place of the batch's error
            raise
        if failed:
            logged = [r for r in logged if r.minute.project_id not in failed]
        indexed_at = time.time()
        projects, fresh = _advance_heads(ctx, connection, logged, len(records), indexed_at - started, indexed_at)
        # A round trip of its own: which minutes count depends on the heads' replies.
        ctx.metrics.freshness("indexed", _lags(fresh, indexed_at))  # best-effort
        refused = sum(p.project_id in failed for p in points) if failed else 0
        indexed = len(points) - refused
        # Freed while the collector still sleeps: back on, it would first walk the batch's objects (dead weight).
        del points, logged, fresh
    marks.append(clock())
    if failed:
        ctx.metrics.failure("index", refused)  # best-effort
        raise PartialIndexError(projects, failed) from next(iter(failed.values()))
    if timings is not None:
        for step, begun, ended in zip(STEPS, marks[:-1], marks[1:], strict=True):
            timings[step] = timings.get(step, 0.0) + ended - begun
    result = {
        "indexed": indexed,
        "agent_minutes_counted": counted,
        "undecodable": undecodable,
        "projects": sorted(projects),
        "seconds": round(indexed_at - started, 6),
    }
    if facts.changes or facts.unparsed:
        result["fact_changes"] = facts.changes
        result["fact_points"] = facts.points
        result["unparsed_fact_changes"] = facts.unparsed
        result["skipped_fact_changes"] = facts.skipped
    return result


# job.meta field: projects of the job's batch indexed by an earlier attempt (a retry leaves them out).
INDEXED_META = "indexed_projects"


def run(worker: WorkerContext, records: list[list[Any]]) -> dict[str, Any]:
    """The job `keys.INDEX_JOB`: index one batch of durable minutes (agent memory, vector points, index head).

    When the vector store fails for some projects of the batch, the job fails
    after indexing the others, and records them in its meta: RQ's retry (or a
    requeue) redoes only the projects that failed.
    """
    job = get_current_job()
    assert job is not None, f"{keys.INDEX_JOB} runs inside an RQ worker"
    done: list[str] = job.meta.get(INDEXED_META, [])
    try:
        return index_batch(worker.part(_context), worker.connection, records, skip_projects=frozenset(done))
    except PartialIndexError as exc:
        job.meta[INDEXED_META] = sorted({*done, *exc.indexed})
        job.save_meta()
        raise


def run_summaries(worker: WorkerContext, project_id: str, threads: list[dict[str, Any]]) -> dict[str, Any]:
    """The job `keys.SUMMARY_POINTS_JOB`: upsert the summary points of what a summarize batch changed of a project's
    threads (`workers.index.summary_points`); on the index queue, because this pool's worker owns the engine."""
    from pvm.engines import shared
    from workers.index import summary_points

    engine, embedder = shared(worker.settings)
    return {"project_id": project_id, **summary_points.index_summaries(engine, embedder, project_id, threads)}


def reset_project(worker: WorkerContext, project_id: str) -> dict[str, Any]:
    """The job `keys.INDEX_RESET_JOB`: forget a project's derived memory (vector points, agent memory, index
    head) before a replay.

    Runs on the index queue so that, with the embedded engine, it runs in the
    one process that owns the engine's files.
    """
    ctx = worker.part(_context)
    ctx.engine.delete_project(project_id)
    ctx.memory.reset(project_id)
    worker.connection.delete(keys.index_head(project_id), keys.index_done(project_id))
    return {"project_id": project_id, "reset": True}


def optimize(worker: WorkerContext, project_id: str | None = None) -> dict[str, Any]:
    """The job `keys.INDEX_OPTIMIZE_JOB`: optimize the embedded engine's shards (all, or one project's);
    explicit and blocking.

    With a Qdrant server the server optimizes on its own and this does nothing.
    """
    engine = worker.part(_context).engine
    run_optimize = getattr(engine, "optimize", None)
    if run_optimize is None:
        return {"optimized": {}, "note": "the Qdrant server optimizes its collections itself"}
    started = time.time()
    done = run_optimize(project_id)
    return {"optimized": done, "seconds": round(time.time() - started, 3)}

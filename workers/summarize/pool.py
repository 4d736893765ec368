"""The summarize pool: keeps a thread's newest minutes verbatim, folds older ones into chunk summaries and episodes.

Fed by the log pool's fan-out (queue ``pvm-summarize``) with records ``[minute_id, log_seq, minute_bytes,
entry_ms]``. Each minute joins its thread (`contracts.summaries.thread_of`: its ``thread_id``, else its
task, else its project; PVM_THREAD_BY) as a pending minute; the project's summarize head then moves
(a contiguous watermark, `workers.runtime.heads`), and every thread holding minutes that are now at or below
it is advanced by the pure core (`workers.summarize.threads.advance`): episodes read, chunks of PVM_SUMMARY_CHUNK
made past the newest PVM_SUMMARY_RECENT, the oldest merged past PVM_SUMMARY_MAX_CHUNKS. A project's
threads are changed by one worker at a time (a lease on the project, ARCHITECTURE invariant 8);
different projects in parallel.

A chunk a model summarized (PVM_SUMMARIZER=llm) is written to the log as a ``chunk_summarized`` minute
(its id derived from the chunk, so a retried job writes the same id), and replay uses it instead of
calling the model (`replay_summaries`). A ``chunk_summarized`` minute coming back through the log is
checked (`contracts.summaries.chunk_summarized`) and, when it names a chunk the thread holds, its
summary is the chunk's; a forged or broken one is refused (logged, counted, never applied).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import msgpack
import redis

from contracts import ContractError, Minute, decode_durable_minute, encode_minute, keys
from contracts.ids import derived_minute_id
from contracts.minute import iso_from_ms
from contracts.summaries import (
    SUMMARY_EVENT_TYPES,
    Chunk,
    ChunkSummarized,
    Episode,
    ThreadRef,
    chunk_summarized,
    chunk_summarized_minute,
    thread_of,
)
from pvm import defaults
from pvm.config import Settings
from pvm.metrics import MetricsRecorder
from pvm.stores.log import LogReader
from pvm.stores.summaries import SummaryStore, decode_chunks, decode_episodes, encode_records
from workers.runtime.context import WorkerContext
from workers.runtime.heads import FRESH, advance_script, runs
from workers.runtime.messages import FannedOut, ThreadChanges, decode_fanned_out, thread_changes
from workers.runtime.minutes import write_minutes
from workers.runtime.queues import enqueue_pool_job, pool_queue
from workers.summarize.episodes import OpenPatterns
from workers.summarize.summarizers import ChunkText, Logged, Summarizer, summarizer_from_settings
from workers.summarize.threads import Advanced, ThreadShape, ThreadState, advance

log = logging.getLogger(__name__)

STAGE = "summarize"  # the stage of the batch metrics and of freshness
_ADVANCE_HEAD = advance_script("summarized_at")
_Record = TypeVar("_Record", Chunk, Episode)
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


# -- decoding ---------------------------------------------------------------------------------------------------


Received = FannedOut  # a fanned-out minute as this pool reads it (workers/runtime/messages.py)


def decode(records: Sequence[Sequence[Any]]) -> tuple[list[Received], list[str]]:
    """Decode fanned-out records (`messages.decode_fanned_out`): the minutes, each once, and the bad ids."""
    return decode_fanned_out(records, "summarize")


# -- the store's thread state ------------------------------------------------------------------------------------


def state_from_hash(thread: ThreadRef, raw: dict[bytes, bytes]) -> ThreadState:
    """A thread's state from its hash (`keys.thread_state`); an empty hash is a new thread."""
    open_raw = raw.get(b"open")
    return ThreadState(
        thread=thread,
        chunks=decode_chunks(raw.get(b"chunks")),
        episodes=decode_episodes(raw.get(b"episodes")),
        open=OpenPatterns.from_dict(msgpack.unpackb(open_raw, raw=False) if open_raw else None),
        final_seq=int(raw.get(b"final_seq", 0)),
        chunked_seq=int(raw.get(b"chunked_seq", 0)),
        minutes=int(raw.get(b"minutes", 0)),
    )


def state_to_hash(state: ThreadState) -> dict[Any, Any]:  # redis-py types a mapping's keys invariantly
    return {
        "chunks": encode_records(state.chunks),
        "episodes": encode_records(state.episodes),
        "open": msgpack.packb(state.open.to_dict(), use_bin_type=True),
        "final_seq": state.final_seq,
        "chunked_seq": state.chunked_seq,
        "minutes": state.minutes,
    }


# -- RQ entry point ---------------------------------------------------------------------------------------------


@dataclass
class SummarizeContext:
    """What a batch is worked with: settings, the summarizer, metrics, and this process's lease token."""

    settings: Settings
    summarizer: Summarizer
    metrics: MetricsRecorder
    owner: str
    shape: ThreadShape = field(default_factory=ThreadShape)

    @classmethod
    def build(
        cls, connection: redis.Redis, settings: Settings, summarizer: Summarizer | None = None
    ) -> SummarizeContext:
        metrics = MetricsRecorder(connection)
        return cls(
            settings=settings,
            summarizer=summarizer_from_settings(settings, metrics) if summarizer is None else summarizer,
            metrics=metrics,
            owner=f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
            shape=shape_of(settings),
        )


def shape_of(settings: Settings) -> ThreadShape:
    return ThreadShape(settings.summary_recent, settings.summary_chunk, settings.summary_max_chunks)


def _context(worker: WorkerContext) -> SummarizeContext:
    """The summarize pool's parts of a worker, built on its first summarize job (`WorkerContext.part`)."""
    return SummarizeContext.build(worker.connection, worker.settings)


class ProjectBusy(RuntimeError):
    """Another summarize worker held a project for longer than a batch waits; the job is retried."""


def summarize_batch(ctx: SummarizeContext, connection: redis.Redis, records: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """Work one batch of ``[minute_id, log_seq, minute_bytes, entry_ms]`` records into threads; the body of `run`."""
    started = time.time()
    received, undecodable = decode(records)
    by_project: dict[str, list[Received]] = {}
    for r in received:
        by_project.setdefault(r.minute.project_id, []).append(r)
    counts: Counter[str] = Counter()
    fresh: list[Received] = []
    try:
        for project_id, items in by_project.items():
            with _ProjectLease(connection, project_id, ctx.owner):
                fresh += _project_batch(ctx, connection, project_id, items, counts)
    except Exception:
        ctx.metrics.failure(STAGE, len(records))  # best-effort: never raises in place of the batch's error
        raise
    done_at = time.time()
    pipe = connection.pipeline(transaction=False)
    ctx.metrics.batch(STAGE, len(records), done_at - started, pipeline=pipe)
    ctx.metrics.freshness(
        STAGE, [done_at - r.entry_ms / 1000.0 for r in fresh if r.entry_ms is not None], pipeline=pipe
    )
    for name, n in counts.items():
        if n and name in keys.SUMMARY_COUNTERS:
            pipe.hincrby(keys.metrics_summaries(), name, n)
    try:
        pipe.execute()
    except redis.exceptions.RedisError as exc:
        log.warning("summarize pool: metrics not recorded: %s", exc)
    return {
        "minutes": len(received),
        "counts": dict(sorted(counts.items())),
        "undecodable": undecodable,
        "seconds": round(done_at - started, 6),
    }


class _ProjectLease:
    """The lease of one project's threads (SET NX PX), waited for up to `SUMMARIZE_LOCK_WAIT_S`."""

    def __init__(self, connection: redis.Redis, project_id: str, owner: str) -> None:
        self.connection, self.key, self.owner = connection, keys.summary_lock(project_id), owner

    def __enter__(self) -> None:
        wait = defaults.SUMMARIZE_LOCK_POLL_S
        deadline = time.monotonic() + defaults.SUMMARIZE_LOCK_WAIT_S
        while not self.connection.set(self.key, self.owner, nx=True, px=defaults.SUMMARIZE_LOCK_MS):
            if time.monotonic() >= deadline:
                raise ProjectBusy(
                    f"{self.key} stayed leased by another summarize worker for {defaults.SUMMARIZE_LOCK_WAIT_S} s; "
                    f"the job is retried (a worker that died holding it loses it after {defaults.SUMMARIZE_LOCK_MS} ms)"
                )
            time.sleep(wait)
            wait = min(wait * 2, 0.2)

    def __exit__(self, *exc: object) -> None:
        try:
            self.connection.eval(_RELEASE, 1, self.key, self.owner)
        except redis.exceptions.RedisError as error:  # it lapses by itself
            log.warning("summarize pool: lease %s not released: %s", self.key, error)


def _project_batch(
    ctx: SummarizeContext, connection: redis.Redis, project_id: str, items: Sequence[Received], counts: Counter[str]
) -> list[Received]:
    """One project's share of a batch, under its lease: join threads, move the head, advance dirty threads."""
    members: dict[ThreadRef, list[Received]] = {}
    summaries: list[tuple[Minute, ChunkSummarized]] = []
    for r in items:
        if r.minute.event_type in SUMMARY_EVENT_TYPES:
            try:
                summaries.append((r.minute, chunk_summarized(r.minute)))
            except ContractError as exc:
                counts["refused"] += 1
                log.warning("summarize pool: refused chunk_summarized %s of %s: %s", r.minute.id, project_id, exc)
            continue
        thread = thread_of(r.minute, ctx.settings.thread_by)
        if thread is not None:
            members.setdefault(thread, []).append(r)
    # 1: which of these minutes are chunked already (a retried or replayed batch)
    threads = list(members)
    pipe = connection.pipeline(transaction=False)
    for thread in threads:
        pipe.hget(keys.thread_state(project_id, thread.digest), "chunked_seq")
    chunked = [int(v or 0) for v in pipe.execute()]
    # 2: join the threads, move the head, list the dirty threads
    pipe = connection.pipeline(transaction=False)
    if threads:
        pipe.hset(keys.summary_threads(project_id), mapping={t.digest: str(t) for t in threads})
    for thread, below in zip(threads, chunked, strict=True):
        joining = [r for r in members[thread] if r.seq > below]
        if joining:
            pipe.zadd(keys.thread_pending(project_id, thread.digest), {r.minute.id: r.seq for r in joining})
            pipe.hset(
                keys.thread_bodies(project_id, thread.digest),
                mapping={r.minute.id: encode_minute(r.minute) for r in joining},
            )
            pipe.sadd(keys.summary_dirty(project_id), thread.digest)
    seqs = runs(sorted(r.seq for r in items))
    pipe.eval(
        _ADVANCE_HEAD, 2, keys.summarize_head(project_id), keys.summarize_done(project_id), repr(time.time()), *seqs
    )
    pipe.smembers(keys.summary_dirty(project_id))
    replies = pipe.execute()
    _, head, flags = replies[-2]
    dirty = sorted(d.decode() for d in replies[-1])
    by_seq = {r.seq: r for r in items}
    ordered = sorted(by_seq)
    flags = flags.encode() if isinstance(flags, str) else flags
    fresh = [by_seq[s] for s, flag in zip(ordered, flags, strict=True) if flag == FRESH]
    summarized_threads = {s.thread.digest for _, s in summaries}
    _advance_threads(ctx, connection, project_id, int(head), dirty, summarized_threads, summaries, counts)
    return fresh


def _advance_threads(
    ctx: SummarizeContext,
    connection: redis.Redis,
    project_id: str,
    head: int,
    dirty: Sequence[str],
    summarized: set[str],
    summaries: Sequence[tuple[Minute, ChunkSummarized]],
    counts: Counter[str],
) -> None:
    """Read the dirty threads (and those a logged summary names), advance them to `head`, write them back."""
    digests = sorted(set(dirty) | summarized)
    if not digests:
        return
    pipe = connection.pipeline(transaction=False)
    pipe.hmget(keys.summary_threads(project_id), digests)
    for digest in digests:
        pipe.hgetall(keys.thread_state(project_id, digest))
        pipe.zrange(keys.thread_pending(project_id, digest), 0, -1, withscores=True)
        pipe.hgetall(keys.thread_bodies(project_id, digest))
    replies = pipe.execute()
    names = replies[0]
    write = connection.pipeline(transaction=False)
    llm_minutes: list[Minute] = []
    points: list[ThreadChanges] = []  # what changed of each thread's summaries, for the vector index
    for i, digest in enumerate(digests):
        raw_name = names[i]
        if raw_name is None:
            continue  # a logged summary naming a thread the project never had: nothing to apply it to
        thread = ThreadRef.parse(raw_name.decode())
        state_raw, pending_raw, bodies = replies[1 + 3 * i : 4 + 3 * i]
        state = state_from_hash(thread, state_raw)
        before = _records(state)
        for minute, summary in summaries:
            if summary.thread == thread:
                _apply_logged_summary(state, minute, summary, counts)
        pending = []
        for member, score in pending_raw:
            body = bodies.get(member)
            if body is not None:
                pending.append(Logged(int(score), decode_durable_minute(body)))
        done = advance(project_id, state, pending, head, ctx.summarizer, ctx.shape)
        _count(done, counts)
        changed = thread_changes(
            project_id, thread, before, _records(state), {m.seq: (m.minute.id, m.minute.timestamp) for m in pending}
        )
        if changed is not None:
            points.append(changed)
        llm_minutes += [
            _summary_minute(project_id, chunk.thread, chunk.first_seq, chunk.last_seq, text, pending)
            for chunk, text in done.made
            if text.by_model
        ]
        write.hset(keys.thread_state(project_id, digest), mapping=state_to_hash(state))
        if done.chunked_ids:
            write.zrem(keys.thread_pending(project_id, digest), *done.chunked_ids)
            write.hdel(keys.thread_bodies(project_id, digest), *done.chunked_ids)
        if all(m.seq <= head for m in pending):
            write.srem(keys.summary_dirty(project_id), digest)
    write.execute()
    if points and "index" in ctx.settings.downstream:
        _index_summaries(connection, project_id, points)
    if llm_minutes:
        write_minutes(connection, ctx.settings.shards, llm_minutes)


def _records(state: ThreadState) -> tuple[list[Chunk], list[Episode]]:
    """A thread's chunks and episodes as they are now (frozen records: a copy of the lists is a snapshot)."""
    return list(state.chunks), list(state.episodes)


def _index_summaries(connection: redis.Redis, project_id: str, threads: list[ThreadChanges]) -> None:
    """Hand what changed of a project's thread summaries to the index queue (the summary-points job)."""
    enqueue_pool_job(pool_queue("index", connection), keys.SUMMARY_POINTS_JOB, (project_id, threads))


def _apply_logged_summary(state: ThreadState, minute: Minute, summary: ChunkSummarized, counts: Counter[str]) -> None:
    """A ``chunk_summarized`` minute from the log: its summary becomes its chunk's (idempotent)."""
    for i, chunk in enumerate(state.chunks):
        if chunk.merged == 1 and chunk.id == summary.chunk_id:
            state.chunks[i] = type(chunk)(
                project_id=chunk.project_id,
                thread=chunk.thread,
                seq_ranges=chunk.seq_ranges,
                minute_count=chunk.minute_count,
                summary=summary.summary,
                key_topics=summary.key_topics,
                participants=chunk.participants,
                outcome=summary.outcome,
                summarizer=f"llm:{summary.model}"[: defaults.SUMMARY_MODEL_NAME_CHARS],
                tokens=chunk.tokens,
                decisions=chunk.decisions,
            )
            return
    log.info(
        "summarize pool: chunk_summarized %s names no chunk %s holds now (merged since, or never drawn); logged only",
        minute.id,
        state.thread,
    )


def _count(done: Advanced, counts: Counter[str]) -> None:
    counts["chunks"] += len(done.made)
    counts["merged"] += done.merged
    counts["episodes"] += done.episodes
    counts["llm_summaries"] += sum(1 for _, text in done.made if text.by_model)
    counts["llm_fallbacks"] += sum(1 for _, text in done.made if text.fell_back)


def _summary_minute(
    project_id: str, thread: ThreadRef, first: int, last: int, text: ChunkText, pending: Sequence[Logged]
) -> Minute:
    """The ``chunk_summarized`` minute of a chunk a model summarized, timed at (just after) its newest minute."""
    newest = next(m.minute for m in pending if m.seq == last)
    ms = int(datetime.fromisoformat(newest.timestamp).timestamp() * 1000) + 1
    summarized = ChunkSummarized(
        thread=thread,
        first_seq=first,
        last_seq=last,
        summary=text.summary,
        key_topics=text.key_topics,
        outcome=text.outcome,
        model=text.summarizer.removeprefix("llm:") or "llm",
    ).check(project_id)
    return chunk_summarized_minute(
        project_id,
        summarized,
        minute_id=derived_minute_id(ms, project_id, "chunk_summarized", summarized.chunk_id),
        timestamp=iso_from_ms(ms),
        context_references=tuple(m.minute.id for m in pending if first <= m.seq <= last)[:2],
    )


def run(worker: WorkerContext, records: list[list[Any]]) -> dict[str, Any]:
    """The job `keys.SUMMARIZE_JOB`: work one fanned-out batch of durable minutes into threads (see the module
    docstring)."""
    return summarize_batch(worker.part(_context), worker.connection, records)


# -- replay -----------------------------------------------------------------------------------------------------


@dataclass
class SummariesReplay:
    """What rebuilding one project's threads did."""

    minutes: int = 0
    threads: int = 0
    chunks: int = 0
    episodes: int = 0
    from_log: int = 0  # chunks whose summary a chunk_summarized minute gave (no model called)
    refused: int = 0
    points: list[ThreadChanges] = field(default_factory=list)  # every thread's summaries, for `index_replayed`


def replay_summaries(
    connection: redis.Redis, settings: Settings, project_id: str, summarizer: Summarizer | None = None
) -> SummariesReplay:
    """Forget a project's threads, then rebuild them from its log through the pool's own core, in log order.

    No model is called: a chunk a model summarized has its ``chunk_summarized`` minute in the log, and takes
    its summary from it; every other chunk is summarized extractively (as the pool did when it made it).
    The summarize head ends at the log's last seq. `points` holds every thread's chunks and episodes, and as
    retired those that merged away or were dropped on the way (as the pool retired them).
    """
    from workers.runtime.progress import Progress
    from workers.summarize.summarizers import ExtractiveSummarizer

    SummaryStore(connection).reset_project(project_id)
    log_reader = LogReader(settings.log_dir)
    done = SummariesReplay()
    overrides: dict[str, ChunkSummarized] = {}
    for record in log_reader.history(project_id):
        if record.fields.get("event_type") in SUMMARY_EVENT_TYPES:
            try:
                summary = chunk_summarized(record.minute)
            except ContractError:
                done.refused += 1
                continue
            overrides.setdefault(summary.chunk_id, summary)  # the first one logged, as the pool applied it
    summarizer = summarizer or ExtractiveSummarizer(ratio=settings.summary_ratio)
    shape = shape_of(settings)
    states: dict[ThreadRef, ThreadState] = {}
    pending: dict[ThreadRef, list[Logged]] = {}
    progress = Progress(f"replay {project_id}: threads", log_reader.count(project_id))
    last_seq = 0
    by_seq: dict[ThreadRef, dict[int, tuple[str, str]]] = {}  # each thread's minutes by log seq: the summaries' sources
    # Each thread's chunks and episodes that merged away or were dropped on the way: the live pool retired their
    # points, and the index reset deleted them, so the rebuild must retire them again.
    left: dict[ThreadRef, tuple[dict[str, Chunk], dict[str, Episode]]] = {}
    for record in log_reader.history(project_id):
        last_seq = record.seq
        done.minutes += 1
        if record.fields.get("event_type") in SUMMARY_EVENT_TYPES:
            continue
        minute = record.minute
        thread = thread_of(minute, settings.thread_by)
        if thread is None:
            continue
        state = states.setdefault(thread, ThreadState(thread))
        members = pending.setdefault(thread, [])
        members.append(Logged(record.seq, minute))
        by_seq.setdefault(thread, {})[record.seq] = (minute.id, minute.timestamp)
        before = _records(state)
        advanced = advance(project_id, state, members, record.seq, summarizer, shape, overrides)
        if advanced.merged or advanced.episodes:
            chunks_left, episodes_left = left.setdefault(thread, ({}, {}))
            _left(before[0], state.chunks, chunks_left)
            _left(before[1], state.episodes, episodes_left)
        if advanced.chunked_ids:
            chunked = set(advanced.chunked_ids)
            pending[thread] = [m for m in members if m.minute.id not in chunked]
        done.chunks += len(advanced.made)
        done.episodes += advanced.episodes
        done.from_log += advanced.from_log
        progress.show(done.minutes)
    pipe = connection.pipeline(transaction=False)
    for thread, state in states.items():
        digest = thread.digest
        pipe.hset(keys.summary_threads(project_id), digest, str(thread))
        pipe.hset(keys.thread_state(project_id, digest), mapping=state_to_hash(state))
        if pending[thread]:
            pipe.zadd(keys.thread_pending(project_id, digest), {m.minute.id: m.seq for m in pending[thread]})
            pipe.hset(
                keys.thread_bodies(project_id, digest),
                mapping={m.minute.id: encode_minute(m.minute) for m in pending[thread]},
            )
    if last_seq:
        pipe.eval(
            _ADVANCE_HEAD,
            2,
            keys.summarize_head(project_id),
            keys.summarize_done(project_id),
            repr(time.time()),
            1,
            last_seq,
        )
    pipe.execute()
    done.threads = len(states)
    for thread, state in states.items():
        chunks_left, episodes_left = left.get(thread, ({}, {}))
        gone = (_gone(chunks_left, state.chunks), _gone(episodes_left, state.episodes))
        message = thread_changes(project_id, thread, gone, _records(state), by_seq.get(thread, {}))
        if message is not None:
            done.points.append(message)
    progress.show(done.minutes, f"{done.chunks:,} chunks, {done.episodes:,} episodes", force=True)
    progress.done()
    return done


def _left(before: Sequence[_Record], after: Sequence[_Record], into: dict[str, _Record]) -> None:
    """Note in `into`, by id, the records of `before` that `after` does not hold as they were (merged, grown or
    dropped); one that grew keeps its id and is told apart at the end (`_gone`)."""
    held = {id(r) for r in after}  # frozen records: one kept unchanged is the same object
    into.update((r.id, r) for r in before if id(r) not in held)


def _gone(left: Mapping[str, _Record], final: Sequence[_Record]) -> list[_Record]:
    """The records that left a thread on the way and whose id it no longer holds: the live pool retired them."""
    held = {r.id for r in final}
    return [r for record_id, r in left.items() if record_id not in held]


def index_replayed(connection: redis.Redis, settings: Settings, project_id: str, done: SummariesReplay) -> None:
    """Hand a replayed project's thread summaries to the index queue, after its index reset (`pvm replay`)."""
    if done.points and "index" in settings.downstream:
        _index_summaries(connection, project_id, done.points)

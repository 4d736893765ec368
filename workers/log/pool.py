"""The log pool: makes each batch durable in the chronological log, then updates the caches and fans it out.

This is the commit point of PVM. Everything after the fsync (Redis caches,
downstream pools) is derived from what the log holds and can be rebuilt from it.

The log head (`keys.log_head`) is contiguous by construction, however many log
processes run: a project's seqs are assigned under its ``flock`` and committed
(the writer's journal fsynced, once for the whole batch) before the lock is
released, so when any process writes a head, every seq at or below it is
already durable. (A process that dies between its fsync and its
cache update leaves its minutes durable; its job's retry refreshes the caches.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from rq import Queue

from contracts import decode_durable_fields, keys
from contracts.summaries import SYSTEM_EVENT_TYPES
from pvm.config import Settings
from pvm.fsync import fsync_calls
from pvm.metrics import MetricsRecorder, entry_time_ms
from pvm.stores.cache import CachedMinute, MinuteCache
from pvm.stores.log import Appended, LogWriter
from workers.runtime.context import WorkerContext
from workers.runtime.messages import LoggedRecord
from workers.runtime.queues import pool_job, pool_queue

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Incoming:
    """One minute of a batch as the dispatcher handed it over."""

    entry_id: str
    minute_id: str
    project_id: str
    agent_id: str | None
    timestamp: str
    raw: bytes
    windowed: bool = (
        True  # False: a knowledge change or chunk summary, kept out of the recent windows (`CachedMinute.windowed`)
    )


@dataclass
class LogBatchResult:
    """What one batch did to the log."""

    appended: int = 0
    duplicates: int = 0
    fsyncs: int = 0  # made by this batch (one commit; more when another writer held some of its projects)
    projects: dict[str, list[tuple[Incoming, Appended]]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "appended": self.appended,
            "duplicates": self.duplicates,
            "fsyncs": self.fsyncs,
            "projects": sorted(self.projects),
        }


def plan(entries: Sequence[Sequence[Any]]) -> dict[str, list[Incoming]]:
    """Group a batch's ``[entry_id, minute_bytes]`` pairs by project, keeping stream order.

    The dispatcher validated every minute already; here we read only the fields
    the log and caches need.
    """
    by_project: dict[str, list[Incoming]] = {}
    for entry_id, raw in entries:
        body = decode_durable_fields(raw)
        item = Incoming(
            entry_id,
            body["id"],
            body["project_id"],
            body.get("agent_id"),
            body["timestamp"],
            raw,
            body.get("event_type") not in SYSTEM_EVENT_TYPES,
        )
        by_project.setdefault(item.project_id, []).append(item)
    return by_project


def process(writer: LogWriter, entries: Sequence[Sequence[Any]]) -> LogBatchResult:
    """Append a batch to the log (idempotent by minute id, one fsync whatever the number of projects)."""
    result = LogBatchResult()
    fsyncs_before = fsync_calls()
    planned = plan(entries)
    batches = {project_id: [(i.minute_id, i.entry_id, i.raw) for i in items] for project_id, items in planned.items()}
    for project_id, appended in writer.append_many(batches).items():
        result.projects[project_id] = list(zip(planned[project_id], appended, strict=True))
        for a in appended:
            if a.new:
                result.appended += 1
            else:
                result.duplicates += 1
    result.fsyncs = fsync_calls() - fsyncs_before
    return result


# -- RQ entry point -------------------------------------------------------------


@dataclass
class _Context:
    settings: Settings
    writer: LogWriter
    cache: MinuteCache
    downstream: list[Queue]
    metrics: MetricsRecorder


def _context(worker: WorkerContext) -> _Context:
    """The log pool's parts of a worker, built on its first log job (`WorkerContext.part`)."""
    settings, connection = worker.settings, worker.connection
    return _Context(
        settings=settings,
        writer=LogWriter(settings.log_dir),
        cache=MinuteCache(connection, settings.recent_window, settings.minute_cache_size),
        downstream=[pool_queue(p, connection) for p in settings.downstream],
        metrics=MetricsRecorder(connection),
    )


def _update_caches(cache: MinuteCache, result: LogBatchResult, durable_at: float) -> None:
    pipe = cache.connection.pipeline(transaction=False)
    for project_id, pairs in result.projects.items():
        cache.update(
            project_id,
            [CachedMinute(a.id, a.seq, item.raw, item.agent_id, item.windowed) for item, a in pairs],
            durable_at,
            pipeline=pipe,
        )
    pipe.execute()


def fanned_out(result: LogBatchResult) -> list[LoggedRecord]:
    """The batch's minutes as the pools downstream get them, in log order: with their stream entry time, which the
    index pool measures freshness from."""
    return [
        LoggedRecord(a.id, a.seq, item.raw, entry_time_ms(item.entry_id))
        for pairs in result.projects.values()
        for item, a in pairs
    ]


def _fan_out(queues: list[Queue], result: LogBatchResult, connection: redis.Redis, per_job: int) -> None:
    """The batch's records to every downstream queue, `per_job` to a job (in log order), all in one MULTI/EXEC."""
    if not queues:
        return
    records = fanned_out(result)
    parts = [records[start : start + per_job] for start in range(0, len(records), per_job)]
    with connection.pipeline(transaction=True) as pipe:
        for queue in queues:
            pool = queue.name.removeprefix("pvm-")
            queue.enqueue_many(
                [pool_job(keys.POOL_JOBS[pool], (part,)) for part in parts],
                pipeline=pipe,
            )
        pipe.execute()


def run(worker: WorkerContext, entries: list[list[Any]]) -> dict[str, Any]:
    """The job `keys.LOG_JOB`: log one dispatcher batch, then refresh caches and enqueue downstream work."""
    ctx = worker.part(_context)
    connection = worker.connection
    started = time.time()
    try:
        result = process(ctx.writer, entries)
    except Exception:
        ctx.metrics.failure("log", len(entries))  # best-effort: never raises in place of the batch's error
        raise
    durable_at = time.time()
    # Caches and fan-out cover the whole batch, duplicates included: a retried job
    # whose first attempt died after the fsync still refreshes them (both idempotent).
    _update_caches(ctx.cache, result, durable_at)
    _fan_out(ctx.downstream, result, connection, ctx.settings.fanout_batch)
    pipe = connection.pipeline(transaction=False)  # both metrics in one round trip
    ctx.metrics.batch("log", len(entries), time.time() - started, pipeline=pipe)
    ctx.metrics.freshness("durable", _lags(result, durable_at), pipeline=pipe)
    try:
        pipe.execute()
    except redis.exceptions.RedisError as exc:  # metrics are best-effort: the batch is durable and fanned out
        log.warning("log batch done; its metrics were not recorded: %s", exc)
    summary = result.summary()
    summary["seconds"] = round(durable_at - started, 6)
    return summary


def _lags(result: LogBatchResult, durable_at: float) -> list[float]:
    """Stream entry -> durable seconds of the minutes this batch made durable (not of redeliveries).

    From the entry time Redis set at XADD, not the producer's timestamp: see `entry_time_ms`.
    """
    lags = []
    for pairs in result.projects.values():
        for item, appended in pairs:
            if appended.new:
                entry_ms = entry_time_ms(item.entry_id)
                if entry_ms is not None:
                    lags.append(durable_at - entry_ms / 1000.0)
    return lags

"""The pipeline's state at one moment, read from Redis: streams and their groups, RQ queues, the stages' recorded
counters and freshness, and the schedules. The exporter serves it to Prometheus (adding each project's evaluation
run), `pvm status` prints it, and the web console's pools page shows it."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, cast

import redis
from rq import Queue
from rq.registry import (
    BaseRegistry,
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)

from contracts import keys
from pvm import defaults
from pvm.config import Settings
from pvm.connection import bulk_reply, hash_reply
from pvm.metrics import FRESHNESS_BUCKETS, Histogram, read_histogram
from workers.runtime.queues import live_workers
from workers.runtime.serializers import MsgpackSerializer

SCHEDULE_FIELDS = ("last", "every", "job")  # `<name>:<field>` in keys.schedules()
# The evaluate pool's counters (keys.metrics_evaluate), the `what` label of pvm_evaluate_total.
EVALUATE_COUNTERS = ("scored", "pruned", "merged", "conflicts", "tokens_reclaimed", "slices", "runs")


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _id_ms(entry_id: str) -> int:
    return int(entry_id.split("-", 1)[0])


@dataclass
class GroupState:
    name: str
    lag: int | None
    lag_source: str  # "redis" | "computed" (counted: Redis gave NULL) | "lower-bound" (counted up to the cap)
    pending: int
    oldest_pending_age_s: float | None


@dataclass
class StreamState:
    shard: int
    stream: str
    length: int
    dead_letters: int
    dead_letters_added: int | None  # None: Redis < 7 does not count them
    groups: list[GroupState] = field(default_factory=list)


@dataclass
class QueueState:
    pool: str
    queue: str
    queued: int
    dequeued: int  # in the queue's intermediate list: taken by a worker, not started yet
    started: int
    failed: int
    deferred: int
    scheduled: int
    finished: int
    workers: int  # live PVM workers (runner.live_workers)
    oldest_waiting_s: float | None
    requeued: dict[str, int]  # reason (keys.REAPER_REASONS) -> jobs the reaper ever requeued


@dataclass
class ScheduleState:
    """One periodic maintenance job as `pvm scheduler` records it in `keys.schedules()`."""

    name: str
    every_s: float | None  # None: no `<name>:every` field (written by the leader at every tick)
    last_run_at: float | None  # Unix seconds of the last run's enqueue; None: never ran
    last_job: str | None
    last_run_age_s: float | None
    next_due_in_s: float | None  # negative: overdue; None: never ran (due at the leader's next tick)


@dataclass
class Snapshot:
    """PVM's state at one moment, as the exporter and `pvm status` see it."""

    taken_at: float
    streams: list[StreamState]
    queues: list[QueueState]
    stages: dict[str, dict[str, float]]  # stage -> minutes, batches, failures
    freshness: dict[str, dict[str, float | None]]  # stage -> p50_s, p99_s, count
    schedules: list[ScheduleState] = field(default_factory=list)
    scheduler_leader: str | None = None  # the lease holder's name; None: no scheduler acts
    fact_changes: dict[str, int] = field(default_factory=dict)  # keys.FACT_CHANGE_COUNTERS, each from 0
    evaluate: dict[str, int] = field(default_factory=dict)  # EVALUATE_COUNTERS, each from 0
    evaluations: list[dict[str, Any]] = field(default_factory=list)  # per project: its run (evaluate_pool.run_state)
    summaries: dict[str, int] = field(default_factory=dict)  # keys.SUMMARY_COUNTERS, each from 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Counts a group's unread entries inside Redis, so no entry crosses the wire; at most `cap` per call.
_COUNT_UNREAD = """
-- KEYS[1]: stream; ARGV: the group's last-delivered id, cap, page. Returns {count, 1 if the count stopped at cap}.
if #redis.call('XREVRANGE', KEYS[1], ARGV[1], '-', 'COUNT', 1) == 0 then
  return {redis.call('XLEN', KEYS[1]), 0}  -- nothing at or before the group's position: every entry is unread
end
local cap, page, n, after = tonumber(ARGV[2]), tonumber(ARGV[3]), 0, '(' .. ARGV[1]
while n < cap do
  local want = math.min(page, cap - n)
  local entries = redis.call('XRANGE', KEYS[1], after, '+', 'COUNT', want)
  n = n + #entries
  if #entries < want then return {n, 0} end
  after = '(' .. entries[#entries][1]
end
return {n, #redis.call('XRANGE', KEYS[1], after, '+', 'COUNT', 1)}
"""


def _count_unread(connection: redis.Redis, stream: str, last_delivered: str) -> tuple[int, str]:
    """Entries past a group's last-delivered id: (count, "computed"), or (cap, "lower-bound") past the cap.

    Redis reports a NULL lag after trims or deletions it cannot account for.
    The entries are counted by a script on the server (only the count comes
    back), at most `defaults.EXPORTER_LAG_COUNT_CAP` per group and scrape, in
    XRANGE pages; a lag past the cap is reported as the cap, a lower bound.
    A group behind every entry left (its position trimmed away) is the
    stream's length, exactly, at the cost of one lookup.
    """
    cap = defaults.EXPORTER_LAG_COUNT_CAP
    count, capped = cast(
        list[int],
        connection.eval(_COUNT_UNREAD, 1, stream, last_delivered, cap, defaults.EXPORTER_LAG_COUNT_PAGE),
    )
    return int(count), "lower-bound" if capped else "computed"


def _group_state(connection: redis.Redis, stream: str, group: dict[str, Any], now_ms: int) -> GroupState:
    name = as_text(group["name"])
    pending = int(group["pending"])
    lag = group.get("lag")
    source = "redis"
    if lag is None:
        lag, source = _count_unread(connection, stream, as_text(group["last-delivered-id"]))
    oldest_age = None
    if pending:
        summary = connection.xpending(stream, name)
        if summary.get("min"):
            oldest_age = max(0.0, (now_ms - _id_ms(as_text(summary["min"]))) / 1000)
    return GroupState(name, int(lag), source, pending, oldest_age)


def _entries_added(connection: redis.Redis, stream: str) -> int | None:
    """Entries ever added to a stream, trimmed and deleted ones included (XINFO STREAM, Redis >= 7).

    Unlike the length it keeps rising once MAXLEN trims the stream, so it can
    feed a counter. A stream that does not exist has had nothing added.
    """
    try:
        info = connection.xinfo_stream(stream)
    except redis.exceptions.ResponseError:
        return 0  # no such key (XLEN of the same key already ruled out a wrong type)
    added = info.get("entries-added")
    return None if added is None else int(added)


def _oldest_waiting(connection: redis.Redis, queue: Queue, now: float) -> float | None:
    head = connection.lindex(queue.key, 0)
    if head is None:
        return None
    enqueued = connection.hget(f"{queue.job_class.redis_job_namespace_prefix}{as_text(head)}", "enqueued_at")
    if not enqueued:
        return None
    try:
        return max(0.0, now - datetime.fromisoformat(as_text(enqueued)).timestamp())
    except ValueError:
        return None


def _job_count(registry_class: type[BaseRegistry], queue: str, connection: redis.Redis) -> int:
    """Jobs in one of a queue's RQ registries, counted without RQ's cleanup (a scrape only reads)."""
    registry = registry_class(queue, connection=connection, serializer=MsgpackSerializer)
    return registry.get_job_count(cleanup=False)


def _requeued(connection: redis.Redis, queue: str) -> dict[str, int]:
    """The reaper's counters of one queue, every reason present (0 before its first requeue)."""
    raw = {as_text(k): v for k, v in hash_reply(connection.hgetall(keys.metrics_reaper(queue))).items()}
    return {reason: int(raw.get(reason, 0)) for reason in keys.REAPER_REASONS}


def _quantile(h: Histogram, q: float) -> float | None:
    if not h.count:
        return None
    target = q * h.count
    for label, cumulative in h.buckets:
        if cumulative >= target:
            return float("inf") if label == "+Inf" else float(label)
    return None


def _seconds(value: bytes | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None  # a hand-edited field: leave it out rather than fail the whole scrape


def _schedules(connection: redis.Redis, now: float) -> list[ScheduleState]:
    """Every schedule in `keys.schedules()` (fields `<name>:last|every|job`), by name."""
    raw = hash_reply(connection.hgetall(keys.schedules()))
    fields = {as_text(k): v for k, v in raw.items()}
    split = (f.rpartition(":") for f in fields)
    names = sorted({name for name, _, part in split if name and part in SCHEDULE_FIELDS})
    states = []
    for name in names:
        every = _seconds(fields.get(f"{name}:every"))
        last = _seconds(fields.get(f"{name}:last"))
        job = fields.get(f"{name}:job")
        states.append(
            ScheduleState(
                name=name,
                every_s=every,
                last_run_at=last,
                last_job=None if job is None else as_text(job),
                last_run_age_s=None if last is None else max(0.0, now - last),
                next_due_in_s=None if last is None or every is None else last + every - now,
            )
        )
    return states


def snapshot(connection: redis.Redis, settings: Settings) -> Snapshot:
    """Read the state of streams, queues, recorded metrics and schedules."""
    now = time.time()
    now_ms = int(now * 1000)
    streams = []
    for shard in range(settings.shards):
        stream = keys.stream(shard)
        length = int(connection.xlen(stream))
        dead_stream = keys.dead_letter_stream(shard)
        dead = int(connection.xlen(dead_stream))
        state = StreamState(shard, stream, length, dead, _entries_added(connection, dead_stream))
        try:
            groups = connection.xinfo_groups(stream)
        except redis.exceptions.ResponseError:
            groups = []
        for group in groups:
            state.groups.append(_group_state(connection, stream, group, now_ms))
        streams.append(state)
    queues = []
    for pool, name in keys.QUEUES.items():
        q = Queue(name, connection=connection, serializer=MsgpackSerializer)
        queues.append(
            QueueState(
                pool=pool,
                queue=name,
                queued=int(connection.llen(q.key)),
                dequeued=int(connection.llen(q.intermediate_queue_key)),
                started=_job_count(StartedJobRegistry, name, connection),
                failed=_job_count(FailedJobRegistry, name, connection),
                deferred=_job_count(DeferredJobRegistry, name, connection),
                scheduled=_job_count(ScheduledJobRegistry, name, connection),
                finished=_job_count(FinishedJobRegistry, name, connection),
                workers=len(live_workers(connection, name)),
                oldest_waiting_s=_oldest_waiting(connection, q, now),
                requeued=_requeued(connection, name),
            )
        )
    stages = {}
    for stage in sorted(as_text(s) for s in connection.smembers(keys.metrics_stages())):
        raw = connection.hgetall(keys.metrics_stage(stage))
        stages[stage] = {k: float(raw.get(k.encode(), 0)) for k in ("minutes", "batches", "failures")}
    freshness: dict[str, dict[str, float | None]] = {}
    for stage in sorted(as_text(s) for s in connection.smembers(keys.metrics_freshness_stages())):
        h = read_histogram(hash_reply(connection.hgetall(keys.metrics_freshness(stage))), FRESHNESS_BUCKETS)
        freshness[stage] = {"p50_s": _quantile(h, 0.5), "p99_s": _quantile(h, 0.99), "count": h.count}
    leader = bulk_reply(connection.get(keys.scheduler_leader()))
    counted = {as_text(k): int(v) for k, v in hash_reply(connection.hgetall(keys.metrics_fact_changes())).items()}
    evaluated = {as_text(k): int(v) for k, v in hash_reply(connection.hgetall(keys.metrics_evaluate())).items()}
    summarized = {as_text(k): int(v) for k, v in hash_reply(connection.hgetall(keys.metrics_summaries())).items()}
    return Snapshot(
        now,
        streams,
        queues,
        stages,
        freshness,
        schedules=_schedules(connection, now),
        scheduler_leader=None if leader is None else as_text(leader),
        fact_changes={name: counted.get(name, 0) for name in keys.FACT_CHANGE_COUNTERS},
        evaluate={name: evaluated.get(name, 0) for name in EVALUATE_COUNTERS},
        summaries={name: summarized.get(name, 0) for name in keys.SUMMARY_COUNTERS},
    )

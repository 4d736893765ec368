"""The exporter: reads PVM's state from Redis and serves it to Prometheus on /metrics.

Everything is read at scrape time: stream length, lag, pending and the age of
the oldest pending entry per shard and group; RQ queue states (dequeued
included: jobs a worker took and has not started) and live workers per pool;
the reaper's requeues per queue and reason; dead letters (held now, and ever
added); the job-level counters and histograms the pools record in Redis
(`pvm.metrics`), the facts pool's change counters and the summarize pool's
counters among them; and the scheduler's schedules and lease. `snapshot()` is
shared with `pvm status`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, cast

import redis
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
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
from pvm.metrics import BATCH_BUCKETS, FRESHNESS_BUCKETS, PROVIDER_BUCKETS, Histogram, read_histogram
from pvm.vectors import GLOBAL_TENANT  # the global tier's evaluation run is named for it (workers.evaluate.pool)
from workers.runtime.queues import live_workers
from workers.runtime.serializers import MsgpackSerializer

log = logging.getLogger(__name__)

SCHEDULE_FIELDS = ("last", "every", "job")  # `<name>:<field>` in keys.schedules()
# The evaluate pool's counters (keys.metrics_evaluate), the `what` label of pvm_evaluate_total.
EVALUATE_COUNTERS = ("scored", "pruned", "merged", "conflicts", "tokens_reclaimed", "slices", "runs")


def _s(value: Any) -> str:
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
    name = _s(group["name"])
    pending = int(group["pending"])
    lag = group.get("lag")
    source = "redis"
    if lag is None:
        lag, source = _count_unread(connection, stream, _s(group["last-delivered-id"]))
    oldest_age = None
    if pending:
        summary = connection.xpending(stream, name)
        if summary.get("min"):
            oldest_age = max(0.0, (now_ms - _id_ms(_s(summary["min"]))) / 1000)
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
    enqueued = connection.hget(f"{queue.job_class.redis_job_namespace_prefix}{_s(head)}", "enqueued_at")
    if not enqueued:
        return None
    try:
        return max(0.0, now - datetime.fromisoformat(_s(enqueued)).timestamp())
    except ValueError:
        return None


def _job_count(registry_class: type[BaseRegistry], queue: str, connection: redis.Redis) -> int:
    """Jobs in one of a queue's RQ registries, counted without RQ's cleanup (a scrape only reads)."""
    registry = registry_class(queue, connection=connection, serializer=MsgpackSerializer)
    return registry.get_job_count(cleanup=False)


def _requeued(connection: redis.Redis, queue: str) -> dict[str, int]:
    """The reaper's counters of one queue, every reason present (0 before its first requeue)."""
    raw = {_s(k): v for k, v in hash_reply(connection.hgetall(keys.metrics_reaper(queue))).items()}
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
    fields = {_s(k): v for k, v in raw.items()}
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
                last_job=None if job is None else _s(job),
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
    for stage in sorted(_s(s) for s in connection.smembers(keys.metrics_stages())):
        raw = connection.hgetall(keys.metrics_stage(stage))
        stages[stage] = {k: float(raw.get(k.encode(), 0)) for k in ("minutes", "batches", "failures")}
    freshness: dict[str, dict[str, float | None]] = {}
    for stage in sorted(_s(s) for s in connection.smembers(keys.metrics_freshness_stages())):
        h = read_histogram(hash_reply(connection.hgetall(keys.metrics_freshness(stage))), FRESHNESS_BUCKETS)
        freshness[stage] = {"p50_s": _quantile(h, 0.5), "p99_s": _quantile(h, 0.99), "count": h.count}
    leader = bulk_reply(connection.get(keys.scheduler_leader()))
    counted = {_s(k): int(v) for k, v in hash_reply(connection.hgetall(keys.metrics_fact_changes())).items()}
    evaluated = {_s(k): int(v) for k, v in hash_reply(connection.hgetall(keys.metrics_evaluate())).items()}
    summarized = {_s(k): int(v) for k, v in hash_reply(connection.hgetall(keys.metrics_summaries())).items()}
    return Snapshot(
        now,
        streams,
        queues,
        stages,
        freshness,
        schedules=_schedules(connection, now),
        scheduler_leader=None if leader is None else _s(leader),
        fact_changes={name: counted.get(name, 0) for name in keys.FACT_CHANGE_COUNTERS},
        evaluate={name: evaluated.get(name, 0) for name in EVALUATE_COUNTERS},
        evaluations=_evaluations(connection),
        summaries={name: summarized.get(name, 0) for name in keys.SUMMARY_COUNTERS},
    )


def _evaluations(connection: redis.Redis) -> list[dict[str, Any]]:
    """Each project's current or last evaluation run and when one last completed, by project."""
    from workers.evaluate.pool import run_state

    completed = {_s(k): float(v) for k, v in hash_reply(connection.hgetall(keys.evaluated_projects())).items()}
    projects = sorted({_s(p) for p in connection.smembers(keys.projects())} | set(completed) | {GLOBAL_TENANT})
    out = []
    for project_id in projects:
        state = run_state(connection, project_id)
        if state or project_id in completed:
            out.append({"project_id": project_id, **state, "last_completed": completed.get(project_id)})
    return out


class PvmCollector:
    """A prometheus_client collector that reads Redis at every scrape."""

    def __init__(self, connection: redis.Redis, settings: Settings) -> None:
        self.connection = connection
        self.settings = settings
        self.scrape_errors = 0
        self._lock = threading.Lock()

    def describe(self) -> list[Metric]:
        return []  # collected lazily: no Redis round trip at registration

    def collect(self) -> Iterator[Metric]:
        errors = CounterMetricFamily("pvm_exporter_scrape_errors", "Scrapes that failed to read Redis.")
        with self._lock:
            try:
                families = list(self._families())
            except redis.exceptions.RedisError as exc:
                log.warning("exporter: cannot read Redis: %s", exc)
                self.scrape_errors += 1
                families = []
            errors.add_metric([], self.scrape_errors)
        yield from families
        yield errors

    def _families(self) -> Iterator[Metric]:
        snap = snapshot(self.connection, self.settings)
        length = GaugeMetricFamily("pvm_stream_length", "Entries in a shard's minutes stream.", labels=["shard"])
        dead = GaugeMetricFamily("pvm_dead_letters", "Entries in a shard's dead-letter stream.", labels=["shard"])
        # The stream is capped (MAXLEN), so its length stops growing at the cap; this counter does not.
        dead_added = CounterMetricFamily(
            "pvm_dead_letters_added",
            "Entries ever added to a shard's dead-letter stream, including those trimmed or deleted since.",
            labels=["shard"],
        )
        lag = GaugeMetricFamily(
            "pvm_stream_lag", "Entries a consumer group has not read yet.", labels=["shard", "group"]
        )
        pending = GaugeMetricFamily(
            "pvm_stream_pending", "Entries read by a group and not acknowledged.", labels=["shard", "group"]
        )
        age = GaugeMetricFamily(
            "pvm_stream_oldest_pending_age_seconds",
            "Age of the oldest pending entry (since it was added to the stream).",
            labels=["shard", "group"],
        )
        for s in snap.streams:
            shard = str(s.shard)
            length.add_metric([shard], s.length)
            dead.add_metric([shard], s.dead_letters)
            if s.dead_letters_added is not None:
                dead_added.add_metric([shard], s.dead_letters_added)
            for g in s.groups:
                lag.add_metric([shard, g.name], g.lag if g.lag is not None else float("nan"))
                pending.add_metric([shard, g.name], g.pending)
                age.add_metric([shard, g.name], g.oldest_pending_age_s or 0.0)
        yield from (length, lag, pending, age, dead, dead_added)

        jobs = GaugeMetricFamily("pvm_queue_jobs", "RQ jobs of a pool by status.", labels=["queue", "pool", "status"])
        workers = GaugeMetricFamily(
            "pvm_queue_workers", "PVM workers serving a queue whose alive key is fresh.", labels=["queue", "pool"]
        )
        waiting = GaugeMetricFamily(
            "pvm_queue_oldest_waiting_seconds", "How long the next queued job has waited.", labels=["queue", "pool"]
        )
        requeued = CounterMetricFamily(
            "pvm_reaper_requeued",
            "Jobs the reaper put back on their queue: their worker died (dead_worker), "
            "or they were dequeued and never started (stranded).",
            labels=["queue", "reason"],
        )
        for q in snap.queues:
            for status in ("queued", "dequeued", "started", "failed", "deferred", "scheduled", "finished"):
                jobs.add_metric([q.queue, q.pool, status], getattr(q, status))
            workers.add_metric([q.queue, q.pool], q.workers)
            waiting.add_metric([q.queue, q.pool], q.oldest_waiting_s or 0.0)
            for reason, count in q.requeued.items():
                requeued.add_metric([q.queue, reason], count)
        yield from (jobs, workers, waiting, requeued)

        minutes = CounterMetricFamily("pvm_stage_minutes", "Minutes a stage processed.", labels=["stage"])
        batches = CounterMetricFamily("pvm_stage_batches", "Batches a stage processed.", labels=["stage"])
        failures = CounterMetricFamily("pvm_stage_failures", "Minutes in batches that failed.", labels=["stage"])
        durations = HistogramMetricFamily(
            "pvm_stage_batch_duration_seconds", "Time a stage spent on one batch.", labels=["stage"]
        )
        for stage, counts in snap.stages.items():
            minutes.add_metric([stage], counts["minutes"])
            batches.add_metric([stage], counts["batches"])
            failures.add_metric([stage], counts["failures"])
            h = read_histogram(hash_reply(self.connection.hgetall(keys.metrics_stage_duration(stage))), BATCH_BUCKETS)
            durations.add_metric([stage], h.buckets, h.sum)
        yield from (minutes, batches, failures, durations)

        # Every change is served from 0 before the facts pool's first batch, so increase() sees the first one.
        changes = CounterMetricFamily(
            "pvm_facts_changes",
            "The facts pool's work: candidates extracted, change minutes written by kind (asserted, confirmed, "
            "promoted, superseded, contradicted), change minutes from the log refused.",
            labels=["change"],
        )
        for change, count in snap.fact_changes.items():
            changes.add_metric([change], count)
        yield changes

        summaries = CounterMetricFamily(
            "pvm_summaries",
            "The summarize pool's work: chunks made, chunks merged past the thread's max, episodes made, chunks a "
            "model summarized, chunks the extractive summarizer took over from a failed model call, "
            "chunk_summarized minutes from the log refused.",
            labels=["what"],
        )
        for what, count in snap.summaries.items():
            summaries.add_metric([what], count)
        yield summaries

        fresh = HistogramMetricFamily(
            "pvm_freshness_seconds", "Time from emit until a minute reached a stage.", labels=["stage"]
        )
        for stage in snap.freshness:
            h = read_histogram(hash_reply(self.connection.hgetall(keys.metrics_freshness(stage))), FRESHNESS_BUCKETS)
            fresh.add_metric([stage], h.buckets, h.sum)
        yield fresh

        work = CounterMetricFamily(
            "pvm_evaluate",
            "The evaluate pool's work: memories scored, pruned, merged (near-duplicates), conflicts flagged, "
            "tokens reclaimed (what pruned memories cost in a context), slices and runs completed.",
            labels=["what"],
        )
        for what, count in snap.evaluate.items():
            work.add_metric([what], count)
        completed = GaugeMetricFamily(
            "pvm_evaluation_last_completed_timestamp_seconds",
            "Unix time a project's last evaluation run completed (no sample: it never did).",
            labels=["project"],
        )
        progress = GaugeMetricFamily(
            "pvm_evaluation_progress_ratio",
            "Share of the log slices a project's current (or last) evaluation run has done.",
            labels=["project"],
        )
        for run in snap.evaluations:
            if run.get("last_completed") is not None:
                completed.add_metric([run["project_id"]], run["last_completed"])
            if run.get("minute_slices"):
                progress.add_metric([run["project_id"]], min(1.0, run["slices_done"] / run["minute_slices"]))
        yield from (work, completed, progress)

        last_run = GaugeMetricFamily(
            "pvm_schedule_last_run_timestamp_seconds",
            "Unix time a schedule's last run was enqueued (no sample: it never ran).",
            labels=["schedule"],
        )
        interval = GaugeMetricFamily(
            "pvm_schedule_interval_seconds", "Seconds between a schedule's runs.", labels=["schedule"]
        )
        for sched in snap.schedules:
            if sched.last_run_at is not None:
                last_run.add_metric([sched.name], sched.last_run_at)
            if sched.every_s is not None:
                interval.add_metric([sched.name], sched.every_s)
        leader = GaugeMetricFamily(
            "pvm_scheduler_leader",
            "1, labelled with the name of the scheduler that holds the lease (no sample: none does).",
            labels=["scheduler"],
        )
        if snap.scheduler_leader is not None:
            leader.add_metric([snap.scheduler_leader], 1)
        yield from (last_run, interval, leader)

        calls = CounterMetricFamily(
            "pvm_provider_calls", "Calls to embedding/LLM providers.", labels=["provider", "kind", "outcome"]
        )
        tokens = CounterMetricFamily("pvm_provider_tokens", "Tokens sent to providers.", labels=["provider", "kind"])
        completion_tokens = CounterMetricFamily(
            "pvm_provider_completion_tokens", "Tokens LLM providers answered with.", labels=["provider", "kind"]
        )
        latency = HistogramMetricFamily(
            "pvm_provider_latency_seconds", "Provider call latency.", labels=["provider", "kind"]
        )
        for name in sorted(_s(n) for n in self.connection.smembers(keys.metrics_providers())):
            provider, _, kind = name.partition("|")
            raw = {_s(k): float(v) for k, v in self.connection.hgetall(keys.metrics_provider(name)).items()}
            for key, value in raw.items():
                if key.startswith("calls:"):
                    calls.add_metric([provider, kind, key.removeprefix("calls:")], value)
            tokens.add_metric([provider, kind], raw.get("tokens", 0.0))
            completion_tokens.add_metric([provider, kind], raw.get("completion_tokens", 0.0))
            h = read_histogram(
                hash_reply(self.connection.hgetall(keys.metrics_provider_latency(name))), PROVIDER_BUCKETS
            )
            latency.add_metric([provider, kind], h.buckets, h.sum)
        yield from (calls, tokens, completion_tokens, latency)

        chunks = CounterMetricFamily(
            "pvm_fact_extraction_chunks",
            "Chunks of minutes a fact extractor read, by outcome (answered, or a rule fallback's reason).",
            labels=["extractor", "outcome"],
        )
        items = CounterMetricFamily(
            "pvm_fact_extraction_items",
            "Items of extractor answers, kept or dropped (unknown_ref, refused).",
            labels=["extractor", "outcome"],
        )
        raw = {_s(k): float(v) for k, v in self.connection.hgetall(keys.metrics_extraction()).items()}
        for name, value in sorted(raw.items()):
            extractor, _, rest = name.partition(":")
            what, _, outcome = rest.partition(":")
            family = chunks if what == "chunks" else items if what == "items" else None
            if family is not None and outcome:
                family.add_metric([extractor, outcome], value)
        yield from (chunks, items)


def serve(
    connection: redis.Redis, settings: Settings, port: int = defaults.EXPORTER_PORT, addr: str = defaults.BIND_ADDR
) -> Any:
    """Start the /metrics HTTP server in a background thread; returns (server, thread)."""
    registry = CollectorRegistry()
    registry.register(PvmCollector(connection, settings))
    return start_http_server(port, addr=addr, registry=registry)

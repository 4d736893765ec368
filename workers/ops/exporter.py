"""The exporter: reads PVM's state from Redis and serves it to Prometheus on /metrics.

Everything is read at scrape time: stream length, lag, pending and the age of
the oldest pending entry per shard and group; RQ queue states (dequeued
included: jobs a worker took and has not started) and live workers per pool;
the reaper's requeues per queue and reason; dead letters (held now, and ever
added); the job-level counters and histograms the pools record in Redis
(`pvm.metrics`), the facts pool's change counters and the summarize pool's
counters among them; and the scheduler's schedules and lease. `snapshot()`
(workers.runtime.state's, with each project's evaluation run) is shared with
`pvm status`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import redis
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from contracts import keys
from pvm import defaults
from pvm.config import Settings
from pvm.connection import hash_reply
from pvm.metrics import BATCH_BUCKETS, FRESHNESS_BUCKETS, PROVIDER_BUCKETS, read_histogram
from pvm.vectors import GLOBAL_TENANT  # the global tier's evaluation run is named for it (workers.evaluate.pool)
from workers.runtime import state
from workers.runtime.state import Snapshot, as_text

log = logging.getLogger(__name__)


def snapshot(connection: redis.Redis, settings: Settings) -> Snapshot:
    """The pipeline's state (`workers.runtime.state.snapshot`) and each project's evaluation run."""
    snap = state.snapshot(connection, settings)
    snap.evaluations = _evaluations(connection)
    return snap


def _evaluations(connection: redis.Redis) -> list[dict[str, Any]]:
    """Each project's current or last evaluation run and when one last completed, by project."""
    from workers.evaluate.pool import run_state

    completed = {as_text(k): float(v) for k, v in hash_reply(connection.hgetall(keys.evaluated_projects())).items()}
    projects = sorted({as_text(p) for p in connection.smembers(keys.projects())} | set(completed) | {GLOBAL_TENANT})
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
        for name in sorted(as_text(n) for n in self.connection.smembers(keys.metrics_providers())):
            provider, _, kind = name.partition("|")
            raw = {as_text(k): float(v) for k, v in self.connection.hgetall(keys.metrics_provider(name)).items()}
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
        raw = {as_text(k): float(v) for k, v in self.connection.hgetall(keys.metrics_extraction()).items()}
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

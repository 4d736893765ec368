"""Job-level metrics recorded in Redis, so the exporter can report them (no multiprocess files per PID).

Pools and the dispatcher call `MetricsRecorder`; `workers.ops.exporter` reads the
same keys and renders Prometheus families. Counters and histogram buckets are
Redis hashes updated with HINCRBY/HINCRBYFLOAT, so any number of worker
processes add to one total. A new stage or provider needs no registration: the
recorder adds its name to a set the exporter iterates.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import redis

from contracts import keys

log = logging.getLogger(__name__)

# Histogram upper bounds (seconds) shared by writers and the exporter.
BATCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
FRESHNESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
PROVIDER_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def entry_time_ms(entry_id: str | bytes) -> int | None:
    """The Unix milliseconds of a stream entry id (``<ms>-<n>``, set by Redis at XADD); None if it is not one.

    Freshness is measured from this time, not from a minute's ``timestamp``:
    the producer's clock may be off by any amount (a day behind made every
    observation +Inf), while entry ids come from the Redis server's clock.
    The timestamp stays what it is, data of the minute.
    """
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, _ = text.partition("-")
    return int(ms) if ms.isdigit() else None


def _bucket_label(buckets: tuple[float, ...], value: float) -> str:
    i = bisect.bisect_left(buckets, value)
    return repr(buckets[i]) if i < len(buckets) else "+Inf"


@dataclass(frozen=True)
class Histogram:
    """A histogram read back from Redis: cumulative bucket counts, sum and count."""

    buckets: list[tuple[str, float]]  # (upper bound label, cumulative count), ending with +Inf
    sum: float
    count: float


def read_histogram(raw: dict[bytes, bytes], bounds: tuple[float, ...]) -> Histogram:
    values = {k.decode(): float(v) for k, v in raw.items()}
    cumulative = 0.0
    out = []
    for label in [*(repr(b) for b in bounds), "+Inf"]:
        cumulative += values.get(f"b:{label}", 0.0)
        out.append((label, cumulative))
    return Histogram(out, values.get("sum", 0.0), values.get("count", 0.0))


class MetricsRecorder:
    """Adds job-level numbers to the Redis-held metrics. Cheap: one pipelined round trip per call.

    Each recording method takes an optional `pipeline`: given one, it only adds
    its commands there and the caller sends them along with its own (one round
    trip for a job's writes and its metrics); without one, it sends them itself.
    """

    def __init__(self, connection: redis.Redis) -> None:
        self.connection = connection

    def _observe(
        self, pipe: redis.client.Pipeline, key: str, bounds: tuple[float, ...], values: Iterable[float]
    ) -> None:
        counts: dict[str, int] = {}
        total = 0.0
        n = 0
        for v in values:
            label = _bucket_label(bounds, v)
            counts[label] = counts.get(label, 0) + 1
            total += v
            n += 1
        if not n:
            return
        for label, c in counts.items():
            pipe.hincrby(key, f"b:{label}", c)
        pipe.hincrbyfloat(key, "sum", total)
        pipe.hincrby(key, "count", n)

    def _send(self, pipe: redis.client.Pipeline) -> None:
        # Metrics are best-effort: a Redis error is logged, never a batch's failure (nor raised in place of
        # its own). With a caller's pipeline, the caller sends it and decides.
        try:
            pipe.execute()
        except redis.exceptions.RedisError as exc:
            log.warning("metrics not recorded: %s", exc)

    def _pipe(self, pipeline: redis.client.Pipeline | None) -> redis.client.Pipeline:
        return self.connection.pipeline(transaction=False) if pipeline is None else pipeline

    def batch(
        self,
        stage: str,
        minutes: int,
        seconds: float,
        failures: int = 0,
        pipeline: redis.client.Pipeline | None = None,
    ) -> None:
        """One batch of a stage finished (or failed: `failures` minutes)."""
        pipe = self._pipe(pipeline)
        pipe.sadd(keys.metrics_stages(), stage)
        pipe.hincrby(keys.metrics_stage(stage), "minutes", minutes)
        pipe.hincrby(keys.metrics_stage(stage), "batches", 1)
        if failures:
            pipe.hincrby(keys.metrics_stage(stage), "failures", failures)
        self._observe(pipe, keys.metrics_stage_duration(stage), BATCH_BUCKETS, [seconds])
        if pipeline is None:
            self._send(pipe)

    def failure(self, stage: str, minutes: int, pipeline: redis.client.Pipeline | None = None) -> None:
        """A batch of a stage failed."""
        pipe = self._pipe(pipeline)
        pipe.sadd(keys.metrics_stages(), stage)
        pipe.hincrby(keys.metrics_stage(stage), "failures", minutes)
        if pipeline is None:
            self._send(pipe)

    def freshness(self, stage: str, lags_s: Iterable[float], pipeline: redis.client.Pipeline | None = None) -> None:
        """How long after emit each minute reached `stage` (durable, indexed, ...).

        Emit is the minute's stream entry time (`entry_time_ms`), a time PVM
        controls; a negative lag (clocks of Redis and a worker apart) counts as 0.
        """
        pipe = self._pipe(pipeline)
        pipe.sadd(keys.metrics_freshness_stages(), stage)
        self._observe(pipe, keys.metrics_freshness(stage), FRESHNESS_BUCKETS, [max(0.0, v) for v in lags_s])
        if pipeline is None:
            self._send(pipe)

    def extraction(
        self, extractor: str, counts: Mapping[str, int], pipeline: redis.client.Pipeline | None = None
    ) -> None:
        """What a fact extractor did with a batch: ``chunks:<outcome>`` / ``items:<outcome>`` -> a count."""
        pipe = self._pipe(pipeline)
        for name, count in counts.items():
            if count:
                pipe.hincrby(keys.metrics_extraction(), f"{extractor}:{name}", count)
        if pipeline is None:
            self._send(pipe)

    def provider_call(
        self,
        provider: str,
        kind: str,
        outcome: str,
        seconds: float | None,
        tokens: int = 0,
        pipeline: redis.client.Pipeline | None = None,
        *,
        completion_tokens: int = 0,
    ) -> None:
        """One call to an embedding or LLM provider.

        `tokens` are the tokens sent (input / prompt), `completion_tokens` those an
        LLM answered with. `seconds` is None for a call that never reached the
        provider (a circuit breaker refused it): counted, but kept out of the latency.
        """
        name = f"{provider}|{kind}"
        pipe = self._pipe(pipeline)
        pipe.sadd(keys.metrics_providers(), name)
        pipe.hincrby(keys.metrics_provider(name), f"calls:{outcome}", 1)
        if tokens:
            pipe.hincrby(keys.metrics_provider(name), "tokens", tokens)
        if completion_tokens:
            pipe.hincrby(keys.metrics_provider(name), "completion_tokens", completion_tokens)
        if seconds is not None:
            self._observe(pipe, keys.metrics_provider_latency(name), PROVIDER_BUCKETS, [seconds])
        if pipeline is None:
            self._send(pipe)

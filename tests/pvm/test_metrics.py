"""MetricsRecorder: what it writes, sent by itself or in the caller's pipeline."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from contracts import keys
from pvm.metrics import BATCH_BUCKETS, FRESHNESS_BUCKETS, PROVIDER_BUCKETS, MetricsRecorder, read_histogram

Recording = Callable[[MetricsRecorder, "redis.client.Pipeline | None"], None]

RECORDINGS: dict[str, Recording] = {
    "batch": lambda m, pipe: m.batch("index", 500, 0.08, failures=2, pipeline=pipe),
    "failure": lambda m, pipe: m.failure("index", 500, pipeline=pipe),
    "freshness": lambda m, pipe: m.freshness("indexed", [0.004, 0.3, -1.0, 7200.0], pipeline=pipe),
    "provider_call": lambda m, pipe: m.provider_call("openai", "embedding", "ok", 0.2, tokens=90, pipeline=pipe),
    "provider_call_chat": lambda m, pipe: m.provider_call(
        "openai", "chat:facts", "repaired", 1.5, tokens=700, completion_tokens=120, pipeline=pipe
    ),
}


def snapshot(connection: redis.Redis) -> dict[bytes, object]:
    out: dict[bytes, object] = {}
    for key in connection.keys("*"):
        out[key] = connection.smembers(key) if connection.type(key) == b"set" else connection.hgetall(key)
    return out


@pytest.mark.parametrize("name", RECORDINGS)
def test_recording_into_a_pipeline_writes_what_recording_alone_does(redis_client: redis.Redis, name: str) -> None:
    record = RECORDINGS[name]
    recorder = MetricsRecorder(redis_client)
    record(recorder, None)
    alone = snapshot(redis_client)
    assert alone
    redis_client.flushdb()

    pipe = redis_client.pipeline(transaction=False)
    pipe.hset("caller", "k", "1")
    record(recorder, pipe)
    assert snapshot(redis_client) == {}  # nothing sent until the caller sends its pipeline
    pipe.execute()
    after = snapshot(redis_client)
    del after[b"caller"]
    assert after == alone


def test_batch_and_freshness_histograms(redis_client: redis.Redis) -> None:
    recorder = MetricsRecorder(redis_client)
    pipe = redis_client.pipeline(transaction=False)
    recorder.batch("index", 500, 0.08, pipeline=pipe)
    recorder.freshness("indexed", [0.004, 0.3, -1.0], pipeline=pipe)
    pipe.execute()
    batch = read_histogram(redis_client.hgetall(keys.metrics_stage_duration("index")), BATCH_BUCKETS)
    assert batch.count == 1 and batch.sum == pytest.approx(0.08)
    fresh = read_histogram(redis_client.hgetall(keys.metrics_freshness("indexed")), FRESHNESS_BUCKETS)
    assert fresh.count == 3 and dict(fresh.buckets)["0.005"] == 2  # a negative lag counts as 0


@pytest.mark.parametrize("name", RECORDINGS)
def test_recording_alone_is_best_effort_and_a_callers_pipeline_is_the_callers(
    redis_client: redis.Redis, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Every metrics key is the wrong type: each write fails (WRONGTYPE).
    for key in (
        keys.metrics_stages(),
        keys.metrics_freshness_stages(),
        keys.metrics_providers(),
    ):
        redis_client.set(key, "not a set")
    recorder = MetricsRecorder(redis_client)
    RECORDINGS[name](recorder, None)  # logs, does not raise
    assert "metrics not recorded" in caplog.text
    pipe = redis_client.pipeline(transaction=False)
    RECORDINGS[name](recorder, pipe)
    with pytest.raises(redis.exceptions.ResponseError):
        pipe.execute()  # the caller's pipeline: the caller decides


def test_provider_calls_count_tokens_both_ways_and_calls_that_never_went_out_have_no_latency(
    redis_client: redis.Redis,
) -> None:
    recorder = MetricsRecorder(redis_client)
    recorder.provider_call("openai", "chat:facts", "ok", 0.8, tokens=700, completion_tokens=120)
    recorder.provider_call("openai", "chat:facts", "unavailable", None)  # refused by the breaker: no request
    name = "openai|chat:facts"
    assert redis_client.smembers(keys.metrics_providers()) == {name.encode()}
    counters = redis_client.hgetall(keys.metrics_provider(name))
    assert counters == {b"calls:ok": b"1", b"calls:unavailable": b"1", b"tokens": b"700", b"completion_tokens": b"120"}
    latency = read_histogram(redis_client.hgetall(keys.metrics_provider_latency(name)), PROVIDER_BUCKETS)
    assert latency.count == 1 and latency.sum == pytest.approx(0.8)

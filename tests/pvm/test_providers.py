"""The policy shared by every provider call: backoff, Retry-After, and the circuit breaker's threshold."""

from __future__ import annotations

import email.utils
import random
import time

import pytest

from pvm.providers import Backoff, CircuitBreaker, retry_after


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_breaker_opens_after_threshold_consecutive_failures_only() -> None:
    clock = ManualClock()
    breaker = CircuitBreaker(30.0, threshold=3, clock=clock)
    assert breaker.failed("HTTP 500") is False
    assert breaker.failed("HTTP 502") is False
    assert breaker.succeeded() is False  # a success in between starts the count again
    assert breaker.failed("HTTP 500") is False and breaker.failed("HTTP 500") is False
    assert breaker.admit() is None and not breaker.is_open
    assert breaker.failed("HTTP 503") is True and breaker.is_open
    clock.now += 10
    assert breaker.admit() == "HTTP 503 (next try in 20.0s)"
    clock.now += 20
    assert breaker.admit() is None  # the trial
    assert breaker.admit() is not None  # the others keep waiting
    # A failed trial opens it again at once: the threshold counts only while closed.
    assert breaker.failed("timed out after 5s") is False and breaker.is_open
    assert breaker.admit() == "timed out after 5s (next try in 30.0s)"
    clock.now += 30
    assert breaker.admit() is None and breaker.succeeded() is True and not breaker.is_open
    assert breaker.failed("HTTP 500") is False  # closed again: three more to open it


def test_the_breaker_refuses_nonsense_settings() -> None:
    with pytest.raises(ValueError, match="threshold"):
        CircuitBreaker(1.0, threshold=0)
    with pytest.raises(ValueError, match="cooldown_s"):
        CircuitBreaker(-1.0)


def test_backoff_doubles_with_jitter_honours_the_server_and_stays_under_the_cap() -> None:
    backoff = Backoff(0.5, 4.0)
    rng = random.Random(7)
    for attempt, full in ((1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (9, 4.0)):
        wait = backoff.wait(attempt, rng=rng)
        assert full / 2 <= wait <= full
    assert backoff.wait(1, requested=3.0, rng=rng) == 3.0  # Retry-After wins over a shorter backoff
    assert backoff.wait(1, requested=60.0, rng=rng) == 4.0  # ... within the cap
    with pytest.raises(ValueError, match="backoff_base"):
        Backoff(2.0, 1.0)


def test_retry_after_reads_milliseconds_seconds_and_dates() -> None:
    assert retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after({"retry-after": "1.5"}) == 1.5
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({}) is None
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= (retry_after({"retry-after": later}) or 0) <= 30

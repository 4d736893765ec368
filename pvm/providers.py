"""What every call to a model provider shares: which failures to retry, how long to wait, and when to stop asking.

The embedder (`pvm.embedders`), the searcher's dense leg (`pvm.search`) and the
LLM client (`pvm.llm`) call OpenAI-compatible endpoints through the `openai`
client with its own retries switched off, and follow one policy:

- 429 (honouring `Retry-After` / `retry-after-ms`), 408, 409, 5xx, timeouts
  and connection errors are worth another try (`ProviderRetry`), after an
  exponential backoff with jitter (`Backoff`), unless the server says
  `x-should-retry: false`;
- any other status is an answer that a retry would only repeat: the caller
  turns it into its own error, naming the setting to fix;
- after enough consecutive failures a `CircuitBreaker` makes callers fail (or
  degrade) at once for a cool-down instead of waiting out every timeout again.

Per-call metrics go through `pvm.metrics.MetricsRecorder.provider_call`.
"""

from __future__ import annotations

import email.utils
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import openai

RETRYABLE_STATUS = frozenset({408, 409, 429})


class ProviderRetry(Exception):
    """One attempt failed in a way a later attempt may not."""

    def __init__(
        self, reason: str, *, status: int | None = None, wait: float | None = None, malformed: bool = False
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.wait = wait  # what the server asked for (Retry-After), if anything
        self.malformed = malformed  # the answer came but made no sense (bad JSON, wrong shape)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter from `base` seconds, at least what the server asked for, never above `cap`."""

    base: float
    cap: float

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < self.base:
            raise ValueError(f"backoff_base={self.base} and backoff_max={self.cap} need 0 <= base <= max")

    def wait(self, attempt: int, requested: float | None = None, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1 for the first)."""
        jitter = (rng or random).uniform(0.5, 1.0)
        wait = min(self.cap, self.base * 2.0 ** (attempt - 1)) * jitter
        if requested is not None:
            wait = max(wait, requested)
        return min(wait, self.cap)


def openai_retry(error: Exception, timeout: float) -> ProviderRetry | None:
    """The `ProviderRetry` an `openai` client error deserves; None when retrying cannot help (a 4xx answer)."""
    import openai  # only callers that hold an openai client get here

    if isinstance(error, openai.APITimeoutError):
        return ProviderRetry(f"timed out after {timeout:g}s")
    if isinstance(error, openai.APIConnectionError):
        cause = error.__cause__ or error
        return ProviderRetry(f"could not connect ({type(cause).__name__}: {cause})")
    if isinstance(error, openai.APIStatusError):
        return status_retry(error)
    return None


def status_retry(error: openai.APIStatusError) -> ProviderRetry | None:
    """A `ProviderRetry` for a status worth another try (429, 408, 409, 5xx), else None."""
    code = error.status_code
    headers = error.response.headers
    should_retry = headers.get("x-should-retry")
    if should_retry != "false" and (code in RETRYABLE_STATUS or code >= 500 or should_retry == "true"):
        return ProviderRetry(f"HTTP {code}{server_message(error.body)}", status=code, wait=retry_after(headers))
    return None


def retry_after(headers: Any) -> float | None:
    """Seconds the server asked us to wait: `retry-after-ms`, else `Retry-After` (seconds or an HTTP date)."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def server_message(body: object) -> str:
    """The error message of an OpenAI-style error body, as " (message)", or ""."""
    error = body.get("error", body) if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if isinstance(message, str) and message:
        return f" ({excerpt(message)})"
    if isinstance(body, str) and body:
        return f" ({excerpt(body)})"
    return ""


def excerpt(text: str, limit: int = 200) -> str:
    """`text` on one line, cut at `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


class CircuitBreaker:
    """Stops calls to a failing provider for a cool-down, then lets one call try it again.

    Closed, every call goes through. `threshold` consecutive failures open it:
    `admit()` refuses calls (saying why) until the cool-down ends, then admits
    one call (the trial) while it goes on refusing the others; the trial's
    success closes the breaker, its failure starts another cool-down. A trial
    that never reports back (its thread died) holds the others off for one
    cool-down, no longer. Thread-safe.
    """

    def __init__(self, cooldown_s: float, threshold: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        if cooldown_s < 0:
            raise ValueError(f"cooldown_s must be 0 or more seconds, got {cooldown_s}")
        if threshold < 1:
            raise ValueError(f"threshold must be 1 or more failures, got {threshold}")
        self.cooldown_s = cooldown_s
        self.threshold = threshold
        self._clock = clock
        self._lock = threading.Lock()
        self._open_until: float | None = None  # None: closed
        self._failures = 0  # consecutive, while closed
        self._reason = ""

    @property
    def is_open(self) -> bool:
        with self._lock:
            return self._open_until is not None

    def admit(self) -> str | None:
        """None when this call may go to the provider; else why not ("<last failure> (next try in Ns)")."""
        with self._lock:
            if self._open_until is None:
                return None
            now = self._clock()
            left = self._open_until - now
            if left <= 0:
                self._open_until = now + self.cooldown_s  # this call is the trial; the rest keep waiting
                return None
            return f"{self._reason} (next try in {left:.1f}s)"

    def succeeded(self) -> bool:
        """Record a call that worked; True when that closed an open breaker."""
        with self._lock:
            was_open = self._open_until is not None
            self._open_until, self._failures, self._reason = None, 0, ""
            return was_open

    def failed(self, reason: str) -> bool:
        """Record a failed call; True when that opened a closed breaker."""
        with self._lock:
            self._reason = reason
            if self._open_until is not None:  # a failed trial: another cool-down
                self._open_until = self._clock() + self.cooldown_s
                return False
            self._failures += 1
            if self._failures < self.threshold:
                return False
            self._open_until = self._clock() + self.cooldown_s
            return True

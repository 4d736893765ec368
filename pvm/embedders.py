"""Embedders: texts in, dense vectors out — none (lexical only) or any OpenAI-compatible endpoint.

`OpenAIEmbedder` uses the `openai` client with its own retries switched off and
retries itself, so every attempt, wait and give-up is counted in `stats` and
shows in the log:

- 429 (honouring `Retry-After` / `retry-after-ms`, bounded by `backoff_max`),
  408, 409, 5xx, timeouts and connection errors: exponential backoff with
  jitter, up to `max_retries` retries;
- malformed or wrongly shaped answers: a couple of retries (a proxy hiccup
  heals, a wrong server does not), then `EmbeddingError`;
- 400/401/403/404/422: no retry; `EmbeddingError` (`EmbeddingConfigError` when
  the fix is a setting) naming the cause and the environment variable to change.

That policy is for indexing, where waiting out a provider's bad minute is
right. A search's query goes through `embed_query`: one try within
`query_timeout` (PVM_EMBED_QUERY_TIMEOUT), no retries, because an agent waits
on the answer and the search can answer lexical-only instead.

The vector length is PVM_EMBED_DIMENSIONS, else what the vector store already
holds (`stored_dimensions`), else learned from one probe request under the
query policy: a process that starts during a provider outage fails at once
with an error that says to set PVM_EMBED_DIMENSIONS, rather than after minutes
of batch retries.
"""

from __future__ import annotations

import array
import base64
import logging
import math
import random
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from contracts.errors import PvmError
from pvm.config import ConfigError
from pvm.defaults import (
    EMBED_BACKOFF_BASE_S,
    EMBED_BACKOFF_MAX_S,
    EMBED_BATCH_SIZE,
    EMBED_MALFORMED_RETRIES,
    EMBED_MAX_BATCH_TOKENS,
    EMBED_MAX_INPUT_CHARS,
    EMBED_MAX_RETRIES,
    EMBED_QUERY_TIMEOUT_S,
    EMBED_TIMEOUT_S,
    OPENAI_DEFAULT_BASE_URL,
)
from pvm.extras import ServerExtraMissing
from pvm.providers import Backoff, ProviderRetry, excerpt, openai_retry, server_message

if TYPE_CHECKING:
    import openai

log = logging.getLogger(__name__)


class EmbeddingError(PvmError):
    """An embedding request failed for good (after retries, or at once when retrying cannot help)."""

    def __init__(self, message: str, *, status: int | None = None, attempts: int = 0) -> None:
        super().__init__(message)
        self.status = status
        self.attempts = attempts


class EmbeddingConfigError(EmbeddingError, ConfigError):
    """The embedder is misconfigured; the message names the environment variable to fix."""


@dataclass(frozen=True, slots=True)
class EmbedderStats:
    """Counters since the embedder was made (a snapshot; the exporter turns them into metrics)."""

    calls: int = 0  # HTTP requests sent, retries included
    retries: int = 0  # requests that were a retry of a failed one
    failures: int = 0  # batches given up on (each raised EmbeddingError)
    texts: int = 0  # texts embedded successfully
    input_tokens: int = 0  # as the endpoint reported in `usage`
    latency_s: float = 0.0  # total time in requests, failed ones included (mean = latency_s / calls)
    last_latency_s: float = 0.0


class NoEmbedder:
    """No embedding provider: lexical search only (the embedded default)."""

    @property
    def dimensions(self) -> int | None:
        return None

    @property
    def stats(self) -> EmbedderStats:
        return EmbedderStats()

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        raise EmbeddingConfigError(
            "no embedding provider is configured (lexical-only mode), so there is nothing to embed with: "
            "set PVM_EMBED_MODEL (with OPENAI_BASE_URL / OPENAI_API_KEY) to enable dense vectors; "
            "callers should check `embedder.dimensions is None` first"
        )

    def embed_query(self, text: str) -> list[float]:
        return self.embed([text])[0]

    def close(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class _Policy:
    """How hard one kind of request tries: indexing batches wait out a bad minute, search queries do not."""

    max_retries: int
    timeout: float  # seconds per request
    timeout_setting: str  # the environment variable that sets `timeout`, for messages


class OpenAIEmbedder:
    """Dense vectors from an OpenAI-compatible `/embeddings` endpoint, batched and retried."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        model: str | None,
        dimensions: int | None = None,
        batch_size: int = EMBED_BATCH_SIZE,
        max_retries: int = EMBED_MAX_RETRIES,
        timeout: float = EMBED_TIMEOUT_S,
        backoff_base: float = EMBED_BACKOFF_BASE_S,
        backoff_max: float = EMBED_BACKOFF_MAX_S,
        *,
        encoding_format: Literal["base64", "float"] = "base64",
        max_batch_tokens: int = EMBED_MAX_BATCH_TOKENS,
        max_input_chars: int = EMBED_MAX_INPUT_CHARS,
        malformed_retries: int = EMBED_MALFORMED_RETRIES,
        query_timeout: float = EMBED_QUERY_TIMEOUT_S,
        stored_dimensions: int | None = None,
    ) -> None:
        if not base_url or not base_url.strip():
            raise EmbeddingConfigError(
                "OPENAI_BASE_URL is not set: the embedder needs the URL of an OpenAI-compatible API "
                f"(e.g. {OPENAI_DEFAULT_BASE_URL} or http://localhost:11434/v1)"
            )
        base_url = base_url.strip().rstrip("/")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise EmbeddingConfigError(
                f"OPENAI_BASE_URL={base_url!r} is not an http(s) URL (expected e.g. {OPENAI_DEFAULT_BASE_URL})"
            )
        if not model or not model.strip():
            raise EmbeddingConfigError(
                "PVM_EMBED_MODEL is not set: name the embedding model the endpoint serves "
                "(e.g. text-embedding-3-small), or unset it for lexical-only search"
            )
        if not api_key and parts.hostname == "api.openai.com":
            raise EmbeddingConfigError(f"OPENAI_API_KEY is not set, and {base_url} requires one")
        if dimensions is not None and (isinstance(dimensions, bool) or dimensions < 1):
            raise EmbeddingConfigError(f"PVM_EMBED_DIMENSIONS={dimensions!r} must be a positive whole number or unset")
        if stored_dimensions is not None and (isinstance(stored_dimensions, bool) or stored_dimensions < 1):
            raise ValueError(f"stored_dimensions={stored_dimensions!r} must be a positive whole number or None")
        if not 1 <= batch_size <= EMBED_BATCH_SIZE:
            raise EmbeddingConfigError(
                f"PVM_EMBED_BATCH_SIZE={batch_size} must be between 1 and {EMBED_BATCH_SIZE} (OpenAI's limit)"
            )
        if max_retries < 0:
            raise EmbeddingConfigError(f"PVM_EMBED_MAX_RETRIES={max_retries} must be 0 or more")
        if not timeout > 0:
            raise EmbeddingConfigError(f"PVM_EMBED_TIMEOUT={timeout} must be a positive number of seconds")
        if not query_timeout > 0:
            raise EmbeddingConfigError(f"PVM_EMBED_QUERY_TIMEOUT={query_timeout} must be a positive number of seconds")
        if encoding_format not in ("base64", "float"):
            raise EmbeddingConfigError(f"encoding_format={encoding_format!r} must be 'base64' or 'float'")
        backoff = Backoff(backoff_base, backoff_max)  # ValueError unless 0 <= base <= max

        self.base_url = base_url
        self.endpoint = f"{base_url}/embeddings"
        self.model = model.strip()
        self.batch_size = batch_size
        self.max_retries = max_retries
        self.timeout = timeout
        self.query_timeout = query_timeout
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self._backoff = backoff
        self.encoding_format = encoding_format
        self.max_batch_tokens = max_batch_tokens
        self.max_input_chars = max_input_chars
        self.malformed_retries = malformed_retries
        self._configured_dimensions = dimensions
        # The length of the dense vectors the vector store already holds: taken instead of a probe request (the
        # provider may be down when a process starts), and checked against like a learned length.
        self._stored_dimensions = None if dimensions is not None else stored_dimensions
        self._dimensions = dimensions if dimensions is not None else stored_dimensions
        self._batch_policy = _Policy(max_retries, timeout, "PVM_EMBED_TIMEOUT")
        self._query_policy = _Policy(0, query_timeout, "PVM_EMBED_QUERY_TIMEOUT")
        try:
            import openai
        except ImportError as exc:
            raise ServerExtraMissing("openai", "PVM_EMBED_MODEL (dense embeddings)") from exc
        # Local servers (Ollama, vLLM, ...) take no key, but the client insists on one;
        # passing it explicitly also keeps the client from reading the environment itself.
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key or "unused", max_retries=0, timeout=timeout)
        self._lock = threading.Lock()
        self._stats = EmbedderStats()
        self._random = random.Random()

    def __repr__(self) -> str:
        return f"OpenAIEmbedder(endpoint={self.endpoint!r}, model={self.model!r}, dimensions={self._dimensions})"

    @property
    def dimensions(self) -> int:
        """The vector length: as configured, else as the vector store holds, else learned from the endpoint.

        Learning it is one probe request under the query policy (one try within
        PVM_EMBED_QUERY_TIMEOUT); when that fails, `EmbeddingConfigError` says to
        set PVM_EMBED_DIMENSIONS. A later call probes again.
        """
        if self._dimensions is None:
            self._probe()
        assert self._dimensions is not None
        return self._dimensions

    def _probe(self) -> None:
        try:
            self._embed_batch(["dimension probe"], self._query_policy)
        except EmbeddingConfigError:
            raise  # names its own fix (a rejected key, an unknown model)
        except EmbeddingError as error:
            raise EmbeddingConfigError(
                f"PVM_EMBED_DIMENSIONS is not set and the vector length of model {self.model!r} could not be "
                "learned from the endpoint: set PVM_EMBED_DIMENSIONS to the model's vector length (e.g. 1536 for "
                f"text-embedding-3-small) to start without asking it. The probe: {error}",
                status=error.status,
                attempts=error.attempts,
            ) from error

    @property
    def stats(self) -> EmbedderStats:
        with self._lock:
            return self._stats

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order. Raises `EmbeddingError` when a batch fails for good."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not a single str")
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"embed() takes texts (str), got {type(text).__name__}")
        vectors: list[list[float]] = []
        for batch in self._batches(texts):
            vectors.extend(self._embed_batch(batch, self._batch_policy))
        return vectors

    def embed_query(self, text: str) -> list[float]:
        """A search query's vector: one request within `query_timeout`, no retries; `EmbeddingError` if it fails."""
        if not isinstance(text, str):
            raise TypeError(f"embed_query() takes a text (str), got {type(text).__name__}")
        [batch] = self._batches([text])
        return self._embed_batch(batch, self._query_policy)[0]

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAIEmbedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- batching --

    def _batches(self, texts: Sequence[str]) -> Iterator[list[str]]:
        batch: list[str] = []
        tokens = 0
        for text in texts:
            # OpenAI rejects empty inputs (a 400 for the whole batch); a blank text has no meaning to embed anyway.
            text = text[: self.max_input_chars] if text.strip() else " "
            estimate = len(text.encode()) // 3 + 1
            if batch and (len(batch) >= self.batch_size or tokens + estimate > self.max_batch_tokens):
                yield batch
                batch, tokens = [], 0
            batch.append(text)
            tokens += estimate
        if batch:
            yield batch

    # -- one batch, with retries --

    def _embed_batch(self, batch: list[str], policy: _Policy) -> list[list[float]]:
        malformed = 0
        attempt = 0
        while True:
            attempt += 1
            started = time.perf_counter()
            try:
                vectors, tokens = self._request(batch, policy.timeout)
            except ProviderRetry as retry:
                self._count(latency=time.perf_counter() - started)
                malformed += retry.malformed
                exhausted = attempt > policy.max_retries or (retry.malformed and malformed > self.malformed_retries)
                if exhausted:
                    self._count(failures=1)
                    raise EmbeddingError(
                        f"embedding request to {self.endpoint} (model {self.model!r}, {len(batch)} inputs) "
                        f"failed after {attempt} attempt{'s' if attempt > 1 else ''}: {retry.reason}. "
                        + _advice(retry, policy),
                        status=retry.status,
                        attempts=attempt,
                    ) from retry.__cause__
                wait = self._backoff.wait(attempt, retry.wait, self._random)
                log.warning(
                    "embedding request to %s failed (%s); retry %d of %d in %.2fs",
                    self.endpoint,
                    retry.reason,
                    attempt,
                    policy.max_retries,
                    wait,
                )
                self._count(retries=1)
                time.sleep(wait)
                continue
            except EmbeddingError as error:
                self._count(latency=time.perf_counter() - started, failures=1)
                error.attempts = attempt
                raise
            self._count(latency=time.perf_counter() - started, texts=len(batch), input_tokens=tokens)
            return vectors

    def _request(self, batch: list[str], timeout: float) -> tuple[list[list[float]], int]:
        """One HTTP request within `timeout` seconds: vectors and input tokens, or `ProviderRetry`/`EmbeddingError`."""
        import openai  # loaded by __init__; only the server extra has it

        self._count(calls=1)
        extra: dict[str, Any] = {}
        if self._configured_dimensions is not None:
            extra["dimensions"] = self._configured_dimensions
        try:
            raw = self._client.embeddings.with_raw_response.create(
                model=self.model, input=batch, encoding_format=self.encoding_format, timeout=timeout, **extra
            )
        except openai.APIError as error:
            retry = openai_retry(error, timeout)
            if retry is not None:
                raise retry from error
            if isinstance(error, openai.APIStatusError):
                raise self._status_error(error) from error
            raise
        response = raw.http_response
        try:
            body = response.json()
        except ValueError as error:
            raise ProviderRetry(f"the answer is not JSON ({excerpt(response.text)})", malformed=True) from error
        return self._parse(body, len(batch))

    def _status_error(self, error: openai.APIStatusError) -> EmbeddingError:
        """The error for an answer no retry changes (401, 403, 404, other 4xx), naming the setting to fix."""
        code = error.status_code
        said = server_message(error.body)
        if code == 401:
            return EmbeddingConfigError(
                f"OPENAI_API_KEY rejected (401) by {self.endpoint}{said}: set OPENAI_API_KEY to a key this endpoint "
                "accepts",
                status=code,
            )
        if code == 403:
            return EmbeddingConfigError(
                f"OPENAI_API_KEY may not use model {self.model!r} (403) at {self.endpoint}{said}: grant the key "
                "access or change PVM_EMBED_MODEL",
                status=code,
            )
        if code == 404:
            return EmbeddingConfigError(
                f"{self.endpoint} or model {self.model!r} not found (404){said}: check OPENAI_BASE_URL (it usually "
                "ends in /v1) and PVM_EMBED_MODEL",
                status=code,
            )
        hint = "check PVM_EMBED_MODEL"
        if self._configured_dimensions is not None:
            hint += " and PVM_EMBED_DIMENSIONS (not every model takes `dimensions`)"
        return EmbeddingError(f"{self.endpoint} rejected the request ({code}){said}: {hint}", status=code)

    def _parse(self, body: Any, expected: int) -> tuple[list[list[float]], int]:
        """Vectors in input order (by `index`) and the input tokens, from a decoded answer."""
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise ProviderRetry("malformed answer: no `data` list", malformed=True)
        if len(data) != expected:
            raise ProviderRetry(f"malformed answer: {len(data)} embeddings for {expected} inputs", malformed=True)
        ordered: list[list[float] | None] = [None] * expected
        for position, item in enumerate(data):
            index = item.get("index", position) if isinstance(item, dict) else None
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < expected:
                raise ProviderRetry(f"malformed answer: item {position} has index {index!r}", malformed=True)
            if ordered[index] is not None:
                raise ProviderRetry(f"malformed answer: index {index} appears twice", malformed=True)
            assert isinstance(item, dict)
            ordered[index] = _vector(item.get("embedding"), index)
        vectors: list[list[float]] = ordered  # type: ignore[assignment]  # every slot was filled above

        lengths = {len(v) for v in vectors}
        if len(lengths) > 1:
            raise ProviderRetry(f"malformed answer: vectors of different lengths {sorted(lengths)}", malformed=True)
        length = lengths.pop()
        if length == 0:
            raise ProviderRetry("malformed answer: empty vectors", malformed=True)
        with self._lock:
            if self._dimensions is None:
                self._dimensions = length
            known = self._dimensions
        if length != known and self._stored_dimensions == known:
            raise EmbeddingConfigError(
                f"{self.endpoint} (model {self.model!r}) returned vectors of length {length}, but the vector store "
                f"holds {known}-dimension vectors, made by another model: go back to that model, or set "
                f"PVM_EMBED_DIMENSIONS={length} and rebuild the vector store (`pvm replay`)"
            )
        if length != known:
            # The same model answers with one length every time: a mismatch is configuration, not luck.
            source = "PVM_EMBED_DIMENSIONS" if self._configured_dimensions is not None else "earlier answers"
            raise EmbeddingConfigError(
                f"{self.endpoint} (model {self.model!r}) returned vectors of length {length}, but {source} "
                f"say {known}: set PVM_EMBED_DIMENSIONS to a length the model supports (or unset it), "
                "and use one model per collection"
            )

        usage = body.get("usage")
        tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        return vectors, tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0

    def _count(
        self,
        *,
        calls: int = 0,
        retries: int = 0,
        failures: int = 0,
        texts: int = 0,
        input_tokens: int = 0,
        latency: float | None = None,
    ) -> None:
        with self._lock:
            s = self._stats
            self._stats = EmbedderStats(
                calls=s.calls + calls,
                retries=s.retries + retries,
                failures=s.failures + failures,
                texts=s.texts + texts,
                input_tokens=s.input_tokens + input_tokens,
                latency_s=s.latency_s + (latency or 0.0),
                last_latency_s=s.last_latency_s if latency is None else latency,
            )


def embedder_from_settings(
    model: str | None,
    base_url: str | None,
    api_key: str | None,
    dimensions: int | None = None,
    **options: Any,
) -> NoEmbedder | OpenAIEmbedder:
    """The embedder the settings ask for: none unless PVM_EMBED_MODEL is set.

    PVM_EMBED_MODEL is the switch because OPENAI_BASE_URL / OPENAI_API_KEY may be
    set for the LLM alone. With a model and a key but no base URL, OpenAI's own API
    is used. `options` go to `OpenAIEmbedder` (batch_size, max_retries, timeout, ...).
    """
    if not model or not model.strip():
        if base_url:
            log.info("OPENAI_BASE_URL is set but PVM_EMBED_MODEL is not: lexical search only")
        return NoEmbedder()
    if not base_url:
        if not api_key:
            raise EmbeddingConfigError(
                f"PVM_EMBED_MODEL={model!r} is set but OPENAI_BASE_URL is not: set OPENAI_BASE_URL to an "
                f"OpenAI-compatible API, or OPENAI_API_KEY to use {OPENAI_DEFAULT_BASE_URL}"
            )
        base_url = OPENAI_DEFAULT_BASE_URL
    return OpenAIEmbedder(base_url=base_url, api_key=api_key, model=model, dimensions=dimensions, **options)


def _vector(raw: Any, index: int) -> list[float]:
    """A list of finite floats from a JSON array of numbers or base64 little-endian float32."""
    if isinstance(raw, str):
        try:
            packed = base64.b64decode(raw, validate=True)
        except ValueError:  # binascii.Error is one
            raise ProviderRetry(f"malformed answer: embedding {index} is not base64", malformed=True) from None
        if len(packed) % 4:
            raise ProviderRetry(f"malformed answer: embedding {index} is not whole float32s", malformed=True)
        floats = array.array("f")
        floats.frombytes(packed)
        if sys.byteorder == "big":
            floats.byteswap()
        vector = floats.tolist()
    elif isinstance(raw, list):
        if not all(type(x) is float or type(x) is int for x in raw):
            raise ProviderRetry(f"malformed answer: embedding {index} holds non-numbers", malformed=True)
        vector = [float(x) for x in raw]
    else:
        raise ProviderRetry(
            f"malformed answer: embedding {index} is {type(raw).__name__}, not a vector", malformed=True
        )
    # One sum catches any NaN or infinity without a Python-level test per element.
    if not math.isfinite(sum(vector)):
        raise ProviderRetry(f"malformed answer: embedding {index} holds NaN or infinity", malformed=True)
    return vector


def _advice(retry: ProviderRetry, policy: _Policy) -> str:
    if retry.malformed:
        return "The endpoint does not answer like an OpenAI embeddings API: check OPENAI_BASE_URL"
    if retry.status == 429:
        return "The endpoint is rate limiting: lower the indexing rate or raise the provider's limits"
    if retry.status is None:
        return f"Check that the endpoint is up and reachable (OPENAI_BASE_URL), or raise {policy.timeout_setting}"
    if not policy.max_retries:
        return "Check the endpoint's health"
    return "The endpoint keeps failing: check its health, or raise PVM_EMBED_MAX_RETRIES"

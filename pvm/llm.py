"""The LLM client: one chat call to an OpenAI-compatible endpoint, answered by a JSON object valid against a schema.

`LLMClient.complete_json(messages, schema, name=...)` is what the facts
extractor, the summarize pool and the PAIR judge call (`pvm.protocols.ChatModel`
is its protocol, so a test double is a few lines). It returns a `JSONResult`
whose `data` matches `schema`, or raises; it never returns an answer it did not
validate.

- **Structured output.** It asks for `response_format` `json_schema`; a
  server that refuses that (a 400 naming `response_format`) is asked for
  `json_object` instead, and one that refuses both gets plain text with the
  schema in a system message. The step down is remembered per client: the
  refusal costs one request per client, not one per call. (Likewise a model
  that takes `max_completion_tokens` but not `max_tokens`.)
- **Reading the answer.** A ```json fence is stripped and the outermost JSON
  object taken from any prose around it, then checked against the schema
  (`pvm.json_schema`).
- **Repair, once.** An answer that does not parse or validate gets one
  follow-up message quoting what is wrong (and the schema); if that answer is
  wrong too, `LLMAnswerRejected` says why. An answer cut off at
  PVM_LLM_MAX_TOKENS or a refusal is rejected at once: asking again would not
  change it.
- **Retries** (the policy of `pvm.providers`, shared with the embedder): 429
  (honouring `Retry-After`), 408, 409, 5xx, timeouts (PVM_LLM_TIMEOUT per
  request) and connection errors, up to PVM_LLM_MAX_RETRIES times with
  exponential backoff; an HTTP answer that is not a chat completion a couple
  of times. Then `LLMUnavailable`. Other 4xx answers fail at once:
  `LLMConfigError` naming the variable to fix (401, 403, 404, a refused
  temperature), else `LLMError` with the server's message.
- **Circuit breaker.** After `LLM_BREAKER_THRESHOLD` calls in a row ended in
  `LLMUnavailable`, calls fail at once with `LLMUnavailable` (no request) for
  `LLM_BREAKER_COOLDOWN_S`, then one call tries the endpoint again. Callers
  fall back to their rule paths instead of waiting out an outage per call.
- **Metrics.** Each call is recorded with `MetricsRecorder.provider_call`
  (provider `openai`, kind `chat:<name>`): its outcome (`ok`, `repaired`,
  `rejected`, `error`, `unavailable`), prompt and completion tokens, and its
  latency (retries and the repair included; none for calls the breaker
  refused). `stats` holds the same numbers for this client.

`llm_from_settings(settings)` builds the client PVM_LLM_* ask for, or returns
None when PVM_LLM_MODEL is unset: no LLM, and every caller takes its rule path.
"""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from contracts.errors import PvmError
from pvm.config import ConfigError, Settings
from pvm.defaults import (
    LLM_BACKOFF_BASE_S,
    LLM_BACKOFF_MAX_S,
    LLM_BREAKER_COOLDOWN_S,
    LLM_BREAKER_THRESHOLD,
    LLM_MALFORMED_RETRIES,
    LLM_MAX_RETRIES,
    LLM_MAX_TOKENS,
    LLM_TEMPERATURE,
    LLM_TIMEOUT_S,
    OPENAI_DEFAULT_BASE_URL,
)
from pvm.extras import ServerExtraMissing
from pvm.json_schema import JSONSchema
from pvm.protocols import JSONResult
from pvm.providers import Backoff, CircuitBreaker, ProviderRetry, excerpt, openai_retry, server_message

if TYPE_CHECKING:
    import openai

    from pvm.metrics import MetricsRecorder

log = logging.getLogger(__name__)

PROVIDER = "openai"  # the `provider` label of the metrics: the API's dialect, as for the embedder

# How the answer is asked to be JSON, best first; a server that refuses one gets the next.
Mode = Literal["json_schema", "json_object", "text"]
MODES: tuple[Mode, ...] = ("json_schema", "json_object", "text")

_ROLES = frozenset({"system", "user", "assistant"})
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a json_schema name
_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n?(.*?)```", re.DOTALL)

SCHEMA_INSTRUCTION = (
    "Answer with one JSON object and nothing else: no prose, no Markdown fence. "
    "It must validate against this JSON Schema:\n{schema}"
)
REPAIR_INSTRUCTION = (
    "Your answer is not valid: {problem}. Answer again with only the corrected JSON object, "
    "valid against this JSON Schema:\n{schema}"
)


class LLMError(PvmError):
    """An LLM call failed; the message says why and what to change."""

    def __init__(self, message: str, *, status: int | None = None, attempts: int = 0) -> None:
        super().__init__(message)
        self.status = status
        self.attempts = attempts  # HTTP requests made


class LLMConfigError(LLMError, ConfigError):
    """The LLM is misconfigured; the message names the environment variable to fix."""


class LLMUnavailable(LLMError):
    """The endpoint failed after retries, or the circuit breaker is open and the call was not made."""

    def __init__(self, message: str, *, reason: str, status: int | None = None, attempts: int = 0) -> None:
        super().__init__(message, status=status, attempts=attempts)
        self.reason = reason  # the last failure, short (what the breaker reports)


class LLMAnswerRejected(LLMError):
    """The model answered, but not with JSON valid against the schema, even after one repair."""

    def __init__(self, message: str, *, reason: str, answer: str | None, attempts: int = 0) -> None:
        super().__init__(message, attempts=attempts)
        self.reason = reason
        self.answer = answer  # the last answer as the model gave it (for the log; never used as data)


@dataclass(frozen=True, slots=True)
class LLMStats:
    """Counters since the client was made (a snapshot)."""

    calls: int = 0  # complete_json calls
    ok: int = 0  # ... answered validly at once
    repaired: int = 0  # ... answered validly after one repair
    rejected: int = 0  # ... that raised LLMAnswerRejected
    failures: int = 0  # ... that raised LLMUnavailable or LLMError after requests
    short_circuits: int = 0  # ... refused by the open breaker, no request made
    requests: int = 0  # HTTP requests, retries and repairs included
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0  # total time in calls that made requests


@dataclass
class _Call:
    """What one complete_json call has spent so far."""

    requests: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True, slots=True)
class _Reply:
    """One chat completion, as read off the wire."""

    text: str | None
    finish_reason: str | None
    refusal: str | None


class _Unsupported(Exception):
    """The server refused a request parameter this client can do without (`response_format`, `max_tokens`)."""


class LLMClient:
    """JSON answers valid against a schema, from an OpenAI-compatible chat endpoint; retried, repaired, metered."""

    def __init__(
        self,
        base_url: str | None,
        api_key: str | None,
        model: str | None,
        *,
        timeout: float = LLM_TIMEOUT_S,
        max_retries: int = LLM_MAX_RETRIES,
        max_tokens: int = LLM_MAX_TOKENS,
        temperature: float = LLM_TEMPERATURE,
        backoff_base: float = LLM_BACKOFF_BASE_S,
        backoff_max: float = LLM_BACKOFF_MAX_S,
        malformed_retries: int = LLM_MALFORMED_RETRIES,
        breaker_threshold: int = LLM_BREAKER_THRESHOLD,
        breaker_cooldown_s: float = LLM_BREAKER_COOLDOWN_S,
        metrics: MetricsRecorder | None = None,
        url_setting: str = "PVM_LLM_BASE_URL",
        key_setting: str = "PVM_LLM_API_KEY",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not model or not model.strip():
            raise LLMConfigError(
                "PVM_LLM_MODEL is not set: name the chat model the endpoint serves (e.g. gpt-4o-mini, or "
                "llama3.1 on a local server), or leave it unset to run without an LLM (rule-based paths)"
            )
        if not base_url or not base_url.strip():
            raise LLMConfigError(
                f"{url_setting} is not set: the LLM client needs the URL of an OpenAI-compatible API "
                f"(e.g. {OPENAI_DEFAULT_BASE_URL} or http://localhost:11434/v1)"
            )
        base_url = base_url.strip().rstrip("/")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise LLMConfigError(
                f"{url_setting}={base_url!r} is not an http(s) URL (expected e.g. {OPENAI_DEFAULT_BASE_URL})"
            )
        if not api_key and parts.hostname == "api.openai.com":
            raise LLMConfigError(f"{key_setting} is not set, and {base_url} requires one")
        if not timeout > 0:
            raise LLMConfigError(f"PVM_LLM_TIMEOUT={timeout} must be a positive number of seconds")
        if max_retries < 0:
            raise LLMConfigError(f"PVM_LLM_MAX_RETRIES={max_retries} must be 0 or more")
        if max_tokens < 1:
            raise LLMConfigError(f"PVM_LLM_MAX_TOKENS={max_tokens} must be 1 or more")
        if not 0 <= temperature <= 2:
            raise LLMConfigError(f"PVM_LLM_TEMPERATURE={temperature} must be from 0 to 2")
        try:
            import openai
        except ImportError as exc:
            raise ServerExtraMissing("openai", "PVM_LLM_MODEL (the LLM client)") from exc

        self.base_url = base_url
        self.endpoint = f"{base_url}/chat/completions"
        self.model = model.strip()
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.malformed_retries = malformed_retries
        self.metrics = metrics
        self.breaker = CircuitBreaker(breaker_cooldown_s, threshold=breaker_threshold, clock=clock)
        self._backoff = Backoff(backoff_base, backoff_max)
        self._url_setting = url_setting
        self._key_setting = key_setting
        # Local servers take no key, but the client insists on one; passing it also keeps it from the environment.
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key or "unused", max_retries=0, timeout=timeout)
        self._lock = threading.Lock()
        self._mode: Mode = "json_schema"
        self._tokens_parameter = "max_tokens"  # the widest understood; reasoning models want max_completion_tokens
        self._stats = LLMStats()
        self._random = random.Random()

    def __repr__(self) -> str:
        return f"LLMClient(endpoint={self.endpoint!r}, model={self.model!r}, mode={self._mode!r})"

    @property
    def mode(self) -> Mode:
        """How answers are asked to be JSON now: "json_schema", or what the server accepted after refusing it."""
        with self._lock:
            return self._mode

    @property
    def stats(self) -> LLMStats:
        with self._lock:
            return self._stats

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the call --

    def complete_json(
        self,
        messages: Sequence[Mapping[str, str]],
        schema: Mapping[str, Any],
        *,
        name: str,
        strict: bool = False,
    ) -> JSONResult:
        """The model's answer to `messages`: a JSON object valid against `schema`, or an `LLMError`.

        `name` says what the call is for (`facts`, `summary`, ...): it names the
        schema sent to the server and the metrics' kind (`chat:<name>`).
        `strict` asks OpenAI's strict structured outputs (the schema must then
        follow its rules: every property required, no additional properties).
        Raises `LLMUnavailable` (the endpoint is failing; retried already),
        `LLMAnswerRejected` (answered, but not validly), `LLMConfigError` or
        `LLMError` (the request was refused; retrying would not help).
        """
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"name={name!r} must be 1 to 64 letters, digits, '_' or '-'")
        checked = JSONSchema(schema)  # SchemaError: a schema this client could not check fully
        if schema.get("type") != "object":
            raise ValueError(f'the schema of {name!r} must describe an object ("type": "object")')
        conversation = _conversation(messages)

        refused = self.breaker.admit()
        if refused is not None:
            self._count(LLMStats(calls=1, short_circuits=1))
            self._record(name, "unavailable", None, _Call())
            raise LLMUnavailable(
                f"LLM call {name!r} not made: {self.endpoint} (model {self.model!r}) has been failing: {refused}",
                reason=refused,
            )

        call = _Call()
        started = time.perf_counter()
        outcome = "error"
        try:
            data, repaired = self._answer(conversation, schema, checked, name, strict, call)
            outcome = "repaired" if repaired else "ok"
        except LLMUnavailable as error:
            if self.breaker.failed(error.reason):
                log.warning(
                    "LLM endpoint %s failed %d calls in a row (%s): calls fail at once for %gs, then one tries again",
                    self.endpoint,
                    self.breaker.threshold,
                    error.reason,
                    self.breaker.cooldown_s,
                )
            raise
        except LLMAnswerRejected:
            outcome = "rejected"
            self._closed()  # the endpoint answered: it is up
            raise
        except LLMError:
            self._closed()
            raise
        finally:
            seconds = time.perf_counter() - started
            self._count(
                LLMStats(
                    calls=1,
                    ok=outcome == "ok",
                    repaired=outcome == "repaired",
                    rejected=outcome == "rejected",
                    failures=outcome == "error",
                    requests=call.requests,
                    retries=call.retries,
                    prompt_tokens=call.prompt_tokens,
                    completion_tokens=call.completion_tokens,
                    latency_s=seconds,
                )
            )
            self._record(name, outcome, seconds, call)
        self._closed()
        return JSONResult(
            data=data,
            model=self.model,
            repaired=repaired,
            prompt_tokens=call.prompt_tokens,
            completion_tokens=call.completion_tokens,
            requests=call.requests,
        )

    def _answer(
        self,
        conversation: list[dict[str, str]],
        schema: Mapping[str, Any],
        checked: JSONSchema,
        name: str,
        strict: bool,
        call: _Call,
    ) -> tuple[dict[str, Any], bool]:
        """The valid answer, and whether it took a repair; `LLMAnswerRejected` when even the repair is invalid."""
        reply = self._chat(conversation, schema, name, strict, call)
        data, problem = _read(reply, checked)
        if data is not None:
            return data, False
        self._reject_unrepairable(reply, problem, name, call)
        log.info("LLM answer for %r invalid (%s): asking once for a corrected one", name, problem)
        repair = [
            *conversation,
            {"role": "assistant", "content": reply.text or ""},
            {"role": "user", "content": REPAIR_INSTRUCTION.format(problem=problem, schema=_dumps(schema))},
        ]
        reply = self._chat(repair, schema, name, strict, call)
        data, problem = _read(reply, checked)
        if data is not None:
            return data, True
        self._reject_unrepairable(reply, problem, name, call)
        raise LLMAnswerRejected(
            f"LLM answer for {name!r} (model {self.model!r}) rejected: invalid, and invalid again after one "
            f"repair: {problem}",
            reason=problem,
            answer=reply.text,
            attempts=call.requests,
        )

    def _reject_unrepairable(self, reply: _Reply, problem: str, name: str, call: _Call) -> None:
        """Raise at once for an invalid answer that a repair would only repeat (cut off, or refused)."""
        if reply.refusal:
            raise LLMAnswerRejected(
                f"LLM answer for {name!r} (model {self.model!r}) rejected: the model refused "
                f"({excerpt(reply.refusal)})",
                reason=f"refused: {excerpt(reply.refusal)}",
                answer=reply.text,
                attempts=call.requests,
            )
        if reply.finish_reason == "length":
            raise LLMAnswerRejected(
                f"LLM answer for {name!r} (model {self.model!r}) rejected: cut off at PVM_LLM_MAX_TOKENS="
                f"{self.max_tokens} tokens ({problem}): raise PVM_LLM_MAX_TOKENS, or send less per call",
                reason=f"cut off at {self.max_tokens} tokens",
                answer=reply.text,
                attempts=call.requests,
            )

    # -- one answer, with retries --

    def _chat(
        self, conversation: list[dict[str, str]], schema: Mapping[str, Any], name: str, strict: bool, call: _Call
    ) -> _Reply:
        malformed = 0
        attempt = 0
        asked_otherwise = 0
        while True:
            attempt += 1
            with self._lock:
                mode, tokens_parameter = self._mode, self._tokens_parameter
            try:
                return self._request(conversation, schema, name, strict, mode, tokens_parameter, call)
            except _Unsupported as unsupported:
                asked_otherwise += 1
                if asked_otherwise > len(MODES):  # each way of asking is given up at most once
                    raise LLMError(
                        f"{self.endpoint} (model {self.model!r}) refuses every way of asking: {unsupported}"
                    ) from unsupported
                attempt -= 1  # not the endpoint's failure: the same try, asked another way
                continue
            except ProviderRetry as retry:
                malformed += retry.malformed
                if attempt > self.max_retries or (retry.malformed and malformed > self.malformed_retries):
                    raise LLMUnavailable(
                        f"LLM request to {self.endpoint} (model {self.model!r}, {name!r}) failed after {attempt} "
                        f"attempt{'s' if attempt > 1 else ''}: {retry.reason}. {self._advice(retry)}",
                        reason=retry.reason,
                        status=retry.status,
                        attempts=call.requests,
                    ) from retry.__cause__
                wait = self._backoff.wait(attempt, retry.wait, self._random)
                log.warning(
                    "LLM request to %s failed (%s); retry %d of %d in %.2fs",
                    self.endpoint,
                    retry.reason,
                    attempt,
                    self.max_retries,
                    wait,
                )
                call.retries += 1
                time.sleep(wait)

    def _request(
        self,
        conversation: list[dict[str, str]],
        schema: Mapping[str, Any],
        name: str,
        strict: bool,
        mode: Mode,
        tokens_parameter: str,
        call: _Call,
    ) -> _Reply:
        """One HTTP request: the reply, or `ProviderRetry`, `_Unsupported` or an `LLMError`."""
        import openai  # loaded by __init__; only the server extra has it

        body: dict[str, Any] = {tokens_parameter: self.max_tokens}
        if mode == "json_schema":
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": dict(schema), "strict": strict},
            }
        elif mode == "json_object":
            body["response_format"] = {"type": "json_object"}
        messages: Any = conversation if mode == "json_schema" else _with_schema(conversation, schema)
        call.requests += 1
        try:
            raw = self._client.chat.completions.with_raw_response.create(
                model=self.model,
                messages=messages,
                temperature=self.temperature,
                timeout=self.timeout,
                extra_body=body,
            )
        except openai.APIError as error:
            retry = openai_retry(error, self.timeout)
            if retry is not None:
                raise retry from error
            if isinstance(error, openai.APIStatusError):
                self._step_down(error, mode, tokens_parameter)  # raises _Unsupported when it did
                raise self._status_error(error) from error
            raise
        response = raw.http_response
        try:
            answer = response.json()
        except ValueError as error:
            raise ProviderRetry(f"the answer is not JSON ({excerpt(response.text)})", malformed=True) from error
        return _reply(answer, call)

    def _step_down(self, error: openai.APIStatusError, mode: Mode, tokens_parameter: str) -> None:
        """When the server refused `response_format` or `max_tokens`, ask another way from now on."""
        if error.status_code not in (400, 422):
            return
        said = server_message(error.body).lower()
        param = _error_param(error.body)
        if mode != "text" and (param == "response_format" or "response_format" in said or mode in said):
            with self._lock:
                if self._mode == mode:
                    self._mode = MODES[MODES.index(mode) + 1]
                now = self._mode
            log.warning(
                "%s (model %r) refused response_format %r%s: asking for %s from now on",
                self.endpoint,
                self.model,
                mode,
                server_message(error.body),
                "a json_object" if now == "json_object" else "plain text with the schema in the prompt",
            )
            raise _Unsupported(f"response_format {mode!r} refused{server_message(error.body)}")
        if tokens_parameter == "max_tokens" and "max_completion_tokens" in said:
            with self._lock:
                self._tokens_parameter = "max_completion_tokens"
            log.info("%s (model %r) wants max_completion_tokens, not max_tokens", self.endpoint, self.model)
            raise _Unsupported(f"max_tokens refused{server_message(error.body)}")

    def _status_error(self, error: openai.APIStatusError) -> LLMError:
        """The error for an answer no retry changes, naming the setting to fix."""
        code = error.status_code
        said = server_message(error.body)
        if code == 401:
            return LLMConfigError(
                f"{self._key_setting} rejected (401) by {self.endpoint}{said}: set {self._key_setting} to a key "
                "this endpoint accepts",
                status=code,
            )
        if code == 403:
            return LLMConfigError(
                f"{self._key_setting} may not use model {self.model!r} (403) at {self.endpoint}{said}: grant the "
                "key access or change PVM_LLM_MODEL",
                status=code,
            )
        if code == 404:
            return LLMConfigError(
                f"{self.endpoint} or model {self.model!r} not found (404){said}: check {self._url_setting} (it "
                "usually ends in /v1) and PVM_LLM_MODEL",
                status=code,
            )
        if "temperature" in said.lower():
            return LLMConfigError(
                f"model {self.model!r} refused temperature {self.temperature:g} ({code}){said}: set "
                "PVM_LLM_TEMPERATURE to a value it takes",
                status=code,
            )
        return LLMError(
            f"{self.endpoint} (model {self.model!r}) rejected the request ({code}){said}: check PVM_LLM_MODEL and "
            "PVM_LLM_MAX_TOKENS, or send less per call",
            status=code,
        )

    def _advice(self, retry: ProviderRetry) -> str:
        if retry.malformed:
            return f"The endpoint does not answer like an OpenAI chat completions API: check {self._url_setting}"
        if retry.status == 429:
            return "The endpoint is rate limiting: make fewer calls or raise the provider's limits"
        if retry.status is None:
            return f"Check that the endpoint is up and reachable ({self._url_setting}), or raise PVM_LLM_TIMEOUT"
        return "The endpoint keeps failing: check its health, or raise PVM_LLM_MAX_RETRIES"

    # -- bookkeeping --

    def _closed(self) -> None:
        if self.breaker.succeeded():
            log.warning("LLM endpoint %s answers again", self.endpoint)

    def _count(self, add: LLMStats) -> None:
        with self._lock:
            s = self._stats
            self._stats = replace(
                s,
                **{f: getattr(s, f) + getattr(add, f) for f in LLMStats.__dataclass_fields__},
            )

    def _record(self, name: str, outcome: str, seconds: float | None, call: _Call) -> None:
        if self.metrics is not None:
            self.metrics.provider_call(
                PROVIDER,
                f"chat:{name}",
                outcome,
                seconds,
                tokens=call.prompt_tokens,
                completion_tokens=call.completion_tokens,
            )


def llm_from_settings(settings: Settings, metrics: MetricsRecorder | None = None) -> LLMClient | None:
    """The LLM client the settings ask for; None when PVM_LLM_MODEL is unset (no LLM: callers use rule paths).

    The endpoint is PVM_LLM_BASE_URL, else OPENAI_BASE_URL, else OpenAI's own
    API when a key is set; the key PVM_LLM_API_KEY, else OPENAI_API_KEY.
    """
    model = settings.llm_model
    if not model or not model.strip():
        if settings.llm_base_url:
            log.info("PVM_LLM_BASE_URL is set but PVM_LLM_MODEL is not: no LLM, rule-based paths only")
        return None
    url_setting = "PVM_LLM_BASE_URL" if settings.llm_base_url else "OPENAI_BASE_URL"
    base_url = settings.llm_base_url or settings.openai_base_url
    key_setting = "OPENAI_API_KEY" if settings.openai_api_key and not settings.llm_api_key else "PVM_LLM_API_KEY"
    api_key = settings.llm_api_key or settings.openai_api_key
    if not base_url:
        if not api_key:
            raise LLMConfigError(
                f"PVM_LLM_MODEL={model!r} is set but neither PVM_LLM_BASE_URL nor OPENAI_BASE_URL is: set one to "
                f"an OpenAI-compatible API, or PVM_LLM_API_KEY (or OPENAI_API_KEY) to use {OPENAI_DEFAULT_BASE_URL}"
            )
        base_url = OPENAI_DEFAULT_BASE_URL
    return LLMClient(
        base_url,
        api_key,
        model,
        timeout=settings.llm_timeout_s,
        max_retries=settings.llm_max_retries,
        max_tokens=settings.llm_max_tokens,
        temperature=settings.llm_temperature,
        metrics=metrics,
        url_setting=url_setting,
        key_setting=key_setting,
    )


def require_llm(settings: Settings, metrics: MetricsRecorder | None = None, *, purpose: str = "this") -> LLMClient:
    """The configured LLM client, for a caller that cannot work without one; `LLMConfigError` naming PVM_LLM_MODEL."""
    client = llm_from_settings(settings, metrics)
    if client is None:
        raise LLMConfigError(
            f"{purpose} needs an LLM, and PVM_LLM_MODEL is not set: set PVM_LLM_MODEL to a chat model of the "
            "endpoint (PVM_LLM_BASE_URL, else OPENAI_BASE_URL)"
        )
    return client


# -- reading answers ------------------------------------------------------------------------------------------------


def _conversation(messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    if isinstance(messages, str | Mapping) or not messages:
        raise TypeError("messages must be a non-empty list of {'role': ..., 'content': ...} mappings")
    conversation = []
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        content = message.get("content") if isinstance(message, Mapping) else None
        if role not in _ROLES or not isinstance(content, str):
            raise TypeError(
                f"messages[{i}] must be {{'role': 'system' | 'user' | 'assistant', 'content': str}}, got {message!r}"
            )
        conversation.append({"role": role, "content": content})
    return conversation


def _with_schema(conversation: list[dict[str, str]], schema: Mapping[str, Any]) -> list[dict[str, str]]:
    """The conversation with the schema instruction after its leading system messages."""
    at = next((i for i, m in enumerate(conversation) if m["role"] != "system"), len(conversation))
    instruction = {"role": "system", "content": SCHEMA_INSTRUCTION.format(schema=_dumps(schema))}
    return [*conversation[:at], instruction, *conversation[at:]]


def _reply(answer: Any, call: _Call) -> _Reply:
    """The first choice of a chat completion (and its usage counted into `call`); ProviderRetry if it is none."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(message, dict):
        raise ProviderRetry("malformed answer: not a chat completion (no choices[0].message)", malformed=True)
    usage = answer.get("usage")
    if isinstance(usage, dict):
        call.prompt_tokens += _count_of(usage.get("prompt_tokens"))
        call.completion_tokens += _count_of(usage.get("completion_tokens"))
    content = message.get("content")
    if isinstance(content, list):  # content parts, as some servers send them
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    refusal = message.get("refusal")
    finish_reason = first.get("finish_reason") if isinstance(first, dict) else None
    return _Reply(
        text=content if isinstance(content, str) else None,
        finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        refusal=refusal if isinstance(refusal, str) and refusal else None,
    )


def _read(reply: _Reply, schema: JSONSchema) -> tuple[dict[str, Any] | None, str]:
    """The answer's JSON object if it is one and valid, else None and what is wrong with it."""
    if reply.refusal:
        return None, f"the model refused: {excerpt(reply.refusal)}"
    if reply.text is None or not reply.text.strip():
        return None, "the answer is empty"
    data = parse_json_object(reply.text)
    if data is None:
        return None, f"the answer holds no JSON object ({excerpt(reply.text, 120)!r})"
    errors = schema.errors(data, limit=5)
    if errors:
        return None, "; ".join(errors)
    return data, ""


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The JSON object in a model's answer: the whole text, else a ```json fence's, else the first in the prose.

    An answer that is JSON but not an object (an array, a string) has none.
    NaN and Infinity are not JSON and are refused.
    """
    candidates = [text.strip()]
    candidates += [m.group(1).strip() for m in _FENCE.finditer(text)]
    for candidate in candidates:
        value = _loads(candidate)
        if value is not _NOT_JSON:
            return value if isinstance(value, dict) else None  # JSON, but an array or a scalar: not an answer
    decoder = json.JSONDecoder(parse_constant=_no_constant)
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return value  # the outermost object starting here: raw_decode reads to its matching brace
        start = text.find("{", start + 1)
    return None


_NOT_JSON = object()


def _loads(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError:
        return _NOT_JSON


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _error_param(body: object) -> str | None:
    error = body.get("error", body) if isinstance(body, dict) else None
    param = error.get("param") if isinstance(error, dict) else None
    return param if isinstance(param, str) else None


def _count_of(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _dumps(schema: Mapping[str, Any]) -> str:
    return json.dumps(schema, separators=(",", ":"), sort_keys=True)

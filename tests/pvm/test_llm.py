"""The LLM client, through the real openai client, against the loopback OpenAI-compatible server."""

from __future__ import annotations

import json
import time
from typing import Any

import openai
import pytest
import redis

from pvm.config import ConfigError, Settings
from pvm.json_schema import SchemaError
from pvm.llm import (
    REPAIR_INSTRUCTION,
    LLMAnswerRejected,
    LLMClient,
    LLMConfigError,
    LLMError,
    LLMUnavailable,
    llm_from_settings,
    parse_json_object,
    require_llm,
)
from pvm.metrics import MetricsRecorder
from pvm.protocols import ChatModel, JSONResult
from tests.openai_server import (
    OpenAIServer,
    answer,
    delay,
    fenced,
    malformed_json,
    openai_server_fixture,  # noqa: F401  (the `openai_server` fixture)
    status,
    wrong_shape,
)
from workers.ops.exporter import PvmCollector

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "facts": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "type": {"enum": ["fact", "decision", "constraint"]},
                    "subject": {"type": "string", "minLength": 1},
                    "attribute": {"type": "string", "minLength": 1},
                    "value": {"type": "string"},
                },
                "required": ["type", "subject", "attribute", "value"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["facts"],
    "additionalProperties": False,
}
GOOD = {"facts": [{"type": "decision", "subject": "service:auth", "attribute": "session_ttl", "value": "30m"}]}
MESSAGES = [
    {"role": "system", "content": "Extract the facts these minutes state."},
    {"role": "user", "content": "We decided: auth sessions expire after 30 minutes."},
]


def make(server: OpenAIServer, **options: Any) -> LLMClient:
    options = {"backoff_base": 0.01, "backoff_max": 0.2, "timeout": 5.0, **options}
    return LLMClient(server.base_url, "sk-test", "test-chat", **options)


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# Answers ----------------------------------------------------------------------------


def test_a_valid_answer_comes_back_with_its_usage_and_the_request_asks_for_the_schema(
    openai_server: OpenAIServer,
) -> None:
    openai_server.queue_chat_reply(answer(GOOD, prompt_tokens=41, completion_tokens=17))
    client = make(openai_server, max_tokens=300, temperature=0.2)

    result = client.complete_json(MESSAGES, SCHEMA, name="facts")

    assert result == JSONResult(
        data=GOOD, model="test-chat", repaired=False, prompt_tokens=41, completion_tokens=17, requests=1
    )
    [sent] = openai_server.chat_requests()
    assert sent.messages == MESSAGES  # the schema travels in response_format, not in the prompt
    assert sent.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "facts", "schema": SCHEMA, "strict": False},
    }
    assert sent.body["model"] == "test-chat"
    assert sent.body["max_tokens"] == 300 and sent.body["temperature"] == 0.2
    assert sent.authorization == "Bearer sk-test"
    assert client.stats.ok == 1 and client.stats.calls == 1 and client.stats.requests == 1


def test_a_fenced_answer_in_prose_is_read(openai_server: OpenAIServer) -> None:
    openai_server.queue_chat_reply(fenced(GOOD))
    result = make(openai_server).complete_json(MESSAGES, SCHEMA, name="facts")
    assert result.data == GOOD and not result.repaired
    assert len(openai_server.chat_requests()) == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ('  \n{"a": {"b": [1, 2]}}\n', {"a": {"b": [1, 2]}}),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('```\n{"a": 1}\n```', {"a": 1}),
        ('Sure! Here it is:\n```json\n{"a": "x}y"}\n```\nAnything else?', {"a": "x}y"}),
        ('The {placeholder} aside, the answer is {"a": {"b": 2}} and that is all.', {"a": {"b": 2}}),
        ('[{"a": 1}]', None),  # JSON, but not an object: no answer
        ('"just a string"', None),
        ('{"a": NaN}', None),
        ('{"a": 1', None),
        ("no json here", None),
        ("", None),
    ],
)
def test_parse_json_object(text: str, expected: dict[str, Any] | None) -> None:
    assert parse_json_object(text) == expected


def test_a_malformed_answer_is_repaired_once(openai_server: OpenAIServer) -> None:
    openai_server.queue_chat_reply('{"facts": [{"type": "decision",', GOOD)
    client = make(openai_server)

    result = client.complete_json(MESSAGES, SCHEMA, name="facts")

    assert result.data == GOOD and result.repaired and result.requests == 2
    _, repair = openai_server.chat_requests()
    assert repair.messages[: len(MESSAGES)] == MESSAGES
    assert repair.messages[len(MESSAGES)] == {"role": "assistant", "content": '{"facts": [{"type": "decision",'}
    follow_up = repair.messages[-1]
    assert follow_up["role"] == "user" and "holds no JSON object" in follow_up["content"]
    assert json.loads(follow_up["content"].split("JSON Schema:\n", 1)[1]) == SCHEMA  # the schema, quoted
    assert client.stats.repaired == 1


def test_a_schema_violation_is_repaired_quoting_the_validation_error(openai_server: OpenAIServer) -> None:
    wrong = {"facts": [{"type": "opinion", "subject": "service:auth", "value": "30m"}]}
    openai_server.queue_chat_reply(wrong, GOOD)

    result = make(openai_server).complete_json(MESSAGES, SCHEMA, name="facts")

    assert result.data == GOOD and result.repaired
    follow_up = openai_server.chat_requests()[1].messages[-1]["content"]
    assert follow_up.startswith(REPAIR_INSTRUCTION.split("{problem}")[0])
    assert "$.facts[0]: required property 'attribute' is missing" in follow_up
    assert "$.facts[0].type: 'opinion' is not one of ['fact', 'decision', 'constraint']" in follow_up


def test_an_answer_invalid_twice_is_rejected_and_never_returned(openai_server: OpenAIServer) -> None:
    openai_server.queue_chat_reply("I could not find any facts.", {"facts": "none"})
    client = make(openai_server)

    with pytest.raises(LLMAnswerRejected) as caught:
        client.complete_json(MESSAGES, SCHEMA, name="facts")

    assert "$.facts: 'none' is not of type array" in str(caught.value)
    assert caught.value.reason == "$.facts: 'none' is not of type array"
    assert caught.value.answer == '{"facts": "none"}'
    assert len(openai_server.chat_requests()) == 2  # the answer and one repair, no more
    assert client.stats.rejected == 1 and client.stats.ok == client.stats.repaired == 0
    assert not client.breaker.is_open  # the endpoint answered: nothing wrong with it


def test_an_answer_cut_off_at_max_tokens_is_rejected_without_a_repair(openai_server: OpenAIServer) -> None:
    openai_server.queue_chat_reply(answer('{"facts": [{"type": "dec', finish_reason="length"))
    with pytest.raises(LLMAnswerRejected, match="PVM_LLM_MAX_TOKENS=64"):
        make(openai_server, max_tokens=64).complete_json(MESSAGES, SCHEMA, name="facts")
    assert len(openai_server.chat_requests()) == 1


def test_a_refusal_is_rejected_without_a_repair(openai_server: OpenAIServer) -> None:
    openai_server.queue_chat_reply(answer(None, refusal="I can't help with that."))
    with pytest.raises(LLMAnswerRejected, match="the model refused") as caught:
        make(openai_server).complete_json(MESSAGES, SCHEMA, name="facts")
    assert caught.value.answer is None  # no content came, only the refusal
    assert len(openai_server.chat_requests()) == 1


# Faults -----------------------------------------------------------------------------


def test_429_waits_for_retry_after_then_succeeds(openai_server: OpenAIServer) -> None:
    openai_server.fail_next(status(429, retry_after=0.3))
    openai_server.queue_chat_reply(GOOD)
    client = make(openai_server, backoff_max=5.0)
    started = time.monotonic()

    result = client.complete_json(MESSAGES, SCHEMA, name="facts")

    assert time.monotonic() - started >= 0.3
    assert result.data == GOOD and result.requests == 2
    assert client.stats.retries == 1


def test_retry_after_is_bounded_by_backoff_max(openai_server: OpenAIServer) -> None:
    openai_server.fail_next(status(429, retry_after=60))
    openai_server.queue_chat_reply(GOOD)
    started = time.monotonic()
    assert make(openai_server, backoff_max=0.2).complete_json(MESSAGES, SCHEMA, name="facts").data == GOOD
    assert time.monotonic() - started < 30  # far below the 60 s asked for


def test_malformed_http_answers_are_retried(openai_server: OpenAIServer) -> None:
    openai_server.fail_next(malformed_json(), wrong_shape())
    openai_server.queue_chat_reply(GOOD)
    client = make(openai_server)
    assert client.complete_json(MESSAGES, SCHEMA, name="facts").data == GOOD
    assert len(openai_server.chat_requests()) == 3 and client.stats.retries == 2
    # Reading the answers the faults replaced did not eat a scripted one.
    assert openai_server.pending_chat_replies == 0


def test_a_timeout_is_retried_and_a_last_one_says_what_to_raise(openai_server: OpenAIServer) -> None:
    openai_server.fail_next(delay(3))
    openai_server.queue_chat_reply(GOOD)
    client = make(openai_server, timeout=0.3, max_retries=1)
    assert client.complete_json(MESSAGES, SCHEMA, name="facts").data == GOOD
    assert len(openai_server.chat_requests()) == 2

    openai_server.fail_next(delay(3), times=2)
    with pytest.raises(LLMUnavailable, match=r"timed out after 0\.3s.*PVM_LLM_TIMEOUT") as caught:
        client.complete_json(MESSAGES, SCHEMA, name="facts")
    assert caught.value.attempts == 2


def test_500s_exhaust_the_retries_then_the_breaker_fails_fast_and_closes_after_the_cooldown(
    openai_server: OpenAIServer,
) -> None:
    clock = ManualClock()
    client = make(openai_server, max_retries=1, breaker_threshold=2, breaker_cooldown_s=30.0, clock=clock)
    openai_server.fail_next(status(500), times=4)

    with pytest.raises(LLMUnavailable, match=r"HTTP 500.*PVM_LLM_MAX_RETRIES") as first:
        client.complete_json(MESSAGES, SCHEMA, name="facts")
    assert first.value.status == 500 and first.value.attempts == 2
    assert not client.breaker.is_open  # one failed call of the two it takes
    with pytest.raises(LLMUnavailable):
        client.complete_json(MESSAGES, SCHEMA, name="facts")
    assert client.breaker.is_open and len(openai_server.chat_requests()) == 4

    with pytest.raises(LLMUnavailable, match=r"not made.*has been failing: HTTP 500.*next try in 30\.0s"):
        client.complete_json(MESSAGES, SCHEMA, name="facts")
    assert len(openai_server.chat_requests()) == 4  # failed fast: no request
    assert client.stats.short_circuits == 1

    clock.now += 30
    openai_server.queue_chat_reply(GOOD)
    assert client.complete_json(MESSAGES, SCHEMA, name="facts").data == GOOD  # the trial
    assert not client.breaker.is_open and len(openai_server.chat_requests()) == 5


def test_a_refused_key_is_a_config_error_naming_the_variable_without_retries(openai_server: OpenAIServer) -> None:
    openai_server.api_key = "sk-right"
    settings = Settings(llm_model="test-chat", openai_base_url=openai_server.base_url, openai_api_key="sk-wrong")
    client = llm_from_settings(settings)
    assert client is not None
    with pytest.raises(LLMConfigError, match=r"OPENAI_API_KEY rejected \(401\).*set OPENAI_API_KEY"):
        client.complete_json(MESSAGES, SCHEMA, name="facts")
    assert len(openai_server.chat_requests()) == 1

    settings = settings.with_(llm_api_key="sk-also-wrong")
    client = llm_from_settings(settings)
    assert client is not None
    with pytest.raises(LLMConfigError, match="set PVM_LLM_API_KEY"):
        client.complete_json(MESSAGES, SCHEMA, name="facts")


def test_a_rejected_request_is_an_error_with_the_servers_words(openai_server: OpenAIServer) -> None:
    openai_server.fail_next(status(400))
    with pytest.raises(LLMError, match=r"rejected the request \(400\) \(scripted failure with status 400\)"):
        make(openai_server).complete_json(MESSAGES, SCHEMA, name="facts")
    assert len(openai_server.chat_requests()) == 1


# Structured output that the server refuses ------------------------------------------


def test_a_refused_json_schema_falls_back_to_json_object_and_the_client_remembers(
    openai_server: OpenAIServer,
) -> None:
    openai_server.options.refuse_response_format = frozenset({"json_schema"})
    openai_server.queue_chat_reply(GOOD, GOOD)
    client = make(openai_server, max_retries=0)

    assert client.complete_json(MESSAGES, SCHEMA, name="facts").data == GOOD
    assert client.mode == "json_object"
    assert client.complete_json(MESSAGES, SCHEMA, name="facts").data == GOOD

    refused, first, second = openai_server.chat_requests()
    assert refused.response_format is not None and refused.response_format["type"] == "json_schema"
    assert first.response_format == second.response_format == {"type": "json_object"}
    # Without json_schema, the schema goes into the prompt, after the caller's system message.
    assert first.messages[0] == MESSAGES[0] and first.messages[2:] == MESSAGES[1:]
    instruction = first.messages[1]
    assert instruction["role"] == "system" and "JSON Schema" in instruction["content"]
    assert json.loads(instruction["content"].split("\n", 1)[1]) == SCHEMA


def test_a_server_without_response_format_gets_plain_text_with_the_schema(openai_server: OpenAIServer) -> None:
    openai_server.options.refuse_response_format = frozenset({"json_schema", "json_object"})
    openai_server.queue_chat_reply(fenced(GOOD), GOOD)
    client = make(openai_server)

    assert client.complete_json(MESSAGES, SCHEMA, name="facts").data == GOOD
    assert client.mode == "text"
    assert client.complete_json(MESSAGES, SCHEMA, name="facts").data == GOOD
    formats = [r.response_format for r in openai_server.chat_requests()]
    assert formats == [
        {"type": "json_schema", "json_schema": {"name": "facts", "schema": SCHEMA, "strict": False}},
        {"type": "json_object"},
        None,
        None,
    ]
    assert "JSON Schema" in openai_server.chat_requests()[-1].messages[1]["content"]


def test_a_model_that_wants_max_completion_tokens_gets_it(openai_server: OpenAIServer) -> None:
    openai_server.options.refuse_max_tokens = True
    openai_server.queue_chat_reply(GOOD, GOOD)
    client = make(openai_server, max_tokens=500)
    client.complete_json(MESSAGES, SCHEMA, name="facts")
    client.complete_json(MESSAGES, SCHEMA, name="facts")
    bodies = [r.body for r in openai_server.chat_requests()]
    assert [("max_tokens" in b, b.get("max_completion_tokens")) for b in bodies] == [
        (True, None),
        (False, 500),
        (False, 500),
    ]


# Metrics ----------------------------------------------------------------------------


def test_calls_tokens_and_latency_are_recorded_in_redis_and_served_by_the_exporter(
    openai_server: OpenAIServer, redis_client: redis.Redis, settings: Settings
) -> None:
    clock = ManualClock()
    client = make(
        openai_server,
        metrics=MetricsRecorder(redis_client),
        max_retries=0,
        breaker_threshold=1,
        clock=clock,
    )
    openai_server.queue_chat_reply(
        answer(GOOD, prompt_tokens=100, completion_tokens=20),  # ok
        answer("nope", prompt_tokens=100, completion_tokens=1),  # repaired ...
        answer(GOOD, prompt_tokens=130, completion_tokens=20),
        answer("nope", prompt_tokens=100, completion_tokens=1),  # rejected
        answer("still nope", prompt_tokens=130, completion_tokens=2),
    )
    client.complete_json(MESSAGES, SCHEMA, name="facts")
    client.complete_json(MESSAGES, SCHEMA, name="facts")
    with pytest.raises(LLMAnswerRejected):
        client.complete_json(MESSAGES, SCHEMA, name="facts")
    openai_server.fail_next(status(503))
    with pytest.raises(LLMUnavailable):
        client.complete_json(MESSAGES, SCHEMA, name="facts")  # error; opens the breaker
    with pytest.raises(LLMUnavailable):
        client.complete_json(MESSAGES, SCHEMA, name="facts")  # unavailable: no request

    families = {f.name: f for f in PvmCollector(redis_client, settings).collect()}
    calls = {
        s.labels["outcome"]: s.value
        for s in families["pvm_provider_calls"].samples
        if s.labels["kind"] == "chat:facts" and s.name.endswith("_total")
    }
    assert calls == {"ok": 1, "repaired": 1, "rejected": 1, "error": 1, "unavailable": 1}
    labels = {"provider": "openai", "kind": "chat:facts"}
    assert (labels, 560.0) in [(s.labels, s.value) for s in families["pvm_provider_tokens"].samples]
    completion = [(s.labels, s.value) for s in families["pvm_provider_completion_tokens"].samples]
    assert (labels, 44.0) in completion
    latency = {s.name: s.value for s in families["pvm_provider_latency_seconds"].samples if s.labels == labels}
    assert latency["pvm_provider_latency_seconds_count"] == 4  # the refused call has no latency
    assert latency["pvm_provider_latency_seconds_sum"] > 0

    stats = client.stats
    assert (stats.calls, stats.ok, stats.repaired, stats.rejected, stats.failures, stats.short_circuits) == (
        5,
        1,
        1,
        1,
        1,
        1,
    )
    assert (stats.requests, stats.prompt_tokens, stats.completion_tokens) == (6, 560, 44)


# Configuration ----------------------------------------------------------------------


def test_no_model_means_no_llm_and_a_caller_that_needs_one_is_told_to_set_pvm_llm_model() -> None:
    assert llm_from_settings(Settings()) is None
    assert llm_from_settings(Settings(llm_base_url="http://127.0.0.1:1/v1")) is None
    with pytest.raises(LLMConfigError, match="the PAIR judge needs an LLM, and PVM_LLM_MODEL is not set"):
        require_llm(Settings(), purpose="the PAIR judge")
    with pytest.raises(ConfigError, match="PVM_LLM_MODEL is not set"):
        LLMClient("http://127.0.0.1:1/v1", None, None)


def test_the_endpoint_and_key_default_to_openais_variables(openai_server: OpenAIServer) -> None:
    env = {
        "PVM_LLM_MODEL": "test-chat",
        "OPENAI_BASE_URL": openai_server.base_url,
        "OPENAI_API_KEY": "sk-shared",
        "PVM_LLM_TIMEOUT": "7.5",
        "PVM_LLM_MAX_RETRIES": "4",
        "PVM_LLM_MAX_TOKENS": "900",
        "PVM_LLM_TEMPERATURE": "0.3",
    }
    client = llm_from_settings(Settings.from_env(env))
    assert client is not None
    assert (client.base_url, client.model, client.timeout) == (openai_server.base_url, "test-chat", 7.5)
    assert (client.max_retries, client.max_tokens, client.temperature) == (4, 900, 0.3)
    openai_server.queue_chat_reply(GOOD)
    client.complete_json(MESSAGES, SCHEMA, name="facts")
    assert openai_server.chat_requests()[0].authorization == "Bearer sk-shared"

    own = llm_from_settings(
        Settings.from_env({**env, "PVM_LLM_BASE_URL": "http://127.0.0.1:9/v1", "PVM_LLM_API_KEY": "sk-llm"})
    )
    assert own is not None and own.base_url == "http://127.0.0.1:9/v1"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PVM_LLM_MODEL": "m"}, "neither PVM_LLM_BASE_URL nor OPENAI_BASE_URL"),
        ({"PVM_LLM_MODEL": "m", "PVM_LLM_BASE_URL": "https://api.openai.com/v1"}, "PVM_LLM_API_KEY is not set"),
        ({"PVM_LLM_MODEL": "m", "PVM_LLM_TEMPERATURE": "3"}, "PVM_LLM_TEMPERATURE='3' is out of range"),
        ({"PVM_LLM_MODEL": "m", "PVM_LLM_BASE_URL": "localhost:11434"}, "PVM_LLM_BASE_URL='localhost:11434'"),
    ],
)
def test_configuration_errors_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        llm_from_settings(Settings.from_env(env))


def test_bad_calls_are_refused_before_any_request(openai_server: OpenAIServer) -> None:
    client = make(openai_server)
    with pytest.raises(SchemaError, match="patternProperties"):
        client.complete_json(MESSAGES, {"type": "object", "patternProperties": {}}, name="facts")
    with pytest.raises(ValueError, match="must describe an object"):
        client.complete_json(MESSAGES, {"type": "array"}, name="facts")
    with pytest.raises(ValueError, match="name="):
        client.complete_json(MESSAGES, SCHEMA, name="facts and more")
    with pytest.raises(TypeError, match=r"messages\[0\]"):
        client.complete_json([{"role": "robot", "content": "hi"}], SCHEMA, name="facts")
    assert openai_server.requests == []


def test_a_test_double_is_a_few_lines() -> None:
    class Scripted:
        def complete_json(self, messages: Any, schema: Any, *, name: str) -> JSONResult:
            return JSONResult(data=GOOD, model="scripted")

    model: ChatModel = Scripted()
    assert model.complete_json(MESSAGES, SCHEMA, name="facts").data == GOOD


def test_the_real_client_speaks_to_the_test_server_as_to_openai(openai_server: OpenAIServer) -> None:
    # The server's own chat behaviour, through the plain openai client: scripted replies, refusals, usage.
    plain = openai.OpenAI(base_url=openai_server.base_url, api_key="k", max_retries=0)
    openai_server.queue_chat_reply(answer(GOOD, prompt_tokens=5, completion_tokens=3))
    reply = plain.chat.completions.create(model="test-chat", messages=[{"role": "user", "content": "x"}])
    assert json.loads(reply.choices[0].message.content or "") == GOOD
    assert reply.usage is not None and (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (5, 3)
    openai_server.options.refuse_response_format = frozenset({"json_object"})
    with pytest.raises(openai.BadRequestError, match="response_format"):
        plain.chat.completions.create(
            model="test-chat", messages=[{"role": "user", "content": "x"}], response_format={"type": "json_object"}
        )

"""Embedders against a real OpenAI-compatible HTTP server on loopback, with injected faults."""

from __future__ import annotations

import math
import socket
import time

import openai
import pytest

from pvm import engines
from pvm.config import ConfigError, Settings
from pvm.embedders import (
    EmbedderStats,
    EmbeddingConfigError,
    EmbeddingError,
    NoEmbedder,
    OpenAIEmbedder,
    embedder_from_settings,
)
from pvm.protocols import Embedder
from tests.openai_server import (
    WRONG_SHAPES,
    Fault,
    OpenAIServer,
    delay,
    embed_text,
    malformed_json,
    openai_server_fixture,  # noqa: F401  (the `openai_server` fixture)
    status,
    wrong_shape,
)


def make(server: OpenAIServer, **options: object) -> OpenAIEmbedder:
    options = {"backoff_base": 0.01, "backoff_max": 0.2, "timeout": 5.0, **options}
    return OpenAIEmbedder(base_url=server.base_url, api_key="sk-test", model="test-embed", **options)  # type: ignore[arg-type]


def texts(n: int) -> list[str]:
    return [f"agent {i % 7} finished task {i} of project alpha" for i in range(n)]


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


# Happy path -------------------------------------------------------------------------


def test_order_is_preserved_across_batches_of_at_most_2048(openai_server: OpenAIServer) -> None:
    openai_server.options.shuffle = True  # items come back reversed: only `index` gives the order
    inputs = texts(5000)
    vectors = make(openai_server, dimensions=16).embed(inputs)

    assert openai_server.embedding_batches() == [2048, 2048, 904]
    assert len(vectors) == 5000
    for i in (0, 1, 2047, 2048, 4095, 4096, 4999):
        assert vectors[i] == pytest.approx(embed_text(inputs[i], 16), abs=1e-6)


def test_smaller_batch_size_and_token_budget_split_batches(openai_server: OpenAIServer) -> None:
    make(openai_server, batch_size=100).embed(texts(250))
    assert openai_server.embedding_batches() == [100, 100, 50]

    openai_server.reset()
    long = ["word " * 300] * 10  # ~500 estimated tokens each
    make(openai_server, max_batch_tokens=2000).embed(long)
    assert openai_server.embedding_batches() == [3, 3, 3, 1]


@pytest.mark.parametrize("encoding", ["base64", "float"])
def test_dimensions_are_sent_and_honoured(openai_server: OpenAIServer, encoding: str) -> None:
    embedder: Embedder = make(openai_server, dimensions=24, encoding_format=encoding)
    vectors = embedder.embed(["deploy the api", "deploy the API gateway"])

    request = openai_server.requests[0]
    assert request.body["dimensions"] == 24
    assert request.body["encoding_format"] == encoding
    assert request.authorization == "Bearer sk-test"
    assert embedder.dimensions == 24
    assert [len(v) for v in vectors] == [24, 24]
    assert vectors[0] == pytest.approx(embed_text("deploy the api", 24), abs=1e-6)


def test_base64_requested_but_floats_answered_is_accepted(openai_server: OpenAIServer) -> None:
    openai_server.options.ignore_encoding_format = True
    assert make(openai_server).embed(["x y"])[0] == pytest.approx(embed_text("x y"), abs=1e-9)


def test_dimensions_are_learned_from_the_first_answer(openai_server: OpenAIServer) -> None:
    embedder = make(openai_server)
    assert openai_server.requests == []  # nothing is sent until the length is asked for
    assert embedder.dimensions == 64  # one probe request
    assert len(openai_server.requests) == 1
    assert "dimensions" not in openai_server.requests[0].body
    embedder.embed(["a"])
    assert embedder.dimensions == 64
    assert len(openai_server.requests) == 2


@pytest.mark.parametrize("fault", [status(503), delay(30), malformed_json()], ids=["503", "hang", "malformed"])
def test_learning_dimensions_is_one_short_try_that_names_the_setting(openai_server: OpenAIServer, fault: Fault) -> None:
    embedder = make(openai_server, max_retries=5, timeout=30.0, query_timeout=0.3)
    openai_server.fail_next(fault, times=10)
    with pytest.raises(EmbeddingConfigError, match="set PVM_EMBED_DIMENSIONS") as caught:
        _ = embedder.dimensions
    assert len(openai_server.requests) == 1 and caught.value.attempts == 1  # the query policy: no retries
    assert embedder.stats.retries == 0 and embedder.stats.failures == 1

    openai_server.reset()  # the provider is back: the next ask probes again
    assert embedder.dimensions == 64 and len(openai_server.requests) == 1


def test_a_rejected_key_while_learning_dimensions_names_the_key(openai_server: OpenAIServer) -> None:
    openai_server.api_key = "sk-other"
    with pytest.raises(EmbeddingConfigError, match="OPENAI_API_KEY"):
        _ = make(openai_server).dimensions
    assert len(openai_server.requests) == 1


def test_the_stored_length_spares_the_probe_and_is_checked(openai_server: OpenAIServer) -> None:
    embedder = make(openai_server, stored_dimensions=64)
    assert embedder.dimensions == 64 and openai_server.requests == []
    assert len(embedder.embed(["a"])[0]) == 64
    assert "dimensions" not in openai_server.requests[0].body  # a stored length is not asked of the model

    other_model = make(openai_server, stored_dimensions=8)
    with pytest.raises(EmbeddingConfigError, match=r"vector store holds 8-dimension.*PVM_EMBED_DIMENSIONS=64"):
        other_model.embed(["a"])
    assert len(openai_server.requests) == 2  # a configuration error: not retried

    assert make(openai_server, dimensions=16, stored_dimensions=8).dimensions == 16  # the setting wins


def test_a_model_ignoring_dimensions_is_a_config_error_not_retried(openai_server: OpenAIServer) -> None:
    openai_server.options.ignore_dimensions = True  # answers 64 floats whatever was asked
    with pytest.raises(EmbeddingConfigError, match="PVM_EMBED_DIMENSIONS") as caught:
        make(openai_server, dimensions=16).embed(["a"])
    assert "length 64" in str(caught.value)
    assert len(openai_server.requests) == 1


def test_similar_texts_get_similar_vectors(openai_server: OpenAIServer) -> None:
    a, b, c = make(openai_server).embed(
        ["database migration failed on shard 3", "the database migration failed", "lunch menu for friday"]
    )
    assert cosine(a, b) > 0.5 > cosine(a, c)
    assert math.sqrt(sum(x * x for x in a)) == pytest.approx(1.0, abs=1e-5)


def test_empty_inputs(openai_server: OpenAIServer) -> None:
    embedder = make(openai_server)
    assert embedder.embed([]) == []
    assert openai_server.requests == []
    # The server (like OpenAI) rejects empty strings; blank texts are sent as a space instead.
    vectors = embedder.embed(["", "   ", "real text"])
    assert len(vectors) == 3
    assert openai_server.requests[0].inputs == [" ", " ", "real text"]


def test_over_long_inputs_are_truncated(openai_server: OpenAIServer) -> None:
    make(openai_server, max_input_chars=50).embed(["x" * 500])
    assert openai_server.requests[0].inputs == ["x" * 50]


def test_a_single_string_is_refused() -> None:
    embedder = OpenAIEmbedder("http://127.0.0.1:9/v1", None, "m")
    with pytest.raises(TypeError, match="not a single str"):
        embedder.embed("hello")
    with pytest.raises(TypeError, match="got int"):
        embedder.embed(["ok", 3])  # type: ignore[list-item]


# Faults that heal ---------------------------------------------------------------------


def test_429_waits_for_retry_after_then_succeeds(openai_server: OpenAIServer) -> None:
    openai_server.fail_next(status(429, retry_after=0.2))
    embedder = make(openai_server, backoff_max=5.0)
    started = time.monotonic()
    vectors = embedder.embed(["a b c"])
    elapsed = time.monotonic() - started

    assert 0.2 <= elapsed < 2.0
    assert vectors[0] == pytest.approx(embed_text("a b c"), abs=1e-6)
    assert len(openai_server.requests) == 2
    assert embedder.stats.retries == 1


def test_retry_after_ms_is_honoured(openai_server: OpenAIServer) -> None:
    openai_server.fail_next(status(429, retry_after_ms=150))
    started = time.monotonic()
    make(openai_server, backoff_max=5.0).embed(["a"])
    assert time.monotonic() - started >= 0.15


def test_retry_after_is_bounded_by_backoff_max(openai_server: OpenAIServer) -> None:
    openai_server.fail_next(status(429, retry_after=60))
    started = time.monotonic()
    make(openai_server, backoff_max=0.2).embed(["a"])
    assert time.monotonic() - started < 2.0
    assert len(openai_server.requests) == 2


@pytest.mark.parametrize("code", [500, 502, 503, 408])
def test_server_errors_are_retried_then_succeed(openai_server: OpenAIServer, code: int) -> None:
    openai_server.fail_next(status(code), times=3)
    embedder = make(openai_server)
    assert len(embedder.embed(["a", "b"])) == 2
    assert len(openai_server.requests) == 4
    assert embedder.stats.retries == 3
    assert embedder.stats.failures == 0


def test_timeout_is_retried_then_succeeds(openai_server: OpenAIServer) -> None:
    openai_server.fail_next(delay(3.0))
    embedder = make(openai_server, timeout=0.3)
    started = time.monotonic()
    assert len(embedder.embed(["slow"])) == 1
    assert time.monotonic() - started < 2.0
    assert len(openai_server.requests) == 2
    assert embedder.stats.retries == 1


def test_malformed_json_is_retried_then_succeeds(openai_server: OpenAIServer) -> None:
    openai_server.fail_next(malformed_json())
    embedder = make(openai_server)
    assert embedder.embed(["a"])[0] == pytest.approx(embed_text("a"), abs=1e-6)
    assert len(openai_server.requests) == 2


@pytest.mark.parametrize("kind", WRONG_SHAPES)
def test_wrong_shapes_are_retried_then_succeed(openai_server: OpenAIServer, kind: str) -> None:
    openai_server.fail_next(wrong_shape(kind))
    embedder = make(openai_server, dimensions=8)
    inputs = ["one", "two", "three"]
    vectors = embedder.embed(inputs)
    assert vectors == [pytest.approx(embed_text(t, 8), abs=1e-6) for t in inputs]
    assert len(openai_server.requests) == 2
    assert embedder.stats.retries == 1


# Faults that do not heal --------------------------------------------------------------


def test_persistent_500_fails_after_max_retries_naming_the_endpoint(openai_server: OpenAIServer) -> None:
    openai_server.fail_next(status(500), times=100)
    embedder = make(openai_server, max_retries=3)
    with pytest.raises(EmbeddingError) as caught:
        embedder.embed(["a"])
    message = str(caught.value)
    assert f"{openai_server.base_url}/embeddings" in message
    assert "HTTP 500" in message and "4 attempts" in message
    assert caught.value.status == 500 and caught.value.attempts == 4
    assert len(openai_server.requests) == 4
    assert embedder.stats.failures == 1


def test_persistently_malformed_answers_give_up_early(openai_server: OpenAIServer) -> None:
    openai_server.fail_next(malformed_json(), times=100)
    with pytest.raises(EmbeddingError, match=r"not JSON.*OPENAI_BASE_URL"):
        make(openai_server, max_retries=5).embed(["a"])
    assert len(openai_server.requests) == 3  # the first try and two retries, not six


def test_401_is_not_retried_and_names_the_api_key(openai_server: OpenAIServer) -> None:
    openai_server.api_key = "the-right-key"
    embedder = make(openai_server)
    with pytest.raises(EmbeddingConfigError, match=r"OPENAI_API_KEY rejected \(401\)") as caught:
        embedder.embed(["a"])
    assert "Incorrect API key" in str(caught.value)
    assert isinstance(caught.value, EmbeddingError) and isinstance(caught.value, ConfigError)
    assert len(openai_server.requests) == 1
    assert embedder.stats.retries == 0 and embedder.stats.failures == 1


@pytest.mark.parametrize(
    ("code", "names"),
    [(404, "PVM_EMBED_MODEL"), (403, "PVM_EMBED_MODEL"), (400, "PVM_EMBED_DIMENSIONS"), (422, "PVM_EMBED_MODEL")],
)
def test_client_errors_are_not_retried(openai_server: OpenAIServer, code: int, names: str) -> None:
    openai_server.fail_next(status(code), times=10)
    with pytest.raises(EmbeddingError, match=names) as caught:
        make(openai_server, dimensions=8).embed(["a"])
    assert caught.value.status == code
    assert len(openai_server.requests) == 1


def test_connection_refused_is_retried_then_fails_naming_the_endpoint() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    embedder = OpenAIEmbedder(f"http://127.0.0.1:{port}/v1", "k", "m", max_retries=2, backoff_base=0.01)
    with pytest.raises(EmbeddingError, match=rf"127\.0\.0\.1:{port}/v1/embeddings.*could not connect"):
        embedder.embed(["a"])
    assert embedder.stats.calls == 3 and embedder.stats.retries == 2 and embedder.stats.failures == 1


# Search queries: one short try ---------------------------------------------------------


def test_embed_query_returns_the_query_vector(openai_server: OpenAIServer) -> None:
    embedder = make(openai_server, dimensions=16)
    assert embedder.embed_query("gateway rollback") == pytest.approx(embed_text("gateway rollback", 16), abs=1e-6)
    assert openai_server.embedding_batches() == [1]
    with pytest.raises(TypeError, match="got list"):
        embedder.embed_query(["a"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        (status(500), "HTTP 500"),
        (status(429, retry_after=0.01), "HTTP 429"),
        (delay(30), "timed out after 0.2s"),
        (malformed_json(), "not JSON"),
    ],
)
def test_embed_query_makes_one_try_within_the_query_timeout(
    openai_server: OpenAIServer, fault: Fault, says: str
) -> None:
    openai_server.fail_next(fault, times=10)
    embedder = make(openai_server, max_retries=5, query_timeout=0.2)
    with pytest.raises(EmbeddingError, match="after 1 attempt") as caught:
        embedder.embed_query("deploy")
    assert says in str(caught.value) and caught.value.attempts == 1
    if "timed out" in says:
        assert "PVM_EMBED_QUERY_TIMEOUT" in str(caught.value)
    assert len(openai_server.requests) == 1
    assert embedder.stats.retries == 0 and embedder.stats.failures == 1


def test_batches_keep_retrying_while_queries_do_not(openai_server: OpenAIServer) -> None:
    embedder = make(openai_server, max_retries=3, query_timeout=0.2)
    openai_server.fail_next(status(500), times=2)
    assert len(embedder.embed(["a", "b"])) == 2  # the index pool's policy: retried through the outage
    assert len(openai_server.requests) == 3 and embedder.stats.retries == 2
    openai_server.fail_next(status(500))
    with pytest.raises(EmbeddingError):
        embedder.embed_query("a")
    assert len(openai_server.requests) == 4 and embedder.stats.retries == 2
    # The short query timeout is per request: a batch slower than it still succeeds.
    openai_server.fail_next(delay(0.4))
    assert len(embedder.embed(["slow batch"])) == 1
    assert len(openai_server.requests) == 5 and embedder.stats.retries == 2


def test_settings_give_queries_their_own_timeout() -> None:
    settings = Settings(
        embed_model="m", openai_base_url="http://127.0.0.1:9/v1", embed_timeout_s=30.0, embed_query_timeout_s=0.7
    )
    embedder = engines.embedder_for(settings)
    assert isinstance(embedder, OpenAIEmbedder)
    assert (embedder.timeout, embedder.query_timeout, embedder.max_retries) == (30.0, 0.7, settings.embed_max_retries)


# Configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"base_url": None}, "OPENAI_BASE_URL"),
        ({"base_url": "  "}, "OPENAI_BASE_URL"),
        ({"base_url": "localhost:8000"}, "OPENAI_BASE_URL"),
        ({"model": None}, "PVM_EMBED_MODEL"),
        ({"model": ""}, "PVM_EMBED_MODEL"),
        ({"base_url": "https://api.openai.com/v1", "api_key": None}, "OPENAI_API_KEY"),
        ({"dimensions": 0}, "PVM_EMBED_DIMENSIONS"),
        ({"batch_size": 5000}, "PVM_EMBED_BATCH_SIZE"),
        ({"batch_size": 0}, "PVM_EMBED_BATCH_SIZE"),
        ({"max_retries": -1}, "PVM_EMBED_MAX_RETRIES"),
        ({"timeout": 0}, "PVM_EMBED_TIMEOUT"),
        ({"query_timeout": 0}, "PVM_EMBED_QUERY_TIMEOUT"),
    ],
)
def test_misconfiguration_names_the_env_var(kwargs: dict[str, object], names: str) -> None:
    args: dict[str, object] = {"base_url": "http://127.0.0.1:9/v1", "api_key": None, "model": "m", **kwargs}
    with pytest.raises(EmbeddingConfigError, match=names):
        OpenAIEmbedder(**args)  # type: ignore[arg-type]


def test_embedder_from_settings() -> None:
    assert isinstance(embedder_from_settings(None, None, None), NoEmbedder)
    # OPENAI_BASE_URL / OPENAI_API_KEY alone may be there for the LLM: no model, no dense vectors.
    assert isinstance(embedder_from_settings("", "http://127.0.0.1:9/v1", "k"), NoEmbedder)

    local = embedder_from_settings("m", "http://127.0.0.1:9/v1/", None, 32, batch_size=64)
    assert isinstance(local, OpenAIEmbedder)
    assert local.endpoint == "http://127.0.0.1:9/v1/embeddings"
    assert (local.dimensions, local.batch_size) == (32, 64)

    hosted = embedder_from_settings("text-embedding-3-small", None, "sk-x")
    assert isinstance(hosted, OpenAIEmbedder) and hosted.endpoint == "https://api.openai.com/v1/embeddings"

    with pytest.raises(EmbeddingConfigError, match="OPENAI_BASE_URL"):
        embedder_from_settings("m", None, None)


def test_no_embedder_is_lexical_only() -> None:
    embedder: Embedder = NoEmbedder()
    assert embedder.dimensions is None
    with pytest.raises(EmbeddingConfigError, match="PVM_EMBED_MODEL"):
        embedder.embed(["a"])


# Stats ------------------------------------------------------------------------------


def test_stats_count_calls_retries_tokens_and_latency(openai_server: OpenAIServer) -> None:
    embedder = make(openai_server, batch_size=3)
    assert embedder.stats == EmbedderStats()
    openai_server.fail_next(status(503), delay(0.05))
    embedder.embed(["one two", "three", "four five six", "seven"])

    stats = embedder.stats
    assert stats.calls == 3  # 503, then the first batch of 3, then the batch of 1
    assert stats.retries == 1
    assert stats.failures == 0
    assert stats.texts == 4
    assert stats.input_tokens == 2 + 1 + 3 + 1  # as the server's `usage` reported
    assert stats.latency_s >= 0.05
    assert 0 < stats.last_latency_s <= stats.latency_s


# The test server itself -------------------------------------------------------------


def test_chat_completions_echo_and_scripted_replies(openai_server: OpenAIServer) -> None:
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="k", max_retries=0)
    reply = client.chat.completions.create(model="test-chat", messages=[{"role": "user", "content": "hello"}])
    assert reply.choices[0].message.content == "echo: hello"
    assert reply.usage is not None and reply.usage.prompt_tokens == 1

    openai_server.queue_chat_reply('{"facts": []}')
    reply = client.chat.completions.create(model="test-chat", messages=[{"role": "user", "content": "x"}])
    assert reply.choices[0].message.content == '{"facts": []}'

    openai_server.fail_next(status(500))
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="test-chat", messages=[{"role": "user", "content": "x"}])


def test_server_starts_fast_and_stops_cleanly() -> None:
    started = time.monotonic()
    server = OpenAIServer().start()
    assert time.monotonic() - started < 1.0
    port = server.port
    server.fail_next(delay(30))  # a request still sleeping must not hold the shutdown
    client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0, timeout=0.2)
    with pytest.raises(openai.APITimeoutError):
        client.embeddings.create(model="m", input=["a"])
    stopping = time.monotonic()
    server.stop()
    assert time.monotonic() - stopping < 1.0
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0

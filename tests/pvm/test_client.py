"""Client and AsyncClient against the real reader API (Starlette under uvicorn on loopback, real Redis, real engine)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import pytest
import redis
import uvicorn

from contracts import InvalidMinute, Minute, new_minute_id
from contracts.memory import ContextPackage
from pvm import AsyncClient, Client, PVMAPIError, PVMClient, PVMRequestError, PVMServerError, defaults, engines
from pvm.client import project_path
from pvm.config import ConfigError, Settings
from pvm.reader import ContextReader
from pvm.routes import _id_chunks
from pvm.stores.log import LogReader
from tests.conftest import free_port
from tests.memory_helpers import log_minutes, use_settings
from tests.workers.api.test_api import run_pipeline
from workers.api.app import create_app
from workers.ops.demo import sample_session

TOKEN = "client-test-token-7c1e"


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """The app under uvicorn in a thread on a free loopback port; yields its URL once it listens."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture
def reader(redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[ContextReader]:
    use_settings(settings, monkeypatch)
    log_minutes(redis_client, settings, list(sample_session("apollo", 60, seed=2)))
    yield ContextReader(redis_client, LogReader(settings.log_dir), engines.searcher_for(settings))  # type: ignore[arg-type]
    engines.close_shared()


@pytest.fixture
def api_url(reader: ContextReader, redis_client: redis.Redis, settings: Settings) -> Iterator[str]:
    """A token-protected API over the 60 minutes of project apollo."""
    with serving(create_app(reader, redis_client, settings.shards, api_token=TOKEN)) as url:
        yield url


@pytest.fixture
def api(api_url: str) -> Iterator[PVMClient]:
    with PVMClient(api_url, TOKEN, retry_backoff=0.01) as client:
        yield client


def test_every_route_answers_through_the_client(api: PVMClient, reader: ContextReader) -> None:
    assert api.health() == {"status": "ok"}

    package = api.context("apollo", "coder", task="tune the cache", budget_tokens=100_000)
    assert package["project_id"] == "apollo" and package["agent_id"] == "coder" and package["relevant_experience"]
    assert ContextPackage.from_dict(package).render().startswith("# Context for coder")
    roomy = api.context("apollo", "coder", budget_tokens=100_000)
    assert len(roomy["recent"]) == defaults.CONTEXT_RECENT and not roomy["budget"]["cut"]
    assert api.context_text("apollo", "coder", task="tune the cache").startswith("# Context for coder")

    answer = api.search("apollo", "conflict resolved", k=3)
    assert answer["degraded"] is None and 0 < len(answer["hits"]) <= 3
    agent = answer["hits"][0]["minute"]["agent_id"]
    only = api.search("apollo", "conflict resolved", k=10, agents=[agent])["hits"]
    assert only and {h["minute"]["agent_id"] for h in only} == {agent}

    recent = api.recent("apollo", n=5)
    assert [m["id"] for m in recent] == [m["id"] for m in reader.get_recent("apollo", 5)]
    wanted = [recent[3]["id"], "no-such-id", recent[0]["id"]]
    assert [m["id"] for m in api.minutes("apollo", wanted)] == [recent[3]["id"], recent[0]["id"]]
    assert api.minutes("apollo", []) == []


def test_posted_minutes_are_logged_once_however_often_they_are_sent(
    api: PVMClient, redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    typed = [Minute(project_id="borealis", event_type="decision", memory_note=f"n{i}") for i in range(3)]
    loose = {"project_id": "borealis", "event_type": "message", "memory_note": "no id given"}
    first = api.post_minutes([*typed, loose])
    assert first["accepted"] == 4 and first["ids"][:3] == [m.id for m in typed] and len(first["stream_ids"]) == 4
    again = api.post_minutes(typed)  # a retry of a call whose answer never arrived
    assert again["ids"] == [m.id for m in typed]
    run_pipeline(redis_client, settings, monkeypatch)
    logged = [r.id for r in LogReader(settings.log_dir).history("borealis")]
    assert sorted(logged) == sorted(first["ids"])
    assert [m["memory_note"] for m in api.recent("borealis")] == ["n0", "n1", "n2", "no id given"]


def test_a_bad_minute_is_refused_before_anything_is_sent(api: PVMClient, redis_client: redis.Redis) -> None:
    good = {"project_id": "borealis", "event_type": "message"}
    with pytest.raises(InvalidMinute) as refused:
        api.post_minutes([good, {"project_id": "borealis", "event_type": "message", "colour": "red"}])
    assert refused.value.field == "minutes[1].colour"
    with pytest.raises(InvalidMinute, match=r"minutes\[0\]"):
        api.post_minutes(["not a minute"])  # type: ignore[list-item]
    assert not redis_client.keys("pvm:{s*}:minutes")


def test_many_ids_and_minutes_go_in_requests_the_server_takes(
    api: PVMClient, redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    minutes = [Minute(project_id="many", event_type="message", data={"pad": "x" * 3_000}) for _ in range(1_500)]
    assert api.post_minutes(minutes)["accepted"] == 1_500  # 4.5 MB, 1,500 minutes: over one request's limits
    run_pipeline(redis_client, settings, monkeypatch)
    ids = [m.id for m in minutes]
    asked = [*ids[::-1], *(new_minute_id() for _ in range(200))]  # 1,700 ids: ~45 kB of query string
    assert [m["id"] for m in api.minutes("many", asked)] == ids[::-1]
    # Each read fits a request line that proxies take (nginx: 8 kB), not only uvicorn's.
    chunks = list(_id_chunks(asked))
    assert [i for c in chunks for i in c] == asked and len(chunks) > 2
    assert all(len(c) <= defaults.API_MAX_BATCH and len(quote(",".join(c))) <= defaults.API_QUERY_BYTES for c in chunks)


def test_a_4xx_is_a_request_error_naming_what_to_fix(api_url: str, api: PVMClient) -> None:
    with PVMClient(api_url, "", retry_backoff=0.01) as anonymous, pytest.raises(PVMRequestError) as missing:
        anonymous.recent("apollo")
    assert missing.value.status == 401 and "the reader API requires a token: set PVM_API_TOKEN" in str(missing.value)
    with PVMClient(api_url, "not-it") as wrong, pytest.raises(PVMRequestError) as refused:
        wrong.recent("apollo")
    assert "refused the token: set PVM_API_TOKEN to the server's token" in str(refused.value)
    assert "not-it" not in str(refused.value) and TOKEN not in repr(api) and "token=set" in repr(api)

    with pytest.raises(PVMRequestError) as bad:
        api.context("apollo", "coder", budget_tokens=0)
    assert bad.value.status == 400 and "budget_tokens=0 must be between 1 and" in bad.value.message
    assert str(bad.value).startswith("the reader API refused the request (400): query parameter budget_tokens")
    assert isinstance(bad.value, PVMAPIError) and not isinstance(bad.value, PVMServerError)


def test_a_503_is_retried_then_a_server_error_with_the_logged_request_id(
    redis_client: redis.Redis, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    bare = ContextReader(redis_client, LogReader(settings.log_dir), None)  # no vector store: search answers 503
    with (
        serving(create_app(bare, redis_client, settings.shards)) as url,
        PVMClient(url, "", retries=2, retry_backoff=0.01) as api,
        caplog.at_level(logging.INFO),
    ):
        with pytest.raises(PVMServerError) as unavailable:
            api.search("apollo", "anything")
        assert api.health() == {"status": "ok"}  # the same client goes on working
    error = unavailable.value
    assert error.status == 503 and "no vector store configured" in error.message
    assert str(error).startswith("the reader API is unavailable (503): ") and error.request_id
    served = [r for r in caplog.records if r.name == "workers.api.app" and error.request_id in r.getMessage()]
    assert len(served) == 3, "one try and two retries, each logged by the server under the client's request id"
    retried = [r.getMessage() for r in caplog.records if r.name == "pvm.client"]
    assert len(retried) == 2 and "try 3 of 3" in retried[-1]


def test_a_500_is_not_retried_and_carries_the_request_id(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def broken(project_id: str, n: int = 50) -> list[dict[str, Any]]:
        calls.append(project_id)
        raise ValueError("a bug in the reader")

    monkeypatch.setattr(reader, "get_recent", broken)
    with (
        serving(create_app(reader, redis_client, settings.shards)) as url,
        PVMClient(url, "") as api,
        pytest.raises(PVMServerError) as failed,
    ):
        api.recent("apollo")
    assert failed.value.status == 500 and calls == ["apollo"]
    assert failed.value.request_id and failed.value.request_id in str(failed.value)
    assert "a bug in the reader" not in str(failed.value)


def test_an_unreachable_api_names_the_url_and_pvm_api_url(caplog: pytest.LogCaptureFixture) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with (
        PVMClient(url, "", retries=2, retry_backoff=0.01) as api,
        caplog.at_level(logging.INFO, "pvm.client"),
        pytest.raises(PVMServerError) as unreachable,
    ):
        api.health()
    error = unreachable.value
    assert error.status is None and error.request_id
    assert str(error).startswith(f"cannot reach the reader API at {url} (")
    assert "point PVM_API_URL at it" in str(error)
    assert len([r for r in caplog.records if r.name == "pvm.client"]) == 2  # bounded: two retries, then the error


def test_the_url_and_token_come_from_settings_with_one_default() -> None:
    settings = Settings(api_url="http://api.example:9000/", api_token="  tok\n")
    with PVMClient(settings=settings) as api:
        assert api.base_url == "http://api.example:9000" and "token=set" in repr(api)
    with PVMClient(settings=Settings()) as api:
        assert api.base_url == defaults.API_URL == "http://127.0.0.1:8080" and "token=unset" in repr(api)
    with pytest.raises(ConfigError, match=r"PVM_API_URL='localhost:8080' is not an http\(s\) URL"):
        PVMClient("localhost:8080", "")


def test_project_ids_are_checked_and_quoted() -> None:
    assert project_path("apollo-2.x", "search") == "/v1/projects/apollo-2.x/search"
    assert project_path("a/b?c d#e", "context") == "/v1/projects/a%2Fb%3Fc%20d%23e/context"
    with PVMClient("http://127.0.0.1:1", "", retries=0) as api:
        for bad in ("", "a/b", "a b", "../x"):
            with pytest.raises(InvalidMinute) as refused:
                api.recent(bad)
            assert refused.value.field == "project_id"


def _routes_of(client_type: type) -> set[str]:
    """The methods of a client class that are routes (built from `pvm.routes`)."""
    return {name for name, member in vars(client_type).items() if getattr(member, "__module__", "") == "pvm.routes"}


def test_the_async_client_has_every_route_and_answers_as_the_sync_one(
    api_url: str, api: Client, reader: ContextReader
) -> None:
    assert PVMClient is Client
    sync_routes = _routes_of(Client)
    assert sync_routes == _routes_of(AsyncClient) and {"search", "recall", "post_minutes", "thread"} <= sync_routes
    assert all(inspect.iscoroutinefunction(getattr(AsyncClient, name)) for name in sync_routes)
    newest = api.recent("apollo", 5)

    async def run() -> dict[str, Any]:
        async with AsyncClient(api_url, TOKEN, retry_backoff=0.01) as aapi:
            return {
                "health": await aapi.health(),
                "context": await aapi.context("apollo", "coder", task="tune the cache", budget_tokens=100_000),
                "text": await aapi.context_text("apollo", "coder"),
                "search": await aapi.search("apollo", "conflict resolved", k=3),
                "recent": await aapi.recent("apollo", 5),
                "minutes": await aapi.minutes("apollo", [newest[2]["id"], newest[0]["id"]]),
                "stats": await aapi.stats("apollo"),
                "thread": await aapi.thread("apollo", "project", recent=3),
                "facts": await aapi.facts("apollo"),
                "recall": await aapi.recall("apollo", "nothing learned"),
                "posted": await aapi.post_minutes([Minute(project_id="apollo", event_type="message")]),
            }

    got = asyncio.run(run())
    assert got["health"] == api.health()
    package = api.context("apollo", "coder", task="tune the cache", budget_tokens=100_000)
    ids = [h["minute_id"] for h in package["relevant_experience"]]  # scores move with each read: the hits do not
    assert ids and [h["minute_id"] for h in got["context"]["relevant_experience"]] == ids
    assert got["text"].startswith("# Context for coder")
    hits = api.search("apollo", "conflict resolved", k=3)["hits"]
    assert hits and [h["minute_id"] for h in got["search"]["hits"]] == [h["minute_id"] for h in hits]
    assert got["recent"] == newest and [m["id"] for m in got["minutes"]] == [newest[2]["id"], newest[0]["id"]]
    assert got["stats"]["minutes"] == api.stats("apollo")["minutes"]
    assert got["thread"] == api.thread("apollo", "project", recent=3)
    assert got["facts"] == api.facts("apollo") and got["recall"]["fact"] is None
    assert got["posted"]["accepted"] == 1


def test_async_errors_are_the_sync_ones(api_url: str) -> None:
    async def run() -> tuple[PVMAPIError, PVMAPIError]:
        async with AsyncClient(api_url, "not-it", retry_backoff=0.01) as wrong:
            with pytest.raises(PVMRequestError) as refused:
                await wrong.recent("apollo")
        async with AsyncClient(f"http://127.0.0.1:{free_port()}", "", retries=1, retry_backoff=0.01) as nowhere:
            with pytest.raises(PVMServerError) as unreachable:
                await nowhere.health()
        return refused.value, unreachable.value

    refused, unreachable = asyncio.run(run())
    assert refused.status == 401 and "refused the token: set PVM_API_TOKEN" in str(refused)
    assert unreachable.status is None and "point PVM_API_URL at it" in str(unreachable)
    assert "token=unset" in repr(AsyncClient(api_url, ""))


def test_reads_return_minute_records_with_as_minutes(api: Client, api_url: str) -> None:
    newest = api.recent("apollo", 3)
    records = api.recent("apollo", 3, as_minutes=True)
    assert all(isinstance(m, Minute) for m in records) and [m.to_dict() for m in records] == newest
    by_id = api.minutes("apollo", [newest[1]["id"]], as_minutes=True)
    assert by_id == [Minute.from_dict(newest[1])]
    hits = api.search("apollo", "conflict resolved", k=2, as_minutes=True)["hits"]
    assert hits and all(isinstance(h["minute"], Minute) and h["minute"].id == h["minute_id"] for h in hits)

    async def run() -> list[Any]:
        async with AsyncClient(api_url, TOKEN) as aapi:
            return await aapi.recent("apollo", 3, as_minutes=True)

    assert asyncio.run(run()) == records

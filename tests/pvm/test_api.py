from __future__ import annotations

from collections.abc import Iterator

import msgpack
import pytest
import redis
from starlette.testclient import TestClient

from contracts import keys
from pvm import engines
from pvm.api import create_app
from pvm.config import Settings
from pvm.demo import sample_session
from pvm.reader import ContextReader
from pvm.stores.log import LogReader
from tests.memory_helpers import log_minutes, use_settings


@pytest.fixture
def client(redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    use_settings(settings, monkeypatch)
    log_minutes(redis_client, settings, list(sample_session("apollo", 80, seed=2)))
    log_minutes(redis_client, settings, list(sample_session("borealis", 20, seed=4)))
    reader = ContextReader(redis_client, LogReader(settings.log_dir), engines.searcher_for(settings))  # type: ignore[arg-type]
    with TestClient(create_app(reader, redis_client, settings.shards)) as c:
        yield c
    engines.close_shared()


def test_context_as_json_and_as_text(client: TestClient) -> None:
    r = client.get("/v1/projects/apollo/context", params={"agent_id": "coder", "task": "tune the cache"})
    assert r.status_code == 200
    body = r.json()
    assert body["project_id"] == "apollo" and 0 < len(body["recent"]) <= 50
    assert {m["project_id"] for m in body["recent"]} == {"apollo"}
    assert body["relevant_experience"] and body["budget"]["used_tokens"] <= 2000
    roomy = client.get("/v1/projects/apollo/context", params={"agent_id": "coder", "budget_tokens": 100_000}).json()
    assert len(roomy["recent"]) == 50 and not roomy["budget"]["cut"]
    text = client.get("/v1/projects/apollo/context", params={"agent_id": "coder", "format": "text"})
    assert text.headers["content-type"].startswith("text/plain") and "# Context for coder" in text.text


def test_search_recent_and_by_ids(client: TestClient) -> None:
    hits = client.get("/v1/projects/apollo/search", params={"q": "conflict resolved", "k": 3}).json()["hits"]
    assert 0 < len(hits) <= 3 and all(h["minute"]["project_id"] == "apollo" for h in hits)
    filtered = client.get(
        "/v1/projects/apollo/search", params={"q": "conflict", "category": "conflict_resolution", "k": 10}
    ).json()["hits"]
    assert filtered and {h["category"] for h in filtered} == {"conflict_resolution"}
    recent = client.get("/v1/projects/borealis/recent", params={"n": 5}).json()["minutes"]
    assert len(recent) == 5
    ids = [m["id"] for m in recent[:2]]
    got = client.get("/v1/projects/borealis/minutes", params={"ids": ",".join(ids)}).json()["minutes"]
    assert [m["id"] for m in got] == ids
    # another project's ids come back empty, never across the tenancy line
    assert client.get("/v1/projects/apollo/minutes", params={"ids": ",".join(ids)}).json()["minutes"] == []


def test_bad_requests_name_the_parameter(client: TestClient) -> None:
    r = client.get("/v1/projects/apollo/context")
    assert r.status_code == 400 and "agent_id" in r.json()["error"]
    r = client.get("/v1/projects/apollo/search", params={"q": "x", "k": "many"})
    assert r.status_code == 400 and "k=" in r.json()["error"]
    r = client.get("/v1/projects/apollo/search")
    assert r.status_code == 400 and "q" in r.json()["error"]


def test_post_minutes_validates_the_whole_batch_then_streams_it(client: TestClient, redis_client: redis.Redis) -> None:
    good = {"project_id": "apollo", "event_type": "decision", "agent_id": "planner", "memory_note": "ship friday"}
    bad = {"project_id": "apollo", "event_type": "task_completed", "data": {"success_criteria_met": 250}}
    r = client.post("/v1/minutes", json={"minutes": [good, bad]})
    assert r.status_code == 422
    assert r.json()["errors"] == [{"index": 1, "field": "data.success_criteria_met", "problem": "250 is outside 0-100"}]
    before = redis_client.xlen(keys.stream(keys.shard_of("apollo", 4)))
    r = client.post("/v1/minutes", json={"minutes": [good, {**good, "memory_note": "second"}]})
    assert r.status_code == 202
    body = r.json()
    assert body["accepted"] == 2 and len(body["ids"]) == 2
    stream = keys.stream(keys.shard_of("apollo", 4))
    assert redis_client.xlen(stream) == before + 2
    last = redis_client.xrevrange(stream, count=1)[0][1][keys.MINUTE_FIELD]
    assert msgpack.unpackb(last)["memory_note"] == "second"
    assert client.post("/v1/minutes", content=b"{not json").status_code == 400


def test_openapi_describes_every_route(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    assert set(spec["paths"]) == {
        "/healthz",
        "/v1/minutes",
        "/v1/projects/{project_id}/context",
        "/v1/projects/{project_id}/search",
        "/v1/projects/{project_id}/recent",
        "/v1/projects/{project_id}/minutes",
    }
    assert client.get("/healthz").json() == {"status": "ok"}

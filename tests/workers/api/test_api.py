from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import msgpack
import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from contracts import Minute, encode_minute, keys, new_minute_id
from pvm import engines
from pvm.config import Settings
from pvm.embedders import OpenAIEmbedder
from pvm.reader import ContextReader
from pvm.search import HybridSearch
from pvm.stores.cache import CachedMinute, MinuteCache
from pvm.stores.log import LogReader, LogWriter
from pvm.stores.summaries import SummaryStore
from pvm.vectors.edge import EdgeEngine
from tests import openai_server as fake_provider
from tests.memory_helpers import run_index_worker, use_settings
from tests.openai_server import OpenAIServer, embed_text
from tests.pvm.test_search import memory_point
from workers.api.app import MAX_BODY_BYTES, bearer_token_matches, create_app, is_loopback
from workers.api.auth import TokenFile, token_sha256
from workers.runtime.queues import pool_queue
from workers.summarize.pool import SummarizeContext, summarize_batch
from workers.summarize.threads import ThreadShape

TOKEN = "s3cret-pvm-test-token"


@pytest.fixture
def client(reader: ContextReader, redis_client: redis.Redis, settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(reader, redis_client, settings.shards)) as c:
        yield c


@pytest.fixture
def guarded(reader: ContextReader, redis_client: redis.Redis, settings: Settings) -> Iterator[TestClient]:
    """The API with a bearer token required."""
    with TestClient(create_app(reader, redis_client, settings.shards, api_token=TOKEN)) as c:
        yield c


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
    answer = client.get("/v1/projects/apollo/search", params={"q": "conflict resolved", "k": 3}).json()
    hits = answer["hits"]
    assert answer["degraded"] is None
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


def test_search_takes_prefer_and_names_a_bad_one(client: TestClient, reader: ContextReader) -> None:
    query = {"q": "conflict resolved", "k": 10}
    relevant = client.get("/v1/projects/apollo/search", params={**query, "prefer": "relevant"}).json()["hits"]
    recent = client.get("/v1/projects/apollo/search", params={**query, "prefer": "recent"}).json()["hits"]
    assert relevant and all("newness" not in h["parts"] for h in relevant)
    assert recent and all("newness" in h["parts"] for h in recent)
    assert [h.minute_id for h in reader.search("apollo", "conflict resolved", k=10, prefer="recent")] == [
        h["minute_id"] for h in recent
    ]
    r = client.get("/v1/projects/apollo/search", params={**query, "prefer": "newest"})
    assert r.status_code == 400 and "prefer='newest'" in r.json()["error"] and "relevant, recent" in r.json()["error"]


def test_search_returns_thread_summaries_with_their_sources_when_kinds_asks(
    client: TestClient, redis_client: redis.Redis, settings: Settings
) -> None:
    history = list(LogReader(settings.log_dir).history("apollo"))
    ctx = replace(SummarizeContext.build(redis_client, settings), shape=ThreadShape(recent=2, chunk=3, max_chunks=25))
    summarize_batch(ctx, redis_client, [[r.minute.id, r.seq, encode_minute(r.minute), 0] for r in history])
    run_index_worker(redis_client)  # a real index worker runs the summary-points job the summarize pool queued
    [chunk, *_] = next(v.chunks for v in map(lambda t: SummaryStore(redis_client).thread_view("apollo", t, 0),
                                             SummaryStore(redis_client).threads("apollo")) if v.chunks)  # fmt: skip
    query = {"q": " ".join(chunk.key_topics) or chunk.summary, "k": 10}
    plain = client.get("/v1/projects/apollo/search", params=query).json()
    assert "ranked" not in plain and plain["hits"]  # minutes only, as before
    answer = client.get("/v1/projects/apollo/search", params={**query, "kinds": "minute,summary"}).json()
    kinds = {h["kind"] for h in answer["ranked"]}
    assert kinds == {"minute", "summary"}
    summaries = [h for h in answer["ranked"] if h["kind"] == "summary"]
    ids = {r.minute.id for r in history}
    assert all(h["sources"] and set(h["sources"]) <= ids for h in summaries)
    found = next(h for h in summaries if h["record"].get("id") == chunk.id)
    assert found["of"] == "chunk" and len(found["sources"]) == chunk.minute_count
    r = client.get("/v1/projects/apollo/search", params={**query, "kinds": "minute,episode"})
    assert r.status_code == 400 and "kinds='episode'" in r.json()["error"] and "summary" in r.json()["error"]


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
        "/openapi.json",
        "/v1/minutes",
        "/v1/projects/{project_id}/context",
        "/v1/projects/{project_id}/search",
        "/v1/projects/{project_id}/recent",
        "/v1/projects/{project_id}/minutes",
        "/v1/projects/{project_id}/stats",
        "/v1/global/stats",
        "/v1/projects/{project_id}/facts",
        "/v1/projects/{project_id}/facts/{fact_id}",
        "/v1/projects/{project_id}/facts/{fact_id}/history",
        "/v1/projects/{project_id}/facts/{fact_id}/promote",
        "/v1/projects/{project_id}/facts/{fact_id}/retract",
        "/v1/projects/{project_id}/learn",
        "/v1/projects/{project_id}/recall",
        "/v1/projects/{project_id}/recall/{key}",
        "/v1/projects/{project_id}/threads/{thread}",
        "/v1/projects/{project_id}/memory/export",
        "/v1/projects/{project_id}/memory/files",
        "/v1/projects/{project_id}/memory/file",
        "/v1/projects/{project_id}/memory/patch",
        "/v1/projects/{project_id}/memory/append",
        "/v1/projects/{project_id}/pair",
    }
    assert client.get("/healthz").json() == {"status": "ok"}


# Every protected route, with a request it answers with success: (method, path, params, json body, status).
PROTECTED = [
    ("GET", "/openapi.json", {}, None, 200),
    ("GET", "/v1/projects/apollo/context", {"agent_id": "coder", "task": "tune the cache"}, None, 200),
    ("GET", "/v1/projects/apollo/search", {"q": "conflict resolved"}, None, 200),
    ("GET", "/v1/projects/apollo/recent", {"n": 3}, None, 200),
    ("GET", "/v1/projects/apollo/minutes", {"ids": "nosuchid"}, None, 200),
    ("GET", "/v1/projects/apollo/memory/export", {}, None, 200),
    ("POST", "/v1/minutes", {}, {"minutes": [{"project_id": "apollo", "event_type": "decision"}]}, 202),
]


def test_with_a_token_every_route_but_health_needs_it(
    guarded: TestClient, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    stream = keys.stream(keys.shard_of("apollo", 4))
    before = redis_client.xlen(stream)
    wrong = {"Authorization": "Bearer not-the-token"}
    refused = [{}, wrong, {"Authorization": TOKEN}, {"Authorization": f"Basic {TOKEN}"}, {"Authorization": "Bearer"}]
    for method, path, params, body, status in PROTECTED:
        for headers in refused:
            r = guarded.request(method, path, params=params, json=body, headers=headers)
            assert r.status_code == 401, (path, headers)
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert set(r.json()) == {"error"} and "token" in r.json()["error"]
            assert TOKEN not in r.text and "not-the-token" not in r.text
        r = guarded.request(method, path, params=params, json=body, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == status, (path, r.text)
    # the refused POSTs wrote nothing; the accepted one wrote its minute
    assert redis_client.xlen(stream) == before + 1
    # the scheme is case-insensitive (RFC 7235)
    assert guarded.get("/v1/projects/apollo/recent", headers={"Authorization": f"bearer {TOKEN}"}).status_code == 200
    assert guarded.get("/healthz").json() == {"status": "ok"}
    assert TOKEN not in caplog.text


def test_a_missing_and_a_wrong_token_are_told_apart(guarded: TestClient) -> None:
    missing = guarded.get("/v1/projects/apollo/recent")
    assert "requires a bearer token" in missing.json()["error"]
    assert missing.headers["www-authenticate"] == 'Bearer realm="pvm"'
    wrong = guarded.get("/v1/projects/apollo/recent", headers={"Authorization": "Bearer nope"})
    assert "not accepted" in wrong.json()["error"]
    assert 'error="invalid_token"' in wrong.headers["www-authenticate"]


def test_openapi_documents_the_bearer_scheme_only_when_a_token_is_required(
    guarded: TestClient, client: TestClient
) -> None:
    spec = guarded.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    schemes = spec["components"]["securitySchemes"]
    assert schemes == {"bearerAuth": {"type": "http", "scheme": "bearer", "description": "the server's PVM_API_TOKEN"}}
    assert spec["security"] == [{"bearerAuth": []}]
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            if path == "/healthz":
                assert operation["security"] == [] and "401" not in operation["responses"]
            else:
                assert "security" not in operation and "401" in operation["responses"]
            # every security requirement names a declared scheme
            for requirement in operation.get("security", []):
                assert set(requirement) <= set(schemes)
    open_spec = client.get("/openapi.json").json()
    assert "security" not in open_spec and "securitySchemes" not in open_spec["components"]
    assert all("401" not in op["responses"] for ops in open_spec["paths"].values() for op in ops.values())


def test_without_a_token_no_route_asks_for_one(client: TestClient) -> None:
    for method, path, params, body, status in PROTECTED:
        assert client.request(method, path, params=params, json=body).status_code == status, path
    # a stray header does no harm on an open API
    assert client.get("/v1/projects/apollo/recent", headers={"Authorization": "Bearer x"}).status_code == 200


def test_bearer_token_matching() -> None:
    assert bearer_token_matches(f"Bearer {TOKEN}", TOKEN)
    assert bearer_token_matches(f"BEARER  {TOKEN} ", TOKEN)
    for header in (None, "", TOKEN, f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Token {TOKEN}", "Bearer é"):
        assert not bearer_token_matches(header, TOKEN), header


def test_loopback_addresses() -> None:
    assert all(is_loopback(a) for a in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(is_loopback(a) for a in ("0.0.0.0", "::", "", "10.0.0.5", "api.internal"))


def test_search_says_when_the_answer_is_lexical_only(
    redis_client: redis.Redis, settings: Settings, openai_server: OpenAIServer, tmp_path: Path
) -> None:
    engine = EdgeEngine(tmp_path / "vectors", 16)
    try:
        engine.upsert([memory_point("apollo", "g1", "gateway rollback after the deploy", dense=embed_text("g", 16))])
        embedder = OpenAIEmbedder(openai_server.base_url, "sk-test", "test-embed", dimensions=16, query_timeout=0.3)
        reader = ContextReader(redis_client, LogReader(settings.log_dir), HybridSearch(engine, embedder))
        openai_server.fail_next(fake_provider.status(500), times=5)
        with TestClient(create_app(reader, redis_client, settings.shards)) as c:
            answer = c.get("/v1/projects/apollo/search", params={"q": "gateway"}).json()
        assert [h["minute_id"] for h in answer["hits"]] == ["g1"]
        assert answer["degraded"].startswith("dense leg skipped") and "HTTP 500" in answer["degraded"]
    finally:
        engine.close()


# -- project-scoped tokens (PVM_API_TOKENS_FILE) -------------------------------------------------

TEAM_A = "team-a-token-7c1e"
OPS = "ops-token-51d0"


def write_tokens(path: Path, *entries: tuple[str, str, list[str]]) -> None:
    """Write a tokens file aside and rename it into place, as `pvm token new --file` does."""
    document = {"tokens": [{"name": n, "sha256": token_sha256(t), "projects": p} for n, t, p in entries]}
    aside = path.with_name(path.name + ".new")
    aside.write_text(json.dumps(document))
    os.replace(aside, path)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def tokens_path(tmp_path: Path) -> Path:
    path = tmp_path / "tokens.json"
    write_tokens(path, ("team-a", TEAM_A, ["apollo"]), ("ops", OPS, ["*"]))
    return path


@pytest.fixture
def scoped(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings, tokens_path: Path
) -> Iterator[TestClient]:
    """The API with the tokens file (checked on every request here) and PVM_API_TOKEN both set."""
    tokens = TokenFile(tokens_path, check_every_s=0)
    with TestClient(create_app(reader, redis_client, settings.shards, api_token=TOKEN, tokens=tokens)) as c:
        yield c


def stream_lengths(redis_client: redis.Redis) -> list[int]:
    return [redis_client.xlen(keys.stream(shard)) for shard in range(4)]


# Every read route, with a request it answers with success for a project: (path template, params).
READS = [
    ("/v1/projects/{}/context", {"agent_id": "coder"}),
    ("/v1/projects/{}/search", {"q": "conflict resolved"}),
    ("/v1/projects/{}/recent", {"n": 3}),
    ("/v1/projects/{}/minutes", {"ids": "nosuchid"}),
]


def test_a_scoped_token_reads_its_project_and_nothing_else(scoped: TestClient) -> None:
    for template, params in READS:
        r = scoped.get(template.format("apollo"), params=params, headers=bearer(TEAM_A))
        assert r.status_code == 200, (template, r.text)
        # borealis exists, nosuchproject does not: the refusal is the same, so it tells nothing about which exist
        for project in ("borealis", "nosuchproject"):
            r = scoped.get(template.format(project), params=params, headers=bearer(TEAM_A))
            assert r.status_code == 403, (template, project)
            assert r.json() == {"error": f"this token may not read project {project}"}
        # the check comes before the route's own: a bad request for a foreign project is still 403
        assert scoped.get(template.format("borealis"), headers=bearer(TEAM_A)).status_code == 403
    assert scoped.get("/openapi.json", headers=bearer(TEAM_A)).status_code == 200
    assert scoped.get("/healthz").json() == {"status": "ok"}


def test_an_all_projects_token_and_the_api_token_read_every_project(scoped: TestClient) -> None:
    for token in (OPS, TOKEN):
        for project in ("apollo", "borealis", "nosuchproject"):
            for template, params in READS:
                r = scoped.get(template.format(project), params=params, headers=bearer(token))
                assert r.status_code == 200, (token, template, project, r.text)


def test_unknown_tokens_get_401_with_a_tokens_file(scoped: TestClient) -> None:
    for headers in ({}, bearer("not-a-token"), bearer(token_sha256(TEAM_A)), {"Authorization": TEAM_A}):
        for path in ("/v1/projects/apollo/recent", "/openapi.json"):
            r = scoped.get(path, headers=headers)
            assert r.status_code == 401 and "token" in r.json()["error"], (path, headers)
            assert TEAM_A not in r.text


def test_posting_to_a_foreign_project_writes_nothing(scoped: TestClient, redis_client: redis.Redis) -> None:
    own = {"project_id": "apollo", "event_type": "decision", "memory_note": "ship friday"}
    foreign = {**own, "project_id": "borealis"}
    invalid = {"project_id": "apollo", "event_type": "task_completed", "data": {"success_criteria_met": 250}}
    before = stream_lengths(redis_client)
    for batch in ([foreign], [own, foreign], [own, {**foreign, "project_id": "nosuchproject"}], [invalid, foreign]):
        r = scoped.post("/v1/minutes", json={"minutes": batch}, headers=bearer(TEAM_A))
        assert r.status_code == 403, batch
        assert r.json()["error"].startswith("this token may not write project ")
        assert r.json()["error"].endswith("; nothing was accepted")
        assert [e["index"] for e in r.json()["errors"]] == [
            i for i, m in enumerate(batch) if m["project_id"] != "apollo"
        ]
        assert stream_lengths(redis_client) == before
    r = scoped.post("/v1/minutes", json={"minutes": [own, foreign]}, headers=bearer(TEAM_A))
    assert r.json()["errors"] == [
        {"index": 1, "field": "project_id", "problem": "this token may not write project borealis"}
    ]
    # its own project: the contract still applies (422), then the batch is written
    assert scoped.post("/v1/minutes", json={"minutes": [invalid]}, headers=bearer(TEAM_A)).status_code == 422
    assert scoped.post("/v1/minutes", json={"minutes": [own, own]}, headers=bearer(TEAM_A)).status_code == 202
    assert redis_client.xlen(keys.stream(keys.shard_of("apollo", 4))) == before[keys.shard_of("apollo", 4)] + 2
    assert sum(stream_lengths(redis_client)) == sum(before) + 2
    assert scoped.post("/v1/minutes", json={"minutes": [own, foreign]}, headers=bearer(OPS)).status_code == 202


def test_editing_the_tokens_file_revokes_and_grants_without_a_restart(
    scoped: TestClient, tokens_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert scoped.get("/v1/projects/apollo/recent", headers=bearer(TEAM_A)).status_code == 200
    write_tokens(tokens_path, ("ops", OPS, ["*"]))
    assert scoped.get("/v1/projects/apollo/recent", headers=bearer(TEAM_A)).status_code == 401
    write_tokens(tokens_path, ("ops", OPS, ["*"]), ("team-a", TEAM_A, ["borealis"]))
    assert scoped.get("/v1/projects/apollo/recent", headers=bearer(TEAM_A)).status_code == 403
    assert scoped.get("/v1/projects/borealis/recent", headers=bearer(TEAM_A)).status_code == 200
    # a broken edit keeps the last good set, and says so in the log
    tokens_path.write_text('{"tokens": [{"name": "ops"')
    assert scoped.get("/v1/projects/borealis/recent", headers=bearer(TEAM_A)).status_code == 200
    assert "keeping the 2 tokens loaded before" in caplog.text
    assert TEAM_A not in caplog.text and OPS not in caplog.text


def test_openapi_documents_403_when_tokens_are_scoped(scoped: TestClient) -> None:
    spec = scoped.get("/openapi.json", headers=bearer(OPS)).json()
    assert "PVM_API_TOKENS_FILE" in spec["components"]["securitySchemes"]["bearerAuth"]["description"]
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            # 403 where a project is named: in the path, or in the posted minutes
            names_project = path.startswith("/v1/")
            assert ("403" in operation["responses"]) == names_project, path


PROJECTS = ["apollo", "borealis", "cassini", "deimos", "europa"]


@hsettings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    scope=st.one_of(st.just(["*"]), st.lists(st.sampled_from(PROJECTS), min_size=1, max_size=4, unique=True)),
    asked=st.sampled_from(PROJECTS),
)
def test_access_is_granted_iff_the_project_is_in_the_tokens_scope(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings, tmp_path: Path, scope: list[str], asked: str
) -> None:
    path = tmp_path / "property-tokens.json"
    write_tokens(path, ("holder", TEAM_A, scope), ("other", OPS, [p for p in PROJECTS if p not in scope] or ["*"]))
    app = create_app(reader, redis_client, settings.shards, tokens=TokenFile(path))
    in_scope = "*" in scope or asked in scope
    with TestClient(app) as c:
        for template, params in READS:
            r = c.get(template.format(asked), params=params, headers=bearer(TEAM_A))
            assert r.status_code == (200 if in_scope else 403), (template, scope, asked)
        before = stream_lengths(redis_client)
        minute = {"project_id": asked, "event_type": "decision"}
        r = c.post("/v1/minutes", json={"minutes": [minute]}, headers=bearer(TEAM_A))
        assert r.status_code == (202 if in_scope else 403)
        assert sum(stream_lengths(redis_client)) == sum(before) + (1 if in_scope else 0)


# -- one rule for data: JSON ------------------------------------------------------------------------


def _posted(client: TestClient, data_json: bytes) -> Any:
    body = b'{"minutes": [{"project_id": "apollo", "event_type": "decision", "data": ' + data_json + b"}]}"
    return client.post("/v1/minutes", content=body, headers={"content-type": "application/json"})


def test_post_minutes_refuses_nan_and_infinity_naming_the_field(client: TestClient, redis_client: redis.Redis) -> None:
    stream = keys.stream(keys.shard_of("apollo", 4))
    before = redis_client.xlen(stream)
    for literal, field in (
        (b'{"m": {"ratio": NaN}}', "data.m.ratio"),
        (b'{"xs": [1, Infinity]}', "data.xs[1]"),
        (b'{"low": -Infinity}', "data.low"),
        (b'{"huge": 1e400}', "data.huge"),  # beyond float64: Python's parser reads it as Infinity
    ):
        r = _posted(client, literal)
        assert r.status_code == 422, (literal, r.text)
        (error,) = r.json()["errors"]
        assert error["index"] == 0 and error["field"] == field, (literal, error)
    assert redis_client.xlen(stream) == before


def test_deep_nesting_is_a_bad_request_never_a_server_error(client: TestClient, redis_client: redis.Redis) -> None:
    stream = keys.stream(keys.shard_of("apollo", 4))
    before = redis_client.xlen(stream)
    r = _posted(client, b"[" * 100_000 + b"]" * 100_000)  # deeper than Python's parser goes
    assert r.status_code == 400, r.text
    assert "nest" in r.json()["error"] and "32" in r.json()["error"]
    r = _posted(client, b'{"a": ' * 40 + b"1" + b"}" * 40)  # parses, but deeper than the contract allows
    assert r.status_code == 422, r.text
    (error,) = r.json()["errors"]
    assert error["field"].startswith("data.a.a") and "32 levels" in error["problem"]
    assert redis_client.xlen(stream) == before


def test_a_body_that_is_not_utf8_is_a_bad_request_never_a_server_error(bare: TestClient) -> None:
    r = bare.post("/v1/minutes", content=b"\xac\xed", headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert "UTF-8" in r.json()["error"]


def test_a_project_id_the_contract_refuses_is_a_bad_request(client: TestClient) -> None:
    routes = {"recent": {}, "context": {"agent_id": "coder"}, "minutes": {"ids": "x"}, "search": {"q": "x"}}
    for route, params in routes.items():
        for project_id in ("a" * 129, "a" * 300, "a" * 5_000, "a..b:c", "-a"):
            r = client.get(f"/v1/projects/{project_id}/{route}", params=params)
            assert r.status_code == 400, (route, project_id[:10], r.text)
            assert "project_id" in r.json()["error"] and "128" in r.json()["error"]


def test_a_posted_project_id_over_the_limit_is_refused_by_the_contract(client: TestClient) -> None:
    r = client.post("/v1/minutes", json={"minutes": [{"project_id": "a" * 5_000, "event_type": "decision"}]})
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "project_id"


# -- reads never fail on stored data ----------------------------------------------------------------

LEGACY = [  # minutes logged before the data rule held: NaN, Infinity, bytes and a msgpack timestamp in data
    {"ratio": float("nan"), "note": "fine"},
    {"limits": {"max": float("inf"), "min": float("-inf")}, "samples": [1.5, float("nan")]},
    {"blob": b"\x00\x01\xfe", "nested": [{"raw": b"ok"}], "when": msgpack.Timestamp(1795658769, 0)},
]


def plant_legacy_minutes(redis_client: redis.Redis, settings: Settings) -> list[str]:
    """Write minutes straight into the log, the caches and the index, past the contract, as an old build did."""
    writer = LogWriter(settings.log_dir)
    cache = MinuteCache(redis_client, settings.recent_window, settings.minute_cache_size)
    entries = []
    for i, data in enumerate(LEGACY):
        minute = Minute(project_id="legacy", event_type="task_failed", agent_id="coder", memory_note=f"orders lock {i}")
        raw = msgpack.packb({"v": 1, **minute.to_dict(), "data": data}, use_bin_type=True, datetime=False)
        entries.append((minute.id, f"{i + 1}-0", raw))
    appended = writer.append("legacy", entries)
    writer.close()
    raws = [raw for _, _, raw in entries]
    cache.update(
        "legacy", [CachedMinute(a.id, a.seq, raw, "coder") for a, raw in zip(appended, raws, strict=True)], 0.0
    )
    pool_queue("index", redis_client).enqueue(
        keys.INDEX_JOB, [[a.id, a.seq, raw] for a, raw in zip(appended, raws, strict=True)]
    )
    run_index_worker(redis_client)
    return [a.id for a in appended]


def assert_safe(minutes: list[dict[str, Any]], ids: list[str]) -> None:
    by_id = {m["id"]: m["data"] for m in minutes}
    assert set(ids) <= set(by_id)
    assert by_id[ids[0]] == {"ratio": None, "note": "fine"}  # NaN and ±Infinity read as null
    assert by_id[ids[1]] == {"limits": {"max": None, "min": None}, "samples": [1.5, None]}
    assert by_id[ids[2]]["blob"] == "AAH+" and by_id[ids[2]]["nested"] == [{"raw": "b2s="}]  # bytes: base64 text
    assert isinstance(by_id[ids[2]]["when"], str)


def test_reads_of_stored_data_json_cannot_hold_answer_200_with_a_safe_encoding(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_settings(settings, monkeypatch)
    ids = plant_legacy_minutes(redis_client, settings)
    reader = ContextReader(redis_client, LogReader(settings.log_dir), engines.searcher_for(settings))  # type: ignore[arg-type]
    try:
        with TestClient(create_app(reader, redis_client, settings.shards), raise_server_exceptions=False) as c:
            for source in ("cache", "log"):
                recent = c.get("/v1/projects/legacy/recent")
                assert recent.status_code == 200, (source, recent.text)
                assert "NaN" not in recent.text and "Infinity" not in recent.text
                assert_safe(recent.json()["minutes"], ids)
                by_ids = c.get("/v1/projects/legacy/minutes", params={"ids": ",".join(ids)})
                assert by_ids.status_code == 200, (source, by_ids.text)
                assert_safe(by_ids.json()["minutes"], ids)
                search = c.get("/v1/projects/legacy/search", params={"q": "orders lock", "k": 10})
                assert search.status_code == 200, (source, search.text)
                assert_safe([h["minute"] for h in search.json()["hits"]], ids)
                context = c.get("/v1/projects/legacy/context", params={"agent_id": "coder", "task": "orders lock"})
                assert context.status_code == 200, (source, context.text)
                assert_safe(context.json()["recent"], ids)
                assert_safe([h["minute"] for h in context.json()["relevant_experience"]], ids)
                text = c.get("/v1/projects/legacy/context", params={"agent_id": "coder", "format": "text"})
                assert text.status_code == 200 and "orders lock 2" in text.text
                # Again from the log alone: the caches are gone (evicted, or a Redis restart without AOF).
                redis_client.delete(keys.minute_by_id("legacy"), keys.recent_window("legacy"))
    finally:
        engines.close_shared()


def test_an_unexpected_error_is_a_logged_500_with_a_request_id_never_a_400(
    client: TestClient, reader: ContextReader, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(project_id: str, n: int = 50) -> list[dict[str, Any]]:
        raise ValueError("a bug in the reader, not the request")

    monkeypatch.setattr(reader, "get_recent", broken)
    with TestClient(client.app, raise_server_exceptions=False) as c, caplog.at_level(logging.ERROR, "workers.api.app"):
        r = c.get("/v1/projects/apollo/recent", headers={"X-Request-ID": "req-42"})
        minted = c.get("/v1/projects/apollo/recent")
    assert r.status_code == 500, r.text
    assert r.json()["request_id"] == "req-42" and "req-42" in r.json()["error"]
    assert "a bug in the reader" not in r.text  # details go to the server log, not to the client
    assert r.headers["x-request-id"] == "req-42"
    logged = [rec for rec in caplog.records if "req-42" in rec.getMessage()]
    assert logged and logged[0].exc_info is not None and "a bug in the reader" in caplog.text
    assert minted.status_code == 500 and len(minted.json()["request_id"]) >= 16
    assert any(minted.json()["request_id"] in rec.getMessage() for rec in caplog.records)


# -- atomic, retry-safe ingest -------------------------------------------------------------------------


def run_pipeline(redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dispatch what the streams hold and let a log worker make it durable."""
    from workers.ingest.dispatcher import Dispatcher
    from workers.runtime.runner import PvmWorker

    use_settings(settings, monkeypatch)
    Dispatcher(redis_client, settings, consumer="api-test", block_ms=10).run(max_idle_s=0.3)
    PvmWorker([pool_queue("log", redis_client)], redis_client).work(burst=True)


def two_shard_projects(shards: int = 4) -> tuple[str, str]:
    """Two project ids on different shards."""
    first = "apollo"
    other = next(f"p{i}" for i in range(100) if keys.shard_of(f"p{i}", shards) != keys.shard_of(first, shards))
    return first, other


@pytest.fixture
def bare(redis_client: redis.Redis, settings: Settings) -> Iterator[TestClient]:
    """The API over an empty project set and no vector store: for ingest tests."""
    reader = ContextReader(redis_client, LogReader(settings.log_dir), None)
    with TestClient(create_app(reader, redis_client, settings.shards)) as c:
        yield c


def test_a_retried_post_logs_each_minute_once(
    bare: TestClient, redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = two_shard_projects()
    # The server mints ids when a minute has none and returns them; a client retries with them.
    minted = bare.post("/v1/minutes", json=[{"project_id": a, "event_type": "decision", "memory_note": "minted"}])
    assert minted.status_code == 202
    (minted_id,) = minted.json()["ids"]
    own = [
        {"id": new_minute_id(), "project_id": p, "event_type": "decision", "memory_note": f"{p} {i}"}
        for i, p in enumerate([a, b, a])
    ]
    batch = {"minutes": [*own, {"id": minted_id, "project_id": a, "event_type": "decision", "memory_note": "x"}]}
    for _ in range(2):  # the answer was lost: the client sends the same batch again
        r = bare.post("/v1/minutes", json=batch)
        assert r.status_code == 202 and r.json()["ids"] == [m["id"] for m in batch["minutes"]]
    run_pipeline(redis_client, settings, monkeypatch)
    r = bare.post("/v1/minutes", json=batch)  # and once more, after the first copies are durable
    assert r.status_code == 202
    run_pipeline(redis_client, settings, monkeypatch)
    log = LogReader(settings.log_dir)
    assert [r.id for r in log.history(a)] == [minted_id, own[0]["id"], own[2]["id"]]
    assert [r.id for r in log.history(b)] == [own[1]["id"]]
    assert next(log.history(a)).minute.memory_note == "minted"  # the first write of an id is the one kept


def test_ids_must_be_unique_within_a_batch_and_follow_the_id_rule(bare: TestClient, redis_client: redis.Redis) -> None:
    minute_id = new_minute_id()
    same = {"id": minute_id, "project_id": "apollo", "event_type": "decision"}
    r = bare.post("/v1/minutes", json=[same, {**same, "memory_note": "different"}])
    assert r.status_code == 422
    assert r.json()["errors"] == [
        {"index": 1, "field": "id", "problem": f"repeats the id of minute 0 ({minute_id}); ids are unique in a batch"}
    ]
    r = bare.post("/v1/minutes", json=[{**same, "id": "not an id!"}])
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "id"
    assert redis_client.xlen(keys.stream(keys.shard_of("apollo", 4))) == 0


def test_a_batch_is_appended_whole_or_not_at_all(bare: TestClient, redis_client: redis.Redis) -> None:
    a, b = two_shard_projects()
    broken = keys.stream(keys.shard_of(b, 4))
    redis_client.set(broken, "not a stream")  # the second shard's XADD would fail with WRONGTYPE
    batch = [{"project_id": p, "event_type": "decision"} for p in (a, a, b, a)]
    r = bare.post("/v1/minutes", json=batch)
    assert r.status_code == 503, r.text
    body = r.json()
    assert broken in body["error"] and "nothing of the batch was written" in body["error"]
    assert len(body["ids"]) == 4  # the ids it minted, to retry with
    assert redis_client.xlen(keys.stream(keys.shard_of(a, 4))) == 0
    assert redis_client.get(broken) == b"not a stream"


# -- request size ------------------------------------------------------------------------------------


def post_raw(app: Any, headers: list[tuple[bytes, bytes]], chunks: Iterator[bytes]) -> tuple[int, bytes, int]:
    """POST /v1/minutes straight through ASGI; returns the status, the body and how many chunks the app read."""
    read = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        chunk = next(chunks, None)
        read += 1
        return {"type": "http.request", "body": chunk or b"", "more_body": chunk is not None}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/minutes",
        "raw_path": b"/v1/minutes",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"test"), (b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }
    anyio.run(app, scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"), read


def endless(size: int) -> Iterator[bytes]:
    """A body that goes on past the limit (ending at twice the limit, so a server that reads it all still ends)."""
    yield b'{"minutes": [' + b" " * (size - 13)
    for _ in range(2 * MAX_BODY_BYTES // size):
        yield b" " * size


def test_an_oversized_body_is_refused_by_its_content_length_before_it_is_read(bare: TestClient) -> None:
    status, body, read = post_raw(bare.app, [(b"content-length", b"1000000000")], endless(64 * 1024))
    assert status == 413
    error = json.loads(body)["error"]
    assert "1000000000 bytes" in error and str(MAX_BODY_BYTES) in error and "split the batch" in error
    assert read == 0


def test_a_chunked_body_is_read_only_up_to_the_limit(bare: TestClient, redis_client: redis.Redis) -> None:
    chunk = 64 * 1024
    status, body, read = post_raw(bare.app, [(b"transfer-encoding", b"chunked")], endless(chunk))
    assert status == 413
    assert str(MAX_BODY_BYTES) in json.loads(body)["error"]
    assert read == MAX_BODY_BYTES // chunk + 1  # stopped at the first chunk past the limit
    # Under the limit, a chunked body is read whole and ingested.
    minute = b'{"project_id": "apollo", "event_type": "decision"}'
    parts = iter([b'{"minutes": [', minute, b"]}"])
    status, body, _ = post_raw(bare.app, [(b"transfer-encoding", b"chunked")], parts)
    assert status == 202, body
    assert redis_client.xlen(keys.stream(keys.shard_of("apollo", 4))) == 1


def test_a_content_length_that_is_not_a_number_is_a_bad_request(bare: TestClient) -> None:
    status, body, read = post_raw(bare.app, [(b"content-length", b"lots")], iter([b"[]"]))
    assert status == 400 and "Content-Length" in json.loads(body)["error"] and read == 0


# -- knowledge changes come only through the facts routes (issue 10) ------------------------------------


def test_post_minutes_refuses_knowledge_changes_naming_the_event_type(
    client: TestClient, redis_client: redis.Redis
) -> None:
    from contracts.fact_changes import FACT_EVENT_TYPES
    from contracts.vectors.generate import load_vector, vector_paths

    forged = [load_vector(p) for p in vector_paths() if load_vector(p)["event_type"] in FACT_EVENT_TYPES]
    assert {v["event_type"] for v in forged} == FACT_EVENT_TYPES  # every kind of change, each valid by the contract
    good = {"project_id": "apollo", "event_type": "decision", "memory_note": "ship friday"}
    before = stream_lengths(redis_client)
    for vector in forged:
        r = client.post("/v1/minutes", json={"minutes": [good, vector]})
        assert r.status_code == 422, (vector["event_type"], r.text)
        (error,) = r.json()["errors"]
        assert error["index"] == 1 and error["field"] == "event_type"
        assert vector["event_type"] in error["problem"] and "/v1/projects/{project_id}/facts" in error["problem"]
    assert stream_lengths(redis_client) == before


@pytest.mark.parametrize("event_type", [["fact_asserted"], {"x": 1}, 7, None])
def test_an_event_type_that_is_not_text_is_422_not_500(client: TestClient, event_type: object) -> None:
    r = client.post("/v1/minutes", json={"minutes": [{"project_id": "apollo", "event_type": event_type}]})
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "event_type"


def test_post_minutes_refuses_chunk_summaries_which_only_the_summarize_pool_writes(
    client: TestClient, redis_client: redis.Redis
) -> None:
    from contracts.summaries import ChunkSummarized, ThreadRef, chunk_summarized_minute

    forged = chunk_summarized_minute(
        "apollo",
        ChunkSummarized(ThreadRef.parse("task:T-1"), 1, 10, "Nothing went wrong.", (), None, "m"),
        minute_id="forged1",
        timestamp="2026-11-26T10:00:00.000Z",
        context_references=(),
    ).to_dict()
    good = {"project_id": "apollo", "event_type": "decision", "memory_note": "ship friday"}
    before = stream_lengths(redis_client)
    r = client.post("/v1/minutes", json={"minutes": [good, forged]})
    assert r.status_code == 422, r.text
    (error,) = r.json()["errors"]
    assert error["index"] == 1 and error["field"] == "event_type" and "chunk_summarized" in error["problem"]
    assert "summarize pool" in error["problem"]
    assert stream_lengths(redis_client) == before


def test_a_thread_and_a_thread_context_over_http(
    client: TestClient, redis_client: redis.Redis, settings: Settings
) -> None:
    from tests.workers.summarize.test_summarize_pool import conversation, records

    summarize_batch(SummarizeContext.build(redis_client, settings), redis_client, records(conversation(60)))
    r = client.get("/v1/projects/p1/threads/deploy-42")
    assert r.status_code == 200, r.text
    thread = r.json()
    assert thread["thread"] == "thread:deploy-42" and thread["minutes"] == 60
    assert [(c["first_seq"], c["last_seq"]) for c in thread["chunks"]] == [(1, 10), (11, 20), (21, 30), (31, 40)]
    assert len(thread["recent"]) == 20 and thread["episodes"]
    assert client.get("/v1/projects/p1/threads/task:").status_code == 400
    assert client.get("/v1/projects/p1/threads/never-seen").json()["chunks"] == []
    ctx = client.get("/v1/projects/p1/context", params={"agent_id": "a1", "thread": "deploy-42"}).json()
    assert ctx["thread"] == "thread:deploy-42" and ctx["summaries"][0]["last_seq"] == 40
    assert client.get("/v1/projects/p1/context", params={"agent_id": "a1", "thread": "task:"}).status_code == 400

"""The search page over the real index: the API's search as a form, each hit with the parts of its score and its
links, facts and thread summaries among the minutes when asked, and a lexical-only answer that says so."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from pvm.config import Settings
from pvm.embedders import OpenAIEmbedder
from pvm.reader import ContextReader
from pvm.search import HybridSearch
from pvm.stores.log import LogReader
from pvm.vectors.edge import EdgeEngine
from tests import openai_server as fake_provider
from tests.memory_helpers import run_index_worker
from tests.openai_server import OpenAIServer, embed_text
from tests.pvm.test_search import memory_point
from tests.workers.api.test_api_facts import FactsFeed
from tests.workers.console.conftest import TEAM_A, sign_in
from tests.workers.console.test_threads import summarize
from workers.api.app import create_app
from workers.console.routes import CONSOLE

SEARCH = "/ui/projects/apollo/search"
API = "/v1/projects/apollo/search"


def rows(page: str) -> list[str]:
    """The hit rows of the results table."""
    body = page.split("<tbody>")[1].split("</tbody>")[0]
    return [r for r in body.split("<tr>")[1:] if '<td class="num">' in r]


def first_link(row: str) -> str:
    return html.unescape(row.split("<td>\n", 1)[1].split('href="', 1)[1].split('"')[0])


def columns(page: str) -> list[str]:
    head = page.split("<thead>")[1].split("</thead>")[0]
    return [c.split(">", 1)[1].split("<")[0] for c in head.split("<th ")[1:]]


def test_without_a_query_the_page_is_the_form_alone(console: TestClient) -> None:
    page = console.get(SEARCH)
    assert page.status_code == 200, page.text
    assert "data-focus-key" in page.text.split('name="q"')[1].split(">")[0]
    for kind in ("minute", "fact", "summary"):
        assert f'name="kinds" value="{kind}"' in page.text
    assert 'name="prefer"' in page.text and "<tbody>" not in page.text


def test_the_hits_are_the_apis_with_the_parts_of_their_scores(console: TestClient) -> None:
    query = {"q": "conflict resolved", "k": 5}
    page = console.get(SEARCH, params=query)
    assert page.status_code == 200, page.text
    hits = console.get(API, params=query).json()["hits"]
    shown = rows(page.text)
    assert len(shown) == len(hits) == 5
    heads = columns(page.text)
    for hit, row in zip(hits, shown, strict=True):
        assert first_link(row) == f"/ui/projects/apollo/minutes/{hit['minute_id']}"
        cells = [c.split("<")[0] for c in row.split('<td class="num">')[1:]]
        assert cells[1] == f"{hit['score']:.3f}"
        for name, value in hit["parts"].items():  # each part in its own column
            assert cells[2 + heads.index(name) - heads.index("Score") - 1] == f"{value:.3f}", name
        assert cells[-1] == f"{hit['scores']['composite']:.3f}"
    assert "keyword" in heads and "recency" in heads and "Matched by words alone" in page.text


def test_the_filters_narrow_as_the_apis_do(console: TestClient) -> None:
    query = {"q": "conflict", "category": "conflict_resolution", "agent": "coder,planner", "k": 20}
    page = console.get(SEARCH, params=query)
    hits = console.get(API, params=query).json()["hits"]
    assert hits and {h["category"] for h in hits} == {"conflict_resolution"}
    assert {h["minute"]["agent_id"] for h in hits} <= {"coder", "planner"}
    assert [first_link(r).rsplit("/", 1)[1] for r in rows(page.text)] == [h["minute_id"] for h in hits]
    assert 'value="coder, planner"' in page.text  # the form keeps what was asked


def test_prefer_recent_shows_how_new_each_hit_is(console: TestClient) -> None:
    page = console.get(SEARCH, params={"q": "conflict resolved", "prefer": "recent"})
    assert "newness" in columns(page.text) and "(recent first)" in page.text
    assert '<option value="recent" selected>' in page.text


def test_facts_and_thread_summaries_rank_with_the_minutes_and_link_their_sources(
    console: TestClient, redis_client: redis.Redis, settings: Settings
) -> None:
    body = {"subject": "cache layer", "attribute": "eviction policy", "value": "allkeys-lru", "agent_id": "ops"}
    assert console.post("/v1/projects/apollo/facts", json=body).status_code == 202
    FactsFeed(redis_client, settings).settle(index=True)  # the index pool makes the fact's point
    summarize(redis_client, settings, "apollo")
    run_index_worker(redis_client)  # the summary points the summarize pool queued
    query: dict[str, Any] = {"q": "cache eviction policy tune-cache", "kinds": ["minute", "fact", "summary"], "k": 30}
    page = console.get(SEARCH, params=query)
    assert page.status_code == 200, page.text
    ranked = console.get(API, params=query).json()["ranked"]
    assert {h["kind"] for h in ranked} == {"minute", "fact", "summary"}
    shown = rows(page.text)
    assert len(shown) == len(ranked)
    for hit, row in zip(ranked, shown, strict=True):
        assert f'<span class="tag">{hit["kind"]}</span>' in row
        if hit["kind"] == "fact":
            assert first_link(row) == f"/ui/projects/apollo/facts/{hit['fact_id']}"
        elif hit["kind"] == "summary":
            assert first_link(row).startswith("/ui/projects/apollo/threads/" + hit["thread"].replace(":", "%3A"))
        for source in hit.get("sources", [])[:12]:
            assert f'href="/ui/projects/apollo/minutes/{source}"' in row
    fact = next(h for h in ranked if h["kind"] == "fact")
    assert fact["sources"] and "allkeys-lru" in html.unescape(page.text)


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"q": "x", "k": 0}, "k=0"),
        ({"q": "x", "kinds": "minute,episode"}, "kinds="),
        ({"q": "x", "prefer": "newest"}, "prefer="),
        ({"q": "x", "min_composite": 2}, "min_composite="),
        ({"q": "x", "since_ms": "yesterday"}, "since_ms="),
        ({"k": 500}, "k=500"),  # named even before a query is
    ],
)
def test_a_bad_parameter_is_a_400_page_naming_it(console: TestClient, params: dict[str, Any], named: str) -> None:
    answer = console.get(SEARCH, params=params)
    assert answer.status_code == 400 and named in html.unescape(answer.text) and "Traceback" not in answer.text


def console_over(reader: ContextReader, redis_client: redis.Redis, settings: Settings) -> TestClient:
    return TestClient(create_app(reader, redis_client, settings.shards, pages=CONSOLE, settings=settings))


def test_a_lexical_only_answer_says_so(
    redis_client: redis.Redis, settings: Settings, openai_server: OpenAIServer, tmp_path: Path
) -> None:
    engine = EdgeEngine(tmp_path / "vectors", 16)
    try:
        engine.upsert([memory_point("apollo", "g1", "gateway rollback after the deploy", dense=embed_text("g", 16))])
        embedder = OpenAIEmbedder(openai_server.base_url, "sk-test", "test-embed", dimensions=16, query_timeout=0.3)
        reader = ContextReader(redis_client, LogReader(settings.log_dir), HybridSearch(engine, embedder))
        with console_over(reader, redis_client, settings) as client:
            whole = client.get(SEARCH, params={"q": "gateway"})
            assert "semantic" in columns(whole.text) and "Lexical only" not in whole.text  # both legs answered
            openai_server.fail_next(fake_provider.status(500), times=5)
            page = client.get(SEARCH, params={"q": "gateway rollback"})
        assert page.status_code == 200, page.text
        assert "Lexical only: dense leg skipped" in page.text and "HTTP 500" in page.text
        assert [first_link(r) for r in rows(page.text)] == ["/ui/projects/apollo/minutes/g1"]
        assert "semantic" not in columns(page.text)
    finally:
        engine.close()


def test_without_a_vector_store_the_search_is_a_503_page(
    redis_client: redis.Redis, settings: Settings, reader: ContextReader
) -> None:
    blind = ContextReader(redis_client, LogReader(settings.log_dir))
    with console_over(blind, redis_client, settings) as client:
        assert client.get(SEARCH).status_code == 200  # the form still shows
        answer = client.get(SEARCH, params={"q": "conflict"})
    assert answer.status_code == 503 and "no vector store" in answer.text


def test_a_token_for_apollo_cannot_search_borealis(scoped_console: TestClient) -> None:
    sign_in(scoped_console, TEAM_A)
    assert scoped_console.get(SEARCH, params={"q": "conflict"}).status_code == 200
    answer = scoped_console.get("/ui/projects/borealis/search", params={"q": "conflict"})
    assert answer.status_code == 403 and "/minutes/" not in answer.text

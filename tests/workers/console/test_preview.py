"""The context preview over a real reader: the context an agent would get now, its budget report and its text, as
the API's context route answers them."""

from __future__ import annotations

import html
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from pvm.config import Settings
from tests.workers.api.test_api_facts import FactsFeed
from tests.workers.console.conftest import OPS, TEAM_A, sign_in
from tests.workers.console.test_threads import summarize

PREVIEW = "/ui/projects/apollo/context"
API = "/v1/projects/apollo/context"
# Project facts enough that a small budget leaves some of them out.
FACTS = [
    {"subject": "payments service", "attribute": "database", "value": "Postgres", "type": "decision"},
    {"subject": "auth service", "attribute": "session ttl", "value": "30 minutes"},
    {"subject": "ci", "attribute": "runner", "value": "ubuntu-24"},
    {"subject": "cache layer", "attribute": "eviction policy", "value": "allkeys-lru"},
    {"subject": "release train", "attribute": "cadence", "value": "every second Tuesday"},
    {"subject": "search index", "attribute": "engine", "value": "the embedded Qdrant-edge engine"},
    {"subject": "deploying to production", "attribute": "step", "value": "page the on-call first", "type": "procedure"},
]


@pytest.fixture
def known(console: TestClient, redis_client: redis.Redis, settings: Settings) -> TestClient:
    """The console over apollo with project facts, a rule and a global fact, applied by the real facts pool."""
    for body in FACTS:
        assert console.post("/v1/projects/apollo/facts", json={**body, "agent_id": "ops"}).status_code == 202
    learned = {"key": "oncall", "value": "team-b", "tier": "global", "agent_id": "ops"}
    assert console.post("/v1/projects/apollo/learn", json=learned).status_code == 202
    FactsFeed(redis_client, settings).settle()
    return console


def section_row(page: str, name: str) -> list[str]:
    """The cells of a section's row in the budget table: kept, tokens, left out."""
    row = page.split(f'<th scope="row">{name}</th>')[1].split("</tr>")[0]
    return [cell.split(">", 1)[1].split("<")[0] for cell in row.split("<td")[1:4]]


def preview_text(page: str) -> str:
    return html.unescape(page.split("<pre>")[1].split("</pre>")[0])


def test_without_an_agent_the_page_is_the_form_alone(console: TestClient) -> None:
    page = console.get(PREVIEW)
    assert page.status_code == 200, page.text
    assert 'name="agent_id"' in page.text and "data-focus-key" in page.text.split('name="agent_id"')[1].split(">")[0]
    for name in ("task", "task_id", "tag", "thread", "budget_tokens"):
        assert f'name="{name}"' in page.text
    assert "How the budget was spent" not in page.text and "<pre>" not in page.text


def test_the_preview_is_the_context_the_api_gives_with_its_budget_report_and_text(known: TestClient) -> None:
    params: dict[str, Any] = {"agent_id": "coder", "task": "deploying the cache to production", "budget_tokens": 400}
    page = known.get(PREVIEW, params=params)
    assert page.status_code == 200, page.text
    package = known.get(API, params=params).json()
    budget = package["budget"]
    assert f"{budget['used_tokens']} / 400" in page.text
    assert budget["cut"]["recent"] > 0  # a small budget leaves out most of the newest minutes
    for name, tokens in budget["sections"].items():
        cut = budget["cut"].get(name, 0)
        kept = 1 if name == "agent_memory" else len(package[name])
        assert section_row(page.text, name) == [str(kept), str(tokens), str(cut)], name
    # what we know, the rule that matches the task and the experience, each linked
    assert package["facts"] and package["relevant_experience"]
    for fact in package["facts"]:
        assert f'href="/ui/projects/apollo/facts/{fact["id"]}"' in page.text
    assert [r["value"] for r in package["rules"]] == [
        "page the on-call first"
    ] and "page the on-call first" in page.text
    for hit in package["relevant_experience"]:
        assert f'href="/ui/projects/apollo/minutes/{hit["minute_id"]}"' in page.text
    text = known.get(API, params={**params, "format": "text"}).text
    assert preview_text(page.text) == text and "left out" in text


def test_what_was_left_out_of_the_facts_is_told_per_tier(known: TestClient) -> None:
    params = {"agent_id": "coder", "budget_tokens": 120}
    page = known.get(PREVIEW, params=params)
    budget = known.get(API, params=params).json()["budget"]
    assert budget["tier_cut"].get("project", 0) > 0  # not every project fact fits in 30% of 120 tokens
    tiers = page.text.split("What we know, per tier")[1].split("</table>")[0]
    for tier in {*budget["tiers"], *budget["tier_cut"]}:
        row = tiers.split(f'<th scope="row">{tier}</th>')[1].split("</tr>")[0]
        cells = [cell.split(">", 1)[1].split("<")[0] for cell in row.split("<td")[1:]]
        assert cells == [str(budget["tiers"].get(tier, 0)), str(budget["tier_cut"].get(tier, 0))]
    assert "facts (" in preview_text(page.text)  # the text says so too


def test_the_global_tier_is_in_the_preview_only_with_the_tokens_grant(
    known: TestClient, scoped_console: TestClient
) -> None:
    granted = known.get(PREVIEW, params={"agent_id": "coder", "budget_tokens": 4000})
    assert "team-b" in granted.text and "the global tier included" in granted.text
    sign_in(scoped_console, TEAM_A)  # apollo, no global grant
    blind = scoped_console.get(PREVIEW, params={"agent_id": "coder", "budget_tokens": 4000})
    assert blind.status_code == 200 and "Postgres" in blind.text
    assert "team-b" not in blind.text and "without the global tier" in blind.text


def test_a_thread_context_shows_the_threads_sections(
    console: TestClient, redis_client: redis.Redis, settings: Settings
) -> None:
    summarize(redis_client, settings, "apollo")
    params = {"agent_id": "coder", "thread": "migrate-db-thread", "budget_tokens": 4000}
    page = console.get(PREVIEW, params=params)
    assert page.status_code == 200, page.text
    package = console.get(API, params=params).json()
    assert package["thread"] == "thread:migrate-db-thread" and package["summaries"]
    assert 'href="/ui/projects/apollo/threads/thread%3Amigrate-db-thread"' in page.text
    assert section_row(page.text, "summaries")[0] == str(len(package["summaries"]))
    assert preview_text(page.text) == console.get(API, params={**params, "format": "text"}).text


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"agent_id": "coder", "budget_tokens": "lots"}, "budget_tokens"),
        ({"agent_id": "coder", "budget_tokens": 0}, "budget_tokens"),
        ({"budget_tokens": 2_000_000}, "budget_tokens"),  # named even before an agent is
        ({"agent_id": "coder", "task_id": "x" * 1000}, "task_id"),
        ({"agent_id": "coder", "thread": "task:"}, "thread"),
    ],
)
def test_a_bad_parameter_is_a_400_page_naming_it(console: TestClient, params: dict[str, Any], named: str) -> None:
    answer = console.get(PREVIEW, params=params)
    assert answer.status_code == 400 and named in answer.text and "Traceback" not in answer.text


def test_a_token_for_apollo_cannot_preview_borealiss_context(scoped_console: TestClient) -> None:
    sign_in(scoped_console, TEAM_A)
    answer = scoped_console.get("/ui/projects/borealis/context", params={"agent_id": "coder"})
    assert answer.status_code == 403 and "<pre>" not in answer.text
    sign_in(scoped_console, OPS)
    assert scoped_console.get("/ui/projects/borealis/context", params={"agent_id": "coder"}).status_code == 200

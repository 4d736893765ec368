"""`pvm mcp`: an MCP client from the SDK lists and calls every tool over stdio (a subprocess) and streamable HTTP
(uvicorn on a loopback port: `pvm mcp --transport http`, and `pvm serve --mcp` beside the API), each tool going
through the real reader API; a project outside the token's, or no token, is refused."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import redis
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from pvm import AsyncClient, engines
from pvm.config import Settings
from pvm.reader import ContextReader
from pvm.stores.log import LogReader
from tests.conftest import free_port
from tests.memory_helpers import log_minutes, use_settings
from tests.pvm.test_client import serving
from tests.workers.agent.test_memory_files import apply, streamed
from tests.workers.agent.test_memory_tools import NEW
from tests.workers.api.test_api_facts import APOLLO_ONLY, write_tokens
from workers.agent.mcp_server import TOOLS, Gateway, ProjectId, ToolRegistry, beside_api, build_server, http_app
from workers.agent.memory_tools import MemoryTools
from workers.api.app import create_app
from workers.ops.demo import sample_session

EXPECTED_TOOLS = [
    *("emit", "search", "context", "learn", "recall", "facts", "pair"),
    *("list", "read", "write", "patch", "append"),
]
SEEDED = "facts/project/web.md"  # written through the memory tools before the server starts: one fact of apollo


def _text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def exercise(client: Client) -> dict[str, Any]:
    """List the tools, call each one for apollo, and call one for a project the token does not reach."""
    listed = await client.list_tools()
    answers: dict[str, Any] = {"tools": [t.name for t in listed.tools]}
    calls: dict[str, dict[str, Any]] = {
        "emit": {"project_id": "apollo", "event_type": "decision", "agent_id": "coder", "memory_note": "use JWT"},
        "search": {"project_id": "apollo", "query": "conflict resolved", "k": 3},
        "context": {"project_id": "apollo", "agent_id": "coder", "task": "tune the cache"},
        "learn": {"project_id": "apollo", "key": "deploy window", "value": "Tue 10:00", "agent_id": "coder"},
        "recall": {"project_id": "apollo", "key": "nothing learned"},
        "facts": {"project_id": "apollo", "limit": 5},
        "pair": {
            "project_id": "apollo",
            "task": "Pick the web framework",
            "criteria": ["Names the web framework", "Does not mention Flask"],
            "output": "We picked Flask.",
            "rounds": 2,
        },
    }
    for name, arguments in calls.items():
        result = await client.call_tool(name, arguments)
        assert not result.is_error, f"{name}: {_text(result)}"
        answers[name] = result.structured_content if name != "context" else _text(result)
    answers["memory"] = await exercise_memory(client)
    refused = await client.call_tool("search", {"project_id": "borealis", "query": "anything"})
    answers["refused"] = (refused.is_error, _text(refused))
    invalid = await client.call_tool("search", {"project_id": "apollo"})  # no query
    answers["invalid"] = (invalid.is_error, _text(invalid))
    return answers


async def exercise_memory(client: Client) -> dict[str, Any]:
    """Call each memory tool for apollo's one fact, then a path outside the sandbox, an ambiguous patch, and a
    project the token does not reach."""
    answers: dict[str, Any] = {}
    listed = await client.call_tool("list", {"project_id": "apollo", "prefix": "facts/project"})
    assert not listed.is_error, _text(listed)
    answers["list"] = files = listed.structured_content["files"]
    path = files[0]["path"]
    fact = {"project_id": "apollo", "path": path}
    calls: dict[str, dict[str, Any]] = {
        "read": fact,
        "write": {"project_id": "apollo", "path": "facts/project/cache.md", "text": NEW.replace("web", "cache")},
        "patch": {**fact, "old": "We serve with Starlette.", "new": "We serve with Starlette and uvicorn."},
        "append": {**fact, "text": "Chosen in the 2026 review."},
    }
    for name, arguments in calls.items():
        result = await client.call_tool(name, arguments)
        assert not result.is_error, f"{name}: {_text(result)}"
        answers[name] = result.structured_content
    for name, arguments in {
        "outside": ("read", {"project_id": "apollo", "path": "../secrets.md"}),
        "absolute": ("write", {"project_id": "apollo", "path": "/etc/passwd.md", "text": NEW}),
        "ambiguous": ("patch", {**fact, "old": "e", "new": "E"}),
        "other_project": ("list", {"project_id": "borealis"}),
    }.items():
        refused = await client.call_tool(*arguments)
        answers[name] = (refused.is_error, _text(refused))
    return answers


def check_memory(answers: dict[str, Any]) -> None:
    [listed] = answers["list"]
    assert listed["path"].startswith("facts/project/decision/service-web-framework-") and not listed["read_only"]
    assert answers["read"]["path"] == listed["path"] and "We serve with Starlette." in answers["read"]["text"]
    assert answers["write"]["changed"] and [m["event_type"] for m in answers["write"]["minutes"]] == ["fact_asserted"]
    for edit in ("patch", "append"):
        assert answers[edit]["changed"] and [m["event_type"] for m in answers[edit]["minutes"]] == ["fact_edited"]
        assert answers[edit]["path"] == listed["path"] and len(answers[edit]["stream_ids"]) == 1
    is_error, message = answers["outside"]
    assert is_error and "pvm: the reader API refused the request (400): path '../secrets.md'" in message
    assert message.endswith("segment; paths stay inside the project's memory root")
    is_error, message = answers["absolute"]
    assert is_error and "(400)" in message and "relative to the project's memory root" in message
    is_error, message = answers["ambiguous"]
    assert is_error and "(422)" in message and "include more of the surrounding text" in message
    is_error, message = answers["other_project"]
    assert is_error and "(403)" in message and "borealis" in message


def check(answers: dict[str, Any]) -> None:
    assert answers["tools"] == EXPECTED_TOOLS == TOOLS.names()
    assert len(answers["emit"]["id"]) == 26 and answers["emit"]["stream_id"]
    hits = answers["search"]["hits"]
    assert 0 < len(hits) <= 3 and all(h["minute"]["project_id"] == "apollo" for h in hits)
    assert answers["context"].startswith("# Context for coder")
    assert answers["learn"]["fact_id"] and answers["learn"]["minute_id"]
    assert answers["recall"]["key"] == "nothing learned" and answers["recall"]["fact"] is None
    # the seeded fact alone: the facts pool does not run here, so what the tools wrote is not applied
    assert [f["subject"] for f in answers["facts"]["facts"]] == ["service:web"]
    run = answers["pair"]
    assert run["project_id"] == "apollo" and 1 <= len(run["rounds"]) <= 2 and run["minute_ids"]
    assert any("flask" in " ".join(g["forbidden"]).lower() for g in run["rounds"][0]["gaps"])
    check_memory(answers["memory"])
    is_error, message = answers["refused"]
    assert is_error and "may not read project borealis" in message and "403" in message
    is_error, message = answers["invalid"]
    assert is_error and "query" in message


def test_every_tool_answers_over_stdio_with_the_token_of_the_process(api_app: Any) -> None:
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "workers.ops.cli", "mcp", "--token", APOLLO_ONLY],
        env={"PVM_API_TOKEN": "", "PATH": os.environ.get("PATH", "")},
        cwd=str(Path(__file__).resolve().parents[3]),
    )

    async def run() -> dict[str, Any]:
        async with Client(server, read_timeout_seconds=60) as client:
            return await exercise(client)

    with serving(api_app) as api_url:
        server.env = {**(server.env or {}), "PVM_API_URL": api_url}
        check(asyncio.run(run()))


@pytest.fixture
def api_app(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Any]:
    """The token-guarded reader API app over 60 minutes of project apollo
    (tokens: tests/workers/api/test_api_facts.py)."""
    use_settings(settings, monkeypatch)
    log_minutes(redis_client, settings, list(sample_session("apollo", 60, seed=2)))
    with MemoryTools("apollo", settings) as tools:
        tools.write(SEEDED, NEW)
    apply(redis_client, streamed(redis_client, settings))
    reader = ContextReader(redis_client, LogReader(settings.log_dir), engines.searcher_for(settings))  # type: ignore[arg-type]
    yield create_app(reader, redis_client, settings.shards, tokens=write_tokens(tmp_path / "tokens.json"))
    engines.close_shared()


@contextmanager
def mcp_over_http(api: Any, where: str) -> Iterator[str]:
    """The MCP endpoint's URL: `pvm mcp --transport http` calling the API over HTTP, or `pvm serve --mcp`."""
    with serving(api) as api_url:
        if where == "beside the API":
            yield f"{api_url}/mcp"
            return
        with serving(http_app(Gateway(api_url, per_request_token=True), host="127.0.0.1")) as base:
            yield f"{base}/mcp"


@pytest.mark.parametrize("where", ["pvm mcp", "beside the API"])
def test_every_tool_answers_over_http_scoped_by_each_callers_bearer_token(api_app: Any, where: str) -> None:
    served = beside_api(api_app, host="127.0.0.1") if where == "beside the API" else api_app

    async def run(url: str, token: str | None) -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            if token is None:
                return await client.call_tool("recall", {"project_id": "apollo", "key": "k"})
            return await exercise(client)

    with mcp_over_http(served, where) as url:
        check(asyncio.run(run(url, APOLLO_ONLY)))
        anonymous = asyncio.run(run(url, None))
        if where == "beside the API":  # the API's own routes answer as before
            health = httpx2.get(url.removesuffix("/mcp") + "/healthz")
            assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert anonymous.is_error and "requires a token" in _text(anonymous)


def test_a_tool_is_one_function_in_a_registry() -> None:
    registry = ToolRegistry()

    @registry.named("list")
    async def listing(api: AsyncClient, project_id: ProjectId) -> dict[str, Any]:
        """The project asked for, and what the tool was handed to call the API with."""
        return {"project_id": project_id, "client": type(api).__name__}

    with pytest.raises(ValueError, match="registered already"):
        registry.named("list")(listing)

    async def run() -> tuple[Any, Any]:
        server = build_server(Gateway(f"http://127.0.0.1:{free_port()}", "unused"), registry)
        async with Client(server) as client:  # in-process: the tool never reaches the API
            listed = (await client.list_tools()).tools
            return listed, await client.call_tool("list", {"project_id": "apollo"})

    listed, answer = asyncio.run(run())
    assert [t.name for t in listed] == ["list"] and listed[0].description.startswith("The project asked for")
    assert set(listed[0].input_schema["properties"]) == {"project_id"}  # neither the client nor the context
    assert answer.structured_content == {"project_id": "apollo", "client": "AsyncClient"}

"""The clients' Markdown memory methods against the real reader API under uvicorn (the facts pool applying each
change), their refusals as `PVMRequestError` with the server's message, and a client method for every API route."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from pvm import AsyncClient, Client, PVMRequestError, engines, routes
from pvm.config import Settings
from pvm.reader import ContextReader
from pvm.stores.log import LogReader
from tests.memory_helpers import use_settings
from tests.pvm.test_client import _routes_of, serving
from tests.workers.api.test_api_facts import APOLLO_ONLY, FactsFeed, write_tokens
from workers.api.app import create_app
from workers.api.openapi import operations

NEW = (
    "---\ntype: decision\nsubject: service:web\nattribute: framework\nvalue: Starlette\n---\nWe serve with Starlette.\n"
)


@pytest.fixture
def served(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[tuple[str, FactsFeed]]:
    """The token-guarded API (APOLLO_ONLY reaches apollo alone) and the facts pool that applies its minutes."""
    use_settings(settings, monkeypatch)
    reader = ContextReader(redis_client, LogReader(settings.log_dir), engines.searcher_for(settings))  # type: ignore[arg-type]
    app = create_app(reader, redis_client, settings.shards, tokens=write_tokens(tmp_path / "tokens.json"))
    with serving(app) as url:
        yield url, FactsFeed(redis_client, settings)
    engines.close_shared()


def test_every_memory_method_round_trips_through_the_pool(served: tuple[str, FactsFeed]) -> None:
    url, feed = served
    with Client(url, APOLLO_ONLY, retry_backoff=0.01) as api:
        assert api.openapi()["paths"]["/v1/projects/{project_id}/memory/patch"]["post"]
        assert api.memory_list("apollo") == []
        written = api.memory_write("apollo", "facts/project/web.md", NEW)
        assert written["changed"] and [m["event_type"] for m in written["minutes"]] == ["fact_asserted"]
        assert [m.event_type for m in feed.settle()] == ["fact_asserted"]
        [listed] = api.memory_list("apollo")
        path = listed["path"]
        assert path.startswith("facts/project/decision/service-web-framework-") and not listed["read_only"]
        assert api.memory_list("apollo", "facts/project") == [listed] and api.memory_list("apollo", "learned") == []
        assert "We serve with Starlette." in api.memory_read("apollo", path)["text"]

        patched = api.memory_patch("apollo", path, "We serve with Starlette.", "We serve with Starlette and uvicorn.")
        assert [m["event_type"] for m in patched["minutes"]] == ["fact_edited"]
        feed.settle()
        appended = api.memory_append("apollo", path, "Chosen in the 2026 review.")
        assert appended["changed"] and [m["event_type"] for m in appended["minutes"]] == ["fact_edited"]
        feed.settle()
        text = api.memory_read("apollo", path)["text"]
        assert text.endswith("We serve with Starlette and uvicorn.\nChosen in the 2026 review.\n")

        files = api.memory_export("apollo")
        assert files[path] == text
        unchanged = api.memory_import("apollo", files)
        assert unchanged["minutes"] == 0 and not unchanged["dry_run"] and unchanged["stream_ids"] == []
        edited = {**files, path: text.replace("2026 review", "2026 design review")}
        planned = api.memory_import("apollo", edited, dry_run=True)
        assert planned["dry_run"] and [c["event_type"] for c in planned["changes"]] == ["fact_edited"]
        assert feed.settle() == [], "a dry run writes no minute"
        imported = api.memory_import("apollo", edited)
        assert imported["minutes"] == 1 and len(imported["stream_ids"]) == 1
        feed.settle()
        assert "2026 design review" in api.memory_read("apollo", path)["text"]

        # The newest fact's file removed: only the export's version tells that whoever removed it had seen it.
        files, version = api.memory_export_versioned("apollo")
        assert files == api.memory_export("apollo") and version > 0
        removed = {p: t for p, t in files.items() if p != path}
        blind = api.memory_import("apollo", removed, dry_run=True)
        assert blind["changes"] == [], "without the version the newest fact may be newer than the export: kept"
        seen = api.memory_import("apollo", removed, dry_run=True, version=version)
        assert [(c["event_type"], c["path"]) for c in seen["changes"]] == [("fact_retracted", path)]


def test_memory_refusals_are_request_errors_with_the_servers_message(served: tuple[str, FactsFeed]) -> None:
    url, feed = served
    with Client(url, APOLLO_ONLY, retry_backoff=0.01) as api:
        api.memory_write("apollo", "facts/project/web.md", NEW)
        feed.settle()
        [listed] = api.memory_list("apollo")
        path = listed["path"]

        with pytest.raises(PVMRequestError) as ambiguous:
            api.memory_patch("apollo", path, "e", "E")
        assert ambiguous.value.status == 422 and re.search(r"old text occurs \d+ times", ambiguous.value.message)
        assert "include more of the surrounding text" in str(ambiguous.value)

        for outside in ("../secrets.md", "/etc/passwd.md", "facts/%2e%2e/x.md"):
            with pytest.raises(PVMRequestError) as refused:
                api.memory_read("apollo", outside)
            assert refused.value.status == 400 and refused.value.message, outside
            with pytest.raises(PVMRequestError) as refused_write:
                api.memory_write("apollo", outside, NEW)
            assert refused_write.value.status in (400, 422) and refused_write.value.message, outside
        with pytest.raises(PVMRequestError) as missing:
            api.memory_read("apollo", "facts/project/none.md")
        assert missing.value.status == 404 and "no such memory file" in missing.value.message

        stale = api.memory_export("apollo")
        api.memory_append("apollo", path, "A newer edit.")
        feed.settle()
        edited = {**stale, path: stale[path].rstrip("\n") + "\nAn edit of an old export.\n"}
        with pytest.raises(PVMRequestError) as conflict:
            api.memory_import("apollo", edited)
        assert conflict.value.status == 409 and "older than the store's version" in conflict.value.message
        assert feed.settle() == [], "a refused import writes nothing"

        with pytest.raises(PVMRequestError) as several:
            api.memory_import("apollo", {"../x.md": "x", "facts/y.md": "nope"})
        assert len(several.value.errors) == 2 and all(e["problem"] for e in several.value.errors)

        with pytest.raises(PVMRequestError) as other_project:
            api.memory_list("zeus")
        assert other_project.value.status == 403


def test_the_async_client_reads_and_edits_memory_as_the_sync_one(served: tuple[str, FactsFeed]) -> None:
    url, feed = served

    async def run() -> tuple[list[dict[str, Any]], dict[str, str], str]:
        async with AsyncClient(url, APOLLO_ONLY, retry_backoff=0.01) as aapi:
            await aapi.memory_write("apollo", "facts/project/web.md", NEW)
            feed.settle()
            listed = await aapi.memory_list("apollo")
            exported = await aapi.memory_export("apollo")
            try:
                await aapi.memory_patch("apollo", listed[0]["path"], "no such text", "x")
            except PVMRequestError as exc:
                return listed, exported, exc.message
            raise AssertionError("a patch of text the file lacks was accepted")

    listed, exported, refused = asyncio.run(run())
    with Client(url, APOLLO_ONLY) as api:
        assert listed == api.memory_list("apollo") and exported == api.memory_export("apollo")
    assert "old text not found" in refused


# -- one client method for every route ---------------------------------------------------------------------------

# Sample arguments of each route builder: the test below builds each one's requests and matches them to the routes.
SAMPLE_ARGUMENTS: dict[str, tuple[Any, ...]] = {
    "health": (),
    "openapi": (),
    "context": ("p", "agent"),
    "context_text": ("p", "agent"),
    "thread": ("p", "project"),
    "search": ("p", "query"),
    "stats": ("p",),
    "global_stats": (),
    "recent": ("p",),
    "minutes": ("p", ["id"]),
    "post_minutes": ([{"project_id": "p", "event_type": "message"}],),
    "facts": ("p",),
    "fact": ("p", "f"),
    "fact_history": ("p", "f"),
    "assert_fact": ("p", "subject", "attribute", "value"),
    "promote": ("p", "f"),
    "retract": ("p", "f"),
    "learn": ("p", "key", "value"),
    "recall": ("p", "key"),
    "memory_list": ("p",),
    "memory_read": ("p", "facts/x.md"),
    "memory_write": ("p", "facts/x.md", "text"),
    "memory_patch": ("p", "facts/x.md", "old", "new"),
    "memory_append": ("p", "facts/x.md", "text"),
    "memory_export": ("p",),
    "memory_export_versioned": ("p",),
    "memory_import": ("p", {}),
    "pair": ("p", "task", ["criterion"], "output"),
}
# A route that is another spelling of one a client method sends: the same handler, the key in the path.
SPELLINGS = {("get", "/v1/projects/{project_id}/recall/{key}"): ("get", "/v1/projects/{project_id}/recall")}


def test_every_api_route_has_a_method_on_both_clients() -> None:
    documented = {(method, path) for path, methods in operations().items() for method in methods}
    templates = {
        path: re.compile("^" + re.sub(r"\{[a-z_]+\}", "[^/]+", path.replace(".", r"\.")) + "$")
        for _, path in documented
    }
    methods = _routes_of(Client)
    assert methods == _routes_of(AsyncClient) == set(SAMPLE_ARGUMENTS), "a route builder without sample arguments"
    sent: dict[tuple[str, str], str] = {}
    for name in methods:
        for request in getattr(routes, name)(*SAMPLE_ARGUMENTS[name]).requests:
            [template] = [path for path, pattern in templates.items() if pattern.match(request.path)]
            sent[(request.method.lower(), template)] = name
    missing = sorted(route for route in documented - set(sent) if SPELLINGS.get(route) not in sent)
    assert not missing, f"API routes with no Client / AsyncClient method (add a builder in pvm/routes.py): {missing}"
    assert set(sent) <= documented


def test_every_memory_write_sends_a_minute_id_of_its_own_that_its_retries_repeat() -> None:
    """The server derives the write's minute ids from it, so a retried write (after a 503) is written once."""
    calls = [
        routes.memory_write("apollo", "facts/project/web.md", NEW),
        routes.memory_patch("apollo", "facts/project/web.md", "We", "They"),
        routes.memory_append("apollo", "facts/project/web.md", "More."),
        routes.memory_import("apollo", {"facts/project/web.md": NEW}),
    ]
    ids = [call.requests[0].body["minute_id"] for call in calls]
    assert len(set(ids)) == 4 and all(len(i) == 26 for i in ids)
    assert routes.memory_import("apollo", {}, dry_run=True).requests[0].body.get("minute_id") is None

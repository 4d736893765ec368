"""The memory tools (workers/agent/memory_tools.py) and the reader API's memory routes (workers/api/memory_routes.py).

Against the embedded Valkey: every write is a minute on the shard streams, applied to the facts store the way the
facts pool applies it (`apply`), and the reads then show it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from contracts import new_minute_id
from pvm.config import Settings
from pvm.reader import ContextReader
from pvm.stores.log import LogReader
from tests.memory_helpers import log_minutes
from tests.workers.agent.test_memory_files import ATTACKS, P, apply, global_paths, seed_global, seed_memory, streamed
from tests.workers.api.test_api_facts import APOLLO_ONLY, CURATOR, bearer, write_tokens
from workers.agent.memory_errors import MemoryConflict, MemoryFileError, MemoryNotFound, MemoryPathError
from workers.agent.memory_paths import fact_path
from workers.agent.memory_snapshot import read_snapshot
from workers.agent.memory_tools import MemoryTools
from workers.api.app import create_app

NEW = (
    "---\ntype: decision\nsubject: service:web\nattribute: framework\nvalue: Starlette\n---\nWe serve with Starlette.\n"
)


@pytest.fixture
def tools(redis_client: redis.Redis, settings: Settings) -> Iterator[MemoryTools]:
    with MemoryTools(P, settings) as built:
        yield built


def test_write_list_read_patch_append_each_write_a_minute(
    tools: MemoryTools, redis_client: redis.Redis, settings: Settings
) -> None:
    assert tools.list() == []
    written = tools.write("facts/project/web.md", NEW)
    assert written["changed"] and [m["event_type"] for m in written["minutes"]] == ["fact_asserted"]
    [minute] = streamed(redis_client, settings)
    assert minute.event_type == "fact_asserted" and minute.agent_id == "memory-tools"
    apply(redis_client, [minute])
    [listed] = tools.list()
    assert listed["path"].startswith("facts/project/decision/service-web-framework-") and not listed["read_only"]
    assert tools.list("facts/project") == [listed] and tools.list("learned") == []
    path = listed["path"]
    assert "We serve with Starlette." in tools.read(path)["text"]

    assert tools.write(path, tools.read(path)["text"]) == {
        "path": path,
        "changed": False,
        "minutes": [],
        "stream_ids": [],
    }
    patched = tools.patch(path, "We serve with Starlette.", "We serve with Starlette behind uvicorn.")
    assert [m["event_type"] for m in patched["minutes"]] == ["fact_edited"]
    apply(redis_client, streamed(redis_client, settings)[1:])
    assert "behind uvicorn." in tools.read(path)["text"]
    appended = tools.append(path, "Chosen in the 2026 review.")
    assert [m["event_type"] for m in appended["minutes"]] == ["fact_edited"]
    apply(redis_client, streamed(redis_client, settings)[2:])
    assert tools.read(path)["text"].endswith("behind uvicorn.\nChosen in the 2026 review.\n")
    assert len(streamed(redis_client, settings)) == 3


def test_patch_refuses_missing_and_ambiguous_matches(tools: MemoryTools, redis_client: redis.Redis) -> None:
    [fact] = seed_memory(redis_client, random.Random(3), 1)
    path = fact_path(fact)
    with pytest.raises(MemoryFileError, match="old text not found"):
        tools.patch(path, "no such text anywhere", "x")
    with pytest.raises(MemoryFileError, match=r"occurs \d+ times"):
        tools.patch(path, '"', "'")
    with pytest.raises(MemoryFileError, match="old must not be empty"):
        tools.patch(path, "", "x")
    with pytest.raises(MemoryNotFound):
        tools.patch("facts/project/nothing.md", "a", "b")


def test_tools_refuse_paths_out_of_the_root_read_only_files_and_misplaced_ids(
    tools: MemoryTools, redis_client: redis.Redis
) -> None:
    for path in ATTACKS:
        for call in (lambda p: tools.read(p), lambda p: tools.write(p, NEW), lambda p: tools.append(p, "x")):
            with pytest.raises(MemoryPathError):
                call(path)
    with pytest.raises(MemoryPathError):
        tools.list("../")
    [fact] = seed_memory(redis_client, random.Random(4), 1)
    text = tools.read(fact_path(fact))["text"]
    with pytest.raises(MemoryConflict, match="lives at its own path"):
        tools.write("facts/project/elsewhere.md", text)
    with pytest.raises(MemoryConflict, match="read-only"):
        tools.write("episodes/x/1-y.md", "---\ntitle: x\n---\n")


# -- over HTTP ----------------------------------------------------------------------------------------------------


@pytest.fixture
def client(redis_client: redis.Redis, settings: Settings, tmp_path: Path) -> Iterator[TestClient]:
    reader = ContextReader(redis_client, LogReader(settings.log_dir), None)
    app = create_app(reader, redis_client, settings.shards, tokens=write_tokens(tmp_path / "tokens.json"))
    with TestClient(app) as c:
        yield c


def call(client: TestClient, method: str, route: str, token: str = APOLLO_ONLY, **kwargs: Any) -> Any:
    return client.request(method, f"/v1/projects/{P}/memory/{route}", headers=bearer(token), **kwargs)


def test_export_and_import_over_http(client: TestClient, redis_client: redis.Redis, settings: Settings) -> None:
    [fact] = seed_memory(redis_client, random.Random(5), 1)
    r = call(client, "GET", "export")
    assert r.status_code == 200, r.text
    files = r.json()["files"]
    assert len(files) == 3 and fact_path(fact) in files
    assert r.json()["version"] == read_snapshot(redis_client, P).last_ms
    for bad in ("soon", -1, True, 1.5):
        r = call(client, "PUT", "export", json={"files": files, "version": bad})
        assert r.status_code in (400, 422) and "version" in r.text, bad
    r = call(client, "PUT", "export", json={"files": files})
    assert r.status_code == 200 and r.json()["minutes"] == 0 and r.json()["unchanged"] == 3
    edited = {**files, fact_path(fact): files[fact_path(fact)].rstrip("\n") + "\nEdited over HTTP.\n"}
    r = call(client, "PUT", "export", params={"dry_run": "true"}, json={"files": edited})
    assert r.status_code == 200 and r.json()["dry_run"] and r.json()["changes"][0]["event_type"] == "fact_edited"
    assert streamed(redis_client, settings) == []
    r = call(client, "PUT", "export", json={"files": edited})
    assert r.status_code == 202 and len(r.json()["stream_ids"]) == 1
    [minute] = streamed(redis_client, settings)
    assert minute.event_type == "fact_edited"
    apply(redis_client, [minute])
    r = call(client, "PUT", "export", json={"files": edited})  # the old version, now stale
    assert r.status_code == 409 and "older than the store's version" in r.json()["error"]
    r = call(client, "PUT", "export", json={"files": {"../x.md": "x", "facts/y.md": "nope"}})
    assert r.status_code in (400, 422) and len(r.json()["problems"]) == 2
    assert call(client, "GET", "export", token=CURATOR).status_code == 200
    other = client.get("/v1/projects/zeus/memory/export", headers=bearer(APOLLO_ONLY))
    assert other.status_code == 403


def test_memory_tools_over_http(client: TestClient, redis_client: redis.Redis, settings: Settings) -> None:
    r = call(client, "PUT", "file", json={"path": "facts/project/web.md", "text": NEW})
    assert r.status_code == 202 and r.json()["minutes"][0]["event_type"] == "fact_asserted", r.text
    apply(redis_client, streamed(redis_client, settings))
    [listed] = call(client, "GET", "files").json()["files"]
    path = listed["path"]
    r = call(client, "GET", "file", params={"path": path})
    assert r.status_code == 200 and "Starlette" in r.json()["text"]
    r = call(client, "POST", "patch", json={"path": path, "old": "We serve", "new": "We now serve"})
    assert r.status_code == 202 and r.json()["minutes"][0]["event_type"] == "fact_edited"
    r = call(client, "POST", "patch", json={"path": path, "old": '"', "new": "'"})
    assert r.status_code == 422 and "occurs" in r.json()["error"]
    r = call(client, "POST", "append", json={"path": path, "text": "More."})
    assert r.status_code == 202
    assert call(client, "GET", "file", params={"path": "facts/none.md"}).status_code == 404
    for attack in ATTACKS:
        r = call(client, "GET", "file", params={"path": attack})
        assert r.status_code == 400, (attack, r.text)
        r = call(client, "PUT", "file", json={"path": attack, "text": NEW})
        assert r.status_code in (400, 422), (attack, r.text)
    r = client.put(
        "/v1/projects/zeus/memory/file", json={"path": "facts/a.md", "text": NEW}, headers=bearer(APOLLO_ONLY)
    )
    assert r.status_code == 403


def test_the_global_tier_over_http_follows_the_tokens_global_grant(
    client: TestClient, redis_client: redis.Redis, settings: Settings
) -> None:
    copy = seed_global(redis_client)
    path = fact_path(copy)
    assert global_paths(call(client, "GET", "export").json()["files"]) == []
    granted = call(client, "GET", "export", token=CURATOR).json()["files"]
    assert path in global_paths(granted) and len(global_paths(granted)) == 2
    assert [
        f["path"]
        for f in call(client, "GET", "files", token=CURATOR, params={"prefix": "facts/global"}).json()["files"]
    ] == [path]
    # Without the grant its files are not shown: reading one, listing its folder or patching one says why.
    r = call(client, "GET", "file", params={"path": path})
    assert r.status_code == 403 and r.json()["error"].startswith(f"{path}: the global tier's files are shown only")
    r = call(client, "GET", "files", params={"prefix": "facts/global"})
    assert r.status_code == 403 and "global grant" in r.json()["error"], r.text
    r = call(client, "POST", "patch", json={"path": path, "old": "a", "new": "b"})
    assert r.status_code == 403, r.text
    assert call(client, "GET", "file", token=CURATOR, params={"path": path}).json()["text"] == granted[path]
    edited = granted[path].rstrip("\n") + "\nChecked by a person.\n"
    r = call(client, "PUT", "file", json={"path": path, "text": edited})
    assert r.status_code == 403 and r.json()["error"].startswith(f"{path}: the global tier is read-only"), r.text
    r = call(client, "PUT", "export", json={"files": granted})
    assert r.status_code == 403 and len(r.json()["problems"]) == 2
    assert streamed(redis_client, settings) == []
    r = call(client, "PUT", "file", token=CURATOR, json={"path": path, "text": edited})
    assert r.status_code == 202 and [m["event_type"] for m in r.json()["minutes"]] == ["fact_edited"], r.text
    [minute] = streamed(redis_client, settings)
    assert (minute.project_id, minute.scope) == (P, "global")


def test_a_retried_memory_write_writes_each_minute_once(
    client: TestClient, redis_client: redis.Redis, settings: Settings
) -> None:
    """A retry (the same minute_id, as the client sends after a 503) plans the same minute ids, which the log keeps
    once; once the log holds them, it writes nothing and says so."""
    first_id = new_minute_id()
    body = {"path": "facts/project/web.md", "text": NEW, "minute_id": first_id}
    first = call(client, "PUT", "file", json=body)
    assert first.status_code == 202, first.text
    again = call(client, "PUT", "file", json=body)  # not applied yet: planned again, with the same ids
    assert again.status_code == 202 and again.json()["minutes"] == first.json()["minutes"]
    assert first.json()["minutes"][0]["minute_id"] == first_id
    written = streamed(redis_client, settings)
    assert [m.id for m in written] == [first_id, first_id]
    log_minutes(redis_client, settings, written[:1], index=False)  # the log keeps it once; the facts pool applies it
    apply(redis_client, written[:1])
    late = call(client, "PUT", "file", json=body)  # now the slot holds the value: the retry is a write made before
    assert late.status_code == 200 and late.json()["written_before"] == first_id and late.json()["minutes"] == []
    assert len(streamed(redis_client, settings)) == 2
    [listed] = call(client, "GET", "files").json()["files"]
    path = listed["path"]
    edit = {"path": path, "old": "We serve", "new": "We now serve", "minute_id": new_minute_id()}
    patched = [call(client, "POST", "patch", json=edit) for _ in range(2)]
    assert [r.status_code for r in patched] == [202, 202]
    assert patched[0].json()["minutes"] == patched[1].json()["minutes"]
    edits = streamed(redis_client, settings)[2:]
    assert [m.id for m in edits] == [edit["minute_id"]] * 2 and edits[0].data == edits[1].data
    log_minutes(redis_client, settings, edits[:1], index=False)
    apply(redis_client, edits[:1])
    late = call(client, "POST", "patch", json=edit)  # "We serve" is gone now: still the write made before
    assert late.status_code == 200 and late.json()["written_before"] == edit["minute_id"], late.text
    files = call(client, "GET", "export").json()["files"]
    folder = {**files, path: files[path].replace("We now serve", "We still serve")}
    whole = {"files": folder, "minute_id": new_minute_id()}
    imported = [call(client, "PUT", "export", json=whole) for _ in range(2)]
    assert imported[0].status_code == 202 and imported[0].json()["changes"] == imported[1].json()["changes"]
    [minute] = streamed(redis_client, settings)[4:5]
    assert minute.id == whole["minute_id"] and len(streamed(redis_client, settings)) == 6
    log_minutes(redis_client, settings, [minute], index=False)
    apply(redis_client, [minute])
    late = call(client, "PUT", "export", json=whole)  # stale versions now, but the log holds the import
    assert late.status_code == 200 and late.json()["written_before"] == whole["minute_id"], late.text
    bad = call(client, "PUT", "file", json={**body, "minute_id": "no spaces allowed"})
    assert bad.status_code in (400, 422) and "minute_id" in bad.text

"""The facts routes of the reader API (workers/api/fact_routes.py), against the embedded Valkey and the real facts pool.

Every change the API accepts is a minute on the shard streams; `settle` hands the new ones to the facts pool
(`facts_batch`, in process), as the log pool's fan-out would, and the reads then show the change.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from contracts import decode_minute, encode_minute, keys
from contracts.minute import Minute
from pvm import engines
from pvm.config import Settings
from pvm.reader import ContextReader
from pvm.stores.log import LogReader
from tests.memory_helpers import log_minutes, use_settings
from workers.api.app import create_app
from workers.api.auth import TokenFile, token_sha256
from workers.facts.pool import FactsContext, facts_batch

ALL = "every-project-token"  # every project, not the global tier
CURATOR = "curator-token"  # apollo and the global tier
APOLLO_ONLY = "apollo-token"  # apollo alone
P = "/v1/projects/apollo"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class FactsFeed:
    """Hands the minutes the API appended to the streams to the facts pool (`facts_batch`, in process)."""

    def __init__(self, connection: redis.Redis, settings: Settings) -> None:
        self.connection = connection
        self.settings = settings
        self.ctx = FactsContext.build(connection, settings)
        self.read: dict[str, bytes] = {}  # stream -> last entry id handed on
        self.seq: dict[str, int] = {}  # project -> last log seq

    def written(self) -> list[Minute]:
        """The minutes appended to the streams since the last call."""
        out: list[Minute] = []
        for shard in range(self.settings.shards):
            stream = keys.stream(shard)
            entries = self.connection.xrange(stream, min=b"(" + self.read[stream] if stream in self.read else "-")
            for entry_id, fields in entries:
                out.append(decode_minute(fields[keys.MINUTE_FIELD]))
                self.read[stream] = entry_id
        return out

    def settle(self, index: bool = False) -> list[Minute]:
        """Hand the new minutes to the facts pool, as the log pool's fan-out would; returns them.

        With `index`, they are also logged and indexed (the index pool makes their fact points).
        """
        minutes = self.written()
        if index and minutes:
            log_minutes(self.connection, self.settings, minutes)
        records: list[list[object]] = []
        for m in minutes:
            self.seq[m.project_id] = self.seq.get(m.project_id, 0) + 1
            records.append([m.id, self.seq[m.project_id], encode_minute(m), None])
        if records:
            facts_batch(self.ctx, self.connection, records)
        return minutes


@dataclass
class Stack:
    """The API over the embedded Valkey, and the facts pool behind it."""

    client: TestClient
    feed: FactsFeed

    def written(self) -> list[Minute]:
        return self.feed.written()

    def settle(self, index: bool = False) -> list[Minute]:
        return self.feed.settle(index)


def write_tokens(path: Path) -> TokenFile:
    """A tokens file with ALL, CURATOR and APOLLO_ONLY."""
    entries = [
        {"name": "all", "sha256": token_sha256(ALL), "projects": ["*"]},
        {"name": "curator", "sha256": token_sha256(CURATOR), "projects": ["apollo"], "global": True},
        {"name": "apollo", "sha256": token_sha256(APOLLO_ONLY), "projects": ["apollo"]},
    ]
    path.write_text(json.dumps({"tokens": entries}))
    return TokenFile(path, check_every_s=0)


@pytest.fixture
def stack(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Stack]:
    use_settings(settings, monkeypatch)
    reader = ContextReader(redis_client, LogReader(settings.log_dir), engines.searcher_for(settings))  # type: ignore[arg-type]
    app = create_app(reader, redis_client, settings.shards, tokens=write_tokens(tmp_path / "tokens.json"))
    with TestClient(app) as client:
        yield Stack(client, FactsFeed(redis_client, settings))
    engines.close_shared()


def assert_fact(stack: Stack, token: str = CURATOR, project: str = "apollo", **body: Any) -> str:
    r = stack.client.post(f"/v1/projects/{project}/facts", json=body, headers=bearer(token))
    assert r.status_code == 202, r.text
    return str(r.json()["fact_id"])


def listed(stack: Stack, token: str = CURATOR, project: str = "apollo", **params: Any) -> list[dict[str, Any]]:
    r = stack.client.get(f"/v1/projects/{project}/facts", params=params, headers=bearer(token))
    assert r.status_code == 200, r.text
    return list(r.json()["facts"])


# -- assert, list, show ------------------------------------------------------------------------------------------


def test_a_fact_asserted_by_hand_is_a_minute_the_pool_applies(stack: Stack) -> None:
    fid = assert_fact(stack, subject="service:auth", attribute="session_ttl", value="30 minutes", agent_id="ops")
    [minute] = stack.written()
    assert minute.event_type == "fact_asserted" and minute.project_id == "apollo" and minute.agent_id == "ops"
    assert listed(stack) == []  # the API never writes the store: nothing shows before the pool applies it
    stack.feed.read.clear()
    stack.settle()
    [fact] = listed(stack)
    assert fact["id"] == fid and fact["value"] == "30 minutes" and fact["status"] == "promoted"
    assert fact["tier_key"] == "project:apollo" and fact["source_minute_ids"] == [minute.id]
    shown = stack.client.get(f"{P}/facts/{fid}", headers=bearer(CURATOR)).json()
    assert shown == fact


def test_list_filters_by_tier_task_type_status_and_slot(stack: Stack) -> None:
    db = assert_fact(stack, subject="stack", attribute="database", value="Postgres", type="decision")
    assert_fact(stack, subject="stack", attribute="cache", value="Valkey")
    task = assert_fact(stack, subject="stack", attribute="queue", value="RQ", task_id="T-1")
    pending = assert_fact(stack, subject="stack", attribute="cdn", value="none", status="pending")
    stack.settle()
    assert {f["slot"] if "slot" in f else f["attribute"] for f in listed(stack)} == {"database", "cache"}
    assert [f["id"] for f in listed(stack, type="decision")] == [db]
    assert [f["id"] for f in listed(stack, tier="task", task="T-1")] == [task]
    assert {f["id"] for f in listed(stack, task="T-1")} >= {task, db}  # task and project tiers by default
    assert [f["id"] for f in listed(stack, status="pending")] == [pending]
    assert [f["id"] for f in listed(stack, subject="stack", attribute="database")] == [db]
    page = stack.client.get(f"{P}/facts", params={"limit": 1}, headers=bearer(CURATOR)).json()
    assert len(page["facts"]) == 1 and page["next_offset"] == 1


def iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_a_newer_value_supersedes_in_its_slot_and_as_of_returns_what_held_then(stack: Stack) -> None:
    now = datetime.now(UTC)
    old = assert_fact(stack, subject="service:auth", attribute="session_ttl", value="30 minutes")
    other_slot = assert_fact(stack, subject="service:auth", attribute="owner", value="team-a")
    stack.settle()
    # a change decided for next week: the API fits it into the slot (the old value holds until then)
    r = stack.client.post(
        f"{P}/facts",
        json={
            "subject": "service:auth",
            "attribute": "session_ttl",
            "value": "8 hours",
            "valid_from": iso(now + timedelta(days=7)),
        },
        headers=bearer(CURATOR),
    )
    assert r.status_code == 202 and [m["event_type"] for m in r.json()["also"]] == ["fact_superseded"]
    new = r.json()["fact_id"]
    stack.settle()
    assert {f["id"] for f in listed(stack)} == {old, other_slot}
    week = iso(now + timedelta(days=8))
    assert {f["id"] for f in listed(stack, as_of=week)} == {new, other_slot}  # a different slot is untouched
    assert listed(stack, as_of=iso(now - timedelta(days=1))) == []  # PVM had recorded nothing then
    history = stack.client.get(f"{P}/facts/{new}/history", headers=bearer(CURATOR)).json()["facts"]
    assert [f["id"] for f in history] == [old, new]
    assert history[0]["valid_until"] is not None and history[1]["relationships"][0]["kind"] == "supersedes"
    # the same value again is not a second fact
    again = stack.client.post(
        f"{P}/facts",
        json={"subject": "service:auth", "attribute": "session_ttl", "value": "30 minutes"},
        headers=bearer(CURATOR),
    )
    assert again.status_code == 409 and old in again.json()["error"]


def test_q_searches_the_fact_points_of_the_tiers_asked(stack: Stack) -> None:
    db = assert_fact(stack, subject="stack", attribute="database", value="Postgres", text="We use Postgres for data")
    assert_fact(stack, subject="stack", attribute="cache", value="Valkey", text="Valkey caches sessions")
    task = assert_fact(stack, subject="stack", attribute="queue", value="RQ", text="RQ runs Postgres jobs", task_id="T")
    stack.settle(index=True)
    found = stack.client.get(f"{P}/facts", params={"q": "postgres"}, headers=bearer(CURATOR)).json()
    assert [f["id"] for f in found["facts"]] == [db] and found["degraded"] is None
    both = listed(stack, q="postgres", task="T")
    assert {f["id"] for f in both} == {db, task}
    assert listed(stack, q="postgres", type="decision") == []


# -- promote and retract round trips ---------------------------------------------------------------------------


def test_a_newer_value_promoted_to_global_supersedes_the_global_one(stack: Stack) -> None:
    """The global tier follows the slot chain too: its supersession minute lives in the promoting project's log."""
    old = assert_fact(stack, subject="ci", attribute="runner", value="ubuntu-22", valid_from="2026-01-01T00:00:00Z")
    stack.settle()
    up = stack.client.post(f"{P}/facts/{old}/promote", json={"to_tier": "global"}, headers=bearer(CURATOR))
    assert up.status_code == 202, up.text
    stack.settle()
    new = assert_fact(stack, subject="ci", attribute="runner", value="ubuntu-24", valid_from="2026-06-01T00:00:00Z")
    stack.settle()
    again = stack.client.post(f"{P}/facts/{new}/promote", json={"to_tier": "global"}, headers=bearer(CURATOR))
    assert again.status_code == 202, again.text
    written = stack.settle()
    assert [m.event_type for m in written] == ["fact_tier_promoted", "fact_superseded"]
    assert {m.project_id for m in written} == {"apollo"}
    assert [f["value"] for f in listed(stack, tier="global")] == ["ubuntu-24"]


def test_promote_pending_then_up_the_tiers_and_retract(stack: Stack) -> None:
    fid = assert_fact(stack, subject="build", attribute="runner", value="ubuntu-24", task_id="T-7", status="pending")
    stack.settle()
    r = stack.client.post(f"{P}/facts/{fid}/promote", json={}, headers=bearer(CURATOR))
    assert r.status_code == 202 and r.json()["fact_id"] == fid
    [minute] = stack.settle()
    assert minute.event_type == "fact_promoted"
    assert [f["status"] for f in listed(stack, tier="task", task="T-7")] == ["promoted"]
    # promoting a promoted fact in place is a conflict; one tier up is a copy with a new id
    assert stack.client.post(f"{P}/facts/{fid}/promote", headers=bearer(CURATOR)).status_code == 409
    up = stack.client.post(f"{P}/facts/{fid}/promote", json={"to_tier": "project"}, headers=bearer(CURATOR)).json()
    stack.settle()
    project_copy = up["fact_id"]
    assert project_copy != fid
    [copy] = listed(stack, tier="project")
    assert copy["id"] == project_copy and copy["promoted_from"] == fid
    top = stack.client.post(
        f"{P}/facts/{project_copy}/promote", json={"to_tier": "global"}, headers=bearer(CURATOR)
    ).json()
    stack.settle()
    [shared] = listed(stack, tier="global")
    assert shared["id"] == top["fact_id"] and shared["tier_key"] == "global"
    # retract the global copy: the minute is apollo's, the fact leaves the current view and stays in history
    r = stack.client.post(f"{P}/facts/{shared['id']}/retract", json={"reason": "wrong"}, headers=bearer(CURATOR))
    assert r.status_code == 202
    [minute] = stack.settle()
    assert minute.event_type == "fact_retracted" and minute.project_id == "apollo"
    assert listed(stack, tier="global") == []
    assert [f["status"] for f in listed(stack, tier="global", status="retracted")] == ["retracted"]
    again = stack.client.post(f"{P}/facts/{shared['id']}/retract", headers=bearer(CURATOR))
    assert again.status_code == 409 and "retracted already" in again.json()["error"]


# -- learn and recall -----------------------------------------------------------------------------------------


def test_learn_and_recall_task_first_then_project_then_global(stack: Stack) -> None:
    for body in (
        {"key": "deploy window", "value": "Tue 10:00"},
        {"key": "deploy window", "value": "Fri 16:00", "task_id": "T-1"},
        {"key": "oncall", "value": "team-b", "tier": "global"},
    ):
        r = stack.client.post(f"{P}/learn", json=body, headers=bearer(CURATOR))
        assert r.status_code == 202, r.text
    stack.settle()
    got = stack.client.get(f"{P}/recall/deploy window", params={"task": "T-1"}, headers=bearer(CURATOR)).json()
    assert got["fact"]["value"] == "Fri 16:00" and got["searched"][0] == "task:apollo:T-1"
    got = stack.client.get(f"{P}/recall", params={"key": "deploy window"}, headers=bearer(CURATOR)).json()
    assert got["fact"]["value"] == "Tue 10:00"
    assert stack.client.get(f"{P}/recall/oncall", headers=bearer(CURATOR)).json()["fact"]["value"] == "team-b"
    # without the grant, recall never looks in the global tier
    blind = stack.client.get(f"{P}/recall/oncall", headers=bearer(APOLLO_ONLY)).json()
    assert blind["fact"] is None and "global" not in blind["searched"]
    # learning again changes the value
    stack.client.post(f"{P}/learn", json={"key": "deploy window", "value": "Wed 09:00"}, headers=bearer(CURATOR))
    stack.settle()
    stack.settle()
    assert stack.client.get(f"{P}/recall/deploy window", headers=bearer(CURATOR)).json()["fact"]["value"] == (
        "Wed 09:00"
    )
    # a retracted value is not recalled: the task's retracted, the project's answers
    in_task = stack.client.get(f"{P}/recall/deploy window", params={"task": "T-1"}, headers=bearer(CURATOR)).json()
    stack.client.post(f"{P}/facts/{in_task['fact']['id']}/retract", headers=bearer(CURATOR))
    stack.settle()
    got = stack.client.get(f"{P}/recall/deploy window", params={"task": "T-1"}, headers=bearer(CURATOR)).json()
    assert got["fact"]["value"] == "Wed 09:00" and got["fact"]["tier_key"] == "project:apollo"


# -- tenancy ----------------------------------------------------------------------------------------------------


def test_the_global_tier_needs_a_token_that_grants_it(stack: Stack) -> None:
    r = stack.client.post(f"{P}/learn", json={"key": "k", "value": "v", "tier": "global"}, headers=bearer(CURATOR))
    assert r.status_code == 202
    stack.settle()
    [fact] = listed(stack, tier="global")
    for token in (ALL, APOLLO_ONLY):
        refused = [
            stack.client.get(f"{P}/facts", params={"tier": "global"}, headers=bearer(token)),
            stack.client.get(f"{P}/recall/k", params={"tier": "global"}, headers=bearer(token)),
            stack.client.post(f"{P}/learn", json={"key": "k", "value": "w", "tier": "global"}, headers=bearer(token)),
        ]
        for answer in refused:
            assert answer.status_code == 403 and "global" in answer.json()["error"], answer.text
        # a fact of the global tier is not there for a token without the grant, nor are the tier's stats
        assert stack.client.get(f"{P}/facts/{fact['id']}", headers=bearer(token)).status_code == 404
        stats = stack.client.get("/v1/global/stats", headers=bearer(token))
        assert stats.status_code == 403 and "global grant" in stats.json()["error"], stats.text
        # and reads not told to look there never do
        assert listed(stack, token) == []
    stats = stack.client.get("/v1/global/stats", headers=bearer(CURATOR))
    assert stats.status_code == 200, stats.text
    assert stats.json()["project_id"] == "_global" and stats.json()["facts"]["by_tier"] == {"global": 1}
    assert stats.json()["minutes"] == 0 and stats.json()["chunks"] == 0  # the tier has no log of its own
    project_fact = assert_fact(stack, subject="s", attribute="a", value="v")
    stack.settle()
    up = stack.client.post(f"{P}/facts/{project_fact}/promote", json={"to_tier": "global"}, headers=bearer(ALL))
    assert up.status_code == 403
    assert stack.written() == []  # nothing refused was written


def test_another_projects_fact_is_not_found(stack: Stack) -> None:
    theirs = assert_fact(stack, ALL, project="borealis", subject="s", attribute="a", value="v")
    stack.settle()
    assert stack.client.get(f"/v1/projects/borealis/facts/{theirs}", headers=bearer(ALL)).status_code == 200
    for path in (f"{P}/facts/{theirs}", f"{P}/facts/{theirs}/history"):
        r = stack.client.get(path, headers=bearer(ALL))
        assert r.status_code == 404 and theirs in r.json()["error"]
    for action in ("promote", "retract"):
        assert stack.client.post(f"{P}/facts/{theirs}/{action}", headers=bearer(ALL)).status_code == 404
    # a token for apollo alone does not reach borealis at all
    assert stack.client.get(f"/v1/projects/borealis/facts/{theirs}", headers=bearer(APOLLO_ONLY)).status_code == 403
    assert stack.written() == []


# -- bad input ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"attribute": "a", "value": "v"}, "subject"),
        ({"subject": "s", "attribute": "a", "value": {"nested": 1}}, "value"),
        ({"subject": "s", "attribute": "a", "value": "v", "type": "rumour"}, "type"),
        ({"subject": "s", "attribute": "a", "value": "v", "confidence": 7}, "confidence"),
        ({"subject": "s", "attribute": "a", "value": "v", "tier": "global"}, "tier"),
        ({"subject": "s", "attribute": "a", "value": "v", "tier": "task"}, "task_id"),
        ({"subject": "s", "attribute": "a", "value": "v", "valid_from": "last tuesday"}, "valid_from"),
        ({"subject": "s", "attribute": "a", "value": "v", "tags": "x"}, "tags"),
        ({"subject": "s", "attribute": "a", "value": "v", "colour": "red"}, "colour"),
        ({"subject": "s", "attribute": "a", "value": "v", "status": "retracted"}, "status"),
    ],
)
def test_a_bad_assertion_is_422_naming_the_field(stack: Stack, body: dict[str, Any], field: str) -> None:
    r = stack.client.post(f"{P}/facts", json=body, headers=bearer(CURATOR))
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field and field in r.json()["error"]
    assert stack.written() == []


def test_bad_reads_and_changes_name_what_to_fix(stack: Stack) -> None:
    get = stack.client.get
    assert get(f"{P}/facts", params={"tier": "galaxy"}, headers=bearer(CURATOR)).status_code in (400, 422)
    r = get(f"{P}/facts", params={"as_of": "yesterday"}, headers=bearer(CURATOR))
    assert r.status_code in (400, 422) and "as_of" in r.json()["error"]
    r = get(f"{P}/facts", params={"tier": "task"}, headers=bearer(CURATOR))
    assert r.status_code in (400, 422) and "task" in r.json()["error"]
    r = get(f"{P}/facts/not-an-id", headers=bearer(CURATOR))
    assert r.status_code in (400, 422) and "fact_id" in r.json()["error"]
    r = stack.client.post(f"{P}/learn", json={"key": "k"}, headers=bearer(CURATOR))
    assert r.status_code == 422 and r.json()["field"] == "value"
    fid = assert_fact(stack, subject="s", attribute="a", value="v")
    stack.settle()
    r = stack.client.post(f"{P}/facts/{fid}/promote", json={"to_tier": "task"}, headers=bearer(CURATOR))
    assert r.status_code == 422 and r.json()["field"] == "to_tier"


# -- retries and promotion into a held slot -------------------------------------------------------------------


def test_a_value_that_comes_back_is_asserted_as_its_next_period_and_is_current_again(stack: Stack) -> None:
    now = datetime.now(UTC)
    slot = {"subject": "billing", "attribute": "database"}
    first = assert_fact(stack, **slot, value="Postgres", valid_from=iso(now))
    stack.settle()
    replaced = assert_fact(stack, **slot, value="MySQL", valid_from=iso(now + timedelta(days=1)))
    stack.settle()
    body = {
        **slot,
        "value": "postgres",
        "valid_from": iso(now + timedelta(days=2)),
        "minute_id": "01M8BACK00000000000000000A",
    }
    r = stack.client.post(f"{P}/facts", json=body, headers=bearer(CURATOR))
    assert r.status_code == 202, r.text
    assert [m["event_type"] for m in r.json()["also"]] == ["fact_superseded"]
    back = r.json()["fact_id"]
    assert back != first
    stack.settle()
    [current] = listed(stack, as_of=iso(now + timedelta(days=3)))
    assert (current["id"], current["value"], current["period"]) == (back, "postgres", 1)
    assert [f["value"] for f in listed(stack, as_of=iso(now + timedelta(hours=36)))] == ["MySQL"]
    history = stack.client.get(f"{P}/facts/{back}/history", headers=bearer(CURATOR)).json()["facts"]
    assert [(f["id"], f["status"]) for f in history] == [
        (first, "superseded"),
        (replaced, "superseded"),
        (back, "promoted"),
    ]
    # Holding now, the value is not asserted again; a retry of the same minute gets its first answer.
    again = stack.client.post(
        f"{P}/facts",
        json={**slot, "value": "Postgres", "valid_from": iso(now + timedelta(days=3))},
        headers=bearer(CURATOR),
    )
    assert again.status_code == 409 and back in again.json()["error"]
    retried = stack.client.post(f"{P}/facts", json=body, headers=bearer(CURATOR))
    assert retried.status_code == 202 and retried.json()["fact_id"] == back and stack.written() == []


def test_a_retried_assertion_with_its_minute_id_is_written_once(stack: Stack) -> None:
    body = {"subject": "stack", "attribute": "database", "value": "Postgres", "minute_id": "01M8RETRY0000000000000000A"}
    first = stack.client.post(f"{P}/facts", json=body, headers=bearer(CURATOR))
    assert first.status_code == 202
    again = stack.client.post(f"{P}/facts", json=body, headers=bearer(CURATOR))  # before the pool applied it
    assert again.status_code == 202 and again.json()["fact_id"] == first.json()["fact_id"]
    written = stack.settle()
    assert [m.id for m in written] == [body["minute_id"]] * 2  # the log keeps the id once
    late = stack.client.post(f"{P}/facts", json=body, headers=bearer(CURATOR))  # after: nothing more is written
    assert late.status_code == 202 and late.json()["stream_id"] is None and stack.written() == []


def test_a_retried_change_that_supersedes_writes_each_of_its_minutes_once(stack: Stack) -> None:
    """A change whose new value supersedes the one held writes two minutes; retried (the same minute_id) before the
    pool applied it, both come again under the same ids (the second derived from the first), so the log keeps one
    of each and nothing is superseded twice."""
    assert_fact(stack, subject="stack", attribute="database", value="Postgres")
    stack.settle()
    body = {"subject": "stack", "attribute": "database", "value": "MySQL", "minute_id": "01M8RETRY0000000000000000B"}
    first = stack.client.post(f"{P}/facts", json=body, headers=bearer(CURATOR))
    again = stack.client.post(f"{P}/facts", json=body, headers=bearer(CURATOR))
    assert first.status_code == again.status_code == 202 and again.json()["fact_id"] == first.json()["fact_id"]
    written = stack.settle()
    assert [m.event_type for m in written] == ["fact_asserted", "fact_superseded"] * 2
    assert [m.id for m in written[:2]] == [m.id for m in written[2:]] and written[0].id == body["minute_id"]
    assert written[1].id != body["minute_id"]
    held = stack.client.post(
        f"{P}/facts", json={**body, "minute_id": "01M8RETRY0000000000000000C"}, headers=bearer(CURATOR)
    )
    assert held.status_code == 409  # a new request for the value the slot holds now is a conflict, as before


def test_a_copy_promoted_into_a_slot_supersedes_the_value_held_there(stack: Stack) -> None:
    project_value = assert_fact(stack, subject="ci", attribute="runner", value="ubuntu-22")
    stack.settle()
    task_value = assert_fact(stack, subject="ci", attribute="runner", value="ubuntu-24", task_id="T-9")
    stack.settle()
    r = stack.client.post(f"{P}/facts/{task_value}/promote", json={"to_tier": "project"}, headers=bearer(CURATOR))
    assert r.status_code == 202 and [m["event_type"] for m in r.json()["also"]] == ["fact_superseded"]
    stack.settle()
    [current] = listed(stack, tier="project")
    assert current["id"] == r.json()["fact_id"] and current["value"] == "ubuntu-24"
    history = stack.client.get(f"{P}/facts/{project_value}/history", headers=bearer(CURATOR)).json()["facts"]
    assert [(f["value"], f["status"]) for f in history] == [("ubuntu-22", "superseded"), ("ubuntu-24", "promoted")]
    # promoting it again finds the copy: answered, nothing written
    again = stack.client.post(f"{P}/facts/{task_value}/promote", json={"to_tier": "project"}, headers=bearer(CURATOR))
    assert again.status_code == 202 and again.json()["fact_id"] == current["id"] and stack.written() == []


def test_a_copy_promoted_into_a_slot_its_value_left_is_that_values_next_period(stack: Stack) -> None:
    now = datetime.now(UTC)
    slot = {"subject": "ci", "attribute": "runner"}
    first = assert_fact(stack, **slot, value="ubuntu-22", valid_from=iso(now))
    stack.settle()
    assert_fact(stack, **slot, value="ubuntu-24", valid_from=iso(now + timedelta(days=1)))
    stack.settle()
    task_value = assert_fact(stack, **slot, value="ubuntu-22", task_id="T-9", valid_from=iso(now + timedelta(days=2)))
    stack.settle()
    r = stack.client.post(f"{P}/facts/{task_value}/promote", json={"to_tier": "project"}, headers=bearer(CURATOR))
    assert r.status_code == 202 and [m["event_type"] for m in r.json()["also"]] == ["fact_superseded"]
    stack.settle()
    [current] = listed(stack, tier="project", as_of=iso(now + timedelta(days=3)))
    assert (current["id"], current["period"], current["promoted_from"]) == (r.json()["fact_id"], 1, task_value)
    assert current["id"] != first
    again = stack.client.post(f"{P}/facts/{task_value}/promote", json={"to_tier": "project"}, headers=bearer(CURATOR))
    assert again.status_code == 202 and again.json()["fact_id"] == current["id"] and stack.written() == []


# -- tenancy, as a property ------------------------------------------------------------------------------------

PROJECTS = ("apollo", "borealis")
CHANGE = st.tuples(
    st.sampled_from(PROJECTS),
    st.sampled_from(["assert", "learn", "learn-global"]),
    st.sampled_from([None, "T-1", "T-2"]),
    st.sampled_from(["a", "b"]),
    st.sampled_from(["x", "y"]),
)


@hsettings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.lists(CHANGE, min_size=1, max_size=6))
def test_no_read_crosses_a_project_or_a_tier_key(
    stack: Stack, changes: list[tuple[str, str, str | None, str, str]]
) -> None:
    made: dict[str, str] = {}  # fact id -> the project whose minute made it
    for project, kind, task, attribute, value in changes:
        path = f"/v1/projects/{project}"
        if kind == "assert":
            body: dict[str, Any] = {"subject": "s", "attribute": attribute, "value": value, "task_id": task}
            r = stack.client.post(f"{path}/facts", json=body, headers=bearer(ALL))
            assert r.status_code in (202, 409), r.text
        else:
            body = {"key": attribute, "value": value, "task_id": task}
            token = ALL
            if kind == "learn-global":
                body = {"key": attribute, "value": value, "tier": "global"}
                token = CURATOR if project == "apollo" else ALL
            r = stack.client.post(f"{path}/learn", json=body, headers=bearer(token))
            assert r.status_code == (202 if token == CURATOR or kind == "learn" else 403), r.text
        if r.status_code == 202:
            made[r.json()["fact_id"]] = project
    stack.settle()
    for project in PROJECTS:
        own = {f"project:{project}", f"task:{project}:T-1"}
        for status in ("promoted", "superseded"):
            seen = listed(stack, ALL, project=project, task="T-1", status=status)
            assert {f["tier_key"] for f in seen} <= own
        shared = stack.client.get(f"/v1/projects/{project}/facts", params={"tier": "global"}, headers=bearer(ALL))
        assert shared.status_code == 403
    for fid, maker in made.items():
        other = next(p for p in PROJECTS if p != maker)
        fact = stack.client.get(f"/v1/projects/{maker}/facts/{fid}", headers=bearer(ALL))
        answer = stack.client.get(f"/v1/projects/{other}/facts/{fid}", headers=bearer(ALL))
        if fact.status_code == 200:  # applied (a global fact is not there for ALL: 404 in both)
            assert fact.json()["tier_key"] != "global" and answer.status_code == 404
    for fact in listed(stack, CURATOR, tier="global"):
        assert fact["tier_key"] == "global"


def test_the_context_shows_task_project_and_granted_global_facts_and_matching_rules(stack: Stack) -> None:
    bodies = [
        {"subject": "payments service", "attribute": "database", "value": "Postgres", "type": "decision"},
        {"subject": "ci", "attribute": "runner", "value": "ubuntu-24", "task_id": "T-9"},
        {"subject": "ci", "attribute": "runner", "value": "debian-13", "task_id": "T-8"},
        {
            "subject": "deploying to production",
            "attribute": "step",
            "value": "page the on-call first",
            "type": "procedure",
        },
    ]
    for body in bodies:
        assert_fact(stack, **body)
    assert (
        stack.client.post(
            f"{P}/learn", json={"key": "oncall", "value": "team-b", "tier": "global"}, headers=bearer(CURATOR)
        ).status_code
        == 202
    )
    stack.settle()
    stack.client.post(f"{P}/minutes", json={"event_type": "message", "agent_id": "a1"}, headers=bearer(CURATOR))

    def context(token: str, **params: Any) -> dict[str, Any]:
        r = stack.client.get(f"{P}/context", params={"agent_id": "a1", **params}, headers=bearer(token))
        assert r.status_code == 200, r.text
        return dict(r.json())

    granted = context(CURATOR, task_id="T-9", task="deploying the release to production")
    assert {(f["attribute"], f["value"]) for f in granted["facts"]} == {
        ("database", "Postgres"),
        ("runner", "ubuntu-24"),  # T-9's, not T-8's
        ("oncall", "team-b"),  # the global tier: this token grants it
    }
    assert [r["value"] for r in granted["rules"]] == ["page the on-call first"]
    assert set(granted["budget"]["tiers"]) == {"task", "project", "global"}
    blind = context(APOLLO_ONLY, task_id="T-9", tag=["unrelated"])
    assert {f["value"] for f in blind["facts"]} == {"Postgres", "ubuntu-24"}  # no global fact without the grant
    assert blind["rules"] == []
    assert context(APOLLO_ONLY, tag=["production"])["rules"] != []  # a tag meets the rule's condition
    text = stack.client.get(f"{P}/context", params={"agent_id": "a1", "format": "text"}, headers=bearer(CURATOR)).text
    assert "## What we know" in text and "Postgres" in text
    bad = stack.client.get(f"{P}/context", params={"agent_id": "a1", "task_id": "x" * 1000}, headers=bearer(CURATOR))
    assert bad.status_code == 400 and "task_id" in bad.json()["error"]


def test_a_pending_value_retires_nothing_until_promoted_by_hand_then_it_supersedes_the_old(stack: Stack) -> None:
    old = assert_fact(stack, subject="service:auth", attribute="session_ttl", value="30 minutes")
    stack.settle()
    r = stack.client.post(
        f"{P}/facts",
        json={"subject": "service:auth", "attribute": "session_ttl", "value": "8 hours", "status": "pending"},
        headers=bearer(CURATOR),
    )
    assert r.status_code == 202 and "also" not in r.json()  # nothing superseded by a doubtful value
    doubtful = r.json()["fact_id"]
    stack.settle()
    assert [f["id"] for f in listed(stack)] == [old]
    promoted = stack.client.post(f"{P}/facts/{doubtful}/promote", json={}, headers=bearer(CURATOR))
    assert promoted.status_code == 202 and [m["event_type"] for m in promoted.json()["also"]] == ["fact_superseded"]
    stack.settle()
    assert [f["id"] for f in listed(stack)] == [doubtful]
    history = stack.client.get(f"{P}/facts/{doubtful}/history", headers=bearer(CURATOR)).json()["facts"]
    assert {f["id"]: f["status"] for f in history} == {old: "superseded", doubtful: "promoted"}
    assert history[0]["valid_until"] == history[1]["valid_from"]


@pytest.mark.parametrize("agent", ["", 7, ["coder"]])
def test_a_change_naming_an_empty_or_non_text_agent_is_refused_naming_agent_id(stack: Stack, agent: object) -> None:
    # The document says agent_id is a non-empty string; the fuzzer found an empty one accepted (202).
    learn, assertion = {"key": "deploy window", "value": "Tue 10:00"}, {"subject": "s", "attribute": "a", "value": "v"}
    for route, body in (("learn", learn), ("facts", assertion)):
        r = stack.client.post(f"{P}/{route}", json={**body, "agent_id": agent}, headers=bearer(CURATOR))
        assert r.status_code == 422 and r.json()["field"] == "agent_id", (route, r.text)

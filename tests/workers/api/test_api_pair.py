"""POST /v1/projects/{p}/pair (workers/api): a PAIR run over the project's indexed memory, its rounds as minutes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from contracts import Minute, decode_minute, keys
from contracts.pair import PairEvaluation, PairRevision, pair_change
from pvm import engines
from pvm.config import Settings
from pvm.reader import ContextReader
from pvm.stores.log import LogReader
from tests.memory_helpers import log_minutes, use_settings
from workers.api.app import create_app
from workers.api.auth import TokenFile, token_sha256

APOLLO_ONLY = "apollo-token"
PATH = "/v1/projects/apollo/pair"
TASK = "Write the rollout plan for the payments service"
CRITERIA = ["Mentions the rollback plan", "p99 latency under 200 ms"]
OUTPUT = "We roll the payments service out on Monday behind a feature flag."
ROLLBACK = "The rollback plan is to flip the payments flag off."
LATENCY = "Load test of the payments service: p99 latency 170 ms at peak."


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def client(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[TestClient]:
    use_settings(settings, monkeypatch)
    memories = [
        Minute(project_id="apollo", event_type="decision", agent_id="ops", memory_note=ROLLBACK),
        Minute(project_id="apollo", event_type="evaluation", agent_id="qa", memory_note=LATENCY),
        *[Minute(project_id="apollo", event_type="message", memory_note=f"standup {i}") for i in range(10)],
    ]
    log_minutes(redis_client, settings, memories)
    path = tmp_path / "tokens.json"
    path.write_text(
        json.dumps({"tokens": [{"name": "a", "sha256": token_sha256(APOLLO_ONLY), "projects": ["apollo"]}]})
    )
    reader = ContextReader(redis_client, LogReader(settings.log_dir), engines.searcher_for(settings))  # type: ignore[arg-type]
    app = create_app(reader, redis_client, settings.shards, tokens=TokenFile(path, check_every_s=0))
    with TestClient(app) as test_client:
        yield test_client
    engines.close_shared()


def streamed(connection: redis.Redis, shards: int) -> list[Minute]:
    return [
        decode_minute(fields[keys.MINUTE_FIELD])
        for shard in range(shards)
        for _, fields in connection.xrange(keys.stream(shard))
    ]


def test_a_pair_run_over_http_answers_its_rounds_and_writes_them_as_minutes(
    client: TestClient, redis_client: redis.Redis, settings: Settings
) -> None:
    body: dict[str, Any] = {"task": TASK, "criteria": CRITERIA, "output": OUTPUT, "task_id": "T-7", "agent_id": "dev"}
    r = client.post(PATH, json=body, headers=bearer(APOLLO_ONLY))
    assert r.status_code == 200, r.text
    run = r.json()
    assert run["stopped"] == "target" and run["score"] == 100 and run["reached_target"] is True
    assert [x["score"] for x in run["rounds"]][-1] == 100 and len(run["rounds"]) == 2
    assert ROLLBACK in run["output"] and LATENCY in run["output"]
    found = [m["text"] for r in run["rounds"][0]["retrieved"] for m in r["memories"]]
    assert ROLLBACK in found and LATENCY in found
    written = streamed(redis_client, settings.shards)
    assert [m.event_type for m in written] == ["pair_evaluation", "pair_revision", "pair_evaluation"]
    assert [m.id for m in written] == run["minute_ids"]
    assert all(m.project_id == "apollo" and m.agent_id == "dev" and m.data["task_id"] == "T-7" for m in written)
    assert isinstance(pair_change(written[0]), PairEvaluation) and isinstance(pair_change(written[1]), PairRevision)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"task": TASK, "output": OUTPUT}, "criteria"),
        ({"task": TASK, "criteria": [], "output": OUTPUT}, "criteria"),
        ({"task": TASK, "criteria": CRITERIA, "output": 7}, "output"),
        ({"task": TASK, "criteria": CRITERIA, "output": OUTPUT, "rounds": 0}, "rounds"),
        ({"task": TASK, "criteria": CRITERIA, "output": OUTPUT, "target": 101}, "target"),
        ({"task": TASK, "criteria": CRITERIA, "output": OUTPUT, "task_id": "   "}, "task_id"),
        ({"task": TASK, "criteria": CRITERIA, "output": OUTPUT, "agent_id": "x" * 200}, "agent_id"),
        ({"task": TASK, "criteria": CRITERIA, "output": OUTPUT, "judge": "me"}, "judge"),
    ],
)
def test_a_bad_request_is_refused_naming_the_field_and_nothing_is_written(
    client: TestClient, redis_client: redis.Redis, settings: Settings, body: dict[str, Any], field: str
) -> None:
    r = client.post(PATH, json=body, headers=bearer(APOLLO_ONLY))
    assert r.status_code == 422 and r.json()["field"] == field, r.text
    assert streamed(redis_client, settings.shards) == []


def test_another_projects_token_and_a_forged_pair_minute_are_refused(client: TestClient) -> None:
    body = {"task": TASK, "criteria": CRITERIA, "output": OUTPUT}
    assert client.post("/v1/projects/borealis/pair", json=body, headers=bearer(APOLLO_ONLY)).status_code == 403
    assert client.post(PATH, json=body).status_code == 401
    assert client.post(PATH, content=b"{not json", headers=bearer(APOLLO_ONLY)).status_code == 400
    forged = {"project_id": "apollo", "event_type": "pair_evaluation", "data": {"score": 100}}
    r = client.post("/v1/minutes", json=[forged], headers=bearer(APOLLO_ONLY))
    assert r.status_code == 422 and "pair" in r.json()["errors"][0]["problem"]


def test_the_client_runs_pair_and_a_refusal_names_the_field(client: TestClient) -> None:
    from pvm.client import PVMClient, PVMRequestError
    from tests.pvm.test_client import serving

    with serving(client.app) as url, PVMClient(url, token=APOLLO_ONLY) as api:
        run = api.pair("apollo", TASK, CRITERIA, OUTPUT, task_id="T-7", rounds=2)
        assert run["max_rounds"] == 2 and run["score"] == 100 and run["rounds"][0]["gaps"]
        with pytest.raises(PVMRequestError) as refused:
            api.pair("apollo", TASK, [], OUTPUT)
        assert refused.value.status == 422 and "criteria" in str(refused.value)

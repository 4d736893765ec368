"""The OpenAPI description of the reader API: valid OpenAPI 3.1, generated from the contract, true to the app.

True to the app both ways: every route the app serves is documented, every
answer a real app gives (200s, 4xx, outages with Redis down) validates against
the schema documented for its status, and every documented status is one a
request here really gets.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi
from redis.backoff import NoBackoff
from redis.retry import Retry
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance
from starlette.applications import Starlette
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.routing import Route
from starlette.testclient import TestClient

from contracts import new_minute_id
from contracts import pair as pair_contract
from contracts.fact_changes import FACT_EVENT_TYPES, asserted_minute, retracted_minute
from contracts.facts import MAX_FACT_TEXT, MAX_TAGS, MAX_TASK_ID_LENGTH, Fact, Slot, TierKey, fact_id
from contracts.minute import MAX_NAME_LENGTH
from contracts.vectors.generate import VECTORS_DIR, load_vector, vector_paths
from pvm import defaults, engines
from pvm.config import Settings
from pvm.reader import ContextReader
from pvm.stores.facts import FactStore
from pvm.stores.log import LogReader
from tests.memory_helpers import log_minutes, use_settings
from workers.api import fact_routes, fields, memory_routes, pair_routes
from workers.api.app import create_app
from workers.api.auth import EVERY_PROJECT, TokenFile, token_sha256
from workers.api.fact_routes import FactRoutes
from workers.api.fields import Body, Field
from workers.api.memory_routes import MemoryRoutes
from workers.api.openapi import openapi_document
from workers.api.request import BadRequest, InvalidField
from workers.ops.demo import sample_session

CONTRACT_SCHEMA = VECTORS_DIR.parent / "schema" / "minute.schema.json"
TOKEN = "openapi-test-token"
TEAM_A = "team-a-openapi-token"


def validator_for(document: dict[str, Any], schema: dict[str, Any]) -> Draft202012Validator:
    """A JSON Schema 2020-12 validator of `schema` whose `#/components/...` references resolve into `document`."""
    return Draft202012Validator(document).evolve(schema=schema)


def resolved(document: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """A response or parameter object, following its `$ref` within the document."""
    while "$ref" in node:
        target: Any = document
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        node = target
    return node


def request_body_schema(document: dict[str, Any]) -> dict[str, Any]:
    body = document["paths"]["/v1/minutes"]["post"]["requestBody"]
    schema: dict[str, Any] = body["content"]["application/json"]["schema"]
    return schema


# -- the apps ------------------------------------------------------------------------------------------


@pytest.fixture
def reader(redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[ContextReader]:
    use_settings(settings, monkeypatch)
    log_minutes(redis_client, settings, list(sample_session("apollo", 40, seed=2)))
    log_minutes(redis_client, settings, list(sample_session("borealis", 10, seed=4)))
    yield ContextReader(redis_client, LogReader(settings.log_dir), engines.searcher_for(settings))  # type: ignore[arg-type]
    engines.close_shared()


APOLLO = TierKey.for_project("apollo")
# Facts of apollo the calls below find: (attribute, value, status); retracted ones are asserted, then retracted.
SEEDED = {"database": ("Postgres", "pending"), "cache": ("Valkey", "promoted"), "cdn": ("none", "retracted")}
FACT = {attribute: fact_id(APOLLO, Slot("stack", attribute), value) for attribute, (value, _) in SEEDED.items()}
OTHER_FACT = fact_id(TierKey.for_project("borealis"), Slot("stack", "database"), "Postgres")


def seed_facts(connection: redis.Redis) -> None:
    """The facts of SEEDED, applied to the store as the facts pool applies the minutes that carry them."""
    store = FactStore(connection)
    for attribute, (value, status) in SEEDED.items():
        mid = new_minute_id()
        fact = Fact.new(
            type="fact",
            text=f"stack {attribute}: {value}",
            subject="stack",
            attribute=attribute,
            value=value,
            tier_key=APOLLO,
            confidence=1.0,
            source_minute_ids=(mid,),
            status="pending" if status == "pending" else "promoted",
        )
        store.apply(asserted_minute(fact, minute_id=mid))
        if status == "retracted":
            store.apply(retracted_minute(fact, "seeded retracted"))


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def apps(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings, tmp_path: Path
) -> Iterator[dict[str, TestClient]]:
    """The app open, with a token, with project-scoped tokens, and over a Redis that is down."""
    tokens_path = tmp_path / "tokens.json"
    tokens_path.write_text(
        json.dumps({"tokens": [{"name": "team-a", "sha256": token_sha256(TEAM_A), "projects": ["apollo"]}]})
    )
    seed_facts(redis_client)
    seed_threads(redis_client, settings)
    down = redis.Redis(host="127.0.0.1", port=closed_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    down_reader = ContextReader(down, LogReader(settings.log_dir), None)
    built = {
        "open": create_app(reader, redis_client, settings.shards),
        "token": create_app(reader, redis_client, settings.shards, api_token=TOKEN),
        "scoped": create_app(reader, redis_client, settings.shards, tokens=TokenFile(tokens_path)),
        "down": create_app(down_reader, down, settings.shards),
    }
    with ExitStack() as stack:
        stack.callback(down.close)
        yield {name: stack.enter_context(TestClient(app, raise_server_exceptions=False)) for name, app in built.items()}


def seed_threads(connection: redis.Redis, settings: Settings) -> None:
    """apollo's threads, as the summarize pool makes them from its log."""
    from workers.summarize.pool import SummarizeContext, summarize_batch

    records = [[r.id, r.seq, r.minute_bytes] for r in LogReader(settings.log_dir).history("apollo")]
    summarize_batch(SummarizeContext.build(connection, settings), connection, records)


def served_document(client: TestClient) -> dict[str, Any]:
    r = client.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"})
    if r.status_code == 401:  # the scoped app knows no PVM_API_TOKEN
        r = client.get("/openapi.json", headers={"Authorization": f"Bearer {TEAM_A}"})
    assert r.status_code == 200, r.text
    document: dict[str, Any] = r.json()
    return document


# -- the document itself ---------------------------------------------------------------------------------


def test_every_variant_of_the_document_is_valid_openapi_3_1(apps: dict[str, TestClient]) -> None:
    for name, client in apps.items():
        document = served_document(client)
        assert document["openapi"].startswith("3.1."), name
        validate_openapi(document)  # raises OpenAPIValidationError naming the path in the document


def test_the_minute_component_is_the_contracts_json_schema(apps: dict[str, TestClient]) -> None:
    document = served_document(apps["open"])
    contract = json.loads(CONTRACT_SCHEMA.read_text(encoding="utf-8"))
    schemas = document["components"]["schemas"]
    # The contract's $defs become components; its $refs follow them there.
    text = json.dumps(schemas["Minute"])
    for name, definition in contract.pop("$defs").items():
        component = next(c for c, s in schemas.items() if s == definition)
        text = text.replace(f'"#/components/schemas/{component}"', f'"#/$defs/{name}"')
    # $id would make the references inside resolve against the contract's URL instead of the document.
    del contract["$id"], contract["$schema"]
    assert json.loads(text) == contract


def test_every_route_the_app_serves_is_documented_with_its_path_parameters(apps: dict[str, TestClient]) -> None:
    client = apps["open"]
    document = served_document(client)
    assert isinstance(client.app, Starlette)
    served = set()
    for route in client.app.routes:
        assert isinstance(route, Route)
        served |= {(method, route.path) for method in (route.methods or set()) - {"HEAD"}}
    documented = {(method.upper(), path) for path, operations in document["paths"].items() for method in operations}
    assert documented == served
    for path, operations in document["paths"].items():
        for operation in operations.values():
            declared = {resolved(document, p)["name"] for p in operation.get("parameters", [])}
            in_path = {part[1:-1] for part in path.split("/") if part.startswith("{")}
            assert in_path <= declared, path


def test_the_golden_vectors_are_valid_request_bodies_and_the_api_takes_them(apps: dict[str, TestClient]) -> None:
    client = apps["open"]
    document = served_document(client)
    body_schema = validator_for(document, request_body_schema(document))
    every = [load_vector(path) for path in vector_paths()]
    # Knowledge changes are written only by PVM (the facts routes): the document and the API refuse them alike.
    changes = [v for v in every if v["event_type"] in FACT_EVENT_TYPES]
    vectors = [v for v in every if v["event_type"] not in FACT_EVENT_TYPES]
    assert len(vectors) >= 10 and len(changes) == len(FACT_EVENT_TYPES)
    for vector in vectors:
        body_schema.validate({"minutes": [vector]})
        body_schema.validate([vector])
    r = client.post("/v1/minutes", json={"minutes": vectors})
    assert r.status_code == 202, r.text
    assert r.json()["ids"] == [v["id"] for v in vectors]
    for change in changes:
        assert not body_schema.is_valid({"minutes": [change]}), change["event_type"]
        answer = client.post("/v1/minutes", json={"minutes": [change]})
        assert answer.status_code == 422 and answer.json()["errors"][0]["field"] == "event_type"
    # The documented body refuses what the contract refuses: an unknown field, a bad id, another schema version.
    for bad in ({"surprise": 1}, {"id": "not an id!"}, {"v": 2}, {"event_type": "Not-Lower"}):
        minute = {**vectors[0], **bad}
        assert not body_schema.is_valid({"minutes": [minute]}), bad
        answer = client.post("/v1/minutes", json={"minutes": [minute]})
        assert answer.status_code == 422, (bad, answer.text)
        assert answer.json()["errors"][0]["field"] == next(iter(bad))


# -- real answers against the documented ones -------------------------------------------------------------


@dataclass
class Call:
    """One request to one of the apps, and the documented path it goes to."""

    app: str
    method: str
    template: str
    project: str = "apollo"
    params: dict[str, Any] = field(default_factory=dict)
    body: Any = None
    content: bytes | None = None
    token: str | None = None
    path: dict[str, str] = field(default_factory=dict)  # the path's other parameters (fact_id, key)


PROJECT_READS = {
    "/v1/projects/{project_id}/context": {"agent_id": "coder", "task": "tune the cache"},
    "/v1/projects/{project_id}/search": {"q": "conflict resolved"},
    "/v1/projects/{project_id}/recent": {"n": 5},
    "/v1/projects/{project_id}/minutes": {"ids": "nosuchid"},
    "/v1/projects/{project_id}/stats": {},
}
GOOD = {"project_id": "apollo", "event_type": "decision", "agent_id": "planner", "memory_note": "ship friday"}
BAD = {"project_id": "apollo", "event_type": "task_completed", "data": {"success_criteria_met": 250}}

FACTS = "/v1/projects/{project_id}/facts"
ONE_FACT = "/v1/projects/{project_id}/facts/{fact_id}"
FACT_READS = {
    FACTS: {"status": "promoted,pending", "limit": 5},
    ONE_FACT: {},
    ONE_FACT + "/history": {},
    "/v1/projects/{project_id}/recall": {"key": "deploy window"},
    "/v1/projects/{project_id}/recall/{key}": {},
}
FACT_CHANGES = {
    FACTS: {"subject": "stack", "attribute": "queue", "value": "RQ"},
    ONE_FACT + "/promote": {},
    ONE_FACT + "/retract": {"reason": "wrong"},
    "/v1/projects/{project_id}/learn": {"key": "deploy window", "value": "Tue 10:00"},
}
DB = {"fact_id": FACT["database"]}  # a pending fact: each change applies to it
NOWHERE = {"fact_id": "00000000-0000-5000-8000-000000000000"}
FACT_CALLS = [
    *[Call("open", "GET", t, params=p, path=DB | {"key": "oncall"}) for t, p in FACT_READS.items()],
    Call("open", "GET", FACTS, params={"q": "postgres", "as_of": "2030-01-01T00:00:00Z", "tier": "project,global"}),
    Call("open", "GET", FACTS, params={"tier": "galaxy"}),
    Call("open", "GET", FACTS, params={"as_of": "yesterday"}),
    Call("open", "GET", "/v1/projects/{project_id}/recall"),  # no key
    Call("open", "GET", "/v1/projects/{project_id}/recall/{key}", params={"tier": "galaxy"}, path={"key": "k"}),
    *[Call("open", "GET", t, path={"fact_id": "not-a-fact-id"}) for t in (ONE_FACT, ONE_FACT + "/history")],
    *[Call("open", "GET", t, path=NOWHERE) for t in (ONE_FACT, ONE_FACT + "/history")],
    *[Call("open", "GET", t, path={"fact_id": OTHER_FACT}) for t in (ONE_FACT, ONE_FACT + "/history")],
    *[Call("open", "POST", t, body=b, path=DB) for t, b in FACT_CHANGES.items()],
    *[Call("open", "POST", t, content=b"{not json", path=DB) for t in FACT_CHANGES],
    *[Call("open", "POST", t, body={"surprise": 1}, path=DB) for t in FACT_CHANGES],
    *[Call("open", "POST", t, body={}, path=NOWHERE) for t in (ONE_FACT + "/promote", ONE_FACT + "/retract")],
    Call("open", "POST", FACTS, body={"subject": "stack", "attribute": "cache", "value": "Valkey"}),  # held: 409
    Call("open", "POST", ONE_FACT + "/promote", path={"fact_id": FACT["cache"]}),  # promoted already: 409
    Call("open", "POST", ONE_FACT + "/retract", path={"fact_id": FACT["cdn"]}),  # retracted already: 409
    *[Call("token", "GET", t, params=p, path=DB | {"key": "k"}) for t, p in FACT_READS.items()],
    *[Call("token", "POST", t, body=b, path=DB) for t, b in FACT_CHANGES.items()],
    *[Call("token", "POST", t, body=b, path=DB, token=TOKEN) for t, b in FACT_CHANGES.items()],
    *[Call("token", "GET", t, params=p, path=DB | {"key": "k"}, token=TOKEN) for t, p in FACT_READS.items()],
    *[
        Call("scoped", "GET", t, project="borealis", params=p, path=DB | {"key": "k"}, token=TEAM_A)
        for t, p in FACT_READS.items()
    ],
    *[Call("scoped", "POST", t, project="borealis", body=b, path=DB, token=TEAM_A) for t, b in FACT_CHANGES.items()],
    *[Call("scoped", "GET", t, params=p, path=DB | {"key": "k"}, token=TEAM_A) for t, p in FACT_READS.items()],
    Call("scoped", "GET", FACTS, params={"tier": "global"}, token=TEAM_A),  # no global grant: 403
    Call("open", "GET", "/v1/global/stats"),  # 200
    Call("token", "GET", "/v1/global/stats"),  # 401
    Call("scoped", "GET", "/v1/global/stats", token=TEAM_A),  # no global grant: 403
    Call("down", "GET", "/v1/global/stats"),  # 503
    Call(
        "scoped",
        "POST",
        "/v1/projects/{project_id}/learn",
        body={"key": "k", "value": "v", "tier": "global"},
        token=TEAM_A,
    ),
    *[Call("down", "GET", t, params=p, path=DB | {"key": "k"}) for t, p in FACT_READS.items()],
    *[Call("down", "POST", t, body=b, path=DB) for t, b in FACT_CHANGES.items()],
]

THREAD = "/v1/projects/{project_id}/threads/{thread}"
THREAD_CALLS = [
    Call("open", "GET", THREAD, path={"thread": "tune-cache-thread"}, params={"recent": 3}),
    Call("open", "GET", THREAD, path={"thread": "never-seen"}),  # 404
    Call("open", "GET", THREAD, path={"thread": "task:"}),  # 400
    Call("token", "GET", THREAD, path={"thread": "project"}),  # 401
    Call("scoped", "GET", THREAD, project="borealis", path={"thread": "project"}, token=TEAM_A),  # 403
    Call("down", "GET", THREAD, path={"thread": "project"}),  # 503
]

MEMORY = "/v1/projects/{project_id}/memory"
# The database fact's file (workers.agent.memory_files.fact_path) and a new fact's.
DB_FILE = f"facts/project/fact/stack-database-{FACT['database'][:8]}.md"
NEW_FILE = "---\nsubject: stack\nattribute: broker\nvalue: Valkey\n---\n"
MEMORY_READS = {
    MEMORY + "/export": {},
    MEMORY + "/files": {"prefix": "facts/project"},
    MEMORY + "/file": {"path": DB_FILE},
}
MEMORY_WRITES = [
    ("PUT", MEMORY + "/export", {"files": {"facts/project/new.md": NEW_FILE}}),
    ("PUT", MEMORY + "/file", {"path": "facts/project/new.md", "text": NEW_FILE}),
    ("POST", MEMORY + "/patch", {"path": DB_FILE, "old": "stack database: Postgres", "new": "stack db: Postgres"}),
    ("POST", MEMORY + "/append", {"path": DB_FILE, "text": "More."}),
]
MEMORY_CALLS = [
    *[Call("open", "GET", t, params=p) for t, p in MEMORY_READS.items()],
    *[Call("open", "GET", t, project="-not-an-id", params=p) for t, p in MEMORY_READS.items()],
    Call("open", "GET", MEMORY + "/files", params={"prefix": "../"}),
    Call("open", "GET", MEMORY + "/file"),  # no path: 400
    Call("open", "GET", MEMORY + "/file", params={"path": "facts/none.md"}),  # 404
    # A project with no memory yet: its whole-folder import asserts one fact and retracts nothing.
    Call("open", "PUT", MEMORY + "/export", project="empty", body=MEMORY_WRITES[0][2]),  # 202
    Call("open", "PUT", MEMORY + "/export", project="empty", params={"dry_run": "true"}, body={"files": {}}),  # 200
    Call("open", "PUT", MEMORY + "/export", params={"dry_run": "maybe"}, body={"files": {}}),  # 400
    Call("open", "PUT", MEMORY + "/export", body={"files": {"episodes/x/1-y.md": NEW_FILE}}),  # read-only: 409
    Call("open", "PUT", MEMORY + "/export", body={"files": []}),  # 422
    *[Call("open", m, t, body=b) for m, t, b in MEMORY_WRITES[1:]],  # 202
    *[Call("open", m, t, body={**b, "path": "../x.md"}) for m, t, b in MEMORY_WRITES[1:]],  # 400
    *[Call("open", m, t, body={"surprise": 1}) for m, t, _ in MEMORY_WRITES[1:]],  # 422
    Call("open", "POST", MEMORY + "/patch", body={"path": DB_FILE, "old": "stack database", "new": "stack database"}),
    Call("open", "POST", MEMORY + "/append", body={"path": DB_FILE, "text": ""}),  # no change: 200
    Call("open", "POST", MEMORY + "/patch", body={"path": DB_FILE, "old": FACT["database"], "new": FACT["cache"]}),
    *[Call("open", m, t, body={**b, "path": "facts/none.md"}) for m, t, b in MEMORY_WRITES[2:]],  # 404
    Call(
        "open", "PUT", MEMORY + "/file", body={"path": "facts/elsewhere.md", "text": f"---\nid: {FACT['cache']}\n---\n"}
    ),
    *[Call("token", "GET", t, params=p) for t, p in MEMORY_READS.items()],
    *[Call("token", m, t, body=b) for m, t, b in MEMORY_WRITES],
    *[Call("scoped", "GET", t, project="borealis", params=p, token=TEAM_A) for t, p in MEMORY_READS.items()],
    *[Call("scoped", m, t, project="borealis", body=b, token=TEAM_A) for m, t, b in MEMORY_WRITES],
    *[Call("down", "GET", t, params=p) for t, p in MEMORY_READS.items()],
    *[Call("down", m, t, body=b) for m, t, b in MEMORY_WRITES],
]
PAIR = "/v1/projects/{project_id}/pair"
PAIR_BODY = {"task": "Pick the cache", "criteria": ["Names the cache", "Does not mention Memcached"], "output": "x"}
PAIR_CALLS = [
    Call("open", "POST", PAIR, body={**PAIR_BODY, "task_id": "T-1", "agent_id": "coder", "rounds": 2, "target": 90}),
    Call("open", "POST", PAIR, content=b"{not json"),  # 400
    Call("open", "POST", PAIR, body={**PAIR_BODY, "criteria": []}),  # 422
    Call("token", "POST", PAIR, body=PAIR_BODY),  # 401
    Call("scoped", "POST", PAIR, project="borealis", body=PAIR_BODY, token=TEAM_A),  # 403
    Call("down", "POST", PAIR, body=PAIR_BODY),  # 503
]

CALLS = [
    *PAIR_CALLS,
    Call("open", "GET", "/healthz"),
    Call("open", "GET", "/openapi.json"),
    Call("open", "POST", "/v1/minutes", body={"minutes": [GOOD, {**GOOD, "id": "client-chosen-id-1"}]}),
    Call("open", "POST", "/v1/minutes", body=[GOOD]),
    Call("open", "POST", "/v1/minutes", content=b"{not json"),
    Call("open", "POST", "/v1/minutes", body={"minutes": []}),
    Call("open", "POST", "/v1/minutes", body={"minutes": [GOOD, BAD]}),
    Call("open", "POST", "/v1/minutes", content=b" " * (defaults.API_MAX_BODY_BYTES + 1)),
    *[Call("open", "GET", t, params=p) for t, p in PROJECT_READS.items()],
    Call("open", "GET", "/v1/projects/{project_id}/context", params={"agent_id": "coder", "format": "text"}),
    Call("open", "GET", "/v1/projects/{project_id}/minutes", project="borealis", params={"ids": "a,b"}),
    *[Call("open", "GET", t) for t in PROJECT_READS],  # each misses a required parameter, or reads the default
    *[Call("open", "GET", t, project="-not-an-id", params=p) for t, p in PROJECT_READS.items()],
    Call("open", "GET", "/v1/projects/{project_id}/recent", params={"n": 0}),
    Call("open", "GET", "/v1/projects/{project_id}/search", params={"q": "x", "min_composite": "2"}),
    *[Call("token", "GET", t, params=p) for t, p in PROJECT_READS.items()],
    *[Call("token", "GET", t, params=p, token=TOKEN) for t, p in PROJECT_READS.items()],
    Call("token", "GET", "/openapi.json"),
    Call("token", "GET", "/healthz"),
    Call("token", "POST", "/v1/minutes", body=[GOOD]),
    Call("token", "POST", "/v1/minutes", body=[GOOD], token="a wrong token"),
    *[Call("scoped", "GET", t, project="borealis", params=p, token=TEAM_A) for t, p in PROJECT_READS.items()],
    *[Call("scoped", "GET", t, params=p, token=TEAM_A) for t, p in PROJECT_READS.items()],
    Call("scoped", "POST", "/v1/minutes", body=[GOOD, {**GOOD, "project_id": "borealis"}], token=TEAM_A),
    Call("scoped", "POST", "/v1/minutes", body=[GOOD], token=TEAM_A),
    *FACT_CALLS,
    *THREAD_CALLS,
    *MEMORY_CALLS,
    Call("down", "GET", "/healthz"),
    Call("down", "GET", "/openapi.json"),
    Call("down", "POST", "/v1/minutes", body=[GOOD]),
    *[Call("down", "GET", t, params=p) for t, p in PROJECT_READS.items()],
]


def send(client: TestClient, call: Call, headers: dict[str, str] | None = None) -> Any:
    headers = dict(headers or {})
    if call.token is not None:
        headers["Authorization"] = f"Bearer {call.token}"
    path = call.template.replace("{project_id}", call.project)
    for name, value in call.path.items():
        path = path.replace("{" + name + "}", value)
    if call.content is not None:
        headers["Content-Type"] = "application/json"
        return client.request(call.method, path, params=call.params, content=call.content, headers=headers)
    return client.request(call.method, path, params=call.params, json=call.body, headers=headers)


def check_answer(document: dict[str, Any], method: str, template: str, response: Any) -> None:
    """The answer's status is documented for the operation, and its body and headers are as documented."""
    operation = document["paths"][template][method.lower()]
    status = str(response.status_code)
    assert status in operation["responses"], (method, template, status, response.text[:300])
    documented = resolved(document, operation["responses"][status])
    for header in documented.get("headers", {}):
        assert header.lower() in response.headers, (method, template, status, header)
    if "content" not in documented:
        assert not response.content, (method, template, status)
        return
    media_type = response.headers["content-type"].split(";")[0]
    assert media_type in documented["content"], (method, template, status, media_type)
    schema = documented["content"][media_type]["schema"]
    body = response.json() if media_type == "application/json" else response.text
    errors = sorted(validator_for(document, schema).iter_errors(body), key=str)
    assert not errors, (method, template, status, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:3]])


def test_real_answers_validate_and_every_documented_status_is_answered(
    apps: dict[str, TestClient], reader: ContextReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    documents = {name: served_document(client) for name, client in apps.items()}
    answered: set[tuple[str, str, str]] = set()
    for call in CALLS:
        response = send(apps[call.app], call)
        check_answer(documents[call.app], call.method, call.template, response)
        answered.add((call.method.lower(), call.template, str(response.status_code)))

    # The memory tools on files the export holds: one written back unchanged (200), a derived one appended to (409).
    db_text = send(apps["open"], Call("open", "GET", MEMORY + "/file", params={"path": DB_FILE})).json()["text"]
    listed = send(apps["open"], Call("open", "GET", MEMORY + "/files")).json()["files"]
    derived = next(f["path"] for f in listed if f["read_only"])
    for call in (
        Call("open", "PUT", MEMORY + "/file", body={"path": DB_FILE, "text": db_text}),
        Call("open", "POST", MEMORY + "/append", body={"path": derived, "text": "an edit"}),
    ):
        response = send(apps["open"], call)
        check_answer(documents["open"], call.method, call.template, response)
        answered.add((call.method.lower(), call.template, str(response.status_code)))

    # A bug in a handler: 500 with a request id, on every route alike (the one wrapper answers it).
    def broken(project_id: str, n: int = 50) -> list[dict[str, Any]]:
        raise ValueError("a bug in the reader")

    monkeypatch.setattr(reader, "get_recent", broken)
    crash = Call("open", "GET", "/v1/projects/{project_id}/recent")
    response = send(apps["open"], crash, headers={"X-Request-ID": "req-openapi-1"})
    assert response.status_code == 500 and response.json()["request_id"] == "req-openapi-1"
    check_answer(documents["open"], crash.method, crash.template, response)

    documented = {
        (method, path, status)
        for document in documents.values()
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        for status in operation["responses"]
        if status != "500"
    }
    assert documented - answered == set(), "documented statuses no request here got"


def test_numeric_query_bounds_are_the_ones_the_api_enforces(apps: dict[str, TestClient]) -> None:
    client = apps["open"]
    document = served_document(client)
    checked = 0
    for template, operations in document["paths"].items():
        parameters = [resolved(document, p) for p in operations.get("get", {}).get("parameters", [])]
        example = {p["name"]: p["example"] for p in parameters if p["in"] == "query" and p.get("required")}
        path = template.replace("{project_id}", "apollo")
        for parameter in parameters:
            schema, name = parameter["schema"], parameter["name"]
            if parameter["in"] != "query" or "minimum" not in schema:
                continue
            low, high = schema["minimum"], schema["maximum"]
            step = 1 if schema["type"] == "integer" else 0.001
            for value, ok in ((low, True), (high, True), (low - step, False), (high + step, False)):
                r = client.get(path, params={**example, name: value})
                assert (r.status_code == 200) == ok, (template, name, value, r.text[:200])
                if not ok:
                    assert r.status_code == 400 and name in r.json()["error"], (template, name, value)
            checked += 1
    assert checked >= 6  # budget_tokens, k, since_ms, until_ms, min_composite, n


# -- parameters and bodies from the routes' field specs ------------------------------------------------------------

MEMORY_FILE = MEMORY + "/file"
# Each route's fields, as its module declares them: what the handler parses (besides project_id and X-Request-ID, which
# every route shares); a route left out takes nothing else.
SPECS: dict[tuple[str, str], tuple[tuple[Field, ...], Body | None]] = {
    ("get", "/v1/projects/{project_id}/context"): (fields.CONTEXT_PARAMS, None),
    ("get", "/v1/projects/{project_id}/search"): (fields.SEARCH_PARAMS, None),
    ("get", "/v1/projects/{project_id}/recent"): (fields.RECENT_PARAMS, None),
    ("get", THREAD): (fields.THREAD_PARAMS, None),
    ("get", "/v1/projects/{project_id}/minutes"): (fields.BY_IDS_PARAMS, None),
    ("get", FACTS): (fact_routes.LIST_PARAMS, None),
    ("post", FACTS): ((), fact_routes.ASSERT_BODY),
    ("get", ONE_FACT): ((fact_routes.FACT_ID,), None),
    ("get", ONE_FACT + "/history"): ((fact_routes.FACT_ID,), None),
    ("post", ONE_FACT + "/promote"): ((fact_routes.FACT_ID,), fact_routes.PROMOTE_BODY),
    ("post", ONE_FACT + "/retract"): ((fact_routes.FACT_ID,), fact_routes.RETRACT_BODY),
    ("post", "/v1/projects/{project_id}/learn"): ((), fact_routes.LEARN_BODY),
    ("get", "/v1/projects/{project_id}/recall"): (fact_routes.RECALL_PARAMS, None),
    ("get", "/v1/projects/{project_id}/recall/{key}"): (fact_routes.RECALL_PATH_PARAMS, None),
    ("put", MEMORY + "/export"): ((memory_routes.DRY_RUN,), memory_routes.IMPORT_BODY),
    ("get", MEMORY + "/files"): ((memory_routes.PREFIX,), None),
    ("get", MEMORY_FILE): ((memory_routes.FILE,), None),
    ("put", MEMORY_FILE): ((), memory_routes.WRITE_BODY),
    ("post", MEMORY + "/patch"): ((), memory_routes.PATCH_BODY),
    ("post", MEMORY + "/append"): ((), memory_routes.APPEND_BODY),
    ("post", PAIR): ((), pair_routes.PAIR_BODY),
}
SHARED = {("path", "project_id"), ("header", "X-Request-ID")}


def test_every_route_documents_exactly_the_fields_its_module_declares() -> None:
    document = openapi_document()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if (method, path) == ("post", "/v1/minutes"):
                continue  # the contract's NewMinute, in the batch envelope: not a field spec
            params, body = SPECS.get((method, path), ((), None))
            own = [p for p in operation.get("parameters", []) if (p["in"], p["name"]) not in SHARED]
            assert own == [spec.parameter() for spec in params], (method, path)
            assert operation.get("requestBody") == (body.request_body() if body else None), (method, path)


def test_the_specs_limits_are_the_contracts_constants() -> None:
    assert (fact_routes.LIMIT.value.minimum, fact_routes.LIMIT.value.maximum) == (1, defaults.API_FACTS_MAX)
    assert fact_routes.LIMIT.value.default == defaults.API_FACTS_LIMIT
    assert fact_routes.OFFSET.value.maximum == defaults.API_FACTS_MAX_OFFSET
    assert fact_routes.TASK.value.max_length == MAX_TASK_ID_LENGTH
    assert fact_routes.ASSERT_BODY.field("subject").value.max_length == MAX_NAME_LENGTH
    assert fact_routes.ASSERT_BODY.field("text").value.max_length == MAX_FACT_TEXT
    assert fact_routes.ASSERT_BODY.field("tags").value.max_items == MAX_TAGS
    assert pair_routes.PAIR_BODY.field("criteria").value.max_items == pair_contract.MAX_CRITERIA
    assert pair_routes.PAIR_BODY.field("rounds").value.maximum == pair_contract.MAX_ROUNDS
    assert memory_routes.FILE.value.max_length == defaults.MEMORY_PATH_MAX_CHARS


class RecordedParams(QueryParams):
    """Query parameters that remember every name a handler looked up."""

    looked_up: set[str]

    def __getitem__(self, key: Any) -> str:
        self.looked_up.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        self.looked_up.add(key)
        return super().__contains__(key)

    def getlist(self, key: Any) -> list[str]:
        self.looked_up.add(key)
        return super().getlist(key)


class RecordingRequest(Request):
    """A GET request whose query parameters record what is read."""

    def __init__(self, query: dict[str, str], path_params: dict[str, str] | None = None) -> None:
        super().__init__(
            {
                "type": "http",
                "method": "GET",
                "path": "/",
                "query_string": urlencode(query).encode(),
                "headers": [],
                "path_params": {"project_id": "apollo", **(path_params or {})},
            }
        )
        self.recorded = RecordedParams(urlencode(query))
        self.recorded.looked_up = set()

    @property
    def query_params(self) -> QueryParams:
        return self.recorded


def read_by(handler: Any, request: RecordingRequest, body: bytes = b"") -> set[str]:
    """The query parameters `handler` read from `request` (an answer it refuses still counts what it read)."""
    with suppress(BadRequest):
        handler(request, body, EVERY_PROJECT)
    return request.recorded.looked_up


def query_names(specs: tuple[Field, ...]) -> set[str]:
    return {spec.name for spec in specs if spec.where == "query"}


def test_the_facts_and_memory_routes_read_exactly_the_query_parameters_their_specs_document(
    redis_client: redis.Redis,
) -> None:
    facts = FactRoutes(FactStore(redis_client), None, lambda minutes: [])
    memory = MemoryRoutes(redis_client, lambda minutes: [])
    checks = [
        (facts.list_facts, RecordingRequest({}), fact_routes.LIST_PARAMS),
        (facts.recall, RecordingRequest({"key": "k"}), fact_routes.RECALL_PARAMS),
        (facts.recall, RecordingRequest({}, {"key": "k"}), fact_routes.RECALL_PATH_PARAMS),
        (facts.show, RecordingRequest({}, {"fact_id": FACT["cache"]}), (fact_routes.FACT_ID,)),
        (facts.history, RecordingRequest({}, {"fact_id": FACT["cache"]}), (fact_routes.FACT_ID,)),
        (memory.list_files, RecordingRequest({}), (memory_routes.PREFIX,)),
        (memory.read, RecordingRequest({"path": DB_FILE}), (memory_routes.FILE,)),
    ]
    for handler, request, specs in checks:
        assert read_by(handler, request) == query_names(specs), handler.__name__
    imported = read_by(memory.import_files, RecordingRequest({}), b'{"files": {}}')
    assert imported == query_names((memory_routes.DRY_RUN,))


def test_every_body_route_takes_exactly_the_fields_its_document_lists(apps: dict[str, TestClient]) -> None:
    client = apps["open"]
    document = served_document(client)
    checked = 0
    for (method, template), (_, body) in SPECS.items():
        if body is None:
            continue
        path = template.replace("{project_id}", "apollo").replace("{fact_id}", FACT["database"])
        r = client.request(method.upper(), path, json={"surprise": 1})
        assert r.status_code == 422 and r.json()["field"] == "surprise", (method, template, r.text)
        schema = document["paths"][template][method]["requestBody"]["content"]["application/json"]["schema"]
        assert r.json()["error"].endswith("fields: " + ", ".join(schema["properties"])), (method, template)
        checked += 1
    assert checked == 9  # 4 facts changes, 4 memory writes, PAIR


def test_a_limit_changed_in_a_spec_changes_the_document_and_the_parsing() -> None:
    narrower = replace(fact_routes.LIMIT, value=replace(fact_routes.LIMIT.value, maximum=7))
    assert narrower.parameter()["schema"]["maximum"] == 7
    assert narrower.integer(RecordingRequest({"limit": "7"})) == 7
    with pytest.raises(BadRequest, match=r"query parameter limit=8 must be between 1 and 7"):
        narrower.integer(RecordingRequest({"limit": "8"}))

    fewer = replace(fact_routes.TYPE, value=fields.choices(("fact",)))
    assert fewer.parameter()["schema"]["items"]["enum"] == ["fact"]
    assert fewer.choices(RecordingRequest({"type": "fact"})) == ("fact",)
    with pytest.raises(BadRequest, match=r"query parameter type='decision' must be one of fact"):
        fewer.choices(RecordingRequest({"type": "decision"}))

    body = fact_routes.RETRACT_BODY
    without_reason = replace(body, fields=tuple(f for f in body.fields if f.name != "reason"))
    assert "reason" in body.schema()["properties"] and "reason" not in without_reason.schema()["properties"]
    assert body.parse(b'{"reason": "wrong"}') == {"reason": "wrong"}
    with pytest.raises(InvalidField, match=r"body field reason: is not a field of this request; fields: agent_id"):
        without_reason.parse(b'{"reason": "wrong"}')


# -- fuzzing from the document ------------------------------------------------------------------------------

# Per operation and generation mode (PVM_FUZZ_EXAMPLES; 8 take about 11 s here). A strategy over the whole
# document drew some operations never (it picks an operation first, then its data), so each is fuzzed alone.
FUZZ_EXAMPLES = int(os.environ.get("PVM_FUZZ_EXAMPLES", "8"))


@pytest.mark.slow
def test_schemathesis_fuzzing_from_the_document_finds_nothing(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings
) -> None:
    """Requests generated from the document, valid and invalid, get the answers it documents and never a 500."""
    app = create_app(reader, redis_client, settings.shards)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    answered: set[tuple[str, str]] = set()

    def check(case: Any) -> None:
        excluded = []
        if case.method in ("POST", "PUT"):
            # The contract checks what JSON Schema cannot say (data nesting, calendar dates, lone
            # surrogates, an id once per batch, 64 KiB encoded), so a schema-valid minute may get 422;
            # so does a Markdown memory file's front-matter (PUT .../memory/file, .../memory/export).
            excluded.append(positive_data_acceptance)
        response = case.call()
        sent = parse_qs(urlsplit(response.request.url).query, keep_blank_values=True)
        if "task" in sent.get("tier", ()) and not sent.get("task"):
            # The facts reads need a task id with tier=task (each task is a tier key of its own), a rule
            # across two parameters JSON Schema cannot say: the document says it in words, the answer is 400.
            excluded.append(positive_data_acceptance)
        if any(value == "" for values in sent.values() for value in values):
            # An optional parameter sent empty reads as left out (the document says so in words).
            excluded.append(negative_data_rejection)
        case.validate_response(response, excluded_checks=excluded)
        answered.add((case.method, case.path))

    fuzzed: set[tuple[str, str]] = set()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            if mode is GenerationMode.NEGATIVE and not (operation.path_parameters or operation.query or operation.body):
                continue  # nothing to make invalid
            fuzz = given(case=operation.as_strategy(generation_mode=mode))(check)
            hsettings(
                max_examples=FUZZ_EXAMPLES,
                derandomize=True,  # the same requests every run: a failure here is a finding, never a flake
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )(fuzz)()
        fuzzed.add((operation.method.upper(), operation.path))
    operations = {(m.upper(), p) for p, ops in schema.raw_schema["paths"].items() for m in ops}
    assert operations - fuzzed == {("GET", "/openapi.json")}  # the document itself: schemathesis leaves it out
    assert fuzzed - answered == set()

"""The console over a real Valkey, log and embedded engine: two projects of logged minutes, and the app with and
without tokens (a tokens file scoping team-a to apollo; ops to every project)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from starlette.testclient import TestClient

from pvm.config import Settings
from pvm.reader import ContextReader
from tests.workers.api.test_api import write_tokens
from workers.api.app import create_app
from workers.api.auth import TokenFile
from workers.console.routes import CONSOLE

TEAM_A = "team-a-console-token"
OPS = "ops-console-token"
# What a browser sends with a form of this console (TestClient's base URL is http://testserver).
ORIGIN = {"Origin": "http://testserver"}


@pytest.fixture
def console(reader: ContextReader, redis_client: redis.Redis, settings: Settings) -> Iterator[TestClient]:
    """The console of an API that asks for no token."""
    with TestClient(create_app(reader, redis_client, settings.shards, pages=CONSOLE, settings=settings)) as c:
        yield c


@pytest.fixture
def scoped_console(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings, tmp_path: Path
) -> Iterator[TestClient]:
    """The console of an API with a tokens file: team-a reaches apollo only, ops every project."""
    path = tmp_path / "tokens.json"
    write_tokens(path, ("team-a", TEAM_A, ["apollo"]), ("ops", OPS, ["*"]))
    app = create_app(
        reader, redis_client, settings.shards, tokens=TokenFile(path, check_every_s=0), pages=CONSOLE, settings=settings
    )
    with TestClient(app) as c:
        yield c


def sign_in(client: TestClient, token: str) -> None:
    answer = client.post("/ui/login", data={"token": token, "next": "/ui"}, headers=ORIGIN, follow_redirects=False)
    assert answer.status_code == 303, answer.text

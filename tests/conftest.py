"""Shared fixtures: a real Redis server (embedded Valkey unless PVM_TEST_REDIS_URL is set) and isolated settings.

The suite never reads production's PVM_REDIS_URL: it is taken out of the environment
for the whole session, so no test and no child process a test starts can reach it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from pvm.config import Settings
from tests.redis_under_test import PRODUCTION_URL_ENV, TEST_URL_ENV, contents_refusal, redacted, url_refusal
from tests.workers.jobs import TEST_JOB_FUNCTIONS
from workers.embedded import EmbeddedRedis

# The OpenAI-compatible server (fixture `openai_server`) every test module may use.
pytest_plugins = ["tests.openai_server"]

production_url = pytest.StashKey[str | None]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[production_url] = os.environ.pop(PRODUCTION_URL_ENV, None)
    url = os.environ.get(TEST_URL_ENV)
    refusal = url_refusal(url, os.environ) if url else None
    if refusal:
        raise pytest.UsageError(refusal)


def pytest_unconfigure(config: pytest.Config) -> None:
    url = config.stash.get(production_url, None)
    if url is not None:
        os.environ[PRODUCTION_URL_ENV] = url


def pytest_report_header(config: pytest.Config) -> list[str]:
    url = os.environ.get(TEST_URL_ENV)
    lines = [f"redis: {TEST_URL_ENV}={redacted(url)} (flushed by the tests)" if url else "redis: an embedded Valkey"]
    if config.stash.get(production_url, None):
        lines.append(f"redis: {PRODUCTION_URL_ENV} is set and ignored (the tests and their children do not see it)")
    return lines


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # -q hides the header: a server that is not the embedded one is worth a line even then.
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or reporter.showheader:
        return
    if os.environ.get(TEST_URL_ENV) or session.config.stash.get(production_url, None):
        for line in pytest_report_header(session.config):
            reporter.write_line(line)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get(TEST_URL_ENV)
    if url:
        refusal = contents_refusal(url)
        if refusal:
            pytest.exit(refusal, returncode=pytest.ExitCode.USAGE_ERROR)
        yield url
        return
    server = EmbeddedRedis().start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def settings(tmp_path: Path, redis_url: str, redis_client: redis.Redis) -> Settings:
    return Settings(
        redis_url=redis_url,
        shards=4,
        home=tmp_path,
        log_dir=tmp_path / "log",
        spool_dir=tmp_path / "spool",
        extra_job_functions=TEST_JOB_FUNCTIONS,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

"""Shared fixtures: a real Redis-protocol server (embedded Valkey unless PVM_REDIS_URL is set) and isolated settings."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from pvm.config import Settings
from tests.workers.jobs import TEST_JOB_FUNCTIONS
from workers.embedded import EmbeddedRedis

# The OpenAI-compatible server (fixture `openai_server`) every test module may use.
pytest_plugins = ["tests.openai_server"]


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("PVM_REDIS_URL")
    if url:
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

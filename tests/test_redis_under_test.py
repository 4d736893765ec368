"""The suite's own Redis: PVM_TEST_REDIS_URL or an embedded Valkey, never production's PVM_REDIS_URL."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from pvm.config import Settings
from tests.redis_under_test import (
    ALLOW_REMOTE_ENV,
    PRODUCTION_URL_ENV,
    TEST_URL_ENV,
    contents_refusal,
    is_loopback,
    redacted,
    url_refusal,
)
from workers.runtime.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = "tests/test_redis_under_test.py::test_the_suite_sees_no_production_url_and_owns_its_database"
SENTINEL = "production:sentinel"


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://127.8.9.10:6379/0",
        "redis://localhost:6379/15",
        "redis://[::1]:6379/0",
        "redis://[::ffff:127.0.0.1]:6379/0",
        "rediss://:secret@127.0.0.1:6380/0",
        "unix:///tmp/valkey.sock?db=0",
        "redis:///0",
    ],
)
def test_loopback_servers_are_accepted(url: str) -> None:
    assert is_loopback(url)
    assert url_refusal(url, {}) is None


@pytest.mark.parametrize(
    "url",
    [
        "redis://10.0.0.5:6379/0",
        "redis://192.0.2.1:6379/0",
        "redis://redis.example.com:6379/0",
        "redis://127.0.0.1.example.com:6379/0",
        "redis://[2001:db8::1]:6379/0",
        "rediss://:secret@prod-redis:6380/0",
    ],
)
def test_other_hosts_are_refused_unless_allowed(url: str) -> None:
    refusal = url_refusal(url, {})
    assert refusal is not None
    assert f"{TEST_URL_ENV}=" in refusal and f"{ALLOW_REMOTE_ENV}=1" in refusal
    assert "secret" not in refusal
    assert url_refusal(url, {ALLOW_REMOTE_ENV: "1"}) is None
    assert url_refusal(url, {ALLOW_REMOTE_ENV: "yes"}) is not None  # only the documented value


def test_a_url_that_is_not_redis_is_refused() -> None:
    refusal = url_refusal("http://127.0.0.1:6379", {})
    assert refusal is not None and TEST_URL_ENV in refusal and "redis://" in refusal


def test_passwords_are_not_shown() -> None:
    assert redacted("redis://user:pw@127.0.0.1:6379/0") == "redis://user:***@127.0.0.1:6379/0"
    assert redacted("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_a_database_holding_keys_is_refused_and_an_empty_one_accepted(
    redis_url: str, redis_client: redis.Redis
) -> None:
    assert contents_refusal(redis_url) is None
    redis_client.set("someone:else", "1")
    refusal = contents_refusal(redis_url)
    assert refusal is not None
    assert "holds 1 keys" in refusal and "someone:else" in refusal and TEST_URL_ENV in refusal


def test_an_unreachable_test_server_is_named() -> None:
    refusal = contents_refusal("redis://127.0.0.1:1/0")
    assert refusal is not None and f"cannot reach {TEST_URL_ENV}=redis://127.0.0.1:1/0" in refusal


def test_the_suite_sees_no_production_url_and_owns_its_database(redis_client: redis.Redis) -> None:
    """Also the payload of the subprocess runs below: there, PVM_REDIS_URL names a server with a sentinel."""
    assert PRODUCTION_URL_ENV not in os.environ
    assert Settings.from_env().redis_url is None
    child = subprocess.run(
        [sys.executable, "-c", f"import os; print(os.environ.get({PRODUCTION_URL_ENV!r}))"],
        env={**os.environ},
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == "None"
    redis_client.set("written:by:the:suite", "1")  # the fixture flushes this database after the test


def run_pytest(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """pytest in a child process on this repository, with `env` on top of ours minus any test server variable."""
    base = {k: v for k, v in os.environ.items() if k not in (TEST_URL_ENV, ALLOW_REMOTE_ENV, PRODUCTION_URL_ENV)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def other_server() -> Iterator[redis.Redis]:
    """A second Valkey standing for a server that is not the suite's own, holding a sentinel key."""
    server = EmbeddedRedis().start()
    client = redis.Redis.from_url(server.url)
    client.set(SENTINEL, "keep me")
    try:
        yield client
    finally:
        client.close()
        server.stop()


def url_of(client: redis.Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs.get('db', 0)}"


@pytest.mark.integration
def test_a_remote_test_server_stops_the_run_before_any_test() -> None:
    out = run_pytest({TEST_URL_ENV: "redis://:secret@192.0.2.1:6379/0"}, PAYLOAD)
    assert out.returncode == pytest.ExitCode.USAGE_ERROR, out.stdout + out.stderr
    assert f"{TEST_URL_ENV}=redis://:***@192.0.2.1:6379/0 is not on this machine" in out.stderr
    assert f"set {ALLOW_REMOTE_ENV}=1" in out.stderr
    assert "secret" not in out.stdout + out.stderr
    assert "passed" not in out.stdout


@pytest.mark.integration
def test_production_url_in_the_environment_is_ignored(other_server: redis.Redis) -> None:
    out = run_pytest({PRODUCTION_URL_ENV: url_of(other_server)}, PAYLOAD)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout
    assert f"{PRODUCTION_URL_ENV} is set and ignored" in out.stdout
    assert other_server.get(SENTINEL) == b"keep me"
    assert other_server.dbsize() == 1


@pytest.mark.integration
def test_a_test_server_holding_keys_is_refused_and_an_empty_one_used(other_server: redis.Redis) -> None:
    url = url_of(other_server)
    refused = run_pytest({TEST_URL_ENV: url}, PAYLOAD)
    assert refused.returncode == pytest.ExitCode.USAGE_ERROR, refused.stdout + refused.stderr
    assert f"{TEST_URL_ENV}={url} holds 1 keys (for example {SENTINEL})" in refused.stdout + refused.stderr
    assert other_server.get(SENTINEL) == b"keep me"

    other_server.flushdb()
    flushes = other_server.info("commandstats").get("cmdstat_flushdb", {}).get("calls", 0)
    used = run_pytest({TEST_URL_ENV: url}, PAYLOAD)
    assert used.returncode == 0, used.stdout + used.stderr
    assert f"redis: {TEST_URL_ENV}={url} (flushed by the tests)" in used.stdout
    assert other_server.info("commandstats")["cmdstat_flushdb"]["calls"] >= flushes + 2  # before and after the test
    assert other_server.dbsize() == 0


@pytest.mark.integration
def test_a_test_server_is_not_shared_by_xdist_workers() -> None:
    out = run_pytest({TEST_URL_ENV: "redis://127.0.0.1:1/0"}, "-n", "2", PAYLOAD)
    assert out.returncode == pytest.ExitCode.USAGE_ERROR, out.stdout + out.stderr
    assert f"{TEST_URL_ENV} with -n 2: the workers would flush each other's database" in out.stderr

"""Which Redis the test suite flushes, and the guards that keep the suite off a server that is not its own.

The suite flushes its database before and after every test that uses it. It never
reads `PVM_REDIS_URL` (production's variable): it uses `PVM_TEST_REDIS_URL`, or an
embedded Valkey when that is unset. A server that is not on this machine is refused
unless `PVM_TEST_ALLOW_REMOTE_REDIS=1`, and a database that already holds keys is
refused whatever the host: the tests would wipe them.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Mapping

import redis

TEST_URL_ENV = "PVM_TEST_REDIS_URL"
ALLOW_REMOTE_ENV = "PVM_TEST_ALLOW_REMOTE_REDIS"
PRODUCTION_URL_ENV = "PVM_REDIS_URL"

SCHEMES = ("redis", "rediss", "unix")
LOOPBACK_NAMES = ("localhost",)
SAMPLE_KEYS = 5  # keys quoted when a database is refused for holding some


def redacted(url: str) -> str:
    """`url` with its password, if any, replaced by ***."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def is_loopback(url: str) -> bool:
    """Whether `url` reaches a server on this machine: a unix socket, localhost, 127.0.0.0/8 or ::1."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "unix":
        return True
    host = parts.hostname
    if host is None:  # redis-py connects to localhost when the URL names no host
        return True
    if host in LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name: not resolved here, so not trusted to be this machine
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def url_refusal(url: str, env: Mapping[str, str]) -> str | None:
    """Why the suite must not use `url` as its server (None when it may), with the fix."""
    shown = redacted(url)
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in SCHEMES:
        return f"{TEST_URL_ENV}={shown} is not a Redis URL: use redis://, rediss:// or unix://"
    if is_loopback(url) or env.get(ALLOW_REMOTE_ENV) == "1":
        return None
    return (
        f"{TEST_URL_ENV}={shown} is not on this machine, and the tests flush its database: "
        f"point {TEST_URL_ENV} at a server on loopback (127.0.0.1, ::1, localhost or unix://), "
        f"or set {ALLOW_REMOTE_ENV}=1 if that database is yours to wipe"
    )


def contents_refusal(url: str) -> str | None:
    """Why the database at `url` must not be flushed (it holds keys, or cannot be reached), None when it is empty."""
    shown = redacted(url)
    client = redis.Redis.from_url(url)
    try:
        size = client.dbsize()
        if not size:
            return None
        sample = [key.decode(errors="replace") for key in client.scan(0, count=100)[1][:SAMPLE_KEYS]]
    except redis.exceptions.RedisError as exc:
        return f"cannot reach {TEST_URL_ENV}={shown} ({exc}): start it, or unset {TEST_URL_ENV} for an embedded Valkey"
    finally:
        client.close()
    return (
        f"{TEST_URL_ENV}={shown} holds {size} keys (for example {', '.join(sample) or '?'}), "
        f"and the tests flush that database: point {TEST_URL_ENV} at an empty database "
        f"(another number, e.g. /15) or empty it yourself (FLUSHDB) if those keys may go"
    )

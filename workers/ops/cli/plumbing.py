"""What every group of `pvm` commands uses: option types that check what a user typed, the connections (Redis,
the reader API) that end a command with a one-line error, and stopping on signals.

The plain-text tables the commands print are `workers.ops.tables`, which the demo prints with too.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from contracts.minute import PROJECT_ID_RULE, is_valid_project_id
from pvm.config import Settings

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from pvm.client import PVMClient


# -- option types: argparse turns their ArgumentTypeError into a usage error (exit 2) that quotes the message ------


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def positive_int(text: str) -> int:
    value = _whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port (1-65535), got {text!r}")
    return int(text)


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def project_id(text: str) -> str:
    if not is_valid_project_id(text):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a project id: {PROJECT_ID_RULE}")
    return text


def shard_list(text: str) -> list[int]:
    return [shard_number(part.strip()) for part in text.split(",")]


def shard_number(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a shard number (0, 1, 2, ...)")
    return int(text)


def stream_id(text: str) -> str:
    from workers.ops.dead_letters import STREAM_ID

    if not STREAM_ID.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a stream entry id (like 1718000000000-0)")
    return text


# -- connections, and stopping ----------------------------------------------------------------------------------


def shards_of(settings: Settings, chosen: Sequence[int] | None) -> list[int]:
    """The shards a command names (all when none), each checked against PVM_SHARDS."""
    if chosen is None:
        return list(range(settings.shards))
    for shard in chosen:
        if shard >= settings.shards:
            raise SystemExit(
                f"pvm: there is no shard {shard}: PVM_SHARDS is {settings.shards} (shards 0-{settings.shards - 1})"
            )
    return list(chosen)


def connect(settings: Settings) -> redis.Redis:
    """A client for the configured Redis, which has answered a PING (else redis' ConnectionError: one line in main)."""
    from pvm import defaults
    from pvm.connection import redis_from_settings

    connection = redis_from_settings(settings, socket_connect_timeout=defaults.CLI_REDIS_CONNECT_TIMEOUT_S)
    connection.ping()
    return connection


def connect_service(settings: Settings) -> redis.Redis:
    """`connect` for a long-running command: waits up to PVM_REDIS_START_WAIT for a Redis that is
    restarting or loading its data (saying so once on stderr), then gives up like `connect`."""
    import time

    import redis

    deadline = time.monotonic() + settings.redis_start_wait_s
    pause = 0.1
    said = False
    while True:
        try:
            return connect(settings)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            if time.monotonic() + pause > deadline:
                raise
            if not said:
                print(
                    f"pvm: {redis_unreachable(settings.redis_url or '', exc)}; "
                    f"waiting up to {settings.redis_start_wait_s:g} s (PVM_REDIS_START_WAIT)",
                    file=sys.stderr,
                    flush=True,
                )
                said = True
            time.sleep(pause)
            pause = min(pause * 2, 2.0)


def redis_unreachable(url: str, exc: Exception) -> str:
    """The one line `pvm` prints when Redis does not answer: where it looked (no password), why, and the fix."""
    import urllib.parse

    import redis

    parts = urllib.parse.urlsplit(url)
    if parts.password is not None:
        user = parts.username or ""
        host = parts.netloc.rpartition("@")[2]
        url = urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    reason = str(exc).strip().rstrip(".")
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            reason = cause.strerror
            break
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, redis.exceptions.AuthenticationError):
        return f"Redis at {url} refused to log in ({reason}): fix the credentials in PVM_REDIS_URL"
    return f"cannot reach Redis at {url} ({reason}): start it or set PVM_REDIS_URL"


def stop_on_signals(event: threading.Event) -> None:
    def handler(signum: int, frame: object) -> None:
        event.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def reader_api(settings: Settings) -> Iterator[PVMClient]:
    """A client of the reader API at PVM_API_URL; its errors end the command with their one-line message."""
    from pvm.client import PVMAPIError, PVMClient

    try:
        with PVMClient(settings=settings) as api:
            yield api
    except PVMAPIError as exc:
        raise SystemExit(f"pvm: {exc}") from None


def _project_path(project_id: str, route: str) -> str:
    """The API path the client builds for a project (the project id quoted): what the CLI's requests go to."""
    from pvm.client import project_path

    return project_path(project_id, route)

"""Redis commands sent now and answered later, or never: what lets a reader work while Redis does.

A redis-py pipeline sends its commands and waits for every reply before it
returns. A context read does not need to wait so: its first pipeline can run
while the search does (`Sent`: the replies are read after), and the counters it
bumps at the end (access counts, fact reads) need no reply at all
(`Unanswered`: each command follows ``CLIENT REPLY SKIP``, so the server sends
none and nothing is left on the connection).

Both take a connection from the client's pool and give it back whole: a
connection is never returned with replies left on it (it is closed instead).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import redis

log = logging.getLogger(__name__)

Command = tuple[Any, ...]
_SKIP: Command = ("CLIENT", "REPLY", "SKIP")
_PROBE = b"pvm-client-reply-skip"


class Sent:
    """Commands sent in one write on a connection of `client`'s pool, their replies read later (`replies`).

    Nothing is sent where the pool gives no connection or the write fails: `replies` then answers None, and the
    caller runs the commands the plain way. `drop` gives the connection back without reading (closed)."""

    def __init__(self, client: redis.Redis, commands: Sequence[Command]) -> None:
        self.client = client
        self.commands = list(commands)
        self._connection: Any = None
        pool = client.connection_pool
        try:
            connection = pool.get_connection()
        except redis.RedisError:
            return
        try:
            connection.send_packed_command(connection.pack_commands(self.commands))
        except redis.RedisError:
            connection.disconnect()
            pool.release(connection)
            return
        self._connection = connection

    def replies(self) -> list[Any] | None:
        """Each command's reply, in order (an error reply as its `redis.ResponseError`), or None where they could
        not all be read (the connection lost: closed) or nothing was sent. Once."""
        connection, self._connection = self._connection, None
        if connection is None:
            return None
        out: list[Any] = []
        try:
            for command in self.commands:
                try:
                    out.append(self.client.parse_response(connection, command[0]))
                except redis.ResponseError as exc:  # read on: every reply is on the wire
                    out.append(exc)
        except redis.RedisError:
            connection.disconnect()
            return None
        finally:
            self.client.connection_pool.release(connection)
        return out

    def drop(self) -> None:
        """Give the connection back unread (closed: it holds the replies)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.disconnect()
            self.client.connection_pool.release(connection)


class Unanswered:
    """Writes whose replies nobody reads (counters), sent without waiting for the server.

    Each command goes after ``CLIENT REPLY SKIP``, so the server answers none of them. A server that does not
    know it (a proxy, an old server) would answer both and leave replies on the connection: the first `send`
    asks (one round trip), and where the server answers it sends every later batch as a plain pipeline. A
    write that fails is not retried here: the batch is sent again as a plain pipeline, whose errors raise.
    A caller of the same client that reads next on one thread uses the connection these went on (the pool's
    most recently returned), so it sees them; readers on other connections see them as soon as Redis ran them.
    """

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._skips: bool | None = None  # whether the server honours CLIENT REPLY SKIP; None until asked
        self._lock = threading.Lock()

    @property
    def skips(self) -> bool | None:
        return self._skips

    def send(self, commands: Sequence[Command]) -> None:
        """Send these commands; return without their replies where the server can skip them."""
        if not commands:
            return
        if self._skips is None:
            with self._lock:
                if self._skips is None:
                    self._skips = self._ask()
        if not self._skips:
            self._pipeline(commands)
            return
        pool = self.client.connection_pool
        connection = pool.get_connection()
        packed: list[Command] = []
        for command in commands:
            packed += [_SKIP, command]
        try:
            connection.send_packed_command(connection.pack_commands(packed))
        except redis.RedisError:
            connection.disconnect()
            pool.release(connection)
            self._pipeline(commands)
            return
        pool.release(connection)

    def _pipeline(self, commands: Sequence[Command]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        pipe.execute()

    def _ask(self) -> bool:
        """Whether the server honours CLIENT REPLY SKIP: SKIP, an ECHO it skips, and an ECHO it answers; only the
        last one's reply comes back where it does. Every reply the server sends is read."""
        pool = self.client.connection_pool
        connection = pool.get_connection()
        try:
            skipped, answered = (("ECHO", _PROBE + b"-skipped"), ("ECHO", _PROBE))
            connection.send_packed_command(connection.pack_commands([_SKIP, skipped, answered]))
            replies = 0
            while True:  # where it does not: SKIP's own reply (an error, or OK), the skipped ECHO's, then this one
                try:
                    reply = connection.read_response()
                except redis.ResponseError:
                    reply = None
                replies += 1
                if _bytes(reply) == _PROBE:
                    break
            if replies == 1:
                return True
            log.info("the Redis server does not skip replies (CLIENT REPLY): counters are sent as pipelines")
            return False
        except redis.RedisError:
            connection.disconnect()
            raise
        finally:
            pool.release(connection)


def _bytes(value: object) -> bytes | None:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return None

"""`pvm.wire`: commands answered later (`Sent`) or never (`Unanswered`), on a real Redis-protocol server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from pvm.wire import Sent, Unanswered


def in_use(client: redis.Redis) -> int:
    return len(client.connection_pool._in_use_connections)  # type: ignore[attr-defined]


def test_sent_commands_are_answered_when_read_and_the_connection_comes_back_clean(redis_client: redis.Redis) -> None:
    redis_client.set("w:a", b"1")
    sent = Sent(redis_client, [("GET", "w:a"), ("HINCRBY", "w:h", "f", 2), ("LPUSH", "w:a", "x")])
    assert in_use(redis_client) == 1
    replies = sent.replies()
    assert replies is not None and replies[:2] == [b"1", 2]
    assert isinstance(replies[2], redis.ResponseError)  # WRONGTYPE: read on, in order
    assert in_use(redis_client) == 0 and sent.replies() is None  # once
    assert redis_client.get("w:a") == b"1"  # the connection given back reads its own reply, not a left-over one


def test_sent_commands_dropped_or_cut_off_leave_no_reply_behind(redis_client: redis.Redis) -> None:
    redis_client.set("w:a", b"1")
    dropped = Sent(redis_client, [("GET", "w:a")])
    dropped.drop()
    assert in_use(redis_client) == 0 and redis_client.get("w:a") == b"1"
    cut = Sent(redis_client, [("GET", "w:a")])
    (connection,) = redis_client.connection_pool._in_use_connections  # type: ignore[attr-defined]
    connection.disconnect()  # lost with the reply on it
    assert cut.replies() is None and in_use(redis_client) == 0
    assert redis_client.get("w:a") == b"1"


def test_unanswered_writes_land_without_a_reply(redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    writes = Unanswered(redis_client)
    writes.send([("HINCRBY", "w:count", "m1", 1)])  # asks the server first
    assert writes.skips is True
    read = redis.connection.AbstractConnection.read_response
    reads: list[int] = []

    def counted(self: redis.connection.AbstractConnection, *args: object, **kwargs: object) -> object:
        reads.append(1)
        return read(self, *args, **kwargs)

    monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", counted)
    writes.send([("HINCRBY", "w:count", "m1", 1), ("HINCRBY", "w:count", "m2", 5), ("EVAL", "return 1", 0)])
    assert reads == []  # nothing waited for
    monkeypatch.undo()
    assert redis_client.hgetall("w:count") == {b"m1": b"2", b"m2": b"5"}  # the next read on the client sees them
    assert in_use(redis_client) == 0


@pytest.fixture
def denied_client(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """A client of a user the server refuses CLIENT to, as a server without CLIENT REPLY answers it: with an error."""
    name, password = f"w-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    redis_client.acl_setuser(name, enabled=True, passwords=[f"+{password}"], keys=["*"], commands=["+@all", "-client"])
    kwargs = redis_client.connection_pool.connection_kwargs
    client = redis.Redis(host=kwargs.get("host"), port=kwargs.get("port"), username=name, password=password)
    try:
        yield client
    finally:
        client.close()
        redis_client.acl_deluser(name)


def test_a_server_that_answers_every_command_gets_pipelines(denied_client: redis.Redis) -> None:
    writes = Unanswered(denied_client)
    writes.send([("HINCRBY", "w:count", "m1", 1)])
    assert writes.skips is False  # every reply of the question was read: none left on the connection
    writes.send([("HINCRBY", "w:count", "m1", 1)])
    assert denied_client.hgetall("w:count") == {b"m1": b"2"}
    assert denied_client.echo("after") == b"after"
    with pytest.raises(redis.ResponseError):  # a pipeline's errors raise
        writes.send([("LPUSH", "w:count", "x")])

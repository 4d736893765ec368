"""RQ queues of PVM's pools, always with the msgpack serializer."""

from __future__ import annotations

import redis
from rq import Queue

from contracts import keys
from pvm.serializers import MsgpackSerializer


class UnknownPool(ValueError):
    """A pool name that PVM does not have."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown pool {name!r}; pools are: {', '.join(sorted(keys.QUEUES))}")


def queue_name(pool: str) -> str:
    """The RQ queue name of a pool."""
    try:
        return keys.QUEUES[pool]
    except KeyError:
        raise UnknownPool(pool) from None


def pool_queue(pool: str, connection: redis.Redis) -> Queue:
    """The RQ queue of a pool."""
    return Queue(queue_name(pool), connection=connection, serializer=MsgpackSerializer)

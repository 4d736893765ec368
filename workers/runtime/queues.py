"""RQ queues of PVM's pools, always with the msgpack serializer."""

from __future__ import annotations

from typing import cast

import redis
from rq import Queue
from rq.utils import as_text
from rq.worker import Worker
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from contracts import keys
from workers.runtime.jobs import PvmJob
from workers.runtime.serializers import MsgpackSerializer

# Every PVM worker's name starts with this: workers that are not PVM's keep no alive key.
WORKER_NAME_PREFIX = "pvm-"


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
    """The RQ queue of a pool: msgpack job data (never pickle), PVM's job class (`workers.runtime.jobs.PvmJob`)."""
    return Queue(queue_name(pool), connection=connection, serializer=MsgpackSerializer, job_class=PvmJob)


def worker_registrations(connection: redis.Redis, queue_name: str) -> list[tuple[str, bool]]:
    """The PVM workers RQ lists as serving `queue_name`, by name, each with whether its alive key is there."""
    prefix = Worker.redis_worker_namespace_prefix + WORKER_NAME_PREFIX
    registered = (as_text(k) for k in cast(set[bytes], connection.smembers(WORKERS_BY_QUEUE_KEY % queue_name)))
    # A PVM worker sets its alive key before it registers: a registered one without it is dead.
    names = sorted(k.removeprefix(Worker.redis_worker_namespace_prefix) for k in registered if k.startswith(prefix))
    with connection.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.exists(keys.worker_alive(name))
        alive = pipe.execute()
    return [(name, bool(fresh)) for name, fresh in zip(names, alive, strict=True)]


def live_workers(connection: redis.Redis, queue_name: str) -> list[str]:
    """Names of the PVM workers serving `queue_name` now: registered with RQ and keeping their alive key fresh.

    RQ keeps a SIGKILLed worker registered until its worker key expires
    (minutes), or for good when no worker is left to clean up; its alive key
    lapses within `defaults.WORKER_ALIVE_TTL_S`. The one rule behind `pvm
    status`, the exporter's `pvm_queue_workers` and the PVMQueueWithoutWorkers
    alert. A worker that is not PVM's keeps no alive key (and checks no job
    allowlist): it does not count.
    """
    return [name for name, alive in worker_registrations(connection, queue_name) if alive]

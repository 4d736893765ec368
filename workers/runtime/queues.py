"""RQ queues of PVM's pools, always with the msgpack serializer, and the one policy every PVM job is queued with."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import redis
from rq import Queue, Retry
from rq.job import Job
from rq.queue import EnqueueData
from rq.utils import as_text
from rq.worker import Worker
from rq.worker_registration import WORKERS_BY_QUEUE_KEY

from contracts import keys
from pvm import defaults
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


def pool_job(
    name: str,
    args: Sequence[Any] = (),
    *,
    timeout: int | None = defaults.DOWNSTREAM_JOB_TIMEOUT_S,
    retries: int = defaults.JOB_RETRIES,
    description: str | None = None,
    depends_on: Job | str | None = None,
) -> EnqueueData:
    """One PVM job, ready for `Queue.enqueue_many`, with the policy every PVM job has.

    `name` is a job name of `contracts.keys`. Results are kept `JOB_RESULT_TTL_S`, failures
    `JOB_FAILURE_TTL_S`; a failed job is retried `retries` times (every pool job is idempotent; jobs that
    finish or retry their own way, as an evaluation slice or a schedule, pass 0). `timeout` None is RQ's default.
    """
    return Queue.prepare_data(
        name,
        args=tuple(args),
        timeout=timeout,
        retry=Retry(max=retries) if retries else None,
        result_ttl=defaults.JOB_RESULT_TTL_S,
        failure_ttl=defaults.JOB_FAILURE_TTL_S,
        description=description,
        depends_on=depends_on,
    )


def enqueue_pool_job(queue: Queue, name: str, args: Sequence[Any] = (), **policy: Any) -> Job:
    """Queue one PVM job (`pool_job`'s policy; `policy` takes its keyword arguments) and return it."""
    jobs = queue.enqueue_many([pool_job(name, args, **policy)])
    return jobs[0]


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

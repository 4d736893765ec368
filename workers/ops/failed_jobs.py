"""Failed RQ jobs for operators: a bounded page of a pool's failed registry, each job's last error line, requeue.

A page reads only the ids it shows (ZRANGE start..end) and fetches only those
jobs; named ids are checked one by one (ZSCORE). Jobs are read with the msgpack
serializer only: a planted or corrupt job is reported, never unpickled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import redis
from rq.job import Job
from rq.registry import FailedJobRegistry

from pvm import defaults
from workers.runtime.queues import queue_name
from workers.runtime.serializers import MsgpackSerializer


@dataclass(frozen=True)
class FailedJob:
    """One job in a pool's failed registry, as `pvm failed list` shows it."""

    pool: str
    job: str
    function: str
    ended: str
    error: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def registry(connection: redis.Redis, pool: str) -> FailedJobRegistry:
    return FailedJobRegistry(queue_name(pool), connection=connection, serializer=MsgpackSerializer)


def error_line(job: Job) -> str:
    """The last line of a failed job's error (its latest result's)."""
    result = job.latest_result()
    lines = ((result.exc_string if result else None) or "").strip().splitlines()
    return lines[-1] if lines else "-"


def job_error(connection: redis.Redis, job_id: str) -> str:
    """`error_line` of a job given by id; a job that cannot be read says why instead."""
    try:
        return error_line(Job.fetch(job_id, connection=connection, serializer=MsgpackSerializer))
    except Exception as exc:  # a planted or corrupt job: say so, never unpickle it
        return f"(its error cannot be read: {exc})"


def describe(connection: redis.Redis, pool: str, job_id: str) -> FailedJob:
    try:
        job = Job.fetch(job_id, connection=connection, serializer=MsgpackSerializer)
        ended = job.ended_at.isoformat(timespec="seconds") if job.ended_at else "-"
        return FailedJob(pool, job_id, job.func_name or "?", ended, error_line(job))
    except Exception as exc:  # a planted or corrupt job: say so, never unpickle it
        return FailedJob(pool, job_id, "?", "-", str(exc))


def page(connection: redis.Redis, pools: Sequence[str], limit: int) -> list[FailedJob]:
    """Up to `limit` failed jobs, pool by pool, oldest first within a pool; reads only the jobs returned."""
    out: list[FailedJob] = []
    for pool in pools:
        if len(out) >= limit:
            break
        ids = registry(connection, pool).get_job_ids(0, limit - len(out) - 1, cleanup=False)
        out += [describe(connection, pool, job_id) for job_id in ids]
    return out


def find(connection: redis.Redis, pools: Sequence[str], ids: Sequence[str]) -> list[tuple[str, str]]:
    """(pool, job id) of the named jobs that are in these pools' failed registries, in the order asked."""
    return [(pool, job_id) for job_id in ids for pool in pools if job_id in registry(connection, pool)]


def requeue(connection: redis.Redis, pool: str, job_id: str) -> str | None:
    """Put a failed job back on its queue; None when done, else why it could not be (it stays where it is)."""
    try:
        registry(connection, pool).requeue(job_id)
    except Exception as exc:  # gone, planted or corrupt: never unpickled, reported
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return None


def requeue_all(connection: redis.Redis, pool: str) -> tuple[int, list[str]]:
    """Requeue every job failed in a pool when this starts, a page at a time; returns (requeued, "id (why)" not).

    Jobs that fail again meanwhile join the registry's end and wait for the next run.
    """
    failed = registry(connection, pool)
    left = failed.get_job_count(cleanup=False)
    done, stuck = 0, list[str]()
    while left > 0:
        # Requeued jobs leave the registry; the ones that could not be requeued stay at its front.
        ids = failed.get_job_ids(len(stuck), len(stuck) + min(left, defaults.FAILED_JOBS_PAGE) - 1, cleanup=False)
        if not ids:
            break
        for job_id in ids:
            why = requeue(connection, pool, job_id)
            if why is None:
                done += 1
            else:
                stuck.append(f"{job_id} ({why})")
        left -= len(ids)
    return done, stuck

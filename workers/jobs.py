"""PVM's job registry: a worker runs a job only if it names one of PVM's own job functions.

The names are `contracts.keys.JOB_FUNCTIONS`. Anyone who can write to Redis
can put a job on a PVM queue, and RQ would import and call whatever dotted
name it carries: ``os.system``, ``builtins.eval``, or a module whose import
alone does harm. `refusal()` decides from the job's stored data alone, before
anything is imported; `PvmJob` is the job class of every PVM worker and queue,
and never resolves a callback name nor sends a webhook (PVM jobs use neither),
so RQ's own maintenance of abandoned jobs cannot be made to import code either.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from rq.exceptions import DeserializationError
from rq.job import Job, JobStatus


class JobRefused(Exception):
    """A job that is not one of PVM's: failed with the reason, never imported or called."""


class PvmJob(Job):
    """An RQ Job that never resolves callback names and never sends webhooks (no PVM job has either)."""

    @property
    def success_callback(self) -> None:
        return None

    @property
    def failure_callback(self) -> None:
        return None

    @property
    def stopped_callback(self) -> None:
        return None

    def send_webhooks(self, status: str | JobStatus, *, exc_string: str | None = None) -> None:
        return None


def refusal(job: Job, allowed: Collection[str]) -> str | None:
    """Why `job` must not run (None for a PVM job); reads what the job carries, imports nothing."""
    try:
        func, instance = job.func_name, job.instance
    except DeserializationError as exc:
        return f"job data cannot be decoded ({exc.__cause__ or exc}); refused"
    if func not in allowed:
        return f"job function {func!r} is not a PVM job; refused (allowed: {', '.join(sorted(allowed))})"
    if instance is not None:
        return f"job {func!r} is a method of a stored instance; PVM jobs are plain functions; refused"
    # RQ keeps the callback names private; reading them imports nothing, resolving them would.
    callbacks: dict[str, Any] = {
        "a success callback": job._success_callback_name,
        "a failure callback": job._failure_callback_name,
        "a stopped callback": job._stopped_callback_name,
    }
    for what, name in callbacks.items():
        if name:
            return f"job {func!r} asks for {what} ({name!r}); PVM jobs have none; refused"
    if job.webhooks:
        return f"job {func!r} asks for webhooks ({', '.join(w.url for w in job.webhooks)}); PVM jobs have none; refused"
    return None

"""PVM's job registry: the work behind each job name, and a worker that runs a job only if it names PVM's own.

`JOBS` maps each stable job name (`contracts.keys.JOB_FUNCTIONS`; the names
jobs were queued under before, `keys.LEGACY_JOB_NAMES`, resolve to the same
work) to the function that does it, and `PvmJob.func` resolves a job's name
there and hands the function the worker's context (`WorkerContext`) as its
first argument. Anyone who can write to Redis can put a job on a PVM queue,
and RQ would import and call whatever dotted name it carries: ``os.system``, ``builtins.eval``, or a module whose import
alone does harm. `refusal()` decides from the job's stored data alone, before
anything is imported; `PvmJob` is the job class of every PVM worker and queue,
and never resolves a callback name nor sends a webhook (PVM jobs use neither),
so RQ's own maintenance of abandoned jobs cannot be made to import code either.
"""

from __future__ import annotations

import functools
import importlib
import zlib
from collections.abc import Callable, Collection
from typing import Any

from rq.exceptions import DeserializationError
from rq.job import Job, JobStatus

from contracts import keys
from workers.runtime.context import WorkerContext

# The one registry: each job's stable name -> the function that does it ("module:function"). A function takes the
# worker's context first, then the job's arguments. Moving a function changes its line here, never a stored job.
JOBS: dict[str, str] = {
    keys.LOG_JOB: "workers.log.pool:run",
    keys.INDEX_JOB: "workers.index.pool:run",
    keys.INDEX_RESET_JOB: "workers.index.pool:reset_project",
    keys.INDEX_OPTIMIZE_JOB: "workers.index.pool:optimize",
    keys.SUMMARY_POINTS_JOB: "workers.index.pool:run_summaries",
    keys.FACTS_JOB: "workers.facts.pool:run",
    keys.SUMMARIZE_JOB: "workers.summarize.pool:run",
    keys.EVALUATE_PLAN_JOB: "workers.evaluate.pool:plan",
    keys.EVALUATE_SLICE_JOB: "workers.evaluate.pool:run_slice",
}

# RQ stores a job's data zlib-compressed at level 6 on every save: 2 ms for a 500-minute log job, once when the
# dispatcher enqueues it and again when the worker saves its outcome (bench/ingest.py's pipeline profile: about a
# fifth of the dispatcher's time and a tenth of the log worker's). Level 1 takes 0.6 ms for 1.3x the bytes (26 KB
# instead of 20 KB for 185 KB of minutes), and a job read back from Redis saves the bytes it was read with.
DATA_COMPRESSION_LEVEL = 1


def job_function(name: str) -> Callable[..., Any] | None:
    """The function registered for the job `name` (stable or legacy), imported; None for a name not in `JOBS`."""
    target = JOBS.get(keys.job_name(name))
    if target is None:
        return None
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]


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

    worker_context: WorkerContext | None = None  # set by the worker that runs the job (`PvmWorker`)

    @property
    def func(self) -> Any:
        """The function a PVM job names, given the worker's context; RQ's own resolution for an extra allowed name.

        Reached only for a job `refusal` let through. A job run outside a PVM worker gets a context of its own.
        """
        function = job_function(self.func_name or "")
        if function is None:
            return super().func
        context = self.worker_context or WorkerContext(self.connection)
        return functools.partial(function, context)

    _stored_data: tuple[bytes, bytes] | None = None  # (data, the compressed bytes Redis holds for it)

    def restore(self, raw_data: Any) -> Any:
        out = super().restore(raw_data)
        stored = raw_data.get(b"data") if isinstance(raw_data, dict) else None
        if isinstance(stored, bytes) and isinstance(self._data, bytes) and stored is not self._data:
            self._stored_data = (self._data, stored)
        return out

    def to_dict(self, include_meta: bool = True, include_result: bool = True) -> dict[str, Any]:
        """RQ's serialization, with the data compressed once, fast (`DATA_COMPRESSION_LEVEL`), not on every save."""
        data = self.data
        known = self._stored_data
        compressed = known[1] if known is not None and known[0] is data else zlib.compress(data, DATA_COMPRESSION_LEVEL)
        self._data = b""  # RQ's to_dict compresses self.data: give it nothing to do, then put the data back
        try:
            obj = super().to_dict(include_meta=include_meta, include_result=include_result)
        finally:
            self._data = data
        obj["data"] = compressed
        self._stored_data = (data, compressed)
        return obj


def refusal(job: Job, allowed: Collection[str]) -> str | None:
    """Why `job` must not run (None for a PVM job); reads what the job carries, imports nothing."""
    try:
        func, instance = job.func_name, job.instance
    except DeserializationError as exc:
        return f"job data cannot be decoded ({exc.__cause__ or exc}); refused"
    if func not in allowed and keys.job_name(func or "") not in allowed:
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

"""The scheduler: enqueues periodic maintenance jobs onto the pools, one scheduler acting at a time.

Any number of `pvm scheduler` processes may run. A lease in Redis
(`keys.scheduler_leader()`: SET NX PX, renewed by its holder every tick)
elects the one that acts; the others are hot standbys and take over within
one lease time (`SCHEDULER_LEASE_MS`) of the leader's death. RQ's own cron is
not used: it pickles, and it has no leader.

Each schedule's state lives in Redis (`keys.schedules()`), so a new leader
keeps the cadence instead of running everything at once. A due run is
enqueued and its run time recorded in one MULTI/EXEC under WATCH: even two
schedulers that both believe they lead (a leader stalled past its lease)
cannot enqueue the same period twice. A run whose previous job is still
queued or running is skipped, so a slow pool never piles up maintenance jobs.

Schedules today: ``optimize`` (the embedded engine's segment merge and HNSW
build, every `PVM_OPTIMIZE_EVERY` seconds; a Qdrant server optimizes itself,
so there is none with `PVM_QDRANT_URL`) and ``evaluate`` (the evaluate pool's
run over every project, every `PVM_EVALUATE_EVERY` seconds: one small job that
starts a chain of bounded slice jobs per project, `workers.evaluate.pool`;
its first run comes one interval after a scheduler first records it, not
with the stack's start).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus

from contracts import keys
from pvm import defaults
from pvm.config import Settings
from pvm.connection import bulk_reply, hash_reply
from workers.runtime.queues import pool_job, pool_queue
from workers.runtime.serializers import MsgpackSerializer

log = logging.getLogger(__name__)

# Returns 1 when `ARGV[1]` holds the lease after the call (renewed or taken), else 0.
_LEASE = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

_PENDING = {JobStatus.QUEUED, JobStatus.STARTED, JobStatus.DEFERRED, JobStatus.SCHEDULED}


@dataclass(frozen=True)
class Schedule:
    """A job to enqueue on a pool every `every_s` seconds."""

    name: str
    every_s: float
    pool: str
    func: str
    args: tuple[Any, ...] = ()
    timeout_s: int = defaults.JOB_TIMEOUT_S
    # Run first one interval after a scheduler first records the schedule, not at once: a heavy run (the
    # evaluate pool's over every project) should not start with the stack.
    delay_first: bool = False

    def __post_init__(self) -> None:
        if not self.name or ":" in self.name:
            raise ValueError(f"schedule name {self.name!r} must be non-empty and without ':'")
        if self.every_s <= 0:
            raise ValueError(f"schedule {self.name}: every_s must be positive, got {self.every_s}")


def default_schedules(settings: Settings) -> list[Schedule]:
    """The schedules these settings call for."""
    schedules = []
    if settings.optimize_every_s and not settings.qdrant_url:
        schedules.append(
            Schedule(
                "optimize",
                settings.optimize_every_s,
                "index",
                keys.INDEX_OPTIMIZE_JOB,
                (None,),
                defaults.OPTIMIZE_JOB_TIMEOUT_S,
            )
        )
    if settings.evaluate_every_s:
        schedules.append(
            Schedule("evaluate", settings.evaluate_every_s, "evaluate", keys.EVALUATE_PLAN_JOB, delay_first=True)
        )
    return schedules


@dataclass
class ScheduleState:
    """One schedule as Redis holds it."""

    name: str
    every_s: float | None
    last_run: float | None
    job_id: str | None

    def due_at(self) -> float | None:
        """When the next run is due (None: never ran, due now; or no interval known)."""
        if self.last_run is None or self.every_s is None:
            return None
        return self.last_run + self.every_s


def read_schedules(connection: redis.Redis) -> list[ScheduleState]:
    """Every schedule some scheduler has recorded, by name."""
    raw = {k.decode(): v.decode() for k, v in hash_reply(connection.hgetall(keys.schedules())).items()}
    names = sorted({k.rsplit(":", 1)[0] for k in raw})
    return [
        ScheduleState(
            name,
            float(raw[f"{name}:every"]) if f"{name}:every" in raw else None,
            float(raw[f"{name}:last"]) if f"{name}:last" in raw else None,
            raw.get(f"{name}:job"),
        )
        for name in names
    ]


def default_scheduler_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class SchedulerStats:
    ticks: int = 0
    led: int = 0  # ticks this scheduler held the lease
    enqueued: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)  # due, but the previous run was still pending


class Scheduler:
    """Enqueues each schedule's job when it is due, while this process holds the lease."""

    def __init__(
        self,
        connection: redis.Redis,
        schedules: Sequence[Schedule],
        name: str | None = None,
        lease_ms: int = defaults.SCHEDULER_LEASE_MS,
    ) -> None:
        names = [s.name for s in schedules]
        if len(set(names)) != len(names):
            raise ValueError(f"schedule names repeat: {names}")
        self.connection = connection
        self.schedules = list(schedules)
        self.name = name or default_scheduler_name()
        self.lease_ms = lease_ms
        self.stats = SchedulerStats()
        self.stop_event = threading.Event()
        self.leading = False  # as of the last tick
        self._lease = connection.register_script(_LEASE)
        self._release = connection.register_script(_RELEASE)
        self._queues: dict[str, Queue] = {}

    def _queue(self, pool: str) -> Queue:
        if pool not in self._queues:
            self._queues[pool] = pool_queue(pool, self.connection)
        return self._queues[pool]

    def now(self) -> float:
        """Redis' clock: every scheduler, wherever it runs, judges due times by the same one."""
        seconds, micros = self.connection.time()
        return float(seconds) + micros / 1e6

    def hold_lease(self) -> bool:
        """Take or renew the lease; True while this scheduler leads."""
        return bool(self._lease(keys=[keys.scheduler_leader()], args=[self.name, self.lease_ms]))

    def release_lease(self) -> None:
        self._release(keys=[keys.scheduler_leader()], args=[self.name])

    def tick(self, now: float | None = None) -> list[str]:
        """Renew the lease; if leading, enqueue every due schedule. Returns the names enqueued."""
        self.stats.ticks += 1
        self.leading = self.hold_lease()
        if not self.leading:
            return []
        self.stats.led += 1
        now = self.now() if now is None else now
        self._record_schedules()
        return [s.name for s in self.schedules if self._run_if_due(s, now)]

    def _record_schedules(self) -> None:
        """Write every schedule's interval; drop the state of schedules the leader no longer has."""
        names = {s.name for s in self.schedules}
        fields = cast(list[bytes], self.connection.hkeys(keys.schedules()))
        stale = [f for f in fields if f.decode().rsplit(":", 1)[0] not in names]
        if stale:
            self.connection.hdel(keys.schedules(), *stale)
            log.warning(
                "scheduler %s: dropped schedules it no longer has: %s",
                self.name,
                sorted({f.decode().rsplit(":", 1)[0] for f in stale}),
            )
        if self.schedules:
            every = {f"{s.name}:every": repr(s.every_s) for s in self.schedules}
            self.connection.hset(keys.schedules(), mapping=every)  # type: ignore[arg-type]

    def _run_if_due(self, schedule: Schedule, now: float) -> bool:
        key = keys.schedules()
        with self.connection.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)
                last = bulk_reply(pipe.hget(key, f"{schedule.name}:last"))
                if last is None and schedule.delay_first:
                    pipe.multi()  # its cadence starts now: the first run is one interval away
                    pipe.hset(key, f"{schedule.name}:last", repr(now))
                    pipe.execute()
                    return False
                if last is not None and now - float(last) < schedule.every_s:
                    return False
                previous = bulk_reply(pipe.hget(key, f"{schedule.name}:job"))
                if previous is not None and self._pending(previous.decode()):
                    self.stats.skipped[schedule.name] = self.stats.skipped.get(schedule.name, 0) + 1
                    log.warning(
                        "scheduler %s: %s is due but its previous job %s has not finished; skipped",
                        self.name,
                        schedule.name,
                        previous.decode(),
                    )
                    pipe.unwatch()
                    return False
                pipe.multi()
                job_data = pool_job(
                    schedule.func,
                    schedule.args,
                    timeout=schedule.timeout_s,
                    retries=0,
                    description=f"schedule {schedule.name}",
                )
                [job] = self._queue(schedule.pool).enqueue_many([job_data], pipeline=pipe)
                pipe.hset(key, mapping={f"{schedule.name}:last": repr(now), f"{schedule.name}:job": job.id})
                pipe.execute()
            except redis.exceptions.WatchError:
                return False  # another scheduler recorded a run in between: this period is taken
        self.stats.enqueued[schedule.name] = self.stats.enqueued.get(schedule.name, 0) + 1
        log.info("scheduler %s: enqueued %s (job %s) on %s", self.name, schedule.name, job.id, schedule.pool)
        return True

    def _pending(self, job_id: str) -> bool:
        try:
            job = Job.fetch(job_id, connection=self.connection, serializer=MsgpackSerializer)
        except NoSuchJobError:
            return False
        return job.get_status(refresh=False) in _PENDING

    def run(self, tick_s: float = defaults.SCHEDULER_TICK_S) -> SchedulerStats:
        """Tick until `stop_event` is set; Redis unreachable is waited out, never the end of the loop."""
        was_leading = None
        try:
            while not self.stop_event.is_set():
                try:
                    self.tick()
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                    log.warning("scheduler %s: Redis unreachable (%s); retrying", self.name, exc)
                    self.leading = False
                if self.leading != was_leading:
                    log.warning("scheduler %s: %s", self.name, "leading" if self.leading else "standing by")
                    was_leading = self.leading
                self.stop_event.wait(tick_s)
        finally:
            with contextlib.suppress(redis.exceptions.RedisError):
                self.release_lease()  # a standby takes over at once instead of after the lease time
        return self.stats

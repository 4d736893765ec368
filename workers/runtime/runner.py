"""Runs RQ workers for PVM pools: msgpack only, long-lived processes, dead workers' jobs requeued quickly.

`PvmWorker` is an RQ `SimpleWorker` (no fork per job: one job carries a whole
batch, and a fork costs more than a batch's work) that

* runs only PVM's own job functions (`keys.JOB_FUNCTIONS`, checked before
  anything is imported; see `workers.runtime.jobs`): anything else is failed with the reason,
* keeps a short-lived "alive" key in Redis while its process lives (only
  workers with a fresh one count as live: `live_workers`), and
* reaps: a job left in a pool's started registry by a worker whose alive key
  lapsed (a ``kill -9``, an OOM kill, a lost node) goes back to the front of its
  queue within seconds, instead of after RQ's heartbeat timeout; so does a job
  stranded in the queue's intermediate list (its worker died between RQ's
  BLMOVE and the started registry), which RQ's own maintenance would mark
  *failed* after a minute or two. Every pool job is idempotent, so running a
  batch again is safe.

RQ dequeues with BLMOVE into the intermediate list only for a worker of one
queue; for several it uses BLPOP, and a worker killed in the instant between
BLPOP and the started registry would lose that job from every list.
`DurableQueue` moves the job into its queue's intermediate list for any
number of queues, so `pvm worker log index` is as safe as `pvm worker log`.

SIGTERM (or Ctrl-C) finishes the current batch and exits; a second one stops at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Collection, Sequence
from typing import Any, cast

import redis
from rq import Queue, worker_registration
from rq.exceptions import DequeueTimeout, StopRequested
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.registry import StartedJobRegistry
from rq.results import Result
from rq.serializers import Serializer
from rq.timeouts import BaseDeathPenalty
from rq.utils import as_text, now, parse_composite_key
from rq.worker import SimpleWorker, Worker, WorkerStatus
from rq.worker_registration import REDIS_WORKER_KEYS, WORKERS_BY_QUEUE_KEY

from contracts import keys
from pvm import defaults
from pvm.config import Settings
from pvm.connection import bulk_reply, hash_reply, redis_from_settings
from workers.runtime.context import WorkerContext
from workers.runtime.jobs import JobRefused, PvmJob, refusal
from workers.runtime.queues import WORKER_NAME_PREFIX, pool_queue, queue_name, worker_registrations
from workers.runtime.serializers import MsgpackSerializer
from workers.runtime.stack import RestartPolicy, terminate

log = logging.getLogger(__name__)


_REQUEUE = """
-- KEYS: started registry, job hash, queue list, execution hash, the reaper's counters, intermediate list
-- ARGV: registry member, job id, counter field
-- RQ registers a started job and only then takes it off the intermediate list: a worker killed
-- between the two leaves it in both, and the copy there would never be cleared once the job ran.
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[2], 'status', 'queued')
  redis.call('DEL', KEYS[4])
  redis.call('LREM', KEYS[6], 0, ARGV[2])
  redis.call('LPUSH', KEYS[3], ARGV[2])
  redis.call('HINCRBY', KEYS[5], ARGV[3], 1)
  return 1
end
return 0
"""

_REQUEUE_STRANDED = """
-- KEYS: intermediate list, job hash, queue list, RQ's first-seen key, our seen hash, the reaper's counters
-- ARGV: job id, counter field
-- A job dequeued (moved to the intermediate list) that no worker started: status still 'queued'.
-- Any other status (started, finished, failed, or no job hash left) is a leftover copy: the started
-- registry and the dead-worker reaper own the job now, so the copy is only dropped.
redis.call('HDEL', KEYS[5], ARGV[1])
if redis.call('HGET', KEYS[2], 'status') ~= 'queued' then
  redis.call('LREM', KEYS[1], 0, ARGV[1])
  redis.call('DEL', KEYS[4])
  return 0
end
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
redis.call('DEL', KEYS[4])
redis.call('LPUSH', KEYS[3], ARGV[1])
redis.call('HINCRBY', KEYS[6], ARGV[2], 1)
return 1
"""


def requeue_orphans(
    connection: redis.Redis,
    queues: Sequence[Queue],
    now: float | None = None,
    grace: float = defaults.STRANDED_GRACE_S,
) -> list[str]:
    """Requeue jobs whose PVM worker died mid-job or right after dequeuing; returns the requeued job ids.

    The script that requeues a job also counts it, by reason, in its queue's
    `keys.metrics_reaper` hash (the exporter's `pvm_reaper_requeued_total`).
    Stranded jobs (dequeued, never started) are requeued once they have been
    seen stranded for `grace` seconds, by whichever reaper looks then; `now`
    (seconds, default Redis' clock) is for tests.
    """
    requeued = _requeue_dead_workers_jobs(connection, queues)
    requeued += _requeue_stranded(connection, queues, now, grace)
    return requeued


def _requeue_stranded(connection: redis.Redis, queues: Sequence[Queue], now: float | None, grace: float) -> list[str]:
    if now is None:
        seconds, micros = connection.time()
        now = seconds + micros / 1e6
    script = connection.register_script(_REQUEUE_STRANDED)
    requeued = []
    for queue in queues:
        seen_key = keys.stranded_seen(queue.name)
        stranded = {raw.decode() for raw in cast(list[bytes], connection.lrange(queue.intermediate_queue_key, 0, -1))}
        seen = {k.decode(): float(v) for k, v in hash_reply(connection.hgetall(seen_key)).items()}
        gone = [job_id for job_id in seen if job_id not in stranded]
        if gone:
            connection.hdel(seen_key, *gone)
        for job_id in stranded:
            first = seen.get(job_id)
            if first is None:
                connection.hsetnx(seen_key, job_id, repr(now))
                continue
            if now - first < grace:
                continue
            done = script(
                keys=[
                    queue.intermediate_queue_key,
                    Job.key_for(job_id),
                    queue.key,
                    queue.intermediate_queue.get_first_seen_key(job_id),
                    seen_key,
                    keys.metrics_reaper(queue.name),
                ],
                args=[job_id, keys.REQUEUED_STRANDED],
            )
            if done:
                log.warning("requeued job %s stranded unstarted on %s for %.0f s", job_id, queue.name, now - first)
                requeued.append(job_id)
    return requeued


def _requeue_dead_workers_jobs(connection: redis.Redis, queues: Sequence[Queue]) -> list[str]:
    script = connection.register_script(_REQUEUE)
    requeued = []
    for queue in queues:
        registry = StartedJobRegistry(queue.name, connection=connection, serializer=MsgpackSerializer)
        for raw in cast(list[bytes], connection.zrange(registry.key, 0, -1)):  # no scores: members only
            composite = raw.decode()
            job_id, execution_id = parse_composite_key(composite)
            execution_key = Execution(execution_id, job_id, connection).key
            worker = bulk_reply(connection.hget(execution_key, "worker_name"))
            worker_name = worker.decode() if worker else ""
            if not worker_name.startswith(WORKER_NAME_PREFIX):
                continue  # not ours: RQ's own heartbeat cleanup handles it
            if connection.exists(keys.worker_alive(worker_name)):
                continue
            done = script(
                keys=[
                    registry.key,
                    Job.key_for(job_id),
                    queue.key,
                    execution_key,
                    keys.metrics_reaper(queue.name),
                    queue.intermediate_queue_key,
                ],
                args=[composite, job_id, keys.REQUEUED_DEAD_WORKER],
            )
            if done:
                log.warning("requeued job %s of dead worker %s on %s", job_id, worker_name, queue.name)
                requeued.append(job_id)
    return requeued


def drop_dead_workers(connection: redis.Redis, queues: Sequence[Queue]) -> list[str]:
    """Unregister from RQ the PVM workers of `queues` whose alive key lapsed; returns their names.

    So `rq info` and anything else reading RQ's registry agree with
    `live_workers`. A worker dropped while alive (its alive key lapsed for a
    while) registers again at its next refresh.
    """
    dropped = set()
    for queue in queues:
        dead = [name for name, alive in worker_registrations(connection, queue.name) if not alive]
        if not dead:
            continue
        worker_keys = [Worker.redis_worker_namespace_prefix + name for name in dead]
        with connection.pipeline() as pipe:
            pipe.srem(WORKERS_BY_QUEUE_KEY % queue.name, *worker_keys)
            pipe.srem(REDIS_WORKER_KEYS, *worker_keys)
            pipe.execute()
        log.warning("unregistered dead workers from %s: %s", queue.name, ", ".join(dead))
        dropped.update(dead)
    return sorted(dropped)


# A worker of several queues blocks this long on each in turn when all are empty: a job waits at most this long for
# a worker blocked on another of its queues (`pvm serve`'s index pool shares its worker with the evaluate pool, and
# each index job's wait is part of emit -> searchable; ~20 idle BLMOVEs a second cost Redis nothing).
MULTI_QUEUE_POLL_S = 0.05


class DurableQueue(Queue):
    """An RQ Queue whose dequeue always goes through the queue's intermediate list, one queue or several.

    A dequeued job whose hash RQ cannot read (planted or corrupt) goes to the
    failed registry with the reason, instead of ending the worker's loop.
    """

    @classmethod
    def dequeue_any(  # type: ignore[override]
        cls,
        queues: Sequence[Queue],
        timeout: int | None,
        connection: redis.Redis,
        job_class: type[Job] | None = None,
        serializer: Serializer | str | None = None,
        death_penalty_class: type[BaseDeathPenalty] | None = None,
    ) -> tuple[Job, Queue] | None:
        queues = list(queues)
        if len(queues) == 1:
            return super().dequeue_any(
                queues,
                timeout,
                connection,
                job_class,
                serializer,
                death_penalty_class,
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        turn = 0
        while True:
            unusable = False  # a job id came off a queue with no runnable job behind it: look again
            for queue in queues:  # in priority order, without blocking
                raw = bulk_reply(connection.lmove(queue.key, queue.intermediate_queue_key))
                if raw is None:
                    continue
                found = cls._moved(connection, queue, raw, job_class, serializer, death_penalty_class)
                if found is not None:
                    return found
                unusable = True
                break
            if unusable:
                continue
            if deadline is None:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DequeueTimeout(timeout, ",".join(q.key for q in queues))
            queue = queues[turn % len(queues)]
            turn += 1
            # BLMOVE takes a fractional timeout (Redis >= 6.0); redis-py's stub says int.
            timeout_s = min(remaining, MULTI_QUEUE_POLL_S)
            raw = bulk_reply(connection.blmove(queue.key, queue.intermediate_queue_key, timeout_s))  # type: ignore[arg-type]
            found = cls._moved(connection, queue, raw, job_class, serializer, death_penalty_class)
            if found is not None:
                return found

    @classmethod
    def _fetch_dequeued_job(
        cls,
        connection: redis.Redis,
        queue_key: str,
        job_id: str,
        job_class: type[Job] | None = None,
        serializer: Serializer | str | None = None,
        death_penalty_class: type[BaseDeathPenalty] | None = None,
    ) -> tuple[Job, Queue] | None:
        queue_name = queue_key.removeprefix(cls.redis_queue_namespace_prefix)
        try:
            found = super()._fetch_dequeued_job(
                connection, queue_key, job_id, job_class, serializer, death_penalty_class
            )
        except (redis.exceptions.RedisError, StopRequested):  # a stop is no verdict on the job: it stays queued
            raise
        except Exception as exc:  # a hash RQ cannot read (planted or corrupt): it would stop the worker
            _fail_unreadable(connection, queue_name, job_id, f"{type(exc).__name__}: {exc}")
            return None  # dequeue the next one
        if found is None:  # no hash (deleted or expired: nothing to run), or one without data (RQ says the same)
            if connection.exists(Job.key_for(job_id)):
                _fail_unreadable(connection, queue_name, job_id, "it has no job data")
            else:
                connection.lrem(cls(queue_name, connection=connection).intermediate_queue_key, 1, job_id)
        return found

    @classmethod
    def _moved(
        cls,
        connection: redis.Redis,
        queue: Queue,
        raw: bytes | None,
        job_class: type[Job] | None,
        serializer: Serializer | str | None,
        death_penalty_class: type[BaseDeathPenalty] | None,
    ) -> tuple[Job, Queue] | None:
        if raw is None:
            return None
        return cls._fetch_dequeued_job(connection, queue.key, as_text(raw), job_class, serializer, death_penalty_class)


def _fail_unreadable(connection: redis.Redis, queue_name: str, job_id: str, error: str) -> None:
    """Fail a dequeued job whose hash RQ cannot turn into a Job: no Job object exists to fail the usual way."""
    reason = f"{JobRefused.__name__}: job hash cannot be read ({error}); refused"
    log.error("job %s on %s: %s", job_id, queue_name, reason)
    queue = Queue(queue_name, connection=connection, serializer=MsgpackSerializer)
    ttl = defaults.JOB_FAILURE_TTL_S
    with connection.pipeline() as pipe:
        pipe.hset(Job.key_for(job_id), "status", JobStatus.FAILED.value)
        pipe.expire(Job.key_for(job_id), ttl)
        failure = Result(job_id, Result.Type.FAILED, connection, exc_string=reason, serializer=MsgpackSerializer)
        failure.save(ttl, pipeline=pipe)
        pipe.zadd(queue.failed_job_registry.key, {job_id: time.time() + ttl})
        pipe.lrem(queue.intermediate_queue_key, 1, job_id)
        pipe.execute()


class PvmWorker(SimpleWorker):
    """An RQ SimpleWorker with the msgpack serializer, an alive key, an orphan reaper, and PVM's jobs only.

    A job that does not name one of `job_functions` (default: PVM's own,
    `keys.JOB_FUNCTIONS`) is failed with the reason before anything is
    imported, and never retried (see `workers.runtime.jobs`). Every job it
    runs gets `context` (one `WorkerContext` for the worker's life, built
    from the environment's settings unless given).
    """

    def __init__(
        self,
        queues: Sequence[Queue],
        connection: redis.Redis,
        job_functions: Collection[str] = keys.JOB_FUNCTIONS,
        context: WorkerContext | None = None,
        **kwargs: object,
    ) -> None:
        name = (
            kwargs.pop("name", None)
            or f"{WORKER_NAME_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        # RQ checks every queue is of the worker's queue class.
        queues = [
            DurableQueue(q.name, connection=connection, serializer=MsgpackSerializer, job_class=PvmJob) for q in queues
        ]
        super().__init__(
            queues,
            connection=connection,
            name=str(name),
            serializer=MsgpackSerializer,
            queue_class=DurableQueue,
            job_class=PvmJob,
            maintenance_interval=60,
            **kwargs,  # type: ignore[arg-type]
        )
        self.job_functions = frozenset(job_functions)
        self.context = context or WorkerContext(connection)
        self._pvm_queues = list(queues)
        self._pvm_stop = threading.Event()
        self._pvm_registered = threading.Event()  # between RQ's register_birth and register_death
        # redis-py clients are thread-safe (a connection per command from the pool).
        self._pvm_connection = connection

    def execute_job(self, job: Job, queue: Queue) -> None:
        reason = refusal(job, self.job_functions)
        if reason is None:
            if isinstance(job, PvmJob):
                job.worker_context = self.context
            super().execute_job(job, queue)
        else:
            self._refuse(job, queue, reason)

    def _refuse(self, job: Job, queue: Queue, reason: str) -> None:
        """Fail a job that is not PVM's: into `queue`'s failed registry with the reason, no retry, nothing run."""
        log.error("worker %s: job %s on %s: %s", self.name, job.id, queue.name, reason)
        job.origin = queue.name  # where it was found, whatever its hash claims
        job.retries_left = None  # it would only be refused again
        job.ended_at = now()
        self.connection.lrem(queue.intermediate_queue_key, 1, job.id)
        self.handle_job_failure(
            job, queue, started_job_registry=queue.started_job_registry, exc_string=f"{JobRefused.__name__}: {reason}"
        )

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        # RQ removes the job from its intermediate list only for a worker of one queue; DurableQueue
        # put it there for any number, so take it out at the start in every case.
        super().prepare_job_execution(job, remove_from_intermediate_queue=True)

    def _keep_alive(self) -> None:
        next_reap = 0.0
        while not self._pvm_stop.is_set():
            try:
                with self._pvm_connection.pipeline(transaction=False) as pipe:
                    pipe.set(keys.worker_alive(self.name), os.getpid(), ex=defaults.WORKER_ALIVE_TTL_S)
                    if self._pvm_registered.is_set():  # again, in case a reaper dropped it while our key lapsed
                        worker_registration.register(self, pipe)
                    pipe.execute()
                now = time.monotonic()
                if now >= next_reap:
                    requeue_orphans(self._pvm_connection, self._pvm_queues)
                    drop_dead_workers(self._pvm_connection, self._pvm_queues)
                    next_reap = now + defaults.REAPER_INTERVAL_S
            except redis.exceptions.RedisError as exc:
                log.warning("worker %s: keep-alive failed: %s", self.name, exc)
            self._pvm_stop.wait(defaults.WORKER_ALIVE_REFRESH_S)

    def register_birth(self) -> None:
        super().register_birth()  # type: ignore[no-untyped-call]  # rq leaves it unannotated; untyped_calls_exclude misses super()
        self._pvm_registered.set()

    def register_death(self) -> None:
        self._pvm_registered.clear()
        super().register_death()  # type: ignore[no-untyped-call]  # as register_birth

    _pvm_waiting = False  # blocked in Redis for the next job: nothing is half done

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        self._pvm_waiting = True
        try:
            if self._stop_requested:
                raise StopRequested()
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        finally:
            self._pvm_waiting = False

    def _shutdown(self) -> None:
        """SIGTERM: stop now while waiting for a job, else after what the worker is doing.

        RQ raises `StopRequested` from the signal handler wherever the main thread is when the worker is not
        running a job, and code there that catches `Exception` (RQ's own bookkeeping of a failed job among it)
        swallows it: the worker then never stops. Raised only while the worker waits for a job; otherwise the
        loop stops at its next turn (`_stop_requested`).
        """
        self._stop_requested = True
        if self._pvm_waiting:
            raise StopRequested()
        if self.get_state() == WorkerStatus.BUSY:  # RQ's warm stop after the running job (it does not raise then)
            super()._shutdown()  # type: ignore[no-untyped-call]

    def work(self, *args: object, **kwargs: object) -> bool:
        self._pvm_connection.set(keys.worker_alive(self.name), os.getpid(), ex=defaults.WORKER_ALIVE_TTL_S)
        thread = threading.Thread(target=self._keep_alive, name="pvm-keep-alive", daemon=True)
        thread.start()
        try:
            return super().work(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            self._pvm_stop.set()
            thread.join(timeout=5)
            with contextlib.suppress(redis.exceptions.RedisError):
                self._pvm_connection.delete(keys.worker_alive(self.name))


def run_worker(pools: Sequence[str], settings: Settings, burst: bool = False, name: str | None = None) -> bool:
    """Run one worker process for `pools` in this process until stopped.

    Redis going away (a restart, a failover) can end RQ's work loop: a job
    whose outcome cannot be recorded raises out of it. The process then
    waits for Redis with backoff and starts a fresh worker under a new name;
    the interrupted job, left in the started registry, is requeued by the
    reaper once the old worker's alive key lapses.
    """
    connection = redis_from_settings(settings)
    queues = [pool_queue(p, connection) for p in pools]
    job_functions = keys.JOB_FUNCTIONS | set(settings.extra_job_functions)
    context = WorkerContext(connection, settings)  # kept across a restart after Redis came back
    generation = 0
    while True:
        try:
            # Inside the try: RQ's Worker() already talks to Redis (CLIENT SETNAME), which may be restarting.
            worker = PvmWorker(
                queues,
                connection,
                job_functions,
                context,
                name=f"{name}-{generation}" if name and generation else name,
            )
            return worker.work(burst=burst, logging_level="WARNING")
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            log.warning("worker lost Redis (%s); a new worker starts when Redis is back", exc)
        if not wait_for_redis(connection):
            return False
        generation += 1


def wait_for_redis(connection: redis.Redis) -> bool:
    """Ping Redis with backoff until it answers (True) or SIGTERM/SIGINT asks this process to stop (False)."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    wait = defaults.WORKER_RECONNECT_MIN_S
    while not stop.wait(wait):
        try:
            connection.ping()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            wait = min(wait * 2, defaults.WORKER_RECONNECT_MAX_S)
            continue
        log.warning("Redis is back; starting a new worker")
        return True
    return False


class WorkerGroup:
    """N worker processes for some pools, started, watched and stopped together."""

    def __init__(self, pools: Sequence[str], processes: int, settings: Settings) -> None:
        for pool in pools:
            queue_name(pool)  # validates the pool name before any process starts
        self.pools = list(pools)
        self.processes = processes
        self.settings = settings
        self.children: list[subprocess.Popen[bytes]] = []
        self.restarts = RestartPolicy()

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.update(self.settings.to_env())
        # A session of its own: a terminal's Ctrl-C reaches only the supervisor, which
        # then stops each child once (a second signal would make RQ stop cold).
        return subprocess.Popen(
            [sys.executable, "-m", "workers.ops.cli", "worker", *self.pools, "--processes", "1"],
            env=env,
            start_new_session=True,
        )

    def start(self) -> None:
        self.children = [self._spawn() for _ in range(self.processes)]
        for i in range(self.processes):
            self.restarts.spawned(f"worker {i} of {'+'.join(self.pools)}")

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every child (each finishes its batch), then SIGKILL any left after `timeout`."""
        terminate(self.children, timeout)

    def supervise(self, stop: threading.Event) -> None:
        """Restart children that die unexpectedly until `stop` is set (a crash loop with backoff)."""
        while not stop.wait(1.0):
            self.restart_dead()

    def restart_dead(self, now: float | None = None) -> list[int]:
        """Restart exited children per `RestartPolicy`; returns the slots restarted now."""
        now = time.monotonic() if now is None else now
        restarted = []
        for i, child in enumerate(self.children):
            name = f"worker {i} of {'+'.join(self.pools)}"
            if child.poll() is not None and self.restarts.due(name, child, now):
                self.children[i] = self._spawn()
                self.restarts.spawned(name, now)
                restarted.append(i)
        return restarted

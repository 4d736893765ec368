"""Runs RQ workers for PVM pools: msgpack only, long-lived processes, dead workers' jobs requeued quickly.

`PvmWorker` is an RQ `SimpleWorker` (no fork per job: one job carries a whole
batch, and a fork costs more than a batch's work) that

* keeps a short-lived "alive" key in Redis while its process lives, and
* reaps: a job left in a pool's started registry by a worker whose alive key
  lapsed (a ``kill -9``, an OOM kill, a lost node) goes back to the front of its
  queue within seconds, instead of after RQ's heartbeat timeout. Every pool job
  is idempotent, so running a batch again is safe.

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
from collections.abc import Sequence

import redis
from rq import Queue
from rq.executions import Execution
from rq.job import Job
from rq.registry import StartedJobRegistry
from rq.utils import parse_composite_key
from rq.worker import SimpleWorker

from contracts import keys
from pvm import defaults
from pvm.config import Settings
from pvm.connection import redis_from_settings
from pvm.queues import pool_queue, queue_name
from pvm.serializers import MsgpackSerializer

log = logging.getLogger(__name__)

WORKER_NAME_PREFIX = "pvm-"

_REQUEUE = """
-- KEYS: started registry, job hash, queue list, execution hash
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[2], 'status', 'queued')
  redis.call('DEL', KEYS[4])
  redis.call('LPUSH', KEYS[3], ARGV[2])
  return 1
end
return 0
"""


def requeue_orphans(connection: redis.Redis, queues: Sequence[Queue]) -> list[str]:
    """Requeue jobs whose PVM worker died mid-job; returns the requeued job ids."""
    script = connection.register_script(_REQUEUE)
    requeued = []
    for queue in queues:
        registry = StartedJobRegistry(queue.name, connection=connection, serializer=MsgpackSerializer)
        for raw in connection.zrange(registry.key, 0, -1):
            composite = raw.decode()
            job_id, execution_id = parse_composite_key(composite)
            execution_key = Execution(execution_id, job_id, connection).key
            worker = connection.hget(execution_key, "worker_name")
            worker_name = worker.decode() if worker else ""
            if not worker_name.startswith(WORKER_NAME_PREFIX):
                continue  # not ours: RQ's own heartbeat cleanup handles it
            if connection.exists(keys.worker_alive(worker_name)):
                continue
            done = script(
                keys=[registry.key, Job.key_for(job_id), queue.key, execution_key],
                args=[composite, job_id],
            )
            if done:
                log.warning("requeued job %s of dead worker %s on %s", job_id, worker_name, queue.name)
                requeued.append(job_id)
    return requeued


class PvmWorker(SimpleWorker):
    """An RQ SimpleWorker with the msgpack serializer, an alive key and an orphan reaper."""

    def __init__(self, queues: Sequence[Queue], connection: redis.Redis, **kwargs: object) -> None:
        name = (
            kwargs.pop("name", None)
            or f"{WORKER_NAME_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        super().__init__(
            list(queues),
            connection=connection,
            name=str(name),
            serializer=MsgpackSerializer,
            maintenance_interval=60,
            **kwargs,  # type: ignore[arg-type]
        )
        self._pvm_queues = list(queues)
        self._pvm_stop = threading.Event()
        # redis-py clients are thread-safe (a connection per command from the pool).
        self._pvm_connection = connection

    def _keep_alive(self) -> None:
        next_reap = 0.0
        while not self._pvm_stop.is_set():
            try:
                self._pvm_connection.set(keys.worker_alive(self.name), os.getpid(), ex=defaults.WORKER_ALIVE_TTL_S)
                now = time.monotonic()
                if now >= next_reap:
                    requeue_orphans(self._pvm_connection, self._pvm_queues)
                    next_reap = now + defaults.REAPER_INTERVAL_S
            except redis.exceptions.RedisError as exc:
                log.warning("worker %s: keep-alive failed: %s", self.name, exc)
            self._pvm_stop.wait(defaults.WORKER_ALIVE_REFRESH_S)

    def work(self, *args: object, **kwargs: object) -> bool:  # type: ignore[override]
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
    """Run one worker process for `pools` in this process until stopped."""
    connection = redis_from_settings(settings)
    queues = [pool_queue(p, connection) for p in pools]
    worker = PvmWorker(queues, connection, name=name)
    return worker.work(burst=burst, logging_level="WARNING")


class WorkerGroup:
    """N worker processes for some pools, started, watched and stopped together."""

    def __init__(self, pools: Sequence[str], processes: int, settings: Settings) -> None:
        for pool in pools:
            queue_name(pool)  # validates the pool name before any process starts
        self.pools = list(pools)
        self.processes = processes
        self.settings = settings
        self.children: list[subprocess.Popen[bytes]] = []

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.update(self.settings.to_env())
        # A session of its own: a terminal's Ctrl-C reaches only the supervisor, which
        # then stops each child once (a second signal would make RQ stop cold).
        return subprocess.Popen(
            [sys.executable, "-m", "pvm.cli", "worker", *self.pools, "--processes", "1"],
            env=env,
            start_new_session=True,
        )

    def start(self) -> None:
        self.children = [self._spawn() for _ in range(self.processes)]

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every child (each finishes its batch), then SIGKILL any left after `timeout`."""
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in self.children:
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    def supervise(self, stop: threading.Event) -> None:
        """Restart children that die unexpectedly until `stop` is set."""
        while not stop.wait(1.0):
            for i, child in enumerate(self.children):
                code = child.poll()
                if code is not None:
                    log.warning("worker process %d for %s exited with %s; restarting", child.pid, self.pools, code)
                    self.children[i] = self._spawn()

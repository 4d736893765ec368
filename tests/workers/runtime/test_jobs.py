"""Only PVM's own job functions run: planted jobs on every queue are refused, unimported, into the failed registry."""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from rq.job import Job
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.results import Result
from rq.utils import utcformat

from contracts import encode_minute, keys
from pvm.config import ConfigError, Settings
from pvm.stores.log import LogReader
from tests.conftest import free_port
from tests.workers import planted_import
from tests.workers.jobs import ALLOWED_IN_TESTS
from tests.workers.minutes import minute
from workers.runtime.context import WorkerContext
from workers.runtime.jobs import JOBS, job_function
from workers.runtime.queues import pool_queue
from workers.runtime.runner import PvmWorker
from workers.runtime.scheduler import default_schedules
from workers.runtime.serializers import MsgpackSerializer

PLANTED_MODULE = "tests.workers.planted_import"
SLOW_MARKER = "tests.workers.jobs.slow_marker"


def plant(connection: redis.Redis, queue: str, func: str, args: list[object], **fields: str | bytes) -> str:
    """Put a job on `queue` by hand, as anyone who can write to Redis can: a job hash and its id on the list."""
    job_id = uuid.uuid4().hex
    stamp = utcformat(datetime.now(UTC))
    connection.hset(
        f"rq:job:{job_id}",
        mapping={
            "data": MsgpackSerializer.dumps((func, None, args, {})),
            "origin": queue,
            "status": "queued",
            "created_at": stamp,
            "enqueued_at": stamp,
            "description": f"{func}(...)",
            "timeout": "60",
            **fields,
        },
    )
    connection.rpush(f"rq:queue:{queue}", job_id)
    return job_id


def refusal(connection: redis.Redis, job_id: str) -> str:
    """The failure a refused job carries; asserts it was failed, not run, and sits in its failed registry."""
    job = Job.fetch(job_id, connection=connection, serializer=MsgpackSerializer)
    assert job.get_status() == "failed", job_id
    assert job_id in FailedJobRegistry(job.origin, connection=connection, serializer=MsgpackSerializer)
    result = job.latest_result()
    assert result is not None and result.exc_string
    return result.exc_string


def test_every_job_name_is_a_stable_name_registered_to_a_function_of_its_pool() -> None:
    assert set(JOBS) == keys.JOB_FUNCTIONS
    for name, target in JOBS.items():
        # A name, not a module path: moving a module changes the registry, never a job stored in Redis.
        assert re.fullmatch(r"[a-z]+(-[a-z]+)+", name), name
        module, _, attribute = target.partition(":")
        assert re.fullmatch(r"workers\.(log|index|facts|summarize|evaluate)\.pool", module), target
        function = job_function(name)
        # A plain function defined in that pool module: what the name resolves to is what the pool wrote.
        assert inspect.isfunction(function), name
        assert (function.__module__, function.__qualname__) == (module, attribute), name
        first = next(iter(inspect.signature(function).parameters.values()))
        assert first.annotation in ("WorkerContext", WorkerContext), f"{target} takes the worker context first"
    assert set(keys.POOL_JOBS) == set(keys.QUEUES) - set(keys.SCHEDULED_POOLS)
    assert set(keys.POOL_JOBS.values()) <= keys.JOB_FUNCTIONS
    assert job_function("os.system") is None and job_function("tests.workers.jobs.slow_marker") is None


def test_the_names_jobs_were_queued_under_before_resolve_to_the_same_work() -> None:
    assert set(keys.LEGACY_JOB_NAMES.values()) == keys.JOB_FUNCTIONS
    for legacy, name in keys.LEGACY_JOB_NAMES.items():
        assert legacy.startswith("workers.") and keys.job_name(legacy) == name
        assert job_function(legacy) is job_function(name) is not None, legacy
    assert keys.job_name(keys.LOG_JOB) == keys.LOG_JOB and keys.job_name("os.system") == "os.system"


def test_a_job_queued_under_its_old_name_runs_after_the_upgrade(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade with jobs in flight loses none: jobs an older PVM stored under module paths run as their job."""
    for k, v in settings.with_(downstream=("index",)).to_env().items():
        monkeypatch.setenv(k, v)
    minutes = [minute("message", i, project_id="upgraded", memory_note=f"note {i}") for i in range(3)]
    entries = [[f"{100 + i}-0", encode_minute(m)] for i, m in enumerate(minutes)]
    # As PVM 0.1.0 stored it: the function's module path then, in a job hash and on the queue's list.
    log_job = plant(redis_client, keys.LOG_QUEUE, "workers.log_pool.run", [entries])
    PvmWorker([pool_queue("log", redis_client)], redis_client).work(burst=True)
    assert Job.fetch(log_job, connection=redis_client, serializer=MsgpackSerializer).get_status() == "finished"
    assert [r.minute.id for r in LogReader(settings.log_dir).history("upgraded")] == [m.id for m in minutes]
    # What it fanned out is queued under the stable name, and runs.
    (index_job,) = pool_queue("index", redis_client).jobs
    assert index_job.func_name == keys.INDEX_JOB
    PvmWorker([pool_queue("index", redis_client)], redis_client).work(burst=True)
    assert index_job.get_status(refresh=True) == "finished"


def test_extra_job_functions_are_exact_dotted_names_read_from_the_environment() -> None:
    settings = Settings.from_env({"PVM_EXTRA_JOB_FUNCTIONS": " site.jobs.nightly , tests.workers.jobs.slow_marker"})
    assert settings.extra_job_functions == ("site.jobs.nightly", "tests.workers.jobs.slow_marker")
    assert Settings.from_env(settings.to_env()) == settings
    assert Settings.from_env({}).extra_job_functions == ()
    for bad in ("os", "os.*", "os.system(1)", "pkg..f"):
        with pytest.raises(ConfigError, match=r"PVM_EXTRA_JOB_FUNCTIONS names .* dotted function name"):
            Settings.from_env({"PVM_EXTRA_JOB_FUNCTIONS": bad})


def test_the_scheduler_only_schedules_pvm_jobs(settings: Settings) -> None:
    schedules = default_schedules(settings)
    assert schedules, "the embedded engine has a periodic optimize"
    assert {s.func for s in schedules} <= keys.JOB_FUNCTIONS


def test_planted_jobs_on_every_queue_are_refused_unimported_and_failed(
    redis_client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    monkeypatch.setenv(planted_import.MARKER_ENV, str(marker))
    planted: dict[str, str] = {}
    ours = []
    for pool, queue in keys.QUEUES.items():
        planted[plant(redis_client, queue, "os.mkdir", [str(tmp_path / f"{queue}-mkdir")])] = "os.mkdir"
        evil = f"__import__('os').mkdir({str(tmp_path / f'{queue}-eval')!r})"
        planted[plant(redis_client, queue, "builtins.eval", [evil])] = "builtins.eval"
        planted[plant(redis_client, queue, f"{PLANTED_MODULE}.run", [])] = f"{PLANTED_MODULE}.run"
        planted[plant(redis_client, queue, "run", [], data=b"\x80\x04\x95not msgpack")] = ""  # a pickle, say
        ours.append(pool_queue(pool, redis_client).enqueue(SLOW_MARKER, str(tmp_path / f"{queue}-ours"), 0.0))
    sys.modules.pop(PLANTED_MODULE, None)
    worker = PvmWorker(
        [pool_queue(pool, redis_client) for pool in keys.QUEUES],
        redis_client,
        job_functions=ALLOWED_IN_TESTS,
        name="pvm-test-planted",
    )
    worker.work(burst=True, logging_level="WARNING")

    expected = sorted(f"{q}-ours{suffix}" for q in keys.QUEUES.values() for suffix in ("", ".started"))
    assert sorted(p.name for p in tmp_path.iterdir()) == expected, "a planted job ran"
    assert PLANTED_MODULE not in sys.modules and not marker.exists(), "a planted job's module was imported"
    for job_id, func in planted.items():
        reason = refusal(redis_client, job_id)
        if func:
            assert f"job function '{func}' is not a PVM job; refused (allowed: " in reason, reason
            assert keys.LOG_JOB in reason
        else:
            assert "job data cannot be decoded" in reason, reason
    assert [j.get_status(refresh=True) for j in ours] == ["finished"] * len(ours)  # PVM's jobs still run
    for queue in worker.queues:
        assert queue.count == 0 and redis_client.llen(queue.intermediate_queue_key) == 0
        assert StartedJobRegistry(queue.name, connection=redis_client).get_job_count(cleanup=False) == 0


def test_a_pvm_job_that_asks_for_callbacks_or_webhooks_is_refused(
    redis_client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    monkeypatch.setenv(planted_import.MARKER_ENV, str(marker))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    hook = json.dumps([{"url": f"http://127.0.0.1:{listener.getsockname()[1]}/", "job_status": "failed"}])
    queue = keys.LOG_QUEUE
    callback = f"{PLANTED_MODULE}.callback"
    asks = {
        plant(redis_client, queue, keys.LOG_JOB, [[]], success_callback_name=callback): "a success callback",
        plant(redis_client, queue, keys.LOG_JOB, [[]], failure_callback_name=callback): "a failure callback",
        plant(redis_client, queue, keys.LOG_JOB, [[]], stopped_callback_name=callback): "a stopped callback",
        plant(redis_client, queue, keys.LOG_JOB, [[]], webhooks=hook): "webhooks",
    }
    sys.modules.pop(PLANTED_MODULE, None)
    PvmWorker([pool_queue("log", redis_client)], redis_client).work(burst=True, logging_level="WARNING")
    for job_id, what in asks.items():
        reason = refusal(redis_client, job_id)
        assert f"asks for {what}" in reason and "refused" in reason, reason
    assert PLANTED_MODULE not in sys.modules and not marker.exists()
    with pytest.raises(BlockingIOError):
        listener.accept()  # no webhook was sent
    listener.close()


def test_rq_maintenance_never_imports_an_abandoned_planted_jobs_callback(
    redis_client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    monkeypatch.setenv(planted_import.MARKER_ENV, str(marker))
    queue = keys.LOG_QUEUE
    callback = f"{PLANTED_MODULE}.callback"
    job_id = plant(redis_client, queue, "os.mkdir", [str(tmp_path / "mkdir")], failure_callback_name=callback)
    redis_client.lrem(f"rq:queue:{queue}", 1, job_id)
    redis_client.hset(f"rq:job:{job_id}", "status", "started")
    # An execution whose heartbeat expired long ago: RQ's cleanup calls the job's failure callback.
    redis_client.zadd(f"rq:wip:{queue}", {f"{job_id}:exec1": 1.0})
    sys.modules.pop(PLANTED_MODULE, None)
    PvmWorker([pool_queue("log", redis_client)], redis_client).clean_registries()
    assert PLANTED_MODULE not in sys.modules and not marker.exists()
    assert not (tmp_path / "mkdir").exists()
    assert Job.fetch(job_id, connection=redis_client, serializer=MsgpackSerializer).get_status() == "failed"


def spawn(args: list[str], settings: Settings, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "workers.ops.cli", *args],
        env={**os.environ, **settings.to_env(), "PYTHONPATH": str(Path.cwd()), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_the_pvm_worker_command_refuses_planted_jobs_on_every_queue(
    redis_client: redis.Redis, settings: Settings, tmp_path: Path
) -> None:
    marker = tmp_path / "imported"
    planted = []
    for queue in keys.QUEUES.values():
        planted.append(plant(redis_client, queue, "os.mkdir", [str(tmp_path / f"{queue}-mkdir")]))
        planted.append(plant(redis_client, queue, f"{PLANTED_MODULE}.run", []))
    worker = spawn(["worker", *keys.QUEUES, "--burst"], settings, {planted_import.MARKER_ENV: str(marker)})
    out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, out
    assert not list(tmp_path.glob("*-mkdir")) and not marker.exists(), out
    for job_id in planted:
        assert "is not a PVM job; refused" in refusal(redis_client, job_id)


@pytest.mark.slow
def test_pvm_serve_refuses_a_planted_job_on_the_index_queue(
    redis_client: redis.Redis, settings: Settings, tmp_path: Path
) -> None:
    target = tmp_path / "mkdir"
    job_id = plant(redis_client, keys.QUEUES["index"], "os.mkdir", [str(target)])
    server = spawn(["serve", "--port", str(free_port()), "--index-worker", "yes"], settings, {})
    try:
        job = Job.fetch(job_id, connection=redis_client, serializer=MsgpackSerializer)
        deadline = time.monotonic() + 60
        while job.get_status(refresh=True) not in ("finished", "failed"):
            assert server.poll() is None, server.communicate()[0]
            assert time.monotonic() < deadline, "pvm serve never took the planted job"
            time.sleep(0.1)
    finally:
        stopped(server)
    assert not target.exists()
    assert "job function 'os.mkdir' is not a PVM job; refused" in refusal(redis_client, job_id)


@pytest.mark.slow
def test_pvm_serve_prints_every_threads_stack_on_sigusr1(settings: Settings) -> None:
    # What a server that does not stop is waiting on (`stopped` asks for it before killing one).
    server = spawn(["serve", "--port", str(free_port()), "--index-worker", "no"], settings, {})
    assert server.stdout is not None
    first = server.stdout.readline()
    assert "pvm serve: reader API on" in first, first
    server.send_signal(signal.SIGUSR1)
    time.sleep(0.5)
    assert server.poll() is None  # it keeps serving
    out = stopped(server)
    assert "(most recent call first)" in out and 'File "' in out, out
    assert server.returncode == 0, out


def test_a_pvm_worker_prints_every_threads_stack_on_sigusr1_and_goes_on(
    redis_client: redis.Redis, settings: Settings
) -> None:
    # Registered by the CLI's entry, so every long-running command has it, not only `pvm serve`.
    from rq import Worker

    name = f"usr1-{uuid.uuid4().hex[:8]}"
    worker = spawn(["worker", "log", "--name", name], settings, {})
    try:
        deadline = time.monotonic() + 30
        # Registered under its name: past its start, waiting for work.
        while name not in {w.name for w in Worker.all(connection=redis_client)}:
            assert worker.poll() is None, worker.communicate()[0]
            assert time.monotonic() < deadline, "pvm worker never registered"
            time.sleep(0.1)
        worker.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        assert worker.poll() is None  # it keeps working
    finally:
        out = stopped(worker)
    assert "(most recent call first)" in out and 'File "' in out, out
    assert worker.returncode == 0, out


def stopped(server: subprocess.Popen[str], within_s: float = 30) -> str:
    """SIGTERM `server` and its output once it exited; one that has not within `within_s` fails the test with every
    thread's stack (every `pvm` command prints them on SIGUSR1), then is killed."""
    server.send_signal(signal.SIGTERM)
    try:
        return server.communicate(timeout=within_s)[0]
    except subprocess.TimeoutExpired:
        server.send_signal(signal.SIGUSR1)
        time.sleep(1)
        server.kill()
        pytest.fail(
            f"the pvm command did not stop within {within_s:g} s of SIGTERM; its threads:\n{server.communicate()[0]}"
        )


@pytest.mark.parametrize("pools", [["log"], list(keys.QUEUES)], ids=["one-queue", "all-queues"])
def test_a_job_hash_rq_cannot_read_is_failed_and_the_worker_keeps_going(
    redis_client: redis.Redis, tmp_path: Path, pools: list[str]
) -> None:
    queue = keys.LOG_QUEUE
    bad_date = plant(redis_client, queue, keys.LOG_JOB, [[]], created_at="not a date")
    no_data = plant(redis_client, queue, keys.LOG_JOB, [[]])
    redis_client.hdel(f"rq:job:{no_data}", "data")
    ours = pool_queue("log", redis_client).enqueue(SLOW_MARKER, str(tmp_path / "ours"), 0.0)
    worker = PvmWorker([pool_queue(p, redis_client) for p in pools], redis_client, ALLOWED_IN_TESTS)
    worker.work(burst=True, logging_level="WARNING")
    assert ours.get_status(refresh=True) == "finished"  # the planted hashes did not stop the worker
    registry = FailedJobRegistry(queue, connection=redis_client, serializer=MsgpackSerializer)
    for job_id in (bad_date, no_data):
        assert job_id in registry and redis_client.hget(f"rq:job:{job_id}", "status") == b"failed"
        [result] = Result.all(Job(job_id, connection=redis_client, serializer=MsgpackSerializer))
        assert result.exc_string is not None and "job hash cannot be read" in result.exc_string
        assert redis_client.ttl(f"rq:job:{job_id}") > 0  # it goes away with the failed registry's entry
    assert redis_client.llen(f"rq:queue:{queue}:intermediate") == 0 and redis_client.llen(f"rq:queue:{queue}") == 0


def test_job_data_is_compressed_once_fast_and_saved_again_as_it_was_read(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # RQ compresses a job's data (zlib level 6) on every save; PvmJob compresses it once at level 1 when it is
    # enqueued and saves the bytes it was read with afterwards. The stored data still reads back as RQ reads it.
    import zlib

    from workers.runtime.jobs import DATA_COMPRESSION_LEVEL, PvmJob

    queue = pool_queue("log", redis_client)
    records = [[f"id-{i}", i, b"x" * 200 + str(i).encode()] for i in range(500)]
    job = queue.enqueue("workers.log.pool.run", records, job_id="compress-once")
    stored = redis_client.hget(job.key, "data")
    assert isinstance(stored, bytes) and stored == zlib.compress(job.data, DATA_COMPRESSION_LEVEL)
    assert zlib.decompress(stored) == job.data

    compressed: list[int] = []
    real = zlib.compress
    monkeypatch.setattr(zlib, "compress", lambda data, *a: compressed.append(len(data)) or real(data, *a))
    fetched = PvmJob.fetch("compress-once", connection=redis_client, serializer=MsgpackSerializer)
    assert fetched.args == [records] and fetched.func_name == "workers.log.pool.run"
    fetched.meta["seen"] = True
    fetched.save()  # as a worker saves a job's outcome: the same bytes, not compressed again
    assert redis_client.hget(job.key, "data") == stored
    assert max(compressed, default=0) < 1000  # the 100 KB of data was not compressed again (RQ's meta may be)
    assert Job.fetch("compress-once", connection=redis_client, serializer=MsgpackSerializer).args == [records]

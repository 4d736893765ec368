from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from pvm import defaults
from pvm.config import Settings
from pvm.queues import pool_queue
from pvm.serializers import MsgpackSerializer


def spawn(args: list[str], settings: Settings) -> subprocess.Popen[str]:
    env = {**os.environ, **settings.to_env(), "PYTHONPATH": str(Path.cwd())}
    return subprocess.Popen(
        [sys.executable, "-m", "pvm.cli", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_sigterm_finishes_the_current_batch_then_exits(
    redis_client: redis.Redis, settings: Settings, tmp_path: Path
) -> None:
    marker = tmp_path / "job"
    queue = pool_queue("log", redis_client)
    job = queue.enqueue("tests.workers.jobs.slow_marker", str(marker), 1.5)
    queue.enqueue("tests.workers.jobs.slow_marker", str(tmp_path / "second"), 0.1)
    worker = spawn(["worker", "log"], settings)
    try:
        wait_for(Path(str(marker) + ".started"))
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
    assert marker.read_text() == "done"
    job.refresh()
    assert job.get_status() == "finished"
    assert not (tmp_path / "second").exists()  # it stopped after the batch in hand
    assert queue.count == 1


def test_several_processes_serve_one_pool(redis_client: redis.Redis, settings: Settings, tmp_path: Path) -> None:
    queue = pool_queue("log", redis_client)
    for i in range(4):
        queue.enqueue("tests.workers.jobs.slow_marker", str(tmp_path / f"j{i}"), 1.0)
    group = spawn(["worker", "log", "--processes", "2"], settings)
    try:
        wait_for(tmp_path / "j0.started")
        deadline = time.monotonic() + 20
        while len(list(tmp_path.glob("*.started"))) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        started = sorted(p.stat().st_mtime for p in tmp_path.glob("*.started"))
        assert started[1] - started[0] < 0.9  # two jobs ran at the same time
        assert len([w for w in redis_client.smembers("rq:workers:pvm-log")]) == 2
    finally:
        group.send_signal(signal.SIGTERM)
        assert group.wait(30) == 0


@pytest.mark.slow
def test_a_running_worker_requeues_a_job_a_killed_worker_left_unstarted(
    redis_client: redis.Redis, settings: Settings, tmp_path: Path
) -> None:
    queue = pool_queue("log", redis_client)
    marker = tmp_path / "stranded"
    job = queue.enqueue("tests.workers.jobs.slow_marker", str(marker), 0.0)
    # What a worker killed between RQ's BLMOVE and its started registry leaves behind.
    assert queue.dequeue_any([queue], None, connection=redis_client, serializer=MsgpackSerializer) is not None
    assert queue.count == 0
    worker = spawn(["worker", "log"], settings)
    try:
        wait_for(marker, timeout=defaults.STRANDED_GRACE_S + 4 * defaults.REAPER_INTERVAL_S + 30)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    assert job.get_status(refresh=True) == "finished"
    assert redis_client.llen(queue.intermediate_queue_key) == 0

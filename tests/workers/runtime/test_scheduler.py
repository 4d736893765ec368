"""The scheduler against a real Redis and real RQ workers: cadence, one leader, no doubled or piled-up runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from rq.job import Job

from contracts import keys
from pvm.config import Settings
from tests.workers.jobs import ALLOWED_IN_TESTS
from workers.runtime.queues import pool_queue
from workers.runtime.runner import PvmWorker
from workers.runtime.scheduler import Schedule, Scheduler, default_schedules, read_schedules
from workers.runtime.serializers import MsgpackSerializer


def marker_schedule(tmp_path: Path, every_s: float = 60.0, name: str = "mark") -> Schedule:
    return Schedule(name, every_s, "log", "tests.workers.jobs.slow_marker", (str(tmp_path / name), 0.0))


def drain(redis_client: redis.Redis, pool: str = "log") -> None:
    worker = PvmWorker([pool_queue(pool, redis_client)], redis_client, ALLOWED_IN_TESTS)
    worker.work(burst=True, logging_level="WARNING")


def test_the_embedded_engine_gets_a_periodic_optimize_and_a_qdrant_server_none(settings: Settings) -> None:
    [optimize, evaluate] = default_schedules(settings)
    assert (optimize.name, optimize.pool, optimize.func) == ("optimize", "index", keys.INDEX_OPTIMIZE_JOB)
    assert optimize.every_s == settings.optimize_every_s == 3600
    assert (evaluate.name, evaluate.pool, evaluate.func) == ("evaluate", "evaluate", keys.EVALUATE_PLAN_JOB)
    assert evaluate.delay_first and not optimize.delay_first
    assert evaluate.every_s == settings.evaluate_every_s == 6 * 3600
    assert default_schedules(settings.with_(qdrant_url="http://qdrant:6333")) == [evaluate]
    assert default_schedules(settings.with_(optimize_every_s=0, evaluate_every_s=0)) == []


def test_a_delayed_schedule_runs_first_one_interval_after_it_is_recorded(redis_client: redis.Redis) -> None:
    delayed = Schedule("heavy", 60, "log", keys.LOG_JOB, delay_first=True)
    scheduler = Scheduler(redis_client, [delayed], name="t")
    assert scheduler.tick(now=1000.0) == []  # recorded: its cadence starts here
    assert scheduler.tick(now=1059.0) == []
    assert scheduler.tick(now=1060.0) == ["heavy"]
    assert scheduler.tick(now=1061.0) == []


def test_bad_schedules_are_refused(redis_client: redis.Redis, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="every_s must be positive"):
        Schedule("x", 0, "log", "f")
    with pytest.raises(ValueError, match="without ':'"):
        Schedule("a:b", 1, "log", "f")
    with pytest.raises(ValueError, match="repeat"):
        Scheduler(redis_client, [marker_schedule(tmp_path), marker_schedule(tmp_path)])


def test_a_schedule_runs_at_once_then_every_interval(redis_client: redis.Redis, tmp_path: Path) -> None:
    scheduler = Scheduler(redis_client, [marker_schedule(tmp_path, every_s=60)], name="s1")
    assert scheduler.tick(now=1000.0) == ["mark"]  # never ran: due now
    assert scheduler.tick(now=1059.0) == []
    drain(redis_client)
    assert (tmp_path / "mark").read_text() == "done"
    assert scheduler.tick(now=1060.0) == ["mark"]
    [state] = read_schedules(redis_client)
    assert (state.name, state.every_s, state.last_run) == ("mark", 60.0, 1060.0)
    assert state.due_at() == 1120.0
    job = Job.fetch(state.job_id or "", connection=redis_client, serializer=MsgpackSerializer)
    assert job.func_name == "tests.workers.jobs.slow_marker" and job.get_status() == "queued"
    assert pool_queue("log", redis_client).count == 1


def test_a_run_whose_previous_job_is_unfinished_is_skipped_not_piled_up(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    scheduler = Scheduler(redis_client, [marker_schedule(tmp_path, every_s=10)], name="s1")
    assert scheduler.tick(now=0.0) == ["mark"]
    assert scheduler.tick(now=10.0) == [] and scheduler.tick(now=20.0) == []  # the pool has not run it yet
    assert scheduler.stats.skipped == {"mark": 2}
    assert pool_queue("log", redis_client).count == 1
    drain(redis_client)
    assert scheduler.tick(now=30.0) == ["mark"]


def test_only_the_lease_holder_enqueues_and_a_standby_takes_over(redis_client: redis.Redis, tmp_path: Path) -> None:
    first = Scheduler(redis_client, [marker_schedule(tmp_path, every_s=10)], name="first")
    second = Scheduler(redis_client, [marker_schedule(tmp_path, every_s=10)], name="second")
    assert first.tick(now=0.0) == ["mark"] and first.leading
    drain(redis_client)
    assert second.tick(now=100.0) == [] and not second.leading
    assert redis_client.get(keys.scheduler_leader()) == b"first"
    # The leader dies without a word: its lease runs out, and the standby's next tick takes over.
    redis_client.pexpire(keys.scheduler_leader(), 1)
    while redis_client.exists(keys.scheduler_leader()):
        pass
    assert second.tick(now=100.0) == ["mark"] and second.leading
    assert first.tick(now=200.0) == [] and not first.leading
    # A leader that stops releases the lease: the other takes over on its next tick, not a lease later.
    second.release_lease()
    drain(redis_client)
    assert first.tick(now=200.0) == ["mark"]


def test_two_schedulers_that_both_think_they_lead_cannot_run_one_period_twice(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    schedule = marker_schedule(tmp_path, every_s=10)
    other = Scheduler(redis_client, [schedule], name="other")

    class Stalled(Scheduler):
        """Looks at the previous job, and in that instant the other scheduler runs the same period."""

        def _pending(self, job_id: str) -> bool:
            assert other._run_if_due(schedule, 10.0)
            return super()._pending(job_id)

    stalled = Stalled(redis_client, [schedule], name="stalled")
    assert stalled.tick(now=0.0) == ["mark"]
    drain(redis_client)
    assert stalled._run_if_due(schedule, 10.0) is False  # its WATCH saw the other's run: no second job
    assert pool_queue("log", redis_client).count == 1
    [state] = read_schedules(redis_client)
    assert state.last_run == 10.0


def test_scheduler_once_and_list_from_the_command_line(settings: Settings, tmp_path: Path) -> None:
    env = {**os.environ, **settings.to_env(), "PYTHONPATH": str(Path.cwd())}

    def pvm(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "workers.ops.cli", "scheduler", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    before = pvm("--list")
    assert before.returncode == 0 and "leader: none" in before.stdout and "never" in before.stdout
    once = pvm("--once", "--name", "cli-test")
    assert once.returncode == 0 and once.stdout.strip() == "enqueued: optimize", once.stdout + once.stderr
    again = pvm("--once")
    assert again.returncode == 0 and "nothing due" in again.stdout  # the lease was released: it leads, nothing due
    listed = pvm("--list")
    row = next(line for line in listed.stdout.splitlines() if line.startswith("optimize"))
    assert " ago " in row and ("in 60.0m" in row or "in 59.9m" in row), listed.stdout
    helped = subprocess.run(
        [sys.executable, "-m", "workers.ops.cli", "scheduler", "--help"], env=env, capture_output=True, text=True
    )
    assert "PVM_OPTIMIZE_EVERY" in helped.stdout


def test_run_leads_enqueues_and_hands_the_lease_back_on_stop(redis_client: redis.Redis, tmp_path: Path) -> None:
    import threading
    import time

    scheduler = Scheduler(redis_client, [marker_schedule(tmp_path, every_s=3600)], name="runner")
    thread = threading.Thread(target=scheduler.run, kwargs={"tick_s": 0.05})
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while pool_queue("log", redis_client).count == 0:
            assert time.monotonic() < deadline, "the running scheduler never enqueued its due schedule"
            time.sleep(0.02)
        assert redis_client.get(keys.scheduler_leader()) == b"runner"
    finally:
        scheduler.stop_event.set()
        thread.join(10)
    assert not thread.is_alive()
    assert redis_client.get(keys.scheduler_leader()) is None  # a standby need not wait out the lease
    assert scheduler.stats.enqueued == {"mark": 1} and pool_queue("log", redis_client).count == 1


def test_the_leader_drops_the_state_of_schedules_it_no_longer_has(redis_client: redis.Redis, tmp_path: Path) -> None:
    old = Scheduler(redis_client, [marker_schedule(tmp_path, name="gone"), marker_schedule(tmp_path)], name="old")
    assert sorted(old.tick(now=0.0)) == ["gone", "mark"]
    old.release_lease()
    new = Scheduler(redis_client, [marker_schedule(tmp_path)], name="new")  # "gone" was configured away
    new.tick(now=1.0)
    assert [st.name for st in read_schedules(redis_client)] == ["mark"]
    Scheduler(redis_client, [], name="new").tick(now=2.0)  # e.g. PVM_OPTIMIZE_EVERY=0: nothing left to report
    assert read_schedules(redis_client) == []

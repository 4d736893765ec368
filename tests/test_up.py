"""`pvm up` on the embedded default: Valkey, dispatcher, log pool, API + index pool, scheduler; Ctrl-C stops all."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from rq.job import Job

from contracts import Minute
from pvm.config import Settings
from pvm.emitter import Emitter
from pvm.stores.log import LogReader
from tests.conftest import free_port
from workers.runtime.scheduler import read_schedules
from workers.runtime.serializers import MsgpackSerializer

pytestmark = pytest.mark.slow


def test_pvm_up_runs_the_pipeline_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PVM_REDIS_URL"}
    env["PVM_HOME"] = str(tmp_path)
    api_port = free_port()
    up = subprocess.Popen(
        [sys.executable, "-m", "workers.ops.cli", "up", "--api-port", str(api_port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert up.stdout is not None
        url = None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            line = up.stdout.readline()
            found = re.search(r"PVM_REDIS_URL=(\S+)", line)
            url = found.group(1) if found else None
        assert url, "pvm up never printed the Redis URL"
        settings = Settings(redis_url=url, home=tmp_path, log_dir=tmp_path / "var/log", spool_dir=tmp_path / "spool")
        with Emitter(settings=settings) as em:
            ids = [em.emit(Minute(project_id="up-test", event_type="message")) for _ in range(100)]
        reader = LogReader(settings.log_dir)
        deadline = time.monotonic() + 30
        while reader.count("up-test") < 100:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert [r.id for r in reader.history("up-test")] == ids
        # the index pool runs inside `pvm serve`; the CLI reads through the API
        cli_env = {**env, "PVM_API_URL": f"http://127.0.0.1:{api_port}", "PVM_REDIS_URL": url}
        deadline = time.monotonic() + 30
        while True:
            ctx = subprocess.run(
                [sys.executable, "-m", "workers.ops.cli", "context", "--project", "up-test", "--agent", "a1", "--json"],
                env=cli_env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            if ctx.returncode == 0 and json.loads(ctx.stdout)["freshness"]["index"]["seq"] == 100:
                break
            assert time.monotonic() < deadline, ctx.stdout + ctx.stderr
            time.sleep(0.2)
        package = json.loads(ctx.stdout)
        assert package["recent"][-1]["id"] == ids[-1] and package["freshness"]["index"]["behind"] == 0
        found = subprocess.run(
            [sys.executable, "-m", "workers.ops.cli", "search", "--project", "up-test", "message", "--json"],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert found.returncode == 0 and json.loads(found.stdout)["hits"]
        # the scheduler ran the embedded engine's optimize at start, in the process that owns the engine
        r = redis.Redis.from_url(url)
        deadline = time.monotonic() + 60
        while True:
            states = {st.name: st for st in read_schedules(r)}
            job_id = states["optimize"].job_id if "optimize" in states else None
            status = Job.fetch(job_id, connection=r, serializer=MsgpackSerializer).get_status() if job_id else None
            if status == "finished":
                break
            assert time.monotonic() < deadline, f"optimize never finished: {states}, {status}"
            time.sleep(0.2)
        listed = subprocess.run(
            [sys.executable, "-m", "workers.ops.cli", "scheduler", "--list"],
            env=cli_env,
            capture_output=True,
            text=True,
        )
        assert listed.returncode == 0 and "optimize" in listed.stdout and "-up" in listed.stdout, listed.stdout
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=60)
        assert up.returncode == 0
        assert "pvm up: stopped" in out
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    # every child is gone: nothing left listening on the embedded port
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    import socket

    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0

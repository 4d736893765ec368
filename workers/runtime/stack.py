"""The PVM stack on one machine: Redis (embedded Valkey unless PVM_REDIS_URL is set), dispatcher, pools, scheduler."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from pvm import defaults
from pvm.config import Settings
from workers.runtime.embedded import EmbeddedRedis

log = logging.getLogger(__name__)

# Pools `pvm up` runs as worker processes, in start order. Later pools join here as they land.
# The index and evaluate pools run inside `pvm serve` with the embedded engine (one process owns its files).
STACK_POOLS = ("log", "facts", "summarize")


def terminate(children: Iterable[subprocess.Popen[bytes]], timeout: float) -> None:
    """SIGTERM every child still running (workers finish their batch), then SIGKILL any left after `timeout`."""
    children = list(children)
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for child in children:
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


class RestartPolicy:
    """When a supervisor restarts an exited child: at once, unless it keeps dying right after its start.

    A child that exits within `CRASH_LOOP_S` of its start for the second time
    in a row (a bad setting, a missing file) waits 1 s, then 2, 4, ... up to
    `CRASH_LOOP_MAX_DELAY_S`, instead of being respawned every second; one
    that ran a while is restarted at once and the count starts again.
    """

    def __init__(self) -> None:
        self.started: dict[str, float] = {}  # child name -> when it was last spawned
        self.quick_exits: dict[str, int] = {}  # child name -> exits in a row soon after a start
        self.restart_at: dict[str, float] = {}  # child name -> when its pending restart is due

    def spawned(self, name: str, now: float | None = None) -> None:
        self.started[name] = time.monotonic() if now is None else now

    def due(self, name: str, child: subprocess.Popen[bytes], now: float) -> bool:
        """For an exited `child`: is its restart due now? (Logs the exit once.)"""
        if name not in self.restart_at:
            lived = now - self.started.get(name, now)
            quick = self.quick_exits.get(name, 0) + 1 if lived < defaults.CRASH_LOOP_S else 0
            self.quick_exits[name] = quick
            delay = 0.0 if quick <= 1 else min(2.0 ** (quick - 2), defaults.CRASH_LOOP_MAX_DELAY_S)
            self.restart_at[name] = now + delay
            log.warning(
                "%s (pid %d) exited with %s after %.1f s; restarting%s",
                name,
                child.pid,
                child.returncode,
                lived,
                f" in {delay:.0f} s ({quick} quick exits in a row)" if delay else "",
            )
        if now < self.restart_at[name]:
            return False
        del self.restart_at[name]
        return True


class Stack:
    """Starts and stops the processes of a PVM deployment on this machine."""

    def __init__(
        self,
        settings: Settings,
        processes: Mapping[str, int] | None = None,
        dispatchers: int = 1,
        api_port: int | None = defaults.API_PORT,
        mcp: bool = False,
    ) -> None:
        processes = dict(processes or {})
        if mcp and api_port is None:
            raise ValueError("--mcp serves the MCP tools beside the reader API; it needs the API (an --api-port)")
        for pool in ("index", "evaluate"):
            if pool in processes and not settings.qdrant_url:
                raise ValueError(
                    f"the {pool} pool cannot have extra processes with the embedded engine (one process owns its "
                    "files); set PVM_QDRANT_URL to a Qdrant server to scale it"
                )
        self.settings = settings
        self.processes = {pool: 1 for pool in STACK_POOLS}
        if settings.qdrant_url:
            self.processes["index"] = 1
            self.processes["evaluate"] = 1  # with the embedded engine, `pvm serve` runs it beside the index pool
        self.processes.update(processes)
        self.dispatchers = dispatchers
        self.api_port = api_port
        self.mcp = mcp
        self.redis: EmbeddedRedis | None = None
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts = RestartPolicy()

    def start(self) -> Settings:
        """Start everything; returns the settings children use (with the Redis URL filled in)."""
        if not self.settings.redis_url:
            data_dir = Path(self.settings.home) / defaults.EMBEDDED_DATA_DIR
            self.redis = EmbeddedRedis(data_dir=data_dir).start()
            self.settings = self.settings.with_(redis_url=self.redis.url)
        for i in range(self.dispatchers):
            self._start_child(f"dispatcher-{i}", ["dispatch", "--consumer", f"{os.uname().nodename}-up-{i}"])
        for pool, n in self.processes.items():
            self._start_child(f"worker-{pool}", ["worker", pool, "--processes", str(n)])
        self._start_child("scheduler", ["scheduler", "--name", f"{os.uname().nodename}-up"])
        if self.api_port is not None:
            self.settings = self.settings.with_(api_url=f"http://127.0.0.1:{self.api_port}")
            self._start_child("serve", self.serve_args())
        return self.settings

    def serve_args(self) -> list[str]:
        """The reader API's command line: `pvm serve` on the API port, with `--mcp` the MCP tools at its /mcp."""
        return ["serve", "--port", str(self.api_port), *(["--mcp"] if self.mcp else [])]

    def _start_child(self, name: str, args: list[str], now: float | None = None) -> None:
        self.children[name] = self._spawn(args)
        self.restarts.spawned(name, now)

    def _spawn(self, args: list[str]) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.update(self.settings.to_env())
        # A session of its own: Ctrl-C reaches only `pvm up`, which stops each child once.
        return subprocess.Popen([sys.executable, "-m", "workers.ops.cli", *args], env=env, start_new_session=True)

    def restart_dead(self, now: float | None = None) -> list[str]:
        """Restart children that exited, per `RestartPolicy`; returns the names restarted now."""
        now = time.monotonic() if now is None else now
        restarted = []
        for name, child in list(self.children.items()):
            if child.poll() is not None and self.restarts.due(name, child, now):
                args = child.args[3:] if isinstance(child.args, list) else []
                self._start_child(name, [str(a) for a in args], now)
                restarted.append(name)
        return restarted

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every child (workers finish their batch), then stop Redis."""
        terminate(self.children.values(), timeout)
        self.children.clear()
        if self.redis is not None:
            self.redis.stop()
            self.redis = None

    def __enter__(self) -> Stack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

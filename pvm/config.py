"""The one settings object, built from environment variables with documented defaults.

| variable | default | meaning |
|---|---|---|
| PVM_REDIS_URL | (unset: embedded Valkey) | Redis/Valkey URL (`redis://`, `rediss://`, `unix://`) |
| PVM_SHARDS | 4 | number of minute streams; every producer and dispatcher must agree |
| PVM_HOME | . | base directory for `var/` (log, spool, embedded Valkey data) |
| PVM_LOG_DIR | $PVM_HOME/var/log | durable log directory |
| PVM_SPOOL_DIR | $PVM_HOME/var/spool | emitter spool directory |
| PVM_DOWNSTREAM | (empty) | comma-separated pools the log pool fans batches out to |
| PVM_RECENT_WINDOW | 200 | newest minutes per project/agent cached in Redis |
| PVM_MINUTE_CACHE_SIZE | 20000 | minutes per project cached by id in Redis |
| PVM_DISPATCH_BATCH | 500 | minutes per RQ job |
| PVM_CLAIM_IDLE_MS | 30000 | idle time before another dispatcher reclaims an entry |
| PVM_MAX_DELIVERIES | 5 | deliveries before an entry is dead-lettered |
| PVM_JOB_TIMEOUT | 120 | seconds an RQ batch job may run |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from contracts import keys
from pvm import defaults


class ConfigError(ValueError):
    """An environment variable holds a value PVM cannot use."""


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be at least {minimum}")
    return value


@dataclass(frozen=True)
class Settings:
    """Runtime configuration shared by the library, the workers and the CLI."""

    redis_url: str | None = None
    shards: int = defaults.SHARDS
    home: Path = field(default_factory=lambda: Path("."))
    log_dir: Path = field(default_factory=lambda: Path(defaults.LOG_DIR))
    spool_dir: Path = field(default_factory=lambda: Path(defaults.SPOOL_DIR))
    downstream: tuple[str, ...] = ()
    recent_window: int = defaults.RECENT_WINDOW
    minute_cache_size: int = defaults.MINUTE_CACHE_SIZE
    dispatch_batch: int = defaults.DISPATCH_BATCH_SIZE
    claim_idle_ms: int = defaults.DISPATCH_CLAIM_IDLE_MS
    max_deliveries: int = defaults.DISPATCH_MAX_DELIVERIES
    job_timeout: int = defaults.JOB_TIMEOUT_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read settings from `env` (default: the process environment)."""
        env = os.environ if env is None else env
        home = Path(env.get("PVM_HOME") or ".")
        downstream = tuple(p.strip() for p in (env.get("PVM_DOWNSTREAM") or "").split(",") if p.strip())
        for pool in downstream:
            if pool not in keys.QUEUES or pool == "log":
                fed = sorted(set(keys.QUEUES) - {"log"})
                raise ConfigError(
                    f"PVM_DOWNSTREAM names {pool!r}, which is not a pool the log feeds "
                    f"(available: {', '.join(fed) or 'none yet'})"
                )
        return cls(
            redis_url=env.get("PVM_REDIS_URL") or None,
            shards=_int(env, "PVM_SHARDS", defaults.SHARDS),
            home=home,
            log_dir=Path(env.get("PVM_LOG_DIR") or home / defaults.LOG_DIR),
            spool_dir=Path(env.get("PVM_SPOOL_DIR") or home / defaults.SPOOL_DIR),
            downstream=downstream,
            recent_window=_int(env, "PVM_RECENT_WINDOW", defaults.RECENT_WINDOW),
            minute_cache_size=_int(env, "PVM_MINUTE_CACHE_SIZE", defaults.MINUTE_CACHE_SIZE),
            dispatch_batch=_int(env, "PVM_DISPATCH_BATCH", defaults.DISPATCH_BATCH_SIZE),
            claim_idle_ms=_int(env, "PVM_CLAIM_IDLE_MS", defaults.DISPATCH_CLAIM_IDLE_MS),
            max_deliveries=_int(env, "PVM_MAX_DELIVERIES", defaults.DISPATCH_MAX_DELIVERIES),
            job_timeout=_int(env, "PVM_JOB_TIMEOUT", defaults.JOB_TIMEOUT_S),
        )

    def with_(self, **changes: object) -> Settings:
        """A copy with some fields changed."""
        return replace(self, **changes)  # type: ignore[arg-type]

    def to_env(self) -> dict[str, str]:
        """The environment variables that reproduce these settings in a child process."""
        env = {
            "PVM_SHARDS": str(self.shards),
            "PVM_HOME": str(self.home),
            "PVM_LOG_DIR": str(self.log_dir),
            "PVM_SPOOL_DIR": str(self.spool_dir),
            "PVM_DOWNSTREAM": ",".join(self.downstream),
            "PVM_RECENT_WINDOW": str(self.recent_window),
            "PVM_MINUTE_CACHE_SIZE": str(self.minute_cache_size),
            "PVM_DISPATCH_BATCH": str(self.dispatch_batch),
            "PVM_CLAIM_IDLE_MS": str(self.claim_idle_ms),
            "PVM_MAX_DELIVERIES": str(self.max_deliveries),
            "PVM_JOB_TIMEOUT": str(self.job_timeout),
        }
        if self.redis_url:
            env["PVM_REDIS_URL"] = self.redis_url
        return env

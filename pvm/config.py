"""The one settings object, built from environment variables with documented defaults.

| variable | default | meaning |
|---|---|---|
| PVM_REDIS_URL | (unset: embedded Valkey) | Redis/Valkey URL (`redis://`, `rediss://`, `unix://`) |
| PVM_SHARDS | 4 | number of minute streams; every producer and dispatcher must agree |
| PVM_HOME | . | base directory for `var/` (log, spool, embedded Valkey data) |
| PVM_LOG_DIR | $PVM_HOME/var/log | durable log directory |
| PVM_SPOOL_DIR | $PVM_HOME/var/spool | emitter spool directory |
| PVM_DOWNSTREAM | index | comma-separated pools the log pool fans batches out to ("" for none) |
| PVM_RECENT_WINDOW | 200 | newest minutes per project/agent cached in Redis |
| PVM_MINUTE_CACHE_SIZE | 20000 | minutes per project cached by id in Redis |
| PVM_DISPATCH_BATCH | 500 | minutes per RQ job |
| PVM_CLAIM_IDLE_MS | 30000 | idle time before another dispatcher reclaims an entry |
| PVM_MAX_DELIVERIES | 5 | deliveries before an entry is dead-lettered |
| PVM_JOB_TIMEOUT | 120 | seconds a log-pool job may run (index jobs: 600, defaults.DOWNSTREAM_JOB_TIMEOUT_S) |
| PVM_QDRANT_URL | (unset: embedded engine) | Qdrant server URL; unset: in-process engine in $PVM_HOME/var/qdrant |
| PVM_QDRANT_API_KEY | (unset) | API key for PVM_QDRANT_URL |
| PVM_EMBED_MODEL | (unset: lexical only) | embedding model name; setting it turns on dense vectors |
| OPENAI_BASE_URL | https://api.openai.com/v1 | any OpenAI-compatible endpoint for embeddings |
| OPENAI_API_KEY | (unset) | key for OPENAI_BASE_URL |
| PVM_EMBED_DIMENSIONS | (model default) | dense vector length to request |
| PVM_EMBED_BATCH_SIZE | 2048 | inputs per embedding request (1-2048) |
| PVM_EMBED_MAX_RETRIES | 5 | retries of 429/5xx/timeouts before a batch fails |
| PVM_EMBED_TIMEOUT | 30 | seconds per embedding request |
| PVM_EMBED_QUERY_TIMEOUT | 2 | seconds a search waits for its query embedding (one try) before answering lexical-only |
| PVM_SEARCH_WEIGHTS | 0.4,0.3,0.2,0.1; 0.6,0.1,0.2,0.1 with PVM_EMBED_MODEL | semantic,keyword,recency,importance |
| PVM_API_URL | (unset) | where `pvm context`/`pvm search` reach the reader API (default http://127.0.0.1:8080) |
| PVM_OPTIMIZE_EVERY | 3600 | seconds between the scheduler's optimize runs of the embedded engine (0: never) |
| PVM_API_TOKEN | (unset: no auth) | bearer token the reader API requires on every route but /healthz; clients send it |
| PVM_API_TOKENS_FILE | (unset) | JSON file of project-scoped API token hashes (`pvm token new`); re-read on change |
| PVM_REDIS_START_WAIT | 30 | seconds a long-running command waits at start for Redis before giving up (0: none) |
| PVM_EXTRA_JOB_FUNCTIONS | (unset) | job functions (dotted names, comma-separated) workers run besides PVM's own |
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from contracts import keys
from pvm import defaults

_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


class ConfigError(ValueError):
    """An environment variable holds a value PVM cannot use."""


def _optional_int(env: Mapping[str, str], name: str, minimum: int = 1) -> int | None:
    if not env.get(name):
        return None
    return _int(env, name, 0, minimum)


def _float(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be at least {minimum}")
    return value


def _weights(env: Mapping[str, str]) -> tuple[float, float, float, float] | None:
    raw = env.get("PVM_SEARCH_WEIGHTS")
    if not raw:
        return None
    try:
        parts = tuple(float(p) for p in raw.split(","))
    except ValueError:
        raise ConfigError(
            f"PVM_SEARCH_WEIGHTS={raw!r} must be four numbers: semantic,keyword,recency,importance"
        ) from None
    if len(parts) != 4 or any(p < 0 for p in parts) or not sum(parts):
        raise ConfigError(f"PVM_SEARCH_WEIGHTS={raw!r} must be four non-negative numbers, not all 0")
    return parts


def _job_functions(env: Mapping[str, str]) -> tuple[str, ...]:
    raw = env.get("PVM_EXTRA_JOB_FUNCTIONS") or ""
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    for name in names:
        if not _DOTTED_NAME.fullmatch(name):
            raise ConfigError(
                f"PVM_EXTRA_JOB_FUNCTIONS names {name!r}, which is not a dotted function name "
                "like package.module.function; list exact names, comma-separated"
            )
    return names


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


# TEMPORARY (docs branch): replaced at merge by the settings branch's settings_reference(), which derives the
# same shape from the settings declarations. This stand-in reads the table in this module's docstring, and the
# type and lower bound from the parser each variable goes through in `Settings.from_env`.
def settings_reference() -> list[dict[str, str]]:
    """Every environment variable PVM reads: env, default, type, range and help (the docs' configuration page)."""
    import inspect

    source = inspect.getsource(Settings.from_env)
    rows = []
    for line in (__doc__ or "").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not re.fullmatch(r"[A-Z][A-Z0-9_]+", cells[0]):
            continue
        env, default, meaning = cells
        kind, bound = "str", ""
        call = rf'(_int|_float|_optional_int)\(env, "{env}"(?:, [^,)]+)?(?:, (?:minimum=)?([\d.]+))?\)'
        parsed = re.search(call, source)
        if parsed:
            kind = "float" if parsed.group(1) == "_float" else "int"
            bound = f">= {parsed.group(2) or ('0' if kind == 'float' else '1')}"
        elif env == "PVM_SEARCH_WEIGHTS":
            kind, bound = "4 floats", ">= 0, not all 0"
        rows.append({"env": env, "default": default, "type": kind, "range": bound, "help": meaning})
    return rows


@dataclass(frozen=True)
class Settings:
    """Runtime configuration shared by the library, the workers and the CLI."""

    redis_url: str | None = None
    shards: int = defaults.SHARDS
    home: Path = field(default_factory=lambda: Path("."))
    log_dir: Path = field(default_factory=lambda: Path(defaults.LOG_DIR))
    spool_dir: Path = field(default_factory=lambda: Path(defaults.SPOOL_DIR))
    downstream: tuple[str, ...] = defaults.DOWNSTREAM
    recent_window: int = defaults.RECENT_WINDOW
    minute_cache_size: int = defaults.MINUTE_CACHE_SIZE
    dispatch_batch: int = defaults.DISPATCH_BATCH_SIZE
    claim_idle_ms: int = defaults.DISPATCH_CLAIM_IDLE_MS
    max_deliveries: int = defaults.DISPATCH_MAX_DELIVERIES
    job_timeout: int = defaults.JOB_TIMEOUT_S
    qdrant_url: str | None = None
    qdrant_api_key: str | None = field(default=None, repr=False)
    embed_model: str | None = None
    openai_base_url: str | None = None
    openai_api_key: str | None = field(default=None, repr=False)
    embed_dimensions: int | None = None
    embed_batch_size: int = defaults.EMBED_BATCH_SIZE
    embed_max_retries: int = defaults.EMBED_MAX_RETRIES
    embed_timeout_s: float = defaults.EMBED_TIMEOUT_S
    embed_query_timeout_s: float = defaults.EMBED_QUERY_TIMEOUT_S
    search_weights: tuple[float, float, float, float] | None = None  # None: by whether dense vectors are on
    api_url: str | None = None
    api_token: str | None = field(default=None, repr=False)
    api_tokens_file: Path | None = None
    optimize_every_s: int = defaults.OPTIMIZE_EVERY_S
    extra_job_functions: tuple[str, ...] = ()  # workers run these besides keys.JOB_FUNCTIONS
    redis_start_wait_s: float = defaults.REDIS_START_WAIT_S

    @property
    def vector_dir(self) -> Path:
        """Where the embedded vector engine keeps its shards."""
        return Path(self.home) / defaults.VECTOR_DIR

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read settings from `env` (default: the process environment)."""
        env = os.environ if env is None else env
        home = Path(env.get("PVM_HOME") or ".")
        raw_downstream = env.get("PVM_DOWNSTREAM")
        if raw_downstream is None:
            raw_downstream = ",".join(defaults.DOWNSTREAM)
        downstream = tuple(p.strip() for p in raw_downstream.split(",") if p.strip())
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
            qdrant_url=env.get("PVM_QDRANT_URL") or None,
            qdrant_api_key=env.get("PVM_QDRANT_API_KEY") or None,
            embed_model=env.get("PVM_EMBED_MODEL") or None,
            openai_base_url=env.get("OPENAI_BASE_URL") or None,
            openai_api_key=env.get("OPENAI_API_KEY") or None,
            embed_dimensions=_optional_int(env, "PVM_EMBED_DIMENSIONS"),
            embed_batch_size=min(_int(env, "PVM_EMBED_BATCH_SIZE", defaults.EMBED_BATCH_SIZE), 2048),
            embed_max_retries=_int(env, "PVM_EMBED_MAX_RETRIES", defaults.EMBED_MAX_RETRIES, minimum=0),
            embed_timeout_s=_float(env, "PVM_EMBED_TIMEOUT", defaults.EMBED_TIMEOUT_S, minimum=0.1),
            embed_query_timeout_s=_float(env, "PVM_EMBED_QUERY_TIMEOUT", defaults.EMBED_QUERY_TIMEOUT_S, minimum=0.05),
            search_weights=_weights(env),
            api_url=env.get("PVM_API_URL") or None,
            api_token=env.get("PVM_API_TOKEN") or None,
            api_tokens_file=Path(env["PVM_API_TOKENS_FILE"]) if env.get("PVM_API_TOKENS_FILE") else None,
            optimize_every_s=_int(env, "PVM_OPTIMIZE_EVERY", defaults.OPTIMIZE_EVERY_S, minimum=0),
            extra_job_functions=_job_functions(env),
            redis_start_wait_s=_float(env, "PVM_REDIS_START_WAIT", defaults.REDIS_START_WAIT_S),
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
            "PVM_OPTIMIZE_EVERY": str(self.optimize_every_s),
        }
        optional = {
            "PVM_REDIS_URL": self.redis_url,
            "PVM_QDRANT_URL": self.qdrant_url,
            "PVM_QDRANT_API_KEY": self.qdrant_api_key,
            "PVM_EMBED_MODEL": self.embed_model,
            "OPENAI_BASE_URL": self.openai_base_url,
            "OPENAI_API_KEY": self.openai_api_key,
            "PVM_EMBED_DIMENSIONS": None if self.embed_dimensions is None else str(self.embed_dimensions),
            "PVM_API_URL": self.api_url,
            "PVM_API_TOKEN": self.api_token,
            "PVM_API_TOKENS_FILE": None if self.api_tokens_file is None else str(self.api_tokens_file),
            "PVM_EXTRA_JOB_FUNCTIONS": ",".join(self.extra_job_functions),
        }
        env.update({k: v for k, v in optional.items() if v})
        env["PVM_EMBED_BATCH_SIZE"] = str(self.embed_batch_size)
        env["PVM_EMBED_MAX_RETRIES"] = str(self.embed_max_retries)
        env["PVM_EMBED_TIMEOUT"] = repr(self.embed_timeout_s)
        env["PVM_EMBED_QUERY_TIMEOUT"] = repr(self.embed_query_timeout_s)
        env["PVM_REDIS_START_WAIT"] = repr(self.redis_start_wait_s)
        if self.search_weights is not None:
            env["PVM_SEARCH_WEIGHTS"] = ",".join(repr(w) for w in self.search_weights)
        return env

"""Putting minutes through the real log, caches and index pool for reader and API tests (no Redis or Qdrant doubles)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import redis

from contracts import FACT_EVENT_TYPES, Minute, encode_minute, keys
from pvm import engines
from pvm.config import Settings
from pvm.stores.cache import CachedMinute, MinuteCache
from pvm.stores.log import LogWriter
from workers.runtime.queues import pool_queue
from workers.runtime.runner import PvmWorker


def use_settings(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make worker code (which reads the environment) see these settings."""
    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    for k in ("PVM_EMBED_MODEL", "OPENAI_BASE_URL", "OPENAI_API_KEY", "PVM_QDRANT_URL"):
        if not getattr(
            settings,
            {
                "PVM_EMBED_MODEL": "embed_model",
                "OPENAI_BASE_URL": "openai_base_url",
                "OPENAI_API_KEY": "openai_api_key",
                "PVM_QDRANT_URL": "qdrant_url",
            }[k],
        ):
            monkeypatch.delenv(k, raising=False)
    engines.close_shared()


def log_minutes(connection: redis.Redis, settings: Settings, minutes: Sequence[Minute], index: bool = True) -> None:
    """Append minutes to the log and caches as the log pool does, then (optionally) index them through RQ."""
    writer = LogWriter(settings.log_dir)
    cache = MinuteCache(connection, settings.recent_window, settings.minute_cache_size)
    records: list[list[object]] = []
    by_project: dict[str, list[Minute]] = {}
    for m in minutes:
        by_project.setdefault(m.project_id, []).append(m)
    for project, ms in by_project.items():
        encoded = [encode_minute(m) for m in ms]
        appended = writer.append(
            project, [(m.id, f"{i + 1}-0", raw) for i, (m, raw) in enumerate(zip(ms, encoded, strict=True))]
        )
        cache.update(
            project,
            [
                CachedMinute(a.id, a.seq, raw, m.agent_id, m.event_type not in FACT_EVENT_TYPES)
                for a, m, raw in zip(appended, ms, encoded, strict=True)
            ],
            0.0,
        )
        records.extend([a.id, a.seq, raw] for a, raw in zip(appended, encoded, strict=True))
    writer.close()
    if index:
        for start in range(0, len(records), 500):
            pool_queue("index", connection).enqueue(keys.INDEX_JOB, records[start : start + 500])
        run_index_worker(connection)


def run_index_worker(connection: redis.Redis) -> None:
    PvmWorker([pool_queue("index", connection)], connection).work(burst=True)


def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Record every write to a Redis connection from now on: one a round trip (a command alone, or a pipeline
    whatever it holds, or commands sent now whose replies are read later). Each entry is the first command's name.
    """
    sent: list[bytes] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(self: redis.connection.AbstractConnection, command: object, check_health: bool = True) -> None:
        chunks = command if isinstance(command, list | tuple) else [command]
        first = bytes(chunks[0]) if chunks else b""
        sent.append(first.split(b"\r\n")[2] if first.startswith(b"*") else first)  # RESP: *<n>, $<len>, <name>
        send(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    return sent

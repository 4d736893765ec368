"""The worker context: built once per worker, its parts built on first use and kept; a new worker starts fresh."""

from __future__ import annotations

import pytest
import redis

from pvm.config import Settings
from workers.runtime.context import WorkerContext


def test_a_part_is_built_once_per_context_and_settings_come_from_the_environment_when_first_asked(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[WorkerContext] = []

    def parts(context: WorkerContext) -> tuple[int, str]:
        built.append(context)
        return (context.settings.shards, context.settings.redis_url)

    for k, v in settings.with_(shards=3).to_env().items():
        monkeypatch.setenv(k, v)
    first = WorkerContext(redis_client)
    assert first.part(parts) is first.part(parts) == (3, settings.redis_url)
    assert built == [first]
    monkeypatch.setenv("PVM_SHARDS", "5")
    assert first.part(parts)[0] == 3  # a worker keeps what it built for its life
    assert WorkerContext(redis_client).part(parts)[0] == 5  # a new worker reads the environment again
    given = WorkerContext(redis_client, settings)
    assert given.settings is settings and given.connection is redis_client

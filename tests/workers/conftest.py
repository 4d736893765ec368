"""What the API's and the console's tests read: two projects of logged minutes over a real Valkey, log and
embedded engine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from pvm import engines
from pvm.config import Settings
from pvm.reader import ContextReader
from pvm.stores.log import LogReader
from tests.memory_helpers import log_minutes, use_settings
from workers.ops.demo import sample_session


@pytest.fixture
def reader(redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[ContextReader]:
    """The reader `pvm serve` builds, over 80 logged minutes of apollo and 20 of borealis."""
    use_settings(settings, monkeypatch)
    log_minutes(redis_client, settings, list(sample_session("apollo", 80, seed=2)))
    log_minutes(redis_client, settings, list(sample_session("borealis", 20, seed=4)))
    yield ContextReader(redis_client, LogReader(settings.log_dir), engines.searcher_for(settings))  # type: ignore[arg-type]
    engines.close_shared()

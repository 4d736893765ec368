"""PVMClient's facts methods against the real reader API under uvicorn, with the facts pool applying its changes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis

from contracts import keys
from pvm import PVMClient, PVMRequestError, engines
from pvm.config import Settings
from pvm.reader import ContextReader
from pvm.stores.log import LogReader
from tests.memory_helpers import use_settings
from tests.pvm.test_client import serving
from tests.workers.api.test_api_facts import APOLLO_ONLY, CURATOR, FactsFeed, write_tokens
from workers.api.app import create_app


@dataclass
class Served:
    url: str
    feed: FactsFeed


@pytest.fixture
def served(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Served]:
    use_settings(settings, monkeypatch)
    reader = ContextReader(redis_client, LogReader(settings.log_dir), engines.searcher_for(settings))  # type: ignore[arg-type]
    app = create_app(reader, redis_client, settings.shards, tokens=write_tokens(tmp_path / "tokens.json"))
    with serving(app) as url:
        yield Served(url, FactsFeed(redis_client, settings))
    engines.close_shared()


def test_every_facts_method_round_trips_through_the_pool(served: Served) -> None:
    feed = served.feed
    with PVMClient(served.url, CURATOR, retry_backoff=0.01) as api:
        old = api.assert_fact("apollo", "service:auth", "session_ttl", "30 minutes", agent_id="ops")
        feed.settle()
        later = datetime.now(UTC) + timedelta(days=7)
        new = api.assert_fact("apollo", "service:auth", "session_ttl", "8 hours", valid_from=later.isoformat())
        assert [m["event_type"] for m in new["also"]] == ["fact_superseded"]
        feed.settle()
        assert [f["id"] for f in api.facts("apollo")["facts"]] == [old["fact_id"]]
        assert [f["id"] for f in api.facts("apollo", as_of=later + timedelta(hours=1))["facts"]] == [new["fact_id"]]
        assert api.fact("apollo", new["fact_id"])["value"] == "8 hours"
        history = api.fact_history("apollo", new["fact_id"])
        assert [f["id"] for f in history] == [old["fact_id"], new["fact_id"]]

        pending = api.assert_fact("apollo", "build", "runner", "ubuntu-24", task_id="T-1", status="pending")
        feed.settle()
        assert api.promote("apollo", pending["fact_id"])["fact_id"] == pending["fact_id"]
        feed.settle()
        up = api.promote("apollo", pending["fact_id"], "project")
        feed.settle()
        top = api.promote("apollo", up["fact_id"], "global")
        feed.settle()
        assert [f["id"] for f in api.facts("apollo", tiers=["global"])["facts"]] == [top["fact_id"]]
        api.retract("apollo", top["fact_id"], "not for everyone")
        feed.settle()
        assert api.facts("apollo", tiers=["global"])["facts"] == []
        assert api.fact("apollo", top["fact_id"])["status"] == "retracted"

        api.learn("apollo", "deploy window", "Tue 10:00")
        api.learn("apollo", "deploy window", "Fri 16:00", task_id="T-1")
        feed.settle()
        assert api.recall("apollo", "deploy window")["fact"]["value"] == "Tue 10:00"
        assert api.recall("apollo", "deploy window", task="T-1")["fact"]["value"] == "Fri 16:00"
        assert api.recall("apollo", "nothing learned")["fact"] is None


def test_a_change_is_sent_with_one_minute_id_and_refusals_name_the_field(
    served: Served, redis_client: redis.Redis
) -> None:
    with PVMClient(served.url, CURATOR, retry_backoff=0.01) as api:
        accepted = api.learn("apollo", "k", "v")
        [minute] = served.feed.written()
        assert minute.id == accepted["minute_id"] and minute.event_type == "fact_learned"
        with pytest.raises(PVMRequestError) as bad:
            api.assert_fact("apollo", "s", "a", "v", confidence=3)
        assert bad.value.status == 422 and bad.value.errors == [{"field": "confidence", "problem": bad.value.message}]
        with pytest.raises(PVMRequestError) as missing:
            api.fact("apollo", "00000000-0000-5000-8000-000000000000")
        assert missing.value.status == 404
    with PVMClient(served.url, APOLLO_ONLY, retry_backoff=0.01) as api:
        with pytest.raises(PVMRequestError) as refused:
            api.facts("apollo", tiers=["global"])
        assert refused.value.status == 403 and "global" in refused.value.message
        with pytest.raises(ValueError, match="as_of"):
            api.facts("apollo", as_of=datetime(2026, 1, 1))
    assert served.feed.written() == []
    assert redis_client.xlen(keys.stream(keys.shard_of("apollo", served.feed.settings.shards))) == 1

"""The minute caches against a real Valkey: bulk writes per batch, trims, eviction and a head that never moves back."""

from __future__ import annotations

import redis

from contracts import keys
from pvm.stores.cache import CachedMinute, MinuteCache


def batch(first: int, last: int, agent: str | None = "a1", windowed: bool = True) -> list[CachedMinute]:
    return [CachedMinute(f"m{seq}", seq, f"body {seq}".encode(), agent, windowed) for seq in range(first, last + 1)]


def test_a_batch_fills_the_windows_trims_them_and_caches_every_minute(redis_client: redis.Redis) -> None:
    cache = MinuteCache(redis_client, window=5, cache_size=100)
    minutes = batch(1, 8) + batch(9, 10, agent="a2") + batch(11, 12, windowed=False)  # a knowledge change: no window
    cache.update("apollo", minutes, 1.5)
    assert cache.recent_ids("apollo", 50) == [f"m{s}" for s in range(6, 11)]  # windowed only, the newest 5
    assert cache.recent_ids("apollo", 50, agent_id="a1") == [f"m{s}" for s in range(4, 9)]
    assert cache.recent_ids("apollo", 50, agent_id="a2") == ["m9", "m10"]
    assert cache.get_many("apollo", ["m1", "m12", "nope"]) == {"m1": b"body 1", "m12": b"body 12"}
    assert cache.head("apollo") == {"id": "m12", "seq": "12", "durable_at": "1.5"}
    assert redis_client.sismember(keys.projects(), "apollo")


def test_an_older_batch_applied_again_changes_nothing_and_never_moves_the_head_back(redis_client: redis.Redis) -> None:
    cache = MinuteCache(redis_client, window=5, cache_size=100)
    cache.update("apollo", batch(1, 4), 1.0)
    cache.update("apollo", batch(5, 8), 2.0)
    before = (cache.recent_ids("apollo", 50), cache.recent_ids("apollo", 50, agent_id="a1"), cache.head("apollo"))
    cache.update("apollo", batch(1, 4), 3.0)  # a retried job's older minutes
    after = (cache.recent_ids("apollo", 50), cache.recent_ids("apollo", 50, agent_id="a1"), cache.head("apollo"))
    assert after == before and before[2]["seq"] == "8"


def test_the_oldest_cached_minutes_are_evicted_past_the_cache_size_in_one_pipeline(redis_client: redis.Redis) -> None:
    cache = MinuteCache(redis_client, window=3, cache_size=10)
    pipe = redis_client.pipeline(transaction=False)
    cache.update("apollo", batch(1, 25), 1.0, pipeline=pipe)
    assert cache.get_many("apollo", ["m25"]) == {}  # nothing is written before the caller's pipeline runs
    pipe.execute()
    assert sorted(cache.get_many("apollo", [f"m{s}" for s in range(1, 26)]), key=lambda i: int(i[1:])) == [
        f"m{s}" for s in range(16, 26)
    ]
    assert redis_client.zcard(keys.minute_by_id_order("apollo")) == 10

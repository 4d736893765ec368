"""Redis caches the reader uses: recent windows per project and agent, minutes by id.

All of a project's keys share the ``{p:<project>}`` hash tag and a batch is
written in one pipeline: one HSET of the minutes' bytes, then one ZADD per
sorted set for the whole batch, then a small Lua script that trims the
windows, evicts the oldest cached minutes and moves the log head forward
(never back). A minute's bytes are cached before any window or index names it,
and an update is idempotent: windows are sorted sets scored by log sequence,
so re-applying a batch changes nothing. (The bulk writes were inside the script
until issue 14: building them in Lua cost Valkey ~6 us per minute.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import redis
from redis.typing import EncodableT

from contracts import keys
from pvm import defaults
from pvm.connection import hash_reply

_SETTLE = """
-- After a batch's bulk writes (earlier in the same pipeline): trim the windows, evict the oldest cached minutes, move
-- the head forward (never back).
-- KEYS: recent, byid, byid_order, head, agent windows...
-- ARGV: window, cache_size, durable_at, top_id, top_seq
local window = tonumber(ARGV[1])
local cache_size = tonumber(ARGV[2])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -window - 1)
for i = 5, #KEYS do
  redis.call('ZREMRANGEBYRANK', KEYS[i], 0, -window - 1)
end
local excess = redis.call('ZCARD', KEYS[3]) - cache_size
while excess > 0 do
  local chunk = math.min(excess, 1000)
  local old = redis.call('ZRANGE', KEYS[3], 0, chunk - 1)
  redis.call('HDEL', KEYS[2], unpack(old))
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, chunk - 1)
  excess = excess - chunk
end
local top_seq = tonumber(ARGV[5])
if top_seq > tonumber(redis.call('HGET', KEYS[4], 'seq') or '0') then
  redis.call('HSET', KEYS[4], 'id', ARGV[4], 'seq', top_seq, 'durable_at', ARGV[3])
end
return top_seq
"""


@dataclass(frozen=True, slots=True)
class CachedMinute:
    """A minute as a cache update carries it."""

    id: str
    seq: int
    minute_bytes: bytes
    agent_id: str | None
    # In the recent windows: what agents said. A knowledge change (fact_*, task_memory_cleared) is cached by id
    # and lives in the log, but stays out of the windows: the facts store is its view (a context's "What we know").
    windowed: bool = True


class MinuteCache:
    """Writes and reads the per-project minute caches in Redis."""

    def __init__(
        self,
        connection: redis.Redis,
        window: int = defaults.RECENT_WINDOW,
        cache_size: int = defaults.MINUTE_CACHE_SIZE,
    ) -> None:
        self.connection = connection
        self.window = window
        self.cache_size = max(cache_size, window)
        self._settle = connection.register_script(_SETTLE)

    def update(
        self,
        project_id: str,
        minutes: Sequence[CachedMinute],
        durable_at: float,
        pipeline: redis.client.Pipeline | None = None,
    ) -> None:
        """Record durable minutes of one project (idempotent), in a pipeline of its own or in `pipeline`."""
        if not minutes:
            return
        bodies: dict[EncodableT, EncodableT] = {}
        order: dict[str, int] = {}
        recent: dict[str, int] = {}
        windows: dict[str, dict[str, int]] = {}
        top = minutes[0]
        for m in minutes:
            bodies[m.id] = m.minute_bytes
            order[m.id] = m.seq
            if m.windowed:
                recent[m.id] = m.seq
                if m.agent_id:
                    windows.setdefault(m.agent_id, {})[m.id] = m.seq
            if m.seq > top.seq:
                top = m
        byid = keys.minute_by_id(project_id)
        head_keys = [
            keys.recent_window(project_id),
            byid,
            keys.minute_by_id_order(project_id),
            keys.log_head(project_id),
        ]
        agent_keys = {agent: keys.agent_recent_window(project_id, agent) for agent in windows}
        own = pipeline is None
        client = self.connection.pipeline(transaction=False) if own else pipeline
        assert client is not None
        client.hset(byid, mapping=bodies)
        client.zadd(head_keys[2], order)
        if recent:
            client.zadd(head_keys[0], recent)
        for agent, members in windows.items():
            client.zadd(agent_keys[agent], members)
        args: list[EncodableT] = [self.window, self.cache_size, repr(durable_at), top.id, top.seq]
        self._settle(keys=[*head_keys, *agent_keys.values()], args=args, client=client)
        client.sadd(keys.projects(), project_id)  # in another slot: outside the project's keys
        if own:
            client.execute()

    def recent_ids(self, project_id: str, n: int, agent_id: str | None = None) -> list[str]:
        """Ids of the newest `n` cached minutes, oldest first."""
        key = keys.agent_recent_window(project_id, agent_id) if agent_id else keys.recent_window(project_id)
        raw = cast(list[bytes], self.connection.zrange(key, -n, -1)) if n > 0 else []  # no scores: members only
        return [r.decode() for r in raw]

    def get_many(self, project_id: str, ids: Sequence[str]) -> dict[str, bytes]:
        """Cached minute bytes by id; ids not cached are absent."""
        if not ids:
            return {}
        values = cast(list[bytes | None], self.connection.hmget(keys.minute_by_id(project_id), list(ids)))
        return {i: v for i, v in zip(ids, values, strict=True) if v is not None}

    def head(self, project_id: str) -> dict[str, str]:
        """The newest durable minute of the project: id, seq, durable_at (empty when none)."""
        raw = hash_reply(self.connection.hgetall(keys.log_head(project_id)))
        return {k.decode(): v.decode() for k, v in raw.items()}

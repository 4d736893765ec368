"""Redis caches the reader uses: recent windows per project and agent, minutes by id.

All of a project's keys share the ``{p:<project>}`` hash tag and are written by
one Lua script per batch, so an update is atomic and idempotent: windows are
sorted sets scored by log sequence, so re-applying a batch changes nothing.
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

_UPDATE = """
-- KEYS: recent, byid, byid_order, head, head again (a placeholder), agent windows...
-- ARGV: project, window, cache_size, durable_at, n, then n x (id, seq, bytes, agent_index)
-- agent_index: 0 no agent, k the agent window KEYS[5 + k], -1 in no window at all (a knowledge change)
local window = tonumber(ARGV[2])
local cache_size = tonumber(ARGV[3])
local n = tonumber(ARGV[5])
local top_seq = tonumber(redis.call('HGET', KEYS[4], 'seq') or '0')
local top_id = nil
-- One command per key for the whole batch (ZADD and HSET take many members), in chunks well under Lua's
-- unpack limit: a batch of 500 minutes is a handful of commands, not 2,000.
local CHUNK = 2000
local recent, bodies, order, windows = {}, {}, {}, {}
local function push(list, a, b)
  list[#list + 1] = a
  list[#list + 1] = b
end
local function flush(command, key, list)
  for from = 1, #list, CHUNK do
    redis.call(command, key, unpack(list, from, math.min(from + CHUNK - 1, #list)))
  end
end
for i = 0, n - 1 do
  local base = 6 + i * 4
  local id, seq, body, agent = ARGV[base], tonumber(ARGV[base + 1]), ARGV[base + 2], tonumber(ARGV[base + 3])
  if agent >= 0 then push(recent, seq, id) end
  push(bodies, id, body)
  push(order, seq, id)
  if agent > 0 then
    windows[agent] = windows[agent] or {}
    push(windows[agent], seq, id)
  end
  if seq > top_seq then top_seq = seq; top_id = id end
end
flush('ZADD', KEYS[1], recent)
flush('HSET', KEYS[2], bodies)
flush('ZADD', KEYS[3], order)
for agent, list in pairs(windows) do
  flush('ZADD', KEYS[5 + agent], list)
end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -window - 1)
for agent, _ in pairs(windows) do
  redis.call('ZREMRANGEBYRANK', KEYS[5 + agent], 0, -window - 1)
end
local excess = redis.call('ZCARD', KEYS[3]) - cache_size
while excess > 0 do
  local chunk = math.min(excess, 1000)
  local old = redis.call('ZRANGE', KEYS[3], 0, chunk - 1)
  redis.call('HDEL', KEYS[2], unpack(old))
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, chunk - 1)
  excess = excess - chunk
end
if top_id then
  redis.call('HSET', KEYS[4], 'id', top_id, 'seq', top_seq, 'durable_at', ARGV[4])
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
        self._update = connection.register_script(_UPDATE)

    def update(
        self,
        project_id: str,
        minutes: Sequence[CachedMinute],
        durable_at: float,
        pipeline: redis.client.Pipeline | None = None,
    ) -> None:
        """Record durable minutes of one project (idempotent)."""
        if not minutes:
            return
        agents: dict[str, int] = {}
        args: list[EncodableT] = [project_id, self.window, self.cache_size, repr(durable_at), len(minutes)]
        for m in minutes:
            agent_index = 0
            if not m.windowed:
                agent_index = -1
            elif m.agent_id:
                agent_index = agents.setdefault(m.agent_id, len(agents) + 1)
            args.extend((m.id, m.seq, m.minute_bytes, agent_index))
        key_list = [
            keys.recent_window(project_id),
            keys.minute_by_id(project_id),
            keys.minute_by_id_order(project_id),
            keys.log_head(project_id),
            keys.log_head(project_id),  # placeholder: agent windows stay at KEYS[6..]
        ]
        key_list.extend(keys.agent_recent_window(project_id, a) for a in agents)
        client = pipeline if pipeline is not None else self.connection
        self._update(keys=key_list, args=args, client=client)
        client.sadd(keys.projects(), project_id)  # outside the script: it lives in another slot

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

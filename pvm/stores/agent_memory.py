"""Agent memory in Redis: each agent's track record per project (task counts, mean success, capabilities, last active).

Layout, all under the project's ``{p:<project>}`` hash tag so one Lua script
updates a whole batch atomically:

* ``keys.agent_memory(p, a)``: hash ``assigned``, ``completed``, ``failed``,
  ``success_sum``, ``success_count``, ``last_active_ms``, ``last_active``;
* ``keys.agent_capabilities(p, a)``: set of capability names (bounded);
* ``keys.agents(p)``: set of the project's agent ids;
* ``keys.agent_memory_counted(p)``: a bitmap over the project's log sequence.

Idempotence: a minute is counted at most once, however often it is re-indexed
(a retried job, a redelivered batch, `pvm replay`). The script sets bit ``seq``
of the counted bitmap and applies the minute's deltas only when the bit was
clear. The log assigns each minute id exactly one ``seq`` per project (a
duplicate append returns the original), so the bit stands for the minute id.
Why a bitmap and not a set of counted minute ids: it is exact for any replay,
in any order, at one bit per minute (10 million minutes: 1.25 MB), where a set
of ids costs ~70 bytes per minute, and a bounded set would count a replay of
minutes older than its bound a second time. The price: the bitmap belongs to the
log's numbering, so a project whose log is recreated must `reset` its agent
memory too (replay from scratch does exactly that).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis

from contracts import keys
from contracts.memory import AgentMemory

MAX_CAPABILITIES = 256  # per agent and project; beyond it new capability names are dropped

_APPLY = """
-- KEYS: counted bitmap, agents set, then per agent (1-based i): memory hash KEYS[2i+1], capabilities set KEYS[2i+2]
-- ARGV: max_capabilities, agent count m, m agent ids, delta count n, then n x
--       (seq, agent index, assigned, completed, failed, success or '', active_ms or '', active_at, ncaps, caps...)
local max_caps = tonumber(ARGV[1])
local m = tonumber(ARGV[2])
local i = 3 + m
local n = tonumber(ARGV[i])
i = i + 1
local decided = {}
local counted = 0
for _ = 1, n do
  local seq = ARGV[i]
  local agent = tonumber(ARGV[i + 1])
  local ncaps = tonumber(ARGV[i + 8])
  local fresh = decided[seq]
  if fresh == nil then
    fresh = redis.call('SETBIT', KEYS[1], seq, 1) == 0
    decided[seq] = fresh
    if fresh then counted = counted + 1 end
  end
  if fresh then
    local mem, caps = KEYS[2 * agent + 1], KEYS[2 * agent + 2]
    redis.call('SADD', KEYS[2], ARGV[2 + agent])
    for field, offset in pairs({assigned = 2, completed = 3, failed = 4}) do
      local v = tonumber(ARGV[i + offset])
      if v ~= 0 then redis.call('HINCRBY', mem, field, v) end
    end
    if ARGV[i + 5] ~= '' then
      redis.call('HINCRBYFLOAT', mem, 'success_sum', ARGV[i + 5])
      redis.call('HINCRBY', mem, 'success_count', 1)
    end
    if ARGV[i + 6] ~= '' then
      local newest = tonumber(redis.call('HGET', mem, 'last_active_ms') or '-1')
      if tonumber(ARGV[i + 6]) > newest then
        redis.call('HSET', mem, 'last_active_ms', ARGV[i + 6], 'last_active', ARGV[i + 7])
      end
    end
    for c = 1, ncaps do
      local cap = ARGV[i + 8 + c]
      if redis.call('SISMEMBER', caps, cap) == 0 and redis.call('SCARD', caps) < max_caps then
        redis.call('SADD', caps, cap)
      end
    end
  end
  i = i + 9 + ncaps
end
return counted
"""


@dataclass(frozen=True, slots=True)
class AgentDelta:
    """What one minute adds to one agent's memory. A minute yields at most one delta per agent."""

    project_id: str
    agent_id: str
    minute_id: str
    seq: int  # the minute's log sequence in its project: the idempotency key
    assigned: int = 0
    completed: int = 0
    failed: int = 0
    success: float | None = None  # success_criteria_met, 0..100
    capabilities: tuple[str, ...] = ()
    active_ms: int | None = None  # Unix ms of the minute when the agent itself acted
    active_at: str | None = None  # the same instant as the minute's timestamp text


def _require(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} is required: agent memory is kept per project and agent; pass a non-empty {name}")
    return value


class AgentMemoryStore:
    """Writes and reads agent memory in Redis."""

    def __init__(self, connection: redis.Redis, max_capabilities: int = MAX_CAPABILITIES) -> None:
        self.connection = connection
        self.max_capabilities = max_capabilities
        self._apply = connection.register_script(_APPLY)

    def apply(self, deltas: Sequence[AgentDelta]) -> int:
        """Add deltas to agent memory, each minute at most once ever; returns how many minutes were new."""
        by_project: dict[str, dict[tuple[int, str], AgentDelta]] = {}
        for d in deltas:
            _require("project_id", d.project_id)
            _require("agent_id", d.agent_id)
            # Keep the first delta per (minute, agent): the same minute twice in one batch is one minute.
            by_project.setdefault(d.project_id, {}).setdefault((d.seq, d.agent_id), d)
        if not by_project:
            return 0
        pipe = self.connection.pipeline(transaction=False)
        for project_id, unique in by_project.items():
            agents: dict[str, int] = {}
            body: list[str | int | float] = []
            for d in unique.values():
                index = agents.setdefault(d.agent_id, len(agents) + 1)
                body.extend(
                    (
                        d.seq,
                        index,
                        d.assigned,
                        d.completed,
                        d.failed,
                        "" if d.success is None else repr(float(d.success)),
                        "" if d.active_ms is None else d.active_ms,
                        d.active_at or "",
                        len(d.capabilities),
                        *d.capabilities,
                    )
                )
            key_list = [keys.agent_memory_counted(project_id), keys.agents(project_id)]
            for agent_id in agents:
                key_list.extend(
                    (keys.agent_memory(project_id, agent_id), keys.agent_capabilities(project_id, agent_id))
                )
            args: list[str | int | float] = [self.max_capabilities, len(agents), *agents, len(unique), *body]
            self._apply(keys=key_list, args=args, client=pipe)
        return sum(int(n) for n in pipe.execute())

    def get(self, project_id: str, agent_id: str) -> AgentMemory:
        """One agent's track record in a project (all zeros for an agent not seen there)."""
        _require("project_id", project_id)
        _require("agent_id", agent_id)
        pipe = self.connection.pipeline(transaction=False)
        pipe.hgetall(keys.agent_memory(project_id, agent_id))
        pipe.smembers(keys.agent_capabilities(project_id, agent_id))
        raw, caps = pipe.execute()
        fields = {k.decode(): v.decode() for k, v in raw.items()}
        capabilities: set[bytes] = caps
        count = int(fields.get("success_count", 0))
        mean = round(float(fields["success_sum"]) / count, 4) if count else None
        return AgentMemory(
            agent_id=agent_id,
            tasks_assigned=int(fields.get("assigned", 0)),
            tasks_completed=int(fields.get("completed", 0)),
            tasks_failed=int(fields.get("failed", 0)),
            mean_success=mean,
            capabilities=tuple(sorted(c.decode() for c in capabilities)),
            last_active=fields.get("last_active"),
        )

    def agents(self, project_id: str) -> list[str]:
        """Ids of the agents with a memory in the project, sorted."""
        _require("project_id", project_id)
        members: set[bytes] = self.connection.smembers(keys.agents(project_id))  # type: ignore[assignment]
        return sorted(a.decode() for a in members)

    def reset(self, project_id: str) -> None:
        """Forget a project's agent memory, counted minutes included (before a replay from scratch)."""
        _require("project_id", project_id)
        names = [keys.agents(project_id), keys.agent_memory_counted(project_id)]
        for agent_id in self.agents(project_id):
            names.extend((keys.agent_memory(project_id, agent_id), keys.agent_capabilities(project_id, agent_id)))
        for start in range(0, len(names), 500):
            self.connection.delete(*names[start : start + 500])

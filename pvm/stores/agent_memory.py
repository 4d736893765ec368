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
clear; the deltas of the minutes it counts are summed per agent first, so a
batch writes each agent's hash and sets once rather than once per minute. The
log assigns each minute id exactly one ``seq`` per project (a duplicate append
returns the original), so the bit stands for the minute id.
Why a bitmap and not a set of counted minute ids: it is exact for any replay,
in any order, at one bit per minute (10 million minutes: 1.25 MB), where a set
of ids costs ~70 bytes per minute, and a bounded set would count a replay of
minutes older than its bound a second time. The price: the bitmap belongs to the
log's numbering, so a project whose log is recreated must `reset` its agent
memory too (replay from scratch does exactly that).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import redis

from contracts import keys
from contracts.memory import AgentMemory

MAX_CAPABILITIES = 256  # per agent and project; beyond it new capability names are dropped
# Minutes whose counted bits one BITFIELD sets (4 arguments each: Lua's unpack() takes at most ~8,000 values).
BITS_PER_CALL = 1_000

_APPLY = """
-- KEYS: counted bitmap, agents set, then per agent (1-based a): memory hash KEYS[2a+1], capabilities set KEYS[2a+2]
-- ARGV[1]: max_capabilities; ARGV[2]: agent ids (msgpack array); ARGV[3]: the minutes (one flat msgpack array):
--   per minute: seq, delta count k, then k x (agent index, assigned, completed, failed, success or false,
--   active_ms or false, active_at, capability count c, c capabilities)
-- A minute whose bit was clear counts; its deltas are summed per agent, then each agent is written once.
local max_caps = tonumber(ARGV[1])
local agents = cmsgpack.unpack(ARGV[2])
local v = cmsgpack.unpack(ARGV[3])
-- Every minute's bit is set first, BITS_PER_CALL minutes per BITFIELD: a SETBIT per minute cost most of the script.
-- BITFIELD answers the old bits in order, so a minute twice in one batch counts once, as with SETBIT.
local was = {}  -- per minute, in order: its bit before
local ops = {}
local i = 1
while i <= #v do
  local n = #ops
  ops[n + 1], ops[n + 2], ops[n + 3], ops[n + 4] = 'SET', 'u1', v[i], 1
  local k = v[i + 1]
  i = i + 2
  for _ = 1, k do
    i = i + 8 + v[i + 7]
  end
  if #ops == 4 * bits_per_call or i > #v then
    for _, bit in ipairs(redis.call('BITFIELD', KEYS[1], unpack(ops))) do
      was[#was + 1] = bit
    end
    ops = {}
  end
end
local counted = 0
local totals = {}  -- agent index -> sums over the minutes counted now
local m = 0
i = 1
while i <= #v do
  m = m + 1
  local fresh = was[m] == 0
  local k = v[i + 1]
  i = i + 2
  if fresh then counted = counted + 1 end
  for _ = 1, k do
    local ncaps = v[i + 7]
    if fresh then
      local t = totals[v[i]]
      if t == nil then
        t = {assigned = 0, completed = 0, failed = 0, success_sum = 0, success_count = 0, caps = {}, seen = {}}
        totals[v[i]] = t
      end
      t.assigned = t.assigned + v[i + 1]
      t.completed = t.completed + v[i + 2]
      t.failed = t.failed + v[i + 3]
      if v[i + 4] then
        t.success_sum = t.success_sum + v[i + 4]
        t.success_count = t.success_count + 1
      end
      if v[i + 5] and (t.active_ms == nil or v[i + 5] > t.active_ms) then
        t.active_ms = v[i + 5]
        t.active_at = v[i + 6]
      end
      for c = 1, ncaps do
        local cap = v[i + 7 + c]
        if not t.seen[cap] then
          t.seen[cap] = true
          t.caps[#t.caps + 1] = cap
        end
      end
    end
    i = i + 8 + ncaps
  end
end
for a, agent in ipairs(agents) do
  local t = totals[a]
  if t ~= nil then
    local mem, caps = KEYS[2 * a + 1], KEYS[2 * a + 2]
    redis.call('SADD', KEYS[2], agent)
    for _, field in ipairs({'assigned', 'completed', 'failed'}) do
      if t[field] ~= 0 then redis.call('HINCRBY', mem, field, t[field]) end
    end
    if t.success_count > 0 then
      redis.call('HINCRBYFLOAT', mem, 'success_sum', string.format('%.17g', t.success_sum))
      redis.call('HINCRBY', mem, 'success_count', t.success_count)
    end
    if t.active_ms ~= nil then
      local newest = tonumber(redis.call('HGET', mem, 'last_active_ms') or '-1')
      if t.active_ms > newest then
        redis.call('HSET', mem, 'last_active_ms', string.format('%d', t.active_ms), 'last_active', t.active_at)
      end
    end
    if #t.caps > 0 then
      local size = redis.call('SCARD', caps)
      for _, cap in ipairs(t.caps) do
        if size >= max_caps then break end
        size = size + redis.call('SADD', caps, cap)
      end
    end
  end
end
return counted
"""
_APPLY = f"local bits_per_call = {BITS_PER_CALL}\n{_APPLY}"


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
        # project -> seq -> agent -> delta; the first delta per (minute, agent) wins: a minute twice in a batch is one.
        by_project: dict[str, dict[int, dict[str, AgentDelta]]] = {}
        for d in deltas:
            project_id, agent_id = d.project_id, d.agent_id
            if not (isinstance(project_id, str) and project_id and isinstance(agent_id, str) and agent_id):
                _require("project_id", project_id)
                _require("agent_id", agent_id)
            minutes = by_project.get(project_id)
            if minutes is None:
                minutes = by_project[project_id] = {}
            of_minute = minutes.get(d.seq)
            if of_minute is None:
                minutes[d.seq] = {agent_id: d}
            elif agent_id not in of_minute:
                of_minute[agent_id] = d
        if not by_project:
            return 0
        pipe = self.connection.pipeline(transaction=False)
        for project_id, minutes in by_project.items():
            agents: dict[str, int] = {}
            flat: list[Any] = []
            extend = flat.extend
            for seq, of_minute in minutes.items():
                extend((seq, len(of_minute)))
                for d in of_minute.values():
                    index = agents.get(d.agent_id)
                    if index is None:
                        index = agents[d.agent_id] = len(agents) + 1
                    success, active_ms, capabilities = d.success, d.active_ms, d.capabilities
                    extend(
                        (
                            index,
                            d.assigned,
                            d.completed,
                            d.failed,
                            False if success is None else float(success),
                            False if active_ms is None else active_ms,
                            d.active_at or "",
                            len(capabilities),
                        )
                    )
                    if capabilities:
                        extend(capabilities)
            key_list = [keys.agent_memory_counted(project_id), keys.agents(project_id)]
            for agent_id in agents:
                key_list.append(keys.agent_memory(project_id, agent_id))
                key_list.append(keys.agent_capabilities(project_id, agent_id))
            # msgpack arguments (the script unpacks them with cmsgpack): ~10 arguments per minute cost redis-py more
            # to encode than the script takes to run, and one flat array spares the script a table per delta.
            args = [self.max_capabilities, msgpack.packb(list(agents)), msgpack.packb(flat)]
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
        return self.parse(agent_id, raw, caps)

    @staticmethod
    def parse(agent_id: str, fields: dict[bytes, bytes], capabilities: Iterable[bytes]) -> AgentMemory:
        """An agent's track record from its memory hash and capabilities set as Redis returned them.

        For readers that fetch them along with other keys in one round trip.
        """
        values = {k.decode(): v.decode() for k, v in fields.items()}
        count = int(values.get("success_count", 0))
        mean = round(float(values["success_sum"]) / count, 4) if count else None
        return AgentMemory(
            agent_id=agent_id,
            tasks_assigned=int(values.get("assigned", 0)),
            tasks_completed=int(values.get("completed", 0)),
            tasks_failed=int(values.get("failed", 0)),
            mean_success=mean,
            capabilities=tuple(sorted(c.decode() for c in capabilities)),
            last_active=values.get("last_active"),
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

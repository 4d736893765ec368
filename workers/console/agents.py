"""The console's agents pages: every agent of a project with its track record (what agent memory holds: tasks
assigned, completed and failed, mean success, capabilities, when it last acted), and one agent's record with its
recent minutes.

The track record is the index pool's agent memory (`pvm.stores.agent_memory`); an agent's recent minutes are its
recent window (`keys.agent_recent_window`, the newest `PVM_RECENT_WINDOW` minutes it wrote, by log seq), read a
page at a time from the newest, their bodies from the minute cache and then the log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from starlette.routing import Route

from contracts import keys
from contracts.memory import AgentMemory
from pvm.stores.agent_memory import AgentMemoryStore
from workers.api.request import NotFound, int_param
from workers.console.site import Page, Site, Visit, segment

PAGE_SIZE = 100  # agents, or an agent's minutes, a page shows unless `n` says otherwise
MAX_PAGE_SIZE = 1_000


@dataclass(frozen=True)
class AgentRow:
    """An agent as the agents page lists it: its track record and how many of its minutes the window holds."""

    memory: AgentMemory
    windowed: int

    @property
    def path(self) -> str:
        return segment(self.memory.agent_id)


def agent_rows(visit: Visit, agent_ids: list[str]) -> list[AgentRow]:
    """Each agent's record and window size, in one round trip for the page."""
    project_id = visit.project_id
    pipe = visit.stores.connection.pipeline(transaction=False)
    for agent_id in agent_ids:
        pipe.hgetall(keys.agent_memory(project_id, agent_id))
        pipe.smembers(keys.agent_capabilities(project_id, agent_id))
        pipe.zcard(keys.agent_recent_window(project_id, agent_id))
    replies = iter(pipe.execute())
    return [
        AgentRow(AgentMemoryStore.parse(agent_id, next(replies), next(replies)), int(next(replies)))
        for agent_id in agent_ids
    ]


def agents_page(visit: Visit) -> Page:
    """The project's agents by id, those whose id holds `contains`, a page at a time (`after`: the last id of the
    page before)."""
    n = int_param(visit.request, "n", PAGE_SIZE, 1, MAX_PAGE_SIZE)
    after = visit.param("after")
    contains = visit.param("contains")
    every = AgentMemoryStore(visit.stores.connection).agents(visit.project_id)  # sorted
    if contains:
        every = [a for a in every if contains.casefold() in a.casefold()]
    following = [a for a in every if a > after] if after else every
    shown = following[:n]
    return Page(
        "agents.html",
        "Agents",
        {
            "rows": agent_rows(visit, shown),
            "total": len(every),
            "n": n,
            "after": after,
            "contains": contains,
            "next_after": shown[-1] if len(following) > n and shown else "",
        },
    )


def recent_minutes(visit: Visit, agent_id: str, n: int, before: int | None) -> tuple[list[dict[str, Any]], int | None]:
    """The agent's newest `n` windowed minutes below log seq `before` (all when None), newest first, and the seq to
    read the next older page below (None when there is none)."""
    key = keys.agent_recent_window(visit.project_id, agent_id)
    top = f"({before}" if before is not None else "+inf"
    found = cast(
        list[tuple[bytes, float]],
        visit.stores.connection.zrevrangebyscore(key, top, "-inf", start=0, num=n + 1, withscores=True),
    )
    page = [(raw.decode(), int(seq)) for raw, seq in found[:n]]
    minutes = visit.stores.reader.get_by_ids(visit.project_id, [minute_id for minute_id, _ in page])
    older = page[-1][1] if len(found) > n else None
    return minutes, older


def agent_page(visit: Visit) -> Page:
    """One agent: its track record, its capabilities and its recent minutes, newest first, a page at a time."""
    project_id = visit.project_id
    agent_id = visit.request.path_params["agent_id"]
    n = int_param(visit.request, "n", PAGE_SIZE, 1, MAX_PAGE_SIZE)
    raw_before = visit.param("before")
    before = int_param(visit.request, "before", 0, 1, 2**63 - 1) if raw_before else None
    pipe = visit.stores.connection.pipeline(transaction=False)
    pipe.sismember(keys.agents(project_id), agent_id)
    pipe.exists(keys.agent_recent_window(project_id, agent_id))
    known, windowed = pipe.execute()
    if not known and not windowed:
        raise NotFound(
            f"project {project_id} has no agent {agent_id!r}: no minute of it has been indexed or cached; "
            "the agents page lists those it has"
        )
    memory = AgentMemoryStore(visit.stores.connection).get(project_id, agent_id)
    minutes, older = recent_minutes(visit, agent_id, n, before)
    return Page(
        "agent.html",
        f"Agent {agent_id}",
        {
            "agent_id": agent_id,
            "agent_path": segment(agent_id),
            "memory": memory,
            "minutes": minutes,
            "n": n,
            "before": before,
            "older": older,
            "window": visit.stores.settings.recent_window if visit.stores.settings else None,
        },
    )


def routes(site: Site) -> list[Route]:
    return [
        Route("/ui/projects/{project_id}/agents", site.page(agents_page)),
        # An agent id is free text: a '/' in it reaches the handler whole.
        Route("/ui/projects/{project_id}/agents/{agent_id:path}", site.page(agent_page)),
    ]

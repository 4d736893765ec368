"""The console's front pages: every project the token sees, and one project's overview (what it holds, how far
each pool has caught up with its log, its shard's dead letters)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from starlette.routing import Route

from contracts import keys
from contracts.facts import TierKey
from workers.api.stats import project_stats
from workers.console.site import Page, Site, Visit

# Each pool's watermark over the log: its key and the field that says when it last moved.
POOL_HEADS = (
    ("index", keys.index_head, "indexed_at"),
    ("facts", keys.facts_head, "applied_at"),
    ("summarize", keys.summarize_head, "summarized_at"),
)


@dataclass(frozen=True)
class PoolFreshness:
    """How far one pool is behind the newest durable minute of a project."""

    pool: str
    seq: int  # every log seq at or below it is done
    behind: int  # durable minutes the pool has not done yet
    moved_at: float | None  # when `seq` last moved (Unix seconds)


@dataclass(frozen=True)
class ProjectRow:
    """A project as the projects page lists it."""

    project_id: str
    minutes: int
    durable_at: float | None
    agents: int
    threads: int
    facts: int  # fact records of the project's tier, every status (its task tiers are not counted)
    freshness: list[PoolFreshness]
    dead_letters: int  # in the project's shard (dead letters are kept per shard, not per project)


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _float(raw: Any) -> float | None:
    try:
        return float(_text(raw)) if raw is not None else None
    except ValueError:
        return None


def project_rows(connection: redis.Redis, projects: list[str], shards: int) -> list[ProjectRow]:
    """Each project's row, in one round trip for all of them."""
    pipe = connection.pipeline(transaction=False)
    for project_id in projects:
        pipe.hmget(keys.log_head(project_id), ["seq", "durable_at"])
        pipe.scard(keys.agents(project_id))
        pipe.hlen(keys.summary_threads(project_id))
        pipe.hlen(keys.facts_by_id(TierKey.for_project(project_id)))
        for _, head, moved in POOL_HEADS:
            pipe.hmget(head(project_id), ["seq", moved])
        pipe.xlen(keys.dead_letter_stream(keys.shard_of(project_id, shards)))
    replies = iter(pipe.execute())
    rows = []
    for project_id in projects:
        seq_raw, durable_raw = next(replies)
        seq = int(_text(seq_raw)) if seq_raw is not None else 0
        agents, threads, facts = int(next(replies)), int(next(replies)), int(next(replies))
        freshness = []
        for pool, _, _ in POOL_HEADS:
            done_raw, moved_raw = next(replies)
            done = int(_text(done_raw)) if done_raw is not None else 0
            freshness.append(PoolFreshness(pool, done, max(0, seq - done), _float(moved_raw)))
        rows.append(
            ProjectRow(project_id, seq, _float(durable_raw), agents, threads, facts, freshness, int(next(replies)))
        )
    return rows


def projects_page(visit: Visit) -> Page:
    rows = project_rows(visit.stores.connection, visit.projects(), visit.stores.shards)
    return Page("projects.html", "Projects", {"rows": rows})


def project_page(visit: Visit) -> Page:
    project_id = visit.project_id
    [row] = project_rows(visit.stores.connection, [project_id], visit.stores.shards)
    stats = project_stats(visit.stores.connection, project_id)
    return Page("project.html", project_id, {"row": row, "stats": stats})


def routes(site: Site) -> list[Route]:
    return [
        Route("/ui", site.page(projects_page)),
        Route("/ui/projects/{project_id}", site.page(project_page)),
    ]

"""The console's pools page: how the pipeline is keeping up, deployment-wide, refreshed live.

One row per stage (the dispatchers' stream group, then each pool's RQ queue): what waits, what is in progress,
the workers serving it, what failed and how long the oldest waiting item has waited; below, each shard's stream,
how soon after emit minutes reached each stage, and the maintenance schedules. It reads the same snapshot as
`pvm status` and the Prometheus exporter (workers.runtime.state), so the three never disagree. Every count is the
deployment's, none a project's: any accepted token may see it.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.routing import Route

from pvm.config import Settings
from pvm.metrics import FRESHNESS_BUCKETS
from workers.console.site import Page, Site, Visit
from workers.runtime.state import Snapshot, snapshot

REFRESH_S = 5  # how often the page's live part reloads itself (console.js, data-refresh)
# An item waiting this long at a stage is marked: well past a batch's usual seconds, short of an alert's minutes.
SLOW_WAIT_S = 60.0


@dataclass(frozen=True)
class StageRow:
    """One stage of the pipeline as the page's first table shows it (None: the stage has no such count)."""

    stage: str
    source: str  # where its work waits: a stream group, or an RQ queue
    waiting: int  # unread stream entries (the group's lag), or jobs queued
    lag_exact: bool  # False: the lag was counted up to a cap, a lower bound
    in_progress: int  # delivered and not acknowledged, or jobs started
    workers: int | None  # live workers (a stream group's consumers are not counted here)
    failed: int  # dead letters, or jobs in the failed registry
    failures: int  # minutes the stage counted as failed in its batches, ever
    minutes: int  # minutes the stage has done, ever
    oldest_waiting_s: float | None

    @property
    def slow(self) -> bool:
        return self.oldest_waiting_s is not None and self.oldest_waiting_s >= SLOW_WAIT_S


def _counter(state: Snapshot, stage: str, name: str) -> int:
    return int(state.stages.get(stage, {}).get(name, 0))


def stage_rows(state: Snapshot) -> list[StageRow]:
    """The dispatch stage (each stream group, summed over the shards), then one row per pool's queue."""
    rows = []
    groups = sorted({g.name for s in state.streams for g in s.groups})
    for name in groups:
        found = [g for s in state.streams for g in s.groups if g.name == name]
        ages = [g.oldest_pending_age_s for g in found if g.oldest_pending_age_s is not None]
        rows.append(
            StageRow(
                stage="dispatch",
                source=f"stream group {name}",
                waiting=sum(g.lag or 0 for g in found),
                lag_exact=all(g.lag_source != "lower-bound" for g in found),
                in_progress=sum(g.pending for g in found),
                workers=None,
                failed=sum(s.dead_letters for s in state.streams),
                failures=_counter(state, "dispatch", "failures"),
                minutes=_counter(state, "dispatch", "minutes"),
                oldest_waiting_s=max(ages) if ages else None,
            )
        )
    for q in state.queues:
        rows.append(
            StageRow(
                stage=q.pool,
                source=f"queue {q.queue}",
                waiting=q.queued + q.dequeued,
                lag_exact=True,
                in_progress=q.started,
                workers=q.workers,
                failed=q.failed,
                failures=_counter(state, q.pool, "failures"),
                minutes=_counter(state, q.pool, "minutes"),
                oldest_waiting_s=q.oldest_waiting_s,
            )
        )
    return rows


def duration(seconds: float | None) -> str:
    """A span of time for people: '0.025 s', '12 s', '3 min', '2.5 h', '4 d'; '—' for None."""
    if seconds is None:
        return "—"
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if abs(seconds) >= size:
            return f"{seconds / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{seconds:.3g} s" if abs(seconds) < 10 else f"{seconds:.0f} s"


def bound(seconds: float | None) -> str:
    """A quantile read from a histogram: the upper bound of its bucket ('≤ 0.5 s'), or past the last bucket."""
    if seconds is None:
        return "—"
    if seconds == float("inf"):
        return f"> {duration(FRESHNESS_BUCKETS[-1])}"
    return f"≤ {duration(seconds)}"


def pools_page(visit: Visit) -> Page:
    stores = visit.stores
    # Without the server's settings (an app built in code), the shard count is all the snapshot needs.
    settings = stores.settings if stores.settings is not None else Settings(shards=stores.shards)
    state = snapshot(stores.connection, settings)
    values = {
        "state": state,
        "rows": stage_rows(state),
        "refresh_s": REFRESH_S,
        "slow_wait_s": SLOW_WAIT_S,
        "duration": duration,
        "bound": bound,
    }
    return Page("pools.html", "Pools", values)


def routes(site: Site) -> list[Route]:
    return [Route("/ui/pools", site.page(pools_page))]

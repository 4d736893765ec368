"""`pvm replay`: rebuild every derived store of a project from the durable log alone.

The log is the commit point; Redis caches, the vector index, agent memory and
the facts are derived from it. Replay clears a project's derived state and feeds the log
back through the same code paths the pipeline uses: the cache update of the
log pool, then index jobs on the index queue (so with the embedded engine the
process that owns the engine does the indexing). Idempotence makes a replay
that is interrupted and run again safe.

The facts are rebuilt here, in this process, before any job is queued: the
store changes only by applying knowledge-change minutes, so replay applies the
project's change minutes from the log (`replay_facts`), with no extractor and
no model, and every fact comes back as it was. A replay of every project
forgets the global tier first; a replay of one project applies its changes to
the global tier again (idempotent) and leaves the other projects' alone.

Waiting, replay says "rebuilt" only once each project's reset job has finished
and its index head has reached the newest seq the replay sent (the head's
`seq` means every seq up to it is indexed). A failed reset or index job ends
the wait with the job's error; so does the index queue having no live worker,
at the start or later, rather than a wait that never ends.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import redis
from rq.job import Job

from contracts import ContractError, FactChange, Minute, fact_change, keys
from contracts.fact_changes import FACT_EVENT_TYPES
from contracts.facts import GLOBAL_KEY
from contracts.summaries import SYSTEM_EVENT_TYPES
from pvm import defaults
from pvm.config import Settings
from pvm.connection import bulk_reply
from pvm.stores.cache import CachedMinute, MinuteCache
from pvm.stores.facts import FactStore, Outcome
from pvm.stores.log import LogReader
from workers.evaluate import pool as evaluate_pool
from workers.ops.failed_jobs import job_error
from workers.runtime.heads import advance_script
from workers.runtime.messages import LoggedRecord
from workers.runtime.progress import Progress
from workers.runtime.queues import enqueue_pool_job, live_workers, pool_job, pool_queue

NO_INDEX_WORKER = "no index worker is running: start `pvm worker index` or `pvm serve`"


@dataclass
class ProjectReplay:
    """The jobs one project's replay enqueued and the log seq its index head must reach."""

    project_id: str
    reset_id: str
    index_ids: list[str] = field(default_factory=list)
    minutes: int = 0
    last_seq: int = 0  # the newest seq sent to the index: done when the index head holds it


class ReplayFailed(Exception):
    """A replay's job failed, or nothing will run its jobs; the message says which and why."""


def _clear_caches(connection: redis.Redis, project_id: str) -> None:
    doomed = [keys.recent_window(project_id), keys.minute_by_id(project_id), keys.minute_by_id_order(project_id)]
    doomed += list(connection.scan_iter(match=keys.agent_recent_window(project_id, "*"), count=1000))
    connection.delete(*doomed)


@dataclass
class FactsReplay:
    """What rebuilding one project's facts applied."""

    changes: int = 0  # knowledge-change minutes in the log
    applied: int = 0  # ... that changed the store (the rest: already applied, or dropped by a clearing)
    refused: int = 0  # ... that `fact_change` or the store refused, as the facts pool did


_FACTS_HEAD = advance_script("applied_at")


def replay_facts(connection: redis.Redis, settings: Settings, project_id: str) -> FactsReplay:
    """Forget a project's facts, then apply its knowledge-change minutes from the log, in log order.

    No extractor or model runs: the facts pool wrote every decision as a change minute. The facts head
    ends at the log's last seq (every minute of the log is accounted for).
    """
    store = FactStore(connection)
    store.reset_project(project_id)
    log = LogReader(settings.log_dir)
    done = FactsReplay()
    progress = Progress(f"replay {project_id}: facts", log.count(project_id))
    batch: list[tuple[Minute, FactChange]] = []
    seen = last_seq = 0

    def flush() -> None:
        nonlocal batch
        if batch:
            outcomes = store.apply_changes(batch)
            done.applied += sum(o is Outcome.APPLIED for o in outcomes)
            done.refused += sum(o is Outcome.REFUSED for o in outcomes)
            batch = []

    for record in log.history(project_id):
        seen, last_seq = seen + 1, record.seq
        if record.fields.get("event_type") not in FACT_EVENT_TYPES:
            continue
        done.changes += 1
        minute = record.minute
        try:
            batch.append((minute, fact_change(minute)))
        except ContractError:
            done.refused += 1  # the facts pool refused it too: the log keeps it, the store never had it
        if len(batch) >= defaults.REPLAY_BATCH:
            flush()
            progress.show(seen)
    flush()
    if last_seq:
        connection.eval(
            _FACTS_HEAD, 2, keys.facts_head(project_id), keys.facts_done(project_id), repr(time.time()), 1, last_seq
        )
    progress.show(seen, f"{done.changes:,} knowledge changes", force=True)
    progress.done()
    return done


def replay_summaries(connection: redis.Redis, settings: Settings, project_id: str) -> object:
    """Rebuild a project's threads from its log (`workers.summarize.pool.replay_summaries`)."""
    from workers.summarize.pool import replay_summaries as rebuild

    return rebuild(connection, settings, project_id)


def index_replayed_summaries(connection: redis.Redis, settings: Settings, project_id: str, done: object) -> None:
    """Queue a replayed project's summary points (`workers.summarize.pool.index_replayed`)."""
    from workers.summarize.pool import SummariesReplay, index_replayed

    assert isinstance(done, SummariesReplay)
    index_replayed(connection, settings, project_id, done)


def enqueue_project(connection: redis.Redis, settings: Settings, project_id: str) -> ProjectReplay:
    """Clear one project's caches, refill them from its log and enqueue its reset and index jobs."""
    log = LogReader(settings.log_dir)
    total = log.count(project_id)
    cache = MinuteCache(connection, settings.recent_window, settings.minute_cache_size)
    index_queue = pool_queue("index", connection)
    # The index jobs depend on the reset: RQ holds them back until it has finished,
    # however many index workers there are.
    reset = enqueue_pool_job(index_queue, keys.INDEX_RESET_JOB, (project_id,), timeout=None, retries=0)
    replayed = ProjectReplay(project_id, reset.id)
    _clear_caches(connection, project_id)
    progress = Progress(f"replay {project_id}: log", total)
    batch: list[CachedMinute] = []

    def flush() -> None:
        nonlocal batch
        if not batch:
            return
        cache.update(project_id, batch, time.time())
        jobs = index_queue.enqueue_many(
            [pool_job(keys.INDEX_JOB, ([LoggedRecord(m.id, m.seq, m.minute_bytes) for m in batch],), depends_on=reset)]
        )
        # RQ 3.0 lists a job twice when its dependency finishes while it is enqueued (a WATCH retry).
        replayed.index_ids.extend(dict.fromkeys(job.id for job in jobs))
        replayed.minutes += len(batch)
        replayed.last_seq = max(replayed.last_seq, batch[-1].seq)
        batch = []
        progress.show(replayed.minutes)

    for record in log.history(project_id):
        agent, windowed = None, True
        with contextlib.suppress(ValueError):
            agent = record.minute.agent_id
            windowed = record.minute.event_type not in SYSTEM_EVENT_TYPES
        batch.append(CachedMinute(record.id, record.seq, record.minute_bytes, agent, windowed))
        if len(batch) >= defaults.REPLAY_BATCH:
            flush()
    flush()
    # The embedded engine's search is fastest on an optimized shard: ask for it once the rebuild is in.
    enqueue_pool_job(
        index_queue,
        keys.INDEX_OPTIMIZE_JOB,
        (project_id,),
        timeout=defaults.OPTIMIZE_JOB_TIMEOUT_S,
        retries=0,
        depends_on=replayed.index_ids[-1] if replayed.index_ids else reset,
    )
    progress.show(replayed.minutes, "queued for indexing", force=True)
    progress.done()
    return replayed


def _statuses(connection: redis.Redis, job_ids: Sequence[str]) -> list[str | None]:
    """Each job's RQ status (None: its hash is gone), in one round trip."""
    pipe = connection.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hget(Job.key_for(job_id), "status")
    return [None if raw is None else raw.decode() for raw in (bulk_reply(r) for r in pipe.execute())]


FAILED_STATES = ("failed", "stopped", "canceled")


def _check_jobs(connection: redis.Redis, pending: dict[str, str]) -> None:
    """Drop finished jobs from `pending` (job id -> what it is, in enqueue order); ReplayFailed for one that failed.

    Reads the states of the oldest `REPLAY_STATUS_BATCH` pending jobs only (jobs run
    roughly in the order enqueued), so a poll of a long replay stays one small round trip.
    """
    ids = list(itertools.islice(pending, defaults.REPLAY_STATUS_BATCH))
    for job_id, state in zip(ids, _statuses(connection, ids), strict=True):
        if state in FAILED_STATES:
            raise ReplayFailed(f"{pending[job_id]} failed (job {job_id}, {state}): {job_error(connection, job_id)}")
        if state in ("finished", None):  # None: expired after finishing (a failed job is kept for days)
            del pending[job_id]


def _index_heads(connection: redis.Redis, projects: Sequence[ProjectReplay]) -> list[int]:
    pipe = connection.pipeline(transaction=False)
    for p in projects:
        pipe.hget(keys.index_head(p.project_id), "seq")
    return [int(raw) if raw else 0 for raw in (bulk_reply(r) for r in pipe.execute())]


def wait_for(connection: redis.Redis, projects: Sequence[ProjectReplay]) -> None:
    """Wait until every project's reset ran and its index head reached its log; ReplayFailed when that cannot come."""
    if not projects:
        return
    index_queue = pool_queue("index", connection)
    resets = {p.reset_id: f"the reset of {p.project_id}" for p in projects}
    index_jobs = {i: f"an index job of {p.project_id}" for p in projects for i in p.index_ids}
    total = sum(p.minutes for p in projects)
    progress = Progress("replay: reset", len(projects))
    resetting = True
    next_worker_check = time.monotonic() + defaults.REPLAY_WORKER_CHECK_S
    while True:
        if resetting:
            _check_jobs(connection, resets)
            progress.show(len(projects) - len(resets), "waiting for the index worker to reset")
            if not resets:
                resetting = False
                progress.show(len(projects), "done", force=True)
                progress.done()
                label = projects[0].project_id if len(projects) == 1 else f"{len(projects)} projects"
                progress = Progress(f"replay {label}: index", total)
        if not resetting:
            _check_jobs(connection, index_jobs)
            heads = _index_heads(connection, projects)
            progress.show(sum(min(h, p.last_seq) for h, p in zip(heads, projects, strict=True)))
            behind = [p.project_id for h, p in zip(heads, projects, strict=True) if h < p.last_seq]
            if not behind and not index_jobs:
                progress.show(total, "done", force=True)
                progress.done()
                return
            if behind and not index_jobs:
                raise ReplayFailed(
                    f"every index job of the replay ended, yet the index head of {', '.join(behind)} "
                    "is short of the log (was a job deleted?): run the replay again"
                )
        now = time.monotonic()
        if now >= next_worker_check:
            next_worker_check = now + defaults.REPLAY_WORKER_CHECK_S
            if not live_workers(connection, index_queue.name):
                progress.done()
                raise ReplayFailed(f"{NO_INDEX_WORKER}; the replay's jobs stay queued and run once one starts")
        time.sleep(defaults.REPLAY_POLL_S)


def replay(connection: redis.Redis, settings: Settings, project_id: str | None, wait: bool = True) -> int:
    """`pvm replay --project P | --all`: an exit status."""
    projects = LogReader(settings.log_dir).projects()
    if project_id is not None:
        if project_id not in projects:
            known = ", ".join(projects) or "none"
            print(
                f"pvm replay: no log for project {project_id!r} in {settings.log_dir} (projects: {known})",
                file=sys.stderr,
            )
            return 2
        projects = [project_id]
    # Before anything changes: waiting on a queue nobody serves would never end.
    if wait and not live_workers(connection, keys.QUEUES["index"]):
        print(f"pvm replay: {NO_INDEX_WORKER} (or pass --no-wait to queue the rebuild for later)", file=sys.stderr)
        return 1
    if project_id is None:
        FactStore(connection).reset_global()  # every project's changes to it are applied again below
    threads: dict[str, object] = {}
    for p in projects:
        replay_facts(connection, settings, p)
        evaluate_pool.forget(connection, p)  # pruned and merged memories come back with the index
        threads[p] = replay_summaries(connection, settings, p)  # threads: chunks and episodes, no model called
    evaluate_pool.restore_global(connection)  # every project's log feeds the global tier: its prunes are undone too
    enqueued = [enqueue_project(connection, settings, p) for p in projects]
    for p, rebuilt_threads in threads.items():  # their summary points, queued after the index reset
        index_replayed_summaries(connection, settings, p, rebuilt_threads)
    runs = [(r.project_id, r.index_ids[-1] if r.index_ids else r.reset_id) for r in enqueued]
    if enqueued and connection.exists(keys.facts_by_id(GLOBAL_KEY)):
        runs.append((evaluate_pool.GLOBAL_RUN, runs[-1][1]))  # its points come back once the fact changes are in
    for project_id, after in runs:
        # The scores come back too: a rescoring run (no prune, no merge) once the project's index is rebuilt.
        if evaluate_pool.enqueue_run(connection, settings, project_id, evaluate_pool.RESCORE, after) is None:
            print(f"pvm replay: {project_id} is being evaluated; the next evaluation rebuilds its scores")
    total = sum(p.minutes for p in enqueued)
    if wait:
        try:
            wait_for(connection, enqueued)
        except ReplayFailed as exc:
            print(f"pvm replay: {exc}", file=sys.stderr)
            return 1
    state = "rebuilt" if wait else "queued for rebuilding"
    print(f"pvm replay: {total:,} minutes of {len(projects)} project(s) {state} from the log")
    return 0

"""`pvm replay`: rebuild every derived store of a project from the durable log alone.

The log is the commit point; Redis caches, the vector index and agent memory
are derived from it. Replay clears a project's derived state and feeds the log
back through the same code paths the pipeline uses: the cache update of the
log pool, then index jobs on the index queue (so with the embedded engine the
process that owns the engine does the indexing). Idempotence makes a replay
that is interrupted and run again safe.
"""

from __future__ import annotations

import contextlib
import sys
import time

import redis
from rq import Queue, Retry, Worker

from contracts import keys
from pvm import defaults
from pvm.config import Settings
from pvm.queues import pool_queue
from pvm.stores.cache import CachedMinute, MinuteCache
from pvm.stores.log import LogReader


class Progress:
    """A one-line progress display on stderr (a line per update when stderr is not a terminal)."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.started, self.last = label, total, time.monotonic(), 0.0
        self.tty = sys.stderr.isatty()

    def show(self, done: int, note: str = "", force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < (0.2 if self.tty else 2.0):
            return
        self.last = now
        width = 30
        filled = int(width * done / self.total) if self.total else width
        rate = done / max(now - self.started, 1e-6)
        line = f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {done:,}/{self.total:,} {rate:,.0f}/s {note}"
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty:
            print(file=sys.stderr)


def _clear_caches(connection: redis.Redis, project_id: str) -> None:
    doomed = [keys.recent_window(project_id), keys.minute_by_id(project_id), keys.minute_by_id_order(project_id)]
    doomed += list(connection.scan_iter(match=keys.agent_recent_window(project_id, "*"), count=1000))
    connection.delete(*doomed)


def replay_project(connection: redis.Redis, settings: Settings, project_id: str, wait: bool = True) -> int:
    """Rebuild one project's caches, index and agent memory from its log; returns minutes replayed."""
    log = LogReader(settings.log_dir)
    total = log.count(project_id)
    cache = MinuteCache(connection, settings.recent_window, settings.minute_cache_size)
    index_queue = pool_queue("index", connection)
    # The index jobs depend on the reset: RQ holds them back until it has finished,
    # however many index workers there are.
    reset = index_queue.enqueue(keys.INDEX_RESET_JOB, project_id, result_ttl=600)
    _clear_caches(connection, project_id)
    progress = Progress(f"replay {project_id}: log", total)
    sent = 0
    batch: list[CachedMinute] = []
    last = reset

    def flush() -> None:
        nonlocal sent, batch, last
        if not batch:
            return
        cache.update(project_id, batch, time.time())
        [last] = index_queue.enqueue_many(
            [
                Queue.prepare_data(
                    keys.INDEX_JOB,
                    args=([[m.id, m.seq, m.minute_bytes] for m in batch],),
                    retry=Retry(max=defaults.JOB_RETRIES),
                    result_ttl=defaults.JOB_RESULT_TTL_S,
                    failure_ttl=defaults.JOB_FAILURE_TTL_S,
                    timeout=defaults.DOWNSTREAM_JOB_TIMEOUT_S,
                    depends_on=reset,
                )
            ]
        )
        sent += len(batch)
        batch = []
        progress.show(sent)

    for record in log.history(project_id):
        agent = None
        with contextlib.suppress(ValueError):
            agent = record.minute.agent_id
        batch.append(CachedMinute(record.id, record.seq, record.minute_bytes, agent))
        if len(batch) >= defaults.REPLAY_BATCH:
            flush()
    flush()
    # The embedded engine's search is fastest on an optimized shard: ask for it once the rebuild is in.
    index_queue.enqueue(
        keys.INDEX_OPTIMIZE_JOB, project_id, depends_on=last, job_timeout=defaults.OPTIMIZE_JOB_TIMEOUT_S
    )
    progress.show(sent, "queued for indexing", force=True)
    progress.done()
    if not wait:
        return sent
    progress = Progress(f"replay {project_id}: index", total)
    hinted = False
    started = time.monotonic()
    while True:
        head = connection.hget(keys.index_head(project_id), "seq")
        indexed = int(head) if head else 0
        progress.show(indexed)
        if indexed >= total:
            break
        if (
            not hinted
            and time.monotonic() - started > 5
            and Worker.count(connection=connection, queue=index_queue) == 0
        ):
            print(
                "\npvm replay: no index worker is running; start `pvm up`, `pvm serve` or `pvm worker index`",
                file=sys.stderr,
            )
            hinted = True
        time.sleep(0.1)
    progress.show(total, "done", force=True)
    progress.done()
    return sent


def replay(connection: redis.Redis, settings: Settings, project_id: str | None, wait: bool = True) -> int:
    """`pvm replay --project P | --all`."""
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
    total = 0
    for p in projects:
        total += replay_project(connection, settings, p, wait)
    state = "rebuilt" if wait else "queued for rebuilding"
    print(f"pvm replay: {total:,} minutes of {len(projects)} project(s) {state} from the log")
    return 0

"""The `pvm` command: run the stack and its parts, and look into the log.

Server-side commands import `workers` lazily, so agents that only use the
library never load worker code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contracts.minute import PROJECT_ID_RULE, is_valid_project_id
from pvm import defaults
from pvm.config import ConfigError, Settings

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from pvm.client import PVMClient
    from workers.ops.exporter import GroupState


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pvm")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _parse_processes(values: Sequence[str]) -> dict[str, int]:
    from workers.runtime.queues import UnknownPool, queue_name

    out: dict[str, int] = {}
    for value in values:
        pool, sep, count = value.partition("=")
        if not sep or not count.isdigit() or int(count) < 1:
            raise SystemExit(f"pvm: --processes expects POOL=N with N >= 1, got {value!r}")
        try:
            queue_name(pool)
        except UnknownPool as exc:
            raise SystemExit(f"pvm: {exc}") from None
        out[pool] = int(count)
    return out


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port (1-65535), got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def _project_id(text: str) -> str:
    if not is_valid_project_id(text):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a project id: {PROJECT_ID_RULE}")
    return text


def _shard_list(text: str) -> list[int]:
    return [_shard_number(part.strip()) for part in text.split(",")]


def _shard_number(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a shard number (0, 1, 2, ...)")
    return int(text)


def _stream_id(text: str) -> str:
    from workers.ops.dead_letters import STREAM_ID

    if not STREAM_ID.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a stream entry id (like 1718000000000-0)")
    return text


def _shards_of(settings: Settings, chosen: Sequence[int] | None) -> list[int]:
    """The shards a command names (all when none), each checked against PVM_SHARDS."""
    if chosen is None:
        return list(range(settings.shards))
    for shard in chosen:
        if shard >= settings.shards:
            raise SystemExit(
                f"pvm: there is no shard {shard}: PVM_SHARDS is {settings.shards} (shards 0-{settings.shards - 1})"
            )
    return list(chosen)


def _connect(settings: Settings) -> redis.Redis:
    """A client for the configured Redis, which has answered a PING (else redis' ConnectionError: one line in main)."""
    from pvm import defaults
    from pvm.connection import redis_from_settings

    connection = redis_from_settings(settings, socket_connect_timeout=defaults.CLI_REDIS_CONNECT_TIMEOUT_S)
    connection.ping()
    return connection


def _connect_service(settings: Settings) -> redis.Redis:
    """`_connect` for a long-running command: waits up to PVM_REDIS_START_WAIT for a Redis that is
    restarting or loading its data (saying so once on stderr), then gives up like `_connect`."""
    import time

    import redis

    deadline = time.monotonic() + settings.redis_start_wait_s
    pause = 0.1
    said = False
    while True:
        try:
            return _connect(settings)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            if time.monotonic() + pause > deadline:
                raise
            if not said:
                print(
                    f"pvm: {redis_unreachable(settings.redis_url or '', exc)}; "
                    f"waiting up to {settings.redis_start_wait_s:g} s (PVM_REDIS_START_WAIT)",
                    file=sys.stderr,
                    flush=True,
                )
                said = True
            time.sleep(pause)
            pause = min(pause * 2, 2.0)


def redis_unreachable(url: str, exc: Exception) -> str:
    """The one line `pvm` prints when Redis does not answer: where it looked (no password), why, and the fix."""
    import urllib.parse

    import redis

    parts = urllib.parse.urlsplit(url)
    if parts.password is not None:
        user = parts.username or ""
        host = parts.netloc.rpartition("@")[2]
        url = urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    reason = str(exc).strip().rstrip(".")
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            reason = cause.strerror
            break
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, redis.exceptions.AuthenticationError):
        return f"Redis at {url} refused to log in ({reason}): fix the credentials in PVM_REDIS_URL"
    return f"cannot reach Redis at {url} ({reason}): start it or set PVM_REDIS_URL"


def _stop_on_signals(event: threading.Event) -> None:
    def handler(signum: int, frame: object) -> None:
        event.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


# -- commands -----------------------------------------------------------------


def _need_mcp(command: str) -> None:
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise SystemExit(f"{command}: needs the mcp extra: pip install 'pvm[mcp]'") from None


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    from workers.runtime.stack import Stack

    try:
        stack = Stack(
            settings,
            _parse_processes(args.processes),
            dispatchers=args.dispatchers,
            api_port=args.api_port,
            mcp=args.mcp,
        )
    except ValueError as exc:
        raise SystemExit(f"pvm: {exc}") from None
    if args.mcp:
        _need_mcp("pvm up --mcp")
    if settings.redis_url:
        _connect_service(settings).close()  # a Redis named but not there: say so before starting anything
    stop = threading.Event()
    _stop_on_signals(stop)
    live = stack.start()
    where = "embedded Valkey" if stack.redis else "PVM_REDIS_URL"
    print(f"pvm up: Redis {live.redis_url} ({where}); log in {live.log_dir}; shards {live.shards}")
    print("  processes: " + ", ".join(f"{name} pid {c.pid}" for name, c in stack.children.items()))
    print(f"  reader API on {live.api_url}  (pvm context / pvm search use it: PVM_API_URL={live.api_url})")
    if args.mcp:
        print(f"  MCP tools on {live.api_url}{defaults.MCP_PATH}  (streamable HTTP, the API's bearer tokens)")
    print(f"  agents connect with PVM_REDIS_URL={live.redis_url}  (Ctrl-C stops the stack)")
    sys.stdout.flush()
    try:
        while not stop.wait(1.0):
            stack.restart_dead()
    finally:
        print("pvm up: stopping (workers finish their current batch)...")
        stack.stop()
        print("pvm up: stopped")
    return 0


def cmd_scheduler(args: argparse.Namespace, settings: Settings) -> int:
    from contracts import keys
    from workers.runtime.scheduler import Scheduler, default_schedules, read_schedules

    connection = _connect_service(settings)
    scheduler = Scheduler(connection, default_schedules(settings), name=args.name)
    if args.list:
        now = scheduler.now()
        states = {st.name: st for st in read_schedules(connection)}
        holder = connection.get(keys.scheduler_leader())
        print(f"leader: {holder.decode() if isinstance(holder, bytes) else 'none'}")
        rows: list[dict[str, Any]] = []
        for sched in scheduler.schedules:
            st = states.get(sched.name)
            last = st.last_run if st else None
            due = (last + sched.every_s - now) if last is not None else 0.0
            rows.append(
                {
                    "schedule": sched.name,
                    "pool": sched.pool,
                    "every": _age(sched.every_s),
                    "last run": "never" if last is None else f"{_age(now - last)} ago",
                    "next": "now" if due <= 0 else f"in {_age(due)}",
                    "last job": (st.job_id if st else None) or "-",
                }
            )
        if rows:
            print(_table(rows, ["schedule", "pool", "every", "last run", "next", "last job"]))
        else:
            print("no schedules (PVM_OPTIMIZE_EVERY=0 or a Qdrant server, and PVM_EVALUATE_EVERY=0)")
        return 0
    if args.once:
        enqueued = scheduler.tick()
        if not scheduler.leading:
            holder = connection.get(keys.scheduler_leader())
            print(f"standing by: {holder.decode() if isinstance(holder, bytes) else 'another scheduler'} leads")
        else:
            print("enqueued: " + (", ".join(enqueued) or "nothing due"))
        scheduler.release_lease()
        return 0
    if not scheduler.schedules:
        logging.getLogger("workers").warning(
            "pvm scheduler: nothing to schedule (PVM_OPTIMIZE_EVERY=0 or a Qdrant server, and PVM_EVALUATE_EVERY=0); "
            "idling"
        )
    _stop_on_signals(scheduler.stop_event)
    stats = scheduler.run()
    logging.getLogger("workers").info("scheduler %s stopped: %s", scheduler.name, stats.__dict__)
    return 0


def cmd_dispatch(args: argparse.Namespace, settings: Settings) -> int:
    from workers.ingest.dispatcher import Dispatcher

    shards = _shards_of(settings, args.shards) if args.shards else None
    if args.batch:
        settings = settings.with_(dispatch_batch=args.batch)
    dispatcher = Dispatcher(_connect_service(settings), settings, consumer=args.consumer, shards=shards)
    _stop_on_signals(dispatcher.stop_event)
    logging.getLogger("workers").info("dispatcher %s on shards %s", dispatcher.consumer, dispatcher.shards)
    stats = dispatcher.run(max_idle_s=args.max_idle)
    logging.getLogger("workers").info("dispatcher %s stopped: %s", dispatcher.consumer, stats.__dict__)
    return 0


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from workers.runtime.queues import queue_name
    from workers.runtime.runner import WorkerGroup, run_worker

    for pool in args.pools:
        queue_name(pool)  # an unknown pool: UnknownPool, one line
    for pool in ("index", "evaluate"):
        if pool in args.pools and args.processes > 1 and not settings.qdrant_url:
            raise SystemExit(
                f"pvm: the {pool} pool runs in one process with the embedded engine (it owns the engine's files; "
                "`pvm serve` runs both pools); set PVM_QDRANT_URL to a Qdrant server to run more"
            )
    # A worker rides out Redis going away, but one that never reached it would wait without a word.
    _connect_service(settings).close()
    if args.processes == 1:
        run_worker(args.pools, settings, burst=args.burst, name=args.name)
        return 0
    group = WorkerGroup(args.pools, args.processes, settings)
    stop = threading.Event()
    _stop_on_signals(stop)
    group.start()
    try:
        group.supervise(stop)
    finally:
        group.stop()
    return 0


def _minute_row(record: Any) -> dict[str, Any]:
    m = record.minute
    return {
        "seq": record.seq,
        "id": m.id,
        "timestamp": m.timestamp,
        "event_type": m.event_type,
        "agent_id": m.agent_id,
        "task_id": m.data.get("task_id"),
        "thread_id": m.thread_id,
        "memory_note": m.memory_note,
        "stream_id": record.stream_id,
        "durable_at": datetime.fromtimestamp(record.durable_at, UTC).isoformat(timespec="milliseconds"),
        "minute": m.to_dict(),
    }


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max([len(c)] + [min(len(row[i]), 60) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    for row in cells:
        lines.append("  ".join(v[:60].ljust(w) for v, w in zip(row, widths, strict=True)))
    return "\n".join(lines)


def cmd_log_tail(args: argparse.Namespace, settings: Settings) -> int:
    from pvm.stores.log import LogReader

    reader = LogReader(settings.log_dir)
    if args.project not in reader.projects():
        known = ", ".join(reader.projects()) or "none yet"
        print(f"pvm: no log for project {args.project!r} in {settings.log_dir} (projects: {known})", file=sys.stderr)
        return 2
    records = reader.get_recent(args.project, args.n)
    rows = [_minute_row(r) for r in records]
    if args.json:
        print(json.dumps({"project_id": args.project, "count": reader.count(args.project), "minutes": rows}, indent=2))
    else:
        print(f"project {args.project}: {reader.count(args.project)} minutes in the log; newest {len(rows)}:")
        print(_table(rows, ["seq", "timestamp", "event_type", "agent_id", "task_id", "memory_note"]))
    return 0


def cmd_exporter(args: argparse.Namespace, settings: Settings) -> int:
    from workers.ops.exporter import serve

    server, _thread = serve(_connect_service(settings), settings, port=args.port, addr=args.addr)
    print(f"pvm exporter: serving http://{args.addr}:{args.port}/metrics (Ctrl-C stops)")
    sys.stdout.flush()
    stop = threading.Event()
    _stop_on_signals(stop)
    stop.wait()
    server.shutdown()
    return 0


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _due(in_s: float | None, ran: bool) -> str:
    if not ran:
        return "now"  # a schedule that never ran is due at the leader's next tick
    if in_s is None:
        return "-"
    return f"in {_age(in_s)}" if in_s > 0 else f"overdue {_age(-in_s)}"


LAG_MARKS = {"computed": "*", "lower-bound": "+"}  # Redis gave a NULL lag: counted, or counted up to the cap


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from workers.ops.exporter import snapshot

    snap = snapshot(_connect(settings), settings)
    if args.json:
        print(json.dumps(snap.to_dict(), indent=2))
        return 0
    print("POOLS")
    rows = [
        {
            "pool": q.pool,
            "queue": q.queue,
            "queued": q.queued,
            "dequeued": q.dequeued,  # taken, not started: a moment's 1 per worker; one that stays is stranded
            "running": q.started,
            "failed": q.failed,
            "workers": q.workers,
            "oldest waiting": _age(q.oldest_waiting_s),
        }
        for q in snap.queues
    ]
    print(_table(rows, ["pool", "queue", "queued", "dequeued", "running", "failed", "workers", "oldest waiting"]))
    print("\nSTREAMS")
    rows = []
    for s in snap.streams:
        groups: Sequence[GroupState | None] = s.groups or [None]
        for g in groups:
            rows.append(
                {
                    "shard": s.shard,
                    "length": s.length,
                    "group": g.name if g else "-",
                    "lag": f"{g.lag}{LAG_MARKS.get(g.lag_source, '')}" if g else "-",
                    "pending": g.pending if g else "-",
                    "oldest pending": _age(g.oldest_pending_age_s) if g else "-",
                    "dead letters": s.dead_letters,
                }
            )
    print(_table(rows, ["shard", "length", "group", "lag", "pending", "oldest pending", "dead letters"]))
    print("\nFRESHNESS (emit -> stage)")
    rows = [
        {"stage": stage, "p50": _age(f["p50_s"]), "p99": _age(f["p99_s"]), "minutes": int(f["count"] or 0)}
        for stage, f in snap.freshness.items()
    ]
    print(_table(rows, ["stage", "p50", "p99", "minutes"]) if rows else "  nothing recorded yet")
    print("\nFACTS (what the facts pool did)")
    print("  " + ", ".join(f"{change} {count:,}" for change, count in snap.fact_changes.items()))
    print("\nEVALUATION (the evaluate pool's runs, by project)")
    rows = [
        {
            "project": run["project_id"],
            "run": run.get("status", "-"),
            "mode": run.get("mode", "-"),
            "slices": f"{run.get('slices_done', 0)}/{run.get('minute_slices', 0)}+facts" if run.get("run_id") else "-",
            "scored": run.get("scored", 0),
            "pruned": run.get("pruned", 0),
            "last completed": "never"
            if run.get("last_completed") is None
            else f"{_age(snap.taken_at - run['last_completed'])} ago",
        }
        for run in snap.evaluations
    ]
    print(
        _table(rows, ["project", "run", "mode", "slices", "scored", "pruned", "last completed"])
        if rows
        else "  no run yet"
    )
    print("  " + ", ".join(f"{what} {count:,}" for what, count in snap.evaluate.items()))
    print("\nSUMMARIES (what the summarize pool did)")
    print("  " + ", ".join(f"{what} {count:,}" for what, count in snap.summaries.items()))
    print(f"\nSCHEDULES (leader: {snap.scheduler_leader or 'none'})")
    rows = [
        {
            "schedule": sched.name,
            "every": _age(sched.every_s),
            "last run": "never" if sched.last_run_age_s is None else f"{_age(sched.last_run_age_s)} ago",
            "next due": _due(sched.next_due_in_s, ran=sched.last_run_at is not None),
        }
        for sched in snap.schedules
    ]
    print(_table(rows, ["schedule", "every", "last run", "next due"]) if rows else "  none recorded yet")
    dead = sum(s.dead_letters for s in snap.streams)
    failed = sum(q.failed for q in snap.queues)
    if dead or failed:
        print(f"\n{dead} dead letters (pvm dead list), {failed} failed jobs (pvm failed list)")
    return 0


def cmd_dead(args: argparse.Namespace, settings: Settings) -> int:
    from workers.ops import dead_letters

    r = _connect(settings)
    shards = _shards_of(settings, [args.shard] if args.shard is not None else None)
    if args.dead_command == "list":
        if args.ids:
            chosen = dead_letters.find(r, shards, args.ids)
        else:
            chosen = dead_letters.page(r, shards, args.limit, before=args.before)
        rows = [
            {"shard": d.shard, "id": d.id, "reason": d.reason, "bytes": len(d.raw), "entry": d.entry_id} for d in chosen
        ]
        if args.json:
            print(json.dumps(rows, indent=2))
            return 0
        print(_table(rows, ["shard", "id", "entry", "bytes", "reason"]) if rows else "no dead letters")
        if not args.ids and len(rows) >= args.limit:
            shard = f" --shard {args.shard}" if args.shard is not None else ""
            print(f"older ones: pvm dead list --limit {args.limit}{shard} --before {rows[-1]['id']}", file=sys.stderr)
        return 0
    if not args.ids and not args.all:
        print(f"pvm: name dead-letter ids to {args.dead_command}, or pass --all", file=sys.stderr)
        return 2
    act = dead_letters.retry if args.dead_command == "retry" else dead_letters.drop
    missing: list[str] = []
    if args.ids:
        found = dead_letters.find(r, shards, args.ids)
        missing = sorted(set(args.ids) - {d.id for d in found})
        done = act(r, found)
    else:
        done = sum(act(r, batch) for batch in dead_letters.batches(r, shards))
    verb = "sent back to their streams" if args.dead_command == "retry" else "dropped"
    print(f"{done} dead letters {verb}")
    if missing:
        print(f"pvm: not found: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


def cmd_failed(args: argparse.Namespace, settings: Settings) -> int:
    from contracts import keys
    from workers.ops import failed_jobs
    from workers.runtime.queues import queue_name

    if args.failed_command == "retry" and not args.ids and not args.all:
        print("pvm: name failed job ids to retry, or pass --all", file=sys.stderr)
        return 2
    if args.pool:
        queue_name(args.pool)  # an unknown pool: UnknownPool, one line
    r = _connect(settings)
    pools = [args.pool] if args.pool else list(keys.QUEUES)
    found = failed_jobs.find(r, pools, args.ids) if args.ids else None
    missing = sorted(set(args.ids) - {job_id for _, job_id in found or ()})
    if missing:
        print(f"pvm: not found: {', '.join(missing)}", file=sys.stderr)
    if args.failed_command == "retry":
        if found is not None:
            outcomes = [(job_id, failed_jobs.requeue(r, pool, job_id)) for pool, job_id in found]
            retried = sum(why is None for _, why in outcomes)
            stuck = [f"{job_id} ({why})" for job_id, why in outcomes if why is not None]
        else:
            retried, stuck = 0, []
            for pool in pools:
                done, left = failed_jobs.requeue_all(r, pool)
                retried, stuck = retried + done, stuck + left
        print(f"{retried} failed jobs requeued")
        if stuck:
            print(f"pvm: could not requeue: {', '.join(stuck)}", file=sys.stderr)
        return 1 if missing or stuck else 0
    if found is not None:
        rows = [failed_jobs.describe(r, pool, job_id).to_dict() for pool, job_id in found[: args.limit]]
    else:
        rows = [job.to_dict() for job in failed_jobs.page(r, pools, args.limit)]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(_table(rows, ["pool", "job", "function", "ended", "error"]) if rows else "no failed jobs")
    return 1 if missing else 0


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from workers.api.app import run_server
    from workers.api.auth import TokenFile

    # Loaded before anything starts: a tokens file that cannot be used is a one-line error, never an open API.
    tokens = TokenFile(settings.api_tokens_file) if settings.api_tokens_file else None
    _connect_service(settings).close()
    index_worker = not settings.qdrant_url if args.index_worker == "auto" else args.index_worker == "yes"
    if index_worker and settings.qdrant_url is None:
        where = "with the embedded engine: this process also runs the index and evaluate pools"
    elif index_worker:
        where = "and runs an index and evaluate worker"
    else:
        where = "(stateless: run index workers with `pvm worker index`)"
    print(f"pvm serve: reader API on http://{args.addr}:{args.port} {where}")
    sys.stdout.flush()
    if args.mcp:
        _need_mcp("pvm serve --mcp")
        print(f"pvm serve: MCP tools on http://{args.addr}:{args.port}{defaults.MCP_PATH}")
        sys.stdout.flush()
    run_server(settings, args.addr, args.port, index_worker, tokens=tokens, mcp=args.mcp)
    return 0


def cmd_token_new(args: argparse.Namespace, settings: Settings) -> int:
    from workers.api.auth import ALL_PROJECTS, add_to_file, new_token, token_entry

    token = new_token()
    try:
        entry = token_entry(
            args.name, token, [ALL_PROJECTS] if args.all else args.project, global_tier=args.global_tier
        )
    except ValueError as exc:
        raise SystemExit(f"pvm: {exc}") from None
    if args.file:
        add_to_file(args.file, entry)
    if args.json:
        print(json.dumps({"token": token, "entry": entry, "file": str(args.file) if args.file else None}, indent=2))
        return 0
    # The token goes to stderr, labelled, and is never shown again; stdout holds only what is safe to keep.
    print(
        f"token {args.name!r} (shown only now; the file keeps only its hash; clients set PVM_API_TOKEN to it):\n"
        f"  {token}",
        file=sys.stderr,
    )
    projects = "every project" if args.all else ", ".join(entry["projects"])
    if args.global_tier:
        projects += " and the global tier"
    if args.file:
        print(f"added {args.name!r} ({projects}) to {args.file}; a running pvm serve picks it up within a second")
    else:
        print(json.dumps(entry))
    return 0


@contextlib.contextmanager
def reader_api(settings: Settings) -> Iterator[PVMClient]:
    """A client of the reader API at PVM_API_URL; its errors end the command with their one-line message."""
    from pvm.client import PVMAPIError, PVMClient

    try:
        with PVMClient(settings=settings) as api:
            yield api
    except PVMAPIError as exc:
        raise SystemExit(f"pvm: {exc}") from None


def _project_path(project_id: str, route: str) -> str:
    from pvm.client import project_path

    return project_path(project_id, route)


def cmd_context(args: argparse.Namespace, settings: Settings) -> int:
    from contracts.memory import ContextPackage

    with reader_api(settings) as api:
        package = api.context(
            args.project,
            args.agent,
            task=args.task,
            budget_tokens=args.budget,
            task_id=args.task_id,
            tags=args.tag or (),
            thread=args.thread,
        )
    if not package["recent"] and not package["full_log_available"]:
        print(
            f"pvm: project {args.project!r} has no minutes (nothing in the log or the caches the reader API "
            f"at {api.base_url} reads): check --project",
            file=sys.stderr,
        )
        return 2
    if args.json:
        print(json.dumps(package, indent=2))
    else:
        print(ContextPackage.from_dict(package).render())
    return 0


def cmd_thread_show(args: argparse.Namespace, settings: Settings) -> int:
    """`pvm thread show`: one thread's chunks and episodes (and its newest minutes with --recent)."""
    from contracts.memory import minute_line
    from contracts.summaries import chunk_line, episode_line

    with reader_api(settings) as api:
        thread = api.thread(args.project, args.thread, args.recent)
    if args.json:
        print(json.dumps(thread, indent=2))
        return 0
    chunks, episodes, recent = thread["chunks"], thread["episodes"], thread["recent"]
    print(
        f"thread {thread['thread']} of {thread['project_id']}: {thread['minutes']:,} minutes summarized, "
        f"{len(chunks)} chunk(s), {len(episodes)} episode(s)"
    )
    if not (chunks or episodes or recent):
        print("(nothing yet: no minute of this thread has reached the summarize pool)")
    if chunks:
        print("\nChunks (oldest first):")
        for chunk in chunks:
            print(chunk_line(chunk))
    if episodes:
        print("\nEpisodes:")
        for episode in episodes:
            print(episode_line(episode))
    if recent and args.recent:
        print(f"\nNewest {len(recent)} minutes (verbatim):")
        for minute in recent:
            print(minute_line(minute))
    return 0


def _kinds(text: str) -> tuple[str, ...]:
    from pvm.search import KINDS

    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"--kinds {text!r}: name some of {', '.join(KINDS)}, comma-separated")
    return kinds


def cmd_search(args: argparse.Namespace, settings: Settings) -> int:
    with reader_api(settings) as api:
        result = api.search(
            args.project,
            args.query,
            args.k,
            categories=args.category or (),
            event_types=args.event_type or (),
            agents=args.agent or (),
            task_id=args.task_id,
            thread_id=args.thread_id,
            min_composite=args.min_composite,
            kinds=args.kinds or (),
        )
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if "ranked" in result:  # --kinds: every kind, best first, with what it stands for
        ranked = [
            {
                "score": f"{h['score']:.3f}",
                "kind": h["kind"],
                "id": h.get("minute_id") or h.get("fact_id") or h.get("summary_id"),
                "text": h["minute"].get("memory_note") if h["kind"] == "minute" else h.get("text") or h["fact"]["text"],
                "sources": ",".join(h.get("sources") or ()),
            }
            for h in result["ranked"]
        ]
        print(_table(ranked, ["score", "kind", "id", "text", "sources"]) if ranked else "no hits")
        return 0
    rows = [
        {
            "score": f"{h['score']:.3f}",
            "id": h["minute_id"],
            "event_type": h["minute"].get("event_type"),
            "agent_id": h["minute"].get("agent_id"),
            "category": h["category"],
            "memory_note": h["minute"].get("memory_note"),
        }
        for h in result["hits"]
    ]
    print(_table(rows, ["score", "id", "event_type", "agent_id", "category", "memory_note"]) if rows else "no hits")
    return 0


# -- facts: long-term memory, via the reader API (each change is a minute the API writes) -------------------------

FACT_COLUMNS = ("id", "tier_key", "type", "status", "subject", "attribute", "value", "valid_from", "valid_until")


def _fact_rows(facts: Sequence[dict[str, Any]]) -> str:
    return _table([dict(f) for f in facts], FACT_COLUMNS)


def _show_fact(fact: dict[str, Any]) -> str:
    lines = [f"{name}: {'' if fact.get(name) is None else fact[name]}" for name in (*FACT_COLUMNS, "text")]
    lines += [
        f"confidence: {fact['confidence']}  importance: {fact['importance']}",
        f"recorded_at: {fact['recorded_at']}",
    ]
    if fact.get("promoted_from"):
        lines.append(f"promoted_from: {fact['promoted_from']}")
    lines += [f"{r['kind']}: {r['fact_id']} ({r['strength']})" for r in fact.get("relationships", [])]
    if fact.get("tags"):
        lines.append("tags: " + ", ".join(fact["tags"]))
    lines.append("sources: " + ", ".join(fact.get("source_minute_ids", [])))
    return "\n".join(lines)


def _accepted(args: argparse.Namespace, answer: dict[str, Any], what: str) -> int:
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    print(f"{what}: fact {answer['fact_id']} (minute {answer['minute_id']}); the facts pool applies it shortly")
    for also in answer.get("also", []):
        print(f"  and {also['event_type']} (minute {also['minute_id']})")
    return 0


def cmd_facts(args: argparse.Namespace, settings: Settings) -> int:
    with reader_api(settings) as api:
        if args.facts_command == "list":
            answer = api.facts(
                args.project,
                tiers=args.tier or (),
                task=args.task,
                types=args.type or (),
                statuses=args.status or (),
                subject=args.subject,
                attribute=args.attribute,
                q=args.query,
                as_of=args.as_of,
                limit=args.limit,
                offset=args.offset,
            )
            if args.json:
                print(json.dumps(answer, indent=2))
            elif not answer["facts"]:
                print("no facts")
            else:
                print(_fact_rows(answer["facts"]))
                if answer["next_offset"] is not None:
                    print(f"(more: --offset {answer['next_offset']})")
            return 0
        if args.facts_command == "show":
            fact = api.fact(args.project, args.fact_id)
            print(json.dumps(fact, indent=2) if args.json else _show_fact(fact))
            return 0
        if args.facts_command == "history":
            history = api.fact_history(args.project, args.fact_id)
            print(json.dumps({"facts": history}, indent=2) if args.json else _fact_rows(history))
            return 0
        if args.facts_command == "promote":
            answer = api.promote(args.project, args.fact_id, args.to_tier, agent_id=args.agent)
            return _accepted(args, answer, f"promoted to {args.to_tier}" if args.to_tier else "promoted")
        answer = api.retract(args.project, args.fact_id, args.reason, agent_id=args.agent)
        return _accepted(args, answer, "retracted")


def cmd_learn(args: argparse.Namespace, settings: Settings) -> int:
    with reader_api(settings) as api:
        answer = api.learn(
            args.project,
            args.key,
            args.value,
            tier=args.tier,
            task_id=args.task_id,
            type=args.type,
            agent_id=args.agent,
        )
    return _accepted(args, answer, f"learned {args.key!r}")


def cmd_recall(args: argparse.Namespace, settings: Settings) -> int:
    with reader_api(settings) as api:
        answer = api.recall(args.project, args.key, task=args.task, tiers=args.tier or ())
    if args.json:
        print(json.dumps(answer, indent=2))
    elif answer["fact"] is None:
        print(f"pvm: nothing learned as {args.key!r} in {', '.join(answer['searched'])}", file=sys.stderr)
    else:
        print(answer["fact"]["value"])
    return 0 if answer["fact"] is not None else 1


def _pair_output(source: str) -> str | None:
    """The text of `--output`: a file's, or stdin's for ``-``; None (and why, on stderr) when it cannot be read."""
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        print(f"pvm pair: --output {source}: {why}: name a readable UTF-8 file, or - for stdin", file=sys.stderr)
        return None


def _gap_text(gap: dict[str, Any]) -> str:
    parts = []
    if gap["missing"]:
        parts.append("missing " + ", ".join(gap["missing"]))
    if gap["forbidden"]:
        parts.append("holds " + ", ".join(gap["forbidden"]))
    return "; ".join(parts) or f"scored {gap['score']}"


def cmd_pair(args: argparse.Namespace, settings: Settings) -> int:
    """`pvm pair`: a PAIR run via the reader API; exit 0 when the output reached the target, 1 when not."""
    output = _pair_output(args.output)
    if output is None:
        return 2
    with reader_api(settings) as api:
        run = api.pair(
            args.project,
            args.task,
            args.criteria,
            output,
            task_id=args.task_id,
            agent_id=args.agent,
            rounds=args.rounds,
            target=args.target,
        )
    if args.json:
        print(json.dumps(run, indent=2))
        return 0 if run["reached_target"] else 1
    rows = []
    for r in run["rounds"]:
        gaps = "; ".join(f"{g['criterion']}: {_gap_text(g)}" for g in r["gaps"])
        rows.append({"round": r["round"], "score": r["score"], "judge": r["judge"], "gaps": gaps or "-"})
    print(_table(rows, ["round", "score", "judge", "gaps"]))
    for r in run["rounds"]:
        if r["judge_fallback"] or r["reviser_fallback"]:
            print(f"round {r['round']}: {r['judge_fallback'] or r['reviser_fallback']}")
    print(f"\nstopped: {run['stopped']}; score {run['score']}/100 (target {run['target']})\n")
    print(run["output"])
    return 0 if run["reached_target"] else 1


# Commands that only call the reader API: they run in a client-only install (`pip install pvm`).
def cmd_mcp(args: argparse.Namespace, settings: Settings) -> int:
    try:
        from workers.agent import mcp_server
    except ImportError as exc:
        raise SystemExit(
            f"pvm mcp: needs the mcp extra ({exc.name or exc} not installed): pip install 'pvm[mcp]'"
        ) from None
    if args.transport == "stdio":
        # stdout is the protocol's: nothing else may be printed there.
        mcp_server.run_stdio(args.api_url, args.token, settings)
        return 0
    if args.token is not None:
        raise SystemExit("pvm mcp: --token is for stdio; over HTTP each caller sends its own bearer token")
    print(
        f"pvm mcp: MCP tools on http://{args.addr}:{args.port}{defaults.MCP_PATH}, calling the reader API at "
        f"{args.api_url or settings.api_url or defaults.API_URL}"
    )
    sys.stdout.flush()
    mcp_server.run_http(args.api_url, args.addr, args.port, settings)
    return 0


# Commands that need only the client library (and, for `mcp`, the mcp extra): they call the reader API.
CLIENT_COMMANDS = (cmd_context, cmd_search, cmd_facts, cmd_learn, cmd_recall, cmd_mcp, cmd_pair)


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    from workers.ops.replay import replay

    return replay(_connect(settings), settings, None if args.all else args.project, wait=not args.no_wait)


def cmd_evaluate(args: argparse.Namespace, settings: Settings) -> int:
    """`pvm evaluate --project P [--dry-run]`: one evaluation run by hand, or what it would do."""
    import time

    from pvm import defaults
    from workers.evaluate import pool as evaluate_pool
    from workers.runtime.queues import live_workers, pool_queue

    connection = _connect(settings)
    if args.global_tier:
        args.project = evaluate_pool.GLOBAL_RUN
    if args.dry_run:
        report = evaluate_pool.evaluate_here(connection, settings, args.project)
        if args.json:
            print(json.dumps(report.to_dict(), indent=2))
            return 0
        pruned = [p for p in report.pruned if p["why"] != "merged"]
        print(
            f"pvm evaluate --dry-run {args.project}: {report.scored:,} minutes and {report.facts_scored:,} facts "
            f"scored in {report.slices} slices (nothing written)"
        )
        print(f"\nWOULD PRUNE ({len(pruned)}; {report.tokens_reclaimed:,} tokens reclaimed with the merges)")
        print(_table(pruned[: args.limit], ["id", "kind", "why", "composite", "tokens"]) if pruned else "  nothing")
        print(f"\nWOULD MERGE ({len(report.merged)} groups of near-duplicates into their best-scored memory)")
        rows = [{**m, "absorbed": ", ".join(m["absorbed"])} for m in report.merged[: args.limit]]
        print(_table(rows, ["survivor", "absorbed", "similarity"]) if rows else "  nothing")
        print(f"\nCONFLICTS ({len(report.conflicts)}: the loser ranks lower)")
        print(_table(report.conflicts[: args.limit], ["winner", "loser"]) if report.conflicts else "  none")
        print(f"\nWOULD RESCORE ({len(report.rescored)} composites change)")
        rows = report.rescored[: args.limit]
        print(_table(rows, ["id", "before", "after"]) if rows else "  nothing")
        return 0
    queue = pool_queue("evaluate", connection)
    if not args.no_wait and not live_workers(connection, queue.name):
        raise SystemExit(
            "pvm evaluate: no evaluate worker is running: start `pvm serve` (embedded engine), `pvm up`, or "
            "`pvm worker evaluate` (Qdrant server); or pass --no-wait to queue the run, or --dry-run"
        )
    run_id = evaluate_pool.enqueue_run(connection, settings, args.project)
    if run_id is None:
        raise SystemExit(f"pvm evaluate: {args.project} is being evaluated already; see `pvm status`")
    if args.no_wait:
        print(f"pvm evaluate: run {run_id} of {args.project} queued")
        return 0
    while (state := evaluate_pool.run_state(connection, args.project)).get("status") == "running":
        time.sleep(defaults.EVALUATE_WAIT_POLL_S)
    if args.json:
        print(json.dumps(state, indent=2))
    else:
        print(
            f"pvm evaluate: run {run_id} of {args.project} {state.get('status')}: {state.get('scored', 0):,} "
            f"memories scored, {state.get('pruned', 0):,} pruned or merged, in {state.get('slices_done', 0)} slices"
        )
    return 0 if state.get("status") == "done" else 1


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    from pvm.vectors import GLOBAL_TENANT
    from workers.api.stats import project_stats

    stats = project_stats(_connect(settings), GLOBAL_TENANT if args.global_tier else args.project)
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    facts = stats["facts"]
    print(f"project {stats['project_id']}")
    print(f"  minutes           {stats['minutes']:,} in the log, {stats['indexed']:,} indexed")
    print(
        f"  facts             {facts['total']:,} current: "
        + ", ".join(f"{t} {n}" for t, n in {**facts["by_tier"], **facts["by_type"]}.items() if n)
        if facts["total"]
        else "  facts             0"
    )
    print(f"  chunks, episodes  {stats['chunks']:,}, {stats['episodes']:,}")
    print(f"  pruned, merged    {stats['pruned']:,}, {stats['merged']:,} ({stats['conflicts']:,} conflicts flagged)")
    print(f"  tokens reclaimed  {stats['tokens_reclaimed']:,}")
    scores = stats["average_scores"]
    shown = ", ".join(f"{k} {v:.3f}" for k, v in scores.items() if v is not None)
    print(f"  average scores    {shown or 'none yet (no evaluation run)'}")
    return 0


def cmd_export(args: argparse.Namespace, settings: Settings) -> int:
    from workers.agent.memory_files import export_files, read_snapshot, tree_lines, write_folder

    snapshot = read_snapshot(_connect(settings), args.project, include_global=args.global_tier)
    files = export_files(snapshot)
    write_folder(args.out, files, snapshot.last_ms)
    if args.json:
        print(json.dumps({"project_id": args.project, "out": str(args.out), "files": sorted(files)}, indent=2))
        return 0
    print(f"pvm export: {len(files):,} files of project {args.project} in {args.out}")
    if args.tree:
        print("\n".join(tree_lines(files)))
    return 0


def cmd_import(args: argparse.Namespace, settings: Settings) -> int:
    from workers.agent.memory_files import (
        MemoryFileError,
        plan_import,
        read_export_version,
        read_folder,
        read_snapshot,
        stream_writer,
    )

    connection = _connect(settings)
    try:
        snapshot = read_snapshot(connection, args.project, include_global=args.global_tier)
        files = read_folder(args.folder)
        plan = plan_import(snapshot, files, exported_version=read_export_version(args.folder))
    except MemoryFileError as exc:
        print(f"pvm import: {exc}", file=sys.stderr)
        return 1
    stream_ids = [] if args.dry_run or not plan.changes else stream_writer(connection, settings.shards)(plan.minutes)
    if args.json:
        answer = plan.to_dict()
        answer.update(dry_run=args.dry_run, stream_ids=stream_ids)
        print(json.dumps(answer, indent=2))
        return 0
    verb = "would write" if args.dry_run else "wrote"
    print(
        f"pvm import: {verb} {len(plan.changes):,} minutes for project {args.project} "
        f"({plan.unchanged:,} files unchanged)"
    )
    if plan.changes:
        rows = [{"event": c.minute.event_type, "path": c.path, "fact": c.fact_id[:8]} for c in plan.changes]
        print(_table(rows, ("event", "path", "fact")))
    return 0


def cmd_optimize(args: argparse.Namespace, settings: Settings) -> int:
    from contracts import keys
    from pvm import defaults
    from workers.runtime.queues import pool_queue

    job = pool_queue("index", _connect(settings)).enqueue(
        keys.INDEX_OPTIMIZE_JOB, args.project, job_timeout=defaults.OPTIMIZE_JOB_TIMEOUT_S
    )
    print(f"optimize of {args.project or 'every project'} queued for the index worker (job {job.id})")
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from workers.ops.demo import run_demo

    if settings.redis_url:
        _connect(settings).close()
    return run_demo(settings, minutes=args.minutes, project=args.project)


# -- parser -------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pvm",
        description="PVM: durable, searchable memory for fleets of AI agents. "
        "Configuration comes from PVM_* environment variables (see docs/operations/configuration.md).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--version", action="version", version=f"pvm {_version()}", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="run the whole stack here: Redis (embedded unless PVM_REDIS_URL), dispatcher, pools")
    up.add_argument(
        "--processes", action="append", default=[], metavar="POOL=N", help="worker processes for a pool (repeatable)"
    )
    up.add_argument("--dispatchers", type=_positive_int, default=1, help="dispatcher processes (default 1)")
    up.add_argument(
        "--api-port", type=_port, default=defaults.API_PORT, help=f"reader API port (default {defaults.API_PORT})"
    )
    up.add_argument(
        "--mcp",
        action="store_true",
        help=f"also serve the MCP tools at {defaults.MCP_PATH} of the reader API (pvm serve --mcp)",
    )
    up.set_defaults(func=cmd_up)

    dispatch = sub.add_parser("dispatch", help="move minutes from the streams into log-pool batch jobs")
    dispatch.add_argument("--consumer", help="consumer name; reuse it after a restart to resume its pending entries")
    dispatch.add_argument("--shards", type=_shard_list, help="comma-separated shard numbers (default: all)")
    dispatch.add_argument(
        "--batch",
        type=_positive_int,
        help=f"minutes per job (default PVM_DISPATCH_BATCH or {defaults.DISPATCH_BATCH_SIZE})",
    )
    dispatch.add_argument("--max-idle", type=_seconds, help="exit after this many seconds with nothing to do")
    dispatch.set_defaults(func=cmd_dispatch)

    scheduler = sub.add_parser(
        "scheduler",
        help="enqueue periodic maintenance jobs (one scheduler leads; others stand by)",
        description="Enqueue periodic maintenance jobs onto the pools: the embedded engine's optimize "
        f"every PVM_OPTIMIZE_EVERY seconds (default {defaults.OPTIMIZE_EVERY_S}; none with a Qdrant server, "
        "which optimizes itself), and the evaluate pool's run over every project (score, dedupe, prune) every "
        f"PVM_EVALUATE_EVERY seconds (default {defaults.EVALUATE_EVERY_S}). "
        "Run as many as you like: a lease in Redis makes one act and the others stand by.",
    )
    scheduler.add_argument("--name", help="scheduler name in the lease (default: <host>-<pid>)")
    scheduler.add_argument("--once", action="store_true", help="one tick: enqueue what is due if leading, then exit")
    scheduler.add_argument("--list", action="store_true", help="show the schedules, their last run and next due time")
    scheduler.set_defaults(func=cmd_scheduler)

    worker = sub.add_parser("worker", help="run RQ workers for pools (msgpack only; SIGTERM finishes the batch)")
    worker.add_argument("pools", nargs="+", metavar="POOL", help="pools to serve, e.g. log")
    worker.add_argument("--processes", type=_positive_int, default=1, help="long-lived worker processes (default 1)")
    worker.add_argument("--burst", action="store_true", help="exit when the queues are empty")
    worker.add_argument("--name", help="worker name (default: pvm-<host>-<pid>-<random>)")
    worker.set_defaults(func=cmd_worker)

    log_cmd = sub.add_parser("log", help="read the durable log")
    log_sub = log_cmd.add_subparsers(dest="log_command", required=True, metavar="SUBCOMMAND")
    tail = log_sub.add_parser("tail", help="the newest minutes of a project")
    tail.add_argument("--project", required=True, type=_project_id, help="project id")
    tail.add_argument("-n", type=_positive_int, default=20, help="how many minutes (default 20)")
    tail.add_argument("--json", action="store_true", help="machine-readable output")
    tail.set_defaults(func=cmd_log_tail)

    exporter = sub.add_parser("exporter", help="serve Prometheus metrics read from Redis on /metrics")
    exporter.add_argument(
        "--port", type=_port, default=defaults.EXPORTER_PORT, help=f"port (default {defaults.EXPORTER_PORT})"
    )
    exporter.add_argument(
        "--addr",
        default=defaults.BIND_ADDR,
        help=f"address to bind (default {defaults.BIND_ADDR}; 0.0.0.0 in containers)",
    )
    exporter.set_defaults(func=cmd_exporter)

    status = sub.add_parser(
        "status", help="one screen for operators: pools, streams, dead letters, freshness, schedules"
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)

    dead = sub.add_parser("dead", help="inspect, retry or drop dead letters")
    dead_sub = dead.add_subparsers(dest="dead_command", required=True, metavar="SUBCOMMAND")
    for name, text in (
        ("list", "show dead letters with their reasons, newest first, a page at a time"),
        ("retry", "put dead letters back on their stream (validated again by the dispatcher)"),
        ("drop", "delete dead letters"),
    ):
        p = dead_sub.add_parser(name, help=text)
        p.add_argument("--shard", type=_shard_number, metavar="N", help="only this shard")
        if name == "list":
            p.add_argument("ids", nargs="*", type=_stream_id, help="only these dead-letter entry ids")
            p.add_argument("--limit", type=_positive_int, default=100, help="rows to list (default 100)")
            p.add_argument(
                "--before",
                type=_stream_id,
                metavar="ID",
                help="older than this id: the next page after one ending at ID",
            )
            p.add_argument("--json", action="store_true", help="machine-readable output")
        else:
            p.add_argument("ids", nargs="*", type=_stream_id, help="dead-letter entry ids (or --all)")
            p.add_argument("--all", action="store_true", help=f"{name} every dead letter (of --shard)")
        p.set_defaults(func=cmd_dead)

    failed = sub.add_parser("failed", help="inspect or retry failed RQ jobs")
    failed_sub = failed.add_subparsers(dest="failed_command", required=True, metavar="SUBCOMMAND")
    for name, text in (("list", "show failed jobs and their last error"), ("retry", "requeue failed jobs")):
        p = failed_sub.add_parser(name, help=text)
        p.add_argument("--pool", help="only this pool")
        if name == "list":
            p.add_argument("ids", nargs="*", help="only these job ids")
            p.add_argument("--limit", type=_positive_int, default=100, help="rows to list (default 100)")
            p.add_argument("--json", action="store_true", help="machine-readable output")
        else:
            p.add_argument("ids", nargs="*", help="job ids (or --all)")
            p.add_argument("--all", action="store_true", help="requeue every failed job (of --pool)")
        p.set_defaults(func=cmd_failed)

    serve = sub.add_parser("serve", help="the reader HTTP API (and, with the embedded engine, the index pool)")
    serve.add_argument(
        "--addr",
        default=defaults.BIND_ADDR,
        help=f"address to bind (default {defaults.BIND_ADDR}; 0.0.0.0 in containers)",
    )
    serve.add_argument("--port", type=_port, default=defaults.API_PORT, help=f"port (default {defaults.API_PORT})")
    serve.add_argument(
        "--index-worker",
        choices=["auto", "yes", "no"],
        default="auto",
        help="run the index pool in this process (auto: yes with the embedded engine, which one process must own)",
    )
    serve.add_argument(
        "--mcp",
        action="store_true",
        help=f"also serve the MCP tools at {defaults.MCP_PATH} (as pvm mcp --transport http does, without its hop)",
    )
    serve.set_defaults(func=cmd_serve)

    token = sub.add_parser("token", help="project-scoped tokens for the reader API (PVM_API_TOKENS_FILE)")
    token_sub = token.add_subparsers(dest="token_command", required=True, metavar="SUBCOMMAND")
    token_new = token_sub.add_parser(
        "new",
        help="make a random token for some projects: print it once, and its entry (a hash) for the tokens file",
        description="Make a random token that reaches only the projects named. The token is printed once, on "
        "stderr; the tokens file stores only its SHA-256. Without --file the entry to add to the file is printed "
        "on stdout; with --file it is added (the file is created when missing, and written atomically, mode 0600).",
    )
    token_new.add_argument("--name", required=True, help="a unique name for the token's holder (e.g. team-a)")
    reach = token_new.add_mutually_exclusive_group(required=True)
    reach.add_argument("--project", action="append", help="a project the token may read and write (repeatable)")
    reach.add_argument("--all", action="store_true", help="every project")
    token_new.add_argument(
        "--global",
        dest="global_tier",
        action="store_true",
        help="also the global tier of facts (read it, promote and learn into it); never implied by --all",
    )
    token_new.add_argument("--file", type=Path, help="add the entry to this tokens file (PVM_API_TOKENS_FILE)")
    token_new.add_argument("--json", action="store_true", help='print {"token", "entry", "file"} as JSON on stdout')
    token_new.set_defaults(func=cmd_token_new)

    context = sub.add_parser("context", help="an agent's context, from the reader API (PVM_API_URL)")
    context.add_argument("--project", required=True, type=_project_id, help="project id")
    context.add_argument("--agent", required=True, help="agent id")
    context.add_argument("--task", help="task text: adds relevant past experience and the rules it matches")
    context.add_argument("--task-id", help="the task's id: adds its task-tier facts")
    context.add_argument("--tag", action="append", help="a task tag rules match too (repeat for more)")
    context.add_argument(
        "--budget",
        type=_positive_int,
        default=defaults.CONTEXT_BUDGET_TOKENS,
        help=f"token budget (default {defaults.CONTEXT_BUDGET_TOKENS})",
    )
    context.add_argument(
        "--thread", help="build it for one thread (a thread id, task:<id> or project): newest minutes, summaries"
    )
    context.add_argument("--json", action="store_true", help="the ContextPackage as JSON")
    context.set_defaults(func=cmd_context)

    thread = sub.add_parser("thread", help="a thread's chunk summaries and episodes, via the reader API")
    thread_sub = thread.add_subparsers(dest="thread_command", required=True)
    thread_show = thread_sub.add_parser("show", help="one thread's chunks and episodes")
    thread_show.add_argument("thread", help="a thread id, task:<task id>, or project")
    thread_show.add_argument("--project", required=True, type=_project_id, help="project id")
    thread_show.add_argument("--recent", type=int, default=0, help="also print its newest N minutes (default 0)")
    thread_show.add_argument("--json", action="store_true", help="the thread as JSON")
    thread_show.set_defaults(func=cmd_thread_show)

    search = sub.add_parser("search", help="hybrid search over a project's minutes, via the reader API")
    search.add_argument("query", help="search text")
    search.add_argument("--project", required=True, type=_project_id, help="project id")
    search.add_argument("-k", type=_positive_int, default=defaults.SEARCH_K, help=f"hits (default {defaults.SEARCH_K})")
    search.add_argument("--category", action="append", help="only these categories (repeatable)")
    search.add_argument("--event-type", action="append", help="only these event types (repeatable)")
    search.add_argument("--agent", action="append", help="only these agents (repeatable)")
    search.add_argument("--task-id", help="only this task")
    search.add_argument("--thread-id", help="only this thread")
    search.add_argument("--min-composite", type=_fraction, help="minimum composite score (0-1)")
    search.add_argument(
        "--kinds",
        type=_kinds,
        help="what to return, comma-separated: minute (default), fact, summary (chunk and episode summaries)",
    )
    search.add_argument("--json", action="store_true", help="machine-readable output")
    search.set_defaults(func=cmd_search)

    _add_fact_commands(sub)
    _add_pair_command(sub)

    replay_cmd = sub.add_parser("replay", help="rebuild derived stores (caches, index, agent memory) from the log")
    target = replay_cmd.add_mutually_exclusive_group(required=True)
    target.add_argument("--project", type=_project_id, help="one project")
    target.add_argument("--all", action="store_true", help="every project in the log")
    replay_cmd.add_argument("--no-wait", action="store_true", help="enqueue the rebuild and return")
    replay_cmd.set_defaults(func=cmd_replay)

    evaluate = sub.add_parser(
        "evaluate",
        help="score, dedupe and prune a project's memories now (or --dry-run: print what it would do)",
        description="One evaluation run of a project, as the scheduler starts every PVM_EVALUATE_EVERY seconds: "
        "scores every indexed minute and fact, merges near-duplicates, flags contradictions and prunes stale "
        "memories from the vector store and hot caches (never the log; `pvm replay` restores them). Queued for "
        "the evaluate worker, waited for; --dry-run runs here and writes nothing.",
    )
    scope = evaluate.add_mutually_exclusive_group(required=True)
    scope.add_argument("--project", type=_project_id, help="the project")
    scope.add_argument(
        "--global", dest="global_tier", action="store_true", help="the global tier's facts (their own run, `_global`)"
    )
    evaluate.add_argument("--dry-run", action="store_true", help="print what it would prune, merge and rescore")
    evaluate.add_argument("--no-wait", action="store_true", help="queue the run and return")
    evaluate.add_argument("--limit", type=int, default=20, help="rows per table of a dry run (default 20)")
    evaluate.add_argument("--json", action="store_true", help="machine-readable output")
    evaluate.set_defaults(func=cmd_evaluate)

    stats = sub.add_parser("stats", help="a project's memory in numbers: minutes, facts, pruned, merged, scores")
    scope = stats.add_mutually_exclusive_group(required=True)
    scope.add_argument("--project", type=_project_id, help="the project")
    scope.add_argument("--global", dest="global_tier", action="store_true", help="the global tier's facts")
    stats.add_argument("--json", action="store_true", help="machine-readable output")
    stats.set_defaults(func=cmd_stats)

    export = sub.add_parser(
        "export", help="a project's memory (facts, learned keys, episodes, summaries) as Markdown files in a folder"
    )
    export.add_argument("--project", type=_project_id, required=True, help="the project")
    export.add_argument("--out", required=True, help="the folder (created; its old memory files are replaced)")
    export.add_argument("--tree", action="store_true", help="print the files as a tree")
    export.add_argument(
        "--global",
        dest="global_tier",
        action="store_true",
        help="also the global tier's facts and learned keys (facts/global/, learned/global/)",
    )
    export.add_argument("--json", action="store_true", help="machine-readable output")
    export.set_defaults(func=cmd_export)

    import_cmd = sub.add_parser(
        "import",
        help="write a Markdown memory folder's edits back as minutes (one per change; a removed file retracts)",
    )
    import_cmd.add_argument("--project", type=_project_id, required=True, help="the project")
    import_cmd.add_argument("folder", help="the folder that pvm export wrote (and a person edited)")
    import_cmd.add_argument("--dry-run", action="store_true", help="show the minutes it would write; write none")
    import_cmd.add_argument(
        "--global",
        dest="global_tier",
        action="store_true",
        help="the global tier's files may be edited (without it, a folder holding them is refused)",
    )
    import_cmd.add_argument("--json", action="store_true", help="machine-readable output")
    import_cmd.set_defaults(func=cmd_import)

    optimize = sub.add_parser(
        "optimize", help="optimize the embedded engine's shards (queued for the index worker that owns them)"
    )
    optimize.add_argument("--project", type=_project_id, help="one project (default: all)")
    optimize.set_defaults(func=cmd_optimize)

    demo = sub.add_parser(
        "demo", help="run a coordination session through the embedded stack; show the log and an agent's context"
    )
    demo.add_argument(
        "--minutes",
        type=_positive_int,
        default=defaults.DEMO_MINUTES,
        help=f"how many minutes to emit (default {defaults.DEMO_MINUTES})",
    )
    demo.add_argument(
        "--project",
        type=_project_id,
        help="the project to emit into (default: a new one per run, apollo-<UTC time>, so each run shows only its "
        "own minutes; name an existing one to add to it)",
    )
    demo.set_defaults(func=cmd_demo)

    mcp = sub.add_parser(
        "mcp",
        help="PVM's memory as MCP tools (emit, search, context, learn, recall, facts) over stdio or HTTP",
        description="Serve PVM's memory to MCP hosts: each tool calls the reader API (PVM_API_URL) with a token, "
        "so a caller reaches only its token's projects. Over stdio the token is --token, else PVM_API_TOKEN; "
        "over HTTP each request's Authorization: Bearer header. Needs the mcp extra (pip install 'pvm[mcp]').",
    )
    mcp.add_argument("--transport", choices=["stdio", "http"], default="stdio", help="stdio (default) or http")
    mcp.add_argument("--token", help="stdio: the API token to call with (default: PVM_API_TOKEN)")
    mcp.add_argument("--api-url", help="the reader API to call (default: PVM_API_URL)")
    mcp.add_argument("--addr", default=defaults.BIND_ADDR, help=f"http: address to bind (default {defaults.BIND_ADDR})")
    mcp.add_argument("--port", type=_port, default=defaults.MCP_PORT, help=f"http: port (default {defaults.MCP_PORT})")
    mcp.set_defaults(func=cmd_mcp)
    _describe(parser)
    return parser


def _add_fact_commands(sub: Any) -> None:
    """`pvm facts list|show|history|promote|retract`, `pvm learn`, `pvm recall`: via the reader API (PVM_API_URL)."""
    from contracts.facts import FactStatus, FactType, Tier

    tiers, types, statuses = [t.value for t in Tier], [t.value for t in FactType], [s.value for s in FactStatus]
    facts = sub.add_parser(
        "facts",
        help="a project's long-term memory (facts), via the reader API: list, show, history, promote, retract",
        description="Read and change a project's facts through the reader API (PVM_API_URL, PVM_API_TOKEN).\n"
        "A change is written as a knowledge-change minute (202): the facts pool applies it a moment\n"
        "later. The global tier needs a token that grants it (pvm token new --global).",
        epilog="examples:\n"
        "  pvm facts list --project apollo --type decision\n"
        "  pvm facts list --project apollo --as-of 2026-03-01T00:00:00Z\n"
        "  pvm facts history FACT_ID --project apollo\n"
        "  pvm facts promote FACT_ID --project apollo --to-tier global",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    facts_sub = facts.add_subparsers(dest="facts_command", required=True, metavar="SUBCOMMAND")

    def command(name: str, text: str, with_id: bool = True) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = facts_sub.add_parser(name, help=text)
        if with_id:
            p.add_argument("fact_id", metavar="FACT_ID", help="the fact's id (a UUID, as `pvm facts list` shows)")
        p.add_argument("--project", required=True, type=_project_id, help="project id")
        p.add_argument("--json", action="store_true", help="the API's answer as JSON")
        p.set_defaults(func=cmd_facts)
        return p

    listing = command("list", "the current facts of a project (filters; --as-of for what held then)", with_id=False)
    listing.add_argument("--tier", action="append", choices=tiers, help="tiers (repeatable; default: task and project)")
    listing.add_argument("--task", help="a task id: its tier too (required with --tier task)")
    listing.add_argument("--type", action="append", choices=types, help="fact types (repeatable)")
    listing.add_argument("--status", action="append", choices=statuses, help="statuses (repeatable; default promoted)")
    listing.add_argument("--subject", help="one subject")
    listing.add_argument("--attribute", help="one attribute")
    listing.add_argument("-q", "--query", help="search the facts (hybrid), best first")
    listing.add_argument(
        "--as-of", metavar="TIME", help="ISO 8601 time with an offset (2026-03-01T00:00:00Z): what held then"
    )
    listing.add_argument("--limit", type=_positive_int, help=f"facts per page (default {defaults.API_FACTS_LIMIT})")
    listing.add_argument("--offset", type=_non_negative_int, help="facts to skip (the next page's offset)")
    command("show", "one fact, any status")
    command("history", "every value of the fact's slot, superseded and retracted ones too, oldest first")
    promote = command("promote", "promote a pending fact, or copy it one tier up (--to-tier)")
    promote.add_argument(
        "--to-tier", choices=["project", "global"], help="copy it one tier up (task -> project -> global)"
    )
    promote.add_argument("--agent", help="who promotes it (the change minute's agent_id)")
    retract = command("retract", "withdraw a fact: it leaves the current view and stays in history")
    retract.add_argument("--reason", help="why, in words")
    retract.add_argument("--agent", help="who retracts it (the change minute's agent_id)")

    learn = sub.add_parser(
        "learn",
        help="learn(key, value): a certain fact under a key, in a task, the project or the global tier",
        description="Learn a value under a key, via the reader API: a fact_learned minute the facts pool applies. "
        "Learning a key again replaces its value; `pvm recall KEY` reads it.",
    )
    learn.add_argument("key", help="the key (e.g. 'deploy window')")
    learn.add_argument("value", help="its value, as text")
    learn.add_argument("--project", required=True, type=_project_id, help="project id")
    learn.add_argument("--tier", choices=tiers, help="default: task with --task-id, else project")
    learn.add_argument("--task-id", help="a task id: learn it in that task's tier")
    learn.add_argument("--type", choices=types, help="fact type (default fact)")
    learn.add_argument("--agent", help="who learns it (the minute's agent_id)")
    learn.add_argument("--json", action="store_true", help="the API's answer as JSON")
    learn.set_defaults(func=cmd_learn)

    recall = sub.add_parser(
        "recall",
        help="recall(key): a learned value, the task's tier first, then the project's, then global (if granted)",
        description="Print the value learned under a key (exit 1 when no tier holds it), via the reader API.",
    )
    recall.add_argument("key", help="the key")
    recall.add_argument("--project", required=True, type=_project_id, help="project id")
    recall.add_argument("--task", help="a task id: its tier is looked in first")
    recall.add_argument("--tier", action="append", choices=tiers, help="look only in these tiers (repeatable)")
    recall.add_argument("--json", action="store_true", help="the API's answer as JSON (key, fact, searched)")
    recall.set_defaults(func=cmd_recall)


def _add_pair_command(sub: Any) -> None:
    pair = sub.add_parser(
        "pair",
        help="PAIR: judge an output against its task's success criteria, revise it from memory, re-judge",
        description="Check an output against its task's success criteria via the reader API (PVM_API_URL). A fresh "
        "judge (PVM_PAIR_JUDGE: checklist or llm) scores it 0-100 and names the gaps; the project's memories are "
        "retrieved for each gap; a reviser (PVM_PAIR_REVISER) writes a revision; the revision is judged again, "
        "until the score reaches PVM_PAIR_TARGET (95) or PVM_PAIR_ROUNDS (3) judgments. Every round is written "
        "as a minute (pair_evaluation, pair_revision). Prints a table of the rounds and the best output; exit "
        "status 0 when it reached the target, 1 when not.",
        epilog="example: pvm pair --project apollo --task 'Plan the rollout' --criteria 'Mentions the rollback "
        "plan' --criteria 'p99 latency under 200 ms' --output answer.md",
    )
    pair.add_argument("--project", required=True, type=_project_id, help="project id (its memory fills the gaps)")
    pair.add_argument("--task", required=True, help="the original task, as the agent was given it")
    pair.add_argument(
        "--criteria",
        action="append",
        required=True,
        metavar="CRITERION",
        help='one success criterion (repeat for each): terms to mention, "quoted phrases", numbers, bounds '
        "('under 200 ms'), negations ('does not mention X'); see docs/pair.md",
    )
    pair.add_argument("--output", required=True, metavar="FILE", help="the output to judge: a file, or - for stdin")
    pair.add_argument("--task-id", help="the task's id: the evaluate pool reads the score as the task's outcome")
    pair.add_argument("--agent", help="whose output it is (the minutes' agent_id)")
    pair.add_argument("--rounds", type=_positive_int, help="judgments at most (default: the server's PVM_PAIR_ROUNDS)")
    pair.add_argument("--target", type=_positive_int, help="score that stops the loop (default: PVM_PAIR_TARGET)")
    pair.add_argument("--json", action="store_true", help="the run as JSON (rounds, gaps, memories, revisions)")
    pair.set_defaults(func=cmd_pair)


def _describe(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand's own --help page its line from the listing, where it has no description of its own."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            lines = {choice.dest: choice.help for choice in action._choices_actions}
            for name, child in action.choices.items():
                line = lines.get(name)
                if child.description is None and line:
                    child.description = f"{line[0].upper()}{line[1:]}."
                _describe(child)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"pvm: {exc}", file=sys.stderr)
        return 2
    import redis

    from pvm.connection import NoRedisConfigured
    from pvm.extras import SERVER_EXTRA, missing_server_packages

    user_errors: tuple[type[Exception], ...] = (NoRedisConfigured, ConfigError)
    if args.func not in CLIENT_COMMANDS:
        missing = missing_server_packages()
        if missing:
            print(
                f"pvm {args.command}: needs the server extra ({', '.join(missing)} not installed): {SERVER_EXTRA} "
                "(pvm context and pvm search work without it)",
                file=sys.stderr,
            )
            return 2
        from workers.runtime.queues import UnknownPool

        user_errors += (UnknownPool,)
    try:
        code = int(args.func(args, settings))
        sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's last flush
        return code
    except BrokenPipeError:
        # `pvm status | head -1`: the reader has what it wanted. Python's advice: point stdout at
        # devnull so the flush at exit cannot fail again; 141 is what a shell reports for SIGPIPE.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        return 130
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        print(f"pvm: {redis_unreachable(settings.redis_url or '', exc)}", file=sys.stderr)
        return 2
    except user_errors as exc:  # a clear one-line error for what a user can fix
        print(f"pvm: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

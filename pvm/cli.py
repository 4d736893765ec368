"""The `pvm` command: run the stack and its parts, and look into the log.

Server-side commands import `workers` lazily, so agents that only use the
library never load worker code.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pvm.config import ConfigError, Settings


def _parse_processes(values: Sequence[str]) -> dict[str, int]:
    from pvm.queues import UnknownPool, queue_name

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


def _stop_on_signals(event: threading.Event) -> None:
    def handler(signum: int, frame: object) -> None:
        event.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


# -- commands -----------------------------------------------------------------


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    from pvm.stack import Stack

    stack = Stack(settings, _parse_processes(args.processes), dispatchers=args.dispatchers)
    stop = threading.Event()
    _stop_on_signals(stop)
    live = stack.start()
    where = "embedded Valkey" if stack.redis else "PVM_REDIS_URL"
    print(f"pvm up: Redis {live.redis_url} ({where}); log in {live.log_dir}; shards {live.shards}")
    print("  processes: " + ", ".join(f"{name} pid {c.pid}" for name, c in stack.children.items()))
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


def cmd_dispatch(args: argparse.Namespace, settings: Settings) -> int:
    from pvm.connection import redis_from_settings
    from workers.dispatcher import Dispatcher

    shards = [int(s) for s in args.shards.split(",")] if args.shards else None
    if args.batch:
        settings = settings.with_(dispatch_batch=args.batch)
    dispatcher = Dispatcher(redis_from_settings(settings), settings, consumer=args.consumer, shards=shards)
    _stop_on_signals(dispatcher.stop_event)
    logging.getLogger("workers").info("dispatcher %s on shards %s", dispatcher.consumer, dispatcher.shards)
    stats = dispatcher.run(max_idle_s=args.max_idle)
    logging.getLogger("workers").info("dispatcher %s stopped: %s", dispatcher.consumer, stats.__dict__)
    return 0


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from workers.runner import WorkerGroup, run_worker

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


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from pvm.demo import run_demo

    return run_demo(settings, minutes=args.minutes)


# -- parser -------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pvm",
        description="PVM: durable, searchable memory for fleets of AI agents. "
        "Configuration comes from PVM_* environment variables (see README).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="run the whole stack here: Redis (embedded unless PVM_REDIS_URL), dispatcher, pools")
    up.add_argument(
        "--processes", action="append", default=[], metavar="POOL=N", help="worker processes for a pool (repeatable)"
    )
    up.add_argument("--dispatchers", type=_positive_int, default=1, help="dispatcher processes (default 1)")
    up.set_defaults(func=cmd_up)

    dispatch = sub.add_parser("dispatch", help="move minutes from the streams into log-pool batch jobs")
    dispatch.add_argument("--consumer", help="consumer name; reuse it after a restart to resume its pending entries")
    dispatch.add_argument("--shards", help="comma-separated shard numbers (default: all)")
    dispatch.add_argument("--batch", type=_positive_int, help="minutes per job (default PVM_DISPATCH_BATCH or 500)")
    dispatch.add_argument("--max-idle", type=float, help="exit after this many seconds with nothing to do")
    dispatch.set_defaults(func=cmd_dispatch)

    worker = sub.add_parser("worker", help="run RQ workers for pools (msgpack only; SIGTERM finishes the batch)")
    worker.add_argument("pools", nargs="+", metavar="POOL", help="pools to serve, e.g. log")
    worker.add_argument("--processes", type=_positive_int, default=1, help="long-lived worker processes (default 1)")
    worker.add_argument("--burst", action="store_true", help="exit when the queues are empty")
    worker.add_argument("--name", help="worker name (default: pvm-<host>-<pid>-<random>)")
    worker.set_defaults(func=cmd_worker)

    log_cmd = sub.add_parser("log", help="read the durable log")
    log_sub = log_cmd.add_subparsers(dest="log_command", required=True, metavar="SUBCOMMAND")
    tail = log_sub.add_parser("tail", help="the newest minutes of a project")
    tail.add_argument("--project", required=True, help="project id")
    tail.add_argument("-n", type=_positive_int, default=20, help="how many minutes (default 20)")
    tail.add_argument("--json", action="store_true", help="machine-readable output")
    tail.set_defaults(func=cmd_log_tail)

    demo = sub.add_parser("demo", help="start the embedded stack, emit sample minutes, show the log, stop")
    demo.add_argument("--minutes", type=int, default=300, help="how many minutes to emit (default 300)")
    demo.set_defaults(func=cmd_demo)
    return parser


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
    try:
        return int(args.func(args, settings))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a clear one-line error for anything a user can cause
        from pvm.connection import NoRedisConfigured
        from pvm.queues import UnknownPool

        if isinstance(exc, (NoRedisConfigured, UnknownPool, ConfigError)):
            print(f"pvm: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())

"""`pvm up`, `serve`, `worker`, `dispatch`, `scheduler`, `exporter` and `mcp`: the commands that run the
stack, or one of its processes."""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Sequence
from typing import Any

from pvm import defaults
from pvm.config import Settings
from workers.ops.cli.plumbing import (
    connect_service,
    port,
    positive_int,
    seconds,
    shard_list,
    shards_of,
    stop_on_signals,
)
from workers.ops.tables import age, table


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
        connect_service(settings).close()  # a Redis named but not there: say so before starting anything
    stop = threading.Event()
    stop_on_signals(stop)
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


def cmd_dispatch(args: argparse.Namespace, settings: Settings) -> int:
    from workers.ingest.dispatcher import Dispatcher

    shards = shards_of(settings, args.shards) if args.shards else None
    if args.batch:
        settings = settings.with_(dispatch_batch=args.batch)
    dispatcher = Dispatcher(connect_service(settings), settings, consumer=args.consumer, shards=shards)
    stop_on_signals(dispatcher.stop_event)
    logging.getLogger("workers").info("dispatcher %s on shards %s", dispatcher.consumer, dispatcher.shards)
    stats = dispatcher.run(max_idle_s=args.max_idle)
    logging.getLogger("workers").info("dispatcher %s stopped: %s", dispatcher.consumer, stats.__dict__)
    return 0


def cmd_scheduler(args: argparse.Namespace, settings: Settings) -> int:
    from contracts import keys
    from workers.runtime.scheduler import Scheduler, default_schedules, read_schedules

    connection = connect_service(settings)
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
                    "every": age(sched.every_s),
                    "last run": "never" if last is None else f"{age(now - last)} ago",
                    "next": "now" if due <= 0 else f"in {age(due)}",
                    "last job": (st.job_id if st else None) or "-",
                }
            )
        if rows:
            print(table(rows, ["schedule", "pool", "every", "last run", "next", "last job"]))
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
    stop_on_signals(scheduler.stop_event)
    stats = scheduler.run()
    logging.getLogger("workers").info("scheduler %s stopped: %s", scheduler.name, stats.__dict__)
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
    connect_service(settings).close()
    if args.processes == 1:
        run_worker(args.pools, settings, burst=args.burst, name=args.name)
        return 0
    group = WorkerGroup(args.pools, args.processes, settings)
    stop = threading.Event()
    stop_on_signals(stop)
    group.start()
    try:
        group.supervise(stop)
    finally:
        group.stop()
    return 0


def cmd_exporter(args: argparse.Namespace, settings: Settings) -> int:
    from workers.ops.exporter import serve

    server, _thread = serve(connect_service(settings), settings, port=args.port, addr=args.addr)
    print(f"pvm exporter: serving http://{args.addr}:{args.port}/metrics (Ctrl-C stops)")
    sys.stdout.flush()
    stop = threading.Event()
    stop_on_signals(stop)
    stop.wait()
    server.shutdown()
    return 0


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from workers.api.app import run_server
    from workers.api.auth import TokenFile

    # Loaded before anything starts: a tokens file that cannot be used is a one-line error, never an open API.
    tokens = TokenFile(settings.api_tokens_file) if settings.api_tokens_file else None
    connect_service(settings).close()
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
    if args.ui:
        print(f"pvm serve: web console on http://{args.addr}:{args.port}/ui")
        sys.stdout.flush()
    pages = None
    if args.ui:
        from workers.console.routes import CONSOLE

        pages = CONSOLE
    run_server(settings, args.addr, args.port, index_worker, tokens=tokens, mcp=args.mcp, pages=pages)
    return 0


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


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `pvm up`, `dispatch`, `scheduler`, `worker`, `exporter`, `serve` and `mcp` to the `pvm` subcommands."""
    up = sub.add_parser("up", help="run the whole stack here: Redis (embedded unless PVM_REDIS_URL), dispatcher, pools")
    up.add_argument(
        "--processes", action="append", default=[], metavar="POOL=N", help="worker processes for a pool (repeatable)"
    )
    up.add_argument("--dispatchers", type=positive_int, default=1, help="dispatcher processes (default 1)")
    up.add_argument(
        "--api-port", type=port, default=defaults.API_PORT, help=f"reader API port (default {defaults.API_PORT})"
    )
    up.add_argument(
        "--mcp",
        action="store_true",
        help=f"also serve the MCP tools at {defaults.MCP_PATH} of the reader API (pvm serve --mcp)",
    )
    up.set_defaults(func=cmd_up)

    dispatch = sub.add_parser("dispatch", help="move minutes from the streams into log-pool batch jobs")
    dispatch.add_argument("--consumer", help="consumer name; reuse it after a restart to resume its pending entries")
    dispatch.add_argument("--shards", type=shard_list, help="comma-separated shard numbers (default: all)")
    dispatch.add_argument(
        "--batch",
        type=positive_int,
        help=f"minutes per job (default PVM_DISPATCH_BATCH or {defaults.DISPATCH_BATCH_SIZE})",
    )
    dispatch.add_argument("--max-idle", type=seconds, help="exit after this many seconds with nothing to do")
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
    worker.add_argument("--processes", type=positive_int, default=1, help="long-lived worker processes (default 1)")
    worker.add_argument("--burst", action="store_true", help="exit when the queues are empty")
    worker.add_argument("--name", help="worker name (default: pvm-<host>-<pid>-<random>)")
    worker.set_defaults(func=cmd_worker)

    exporter = sub.add_parser("exporter", help="serve Prometheus metrics read from Redis on /metrics")
    exporter.add_argument(
        "--port", type=port, default=defaults.EXPORTER_PORT, help=f"port (default {defaults.EXPORTER_PORT})"
    )
    exporter.add_argument(
        "--addr",
        default=defaults.BIND_ADDR,
        help=f"address to bind (default {defaults.BIND_ADDR}; 0.0.0.0 in containers)",
    )
    exporter.set_defaults(func=cmd_exporter)

    serve = sub.add_parser("serve", help="the reader HTTP API (and, with the embedded engine, the index pool)")
    serve.add_argument(
        "--addr",
        default=defaults.BIND_ADDR,
        help=f"address to bind (default {defaults.BIND_ADDR}; 0.0.0.0 in containers)",
    )
    serve.add_argument("--port", type=port, default=defaults.API_PORT, help=f"port (default {defaults.API_PORT})")
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
    serve.add_argument(
        "--no-ui",
        dest="ui",
        action="store_false",
        help="leave out the web console (served at /ui by default, behind the same tokens as the API)",
    )
    serve.set_defaults(func=cmd_serve)

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
    mcp.add_argument("--port", type=port, default=defaults.MCP_PORT, help=f"http: port (default {defaults.MCP_PORT})")
    mcp.set_defaults(func=cmd_mcp)

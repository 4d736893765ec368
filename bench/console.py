#!/usr/bin/env python
"""Console benchmark: how long each page of the web console takes to answer, at 100k minutes in a project.

Everything runs on a temporary PVM_HOME and a fresh embedded Valkey, with the
embedded vector engine and no model (rules, lexical search), in this process:

1. load       generated multi-agent minutes (bench/sessions.py, as bench/reader.py
              makes them: ~90% in the measured project, the rest in 4 small ones)
              go through the log pool's and the index pool's steps
              (`bench.reader.Loader`), and the same batches through the facts
              pool (`facts_batch`) and the summarize pool (`summarize_batch`), so
              the project has threads, chunks and episodes as a running stack
              would give it. Those sessions state no facts the rules read, so
              first the minutes of bench/fact_sessions.py's generated split (six
              projects' worth of stated, changed and restated facts) go the same
              way, moved into the measured project: it has facts and their
              histories too (their minutes come on top of --minutes).
2. serve      the API with the console (`create_app` with `CONSOLE`, as `pvm serve`
              builds it) under uvicorn on 127.0.0.1, in a thread of this process.
3. measure    each page, `--calls` GETs over HTTP (httpx, one connection, after a
              warm-up), with its ids taken from the stores (a minute, a fact, a
              thread, an agent): the time from sending the request to the whole
              HTML answer read, which is the server's work for a browser (not the
              browser's layout). The timeline is measured with 1,000 minutes on a
              page (`timeline_1000`), the issue's "page of 1,000 minutes", and
              with its default page and a filter. A page that answers anything
              but 200 is reported with its status and not timed.
                page_p50_ms / page_p99_ms: {page: ms}
                                                        target: every page_p99_ms <= 1,000 ms

Progress goes to stderr; the result (one JSON object with --json, else a table) to stdout.

    .venv/bin/python bench/console.py --json                      # 100k minutes, ~3 min
    .venv/bin/python bench/console.py --minutes 5000 --calls 10   # a quick run
"""

from __future__ import annotations

import dataclasses
import random
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import redis

from bench.fact_sessions import fact_session
from bench.harness import (
    Progress,
    argument_parser,
    footer,
    measuring,
    parse,
    percentile,
    report,
    target_texts,
    workspace,
)
from bench.machine import machine
from bench.reader import BATCH, MAIN_PROJECT, Feed, Loader, generate_minutes, load
from bench.sessions import AGENTS, task_texts
from contracts import encode_minute, keys
from contracts.facts import TierKey
from pvm import engines
from pvm.config import Settings
from pvm.reader import ContextReader
from pvm.stores.log import LogReader
from pvm.stores.summaries import SummaryStore
from workers.api.app import create_app
from workers.console.routes import CONSOLE
from workers.facts.pool import FactsContext, facts_batch
from workers.summarize.pool import SummarizeContext, summarize_batch

MINUTES = 100_000
CALLS = 30
WARMUP_CALLS = 3
PAGE_TARGET_MS = 1_000.0


class StackLoader(Loader):
    """`bench.reader.Loader`, and each batch through the facts and summarize pools' steps too."""

    def __init__(self, settings: Settings, connection: redis.Redis) -> None:
        super().__init__(settings, connection)
        self.facts = FactsContext.build(connection, settings)
        self.summaries = SummarizeContext.build(connection, settings)

    def _index(self, records: list[list[Any]]) -> None:
        super()._index(records)
        facts_batch(self.facts, self.connection, records)
        summarize_batch(self.summaries, self.connection, records)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(settings: Settings, connection: redis.Redis) -> Iterator[str]:
    """The API and the console, as `pvm serve` builds them, under uvicorn in a thread; yields its base URL."""
    import uvicorn

    reader = ContextReader(connection, LogReader(settings.log_dir), engines.searcher_for(settings))  # type: ignore[arg-type]
    app = create_app(reader, connection, settings.shards, pages=CONSOLE, settings=settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name="console-bench", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the console's server did not start within 30 s")
        time.sleep(0.05)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(10)


def sample_ids(connection: redis.Redis, settings: Settings, rng: random.Random) -> dict[str, str]:
    """A minute, a fact, a thread and an agent of the measured project, to open their pages."""
    log = LogReader(settings.log_dir)
    newest = log.get_recent(MAIN_PROJECT, 2_000)
    minute = rng.choice(newest[: len(newest) // 2]) if newest else None
    raw = connection.hkeys(keys.facts_by_id(TierKey.for_project(MAIN_PROJECT)))
    facts = sorted(f.decode() if isinstance(f, bytes) else str(f) for f in raw)  # type: ignore[union-attr]
    threads = SummaryStore(connection).threads(MAIN_PROJECT)
    return {
        "minute": minute.minute.id if minute is not None else "",
        "fact": rng.choice(facts) if facts else "",
        "thread": str(rng.choice(threads)) if threads else "",
        "agent": rng.choice(AGENTS),
    }


def pages(ids: dict[str, str], rng: random.Random) -> dict[str, tuple[str, dict[str, str]]]:
    """Each measured page: (path, query parameters)."""
    p = f"/ui/projects/{MAIN_PROJECT}"
    task = task_texts(rng, 1)[0]
    return {
        "projects": ("/ui", {}),
        "project": (p, {}),
        "timeline": (f"{p}/timeline", {}),
        "timeline_1000": (f"{p}/timeline", {"n": "1000"}),
        "timeline_agent": (f"{p}/timeline", {"agent": ids["agent"]}),
        "minute": (f"{p}/minutes/{ids['minute']}", {}),
        "knowledge": (f"{p}/knowledge", {}),
        "fact": (f"{p}/facts/{ids['fact']}", {}),
        "threads": (f"{p}/threads", {}),
        "thread": (f"{p}/threads/{ids['thread']}", {}),
        "agents": (f"{p}/agents", {}),
        "agent": (f"{p}/agents/{ids['agent']}", {}),
        "context": (f"{p}/context", {"agent_id": ids["agent"], "task": task}),
        "search": (f"{p}/search", {"q": task}),
        "pools": ("/ui/pools", {}),
    }


def measure(
    base: str, measured: dict[str, tuple[str, dict[str, str]]], calls: int, progress: Progress
) -> dict[str, Any]:
    """Each page's p50/p99 over `calls` timed GETs (after a warm-up); a page that does not answer 200 is not timed."""
    p50: dict[str, float] = {}
    p99: dict[str, float] = {}
    sizes: dict[str, int] = {}
    failed: dict[str, int] = {}
    with httpx.Client(base_url=base, timeout=60) as client:
        for i, (name, (path, params)) in enumerate(measured.items()):
            answer = client.get(path, params=params)
            if answer.status_code != 200:
                failed[name] = answer.status_code
                progress.tick(f"{name}: {answer.status_code}, not timed", force=True)
                continue
            for _ in range(WARMUP_CALLS):
                client.get(path, params=params)
            times = []
            for _ in range(calls):
                started = time.perf_counter()
                answer = client.get(path, params=params)
                answer.read()
                times.append((time.perf_counter() - started) * 1000)
            times.sort()
            p50[name], p99[name] = round(percentile(times, 50), 2), round(percentile(times, 99), 2)
            sizes[name] = len(answer.content)
            progress.tick(f"{i + 1}/{len(measured)} {name}: p50 {p50[name]:.1f} ms, p99 {p99[name]:.1f} ms", force=True)
    slowest = max(p99.values(), default=None)
    return {
        "page_p50_ms": p50,
        "page_p99_ms": p99,
        "page_bytes": sizes,
        "pages_not_200": failed,
        "page_p99_ms_slowest": slowest,
    }


def run(minutes: int, calls: int, seed: int, progress: Progress) -> dict[str, Any]:
    rng = random.Random(seed)
    progress.start("load", f"{minutes:,} minutes of {MAIN_PROJECT} through the log, index, facts and summarize steps")
    with workspace("console") as ws:
        settings, connection = ws.settings, ws.connection
        loader = StackLoader(settings, connection)
        try:
            facts = [
                (moved := dataclasses.replace(m, project_id=MAIN_PROJECT), encode_minute(moved))
                for m in fact_session("default", seed).minutes
            ]
            for start in range(0, len(facts), BATCH):
                loader.batch(facts[start : start + BATCH])
            progress.tick(f"{len(facts):,} minutes stating facts loaded", force=True)
            load(loader, Feed(generate_minutes(minutes, seed)), minutes, progress)
            ids = sample_ids(connection, settings, rng)
            measured = pages(ids, rng)
            progress.start("measure", f"{len(measured)} pages, {calls} GETs each over HTTP")
            with serving(settings, connection) as base:
                result = measure(base, measured, calls, progress)
            result["machine"] = machine(connection)
            result["ids"] = ids
        finally:
            engines.close_shared()
            loader.writer.close()
    return result


def table(result: dict[str, Any]) -> str:
    lines = [f"{'page':<16} {'p50 ms':>9} {'p99 ms':>9} {'bytes':>10}"]
    for name, p99 in result["page_p99_ms"].items():
        lines.append(f"{name:<16} {result['page_p50_ms'][name]:>9.1f} {p99:>9.1f} {result['page_bytes'][name]:>10,}")
    for name, status in result["pages_not_200"].items():
        lines.append(f"{name:<16} answered {status}: not timed")
    lines.append(footer(result, f"{result['config']['minutes']:,} minutes, {result['config']['calls']} GETs a page"))
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> Any:
    parser = argument_parser("bench/console.py", __doc__)
    parser.add_argument(
        "--minutes", type=int, default=MINUTES, help="minutes in the measured project (default %(default)s)"
    )
    parser.add_argument("--calls", type=int, default=CALLS, help="timed GETs of each page (default %(default)s)")
    parser.add_argument("--seed", type=int, default=7)
    args = parse(parser, argv)
    if args.minutes < 1_000:
        parser.error("--minutes must be at least 1000")
    if args.calls < 5:
        parser.error("--calls must be at least 5")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    with measuring("console bench") as outcome:
        result = run(args.minutes, args.calls, args.seed, Progress("console bench", sep=": "))
    if outcome.exit_code is not None:
        return outcome.exit_code
    result["config"] = {
        "minutes": args.minutes,
        "calls": args.calls,
        "warmup_calls": WARMUP_CALLS,
        "basis": "GET over HTTP on loopback to the whole HTML answer read (server work, not browser layout)",
        "engine": "embedded (qdrant-edge), lexical only; rule extraction, extractive summaries",
    }
    targets = {f"page_p99_ms.{name}": ("<=", PAGE_TARGET_MS) for name in result["page_p99_ms"]}
    result["targets"] = target_texts(targets)
    result["met"] = {
        **{f"page_p99_ms.{name}": ms <= PAGE_TARGET_MS for name, ms in result["page_p99_ms"].items()},
        **{f"page_p99_ms.{name}": False for name in result["pages_not_200"]},
    }
    return report(result, started, args.json, table)


if __name__ == "__main__":
    sys.exit(main())

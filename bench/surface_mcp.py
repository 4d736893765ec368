#!/usr/bin/env python
"""MCP benchmark: search through `pvm mcp` at 100k indexed minutes (mcp_call_p99_ms).

1. load       the measured project of bench/reader.py (100k minutes of generated
              multi-agent sessions plus 4 side projects), through the log pool's
              and the index pool's steps, then one explicit `engine.optimize()`,
              as bench/reader.py does (its `build_minutes`, `Loader`, `load`).
2. serve      in this process, as `pvm serve --mcp` runs it: the reader API
              (`workers.api.app.create_app`, token-guarded) with the MCP tools at
              /mcp beside it (`workers.agent.mcp_server.beside_api`: the tools call
              the API app in-process), under uvicorn on a loopback port; and, as
              `pvm mcp --transport http` runs it, the MCP server on its own
              (`workers.agent.mcp_server.http_app`) under uvicorn on another port,
              calling the API over HTTP. Both pass each caller's bearer token on.
3. measure    from a separate process (an agent host): the SDK's MCP client
              (`mcp.Client` over streamable HTTP) calls the `search` tool with
              varied queries (k=5), each call timed from the call to its parsed
              result, after a warm-up: mcp_call_* through `pvm serve --mcp`,
              mcp_proxy_call_* through `pvm mcp`. For comparison, the same
              queries through `pvm.Client.search` straight to the API, and
              `ContextReader.search` in-process (what the API itself spends);
              and each server's CPU time per call (`*_server_cpu_ms`).
                                                        target: mcp_call_p99_ms <= 20 at 100k

Progress goes to stderr; the result (one JSON object with --json, else a table) to stdout.

    .venv/bin/python bench/surface_mcp.py --json
    .venv/bin/python bench/surface_mcp.py --minutes-scale 0.1     # a quick run
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvicorn

from bench.harness import (
    VERDICT_WORDS,
    BenchError,
    Progress,
    add_minutes_scale,
    argument_parser,
    machine_line,
    measuring,
    parse,
    percentile,
    report,
    target_texts,
    verdicts,
)
from bench.harness import workspace as bench_workspace
from bench.machine import machine
from bench.reader import MAIN_MINUTES, MAIN_PROJECT, Feed, Loader, build_minutes, load
from bench.sessions import task_texts
from pvm import defaults, engines
from pvm.reader import ContextReader
from pvm.stores.log import LogReader
from workers.agent.mcp_server import Gateway, beside_api, http_app
from workers.api.app import create_app

ROOT = Path(__file__).resolve().parents[1]
CALLS = 1_000
WARMUP_CALLS = 100
SEARCH_K = defaults.SEARCH_K
TOKEN = "bench-surface-mcp-token"
SERVER_START_S = 30.0

TARGETS: dict[str, tuple[str, float]] = {"mcp_call_p99_ms": ("<=", 20.0)}


@contextmanager
def serving(app: Any, label: str) -> Iterator[str]:
    """An ASGI app under uvicorn in a thread on a free loopback port; yields its URL once it listens."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name=f"bench-{label}", daemon=True)
    thread.start()
    deadline = time.monotonic() + SERVER_START_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise BenchError(f"the {label} server did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


# -- the agent host's side (a separate process) ----------------------------------------------------------------


def client_main() -> int:
    """Read {"via": "mcp" | "api", "url", "token", "project", "queries", "warmup"} on stdin; print the timings."""
    spec = json.load(sys.stdin)
    if spec["via"] == "mcp":
        timed, hits = asyncio.run(_time_mcp(spec))
    else:
        timed, hits = _time_api(spec), []
    print(json.dumps({"ms": timed, "hits": hits}))
    return 0


async def _time_mcp(spec: dict[str, Any]) -> tuple[list[float], list[int]]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {spec['token']}"}
    clock = time.perf_counter_ns
    timed: list[float] = []
    hits: list[int] = []
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        Client(streamable_http_client(spec["url"], http_client=http)) as client,
    ):
        for i, query in enumerate(spec["queries"]):
            arguments = {"project_id": spec["project"], "query": query, "k": SEARCH_K}
            started = clock()
            result = await client.call_tool("search", arguments)
            elapsed = (clock() - started) / 1e6
            if result.is_error:
                raise BenchError(f"the search tool failed: {result.content}")
            if i >= spec["warmup"]:
                timed.append(elapsed)
                hits.append(len(result.structured_content["hits"]))
    return sorted(timed), hits


def _time_api(spec: dict[str, Any]) -> list[float]:
    from pvm import Client

    clock = time.perf_counter_ns
    timed: list[float] = []
    with Client(spec["url"], spec["token"]) as api:
        for i, query in enumerate(spec["queries"]):
            started = clock()
            api.search(spec["project"], query, SEARCH_K)
            if i >= spec["warmup"]:
                timed.append((clock() - started) / 1e6)
    return sorted(timed)


# -- run -------------------------------------------------------------------------------------------------------


def _stats(name: str, values: Sequence[float]) -> dict[str, float]:
    return {
        f"{name}_p50_ms": round(percentile(values, 50), 3),
        f"{name}_p99_ms": round(percentile(values, 99), 3),
        f"{name}_mean_ms": round(sum(values) / len(values), 3),
        f"{name}_max_ms": round(values[-1], 3),
    }


def run(main_minutes: int, calls: int, seed: int, progress: Progress) -> dict[str, Any]:
    """Load the measured project, serve the API and the MCP server, time search over MCP from another process."""
    progress.tick(f"building {main_minutes:,} minutes of {MAIN_PROJECT} plus side projects", True)
    minutes = build_minutes(main_minutes, seed)
    gc.collect()
    gc.freeze()
    rng = random.Random(seed)
    queries = task_texts(rng, calls + WARMUP_CALLS)
    result: dict[str, Any] = {}
    with bench_workspace("surface-mcp") as ws:
        live, connection = ws.settings, ws.connection
        loader = Loader(live, connection)
        try:
            searcher = engines.searcher_for(live)
            reader = ContextReader(connection, LogReader(live.log_dir), searcher)  # type: ignore[arg-type]
            load(loader, Feed(iter(minutes)), main_minutes, progress)
            progress.tick("engine.optimize() (explicit, as after a bulk load)", True)
            engines.shared_engine(live).optimize()
            del minutes
            gc.unfreeze()
            gc.collect()
            direct: list[float] = []
            for query in queries:
                started = time.perf_counter_ns()
                reader.search(MAIN_PROJECT, query, k=SEARCH_K)
                direct.append((time.perf_counter_ns() - started) / 1e6)
            result.update(_stats("reader_search", sorted(direct[WARMUP_CALLS:])))
            api = create_app(reader, connection, live.shards, api_token=TOKEN)
            # `pvm serve --mcp`: the tools at /mcp of the API's server, calling the API app in-process.
            with serving(beside_api(api, host="127.0.0.1"), "api") as api_url:
                # `pvm mcp --transport http`: a server of its own, calling the API over loopback HTTP.
                proxy = http_app(Gateway(api_url, per_request_token=True), host="127.0.0.1")
                with serving(proxy, "mcp") as proxy_url:
                    spec = {"token": TOKEN, "project": MAIN_PROJECT, "queries": queries, "warmup": WARMUP_CALLS}
                    load_before = os.getloadavg()[0]
                    for via, name, url in (
                        ("mcp", "mcp_call", f"{api_url}{defaults.MCP_PATH}"),
                        ("mcp", "mcp_proxy_call", f"{proxy_url}{defaults.MCP_PATH}"),
                        ("api", "api_search", api_url),
                    ):
                        progress.tick(f"timing {calls:,} calls: {name}, from a client process", True)
                        cpu_before = time.process_time()
                        timings = _client_process({**spec, "via": via, "url": url})
                        cpu_ms = (time.process_time() - cpu_before) * 1000 / (calls + WARMUP_CALLS)
                        result.update(_stats(name, timings["ms"]))
                        # What serving one call cost this process (its servers, the reader): CPU time, which
                        # other load on the machine inflates far less than wall time.
                        result[f"{name}_server_cpu_ms"] = round(cpu_ms, 3)
                        if via == "mcp":
                            result[f"{name}_hits_mean"] = round(sum(timings["hits"]) / len(timings["hits"]), 2)
                    load_after = os.getloadavg()[0]
            # The machine's 1-minute load average around the timed calls: above ~1 others shared the cores.
            result["load_avg"] = [round(load_before, 2), round(load_after, 2)]
            result["points_main"] = engines.shared_engine(live).count(MAIN_PROJECT)
            result["machine"] = machine(connection)
        finally:
            engines.close_shared()
            loader.writer.close()
    result["minutes_main"] = main_minutes
    return result


def _client_process(spec: dict[str, Any]) -> dict[str, Any]:
    """Run the agent host's side in its own process (its own interpreter lock, as an agent host has)."""
    code = "import sys; from bench.surface_mcp import client_main; sys.exit(client_main())"
    done = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(spec), capture_output=True, text=True, cwd=ROOT, timeout=1_800
    )
    if done.returncode != 0:
        raise BenchError(f"the client process failed: {done.stderr.strip().splitlines()[-1:]}")
    timings: dict[str, Any] = json.loads(done.stdout)
    return timings


def table(result: dict[str, Any]) -> str:
    label = f"@{result['minutes_main'] // 1000}k"
    rows = [
        (f"search over MCP (serve --mcp) p50 / p99 {label}",
         f"{result['mcp_call_p50_ms']} / {result['mcp_call_p99_ms']} ms", "mcp_call_p99_ms"),
        (f"search over MCP (pvm mcp) p50 / p99 {label}",
         f"{result['mcp_proxy_call_p50_ms']} / {result['mcp_proxy_call_p99_ms']} ms", ""),
        (f"search over the API p50 / p99 {label}", f"{result['api_search_p50_ms']} / {result['api_search_p99_ms']} ms",
         ""),
        (f"reader.search p50 / p99 {label}", f"{result['reader_search_p50_ms']} / "
         f"{result['reader_search_p99_ms']} ms", ""),
        ("server CPU per call: serve --mcp / pvm mcp / API", f"{result['mcp_call_server_cpu_ms']} / "
         f"{result['mcp_proxy_call_server_cpu_ms']} / {result['api_search_server_cpu_ms']} ms", ""),
    ]  # fmt: skip
    met = result.get("met", {})
    lines = [f"{'METRIC':<50}{'VALUE':>22}  {'TARGET':<12}RESULT"]
    for name, value, key in rows:
        target = verdict = ""
        if key in TARGETS:
            op, bound = TARGETS[key]
            target, verdict = f"{op} {bound:g}", VERDICT_WORDS[met.get(key)]
        lines.append(f"{name:<50}{value:>22}  {target:<12}{verdict}")
    lines += [
        "",
        f"{machine_line(result['machine'], server=False)}; load {result['load_avg']}; {result['elapsed_s']:.0f} s",
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argument_parser("bench/surface_mcp.py", __doc__)
    add_minutes_scale(parser, f"multiply the {MAIN_MINUTES:,} minutes of the measured project by X")
    parser.add_argument("--calls", type=int, default=CALLS, help="timed calls (default %(default)s)")
    parser.add_argument("--seed", type=int, default=11)
    args = parse(parser, argv)
    if args.calls < 10:
        parser.error("--calls must be at least 10")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    main_minutes = max(1_000, round(MAIN_MINUTES * args.minutes_scale / 1_000) * 1_000)
    progress = Progress("surface mcp bench", sep=": ")
    started = time.monotonic()
    with measuring("surface mcp bench") as outcome:
        result = run(main_minutes, args.calls, args.seed, progress)
    if outcome.exit_code is not None:
        return outcome.exit_code
    result["config"] = {
        "minutes_scale": args.minutes_scale,
        "calls": args.calls,
        "warmup_calls": WARMUP_CALLS,
        "search_k": SEARCH_K,
        "engine": "embedded (qdrant-edge), lexical only",
        "transport": "streamable HTTP (stateless, JSON answers), bearer token",
        "mcp_call": "pvm serve --mcp: the tools at /mcp of the API's server, calling the API app in-process",
        "mcp_proxy_call": "pvm mcp --transport http: its own server, calling the API over loopback HTTP",
        "client": "mcp.Client in a separate process; both servers share this one (two uvicorn threads)",
    }
    result["targets"] = target_texts(TARGETS)
    result["met"] = verdicts(result, TARGETS)
    return report(result, started, args.json, table)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Reader benchmark: build_context and search latency at 10k and 100k indexed minutes (or the sizes --minutes
names, up to a million), where each millisecond goes, the process's memory; index pool minutes/s.

Everything runs in this one process on a temporary PVM_HOME and a fresh embedded
Valkey, with the embedded vector engine and no embedder (lexical only), through
the code the pools and the reader run in production. The engine keeps its hot
window (`--hot-minutes`, PVM_SEARCH_HOT_MINUTES: a project past twice that many
minutes is searched in its newest ones first); `--hot-minutes 0` measures
without it.

1. load       generated multi-agent minutes (bench/sessions.py: failures with
              causes, conflicts with resolutions, tasks, chatter; references to
              earlier minutes) arrive in 500-minute batches, ~90% of them in the
              measured project and the rest in 4 small ones, interleaved in time.
              Per batch, as the log pool does: `log_pool.process` (the durable
              log, one fsync per batch) and `MinuteCache.update` (recent
              windows, minutes by id, log head) in one pipeline. Then, as
              `workers.index.pool.run` does without RQ, `index_pool.index_batch`:
              decode, build points, agent memory (`AgentMemoryStore.apply`), the
              engine's upsert, the index head and the pool's metrics. index_per_s
              is the minutes of all batches / the time in `index_batch` (one process).
                                                        target: >= 5,000/s
              Minutes are generated batch by batch as they are loaded (a million
              never sit in memory at once).
2. optimize   when the measured project holds 10k (then 100k) minutes, or each
              size `--minutes` names, loading pauses and `engine.optimize()`
              runs once, explicitly, as an operator would after a bulk load (timed).
              Then the file systems are synced (`os.sync`, timed: settle_s_*):
              the load's dirty pages would otherwise be written back by the
              kernel during the measured calls, 5-30 s after the load. On the
              2-core VM that writeback (ext4's extent conversion, discards)
              ran on the other core and slowed the reader's own thread 2-3x
              in ~2% of calls (docs/performance.md, issue 26 session 33).
3. measure    `ContextReader.build_context(project, agent, task, budget_tokens=2000)`
              and `ContextReader.search(project, query, k=5)`, each timed call by
              call over `--calls` calls (after a warm-up) with agents and
              task texts varied (work, incidents, conflicts in any wording).
              The reader is the one `pvm serve` builds: Redis caches, the log,
              `HybridSearch` over the process's shared engine. Wall time per call is
              the target's; each call's CPU time in the reader's thread is reported
              beside it (context_reader_cpu_p50/p99_ms_*: Redis's work and the
              waits for it left out), which a neighbour on a shared machine cannot
              stretch, and the major page faults a context took
              (context_major_faults_*: reads from the disk; home_filesystem
              says what the temporary home, under $TMPDIR, is on: tmpfs has
              none to take). ranking_payloads: the candidates' ranking
              payloads the engine kept at the end, and over the run how many
              it was asked for that it had (hits) and read from a shard
              (misses).
              Then `--phase-calls` more build_context calls, each timed phase by
              phase (wall and the thread's CPU; context_phases_*): `reads` (the
              one pipeline of scripts: recent window, caches, heads, agent
              memory, current facts), `search` (relevant experience),
              `referenced` (the minutes the recent ones reference, from the
              cache or the log) and `assemble` (the rest: facts and rules chosen,
              the budget packed, access counted). And the process's resident
              memory (reader_rss_mb_*: the whole bench process, so the loader's
              and the embedded engine's memory is in it; `pvm serve` holds the
              engine too), and how much of it is mapped files
              (reader_rss_file_mb_*: the shards' payloads and point ids, kept
              warm in the page cache, which the kernel can take back).
                                                        target: build_context p99 <= 4 ms at 100k,
                                                        <= 5 ms at 1m; search p99 <= 3 ms at 1m

Progress goes to stderr; the result (one JSON object with --json, else a table) to stdout.

    .venv/bin/python bench/reader.py --json
    .venv/bin/python bench/reader.py --minutes-scale 0.1     # a quick run
    .venv/bin/python bench/reader.py --minutes 100000,500000,1000000 --json   # ~10 min, ~4 GB
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import math
import os
import pstats
import random
import resource
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis

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
    say,
    target_texts,
    verdicts,
    workspace,
)
from bench.machine import machine
from bench.sessions import AGENTS, stream, task_texts
from contracts import Minute, encode_minute
from pvm import defaults, engines
from pvm.config import Settings
from pvm.reader import ContextReader
from pvm.stores.cache import CachedMinute, MinuteCache
from pvm.stores.log import LogReader, LogWriter
from workers.index import pool as index_pool
from workers.log import pool as log_pool

MAIN_PROJECT = "bench-main"
SIDE_PROJECTS = ("bench-side-1", "bench-side-2", "bench-side-3", "bench-side-4")
SIDE_SHARE = 0.1  # of all minutes, spread over the side projects
MAIN_MINUTES = 100_000  # at --minutes-scale 1.0; the first checkpoint is a tenth of it
MAX_MINUTES = 2_000_000  # the largest checkpoint --minutes takes
PHASE_CALLS = 300
PHASES = ("reads", "search", "referenced", "assemble")
BATCH = defaults.FANOUT_BATCH_SIZE
CALLS = 1_000
WARMUP_CALLS = 100
BUDGET_TOKENS = defaults.CONTEXT_BUDGET_TOKENS
SEARCH_K = defaults.SEARCH_K
INDEX_STAGES = index_pool.STEPS  # decode, build_points, agent_memory, upsert, head_metrics

# Issue 26's targets, each where its checkpoint is measured (100k at --minutes-scale 1; 1m with --minutes).
TARGETS: dict[str, tuple[str, float]] = {
    "context_p99_ms_100k": ("<=", 4.0),
    "context_p99_ms_1m": ("<=", 5.0),
    "search_p99_ms_1m": ("<=", 3.0),
    "index_per_s": (">=", 5_000.0),
}


@dataclass
class IndexTimes:
    """Seconds spent in each index step, summed over batches, and each batch's total."""

    stages: dict[str, float] = field(default_factory=lambda: dict.fromkeys(INDEX_STAGES, 0.0))
    batches: list[float] = field(default_factory=list)
    minutes: int = 0
    log_cache_s: float = 0.0
    cpu_s: float = 0.0  # this process's CPU time in index_batch (every thread): what a shared machine cannot steal

    @property
    def seconds(self) -> float:
        return sum(self.batches)


# -- load ---------------------------------------------------------------------------


def generate_minutes(main_minutes: int, seed: int) -> Iterator[tuple[Minute, bytes]]:
    """Minutes in time order until the main project holds `main_minutes`, with their wire bytes, made as they are
    asked for."""
    weights = {MAIN_PROJECT: 1 - SIDE_SHARE, **{p: SIDE_SHARE / len(SIDE_PROJECTS) for p in SIDE_PROJECTS}}
    expected = math.ceil(main_minutes / (1 - SIDE_SHARE) * 1.05) + 1_000
    main = 0
    for minute in stream(weights, expected, seed=seed):
        yield minute, encode_minute(minute)
        if minute.project_id == MAIN_PROJECT:
            main += 1
            if main >= main_minutes:
                return
    raise BenchError(f"the session stream ended with {main:,}/{main_minutes:,} minutes in {MAIN_PROJECT}")


class Loader:
    """Feeds batches through the log pool's and the index pool's steps, as their RQ jobs do."""

    def __init__(self, settings: Settings, connection: redis.Redis) -> None:
        self.connection = connection
        self.writer = LogWriter(settings.log_dir)
        self.cache = MinuteCache(connection, settings.recent_window, settings.minute_cache_size)
        # The index pool's context, as its RQ job builds it, on our settings (not the environment's).
        self.index = index_pool.IndexContext.build(connection, settings)
        self.times = IndexTimes()
        self._entry = 0

    def batch(self, minutes: Sequence[tuple[Minute, bytes]]) -> None:
        started = time.perf_counter()
        entries = []
        now_ms = int(time.time() * 1000)
        for _, raw in minutes:
            self._entry += 1
            entries.append([f"{now_ms}-{self._entry}", raw])  # as XADD names them: the index pool's freshness
        # log pool: durable log, then the caches (as log_pool.run / _update_caches).
        result = log_pool.process(self.writer, entries)
        durable_at = time.time()
        pipe = self.connection.pipeline(transaction=False)
        for project_id, pairs in result.projects.items():
            self.cache.update(
                project_id,
                [CachedMinute(a.id, a.seq, item.raw, item.agent_id, item.windowed) for item, a in pairs],
                durable_at,
                pipeline=pipe,
            )
        pipe.execute()
        records = log_pool.fanned_out(result)  # the message the log pool fans out
        self.times.log_cache_s += time.perf_counter() - started
        self._index(records)

    def _index(self, records: list[list[Any]]) -> None:
        """What `workers.index.pool.run` does without RQ: `index_pool.index_batch`, timed step by step."""
        started, cpu = time.perf_counter(), time.process_time()
        result = index_pool.index_batch(self.index, self.connection, records, timings=self.times.stages)
        self.times.batches.append(time.perf_counter() - started)
        self.times.cpu_s += time.process_time() - cpu
        if result["undecodable"]:
            raise BenchError(f"{len(result['undecodable'])} minutes did not decode")
        self.times.minutes += len(records)


def build_minutes(main_minutes: int, seed: int) -> list[tuple[Minute, bytes]]:
    """`generate_minutes` made all at once (for a benchmark that loads them more than once, or times nothing else)."""
    return list(generate_minutes(main_minutes, seed))


@dataclass
class Feed:
    """The generated minutes, taken batch by batch: how many were loaded, and how many of them are the main
    project's."""

    minutes: Iterator[tuple[Minute, bytes]]
    loaded: int = 0
    main: int = 0


def load(loader: Loader, feed: Feed, main_target: int, progress: Progress) -> None:
    """Load minutes from `feed` until the main project holds `main_target`."""
    while feed.main < main_target:
        batch: list[tuple[Minute, bytes]] = []
        while len(batch) < BATCH and feed.main < main_target:
            minute = next(feed.minutes, None)
            if minute is None:
                break
            batch.append(minute)
            feed.main += minute[0].project_id == MAIN_PROJECT
        if not batch:
            raise BenchError(f"the minutes ran out at {feed.main:,}/{main_target:,} in {MAIN_PROJECT}")
        loader.batch(batch)
        feed.loaded += len(batch)
        t = loader.times
        progress.tick(
            f"loaded {feed.main:,}/{main_target:,} minutes of {MAIN_PROJECT} ({t.minutes / t.seconds:,.0f}/s indexed)"
        )


# -- measure ------------------------------------------------------------------------


def major_faults() -> int:
    """This process's major page faults so far: each a read from the disk."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def home_filesystem(path: str) -> str | None:
    """The type of the filesystem `path` is on (ext4, tmpfs, ...), from /proc/mounts; None where it cannot tell."""
    try:
        mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return None
    real = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for fields in mounts:
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (real == point or real.startswith(point.rstrip("/") + "/")) and (best is None or len(point) > best[0]):
            best = (len(point), fields[2])
    return best[1] if best is not None else None


def timed_calls(calls: Sequence[Callable[[], Any]], cpu: list[float] | None = None) -> list[float]:
    """Each call's wall time in ms, sorted; with `cpu`, each call's CPU time in this thread (ms, sorted) is put
    in it too: what the reader itself spent, which a neighbour on a shared machine cannot stretch (Redis's own
    work and the waits for it are not in it)."""
    clock, thread_clock = time.perf_counter_ns, time.thread_time_ns
    out = []
    for call in calls:
        t, c = clock(), thread_clock()
        call()
        out.append((clock() - t) / 1e6)
        if cpu is not None:
            cpu.append((thread_clock() - c) / 1e6)
    out.sort()
    if cpu is not None:
        cpu.sort()
    return out


def measure(reader: ContextReader, calls: int, seed: int, label: str, progress: Progress) -> dict[str, Any]:
    """build_context and search latency over `calls` varied calls each, after a warm-up."""
    rng = random.Random(seed)
    agents = [*AGENTS, "newcomer"]  # plus an agent with no memory yet
    tasks = task_texts(rng, calls + WARMUP_CALLS)
    queries = task_texts(rng, calls + WARMUP_CALLS)
    askers = [rng.choice(agents) for _ in tasks]
    contexts = [
        (lambda a=a, t=t: reader.build_context(MAIN_PROJECT, a, task=t, budget_tokens=BUDGET_TOKENS))
        for a, t in zip(askers, tasks, strict=True)
    ]
    searches = [(lambda q=q: reader.search(MAIN_PROJECT, q, k=SEARCH_K)) for q in queries]
    progress.tick(f"{label}: warming up ({WARMUP_CALLS} calls each)", force=True)
    for call in contexts[:WARMUP_CALLS] + searches[:WARMUP_CALLS]:
        call()
    gc.collect()
    load_before = os.getloadavg()[0]
    progress.tick(f"{label}: timing {calls:,} build_context calls", force=True)
    context_cpu_ms: list[float] = []
    faults_before = major_faults()
    context_ms = timed_calls(contexts[WARMUP_CALLS:], context_cpu_ms)
    faults = major_faults() - faults_before
    progress.tick(f"{label}: timing {calls:,} search calls", force=True)
    search_ms = timed_calls(searches[WARMUP_CALLS:])
    load_after = os.getloadavg()[0]
    sample = reader.build_context(MAIN_PROJECT, "coder", task=tasks[0], budget_tokens=BUDGET_TOKENS)
    hits = [len(reader.search(MAIN_PROJECT, q, k=SEARCH_K)) for q in queries[:50]]
    out = {
        f"context_p50_ms_{label}": round(percentile(context_ms, 50), 3),
        f"context_p99_ms_{label}": round(percentile(context_ms, 99), 3),
        f"context_mean_ms_{label}": round(sum(context_ms) / len(context_ms), 3),
        f"context_max_ms_{label}": round(context_ms[-1], 3),
        # The reader thread's CPU time per call (Redis's work and waits left out), beside the wall time above.
        f"context_reader_cpu_p50_ms_{label}": round(percentile(context_cpu_ms, 50), 3),
        f"context_reader_cpu_p99_ms_{label}": round(percentile(context_cpu_ms, 99), 3),
        # Reads from the disk the contexts waited on (the process's major page faults over the timed calls).
        f"context_major_faults_{label}": round(faults / max(1, len(context_ms)), 2),
        f"search_p50_ms_{label}": round(percentile(search_ms, 50), 3),
        f"search_p99_ms_{label}": round(percentile(search_ms, 99), 3),
        f"search_mean_ms_{label}": round(sum(search_ms) / len(search_ms), 3),
        f"search_max_ms_{label}": round(search_ms[-1], 3),
        f"context_sample_{label}": {
            "task": sample.task,
            "recent": len(sample.recent),
            "referenced": len(sample.referenced),
            "relevant_experience": len(sample.relevant_experience),
            "used_tokens": sample.budget.used_tokens,
            "cut": sample.budget.cut,
            "index_behind": sample.freshness["index"]["behind"],
        },
        f"search_hits_mean_{label}": round(sum(hits) / len(hits), 2),
        # The machine's 1-minute load average around the timed calls: above ~1 someone else shared the 2 cores.
        f"load_avg_{label}": [round(load_before, 2), round(load_after, 2)],
    }
    progress.tick(
        f"{label}: build_context p50 {out[f'context_p50_ms_{label}']} ms p99 {out[f'context_p99_ms_{label}']} ms; "
        f"search p50 {out[f'search_p50_ms_{label}']} ms p99 {out[f'search_p99_ms_{label}']} ms",
        force=True,
    )
    return out


class PhaseClock:
    """Wall and thread-CPU time of each phase of the build_context calls made while it is `on` (ms per call).

    It wraps, on one reader, the methods each phase runs in: `_send_scripts` and `_script_replies` (reads: the
    first pipeline is sent before the search and its replies read after it, so the wait Redis's work overlapped
    with the search is not in this phase), the searcher's
    `search_result` (search), `_by_ids` (referenced); what the call takes beyond them is `assemble`."""

    def __init__(self, reader: ContextReader) -> None:
        self.calls: list[dict[str, tuple[float, float]]] = []
        self._current: dict[str, list[float]] = {}
        self._wrap(reader, "_send_scripts", "reads")
        self._wrap(reader, "_script_replies", "reads")
        if reader.searcher is not None:
            self._wrap(reader.searcher, "search_result", "search")
        self._wrap(reader, "_by_ids", "referenced")

    def _wrap(self, owner: Any, name: str, phase: str) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t, c = time.perf_counter_ns(), time.thread_time_ns()
            try:
                return inner(*args, **kwargs)
            finally:
                spent = self._current.setdefault(phase, [0.0, 0.0])
                spent[0] += (time.perf_counter_ns() - t) / 1e6
                spent[1] += (time.thread_time_ns() - c) / 1e6

        setattr(owner, name, timed)  # on the instance: the class and every other reader are as they were

    def call(self, build: Callable[[], Any]) -> None:
        self._current = {}
        t, c = time.perf_counter_ns(), time.thread_time_ns()
        build()
        wall, cpu = (time.perf_counter_ns() - t) / 1e6, (time.thread_time_ns() - c) / 1e6
        phases = {p: (w, u) for p, (w, u) in self._current.items()}
        phases["assemble"] = (
            wall - sum(w for w, _ in phases.values()),
            cpu - sum(u for _, u in phases.values()),
        )
        phases["total"] = (wall, cpu)
        self.calls.append(phases)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per phase: p50 and p99 of wall and CPU ms over the calls (0 where a call did not run it), and its share
        of the total wall time."""
        total = sum(c["total"][0] for c in self.calls) or 1.0
        out = {}
        for phase in (*PHASES, "total"):
            wall = sorted(c.get(phase, (0.0, 0.0))[0] for c in self.calls)
            cpu = sorted(c.get(phase, (0.0, 0.0))[1] for c in self.calls)
            out[phase] = {
                "wall_p50_ms": round(percentile(wall, 50), 3),
                "wall_p99_ms": round(percentile(wall, 99), 3),
                "cpu_p50_ms": round(percentile(cpu, 50), 3),
                "cpu_p99_ms": round(percentile(cpu, 99), 3),
                "share": round(sum(wall) / total, 3),
            }
        return out


def measure_phases(reader: ContextReader, calls: int, seed: int, label: str, progress: Progress) -> dict[str, Any]:
    """`calls` build_context calls timed phase by phase (`PhaseClock`), on a reader of their own."""
    progress.tick(f"{label}: timing {calls:,} build_context calls phase by phase", force=True)
    rng = random.Random(seed)
    for task in task_texts(rng, WARMUP_CALLS // 2):  # its own searcher's reads kept warm, as the measured reader's
        reader.build_context(MAIN_PROJECT, rng.choice(AGENTS), task=task, budget_tokens=BUDGET_TOKENS)
    clock = PhaseClock(reader)
    for task in task_texts(rng, calls):
        agent = rng.choice(AGENTS)
        clock.call(lambda a=agent, t=task: reader.build_context(MAIN_PROJECT, a, task=t, budget_tokens=BUDGET_TOKENS))
    return {f"context_phases_{label}": clock.summary()}


def rss_mb(field: str = "VmRSS") -> float | None:
    """This process's resident memory now (`field` of /proc/self/status: VmRSS, or RssFile for the mapped files
    in it), in MiB. Where /proc is not there: VmRSS's peak, and None for any other field."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    if field != "VmRSS":
        return None
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def profile_context(reader: ContextReader, calls: int, seed: int, top: int = 25) -> str:
    """cProfile of `calls` build_context calls: the top functions by cumulative time."""
    rng = random.Random(seed)
    tasks = task_texts(rng, calls)
    profiler = cProfile.Profile()
    profiler.enable()
    for t in tasks:
        reader.build_context(MAIN_PROJECT, rng.choice(AGENTS), task=t, budget_tokens=BUDGET_TOKENS)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


# -- run ----------------------------------------------------------------------------


def optimize(engine: Any, label: str, progress: Progress) -> dict[str, Any]:
    """Run the embedded engine's explicit optimize() over every project, timed; and what it did."""
    progress.tick(f"{label}: engine.optimize() (explicit, blocking)", force=True)
    started = time.perf_counter()
    done = engine.optimize()  # the embedded engine's extra: {project: whether anything was optimized}
    seconds = time.perf_counter() - started
    progress.tick(f"{label}: optimized in {seconds:.2f} s ({done.get(MAIN_PROJECT)} for {MAIN_PROJECT})", force=True)
    return {f"optimize_s_{label}": round(seconds, 3), f"optimize_did_work_{label}": bool(done.get(MAIN_PROJECT))}


def settle(label: str, progress: Progress) -> dict[str, Any]:
    """Write the load's dirty pages back now (`os.sync`, timed), not during the measured calls: the kernel's
    writeback of a bulk load, 5-30 s later, would run beside them and slow the reader's thread."""
    started = time.perf_counter()
    os.sync()
    seconds = time.perf_counter() - started
    progress.tick(f"{label}: file systems synced in {seconds:.2f} s", force=True)
    return {f"settle_s_{label}": round(seconds, 3)}


def run(
    checkpoints: Sequence[int],
    calls: int,
    phase_calls: int,
    seed: int,
    profile: bool,
    progress: Progress,
    *,
    hot_minutes: int = defaults.SEARCH_HOT_MINUTES,
) -> dict[str, Any]:
    """Load, optimize and measure at each checkpoint (minutes of the main project), smallest first; the engine
    with a hot window of `hot_minutes` (0: none)."""
    main_minutes = checkpoints[-1]
    progress.tick(
        f"loading up to {main_minutes:,} minutes of {MAIN_PROJECT} and {len(SIDE_PROJECTS)} side projects", True
    )
    feed = Feed(generate_minutes(main_minutes, seed))
    result: dict[str, Any] = {}
    # A fresh home: the embedded engine and no embedder, none of the caller's environment.
    with workspace("reader") as ws:
        live, connection = ws.settings.with_(search_hot_minutes=hot_minutes), ws.connection
        loader = Loader(live, connection)
        try:
            # The reader `pvm serve` builds: caches, the log, HybridSearch over the process's shared engine.
            searcher = engines.searcher_for(live)
            reader = ContextReader(connection, LogReader(live.log_dir), searcher)  # type: ignore[arg-type]
            engine = engines.shared_engine(live)
            for i, checkpoint in enumerate(checkpoints):
                label = _label(checkpoint)
                load(loader, feed, checkpoint, progress)
                result.update(optimize(engine, label, progress))
                result.update(settle(label, progress))
                gc.collect()
                gc.freeze()  # what the load left is not the reader's garbage
                result.update(measure(reader, calls, seed + i, label, progress))
                if phase_calls:
                    # A reader of its own: the phases' clocks wrap its methods, not the measured reader's.
                    phased = ContextReader(connection, LogReader(live.log_dir), engines.searcher_for(live))  # type: ignore[arg-type]
                    result.update(measure_phases(phased, phase_calls, seed + 100 + i, label, progress))
                result[f"reader_rss_mb_{label}"] = rss_mb()
                result[f"reader_rss_file_mb_{label}"] = rss_mb("RssFile")
                gc.unfreeze()
            if profile:
                result["profile_context"] = profile_context(reader, min(calls, 300), seed + 2)
            hot = getattr(engine, "hot", None)
            result["hot_window_searches"] = dict(hot.searches) if hot is not None else {}
            # The candidates' ranking payloads the engine kept, and how many it was asked for that it had (hits)
            # or read from a shard (misses), over the whole run.
            memo = getattr(engine, "ranking", None)
            result["ranking_payloads"] = (
                {"kept": len(memo), "hits": memo.hits, "misses": memo.misses} if memo is not None else {}
            )
            result["points_main"] = engine.count(MAIN_PROJECT)
            result["points_total"] = sum(engine.count(p) for p in (MAIN_PROJECT, *SIDE_PROJECTS))
            result["machine"] = machine(connection)
            result["home_filesystem"] = home_filesystem(live.home)  # the shards' and the log's: tmpfs hides disk reads
        finally:
            engines.close_shared()
            loader.writer.close()
    t = loader.times
    batches = sorted(t.batches)
    result.update(
        {
            "index_per_s": round(t.minutes / t.seconds),
            # On a busy machine the wall-clock rate measures the neighbours too; CPU time is this process's work.
            "index_per_cpu_s": round(t.minutes / t.cpu_s) if t.cpu_s else None,
            "index_minutes": t.minutes,
            "index_batches": len(batches),
            "index_batch_p50_ms": round(percentile(batches, 50) * 1000, 2),
            "index_batch_p99_ms": round(percentile(batches, 99) * 1000, 2),
            "index_stage_share": {k: round(v / t.seconds, 3) for k, v in t.stages.items()},
            "index_stage_us_per_minute": {k: round(v / t.minutes * 1e6, 1) for k, v in t.stages.items()},
            "log_cache_per_s": round(t.minutes / t.log_cache_s),
            "minutes_main": main_minutes,
            "minutes_total": feed.loaded,
            "checkpoints": list(checkpoints),
        }
    )
    largest = _label(main_minutes)
    result["context_p99_ms_largest"] = result[f"context_p99_ms_{largest}"]
    return result


def _label(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}m"
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def table(result: dict[str, Any]) -> str:
    rows = []
    for label in (_label(n) for n in result["checkpoints"]):
        rows += [
            (f"build_context p50 / p99 @{label}", f"{result[f'context_p50_ms_{label}']} / "
             f"{result[f'context_p99_ms_{label}']} ms", f"context_p99_ms_{label}"),
            (f"search p50 / p99 @{label}", f"{result[f'search_p50_ms_{label}']} / "
             f"{result[f'search_p99_ms_{label}']} ms", f"search_p99_ms_{label}"),
            (f"optimize @{label}", f"{result[f'optimize_s_{label}']} s", ""),
            (f"major page faults a context @{label}", f"{result[f'context_major_faults_{label}']}", ""),
            (f"process memory @{label}", f"{result[f'reader_rss_mb_{label}']:,} MiB "
             f"({result[f'reader_rss_file_mb_{label}']} MiB mapped files)", ""),
        ]  # fmt: skip
        phases = result.get(f"context_phases_{label}")
        if phases:
            rows.append((f"  phases p50 ms @{label}", " ".join(f"{p} {phases[p]['wall_p50_ms']}" for p in PHASES), ""))
    rows.append(("index (1 process)", f"{result['index_per_s']:,} minutes/s", "index_per_s"))
    rows.append(("log + caches", f"{result['log_cache_per_s']:,} minutes/s", ""))
    met = result.get("met", {})
    lines = [f"{'METRIC':<34}{'VALUE':>24}  {'TARGET':<12}RESULT"]
    for name, value, key in rows:
        target = verdict = ""
        if key in TARGETS:
            op, bound = TARGETS[key]
            target = f"{op} {bound:g}"
            verdict = VERDICT_WORDS[met.get(key)]
        lines.append(f"{name:<34}{value:>24}  {target:<12}{verdict}")
    lines += ["", f"{machine_line(result['machine'], server=False)}; {result['elapsed_s']:.0f} s"]
    return "\n".join(lines)


def checkpoint_list(text: str) -> list[int]:
    """`--minutes`: comma-separated sizes of the measured project, each at least 1,000 (``100000,1000000``)."""
    try:
        sizes = sorted({int(part.replace("_", "")) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None
    if not sizes or sizes[0] < 1_000 or sizes[-1] > MAX_MINUTES:
        raise argparse.ArgumentTypeError(f"each size must be 1,000 to {MAX_MINUTES:,}, got {text!r}")
    return sizes


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argument_parser("bench/reader.py", __doc__)
    add_minutes_scale(
        parser, f"multiply the {MAIN_MINUTES:,} minutes of the measured project by X (checkpoints at X/10 and X)"
    )
    parser.add_argument(
        "--minutes",
        type=checkpoint_list,
        metavar="N[,N...]",
        help="measure when the project holds each of these many minutes (e.g. 100000,500000,1000000); "
        "instead of --minutes-scale's two checkpoints",
    )
    parser.add_argument("--calls", type=int, default=CALLS, help="timed calls of each kind (default %(default)s)")
    parser.add_argument(
        "--phase-calls",
        type=int,
        default=PHASE_CALLS,
        help="build_context calls timed phase by phase at each checkpoint, 0 for none (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="add a cProfile of build_context at the last size")
    parser.add_argument(
        "--hot-minutes",
        type=int,
        default=defaults.SEARCH_HOT_MINUTES,
        metavar="N",
        help="the engine's hot window (PVM_SEARCH_HOT_MINUTES): search reads a large project's newest N to 2N "
        "minutes first; 0 measures without it (default %(default)s)",
    )
    args = parse(parser, argv)
    if args.calls < 10:
        parser.error("--calls must be at least 10")
    if args.phase_calls < 0:
        parser.error("--phase-calls must be 0 or more")
    if args.hot_minutes < 0:
        parser.error("--hot-minutes must be 0 (no hot window) or more")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    main_minutes = max(1_000, round(MAIN_MINUTES * args.minutes_scale / 1_000) * 1_000)
    checkpoints = args.minutes or [max(1_000, main_minutes // 10), main_minutes]
    progress = Progress("reader bench", sep=": ")
    started = time.monotonic()
    with measuring("reader bench") as outcome:
        result = run(
            checkpoints, args.calls, args.phase_calls, args.seed, args.profile, progress, hot_minutes=args.hot_minutes
        )
    if outcome.exit_code is not None:
        return outcome.exit_code
    result["config"] = {
        "minutes_scale": None if args.minutes else args.minutes_scale,
        "calls": args.calls,
        "phase_calls": args.phase_calls,
        "warmup_calls": WARMUP_CALLS,
        "batch": BATCH,
        "budget_tokens": BUDGET_TOKENS,
        "search_k": SEARCH_K,
        "side_projects": len(SIDE_PROJECTS),
        "side_share": SIDE_SHARE,
        "engine": "embedded (qdrant-edge), lexical only",
        "search_hot_minutes": args.hot_minutes,
        "index_rate_basis": "minutes / time in index_pool.index_batch (decode, points, agent memory, upsert, head)",
    }
    result["targets"] = target_texts(TARGETS)
    result["met"] = verdicts(result, TARGETS)
    profile = result.pop("profile_context", None)
    if profile:
        say(profile)
    return report(result, started, args.json, table)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Ingest benchmark: emit latency, producer throughput, dispatch+log throughput, emit->durable latency.

Four phases, each on its own temporary PVM_HOME and its own fresh embedded Valkey
(AOF on, appendfsync everysec, as `pvm up` runs it):

1. emit latency     `Emitter.emit()` on pre-built `Minute` objects, timed one call at
                    a time with time.perf_counter_ns, paced at 10,000/s (bursts of
                    ~10 calls, then a ~1 ms sleep), which never fills the buffer.
                    Also reported apart: the first call after each sleep
                    ("after_idle") and the calls within a burst.
                                                        target: p99 <= 20 us
2. producer         minutes/s from the first emit() until flush() has returned and
                    the emitter's sent counter covers every minute (all XADDed);
                    the loop waits while the buffer is over half a shard's
                    capacity, so nothing spills to the spool (stats().spooled_total
                    is reported and must be 0).         target: >= 50,000/s
3. pipeline         minutes pre-loaded into the streams with nothing running, then
                    ONE `pvm dispatch` process and ONE `pvm worker log` process
                    (workers.runtime.stack.Stack) drain them into the durable log. The rate is
                    measured inside the log, excluding process start-up: minutes
                    made durable after the first record's durable_at, divided by
                    (last durable_at - first durable_at). Wall-clock rates from
                    process spawn are reported too, and the CPU each process
                    (dispatcher, log worker, Valkey) used per minute from the
                    last poll before the first durable minute, over all of them
                    (pipeline_cpu_us_per_minute, from /proc): what neighbours on a
                    shared machine cannot steal. On a fast host the dispatcher may
                    have read every entry before the first minute is durable, and
                    then reads 0.
                                                        target: >= 25,000/s with 8
                                                        projects, >= 20,000/s with 64
4. durable latency  the whole stack running (embedded Valkey + 1 dispatcher + 1 log
                    worker); minutes emitted at a fixed offered load of 5,000/s for
                    ~10 s, time.time() recorded per minute id at emit; afterwards
                    every log record is read back and record.durable_at - emit time
                    is taken per id. durable_at is stamped by the log writer just
                    before the batch's write and commit (its one fsync). If the log has not caught up
                    90 s after the last emit, the missing minutes count with a
                    lower bound (time until the log was read) and
                    durable_censored says how many.     target: p99 <= 250 ms

Workload: workers.ops.demo.sample_session minutes (assignments, conflicts, failures, handoffs,
references to recent minutes) over --projects projects (default 2 per shard), interleaved,
with project names chosen so every shard gets the same share. With more projects a log
batch spans more of them: the log makes one fsync per batch whatever their number. All minutes are built before any
phase starts and then moved out of the garbage collector's way (gc.freeze()), as an
agent holds a handful of minutes, not 200,000.
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Run as `python bench/ingest.py`: make the repository root importable for `bench.*`.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import (
    VERDICT_WORDS,
    BenchError,
    Progress,
    add_minutes_scale,
    argument_parser,
    footer,
    measuring,
    parse,
    percentile,
    polls,
    proc_stat,
    report,
    say,
    target_texts,
    temp_home,
    verdicts,
    workspace,
)
from bench.machine import machine
from contracts import Minute, keys
from pvm import defaults
from pvm.config import Settings
from pvm.emitter import Emitter, EmitterStats
from pvm.stores.log import LogReader
from workers.ops.demo import sample_session
from workers.runtime.stack import Stack

PHASES = 4

# Counts at --minutes-scale 1.0.
EMIT_CALLS = 50_000
EMIT_RATE = 10_000  # phase 1 pacing, minutes/s
PRODUCER_MINUTES = 200_000
PIPELINE_MINUTES = 100_000
DURABLE_RATE = 5_000  # phase 4 offered load, minutes/s
DURABLE_SECONDS = 10.0
DURABLE_DRAIN_S = 90.0  # how long phase 4 waits, after the last emit, for the log to catch up
PROJECTS_PER_SHARD = 2
WARMUP_MINUTES = 2_000
MIN_COUNT = 500

TARGETS: dict[str, tuple[str, float, str]] = {
    "emit_p99_us": ("<=", 20, "us"),
    "producer_per_s": (">=", 50_000, "/s"),
    "pipeline_per_s": (">=", 25_000, "/s"),
    "durable_p99_ms": ("<=", 250, "ms"),
}
# Issue 14: dispatch + log at 1 + 1 processes, >= 25,000/s with 8 projects, >= 20,000/s with 64 (or more).
PIPELINE_TARGET_MANY_PROJECTS = (64, 20_000)


def targets_for(projects: int) -> dict[str, tuple[str, float, str]]:
    """The targets of a run over `projects` projects (the pipeline's depends on how many)."""
    many, bound = PIPELINE_TARGET_MANY_PROJECTS
    return TARGETS | ({"pipeline_per_s": (">=", bound, "/s")} if projects >= many else {})


# -- helpers ----------------------------------------------------------------------


def scaled(base: float, scale: float, minimum: int = MIN_COUNT) -> int:
    return max(minimum, round(base * scale))


def pick_projects(shards: int, count: int | None = None) -> list[str]:
    """`count` project ids (default 2 per shard) spread evenly over the shards (the shard is a hash of the id)."""
    count = shards * PROJECTS_PER_SHARD if count is None else count
    quota = [count // shards + (1 if s < count % shards else 0) for s in range(shards)]
    chosen: list[str] = []
    taken = [0] * shards
    k = 0
    while len(chosen) < count:
        name = f"bench-{k:03d}"
        shard = keys.shard_of(name, shards)
        if taken[shard] < quota[shard]:
            chosen.append(name)
            taken[shard] += 1
        k += 1
    return chosen


def build_minutes(projects: Sequence[str], n: int) -> list[Minute]:
    """`n` realistic minutes over `projects`, interleaved round-robin."""
    per = math.ceil(n / len(projects))
    sessions = [list(sample_session(p, per, seed=i + 1)) for i, p in enumerate(projects)]
    out: list[Minute] = []
    for j in range(per):
        for session in sessions:
            out.append(session[j])
    return out[:n]


@contextmanager
def running_stack(settings: Settings) -> Iterator[Stack]:
    """workers.runtime.stack.Stack with one dispatcher and one log worker process (and Valkey when settings has no URL).

    The ingest half only: no fan-out to the index pool and no reader API, so the
    figures are dispatch + log as issue 2 defines them (bench/reader.py and
    bench/scaling.py measure the index pool).
    """
    stack = Stack(settings.with_(downstream=()), processes={"log": 1}, dispatchers=1, api_port=None)
    try:
        stack.start()
        yield stack
    finally:
        server = stack.redis
        try:
            stack.stop(timeout=20)
        finally:
            if server is not None:
                server.server.terminate()


def check_children(stack: Stack) -> None:
    for name, child in stack.children.items():
        code = child.poll()
        if code is not None:
            raise BenchError(f"{name} (pid {child.pid}) exited with {code}")


def log_total(reader: LogReader, projects: Sequence[str]) -> int:
    return sum(reader.count(p) for p in projects)


def wait_durable(
    reader: LogReader,
    projects: Sequence[str],
    target: int,
    stack: Stack,
    timeout: float,
    progress: Progress,
    strict: bool = True,
) -> bool:
    """Poll the log until it holds `target` minutes of `projects`.

    Returns True when it does; after `timeout` raises BenchError, or returns False when not `strict`.
    """
    for _ in polls(timeout, 0.1, alive=lambda: check_children(stack)):
        done = log_total(reader, projects)
        if done >= target:
            progress.tick(f"{done:,}/{target:,} durable", force=True)
            return True
        progress.tick(f"{done:,}/{target:,} durable")
    if strict:
        raise BenchError(f"only {done:,}/{target:,} minutes durable after {timeout:.0f} s")
    progress.tick(f"giving up after {timeout:.0f} s with {done:,}/{target:,} durable", force=True)
    return False


def emit_with_backpressure(emitter: Emitter, minutes: Sequence[Minute], progress: Progress, verb: str) -> int:
    """Emit as fast as possible, pausing while the buffer is over half a shard's capacity; returns pauses."""
    high = max(1_000, emitter.buffer_size // emitter.shards // 2)
    low = high // 2
    pauses = 0
    n = len(minutes)
    emit = emitter.emit
    for i, minute in enumerate(minutes):
        emit(minute)
        if i & 1023 == 1023:
            if emitter.stats().buffered > high:
                pauses += 1
                while emitter.stats().buffered > low:
                    time.sleep(0.0005)
            progress.tick(f"{i + 1:,}/{n:,} {verb}")
    return pauses


def warm_up(emitter: Emitter) -> None:
    """Send a few thousand minutes of another project first (connection, code paths, Valkey allocations)."""
    zero = emitter.stats()
    for m in sample_session("bench-warmup", WARMUP_MINUTES, seed=99):
        emitter.emit(m)
    emitter.flush(30)
    settle(emitter, zero, WARMUP_MINUTES)


def settle(emitter: Emitter, base: EmitterStats, n: int, timeout: float = 30.0) -> int:
    """Wait until `n` minutes past `base` are sent or spooled; returns how many were not yet.

    `stats().spooled` is what the spool holds now (a replayed minute moves to `sent`), so
    the difference below counts what is still buffered or in flight. Once `flush()` has
    returned True it is 0.
    """

    def outstanding() -> int:
        stats = emitter.stats()
        return n - (stats.sent - base.sent) - (stats.spooled - base.spooled) - (stats.dropped - base.dropped)

    behind = outstanding()
    for _ in polls(timeout, 0.0002):
        if outstanding() <= 0:
            return max(0, behind)
    raise BenchError(f"emitter: {outstanding():,} minutes neither sent nor spooled after {timeout:.0f} s")


def preload(settings: Settings, minutes: Sequence[Minute], progress: Progress, stage: str, verb: str) -> None:
    """Emit `minutes` into the shard streams (with back-pressure) and check every one is there."""
    n = len(minutes)
    with Emitter(settings=settings) as emitter:
        base = emitter.stats()
        emit_with_backpressure(emitter, minutes, progress, verb)
        if not emitter.flush(120):
            raise BenchError(f"{stage}: the pre-load did not flush")
        settle(emitter, base, n)
        loaded = sum(int(emitter.connection.xlen(s)) for s in emitter.streams)
    if loaded != n:
        raise BenchError(f"{stage}: {loaded:,} entries in the streams, expected {n:,}")


@contextmanager
def warm_emitter(name: str, shards: int) -> Iterator[tuple[Emitter, EmitterStats]]:
    """An emitter on a fresh workspace, warmed up, and its stats when the measurement starts."""
    with workspace(name, shards) as ws:
        emitter = Emitter(settings=ws.settings)
        try:
            warm_up(emitter)
            base = emitter.stats()
            gc.collect()
            yield emitter, base
        finally:
            emitter.close()


def read_log(reader: LogReader, projects: Sequence[str]) -> tuple[list[tuple[str, float]], int]:
    """(minute id, durable_at) of every record of `projects`, and how many ids appear more than once."""
    records: list[tuple[str, float]] = []
    for project in projects:
        records.extend((r.id, r.durable_at) for r in reader.history(project))
    duplicates = len(records) - len({i for i, _ in records})
    return records, duplicates


# -- phases ---------------------------------------------------------------------------


def phase_emit(minutes: Sequence[Minute], shards: int, progress: Progress) -> tuple[dict[str, Any], dict[str, Any]]:
    n = len(minutes)
    progress.start(f"phase 1/{PHASES}: emit latency", f"{n:,} emit() calls paced at {EMIT_RATE:,}/s, one fresh Valkey")
    with warm_emitter("emit", shards) as (emitter, base):
        latencies = [0] * n
        after_wait = [False] * n
        clock = time.perf_counter_ns
        interval = 1e9 / EMIT_RATE
        emit = emitter.emit
        start = clock()
        for i, minute in enumerate(minutes):
            ahead = start + int(i * interval) - clock()
            if ahead >= 1_000_000:  # sleep in ~1 ms steps, outside the timed region
                time.sleep(ahead / 1e9)
                after_wait[i] = True
            t = clock()
            emit(minute)
            latencies[i] = clock() - t
            if i & 4095 == 4095:
                progress.tick(f"{i + 1:,}/{n:,} emitted")
        elapsed = (clock() - start) / 1e9
        flushed = emitter.flush(60)
        settle(emitter, base, n)
        stats = emitter.stats()
        box = machine(emitter.connection)
    first = sorted(v / 1000 for v, w in zip(latencies, after_wait, strict=True) if w)
    rest = sorted(v / 1000 for v, w in zip(latencies, after_wait, strict=True) if not w)
    latencies.sort()
    us = [v / 1000 for v in latencies]
    progress.tick(f"p50 {percentile(us, 50):.1f} us, p99 {percentile(us, 99):.1f} us", force=True)
    return {
        "emit_p50_us": round(percentile(us, 50), 2),
        "emit_p90_us": round(percentile(us, 90), 2),
        "emit_p99_us": round(percentile(us, 99), 2),
        "emit_p999_us": round(percentile(us, 99.9), 2),
        "emit_max_us": round(us[-1], 2),
        "emit_mean_us": round(sum(us) / n, 2),
        "emit_calls": n,
        # The first call after a pacing sleep (cold caches, the flusher woken alongside) vs. calls within a burst.
        "emit_after_idle_calls": len(first),
        "emit_after_idle_p50_us": round(percentile(first, 50), 2) if first else None,
        "emit_after_idle_p99_us": round(percentile(first, 99), 2) if first else None,
        "emit_in_burst_p50_us": round(percentile(rest, 50), 2) if rest else None,
        "emit_in_burst_p99_us": round(percentile(rest, 99), 2) if rest else None,
        "emit_paced_per_s": round(n / elapsed),
        "emit_flushed": flushed,
        "emit_spooled": stats.spooled_total - base.spooled_total,
        "emit_sent": stats.sent - base.sent,
    }, box


def phase_producer(minutes: Sequence[Minute], shards: int, progress: Progress) -> dict[str, Any]:
    n = len(minutes)
    progress.start(f"phase 2/{PHASES}: producer", f"{n:,} minutes emitted flat out, timed until flush() returns")
    with warm_emitter("producer", shards) as (emitter, base):
        start = time.perf_counter()
        pauses = emit_with_backpressure(emitter, minutes, progress, "emitted")
        emitted_at = time.perf_counter()
        flushed = emitter.flush(120)
        behind = settle(emitter, base, n)
        done = time.perf_counter()
        stats = emitter.stats()
        in_streams = sum(int(emitter.connection.xlen(s)) for s in emitter.streams) - base.sent
    sent = stats.sent - base.sent
    spooled = stats.spooled_total - base.spooled_total
    rate = n / (done - start)
    progress.tick(f"{rate:,.0f} minutes/s; sent {sent:,}, spooled {spooled:,}, in streams {in_streams:,}", force=True)
    if not flushed or sent != n or in_streams != n:
        raise BenchError(f"producer: flushed={flushed}, sent {sent:,}, in streams {in_streams:,}, expected {n:,}")
    return {
        "producer_per_s": round(rate),
        "producer_emit_loop_per_s": round(n / (emitted_at - start)),
        "producer_minutes": n,
        "producer_sent": sent,
        "producer_spooled": spooled,
        "producer_dropped": stats.dropped - base.dropped,
        "producer_backpressure_pauses": pauses,
        "producer_unsent_when_flush_returned": behind,
        "producer_seconds": round(done - start, 3),
    }


def cpu_seconds_of(pid: int) -> float | None:
    stat = proc_stat(pid)
    return stat[1] if stat is not None else None


def pipeline_processes(stack: Stack, connection: Any) -> dict[str, int]:
    """The processes that do the pipeline's work, by role: dispatcher, log worker and Valkey."""
    pids = {"dispatcher": stack.children["dispatcher-0"].pid, "log_worker": stack.children["worker-log"].pid}
    valkey = connection.info("server").get("process_id")
    if isinstance(valkey, int):
        pids["valkey"] = valkey
    return pids


def phase_pipeline(minutes: Sequence[Minute], shards: int, progress: Progress) -> dict[str, Any]:
    n = len(minutes)
    projects = sorted(Counter(m.project_id for m in minutes))
    progress.start(f"phase 3/{PHASES}: pipeline", f"{n:,} minutes pre-loaded, then 1 dispatcher + 1 log worker process")
    with workspace("pipeline", shards) as ws:
        live = ws.settings
        preload(live, minutes, progress, "pipeline", "pre-loaded")
        progress.tick(f"{n:,} minutes in {shards} streams; starting dispatcher + log worker", force=True)
        reader = LogReader(live.log_dir)
        with running_stack(live) as stack:
            spawned = time.time()
            first_seen: float | None = None
            pids = pipeline_processes(stack, ws.connection)
            # CPU is read at every poll until the first minute is durable, and the last reading before it is the
            # baseline: on a fast host all of them can be durable by the first poll that sees any (5,000 took
            # ~125 ms on an AMD EPYC host). Polls are 5 ms apart until then, so the baseline holds at most 5 ms of
            # the processes' start-up; every minute counts.
            cpu_before = {role: cpu_seconds_of(pid) for role, pid in pids.items()}
            for _ in polls(max(60.0, n / 1_000), 0.005, alive=lambda: check_children(stack)):
                done = log_total(reader, projects)
                now = time.time()
                if not done:
                    cpu_before = {role: cpu_seconds_of(pid) for role, pid in pids.items()}
                    continue
                if first_seen is None:
                    first_seen = now
                if done >= n:
                    cpu_after = {role: cpu_seconds_of(pid) for role, pid in pids.items()}
                    break
                progress.tick(f"{done:,}/{n:,} durable")
                time.sleep(0.095)
            else:
                raise BenchError(f"pipeline: only {done:,}/{n:,} minutes durable in time")
            finished = time.time()
            progress.tick(f"{done:,}/{n:,} durable; stopping processes", force=True)
        records, duplicates = read_log(reader, projects)
    if len(records) != n or duplicates:
        raise BenchError(f"pipeline: the log holds {len(records):,} records ({duplicates} duplicates), expected {n:,}")
    stamps = sorted(at for _, at in records)
    first, last = stamps[0], stamps[-1]
    after_first = sum(1 for at in stamps if at > first)
    rate = after_first / (last - first) if last > first else math.nan
    assert first_seen is not None
    progress.tick(f"{rate:,.0f} minutes/s between the first and last durable_at", force=True)
    # CPU per minute by process, from just before the first durable minute: what a shared machine cannot steal.
    cpu_us: dict[str, float | None] = {}
    for role in pids:
        before, after = cpu_before.get(role), cpu_after.get(role)
        cpu_us[role] = round((after - before) / n * 1e6, 1) if before is not None and after is not None else None
    return {
        "pipeline_cpu_us_per_minute": cpu_us,
        "pipeline_per_s": round(rate),
        "pipeline_minutes": n,
        "pipeline_durable_span_s": round(last - first, 3),
        "pipeline_startup_s": round(first - spawned, 3),
        "pipeline_wall_per_s": round(n / (finished - spawned)),
        "pipeline_observed_per_s": round(n / (finished - first_seen)) if finished > first_seen else None,
        "pipeline_appends": len(set(stamps)),
    }


def phase_durable(minutes: Sequence[Minute], shards: int, scale: float, progress: Progress) -> dict[str, Any]:
    n = len(minutes)
    projects = sorted(Counter(m.project_id for m in minutes))
    progress.start(
        f"phase 4/{PHASES}: durable latency",
        f"{n:,} minutes offered at {DURABLE_RATE:,}/s to the running stack (1+1 processes)",
    )
    emitted_at: dict[str, float] = {}
    with temp_home("durable", shards) as settings:
        with running_stack(settings) as stack:
            live = stack.settings
            reader = LogReader(live.log_dir)
            emitter = Emitter(settings=live)
            try:
                warm = list(sample_session("bench-warmup", 200, seed=99))
                for m in warm:
                    emitter.emit(m)
                progress.tick("waiting for the stack to make a warm-up batch durable", force=True)
                wait_durable(reader, ["bench-warmup"], len(warm), stack, 60.0, progress)
                gc.collect()
                clock = time.perf_counter
                wall = time.time
                emit = emitter.emit
                interval = 1 / DURABLE_RATE
                start = clock()
                for i, minute in enumerate(minutes):
                    ahead = start + i * interval - clock()
                    if ahead >= 0.001:
                        time.sleep(ahead)
                    emitted_at[minute.id] = wall()
                    emit(minute)
                    if i & 1023 == 1023:
                        progress.tick(f"{i + 1:,}/{n:,} emitted, {log_total(reader, projects):,} durable")
                offered_for = clock() - start
                emitter.flush(60)
                drain = max(30.0, DURABLE_DRAIN_S * scale)
                complete = wait_durable(reader, projects, n, stack, drain, progress, strict=False)
                stats = emitter.stats()
            finally:
                emitter.close()
        records, duplicates = read_log(reader, projects)
        read_at = time.time()
    if duplicates or len(records) > n:
        raise BenchError(f"durable: the log holds {len(records):,} records ({duplicates} duplicates) for {n:,} minutes")
    durable_at = dict(records)
    ms = [(at - emitted_at[i]) * 1000 for i, at in records]
    # Minutes the log did not hold when we gave up count with a lower bound: the time until the log was read.
    censored = [(read_at - t) * 1000 for i, t in emitted_at.items() if i not in durable_at]
    ms = sorted(ms + censored)
    if censored:
        progress.tick(f"{len(censored):,} minutes not durable; their latency counts as >= time to read", force=True)
    progress.tick(f"p50 {percentile(ms, 50):.1f} ms, p99 {percentile(ms, 99):.1f} ms", force=True)
    return {
        "durable_p50_ms": round(percentile(ms, 50), 2),
        "durable_p90_ms": round(percentile(ms, 90), 2),
        "durable_p99_ms": round(percentile(ms, 99), 2),
        "durable_max_ms": round(ms[-1], 2),
        "durable_mean_ms": round(sum(ms) / len(ms), 2),
        "durable_minutes": n,
        "durable_complete": complete and not censored,
        "durable_censored": len(censored),
        "durable_drain_wait_s": drain,
        # Distinct durable_at stamps: one per commit (one per log job, two when another writer held some of
        # its projects), so minutes/append shows the batch sizes.
        "durable_log_appends": len({at for _, at in records}),
        "offered_per_s": round(n / offered_for),
        "offered_target_per_s": DURABLE_RATE,
        "offered_seconds": round(offered_for, 3),
        "durable_spooled": stats.spooled_total,
    }


# -- report ---------------------------------------------------------------------------


def table(result: dict[str, Any]) -> str:
    rows = [
        ("emit p50", f"{result['emit_p50_us']:.1f} us", ""),
        ("emit p99", f"{result['emit_p99_us']:.1f} us", "emit_p99_us"),
        ("emit p99 after idle/burst", f"{result['emit_after_idle_p99_us']} / {result['emit_in_burst_p99_us']} us", ""),
        ("emit p99.9 / max", f"{result['emit_p999_us']:.1f} / {result['emit_max_us']:.0f} us", ""),
        ("producer", f"{result['producer_per_s']:,} minutes/s", "producer_per_s"),
        ("producer spooled", f"{result['producer_spooled']:,}", ""),
        ("pipeline (1+1 processes)", f"{result['pipeline_per_s']:,} minutes/s", "pipeline_per_s"),
        ("pipeline incl. start-up", f"{result['pipeline_wall_per_s']:,} minutes/s", ""),
        (
            "pipeline CPU us/minute",
            " / ".join(f"{v if v is not None else '?'}" for v in result["pipeline_cpu_us_per_minute"].values()),
            "",
        ),
        ("durable p50", f"{result['durable_p50_ms']:.1f} ms", ""),
        ("durable p99", f"{result['durable_p99_ms']:.1f} ms", "durable_p99_ms"),
        ("durable max", f"{result['durable_max_ms']:.1f} ms", ""),
        ("durable log appends", f"{result['durable_log_appends']:,} ({result['durable_censored']:,} censored)", ""),
        ("offered load", f"{result['offered_per_s']:,} minutes/s", ""),
    ]
    met = result["met"]
    lines = [f"{'METRIC':<28}{'VALUE':>22}  {'TARGET':<16}RESULT"]
    for label, value, key in rows:
        target = verdict = ""
        if key:
            op, bound, unit = targets_for(result["config"]["projects"])[key]
            target = f"{op} {bound:,} {unit}"
            verdict = VERDICT_WORDS[met[key]]
        lines.append(f"{label:<28}{value:>22}  {target:<16}{verdict}")
    config = result["config"]
    lines += [
        "",
        footer(result, f"shards {config['shards']}, projects {config['projects']}, scale {config['minutes_scale']}"),
    ]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argument_parser(
        "bench/ingest.py",
        __doc__,
        epilog=(
            f"Counts at scale 1.0: {EMIT_CALLS:,} emit calls, {PRODUCER_MINUTES:,} producer minutes, "
            f"{PIPELINE_MINUTES:,} pipeline minutes, {DURABLE_RATE:,}/s for {DURABLE_SECONDS:.0f} s. "
            "Progress goes to stderr; the result (a JSON object with --json) to stdout. "
            "Exit status 0 when every phase measured (targets missed or not), 1 when a phase failed, 130 on Ctrl-C."
        ),
    )
    add_minutes_scale(
        parser, "multiply every count (and the phase-4 duration) by X, e.g. 0.1 for a quick run (default 1.0)"
    )
    parser.add_argument("--shards", type=int, default=defaults.SHARDS, help="stream shards (default %(default)s)")
    parser.add_argument(
        "--projects",
        type=int,
        default=None,
        help=f"projects the minutes are spread over, evenly across the shards (default {PROJECTS_PER_SHARD} per shard)",
    )
    args = parse(parser, argv)
    if args.shards < 1:
        parser.error("--shards must be at least 1")
    if args.projects is not None and args.projects < 1:
        parser.error("--projects must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    scale, shards = args.minutes_scale, args.shards
    emit_calls = scaled(EMIT_CALLS, scale)
    producer_minutes = scaled(PRODUCER_MINUTES, scale)
    pipeline_minutes = scaled(PIPELINE_MINUTES, scale)
    durable_seconds = max(1.0, DURABLE_SECONDS * scale)
    durable_minutes = round(DURABLE_RATE * durable_seconds)
    progress = Progress()
    started = time.monotonic()
    with measuring("bench", "interrupted; processes and Valkey stopped") as outcome:
        projects = pick_projects(shards, args.projects)
        total = max(emit_calls, producer_minutes, pipeline_minutes, durable_minutes)
        say(f"bench: building {total:,} sample minutes over {len(projects)} projects ({shards} shards)")
        # Phases run on separate Redis servers and logs, so they share the pre-built minutes.
        minutes = build_minutes(projects, total)
        gc.collect()
        gc.freeze()
        result: dict[str, Any] = {}
        emit_result, box = phase_emit(minutes[:emit_calls], shards, progress)
        result.update(emit_result)
        result.update(phase_producer(minutes[:producer_minutes], shards, progress))
        result.update(phase_pipeline(minutes[:pipeline_minutes], shards, progress))
        result.update(phase_durable(minutes[:durable_minutes], shards, scale, progress))
    if outcome.exit_code is not None:
        return outcome.exit_code
    result["counts"] = {
        "emit_calls": emit_calls,
        "producer_minutes": producer_minutes,
        "pipeline_minutes": pipeline_minutes,
        "durable_minutes": durable_minutes,
    }
    result["config"] = {
        "minutes_scale": scale,
        "shards": shards,
        "projects": len(projects),
        "emit_paced_rate_per_s": EMIT_RATE,
        "durable_offered_rate_per_s": DURABLE_RATE,
        "dispatch_batch": defaults.DISPATCH_BATCH_SIZE,
        "emit_batch": defaults.EMIT_BATCH_SIZE,
        "pipeline_rate_basis": "minutes durable after the first record's durable_at / (last durable_at - first)",
        "durable_latency_basis": "log record durable_at (stamped before the batch's write and commit) - emit time",
    }
    result["targets"] = target_texts(targets_for(len(projects)))
    result["met"] = verdicts(result, targets_for(len(projects)))
    return report(result, started, args.json, table, box)


if __name__ == "__main__":
    sys.exit(main())

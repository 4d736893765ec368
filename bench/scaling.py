#!/usr/bin/env python
"""Scaling benchmark: minutes/s of the dispatcher and of each pool at 1 and 2 processes.

Every (stage, processes) run gets a fresh temporary PVM_HOME and a fresh embedded
Valkey (AOF on, appendfsync everysec, as `pvm up` runs it). The stage's processes
are started with the real CLI and left to go idle (start-up is not measured); then
the whole backlog is released at once and the drain is timed from the first to
the last completed minute: minutes completed after the first completion, divided
by (last completion - first completion).

dispatch  4N minutes (--dispatch-minutes; N drains in about 2 s) are emitted into
          the shard streams (pvm.emit), given the consumer group and parked under
          another key. `pvm dispatch` x P start (distinct consumer names, no log
          worker) and block on the empty streams; one MULTI/EXEC renames the
          parked streams back, which wakes their XREADGROUPs. Completion = each
          log job's enqueued_at (the dispatcher stores a job and acknowledges its
          entries in one MULTI/EXEC).
log       pvm-log is filled, in one MULTI/EXEC once `pvm worker log --processes P`
          is idle, with N minutes in jobs made the way the dispatcher makes them:
          `workers.log.pool.run([[entry_id, minute_bytes], ...])`, DISPATCH_BATCH_SIZE minutes of
          all projects each (--batch), Queue.prepare_data + enqueue_many.
          Completion = the log records' durable_at (stamped by the log writer
          just before a batch's write and commit). The pool fans out to pvm-index as
          in production (PVM_DOWNSTREAM=index); nothing drains that queue.
index     N minutes are appended to the log first (workers.log.pool.process, the
          log pool's core, in this process), and pvm-index is filled with the jobs
          the log pool's fan-out makes from each log batch (FANOUT_BATCH_SIZE each):
          `workers.index.pool.run([[minute_id, seq, minute_bytes], ...])`.
          `pvm worker index --processes P` indexes them into the embedded engine
          (no embedding model: lexical vectors; `pvm serve` runs the same worker
          loop when it owns the embedded engine). Completion = the jobs' ended_at.
          The embedded engine's directory belongs to one process, so P > 1 needs
          a Qdrant server: with PVM_QDRANT_URL set, index runs at every P against
          it (the bench projects are deleted from it first); without, at 1 only,
          and the result says why the rest is not measured.

Each (stage, P) runs --repeats times, interleaved (1, 2, 1, 2, ...), and the run
with the median rate is reported with every repeat's rate. The machine has to be
quiet: before each run the script waits (up to --quiet-wait s) for other
processes to use under --quiet-cores cores, and runs again (up to --attempts)
a run during which they used more.

Also reported per run: the "steady" rate over the window in which every process
had finished a batch and none had finished its last (skew of start and tail
left out; equal to the main rate at 1 process), the rate from the release, batch
durations, how the batches were shared between processes, and the CPU each
part used during the drain (in cores: workers, Valkey, this script, and the rest
of the machine, from /proc), which is what explains a speed-up below 2x on a
2-core machine. The results are checked: the log holds every minute once, the
index holds a point per minute and the index heads reached the log heads, the
streams have nothing pending.

Workload: workers.ops.demo.sample_session minutes over 2 projects per shard, interleaved
(bench/ingest.py's workload). Progress goes to stderr; a table (or --json) to stdout.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Run as `python bench/scaling.py`: make the repository root importable for `bench.*`.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis
from rq import Queue, Retry, Worker
from rq.job import Job, JobStatus

from bench.harness import (
    BenchError,
    CliProcesses,
    ProcessDied,
    Progress,
    Workspace,
    argument_parser,
    footer,
    machine_busy,
    measuring,
    parse,
    percentile,
    polls,
    process_table,
    report,
    running,
    say,
    tree_cpu,
    workspace,
)
from bench.ingest import build_minutes, pick_projects, preload
from bench.machine import machine
from contracts import Minute, encode_minute, keys
from pvm import defaults
from pvm.config import Settings
from pvm.stores.log import LogReader, LogWriter
from workers.log import pool as log_pool
from workers.runtime.queues import pool_queue
from workers.runtime.serializers import MsgpackSerializer

STAGES = ("dispatch", "log", "index")
MINUTES = 60_000
BATCH = defaults.DISPATCH_BATCH_SIZE
PROCESSES = (1, 2)
REPEATS = 3
ATTEMPTS = 3
QUIET_CORES = 0.25  # other processes' CPU (cores) above which a run counts as disturbed
QUIET_WAIT_S = 180.0
READY_TIMEOUT_S = 60.0
POLL_S = 0.05
PARKED_SUFFIX = ":bench-parked"

INDEX_NEEDS_SERVER_SHORT = "needs a Qdrant server (PVM_QDRANT_URL); none can run here"
INDEX_NEEDS_SERVER = (
    "not measured: the embedded vector engine's directory is locked by the one process that opens it "
    "(pvm/vectors/edge.py), so a second index worker cannot open it; more than one index process needs a "
    "Qdrant server (PVM_QDRANT_URL), and none can run here (no Debian package, no server binary on PyPI, "
    "no container runtime)"
)


# -- CPU accounting from /proc ------------------------------------------------------------


KTHREADD_PID = 2  # parent of every kernel thread (jbd2, kworker, ...): fsync work shows up there


def _kernel_cpu(table: dict[int, tuple[int, float]], interrupts: float) -> float:
    return tree_cpu(table, [KTHREADD_PID]) + interrupts


@dataclass
class CpuSnapshot:
    at: float
    machine: float
    kernel: float
    workers: float
    valkey: float
    bench: float


def cpu_snapshot(procs: CliProcesses, valkey_pid: int) -> CpuSnapshot:
    table = process_table()
    own = os.times()
    busy, interrupts = machine_busy()
    return CpuSnapshot(
        at=time.monotonic(),
        machine=busy,
        kernel=_kernel_cpu(table, interrupts),
        workers=tree_cpu(table, [c.pid for c in procs.children]),
        valkey=table.get(valkey_pid, (0, 0.0))[1],
        bench=own.user + own.system,
    )


def cpu_cores(a: CpuSnapshot, b: CpuSnapshot) -> dict[str, float]:
    """Average cores busy between two snapshots, per part.

    `kernel` is kernel threads and interrupts (journal commits, block I/O for
    the fsyncs); `other` is what is left of the machine's busy time: other
    users' processes.
    """
    wall = max(1e-9, b.at - a.at)
    parts = {
        "workers": (b.workers - a.workers) / wall,
        "valkey": (b.valkey - a.valkey) / wall,
        "bench": (b.bench - a.bench) / wall,
        "kernel": (b.kernel - a.kernel) / wall,
        "machine": (b.machine - a.machine) / wall,
    }
    ours = parts["workers"] + parts["valkey"] + parts["bench"] + parts["kernel"]
    parts["other"] = max(0.0, parts["machine"] - ours)
    return {k: round(v, 2) for k, v in parts.items()}


def cpu_per_minute(a: CpuSnapshot, b: CpuSnapshot, minutes: int) -> dict[str, float]:
    """CPU microseconds per minute processed, of the processes under test and of Valkey."""
    return {
        "workers": round((b.workers - a.workers) / minutes * 1e6, 1),
        "valkey": round((b.valkey - a.valkey) / minutes * 1e6, 1),
    }


# -- rates ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Done:
    """One completion: `minutes` finished at `at` (Unix time), by `worker` when known."""

    at: float
    minutes: int
    worker: str = ""
    seconds: float | None = None  # how long the batch ran, when known


def span_rate(events: Sequence[Done]) -> tuple[float, float, float]:
    """(minutes/s, first, last): minutes completed after the first completion / (last - first)."""
    ordered = sorted(events, key=lambda e: e.at)
    first, last = ordered[0].at, ordered[-1].at
    after = sum(e.minutes for e in ordered if e.at > first)
    return (after / (last - first) if last > first else math.nan), first, last


def steady_rate(events: Sequence[Done]) -> tuple[float | None, float]:
    """Minutes/s while every worker was busy: from the latest first completion to the earliest last one.

    Returns (rate, window seconds); the rate is None when the window is empty or
    the completions do not say which worker made them.
    """
    by_worker: dict[str, list[float]] = defaultdict(list)
    for e in events:
        by_worker[e.worker].append(e.at)
    if "" in by_worker:
        return None, 0.0
    start = max(min(ts) for ts in by_worker.values())
    end = min(max(ts) for ts in by_worker.values())
    if end <= start:
        return None, 0.0
    minutes = sum(e.minutes for e in events if start < e.at <= end)
    return minutes / (end - start), end - start


def _ts(value: Any) -> float:
    return value.timestamp()


def fetch_jobs(connection: redis.Redis, ids: Sequence[str]) -> list[Job]:
    jobs: list[Job] = []
    for i in range(0, len(ids), 200):
        chunk = Job.fetch_many(ids[i : i + 200], connection=connection, serializer=MsgpackSerializer)
        missing = [j for j, job in zip(ids[i : i + 200], chunk, strict=True) if job is None]
        if missing:
            raise BenchError(f"{len(missing)} jobs vanished from Redis, e.g. {missing[0]}")
        jobs.extend(job for job in chunk if job is not None)
    return jobs


def finished_events(connection: redis.Redis, minutes_by_job: dict[str, int]) -> list[Done]:
    """Completions of the jobs we enqueued, from their RQ hashes (ended_at, started_at, worker_name)."""
    # A pool counts its minutes inside the job; RQ marks the job finished a moment later.
    for _ in polls(30.0, 0.05):
        jobs = fetch_jobs(connection, list(minutes_by_job))
        statuses = Counter(job.get_status(refresh=False) for job in jobs)
        unfinished = {str(s): c for s, c in statuses.items() if s != JobStatus.FINISHED}
        if not unfinished:
            break
    else:
        raise BenchError(f"jobs not finished: {unfinished}")
    events = []
    for job in jobs:
        assert job.ended_at is not None and job.started_at is not None
        events.append(
            Done(
                at=_ts(job.ended_at),
                minutes=minutes_by_job[job.id],
                worker=job.worker_name or "",
                seconds=_ts(job.ended_at) - _ts(job.started_at),
            )
        )
    return events


def summarize(
    stage: str,
    processes: int,
    n: int,
    events: Sequence[Done],
    released: float,
    basis: str,
    job_events: Sequence[Done] | None = None,
) -> dict[str, Any]:
    """The figures of one run. `events` time the main rate; `job_events` (default `events`) the per-job figures."""
    jobs = list(job_events if job_events is not None else events)
    rate, first, last = span_rate(events)
    steady, window = steady_rate(jobs)
    out: dict[str, Any] = {
        "stage": stage,
        "processes": processes,
        "minutes": n,
        "per_s": round(rate),
        "basis": basis,
        "span_s": round(last - first, 3),
        "first_done_after_release_s": round(first - released, 3),
        "from_release_per_s": round(n / (last - released)) if last > released else None,
        "steady_per_s": round(steady) if steady is not None else None,
        "steady_window_s": round(window, 3),
        "jobs": len(jobs),
        "minutes_per_job_mean": round(sum(e.minutes for e in jobs) / len(jobs), 1),
        "minutes_per_job_max": max(e.minutes for e in jobs),
    }
    durations = sorted(e.seconds for e in jobs if e.seconds is not None)
    if durations:
        out["job_seconds_p50"] = round(percentile(durations, 50), 4)
        out["job_seconds_p90"] = round(percentile(durations, 90), 4)
        out["job_seconds_mean"] = round(sum(durations) / len(durations), 4)
    workers: Counter[str] = Counter()
    for e in jobs:
        if e.worker:
            workers[e.worker] += e.minutes
    if workers:
        out["minutes_per_process"] = sorted(workers.values(), reverse=True)
    return out


# -- waiting --------------------------------------------------------------------------------


def wait_idle_workers(connection: redis.Redis, queue: Queue, n: int, procs: CliProcesses) -> float:
    """Wait until `n` RQ workers of `queue` are registered and idle (waiting for a job); returns seconds waited."""
    started = time.monotonic()
    for _ in polls(READY_TIMEOUT_S, 0.05, alive=procs.check):
        worker_keys = Worker.all_keys(connection=connection, queue=queue)
        idle = [k for k in worker_keys if connection.hget(k, "state") == b"idle"]
        if len(idle) >= n:
            time.sleep(0.3)  # past the state write, into the blocking dequeue
            return time.monotonic() - started
    raise BenchError(f"only {len(idle)}/{n} workers of {queue.name} idle after {READY_TIMEOUT_S:.0f} s")


def wait_consumers(connection: redis.Redis, streams: Sequence[str], names: Sequence[str], procs: CliProcesses) -> float:
    """Wait until every dispatcher has joined the group on every stream; returns seconds waited."""
    started = time.monotonic()
    for _ in polls(READY_TIMEOUT_S, 0.05, alive=procs.check):
        joined = True
        for stream in streams:
            try:
                present = {c["name"].decode() for c in connection.xinfo_consumers(stream, keys.DISPATCH_GROUP)}
            except redis.exceptions.ResponseError:
                present = set()
            joined = joined and set(names) <= present
        if joined:
            time.sleep(0.6)  # past start-up housekeeping, into the blocking XREADGROUP
            return time.monotonic() - started
    raise BenchError(f"dispatchers did not join the consumer group in {READY_TIMEOUT_S:.0f} s")


def wait_stage(
    connection: redis.Redis, stage: str, n: int, procs: CliProcesses, progress: Progress, timeout: float
) -> tuple[float, int]:
    """Poll the stage's minute counter (pvm.metrics, in Redis) until it reaches `n`; returns (time, failures)."""
    key = keys.metrics_stage(stage)
    for _ in polls(timeout, POLL_S, alive=procs.check):
        raw_done, raw_failed = connection.hmget(key, ["minutes", "failures"])
        done, failed = int(raw_done or 0), int(raw_failed or 0)
        if done >= n:
            now = time.time()
            progress.tick(f"{done:,}/{n:,} minutes done", force=True)
            return now, failed
        progress.tick(f"{done:,}/{n:,} minutes done" + (f", {failed:,} failed" if failed else ""))
    raise BenchError(f"{stage}: only {done:,}/{n:,} minutes done after {timeout:.0f} s")


def valkey_pid(connection: redis.Redis) -> int:
    return int(connection.info("server")["process_id"])


# -- the runs -------------------------------------------------------------------------------


def _log_job_data(good: list[list[Any]], settings: Settings, shards: int) -> Any:
    """A log job exactly as `Dispatcher.dispatch_many` prepares it."""
    return Queue.prepare_data(
        keys.LOG_JOB,
        args=(good,),
        timeout=settings.job_timeout,
        result_ttl=defaults.JOB_RESULT_TTL_S,
        failure_ttl=defaults.JOB_FAILURE_TTL_S,
        retry=Retry(max=defaults.JOB_RETRIES),
        description=f"log {len(good)} minutes from shards {list(range(shards))}",
    )


def _index_job_data(records: list[list[Any]]) -> Any:
    """An index job exactly as `workers.log.pool._fan_out` prepares it."""
    return Queue.prepare_data(
        keys.INDEX_JOB,
        args=(records,),
        retry=Retry(max=defaults.JOB_RETRIES),
        result_ttl=defaults.JOB_RESULT_TTL_S,
        failure_ttl=defaults.JOB_FAILURE_TTL_S,
    )


def dispatcher_batches(encoded: Sequence[bytes], batch: int) -> list[list[list[Any]]]:
    """`[[entry_id, minute_bytes], ...]` batches in stream order, with stream-style entry ids."""
    base_ms = int(time.time() * 1000)
    entries = [[f"{base_ms}-{i}", raw] for i, raw in enumerate(encoded)]
    return [entries[i : i + batch] for i in range(0, len(entries), batch)]


def release_jobs(connection: redis.Redis, queue: Queue, datas: Sequence[Any]) -> tuple[dict[str, int], float]:
    """Enqueue every job in one MULTI/EXEC; returns {job id: minutes} and the time the EXEC returned."""
    with connection.pipeline(transaction=True) as pipe:
        jobs = queue.enqueue_many(list(datas), pipeline=pipe)
        pipe.execute()
    released = time.time()
    return {job.id: len(job.args[0]) for job in jobs}, released


@dataclass
class Drain:
    """One timed drain: how long the processes took to get ready, when the backlog was released, the CPU around it."""

    ready_s: float
    released: float
    before: CpuSnapshot
    after: CpuSnapshot
    failures: int = 0
    jobs: list[Done] = field(default_factory=list)  # the released jobs' completions, when the backlog was jobs


def drain_jobs(
    ws: Workspace,
    pool: str,
    processes: int,
    datas: Sequence[Any],
    n: int,
    timeout: float,
    progress: Progress,
    where: str = "",
) -> Drain:
    """Start `pvm worker <pool> --processes P`, wait until it is idle, enqueue `datas` (`n` minutes) at once."""
    conn = ws.connection
    queue = pool_queue(pool, conn)
    with running(ws.settings, [["worker", pool, "--processes", str(processes)]]) as procs:
        ready_s = wait_idle_workers(conn, queue, processes, procs)
        progress.tick(f"{processes} workers idle ({ready_s:.1f} s{where}); releasing {len(datas)} jobs", force=True)
        before = cpu_snapshot(procs, valkey_pid(conn))
        minutes_by_job, released = release_jobs(conn, queue, datas)
        _, failures = wait_stage(conn, pool, n, procs, progress, timeout)
        after = cpu_snapshot(procs, valkey_pid(conn))
        jobs = finished_events(conn, minutes_by_job)
    return Drain(ready_s, released, before, after, failures, jobs)


def finish(out: dict[str, Any], drain: Drain, n: int, verified: dict[str, Any], progress: Progress) -> None:
    """Add what every run reports besides its rates: readiness, CPU, the checks made."""
    out["ready_s"] = round(drain.ready_s, 3)
    out["cpu_cores"] = cpu_cores(drain.before, drain.after)
    out["cpu_us_per_minute"] = cpu_per_minute(drain.before, drain.after, n)
    out["verified"] = verified
    progress.tick(f"{out['per_s']:,} minutes/s", force=True)


def run_dispatch(minutes: Sequence[Minute], processes: int, shards: int, progress: Progress) -> dict[str, Any]:
    n = len(minutes)
    progress.start(f"dispatch x{processes}", f"{n:,} minutes in {shards} streams, {processes} `pvm dispatch`")
    with workspace(f"scaling-dispatch{processes}", shards) as ws:
        conn = ws.connection
        preload(ws.settings, minutes, progress, "dispatch", "emitted")
        streams = [keys.stream(s) for s in range(shards)]
        with conn.pipeline(transaction=True) as pipe:
            for s in streams:
                pipe.xgroup_create(s, keys.DISPATCH_GROUP, id="0")
                pipe.rename(s, s + PARKED_SUFFIX)
            pipe.execute()
        names = [f"bench-dispatch-{i}" for i in range(processes)]
        with running(ws.settings, [["dispatch", "--consumer", name] for name in names]) as procs:
            ready_s = wait_consumers(conn, streams, names, procs)
            progress.tick(f"{processes} dispatchers waiting ({ready_s:.1f} s); releasing the streams", force=True)
            before = cpu_snapshot(procs, valkey_pid(conn))
            with conn.pipeline(transaction=True) as pipe:
                for s in streams:
                    pipe.rename(s + PARKED_SUFFIX, s)
                pipe.execute()
            released = time.time()
            wait_stage(conn, "dispatch", n, procs, progress, max(60.0, n / 1_000))
            drain = Drain(ready_s, released, before, cpu_snapshot(procs, valkey_pid(conn)))
        job_ids = [i.decode() if isinstance(i, bytes) else i for i in conn.lrange(pool_queue("log", conn).key, 0, -1)]
        events = [Done(_ts(job.enqueued_at), len(job.args[0])) for job in fetch_jobs(conn, job_ids)]
        pending = sum(int(g["pending"]) for s in streams for g in conn.xinfo_groups(s))
        box = machine(conn)
    dispatched = sum(e.minutes for e in events)
    if dispatched != n or pending:
        raise BenchError(f"dispatch: {dispatched:,}/{n:,} minutes in log jobs, {pending} entries still pending")
    out = summarize(
        processes=processes,
        stage="dispatch",
        n=n,
        events=events,
        released=released,
        basis="log jobs' enqueued_at (job stored + entries acknowledged in one MULTI/EXEC)",
    )
    finish(out, drain, n, {"minutes_in_jobs": dispatched, "pending_entries": pending}, progress)
    return out | {"_machine": box}


def run_log(
    encoded: Sequence[bytes], projects: Sequence[str], processes: int, shards: int, batch: int, progress: Progress
) -> dict[str, Any]:
    n = len(encoded)
    batches = dispatcher_batches(encoded, batch)
    detail = f"{len(batches)} jobs of {batch} minutes, `pvm worker log --processes {processes}`"
    progress.start(f"log x{processes}", detail)
    with workspace(f"scaling-log{processes}", shards) as ws:
        live, conn = ws.settings, ws.connection
        datas = [_log_job_data(b, live, shards) for b in batches]
        drain = drain_jobs(ws, "log", processes, datas, n, max(60.0, n / 500), progress)
        box = machine(conn)
        reader = LogReader(live.log_dir)
        records = [(r.id, r.durable_at) for p in projects for r in reader.history(p)]
        fanned_out = conn.llen(pool_queue("index", conn).key) if "index" in live.downstream else None
    duplicates = len(records) - len({i for i, _ in records})
    if len(records) != n or duplicates:
        raise BenchError(f"log: the log holds {len(records):,} records ({duplicates} duplicates), expected {n:,}")
    events = [Done(at, 1) for _, at in records]
    jobs = drain.jobs
    out = summarize(
        "log",
        processes,
        n,
        events,
        drain.released,
        "log records' durable_at (stamped before each batch's write and commit)",
        job_events=jobs,
    )
    out["jobs_ended_per_s"] = round(span_rate(jobs)[0])
    out["appends"] = len({at for _, at in records})
    verified = {
        "log_records": len(records),
        "duplicates": duplicates,
        "failures": drain.failures,
        "index_jobs_fanned_out": fanned_out,
    }
    finish(out, drain, n, verified, progress)
    return out | {"_machine": box}


def _index_engine(settings: Settings) -> Any:
    from pvm.engines import make_engine

    return make_engine(settings, None)


def run_index(
    encoded: Sequence[bytes], projects: Sequence[str], processes: int, shards: int, batch: int, progress: Progress
) -> dict[str, Any]:
    n = len(encoded)
    batches = dispatcher_batches(encoded, batch)
    progress.start(f"index x{processes}", f"{n:,} minutes into the log, then {len(batches)} index jobs")
    outer = Settings.from_env()  # the workspace starts from a clean environment: bring a Qdrant server along
    with workspace(f"scaling-index{processes}", shards) as ws:
        if outer.qdrant_url:
            server = ws.settings.with_(qdrant_url=outer.qdrant_url, qdrant_api_key=outer.qdrant_api_key)
            ws = replace(ws, settings=server)
        live, conn = ws.settings, ws.connection
        if live.qdrant_url:  # a server keeps points between runs: start from none
            engine = _index_engine(live)
            try:
                for p in projects:
                    engine.delete_project(p)
            finally:
                engine.close()
        writer = LogWriter(live.log_dir)
        datas = []
        logged = 0
        try:
            for entries in batches:
                result = log_pool.process(writer, entries)
                # As the log pool fans them out: the batch's records, grouped by project, in jobs of at most
                # FANOUT_BATCH_SIZE.
                records = log_pool.fanned_out(result)
                for start in range(0, len(records), defaults.FANOUT_BATCH_SIZE):
                    datas.append(_index_job_data(records[start : start + defaults.FANOUT_BATCH_SIZE]))
                logged += len(entries)
                progress.tick(f"{logged:,}/{n:,} minutes in the log")
        finally:
            writer.close()
        where = "Qdrant server" if live.qdrant_url else "embedded engine"
        drain = drain_jobs(ws, "index", processes, datas, n, max(120.0, n / 100), progress, f", {where}")
        box = machine(conn)
        reader = LogReader(live.log_dir)
        log_heads = {p: reader.count(p) for p in projects}
        index_heads = {p: int(conn.hget(keys.index_head(p), "seq") or 0) for p in projects}
        engine = _index_engine(live)  # the worker has exited: its lock on the embedded engine is released
        try:
            points = {p: engine.count(p) for p in projects}
        finally:
            engine.close()
    if sum(points.values()) != n or index_heads != log_heads:
        raise BenchError(f"index: {sum(points.values()):,}/{n:,} points; index heads {index_heads} vs log {log_heads}")
    out = summarize(
        "index", processes, n, drain.jobs, drain.released, f"index jobs' ended_at ({where}, lexical vectors)"
    )
    verified = {"points": sum(points.values()), "index_heads_at_log_heads": True, "failures": drain.failures}
    finish(out, drain, n, verified, progress)
    return out | {"_machine": box}


# -- report -----------------------------------------------------------------------------------


def pool_summary(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per stage: the median minutes/s at each process count, the speed-up, and the steady rates."""
    out: dict[str, dict[str, Any]] = {}
    for r in runs:
        entry = out.setdefault(r["stage"], {"per_s": {}, "steady_per_s": {}})
        entry["per_s"][str(r["processes"])] = r["per_s"]
        entry["steady_per_s"][str(r["processes"])] = r["steady_per_s"]
    for entry in out.values():
        one, two = entry["per_s"].get("1"), entry["per_s"].get("2")
        entry["speedup_2_vs_1"] = round(two / one, 2) if one and two else None
    return out


def median_run(attempts: Sequence[dict[str, Any]], quiet_cores: float) -> dict[str, Any]:
    """The repeat with the median rate, among the undisturbed ones when there are any.

    Annotated with every repeat's rate and the other processes' CPU during it.
    """
    quiet = [r for r in attempts if r["cpu_cores"]["other"] < quiet_cores]
    ordered = sorted(quiet or attempts, key=lambda r: r["per_s"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["repeats_per_s"] = [r["per_s"] for r in attempts]
    chosen["repeats_other_cores"] = [r["cpu_cores"]["other"] for r in attempts]
    chosen["disturbed_repeats"] = len(attempts) - len(quiet)
    return chosen


def foreign_cores(seconds: float = 1.0) -> float:
    """Cores other users' processes kept busy over `seconds` (this process and the kernel's threads left out)."""

    def sample() -> tuple[float, float, float]:
        busy, interrupts = machine_busy()
        own = os.times()
        return busy, _kernel_cpu(process_table(), interrupts), own.user + own.system

    t0, before = time.monotonic(), sample()
    time.sleep(seconds)
    after = sample()
    wall = time.monotonic() - t0
    busy, kernel, own = (y - x for x, y in zip(before, after, strict=True))
    # Reading /proc costs this process CPU too; `own` includes it.
    return max(0.0, (busy - kernel - own) / wall)


def wait_quiet(threshold: float, max_wait: float) -> tuple[float, float]:
    """Wait (up to `max_wait` s) for a second in which other processes use under `threshold` cores.

    Returns (seconds waited, the last second's foreign cores).
    """
    started = time.monotonic()
    while True:
        other = foreign_cores()
        waited = time.monotonic() - started
        if other < threshold or waited >= max_wait:
            if other >= threshold:
                say(f"bench: the machine is still busy ({other:.2f} cores not ours) after {waited:.0f} s; running")
            return waited, other
        if waited < 1.5 or int(waited) % 10 == 0:
            say(f"bench: waiting for a quiet machine ({other:.2f} cores busy with other processes)")


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{'STAGE':<10}{'PROCS':>6}{'MINUTES/S':>11}{'STEADY/S':>10}{'JOBS':>6}{'JOB P50':>9}"
        f"  {'CORES workers/valkey/kernel/other':<35}{'SPLIT':<15}REPEATS"
    ]
    for r in result["runs"]:
        cpu = r["cpu_cores"]
        cores = f"{cpu['workers']:.2f} / {cpu['valkey']:.2f} / {cpu['kernel']:.2f} / {cpu['other']:.2f}"
        split = "/".join(f"{m:,}" for m in r.get("minutes_per_process", [])) if r["processes"] > 1 else ""
        steady = f"{r['steady_per_s']:,}" if r["steady_per_s"] is not None else "-"
        p50 = f"{r['job_seconds_p50'] * 1000:.0f} ms" if "job_seconds_p50" in r else "-"
        repeats = ", ".join(f"{v:,}" for v in r["repeats_per_s"])
        lines.append(
            f"{r['stage']:<10}{r['processes']:>6}{r['per_s']:>11,}{steady:>10}{r['jobs']:>6}{p50:>9}"
            f"  {cores:<35}{split:<15}{repeats}"
        )
    for miss in result["not_measured"]:
        lines.append(f"{miss['stage']:<10}{miss['processes']:>6}{'-':>11}  not measured: {miss['short']}")
    for crash in result["process_crashes"]:
        lines.append(f"crashed in {crash['stage']} x{crash['processes']} (run again): {crash['error']}")
    lines.append("")
    for stage, entry in result["pools"].items():
        if entry.get("speedup_2_vs_1") is not None:
            lines.append(f"{stage}: 2 processes = {entry['speedup_2_vs_1']:.2f}x of 1")
    cfg = result["config"]
    detail = (
        f"{cfg['minutes']:,} minutes ({cfg['dispatch_minutes']:,} for dispatch), batch {cfg['batch']}, "
        f"shards {cfg['shards']}, {cfg['projects']} projects, median of {cfg['repeats']}"
    )
    lines.append(footer(result, detail))
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argument_parser(
        "bench/scaling.py",
        __doc__,
        epilog="Exit status 0 when every run measured, 1 when one failed, 130 on Ctrl-C.",
    )
    parser.add_argument("--minutes", type=int, default=MINUTES, help="minutes per run (default %(default)s)")
    parser.add_argument(
        "--dispatch-minutes",
        type=int,
        help="minutes per dispatch run (default 4x --minutes: the dispatcher drains 60,000 in about 2 s)",
    )
    parser.add_argument(
        "--repeats", type=int, default=REPEATS, help="runs per stage and process count; the median is reported"
    )
    parser.add_argument(
        "--quiet-cores",
        type=float,
        default=QUIET_CORES,
        help="before each run, wait until other processes use fewer cores than this (default %(default)s); "
        "a run during which they used more is run again, up to --attempts times",
    )
    parser.add_argument("--quiet-wait", type=float, default=QUIET_WAIT_S, help="longest wait for that, s")
    parser.add_argument("--attempts", type=int, default=ATTEMPTS, help="attempts per repeat (default %(default)s)")
    parser.add_argument("--batch", type=int, default=BATCH, help="minutes per log job (default %(default)s)")
    parser.add_argument("--shards", type=int, default=defaults.SHARDS, help="stream shards (default %(default)s)")
    parser.add_argument(
        "--processes", default=",".join(map(str, PROCESSES)), help="process counts to run (default %(default)s)"
    )
    parser.add_argument(
        "--stages", default=",".join(STAGES), help=f"stages to measure (default %(default)s; of {', '.join(STAGES)})"
    )
    args = parse(parser, argv)
    if args.minutes < 1_000:
        parser.error("--minutes must be at least 1000")
    if args.batch < 1 or args.shards < 1 or args.repeats < 1 or args.attempts < 1:
        parser.error("--batch, --shards, --repeats and --attempts must be at least 1")
    if args.dispatch_minutes is None:
        args.dispatch_minutes = 4 * args.minutes
    if args.dispatch_minutes < 1_000:
        parser.error("--dispatch-minutes must be at least 1000")
    try:
        args.processes = sorted({int(p) for p in args.processes.split(",")})
    except ValueError:
        parser.error("--processes takes comma-separated whole numbers, e.g. 1,2")
    if min(args.processes) < 1:
        parser.error("--processes must be at least 1")
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = set(args.stages) - set(STAGES)
    if unknown:
        parser.error(f"unknown stages {sorted(unknown)}; stages are {', '.join(STAGES)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    qdrant_url = Settings.from_env().qdrant_url
    runs: list[dict[str, Any]] = []
    not_measured: list[dict[str, Any]] = []
    crashes: list[dict[str, Any]] = []
    box: dict[str, Any] = {}
    progress = Progress()
    with measuring("bench", "interrupted; processes and Valkey stopped") as outcome:
        projects = pick_projects(args.shards)
        total = max(args.minutes, args.dispatch_minutes if "dispatch" in args.stages else 0)
        say(f"bench: building {total:,} sample minutes over {len(projects)} projects ({args.shards} shards)")
        minutes = build_minutes(projects, total)
        encoded = [encode_minute(m) for m in minutes[: args.minutes]]
        gc.collect()
        gc.freeze()
        for stage in args.stages:
            counts = []
            for p in args.processes:
                if stage == "index" and p > 1 and not qdrant_url:
                    not_measured.append(
                        {
                            "stage": stage,
                            "processes": p,
                            "reason": INDEX_NEEDS_SERVER,
                            "short": INDEX_NEEDS_SERVER_SHORT,
                        }
                    )
                    say(f"index x{p}: {INDEX_NEEDS_SERVER}")
                else:
                    counts.append(p)
            attempts: dict[int, list[dict[str, Any]]] = defaultdict(list)
            # Interleaved (1, 2, 1, 2, ...): a change in the machine's load touches every count alike.
            for repeat in range(args.repeats):
                for p in counts:
                    kept: dict[str, Any] | None = None
                    for attempt in range(1, args.attempts + 1):
                        waited, _ = wait_quiet(args.quiet_cores, args.quiet_wait)
                        last = attempt == args.attempts
                        try:
                            if stage == "dispatch":
                                result = run_dispatch(minutes[: args.dispatch_minutes], p, args.shards, progress)
                            elif stage == "log":
                                result = run_log(encoded, projects, p, args.shards, args.batch, progress)
                            else:
                                result = run_index(encoded, projects, p, args.shards, args.batch, progress)
                        except ProcessDied as exc:
                            crashes.append({"stage": stage, "processes": p, "repeat": repeat + 1, "error": str(exc)})
                            say(f"{stage} x{p}: {exc}" + ("" if last else "; running it again"))
                            if last and kept is None:
                                raise
                            continue
                        box = result.pop("_machine")
                        result["repeat"], result["attempt"] = repeat + 1, attempt
                        result["waited_for_quiet_s"] = round(waited, 1)
                        kept = result
                        other = result["cpu_cores"]["other"]
                        if other < args.quiet_cores:
                            break
                        again = "keeping it" if last else "running it again"
                        say(f"{stage} x{p}: other processes used {other:.2f} cores during the run; {again}")
                    assert kept is not None
                    attempts[p].append(kept)
            runs.extend(median_run(attempts[p], args.quiet_cores) for p in counts)
    if outcome.exit_code is not None:
        return outcome.exit_code
    out: dict[str, Any] = {
        "pools": pool_summary(runs),
        "runs": runs,
        "not_measured": not_measured,
        "process_crashes": crashes,
        "config": {
            "minutes": args.minutes,
            "dispatch_minutes": args.dispatch_minutes,
            "repeats": args.repeats,
            "quiet_cores": args.quiet_cores,
            "batch": args.batch,
            "shards": args.shards,
            "projects": len(projects),
            "processes": args.processes,
            "downstream_of_log": list(Settings.from_env().downstream),
            "vector_engine": "Qdrant server" if qdrant_url else "embedded (qdrant-edge), lexical vectors only",
            "rate_basis": "minutes completed after the first completion / (last completion - first completion)",
            "reported_run": "the repeat with the median minutes/s among those other processes did not disturb "
            "(all, when every one was); repeats_per_s lists them all",
            "steady_basis": "minutes completed while every process had finished a batch and none its last",
            "cpu_basis": "average cores busy from release to drained, from /proc: workers (the processes under "
            "test and their children), valkey, bench (this script), kernel (kernel threads + interrupts: journal, "
            "block I/O), other (the rest: other users' processes)",
        },
    }
    return report(out, started, args.json, table, box)


if __name__ == "__main__":
    sys.exit(main())

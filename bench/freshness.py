#!/usr/bin/env python
"""Freshness benchmark: how soon a minute `emit()` returned is found by search, and its fact is in the facts API.

The whole stack runs as `pvm up` runs it (`workers.runtime.stack.Stack` on a
fresh home: embedded Valkey, a dispatcher, the log, facts and summarize pools,
the scheduler, and `pvm serve`, which owns the embedded engine and runs the
index pool), and this process is an agent beside it:

1. offer      for each rate (`--rates`, minutes/s), generated multi-agent minutes
              (bench/sessions.py) of a project of its own are emitted with
              `Emitter` at that rate for `--seconds`. Every stride-th minute is a
              probe (`--sample` of them): its note says one thing no other minute
              says, "Probe <token>: the <token> gateway is owned by <Name>.": a
              word to search for, and a statement the rules read as a fact
              (its id computed beforehand with the rule extractor, as the pool
              will).
2. poll       while the minutes are emitted and after, a second thread looks for
              the probes in flight, a round at most every 50 ms, each round in
              emit order up to the first not found yet (the pools work a
              project's minutes in log order): often enough for latencies of
              hundreds of ms, seldom enough not to slow the server that
              indexes. Through the reader API (`pvm.Client`, HTTP), as any
              agent would: `search(project, token)` until a hit is the probe
              minute, and `fact(project, id)` until the fact is there (promoted
              or pending).
                emit_to_searchable_p50/p99_ms_<rate>, emit_to_fact_p50/p99_ms_<rate>:
                from `emit()` returning to the first answer that has it; a probe
                not found within `--drain` seconds after the last emit counts
                with the time waited (censored, and counted).
              Beside them: the rate the emitter achieved, per stage the jobs
              it made, their mean size and the mean time a job took, and the
              pools' own mean time from a stream entry to each stage
              (stages_<rate>), and whether the pipeline kept up (every probe found while the offer ran, or soon
              after). And what each process used of the machine over the offer
              and its drain (cpu_<rate>, from /proc): per process of the stack
              with its children, Valkey, this process (emitter and poller) and
              the whole machine, as cores and as CPU µs per minute offered;
              stack_us_per_minute, all of them per minute, is the work a rate
              asks of the machine (at 5,000/s, 200 µs a minute is one core).
              When the pipeline cannot keep up with a rate, the latency
              is a backlog that grows with the run's length: it is reported as
              measured, with `kept_up` false.

Targets (issue 26, 2 cores): emit -> searchable p99 <= 1,000 ms at 5k/s offered;
emit -> fact p99 <= 1,500 ms (at 5k/s).

Progress goes to stderr; the result (one JSON object with --json, else a table) to stdout.

    .venv/bin/python bench/freshness.py --json
    .venv/bin/python bench/freshness.py --rates 200 --seconds 5     # a quick run
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis
from rq.utils import as_text

from bench.harness import (
    BenchError,
    Progress,
    argument_parser,
    machine_busy,
    machine_line,
    measuring,
    parse,
    percentile,
    polls,
    process_table,
    report,
    target_texts,
    temp_home,
    tree_cpu,
    verdicts,
)
from bench.machine import machine
from bench.sessions import stream
from contracts import Minute, keys
from contracts.facts import Slot, TierKey, fact_id
from pvm.client import Client, PVMRequestError
from pvm.config import Settings
from pvm.emitter import Emitter
from workers.facts.extraction import RuleExtractor
from workers.runtime.embedded import free_port
from workers.runtime.stack import Stack

RATES = (1_000, 5_000)
SECONDS = 10.0
SAMPLE = 200  # probes per rate
DRAIN_S = 30.0  # after the last emit, how long probes still in flight are looked for
POLL_INTERVAL_S = 0.05  # a round of looking for the probes in flight at most this often
POLL_REQUESTS = 20  # requests of each kind in one round at most
NAMES = ("Dana Whitfield", "Ines Duarte", "Raj Mehta", "Maya Chen", "Tomasz Kowal", "Priya Nair")
TARGETS: dict[str, tuple[str, float]] = {
    "emit_to_searchable_p99_ms_5k": ("<=", 1_000.0),
    "emit_to_fact_p99_ms_5k": ("<=", 1_500.0),
}


@dataclass(frozen=True)
class Probe:
    """A minute whose note says one thing no other minute says: the word to search for, the fact it states."""

    minute: Minute
    token: str
    fact_id: str


@dataclass
class Seen:
    """When each probe's `emit()` returned, and when an answer first had its minute, and its fact."""

    emitted: dict[str, float] = field(default_factory=dict)
    searchable: dict[str, float] = field(default_factory=dict)
    fact: dict[str, float] = field(default_factory=dict)
    offered_s: float = 0.0
    last_emit: float = 0.0
    gave_up_at: float | None = None


def probe_of(minute: Minute, n: int, extractor: RuleExtractor) -> Probe:
    """`minute` made a probe: its note a statement of its own, and the id of the fact the rules read from it."""
    token = f"zq{n:05d}x{random.Random(n).randrange(36**4):04x}"  # a word no generated note has
    note = f"Probe {token}: the {token} gateway is owned by {NAMES[n % len(NAMES)]}."
    probe = dataclasses.replace(minute, memory_note=note, data={}, context_references=())
    found = extractor.extract([probe])
    owned = [c for c in found if c.attribute == "owner"]
    if len(owned) != 1:
        raise BenchError(f"the rules read {[(c.subject, c.attribute) for c in found]} from a probe, not one owner")
    c = owned[0]
    tier = TierKey.for_project(probe.project_id)
    return Probe(probe, token, fact_id(tier, Slot(c.subject, c.attribute), c.value))


def offer_minutes(project: str, n: int, sample: int, seed: int) -> tuple[list[Minute], dict[str, Probe]]:
    """`n` generated minutes of `project`, every stride-th a probe (`sample` of them, spread through the run)."""
    extractor = RuleExtractor(statements=False)
    stride = max(1, n // max(1, sample))
    minutes: list[Minute] = []
    probes: dict[str, Probe] = {}
    for i, minute in enumerate(stream({project: 1.0}, n, seed=seed)):
        if i % stride == stride // 2 and len(probes) < sample:
            p = probe_of(minute, len(probes) + seed * 100_000, extractor)
            probes[p.minute.id] = p
            minute = p.minute
        minutes.append(minute)
    return minutes, probes


def searchable(api: Client, probe: Probe) -> bool:
    hits = api.search(probe.minute.project_id, probe.token, k=5)["hits"]
    return any(h.get("minute_id") == probe.minute.id for h in hits)


def fact_held(api: Client, probe: Probe) -> bool:
    try:
        api.fact(probe.minute.project_id, probe.fact_id)
    except PVMRequestError as exc:
        if exc.status == 404:
            return False
        raise
    return True


class Poller(threading.Thread):
    """Looks for the probes in flight through the API, a round at most every `POLL_INTERVAL_S`, each round in emit
    order up to the first not found: often enough for a latency measured in hundreds of milliseconds, seldom
    enough not to slow the server it measures (`pvm serve` answers these searches in the process that indexes;
    asking for every probe in flight each round, a backlog made more requests, which made a longer backlog)."""

    def __init__(self, api: Client, seen: Seen) -> None:
        super().__init__(name="freshness-poller", daemon=True)
        self.api = api
        self.seen = seen
        self.lock = threading.Lock()
        self.waiting_search: dict[str, Probe] = {}
        self.waiting_fact: dict[str, Probe] = {}
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def add(self, probe: Probe) -> None:
        with self.lock:
            self.waiting_search[probe.minute.id] = self.waiting_fact[probe.minute.id] = probe

    def in_flight(self) -> tuple[int, int]:
        with self.lock:
            return len(self.waiting_search), len(self.waiting_fact)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                began = time.monotonic()
                self._round()
                self.stop.wait(max(0.0, POLL_INTERVAL_S - (time.monotonic() - began)))
        except BaseException as exc:  # reported by the emitting thread
            self.error = exc

    def _round(self) -> None:
        """Each kind's probes in flight in emit order, up to the first not found yet (the pools work a project's
        minutes in log order, so the ones after it are not there either), at most `POLL_REQUESTS` of them."""
        for waiting, found, there in (
            (self.waiting_search, self.seen.searchable, searchable),
            (self.waiting_fact, self.seen.fact, fact_held),
        ):
            with self.lock:
                in_order = list(waiting.values())  # dicts keep insertion order: emit order
            for probe in in_order[:POLL_REQUESTS]:
                if not there(self.api, probe):
                    break
                with self.lock:
                    found[probe.minute.id] = time.time()
                    del waiting[probe.minute.id]


def offer(
    settings: Settings,
    api: Client,
    stack: Stack,
    minutes: Sequence[Minute],
    probes: dict[str, Probe],
    rate: float,
    drain_s: float,
    progress: Progress,
) -> Seen:
    """Emit `minutes` at `rate` while a `Poller` looks for the probes in flight, then wait until all are found or
    `drain_s` has passed since the last emit."""
    seen = Seen()
    poller = Poller(api, seen)
    poller.start()
    interval = 1.0 / rate
    n, i = len(minutes), 0
    try:
        with Emitter(settings=settings) as emitter:
            start = time.perf_counter()
            while i < n:
                while i < n and start + i * interval <= time.perf_counter():
                    m = minutes[i]
                    emitter.emit(m)
                    probe = probes.get(m.id)
                    if probe is not None:
                        seen.emitted[m.id] = time.time()
                        poller.add(probe)
                    i += 1
                if i % 500 == 0 or i == n:
                    check(stack, poller)
                    progress.tick(f"{rate:,.0f}/s: {i:,}/{n:,} emitted", force=False)
                time.sleep(max(0.0, start + i * interval - time.perf_counter()))
            seen.offered_s = time.perf_counter() - start
            seen.last_emit = time.time()
            emitter.flush(30)
        while True:
            check(stack, poller)
            searching, facts = poller.in_flight()
            progress.tick(
                f"{rate:,.0f}/s: all {n:,} emitted; {searching} probes not searchable yet, {facts} facts not held"
            )
            if not searching and not facts:
                return seen
            if time.time() - seen.last_emit > drain_s:
                seen.gave_up_at = time.time()
                progress.tick(
                    f"{rate:,.0f}/s: {searching} probes not searchable, {facts} facts not held {drain_s:.0f} s "
                    "after the last emit",
                    force=True,
                )
                return seen
            time.sleep(POLL_INTERVAL_S)
    finally:
        poller.stop.set()
        poller.join(10)


def check(stack: Stack, poller: Poller) -> None:
    """Raise when a process of the stack exited, or the poller failed."""
    for name, child in stack.children.items():
        if child.poll() is not None:
            raise BenchError(f"{name} (pid {child.pid}) exited with {child.returncode}")
    if poller.error is not None:
        raise BenchError(f"the poller failed: {type(poller.error).__name__}: {poller.error}") from poller.error


def latencies(seen: Seen, found: dict[str, float]) -> tuple[list[float], int]:
    """Each probe's emit -> found (ms, sorted); a probe never found counts with the time waited. And how many."""
    end = seen.gave_up_at or time.time()
    ms = sorted(((found.get(k) or end) - at) * 1000 for k, at in seen.emitted.items())
    return ms, sum(1 for k in seen.emitted if k not in found)


def rate_result(label: str, rate: float, n: int, seen: Seen) -> dict[str, Any]:
    out: dict[str, Any] = {
        f"offered_per_s_{label}": round(n / seen.offered_s) if seen.offered_s else None,
        f"probes_{label}": len(seen.emitted),
    }
    for name, found in (("searchable", seen.searchable), ("fact", seen.fact)):
        ms, censored = latencies(seen, found)
        if not ms:
            raise BenchError(f"{label}: no probe was emitted")
        out[f"emit_to_{name}_p50_ms_{label}"] = round(percentile(ms, 50), 1)
        out[f"emit_to_{name}_p99_ms_{label}"] = round(percentile(ms, 99), 1)
        out[f"emit_to_{name}_max_ms_{label}"] = round(ms[-1], 1)
        out[f"not_{name}_{label}"] = censored
    # Kept up: every probe found, the last of them within a second of the last emit (no backlog left to drain).
    last = max([*seen.searchable.values(), *seen.fact.values()], default=seen.last_emit)
    out[f"kept_up_{label}"] = (
        out[f"not_searchable_{label}"] == 0 and out[f"not_fact_{label}"] == 0 and last - seen.last_emit <= 1.0
    )
    out[f"rate_target_{label}"] = rate
    return out


Counts = dict[str, dict[str, tuple[float, float]]]  # "batches" / "freshness" -> stage -> two running totals


def stage_counts(connection: redis.Redis) -> Counts:
    """What the pools count for the exporter so far: per stage, (minutes, batches) and its batches' (seconds
    summed, count); per freshness stage (how soon after its stream entry a minute reached it), (seconds summed,
    minutes)."""
    stages = sorted(as_text(s) for s in connection.smembers(keys.metrics_stages()))
    fresh = sorted(as_text(s) for s in connection.smembers(keys.metrics_freshness_stages()))
    pipe = connection.pipeline(transaction=False)
    for stage in stages:
        pipe.hmget(keys.metrics_stage(stage), ["minutes", "batches"])
    for stage in stages:
        pipe.hmget(keys.metrics_stage_duration(stage), ["sum", "count"])
    for stage in fresh:
        pipe.hmget(keys.metrics_freshness(stage), ["sum", "count"])
    replies = pipe.execute()
    pairs = [(float(a or 0), float(b or 0)) for a, b in replies]
    n = len(stages)
    return {
        "batches": dict(zip(stages, pairs[:n], strict=True)),
        "durations": dict(zip(stages, pairs[n : 2 * n], strict=True)),
        "freshness": dict(zip(fresh, pairs[2 * n :], strict=True)),
    }


def stage_figures(before: Counts, after: Counts) -> dict[str, Any]:
    """Between two `stage_counts`: per stage the minutes, the batches, the mean batch (how the pipeline cut the
    offer into jobs: many small batches cost each stage its per-job work many times) and the mean time a batch
    took; and per freshness stage the mean time from a minute's stream entry to that stage, as the pools
    measured it (where the time goes: working, or waiting)."""
    batches: dict[str, Any] = {}
    for stage, (minutes, count) in after["batches"].items():
        m0, b0 = before["batches"].get(stage, (0.0, 0.0))
        m, b = int(minutes - m0), int(count - b0)
        if b:
            seconds, timed = after["durations"].get(stage, (0.0, 0.0))
            s0, t0 = before["durations"].get(stage, (0.0, 0.0))
            took = round((seconds - s0) / (timed - t0) * 1000, 1) if timed - t0 else None
            batches[stage] = {"minutes": m, "batches": b, "mean_batch": round(m / b, 1), "mean_batch_ms": took}
    fresh: dict[str, float] = {}
    for stage, (total, count) in after["freshness"].items():
        t0, n0 = before["freshness"].get(stage, (0.0, 0.0))
        if count - n0:
            fresh[stage] = round((total - t0) / (count - n0) * 1000, 1)
    return {"batches": batches, "freshness_mean_ms": fresh}


def cpu_now(stack: Stack, valkey_pid: int | None) -> dict[str, float]:
    """CPU seconds used so far, by role: each process of the stack with its descendants (by its name in
    `Stack.children`), Valkey, this process (the emitter and the poller), and the whole machine (busy time of all
    its cores, `machine`)."""
    table = process_table()
    out = {name: tree_cpu(table, [child.pid]) for name, child in stack.children.items()}
    if valkey_pid is not None and valkey_pid in table:
        out["valkey"] = table[valkey_pid][1]
    own = os.times()
    out["bench"] = own.user + own.system
    out["machine"] = machine_busy()[0]
    return out


def cpu_figures(before: dict[str, float], after: dict[str, float], wall_s: float, minutes: int) -> dict[str, Any]:
    """Between two `cpu_now`: each role's cores (CPU seconds / wall seconds) and CPU per minute offered (µs), over
    the whole offer and its drain, so a backlog's work counts too. `machine` is every core's busy time: on 2 cores
    2.0 means the machine had nothing left."""
    used = {role: after[role] - before[role] for role in after if role in before}
    return {
        "seconds": round(wall_s, 2),
        "cores": {role: round(cpu / wall_s, 2) for role, cpu in used.items()},
        "us_per_minute": {role: round(cpu / minutes * 1e6, 1) for role, cpu in used.items()},
        "stack_us_per_minute": round(sum(v for k, v in used.items() if k != "machine") / minutes * 1e6, 1),
    }


def _label(rate: float) -> str:
    return f"{rate / 1000:g}k" if rate >= 1000 else f"{rate:g}"


def run(
    rates: Sequence[float], seconds: float, sample: int, drain_s: float, seed: int, progress: Progress
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    with temp_home("freshness") as home:
        stack = Stack(home, api_port=free_port())
        progress.tick("starting the stack (pvm up: Valkey, dispatcher, pools, scheduler, serve)", force=True)
        live = stack.start()
        try:
            connection = redis.Redis.from_url(str(live.redis_url))
            valkey_pid = connection.info("server").get("process_id")
            valkey_pid = valkey_pid if isinstance(valkey_pid, int) else None
            with Client(settings=live, retries=0) as api:
                for _ in polls(60.0, 0.1):
                    try:
                        api.health()
                        break
                    except Exception:  # the API is still starting
                        continue
                else:
                    raise BenchError("the reader API did not answer within 60 s")
                # A warm-up: the pools' first batch (imports, the engine's files) is no one's steady state.
                warm, warm_probes = offer_minutes("fresh-warmup", 200, 5, seed)
                offer(live, api, stack, warm, warm_probes, 200.0, drain_s, progress)
                for i, rate in enumerate(rates):
                    label = _label(rate)
                    n = max(1, round(rate * seconds))
                    minutes, probes = offer_minutes(f"fresh-{label}", n, sample, seed + 1 + i)
                    progress.tick(f"{label}: offering {n:,} minutes at {rate:,.0f}/s, {len(probes)} probes", True)
                    before = stage_counts(connection)
                    cpu_before, started = cpu_now(stack, valkey_pid), time.perf_counter()
                    seen = offer(live, api, stack, minutes, probes, rate, drain_s, progress)
                    cpu = cpu_figures(cpu_before, cpu_now(stack, valkey_pid), time.perf_counter() - started, n)
                    result.update(rate_result(label, rate, n, seen))
                    result[f"stages_{label}"] = stage_figures(before, stage_counts(connection))
                    result[f"cpu_{label}"] = cpu
                    progress.tick(
                        f"{label}: searchable p99 {result[f'emit_to_searchable_p99_ms_{label}']} ms, fact p99 "
                        f"{result[f'emit_to_fact_p99_ms_{label}']} ms, kept up: {result[f'kept_up_{label}']}",
                        force=True,
                    )
            result["machine"] = machine(connection)
        finally:
            stack.stop()
    result["rates"] = [_label(r) for r in rates]
    return result


def table(result: dict[str, Any]) -> str:
    lines = [f"{'METRIC':<40}{'VALUE':>22}  {'TARGET':<12}RESULT"]
    met = result.get("met", {})
    for label in result["rates"]:
        for name, what in (("searchable", "emit -> searchable"), ("fact", "emit -> fact")):
            key = f"emit_to_{name}_p99_ms_{label}"
            target = verdict = ""
            if key in TARGETS:
                op, bound = TARGETS[key]
                target, verdict = f"{op} {bound:g}", {True: "met", False: "MISSED", None: ""}[met.get(key)]
            value = f"{result[f'emit_to_{name}_p50_ms_{label}']} / {result[key]} ms"
            lines.append(f"{what + ' p50 / p99 @' + label:<40}{value:>22}  {target:<12}{verdict}")
        lines.append(
            f"{'offered @' + label:<40}{str(result[f'offered_per_s_{label}']) + '/s':>22}  "
            f"kept up: {result[f'kept_up_{label}']}"
        )
    lines += ["", f"{machine_line(result['machine'])}; {result['elapsed_s']:.0f} s"]
    return "\n".join(lines)


def rate_list(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of minutes/s") from None
    if not rates or any(r <= 0 for r in rates):
        raise argparse.ArgumentTypeError(f"each rate must be positive, got {text!r}")
    return rates


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argument_parser("bench/freshness.py", __doc__)
    parser.add_argument(
        "--rates", type=rate_list, default=list(RATES), metavar="R[,R...]", help="offered minutes/s (default 1000,5000)"
    )
    parser.add_argument("--seconds", type=float, default=SECONDS, help="how long each rate is offered (default 10)")
    parser.add_argument("--sample", type=int, default=SAMPLE, help="probes per rate (default %(default)s)")
    parser.add_argument("--drain", type=float, default=DRAIN_S, help="seconds to wait after the last emit (default 30)")
    parser.add_argument("--seed", type=int, default=7)
    args = parse(parser, argv)
    if args.seconds <= 0 or args.sample < 1 or args.drain <= 0:
        parser.error("--seconds and --drain must be positive, --sample at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    progress = Progress("freshness bench", sep=": ")
    started = time.monotonic()
    with measuring("freshness bench") as outcome:
        result = run(args.rates, args.seconds, args.sample, args.drain, args.seed, progress)
    if outcome.exit_code is not None:
        return outcome.exit_code
    result["config"] = {
        "rates": args.rates,
        "seconds": args.seconds,
        "sample": args.sample,
        "drain_s": args.drain,
        "stack": "pvm up: embedded Valkey, dispatcher, log/facts/summarize pools, scheduler, pvm serve (index)",
        "basis": "emit() returned -> the first reader API answer (search, facts) that has the probe",
    }
    result["targets"] = target_texts(TARGETS)
    result["met"] = verdicts(result, TARGETS)
    return report(result, started, args.json, table)


if __name__ == "__main__":
    sys.exit(main())

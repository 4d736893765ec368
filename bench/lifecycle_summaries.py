#!/usr/bin/env python
"""Summaries benchmark: how fast the summarize pool folds threads into chunks, how short its summaries are, and
whether a long thread's context still names every decision.

The sessions are generated (seed 11 by default): threads of 250 minutes each, by five agents, with a decision
every tenth minute (its `data.topic` sometimes the topic of an earlier one: a pivot), a task that fails and is
completed later every 37 minutes, and notes, observations and tool calls between, each with its reasoning.
Two phases, each on a fresh embedded Valkey:

1. pool       The threads of four projects, their minutes interleaved as a shared stream would carry them
              (40 threads, 10,000 minutes; --quick: 4 threads, 1,000 minutes), go through
              `workers.summarize.pool.summarize_batch` (the body of the pool's RQ job, extractive summarizer,
              one process) in batches of 500 with a per-project log seq, as the log pool fans them out.
                summarize_per_s
                    minutes / seconds inside summarize_batch.
                summary_ratio
                    over every chunk the pool made: the tokens of its summaries / the tokens its minutes cost
                    verbatim (`Chunk.tokens`: the reader's line for each minute), both by the reader's
                    estimate. `ratio.summary_line_ratio` counts the whole line a context shows for a chunk
                    (span, topics and outcome too).
2. thread_250 One 250-minute thread through the pool, then `ContextReader.build_context(thread=...)` with a
              2,000-token budget, rendered as an agent's prompt (`ContextPackage.render`).
                thread_250_decisions_kept
                    of the thread's decisions (each names a choice no other minute names), the share whose
                    choice the rendered context names (in its recent minutes, chunk summaries or episodes).

Targets (issue 11): >= 2,000 minutes/s, summary ratio <= 0.2, every decision kept (1.0). A missed target is
reported as missed; nothing is tuned to pass.

    .venv/bin/python bench/lifecycle_summaries.py --json > bench/results/lifecycle-summaries.json
    .venv/bin/python bench/lifecycle_summaries.py --quick --json    # a smoke run, seconds
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench.harness import (
    VERDICT_WORDS,
    BenchError,
    Progress,
    argument_parser,
    footer,
    measuring,
    parse,
    report,
    target_texts,
    verdicts,
    workspace,
)
from bench.machine import machine
from contracts import Minute, encode_minute
from contracts.summaries import ThreadRef, chunk_line
from pvm import defaults
from pvm.reader import ContextReader, estimate_tokens
from pvm.stores.log import LogReader
from pvm.stores.summaries import SummaryStore
from workers.summarize.pool import SummarizeContext, summarize_batch

TARGETS: dict[str, tuple[str, float]] = {
    "summarize_per_s": (">=", 2000),
    "summary_ratio": ("<=", 0.2),
    "thread_250_decisions_kept": (">=", 1.0),
}
SEED = 11
PROJECTS = 4
THREADS = 40  # threads of the pool phase, spread over PROJECTS
QUICK_THREADS = 4
THREAD_MINUTES = 250
BATCH = defaults.FANOUT_BATCH_SIZE
LONG_THREAD_BUDGET = 2_000
DECISION_EVERY = 10
TASK_EVERY = 37
AGENTS = ("planner", "coder", "reviewer", "tester", "ops")
T0 = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)

# -- the generated threads ---------------------------------------------------------------------------------------

COMPONENTS = (
    "session store", "job queue", "search index", "metrics pipeline", "auth service", "billing ledger",
    "feature flags", "image cache", "config service", "audit trail", "rate limiter", "email relay",
)  # fmt: skip
# Each a choice no filler minute names: the context names a decision when it names its choice.
CHOICES = (
    "Postgres", "Kafka", "NATS", "ClickHouse", "Memcached", "SQLite", "Cassandra", "RabbitMQ", "Elasticsearch",
    "DuckDB", "Pulsar", "CockroachDB", "Envoy", "Vault", "Consul", "Prometheus", "Loki", "Tempo", "MinIO",
    "Keycloak", "Traefik", "Temporal", "Airflow", "Dagster", "Flink", "Spark", "Trino", "Redpanda", "ScyllaDB",
    "TimescaleDB",
)  # fmt: skip
FILLER = (
    "Checked shard {n} after the rollout: p99 latency {ms} ms, error rate {pct}% and flat since the last deploy.",
    "Reviewed pull request {n}: the retry loop needs a jittered backoff and the test misses the timeout path.",
    "Ran the integration suite on branch {n}; {k} of {total} cases passed, the rest wait on the staging database.",
    "Paged in on alert {n}: disk on node {k} at {pct}% after log rotation stalled; rotated by hand and watching.",
    "Profiled worker {n}: {pct}% of the time is spent decoding payloads, the rest waits on the network.",
    "Synced with the team on ticket {n}; the customer wants the export by Thursday and accepts a CSV first.",
    "Drafted the runbook step for incident {n}: drain the node, snapshot the volume, then restart the service.",
)
REASONS = (
    "The numbers match what we saw last week, so nothing changes yet.",
    "A second look is cheaper than a rollback later.",
    "Waiting keeps the change window free for the migration.",
    "The same fix already worked on the other cluster.",
)


@dataclass(frozen=True)
class Decision:
    minute_id: str
    choice: str
    seq_in_thread: int


@dataclass
class GeneratedThread:
    project_id: str
    thread_id: str
    minutes: list[Minute] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)


def generate_thread(
    project_id: str, thread_id: str, count: int, rng: random.Random, start: datetime
) -> GeneratedThread:
    """One thread of `count` minutes: a decision every `DECISION_EVERY`th, a task failed and completed, filler."""
    out = GeneratedThread(project_id, thread_id)
    choices = rng.sample(CHOICES, k=len(CHOICES))
    open_task: str | None = None
    for i in range(count):
        agent = AGENTS[rng.randrange(len(AGENTS))]
        at = (start + timedelta(seconds=30 * i)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        base: dict[str, Any] = {"project_id": project_id, "thread_id": thread_id, "agent_id": agent, "timestamp": at}
        n, k = rng.randrange(100, 999), rng.randrange(2, 40)
        if i % DECISION_EVERY == DECISION_EVERY // 2:
            choice = choices[len(out.decisions) % len(choices)]
            component = COMPONENTS[rng.randrange(len(COMPONENTS))]
            minute = Minute(
                event_type="decision",
                memory_note=f"Decided to run the {component} on {choice} from the next release.",
                data={
                    "topic": component,
                    "reasoning": f"It held {k}k writes per second in the load test and the team already operates it.",
                },
                **base,
            )
            out.decisions.append(Decision(minute.id, choice, i))
        elif i % TASK_EVERY == 3:
            open_task = f"T-{thread_id}-{i}"
            minute = Minute(
                event_type="task_failed",
                memory_note=f"The migration step {n} failed: lock wait timeout on table {k}.",
                data={"task_id": open_task, "error": "lock wait timeout exceeded; try restarting transaction"},
                **base,
            )
        elif open_task is not None and i % TASK_EVERY == 9:
            minute = Minute(
                event_type="task_completed",
                memory_note=f"Reran the migration step with a {k} s lock wait; it went through.",
                data={"task_id": open_task, "success_criteria_met": rng.choice((80, 90, 100))},
                **base,
            )
            open_task = None
        else:
            text = FILLER[rng.randrange(len(FILLER))].format(
                n=n, k=k, ms=rng.randrange(20, 400), pct=rng.randrange(1, 99), total=k + rng.randrange(1, 10)
            )
            minute = Minute(
                event_type=rng.choice(("message", "observation", "tool_call")),
                memory_note=text,
                data={"reasoning": REASONS[rng.randrange(len(REASONS))]},
                **base,
            )
        out.minutes.append(minute)
    return out


def interleaved(threads: Sequence[GeneratedThread], rng: random.Random) -> Iterator[Minute]:
    """The threads' minutes as a shared stream carries them: each thread in order, threads mixed at random."""
    cursors = [0] * len(threads)
    live = [i for i, t in enumerate(threads) if t.minutes]
    while live:
        pick = live[rng.randrange(len(live))]
        yield threads[pick].minutes[cursors[pick]]
        cursors[pick] += 1
        if cursors[pick] == len(threads[pick].minutes):
            live.remove(pick)


class _Log:
    """Hands the pool records as the log pool would: a per-project seq, the stream entry time now."""

    def __init__(self) -> None:
        self.seqs: Counter[str] = Counter()

    def records(self, minutes: Sequence[Minute]) -> list[list[Any]]:
        now_ms = int(time.time() * 1000)
        out: list[list[Any]] = []
        for m in minutes:
            self.seqs[m.project_id] += 1
            out.append([m.id, self.seqs[m.project_id], encode_minute(m), now_ms])
        return out


# -- phase 1: the pool -------------------------------------------------------------------------------------------


def pool_phase(threads: int, seed: int, progress: Progress) -> dict[str, Any]:
    """`threads` threads through `summarize_batch`; its rate and the summaries' ratio, with the counts behind them."""
    rng = random.Random(seed)
    made = [
        generate_thread(f"bench-p{i % PROJECTS}", f"thread-{i}", THREAD_MINUTES, rng, T0 + timedelta(minutes=i))
        for i in range(threads)
    ]
    stream = list(interleaved(made, rng))
    progress.start("pool", f"{len(stream):,} minutes of {threads} threads in batches of {BATCH}")
    with workspace("summaries-pool") as ws:
        ctx = SummarizeContext.build(ws.connection, ws.settings)
        log = _Log()
        seconds, batches = 0.0, 0
        counts: Counter[str] = Counter()
        for start in range(0, len(stream), BATCH):
            records = log.records(stream[start : start + BATCH])
            began = time.perf_counter()
            out = summarize_batch(ctx, ws.connection, records)
            seconds += time.perf_counter() - began
            batches += 1
            if out["undecodable"]:
                raise BenchError(f"the pool could not decode {len(out['undecodable'])} minutes")
            counts.update(out["counts"])
            done = start + len(records)
            progress.tick(f"{done:,} minutes, {done / max(seconds, 1e-9):,.0f}/s so far")
        store = SummaryStore(ws.connection)
        chunks = [c for t in made for c in store.thread_view(t.project_id, ThreadRef.parse(t.thread_id), 0).chunks]
        box = machine(ws.connection)
    if not chunks:
        raise BenchError("the pool made no chunk")
    summary_tokens = sum(estimate_tokens(c.summary) for c in chunks)
    line_tokens = sum(estimate_tokens(chunk_line(c.to_dict())) for c in chunks)
    chunk_tokens = sum(c.tokens for c in chunks)
    seconds = max(round(seconds, 6), 1e-6)  # the rate from the seconds reported: the JSON's figures agree
    return {
        "summarize_per_s": round(len(stream) / seconds),
        "summary_ratio": round(summary_tokens / chunk_tokens, 4),
        "throughput": {
            "minutes": len(stream),
            "threads": threads,
            "projects": min(threads, PROJECTS),
            "batches": batches,
            "seconds": seconds,
            "basis": "minutes / seconds inside summarize_batch (extractive summarizer, 1 process)",
        },
        "ratio": {
            "chunks": len(chunks),
            "merged_chunks": sum(1 for c in chunks if c.merged > 1),
            "summary_tokens": summary_tokens,
            "chunk_tokens": chunk_tokens,
            "summary_line_tokens": line_tokens,
            "summary_line_ratio": round(line_tokens / chunk_tokens, 4),
            "pool_counts": dict(sorted(counts.items())),
            "basis": "tokens of the chunks' summaries / tokens their minutes cost verbatim (reader estimate)",
        },
        "redis_server": box.get("redis_server"),
    }


# -- phase 2: a 250-minute thread's context ----------------------------------------------------------------------


def long_thread_phase(seed: int, budget: int = LONG_THREAD_BUDGET, minutes: int = THREAD_MINUTES) -> dict[str, Any]:
    """A `minutes`-long thread through the pool, then its context within `budget` tokens: which decisions it names."""
    thread = generate_thread("bench-long", "release-train", minutes, random.Random(seed + 1), T0)
    with workspace("summaries-thread") as ws:
        ctx = SummarizeContext.build(ws.connection, ws.settings)
        log = _Log()
        for start in range(0, len(thread.minutes), 50):  # as a steady thread arrives: a few batches
            summarize_batch(ctx, ws.connection, log.records(thread.minutes[start : start + 50]))
        reader = ContextReader(ws.connection, LogReader(ws.settings.log_dir))
        package = reader.build_context(thread.project_id, AGENTS[0], budget_tokens=budget, thread=thread.thread_id)
    text = package.render().lower()
    sections = {
        "recent": " ".join(str(m.get("memory_note") or "") for m in package.recent).lower(),
        "summaries": " ".join(str(c.get("summary") or "") for c in package.summaries).lower(),
        "episodes": " ".join(str(e.get("title") or "") + " " + str(e.get("summary") or "") for e in package.episodes),
    }
    named = [d for d in thread.decisions if d.choice.lower() in text]
    where: Counter[str] = Counter()
    for d in named:
        for name, body in sections.items():
            if d.choice.lower() in body.lower():
                where[name] += 1
                break
    return {
        "thread_250_decisions_kept": round(len(named) / len(thread.decisions), 4),
        "thread_250": {
            "minutes": minutes,
            "decisions": len(thread.decisions),
            "decisions_named": len(named),
            "missing": [
                {"minute": d.seq_in_thread + 1, "choice": d.choice} for d in thread.decisions if d not in named
            ],
            "named_first_in": dict(where),
            "budget_tokens": budget,
            "used_tokens": package.budget.used_tokens,
            "section_tokens": dict(package.budget.sections),
            "cut": dict(package.budget.cut),
            "recent_minutes": len(package.recent),
            "chunk_summaries": len(package.summaries),
            "episodes": len(package.episodes),
            "basis": "a decision is kept when the rendered context names its choice (no other minute does)",
        },
    }


# -- the run ------------------------------------------------------------------------------------------------------


def metric_table(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    met = verdicts(values, TARGETS)
    texts = target_texts(TARGETS)
    return {k: {"value": values.get(k), "target": texts[k], "met": met[k]} for k in TARGETS}


def run(quick: bool, seed: int = SEED, progress: Progress | None = None) -> dict[str, Any]:
    """Both phases; the result as `--json` prints it (without `elapsed_s`)."""
    progress = progress or Progress()
    load_before = os.getloadavg()
    threads = QUICK_THREADS if quick else THREADS
    pool = pool_phase(threads, seed, progress)
    progress.start("thread_250", f"a {THREAD_MINUTES}-minute thread's context in {LONG_THREAD_BUDGET:,} tokens")
    long = long_thread_phase(seed)
    values = {
        "summarize_per_s": pool["summarize_per_s"],
        "summary_ratio": pool["summary_ratio"],
        "thread_250_decisions_kept": long["thread_250_decisions_kept"],
    }
    box = machine()
    box["redis_server"] = pool["redis_server"]
    box["load_average_before"] = [round(x, 2) for x in load_before]
    box["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return {
        "benchmark": "lifecycle_summaries",
        "seed": seed,
        "quick": quick,
        "metrics": metric_table(values),
        "met": verdicts(values, TARGETS),
        "targets": target_texts(TARGETS),
        "throughput": pool["throughput"],
        "ratio": pool["ratio"],
        "thread_250": long["thread_250"],
        "config": {
            "summarizer": "extractive",
            "thread_minutes": THREAD_MINUTES,
            "decision_every": DECISION_EVERY,
            "batch": BATCH,
            "summary_recent": defaults.SUMMARY_RECENT,
            "summary_chunk": defaults.SUMMARY_CHUNK,
            "summary_max_chunks": defaults.SUMMARY_MAX_CHUNKS,
            "summary_ratio_setting": defaults.SUMMARY_RATIO,
            "context_recent_share": defaults.CONTEXT_RECENT_SHARE,
            "context_retrieved_share": defaults.CONTEXT_RETRIEVED_SHARE,
        },
        "machine": box,
    }


def table(result: dict[str, Any]) -> str:
    lines = [f"{'METRIC':<28}{'TARGET':<12}{'VALUE':>10}"]
    for key in TARGETS:
        cell = result["metrics"][key]
        value = cell["value"]
        shown = f"{value:,}" if isinstance(value, int) else f"{value:.4g}"
        lines.append(f"{key:<28}{cell['target']:<12}{shown:>10} {VERDICT_WORDS[cell['met']]:>7}")
    long = result["thread_250"]
    lines += [
        "",
        f"pool: {result['throughput']['minutes']:,} minutes of {result['throughput']['threads']} threads, "
        f"{result['ratio']['chunks']:,} chunks",
        f"thread_250: {long['decisions_named']}/{long['decisions']} decisions named in {long['used_tokens']:,} of "
        f"{long['budget_tokens']:,} tokens; missing: {', '.join(d['choice'] for d in long['missing']) or 'none'}",
        footer(result, f"seed {result['seed']}{', quick' if result['quick'] else ''}"),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(
        "bench/lifecycle_summaries.py",
        __doc__,
        epilog=(
            "Progress goes to stderr; the result (a JSON object with --json) to stdout. Exit status 0 when every "
            "phase measured (targets missed or not), 1 when a phase failed, 130 on Ctrl-C."
        ),
    )
    parser.add_argument("--seed", type=int, default=SEED, help="the generated threads' seed (default %(default)s)")
    parser.add_argument(
        "--quick", action="store_true", help=f"a bounded smoke run: {QUICK_THREADS} threads in the pool phase"
    )
    args = parse(parser, argv)
    started = time.monotonic()
    with measuring("summaries bench", "interrupted; Valkey stopped") as outcome:
        result = run(args.quick, args.seed)
    if outcome.exit_code is not None:
        return outcome.exit_code
    return report(result, started, args.json, table)


if __name__ == "__main__":
    sys.exit(main())

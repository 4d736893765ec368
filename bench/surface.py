#!/usr/bin/env python
"""Agent-surface benchmark: the ways agents and people reach PVM's memory, one metric per function.

Every metric is a function `measure(scale, seed, progress) -> dict` in the
`METRICS` registry with its target; each runs in a fresh workspace of its own
(temporary PVM_HOME, embedded Valkey, the embedded vector engine, no embedder)
and returns its value under its own name plus whatever detail explains it.
`--only NAME` runs some; the result holds every value, the targets, whether
each was met, and the `machine` object.

pair_round_p99_ms   one PAIR round (pvm/pair.py) with the checklist judge and
                    the extractive reviser, as `POST /v1/projects/{p}/pair`
                    runs it: judge the output, retrieve the top 5 memories
                    for each gap by hybrid search over a project of 10k
                    minutes (bench/sessions.py, loaded through the log and
                    index pools' code; `--minutes-scale` scales it), revise,
                    write the round's minutes through an `Emitter`. Incident
                    reports on the project's failures are judged against
                    criteria their memories can fill, over `--runs` runs
                    after a warm-up; each round's wall time, from its start
                    to its last minute written, is one sample.
                                                        target: p99 <= 50 ms

export_per_s        20,000 facts rendered as Markdown files with front-matter and
import_per_s        written to a folder; the folder read back and diffed against
                    the store (bench/surface_memory.py, best of 3 runs each).
                                                        target: >= 5,000 facts/s each
mcp_call_p99_ms     `search` over MCP (`pvm serve --mcp`, streamable HTTP) from a
                    client process, at 100k minutes (bench/surface_mcp.py).
                                                        target: p99 <= 20 ms

To add a metric: write
`measure_<name>(scale, seed, progress) -> dict` returning at least `{name: value}`,
and add one line to `METRICS`.

    .venv/bin/python bench/surface.py --json
    .venv/bin/python bench/surface.py --only pair_round_p99_ms --minutes-scale 0.1
"""

from __future__ import annotations

import gc
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
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
    report,
    target_texts,
    verdicts,
    workspace,
)
from bench.machine import machine
from contracts import Minute
from pvm import engines
from pvm.emitter import Emitter
from pvm.pair import Pair, SearchRetriever

Measure = Callable[[float, int, Progress], dict[str, Any]]


@dataclass(frozen=True)
class Metric:
    """A registered metric: how to measure it, its target (op, bound, unit) and one line on what it is."""

    measure: Measure
    target: tuple[str, float, str]
    what: str


# -- pair_round_p99_ms ------------------------------------------------------------------------------------------------

PAIR_PROJECT = "bench-main"
PAIR_MINUTES = 10_000  # in the measured project, at --minutes-scale 1
PAIR_RUNS = 200
PAIR_WARMUP = 20


@dataclass(frozen=True)
class PairCase:
    """An incident report to judge: the task, criteria the project's memories can fill, a first draft."""

    task: str
    criteria: tuple[str, ...]
    output: str


def pair_cases(minutes: Sequence[Minute], n: int, seed: int) -> list[PairCase]:
    """Reports on the project's failures: the draft names the failure; the criteria ask for its cause and owner."""
    failures = [m for m in minutes if m.event_type == "task_failed" and m.project_id == PAIR_PROJECT]
    if not failures:
        raise BenchError(f"the generated sessions hold no task_failed minute in {PAIR_PROJECT}")
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        failed = rng.choice(failures)
        note = failed.memory_note or ""
        thing = note.removeprefix("the ").split(" broke")[0]
        error = str(failed.data.get("error") or "")
        cases.append(
            PairCase(
                task=f"Write the incident report for the {thing} outage ({failed.data.get('task_id')})",
                criteria=(
                    f"Names the root cause of the {thing} outage",
                    f'Quotes "{error}"' if error else f"Says what broke on the {thing}",
                    f"Names who the {thing} fix was handed to",
                    "Does not blame a person",
                ),
                output=f"Incident report: the {thing} failed during the rollout and was restored.",
            )
        )
    return cases


def measure_pair_round(scale: float, seed: int, progress: Progress) -> dict[str, Any]:
    """pair_round_p99_ms: one PAIR round (checklist judge, extractive reviser) over a 10k-minute project."""
    from bench.reader import Feed, Loader, build_minutes, load, optimize

    main = max(100, round(PAIR_MINUTES * scale))
    runs = max(20, round(PAIR_RUNS * min(1.0, scale * 10)))
    progress.tick(f"pair: building {main:,} minutes of {PAIR_PROJECT}", force=True)
    built = build_minutes(main, seed)
    cases = pair_cases([m for m, _ in built], runs + PAIR_WARMUP, seed)
    with workspace("surface-pair") as ws:
        try:
            loader = Loader(ws.settings, ws.connection)
            load(loader, Feed(iter(built)), main, progress)
            optimize(engines.shared_engine(ws.settings), "pair", progress)
            searcher = engines.searcher_for(ws.settings)
            with Emitter(settings=ws.settings, connection=ws.connection) as emitter:
                marks: list[float] = []

                def record(minute: Minute) -> None:
                    emitter.emit(minute)
                    marks.append(time.perf_counter())

                pair = Pair(retriever=SearchRetriever(searcher), record=record)  # type: ignore[arg-type]
                progress.tick(f"pair: warming up ({PAIR_WARMUP} runs)", force=True)
                for case in cases[:PAIR_WARMUP]:
                    pair.run(PAIR_PROJECT, case.task, case.criteria, case.output)
                gc.collect()
                samples: list[float] = []
                rounds_per_run: list[int] = []
                scores: list[tuple[int, int]] = []
                stops: dict[str, int] = {}
                retrieved: list[int] = []
                progress.tick(f"pair: timing {runs} runs", force=True)
                load_before = os.getloadavg()[0]
                for case in cases[PAIR_WARMUP:]:
                    marks.clear()
                    started = time.perf_counter()
                    result = pair.run(PAIR_PROJECT, case.task, case.criteria, case.output)
                    ends = [marks[result.minute_ids.index(r.revision_id or r.evaluation_id)] for r in result.rounds]
                    samples.extend((end - start) * 1000 for start, end in zip([started, *ends], ends, strict=False))
                    rounds_per_run.append(len(result.rounds))
                    scores.append((result.rounds[0].score, result.score))
                    stops[result.stopped] = stops.get(result.stopped, 0) + 1
                    retrieved.extend(len(r.memories) for r in result.rounds[0].retrieved)
                    progress.tick(f"pair: {len(rounds_per_run)}/{runs} runs")
                load_after = os.getloadavg()[0]
                sample = pair.run(PAIR_PROJECT, cases[0].task, cases[0].criteria, cases[0].output).to_dict()
        finally:
            engines.close_shared()
    samples.sort()
    return {
        "pair_round_p99_ms": round(percentile(samples, 99), 3),
        "pair": {
            "project_minutes": main,
            "runs": runs,
            "rounds": len(samples),
            "round_p50_ms": round(percentile(samples, 50), 3),
            "round_max_ms": round(samples[-1], 3),
            "rounds_per_run_mean": round(sum(rounds_per_run) / len(rounds_per_run), 2),
            "first_score_mean": round(sum(a for a, _ in scores) / len(scores), 1),
            "final_score_mean": round(sum(b for _, b in scores) / len(scores), 1),
            "stopped": stops,
            "memories_per_gap_mean": round(sum(retrieved) / max(1, len(retrieved)), 2),
            # The 1-minute load average around the timed runs: above the core count, others shared the CPUs.
            "load_avg": [round(load_before, 2), round(load_after, 2)],
            "sample_run": {k: sample[k] for k in ("score", "stopped", "output")}
            | {"scores": [r["score"] for r in sample["rounds"]]},
        },
    }


# -- export_per_s, import_per_s (bench/surface_memory.py) and mcp_call_p99_ms (bench/surface_mcp.py) ---------------


def measure_memory_files(scale: float, seed: int, progress: Progress) -> dict[str, Any]:
    """`bench/surface_memory.py`: 20,000 facts (2,000 below scale 1) exported to Markdown files and imported back."""
    from bench import surface_memory

    result = surface_memory.run(quick=scale < 1, seed=seed, progress=progress)
    values = {name: metric["value"] for name, metric in result["metrics"].items()}
    return {**values, "memory_files": result}


def measure_mcp_call(scale: float, seed: int, progress: Progress) -> dict[str, Any]:
    """`bench/surface_mcp.py`: search over MCP (`pvm serve --mcp`) at 100k minutes (scaled), from a client process."""
    from bench import surface_mcp

    result = surface_mcp.run(max(1_000, round(surface_mcp.MAIN_MINUTES * scale)), surface_mcp.CALLS, seed, progress)
    result.pop("machine", None)  # the report's own
    return {"mcp_call_p99_ms": result["mcp_call_p99_ms"], "mcp": result}


# -- the registry ----------------------------------------------------------------------------------------------------

METRICS: dict[str, Metric] = {
    "pair_round_p99_ms": Metric(
        measure_pair_round, ("<=", 50.0, "ms"), "one PAIR round, checklist judge, 10k-minute project"
    ),
    "export_per_s": Metric(measure_memory_files, (">=", 5_000.0, "facts/s"), "facts exported as Markdown files"),
    "import_per_s": Metric(measure_memory_files, (">=", 5_000.0, "facts/s"), "an unedited export imported back"),
    "mcp_call_p99_ms": Metric(measure_mcp_call, ("<=", 20.0, "ms"), "search over MCP at 100k minutes"),
}


def run(names: Sequence[str], scale: float, seed: int, progress: Progress) -> dict[str, Any]:
    """Each named metric in a workspace of its own; the values, details, targets and verdicts."""
    result: dict[str, Any] = {"minutes_scale": scale, "seed": seed}
    done: set[Measure] = set()
    for name in names:
        measure = METRICS[name].measure
        if measure not in done:  # export and import are one measurement
            done.add(measure)
            result.update(measure(scale, seed, progress))
    targets = {name: METRICS[name].target for name in names}
    result["targets"] = target_texts(targets)
    result["met"] = verdicts(result, targets)
    return result


def table(result: dict[str, Any]) -> str:
    lines = [f"{'metric':<22} {'value':>12}  {'target':<12} met"]
    for name, target in result["targets"].items():
        unit = METRICS[name].target[2]
        lines.append(
            f"{name:<22} {result.get(name, float('nan')):>12,.3f}  {target + ' ' + unit:<12} "
            f"{VERDICT_WORDS[result['met'][name]]}"
        )
    lines.append(footer(result, f"minutes scale {result['minutes_scale']:g}"))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser("bench/surface.py", __doc__ or "")
    add_minutes_scale(parser, f"scales the measured project ({PAIR_MINUTES:,} minutes at 1.0)")
    parser.add_argument(
        "--only", action="append", choices=sorted(METRICS), help="measure only this metric (repeatable)"
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the generated sessions (default 7)")
    args = parse(parser, argv)
    started = time.monotonic()
    names = args.only or list(METRICS)
    with measuring("surface") as outcome:
        result = run(names, args.minutes_scale, args.seed, Progress("surface"))
    if outcome.exit_code:
        return outcome.exit_code
    return report(result, started, args.json, table, machine())


if __name__ == "__main__":
    sys.exit(main())

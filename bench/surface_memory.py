#!/usr/bin/env python
"""Markdown memory benchmark: how many facts per second `pvm export` writes and `pvm import` reads back.

A project's memory is generated (seed 11 by default): 20,000 facts (--quick: 2,000) of all seven types in the
task and project tiers, each in a slot of its own, with tags, sources and multi-line text, applied to a fresh
embedded Valkey the way the facts pool applies them (`FactStore.apply_changes` on fact_asserted minutes). Then:

- export      `read_snapshot` + `export_files` + `write_folder` into a new, empty folder: what `pvm export
              --out <new folder>` does. export_per_s = facts / seconds. `export_render_per_s` leaves the
              folder out (read and render only), so a slow disk shows as the difference.
- import      `read_folder` + `read_snapshot` + `plan_import` of the unedited folder: what `pvm import` does
              before it writes (it writes nothing: an unedited export is no change; the run checks it).
                import_per_s = facts / seconds.
- edited      the same with 10% of the files edited (text and importance): the plan holds exactly one
              fact_edited minute per edited file (checked), built but not written.
                import_edited_per_s = facts / seconds.

Each phase runs three times; the best run counts (the machine is shared). Targets (issue 13): export and
import >= 5,000 facts/s. A missed target is reported as missed; nothing is tuned to pass.

    .venv/bin/python bench/surface_memory.py --json > bench/results/surface-memory.json
    .venv/bin/python bench/surface_memory.py --quick --json    # a smoke run, seconds
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench.harness import (
    VERDICT_WORDS,
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
from contracts import new_minute_id
from contracts.fact_changes import asserted_minute, fact_change
from contracts.facts import Fact, FactType, TierKey
from pvm.stores.facts import FactStore
from workers.agent.memory_files import export_files, plan_import, read_folder, read_snapshot, write_folder
from workers.agent.memory_front_matter import parse as parse_file

SEED = 11
FACTS = 20_000
QUICK_FACTS = 2_000
RUNS = 3
EDITED_SHARE = 0.1
PROJECT = "surface"
APPLY_BATCH = 1_000

TARGETS: dict[str, tuple[str, float]] = {
    "export_per_s": (">=", 5_000),
    "import_per_s": (">=", 5_000),
}


def seed_facts(connection: Any, count: int, seed: int) -> None:
    """`count` facts of `PROJECT`, applied as the facts pool applies their fact_asserted minutes."""
    rng = random.Random(seed)
    types = list(FactType)
    store = FactStore(connection)
    minutes = []
    for i in range(count):
        tier = TierKey.for_task(PROJECT, f"T-{i % 50}") if rng.random() < 0.3 else TierKey.for_project(PROJECT)
        fact = Fact.new(
            type=rng.choice(types),
            text=f"Service {i} keeps its {rng.choice(['cache', 'queue', 'db'])} setting.\nDecided in review {i % 97}.",
            subject=f"service:{i}",
            attribute=rng.choice(["owner", "ttl", "engine", "port", "region"]),
            value=f"value {rng.randint(1, 10_000)}",
            tier_key=tier,
            confidence=round(rng.random(), 3),
            source_minute_ids=[new_minute_id() for _ in range(rng.randint(1, 3))],
            status=rng.choice(["pending", "promoted"]),
            tags=rng.sample(["ops", "db", "auth", "perf"], rng.randint(0, 2)),
        )
        minutes.append(asserted_minute(fact))
        if len(minutes) == APPLY_BATCH:
            store.apply_changes([(m, fact_change(m)) for m in minutes])
            minutes = []
    if minutes:
        store.apply_changes([(m, fact_change(m)) for m in minutes])


def best(runs: int, step: Callable[[], Any]) -> tuple[float, Any]:
    """The fastest of `runs` runs of `step` (seconds) and its last answer."""
    fastest, answer = float("inf"), None
    for _ in range(runs):
        started = time.perf_counter()
        answer = step()
        fastest = min(fastest, time.perf_counter() - started)
    return fastest, answer


def edit(folder: str, share: float, seed: int) -> int:
    """Edit `share` of the fact files under `folder` (text and importance); how many were edited."""
    rng = random.Random(seed)
    files = read_folder(folder)
    chosen = rng.sample(sorted(files), int(len(files) * share))
    for path in chosen:
        text = files[path]
        front, _ = parse_file(path, text)
        text = text.replace(f"importance: {front['importance']!r}", "importance: 0.99", 1)
        with open(os.path.join(folder, path), "w", encoding="utf-8") as f:
            f.write(text.rstrip("\n") + "\nEdited by the benchmark.\n")
    return len(chosen)


def run(
    quick: bool, seed: int = SEED, progress: Progress | None = None, folder_root: str | None = None
) -> dict[str, Any]:
    """The three phases; the result as `--json` prints it (without `elapsed_s`)."""
    progress = progress or Progress()
    count = QUICK_FACTS if quick else FACTS
    load_before = os.getloadavg()
    with (
        workspace("surface-memory") as ws,
        tempfile.TemporaryDirectory(prefix="pvm-bench-memory-", dir=folder_root) as folder,
    ):
        connection = ws.connection
        progress.start("seed", f"{count:,} facts applied to the store")
        seed_facts(connection, count, seed)

        fresh = iter(range(RUNS))

        def export() -> int:
            return write_folder(
                os.path.join(folder, f"run-{next(fresh)}"), export_files(read_snapshot(connection, PROJECT))
            )

        def render() -> dict[str, str]:
            return export_files(read_snapshot(connection, PROJECT))

        def import_plan() -> Any:
            return plan_import(read_snapshot(connection, PROJECT), read_folder(folder))

        progress.start("export", f"{RUNS} runs")
        export_s, written = best(RUNS, export)
        render_s, _ = best(RUNS, render)
        folder = os.path.join(folder, "run-0")
        progress.start("import", f"{RUNS} runs of the unedited folder")
        import_s, plan = best(RUNS, import_plan)
        if plan.changes or plan.unchanged != count:
            raise AssertionError(f"an unedited export planned {len(plan.changes)} minutes ({plan.unchanged} unchanged)")
        edited = edit(folder, EDITED_SHARE, seed)
        progress.start("edited", f"{RUNS} runs with {edited:,} files edited")
        edited_s, edited_plan = best(RUNS, import_plan)
        kinds = {c.minute.event_type for c in edited_plan.changes}
        if len(edited_plan.changes) != edited or kinds != {"fact_edited"}:
            raise AssertionError(f"{edited} edited files planned {len(edited_plan.changes)} minutes of {kinds}")
        box = machine(connection)
    values = {
        "export_per_s": round(count / export_s),
        "import_per_s": round(count / import_s),
    }
    box["load_average_before"] = [round(x, 2) for x in load_before]
    box["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    met = verdicts(values, TARGETS)
    texts = target_texts(TARGETS)
    return {
        "benchmark": "surface_memory",
        "seed": seed,
        "quick": quick,
        "metrics": {k: {"value": values[k], "target": texts[k], "met": met[k]} for k in TARGETS},
        "met": met,
        "targets": texts,
        "export_render_per_s": round(count / render_s),
        "import_edited_per_s": round(count / edited_s),
        # Creating thousands of small files is the file system's work: the folder's one is named.
        "folder_root": folder_root or tempfile.gettempdir(),
        "phases": {
            "facts": count,
            "files_written": written,
            "export_s": round(export_s, 4),
            "export_render_s": round(render_s, 4),
            "import_s": round(import_s, 4),
            "edited_files": edited,
            "edited_minutes": len(edited_plan.changes),
            "import_edited_s": round(edited_s, 4),
            "runs": RUNS,
        },
        "machine": box,
    }


def table(result: dict[str, Any]) -> str:
    lines = [f"{'METRIC':<22}{'TARGET':<12}{'VALUE':>10}"]
    for key in TARGETS:
        cell = result["metrics"][key]
        lines.append(f"{key:<22}{cell['target']:<12}{cell['value']:>10,} {VERDICT_WORDS[cell['met']]:>7}")
    phases = result["phases"]
    lines += [
        "",
        f"{phases['facts']:,} facts; export without the folder (read and render): "
        f"{result['export_render_per_s']:,} facts/s",
        f"import with {phases['edited_files']:,} files edited: "
        f"{result['import_edited_per_s']:,} facts/s ({phases['edited_minutes']:,} fact_edited minutes planned)",
        footer(
            result,
            f"seed {result['seed']}{', quick' if result['quick'] else ''}, best of {phases['runs']}, "
            f"folders in {result['folder_root']}",
        ),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser(
        "bench/surface_memory.py",
        __doc__,
        epilog="Progress goes to stderr; the result (a JSON object with --json) to stdout.",
    )
    parser.add_argument("--seed", type=int, default=SEED, help="the generated memory's seed (default %(default)s)")
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK_FACTS:,} facts")
    parser.add_argument(
        "--folder-root", help="where the export folders are made (default: the temporary directory); /dev/shm: no disk"
    )
    args = parse(parser, argv)
    started = time.monotonic()
    with measuring("surface memory bench", "interrupted; Valkey stopped") as outcome:
        result = run(args.quick, args.seed, folder_root=args.folder_root)
    if outcome.exit_code is not None:
        return outcome.exit_code
    return report(result, started, args.json, table)


if __name__ == "__main__":
    sys.exit(main())

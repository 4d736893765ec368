#!/usr/bin/env python
"""Lifecycle benchmark (issue 11): the summarize and evaluate pools, one JSON.

Runs the two parts one after the other, on the same machine, and reports every target of issue 11 in one table:

  summaries  (bench/lifecycle_summaries.py)  summarize_per_s >= 2,000, summary_ratio <= 0.2,
                                              thread_250_decisions_kept = 1.0
  evaluate   (bench/lifecycle_evaluate.py)   evaluate_per_s >= 10,000 (100k memories in <= 10 s),
                                              prune_precision >= 0.9, prune_recall >= 0.9,
                                              context_p99_ms_100k <= 10

Each part's own result (its counts, its `machine` with load averages) is kept under `parts`; `metrics` holds
every target as {"value", "target", "met"}. The parts' docstrings say how each figure is measured.

    .venv/bin/python bench/lifecycle.py --json
    .venv/bin/python bench/lifecycle.py --quick     # seconds: small sizes, for a smoke run
    .venv/bin/python bench/lifecycle.py --part summaries
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import lifecycle_evaluate, lifecycle_summaries
from bench.harness import VERDICT_WORDS, Progress, argument_parser, measuring, parse, report, target_texts, verdicts
from bench.machine import machine

PARTS = ("summaries", "evaluate")
TARGETS: dict[str, tuple[Any, ...]] = {**lifecycle_summaries.TARGETS, **lifecycle_evaluate.TARGETS}


def values(parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every targeted figure of the parts that ran, by its name."""
    out: dict[str, Any] = {}
    if "summaries" in parts:
        out.update({k: cell["value"] for k, cell in parts["summaries"]["metrics"].items()})
    if "evaluate" in parts:
        out.update({k: parts["evaluate"].get(k) for k in lifecycle_evaluate.TARGETS})
    return out


def run(quick: bool, only: Sequence[str] = PARTS, progress: Progress | None = None) -> dict[str, Any]:
    progress = progress or Progress("lifecycle")
    parts: dict[str, dict[str, Any]] = {}
    if "summaries" in only:
        parts["summaries"] = lifecycle_summaries.run(quick, progress=progress)
    if "evaluate" in only:
        parts["evaluate"] = lifecycle_evaluate.run(quick, progress)
    figures = values(parts)
    met = verdicts(figures, TARGETS)
    texts = target_texts(TARGETS)
    return {
        "benchmark": "lifecycle",
        "quick": quick,
        "metrics": {k: {"value": figures.get(k), "target": texts[k], "met": met[k]} for k in TARGETS if k in figures},
        "parts": parts,
        "machine": machine(),
    }


def table(result: dict[str, Any]) -> str:
    lines = [f"{'METRIC':<28}{'TARGET':<12}{'VALUE':>12}"]
    for key, cell in result["metrics"].items():
        value = cell["value"]
        shown = "-" if value is None else f"{value:,}" if isinstance(value, int) else f"{value:.4g}"
        lines.append(f"{key:<28}{cell['target']:<12}{shown:>12} {VERDICT_WORDS[cell['met']]:>7}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser("bench/lifecycle.py", __doc__ or "")
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds), for a smoke run")
    parser.add_argument("--part", choices=PARTS, action="append", help="run only this part (repeatable)")
    args = parse(parser, argv)
    started = time.monotonic()
    with measuring("lifecycle bench", "interrupted; Valkey stopped") as outcome:
        result = run(args.quick, args.part or PARTS)
    if outcome.exit_code is not None:
        return outcome.exit_code
    return report(result, started, args.json, table)


if __name__ == "__main__":
    sys.exit(main())

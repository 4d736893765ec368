"""`pvm pair`: judge an output against its task's success criteria, revise it from the project's memory, judge
again; via the reader API."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pvm.config import Settings
from workers.ops.cli.plumbing import positive_int, project_id, reader_api
from workers.ops.tables import table


def _pair_output(source: str) -> str | None:
    """The text of `--output`: a file's, or stdin's for ``-``; None (and why, on stderr) when it cannot be read."""
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        print(f"pvm pair: --output {source}: {why}: name a readable UTF-8 file, or - for stdin", file=sys.stderr)
        return None


def _gap_text(gap: dict[str, Any]) -> str:
    parts = []
    if gap["missing"]:
        parts.append("missing " + ", ".join(gap["missing"]))
    if gap["forbidden"]:
        parts.append("holds " + ", ".join(gap["forbidden"]))
    return "; ".join(parts) or f"scored {gap['score']}"


def cmd_pair(args: argparse.Namespace, settings: Settings) -> int:
    """`pvm pair`: a PAIR run via the reader API; exit 0 when the output reached the target, 1 when not."""
    output = _pair_output(args.output)
    if output is None:
        return 2
    with reader_api(settings) as api:
        run = api.pair(
            args.project,
            args.task,
            args.criteria,
            output,
            task_id=args.task_id,
            agent_id=args.agent,
            rounds=args.rounds,
            target=args.target,
        )
    if args.json:
        print(json.dumps(run, indent=2))
        return 0 if run["reached_target"] else 1
    rows = []
    for r in run["rounds"]:
        gaps = "; ".join(f"{g['criterion']}: {_gap_text(g)}" for g in r["gaps"])
        rows.append({"round": r["round"], "score": r["score"], "judge": r["judge"], "gaps": gaps or "-"})
    print(table(rows, ["round", "score", "judge", "gaps"]))
    for r in run["rounds"]:
        if r["judge_fallback"] or r["reviser_fallback"]:
            print(f"round {r['round']}: {r['judge_fallback'] or r['reviser_fallback']}")
    print(f"\nstopped: {run['stopped']}; score {run['score']}/100 (target {run['target']})\n")
    print(run["output"])
    return 0 if run["reached_target"] else 1


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `pvm pair` to the `pvm` subcommands."""
    pair = sub.add_parser(
        "pair",
        help="PAIR: judge an output against its task's success criteria, revise it from memory, re-judge",
        description="Check an output against its task's success criteria via the reader API (PVM_API_URL). A fresh "
        "judge (PVM_PAIR_JUDGE: checklist or llm) scores it 0-100 and names the gaps; the project's memories are "
        "retrieved for each gap; a reviser (PVM_PAIR_REVISER) writes a revision; the revision is judged again, "
        "until the score reaches PVM_PAIR_TARGET (95) or PVM_PAIR_ROUNDS (3) judgments. Every round is written "
        "as a minute (pair_evaluation, pair_revision). Prints a table of the rounds and the best output; exit "
        "status 0 when it reached the target, 1 when not.",
        epilog="example: pvm pair --project apollo --task 'Plan the rollout' --criteria 'Mentions the rollback "
        "plan' --criteria 'p99 latency under 200 ms' --output answer.md",
    )
    pair.add_argument("--project", required=True, type=project_id, help="project id (its memory fills the gaps)")
    pair.add_argument("--task", required=True, help="the original task, as the agent was given it")
    pair.add_argument(
        "--criteria",
        action="append",
        required=True,
        metavar="CRITERION",
        help='one success criterion (repeat for each): terms to mention, "quoted phrases", numbers, bounds '
        "('under 200 ms'), negations ('does not mention X'); see docs/pair.md",
    )
    pair.add_argument("--output", required=True, metavar="FILE", help="the output to judge: a file, or - for stdin")
    pair.add_argument("--task-id", help="the task's id: the evaluate pool reads the score as the task's outcome")
    pair.add_argument("--agent", help="whose output it is (the minutes' agent_id)")
    pair.add_argument("--rounds", type=positive_int, help="judgments at most (default: the server's PVM_PAIR_ROUNDS)")
    pair.add_argument("--target", type=positive_int, help="score that stops the loop (default: PVM_PAIR_TARGET)")
    pair.add_argument("--json", action="store_true", help="the run as JSON (rounds, gaps, memories, revisions)")
    pair.set_defaults(func=cmd_pair)

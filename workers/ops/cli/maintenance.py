"""`pvm evaluate` and `pvm optimize`: the maintenance the scheduler runs every so often, run by hand."""

from __future__ import annotations

import argparse
import json

from pvm import defaults
from pvm.config import Settings
from workers.ops.cli.plumbing import connect, project_id
from workers.ops.tables import table


def cmd_evaluate(args: argparse.Namespace, settings: Settings) -> int:
    """`pvm evaluate --project P [--dry-run]`: one evaluation run by hand, or what it would do."""
    import time

    from workers.evaluate import pool as evaluate_pool
    from workers.runtime.queues import live_workers, pool_queue

    connection = connect(settings)
    if args.global_tier:
        args.project = evaluate_pool.GLOBAL_RUN
    if args.dry_run:
        report = evaluate_pool.evaluate_here(connection, settings, args.project)
        if args.json:
            print(json.dumps(report.to_dict(), indent=2))
            return 0
        pruned = [p for p in report.pruned if p["why"] != "merged"]
        print(
            f"pvm evaluate --dry-run {args.project}: {report.scored:,} minutes and {report.facts_scored:,} facts "
            f"scored in {report.slices} slices (nothing written)"
        )
        print(f"\nWOULD PRUNE ({len(pruned)}; {report.tokens_reclaimed:,} tokens reclaimed with the merges)")
        print(table(pruned[: args.limit], ["id", "kind", "why", "composite", "tokens"]) if pruned else "  nothing")
        print(f"\nWOULD MERGE ({len(report.merged)} groups of near-duplicates into their best-scored memory)")
        rows = [{**m, "absorbed": ", ".join(m["absorbed"])} for m in report.merged[: args.limit]]
        print(table(rows, ["survivor", "absorbed", "similarity"]) if rows else "  nothing")
        print(f"\nCONFLICTS ({len(report.conflicts)}: the loser ranks lower)")
        print(table(report.conflicts[: args.limit], ["winner", "loser"]) if report.conflicts else "  none")
        print(f"\nWOULD RESCORE ({len(report.rescored)} composites change)")
        rows = report.rescored[: args.limit]
        print(table(rows, ["id", "before", "after"]) if rows else "  nothing")
        return 0
    queue = pool_queue("evaluate", connection)
    if not args.no_wait and not live_workers(connection, queue.name):
        raise SystemExit(
            "pvm evaluate: no evaluate worker is running: start `pvm serve` (embedded engine), `pvm up`, or "
            "`pvm worker evaluate` (Qdrant server); or pass --no-wait to queue the run, or --dry-run"
        )
    run_id = evaluate_pool.enqueue_run(connection, settings, args.project)
    if run_id is None:
        raise SystemExit(f"pvm evaluate: {args.project} is being evaluated already; see `pvm status`")
    if args.no_wait:
        print(f"pvm evaluate: run {run_id} of {args.project} queued")
        return 0
    while (state := evaluate_pool.run_state(connection, args.project)).get("status") == "running":
        time.sleep(defaults.EVALUATE_WAIT_POLL_S)
    if args.json:
        print(json.dumps(state, indent=2))
    else:
        print(
            f"pvm evaluate: run {run_id} of {args.project} {state.get('status')}: {state.get('scored', 0):,} "
            f"memories scored, {state.get('pruned', 0):,} pruned or merged, in {state.get('slices_done', 0)} slices"
        )
    return 0 if state.get("status") == "done" else 1


def cmd_optimize(args: argparse.Namespace, settings: Settings) -> int:
    from contracts import keys
    from workers.runtime.queues import enqueue_pool_job, pool_queue

    queue = pool_queue("index", connect(settings))
    job = enqueue_pool_job(
        queue, keys.INDEX_OPTIMIZE_JOB, (args.project,), timeout=defaults.OPTIMIZE_JOB_TIMEOUT_S, retries=0
    )
    print(f"optimize of {args.project or 'every project'} queued for the index worker (job {job.id})")
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `pvm evaluate` and `optimize` to the `pvm` subcommands."""
    evaluate = sub.add_parser(
        "evaluate",
        help="score, dedupe and prune a project's memories now (or --dry-run: print what it would do)",
        description="One evaluation run of a project, as the scheduler starts every PVM_EVALUATE_EVERY seconds: "
        "scores every indexed minute and fact, merges near-duplicates, flags contradictions and prunes stale "
        "memories from the vector store and hot caches (never the log; `pvm replay` restores them). Queued for "
        "the evaluate worker, waited for; --dry-run runs here and writes nothing.",
    )
    scope = evaluate.add_mutually_exclusive_group(required=True)
    scope.add_argument("--project", type=project_id, help="the project")
    scope.add_argument(
        "--global", dest="global_tier", action="store_true", help="the global tier's facts (their own run, `_global`)"
    )
    evaluate.add_argument("--dry-run", action="store_true", help="print what it would prune, merge and rescore")
    evaluate.add_argument("--no-wait", action="store_true", help="queue the run and return")
    evaluate.add_argument("--limit", type=int, default=20, help="rows per table of a dry run (default 20)")
    evaluate.add_argument("--json", action="store_true", help="machine-readable output")
    evaluate.set_defaults(func=cmd_evaluate)

    optimize = sub.add_parser(
        "optimize", help="optimize the embedded engine's shards (queued for the index worker that owns them)"
    )
    optimize.add_argument("--project", type=project_id, help="one project (default: all)")
    optimize.set_defaults(func=cmd_optimize)

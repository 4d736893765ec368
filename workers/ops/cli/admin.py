"""`pvm status`, `log tail`, `dead`, `failed`, `token new` and `replay`: an operator's look into a running stack,
and its repairs."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pvm.config import Settings
from workers.ops.cli.plumbing import connect, positive_int, project_id, shard_number, shards_of, stream_id
from workers.ops.tables import age, log_tail_text, minute_row, table

if TYPE_CHECKING:
    from workers.runtime.state import GroupState


def cmd_log_tail(args: argparse.Namespace, settings: Settings) -> int:
    from pvm.stores.log import LogReader

    reader = LogReader(settings.log_dir)
    if args.project not in reader.projects():
        known = ", ".join(reader.projects()) or "none yet"
        print(f"pvm: no log for project {args.project!r} in {settings.log_dir} (projects: {known})", file=sys.stderr)
        return 2
    records = reader.get_recent(args.project, args.n)
    rows = [minute_row(r) for r in records]
    if args.json:
        print(json.dumps({"project_id": args.project, "count": reader.count(args.project), "minutes": rows}, indent=2))
    else:
        print(log_tail_text(args.project, reader.count(args.project), rows))
    return 0


def _due(in_s: float | None, ran: bool) -> str:
    if not ran:
        return "now"  # a schedule that never ran is due at the leader's next tick
    if in_s is None:
        return "-"
    return f"in {age(in_s)}" if in_s > 0 else f"overdue {age(-in_s)}"


LAG_MARKS = {"computed": "*", "lower-bound": "+"}  # Redis gave a NULL lag: counted, or counted up to the cap


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from workers.ops.exporter import snapshot

    snap = snapshot(connect(settings), settings)
    if args.json:
        print(json.dumps(snap.to_dict(), indent=2))
        return 0
    print("POOLS")
    rows = [
        {
            "pool": q.pool,
            "queue": q.queue,
            "queued": q.queued,
            "dequeued": q.dequeued,  # taken, not started: a moment's 1 per worker; one that stays is stranded
            "running": q.started,
            "failed": q.failed,
            "workers": q.workers,
            "oldest waiting": age(q.oldest_waiting_s),
        }
        for q in snap.queues
    ]
    print(table(rows, ["pool", "queue", "queued", "dequeued", "running", "failed", "workers", "oldest waiting"]))
    print("\nSTREAMS")
    rows = []
    for s in snap.streams:
        groups: Sequence[GroupState | None] = s.groups or [None]
        for g in groups:
            rows.append(
                {
                    "shard": s.shard,
                    "length": s.length,
                    "group": g.name if g else "-",
                    "lag": f"{g.lag}{LAG_MARKS.get(g.lag_source, '')}" if g else "-",
                    "pending": g.pending if g else "-",
                    "oldest pending": age(g.oldest_pending_age_s) if g else "-",
                    "dead letters": s.dead_letters,
                }
            )
    print(table(rows, ["shard", "length", "group", "lag", "pending", "oldest pending", "dead letters"]))
    print("\nFRESHNESS (emit -> stage)")
    rows = [
        {"stage": stage, "p50": age(f["p50_s"]), "p99": age(f["p99_s"]), "minutes": int(f["count"] or 0)}
        for stage, f in snap.freshness.items()
    ]
    print(table(rows, ["stage", "p50", "p99", "minutes"]) if rows else "  nothing recorded yet")
    print("\nFACTS (what the facts pool did)")
    print("  " + ", ".join(f"{change} {count:,}" for change, count in snap.fact_changes.items()))
    print("\nEVALUATION (the evaluate pool's runs, by project)")
    rows = [
        {
            "project": run["project_id"],
            "run": run.get("status", "-"),
            "mode": run.get("mode", "-"),
            "slices": f"{run.get('slices_done', 0)}/{run.get('minute_slices', 0)}+facts" if run.get("run_id") else "-",
            "scored": run.get("scored", 0),
            "pruned": run.get("pruned", 0),
            "last completed": "never"
            if run.get("last_completed") is None
            else f"{age(snap.taken_at - run['last_completed'])} ago",
        }
        for run in snap.evaluations
    ]
    print(
        table(rows, ["project", "run", "mode", "slices", "scored", "pruned", "last completed"])
        if rows
        else "  no run yet"
    )
    print("  " + ", ".join(f"{what} {count:,}" for what, count in snap.evaluate.items()))
    print("\nSUMMARIES (what the summarize pool did)")
    print("  " + ", ".join(f"{what} {count:,}" for what, count in snap.summaries.items()))
    print(f"\nSCHEDULES (leader: {snap.scheduler_leader or 'none'})")
    rows = [
        {
            "schedule": sched.name,
            "every": age(sched.every_s),
            "last run": "never" if sched.last_run_age_s is None else f"{age(sched.last_run_age_s)} ago",
            "next due": _due(sched.next_due_in_s, ran=sched.last_run_at is not None),
        }
        for sched in snap.schedules
    ]
    print(table(rows, ["schedule", "every", "last run", "next due"]) if rows else "  none recorded yet")
    dead = sum(s.dead_letters for s in snap.streams)
    failed = sum(q.failed for q in snap.queues)
    if dead or failed:
        print(f"\n{dead} dead letters (pvm dead list), {failed} failed jobs (pvm failed list)")
    return 0


def cmd_dead(args: argparse.Namespace, settings: Settings) -> int:
    from workers.ops import dead_letters

    r = connect(settings)
    shards = shards_of(settings, [args.shard] if args.shard is not None else None)
    if args.dead_command == "list":
        if args.ids:
            chosen = dead_letters.find(r, shards, args.ids)
        else:
            chosen = dead_letters.page(r, shards, args.limit, before=args.before)
        rows = [
            {"shard": d.shard, "id": d.id, "reason": d.reason, "bytes": len(d.raw), "entry": d.entry_id} for d in chosen
        ]
        if args.json:
            print(json.dumps(rows, indent=2))
            return 0
        print(table(rows, ["shard", "id", "entry", "bytes", "reason"]) if rows else "no dead letters")
        if not args.ids and len(rows) >= args.limit:
            shard = f" --shard {args.shard}" if args.shard is not None else ""
            print(f"older ones: pvm dead list --limit {args.limit}{shard} --before {rows[-1]['id']}", file=sys.stderr)
        return 0
    if not args.ids and not args.all:
        print(f"pvm: name dead-letter ids to {args.dead_command}, or pass --all", file=sys.stderr)
        return 2
    act = dead_letters.retry if args.dead_command == "retry" else dead_letters.drop
    missing: list[str] = []
    if args.ids:
        found = dead_letters.find(r, shards, args.ids)
        missing = sorted(set(args.ids) - {d.id for d in found})
        done = act(r, found)
    else:
        done = sum(act(r, batch) for batch in dead_letters.batches(r, shards))
    verb = "sent back to their streams" if args.dead_command == "retry" else "dropped"
    print(f"{done} dead letters {verb}")
    if missing:
        print(f"pvm: not found: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


def cmd_failed(args: argparse.Namespace, settings: Settings) -> int:
    from contracts import keys
    from workers.ops import failed_jobs
    from workers.runtime.queues import queue_name

    if args.failed_command == "retry" and not args.ids and not args.all:
        print("pvm: name failed job ids to retry, or pass --all", file=sys.stderr)
        return 2
    if args.pool:
        queue_name(args.pool)  # an unknown pool: UnknownPool, one line
    r = connect(settings)
    pools = [args.pool] if args.pool else list(keys.QUEUES)
    found = failed_jobs.find(r, pools, args.ids) if args.ids else None
    missing = sorted(set(args.ids) - {job_id for _, job_id in found or ()})
    if missing:
        print(f"pvm: not found: {', '.join(missing)}", file=sys.stderr)
    if args.failed_command == "retry":
        if found is not None:
            outcomes = [(job_id, failed_jobs.requeue(r, pool, job_id)) for pool, job_id in found]
            retried = sum(why is None for _, why in outcomes)
            stuck = [f"{job_id} ({why})" for job_id, why in outcomes if why is not None]
        else:
            retried, stuck = 0, []
            for pool in pools:
                done, left = failed_jobs.requeue_all(r, pool)
                retried, stuck = retried + done, stuck + left
        print(f"{retried} failed jobs requeued")
        if stuck:
            print(f"pvm: could not requeue: {', '.join(stuck)}", file=sys.stderr)
        return 1 if missing or stuck else 0
    if found is not None:
        rows = [failed_jobs.describe(r, pool, job_id).to_dict() for pool, job_id in found[: args.limit]]
    else:
        rows = [job.to_dict() for job in failed_jobs.page(r, pools, args.limit)]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(table(rows, ["pool", "job", "function", "ended", "error"]) if rows else "no failed jobs")
    return 1 if missing else 0


def cmd_token_new(args: argparse.Namespace, settings: Settings) -> int:
    from workers.api.auth import ALL_PROJECTS, add_to_file, new_token, token_entry

    token = new_token()
    try:
        entry = token_entry(
            args.name, token, [ALL_PROJECTS] if args.all else args.project, global_tier=args.global_tier
        )
    except ValueError as exc:
        raise SystemExit(f"pvm: {exc}") from None
    if args.file:
        add_to_file(args.file, entry)
    if args.json:
        print(json.dumps({"token": token, "entry": entry, "file": str(args.file) if args.file else None}, indent=2))
        return 0
    # The token goes to stderr, labelled, and is never shown again; stdout holds only what is safe to keep.
    print(
        f"token {args.name!r} (shown only now; the file keeps only its hash; clients set PVM_API_TOKEN to it):\n"
        f"  {token}",
        file=sys.stderr,
    )
    projects = "every project" if args.all else ", ".join(entry["projects"])
    if args.global_tier:
        projects += " and the global tier"
    if args.file:
        print(f"added {args.name!r} ({projects}) to {args.file}; a running pvm serve picks it up within a second")
    else:
        print(json.dumps(entry))
    return 0


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    from workers.ops.replay import replay

    return replay(connect(settings), settings, None if args.all else args.project, wait=not args.no_wait)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `pvm log tail`, `status`, `dead`, `failed`, `token new` and `replay` to the `pvm` subcommands."""
    log_cmd = sub.add_parser("log", help="read the durable log")
    log_sub = log_cmd.add_subparsers(dest="log_command", required=True, metavar="SUBCOMMAND")
    tail = log_sub.add_parser("tail", help="the newest minutes of a project")
    tail.add_argument("--project", required=True, type=project_id, help="project id")
    tail.add_argument("-n", type=positive_int, default=20, help="how many minutes (default 20)")
    tail.add_argument("--json", action="store_true", help="machine-readable output")
    tail.set_defaults(func=cmd_log_tail)

    status = sub.add_parser(
        "status", help="one screen for operators: pools, streams, dead letters, freshness, schedules"
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)

    dead = sub.add_parser("dead", help="inspect, retry or drop dead letters")
    dead_sub = dead.add_subparsers(dest="dead_command", required=True, metavar="SUBCOMMAND")
    for name, text in (
        ("list", "show dead letters with their reasons, newest first, a page at a time"),
        ("retry", "put dead letters back on their stream (validated again by the dispatcher)"),
        ("drop", "delete dead letters"),
    ):
        p = dead_sub.add_parser(name, help=text)
        p.add_argument("--shard", type=shard_number, metavar="N", help="only this shard")
        if name == "list":
            p.add_argument("ids", nargs="*", type=stream_id, help="only these dead-letter entry ids")
            p.add_argument("--limit", type=positive_int, default=100, help="rows to list (default 100)")
            p.add_argument(
                "--before",
                type=stream_id,
                metavar="ID",
                help="older than this id: the next page after one ending at ID",
            )
            p.add_argument("--json", action="store_true", help="machine-readable output")
        else:
            p.add_argument("ids", nargs="*", type=stream_id, help="dead-letter entry ids (or --all)")
            p.add_argument("--all", action="store_true", help=f"{name} every dead letter (of --shard)")
        p.set_defaults(func=cmd_dead)

    failed = sub.add_parser("failed", help="inspect or retry failed RQ jobs")
    failed_sub = failed.add_subparsers(dest="failed_command", required=True, metavar="SUBCOMMAND")
    for name, text in (("list", "show failed jobs and their last error"), ("retry", "requeue failed jobs")):
        p = failed_sub.add_parser(name, help=text)
        p.add_argument("--pool", help="only this pool")
        if name == "list":
            p.add_argument("ids", nargs="*", help="only these job ids")
            p.add_argument("--limit", type=positive_int, default=100, help="rows to list (default 100)")
            p.add_argument("--json", action="store_true", help="machine-readable output")
        else:
            p.add_argument("ids", nargs="*", help="job ids (or --all)")
            p.add_argument("--all", action="store_true", help="requeue every failed job (of --pool)")
        p.set_defaults(func=cmd_failed)

    token = sub.add_parser("token", help="project-scoped tokens for the reader API (PVM_API_TOKENS_FILE)")
    token_sub = token.add_subparsers(dest="token_command", required=True, metavar="SUBCOMMAND")
    token_new = token_sub.add_parser(
        "new",
        help="make a random token for some projects: print it once, and its entry (a hash) for the tokens file",
        description="Make a random token that reaches only the projects named. The token is printed once, on "
        "stderr; the tokens file stores only its SHA-256. Without --file the entry to add to the file is printed "
        "on stdout; with --file it is added (the file is created when missing, and written atomically, mode 0600).",
    )
    token_new.add_argument("--name", required=True, help="a unique name for the token's holder (e.g. team-a)")
    reach = token_new.add_mutually_exclusive_group(required=True)
    reach.add_argument("--project", action="append", help="a project the token may read and write (repeatable)")
    reach.add_argument("--all", action="store_true", help="every project")
    token_new.add_argument(
        "--global",
        dest="global_tier",
        action="store_true",
        help="also the global tier of facts (read it, promote and learn into it); never implied by --all",
    )
    token_new.add_argument("--file", type=Path, help="add the entry to this tokens file (PVM_API_TOKENS_FILE)")
    token_new.add_argument("--json", action="store_true", help='print {"token", "entry", "file"} as JSON on stdout')
    token_new.set_defaults(func=cmd_token_new)

    replay_cmd = sub.add_parser("replay", help="rebuild derived stores (caches, index, agent memory) from the log")
    target = replay_cmd.add_mutually_exclusive_group(required=True)
    target.add_argument("--project", type=project_id, help="one project")
    target.add_argument("--all", action="store_true", help="every project in the log")
    replay_cmd.add_argument("--no-wait", action="store_true", help="enqueue the rebuild and return")
    replay_cmd.set_defaults(func=cmd_replay)

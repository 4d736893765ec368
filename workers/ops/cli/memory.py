"""`pvm context`, `thread show`, `search`, `stats`, `export` and `import`: a project's memory, read through the
reader API, counted, and as Markdown files a person can edit."""

from __future__ import annotations

import argparse
import json
import sys

from pvm import defaults
from pvm.config import Settings
from workers.ops.cli.plumbing import connect, fraction, positive_int, project_id, reader_api
from workers.ops.tables import table


def cmd_context(args: argparse.Namespace, settings: Settings) -> int:
    from contracts.memory import ContextPackage

    with reader_api(settings) as api:
        package = api.context(
            args.project,
            args.agent,
            task=args.task,
            budget_tokens=args.budget,
            task_id=args.task_id,
            tags=args.tag or (),
            thread=args.thread,
        )
    if not package["recent"] and not package["full_log_available"]:
        print(
            f"pvm: project {args.project!r} has no minutes (nothing in the log or the caches the reader API "
            f"at {api.base_url} reads): check --project",
            file=sys.stderr,
        )
        return 2
    if args.json:
        print(json.dumps(package, indent=2))
    else:
        print(ContextPackage.from_dict(package).render())
    return 0


def cmd_thread_show(args: argparse.Namespace, settings: Settings) -> int:
    """`pvm thread show`: one thread's chunks and episodes (and its newest minutes with --recent)."""
    from contracts.memory import minute_line
    from contracts.summaries import chunk_line, episode_line

    with reader_api(settings) as api:
        thread = api.thread(args.project, args.thread, args.recent)
    if args.json:
        print(json.dumps(thread, indent=2))
        return 0
    chunks, episodes, recent = thread["chunks"], thread["episodes"], thread["recent"]
    print(
        f"thread {thread['thread']} of {thread['project_id']}: {thread['minutes']:,} minutes summarized, "
        f"{len(chunks)} chunk(s), {len(episodes)} episode(s)"
    )
    if not (chunks or episodes or recent):
        print("(nothing yet: no minute of this thread has reached the summarize pool)")
    if chunks:
        print("\nChunks (oldest first):")
        for chunk in chunks:
            print(chunk_line(chunk))
    if episodes:
        print("\nEpisodes:")
        for episode in episodes:
            print(episode_line(episode))
    if recent and args.recent:
        print(f"\nNewest {len(recent)} minutes (verbatim):")
        for minute in recent:
            print(minute_line(minute))
    return 0


def _kinds(text: str) -> tuple[str, ...]:
    from pvm.search import KINDS

    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"--kinds {text!r}: name some of {', '.join(KINDS)}, comma-separated")
    return kinds


def cmd_search(args: argparse.Namespace, settings: Settings) -> int:
    with reader_api(settings) as api:
        result = api.search(
            args.project,
            args.query,
            args.k,
            categories=args.category or (),
            event_types=args.event_type or (),
            agents=args.agent or (),
            task_id=args.task_id,
            thread_id=args.thread_id,
            min_composite=args.min_composite,
            kinds=args.kinds or (),
        )
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if "ranked" in result:  # --kinds: every kind, best first, with what it stands for
        ranked = [
            {
                "score": f"{h['score']:.3f}",
                "kind": h["kind"],
                "id": h.get("minute_id") or h.get("fact_id") or h.get("summary_id"),
                "text": h["minute"].get("memory_note") if h["kind"] == "minute" else h.get("text") or h["fact"]["text"],
                "sources": ",".join(h.get("sources") or ()),
            }
            for h in result["ranked"]
        ]
        print(table(ranked, ["score", "kind", "id", "text", "sources"]) if ranked else "no hits")
        return 0
    rows = [
        {
            "score": f"{h['score']:.3f}",
            "id": h["minute_id"],
            "event_type": h["minute"].get("event_type"),
            "agent_id": h["minute"].get("agent_id"),
            "category": h["category"],
            "memory_note": h["minute"].get("memory_note"),
        }
        for h in result["hits"]
    ]
    print(table(rows, ["score", "id", "event_type", "agent_id", "category", "memory_note"]) if rows else "no hits")
    return 0


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    from pvm.vectors import GLOBAL_TENANT
    from workers.api.stats import project_stats

    stats = project_stats(connect(settings), GLOBAL_TENANT if args.global_tier else args.project)
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    facts = stats["facts"]
    print(f"project {stats['project_id']}")
    print(f"  minutes           {stats['minutes']:,} in the log, {stats['indexed']:,} indexed")
    print(
        f"  facts             {facts['total']:,} current: "
        + ", ".join(f"{t} {n}" for t, n in {**facts["by_tier"], **facts["by_type"]}.items() if n)
        if facts["total"]
        else "  facts             0"
    )
    print(f"  chunks, episodes  {stats['chunks']:,}, {stats['episodes']:,}")
    print(f"  pruned, merged    {stats['pruned']:,}, {stats['merged']:,} ({stats['conflicts']:,} conflicts flagged)")
    print(f"  tokens reclaimed  {stats['tokens_reclaimed']:,}")
    scores = stats["average_scores"]
    shown = ", ".join(f"{k} {v:.3f}" for k, v in scores.items() if v is not None)
    print(f"  average scores    {shown or 'none yet (no evaluation run)'}")
    return 0


def cmd_export(args: argparse.Namespace, settings: Settings) -> int:
    from workers.agent.memory_files import export_files, read_snapshot, tree_lines, write_folder

    snapshot = read_snapshot(connect(settings), args.project, include_global=args.global_tier)
    files = export_files(snapshot)
    write_folder(args.out, files, snapshot.last_ms)
    if args.json:
        print(json.dumps({"project_id": args.project, "out": str(args.out), "files": sorted(files)}, indent=2))
        return 0
    print(f"pvm export: {len(files):,} files of project {args.project} in {args.out}")
    if args.tree:
        print("\n".join(tree_lines(files)))
    return 0


def cmd_import(args: argparse.Namespace, settings: Settings) -> int:
    from workers.agent.memory_files import (
        MemoryFileError,
        plan_import,
        read_export_version,
        read_folder,
        read_snapshot,
        stream_writer,
    )

    connection = connect(settings)
    try:
        snapshot = read_snapshot(connection, args.project, include_global=args.global_tier)
        files = read_folder(args.folder)
        plan = plan_import(snapshot, files, exported_version=read_export_version(args.folder))
    except MemoryFileError as exc:
        print(f"pvm import: {exc}", file=sys.stderr)
        return 1
    stream_ids = [] if args.dry_run or not plan.changes else stream_writer(connection, settings.shards)(plan.minutes)
    if args.json:
        answer = plan.to_dict()
        answer.update(dry_run=args.dry_run, stream_ids=stream_ids)
        print(json.dumps(answer, indent=2))
        return 0
    verb = "would write" if args.dry_run else "wrote"
    print(
        f"pvm import: {verb} {len(plan.changes):,} minutes for project {args.project} "
        f"({plan.unchanged:,} files unchanged)"
    )
    if plan.changes:
        rows = [{"event": c.minute.event_type, "path": c.path, "fact": c.fact_id[:8]} for c in plan.changes]
        print(table(rows, ("event", "path", "fact")))
    return 0


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `pvm context`, `thread show`, `search`, `stats`, `export` and `import` to the `pvm` subcommands."""
    context = sub.add_parser("context", help="an agent's context, from the reader API (PVM_API_URL)")
    context.add_argument("--project", required=True, type=project_id, help="project id")
    context.add_argument("--agent", required=True, help="agent id")
    context.add_argument("--task", help="task text: adds relevant past experience and the rules it matches")
    context.add_argument("--task-id", help="the task's id: adds its task-tier facts")
    context.add_argument("--tag", action="append", help="a task tag rules match too (repeat for more)")
    context.add_argument(
        "--budget",
        type=positive_int,
        default=defaults.CONTEXT_BUDGET_TOKENS,
        help=f"token budget (default {defaults.CONTEXT_BUDGET_TOKENS})",
    )
    context.add_argument(
        "--thread", help="build it for one thread (a thread id, task:<id> or project): newest minutes, summaries"
    )
    context.add_argument("--json", action="store_true", help="the ContextPackage as JSON")
    context.set_defaults(func=cmd_context)

    thread = sub.add_parser("thread", help="a thread's chunk summaries and episodes, via the reader API")
    thread_sub = thread.add_subparsers(dest="thread_command", required=True)
    thread_show = thread_sub.add_parser("show", help="one thread's chunks and episodes")
    thread_show.add_argument("thread", help="a thread id, task:<task id>, or project")
    thread_show.add_argument("--project", required=True, type=project_id, help="project id")
    thread_show.add_argument("--recent", type=int, default=0, help="also print its newest N minutes (default 0)")
    thread_show.add_argument("--json", action="store_true", help="the thread as JSON")
    thread_show.set_defaults(func=cmd_thread_show)

    search = sub.add_parser("search", help="hybrid search over a project's minutes, via the reader API")
    search.add_argument("query", help="search text")
    search.add_argument("--project", required=True, type=project_id, help="project id")
    search.add_argument("-k", type=positive_int, default=defaults.SEARCH_K, help=f"hits (default {defaults.SEARCH_K})")
    search.add_argument("--category", action="append", help="only these categories (repeatable)")
    search.add_argument("--event-type", action="append", help="only these event types (repeatable)")
    search.add_argument("--agent", action="append", help="only these agents (repeatable)")
    search.add_argument("--task-id", help="only this task")
    search.add_argument("--thread-id", help="only this thread")
    search.add_argument("--min-composite", type=fraction, help="minimum composite score (0-1)")
    search.add_argument(
        "--kinds",
        type=_kinds,
        help="what to return, comma-separated: minute (default), fact, summary (chunk and episode summaries)",
    )
    search.add_argument("--json", action="store_true", help="machine-readable output")
    search.set_defaults(func=cmd_search)

    stats = sub.add_parser("stats", help="a project's memory in numbers: minutes, facts, pruned, merged, scores")
    scope = stats.add_mutually_exclusive_group(required=True)
    scope.add_argument("--project", type=project_id, help="the project")
    scope.add_argument("--global", dest="global_tier", action="store_true", help="the global tier's facts")
    stats.add_argument("--json", action="store_true", help="machine-readable output")
    stats.set_defaults(func=cmd_stats)

    export = sub.add_parser(
        "export", help="a project's memory (facts, learned keys, episodes, summaries) as Markdown files in a folder"
    )
    export.add_argument("--project", type=project_id, required=True, help="the project")
    export.add_argument("--out", required=True, help="the folder (created; its old memory files are replaced)")
    export.add_argument("--tree", action="store_true", help="print the files as a tree")
    export.add_argument(
        "--global",
        dest="global_tier",
        action="store_true",
        help="also the global tier's facts and learned keys (facts/global/, learned/global/)",
    )
    export.add_argument("--json", action="store_true", help="machine-readable output")
    export.set_defaults(func=cmd_export)

    import_cmd = sub.add_parser(
        "import",
        help="write a Markdown memory folder's edits back as minutes (one per change; a removed file retracts)",
    )
    import_cmd.add_argument("--project", type=project_id, required=True, help="the project")
    import_cmd.add_argument("folder", help="the folder that pvm export wrote (and a person edited)")
    import_cmd.add_argument("--dry-run", action="store_true", help="show the minutes it would write; write none")
    import_cmd.add_argument(
        "--global",
        dest="global_tier",
        action="store_true",
        help="the global tier's files may be edited (without it, a folder holding them is refused)",
    )
    import_cmd.add_argument("--json", action="store_true", help="machine-readable output")
    import_cmd.set_defaults(func=cmd_import)

"""`pvm demo`: a coordination session through the embedded stack (the session and what it shows are
`workers.ops.demo`)."""

from __future__ import annotations

import argparse

from pvm import defaults
from pvm.config import Settings
from workers.ops.cli.plumbing import connect, positive_int, project_id


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from workers.ops.demo import run_demo

    if settings.redis_url:
        connect(settings).close()
    return run_demo(settings, minutes=args.minutes, project=args.project)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `pvm demo` to the `pvm` subcommands."""
    demo = sub.add_parser(
        "demo", help="run a coordination session through the embedded stack; show the log and an agent's context"
    )
    demo.add_argument(
        "--minutes",
        type=positive_int,
        default=defaults.DEMO_MINUTES,
        help=f"how many minutes to emit (default {defaults.DEMO_MINUTES})",
    )
    demo.add_argument(
        "--project",
        type=project_id,
        help="the project to emit into (default: a new one per run, apollo-<UTC time>, so each run shows only its "
        "own minutes; name an existing one to add to it)",
    )
    demo.set_defaults(func=cmd_demo)

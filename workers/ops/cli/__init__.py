"""The `pvm` command: run the stack and its parts, and look into the log.

A package of command groups, each module holding its commands beside their subparsers (its `add_parsers`):
`stack` (up, serve, worker, dispatch, scheduler, exporter, mcp), `admin` (status, log tail, dead letters, failed
jobs, tokens, replay), `memory` (context, thread, search, stats, export, import), `facts` (facts, learn, recall),
`pair`, `maintenance` (evaluate, optimize) and `demo`; `plumbing` holds what they share. This module builds the top
parser from the groups and runs the chosen command: `main` is the `pvm` console script, and `python -m
workers.ops.cli` runs it too.

Server-side commands import `workers` lazily, so agents that only use the library never load worker code.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import os
import signal
import sys
from collections.abc import Sequence

from pvm.config import ConfigError, Settings
from workers.ops.cli import admin, demo, facts, maintenance, memory, pair, stack
from workers.ops.cli.plumbing import redis_unreachable

__all__ = ["build_parser", "main"]

# The order `pvm --help` and the CLI reference list the commands in, as before the commands were grouped: the
# groups add theirs group by group, and a command missing here goes last.
LISTING = (
    "up",
    "dispatch",
    "scheduler",
    "worker",
    "log",
    "exporter",
    "status",
    "dead",
    "failed",
    "serve",
    "token",
    "context",
    "thread",
    "search",
    "facts",
    "learn",
    "recall",
    "pair",
    "replay",
    "evaluate",
    "stats",
    "export",
    "import",
    "optimize",
    "demo",
    "mcp",
)

# Commands that need only the client library (and, for `mcp`, the mcp extra): they call the reader API, so they
# run in a client-only install (`pip install pvm`).
CLIENT_COMMANDS = (
    memory.cmd_context,
    memory.cmd_search,
    facts.cmd_facts,
    facts.cmd_learn,
    facts.cmd_recall,
    stack.cmd_mcp,
    pair.cmd_pair,
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pvm")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pvm",
        description="PVM: durable, searchable memory for fleets of AI agents. "
        "Configuration comes from PVM_* environment variables (see docs/operations/configuration.md).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--version", action="version", version=f"pvm {_version()}", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (stack, admin, memory, facts, pair, maintenance, demo):
        group.add_parsers(sub)
    _in_listing_order(sub)
    _describe(parser)
    return parser


def _in_listing_order(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Order the commands as `LISTING` does: the help's listing, and the choices an unknown command is told of."""
    rank = {name: i for i, name in enumerate(LISTING)}
    sub._choices_actions.sort(key=lambda action: rank.get(action.dest, len(rank)))
    ordered = sorted(sub.choices.items(), key=lambda item: rank.get(item[0], len(rank)))
    sub.choices.clear()
    sub.choices.update(ordered)


def _describe(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand's own --help page its line from the listing, where it has no description of its own."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            lines = {choice.dest: choice.help for choice in action._choices_actions}
            for name, child in action.choices.items():
                line = lines.get(name)
                if child.description is None and line:
                    child.description = f"{line[0].upper()}{line[1:]}."
                _describe(child)


def _stacks_on_sigusr1() -> None:
    """`kill -USR1 <pid>` prints every thread's stack to stderr, and the process goes on: what a server, worker,
    dispatcher or scheduler that does not stop (or does not move) is waiting on. Not where stderr is no file
    (`main` called in a process whose stderr was replaced, as a test's captured output)."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # io.UnsupportedOperation: no fileno
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _stacks_on_sigusr1()
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print(f"pvm: {exc}", file=sys.stderr)
        return 2
    import redis

    from pvm.connection import NoRedisConfigured
    from pvm.extras import SERVER_EXTRA, missing_server_packages

    user_errors: tuple[type[Exception], ...] = (NoRedisConfigured, ConfigError)
    if args.func not in CLIENT_COMMANDS:
        missing = missing_server_packages()
        if missing:
            print(
                f"pvm {args.command}: needs the server extra ({', '.join(missing)} not installed): {SERVER_EXTRA} "
                "(pvm context and pvm search work without it)",
                file=sys.stderr,
            )
            return 2
        from workers.runtime.queues import UnknownPool

        user_errors += (UnknownPool,)
    try:
        code = int(args.func(args, settings))
        sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's last flush
        return code
    except BrokenPipeError:
        # `pvm status | head -1`: the reader has what it wanted. Python's advice: point stdout at
        # devnull so the flush at exit cannot fail again; 141 is what a shell reports for SIGPIPE.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        return 130
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        print(f"pvm: {redis_unreachable(settings.redis_url or '', exc)}", file=sys.stderr)
        return 2
    except user_errors as exc:  # a clear one-line error for what a user can fix
        print(f"pvm: {exc}", file=sys.stderr)
        return 2

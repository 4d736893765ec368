"""`pvm facts list|show|history|promote|retract`, `learn` and `recall`: a project's long-term memory (facts), via
the reader API; each change is a minute the API writes."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from pvm import defaults
from pvm.config import Settings
from workers.ops.cli.plumbing import non_negative_int, positive_int, project_id, reader_api
from workers.ops.tables import table

FACT_COLUMNS = ("id", "tier_key", "type", "status", "subject", "attribute", "value", "valid_from", "valid_until")


def _fact_rows(facts: Sequence[dict[str, Any]]) -> str:
    return table([dict(f) for f in facts], FACT_COLUMNS)


def _show_fact(fact: dict[str, Any]) -> str:
    lines = [f"{name}: {'' if fact.get(name) is None else fact[name]}" for name in (*FACT_COLUMNS, "text")]
    lines += [
        f"confidence: {fact['confidence']}  importance: {fact['importance']}",
        f"recorded_at: {fact['recorded_at']}",
    ]
    if fact.get("promoted_from"):
        lines.append(f"promoted_from: {fact['promoted_from']}")
    lines += [f"{r['kind']}: {r['fact_id']} ({r['strength']})" for r in fact.get("relationships", [])]
    if fact.get("tags"):
        lines.append("tags: " + ", ".join(fact["tags"]))
    lines.append("sources: " + ", ".join(fact.get("source_minute_ids", [])))
    return "\n".join(lines)


def _accepted(args: argparse.Namespace, answer: dict[str, Any], what: str) -> int:
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    print(f"{what}: fact {answer['fact_id']} (minute {answer['minute_id']}); the facts pool applies it shortly")
    for also in answer.get("also", []):
        print(f"  and {also['event_type']} (minute {also['minute_id']})")
    return 0


def cmd_facts(args: argparse.Namespace, settings: Settings) -> int:
    with reader_api(settings) as api:
        if args.facts_command == "list":
            answer = api.facts(
                args.project,
                tiers=args.tier or (),
                task=args.task,
                types=args.type or (),
                statuses=args.status or (),
                subject=args.subject,
                attribute=args.attribute,
                q=args.query,
                as_of=args.as_of,
                limit=args.limit,
                offset=args.offset,
            )
            if args.json:
                print(json.dumps(answer, indent=2))
            elif not answer["facts"]:
                print("no facts")
            else:
                print(_fact_rows(answer["facts"]))
                if answer["next_offset"] is not None:
                    print(f"(more: --offset {answer['next_offset']})")
            return 0
        if args.facts_command == "show":
            fact = api.fact(args.project, args.fact_id)
            print(json.dumps(fact, indent=2) if args.json else _show_fact(fact))
            return 0
        if args.facts_command == "history":
            history = api.fact_history(args.project, args.fact_id)
            print(json.dumps({"facts": history}, indent=2) if args.json else _fact_rows(history))
            return 0
        if args.facts_command == "promote":
            answer = api.promote(args.project, args.fact_id, args.to_tier, agent_id=args.agent)
            return _accepted(args, answer, f"promoted to {args.to_tier}" if args.to_tier else "promoted")
        answer = api.retract(args.project, args.fact_id, args.reason, agent_id=args.agent)
        return _accepted(args, answer, "retracted")


def cmd_learn(args: argparse.Namespace, settings: Settings) -> int:
    with reader_api(settings) as api:
        answer = api.learn(
            args.project,
            args.key,
            args.value,
            tier=args.tier,
            task_id=args.task_id,
            type=args.type,
            agent_id=args.agent,
        )
    return _accepted(args, answer, f"learned {args.key!r}")


def cmd_recall(args: argparse.Namespace, settings: Settings) -> int:
    with reader_api(settings) as api:
        answer = api.recall(args.project, args.key, task=args.task, tiers=args.tier or ())
    if args.json:
        print(json.dumps(answer, indent=2))
    elif answer["fact"] is None:
        print(f"pvm: nothing learned as {args.key!r} in {', '.join(answer['searched'])}", file=sys.stderr)
    else:
        print(answer["fact"]["value"])
    return 0 if answer["fact"] is not None else 1


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`pvm facts list|show|history|promote|retract`, `pvm learn`, `pvm recall`: via the reader API (PVM_API_URL)."""
    from contracts.facts import FactStatus, FactType, Tier

    tiers, types, statuses = [t.value for t in Tier], [t.value for t in FactType], [s.value for s in FactStatus]
    facts = sub.add_parser(
        "facts",
        help="a project's long-term memory (facts), via the reader API: list, show, history, promote, retract",
        description="Read and change a project's facts through the reader API (PVM_API_URL, PVM_API_TOKEN).\n"
        "A change is written as a knowledge-change minute (202): the facts pool applies it a moment\n"
        "later. The global tier needs a token that grants it (pvm token new --global).",
        epilog="examples:\n"
        "  pvm facts list --project apollo --type decision\n"
        "  pvm facts list --project apollo --as-of 2026-03-01T00:00:00Z\n"
        "  pvm facts history FACT_ID --project apollo\n"
        "  pvm facts promote FACT_ID --project apollo --to-tier global",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    facts_sub = facts.add_subparsers(dest="facts_command", required=True, metavar="SUBCOMMAND")

    def command(name: str, text: str, with_id: bool = True) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = facts_sub.add_parser(name, help=text)
        if with_id:
            p.add_argument("fact_id", metavar="FACT_ID", help="the fact's id (a UUID, as `pvm facts list` shows)")
        p.add_argument("--project", required=True, type=project_id, help="project id")
        p.add_argument("--json", action="store_true", help="the API's answer as JSON")
        p.set_defaults(func=cmd_facts)
        return p

    listing = command("list", "the current facts of a project (filters; --as-of for what held then)", with_id=False)
    listing.add_argument("--tier", action="append", choices=tiers, help="tiers (repeatable; default: task and project)")
    listing.add_argument("--task", help="a task id: its tier too (required with --tier task)")
    listing.add_argument("--type", action="append", choices=types, help="fact types (repeatable)")
    listing.add_argument("--status", action="append", choices=statuses, help="statuses (repeatable; default promoted)")
    listing.add_argument("--subject", help="one subject")
    listing.add_argument("--attribute", help="one attribute")
    listing.add_argument("-q", "--query", help="search the facts (hybrid), best first")
    listing.add_argument(
        "--as-of", metavar="TIME", help="ISO 8601 time with an offset (2026-03-01T00:00:00Z): what held then"
    )
    listing.add_argument("--limit", type=positive_int, help=f"facts per page (default {defaults.API_FACTS_LIMIT})")
    listing.add_argument("--offset", type=non_negative_int, help="facts to skip (the next page's offset)")
    command("show", "one fact, any status")
    command("history", "every value of the fact's slot, superseded and retracted ones too, oldest first")
    promote = command("promote", "promote a pending fact, or copy it one tier up (--to-tier)")
    promote.add_argument(
        "--to-tier", choices=["project", "global"], help="copy it one tier up (task -> project -> global)"
    )
    promote.add_argument("--agent", help="who promotes it (the change minute's agent_id)")
    retract = command("retract", "withdraw a fact: it leaves the current view and stays in history")
    retract.add_argument("--reason", help="why, in words")
    retract.add_argument("--agent", help="who retracts it (the change minute's agent_id)")

    learn = sub.add_parser(
        "learn",
        help="learn(key, value): a certain fact under a key, in a task, the project or the global tier",
        description="Learn a value under a key, via the reader API: a fact_learned minute the facts pool applies. "
        "Learning a key again replaces its value; `pvm recall KEY` reads it.",
    )
    learn.add_argument("key", help="the key (e.g. 'deploy window')")
    learn.add_argument("value", help="its value, as text")
    learn.add_argument("--project", required=True, type=project_id, help="project id")
    learn.add_argument("--tier", choices=tiers, help="default: task with --task-id, else project")
    learn.add_argument("--task-id", help="a task id: learn it in that task's tier")
    learn.add_argument("--type", choices=types, help="fact type (default fact)")
    learn.add_argument("--agent", help="who learns it (the minute's agent_id)")
    learn.add_argument("--json", action="store_true", help="the API's answer as JSON")
    learn.set_defaults(func=cmd_learn)

    recall = sub.add_parser(
        "recall",
        help="recall(key): a learned value, the task's tier first, then the project's, then global (if granted)",
        description="Print the value learned under a key (exit 1 when no tier holds it), via the reader API.",
    )
    recall.add_argument("key", help="the key")
    recall.add_argument("--project", required=True, type=project_id, help="project id")
    recall.add_argument("--task", help="a task id: its tier is looked in first")
    recall.add_argument("--tier", action="append", choices=tiers, help="look only in these tiers (repeatable)")
    recall.add_argument("--json", action="store_true", help="the API's answer as JSON (key, fact, searched)")
    recall.set_defaults(func=cmd_recall)

"""`pvm demo`: a multi-agent coordination session pushed through the embedded stack, end to end."""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Iterator

from contracts import Minute
from pvm.config import Settings

AGENTS = ("planner", "coder", "reviewer", "tester", "deployer")
TASKS = ("parse-invoices", "fix-login-bug", "migrate-db", "write-docs", "tune-cache", "ship-release")


def sample_session(project_id: str, n: int, seed: int = 7) -> Iterator[Minute]:
    """A plausible stream of minutes: assignments, work, conflicts and resolutions, failures, handoffs."""
    rng = random.Random(seed)
    recent: list[str] = []
    for i in range(n):
        task = rng.choice(TASKS)
        agent = rng.choice(AGENTS)
        kind = rng.choices(
            [
                "task_assigned",
                "task_started",
                "task_completed",
                "task_failed",
                "conflict_detected",
                "conflict_resolved",
                "decision",
                "message",
                "handoff",
                "knowledge",
            ],
            weights=[12, 10, 10, 4, 4, 4, 6, 20, 5, 3],
        )[0]
        data: dict[str, object] = {"task_id": task}
        note = None
        if kind == "task_assigned":
            data["assignment_reasoning"] = f"{agent} has the best record on {task.split('-')[0]} work"
            note = f"{task} assigned to {agent}"
        elif kind in ("task_completed", "task_failed"):
            data["success_criteria_met"] = rng.randint(70, 100) if kind == "task_completed" else rng.randint(0, 40)
            note = f"{agent} {'finished' if kind == 'task_completed' else 'failed'} {task}"
        elif kind == "conflict_detected":
            data["conflict_type"] = rng.choice(["resource", "priority", "file-lock"])
            note = f"{agent} hit a {data['conflict_type']} conflict on {task}"
        elif kind == "conflict_resolved":
            data["conflict_type"] = rng.choice(["resource", "priority", "file-lock"])
            data["resolution"] = rng.choice(["serialized the writers", "planner re-prioritized", "split the task"])
            note = f"conflict on {task} resolved: {data['resolution']}"
        elif kind == "handoff":
            data["to_agent"] = rng.choice(AGENTS)
            note = f"{agent} handed {task} to {data['to_agent']}"
        else:
            note = f"{agent} on {task}: update {i}"
        refs = tuple(rng.sample(recent, k=min(len(recent), rng.randint(0, 2))))
        minute = Minute(
            project_id=project_id,
            event_type=kind,
            agent_id=agent,
            data=data,
            context_references=refs,
            memory_note=note,
            thread_id=f"{task}-thread",
        )
        recent = ([*recent, minute.id])[-20:]
        yield minute


def run_demo(settings: Settings, minutes: int = 300) -> int:
    """Start the stack, emit `minutes` minutes over 3 projects, wait until all are durable, show the log."""
    from pvm.emitter import Emitter
    from pvm.stack import Stack
    from pvm.stores.log import LogReader

    projects = ["apollo", "borealis", "cygnus"]
    print(f"pvm demo: starting the embedded stack (home {settings.home.resolve()})")
    with Stack(settings) as stack:
        live = stack.settings
        reader = LogReader(live.log_dir)
        before = {p: reader.count(p) for p in projects}
        print(f"  Redis at {live.redis_url}; dispatcher and log pool running")
        started = time.monotonic()
        with Emitter(settings=live) as emitter:
            for i, minute in enumerate(sample_session("demo", minutes)):
                project = projects[i % len(projects)]
                emitter.emit(Minute(**{**minute.to_dict(), "project_id": project}))
        print(f"  emitted {minutes} minutes from {len(AGENTS)} agents over {len(projects)} projects")
        deadline = time.monotonic() + 60
        shown = -1
        while True:
            durable = sum(reader.count(p) for p in projects) - sum(before.values())
            if durable != shown:
                end = "" if sys.stdout.isatty() else "\n"
                print(f"\r  durable in the log: {durable}/{minutes}", end=end)
                sys.stdout.flush()
                shown = durable
            if durable >= minutes:
                break
            if time.monotonic() > deadline:
                print("\npvm demo: timed out waiting for the log pool", file=sys.stderr)
                return 1
            time.sleep(0.1)
        print(f"{chr(10) if sys.stdout.isatty() else ''}  all durable in {time.monotonic() - started:.2f}s")
    print()
    from pvm.cli import main

    return main(["log", "tail", "--project", projects[0], "-n", "12"])

"""One producer process of the chaos test (tests/test_chaos.py): an agent that emits minutes through `pvm.Emitter`.

Run as ``python -m tests.chaos_producer SEED INDEX PROJECTS SECONDS RATE OUT`` with the
PVM_* settings in the environment. For `SECONDS` it emits about `RATE` minutes a second
to projects ``chaos-0`` ... ``chaos-<PROJECTS-1>`` (more of them as time passes, so new
projects keep appearing while components are killed), waits until its emitter has
sent everything, spool included, then writes to `OUT` one ``project<TAB>minute id``
line per minute and a last line ``#stats <json>`` with the emitter's counters. The
choices depend only on SEED and INDEX; the minute ids are the emitter's own.
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

from contracts import Minute
from pvm.config import Settings
from pvm.emitter import Emitter

EVENT_TYPES = ("message", "task_assigned", "task_completed", "decision_made", "conflict_resolved")
TICK_S = 0.02  # emits in small bursts this often
FLUSH_DEADLINE_S = 90.0  # how long the producer waits for its emitter to send everything after the last emit


def project_name(i: int) -> str:
    return f"chaos-{i}"


def active_projects(elapsed: float, seconds: float, projects: int) -> int:
    """How many projects are in use `elapsed` seconds in: a quarter at the start, all of them by 80 % of the run."""
    share = 0.25 + 0.75 * min(1.0, elapsed / (0.8 * seconds))
    return max(1, min(projects, round(projects * share)))


def minute(rng: random.Random, producer: int, project: str, n: int) -> Minute:
    event_type = rng.choice(EVENT_TYPES)
    data: dict[str, object] = {"n": n, "producer": producer}
    if event_type.startswith("task_"):
        data["task_id"] = f"task-{rng.randrange(50)}"
    if event_type == "task_completed":
        data["success_criteria_met"] = rng.randrange(101)
    return Minute(
        project_id=project,
        event_type=event_type,
        agent_id=f"agent-{producer}-{rng.randrange(4)}",
        data=data,
        memory_note=f"chaos minute {n} of producer {producer}: {rng.choice(['deploy', 'review', 'merge', 'fix'])}",
    )


def main(argv: list[str]) -> int:
    seed, index, projects, seconds, rate, out = (
        int(argv[0]),
        int(argv[1]),
        int(argv[2]),
        float(argv[3]),
        float(argv[4]),
        Path(argv[5]),
    )
    rng = random.Random(f"{seed}-producer-{index}")
    emitted: list[tuple[str, str]] = []
    em = Emitter(settings=Settings.from_env())
    start = time.monotonic()
    due = 0.0
    while (elapsed := time.monotonic() - start) < seconds:
        due += rate * TICK_S
        active = active_projects(elapsed, seconds, projects)
        while len(emitted) < int(due):
            project = project_name(rng.randrange(active))
            emitted.append((project, em.emit(minute(rng, index, project, len(emitted)))))
        time.sleep(TICK_S)
    # close() spools what it cannot send in its timeout, and nothing replays that spool but a later
    # emitter: wait here until everything, spool included, is on the streams.
    flushed = em.flush(FLUSH_DEADLINE_S)
    stats = em.stats()
    em.close()
    with open(out, "w") as f:
        for project, minute_id in emitted:
            f.write(f"{project}\t{minute_id}\n")
        f.write("#stats " + json.dumps({**asdict(stats), "flushed": flushed}) + "\n")
    return 0 if flushed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

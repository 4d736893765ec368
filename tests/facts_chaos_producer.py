"""One producer process of the facts chaos test (tests/test_facts_chaos.py): an agent stating facts via `pvm.Emitter`.

Run as ``python -m tests.facts_chaos_producer SEED INDEX PROJECTS SECONDS RATE OUT`` with the PVM_*
settings in the environment. For `SECONDS` it emits about `RATE` minutes a second to projects
``fchaos-0`` ... ``fchaos-<PROJECTS-1>``:

- fact-stating minutes the rule extractor reads (``The billing service's database is Postgres.``), in a
  few slots per project (some in a task tier), each slot's value a random walk over a small set, so values
  are confirmed, replaced, and come back (their next period);
- some of them stamped in the future (2031) or in the past (2021-2023): the contract allows any timestamp;
- ``learn(project, key, value)`` calls (`Emitter.learn`) changing a few learned keys again and again;
- now and then a minute that states no fact.

It waits until its emitter has sent everything, spool included, then writes to `OUT` one JSON line per
minute (``{"project", "id", "kind", "when", ...}``) and a last line ``#stats <json>`` with the emitter's
counters. The choices depend only on SEED and INDEX; the minute ids are the emitter's own.
"""

from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from contracts import Minute
from pvm.config import Settings
from pvm.emitter import Emitter

TICK_S = 0.02  # emits in small bursts this often
FLUSH_DEADLINE_S = 90.0  # how long the producer waits for its emitter to send everything after the last emit

SUBJECTS = ("billing service", "auth service", "search service", "checkout service")
VALUES: dict[str, tuple[str, ...]] = {
    "database": ("Postgres", "MySQL", "CockroachDB"),
    "cache": ("Redis", "Memcached", "Valkey"),
    "queue": ("Kafka", "RabbitMQ", "NATS"),
    "region": ("eu-west-1", "us-east-1", "ap-south-1"),
}
SLOTS_PER_PROJECT = 4  # (subject, attribute) pairs a project states facts about
TASKS = ("T-1", "T-2")  # task tiers: some statements are made inside a task
LEARNED: dict[str, tuple[str, ...]] = {
    "deploy_window": ("mornings", "evenings", "weekends"),
    "max_batch": ("100", "250", "500"),
    "oncall": ("alice", "bob", "carol"),
}
FUTURE = datetime(2031, 1, 1, tzinfo=UTC)  # minutes from the future: up to 30 days after this
PAST = datetime(2021, 1, 1, tzinfo=UTC)  # minutes from the past: up to ~3 years after this
# Shares of what is emitted (the rest states a fact, stamped now).
P_LEARN, P_FILLER, P_FUTURE, P_PAST, P_TASK = 0.12, 0.08, 0.10, 0.10, 0.2
P_KEEP = 0.45  # a slot's next statement repeats its current value (a confirmation) rather than changing it


def project_name(i: int) -> str:
    return f"fchaos-{i}"


def project_slots(project: int) -> list[tuple[str, str]]:
    """The slots a project states facts in: the same for every producer (they share the slots' histories)."""
    rng = random.Random(f"fchaos-slots-{project}")
    pairs = [(s, a) for s in SUBJECTS for a in VALUES]
    return rng.sample(pairs, SLOTS_PER_PROJECT)


def iso(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def statement(subject: str, attribute: str, value: str) -> str:
    """A sentence the rules read as (subject, attribute) = value."""
    return f"The {subject}'s {attribute} is {value}."


class Agent:
    """The producer's choices: which project, slot and value, stamped when; the same for the same seed and index."""

    def __init__(self, seed: int, index: int, projects: int) -> None:
        self.rng = random.Random(f"{seed}-fchaos-producer-{index}")
        self.index = index
        self.projects = projects
        self.current: dict[tuple[Any, ...], str] = {}  # (project, tier, subject, attribute) or learned key -> value

    def walk(self, key: tuple[Any, ...], values: tuple[str, ...]) -> str:
        held = self.current.get(key)
        if held is None or self.rng.random() >= P_KEEP:
            held = self.rng.choice([v for v in values if v != held] if held is not None else values)
        self.current[key] = held
        return held

    def when(self) -> tuple[str, str | None]:
        """("now" | "future" | "past", the timestamp to stamp, None for now)."""
        roll = self.rng.random()
        if roll < P_FUTURE:
            return "future", iso(FUTURE + timedelta(seconds=self.rng.uniform(0, 30 * 86400)))
        if roll < P_FUTURE + P_PAST:
            return "past", iso(PAST + timedelta(seconds=self.rng.uniform(0, 3 * 365 * 86400)))
        return "now", None

    def next(self, n: int) -> dict[str, Any]:
        """What to emit next: a dict describing it (kind fact | learn | filler) with what `emit_one` needs."""
        p = self.rng.randrange(self.projects)
        project = project_name(p)
        roll = self.rng.random()
        agent = f"agent-{self.index}-{self.rng.randrange(3)}"
        if roll < P_LEARN:
            key = self.rng.choice(sorted(LEARNED))
            value = self.walk((project, "learned", key), LEARNED[key])
            return {"kind": "learn", "project": project, "key": key, "value": value, "agent": agent, "when": "now"}
        if roll < P_LEARN + P_FILLER:
            return {"kind": "filler", "project": project, "agent": agent, "when": "now", "n": n}
        subject, attribute = self.rng.choice(project_slots(p))
        task = self.rng.choice(TASKS) if self.rng.random() < P_TASK else None
        value = self.walk((project, task, subject, attribute), VALUES[attribute])
        when, timestamp = self.when()
        return {
            "kind": "fact",
            "project": project,
            "task": task,
            "subject": subject,
            "attribute": attribute,
            "value": value,
            "when": when,
            "timestamp": timestamp,
            "agent": agent,
            "event_type": self.rng.choice(("message", "knowledge")),
        }


def emit_one(em: Emitter, what: dict[str, Any], n: int) -> str:
    project = what["project"]
    if what["kind"] == "learn":
        return em.learn(project, what["key"], what["value"], agent_id=what["agent"])
    if what["kind"] == "filler":
        return em.emit(
            Minute(
                project_id=project,
                event_type="message",
                agent_id=what["agent"],
                data={"n": n},
                memory_note=f"status update {n}: still working on it",
            )
        )
    fields: dict[str, Any] = {}
    if what["timestamp"] is not None:
        fields["timestamp"] = what["timestamp"]
    data: dict[str, Any] = {"n": n}
    if what["task"] is not None:
        data["task_id"] = what["task"]
        fields["scope"] = "task"
    return em.emit(
        Minute(
            project_id=project,
            event_type=what["event_type"],
            agent_id=what["agent"],
            data=data,
            memory_note=statement(what["subject"], what["attribute"], what["value"]),
            **fields,
        )
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
    agent = Agent(seed, index, projects)
    emitted: list[dict[str, Any]] = []
    em = Emitter(settings=Settings.from_env())
    start = time.monotonic()
    due = 0.0
    while time.monotonic() - start < seconds:
        due += rate * TICK_S
        while len(emitted) < int(due):
            what = agent.next(len(emitted))
            what["id"] = emit_one(em, what, len(emitted))
            emitted.append(what)
        time.sleep(TICK_S)
    # close() spools what it cannot send in its timeout, and nothing replays that spool but a later
    # emitter: wait here until everything, spool included, is on the streams.
    flushed = em.flush(FLUSH_DEADLINE_S)
    stats = em.stats()
    em.close()
    with open(out, "w") as f:
        for what in emitted:
            f.write(json.dumps(what) + "\n")
        f.write("#stats " + json.dumps({**asdict(stats), "flushed": flushed}) + "\n")
    return 0 if flushed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A paraphrase-heavy, entity-heavy labeled set whose answers span 2-4 minutes of one thread (multi-hop).

Built to disagree with `bench/sessions.py` (where every relevant minute
states the whole situation): here a *chain* tells one story over several
minutes of one thread, each minute referring to the one before, and no
single minute answers the question. Stories are about many named entities
(people, code-named projects, vendors, customers), and the same names recur
in other chains in other roles, so a name alone does not find the answer.
A question names one entity by an alias (``the object-storage supplier``
for ``Nimbus Storage``) and asks for what another minute of the chain says.

Chains (relevant minutes marked *):

- blocker:    *X took ownership of project P; *P is blocked until vendor V
              delivers A; V delivered A — "who leads the initiative that
              waited on <V's alias>'s <A's alias>?"
- complaint:  customer C reported S; *traced C's issue to cause K; *offered C
              a credit — "what compensation went to the client whose trouble
              came from <K's alias>?"
- handoff:    *X handed the P runbook to Y; *Y rewrote it to cover T —
              "what did the new keeper of P's operating guide add to it?"
- decision:   Y proposed O1 for P; *X objected because R; *a benchmark
              showed M; *P went with O2 — "which option won for P after the
              objection, and what evidence settled it?"

This is the HELD-OUT set of `bench/retrieval.py`: no default was chosen on
it (see docs/search.md). Every question is multi-hop.

    from bench.multihop import labeled_chains
    session = labeled_chains("bench-multihop", seed=7)
"""

from __future__ import annotations

import random

from bench.sessions import LabeledSession, Query, _iso, _now_ms
from contracts import Minute
from contracts.ids import keyed_minute_id

PEOPLE = ("Amara", "Bjorn", "Chiara", "Dmitri", "Esther", "Farid", "Greta", "Hiroshi", "Ines", "Jonas", "Keiko", "Lars")
PROJECTS = ("Falcon", "Orchid", "Tundra", "Beacon", "Quasar", "Marlin", "Juniper", "Cobalt", "Saffron", "Zephyr")
# Vendors and what they deliver: (name, alias) pairs whose words differ.
VENDORS = (
    ("Nimbus Storage", "the object-storage supplier"),
    ("Ironclad Security", "the penetration-testing firm"),
    ("Velox Networks", "the bandwidth carrier"),
    ("Lumen Analytics", "the metrics contractor"),
    ("Atlas Hardware", "the server manufacturer"),
    ("Quill Legal", "the outside counsel"),
)
ARTIFACTS = (
    ("signed contract", "paperwork"),
    ("audit report", "assessment findings"),
    ("rack of machines", "physical equipment"),
    ("API credentials", "access tokens"),
    ("capacity plan", "sizing estimate"),
)
CUSTOMERS = ("Globex", "Initech", "Umbrella Foods", "Stark Logistics", "Wayne Media", "Acme Retail", "Hooli Travel")
SYMPTOMS = ("missing invoices", "double charges", "slow exports", "broken logins", "lost shipments")
CAUSES = (
    ("a timezone bug in the scheduler", "clocks in the cron planner set to the wrong zone"),
    ("a stale read replica", "a lagging database copy"),
    ("an exhausted API quota", "hitting the provider's request ceiling"),
    ("a bad feature flag", "a mis-set toggle"),
    ("a rounding error in currency conversion", "fractions of cents lost when exchanging money"),
)
CREDITS = ("one month free", "a 20 percent discount", "a refund of the setup fee", "priority support for a year")
TOPICS = ("failover drills", "cost alerts", "on-call escalation", "data retention", "disaster recovery")
OPTIONS = (("gRPC", "REST"), ("Terraform", "Pulumi"), ("Rust", "Go"), ("Snowflake", "BigQuery"), ("Vault", "SOPS"))
OBJECTIONS = ("the team lacks experience with it", "its licence is too expensive", "it failed the security review")
MEASURES = ("p99 latency fell by half", "build times dropped from 20 to 6 minutes", "monthly cost fell by 30 percent")
CHATTER = (
    "{x} and {y} met about project {p}",
    "{x} shared the {p} status deck",
    "{c} account review with {x}, routine",
    "{x} is on leave; {y} covers {p}",
    "{v} sent its quarterly newsletter",
)
STEP_MS = 45_000


def labeled_chains(project_id: str, seed: int = 7, chains: int = 80, chatter: int = 320,
                   end_ms: int | None = None) -> LabeledSession:  # fmt: skip
    """The chains and questions described in the module docstring, interleaved with chatter, in time order."""
    rng = random.Random(seed)
    stories: list[tuple[list[tuple[str, str, dict[str, object], bool]], str]] = []
    for _ in range(chains):
        kind = rng.choice(("blocker", "complaint", "handoff", "decision"))
        x, y = rng.sample(PEOPLE, 2)
        p = rng.choice(PROJECTS)
        if kind == "blocker":
            v, a = rng.choice(VENDORS), rng.choice(ARTIFACTS)
            steps = [
                ("task_assigned", f"{x} took ownership of project {p}", {"assignee": x}, True),
                ("message", f"{p} is blocked until {v[0]} delivers the {a[0]}", {}, True),
                ("message", f"{v[0]} delivered the {a[0]}; {p} unblocked", {}, False),
            ]
            question = f"who leads the initiative that waited on {v[1]} for the {a[1]}?"
        elif kind == "complaint":
            c, k = rng.choice(CUSTOMERS), rng.choice(CAUSES)
            steps = [
                ("message", f"{c} reported {rng.choice(SYMPTOMS)}", {}, False),
                ("message", f"traced the {c} issue to {k[0]}", {"reason": k[0]}, True),
                ("decision", f"offered {c} {rng.choice(CREDITS)} as compensation", {}, True),
            ]
            question = f"what did we give the client whose trouble came from {k[1]}?"
        elif kind == "handoff":
            t = rng.choice(TOPICS)
            steps = [
                ("handoff", f"{x} handed the {p} runbook to {y}", {"to_agent": y}, True),
                ("message", f"{y} rewrote the runbook to cover {t}", {}, True),
            ]
            question = f"what did the new keeper of the {p} operating guide add to it?"
        else:
            o = rng.choice(OPTIONS)
            steps = [
                ("message", f"{y} proposed {o[0]} for {p}", {}, False),
                ("message", f"{x} objected: {rng.choice(OBJECTIONS)}", {}, True),
                ("evaluation", f"benchmark result: {rng.choice(MEASURES)} with {o[1]}", {}, True),
                ("decision", f"{p} goes with {o[1]}", {"reasoning": "the benchmark settled it"}, True),
            ]
            question = f"which option won for {p} after the objection, and what evidence settled it?"
        stories.append((steps, question))
    # Interleave: each chain's minutes in order, chains and chatter shuffled together.
    slots: list[tuple[int, int]] = [(i, j) for i, (steps, _) in enumerate(stories) for j in range(len(steps))]
    slots += [(-1, n) for n in range(chatter)]
    rng.shuffle(slots)
    next_step = [0] * len(stories)
    order: list[tuple[int, int]] = []
    for i, _ in slots:
        if i < 0:
            order.append((i, 0))
        else:
            order.append((i, next_step[i]))
            next_step[i] += 1
    at = int(_now_ms() if end_ms is None else end_ms) - len(order) * STEP_MS
    ids: dict[tuple[int, int], str] = {}
    minutes: list[Minute] = []
    for i, j in order:
        at += rng.randint(STEP_MS // 2, STEP_MS * 3 // 2)
        if i < 0:
            x, y = rng.sample(PEOPLE, 2)
            note = rng.choice(CHATTER).format(
                x=x, y=y, p=rng.choice(PROJECTS), c=rng.choice(CUSTOMERS), v=rng.choice(VENDORS)[0]
            )
            event, data, thread, refs = "message", {}, None, ()
        else:
            event, note, data, _ = stories[i][0][j]
            thread, refs = f"chain-{i}", ((ids[(i, j - 1)],) if j else ())
        minute_id = keyed_minute_id(at, f"{project_id}/{len(minutes)}")
        minute = Minute(project_id=project_id, event_type=event, id=minute_id, timestamp=_iso(at),
                        agent_id=rng.choice(PEOPLE).lower(), data=dict(data), memory_note=note, thread_id=thread,
                        context_references=refs)  # fmt: skip
        minutes.append(minute)
        if i >= 0:
            ids[(i, j)] = minute.id
    queries = [
        Query(question, frozenset(ids[(i, j)] for j, s in enumerate(steps) if s[3]), kind, "paraphrase", multihop=True)
        for i, ((steps, question), kind) in enumerate(zip(stories, _kinds(stories), strict=True))
    ]
    return LabeledSession(minutes, queries)


def _kinds(stories: list[tuple[list[tuple[str, str, dict[str, object], bool]], str]]) -> list[str]:
    """Each chain's kind, read back from its first question word (for the per-kind report)."""
    by_start = {"who": "blocker", "what did we": "complaint", "what did the": "handoff", "which": "decision"}
    return [next(k for s, k in by_start.items() if q.startswith(s)) for _, q in stories]

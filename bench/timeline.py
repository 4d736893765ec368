"""A months-long labeled timeline: most questions ask about old events, several about what changed since.

Built to disagree with `bench/sessions.py` (a few hours of minutes, every
answer about as new as every other): here a project runs for `SPAN_DAYS`
days in `SESSIONS` working sessions, the newest a day before "now", and

- *choices*: a decision fixes an attribute of a component ("the invoicing
  backend will use PostgreSQL as its datastore, because ..."), with a
  message giving the reasoning; two in three are changed in a later session
  ("switched ... from PostgreSQL to CockroachDB after ...");
- *incidents*: an alert, a diagnosis and a fix, in one thread, each minute
  referring to the one before;
- *chatter* in every session names the same components in passing
  ("checked the invoicing backend dashboards, nothing new"): new minutes
  that share words with every question and answer none, the ones a
  recency weight pushes above old answers.

Questions (each labels the minutes that answer it):

- ``first``:   which value was chosen first, in other words than the decision's
               (relevant: the decision and its reasoning);
- ``changed``: what changed about an attribute (relevant: the decision and the
               change, months apart: multi-hop);
- ``latest``:  what the attribute is now ("currently", "now": the query asks
               for recency; relevant: the change);
- ``incident``: what broke a component and how it was fixed (relevant: the
               diagnosis and the fix: multi-hop).

A question is *old* when every minute that answers it lies in the oldest
third of the timeline (`old_answer_recall_at_10`).

    from bench.timeline import labeled_timeline
    session = labeled_timeline("bench-timeline", seed=7)
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime

from bench.sessions import AGENTS, LabeledSession, Query, _iso, _now_ms
from contracts import Minute
from contracts.ids import keyed_minute_id

DAY_MS = 24 * 3600 * 1000
SPAN_DAYS = 240  # eight months
SESSIONS = 30
MINUTE_GAP_MS = 90_000  # between minutes of one session

# Components in two wordings that share no stem: a question uses either.
COMPONENTS: tuple[tuple[str, str], ...] = (
    ("invoicing backend", "billing engine"),
    ("customer portal", "client web app"),
    ("search service", "query frontend"),
    ("notification hub", "alert dispatcher"),
    ("analytics warehouse", "reporting lake"),
    ("mobile API", "phone app gateway"),
    ("identity provider", "single sign-on"),
    ("media pipeline", "video processing chain"),
    ("order router", "purchase dispatcher"),
    ("fraud scorer", "risk model"),
    ("document store", "file archive"),
    ("partner webhook relay", "integration callback forwarder"),
)
# Attributes: two wordings each, and the values a component's attribute can take.
ATTRIBUTES: tuple[tuple[tuple[str, str], tuple[str, ...]], ...] = (
    (("datastore", "database"), ("PostgreSQL", "CockroachDB", "MySQL", "DynamoDB")),
    (("message queue", "event broker"), ("RabbitMQ", "Kafka", "NATS", "SQS")),
    (("hosting region", "cloud location"), ("Frankfurt", "Virginia", "Dublin", "Singapore")),
    (("cache", "in-memory store"), ("Redis", "Memcached", "Hazelcast", "Varnish")),
    (("logging vendor", "log provider"), ("Datadog", "Splunk", "Loki", "Papertrail")),
    (("deploy tool", "release mechanism"), ("Argo CD", "Spinnaker", "Helm scripts", "Flux")),
)
REASONS = (
    "its licence costs less at our volume",
    "the team already runs it elsewhere",
    "it kept latency under the target in the trial",
    "the vendor offered support in our time zone",
    "it handled the load test without errors",
    "the security review approved it first",
)
CHANGE_REASONS = (
    "the old one could not keep up with peak traffic",
    "the contract renewal tripled the price",
    "an outage showed it had no failover",
    "compliance asked for data to stay in another jurisdiction",
    "the maintainers ended support for our version",
)
# Incidents: a symptom, a cause and a fix, each in two wordings that share no stem.
INCIDENTS: tuple[tuple[tuple[str, str], tuple[str, str], tuple[str, str]], ...] = (
    (
        ("returned blank pages", "served empty screens"),
        ("an expired signing secret", "a lapsed HMAC key"),
        ("rotated the secret", "issued a fresh key"),
    ),
    (
        ("dropped half its requests", "lost many calls"),
        ("a misconfigured load balancer", "a wrong traffic splitter rule"),
        ("restored the balancer config", "reverted the splitter rule"),
    ),
    (
        ("slowed to a crawl", "became sluggish"),
        ("a runaway cron job", "a scheduled task looping forever"),
        ("killed the cron job", "stopped the looping schedule"),
    ),
    (
        ("sent duplicate emails", "mailed customers twice"),
        ("a retry without idempotency", "repeated attempts lacking dedup keys"),
        ("added idempotency keys", "made the sends deduplicated"),
    ),
    (
        ("corrupted uploaded files", "mangled attachments"),
        ("a truncated multipart parser", "a cut-off form decoder"),
        ("patched the parser", "fixed the decoder"),
    ),
    (
        ("showed stale prices", "displayed outdated costs"),
        ("a cache that never expired", "entries without a TTL"),
        ("set an expiry on the cache", "gave entries a TTL"),
    ),
)
CHATTER = (
    "checked the {c} dashboards, nothing new",
    "{agent} reviewed open tickets for the {c}",
    "weekly sync: the {c} is on track",
    "{agent} asked about the {c} {a} in planning; no change agreed",
    "{agent} updated the runbook index for the {c}",
    "the {c} {a} came up in the retro again, no action",
)


@dataclass(frozen=True)
class Choice:
    component: int
    attribute: int
    first: str
    then: str | None  # the value it was changed to, or None
    reason: str
    change_reason: str
    decided_session: int
    changed_session: int | None


def labeled_timeline(
    project_id: str,
    seed: int = 7,
    choices: int = 30,
    incidents: int = 18,
    chatter_per_session: int = 14,
    end_ms: int | None = None,
) -> LabeledSession:
    """The timeline described in the module docstring: minutes in time order, and labeled questions."""
    rng = random.Random(seed)
    end = int(_now_ms() if end_ms is None else end_ms) - DAY_MS  # the newest session was a day ago
    session_start = [end - int((SPAN_DAYS * (SESSIONS - 1 - i) / (SESSIONS - 1)) * DAY_MS) for i in range(SESSIONS)]
    pairs = [(c, a) for c in range(len(COMPONENTS)) for a in range(len(ATTRIBUTES))]
    # Most choices are made in the oldest third: the questions are mostly about old events.
    picked: list[Choice] = []
    for c, a in rng.sample(pairs, min(choices, len(pairs))):
        first, then = rng.sample(ATTRIBUTES[a][1], 2)
        decided = rng.randrange(SESSIONS // 3) if rng.random() < 0.7 else rng.randrange(SESSIONS // 2)
        changed = rng.randrange(decided + 2, SESSIONS) if rng.random() < 2 / 3 and decided + 2 < SESSIONS else None
        picked.append(
            Choice(
                c, a, first, then if changed is not None else None,
                rng.choice(REASONS), rng.choice(CHANGE_REASONS), decided, changed,
            )
        )  # fmt: skip
    # Per session: (kind, payload) items, each becoming one to three minutes.
    plan: list[list[tuple[str, object]]] = [[] for _ in range(SESSIONS)]
    for choice in picked:
        plan[choice.decided_session].append(("decided", choice))
        if choice.changed_session is not None:
            plan[choice.changed_session].append(("changed", choice))
    incident_plan = []
    kinds = [(c, i) for c in range(len(COMPONENTS)) for i in range(len(INCIDENTS))]
    for n, (component, which) in enumerate(rng.sample(kinds, min(incidents, len(kinds)))):
        session = rng.randrange(SESSIONS // 3) if n % 2 == 0 else rng.randrange(SESSIONS)
        spec = (component, which, session, n)
        incident_plan.append(spec)
        plan[session].append(("incident", spec))
    for items in plan:
        for _ in range(chatter_per_session):
            items.append(("chatter", None))
        rng.shuffle(items)

    minutes: list[Minute] = []
    answers: dict[tuple[str, object], list[str]] = {}

    def add(at: int, event_type: str, agent: str, note: str, data: dict[str, object], thread: str | None,
            refs: tuple[str, ...] = ()) -> str:  # fmt: skip
        minute = Minute(
            project_id=project_id,
            event_type=event_type,
            id=keyed_minute_id(at, f"{project_id}/{len(minutes)}"),
            timestamp=_iso(at),
            agent_id=agent,
            data=data,
            memory_note=note,
            thread_id=thread,
            context_references=refs,
        )
        minutes.append(minute)
        return minute.id

    for s, items in enumerate(plan):
        at = session_start[s]
        for kind, item in items:
            at += rng.randint(MINUTE_GAP_MS // 2, MINUTE_GAP_MS * 3 // 2)
            agent = rng.choice(AGENTS)
            if kind == "chatter":
                c = COMPONENTS[rng.randrange(len(COMPONENTS))][0]
                a = ATTRIBUTES[rng.randrange(len(ATTRIBUTES))][0][0]
                add(at, "message", agent, rng.choice(CHATTER).format(c=c, a=a, agent=agent), {}, None)
            elif kind == "decided":
                assert isinstance(item, Choice)
                c, a = COMPONENTS[item.component][0], ATTRIBUTES[item.attribute][0][0]
                thread = f"choice-{item.component}-{item.attribute}"
                d = add(at, "decision", "planner", f"decided: the {c} will use {item.first} as its {a}",
                        {"reasoning": f"{item.first} because {item.reason}"}, thread)  # fmt: skip
                at += MINUTE_GAP_MS
                r = add(at, "message", agent, f"why {item.first} for the {c}: {item.reason}", {}, thread, (d,))
                answers[("decided", item)] = [d, r]
            elif kind == "changed":
                assert isinstance(item, Choice)
                c, a = COMPONENTS[item.component][0], ATTRIBUTES[item.attribute][0][0]
                thread = f"choice-{item.component}-{item.attribute}"
                ch = add(at, "decision", "planner",
                         f"switched the {c} {a} from {item.first} to {item.then}",
                         {"reasoning": f"{item.change_reason}"}, thread, (answers[("decided", item)][0],))  # fmt: skip
                answers[("changed", item)] = [ch]
            else:
                component, which, _, n = item  # type: ignore[misc]
                symptom, cause, fix = INCIDENTS[which]
                c = COMPONENTS[component][0]
                thread = f"incident-{n}"
                alert = add(at, "task_failed", "operator", f"the {c} {symptom[0]}", {"task_id": f"INC-{n}"}, thread)
                at += MINUTE_GAP_MS
                cause_id = add(at, "message", agent, f"root cause on the {c}: {cause[0]}",
                               {"task_id": f"INC-{n}"}, thread, (alert,))  # fmt: skip
                at += MINUTE_GAP_MS
                fix_id = add(at, "task_completed", agent, f"{fix[0]}; the {c} is healthy again",
                             {"task_id": f"INC-{n}"}, thread, (cause_id,))  # fmt: skip
                answers[("incident", item)] = [cause_id, fix_id]

    oldest_third = session_start[0] + (end - session_start[0]) // 3
    born = {m.id: _ms(m.timestamp) for m in minutes}
    queries: list[Query] = []

    def ask(text: str, relevant: list[str], kind: str, wording: str, multihop: bool) -> None:
        old = all(born[i] < oldest_third for i in relevant)
        queries.append(Query(text, frozenset(relevant), kind, wording, multihop=multihop, old=old))

    for choice in picked:
        c = COMPONENTS[choice.component][rng.randrange(2)]
        a = ATTRIBUTES[choice.attribute][0][1]  # the other wording of the attribute
        decided = answers[("decided", choice)]
        ask(f"which {a} did we originally pick for the {c}, and why?", decided, "first", "mixed", False)
        if choice.then is not None:
            changed = answers[("changed", choice)]
            ask(f"what changed about the {a} of the {c} over time?", [decided[0], *changed], "changed", "mixed", True)
            ask(f"what {a} does the {c} currently run on now?", changed, "latest", "mixed", False)
    for spec in incident_plan:
        component, which, _, n = spec
        symptom, cause, fix = INCIDENTS[which]
        c = COMPONENTS[component][1]  # the other wording of the component
        ask(f"the {c} {symptom[1]}: what was behind it and how was it repaired?",
            answers[("incident", spec)], "incident", "paraphrase", True)  # fmt: skip
    minutes.sort(key=lambda m: m.id)
    return LabeledSession(minutes, queries)


def _ms(timestamp: str) -> int:
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)

"""Generated multi-agent coordination sessions, and labels saying which minutes answer which question.

A session is woven from *situations* running side by side, interleaved with
chatter, the way a fleet's minutes arrive:

- failure:  a task on some component is assigned, started and fails; someone
            names the root cause; sometimes a runbook note follows, sometimes a handoff;
- conflict: two agents collide on a component; a fix is proposed; the conflict
            is resolved;
- task:     work on a component is assigned, started and completed (sometimes reviewed).

Every component ("entity"), failure cause ("problem"), kind of work ("action")
and conflict resolution is a concept with three wordings that share no word
stem (``login service`` / ``sign-in backend`` / ``authentication endpoint``).
A situation's minutes use one wording of each of its concepts; a query put
in the same wording is an exact-term query (the lexical leg's strong case),
one put in the other wordings and another sentence shape is a paraphrase
(the lexical leg's weak case: only generic words can match). Situations of
a labeled session share components and causes with each other (a failure of
the login service caused by a full disk, another caused by clock skew, a
full disk on the billing database...), so a query must match both halves.

`stream()` yields as many minutes as asked (the reader benchmark's volume);
`labeled_session()` builds a session with queries whose relevant minutes are
known (the retrieval benchmark).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from contracts import Minute
from contracts.ids import keyed_minute_id

AGENTS = ("planner", "coder", "reviewer", "tester", "deployer", "researcher", "operator", "dba")
WORKERS = AGENTS[1:]  # agents that take tasks (the planner assigns them)

# Three wordings per concept, no word stem shared within a concept.
ENTITIES: tuple[tuple[str, str, str], ...] = (
    ("login service", "sign-in backend", "authentication endpoint"),
    ("billing database", "ledger datastore", "payments DB"),
    ("search index", "Elasticsearch cluster", "full-text lookup"),
    ("image thumbnailer", "picture resizing worker", "photo scaling job"),
    ("nightly ETL pipeline", "overnight data import", "evening batch ingestion"),
    ("push notifications", "mobile alert delivery", "phone message broadcaster"),
    ("checkout page", "purchase flow", "cart screen"),
    ("CI build cache", "continuous integration artifact store", "compiler output reuse"),
    ("customer CSV export", "client spreadsheet download", "user data extract"),
    ("rate limiter", "request throttling", "abuse protection gate"),
    ("DNS records", "domain name entries", "hostname resolution config"),
    ("TLS certificates", "SSL certs", "HTTPS keys"),
    ("Kafka consumers", "event stream readers", "message bus subscribers"),
    ("feature flag service", "toggle configuration", "staged rollout switches"),
    ("recommendation model", "suggestion ranker", "personalization algorithm"),
    ("invoice PDF generator", "bill document renderer", "receipt printing module"),
    ("email sender", "mail dispatch", "newsletter relay"),
    ("Kubernetes autoscaler", "cluster node scaling", "pod capacity controller"),
    ("backup snapshots", "disaster recovery copies", "point-in-time archives"),
    ("GraphQL gateway", "API front door", "schema federation layer"),
    ("translation strings", "localization files", "i18n catalogs"),
    ("session cache", "token store", "logged-in state keeper"),
    ("audit log", "compliance trail", "activity history"),
    ("video transcoder", "media encoding farm", "clip conversion service"),
)
PROBLEMS: tuple[tuple[str, str, str], ...] = (
    ("the disk was full", "the storage volume ran out of space", "no free bytes were left on the drive"),
    ("a memory leak", "RAM usage grew until the process was killed", "the heap was exhausted"),
    ("clock skew between hosts", "server times drifted apart", "the machines disagreed about what time it was"),
    (
        "a deadlock between transactions",
        "two jobs blocked each other forever",
        "each worker waited on the other endlessly",
    ),
    ("an upstream timeout", "the dependency answered too slowly", "a remote call exceeded its time limit"),
    ("a stale schema", "table columns out of sync with the code", "an outdated database structure"),
    ("a missing environment variable", "a config setting absent at startup", "an unset deployment parameter"),
    ("a race condition", "concurrent updates interleaved wrongly", "unsafe parallel access to shared state"),
    ("a network partition", "hosts could not reach each other", "connectivity split between zones"),
    (
        "the provider quota was exceeded",
        "the vendor rejected our calls for sending too many",
        "a third-party usage cap",
    ),
    ("a corrupted input file", "malformed upload data", "garbled source records"),
    (
        "a breaking library bump",
        "a new dependency version altered its API",
        "package releases that do not fit together",
    ),
    ("a unicode encoding error", "non-ASCII characters got mangled", "the wrong text charset"),
    ("a slow unindexed query", "a full table scan", "a database lookup without an index"),
    ("permission denied for the service account", "missing access rights", "a forbidden IAM policy"),
    ("an exhausted connection pool", "no sockets left to the database", "all client links were busy"),
)
# Kinds of work: a task_kind slug and three wordings of the work ({e} is the entity).
ACTIONS: tuple[tuple[str, tuple[str, str, str]], ...] = (
    (
        "migration",
        (
            "migrate the {e} to the new region",
            "move the {e} onto fresh infrastructure",
            "relocate the {e} to other hardware",
        ),
    ),
    ("upgrade", ("upgrade the {e}", "bring the {e} to its latest version", "update the {e} to a newer release")),
    (
        "caching",
        ("add caching in front of the {e}", "memoize responses of the {e}", "keep hot results of the {e} in memory"),
    ),
    (
        "testing",
        (
            "write integration tests for the {e}",
            "cover the {e} with end-to-end checks",
            "build a verification suite for the {e}",
        ),
    ),
    ("docs", ("document the {e}", "explain the {e} in the wiki", "produce a handbook describing the {e}")),
    ("performance", ("speed up the {e}", "make the {e} faster", "cut the latency of the {e}")),
    (
        "security",
        ("harden the security of the {e}", "lock down the {e} against attackers", "close vulnerabilities in the {e}"),
    ),
    ("refactoring", ("refactor the {e}", "clean up the code of the {e}", "restructure the internals of the {e}")),
)
RESOLUTIONS: tuple[tuple[str, str, str], ...] = (
    (
        "serializing the writers behind a lock",
        "making the updates run one at a time",
        "queueing the changes sequentially",
    ),
    (
        "splitting the task into two parts",
        "dividing the work between both agents",
        "breaking the job into separate pieces",
    ),
    ("having the planner re-prioritize the backlog", "reordering what comes first", "changing the urgency ranking"),
    ("rolling back to the previous release", "reverting the deploy", "restoring the last good version"),
    ("adding a retry with backoff", "trying again with growing delays", "repeating the call after a pause"),
    ("escalating to a human reviewer", "asking a person to decide", "handing the dispute to an operator"),
    ("merging both proposals", "combining the two approaches", "unifying the competing designs"),
    (
        "giving ownership to the agent with the better track record",
        "letting the more reliable agent keep it",
        "assigning it to whoever succeeds more often",
    ),
)
CONFLICT_TYPES = ("resource", "priority", "file-lock", "ownership", "design")

# Query shapes. Exact queries reuse the minutes' wordings; paraphrases use other wordings and other sentences.
FAILURE_EXACT = ("why did the {e} fail with {p}", "{e} failure: {p}", "{p} on the {e}")
FAILURE_PARAPHRASE = (
    "the {e} stopped working and it looks like {p}; how did that go last time?",
    "incident on the {e} where {p}",
    "what went wrong with the {e} when {p}",
)
CONFLICT_EXACT = ("how was the {c} conflict on the {e} resolved", "{c} conflict over the {e}")
CONFLICT_PARAPHRASE = (
    "how did the agents settle their disagreement about the {e}?",
    "two agents argued over the {e}; what did we agree?",
    "clash between agents touching the {e}: how was it sorted out",
)
TASK_PARAPHRASE = ("has anyone ever had to {a}?", "who can {a}, and how did it go before?", "we need to {a}")

CHATTER = (
    "{agent}: standup, still working through the backlog",
    "{agent} is reading the {e} code",
    "{agent} reviewed a small change to the {e}",
    "{agent} asked {other} to pair on the {e} for an hour",
    "{agent} updated the dashboard for the {e}",
    "{agent} is blocked waiting for {other}",
    "{agent}: heartbeat, nothing new",
)

WORDINGS = ("exact", "mixed", "paraphrase")
MINUTE_STEP_MS = 2_000  # mean time between minutes of a session


@dataclass(frozen=True)
class Situation:
    """One thing that happens in a session: a failure, a conflict or a task, with its wordings fixed."""

    kind: str  # failure | conflict | task
    entity: int
    detail: int  # index into PROBLEMS, RESOLUTIONS or ACTIONS
    entity_form: int
    detail_form: int
    agent: str
    other: str
    task_id: str
    conflict_type: str = ""

    @property
    def entity_text(self) -> str:
        return ENTITIES[self.entity][self.entity_form]

    def detail_text(self, form: int | None = None) -> str:
        form = self.detail_form if form is None else form
        if self.kind == "failure":
            return PROBLEMS[self.detail][form]
        if self.kind == "conflict":
            return RESOLUTIONS[self.detail][form]
        return ACTIONS[self.detail][1][form].format(e=self.entity_text)


@dataclass(frozen=True)
class Step:
    """One minute a situation (or the chatter) is about to emit, before it gets an id and a time."""

    event_type: str
    agent_id: str
    data: dict[str, Any]
    note: str
    relevant: bool = False  # labeled as an answer to the situation's queries
    refers_back: bool = True  # references the situation's previous minute


@dataclass(frozen=True)
class Query:
    """A question with the minutes that answer it."""

    text: str
    relevant: frozenset[str]
    kind: str  # the situation's kind: failure | conflict | task (other sets name their own)
    wording: str  # exact | mixed | paraphrase
    multihop: bool = False  # the answer spans minutes that do not each state it (a chain, a before and after)
    old: bool = False  # every answer lies in the oldest third of a long timeline (bench/timeline.py)


@dataclass
class LabeledSession:
    minutes: list[Minute]
    queries: list[Query]
    situations: list[Situation] = field(default_factory=list)


def script(s: Situation, rng: random.Random) -> list[Step]:
    """The minutes a situation emits, in order."""
    e, task, agent, other = s.entity_text, s.task_id, s.agent, s.other
    if s.kind == "failure":
        p = s.detail_text()
        steps = [
            Step(
                "task_assigned",
                "planner",
                {"task_id": task, "assignee": agent, "assignment_reasoning": f"{agent} has handled the {e} before"},
                f"{task} on the {e} assigned to {agent}",
                refers_back=False,
            ),
            Step("task_started", agent, {"task_id": task}, f"{agent} started {task} on the {e}"),
            Step(
                "task_failed",
                agent,
                {"task_id": task, "success_criteria_met": rng.randint(0, 35), "error": p},
                f"the {e} broke: {p}",
                relevant=True,
            ),
            Step("message", other, {"task_id": task}, f"root cause of the {e} outage: {p}", relevant=True),
        ]
        if rng.random() < 0.5:
            steps.append(
                Step("knowledge", "operator", {"task_id": task}, f"runbook for the {e}: check for {p} first", True)
            )
        if rng.random() < 0.5:
            steps.append(
                Step("handoff", agent, {"task_id": task, "to_agent": other}, f"{agent} handed the {e} fix to {other}")
            )
        return steps
    if s.kind == "conflict":
        r, c = s.detail_text(), s.conflict_type
        return [
            Step(
                "conflict_detected",
                agent,
                {"task_id": task, "conflict_type": c},
                f"{agent} and {other} both changed the {e}: {c} conflict",
                relevant=True,
                refers_back=False,
            ),
            Step("message", "planner", {"task_id": task}, f"proposal for the {e} {c} conflict: {r}", relevant=True),
            Step(
                "conflict_resolved",
                "planner",
                {"task_id": task, "conflict_type": c, "resolution": r, "success_criteria_met": rng.randint(60, 100)},
                f"{c} conflict on the {e} resolved by {r}",
                relevant=True,
            ),
        ]
    work = s.detail_text()
    kind = ACTIONS[s.detail][0]
    steps = [
        Step(
            "task_assigned",
            "planner",
            {"task_id": task, "task_kind": kind, "assignee": agent, "assignment_reasoning": f"{agent} did {kind} work"},
            f"assigned to {agent}: {work}",
            relevant=True,
            refers_back=False,
        ),
        Step("task_started", agent, {"task_id": task, "task_kind": kind}, f"{agent} started to {work}", relevant=True),
        Step(
            "task_completed",
            agent,
            {"task_id": task, "task_kind": kind, "success_criteria_met": rng.randint(70, 100)},
            f"done: {work}",
            relevant=True,
        ),
    ]
    if rng.random() < 0.4:
        steps.append(Step("message", "reviewer", {"task_id": task}, f"reviewed the change to the {e}"))
    return steps


def chatter(rng: random.Random) -> Step:
    """A minute that belongs to no situation (it may name a component in passing)."""
    agent, other = rng.sample(AGENTS, 2)
    e = rng.choice(ENTITIES)[rng.randrange(3)]
    text = rng.choice(CHATTER).format(agent=agent, other=other, e=e)
    return Step("message", agent, {}, text, refers_back=False)


def random_situation(rng: random.Random, n: int) -> Situation:
    """Any situation (the volume stream: repeats are fine)."""
    kind = rng.choices(("failure", "conflict", "task"), weights=(3, 2, 5))[0]
    detail_count = {"failure": len(PROBLEMS), "conflict": len(RESOLUTIONS), "task": len(ACTIONS)}[kind]
    agent, other = rng.sample(WORKERS, 2)
    return Situation(
        kind=kind,
        entity=rng.randrange(len(ENTITIES)),
        detail=rng.randrange(detail_count),
        entity_form=rng.randrange(3),
        detail_form=rng.randrange(3),
        agent=agent,
        other=other,
        task_id=f"T-{n:05d}",
        conflict_type=rng.choice(CONFLICT_TYPES) if kind == "conflict" else "",
    )


class Weaver:
    """Interleaves the steps of a few concurrent situations with chatter, as one project's minutes."""

    def __init__(
        self,
        situations: Iterator[Situation],
        rng: random.Random,
        concurrent: int = 6,
        chatter_share: float = 0.3,
        label: bool = False,
    ) -> None:
        self._pending = situations
        self._rng = rng
        self._chatter = chatter_share
        self._label = label
        self._active: list[tuple[Situation, list[Step], list[str]]] = []  # situation, steps left, minute ids so far
        self.recent: list[str] = []
        self._made = 0  # minutes made: each one's id is keyed by it (the same ids in every run)
        self.minute_ids: dict[Situation, list[tuple[str, bool]]] = {}  # situation -> (minute id, relevant)
        for _ in range(concurrent):
            self._open()

    def _open(self) -> None:
        situation = next(self._pending, None)
        if situation is not None:
            self._active.append((situation, script(situation, self._rng), []))

    @property
    def done(self) -> bool:
        return not self._active

    def next_minute(self, project_id: str, at_ms: int) -> Minute:
        """The project's next minute, stamped `at_ms`."""
        rng = self._rng
        situation: Situation | None = None
        ids: list[str] = []
        if self._active and rng.random() >= self._chatter:
            index = rng.randrange(len(self._active))
            situation, steps, ids = self._active[index]
            step = steps.pop(0)
            if not steps:
                self._active.pop(index)
                self._open()
        else:
            step = chatter(rng)
        refs = [ids[-1]] if step.refers_back and ids else []
        if self.recent and rng.random() < 0.3:
            refs.append(rng.choice(self.recent))
        minute = Minute(
            project_id=project_id,
            event_type=step.event_type,
            id=keyed_minute_id(at_ms, f"{project_id}/{self._made}"),
            timestamp=_iso(at_ms),
            agent_id=step.agent_id,
            data=step.data,
            context_references=tuple(dict.fromkeys(refs)),
            memory_note=step.note,
            thread_id=step.data.get("task_id"),
        )
        self._made += 1
        ids.append(minute.id)
        if situation is not None and self._label:
            self.minute_ids.setdefault(situation, []).append((minute.id, step.relevant))
        self.recent = [*self.recent[-19:], minute.id]
        return minute


def _iso(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms / 1000, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def stream(
    weights: Mapping[str, float],
    n: int,
    seed: int = 7,
    end_ms: int | None = None,
) -> Iterator[Minute]:
    """`n` minutes over the projects in `weights` (share of the minutes each gets), in time order.

    Timestamps are spaced `MINUTE_STEP_MS` apart on average and end at `end_ms`
    (default: now), so recency behaves as in a live fleet.
    """
    rng = random.Random(seed)
    projects = list(weights)
    shares = [weights[p] for p in projects]
    counter = iter(range(1, 1 << 62))

    def endless() -> Iterator[Situation]:
        while True:
            yield random_situation(rng, next(counter))

    weavers = {p: Weaver(endless(), rng) for p in projects}
    end = int(_now_ms() if end_ms is None else end_ms)
    at = end - n * MINUTE_STEP_MS
    for _ in range(n):
        at += rng.randint(1, 2 * MINUTE_STEP_MS - 1)
        project = rng.choices(projects, shares)[0]
        yield weavers[project].next_minute(project, at)


def task_texts(rng: random.Random, n: int) -> list[str]:
    """Task descriptions an agent might ask its context for: work, incidents and conflicts, in any wording."""
    out = []
    for _ in range(n):
        e = rng.choice(ENTITIES)[rng.randrange(3)]
        roll = rng.random()
        if roll < 0.5:
            out.append(rng.choice(ACTIONS)[1][rng.randrange(3)].format(e=e))
        elif roll < 0.8:
            out.append(f"fix the {e}: {rng.choice(PROBLEMS)[rng.randrange(3)]}")
        else:
            out.append(f"sort out the {rng.choice(CONFLICT_TYPES)} conflict on the {e}")
    return out


def labeled_session(
    project_id: str,
    seed: int = 7,
    failures: int = 100,
    conflicts: int = 24,
    tasks: int = 60,
    chatter_share: float = 0.3,
    end_ms: int | None = None,
) -> LabeledSession:
    """A session whose situations are distinct, with a query in each of `WORDINGS` for each.

    Failures differ in (entity, problem), tasks in (entity, action), and each
    conflict is about its own entity, so every query has one right situation;
    the relevant minutes are that situation's minutes marked relevant.
    """
    rng = random.Random(seed)
    conflicts = min(conflicts, len(ENTITIES))
    pairs = [(e, p) for e in range(len(ENTITIES)) for p in range(len(PROBLEMS))]
    work = [(e, a) for e in range(len(ENTITIES)) for a in range(len(ACTIONS))]
    if failures > len(pairs) or tasks > len(work):
        raise ValueError(f"at most {len(pairs)} failures and {len(work)} tasks are distinct")
    chosen: list[tuple[str, int, int]] = [("failure", e, p) for e, p in rng.sample(pairs, failures)]
    chosen += [("conflict", e, rng.randrange(len(RESOLUTIONS))) for e in rng.sample(range(len(ENTITIES)), conflicts)]
    chosen += [("task", e, a) for e, a in rng.sample(work, tasks)]
    rng.shuffle(chosen)
    situations = []
    for n, (kind, entity, detail) in enumerate(chosen, start=1):
        agent, other = rng.sample(WORKERS, 2)
        situations.append(
            Situation(
                kind=kind,
                entity=entity,
                detail=detail,
                entity_form=rng.randrange(3),
                detail_form=rng.randrange(3),
                agent=agent,
                other=other,
                task_id=f"T-{n:05d}",
                conflict_type=rng.choice(CONFLICT_TYPES) if kind == "conflict" else "",
            )
        )
    weaver = Weaver(iter(situations), rng, chatter_share=chatter_share, label=True)
    minutes: list[Minute] = []
    expected = sum(len(script(s, random.Random(0))) for s in situations) / (1 - chatter_share)
    at = int(_now_ms() if end_ms is None else end_ms) - int(expected * MINUTE_STEP_MS)
    while not weaver.done:
        at += rng.randint(1, 2 * MINUTE_STEP_MS - 1)
        minutes.append(weaver.next_minute(project_id, at))
    queries = []
    for s in situations:
        relevant = frozenset(i for i, is_relevant in weaver.minute_ids[s] if is_relevant)
        for wording in WORDINGS:
            queries.append(Query(_query_text(s, wording, rng), relevant, s.kind, wording))
    return LabeledSession(minutes, queries, situations)


def _other_form(rng: random.Random, used: int) -> int:
    return rng.choice([f for f in range(3) if f != used])


def _query_text(s: Situation, wording: str, rng: random.Random) -> str:
    """The query for a situation: in the minutes' words (exact), in other words (paraphrase), or half and half.

    "mixed" keeps the component in the minutes' words and puts the cause, the
    work or the conflict in other words, as an agent who knows the component's
    name but not how the minutes described what happened would ask.
    """
    exact, mixed = wording == "exact", wording == "mixed"
    e = s.entity_text if exact or mixed else ENTITIES[s.entity][_other_form(rng, s.entity_form)]
    if s.kind == "failure":
        p = s.detail_text() if exact else PROBLEMS[s.detail][_other_form(rng, s.detail_form)]
        return rng.choice(FAILURE_EXACT if exact else FAILURE_PARAPHRASE).format(e=e, p=p)
    if s.kind == "conflict":
        if exact:
            return rng.choice(CONFLICT_EXACT).format(c=s.conflict_type, e=e)
        return rng.choice(CONFLICT_PARAPHRASE).format(e=e)
    if exact:
        return s.detail_text()
    work = ACTIONS[s.detail][1][_other_form(rng, s.detail_form)].format(e=e)
    return rng.choice(TASK_PARAPHRASE).format(a=work)


def _now_ms() -> int:
    return int(time.time() * 1000)


def summary(minutes: Sequence[Minute]) -> dict[str, int]:
    """Minutes per event type (for a benchmark's report)."""
    out: dict[str, int] = {}
    for m in minutes:
        out[m.event_type] = out.get(m.event_type, 0) + 1
    return dict(sorted(out.items()))

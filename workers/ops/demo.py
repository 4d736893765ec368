"""`pvm demo`: a multi-agent coordination session pushed through the embedded stack, end to end."""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from contracts import Minute, keys
from contracts.facts import FactType, TierKey
from pvm import defaults
from pvm.config import Settings
from workers.ops.tables import log_tail_text, minute_row

if TYPE_CHECKING:
    import redis

    from pvm.stores.facts import FactStore

AGENTS = ("planner", "coder", "reviewer", "tester", "deployer")
TASKS = ("parse-invoices", "fix-login-bug", "migrate-db", "write-docs", "tune-cache", "ship-release")

# What agents say about each task: work notes, failure causes, and things learned.
TASK_NOTES = {
    "parse-invoices": (
        [
            "PDF tables split across pages break the line-item parser",
            "switched to layout-aware extraction",
            "VAT totals now reconcile for EU vendors",
            "OCR confidence below 0.8 goes to manual review",
        ],
        ["scanned invoices without a text layer", "currency symbols parsed as digits"],
        ["invoices from vendor Acme use a two-column layout"],
    ),
    "fix-login-bug": (
        [
            "session cookie expires after 5 minutes instead of 8 hours",
            "the refresh token is not rotated on login",
            "reproduced the logout loop in Safari",
            "cookie SameSite=Lax fixes the redirect loop",
        ],
        ["the fix broke single sign-on for the admin console", "flaky end-to-end login test timed out"],
        ["the auth service caches sessions in Redis with a TTL set in config/auth.yml"],
    ),
    "migrate-db": (
        [
            "orders table migration needs a backfill of 40M rows",
            "added the index concurrently to avoid locks",
            "dry run on the staging snapshot took 3h",
            "foreign keys re-enabled after the copy",
        ],
        ["the migration locked the orders table for 20 minutes", "disk filled up during the backfill"],
        ["run schema migrations in batches of 50k rows outside business hours"],
    ),
    "write-docs": (
        [
            "API reference regenerated from the OpenAPI spec",
            "added a quickstart for the Python client",
            "documented the rate limits per plan",
            "screenshots updated for the new dashboard",
        ],
        ["docs build failed on a broken cross-reference"],
        ["the docs site deploys from the main branch every hour"],
    ),
    "tune-cache": (
        [
            "cache hit rate rose from 71% to 93% after key normalization",
            "evictions spike at midnight batch jobs",
            "moved hot keys to a separate Redis database",
            "TTL jitter stops the thundering herd",
        ],
        ["cache stampede took the product page down", "memory limit hit on the cache nodes"],
        ["product pages are cached for 10 minutes; prices for 1 minute"],
    ),
    "ship-release": (
        [
            "release 2.4 tagged and the changelog drafted",
            "canary at 5% of traffic shows no errors",
            "rollback plan rehearsed on staging",
            "feature flags default off for the new checkout",
        ],
        ["canary error rate crossed 2% and the release was rolled back"],
        ["releases go out Tuesday and Thursday mornings, never on Friday"],
    ),
}


# What the team decides on each task, in order: a first choice, then the change to it (one slot each), so
# the facts pool supersedes the first value and the reader's facts show only the newest. A task's later
# decision minutes restate its last decision.
TASK_DECISIONS = {
    "parse-invoices": ("we use Tesseract for OCR", "switch OCR from Tesseract to Textract"),
    "fix-login-bug": (
        "we use Postgres for the session store",
        "switch the session store from Postgres to Redis",
    ),
    "migrate-db": (
        "the orders service's database is MySQL",
        "switch the orders service database from MySQL to Postgres",
    ),
    "write-docs": ("we use Sphinx for the docs site", "switch the docs site from Sphinx to MkDocs"),
    "tune-cache": (
        "the product service's cache is Memcached",
        "use Redis instead of Memcached for the product service cache",
    ),
    "ship-release": (
        "the web app's deploy window is Friday afternoons",
        "we changed the web app's deploy window to Tuesday mornings",
    ),
}


def sample_session(project_id: str, n: int, seed: int = 7) -> Iterator[Minute]:
    """A plausible stream of minutes: assignments, work, conflicts and resolutions, failures, handoffs, and
    decisions that later change (`TASK_DECISIONS`)."""
    rng = random.Random(seed)
    recent: list[str] = []
    decided = dict.fromkeys(TASKS, 0)  # decision minutes so far, per task
    for _ in range(n):
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
        work, causes, facts = TASK_NOTES[task]
        note = None
        if kind == "task_assigned":
            data["assignment_reasoning"] = f"{agent} has the best record on {task.split('-')[0]} work"
            note = f"{task} assigned to {agent}"
        elif kind in ("task_completed", "task_failed"):
            data["success_criteria_met"] = rng.randint(70, 100) if kind == "task_completed" else rng.randint(0, 40)
            if kind == "task_completed":
                note = f"{agent} finished {task}: {rng.choice(work)}"
            else:
                note = f"{agent} failed {task}: {rng.choice(causes)}"
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
        elif kind == "knowledge":
            note = rng.choice(facts)
        elif kind == "decision":
            rng.choice(work)  # drawn as before decisions had their own notes, so the other minutes stay as they were
            statements = TASK_DECISIONS[task]
            note = statements[min(decided[task], len(statements) - 1)]
            decided[task] += 1
        else:
            note = f"{agent} on {task}: {rng.choice(work)}"
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


def decision_lines(store: FactStore, project_id: str, session: Sequence[Minute], task: str) -> list[str] | None:
    """What the facts store holds about `task`'s decision: the current value, then the values it replaced.

    The slot is the one the facts of the task's decision minutes sit in (project or task tier). The current
    value is read with `FactStore.current` (what the reader shows), the old ones with `FactStore.history`,
    each with the time it stopped holding. None when the store holds no decision of the task.
    """
    said = {m.id for m in session if m.event_type == "decision" and m.data.get("task_id") == task}
    for tier_key in (TierKey.for_task(project_id, task), TierKey.for_project(project_id)):
        stated = [f for f in store.by_type(tier_key, FactType.DECISION) if said & set(f.source_minute_ids)]
        if not stated:
            continue
        slot = stated[-1].slot
        current = [f for f in store.current([tier_key], types=[FactType.DECISION]) if f.slot == slot]
        now = {f.id for f in current}
        old = [f for f in store.history(tier_key, slot) if f.id not in now]
        lines = [f"What we decided on {task} ({slot.subject} / {slot.attribute}, {tier_key.tier.value} tier):"]
        lines += [f"  current:    {f.value}  (valid from {f.valid_from}; {f.status.value})" for f in current]
        if not current:
            lines.append("  current:    nothing promoted yet")
        for f in sorted(old, key=lambda f: f.valid_from, reverse=True):
            held = f"valid {f.valid_from} until {f.valid_until}" if f.valid_until else f"valid from {f.valid_from}"
            lines.append(f"  history:    {f.value}  ({f.status.value}; {held})")
        return lines
    return None


def shown_decision(store: FactStore, project_id: str, session: Sequence[Minute]) -> list[str]:
    """`decision_lines` of the first task (the demo's reader task first) whose decision changed, else of any."""
    tasks = ("fix-login-bug", *(t for t in TASKS if t != "fix-login-bug"))
    found = [lines for t in tasks if (lines := decision_lines(store, project_id, session, t))]
    changed = [lines for lines in found if any(line.startswith("  history:") for line in lines)]
    return (changed or found or [["No decision reached the facts store."]])[0]


# -- the PAIR step ----------------------------------------------------------------------------------------------------

# One agent's output checked against its task's success criteria (docs/pair.md); the session's notes can fill its gaps.
PAIR_AGENT = "coder"
PAIR_TASK = "Fix the login bug and write up what was wrong for the release notes"
PAIR_CRITERIA = (
    "Says the session cookie expired after 5 minutes instead of 8 hours",
    "Says whether the refresh token is rotated on login",
    'Names the cookie fix, "SameSite=Lax"',
    "Does not mention Safari",
)
PAIR_OUTPUT = "Fixed the login bug: the session cookie now lasts as long as it should. Safari users were affected."


def pair_lines(run: dict[str, Any]) -> list[str]:
    """A PAIR run (`PairResult.to_dict`) as the demo prints it: judge -> gaps -> memories -> revision -> re-judge."""
    lines: list[str] = []
    for r in run["rounds"]:
        again = " (re-judge)" if r["round"] > 1 else ""
        judged = f"judge{again}, round {r['round']}: {r['score']}/100 by {r['judge']}"
        lines.append(judged + (f" ({r['judge_fallback']})" if r["judge_fallback"] else ""))
        for gap in r["gaps"]:
            said = [f"missing {', '.join(gap['missing'])}"] if gap["missing"] else []
            said += [f"holds {', '.join(gap['forbidden'])}"] if gap["forbidden"] else []
            lines.append(f"  gap: {gap['criterion']} -- {'; '.join(said)}")
        for found in r["retrieved"]:
            if found["memories"]:
                lines.append(f"  memories for {found['criterion']!r}:")
                lines += [f"    [{m['id']}] ({m['kind']}) {m['text']}" for m in found["memories"]]
        if r["revision"] is not None:
            lines.append(f"  revision by {r['reviser']}:")
            lines += [f"    {line}" if line else "" for line in str(r["revision"]).splitlines()]
    lines.append(
        f"stopped: {run['stopped']}; best score {run['score']}/100 (target {run['target']}); "
        f"{len(run['minute_ids'])} minutes written (pair_evaluation, pair_revision)"
    )
    return lines


def _wait(label: str, done: Callable[[], int], target: int, timeout: float = 90) -> bool:
    deadline = time.monotonic() + timeout
    shown = -1
    tty = sys.stdout.isatty()
    while True:
        n = done()
        if n != shown:
            print(f"\r  {label}: {n}/{target}", end="" if tty else "\n")
            sys.stdout.flush()
            shown = n
        if n >= target:
            if tty:
                print()
            return True
        if time.monotonic() > deadline:
            print(f"\npvm demo: timed out waiting ({label})", file=sys.stderr)
            return False
        time.sleep(0.1)


def _settle(
    connection: redis.Redis, project: str, summaries: bool = False, quiet_s: float = 0.5, timeout: float = 30
) -> None:
    """Wait until the index (and with `summaries` the summarize pool) has caught up with the log and the log has
    stopped growing for `quiet_s` (the change minutes the facts pool wrote have gone through the streams, the log
    and the index), or `timeout` passes."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        log_seq = int(connection.hget(keys.log_head(project), "seq") or 0)
        index_seq = int(connection.hget(keys.index_head(project), "seq") or 0)
        summarized = int(connection.hget(keys.summarize_head(project), "seq") or 0) if summaries else log_seq
        if log_seq != last:
            last, since = log_seq, time.monotonic()
        elif min(index_seq, summarized) >= log_seq and time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.05)


def run_demo(settings: Settings, minutes: int = defaults.DEMO_MINUTES, project: str | None = None) -> int:
    """Run a coordination session through the embedded stack, then show the log and one agent's context."""
    import socket

    from pvm.client import PVMAPIError, PVMClient
    from pvm.connection import redis_from_settings
    from pvm.emitter import Emitter
    from pvm.stores.facts import FactStore
    from pvm.stores.log import LogReader
    from workers.runtime.stack import Stack

    # A new project per run unless one is named: the demo keeps its state in PVM_HOME, and a second run into the
    # same project would show the first run's minutes and facts beside its own.
    project = project or time.strftime("apollo-%Y%m%d-%H%M%S", time.gmtime())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        api_port = int(s.getsockname()[1])
    print(f"pvm demo: starting the embedded stack (home {settings.home.resolve()})")
    with Stack(settings, api_port=api_port) as stack:
        live = stack.settings
        reader = LogReader(live.log_dir)
        before = reader.count(project)
        with_facts = "facts" in live.downstream
        named = [p for p in ("log", "facts", "summarize") if p == "log" or p in live.downstream]
        pools = f"{', '.join(named[:-1])} and {named[-1]} pools" if len(named) > 1 else "log pool"
        print(f"  Redis {live.redis_url}; dispatcher, {pools}, and the reader API + index pool on {live.api_url}")
        session = list(sample_session(project, minutes, seed=int(time.time()) % 1000))
        started = time.monotonic()
        with Emitter(settings=live) as emitter:
            for minute in session:
                emitter.emit(minute)
        agents = sorted({m.agent_id for m in session if m.agent_id})
        print(f"  emitted {minutes} minutes of project {project!r} from {len(agents)} agents: {', '.join(agents)}")
        # The facts pool writes change minutes to the log too: count the session's own minutes, by id.
        durable: dict[str, int] = {}  # session minute id -> its log seq

        def logged() -> int:
            missing = [m.id for m in session if m.id not in durable]
            durable.update((i, r.seq) for i, r in reader.get_by_ids(project, missing).items())
            return len(durable)

        if not _wait("durable in the log", logged, minutes):
            return 1
        # Every stage caught up to the last session minute's seq holds the whole session (the change minutes the
        # facts pool writes may come after it: the store holds them before they are logged).
        target = max(durable.values()) - before
        connection = redis_from_settings(live)

        def facts_applied() -> int:
            return min(target, int(connection.hget(keys.facts_head(project), "seq") or 0) - before)

        with PVMClient(settings=live, timeout=10, retries=0) as api:

            def indexed() -> int:
                try:
                    seq = int(api.context(project, "coder", budget_tokens=1)["freshness"]["index"]["seq"])
                except PVMAPIError:
                    return 0
                return min(target, seq - before)

            if not _wait("indexed for search (log seqs)", indexed, target):
                return 1
            if with_facts and not _wait("applied to the facts (log seqs)", facts_applied, target):
                return 1
            if with_facts:
                # the facts pool's change minutes: logged, indexed and in the threads too
                _settle(connection, project, summaries="summarize" in live.downstream)
            stages = "durable, indexed and applied to the facts" if with_facts else "durable and indexed"
            print(f"  all {stages} in {time.monotonic() - started:.2f}s\n")
            # `pvm log tail --project <project> -n 8`, printed here: the CLI runs the demo, so the demo does not run it.
            rows = [minute_row(r) for r in reader.get_recent(project, 8)]
            print(log_tail_text(project, reader.count(project), rows))
            task = "fix the login bug: the session cookie expires too early"
            # The task's thread: its newest minutes verbatim, older ones as chunk summaries and episodes.
            thread = "fix-login-bug-thread" if "summarize" in live.downstream else None
            context = api.context_text(project, "coder", task=task, budget_tokens=1200, thread=thread)
        on = f" in the thread {thread!r}" if thread else ""
        print(f"\nThe context the reader assembles for agent 'coder' on the task {task!r}{on}:\n")
        print(context)
        if with_facts:
            print("\nA decision that changed during the session, as the facts store holds it (the current value")
            print("is the newest; the old one stays in history with the time it stopped holding):\n")
            print("\n".join(shown_decision(FactStore(connection), project, session)))
        else:
            print("\n(PVM_DOWNSTREAM leaves out the facts pool: no facts to show.)")
        # -- MEMORY: the project's memory as Markdown files a person can edit (docs/memory-files.md) ----------
        print("\n" + "\n".join(export_memory(connection, project)))
        connection.close()
        print("\n" + "=" * 100)
        print(f"PAIR: agent {PAIR_AGENT}'s output, checked against its task's success criteria by a fresh judge")
        print("=" * 100)
        print(f"task: {PAIR_TASK}")
        print("criteria:\n" + "\n".join(f"  {i}. {c}" for i, c in enumerate(PAIR_CRITERIA, 1)))
        print(f"output:\n  {PAIR_OUTPUT}\n")
        with PVMClient(settings=live, timeout=60, retries=0) as api:
            run = api.pair(project, PAIR_TASK, PAIR_CRITERIA, PAIR_OUTPUT, task_id="fix-login-bug", agent_id=PAIR_AGENT)
        print("\n".join(pair_lines(run)))
    return 0


# -- MEMORY step -------------------------------------------------------------------------------------------------


def export_memory(connection: redis.Redis, project: str, out: str = defaults.MEMORY_EXPORT_DIR) -> list[str]:
    """Export `project`'s memory to `out` (`pvm export`) and return what the demo prints: where, and the tree."""
    from workers.agent.memory_files import export_files, read_snapshot, tree_lines, write_folder

    snapshot = read_snapshot(connection, project)
    files = export_files(snapshot)
    write_folder(out, files, snapshot.last_ms)
    return [
        f"The project's memory as Markdown files in {out}/ ({len(files)} files; edit them, then "
        f"`pvm import --project {project} {out}` writes each change as a minute):",
        "",
        *("  " + line for line in tree_lines(files, per_folder=3)),
    ]

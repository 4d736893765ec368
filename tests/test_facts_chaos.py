"""Chaos for facts: producers state facts (some from the future, some from the past, learned keys changed again and
again) while kill -9 lands on the facts worker, one of two log workers or Valkey at random instants; afterwards the
facts stay true:

1. the facts store equals a replay of the log (`workers.ops.replay.replay_facts`), which refuses none of its changes;
2. every fact's vector point agrees with the store (status, validity, value, sources);
3. no single-valued slot is empty while one of its facts holds now (`FactStore.current`);
4. no decision is written twice: every minute is in its project's log once, each fact asserted once, each
   supersession and confirmation written once, each learned minute once;

and no job failed, nothing was dead-lettered.

Seeded like tests/test_chaos.py: PVM_CHAOS_SEED=<n> replays a run's choices (kill order, instants, delays, what
producers emit; the timing of the processes themselves is not replayable). The seed is printed at the start and
heads every failure. PVM_FACTS_CHAOS_SECONDS changes the length of the chaos phase (default 30). One summary line,
``PVM FACTS CHAOS SUMMARY {...}``, is printed (see it with ``-s``) and written as JSON to
``facts-chaos-summary.json`` in the test's tmp dir.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from contracts import ContractError, Minute, keys
from contracts.fact_changes import FACT_EVENT_TYPES, fact_change
from contracts.facts import READ_FIELDS, Fact, FactStatus, TierKey, check_time
from pvm import defaults
from pvm.config import Settings
from pvm.connection import stream_entries
from pvm.protocols import FACT
from pvm.stores.fact_projection import Outcome, StoredFact
from pvm.stores.facts import FactStore
from pvm.stores.log import LogReader
from pvm.vectors.edge import EdgeEngine
from tests import test_chaos as chaos
from tests.conftest import free_port
from tests.facts_chaos_producer import project_name
from tests.test_chaos import (
    COMPONENT_OF,
    VALKEY,
    Chaos,
    DurableValkey,
    chaos_seed,
    pipeline_state,
    text,
    wait_for_api,
)
from workers.ops.replay import replay_facts
from workers.runtime.stack import Stack

pytestmark = pytest.mark.slow

__all__ = ["chaos_seed"]  # the fixture, imported from tests/test_chaos.py

CHAOS_S = float(os.environ.get("PVM_FACTS_CHAOS_SECONDS") or 30)  # kills land during this
PRODUCERS = 2
PROJECTS = 4
RATE_PER_PRODUCER = 10.0  # minutes/s: ~600 minutes in a 30 s run, each stating at most one fact
KILL_GAP_S = (1.5, 4.0)  # between two kills: a component may die while another is still down
RESTART_DELAY_S = (0.2, 2.0)  # a killed component stays down this long
PRODUCER_EXIT_S = 100.0  # after the chaos phase: producers send their spools and exit
# Long enough for the reaper to requeue a job of a worker killed at the very end (alive key 10 s + reaper 3 s),
# then for the facts it decides to go round through the log once more, on a shared 2-core machine.
DRAIN_S = 150.0
QUIET_POLLS = 2  # the pipeline must look drained this many polls in a row
BALLAST_KEYS = 100_000  # so that a Valkey restart spends a moment loading its AOF (clients get LOADING)
SUMMARY_FILE = "facts-chaos-summary.json"
MAX_SHOWN = 8  # examples per kind of problem in the failure message

FACTS_WORKER, LOG_WORKER = "facts worker", "log worker"
FACTS_COMPONENTS = (FACTS_WORKER, LOG_WORKER, VALKEY)
FACTS_CHILD = "worker-facts"
LOG_CHILDREN = ("worker-log", "worker-log-2")  # two log worker processes, each a child of the stack


class FactsStack(Stack):
    """The stack of `pvm up` (dispatcher, log, facts and summarize workers, scheduler, `pvm serve` owning the
    embedded engine and running the index pool), with a second log worker process beside the first."""

    def start(self) -> Settings:
        settings = super().start()
        self._start_child(LOG_CHILDREN[1], ["worker", "log"])  # restarted by `restart_dead` like any child
        return settings


class FactsChaos(Chaos):
    """test_chaos's chaos (restarts, supervision, notes), killing the facts worker, a log worker and Valkey."""

    def run(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        next_kill = time.monotonic() + self.rng.uniform(*KILL_GAP_S)
        while (now := time.monotonic()) < end:
            self.supervise(now)
            if now >= next_kill:
                self.kill_next(now)
                next_kill = now + self.rng.uniform(*KILL_GAP_S)
            time.sleep(0.05)
        for name in self.restart_at:
            self.restart_at[name] = 0.0  # the chaos is over: everything comes back now
        self.supervise(time.monotonic())

    def kill_next(self, now: float) -> None:
        """Kill the next component of a shuffled round (every component is killed about as often)."""
        if not self._kill_order:
            self._kill_order = self.rng.sample(FACTS_COMPONENTS, len(FACTS_COMPONENTS))
        component = self._kill_order.pop()
        if component == VALKEY:
            if VALKEY in self.restart_at:
                return  # still down from before: its turn is skipped
            self.valkey.kill()
            name = down = VALKEY
        else:
            name = FACTS_CHILD if component == FACTS_WORKER else self.rng.choice(LOG_CHILDREN)
            down = COMPONENT_OF.get(name, name)  # the name `Chaos.supervise` keeps a dead child's restart under
            if down in self.restart_at:
                return
            child = self.stack.children[name]
            child.kill()  # SIGKILL
            child.wait()
        self.kills[component] += 1
        self.restart_at[down] = now + self.rng.uniform(*RESTART_DELAY_S)
        self.note(f"kill -9 {name}")


# -- the producers --------------------------------------------------------------------------------------------------


@dataclass
class Produced:
    minutes: list[dict[str, Any]]  # what each producer emitted: {"project", "id", "kind", "when", ...}
    stats: list[dict[str, Any]]
    problems: list[str]

    @property
    def by_project(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {project_name(i): [] for i in range(PROJECTS)}
        for m in self.minutes:
            out.setdefault(m["project"], []).append(m["id"])
        return out


def start_producers(settings: Settings, seed: int, tmp_path: Path, seconds: float) -> list[tuple[Path, Any]]:
    return chaos.start_producers(
        settings, seed, tmp_path, seconds, "tests.facts_chaos_producer", PRODUCERS, PROJECTS, RATE_PER_PRODUCER
    )


def collect_producers(producers: list[tuple[Path, Any]], timeout: float) -> Produced:
    minutes: list[dict[str, Any]] = []
    stats, problems = chaos.read_producers(producers, timeout, lambda line: minutes.append(json.loads(line)))
    return Produced(minutes, stats, problems)


# -- the drain ------------------------------------------------------------------------------------------------------


def heads(r: redis.Redis, log: LogReader, projects: Iterable[str]) -> dict[str, dict[str, int]]:
    return {
        p: {
            "log": log.count(p),
            "facts head": int(r.hget(keys.facts_head(p), "seq") or 0),
            "index head": int(r.hget(keys.index_head(p), "seq") or 0),
        }
        for p in projects
    }


def stream_lag(r: redis.Redis, settings: Settings) -> dict[int, list[str]]:
    """Per shard, the groups that have not been delivered the stream's newest entry (change minutes not read yet)."""
    out: dict[int, list[str]] = {}
    for shard in range(settings.shards):
        stream = keys.stream(shard)
        try:
            last = r.xinfo_stream(stream)["last-generated-id"]
        except redis.ResponseError:
            continue  # no such stream yet: nothing written to it
        behind = [text(g["name"]) or "" for g in r.xinfo_groups(stream) if g["last-delivered-id"] != last]
        if behind:
            out[shard] = behind
    return out


def still_moving(r: redis.Redis, settings: Settings, produced: Produced) -> dict[str, Any] | None:
    """None when every emitted minute is logged, every project's facts and index heads stand at its log's last seq,
    and nothing is queued, running, pending or unread on a stream; else what is still moving."""
    log = LogReader(settings.log_dir)
    expected = produced.by_project
    projects = sorted(set(expected) | set(log.projects()))
    at = heads(r, log, projects)
    behind = {p: h for p, h in at.items() if not h["log"] == h["facts head"] == h["index head"]}
    state = pipeline_state(r, settings)
    busy = {
        pool: {k: state[pool][k] for k in ("queued", "intermediate", "started")}
        for pool in keys.QUEUES
        if state[pool]["queued"] or state[pool]["intermediate"] or state[pool]["started"]
    }
    pending = {s: n for s, n in state["pending"].items() if n}
    lag = stream_lag(r, settings)
    if behind or busy or pending or lag:
        return {"heads behind": behind, "busy": busy, "pending": pending, "unread": lag}
    logged = {p: {rec.id for rec in log.history(p)} for p in expected}
    unlogged = {p: len([i for i in ids if i not in logged[p]]) for p, ids in expected.items()}
    if any(unlogged.values()):
        return {"not in the log yet": unlogged}
    return None


# -- the checks -----------------------------------------------------------------------------------------------------


def slot_name(fact: Fact) -> str:
    return f"{fact.tier_key} slot ({fact.slot.subject!r}, {fact.slot.attribute!r})"


def knowledge(fact: Fact) -> dict[str, Any]:
    """What a fact records, read statistics left out (a replayed fact has them at zero)."""
    return {k: v for k, v in fact.to_dict().items() if k not in READ_FIELDS}


def stored_facts(r: redis.Redis, project: str) -> dict[str, StoredFact]:
    """Every record of a project's facts (task and project tiers: one hash), by id."""
    raw = cast(dict[bytes, bytes], r.hgetall(keys.facts_by_id(TierKey.for_project(project))))
    return {fid.decode(): StoredFact.unpack(record) for fid, record in raw.items()}


def instant_or_none(timestamp: str | None) -> datetime | None:
    return None if timestamp is None else check_time(timestamp, "time")


@dataclass
class Report:
    """Problems by check, each a line naming the project, the slot and the fact; the seed heads the failure."""

    seed: int
    lines: dict[str, list[str]]

    def add(self, check: str, line: str) -> None:
        self.lines.setdefault(check, []).append(line)

    def counts(self) -> dict[str, int]:
        return {check: len(lines) for check, lines in self.lines.items()}

    def message(self, shown: int | None = MAX_SHOWN) -> str:
        """The problems, `shown` of each check (None: all)."""
        total = sum(self.counts().values())
        out = [f"PVM_CHAOS_SEED={self.seed} (set it to replay this run's choices): {total} problems"]
        for check, lines in self.lines.items():
            out.append(f"[{check}] {len(lines)}:")
            out += [f"  {line}" for line in lines[:shown]]
            if shown is not None and len(lines) > shown:
                out.append(f"  ... and {len(lines) - shown} more (all of them in {SUMMARY_FILE})")
        return "\n".join(out)


# What the store keeps as knowledge (`contracts.keys`, facts block), by the word after ``:facts:`` in a key's name:
# records, tier, slot and type indexes, learned keys, procedural rules, parked changes, cleared tasks. The rest is
# bookkeeping of the pool (heads, leases, decisions in flight, read statistics), which a replay need not rebuild.
KNOWLEDGE_KEYS = frozenset({"byid", "all", "slot", "type", "learned", "rules", "parked", "cleared"})


def key_kind(name: str) -> str:
    """``pvm:{p:x}:facts:slot:<digest>:project`` -> ``slot``."""
    return name.partition(":facts:")[2].split(":", 1)[0]


def knowledge_state(r: redis.Redis, project: str) -> dict[str, Any]:
    """Every knowledge key of a project's facts and what it holds, read statistics left out: for equality.

    (As tests/pvm/test_facts_store.py's `state`, with the records' order keys kept beside each fact.)
    """
    out: dict[str, Any] = {}
    for raw_name in r.scan_iter(match=f"{keys.PREFIX}:{{p:{project}}}:facts:*", count=1000):
        name = raw_name.decode()
        if key_kind(name) not in KNOWLEDGE_KEYS:
            continue
        kind = text(r.type(name))
        if kind == "hash" and name.endswith(":byid"):
            records = cast(dict[bytes, bytes], r.hgetall(name))
            out[name] = {
                fid.decode(): (knowledge(s.fact), dict(s.versions), s.created, s.promoted_at)
                for fid, s in ((fid, StoredFact.unpack(record)) for fid, record in records.items())
            }
        elif kind == "hash":
            out[name] = r.hgetall(name)
        elif kind == "zset":
            out[name] = r.zrange(name, 0, -1, withscores=True)
        elif kind == "set":
            out[name] = sorted(r.smembers(name))
        else:
            out[name] = r.get(name)
    return out


def bookkeeping(r: redis.Redis, projects: Iterable[str]) -> dict[str, int]:
    """How many keys of each bookkeeping kind (not heads) the pool left behind, for the summary."""
    left: Counter[str] = Counter()
    for project in projects:
        for raw in r.scan_iter(match=f"{keys.PREFIX}:{{p:{project}}}:facts:*", count=1000):
            kind = key_kind(raw.decode())
            if kind not in KNOWLEDGE_KEYS and kind not in ("head", "done"):
                left[kind] += 1
    return dict(left)


def check_replay(
    r: redis.Redis,
    settings: Settings,
    projects: list[str],
    live: Mapping[str, Mapping[str, StoredFact]],
    report: Report,
) -> dict[str, int]:
    """Check 1: the facts store equals a replay of the log, fact by fact, then key by key."""
    live_state = {p: knowledge_state(r, p) for p in projects}
    replayed_changes = 0
    for project in projects:
        done = replay_facts(r, settings, project)
        replayed_changes += done.changes
        again = stored_facts(r, project)
        before = live[project]
        for fid in sorted(set(before) | set(again)):
            if fid not in again:
                f = before[fid].fact
                report.add(
                    "1 replay",
                    f"project {project}, {slot_name(f)}, fact {fid} ({f.value!r}): in the live "
                    f"store ({f.status.value}), not in the replay",
                )
                continue
            if fid not in before:
                f = again[fid].fact
                report.add(
                    "1 replay",
                    f"project {project}, {slot_name(f)}, fact {fid} ({f.value!r}): in the replay "
                    f"({f.status.value}), not in the live store",
                )
                continue
            a, b = knowledge(before[fid].fact), knowledge(again[fid].fact)
            if a != b:
                diff = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
                report.add(
                    "1 replay",
                    f"project {project}, {slot_name(before[fid].fact)}, fact {fid}: live != replayed: {diff}",
                )
        # The rest of the store (order keys, slot and tier indexes, learned keys, parked changes) the same way.
        after_state = knowledge_state(r, project)
        for name in sorted(set(live_state[project]) | set(after_state)):
            was, now = live_state[project].get(name), after_state.get(name)
            if was == now:
                continue
            if name.endswith(":byid") and isinstance(was, dict) and isinstance(now, dict):
                for fid in sorted(set(was) & set(now)):
                    if was[fid][0] == now[fid][0] and was[fid] != now[fid]:
                        report.add(
                            "1 replay",
                            f"project {project}, fact {fid}: its record's order keys differ "
                            f"(live {was[fid][1:]}, replayed {now[fid][1:]})",
                        )
                continue  # the facts themselves are compared above
            report.add(
                "1 replay", f"project {project}: store key {name} differs: live {short(was)}, replayed {short(now)}"
            )
        if done.refused:
            refused_changes(r, settings, project, done.refused, report)
    return {"replayed_changes": replayed_changes}


def refused_changes(r: redis.Redis, settings: Settings, project: str, refused: int, report: Report) -> None:
    """Name the change minutes replay refused: decisions the pool wrote that do not fit the facts they name.

    `replay_facts` only counts them: replay once more the same way (reset, then the log's changes in log order,
    `REPLAY_BATCH` at a time), noting each refused one with its fact as the replayed store ends up holding it.
    """
    store = FactStore(r)
    store.reset_project(project)
    found: list[tuple[int, Minute, Any]] = []
    batch: list[tuple[int, Minute, Any]] = []

    def flush() -> None:
        outcomes = store.apply_changes([(m, c) for _, m, c in batch])
        found.extend(item for item, outcome in zip(batch, outcomes, strict=True) if outcome is Outcome.REFUSED)
        batch.clear()

    for rec in LogReader(settings.log_dir).history(project):
        if rec.fields.get("event_type") not in FACT_EVENT_TYPES:
            continue
        minute = rec.minute
        try:
            batch.append((rec.seq, minute, fact_change(minute)))
        except ContractError as exc:
            report.add(
                "1 replay: refused changes",
                f"project {project}: change minute {minute.id} (seq {rec.seq}) does not parse: {exc}",
            )
            found.append((rec.seq, minute, None))
        if len(batch) >= defaults.REPLAY_BATCH:
            flush()
    flush()
    for seq, minute, change in found:
        if change is None:
            continue
        fid = str(getattr(change, "fact_id", None) or getattr(getattr(change, "fact", None), "id", None))
        held = store.get(change.tier_key, fid)
        where = f"project {project}, {slot_name(held) if held else change.tier_key}, fact {fid}"
        data = {k: v for k, v in minute.data.items() if k not in ("fact", "tier_key", "fact_id")}
        state = f"{held.value!r} {held.status.value}, valid {held.valid_from} .. {held.valid_until}" if held else "none"
        report.add(
            "1 replay: refused changes",
            f"{where}: {minute.event_type} {minute.id} (seq {seq}, at {minute.timestamp}) {data} does not fit the "
            f"fact (replayed: {state}): the facts pool wrote a decision that replay, like the pool, refuses",
        )
    if len(found) != refused:
        report.add(
            "1 replay",
            f"project {project}: replay refused {refused} change minutes, the same replay again {len(found)}",
        )


def short(value: Any, limit: int = 300) -> str:
    shown = repr(value)
    return shown if len(shown) <= limit else shown[:limit] + "..."


def check_points(
    settings: Settings, projects: list[str], live: Mapping[str, Mapping[str, StoredFact]], report: Report
) -> int:
    """Check 2: every stored fact has a fact point that agrees with it; no fact point of a fact the store lacks."""
    checked = 0
    engine = EdgeEngine(settings.vector_dir)
    try:
        for project in projects:
            facts = live[project]
            try:
                points = {p.key: p for p in engine.get_points(project, sorted(facts))}
                tiers = sorted({str(s.fact.tier_key) for s in facts.values()})
                every = engine.get_points(project, [], tier_keys=tiers) if tiers else []
            except Exception as exc:  # a shard the engine cannot open: say which, and check the others
                report.add("2 points", f"project {project}: the fact points cannot be read: {exc!r}")
                continue
            for point in every:
                if point.payload.get("kind") == FACT and point.key not in facts:
                    fact = point.payload.get("fact") or {}
                    report.add(
                        "2 points",
                        f"project {project}, {fact.get('tier_key')} slot "
                        f"({fact.get('subject')!r}, {fact.get('attribute')!r}), fact {point.key}: a fact point "
                        "of a fact the store does not hold",
                    )
            for fid, stored in sorted(facts.items()):
                fact = stored.fact
                where = f"project {project}, {slot_name(fact)}, fact {fid} ({fact.value!r})"
                found = points.get(fid)
                if found is None:
                    report.add("2 points", f"{where}: no point")
                    continue
                point = found
                if point.payload.get("kind") != FACT or "fact" not in point.payload:
                    report.add(
                        "2 points",
                        f"{where}: its point is {point.payload.get('kind')!r}, not a fact point "
                        f"(store: {fact.status.value})",
                    )
                    continue
                checked += 1
                try:
                    indexed = Fact.from_dict(point.payload["fact"])
                except (TypeError, ValueError) as exc:  # InvalidFact is a ValueError
                    report.add("2 points", f"{where}: its point's fact does not read back: {exc}")
                    continue
                wrong: dict[str, tuple[Any, Any]] = {}
                if indexed.status is not fact.status:
                    wrong["status"] = (fact.status.value, indexed.status.value)
                if instant_or_none(indexed.valid_from) != instant_or_none(fact.valid_from):
                    wrong["valid_from"] = (fact.valid_from, indexed.valid_from)
                if instant_or_none(indexed.valid_until) != instant_or_none(fact.valid_until):
                    wrong["valid_until"] = (fact.valid_until, indexed.valid_until)
                if indexed.value != fact.value:
                    wrong["value"] = (fact.value, indexed.value)
                if set(indexed.source_minute_ids) != set(fact.source_minute_ids):
                    only_store = sorted(set(fact.source_minute_ids) - set(indexed.source_minute_ids))
                    only_point = sorted(set(indexed.source_minute_ids) - set(fact.source_minute_ids))
                    wrong["source_minute_ids"] = (
                        f"only in the store: {only_store}",
                        f"only in the point: {only_point}",
                    )
                if wrong:
                    report.add("2 points", f"{where}: store != point: {wrong}")
    finally:
        engine.close()
    return checked


def check_current(
    r: redis.Redis, projects: list[str], live: Mapping[str, Mapping[str, StoredFact]], report: Report
) -> int:
    """Check 3: a single-valued slot with a fact that holds now (promoted, or superseded later) has a current fact."""
    store = FactStore(r)
    now = datetime.now(UTC)
    slots_checked = 0
    for project in projects:
        by_slot: dict[tuple[TierKey, Any], list[StoredFact]] = {}
        for stored in live[project].values():
            by_slot.setdefault((stored.fact.tier_key, stored.fact.slot), []).append(stored)
        current_by_tier: dict[TierKey, list[Fact]] = {}
        for (tier, slot), history in sorted(by_slot.items(), key=lambda kv: str(kv[0])):
            if not all(s.fact.single_valued for s in history):
                continue
            holding = [
                s
                for s in history
                if s.fact.status in (FactStatus.PROMOTED, FactStatus.SUPERSEDED) and s.fact.holds_at(now)
            ]
            if not holding:
                continue
            slots_checked += 1
            if tier not in current_by_tier:
                current_by_tier[tier] = store.current([tier], as_of=now)
            if any(f.slot == slot for f in current_by_tier[tier]):
                continue
            for s in holding:
                f = s.fact
                report.add(
                    "3 current",
                    f"project {project}, {slot_name(f)}, fact {f.id} ({f.value!r}, {f.status.value}, valid "
                    f"{f.valid_from} .. {f.valid_until}, recorded {f.recorded_at}, promoted_at {s.promoted_at}): "
                    f"holds now, yet the slot has no current fact (history: {len(history)} facts, "
                    f"newest valid_from {max(h.fact.valid_from for h in history)})",
                )
    return slots_checked


def check_log(settings: Settings, produced: Produced, report: Report) -> dict[str, Any]:
    """Check 4: every minute once in its log, each emitted one there, and no knowledge change decided twice."""
    log = LogReader(settings.log_dir)
    expected = produced.by_project
    counts: Counter[str] = Counter()
    for project in sorted(set(expected) | set(log.projects())):
        records = list(log.history(project))
        if [rec.seq for rec in records] != list(range(1, len(records) + 1)):
            report.add("4 log", f"project {project}: the log's sequence numbers are not 1..{len(records)}")
        ids = Counter(rec.id for rec in records)
        for mid, n in sorted(ids.items()):
            if n > 1:
                report.add("4 log", f"project {project}: minute {mid} is in the log {n} times")
        missing = [i for i in expected.get(project, []) if i not in ids]
        if missing:
            report.add(
                "4 log", f"project {project}: {len(missing)} emitted minutes never reached the log: {missing[:5]}"
            )
        asserted: dict[str, list[str]] = {}
        superseded: dict[tuple[str, str, str], list[str]] = {}
        confirmed: dict[tuple[str, str], list[str]] = {}
        promoted: dict[str, list[str]] = {}
        contradicted: dict[tuple[str, str], list[str]] = {}
        learned: dict[tuple[str, ...], list[str]] = {}
        learned_ids: set[str] = set()
        slots: dict[str, str] = {}  # fact id -> its slot, for the messages
        for rec in records:
            fields = rec.fields
            kind = fields.get("event_type")
            if kind not in FACT_EVENT_TYPES:
                continue
            counts[kind] += 1
            data = fields.get("data") or {}
            written = f"{rec.id} (seq {rec.seq}, at {fields.get('timestamp')})"  # how a message names a change minute
            if "fact" in data:
                fact = data["fact"]
                slots[fact["id"]] = f"{fact['tier_key']} slot ({fact['subject']!r}, {fact['attribute']!r})"
            if kind == "fact_asserted":
                asserted.setdefault(data["fact"]["id"], []).append(written)
            elif kind == "fact_superseded":
                superseded.setdefault((data["fact_id"], data["superseded_by"], data["valid_until"]), []).append(written)
            elif kind == "fact_confirmed":
                for source in data["source_minute_ids"]:
                    confirmed.setdefault((data["fact_id"], source), []).append(written)
            elif kind == "fact_promoted":
                promoted.setdefault(data["fact_id"], []).append(written)
            elif kind == "fact_contradicted":
                contradicted.setdefault((data["fact_id"], data["contradicted_by"]), []).append(written)
            elif kind == "fact_learned":
                learned.setdefault(tuple(data["fact"]["source_minute_ids"]), []).append(written)
                learned_ids.add(data["fact"]["id"])

        decided_twice(report, project, slots, "fact_asserted of", asserted, lambda k: k)
        # A learned key's fact id names its value, not its period (`learned_minute`): a value learned again is the
        # same fact, so it may be superseded by the same other value once per time it held, each time closed at
        # another instant. Any other fact has one validity window, so one supersession by a given fact.
        by_pair: dict[tuple[str, ...], list[str]] = {}
        for (fid, by, until), minutes in superseded.items():
            key = (fid, by, until) if fid in learned_ids else (fid, by)
            by_pair.setdefault(key, []).extend(minutes)
        decided_twice(report, project, slots, "fact_superseded (fact, by[, valid_until])", by_pair, lambda k: k[0])
        decided_twice(report, project, slots, "fact_confirmed (fact, source minute)", confirmed, lambda k: k[0])
        decided_twice(report, project, slots, "fact_promoted of", promoted, lambda k: k)
        decided_twice(report, project, slots, "fact_contradicted (fact, by)", contradicted, lambda k: k[0])
        for sources, minutes in sorted(learned.items()):
            if len(minutes) > 1:
                report.add(
                    "4 decided twice",
                    f"project {project}: fact_learned of learned minute {sources} written "
                    f"{len(minutes)} times: {minutes}",
                )
    return dict(sorted(counts.items()))


def decided_twice(
    report: Report,
    project: str,
    slots: Mapping[str, str],
    what: str,
    decided: Mapping[Any, list[str]],
    fact_of: Callable[[Any], str],
) -> None:
    """Report each decision (`decided`: its key -> the change minutes that wrote it) written more than once."""
    for key, minutes in sorted(decided.items()):
        if len(minutes) > 1:
            fid = fact_of(key)
            report.add(
                "4 decided twice",
                f"project {project}, {slots.get(fid, 'slot unknown')}, fact {fid}: {what} {key} written "
                f"{len(minutes)} times, as minutes {minutes}",
            )


def check_pipeline(r: redis.Redis, settings: Settings, report: Report) -> None:
    """No failed job in any pool; nothing dead-lettered (no poison was sent: every entry was a valid minute)."""
    state = pipeline_state(r, settings)
    for pool in keys.QUEUES:
        if state[pool]["failed"]:
            report.add(
                "failed jobs",
                f"pool {pool}: {len(state[pool]['failed'])} failed jobs: {short(state[pool]['failed'], 600)}",
            )
    for shard in range(settings.shards):
        dead = stream_entries(r.xrange(keys.dead_letter_stream(shard)))
        for _, fields in dead:
            reason = fields.get(b"reason", b"").decode(errors="replace")
            entry = fields.get(b"entry_id", b"?").decode(errors="replace")
            report.add("dead letters", f"shard {shard}: entry {entry} dead-lettered: {reason[:300]}")


def drop_ballast(r: redis.Redis, n: int) -> None:
    """Delete the keys `DurableValkey.add_ballast` wrote (chaos:ballast:<i>), so that scans see PVM's keys only."""
    for start in range(0, n, 10_000):
        r.unlink(*(f"chaos:ballast:{i}" for i in range(start, min(n, start + 10_000))))


# -- the test -------------------------------------------------------------------------------------------------------


def test_facts_stay_true_under_kill_9_reordering_and_odd_clocks(
    tmp_path: Path, chaos_seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = chaos_seed
    # Children inherit the environment: the embedded engine, lexical only, the rule extractor, the default fan-out.
    for name in (
        "PVM_QDRANT_URL",
        "PVM_EMBED_MODEL",
        "OPENAI_BASE_URL",
        "PVM_API_TOKEN",
        "PVM_API_TOKENS_FILE",
        "PVM_LLM_MODEL",
        "PVM_DOWNSTREAM",
        "PVM_FACT_PROMOTE_AT",
        "PVM_EVALUATE_EVERY",
    ):
        monkeypatch.delenv(name, raising=False)
    rng = random.Random(seed)
    t0 = time.monotonic()
    valkey = DurableValkey(tmp_path / "valkey", free_port())
    valkey.start()
    valkey.add_ballast(BALLAST_KEYS)
    settings = Settings(
        redis_url=valkey.url,
        shards=4,
        home=tmp_path,
        log_dir=tmp_path / "log",
        spool_dir=tmp_path / "spool",
        # Summaries are not under test: the log feeds the index and the facts only (the summarize worker idles),
        # which leaves a 2-core machine's CPU to the pools that are.
        downstream=("index", "facts"),
    )
    api_port = free_port()
    stack = FactsStack(settings, api_port=api_port)  # with the embedded engine, `pvm serve` is the index owner
    producers: list[tuple[Path, Any]] = []
    report = Report(seed, {})
    summary: dict[str, Any] = {"seed": seed, "chaos_s": CHAOS_S}
    chaos: FactsChaos | None = None
    line = ""
    try:
        stack.start()
        wait_for_api(f"http://127.0.0.1:{api_port}", timeout=60)
        summary["setup_s"] = round(time.monotonic() - t0, 1)
        chaos = FactsChaos(rng, stack, valkey, f"http://127.0.0.1:{api_port}")
        producers = start_producers(settings, seed, tmp_path, CHAOS_S)
        chaos.run(CHAOS_S)
        chaos.settle(timeout=60)
        chaos_end = time.monotonic()
        produced = collect_producers(producers, PRODUCER_EXIT_S)
        summary["producers_done_s"] = round(time.monotonic() - t0, 1)
        for problem in produced.problems:
            report.add("producers", problem)
        # Drain: the supervisor keeps running (as under `pvm up`) until the pipeline is quiet a few polls in a row.
        r = redis.Redis.from_url(valkey.url)
        deadline = time.monotonic() + DRAIN_S
        quiet = 0
        next_note = time.monotonic() + 10
        moving: dict[str, Any] | None = {}
        while time.monotonic() < deadline:
            chaos.supervise(time.monotonic())
            moving = still_moving(r, settings, produced)
            quiet = 0 if moving else quiet + 1
            if quiet >= QUIET_POLLS:
                break
            if moving and time.monotonic() >= next_note:
                print(f"draining t+{time.monotonic() - chaos_end:.0f}s: {short(moving, 600)}", flush=True)
                next_note = time.monotonic() + 10
            time.sleep(0.5)
        drain_s = time.monotonic() - chaos_end
        if quiet < QUIET_POLLS:
            report.add("drain", f"not drained {DRAIN_S:.0f} s after the chaos: {short(moving, 2000)}")
        summary["drain_s"] = round(drain_s, 1)
        stack.stop(timeout=30)  # nothing moves while the stores are read; the index owner flushes its engine
        checks_from = time.monotonic()
        drop_ballast(r, BALLAST_KEYS)  # the checks scan the keyspace

        projects = sorted(produced.by_project)
        live = {p: stored_facts(r, p) for p in projects}
        summary["bookkeeping_left"] = bookkeeping(r, projects)
        counters = cast(dict[bytes, bytes], r.hgetall(keys.metrics_fact_changes()))
        summary["pool_counts"] = {k.decode(): int(v) for k, v in counters.items()}
        check_pipeline(r, settings, report)
        changes = check_log(settings, produced, report)
        points = check_points(settings, projects, live, report)
        slots = check_current(r, projects, live, report)
        replayed = check_replay(r, settings, projects, live, report)  # last: replay rewrites the store
        r.close()

        missing_kills = [c for c in FACTS_COMPONENTS if not chaos.kills[c]]
        if missing_kills:
            report.add("chaos", f"never killed: {missing_kills} (PVM_FACTS_CHAOS_SECONDS too short?)")
        if chaos.unexpected_exits:
            report.add("chaos", f"components exited without being killed: {dict(chaos.unexpected_exits)}")
        summary.update(
            {
                "minutes_emitted": len(produced.minutes),
                "emitted": dict(Counter(f"{m['kind']}:{m['when']}" for m in produced.minutes)),
                "kills": dict(chaos.kills),
                "unexpected_exits": dict(chaos.unexpected_exits),
                "facts": sum(len(f) for f in live.values()),
                "facts_by_status": dict(Counter(s.fact.status.value for f in live.values() for s in f.values())),
                "points_checked": points,
                "slots_holding_now": slots,
                "changes_in_log": changes,
                **replayed,
                "problems": report.counts(),
                "checks_s": round(time.monotonic() - checks_from, 1),
                "total_s": round(time.monotonic() - t0, 1),
                "emitter": {k: sum(s[k] for s in produced.stats) for k in ("emitted", "sent", "spooled", "dropped")},
            }
        )
    except BaseException as exc:
        exc.add_note(f"PVM_CHAOS_SEED={seed} (set it to replay this run's choices)")
        raise
    finally:
        for _, process in producers:
            if process.poll() is None:
                process.kill()
                process.wait()
        stack.stop(timeout=10)
        valkey.stop()
        if chaos is not None:
            summary["events"] = chaos.events
        line = json.dumps({k: v for k, v in summary.items() if k != "events"})
        (tmp_path / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n" + report.message(None) + "\n")
        print(f"PVM FACTS CHAOS SUMMARY {line}\n(with the events: {tmp_path / SUMMARY_FILE})", flush=True)
    assert not report.lines, "\n".join(
        [report.message(), f"summary: {line}", "events: " + ", ".join(summary.get("events", []))]
    )

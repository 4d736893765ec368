from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from contracts import Minute, encode_minute, keys
from pvm.config import ConfigError, Settings
from pvm.stores.log import LogWriter
from tests.conftest import free_port
from tests.memory_helpers import log_minutes
from tests.openai_server import status
from workers.api.auth import TokenFile, load_tokens, token_sha256
from workers.ops.cli import main
from workers.ops.demo import sample_session


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "workers.ops.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_help_lists_every_command() -> None:
    out = run_cli(["--help"], {})
    assert out.returncode == 0
    for command in ("up", "dispatch", "worker", "log", "demo"):
        assert command in out.stdout


def test_log_tail_prints_a_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("PVM_HOME", str(tmp_path))
    writer = LogWriter(tmp_path / "var" / "log")
    minutes = [
        Minute(project_id="apollo", event_type="decision", agent_id="planner", memory_note=f"n{i}") for i in range(5)
    ]
    writer.append("apollo", [(m.id, f"{i}-0", encode_minute(m)) for i, m in enumerate(minutes)])
    assert main(["log", "tail", "--project", "apollo", "-n", "2"]) == 0
    table = capsys.readouterr().out
    assert "5 minutes in the log" in table and "n4" in table and "n2" not in table
    assert main(["log", "tail", "--project", "apollo", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["count"] == 5 and [m["memory_note"] for m in body["minutes"]] == ["n0", "n1", "n2", "n3", "n4"]


def test_unknown_project_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("PVM_HOME", str(tmp_path))
    assert main(["log", "tail", "--project", "nope"]) == 2
    assert "no log for project 'nope'" in capsys.readouterr().err


def test_unknown_pool_and_bad_counts_are_refused() -> None:
    out = run_cli(["worker", "nosuchpool"], {"PVM_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert out.returncode == 2 and "unknown pool 'nosuchpool'" in out.stderr
    out = run_cli(["worker", "log", "--processes", "0"], {})
    assert out.returncode == 2 and "at least 1" in out.stderr
    out = run_cli(["up", "--processes", "bogus=2"], {})
    assert out.returncode != 0 and "unknown pool 'bogus'" in out.stderr


def test_missing_redis_url_is_explained() -> None:
    out = run_cli(["dispatch"], {"PVM_REDIS_URL": ""})
    assert out.returncode == 2 and "PVM_REDIS_URL" in out.stderr


def test_settings_refuse_bad_values() -> None:
    with pytest.raises(ConfigError, match="PVM_SHARDS"):
        Settings.from_env({"PVM_SHARDS": "zero"})
    with pytest.raises(ConfigError, match="PVM_SHARDS"):
        Settings.from_env({"PVM_SHARDS": "0"})
    with pytest.raises(ConfigError, match="PVM_DOWNSTREAM"):
        Settings.from_env({"PVM_DOWNSTREAM": "nosuchpool"})
    s = Settings.from_env({"PVM_HOME": "/srv/pvm", "PVM_SHARDS": "8"})
    assert s.shards == 8 and str(s.log_dir) == "/srv/pvm/var/log"
    assert Settings.from_env(s.to_env()) == s
    scoped = Settings.from_env({"PVM_API_TOKENS_FILE": "/etc/pvm/tokens.json"})
    assert scoped.api_tokens_file == Path("/etc/pvm/tokens.json") and s.api_tokens_file is None
    assert Settings.from_env(scoped.to_env()) == scoped
    with pytest.raises(ConfigError, match="PVM_SEARCH_WEIGHTS"):
        Settings.from_env({"PVM_SEARCH_WEIGHTS": "1,2,3"})


def test_ranking_weights_follow_the_mode_unless_set() -> None:
    from pvm import defaults
    from pvm.engines import ranking_weights

    lexical = Settings.from_env({})
    dense = Settings.from_env({"PVM_EMBED_MODEL": "text-embedding-3-small"})
    chosen = Settings.from_env({"PVM_EMBED_MODEL": "m", "PVM_SEARCH_WEIGHTS": "0.5,0.2,0.2,0.1"})
    assert lexical.search_weights is None and ranking_weights(lexical) == defaults.SEARCH_WEIGHTS
    assert ranking_weights(dense) == defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS == (0.6, 0.1, 0.2, 0.1)
    assert ranking_weights(chosen) == (0.5, 0.2, 0.2, 0.1)
    for s in (lexical, dense, chosen):
        assert Settings.from_env(s.to_env()) == s


@dataclass
class Served:
    """A running `pvm serve`: its URL, and everything it printed once it has stopped."""

    url: str
    output: str = ""


@contextmanager
def serving(
    settings: Settings, addr: str, token: str | None, extra_env: dict[str, str] | None = None
) -> Iterator[Served]:
    """A real `pvm serve` on a free port, yielded once /healthz answers; stopped (SIGTERM) on exit."""
    import os

    port = free_port()
    env = {**os.environ, **settings.to_env(), "PVM_API_TOKEN": token or "", **(extra_env or {})}
    server = subprocess.Popen(
        [sys.executable, "-m", "workers.ops.cli", "serve", "--addr", addr, "--port", str(port), "--index-worker", "no"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    served = Served(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.communicate()[0]
            try:
                with urllib.request.urlopen(f"{served.url}/healthz", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "pvm serve did not answer /healthz within 60 s"
                time.sleep(0.1)
        yield served
    finally:
        if server.poll() is None:
            server.terminate()
        served.output = server.communicate(timeout=30)[0]


@pytest.fixture
def apollo_logged(redis_client: redis.Redis, settings: Settings) -> Settings:
    log_minutes(redis_client, settings, list(sample_session("apollo", 30, seed=3)), index=False)
    return settings


def test_context_against_a_token_protected_api(apollo_logged: Settings) -> None:
    token = "cli-test-token-3f9a"
    context = ["context", "--project", "apollo", "--agent", "coder"]
    with serving(apollo_logged, "127.0.0.1", token) as served:
        url = served.url
        out = run_cli(context, {"PVM_API_URL": url, "PVM_API_TOKEN": token})
        assert out.returncode == 0, out.stderr
        assert "# Context for coder" in out.stdout
        out = run_cli([*context, "--json"], {"PVM_API_URL": url, "PVM_API_TOKEN": token})
        assert out.returncode == 0 and json.loads(out.stdout)["project_id"] == "apollo"

        wrong = run_cli(context, {"PVM_API_URL": url, "PVM_API_TOKEN": "not-it"})
        assert wrong.returncode != 0 and "Traceback" not in wrong.stderr
        assert "the reader API refused the token: set PVM_API_TOKEN to the server's token" in wrong.stderr
        assert token not in wrong.stderr + wrong.stdout

        missing = run_cli(["search", "cache", "--project", "apollo"], {"PVM_API_URL": url, "PVM_API_TOKEN": ""})
        assert missing.returncode != 0 and "Traceback" not in missing.stderr
        assert "the reader API requires a token: set PVM_API_TOKEN" in missing.stderr
    assert "reader API on" in served.output
    assert token not in served.output and "unauthenticated" not in served.output


def test_an_open_api_beyond_loopback_warns_once_and_works_as_before(apollo_logged: Settings) -> None:
    with serving(apollo_logged, "0.0.0.0", None) as served:
        env = {"PVM_API_URL": served.url, "PVM_API_TOKEN": ""}
        out = run_cli(["context", "--project", "apollo", "--agent", "coder"], env)
        assert out.returncode == 0 and "# Context for coder" in out.stdout
    assert served.output.count("unauthenticated") == 1 and "set PVM_API_TOKEN" in served.output


def test_search_with_kinds_lists_every_kind_with_its_sources(
    apollo_logged: Settings, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contracts import encode_minute
    from pvm import engines
    from pvm.stores.log import LogReader
    from tests.memory_helpers import run_index_worker, use_settings
    from workers.runtime.queues import pool_queue

    use_settings(apollo_logged, monkeypatch)
    records = [
        [r.minute.id, r.seq, encode_minute(r.minute)] for r in LogReader(apollo_logged.log_dir).history("apollo")
    ]
    pool_queue("index", redis_client).enqueue(keys.INDEX_JOB, records)
    run_index_worker(redis_client)
    engines.close_shared()  # the engine's files go to the server
    with serving(apollo_logged, "127.0.0.1", None) as served:
        env = {"PVM_API_URL": served.url, "PVM_API_TOKEN": ""}
        out = run_cli(["search", "conflict resolved", "--project", "apollo", "--kinds", "minute,summary"], env)
        assert out.returncode == 0, out.stderr
        header = out.stdout.splitlines()[0].split()
        assert header == ["SCORE", "KIND", "ID", "TEXT", "SOURCES"] and " minute " in out.stdout
        answer = run_cli(["search", "conflict", "--project", "apollo", "--kinds", "summary,minute", "--json"], env)
        assert answer.returncode == 0 and {h["kind"] for h in json.loads(answer.stdout)["ranked"]} == {"minute"}


def test_status_shows_the_schedules_and_the_scheduler_leader(
    redis_client: redis.Redis, settings: Settings, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    from contracts import keys

    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "SCHEDULES (leader: none)\n  none recorded yet" in out

    # What a leading `pvm scheduler` keeps: one schedule that ran (long ago: overdue), one that never ran.
    redis_client.hset(
        keys.schedules(),
        mapping={"optimize:every": "3600.0", "optimize:last": "1000.0", "optimize:job": "j1", "compact:every": "60"},
    )
    redis_client.set(keys.scheduler_leader(), "sched-a", px=60_000)
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    section = out.split("SCHEDULES (leader: sched-a)\n", 1)[1].splitlines()
    assert section[0].split() == ["SCHEDULE", "EVERY", "LAST", "RUN", "NEXT", "DUE"]
    assert section[1].split() == ["compact", "60.0s", "never", "now"]
    name, every, *rest = section[2].split()
    assert (name, every) == ("optimize", "60.0m") and rest[1] == "ago" and rest[2] == "overdue"

    assert main(["status", "--json"]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["scheduler_leader"] == "sched-a"
    compact, optimize = snap["schedules"]
    assert compact == {
        "name": "compact",
        "every_s": 60.0,
        "last_run_at": None,
        "last_job": None,
        "last_run_age_s": None,
        "next_due_in_s": None,
    }
    assert optimize["last_run_at"] == 1000.0 and optimize["last_job"] == "j1"
    assert optimize["last_run_age_s"] == snap["taken_at"] - 1000.0
    assert optimize["next_due_in_s"] == 1000.0 + 3600.0 - snap["taken_at"]


def test_status_counts_jobs_dequeued_and_never_started(
    redis_client: redis.Redis, settings: Settings, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from contracts import keys
    from workers.runtime.queues import pool_queue
    from workers.runtime.runner import DurableQueue
    from workers.runtime.serializers import MsgpackSerializer

    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    queue = pool_queue("log", redis_client)
    stranded = queue.enqueue("tests.workers.jobs.slow_marker", "/nonexistent/never-run", 0.0)
    queue.enqueue("tests.workers.jobs.slow_marker", "/nonexistent/never-run", 0.0)
    # What a log worker killed between dequeue and start leaves behind; the second job still waits.
    taken = DurableQueue.dequeue_any([queue], None, connection=redis_client, serializer=MsgpackSerializer)
    assert taken is not None and taken[0].id == stranded.id
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    header, *rows = out.split("POOLS\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert header.split()[:5] == ["POOL", "QUEUE", "QUEUED", "DEQUEUED", "RUNNING"]
    pools = {row.split()[0]: row.split()[2:5] for row in rows}
    assert pools == {**{pool: ["0", "0", "0"] for pool in keys.QUEUES}, "log": ["1", "1", "0"]}

    assert main(["status", "--json"]) == 0
    snap = json.loads(capsys.readouterr().out)
    log_q, index_q = (next(q for q in snap["queues"] if q["pool"] == pool) for pool in ("log", "index"))
    assert (log_q["queue"], log_q["queued"], log_q["dequeued"], log_q["started"]) == (keys.LOG_QUEUE, 1, 1, 0)
    assert index_q["dequeued"] == 0
    assert log_q["requeued"] == {"dead_worker": 0, "stranded": 0}


def test_token_new_prints_the_token_once_and_the_entry_to_add(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "new", "--name", "team-a", "--project", "borealis", "--project", "apollo"]) == 0
    out, err = capsys.readouterr()
    token = err.strip().splitlines()[-1].strip()
    assert "shown only now" in err and "PVM_API_TOKEN" in err and len(token) >= 43
    assert json.loads(out) == {"name": "team-a", "sha256": token_sha256(token), "projects": ["apollo", "borealis"]}
    assert token not in out

    assert main(["token", "new", "--name", "ops", "--all", "--json"]) == 0
    out, err = capsys.readouterr()
    made = json.loads(out)
    assert err == "" and made["file"] is None
    assert made["entry"] == {"name": "ops", "sha256": token_sha256(made["token"]), "projects": ["*"]}


def test_token_new_refuses_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["token", "new", "--name", "team-a", "--project", "../etc"])
    assert "project '../etc' is not a valid project id" in str(refused.value.code)
    for args in (["--name", "a"], ["--name", "a", "--all", "--project", "apollo"], ["--project", "apollo"]):
        with pytest.raises(SystemExit) as usage:
            main(["token", "new", *args])
        assert usage.value.code == 2
    capsys.readouterr()
    path = tmp_path / "tokens.json"
    assert main(["token", "new", "--name", "team-a", "--all", "--file", str(path)]) == 0
    capsys.readouterr()
    assert main(["token", "new", "--name", "team-a", "--project", "apollo", "--file", str(path)]) == 2
    assert "already has a token named 'team-a'" in capsys.readouterr().err
    assert len(load_tokens(path)) == 1


def test_a_token_from_token_new_reaches_its_project_through_pvm_serve(
    apollo_logged: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import stat

    path = tmp_path / "secrets" / "tokens.json"
    assert main(["token", "new", "--name", "team-a", "--project", "apollo", "--file", str(path)]) == 0
    out, err = capsys.readouterr()
    token = err.strip().splitlines()[-1].strip()
    assert f"added 'team-a' (apollo) to {path}" in out and token not in out
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and token not in path.read_text()
    scope = TokenFile(path).lookup(token)
    assert scope is not None and scope.name == "team-a" and scope.projects == {"apollo"}

    with serving(apollo_logged, "0.0.0.0", None, {"PVM_API_TOKENS_FILE": str(path)}) as served:
        env = {"PVM_API_URL": served.url, "PVM_API_TOKEN": token}
        out = run_cli(["context", "--project", "apollo", "--agent", "coder"], env)
        assert out.returncode == 0 and "# Context for coder" in out.stdout, out.stderr
        foreign = run_cli(["search", "cache", "--project", "borealis"], env)
        assert foreign.returncode != 0 and "Traceback" not in foreign.stderr
        assert "(403): this token may not read project borealis" in foreign.stderr
        wrong = run_cli(["search", "cache", "--project", "apollo"], {**env, "PVM_API_TOKEN": "not-it"})
        assert "the reader API refused the token" in wrong.stderr
    # a tokens file guards the API: no warning about an open one
    assert "unauthenticated" not in served.output and token not in served.output


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ("{not json", "is not JSON"),
        ('{"tokens": [{"name": "a", "sha256": "00", "projects": ["apollo"]}]}', "tokens[0] ('a') sha256 must be"),
    ],
)
def test_serve_with_an_unusable_tokens_file_exits_with_one_line(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "tokens.json"
    if content is not None:
        path.write_text(content)
    env = {"PVM_API_TOKENS_FILE": str(path), "PVM_REDIS_URL": "redis://127.0.0.1:1/0", "PVM_HOME": str(tmp_path)}
    out = run_cli(["serve", "--port", str(free_port()), "--index-worker", "no"], env)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(f"pvm: PVM_API_TOKENS_FILE {path}")
    assert message in out.stderr


# -- pvm replay ---------------------------------------------------------------------------------------------------


def child_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of a `pvm` child process that sees exactly these settings."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PVM_", "OPENAI_"))}
    return {**env, **settings.to_env(), **extra}


@contextmanager
def index_worker(connection: redis.Redis, settings: Settings) -> Iterator[subprocess.Popen[str]]:
    """A real `pvm worker index` process, yielded once it serves the index queue."""
    from contracts import keys
    from workers.runtime.queues import live_workers

    worker = subprocess.Popen(
        [sys.executable, "-m", "workers.ops.cli", "worker", "index"],
        env=child_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not live_workers(connection, keys.QUEUES["index"]):
            assert worker.poll() is None, worker.communicate()[0]
            assert time.monotonic() < deadline, "pvm worker index did not start within 60 s"
            time.sleep(0.1)
        yield worker
    finally:
        worker.terminate()
        worker.communicate(timeout=60)


def replay_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.ops.cli", "replay", *args],
        env=child_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_replay_says_rebuilt_only_once_the_reset_ran_and_the_index_head_reached_the_log(
    redis_client: redis.Redis, settings: Settings
) -> None:
    from contracts import keys

    sessions = {"apollo": 120, "borealis": 40}
    for project, n in sessions.items():
        log_minutes(redis_client, settings, list(sample_session(project, n, seed=5)), index=False)
        # What an earlier indexing left: the head at the log's end (and a field only a reset removes).
        redis_client.hset(keys.index_head(project), mapping={"seq": n, "id": "old", "stale": "1"})
    with index_worker(redis_client, settings):
        one = replay_cli(settings, "--project", "apollo")
        head = redis_client.hgetall(keys.index_head("apollo"))
        every = replay_cli(settings, "--all")
        heads = {p: redis_client.hgetall(keys.index_head(p)) for p in sessions}
    assert one.returncode == 0, one.stderr
    assert "120 minutes of 1 project(s) rebuilt from the log" in one.stdout
    assert b"stale" not in head, "replay returned before the reset job ran"
    assert int(head[b"seq"]) == 120 and int(head[b"max_seq"]) == 120 and b"id" not in head
    assert "replay apollo: index" in one.stderr  # progress
    assert every.returncode == 0, every.stderr
    assert "160 minutes of 2 project(s) rebuilt from the log" in every.stdout
    assert {p: int(h[b"seq"]) for p, h in heads.items()} == sessions
    assert all(b"stale" not in h for h in heads.values())


@pytest.mark.slow
def test_replay_without_a_live_index_worker_says_so_at_once(redis_client: redis.Redis, settings: Settings) -> None:
    from workers.runtime.queues import pool_queue
    from workers.runtime.runner import PvmWorker

    log_minutes(redis_client, settings, list(sample_session("apollo", 20, seed=5)), index=False)
    # A worker that registered and died (kill -9): still in RQ's registry, its alive key gone.
    PvmWorker([pool_queue("index", redis_client)], redis_client).register_birth()
    out = replay_cli(settings, "--project", "apollo")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "no index worker is running: start `pvm worker index` or `pvm serve`" in out.stderr
    assert "rebuilt" not in out.stdout


@pytest.mark.slow
def test_replay_reports_a_failed_index_job_with_its_error(
    redis_client: redis.Redis, settings: Settings, openai_server
) -> None:
    settings = settings.with_(
        embed_model="test-embed",
        openai_base_url=openai_server.base_url,
        openai_api_key="test-key",
        embed_dimensions=32,
        embed_max_retries=0,
    )
    log_minutes(redis_client, settings, list(sample_session("apollo", 30, seed=5)), index=False)
    openai_server.fail_next(status(500), times=1_000)  # the embedding provider is down for good
    with index_worker(redis_client, settings):
        out = replay_cli(settings, "--project", "apollo")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "an index job of apollo failed" in out.stderr
    assert "500" in out.stderr.splitlines()[-1], out.stderr
    assert "rebuilt" not in out.stdout


@pytest.mark.slow
def test_replay_reports_a_failed_reset(redis_client: redis.Redis, settings: Settings) -> None:
    log_minutes(redis_client, settings, list(sample_session("apollo", 10, seed=5)), index=False)
    # A Qdrant server that is not there: the reset (deleting the project's points) fails.
    settings = settings.with_(qdrant_url=f"http://127.0.0.1:{free_port()}")
    with index_worker(redis_client, settings):
        out = replay_cli(settings, "--project", "apollo")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "the reset of apollo failed" in out.stderr


# -- pvm dead -------------------------------------------------------------------------------------------------------


def add_dead_letters(connection: redis.Redis, shard: int, count: int, raw_bytes: int = 200) -> list[str]:
    """`count` dead letters on a shard, as the dispatcher writes them; returns their ids, oldest first."""
    from contracts import keys

    ids: list[str] = []
    for start in range(0, count, 5_000):
        pipe = connection.pipeline(transaction=False)
        for i in range(start, min(start + 5_000, count)):
            fields = {"reason": f"bad {i}", "raw": b"\xc1" * raw_bytes, "entry_id": f"{i + 1}-0"}
            pipe.xadd(keys.dead_letter_stream(shard), fields)  # type: ignore[arg-type]
        ids += [e.decode() for e in pipe.execute()]
    return ids


@contextmanager
def monitored(redis_url: str) -> Iterator[list[list[str]]]:
    """Every command the server runs inside the block (MONITOR), as [NAME, arg, ...]."""
    import threading

    commands: list[list[str]] = []
    client = redis.Redis.from_url(redis_url)
    ready = threading.Event()
    stop = "pvm-test-monitor-stop"

    def watch() -> None:
        with client.monitor() as m:
            ready.set()
            for event in m.listen():
                words = event["command"].split(" ")
                if words[0].upper() == "ECHO" and stop in event["command"]:
                    return
                commands.append([words[0].upper(), *words[1:]])

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    ready.wait(10)
    time.sleep(0.1)  # MONITOR is in place once the server has answered it
    try:
        yield commands
    finally:
        redis.Redis.from_url(redis_url).echo(stop)
        thread.join(30)
        client.close()


def stream_reads(commands: list[list[str]]) -> list[list[str]]:
    return [c for c in commands if c[0] in ("XRANGE", "XREVRANGE")]


def net_output_bytes(connection: redis.Redis) -> int:
    return int(connection.info("stats")["total_net_output_bytes"])


@pytest.mark.slow
def test_dead_list_reads_a_bounded_page_of_a_large_stream(
    redis_client: redis.Redis, settings: Settings, redis_url: str, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    on_0 = add_dead_letters(redis_client, 0, 50_000)  # ~10 MB of raw bytes
    on_1 = add_dead_letters(redis_client, 1, 3)
    newest = sorted(on_0 + on_1, key=lambda i: tuple(map(int, i.split("-"))), reverse=True)
    before = net_output_bytes(redis_client)
    with monitored(redis_url) as commands:
        assert main(["dead", "list", "--limit", "5", "--json"]) == 0
    sent = net_output_bytes(redis_client) - before
    assert sent < 64_000, f"the server sent {sent:,} bytes for 5 dead letters"
    reads = stream_reads(commands)
    assert reads and all("COUNT" in c and int(c[c.index("COUNT") + 1]) <= 5 for c in reads), reads
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == newest[:5]

    # The next page starts below the last id shown, on every shard; the table says how to ask for it.
    assert main(["dead", "list", "--limit", "5", "--before", newest[4], "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == newest[5:10]
    assert main(["dead", "list", "--limit", "3", "--shard", "1"]) == 0
    out, err = capsys.readouterr()
    assert out.count("bad ") == 3 and f"pvm dead list --limit 3 --shard 1 --before {on_1[0]}" in err


@pytest.mark.slow
def test_dead_retry_and_drop_work_in_bounded_batches(
    redis_client: redis.Redis, settings: Settings, redis_url: str, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    from contracts import keys
    from pvm import defaults

    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    page = defaults.DEAD_LETTER_PAGE
    on_0 = add_dead_letters(redis_client, 0, page * 2 + 7)
    on_2 = add_dead_letters(redis_client, 2, 4)
    with monitored(redis_url) as commands:
        assert main(["dead", "retry", "--all", "--shard", "0"]) == 0
    assert f"{len(on_0)} dead letters sent back to their streams" in capsys.readouterr().out
    assert redis_client.xlen(keys.dead_letter_stream(0)) == 0 and redis_client.xlen(keys.stream(0)) == len(on_0)
    assert redis_client.xlen(keys.dead_letter_stream(2)) == 4
    reads = stream_reads(commands)
    assert len(reads) >= 3 and all("COUNT" in c and int(c[c.index("COUNT") + 1]) <= page for c in reads), reads

    with monitored(redis_url) as commands:
        assert main(["dead", "drop", on_2[1], "9-9"]) == 1  # one of them is not there
    out, err = capsys.readouterr()
    assert "1 dead letters dropped" in out and "not found: 9-9" in err
    assert [e[0].decode() for e in redis_client.xrange(keys.dead_letter_stream(2))] == [on_2[0], *on_2[2:]]
    reads = stream_reads(commands)
    assert reads and all(c[2] == c[3] for c in reads), reads  # XRANGE key ID ID: one entry at most

    assert main(["dead", "drop", "--all"]) == 0
    assert "3 dead letters dropped" in capsys.readouterr().out
    assert redis_client.xlen(keys.dead_letter_stream(2)) == 0


def test_dead_refuses_ids_that_are_not_stream_ids(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["list", "--before", "yesterday"], ["drop", "abc"], ["list", "--shard", "-1"]):
        with pytest.raises(SystemExit) as usage:
            main(["dead", *args])
        assert usage.value.code == 2
    assert "is not a stream entry id" in capsys.readouterr().err


# -- one line, never a traceback ---------------------------------------------------------------------------------

NO_REDIS_COMMANDS = {  # the log files, a token, the reader API
    "mcp",
    "log tail",
    "token new",
    "context",
    "search",
    "facts list",
    "facts show",
    "facts history",
    "facts promote",
    "facts retract",
    "learn",
    "recall",
    "thread show",
    "pair",
}


def _leaf_commands(parser: object, prefix: str = "") -> dict[str, object]:
    """Every runnable `pvm` subcommand ("dead list", "status", ...) and its parser."""
    import argparse

    assert isinstance(parser, argparse.ArgumentParser)
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        return {prefix.strip(): parser}
    out: dict[str, object] = {}
    for name, child in subparsers[0].choices.items():
        out.update(_leaf_commands(child, f"{prefix} {name}"))
    return out


def _redis_down_argv(port: str) -> dict[str, list[str]]:
    return {
        "up": ["up", "--api-port", port],
        "dispatch": ["dispatch", "--max-idle", "1"],
        "scheduler": ["scheduler", "--once"],
        "worker": ["worker", "log", "index", "--burst"],
        "exporter": ["exporter", "--port", port],
        "status": ["status"],
        "dead list": ["dead", "list"],
        "dead retry": ["dead", "retry", "--all"],
        "dead drop": ["dead", "drop", "1-0"],
        "failed list": ["failed", "list"],
        "failed retry": ["failed", "retry", "--all"],
        "serve": ["serve", "--port", port, "--index-worker", "no"],
        "replay": ["replay", "--all"],
        "optimize": ["optimize"],
        "evaluate": ["evaluate", "--project", "p1", "--dry-run"],
        "stats": ["stats", "--project", "p1"],
        "export": ["export", "--project", "p1", "--out", "memory"],
        "import": ["import", "--project", "p1", "memory"],
        "demo": ["demo", "--minutes", "5"],
    }


def test_every_command_that_needs_redis_is_checked_with_redis_down() -> None:
    from workers.ops.cli import build_parser

    assert set(_leaf_commands(build_parser())) == NO_REDIS_COMMANDS | set(_redis_down_argv("1"))


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(_redis_down_argv("1")))
def test_with_redis_down_every_command_says_so_in_one_line(command: str, tmp_path: Path) -> None:
    argv = _redis_down_argv(str(free_port()))[command]
    env = {
        "PVM_REDIS_URL": "redis://:s3cret@127.0.0.1:1/0",
        "PVM_HOME": str(tmp_path),
        "PVM_QDRANT_URL": "",
        "PVM_REDIS_START_WAIT": "0",
    }
    out = run_cli(argv, env)
    assert out.returncode == 2, out.stderr
    assert out.stderr == (
        "pvm: cannot reach Redis at redis://:***@127.0.0.1:1/0 (Connection refused): start it or set PVM_REDIS_URL\n"
    )


def test_bad_arguments_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    cases = {
        ("dispatch", "--shards", "a,b"): "'a' is not a shard number",
        ("dispatch", "--shards", "1,,2"): "'' is not a shard number",
        ("demo", "--minutes", "-5"): "must be at least 1, got -5",
        ("demo", "--project", "a b"): "'a b' is not a project id",
        ("dispatch", "--max-idle", "-1"): "must be 0 or more",
        ("search", "x", "--project", "p", "--min-composite", "2"): "must be between 0 and 1",
        ("search", "x", "--project", "p", "--kinds", "minute,episode"): "name some of minute, fact, summary",
        ("exporter", "--port", "70000"): "must be a port (1-65535)",
    }
    for argv, message in cases.items():
        with pytest.raises(SystemExit) as usage:
            main(list(argv))
        err = capsys.readouterr().err
        assert usage.value.code == 2 and err.startswith("usage: pvm ") and message in err, (argv, err)


def test_a_shard_beyond_pvm_shards_is_refused(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    for argv in (["dispatch", "--shards", "1,4"], ["dead", "list", "--shard", "9"]):
        with pytest.raises(SystemExit) as refused:
            main(argv)
        assert "PVM_SHARDS is 4 (shards 0-3)" in str(refused.value.code)


def test_version_is_the_package_version() -> None:
    from importlib.metadata import version

    out = run_cli(["--version"], {})
    assert out.returncode == 0 and out.stdout == f"pvm {version('pvm')}\n"


def test_every_command_has_a_help_line() -> None:
    import argparse

    from workers.ops.cli import build_parser

    def check(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                for name, child in action.choices.items():
                    assert helps.get(name), f"`pvm {path}{name}` has no help line"
                    assert child.description, f"`pvm {path}{name} --help` does not say what it is for"
                    check(child, f"{path}{name} ")
            elif action.dest != "help":
                assert action.help, f"`pvm {path}` option {action.option_strings or action.dest} has no help"

    check(build_parser(), "")


@pytest.mark.slow
def test_a_closed_pipe_ends_the_output_quietly(redis_client: redis.Redis, settings: Settings) -> None:
    log_minutes(redis_client, settings, list(sample_session("apollo", 30, seed=3)), index=False)
    for argv in (["status"], ["log", "tail", "--project", "apollo"]):
        reader = subprocess.Popen(
            [sys.executable, "-m", "workers.ops.cli", *argv],
            env=child_env(settings),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert reader.stdout is not None and reader.stderr is not None
        reader.stdout.close()  # `| head -0`: the reader is gone before the first line
        err = reader.stderr.read()
        assert reader.wait(timeout=60) == 141 and err == "", (argv, err)


def test_context_for_an_unknown_project_says_so(apollo_logged: Settings) -> None:
    with serving(apollo_logged, "127.0.0.1", None) as served:
        env = {"PVM_API_URL": served.url, "PVM_API_TOKEN": ""}
        known = run_cli(["context", "--project", "apollo", "--agent", "coder"], env)
        assert known.returncode == 0 and "# Context for coder" in known.stdout, known.stderr
        for extra in ([], ["--json"]):
            out = run_cli(["context", "--project", "borealis", "--agent", "coder", *extra], env)
            assert out.returncode == 2 and out.stdout == "", out.stderr
            assert out.stderr == (
                "pvm: project 'borealis' has no minutes (nothing in the log or the caches the reader API "
                f"at {served.url} reads): check --project\n"
            )


def test_project_ids_are_checked_and_quoted_in_api_paths(capsys: pytest.CaptureFixture[str]) -> None:
    from workers.ops.cli.plumbing import _project_path

    assert _project_path("a/b?c d#e", "context") == "/v1/projects/a%2Fb%3Fc%20d%23e/context"
    assert _project_path("apollo-2.x", "search") == "/v1/projects/apollo-2.x/search"
    for argv in (["context", "--agent", "a", "--project", "no/such"], ["search", "q", "--project", "a b"]):
        with pytest.raises(SystemExit) as usage:
            main(argv)
        assert usage.value.code == 2 and "is not a project id" in capsys.readouterr().err


@pytest.mark.slow
def test_a_wrong_redis_password_is_one_line_without_the_password(tmp_path: Path) -> None:
    from workers.runtime.embedded import EmbeddedRedis

    with EmbeddedRedis() as server:  # a server of its own, to protect with a password
        redis.Redis.from_url(server.url).config_set("requirepass", "right-one")
        port = server.port
        out = run_cli(
            ["status"], {"PVM_REDIS_URL": f"redis://:wrong-one@127.0.0.1:{port}/0", "PVM_HOME": str(tmp_path)}
        )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith(f"pvm: Redis at redis://:***@127.0.0.1:{port}/0 refused to log in (")
    assert out.stderr.endswith("): fix the credentials in PVM_REDIS_URL\n") and out.stderr.count("\n") == 1
    assert "wrong-one" not in out.stderr


def test_failed_list_reads_only_the_jobs_it_shows(
    redis_client: redis.Redis, settings: Settings, redis_url: str, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    from rq.registry import FailedJobRegistry
    from rq.results import Result

    from pvm import defaults
    from workers.runtime.queues import pool_queue
    from workers.runtime.serializers import MsgpackSerializer

    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    queue = pool_queue("log", redis_client)
    registry = FailedJobRegistry(queue.name, connection=redis_client, serializer=MsgpackSerializer)
    jobs = [queue.enqueue("tests.workers.jobs.slow_marker", f"/nonexistent/{i}", 0.0) for i in range(40)]
    redis_client.delete(queue.key)  # taken by a worker ...
    for job in jobs:  # ... and failed for good: what the worker records
        error = f"Traceback ...\nOSError: disk {job.id} full"
        Result.create_failure(job, 3600, error)
        registry.add(job, ttl=3600, exc_string=error)
    with monitored(redis_url) as commands:
        assert main(["failed", "list", "--limit", "3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 3 and all(r["error"] == f"OSError: disk {r['job']} full" for r in rows), rows
    read = {c[1].strip('"') for c in commands if c[0] == "HGETALL" and c[1].strip('"').startswith("rq:job:")}
    assert len(read) == 3, sorted(read)

    assert main(["failed", "retry", jobs[7].id, "no-such-job"]) == 1
    out, err = capsys.readouterr()
    assert "1 failed jobs requeued" in out and "not found: no-such-job" in err
    assert jobs[7].id not in registry and len(registry) == 39

    # --all requeues page by page; a job that cannot be requeued (its hash is gone) is named and stays.
    redis_client.zadd(registry.key, {"planted-job": time.time() + 60})  # the front of the registry
    monkeypatch.setattr(defaults, "FAILED_JOBS_PAGE", 7)
    assert main(["failed", "retry", "--all", "--pool", "log"]) == 1
    out, err = capsys.readouterr()
    assert "39 failed jobs requeued" in out and "could not requeue: planted-job (NoSuchJobError" in err
    assert registry.get_job_ids(cleanup=False) == ["planted-job"] and queue.count == 1 + 39


def test_token_new_grants_the_global_tier_only_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tokens.json"
    assert main(["token", "new", "--name", "curator", "--project", "apollo", "--global", "--file", str(path)]) == 0
    out, err = capsys.readouterr()
    token = err.strip().splitlines()[-1].strip()
    assert "added 'curator' (apollo and the global tier)" in out
    assert main(["token", "new", "--name", "team-a", "--all", "--file", str(path)]) == 0
    assert "added 'team-a' (every project)" in capsys.readouterr().out
    scopes = load_tokens(path)
    curator = scopes[token_sha256(token)]
    assert curator.allows_global and curator.projects == {"apollo"}
    assert [s.allows_global for s in scopes.values() if s.name == "team-a"] == [False]
    assert main(["token", "new", "--name", "ops", "--all", "--global", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entry"]["global"] is True


def test_thread_show_prints_a_threads_chunks_and_episodes(redis_client: redis.Redis, settings: Settings) -> None:
    from tests.workers.summarize.test_summarize_pool import conversation, records
    from workers.summarize.pool import SummarizeContext, summarize_batch

    summarize_batch(SummarizeContext.build(redis_client, settings), redis_client, records(conversation(45)))
    with serving(settings, "127.0.0.1", None) as served:
        env = {"PVM_API_URL": served.url, "PVM_API_TOKEN": ""}
        out = run_cli(["thread", "show", "deploy-42", "--project", "p1", "--recent", "2"], env)
        assert out.returncode == 0, out.stderr
        assert "thread thread:deploy-42 of p1: 45 minutes summarized, 2 chunk(s)" in out.stdout
        assert "- [seq 1-10] " in out.stdout and "- [seq 11-20] " in out.stdout and "Episodes:" in out.stdout
        assert "Newest 2 minutes (verbatim):" in out.stdout and "[m00045]" in out.stdout
        out = run_cli(["thread", "show", "deploy-42", "--project", "p1", "--json"], env)
        assert out.returncode == 0 and len(json.loads(out.stdout)["chunks"]) == 2
        out = run_cli(["context", "--project", "p1", "--agent", "a1", "--thread", "deploy-42", "--json"], env)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["summaries"][0]["last_seq"] == 20

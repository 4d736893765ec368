"""The pools page over a real Valkey and RQ: each stage's waiting work, workers, failures and oldest wait, the shard
streams' groups, freshness and schedules; deployment-wide, behind any accepted token, live-refreshed."""

from __future__ import annotations

import html
import re
import time
from datetime import UTC, datetime

import redis
from rq.registry import FailedJobRegistry
from starlette.testclient import TestClient

from contracts import keys
from pvm.metrics import MetricsRecorder
from pvm.reader import ContextReader
from tests.workers.console.conftest import OPS, TEAM_A, sign_in
from workers.api.app import create_app
from workers.console.pools import bound, duration
from workers.console.routes import CONSOLE
from workers.runtime.queues import pool_queue
from workers.runtime.serializers import MsgpackSerializer


def cells(page: str, opening: str) -> list[str]:
    """The text of each cell of the table row that opens with `opening` (a `<tr ...>` tag or its first cell)."""
    found = re.search(re.escape(opening) + r"(.*?)</tr>", page, re.S)
    assert found, f"no row {opening!r} on the page"
    row = found.group(1) if opening.startswith("<tr") else opening + found.group(1)
    texts = re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.S)
    return [html.unescape(re.sub(r"<[^>]+>", "", t)).strip() for t in texts]


def section(page: str, anchor: str) -> str:
    """The part of the page from the heading `anchor` on."""
    return page.split(f'id="{anchor}"', 1)[1]


def stage(page: str, name: str) -> dict[str, str]:
    header = ["stage", "source", "waiting", "in_progress", "workers", "failed", "oldest", "done", "failures"]
    return dict(zip(header, cells(page, f'<tr data-stage="{name}">'), strict=True))


def test_each_pools_queue_shows_its_waiting_jobs_workers_failures_and_oldest_wait(
    console: TestClient, redis_client: redis.Redis
) -> None:
    facts = pool_queue("facts", redis_client)
    waiting = [facts.enqueue(keys.FACTS_JOB, []) for _ in range(3)]  # no facts worker runs: they wait
    two_minutes_ago = datetime.fromtimestamp(time.time() - 120, UTC).isoformat()
    redis_client.hset(waiting[0].key, "enqueued_at", two_minutes_ago)
    summarize = pool_queue("summarize", redis_client)
    failed = summarize.enqueue(keys.SUMMARIZE_JOB, [])
    summarize.remove(failed)
    FailedJobRegistry(summarize.name, connection=redis_client, serializer=MsgpackSerializer).add(failed, ttl=600)

    page = console.get("/ui/pools")
    assert page.status_code == 200
    row = stage(page.text, "facts")
    assert row["source"] == "queue pvm-facts" and row["waiting"] == "3" and row["workers"] == "0"
    assert row["oldest"] == "2 min"
    assert re.search(r'<tr data-stage="facts">.*?<td class="num bad">0</td>', page.text, re.S)  # no worker: marked
    assert re.search(r'<tr data-stage="facts">.*?<td class="warn">2', page.text, re.S)  # waited past a minute
    assert stage(page.text, "summarize")["failed"] == "1"
    # The index pool of the reader fixture ran its 100 minutes in batches, through RQ: done, nothing waiting.
    index = stage(page.text, "index")
    assert index["done"] == "100" and index["waiting"] == "0" and index["failed"] == "0"
    assert index["oldest"] == "—"


def test_the_dispatch_stage_shows_each_groups_lag_pending_entries_and_the_oldest_pending_age(
    console: TestClient, redis_client: redis.Redis
) -> None:
    stream = keys.stream(1)
    redis_client.xgroup_create(stream, keys.DISPATCH_GROUP, id="0", mkstream=True)
    old_ms = int(time.time() * 1000) - 90_000
    for i in range(5):
        redis_client.xadd(stream, {keys.MINUTE_FIELD: b"x"}, id=f"{old_ms}-{i}")
    redis_client.xreadgroup(keys.DISPATCH_GROUP, "dispatcher-a", {stream: ">"}, count=2)  # read, never acknowledged
    redis_client.xadd(keys.dead_letter_stream(1), {"reason": "undecodable"})

    page = console.get("/ui/pools").text
    row = stage(page, "dispatch")
    assert row["source"] == f"stream group {keys.DISPATCH_GROUP}"
    assert row["waiting"] == "3" and row["in_progress"] == "2" and row["failed"] == "1" and row["workers"] == "—"
    assert row["oldest"] in ("1.5 min", "1.6 min")
    shard = cells(page, f'<th scope="row" rowspan="1">1 <code>{stream}</code></th>')
    assert shard[1:4] == ["5", "1", keys.DISPATCH_GROUP] and shard[4:6] == ["3", "2"]
    # A shard no dispatcher has read yet says so.
    assert "no consumer group yet" in page


def test_freshness_and_stage_counters_come_from_the_recorded_metrics(
    console: TestClient, redis_client: redis.Redis
) -> None:
    metrics = MetricsRecorder(redis_client)
    metrics.freshness("durable", [0.03] * 98 + [7.0, 7.0])
    metrics.freshness("summarized", [5_000.0])
    metrics.batch("log", 100, 0.2)
    metrics.batch("log", 20, 0.1, failures=20)
    page = console.get("/ui/pools").text
    freshness = section(page, "freshness")
    assert cells(freshness, '<th scope="row">durable</th>') == ["durable", "≤ 0.05 s", "≤ 10 s", "100"]
    assert cells(freshness, '<th scope="row">summarized</th>') == ["summarized", "> 1 h", "> 1 h", "1"]
    log_stage = stage(page, "log")
    assert log_stage["done"] == "120" and log_stage["failures"] == "20"


def test_the_schedules_and_the_schedulers_leader_are_shown(console: TestClient, redis_client: redis.Redis) -> None:
    assert "none holds the lease" in console.get("/ui/pools").text
    now = time.time()
    redis_client.hset(
        keys.schedules(),
        mapping={"optimize:every": 3600, "optimize:last": now - 600, "optimize:job": "job-17", "reap:every": 30},
    )
    redis_client.hset(keys.schedules(), mapping={"evaluate:every": 60, "evaluate:last": now - 300})
    redis_client.set(keys.scheduler_leader(), "host-up")
    page = console.get("/ui/pools").text
    assert "<code>host-up</code> holds the lease" in page
    page = section(page, "schedules")
    optimize = cells(page, '<th scope="row">optimize</th>')
    assert (
        optimize[1] == "1 h" and optimize[2] == "10 min ago" and optimize[3] == "in 50 min" and optimize[4] == "job-17"
    )
    evaluate = cells(page, '<th scope="row">evaluate</th>')
    assert evaluate[3] == "overdue by 4 min" and evaluate[4] == "—"
    assert cells(page, '<th scope="row">reap</th>')[2:4] == ["never", "at the leader's next tick"]


def test_the_live_part_reloads_itself_and_says_when_it_was_updated(console: TestClient) -> None:
    page = console.get("/ui/pools").text
    assert '<div id="pools-live" data-refresh="5"' in page
    live = page.split('<div id="pools-live"', 1)[1]
    assert "Stages" in live and "Streams" in live and "Schedules" in live
    assert re.search(r"<time data-refreshed [^>]*>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</time>", page)
    # What console.js fetches is the same page: the element is there to swap in.
    assert '<div id="pools-live"' in console.get("/ui/pools", headers={"Accept": "text/html"}).text


def test_any_accepted_token_sees_the_pools_and_no_projects_name_on_them(scoped_console: TestClient) -> None:
    answer = scoped_console.get("/ui/pools", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/login?next=%2Fui%2Fpools"
    for token in (TEAM_A, OPS):
        sign_in(scoped_console, token)
        page = scoped_console.get("/ui/pools")
        assert page.status_code == 200 and 'data-stage="index"' in page.text
        assert "apollo" not in page.text and "borealis" not in page.text


def test_an_app_built_without_settings_reads_its_shards_from_the_app(
    reader: ContextReader, redis_client: redis.Redis
) -> None:
    with TestClient(create_app(reader, redis_client, 2, pages=CONSOLE)) as client:
        page = client.get("/ui/pools").text
    assert keys.stream(1) in page and keys.stream(2) not in page


def test_spans_of_time_read_as_people_say_them() -> None:
    assert [duration(s) for s in (None, 0.4, 1.0, 12.3, 90, 180, 9000, 172_800)] == [
        "—",
        "0.4 s",
        "1 s",
        "12 s",
        "1.5 min",
        "3 min",
        "2.5 h",
        "2 d",
    ]
    assert [bound(s) for s in (None, 0.025, 2.5, 60.0)] == ["—", "≤ 0.025 s", "≤ 2.5 s", "≤ 1 min"]
    assert bound(float("inf")) == "> 1 h"

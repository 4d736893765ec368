"""The threads pages over a real summarize pool's store: apollo's logged session worked into threads."""

from __future__ import annotations

import html
import urllib.parse
from dataclasses import replace

import pytest
import redis
from starlette.testclient import TestClient

from contracts import encode_minute
from contracts.summaries import ThreadRef
from pvm.config import Settings
from pvm.stores.log import LogReader
from pvm.stores.summaries import SummaryStore, ThreadView
from tests.workers.console.conftest import TEAM_A, sign_in
from workers.summarize.pool import SummarizeContext, summarize_batch
from workers.summarize.threads import ThreadShape


def summarize(redis_client: redis.Redis, settings: Settings, project_id: str) -> None:
    """Work a project's whole log into threads as the summarize pool does: small chunks, so each thread has some."""
    history = list(LogReader(settings.log_dir).history(project_id))
    ctx = replace(SummarizeContext.build(redis_client, settings), shape=ThreadShape(recent=2, chunk=3, max_chunks=25))
    summarize_batch(ctx, redis_client, [[r.minute.id, r.seq, encode_minute(r.minute), 0] for r in history])


@pytest.fixture
def threaded(console: TestClient, redis_client: redis.Redis, settings: Settings) -> TestClient:
    summarize(redis_client, settings, "apollo")
    return console


def views(redis_client: redis.Redis, project_id: str) -> list[ThreadView]:
    store = SummaryStore(redis_client)
    return [store.thread_view(project_id, t, 1_000) for t in store.threads(project_id)]


def link(thread: ThreadRef | str) -> str:
    return "/ui/projects/apollo/threads/" + urllib.parse.quote(str(thread), safe="")


def test_the_threads_page_lists_every_thread_with_its_counts(threaded: TestClient, redis_client: redis.Redis) -> None:
    page = threaded.get("/ui/projects/apollo/threads")
    assert page.status_code == 200, page.text
    every = views(redis_client, "apollo")
    assert len(every) == 6  # one per task of the sample session: each minute names its thread
    assert f"{len(every)} threads in apollo" in page.text
    for view in every:
        assert f'href="{link(view.thread)}"' in page.text
    # the counts are the store's: the row of the busiest thread says its minutes and its chunks
    busiest = max(every, key=lambda v: v.minutes)
    row = page.text.split(f'href="{link(busiest.thread)}"')[1].split("</tr>")[0]
    assert f">{busiest.minutes}<" in row and f">{len(busiest.chunks)}<" in row and f">{len(busiest.episodes)}<" in row


def test_the_threads_page_filters_by_name_and_pages_with_a_cursor(threaded: TestClient) -> None:
    page = threaded.get("/ui/projects/apollo/threads", params={"contains": "MIGRATE"})
    assert page.status_code == 200
    assert link("thread:migrate-db-thread") in page.text and "parse-invoices" not in page.text
    first = threaded.get("/ui/projects/apollo/threads", params={"n": 4})
    assert first.text.count('<th scope="row"><a href="/ui/projects/apollo/threads/') == 4
    cursor = html.unescape(first.text.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0])
    assert "after=" in cursor and "n=4" in cursor
    second = threaded.get(cursor)
    assert second.text.count('<th scope="row"><a href="/ui/projects/apollo/threads/') == 2
    assert 'rel="next"' not in second.text
    shown_first = {s.split('"')[0] for s in first.text.split('href="/ui/projects/apollo/threads/')[1:]}
    shown_second = {s.split('"')[0] for s in second.text.split('href="/ui/projects/apollo/threads/')[1:]}
    assert not shown_first & shown_second


def test_a_thread_page_shows_its_newest_minutes_chunks_and_episodes_newest_first(
    threaded: TestClient, redis_client: redis.Redis
) -> None:
    view = next(v for v in views(redis_client, "apollo") if len(v.chunks) >= 2 and v.episodes)
    page = threaded.get(link(view.thread))
    assert page.status_code == 200, page.text
    text = html.unescape(page.text)
    assert f"Thread {view.thread}" in text
    # its newest minutes, linked to their minute pages
    for minute in view.recent:
        assert f'href="/ui/projects/apollo/minutes/{minute["id"]}"' in page.text
    # its chunks with their summaries, the newest first
    newest, older = view.chunks[-1], view.chunks[-2]
    assert newest.summary in text and older.summary in text
    chunks = text.split('id="chunks"')[1].split('id="episodes"')[0]
    spans = [f'<th scope="row">{c.first_seq}-{c.seq_ranges[0][1]}' for c in (newest, older)]
    assert chunks.index(spans[0]) < chunks.index(spans[1])
    # each links the timeline of the thread's minutes up to its last one
    timeline = f"/ui/projects/apollo/timeline?before={newest.last_seq + 1}&thread={view.thread.name}"
    assert f'href="{timeline}"' in chunks
    # its episodes, each linking the minutes it stands for
    episode = max(view.episodes, key=lambda e: e.last_seq)
    assert episode.title in text
    assert all(f'href="/ui/projects/apollo/minutes/{i}"' in page.text for i in episode.minute_ids)


def test_a_thread_page_reads_as_many_newest_minutes_as_asked(threaded: TestClient, redis_client: redis.Redis) -> None:
    view = max(views(redis_client, "apollo"), key=lambda v: len(v.recent))
    assert len(view.recent) >= 2

    def newest_shown(params: dict[str, int]) -> list[str]:
        page = threaded.get(link(view.thread), params=params).text
        table = page.split('id="recent"')[1].split('id="chunks"')[0]
        return [s.split('"')[0] for s in table.split('href="/ui/projects/apollo/minutes/')[1:]]

    assert newest_shown({}) == [m["id"] for m in reversed(view.recent)]  # newest first
    assert newest_shown({"recent": 1}) == [view.recent[-1]["id"]]
    assert newest_shown({"recent": 0}) == []


def test_a_thread_is_named_as_in_the_api(threaded: TestClient) -> None:
    bare = threaded.get("/ui/projects/apollo/threads/migrate-db-thread")  # a bare id is a thread id
    assert bare.status_code == 200 and "Thread thread:migrate-db-thread" in bare.text


def test_a_bad_thread_name_is_a_400_page_naming_it(threaded: TestClient) -> None:
    answer = threaded.get("/ui/projects/apollo/threads/task:")
    assert answer.status_code == 400 and "thread:" in answer.text and "Traceback" not in answer.text


def test_a_thread_the_pool_has_not_seen_is_a_404_page(threaded: TestClient) -> None:
    answer = threaded.get(link("thread:never-seen"))
    assert answer.status_code == 404 and "no thread thread:never-seen" in answer.text


def test_a_bad_page_size_or_recent_count_is_a_400_page_naming_it(threaded: TestClient) -> None:
    answer = threaded.get("/ui/projects/apollo/threads", params={"n": "lots"})
    assert answer.status_code == 400 and "n=" in html.unescape(answer.text)
    answer = threaded.get(link("thread:migrate-db-thread"), params={"recent": 5_000})
    assert answer.status_code == 400 and "recent=5000" in answer.text


def test_a_project_without_threads_says_so(console: TestClient) -> None:
    page = console.get("/ui/projects/borealis/threads")
    assert page.status_code == 200 and "has not read a minute of this project yet" in page.text


def test_a_token_for_apollo_cannot_open_borealiss_threads(
    scoped_console: TestClient, redis_client: redis.Redis, settings: Settings
) -> None:
    summarize(redis_client, settings, "borealis")
    sign_in(scoped_console, TEAM_A)
    assert scoped_console.get("/ui/projects/apollo/threads").status_code == 200
    [thread, *_] = SummaryStore(redis_client).threads("borealis")
    for path in ("/ui/projects/borealis/threads", f"/ui/projects/borealis/threads/{thread}"):
        answer = scoped_console.get(path)
        assert answer.status_code == 403 and str(thread) not in answer.text.replace(path, "")

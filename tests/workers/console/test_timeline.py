"""The timeline and minute pages (workers/console/timeline.py) over a real log, Valkey, index and facts store: the
log newest first, each filter, the pager's cursor, the scan bound, and a minute with its references both ways and
what the pools made of it."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import redis
from starlette.testclient import TestClient

from contracts import Minute, encode_minute
from contracts.fact_changes import asserted_minute, fact_change, tier_promoted_minute
from contracts.facts import Fact, FactType, TierKey
from pvm.config import Settings
from pvm.reader import ContextReader
from pvm.stores.facts import FactStore
from pvm.stores.log import LogReader, LogRecord
from pvm.stores.summaries import SummaryStore
from tests.memory_helpers import log_minutes
from tests.workers.console.conftest import TEAM_A, sign_in
from workers.console import timeline
from workers.summarize.pool import SummarizeContext, summarize_batch
from workers.summarize.threads import ThreadShape

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)


def shown(page: str, project: str = "apollo") -> list[str]:
    """The minute ids a page links to, in page order, each once (a timeline row links its minute twice)."""
    return list(dict.fromkeys(re.findall(rf'href="/ui/projects/{project}/minutes/([^"]+)"', page)))


def older_link(page: str) -> str | None:
    found = re.search(r'<a href="([^"]+)" rel="next">older</a>', page)
    return html.unescape(found.group(1)) if found else None


def newest_first(settings: Settings, project: str, admits: Callable[[Minute], bool] = lambda m: True) -> list[str]:
    """The ids of the project's logged minutes that `admits` takes, newest first: what the timeline should show."""
    records = list(LogReader(settings.log_dir).history(project))
    return [r.id for r in reversed(records) if admits(r.minute)]


def apollo(settings: Settings) -> list[Minute]:
    return [r.minute for r in LogReader(settings.log_dir).history("apollo")]


def timed(project: str, count: int, start: datetime = T0, step: timedelta = timedelta(hours=1)) -> list[Minute]:
    """Minutes a known time apart (the sample session's all carry the time they were made)."""
    return [
        Minute(
            project_id=project,
            event_type="message",
            id=f"{project}-{i:05d}",
            timestamp=(start + i * step).isoformat().replace("+00:00", "Z"),
            agent_id="clock",
            memory_note=f"tick {i}",
        )
        for i in range(count)
    ]


# -- the timeline ---------------------------------------------------------------------------------------------


def test_the_timeline_shows_the_log_newest_first_with_each_rows_fields(console: TestClient, settings: Settings) -> None:
    page = console.get("/ui/projects/apollo/timeline")
    assert page.status_code == 200, page.text
    assert shown(page.text) == newest_first(settings, "apollo")  # all 80, newest first
    newest = apollo(settings)[-1]
    row = page.text.split(f'minutes/{newest.id}"', 1)[1].split("</tr>", 1)[0]
    assert newest.agent_id is not None and newest.memory_note is not None and newest.thread_id is not None
    assert f">{newest.agent_id}<" in row and f"<code>{newest.event_type}</code>" in row
    assert html.escape(newest.memory_note)[:60] in row
    assert f'/threads/thread%3A{newest.thread_id}"' in row and f'/threads/task%3A{newest.data["task_id"]}"' in row
    assert older_link(page.text) is None  # one page holds them all
    assert 'name="agent"' in page.text and "data-focus-key" in page.text.split('name="agent"', 1)[1].split(">", 1)[0]
    assert page.text.count("<label>") >= 7  # every input of the filter form has its label


@pytest.mark.parametrize(
    ("param", "value_of"),
    [
        ("agent", lambda m: m.agent_id),
        ("event_type", lambda m: m.event_type),
        ("task", lambda m: m.data.get("task_id")),
        ("thread", lambda m: m.thread_id),
    ],
)
def test_each_filter_narrows_the_timeline_to_the_minutes_it_names(
    console: TestClient, settings: Settings, param: str, value_of: Callable[[Minute], str | None]
) -> None:
    value = value_of(apollo(settings)[10])
    expected = newest_first(settings, "apollo", lambda m: value_of(m) == value)
    assert 0 < len(expected) < 80
    page = console.get("/ui/projects/apollo/timeline", params={param: value})
    assert page.status_code == 200, page.text
    assert shown(page.text) == expected
    assert f'value="{value}"' in page.text  # the form keeps what was asked
    nothing = console.get("/ui/projects/apollo/timeline", params={param: "no-such-value"})
    assert shown(nothing.text) == [] and "matches these filters" in nothing.text


def test_filters_combine(console: TestClient, settings: Settings) -> None:
    first = apollo(settings)[0]
    expected = newest_first(
        settings, "apollo", lambda m: m.agent_id == first.agent_id and m.data["task_id"] == first.data["task_id"]
    )
    page = console.get("/ui/projects/apollo/timeline", params={"agent": first.agent_id, "task": first.data["task_id"]})
    assert first.id in expected and shown(page.text) == expected


def test_since_and_until_bound_the_minutes_time(
    console: TestClient, redis_client: redis.Redis, settings: Settings
) -> None:
    log_minutes(redis_client, settings, timed("carina", 10), index=False)
    url = "/ui/projects/carina/timeline"
    ids = [f"carina-{i:05d}" for i in range(10)]
    assert shown(console.get(url).text, "carina") == ids[::-1]
    # At or after since, before until; a time without an offset is UTC; an offset is kept.
    assert shown(console.get(url, params={"since": "2026-03-01 13:00"}).text, "carina") == ids[3:][::-1]
    assert shown(console.get(url, params={"until": "2026-03-01T15:00:00Z"}).text, "carina") == ids[:5][::-1]
    both = console.get(url, params={"since": "2026-03-01T14:00:00+01:00", "until": "2026-03-01 16:00"})
    assert shown(both.text, "carina") == ids[3:6][::-1]
    assert shown(console.get(url, params={"since": "2026-03-02"}).text, "carina") == []
    # An age counts back from now: these minutes are long past, the sample session's are from just now.
    assert shown(console.get(url, params={"since": "2h"}).text, "carina") == []
    assert shown(console.get(url, params={"until": "2h"}).text, "carina") == ids[::-1]
    assert len(shown(console.get("/ui/projects/apollo/timeline", params={"since": "3d"}).text)) == 80


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"since": "yesterday-ish"}, "since"),
        ({"until": "13:00 tomorrow"}, "until"),
        ({"since": "2026-03-02", "until": "2026-03-01"}, "until"),
        ({"n": "lots"}, "n"),
        ({"n": "0"}, "n"),
        ({"before": "x"}, "before"),
        ({"before": "-3"}, "before"),
    ],
)
def test_a_filter_that_is_no_value_is_a_400_page_naming_it(
    console: TestClient, params: dict[str, str], named: str
) -> None:
    page = console.get("/ui/projects/apollo/timeline", params=params)
    assert page.status_code == 400, page.text
    assert f"{named}: " in page.text and "Traceback" not in page.text


@pytest.mark.parametrize(("n", "params"), [(7, {}), (3, {"event_type": "message"}), (100, {})])
def test_the_older_link_goes_on_exactly_where_the_page_ended(
    console: TestClient, settings: Settings, n: int, params: dict[str, str]
) -> None:
    expected = newest_first(settings, "apollo", lambda m: all(getattr(m, k) == v for k, v in params.items()))
    seen: list[str] = []
    link: str | None = "/ui/projects/apollo/timeline"
    query = {**params, "n": str(n)}
    pages = 0
    while link is not None:
        page = console.get(link, params=query if pages == 0 else None)
        assert page.status_code == 200, page.text
        ids = shown(page.text)
        assert len(ids) <= n
        seen.extend(ids)
        link = older_link(page.text)
        pages += 1
        assert pages <= len(expected) + 1
        if link is not None:  # the pager keeps the filters and the page size
            assert all(f"{k}={v}" in link for k, v in query.items() if not (k == "n" and v == "100"))
    assert seen == expected  # no minute twice, none skipped
    full_pages = -(-len(expected) // n)
    assert pages in (full_pages, full_pages + 1)  # a last page that came out full links on to an empty one


def test_n_is_capped_and_the_page_says_so(console: TestClient, redis_client: redis.Redis, settings: Settings) -> None:
    log_minutes(redis_client, settings, timed("dorado", 1_200, step=timedelta(seconds=1)), index=False)
    page = console.get("/ui/projects/dorado/timeline", params={"n": "5000"})
    assert page.status_code == 200
    assert len(shown(page.text, "dorado")) == timeline.MAX_PAGE_MINUTES and "at most 1,000" in page.text
    assert older_link(page.text) == "/ui/projects/dorado/timeline?before=201&n=1000"
    rest = console.get("/ui/projects/dorado/timeline", params={"before": "201", "n": "1000"})
    assert shown(rest.text, "dorado") == [f"dorado-{i:05d}" for i in range(199, -1, -1)]
    assert older_link(rest.text) is None


def test_a_filter_that_matches_little_stops_reading_and_says_where(
    console: TestClient, redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    minutes = timed("dorado", 1_200, step=timedelta(seconds=1))
    minutes[100] = replace(minutes[100], agent_id="rare")  # seq 101: the one match, deep in the log
    log_minutes(redis_client, settings, minutes, index=False)
    monkeypatch.setattr(timeline, "SCAN_LIMIT", 500)
    page = console.get("/ui/projects/dorado/timeline", params={"agent": "rare"})
    assert shown(page.text, "dorado") == [] and "stopped after reading 500 minutes" in page.text
    link = older_link(page.text)
    assert link == "/ui/projects/dorado/timeline?before=701&agent=rare"
    on = console.get(link)
    assert (
        shown(on.text, "dorado") == [] and older_link(on.text) == "/ui/projects/dorado/timeline?before=201&agent=rare"
    )
    last = console.get("/ui/projects/dorado/timeline?before=201&agent=rare")
    assert shown(last.text, "dorado") == ["dorado-00100"]
    assert older_link(last.text) is None and "stopped after" not in last.text


def test_a_page_reads_the_log_only_back_from_its_cursor(console: TestClient, settings: Settings) -> None:
    log = LogReader(settings.log_dir)
    page = timeline.read_page(log.backward("apollo", before_seq=31), timeline.TimelineFilters(), 10)
    assert [r.seq for r in page.rows] == list(range(30, 20, -1)) and page.scanned == 10 and page.older == 21
    rest = timeline.read_page(log.backward("apollo", before_seq=11), timeline.TimelineFilters(), 10)
    assert [r.seq for r in rest.rows] == list(range(10, 0, -1)) and rest.older is None


# -- one minute -----------------------------------------------------------------------------------------------


def referred(settings: Settings) -> tuple[LogRecord, list[LogRecord]]:
    """An apollo minute that later minutes reference, and those minutes (oldest first)."""
    records = list(LogReader(settings.log_dir).history("apollo"))
    for record in records:
        later = [r for r in records if record.id in r.minute.context_references]
        if later and record.minute.context_references:
            return record, later
    raise AssertionError("the sample session references no minute")


def test_the_minute_page_shows_its_fields_and_references_both_ways(console: TestClient, settings: Settings) -> None:
    record, later = referred(settings)
    minute = record.minute
    page = console.get(f"/ui/projects/apollo/minutes/{minute.id}")
    assert page.status_code == 200, page.text
    text = page.text
    assert f"<code>{minute.id}</code>" in text and f"<dd>{record.seq}</dd>" in text
    assert f"<code>{minute.event_type}</code>" in text and html.escape(minute.memory_note or "") in text
    assert minute.timestamp in text and f"stream entry {record.stream_id}" in text
    assert "&#34;task_id&#34;: &#34;" + minute.data["task_id"] in text  # the data, as JSON
    references, referrers = text.split('id="referrers"', 1)
    assert shown(references.split('id="references"', 1)[1]) == list(minute.context_references)
    assert shown(referrers.split('id="pools"', 1)[0]) == [r.id for r in later]
    assert f"Among the {80 - record.seq} minutes after it" in text
    assert f'href="/ui/projects/apollo/timeline?before={record.seq + 1}"' in text


def test_a_reference_the_log_does_not_hold_says_so(
    console: TestClient, redis_client: redis.Redis, settings: Settings
) -> None:
    [lonely] = timed("carina", 1)
    lonely = replace(lonely, context_references=("carina-gone",))
    log_minutes(redis_client, settings, [lonely], index=False)
    page = console.get(f"/ui/projects/carina/minutes/{lonely.id}")
    assert "not in this project's log" in page.text and "<code>carina-gone</code>" in page.text


def test_the_referrers_are_looked_for_among_a_bounded_number_of_minutes(
    console: TestClient, redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    minutes = timed("dorado", 40)
    minutes[5] = replace(minutes[5], context_references=(minutes[0].id,))
    minutes[30] = replace(minutes[30], context_references=(minutes[0].id,))  # beyond the next 20
    log_minutes(redis_client, settings, minutes, index=False)
    monkeypatch.setattr(timeline, "REFERRER_SCAN", 20)
    page = console.get(f"/ui/projects/dorado/minutes/{minutes[0].id}")
    section = page.text.split('id="referrers"', 1)[1].split('id="pools"', 1)[0]
    assert shown(section, "dorado") == [minutes[5].id] and "Among the next 20 minutes" in section


def test_an_unknown_minute_is_a_404_page(console: TestClient, settings: Settings) -> None:
    page = console.get("/ui/projects/apollo/minutes/no-such-minute")
    assert page.status_code == 404 and "no minute no-such-minute in project apollo" in page.text
    # Another project's minute is not this project's.
    borealis = LogReader(settings.log_dir).get_recent("borealis", 1)[0]
    assert console.get(f"/ui/projects/apollo/minutes/{borealis.id}").status_code == 404


def test_the_minute_page_shows_its_point_in_the_vector_engine_or_that_it_has_none(
    console: TestClient, reader: ContextReader, redis_client: redis.Redis, settings: Settings
) -> None:
    record, _ = referred(settings)
    [point] = reader.searcher.engine.retrieve("apollo", [record.id])  # type: ignore[union-attr]
    page = console.get(f"/ui/projects/apollo/minutes/{record.id}")
    pools = page.text.split('id="pools"', 1)[1]
    assert f'<dt>Category</dt><dd><span class="tag">{point.payload["category"]}</span>' in pools
    assert f"composite <strong>{point.payload['scores']['composite']:.2f}</strong>" in pools
    log_minutes(redis_client, settings, timed("carina", 1), index=False)
    unindexed = console.get("/ui/projects/carina/minutes/carina-00000")
    assert "not indexed yet" in unindexed.text


def test_the_minute_page_shows_the_facts_it_gave_and_the_change_minute_its_fact(
    console: TestClient, redis_client: redis.Redis, settings: Settings
) -> None:
    source = apollo(settings)[20]
    fact = Fact.new(
        type=FactType.DECISION,
        text="the release ships on Thursdays",
        subject="release",
        attribute="ship day",
        value="thursday",
        tier_key=TierKey.for_project("apollo"),
        confidence=0.9,
        source_minute_ids=[source.id],
    )
    change = asserted_minute(fact, agent_id="facts-pool")
    log_minutes(redis_client, settings, [change], index=False)
    FactStore(redis_client).apply(change)
    page = console.get(f"/ui/projects/apollo/minutes/{source.id}")
    facts = page.text.split("<h3>Facts</h3>", 1)[1].split("<h3>Thread</h3>", 1)[0]
    assert f'href="/ui/projects/apollo/facts/{fact.id}">the release ships on Thursdays</a>' in facts
    assert "<code>fact_asserted</code>" in facts and f"minutes/{change.id}" in facts and "<td>yes</td>" in facts
    assert change.id in shown(page.text.split('id="referrers"', 1)[1])
    own = console.get(f"/ui/projects/apollo/minutes/{change.id}")
    assert f"/ui/projects/apollo/facts/{fact.id}" in own.text and "this one" in own.text
    assert "indexed as its fact" in own.text


def test_a_global_fact_shows_only_to_a_token_that_reaches_the_global_tier(
    console: TestClient, scoped_console: TestClient, redis_client: redis.Redis, settings: Settings
) -> None:
    fact = Fact.new(
        type=FactType.FACT,
        text="staging mirrors production nightly",
        subject="staging",
        attribute="refresh",
        value="nightly",
        tier_key=TierKey.for_project("apollo"),
        confidence=0.9,
        source_minute_ids=[apollo(settings)[3].id],
        status="promoted",
    )
    promoted = tier_promoted_minute(fact, agent_id="facts-pool")  # lives in apollo's log, changes a global fact
    changes = [asserted_minute(fact), promoted]
    log_minutes(redis_client, settings, changes, index=False)
    FactStore(redis_client).apply_changes([(m, fact_change(m)) for m in changes])
    path = f"/ui/projects/apollo/minutes/{promoted.id}"
    assert "staging mirrors production nightly</a>" in console.get(path).text  # no tokens: every tier
    sign_in(scoped_console, TEAM_A)
    page = scoped_console.get(path)
    assert page.status_code == 200 and "this token may not read that tier" in page.text
    assert "staging mirrors production nightly</a>" not in page.text


def test_the_minute_page_shows_the_chunk_and_episodes_of_its_thread(
    console: TestClient, redis_client: redis.Redis, settings: Settings
) -> None:
    page = console.get(f"/ui/projects/apollo/minutes/{apollo(settings)[0].id}")
    assert "the summarize pool has not seen it yet" in page.text
    history = list(LogReader(settings.log_dir).history("apollo"))
    ctx = replace(SummarizeContext.build(redis_client, settings), shape=ThreadShape(recent=2, chunk=3, max_chunks=25))
    summarize_batch(ctx, redis_client, [[r.minute.id, r.seq, encode_minute(r.minute), 0] for r in history])
    store = SummaryStore(redis_client)
    views = [store.thread_view("apollo", t, 0) for t in store.threads("apollo")]
    chunk = next(c for v in views for c in v.chunks)
    record = next(r for r in history if r.seq == chunk.seq_ranges[0][0])
    page = console.get(f"/ui/projects/apollo/minutes/{record.id}")
    thread = page.text.split("<h3>Thread</h3>", 1)[1]
    assert f"Chunk of seq {chunk.first_seq}\u2013{chunk.last_seq}" in thread and html.escape(chunk.summary) in thread
    assert f'/threads/{str(chunk.thread).replace(":", "%3A")}"' in thread
    episode = next(e for v in views for e in v.episodes)
    linked = console.get(f"/ui/projects/apollo/minutes/{episode.minute_ids[0]}")
    assert f"Episode: {html.escape(episode.title)}" in linked.text
    newest = next(r for r in reversed(history) if r.minute.thread_id == record.minute.thread_id)
    verbatim = console.get(f"/ui/projects/apollo/minutes/{newest.id}")
    assert "among the thread's newest minutes" in verbatim.text


# -- scope --------------------------------------------------------------------------------------------------


def test_a_token_for_one_project_cannot_open_anothers_timeline_or_minutes(
    scoped_console: TestClient, settings: Settings
) -> None:
    sign_in(scoped_console, TEAM_A)
    assert scoped_console.get("/ui/projects/apollo/timeline").status_code == 200
    borealis = LogReader(settings.log_dir).get_recent("borealis", 1)[0]
    for path in ("/ui/projects/borealis/timeline", f"/ui/projects/borealis/minutes/{borealis.id}"):
        refused = scoped_console.get(path)
        assert refused.status_code == 403 and "may not read project borealis" in refused.text
        assert borealis.id not in refused.text

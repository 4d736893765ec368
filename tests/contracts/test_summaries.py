"""Threads, chunks, episodes and the chunk_summarized minute: records that check themselves, a parser that refuses."""

from __future__ import annotations

from typing import Any

import pytest

from contracts import InvalidMinute, Minute, decode_minute, encode_minute, keys
from contracts.summaries import (
    SYSTEM_EVENT_TYPES,
    Chunk,
    ChunkSummarized,
    Episode,
    EpisodeKind,
    SummaryError,
    ThreadKind,
    ThreadRef,
    check_thread_sources,
    chunk_id,
    chunk_summarized,
    chunk_summarized_minute,
    thread_of,
)
from tests.workers.minutes import minute


def test_a_minute_belongs_to_its_thread_else_its_task_else_its_project() -> None:
    assert thread_of(minute("message", thread_id="deploy-42", data={"task_id": "T-1"})) == ThreadRef(
        ThreadKind.THREAD, "deploy-42"
    )
    assert str(thread_of(minute("message", data={"task_id": "T-1"}))) == "task:T-1"
    assert str(thread_of(minute("message"))) == "project"
    # configurable: tasks only, so a minute of no task is in no thread
    assert thread_of(minute("message", thread_id="x", data={"task_id": "T-1"}), ("task",)) == ThreadRef.parse(
        "task:T-1"
    )
    assert thread_of(minute("message"), ("task",)) is None
    # system minutes are in no thread
    assert thread_of(minute("chunk_summarized", thread_id="x")) is None
    assert thread_of(minute("fact_retracted", thread_id="x")) is None


def test_thread_names_parse_back_and_bare_ids_are_threads() -> None:
    for text in ("project", "task:T-1", "thread:deploy 42", "thread:task:odd"):
        assert str(ThreadRef.parse(text)) == text
    assert ThreadRef.parse("deploy-42") == ThreadRef(ThreadKind.THREAD, "deploy-42")
    assert ThreadRef.parse("thread:task:odd").name == "task:odd"
    for bad in ("", "  ", "task:", "thread:", None, 3):
        with pytest.raises(SummaryError) as err:
            ThreadRef.parse(bad)
        assert err.value.field == "thread"
    assert len({ThreadRef.parse(t).digest for t in ("a", "task:a", "project")}) == 3


def test_thread_sources_are_checked_naming_the_variable() -> None:
    assert check_thread_sources(["task", "project"]) == ("task", "project")
    for bad in ([], ["task", "task"], ["agent"]):
        with pytest.raises(ValueError, match="PVM_THREAD_BY"):
            check_thread_sources(bad)


def chunk(**fields: Any) -> Chunk:
    base: dict[str, Any] = {
        "project_id": "p1",
        "thread": ThreadRef.parse("task:T-1"),
        "seq_ranges": ((1, 12),),
        "minute_count": 10,
        "summary": "Chose Postgres for sessions.",
        "key_topics": ("postgres", "sessions"),
        "participants": ("a1",),
        "tokens": 300,
    }
    return Chunk(**(base | fields))


def test_a_chunk_round_trips_and_names_its_range() -> None:
    c = chunk(seq_ranges=((1, 12), (15, 30)), merged=2, minute_count=20, decisions=("Use Postgres.", "Ship Friday."))
    assert Chunk.from_dict(c.to_dict()) == c
    assert Chunk.from_dict({k: v for k, v in c.to_dict().items() if k != "decisions"}).decisions == ()
    assert (c.first_seq, c.last_seq) == (1, 30)
    assert c.id == chunk_id("p1", c.thread, 1, 30) != chunk_id("p1", c.thread, 1, 29)
    assert c.to_dict()["thread"] == "task:T-1"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"summary": ""}, "summary"),
        ({"summary": "x" * 2001}, "summary"),
        ({"seq_ranges": ()}, "seq_ranges"),
        ({"seq_ranges": ((5, 4),)}, "seq_ranges[0]"),
        ({"seq_ranges": ((1, 5), (5, 9))}, "seq_ranges[1]"),
        ({"seq_ranges": ((0, 5),)}, "seq_ranges[0][0]"),
        ({"key_topics": ("x" * 65,)}, "key_topics[0]"),
        ({"minute_count": 0}, "minute_count"),
        ({"project_id": "no/slash"}, "project_id"),
        ({"thread": ""}, "thread"),
        ({"decisions": ("",)}, "decisions[0]"),
        ({"decisions": ("Use it.",) * 33}, "decisions"),
        ({"decisions": ("x" * 301,)}, "decisions[0]"),
    ],
)
def test_a_chunk_refuses_what_breaks_its_rules_naming_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(SummaryError) as err:
        chunk(**fields)
    assert err.value.field == field


def episode(**fields: Any) -> Episode:
    base: dict[str, Any] = {
        "project_id": "p1",
        "thread": ThreadRef.parse("task:T-1"),
        "kinds": (EpisodeKind.PROBLEM_SOLVED, EpisodeKind.ISSUE_IDENTIFIED),
        "title": "Problem solved: T-1",
        "summary": "The deploy failed, then succeeded after the cache was cleared.",
        "minute_ids": ("m1", "m5"),
        "first_seq": 3,
        "last_seq": 9,
        "participants": ("a1", "a2"),
        "outcome": "completed",
        "significance": 0.8,
        "valence": 0.7,
    }
    return Episode(**(base | fields))


def test_an_episode_round_trips_and_keeps_its_id_as_it_grows() -> None:
    e = episode()
    assert Episode.from_dict(e.to_dict()) == e
    assert e.id == episode(minute_ids=("m1", "m5", "m9"), last_seq=12).id != episode(minute_ids=("m2",)).id


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"kinds": ()}, "kinds"),
        ({"kinds": ("party",)}, "kinds"),
        ({"significance": 1.5}, "significance"),
        ({"valence": -1.1}, "valence"),
        ({"valence": float("nan")}, "valence"),
        ({"minute_ids": ()}, "minute_ids"),
        ({"last_seq": 2}, "last_seq"),
        ({"title": ""}, "title"),
    ],
)
def test_an_episode_refuses_what_breaks_its_rules_naming_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(SummaryError) as err:
        episode(**fields)
    assert err.value.field == field


def summarized_minute(**data: Any) -> Minute:
    thread = ThreadRef.parse("task:T-1")
    made = chunk_summarized_minute(
        "p1",
        ChunkSummarized(thread, 1, 12, "The team chose Postgres.", ("postgres",), "decided", "test-chat"),
        minute_id="cs1",
        timestamp="2026-11-26T10:00:00.000Z",
        context_references=("m1", "m12"),
    )
    if not data:
        return made
    raw = made.to_dict()
    raw["data"] = {**raw["data"], **data}
    for key in [k for k, v in data.items() if v is ...]:
        del raw["data"][key]
    return Minute.from_dict(raw)


def test_a_chunk_summarized_minute_round_trips_through_the_codec_and_the_parser() -> None:
    made = summarized_minute()
    assert made.event_type == "chunk_summarized" and made.scope == "project" and made.thread_id is None
    parsed = chunk_summarized(decode_minute(encode_minute(made)))
    assert (str(parsed.thread), parsed.first_seq, parsed.last_seq, parsed.model) == ("task:T-1", 1, 12, "test-chat")
    assert parsed.chunk_id == chunk_id("p1", parsed.thread, 1, 12)
    assert "chunk_summarized" in SYSTEM_EVENT_TYPES and "fact_asserted" in SYSTEM_EVENT_TYPES


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"last_seq": 13}, "data.chunk_id"),  # a range that is not the chunk's it names: forged or mangled
        ({"chunk_id": "0" * 24}, "data.chunk_id"),
        ({"summary": ""}, "data.summary"),
        ({"first_seq": 0}, "data.first_seq"),
        ({"thread": "task:"}, "data.thread"),
        ({"key_topics": "postgres"}, "data.key_topics"),
        ({"extra": 1}, "data.extra"),
        ({"model": ...}, "data.model"),
    ],
)
def test_a_forged_or_broken_chunk_summarized_is_refused_naming_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidMinute) as err:
        chunk_summarized(summarized_minute(**data))
    assert err.value.field == field


def test_a_chunk_summarized_names_its_own_project_only() -> None:
    raw = summarized_minute().to_dict()
    raw["project_id"] = "p2"  # the same payload in another project's log names no chunk of p2
    with pytest.raises(InvalidMinute) as err:
        chunk_summarized(Minute.from_dict(raw))
    assert err.value.field == "data.chunk_id"
    raw = summarized_minute().to_dict() | {"scope": "task"}
    with pytest.raises(InvalidMinute) as err:
        chunk_summarized(Minute.from_dict(raw))
    assert err.value.field == "scope"


def test_summary_keys_share_the_project_hash_tag() -> None:
    digest = ThreadRef.parse("task:T-1").digest
    names = [
        keys.summary_threads("p1"),
        keys.thread_state("p1", digest),
        keys.thread_pending("p1", digest),
        keys.thread_bodies("p1", digest),
        keys.summary_dirty("p1"),
        keys.summary_lock("p1"),
        keys.summarize_head("p1"),
        keys.summarize_done("p1"),
    ]
    assert all("{p:p1}" in n for n in names) and len(set(names)) == len(names)
    assert keys.QUEUES["summarize"] == "pvm-summarize"
    assert keys.POOL_JOBS["summarize"] == keys.SUMMARIZE_JOB in keys.JOB_FUNCTIONS

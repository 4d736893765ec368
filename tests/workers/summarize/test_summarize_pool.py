"""The summarize pool: threads, chunks past the newest minutes, merges, episodes, the LLM path and replay."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from contracts import Minute, decode_minute, encode_minute, keys
from contracts.summaries import (
    ChunkSummarized,
    EpisodeKind,
    ThreadRef,
    chunk_id,
    chunk_summarized,
    chunk_summarized_minute,
)
from pvm.config import Settings
from pvm.llm import LLMClient
from pvm.stores.log import LogWriter
from pvm.stores.summaries import SummaryStore, ThreadView
from tests.openai_server import (
    OpenAIServer,
    delay,
    malformed_json,
    openai_server_fixture,  # noqa: F401  (the `openai_server` fixture)
    status,
)
from workers.summarize.episodes import OpenPatterns, add, observe
from workers.summarize.pool import SummarizeContext, replay_summaries, summarize_batch
from workers.summarize.summarizers import ExtractiveSummarizer, LLMSummarizer, Logged, chunk_tokens, decision_lines
from workers.summarize.threads import DEFAULT_SHAPE, ThreadShape, ThreadState, advance

T0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
THREAD = ThreadRef.parse("deploy-42")


def at(n: int) -> str:
    return (T0 + timedelta(seconds=n)).isoformat(timespec="microseconds").replace("+00:00", "Z")


def said(n: int, event_type: str = "message", note: str | None = None, **fields: Any) -> Minute:
    """Minute `n` of thread deploy-42 of project p1, by one of three agents."""
    fields.setdefault("thread_id", "deploy-42")
    fields.setdefault("agent_id", f"a{n % 3}")
    return Minute(
        project_id=fields.pop("project_id", "p1"),
        event_type=event_type,
        id=f"m{n:05d}",
        timestamp=at(n),
        memory_note=note if note is not None else f"Checked the rollout step {n} of the canary and the dashboards.",
        **fields,
    )


def conversation(count: int, first: int = 1) -> list[Minute]:
    """A thread that decides something every 7th minute, fails and fixes a task now and then, and talks."""
    out = []
    for n in range(first, first + count):
        if n % 7 == 0:
            out.append(said(n, "decision", f"Decided to pin the cache layer to version {n} for the canary."))
        elif n % 13 == 0:
            out.append(said(n, "task_failed", f"The migration {n} failed: lock timeout.", data={"task_id": f"T{n}"}))
        elif n % 13 == 1 and n > 13:
            task = f"T{n - 1}"
            out.append(said(n, "task_completed", "Retried with a longer lock wait.", data={"task_id": task}))
        else:
            out.append(said(n, note=f"Rollout note {n}: latency on shard {n % 5} looks fine, error rate flat."))
    return out


def logged(minutes: Sequence[Minute], first_seq: int = 1) -> list[Logged]:
    return [Logged(first_seq + i, m) for i, m in enumerate(minutes)]


def records(minutes: Sequence[Minute], first_seq: int = 1) -> list[list[object]]:
    return [[m.id, first_seq + i, encode_minute(m), 1_795_687_200_000] for i, m in enumerate(minutes)]


# -- the pure core ----------------------------------------------------------------------------------------------


def run_core(items: Sequence[Logged], heads: Sequence[int], shape: ThreadShape = DEFAULT_SHAPE) -> ThreadState:
    """Advance one thread as the pool would: minutes arrive (in any order), the head moves in steps."""
    state = ThreadState(THREAD)
    pending: list[Logged] = []
    for head in heads:
        pending = sorted([*pending, *(i for i in items if i.seq <= head and i not in pending)], key=lambda i: i.seq)
        done = advance("p1", state, pending, head, ExtractiveSummarizer(), shape)
        pending = [p for p in pending if p.minute.id not in set(done.chunked_ids)]
    return state


def test_the_newest_twenty_stay_verbatim_and_older_minutes_fall_into_chunks_of_ten() -> None:
    state = run_core(logged(conversation(75)), [75])
    assert [c.seq_ranges for c in state.chunks] == [((1, 10),), ((11, 20),), ((21, 30),), ((31, 40),), ((41, 50),)]
    assert state.chunked_seq == 50 and state.minutes == 75
    assert all(c.minute_count == 10 and c.summarizer == "extractive" for c in state.chunks)
    assert state.chunks[0].participants == ("a1", "a2", "a0")
    assert state.chunks[0].key_topics  # TF-IDF over the chunk


def test_chunk_boundaries_depend_on_the_log_alone_not_on_how_batches_arrived() -> None:
    items = logged(conversation(140))
    one_go = run_core(items, [140])
    steps = run_core(items, [3, 17, 29, 30, 31, 55, 90, 91, 139, 140])
    minute_by_minute = run_core(items, list(range(1, 141)))
    assert one_go.chunks == steps.chunks == minute_by_minute.chunks
    assert one_go.episodes == steps.episodes == minute_by_minute.episodes


def test_minutes_above_the_head_are_never_chunked() -> None:
    items = logged(conversation(60))
    state = ThreadState(THREAD)
    advance("p1", state, items, 35, ExtractiveSummarizer())  # seqs 36..60 arrived, 35 is the contiguous head
    assert [c.seq_ranges for c in state.chunks] == [((1, 10),)] and state.final_seq == 35


def test_past_max_chunks_the_oldest_merge_keeping_their_seq_ranges() -> None:
    shape = ThreadShape(recent=4, chunk=2, max_chunks=3)
    state = run_core(logged(conversation(14)), [14], shape)  # 10 chunked -> 5 chunks -> 3
    assert len(state.chunks) == 3
    oldest = state.chunks[0]
    assert oldest.seq_ranges == ((1, 2), (3, 4), (5, 6)) and oldest.merged == 3 and oldest.minute_count == 6
    assert oldest.summary.startswith("Earlier: ") and " Then: " in oldest.summary
    assert [c.seq_ranges for c in state.chunks[1:]] == [((7, 8),), ((9, 10),)]
    assert oldest.tokens == sum(chunk_tokens(logged(conversation(2, first)[:2], first)) for first in (1, 3, 5))
    merged = run_core(logged(conversation(14)), [14], ThreadShape(recent=4, chunk=2, max_chunks=2)).chunks[0]
    assert merged.merged == 4 and merged.decisions == ("Decided to pin the cache layer to version 7 for the canary.",)


def test_a_chunk_names_what_its_decision_minutes_decided_whoever_summarized_it() -> None:
    state = run_core(logged(conversation(50)), [50])
    assert [c.decisions for c in state.chunks] == [
        ("Decided to pin the cache layer to version 7 for the canary.",),
        ("Decided to pin the cache layer to version 14 for the canary.",),
        (
            "Decided to pin the cache layer to version 21 for the canary.",
            "Decided to pin the cache layer to version 28 for the canary.",
        ),
    ]
    long = said(3, "decision", "Decided to " + " ".join(["move"] * 40) + ". Then more.")
    (line,) = decision_lines([Logged(3, long)])
    assert line.endswith(" …") and len(line.split()) == 25  # the first sentence, cut to 24 words


def test_merging_stays_bounded_however_often_it_happens() -> None:
    shape = ThreadShape(recent=2, chunk=1, max_chunks=2)
    state = run_core(logged(conversation(400)), [400], shape)
    assert len(state.chunks) == 2 and len(state.chunks[0].summary) <= 2_000
    assert state.chunks[0].first_seq == 1 and len(state.chunks[0].seq_ranges) <= 64


def test_the_extractive_summary_keeps_decisions_and_is_a_fifth_of_its_chunk_or_less() -> None:
    chunk = logged(conversation(10, first=1))
    text = ExtractiveSummarizer().summarize("p1", THREAD, chunk)
    assert "Decided to pin the cache layer to version 7" in text.summary
    assert len(text.summary) / 4 <= 0.2 * text.tokens
    assert text == ExtractiveSummarizer().summarize("p1", THREAD, chunk)  # deterministic


def test_a_chunk_with_no_text_still_says_what_happened() -> None:
    quiet = [Logged(i, Minute(project_id="p1", event_type="handoff", id=f"q{i}", timestamp=at(i))) for i in range(1, 4)]
    assert ExtractiveSummarizer().summarize("p1", THREAD, quiet).summary == "3 minutes: 3 handoff"


def test_a_failure_then_completion_is_one_problem_solved_episode() -> None:
    state = OpenPatterns()
    episodes: list[Any] = []
    minutes = [
        said(1, "task_failed", "Deploy failed: the health check timed out.", data={"task_id": "T-9"}),
        said(2, note="Looking at the health check."),
        said(3, "task_failed", "Deploy failed again.", data={"task_id": "T-9"}),
        said(
            4, "task_completed", "Raised the health check timeout.", data={"task_id": "T-9", "success_criteria_met": 95}
        ),
    ]
    for item in logged(minutes):
        for e in observe("p1", THREAD, item, state):
            episodes = add(episodes, e)
    (story,) = episodes  # the failures, the fix and the completion share minutes: one episode
    assert story.kinds[0] is EpisodeKind.BREAKTHROUGH  # success >= 80 after two failures: the most significant
    assert set(story.kinds) == {
        EpisodeKind.BREAKTHROUGH,
        EpisodeKind.PROBLEM_SOLVED,
        EpisodeKind.ISSUE_IDENTIFIED,
        EpisodeKind.TASK_COMPLETED,
    }
    assert story.minute_ids == ("m00001", "m00003", "m00004") and (story.first_seq, story.last_seq) == (1, 4)
    assert story.significance == 0.9 and -1 <= story.valence <= 1 and story.outcome == "T-9 completed (95%)"
    assert "T-9 failed" not in state.failures


def test_a_decision_superseding_another_is_a_pivot_and_unrelated_decisions_stay_apart() -> None:
    state = OpenPatterns()
    episodes: list[Any] = []
    minutes = [
        said(1, "decision", "Use Redis for the session store.", data={"topic": "session store"}),
        said(2, "decision", "Ship on Friday."),
        said(3, "decision", "Use Postgres for the session store.", data={"topic": "Session store"}),
        said(4, "decision", "Roll back to Redis.", context_references=("m00003",)),
    ]
    for item in logged(minutes):
        for e in observe("p1", THREAD, item, state):
            episodes = add(episodes, e)
    assert len(episodes) == 2
    pivots, friday = episodes
    assert friday.kinds == (EpisodeKind.DECISION_MADE,) and friday.minute_ids == ("m00002",)
    assert pivots.kinds == (EpisodeKind.PIVOT, EpisodeKind.DECISION_MADE)
    assert pivots.minute_ids == ("m00001", "m00003", "m00004") and pivots.title.startswith("Pivot: ")


def test_a_minute_that_says_breakthrough_is_one() -> None:
    made = observe(
        "p1", THREAD, Logged(5, said(5, note="Breakthrough: the flaky test was a clock skew.")), OpenPatterns()
    )
    assert [e.kinds for e in made] == [(EpisodeKind.BREAKTHROUGH,)]


# -- through Redis --------------------------------------------------------------------------------------------


@pytest.fixture
def ctx(redis_client: redis.Redis, settings: Settings) -> SummarizeContext:
    return SummarizeContext.build(redis_client, settings)


def view(connection: redis.Redis, thread: ThreadRef = THREAD) -> ThreadView:
    return SummaryStore(connection).thread_view("p1", thread, 20)


def test_batches_in_any_order_give_the_chunks_replay_gives(
    ctx: SummarizeContext, redis_client: redis.Redis, settings: Settings
) -> None:
    minutes = conversation(130)
    other = [said(200 + i, project_id="p1", thread_id=None, data={"task_id": "T-x"}) for i in range(3)]
    # the log, as the log pool wrote it: the thread, then three minutes of task T-x
    LogWriter(settings.log_dir).append_many(
        {"p1": [(m.id, f"{i}-0", encode_minute(m)) for i, m in enumerate([*minutes, *other])]}
    )
    batches = [records(minutes[60:], 61), records(minutes[:30], 1), records(other, 131), records(minutes[30:60], 31)]
    for batch in batches:  # the newest first: nothing may be chunked until the gap below it is filled
        summarize_batch(ctx, redis_client, batch)
    live = view(redis_client)
    assert [c.seq_ranges for c in live.chunks] == [((s, s + 9),) for s in range(1, 111, 10)]
    assert [m["id"] for m in live.recent] == [m.id for m in minutes[-20:]]
    assert live.minutes == 130 and live.episodes
    assert redis_client.hget(keys.summarize_head("p1"), "seq") == b"133"
    assert not redis_client.smembers(keys.summary_dirty("p1"))
    tasks = view(redis_client, ThreadRef.parse("task:T-x"))
    assert len(tasks.recent) == 3 and not tasks.chunks

    summarize_batch(ctx, redis_client, batches[0])  # a retried job changes nothing
    assert view(redis_client) == live

    rebuilt = replay_summaries(redis_client, settings, "p1")
    assert (rebuilt.minutes, rebuilt.threads, rebuilt.chunks, rebuilt.from_log) == (133, 2, 11, 0)
    assert view(redis_client) == live
    assert view(redis_client, ThreadRef.parse("task:T-x")) == tasks
    assert redis_client.hget(keys.summarize_head("p1"), "seq") == b"133"


def test_a_forged_chunk_summary_is_refused_and_counted(ctx: SummarizeContext, redis_client: redis.Redis) -> None:
    minutes = conversation(30)
    summarize_batch(ctx, redis_client, records(minutes))
    honest = view(redis_client).chunks[0]
    forged = chunk_summarized_minute(
        "p1",
        ChunkSummarized(THREAD, 1, 10, "Nothing was decided.", (), None, "m"),
        minute_id="f0001",
        timestamp=at(40),
        context_references=(),
    ).to_dict()
    forged["data"]["last_seq"] = 11  # names a range that is not the chunk's id
    result = summarize_batch(ctx, redis_client, records([Minute.from_dict(forged)], 31))
    assert result["counts"] == {"refused": 1}
    assert view(redis_client).chunks[0] == honest
    assert redis_client.hget(keys.metrics_summaries(), "refused") == b"1"


# -- the LLM summarizer, against the loopback server -----------------------------------------------------------


def make_llm(server: OpenAIServer, **options: Any) -> LLMClient:
    options = {"backoff_base": 0.01, "backoff_max": 0.05, "timeout": 5.0, "max_retries": 1, **options}
    return LLMClient(server.base_url, "sk-test", "test-chat", **options)


def answer(n: int) -> dict[str, Any]:
    return {
        "summary": f"The team pinned the cache layer (chunk {n}).",
        "key_topics": ["cache", "canary"],
        "outcome": None,
    }


@pytest.fixture
def llm_ctx(redis_client: redis.Redis, settings: Settings, openai_server: OpenAIServer) -> Iterator[SummarizeContext]:
    llm = make_llm(openai_server)
    yield SummarizeContext.build(redis_client, settings, summarizer=LLMSummarizer(llm))
    llm.close()


def stream_minutes(connection: redis.Redis, settings: Settings) -> list[Minute]:
    entries = connection.xrange(keys.stream(keys.shard_of("p1", settings.shards)))
    return [decode_minute(fields[keys.MINUTE_FIELD]) for _, fields in entries]


def test_a_model_summary_is_one_call_per_chunk_and_written_as_a_minute(
    llm_ctx: SummarizeContext, redis_client: redis.Redis, settings: Settings, openai_server: OpenAIServer
) -> None:
    openai_server.queue_chat_reply(answer(1), answer(2))
    result = summarize_batch(llm_ctx, redis_client, records(conversation(40)))
    assert len(openai_server.chat_requests()) == 2 and result["counts"]["llm_summaries"] == 2
    chunks = view(redis_client).chunks
    assert [c.summary for c in chunks] == [answer(1)["summary"], answer(2)["summary"]]
    assert chunks[0].summarizer == "llm:test-chat" and chunks[0].key_topics == ("cache", "canary")
    written = stream_minutes(redis_client, settings)
    assert [m.event_type for m in written] == ["chunk_summarized"] * 2
    parsed = [chunk_summarized(m) for m in written]
    assert [(p.first_seq, p.last_seq) for p in parsed] == [(1, 10), (11, 20)]
    assert parsed[0].chunk_id == chunks[0].id == chunk_id("p1", THREAD, 1, 10)
    prompt = next(m["content"] for m in openai_server.chat_requests()[0].messages if m["role"] == "user")
    assert "M10 " in prompt and "M11 " not in prompt and "Decided to pin the cache layer to version 7" in prompt


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(lambda s: s.fail_next(delay(2.0), times=2), id="timeout"),
        pytest.param(lambda s: s.fail_next(status(500), times=2), id="500"),
        pytest.param(lambda s: s.fail_next(malformed_json(), times=3), id="malformed-json"),
        pytest.param(lambda s: s.queue_chat_reply("not json at all", "still {not json"), id="rejected-after-repair"),
    ],
)
def test_a_failing_model_leaves_the_chunk_to_the_extractive_summarizer(
    fault: Any, redis_client: redis.Redis, settings: Settings, openai_server: OpenAIServer
) -> None:
    llm = make_llm(openai_server, timeout=0.5, max_retries=1)
    summarizer = LLMSummarizer(llm)
    ctx = SummarizeContext.build(redis_client, settings, summarizer=summarizer)
    fault(openai_server)
    result = summarize_batch(ctx, redis_client, records(conversation(30)))
    assert result["counts"]["llm_fallbacks"] == 1 and result["counts"]["llm_summaries"] == 0
    assert redis_client.hget(keys.metrics_summaries(), "llm_fallbacks") == b"1"
    (chunk,) = view(redis_client).chunks
    assert chunk.summarizer == "extractive"
    assert chunk.summary == ExtractiveSummarizer().summarize("p1", THREAD, logged(conversation(10))).summary
    assert stream_minutes(redis_client, settings) == []  # nothing a model said: nothing to log
    assert sum(summarizer.counts[k] for k in ("rejected", "unavailable", "error")) == 1
    llm.close()


def test_a_malformed_answer_is_repaired_once_and_kept(
    llm_ctx: SummarizeContext, redis_client: redis.Redis, openai_server: OpenAIServer
) -> None:
    openai_server.queue_chat_reply('{"summary": "half', answer(1))
    summarize_batch(llm_ctx, redis_client, records(conversation(30)))
    assert view(redis_client).chunks[0].summary == answer(1)["summary"]
    assert len(openai_server.chat_requests()) == 2


def test_replay_takes_model_summaries_from_the_log_and_calls_no_model(
    llm_ctx: SummarizeContext, redis_client: redis.Redis, settings: Settings, openai_server: OpenAIServer
) -> None:
    minutes = conversation(50)
    openai_server.queue_chat_reply(answer(1), answer(2))
    # the third chunk: the server echoes the prompt, twice not JSON: rejected, the extractive summary takes it
    summarize_batch(llm_ctx, redis_client, records(minutes))
    written = stream_minutes(redis_client, settings)
    assert len(written) == 2
    log = [*minutes, *written]  # the log pool appends the summaries after the minutes they summarize
    LogWriter(settings.log_dir).append_many({"p1": [(m.id, f"{i}-0", encode_minute(m)) for i, m in enumerate(log)]})
    summarize_batch(llm_ctx, redis_client, records(written, 51))  # they come back through the fan-out
    live = view(redis_client)
    assert [c.summarizer for c in live.chunks] == ["llm:test-chat", "llm:test-chat", "extractive"]
    calls = len(openai_server.chat_requests())

    class Counting(ExtractiveSummarizer):
        def __init__(self) -> None:
            super().__init__()
            self.firsts: list[int] = []

        def summarize(self, project_id: str, thread: ThreadRef, minutes: Sequence[Logged]) -> Any:
            self.firsts.append(minutes[0].seq)
            return super().summarize(project_id, thread, minutes)

    counting = Counting()
    rebuilt = replay_summaries(redis_client, settings, "p1", summarizer=counting)
    assert (rebuilt.from_log, rebuilt.chunks) == (2, 3)
    assert counting.firsts == [21]  # only the chunk no model summarized; the others come from the log
    assert view(redis_client) == live
    assert len(openai_server.chat_requests()) == calls  # no request during replay


# -- the pool as deployed: `pvm worker summarize`, the log pool's fan-out, `pvm replay` ---------------------------


@pytest.fixture
def pool_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """The workers' environment with the default PVM_DOWNSTREAM (the log pool fans out to the summarize pool)."""

    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PVM_DOWNSTREAM", raising=False)
    yield settings


def test_pvm_worker_summarize_serves_its_queue_and_records_its_stage_freshness_and_counters(
    redis_client: redis.Redis, pool_env: Settings
) -> None:
    from workers.ops.cli import main
    from workers.ops.exporter import snapshot
    from workers.runtime.queues import pool_queue

    job = pool_queue("summarize", redis_client).enqueue(keys.SUMMARIZE_JOB, records(conversation(40)))
    assert job.origin == keys.SUMMARIZE_QUEUE == "pvm-summarize"
    assert main(["worker", "summarize", "--burst"]) == 0
    assert job.get_status(refresh=True) == "finished", job.latest_result()
    assert [c.seq_ranges for c in view(redis_client).chunks] == [((1, 10),), ((11, 20),)]
    snap = snapshot(redis_client, pool_env)
    assert snap.stages["summarize"]["minutes"] == 40 and snap.stages["summarize"]["batches"] == 1
    assert snap.freshness["summarize"]["count"] == 40  # every minute reached the stage once
    counted = job.return_value()["counts"]
    assert snap.summaries == {name: counted.get(name, 0) for name in keys.SUMMARY_COUNTERS}
    assert snap.summaries["chunks"] == 2 and snap.summaries["episodes"] >= len(view(redis_client).episodes) > 0


def pipeline_rounds(connection: redis.Redis, settings: Settings, rounds: int = 3) -> None:
    """Dispatcher -> log pool -> summarize pool, again, until the chunk_summarized minutes came back through the log."""
    from workers.ingest.dispatcher import Dispatcher
    from workers.runtime.queues import pool_queue
    from workers.runtime.runner import PvmWorker

    dispatcher = Dispatcher(connection, settings, consumer="t", block_ms=10)
    dispatcher.ensure_groups()
    for _ in range(rounds):
        dispatcher.poll_once()
        dispatcher.flush_gathered()
        PvmWorker([pool_queue(p, connection) for p in ("log", "summarize")], connection).work(burst=True)


@pytest.mark.slow
def test_pvm_replay_rebuilds_equal_chunks_and_episodes_and_never_calls_the_model(
    redis_client: redis.Redis,
    pool_env: Settings,
    openai_server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pvm.stores.log import LogReader
    from workers.ops.cli import main

    with_model = pool_env.with_(
        summarizer="llm", llm_model="test-chat", llm_base_url=openai_server.base_url, llm_api_key="sk-test"
    )
    for k, v in with_model.to_env().items():
        monkeypatch.setenv(k, v)
    minutes = conversation(70)  # 50 minutes past the newest 20: five chunks
    openai_server.queue_chat_reply(*(answer(n) for n in range(1, 6)))
    stream = keys.stream(keys.shard_of("p1", with_model.shards))
    for m in minutes:
        redis_client.xadd(stream, {keys.MINUTE_FIELD: encode_minute(m)})
    pipeline_rounds(redis_client, with_model)

    logged = [r.minute for r in LogReader(with_model.log_dir).history("p1")]
    assert [m.id for m in logged[:70]] == [m.id for m in minutes]
    assert [m.event_type for m in logged[70:]] == ["chunk_summarized"] * 5  # the model's words are in the log
    live = view(redis_client)
    assert [c.summarizer for c in live.chunks] == ["llm:test-chat"] * 5 and live.episodes
    assert [c.summary for c in live.chunks] == [answer(n)["summary"] for n in range(1, 6)]
    calls = len(openai_server.chat_requests())
    assert calls == 5

    SummaryStore(redis_client).reset_project("p1")  # what replay rebuilds from: the log alone
    assert view(redis_client).chunks == ()
    assert main(["replay", "--project", "p1", "--no-wait"]) == 0
    assert "75 minutes of 1 project(s) queued for rebuilding" in capsys.readouterr().out
    assert view(redis_client) == live
    assert len(openai_server.chat_requests()) == calls  # replay asked the model nothing
    assert redis_client.hget(keys.summarize_head("p1"), "seq") == b"75"


def test_project_stats_count_every_threads_chunks_and_episodes(
    ctx: SummarizeContext, redis_client: redis.Redis
) -> None:
    from workers.api.stats import project_stats

    assert (project_stats(redis_client, "p1")["chunks"], project_stats(redis_client, "p1")["episodes"]) == (0, 0)
    minutes = conversation(130)
    other = [said(200 + i, project_id="p1", thread_id="side", data={"task_id": "T-x"}) for i in range(45)]
    summarize_batch(ctx, redis_client, records([*minutes, *other], 1))
    threads = [view(redis_client), view(redis_client, ThreadRef.parse("side"))]
    chunks, episodes = sum(len(t.chunks) for t in threads), sum(len(t.episodes) for t in threads)
    assert chunks == 11 + 2 and episodes >= 1
    stats = project_stats(redis_client, "p1")
    assert (stats["chunks"], stats["episodes"]) == (chunks, episodes)

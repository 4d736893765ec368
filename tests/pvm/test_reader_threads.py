"""A context built for a thread: its newest minutes verbatim, then its chunk summaries and episodes, in the split."""

from __future__ import annotations

import math

import pytest
import redis

from contracts.memory import ContextPackage, minute_line
from contracts.summaries import chunk_line, episode_line
from pvm.config import Settings
from pvm.reader import ContextReader, line_cost
from pvm.stores.log import LogReader
from tests.memory_helpers import round_trips
from tests.workers.summarize.test_summarize_pool import conversation, records
from workers.summarize.pool import SummarizeContext, summarize_batch


@pytest.fixture
def reader(redis_client: redis.Redis, settings: Settings) -> ContextReader:
    summarize_batch(SummarizeContext.build(redis_client, settings), redis_client, records(conversation(250)))
    return ContextReader(redis_client, LogReader(settings.log_dir))


def test_a_thread_context_is_its_recent_minutes_then_summaries_newest_first_then_episodes(
    reader: ContextReader,
) -> None:
    pkg = reader.build_context("p1", "a1", budget_tokens=100_000, thread="deploy-42")
    assert pkg.thread == "thread:deploy-42"
    assert [m["id"] for m in pkg.recent] == [f"m{n:05d}" for n in range(231, 251)]  # the thread's newest 20
    assert [(c["first_seq"], c["last_seq"]) for c in pkg.summaries] == [(s, s + 9) for s in range(221, 0, -10)]
    assert pkg.episodes and pkg.episodes[0]["significance"] >= pkg.episodes[-1]["significance"]
    assert not pkg.budget.cut
    text = pkg.render()
    assert "## Recent activity in thread thread:deploy-42" in text
    assert text.index("## Episodes of this thread") < text.index("## Earlier in this thread")
    assert ContextPackage.from_dict(pkg.to_dict()) == pkg


def cost(lines: list[str]) -> int:
    return sum(line_cost(line) for line in lines)


def test_the_budget_splits_recent_sixty_retrieved_forty_and_says_what_each_section_cut(reader: ContextReader) -> None:
    budget = 2_000
    pkg = reader.build_context("p1", "a1", budget_tokens=budget, thread="deploy-42")
    report = pkg.budget
    assert report.used_tokens <= budget
    recent, summaries, episodes = (report.sections[s] for s in ("recent", "summaries", "episodes"))
    assert recent == cost([minute_line(m) for m in pkg.recent]) <= math.floor(budget * 0.6)
    assert summaries == cost([chunk_line(c) for c in pkg.summaries])
    assert episodes == cost([episode_line(e) for e in pkg.episodes])
    # summaries take the retrieved share and what the recent minutes left of theirs; episodes what summaries left
    assert summaries + episodes <= math.floor(budget * 0.4) + math.floor(budget * 0.6) - recent
    # every chunk is in (in full, or by its decisions), or counted as cut
    assert report.cut.get("summaries", 0) + len(pkg.summaries) == 23
    assert report.cut.get("episodes", 0) + len(pkg.episodes) > 0
    newest_first = [c["last_seq"] for c in pkg.summaries]
    assert newest_first == sorted(newest_first, reverse=True) and newest_first[0] == 230


def test_the_split_is_configurable(redis_client: redis.Redis, settings: Settings, reader: ContextReader) -> None:
    narrow = ContextReader(redis_client, LogReader(settings.log_dir), recent_share=0.2, retrieved_share=0.8)
    pkg = narrow.build_context("p1", "a1", budget_tokens=2_000, thread="deploy-42")
    assert pkg.budget.sections["recent"] <= 400 and pkg.budget.cut["recent"] > 0
    default = reader.build_context("p1", "a1", budget_tokens=2_000, thread="deploy-42")
    in_full = [len([c for c in p.summaries if not c.get("compact")]) for p in (pkg, default)]
    assert in_full[0] > in_full[1] and pkg.budget.sections["summaries"] > default.budget.sections["summaries"]
    with pytest.raises(ValueError, match="recent_share"):
        ContextReader(redis_client, LogReader(settings.log_dir), recent_share=1.5)


def test_a_thread_context_is_still_two_round_trips(reader: ContextReader, monkeypatch: pytest.MonkeyPatch) -> None:
    reader.build_context("p1", "a1", thread="deploy-42")  # loads the scripts
    trips = round_trips(monkeypatch)
    pkg = reader.build_context("p1", "a1", thread="deploy-42")
    assert pkg.summaries and trips == [b"EVALSHA"]  # the scripts' pipeline; no search, so nothing counted


def test_without_a_thread_the_context_is_as_before(reader: ContextReader) -> None:
    pkg = reader.build_context("p1", "a1", budget_tokens=100_000)
    assert pkg.thread is None and pkg.summaries == () and pkg.episodes == ()
    assert "summaries" not in pkg.budget.sections


def test_a_thread_name_that_names_none_is_refused_naming_thread(reader: ContextReader) -> None:
    with pytest.raises(ValueError, match="thread"):
        reader.build_context("p1", "a1", thread="task:")
    unknown = reader.build_context("p1", "a1", thread="never-seen")
    assert unknown.recent == () and unknown.summaries == ()


def test_a_250_minute_thread_in_2000_tokens_names_every_decision_older_chunks_by_their_decisions(
    reader: ContextReader,
) -> None:
    import re

    from tests.workers.summarize.test_summarize_pool import conversation

    decided = [m.memory_note for m in conversation(250) if m.event_type == "decision"]
    assert len(decided) == 35
    pkg = reader.build_context("p1", "a1", budget_tokens=2_000, thread="deploy-42")
    text = pkg.render()
    assert pkg.budget.used_tokens <= 2_000
    missing = [d for d in decided if not re.search(re.escape(str(d)), text)]
    assert missing == []
    full = [c for c in pkg.summaries if not c.get("compact")]
    compact = [c for c in pkg.summaries if c.get("compact")]
    assert full and compact  # the newest chunks in full, the older ones by their decisions
    assert max(c["last_seq"] for c in compact) < min(c["first_seq"] for c in full)
    assert all(c["decisions"] for c in compact) and "decided: " in chunk_line(compact[0])
    # a chunk is in full, by its decisions, or counted as cut (it had none)
    assert len(full) + len(compact) + pkg.budget.cut.get("summaries", 0) == 23
    # with room for everything, every chunk is in full
    roomy = reader.build_context("p1", "a1", budget_tokens=100_000, thread="deploy-42")
    assert len(roomy.summaries) == 23 and not any(c.get("compact") for c in roomy.summaries)


def test_a_thread_context_keeps_what_we_know_and_splits_what_it_leaves(
    redis_client: redis.Redis, reader: ContextReader
) -> None:
    from pvm.stores.facts import FactStore
    from tests.pvm.test_context_facts import known, put

    put(FactStore(redis_client), *(known(f"the deploy uses blue-green slot {i}") for i in range(6)))
    plain = reader.build_context("p1", "a1", budget_tokens=1_200)
    threaded = reader.build_context("p1", "a1", budget_tokens=1_200, thread="deploy-42")
    assert len(plain.facts) == 6 and threaded.facts == plain.facts  # the thread does not starve what we know
    report = threaded.budget
    left = 1_200 - report.sections["agent_memory"] - report.sections["rules"] - report.sections["facts"]
    assert 0 < report.sections["recent"] <= math.floor(left * 0.6)
    assert report.sections["summaries"] > 0 and report.used_tokens <= 1_200


def test_a_story_told_three_times_is_one_episode_line_the_most_significant_newest() -> None:
    from contracts.summaries import Episode, EpisodeKind
    from pvm.reader import distinct_episodes

    def told(seq: int, title: str, significance: float = 0.6) -> Episode:
        return Episode(
            project_id="p1",
            thread="deploy-42",
            kinds=(EpisodeKind.DECISION_MADE,),
            title=title,
            summary=title,
            minute_ids=(f"m{seq}",),
            first_seq=seq,
            last_seq=seq,
            significance=significance,
        )

    same = [told(3, "Decision: use Redis"), told(9, "decision: use Redis"), told(5, "Decision: use Redis")]
    other = told(7, "Decision: use Postgres", 0.9)
    shown = distinct_episodes([*same, other])
    assert [(e.title, e.last_seq) for e in shown] == [("Decision: use Postgres", 7), ("decision: use Redis", 9)]

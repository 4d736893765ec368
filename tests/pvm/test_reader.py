from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from contracts import Minute, keys
from contracts.memory import ContextPackage, SearchFilters, agent_lines, hit_line
from pvm import engines
from pvm.config import Settings
from pvm.embedders import EmbeddingConfigError
from pvm.reader import ContextReader, ReaderError, SearchUnavailable, diverse, estimate_tokens, windowed
from pvm.stores.log import LogReader
from pvm.vectors import ShardLockedError
from pvm.vectors.edge import EdgeEngine
from tests.memory_helpers import log_minutes, round_trips, use_settings
from tests.openai_server import OpenAIServer, delay, status
from workers.ops.demo import sample_session


@pytest.fixture
def reader(redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[ContextReader]:
    use_settings(settings, monkeypatch)
    yield ContextReader(redis_client, LogReader(settings.log_dir), engines.searcher_for(settings))  # type: ignore[arg-type]
    engines.close_shared()


def test_the_context_holds_every_section(reader: ContextReader, redis_client: redis.Redis, settings: Settings) -> None:
    minutes = list(sample_session("apollo", 120, seed=3))
    log_minutes(redis_client, settings, minutes)
    pkg = reader.build_context("apollo", "coder", task="fix the login bug", budget_tokens=100_000)
    assert [m["id"] for m in pkg.recent] == [m.id for m in minutes[-50:]]
    refs = {r for m in pkg.recent for r in m["context_references"]} - {m["id"] for m in pkg.recent}
    assert {m["id"] for m in pkg.referenced} == refs
    assert pkg.agent_memory.agent_id == "coder" and pkg.agent_memory.tasks_assigned > 0
    assert 0 < len(pkg.relevant_experience) <= 5
    assert any("login" in (h.minute.get("memory_note") or "") for h in pkg.relevant_experience)
    assert pkg.freshness["index"]["behind"] == 0 and pkg.freshness["durable"]["seq"] == 120
    assert pkg.full_log_available
    assert pkg.budget.used_tokens <= pkg.budget.budget_tokens and not pkg.budget.cut
    text = pkg.render()
    assert "## Your track record" in text and "## Relevant past experience" in text
    assert ContextPackage.from_dict(pkg.to_dict()) == pkg
    # returned memories get their access counted
    counted = redis_client.hgetall(keys.access_counts("apollo"))
    assert {k.decode() for k in counted} >= {h.minute_id for h in pkg.relevant_experience}


def test_references_missing_from_the_cache_come_from_the_log(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings
) -> None:
    settings = settings.with_(minute_cache_size=60, recent_window=60)
    old = Minute(project_id="p", event_type="decision", memory_note="the original decision")
    rest = [Minute(project_id="p", event_type="message", memory_note=f"n{i}") for i in range(200)]
    rest[-1] = Minute(
        project_id="p", event_type="message", memory_note="see the decision", context_references=(old.id,)
    )
    log_minutes(redis_client, settings, [old, *rest], index=False)
    assert redis_client.hget(keys.minute_by_id("p"), old.id) is None  # evicted from the cache
    pkg = reader.build_context("p", "a1")
    assert [m["memory_note"] for m in pkg.referenced] == ["the original decision"]


@pytest.mark.parametrize("ordinary", [5, 80])  # fewer than the context's 50 (the log is read too), and more
def test_recent_activity_leaves_out_knowledge_changes(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings, ordinary: int
) -> None:
    from contracts.fact_changes import learned_minute
    from contracts.facts import TierKey

    minutes: list[Minute] = []
    for i in range(ordinary):
        minutes.append(Minute(project_id="p", event_type="message", agent_id="a1", memory_note=f"n{i}"))
        if i % 2:
            minutes.append(learned_minute(f"key {i}", "v", TierKey.for_project("p"), agent_id="a1"))
    log_minutes(redis_client, settings, minutes, index=False)
    assert LogReader(settings.log_dir).count("p") == len(minutes)
    pkg = reader.build_context("p", "a1", budget_tokens=100_000)
    said = [m for m in minutes if m.event_type == "message"]
    assert [m["id"] for m in pkg.recent] == [m.id for m in said[-50:]]
    assert [m["id"] for m in reader.get_recent("p", 50)] == [m.id for m in said[-50:]]


@pytest.mark.parametrize("budget", [1, 40, 200, 800, 3000])
def test_the_budget_is_never_exceeded(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings, budget: int
) -> None:
    log_minutes(redis_client, settings, list(sample_session("apollo", 150, seed=5)))
    pkg = reader.build_context("apollo", "tester", task="migrate the database", budget_tokens=budget)
    assert pkg.budget.used_tokens <= budget
    assert sum(pkg.budget.sections.values()) == pkg.budget.used_tokens
    kept = len(pkg.recent) + len(pkg.referenced) + len(pkg.relevant_experience)
    if budget < 3000:
        assert pkg.budget.cut, "a small budget must report what it left out"
    assert kept <= 50 + 5 + 200
    assert estimate_tokens("x" * 40) == 10


def test_freshness_shows_how_far_the_index_is_behind(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings
) -> None:
    first = list(sample_session("apollo", 30, seed=1))
    later = [Minute(project_id="apollo", event_type="message", memory_note=f"late {i}") for i in range(7)]
    log_minutes(redis_client, settings, first)
    log_minutes(redis_client, settings, later, index=False)
    fresh = reader.freshness("apollo")
    assert fresh["durable"]["seq"] == 37 and fresh["index"]["seq"] == 30 and fresh["index"]["behind"] == 7
    assert reader.build_context("apollo", "coder").recent[-1]["memory_note"] == "late 6"  # read-your-writes


def test_the_scripts_sent_before_the_search_survive_a_flush_a_failed_search_and_a_lost_connection(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The context's first pipeline is sent before its search and read after it (Redis answers while the search
    # runs); whatever happens in between, every context answers as the first did and no reply is read out of turn.
    log_minutes(redis_client, settings, list(sample_session("apollo", 120, seed=3)))

    def context() -> tuple[object, ...]:
        pkg = reader.build_context("apollo", "coder", task="fix the login bug", budget_tokens=100_000)
        assert pkg.freshness["durable"]["seq"] == 120
        return pkg.recent, [h.minute for h in pkg.relevant_experience], pkg.agent_memory  # scores age with the clock

    first = context()
    redis_client.script_flush()  # the scripts sent are gone: loaded again, and the pipeline sent again
    assert context() == first
    searcher = reader.searcher
    assert searcher is not None
    search = searcher.search_result

    class Stop(BaseException):  # not an Exception: the context does not turn it into a failed search
        pass

    def stopped(*args: object, **kwargs: object) -> object:
        raise Stop

    monkeypatch.setattr(searcher, "search_result", stopped)
    with pytest.raises(Stop):
        reader.build_context("apollo", "coder", task="fix the login bug")
    monkeypatch.setattr(searcher, "search_result", search)
    assert context() == first  # the replies left unread went with their connection

    pool = redis_client.connection_pool

    def cut_off(*args: object, **kwargs: object) -> object:
        (sent_on,) = pool._in_use_connections  # type: ignore[attr-defined]
        sent_on.disconnect()  # the connection is lost with the replies on it
        return search(*args, **kwargs)

    monkeypatch.setattr(searcher, "search_result", cut_off)
    assert context() == first  # read again the plain way
    assert not pool._in_use_connections  # type: ignore[attr-defined]  # every connection given back


def test_a_context_that_fails_after_asking_for_its_referenced_minutes_gives_every_connection_back(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The referenced minutes are asked for before the sections ahead of them are built, and read after: a failure in
    # between (here the counters cannot be sent) closes the connection that holds the unread reply.
    log_minutes(redis_client, settings, list(sample_session("apollo", 120, seed=3)))
    first = reader.build_context("apollo", "coder", task="fix the login bug", budget_tokens=100_000)
    assert first.referenced

    def down(commands: object) -> None:
        raise redis.ConnectionError("the server went away")

    monkeypatch.setattr(reader._unanswered, "send", down)
    with pytest.raises(redis.ConnectionError):
        reader.build_context("apollo", "coder", task="fix the login bug", budget_tokens=100_000)
    assert not redis_client.connection_pool._in_use_connections  # type: ignore[attr-defined]
    monkeypatch.undo()
    again = reader.build_context("apollo", "coder", task="fix the login bug", budget_tokens=100_000)
    assert again.referenced == first.referenced


def test_access_is_counted_for_the_experience_that_fits(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings
) -> None:
    log_minutes(redis_client, settings, list(sample_session("apollo", 120, seed=3)))
    whole = reader.build_context("apollo", "coder", task="fix the login bug", budget_tokens=100_000)
    assert len(whole.relevant_experience) >= 2
    first = whole.relevant_experience[0]
    budget = estimate_tokens("\n".join(agent_lines(whole.agent_memory))) + 1 + estimate_tokens(hit_line(first)) + 1
    redis_client.delete(keys.access_counts("apollo"))
    pkg = reader.build_context("apollo", "coder", task="fix the login bug", budget_tokens=budget)
    assert [h.minute_id for h in pkg.relevant_experience] == [first.minute_id]
    assert redis_client.hgetall(keys.access_counts("apollo")) == {first.minute_id.encode(): b"1"}
    assert pkg.budget.cut["relevant_experience"] == len(whole.relevant_experience) - 1


def test_a_provider_outage_degrades_the_context_instead_of_stalling_it(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, openai_server: OpenAIServer
) -> None:
    settings = settings.with_(
        embed_model="test-embed",
        openai_base_url=openai_server.base_url,
        openai_api_key="test-key",
        embed_dimensions=32,
        embed_query_timeout_s=0.3,
    )
    use_settings(settings, monkeypatch)
    log_minutes(redis_client, settings, list(sample_session("apollo", 120, seed=3)))  # indexed with dense vectors
    reader = ContextReader(redis_client, LogReader(settings.log_dir), engines.searcher_for(settings))  # type: ignore[arg-type]
    try:
        healthy = reader.build_context("apollo", "coder", task="fix the login bug", budget_tokens=100_000)
        assert "degraded" not in healthy.freshness["index"]
        assert any("semantic" in h.parts for h in healthy.relevant_experience)
        assert "(note:" not in healthy.render()

        openai_server.fail_next(delay(30), times=100)  # the provider hangs
        sent = len(openai_server.requests)
        pkg = reader.build_context("apollo", "coder", task="fix the login bug", budget_tokens=100_000)
        assert len(openai_server.requests) == sent + 1  # one query request, no retries
        assert pkg.relevant_experience and all("semantic" not in h.parts for h in pkg.relevant_experience)
        degraded = pkg.freshness["index"]["degraded"]
        assert degraded.startswith("dense leg skipped: query embedding failed") and "timed out after 0.3s" in degraded
        assert "error" not in pkg.freshness["index"]  # degraded, not failed
        assert ContextPackage.from_dict(pkg.to_dict()) == pkg
        text = pkg.render()
        assert "keywords only: the embedding provider is unavailable" in text
        assert openai_server.base_url not in text and "timed out" not in text

        # The breaker is open: neither contexts nor searches wait on the provider during the cool-down.
        again = reader.build_context("apollo", "coder", task="fix the login bug", budget_tokens=100_000)
        result = reader.search_result("apollo", "login bug", SearchFilters(), 5)
        assert len(openai_server.requests) == sent + 1
        assert again.freshness["index"]["degraded"].startswith("dense leg skipped: ")
        assert result.hits and result.degraded and "next try in" in result.degraded
        assert [h.minute_id for h in reader.search("apollo", "login bug")] == [h.minute_id for h in result.hits]
    finally:
        engines.close_shared()


def test_a_failed_search_is_noted_in_the_prompt_text(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings
) -> None:
    log_minutes(redis_client, settings, list(sample_session("apollo", 60, seed=3)))
    engines.close_shared()  # the searcher's engine is closed under it: every search fails
    pkg = reader.build_context("apollo", "coder", task="fix the login bug", budget_tokens=100_000)
    assert pkg.recent and not pkg.relevant_experience
    assert pkg.freshness["index"]["error"].startswith("VectorStoreError")
    text = pkg.render()
    assert "relevant past experience is missing: search is unavailable" in text
    assert str(settings.home) not in text and "VectorStoreError" not in text


def dense_settings(settings: Settings, server: OpenAIServer) -> Settings:
    """An embedder on the test server, with no PVM_EMBED_DIMENSIONS: the length is learned."""
    return settings.with_(
        embed_model="test-embed",
        openai_base_url=server.base_url,
        openai_api_key="test-key",
        embed_dimensions=None,
        embed_max_retries=5,
        embed_timeout_s=30.0,
        embed_query_timeout_s=0.3,
    )


def test_a_reader_over_a_dense_store_starts_while_the_provider_is_down(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch, openai_server: OpenAIServer
) -> None:
    settings = dense_settings(settings, openai_server)
    use_settings(settings, monkeypatch)
    log_minutes(redis_client, settings, list(sample_session("apollo", 60, seed=3)))  # dense vectors of length 64
    engines.close_shared()  # the process restarts ...
    openai_server.fail_next(status(503), times=100)  # ... during a provider outage
    sent = len(openai_server.requests)
    try:
        reader = ContextReader(redis_client, LogReader(settings.log_dir), engines.searcher_for(settings))  # type: ignore[arg-type]
        assert len(openai_server.requests) == sent  # no probe: the shards hold the length
        assert engines.shared_engine(settings).dense_dimensions == 64  # type: ignore[attr-defined]
        pkg = reader.build_context("apollo", "coder", task="fix the login bug", budget_tokens=100_000)
        assert len(openai_server.requests) == sent + 1  # the query's one try
        assert pkg.relevant_experience and pkg.freshness["index"]["degraded"]
    finally:
        engines.close_shared()


def test_a_new_store_with_the_provider_down_fails_at_once_naming_the_setting(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, openai_server: OpenAIServer
) -> None:
    settings = dense_settings(settings, openai_server)
    use_settings(settings, monkeypatch)
    openai_server.fail_next(delay(30), times=100)  # the provider hangs
    try:
        with pytest.raises(EmbeddingConfigError, match="set PVM_EMBED_DIMENSIONS") as caught:
            engines.searcher_for(settings)
        assert len(openai_server.requests) == 1 and caught.value.attempts == 1  # no batch retries
        assert "PVM_EMBED_QUERY_TIMEOUT" in str(caught.value)

        openai_server.reset()  # the provider is back: the next start learns the length with one request
        engines.searcher_for(settings)
        assert len(openai_server.requests) == 1
        assert engines.shared_engine(settings).dense_dimensions == 64  # type: ignore[attr-defined]
    finally:
        engines.close_shared()


def test_a_project_without_a_log_has_an_empty_context(reader: ContextReader) -> None:
    pkg = reader.build_context("nobody-here", "a1", task="anything")
    assert (pkg.recent, pkg.referenced, pkg.relevant_experience) == ((), (), ())
    assert not pkg.full_log_available and pkg.freshness["durable"]["seq"] == 0
    assert pkg.agent_memory.tasks_assigned == 0


def test_reads_without_a_project_fail_closed(reader: ContextReader) -> None:
    for call in (
        lambda: reader.build_context("", "a"),
        lambda: reader.build_context(None, "a"),  # type: ignore[arg-type]
        lambda: reader.search("", "anything"),
        lambda: reader.get_recent("", 5),
        lambda: reader.get_by_ids("", ["x"]),
    ):
        with pytest.raises(ValueError, match="project_id"):
            call()
    with pytest.raises(ValueError, match="agent_id"):
        reader.build_context("p", "")


project_names = st.sampled_from(["alpha", "beta", "gamma", "delta", "epsilon"])
words = st.sampled_from(["login", "deploy", "cache", "conflict", "failed", "database", "release", "review"])


@hsettings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    layout=st.lists(st.tuples(project_names, st.lists(words, min_size=1, max_size=4)), min_size=2, max_size=25),
    asked=project_names,
    query=st.lists(words, min_size=1, max_size=3),
)
def test_no_read_ever_returns_another_projects_minutes(
    reader: ContextReader,
    redis_client: redis.Redis,
    settings: Settings,
    layout: list[tuple[str, list[str]]],
    asked: str,
    query: list[str],
) -> None:
    redis_client.flushdb()
    import shutil

    shutil.rmtree(settings.log_dir, ignore_errors=True)
    for p in {p for p, _ in layout}:
        engines.shared_engine(settings).delete_project(p)
    minutes = [Minute(project_id=p, event_type="message", agent_id="a1", memory_note=" ".join(w)) for p, w in layout]
    log_minutes(redis_client, settings, minutes)
    foreign = [m.id for m in minutes if m.project_id != asked]
    text = " ".join(query)
    pkg = reader.build_context(asked, "a1", task=text, budget_tokens=50_000)
    seen = [m["project_id"] for m in (*pkg.recent, *pkg.referenced)]
    seen += [h.minute["project_id"] for h in pkg.relevant_experience]
    seen += [h.minute["project_id"] for h in reader.search(asked, text, SearchFilters(), 10)]
    seen += [m["project_id"] for m in reader.get_recent(asked, 50)]
    assert reader.get_by_ids(asked, foreign) == []
    assert set(seen) <= {asked}


def test_relevant_experience_does_not_repeat_one_note(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings
) -> None:
    # Four agents log the same finding; two other minutes say different things about the same bug.
    echoes = [
        Minute(
            project_id="apollo",
            event_type="message",
            agent_id=agent,
            data={"task_id": "fix-login-bug"},
            memory_note=f"{agent} on fix-login-bug: session cookie expires after 5 minutes instead of 8 hours",
        )
        for agent in ("planner", "reviewer", "tester", "coder")
    ]
    distinct = [
        Minute(
            project_id="apollo",
            event_type="decision",
            data={"task_id": "fix-login-bug"},
            memory_note="the login session cookie is refreshed by the gateway, not the auth service",
        ),
        Minute(
            project_id="apollo",
            event_type="task_failed",
            data={"task_id": "fix-login-bug", "success_criteria_met": 10},
            memory_note="the login fix broke single sign-on for the admin console",
        ),
    ]
    log_minutes(redis_client, settings, [*echoes, *distinct])
    pkg = reader.build_context("apollo", "coder", task="login session cookie expires", budget_tokens=100_000)
    notes = [h.minute["memory_note"] for h in pkg.relevant_experience]
    assert len([n for n in notes if "expires after 5 minutes" in n]) == 1, notes
    assert {m.memory_note for m in distinct} <= set(notes), notes
    # The search itself still finds every echo: only the context leaves the repeats out.
    found = reader.search("apollo", "session cookie expires after 5 minutes", k=10)
    assert len([h for h in found if "expires after 5 minutes" in h.minute["memory_note"]]) == 4


def test_the_context_reads_the_points_of_the_experience_it_keeps_only(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    minutes = list(sample_session("apollo", 120, seed=3))
    log_minutes(redis_client, settings, minutes)
    engine = reader.searcher.engine  # type: ignore[union-attr]
    retrieved: list[list[str]] = []
    retrieve = engine.retrieve

    def recording(project_id: str, minute_ids: Sequence[str]) -> Any:
        retrieved.append(list(minute_ids))
        return retrieve(project_id, minute_ids)

    monkeypatch.setattr(engine, "retrieve", recording)
    pkg = reader.build_context("apollo", "coder", task="fix the login bug", budget_tokens=100_000)
    kept = pkg.relevant_experience
    assert 0 < len(kept) <= 5 and retrieved == [[h.minute_id for h in kept]]
    # The same experience, whole, as keeping distinct notes among the search's whole hits.
    found = reader.searcher.search_result("apollo", "fix the login bug", SearchFilters(), 15).hits  # type: ignore[union-attr]
    same = diverse([h for h in found if windowed(h.minute)], 5)
    assert [(h.minute_id, h.minute, h.category, h.insights, h.scores) for h in kept] == [
        (h.minute_id, h.minute, h.category, h.insights, h.scores) for h in same
    ]
    assert all(h.category for h in kept)


def test_relevant_experience_leaves_out_knowledge_changes(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings
) -> None:
    """The index makes no minute point of a change it can apply; one it cannot parse stays a plain minute point
    (and an index built before that rule holds them all): the context leaves those out all the same."""
    said = Minute(project_id="p", event_type="knowledge", memory_note="the login cookie ttl is 8 hours")
    broken = Minute(
        project_id="p",
        event_type="fact_promoted",
        data={"fact_id": "not-an-id"},
        memory_note="promoted: login cookie ttl = 8 hours",
    )
    log_minutes(redis_client, settings, [said, broken])
    assert {h.minute_id for h in reader.search("p", "login cookie ttl")} == {said.id, broken.id}  # both indexed
    pkg = reader.build_context("p", "a1", task="login cookie ttl", budget_tokens=100_000)
    assert [h.minute_id for h in pkg.relevant_experience] == [said.id]


def test_a_second_context_reads_remembered_minutes_as_the_first_and_callers_get_copies(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings
) -> None:
    minutes = list(sample_session("apollo", 80, seed=5))
    log_minutes(redis_client, settings, minutes)
    first = reader.build_context("apollo", "coder", task="fix the login bug", budget_tokens=100_000)
    first.recent[0]["memory_note"] = "changed by a caller"  # a caller's copy: the reader's memo keeps its own
    second = reader.build_context("apollo", "coder", task="fix the login bug", budget_tokens=100_000)
    fresh = ContextReader(redis_client, LogReader(settings.log_dir), reader.searcher)
    third = fresh.build_context("apollo", "coder", task="fix the login bug", budget_tokens=100_000)
    assert second.recent[0]["memory_note"] == minutes[-50].memory_note != "changed by a caller"
    assert second.render() == third.render()
    assert [m["id"] for m in second.recent] == [m.id for m in minutes[-50:]]


def test_a_minute_id_another_project_also_used_is_costed_by_this_projects_minute(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings
) -> None:
    # Minute ids are unique within a project, not across projects: the reader's memo of prompt lines must not
    # cost beta's minute by alpha's line of the same id (a long note against a short one).
    alpha = Minute(project_id="alpha", event_type="message", agent_id="coder", memory_note="long " * 200)
    beta = Minute(id=alpha.id, project_id="beta", event_type="message", agent_id="coder", memory_note="short")
    log_minutes(redis_client, settings, [alpha, beta], index=False)
    redis_client.delete(keys.recent_window("beta"), keys.minute_by_id("beta"))  # beta's minute comes from the log
    reader.build_context("alpha", "coder")
    costed = reader.build_context("beta", "coder").budget
    fresh = ContextReader(redis_client, LogReader(settings.log_dir), reader.searcher)
    assert costed == fresh.build_context("beta", "coder").budget
    assert costed.sections["recent"] < 100  # alpha's note alone is ~250 tokens


def _clients(connection: redis.Redis) -> int:
    return len(connection.client_list())


def test_a_reader_from_settings_reads_then_releases_its_connection_and_engine(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_settings(settings, monkeypatch)
    minutes = list(sample_session("apollo", 30, seed=5))
    log_minutes(redis_client, settings, minutes)
    engines.close_shared()  # log_minutes indexed through this process's engine: from_settings opens its own
    before = _clients(redis_client)
    with ContextReader.from_settings(settings, search=True) as reader:
        assert [m["id"] for m in reader.get_recent("apollo", 5)] == [m.id for m in minutes[-5:]]
        assert reader.search("apollo", "login bug", k=3)
        assert _clients(redis_client) == before + 1
        with pytest.raises(ShardLockedError):
            EdgeEngine(settings.vector_dir)  # the reader holds the embedded engine while it is open
    assert _clients(redis_client) == before
    EdgeEngine(settings.vector_dir).close()  # released: another owner can open it

    with ContextReader.from_settings(settings) as lexical_only:  # no PVM_QDRANT_URL: no search, no engine held
        assert lexical_only.searcher is None and len(lexical_only.get_recent("apollo", 3)) == 3
        with pytest.raises(SearchUnavailable, match="from_settings"):
            lexical_only.search("apollo", "login bug")
        with pytest.raises(ReaderError, match="project_id is required"):
            lexical_only.get_recent("")
    lexical_only.close()  # closing twice is harmless


def test_a_reader_given_its_connection_leaves_it_open(redis_client: redis.Redis, settings: Settings) -> None:
    with ContextReader(redis_client, LogReader(settings.log_dir)) as reader:
        reader.get_recent("apollo")
    assert redis_client.ping()


def test_search_hits_carry_the_whole_minute_from_the_cache_or_the_log(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings
) -> None:
    # The index pool's points hold what search filters and ranks on; the minute comes from Redis or the log.
    minutes = list(sample_session("apollo", 80, seed=5))
    log_minutes(redis_client, settings, minutes)
    by_id = {m.id: m.to_dict() for m in minutes}
    hits = reader.search("apollo", "login bug", k=5)
    assert hits and all(h.minute == by_id[h.minute_id] for h in hits)
    redis_client.delete(keys.minute_by_id("apollo"))  # the cache lost them: the log still has every minute
    again = reader.search("apollo", "login bug", k=5)
    assert [h.minute_id for h in again] == [h.minute_id for h in hits]
    assert all(h.minute == by_id[h.minute_id] for h in again)
    alone = engines.searcher_for(settings).search("apollo", "login bug", SearchFilters(), 5)  # type: ignore[attr-defined]
    assert [h.minute for h in alone] == [h.minute for h in hits]


def test_minutes_asked_read_as_minutes_by_id_reads_them(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings
) -> None:
    # `DurableMinutes.ask` sends the cache's HMGET now; `read` answers what `minutes_by_id` would, for every id asked,
    # some of them, none, or one not asked (read the plain way), and leaves no connection out of the pool.
    minutes = list(sample_session("apollo", 30, seed=2))
    log_minutes(redis_client, settings, minutes)
    ids = [m.id for m in minutes[:6]]
    redis_client.hdel(keys.minute_by_id("apollo"), ids[0], ids[1])  # two only in the log
    whole = reader.minutes.minutes_by_id("apollo", [*ids, "nobody"])
    assert set(whole) == set(ids)
    assert reader.minutes.ask("apollo", [*ids, "nobody"]).read() == whole
    assert reader.minutes.ask("apollo", ids).read(ids[:3]) == {i: whole[i] for i in ids[:3]}
    assert reader.minutes.ask("apollo", ids).read(()) == {}
    unasked = minutes[10].id
    assert reader.minutes.ask("apollo", ids[:2]).read([ids[0], unasked]) == reader.minutes.minutes_by_id(
        "apollo", [ids[0], unasked]
    )
    asked = reader.minutes.ask("apollo", ids)
    assert asked.read() == asked.read() == {i: whole[i] for i in ids}  # a second read, the plain way
    reader.minutes.ask("apollo", ids).drop()
    assert not redis_client.connection_pool._in_use_connections  # type: ignore[attr-defined]


def test_minutes_the_log_has_indexed_are_read_there_and_only_the_rest_are_asked_of_the_cache(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    minutes = list(sample_session("apollo", 30, seed=2))
    log_minutes(redis_client, settings, minutes, index=False)
    by_id = {m.id: m.to_dict() for m in minutes}
    ids = [m.id for m in minutes[:6]]
    trips = round_trips(monkeypatch)
    assert reader.minutes.minutes_by_id("apollo", ids) == {i: by_id[i] for i in ids}
    assert trips == [b"HMGET"]  # the log not indexed yet: all from the cache
    redis_client.hdel(keys.minute_by_id("apollo"), ids[0])
    assert reader.minutes.minutes_by_id("apollo", ids[:2])[ids[0]] == by_id[ids[0]]  # the log indexed for it
    trips.clear()
    assert reader.minutes.minutes_by_id("apollo", ids) == {i: by_id[i] for i in ids}
    assert reader.minutes.ask("apollo", ids).read() == {i: by_id[i] for i in ids}
    assert reader.get_by_ids("apollo", ids[::-1]) == [by_id[i] for i in ids[::-1]]
    assert trips == []  # every one from the log: no round trip
    later = list(sample_session("apollo", 3, seed=9))
    log_minutes(redis_client, settings, later, index=False)
    fresh = later[0].id
    sent: list[list[bytes]] = []
    hmget = redis.Redis.hmget

    def recorded(self: redis.Redis, name: Any, fields: Any, *args: Any) -> Any:
        sent.append(list(fields))
        return hmget(self, name, fields, *args)

    monkeypatch.setattr(redis.Redis, "hmget", recorded)
    assert reader.minutes.minutes_by_id("apollo", [ids[1], fresh]) == {ids[1]: by_id[ids[1]], fresh: later[0].to_dict()}
    assert sent == [[fresh]]  # written since the log was indexed: the cache answers for it alone
    asked = reader.minutes.ask("apollo", [fresh, ids[2]])
    assert trips[-1:] == [b"HMGET"] and asked.read() == {fresh: later[0].to_dict(), ids[2]: by_id[ids[2]]}
    assert not redis_client.connection_pool._in_use_connections  # type: ignore[attr-defined]


def test_search_asks_for_its_winners_minutes_before_reading_their_points_whatever_happens_in_between(
    reader: ContextReader, redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The winners' minutes are asked of the cache (one HMGET sent) before the engine reads the winners' points,
    # and the reply is read after: Redis answers meanwhile. A lost connection, a failed read of the points or an
    # error reply in between leave no reply unread and no connection out of the pool.
    log_minutes(redis_client, settings, list(sample_session("apollo", 80, seed=5)))
    first = [(h.minute_id, h.minute) for h in reader.search("apollo", "login bug", k=5)]
    assert first
    searcher = reader.searcher
    assert searcher is not None
    retrieve = searcher.engine.retrieve
    pool = searcher.minutes.cache.connection.connection_pool  # type: ignore[attr-defined]
    trips = round_trips(monkeypatch)
    asked_first: list[bool] = []

    def watched(*args: Any, **kwargs: Any) -> Any:
        asked_first.append(trips[-1:] == [b"HMGET"])
        return retrieve(*args, **kwargs)

    monkeypatch.setattr(searcher.engine, "retrieve", watched)
    assert [(h.minute_id, h.minute) for h in reader.search("apollo", "login bug", k=5)] == first
    assert asked_first == [True] and trips.count(b"HMGET") == 1  # and read once

    def cut_off(*args: Any, **kwargs: Any) -> Any:
        (sent_on,) = pool._in_use_connections  # type: ignore[attr-defined]
        sent_on.disconnect()  # lost with the reply on it
        return retrieve(*args, **kwargs)

    monkeypatch.setattr(searcher.engine, "retrieve", cut_off)
    assert [(h.minute_id, h.minute) for h in reader.search("apollo", "login bug", k=5)] == first  # the plain way
    assert not pool._in_use_connections  # type: ignore[attr-defined]

    class Stop(BaseException):
        pass

    def stopped(*args: Any, **kwargs: Any) -> Any:
        raise Stop

    monkeypatch.setattr(searcher.engine, "retrieve", stopped)
    with pytest.raises(Stop):
        reader.search("apollo", "login bug", k=5)
    assert not pool._in_use_connections  # type: ignore[attr-defined]
    monkeypatch.setattr(searcher.engine, "retrieve", retrieve)
    redis_client.delete(keys.minute_by_id("apollo"))
    redis_client.set(keys.minute_by_id("apollo"), b"not a hash")  # the cache answers an error: it raises, as before
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        reader.search("apollo", "login bug", k=5)
    assert not pool._in_use_connections  # type: ignore[attr-defined]
    redis_client.delete(keys.minute_by_id("apollo"))
    assert [(h.minute_id, h.minute) for h in reader.search("apollo", "login bug", k=5)] == first  # from the log

"""The LLM extractor, through the real openai client, against the loopback OpenAI-compatible server.

Answers are scripted; what is checked is what PVM does with them: which
minutes it sends and how (chunks, projects, small refs), how it reads an
answer back (refs, slots, dates, the contract), and when it falls back to
the rules.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import redis

from contracts import keys
from contracts.fact_changes import asserted_minute
from contracts.facts import Fact, TierKey
from pvm.config import Settings
from pvm.connection import hash_reply
from pvm.llm import LLMClient
from pvm.metrics import MetricsRecorder
from pvm.stores.facts import FactStore
from tests.openai_server import (
    OpenAIServer,
    openai_server_fixture,  # noqa: F401  (the `openai_server` fixture)
    status,
)
from tests.workers.minutes import minute
from workers.facts.extraction import RuleExtractor
from workers.facts.extraction_llm import (
    FACTS_SCHEMA,
    LLMExtractor,
    llm_extractor_from_settings,
)
from workers.ops.exporter import PvmCollector

NEXT_DAY = "2026-11-27T09:30:00.000000Z"  # the day after T0 (Thursday 2026-11-26 10:00 UTC)
T0_UTC = "2026-11-26T10:00:00.000000Z"


def make_llm(server: OpenAIServer, **options: Any) -> LLMClient:
    options = {"backoff_base": 0.01, "backoff_max": 0.05, "timeout": 5.0, **options}
    return LLMClient(server.base_url, "sk-test", "test-chat", **options)


def item(refs: list[int], **fields: Any) -> dict[str, Any]:
    """One answer item: the billing service's database, unless `fields` say otherwise."""
    base: dict[str, Any] = {
        "type": "fact",
        "subject": "billing service",
        "attribute": "database",
        "value": "Postgres",
        "text": "The billing service's database is Postgres.",
        "confidence": 0.8,
        "minute_refs": refs,
    }
    return base | fields


def prompt(server: OpenAIServer, n: int = 0) -> str:
    """The user message of chat request `n`: the chunk as the model saw it."""
    messages = server.chat_requests()[n].messages
    return str(next(m["content"] for m in messages if m["role"] == "user"))


def minute_lines(text: str) -> list[str]:
    return re.findall(r"^M(\d+) ", text, re.M)


def counters(client: redis.Redis, key: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in hash_reply(client.hgetall(key)).items()}


def known_fact(value: str = "Postgres", project: str = "p1", **fields: Any) -> Fact:
    options: dict[str, Any] = {
        "type": "decision",
        "text": f"The billing service's database is {value}.",
        "subject": "billing service",
        "attribute": "database",
        "value": value,
        "tier_key": TierKey.for_project(project),
        "confidence": 0.9,
        "source_minute_ids": ("id09999",),
        "valid_from": "2026-11-20T00:00:00.000000Z",
        "recorded_at": "2026-11-20T00:00:00.000000Z",
    }
    return Fact.new(**(options | fields))


# -- a good answer ---------------------------------------------------------------------------------


def test_a_good_answer_gives_candidates_with_their_slots_sources_and_grounded_dates(
    openai_server: OpenAIServer,
) -> None:
    minutes = [
        minute("decision", 0, memory_note="We moved the billing service to CockroachDB."),
        minute(
            "message", 1, memory_note="Starting tomorrow the auth service keeps sessions for 8h.", timestamp=NEXT_DAY
        ),
        minute("message", 2, memory_note="Acme, the payment provider, is also called AcmePay."),
    ]
    openai_server.queue_chat_reply(
        {
            "facts": [
                item(
                    [1],
                    type="decision",
                    subject="The Billing Service",
                    attribute="DB",
                    value="CockroachDB",
                    text="The billing service moved to CockroachDB.",
                    confidence=0.99,
                ),
                item(
                    [2],
                    subject="auth service",
                    attribute="session TTL",
                    value="8h",
                    valid_from="tomorrow",
                    text="The auth service keeps sessions for 8 hours.",
                ),
                item(
                    [3, 3], type="entity", subject="Acme", attribute="alias", value="AcmePay", text="Acme aka AcmePay."
                ),
            ]
        }
    )
    extractor = LLMExtractor(make_llm(openai_server))

    found = extractor.extract(minutes)

    assert [(c.type, c.subject, c.attribute, c.value, c.source_minute_ids) for c in found] == [
        ("decision", "billing service", "database", "CockroachDB", ("id00000",)),
        ("fact", "auth service", "session_ttl", "8 hours", ("id00001",)),
        ("entity", "acme", "alias", "AcmePay", ("id00002",)),
    ]
    decision, ttl, alias = found
    assert decision.confidence == 0.85  # 0.99 capped: a model's own confidence is not calibrated
    assert decision.valid_from == T0_UTC  # no date stated: the stating minute's time
    assert ttl.valid_from == "2026-11-28T00:00:00.000000Z"  # "tomorrow" of its own minute (the 27th), not of T0
    assert ttl.single_valued and not alias.single_valued
    assert all(c.rule == "llm" and c.project_id == "p1" and c.tier == "project" for c in found)
    requests = openai_server.chat_requests()
    assert len(requests) == 1
    assert requests[0].response_format is not None
    assert requests[0].response_format["json_schema"]["name"] == "facts"
    text = prompt(openai_server)
    assert minute_lines(text) == ["1", "2", "3"]
    assert "We moved the billing service to CockroachDB." in text and NEXT_DAY in text
    assert "id00000" not in text  # minutes are M1..Mn to the model, never their ids
    assert extractor.stats.answered == 1 and extractor.stats.kept == 3


def test_task_scoped_minutes_give_task_tier_candidates(openai_server: OpenAIServer) -> None:
    minutes = [
        minute(
            "message",
            0,
            memory_note="This task's deadline is next Friday.",
            scope="task",
            data={"task_id": "migrate-7"},
        ),
        minute("message", 1, memory_note="Deadline confirmed.", scope="task", data={"task_id": "other-2"}),
    ]
    openai_server.queue_chat_reply(
        {
            "facts": [
                item([1], subject="this task", attribute="deadline", value="next Friday", text="Due next Friday."),
                item([1, 2], subject="this task", attribute="deadline", value="next Friday", text="Due next Friday."),
            ]
        }
    )
    one, both = LLMExtractor(make_llm(openai_server)).extract(minutes)
    assert (one.tier, one.task_id, one.value) == ("task", "migrate-7", "2026-11-27")  # grounded like the rules
    assert "task migrate-7 (task memory)" in prompt(openai_server)
    assert both.source_minute_ids == ("id00000", "id00001")
    assert (both.tier, both.task_id) == ("project", None)  # two tasks' minutes: not one task's memory


# -- what the model gets wrong ---------------------------------------------------------------------


def test_refs_out_of_range_drop_their_items_and_are_counted(openai_server: OpenAIServer) -> None:
    minutes = [minute("message", i, memory_note=f"note {i}") for i in range(2)]
    known = {("billing service", "database"): [known_fact()]}
    openai_server.queue_chat_reply(
        {
            "facts": [
                item([3]),  # only M1 and M2 were shown
                item([1, 7], value="MySQL"),
                item([2], value="CockroachDB", supersedes_ref=2),  # only F1 was shown
                item([2], value="SQLite", supersedes_ref=1),
            ]
        }
    )
    extractor = LLMExtractor(make_llm(openai_server))

    found = extractor.extract(minutes, known)

    assert [(c.value, c.source_minute_ids, c.supersedes_fact_id) for c in found] == [
        ("SQLite", ("id00001",), known_fact().id)
    ]
    assert (extractor.stats.unknown_ref, extractor.stats.kept, extractor.stats.fallbacks) == (3, 1, 0)


def test_what_the_schema_allows_and_the_contract_refuses_is_dropped_and_counted(openai_server: OpenAIServer) -> None:
    minutes = [minute("message", 0, memory_note="Some notes.")]
    openai_server.queue_chat_reply(
        {
            "facts": [
                item([1], subject="learned", attribute="api_key"),  # learn()'s subject
                item([1], value="Postgres \ud800"),  # no UTF-8: the contract refuses it
                item([1], subject="..."),  # blank once normalized
                item([1], value=16),  # a number: its canonical text
                item([1], value=16.0),  # the same value again: one candidate
            ]
        }
    )
    extractor = LLMExtractor(make_llm(openai_server))

    found = extractor.extract(minutes)

    assert [c.value for c in found] == ["16"]
    assert (extractor.stats.refused, extractor.stats.duplicate, extractor.stats.kept) == (3, 1, 1)


def test_a_malformed_answer_is_repaired_once(openai_server: OpenAIServer) -> None:
    minutes = [minute("message", 0, memory_note="The billing service's database is Postgres.")]
    openai_server.queue_chat_reply("Sure! The database is Postgres.", {"facts": [item([1])]})
    llm = make_llm(openai_server)
    extractor = LLMExtractor(llm)

    found = extractor.extract(minutes)

    assert [(c.slot, c.value, c.rule) for c in found] == [(("billing service", "database"), "Postgres", "llm")]
    assert len(openai_server.chat_requests()) == 2 and llm.stats.repaired == 1
    assert (extractor.stats.answered, extractor.stats.fallbacks) == (1, 0)


def test_a_rejected_answer_falls_back_to_the_rules_for_that_chunk(openai_server: OpenAIServer) -> None:
    minutes = [
        minute("message", 0, memory_note="We must not deploy on Fridays."),
        minute("knowledge", 1, memory_note="The billing service's database is Postgres."),
    ]
    bad = {"facts": [item([1], type="opinion")]}
    openai_server.queue_chat_reply(bad, bad)  # the answer, and the repair
    extractor = LLMExtractor(make_llm(openai_server))

    found = extractor.extract(minutes)

    rules = RuleExtractor().extract(minutes)
    assert len(rules) == 2 and found == rules
    assert (extractor.stats.rejected, extractor.stats.answered, extractor.stats.kept) == (1, 0, 0)


def test_a_refused_request_falls_back_to_the_rules(openai_server: OpenAIServer) -> None:
    minutes = [minute("message", 0, memory_note="We must not deploy on Fridays.")]
    openai_server.fail_next(status(400))
    extractor = LLMExtractor(make_llm(openai_server))
    assert extractor.extract(minutes) == RuleExtractor().extract(minutes)
    assert extractor.stats.error == 1


def test_failing_endpoint_opens_the_breaker_and_the_rules_answer_without_http_calls(
    openai_server: OpenAIServer,
) -> None:
    minutes = [minute("message", i, memory_note=f"We must not touch system {i}.") for i in range(5)]
    openai_server.fail_next(status(500), times=10)
    llm = make_llm(openai_server, max_retries=1, breaker_threshold=2, breaker_cooldown_s=60)
    extractor = LLMExtractor(llm, chunk_minutes=1)

    found = extractor.extract(minutes)

    assert found == RuleExtractor().extract(minutes) and len(found) == 5
    assert len(openai_server.chat_requests()) == 4  # two chunks, each a try and a retry; then the breaker is open
    assert llm.stats.short_circuits == 3
    assert (extractor.stats.chunks, extractor.stats.unavailable) == (5, 5)


# -- what is sent ----------------------------------------------------------------------------------


def test_25_minutes_of_one_project_take_3_calls_of_at_most_10(openai_server: OpenAIServer) -> None:
    minutes = [minute("message", i, memory_note=f"Observation number {i}.") for i in range(25)]
    openai_server.queue_chat_reply(*[{"facts": []}] * 3)
    extractor = LLMExtractor(make_llm(openai_server))

    assert extractor.extract(minutes) == []

    assert len(openai_server.chat_requests()) == 3
    assert [len(minute_lines(prompt(openai_server, n))) for n in range(3)] == [10, 10, 5]
    assert "Observation number 20." in prompt(openai_server, 2)
    assert extractor.stats.chunks == 3 and extractor.stats.sent == 25


def test_a_prompt_never_mixes_projects(openai_server: OpenAIServer) -> None:
    minutes = [
        minute("message", i, memory_note=f"Note {i} of {p}.", project_id=p)
        for i, p in enumerate(["p1", "p2", "p1", "p2", "p1"])
    ]
    openai_server.queue_chat_reply({"facts": [item([2])]}, {"facts": [item([1], value="MySQL")]})

    found = LLMExtractor(make_llm(openai_server)).extract(minutes)

    first, second = prompt(openai_server, 0), prompt(openai_server, 1)
    assert "Project: p1" in first and all("of p1." in line for line in first.splitlines() if "Note" in line)
    assert "Project: p2" in second and all("of p2." in line for line in second.splitlines() if "Note" in line)
    assert minute_lines(first) == ["1", "2", "3"] and minute_lines(second) == ["1", "2"]
    assert [(c.project_id, c.source_minute_ids, c.value) for c in found] == [
        ("p2", ("id00001",), "MySQL"),  # p2's M1 is minute 1: candidates in minute order
        ("p1", ("id00002",), "Postgres"),  # p1's M2 is minute 2
    ]


def test_change_minutes_convention_minutes_and_empty_minutes_are_not_sent(openai_server: OpenAIServer) -> None:
    fact = known_fact()
    change = asserted_minute(fact, agent_id="pvm-facts")
    convention = minute(
        "decision",
        1,
        memory_note="see data",
        data={"fact": {"subject": "cache", "attribute": "ttl", "value": "5 minutes"}},
    )
    empty = minute("task_started", 2)
    extractor = LLMExtractor(make_llm(openai_server))

    found = extractor.extract([change, convention, empty])

    assert openai_server.chat_requests() == []
    assert found == RuleExtractor().extract([convention]) and found[0].rule == "data"
    assert (extractor.stats.sent, extractor.stats.by_rules, extractor.stats.chunks) == (0, 1, 0)


def test_known_facts_are_shown_by_small_refs_and_supersedes_ref_maps_back(openai_server: OpenAIServer) -> None:
    current = known_fact("Postgres")
    cache = known_fact("Redis", attribute="cache", text="The billing service's cache is Redis.")
    old = known_fact("MySQL").with_(status="superseded", valid_until="2026-11-21T00:00:00.000000Z")
    elsewhere = known_fact("Oracle", project="p2")
    known = {
        ("billing service", "database"): [current, old, elsewhere],
        ("billing service", "cache"): [cache],
    }
    minutes = [minute("decision", 0, memory_note="Billing moves from Postgres to CockroachDB.")]
    answer = {
        "facts": [
            item([1], type="decision", value="CockroachDB", supersedes_ref=2),
            item([1], attribute="cache", value="Memcached", supersedes_ref=2),  # F2 is another slot
        ]
    }
    openai_server.queue_chat_reply(answer)
    extractor = LLMExtractor(make_llm(openai_server))

    moved, cache_item = extractor.extract(minutes, known)

    text = prompt(openai_server)
    shown = re.findall(r"^F(\d+) .*= (\S+)", text, re.M)
    assert shown == [("1", "Redis"), ("2", "Postgres")]  # current facts of p1 only, in a fixed order
    assert not any(f.id in text for f in (current, cache, old, elsewhere))  # never a raw id
    assert (moved.supersedes_fact_id, moved.supersedes_hint) == (current.id, True)
    assert (cache_item.supersedes_fact_id, cache_item.supersedes_hint) == (None, False)
    assert extractor.stats.supersedes_ignored == 1


def test_the_same_answer_gives_the_same_candidates(openai_server: OpenAIServer) -> None:
    minutes = [minute("message", i, memory_note=f"Note {i}.", project_id=p) for i, p in enumerate("aabba")]
    known = {("billing service", "database"): [known_fact(project="a")]}
    answer = {"facts": [item([1], supersedes_ref=1, value="SQLite"), item([2], type="decision")]}
    runs = []
    for _ in range(2):
        openai_server.reset()
        openai_server.queue_chat_reply(answer, answer)
        found = LLMExtractor(make_llm(openai_server)).extract(minutes, known)
        runs.append((found, [r.messages for r in openai_server.chat_requests()]))
    assert runs[0] == runs[1]
    assert len(runs[0][0]) == 3  # a's item with the unknown F1 in b's prompt is dropped


# -- metrics and settings --------------------------------------------------------------------------


def test_calls_tokens_and_fallbacks_are_recorded_in_metrics(
    openai_server: OpenAIServer, redis_client: redis.Redis, settings: Settings
) -> None:
    recorder = MetricsRecorder(redis_client)
    minutes = [minute("message", i, memory_note=f"We must not touch system {i}.") for i in range(12)]
    openai_server.queue_chat_reply({"facts": [item([1]), item([11])]}, "no JSON", "still none")
    llm = make_llm(openai_server, metrics=recorder)
    extractor = LLMExtractor(llm, metrics=recorder)

    extractor.extract(minutes)

    provider = counters(redis_client, keys.metrics_provider("openai|chat:facts"))
    assert provider["calls:ok"] == 1 and provider["calls:rejected"] == 1
    assert provider["tokens"] > 0 and provider["completion_tokens"] > 0
    assert (provider["tokens"], provider["completion_tokens"]) == (llm.stats.prompt_tokens, llm.stats.completion_tokens)
    counted = counters(redis_client, keys.metrics_extraction())
    assert counted == {
        "llm:chunks:answered": 1,
        "llm:chunks:rejected": 1,
        "llm:items:kept": 1,
        "llm:items:unknown_ref": 1,
    }
    families = {f.name: f for f in PvmCollector(redis_client, settings).collect()}
    chunks = {tuple(s.labels.values()): s.value for s in families["pvm_fact_extraction_chunks"].samples}
    assert chunks == {("llm", "answered"): 1.0, ("llm", "rejected"): 1.0}


def test_the_factory_builds_the_extractor_the_settings_ask_for(openai_server: OpenAIServer) -> None:
    assert llm_extractor_from_settings(Settings()) is None
    extractor = llm_extractor_from_settings(Settings(llm_model="test-chat", llm_base_url=openai_server.base_url))
    assert isinstance(extractor, LLMExtractor)
    assert isinstance(extractor.fallback, RuleExtractor)
    assert extractor.llm.base_url == openai_server.base_url  # type: ignore[attr-defined]


def test_the_schema_asks_for_what_the_reader_reads() -> None:
    fields = FACTS_SCHEMA["properties"]["facts"]["items"]["properties"]
    assert set(fields) == {
        "type",
        "subject",
        "attribute",
        "value",
        "text",
        "confidence",
        "minute_refs",
        "supersedes_ref",
        "valid_from",
    }
    assert set(fields) - set(FACTS_SCHEMA["properties"]["facts"]["items"]["required"]) == {
        "supersedes_ref",
        "valid_from",
    }


@pytest.mark.parametrize("chunk_minutes", [0, 11])
def test_a_chunk_holds_1_to_10_minutes(openai_server: OpenAIServer, chunk_minutes: int) -> None:
    with pytest.raises(ValueError, match="chunk_minutes"):
        LLMExtractor(make_llm(openai_server), chunk_minutes=chunk_minutes)


def test_the_facts_pool_shows_the_model_the_facts_its_store_holds(
    openai_server: OpenAIServer, redis_client: redis.Redis, settings: Settings
) -> None:
    from tests.workers.facts.test_facts_pool import records
    from workers.facts.pool import FactsContext, facts_batch

    ctx = FactsContext.build(redis_client, settings, extractor=LLMExtractor(make_llm(openai_server)))
    first = minute(
        "knowledge", 0, data={"fact": {"subject": "billing service", "attribute": "database", "value": "Postgres"}}
    )  # the data convention: read by the rules
    facts_batch(ctx, redis_client, records([first]))
    assert openai_server.chat_requests() == []
    openai_server.queue_chat_reply(
        {
            "facts": [
                item([1], type="decision", value="CockroachDB", text="Billing moves to CockroachDB.", supersedes_ref=1)
            ]
        }
    )
    moved = minute("decision", 1, timestamp=NEXT_DAY, memory_note="Billing moves from Postgres to CockroachDB.")
    facts_batch(ctx, redis_client, records([moved], first_seq=2))
    assert re.findall(r"^F(\d+) .*= (\S+)", prompt(openai_server), re.M) == [("1", "Postgres")]
    later = "2026-11-28T00:00:00.000000Z"  # the minutes' clock, not the wall's
    current = FactStore(redis_client).current([TierKey.for_project(moved.project_id)], as_of=later)
    assert [f.value for f in current if f.attribute == "database"] == ["CockroachDB"]

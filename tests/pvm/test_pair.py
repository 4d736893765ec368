"""The PAIR loop (pvm/pair.py, pvm/pair_llm.py): offline with the checklist judge, over the real index, and with an
LLM judge and reviser against the loopback OpenAI-compatible server (scripted answers, malformed JSON, timeouts)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from contracts import Minute
from contracts.memory import SearchHit
from contracts.pair import Gap, PairEvaluation, PairRevision, pair_change
from pvm import engines
from pvm.checklist import ChecklistJudge, Verdict
from pvm.config import Settings
from pvm.llm import LLMClient
from pvm.pair import (
    STOP_NO_PROGRESS,
    STOP_ROUNDS,
    STOP_TARGET,
    ExtractiveReviser,
    GapMemories,
    Memory,
    Pair,
    Revised,
    SearchRetriever,
)
from pvm.pair_llm import JUDGE_INSTRUCTION, LLMJudge, LLMReviser, judge_messages
from tests.memory_helpers import log_minutes, use_settings
from tests.openai_server import OpenAIServer, delay, openai_server_fixture  # noqa: F401  (the `openai_server` fixture)

TASK = "Write the rollout plan for the payments service"
CRITERIA = ("Mentions the rollback plan", "p99 latency under 200 ms", "Names the owner team")
OUTPUT = "We roll the payments service out on Monday behind a feature flag, one region at a time."
ROLLBACK = "The rollback plan is to flip the payments flag off; the old build stays warm for a day."
LATENCY = "Load test of the payments service: p99 latency 170 ms at peak."
OWNER = "The payments service owner team is team-ledger."


class Memories:
    """A retriever over a fixed list (a test double of the `Retriever` protocol): memories holding any query word."""

    def __init__(self, memories: Sequence[Memory]) -> None:
        self.memories = list(memories)
        self.queries: list[str] = []

    def retrieve(self, project_id: str, query: str, k: int) -> list[Memory]:
        self.queries.append(query)
        asked = set(query.lower().split())
        return [m for m in self.memories if asked & set(m.text.lower().replace(";", " ").split())][:k]


STORE = Memories(
    [Memory("m-rollback", "minute", ROLLBACK), Memory("m-latency", "minute", LATENCY), Memory("f-owner", "fact", OWNER)]
)


def test_the_offline_loop_fills_the_gaps_from_memory_and_stops_at_the_target() -> None:
    written: list[Minute] = []
    result = Pair(retriever=STORE, record=written.append).run("apollo", TASK, CRITERIA, OUTPUT, task_id="T-7")
    assert result.stopped == STOP_TARGET and result.score == 100 and len(result.rounds) == 2
    first, second = result.rounds
    assert first.score < 95 and {g.criterion for g in first.gaps} == set(CRITERIA)
    assert {m.id for r in first.retrieved for m in r.memories} == {"m-rollback", "m-latency", "f-owner"}
    assert first.revision is not None and first.revision.startswith(OUTPUT)
    assert f"{ROLLBACK} [m-rollback]" in first.revision and "[f-owner]" in first.revision
    assert (second.score, second.gaps, second.revision) == (100, (), None)
    assert result.output == first.revision
    # every round is a minute: evaluation, revision, evaluation; the revision cites the minutes it quoted
    assert [m.event_type for m in written] == ["pair_evaluation", "pair_revision", "pair_evaluation"]
    assert [m.id for m in written] == list(result.minute_ids)
    evaluation, revision, _again = (pair_change(m) for m in written)
    assert isinstance(evaluation, PairEvaluation) and evaluation.score == first.score and evaluation.output == OUTPUT
    assert isinstance(revision, PairRevision) and revision.revision == first.revision
    assert written[1].context_references[0] == written[0].id and "m-rollback" in written[1].context_references
    assert "f-owner" not in written[1].context_references  # a fact is no minute to reference
    assert written[2].context_references == (written[1].id,)
    assert all(m.data["task_id"] == "T-7" for m in written)
    assert json.loads(json.dumps(result.to_dict()))["rounds"][0]["retrieved"][0]["memories"]


class Stubborn:
    """A judge that never passes the output (a test double of the `Judge` protocol)."""

    name = "stubborn"

    def __init__(self) -> None:
        self.judged: list[str] = []

    def judge(self, task: str, criteria: Sequence[str], output: str) -> Verdict:
        self.judged.append(output)
        return Verdict(10, (Gap(criteria[0], ("something",)),), self.name)


class Appender:
    name = "appender"

    def revise(self, task: str, criteria: Sequence[str], output: str, gaps: Sequence[GapMemories]) -> Revised:
        return Revised(output + " more.", self.name)


@pytest.mark.parametrize("rounds", [1, 2, 3, 5])
def test_the_loop_ends_at_its_round_limit(rounds: int) -> None:
    written: list[Minute] = []
    judge = Stubborn()
    result = Pair(judge, Appender(), STORE, written.append, rounds=rounds).run("apollo", TASK, CRITERIA, OUTPUT)
    assert result.stopped == STOP_ROUNDS and len(result.rounds) == rounds == len(judge.judged)
    assert [m.event_type for m in written].count("pair_evaluation") == rounds
    assert [m.event_type for m in written].count("pair_revision") == rounds - 1
    assert result.rounds[-1].revision is None and result.output == OUTPUT  # no revision scored higher


def test_a_revision_that_changes_nothing_ends_the_loop() -> None:
    result = Pair(retriever=Memories([]), rounds=3).run("apollo", TASK, CRITERIA, OUTPUT)
    assert result.stopped == STOP_NO_PROGRESS and len(result.rounds) == 1 and result.rounds[0].revision == OUTPUT


def test_the_extractive_reviser_removes_what_a_criterion_forbids() -> None:
    verdict_gap = Gap("Does not mention the staging database", (), ("staging database",), 0)
    revised = ExtractiveReviser().revise(
        TASK,
        [verdict_gap.criterion],
        "Deploy on Monday. We tested on the staging database first.",
        [GapMemories(verdict_gap, "q", ())],
    )
    assert revised.text == "Deploy on Monday."


def test_bad_arguments_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="criteria"):
        Pair().run("apollo", TASK, [], OUTPUT)
    with pytest.raises(ValueError, match="output"):
        Pair().run("apollo", TASK, CRITERIA, " ")
    with pytest.raises(ValueError, match="project_id"):
        Pair().run("no/such", TASK, CRITERIA, OUTPUT)
    with pytest.raises(ValueError, match="PVM_PAIR_ROUNDS"):
        Pair(rounds=0)


# -- over the real index ---------------------------------------------------------------------------------------------


def test_gaps_are_filled_from_the_projects_indexed_minutes_and_pair_minutes_are_never_retrieved(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_settings(settings, monkeypatch)
    noise = [
        Minute(
            project_id="apollo", event_type="message", agent_id="a1", memory_note=f"Standup note {i}: reviewed tickets."
        )
        for i in range(30)
    ]
    facts = [
        Minute(project_id="apollo", event_type="decision", agent_id="ops", memory_note=ROLLBACK),
        Minute(project_id="apollo", event_type="evaluation", agent_id="qa", memory_note=LATENCY),
        Minute(project_id="apollo", event_type="decision", agent_id="pm", memory_note=OWNER),
        Minute(
            project_id="borealis", event_type="decision", agent_id="pm", memory_note="The rollback plan is to pray."
        ),
    ]
    # an earlier run's revision holds every answer: it must not be quoted back
    earlier: list[Minute] = []
    Pair(retriever=Memories([Memory("x", "minute", f"{ROLLBACK} {LATENCY} {OWNER}")]), record=earlier.append).run(
        "apollo", TASK, CRITERIA, OUTPUT
    )
    log_minutes(redis_client, settings, [*noise, *facts, *earlier])
    try:
        written: list[Minute] = []
        pair = Pair(retriever=SearchRetriever(engines.searcher_for(settings)), record=written.append)  # type: ignore[arg-type]
        result = pair.run("apollo", TASK, CRITERIA, OUTPUT)
        assert result.stopped == STOP_TARGET and result.score == 100, result.to_dict()
        found = {m.id for r in result.rounds[0].retrieved for m in r.memories}
        assert {facts[0].id, facts[1].id, facts[2].id} <= found
        assert not found & {m.id for m in earlier} and facts[3].id not in found
        assert all(len(r.memories) <= 5 for r in result.rounds[0].retrieved)
    finally:
        engines.close_shared()


# -- the LLM judge and reviser ---------------------------------------------------------------------------------------


def llm(server: OpenAIServer, **options: Any) -> LLMClient:
    options = {"backoff_base": 0.01, "backoff_max": 0.05, "timeout": 5.0, **options}
    return LLMClient(server.base_url, "sk-test", "judge-model", **options)


def test_the_llm_judge_sees_only_the_task_criteria_and_output(openai_server: OpenAIServer) -> None:
    openai_server.queue_chat_reply(
        {"score": 30, "gaps": [{"criterion": 1, "score": 0, "missing": ["rollback plan"], "forbidden": []}]},
        {"score": 97, "gaps": []},
    )
    client = llm(openai_server)
    written: list[Minute] = []
    result = Pair(LLMJudge(client), ExtractiveReviser(), STORE, written.append).run("apollo", TASK, CRITERIA, OUTPUT)
    assert result.stopped == STOP_TARGET and [r.score for r in result.rounds] == [30, 97]
    assert result.rounds[0].judge == "llm:judge-model" and result.rounds[0].judge_fallback is None
    assert result.rounds[0].gaps == (Gap(CRITERIA[0], ("rollback plan",), (), 0),)
    first, second = openai_server.chat_requests()
    assert first.messages == judge_messages(TASK, CRITERIA, OUTPUT)
    assert second.messages == judge_messages(TASK, CRITERIA, result.rounds[0].revision or "")
    # nothing but the instruction, the task, the criteria and the output: no memory, no earlier verdict
    user = first.messages[1]["content"]
    assert first.messages[0]["content"] == JUDGE_INSTRUCTION and len(first.messages) == 2
    numbered = "\n".join(f"{i}. {c}" for i, c in enumerate(CRITERIA, 1))
    assert user == f"Task:\n{TASK}\n\nSuccess criteria:\n{numbered}\n\nOutput:\n{OUTPUT}"
    assert "m-rollback" not in json.dumps(second.messages[:1]) and "30" not in second.messages[1]["content"]
    assert first.response_format is not None and first.response_format["json_schema"]["name"] == "pair_judge"


def test_a_malformed_judge_answer_is_repaired_or_the_checklist_judges_that_round(openai_server: OpenAIServer) -> None:
    # round 1: malformed, then repaired; round 2: malformed twice (rejected) -> the checklist judges
    openai_server.queue_chat_reply(
        '{"score": 30, "gaps": [',
        {"score": 30, "gaps": [{"criterion": 1, "score": 0, "missing": ["rollback plan"], "forbidden": []}]},
        '{"score": 101, "gaps": []}',
        "I cannot answer in JSON.",
    )
    result = Pair(LLMJudge(llm(openai_server)), retriever=STORE, rounds=2).run("apollo", TASK, CRITERIA, OUTPUT)
    first, second = result.rounds
    assert (first.judge, first.judge_fallback, first.score) == ("llm:judge-model", None, 30)
    assert second.judge == "checklist" and second.judge_fallback is not None
    assert "LLM judge failed" in second.judge_fallback and "checklist judged" in second.judge_fallback
    # the model named one gap, so one was filled: the checklist scores that revision as it scores it anywhere
    assert second.score == ChecklistJudge().judge(TASK, CRITERIA, first.revision or "").score < 95
    assert result.stopped == STOP_ROUNDS and ROLLBACK in (first.revision or "")
    assert len(openai_server.chat_requests()) == 4


def test_a_judge_answer_naming_a_criterion_twice_is_refused(openai_server: OpenAIServer) -> None:
    gap = {"criterion": 1, "score": 0, "missing": ["x"], "forbidden": []}
    openai_server.queue_chat_reply({"score": 10, "gaps": [gap, gap]})
    verdict = LLMJudge(llm(openai_server)).judge(TASK, CRITERIA, OUTPUT)
    assert verdict.judge == "checklist" and verdict.fallback is not None and "two gaps" in verdict.fallback


@pytest.mark.parametrize("rounds", [1, 3])
def test_with_the_endpoint_timing_out_the_loop_still_ends_within_its_rounds(
    openai_server: OpenAIServer, rounds: int
) -> None:
    openai_server.fail_next(delay(2), times=20)
    client = llm(openai_server, timeout=0.2, max_retries=0, breaker_threshold=2)
    written: list[Minute] = []
    result = Pair(LLMJudge(client), LLMReviser(client), STORE, written.append, rounds=rounds).run(
        "apollo", TASK, CRITERIA, OUTPUT
    )
    assert len(result.rounds) <= rounds and [m.event_type for m in written].count("pair_evaluation") <= rounds
    assert all(r.judge == "checklist" and r.judge_fallback for r in result.rounds)
    revised = [r for r in result.rounds if r.revision is not None]
    assert all(r.reviser == "extractive" and r.reviser_fallback for r in revised)
    assert len(openai_server.chat_requests()) <= 2  # then the breaker refuses without a request
    if rounds == 3:
        assert result.stopped == STOP_TARGET and result.score == 100
    recorded = [pair_change(m) for m in written]
    assert all(getattr(c, "fallback", None) for c in recorded)  # the minutes say the model was not used


def test_the_llm_reviser_gets_the_memories_and_its_revision_is_judged(openai_server: OpenAIServer) -> None:
    revision = f"{OUTPUT} {ROLLBACK} [m-rollback] {LATENCY} [m-latency] {OWNER} [f-owner]"
    openai_server.queue_chat_reply({"revision": revision})
    result = Pair(reviser=LLMReviser(llm(openai_server)), retriever=STORE).run("apollo", TASK, CRITERIA, OUTPUT)
    assert result.rounds[0].reviser == "llm:judge-model" and result.output == revision and result.score == 100
    [sent] = openai_server.chat_requests()
    assert "m-rollback" in sent.messages[1]["content"] and ROLLBACK in sent.messages[1]["content"]


def test_from_settings_builds_the_configured_loop(
    redis_client: redis.Redis, settings: Settings, openai_server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_settings(settings, monkeypatch)
    configured = settings.with_(
        pair_judge="llm", pair_rounds=2, pair_target=90, llm_model="judge-model", llm_base_url=openai_server.base_url
    )
    with Pair.from_settings(configured, retriever=STORE) as pair:
        assert isinstance(pair.judge, LLMJudge) and isinstance(pair.reviser, ExtractiveReviser)
        assert (pair.rounds, pair.target, pair.k) == (2, 90, 5)
        openai_server.queue_chat_reply({"score": 92, "gaps": []})
        result = pair.run("apollo", TASK, CRITERIA, OUTPUT)
    assert result.stopped == STOP_TARGET and result.score == 92
    stream = [e for s in range(settings.shards) for e in redis_client.xrange(f"pvm:{{s{s}}}:minutes")]
    assert len(stream) == 1  # the emitter it owned wrote the evaluation and was closed (flushed)
    with pytest.raises(ValueError, match="PVM_LLM_MODEL"):
        Pair.from_settings(settings.with_(pair_judge="llm"), retriever=STORE, record=lambda m: None)


def test_the_extractive_reviser_quotes_only_sentences_about_the_criterion() -> None:
    gap = Gap("Names who the billing service fix was handed to", ("handed",), (), 50)
    memories = (
        Memory("m-other", "minute", "The search index fix was handed to dba."),
        Memory("m-billing", "minute", "Tester handed the billing service fix to coder."),
    )
    revised = ExtractiveReviser().revise(
        TASK, [gap.criterion], "The billing service broke.", [GapMemories(gap, "q", memories)]
    )
    assert "[m-billing]" in revised.text and "m-other" not in revised.text
    only_other = ExtractiveReviser().revise(
        TASK, [gap.criterion], "The billing service broke.", [GapMemories(gap, "q", memories[:1])]
    )
    assert only_other.text == "The billing service broke."  # nothing about the billing service to quote


def test_the_largest_request_still_fits_its_minutes_or_is_refused_up_front() -> None:
    from contracts import encode_minute
    from contracts.pair import MAX_CRITERIA, MAX_CRITERION_CHARS, MAX_RUN_CHARS

    words = " ".join(f"term{i}" for i in range(200))
    criteria = [(f"c{i} " + words)[:MAX_CRITERION_CHARS] for i in range(MAX_CRITERIA)]
    with pytest.raises(ValueError, match="MAX_RUN_CHARS"):
        Pair().run("apollo", TASK, criteria, "x" * 10_000)
    room = MAX_RUN_CHARS - len(TASK) - sum(len(c) for c in criteria)
    written: list[Minute] = []
    result = Pair(record=written.append, retriever=Memories([])).run("apollo", TASK, criteria, "y " * (room // 2))
    assert result.rounds[0].gaps and all(len(encode_minute(m)) > 0 for m in written)


class RepeatingSearcher:
    """A searcher over hits agents wrote: the same sentence said five times (other case, other stop), then others."""

    def __init__(self) -> None:
        said = [
            "Roll back with the blue-green switch.",
            "roll back with the blue-green switch",
            "Roll back  with the blue-green switch!",
            "ROLL BACK WITH THE BLUE-GREEN SWITCH.",
            "Roll back with the blue-green switch.",
        ]
        notes = [*said, "The p99 budget is 300 ms.", "Dana owns the rollout."]
        self.hits = [
            SearchHit(f"m{i}", 1.0 - i / 10, {"event_type": "decision", "memory_note": note}, "decision")
            for i, note in enumerate(notes)
        ]
        self.asked: list[int] = []

    def search(self, project_id: str, query: str, filters: Any, k: int, **kwargs: Any) -> list[SearchHit]:
        self.asked.append(k)
        return self.hits[:k]


def test_a_gaps_memories_say_each_text_once() -> None:
    searcher = RepeatingSearcher()
    memories = SearchRetriever(searcher).retrieve("apollo", "rollback plan", 3)  # type: ignore[arg-type]
    assert [m.id for m in memories] == ["m0", "m5", "m6"]  # the best-ranked of the five that say it
    assert [m.text for m in memories] == [
        "Roll back with the blue-green switch.",
        "The p99 budget is 300 ms.",
        "Dana owns the rollout.",
    ]

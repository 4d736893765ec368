"""bench/facts_llm.py: LLM calls per 100 minutes of a fact session, against the scripted loopback server."""

from __future__ import annotations

import math
from collections import Counter

from bench.fact_sessions import fact_session
from bench.facts_llm import calls_per_100_minutes
from tests.openai_server import OpenAIServer, openai_server_fixture  # noqa: F401  (the `openai_server` fixture)
from workers.facts.extraction import structured_facts


def test_calls_per_100_minutes_counts_one_call_per_chunk_of_a_projects_minutes(openai_server: OpenAIServer) -> None:
    session = fact_session()
    minutes = session.minutes
    result = calls_per_100_minutes(session, openai_server, 500)
    # What a call per <= 10 readable minutes of one project, batch by batch, comes to (the session's minutes all
    # have a note; those of the data convention go to the rules as stated).
    expected = 0
    for start in range(0, len(minutes), 500):
        readable = Counter(m.project_id for m in minutes[start : start + 500] if not structured_facts(m))
        expected += sum(math.ceil(n / 10) for n in readable.values())
    assert result["calls"] == result["chunks"] == expected
    assert result["fallbacks"] == 0 and result["minutes"] == len(minutes)
    assert result["minutes_by_rules"] == sum(1 for m in minutes if structured_facts(m)) > 0
    assert result["llm_calls_per_100_minutes"] == round(100 * expected / len(minutes), 2) <= 10  # issue 10's target

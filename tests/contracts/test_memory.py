"""Memory records as agents read them: the context package's prompt text."""

from __future__ import annotations

from typing import Any

import pytest

from contracts.memory import AgentMemory, BudgetReport, ContextPackage, SearchHit

MINUTE = {
    "id": "01J9Z0000000000000000000A1",
    "timestamp": "2026-09-21T12:26:40Z",
    "event_type": "task_failed",
    "agent_id": "coder",
    "memory_note": "login broke after the cache change",
}
KEYWORDS_ONLY = "(note: relevant past experience matched by keywords only: the embedding provider is unavailable)"
NO_SEARCH = "(note: relevant past experience is missing: search is unavailable)"


def package(index: dict[str, Any], experience: bool = True) -> ContextPackage:
    hits = (SearchHit(MINUTE["id"], 0.8, MINUTE, "failure"),) if experience else ()
    return ContextPackage(
        project_id="apollo",
        agent_id="coder",
        task="fix the login bug",
        recent=(MINUTE,),
        referenced=(),
        agent_memory=AgentMemory("coder", tasks_assigned=1),
        relevant_experience=hits,
        budget=BudgetReport(4000, 120, {"recent": 60}, {}),
        freshness={"index": {"seq": 10, "age_s": 0.5, **index}},
        full_log_available=True,
    )


def test_a_healthy_package_adds_no_notes() -> None:
    text = package({"behind": 0}).render()
    assert "(note:" not in text


def test_a_keyword_only_answer_is_one_plain_line() -> None:
    degraded = (
        "dense leg skipped: query embedding failed: embedding request to http://10.0.0.7:8000/v1/embeddings "
        "(model 'test-embed', 1 inputs) failed after 1 attempt: timed out after 0.3s"
    )
    pkg = package({"behind": 0, "degraded": degraded})
    text = pkg.render()
    assert text.endswith("\n\n" + KEYWORDS_ONLY)
    assert "10.0.0.7" not in text and "timed out" not in text and "dense leg" not in text  # reasons are for operators
    assert ContextPackage.from_dict(pkg.to_dict()).render() == text


@pytest.mark.parametrize("experience", [True, False])
def test_a_failed_search_says_experience_is_missing(experience: bool) -> None:
    error = "VectorStoreError: qdrant-edge failed on /srv/pvm/var/qdrant/apollo: Traceback (most recent call last)"
    text = package({"behind": 0, "error": error}, experience=experience).render()
    assert NO_SEARCH in text and KEYWORDS_ONLY not in text
    assert "/srv/pvm" not in text and "Traceback" not in text


def test_notes_share_one_block_after_the_minutes() -> None:
    text = package({"behind": 7, "degraded": "dense leg skipped: next try in 4s"}).render()
    assert text.endswith(f"\n\n(note: search is 7 minutes behind the log)\n{KEYWORDS_ONLY}")

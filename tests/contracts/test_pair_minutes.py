"""The PAIR minutes (contracts/pair.py): records that check themselves, a refusing parser, system-only event types."""

from __future__ import annotations

from typing import Any

import pytest

from contracts import decode_minute, encode_minute
from contracts.pair import (
    MAX_OUTPUT_CHARS,
    Gap,
    PairError,
    PairEvaluation,
    PairRevision,
    Retrieved,
    pair_change,
    pair_minute,
)
from contracts.summaries import SYSTEM_EVENT_TYPES, thread_of


def evaluation(**changes: Any) -> PairEvaluation:
    fields: dict[str, Any] = {
        "run_id": "0f3c",
        "round": 1,
        "score": 50,
        "target": 95,
        "judge": "checklist",
        "task": "Write the rollout plan",
        "criteria": ("Mentions the rollback plan", "p99 under 200 ms"),
        "output": "We roll out on Monday.",
        "gaps": (Gap("Mentions the rollback plan", ("rollback", "plan"), (), 0),),
    }
    return PairEvaluation(**{**fields, **changes})


def test_an_evaluation_and_a_revision_round_trip_through_the_codec_and_the_parser() -> None:
    made = pair_minute("apollo", evaluation(), task_id="T-7", agent_id="judge")
    parsed = pair_change(decode_minute(encode_minute(made)))
    assert parsed == evaluation()
    assert made.event_type == "pair_evaluation" and made.data["task_id"] == "T-7" and made.data["score"] == 50
    assert "50/100" in (made.memory_note or "") and "rollback" in (made.memory_note or "")
    revision = PairRevision(
        "0f3c",
        1,
        "extractive",
        "We roll out on Monday.\n\nRollback: flip the flag. [m1]",
        (Retrieved("Mentions the rollback plan", "rollback plan", ("m1", "m2")),),
    )
    made = pair_minute("apollo", revision, references=[made.id, "m1"])
    assert pair_change(decode_minute(encode_minute(made))) == revision
    assert made.context_references[1] == "m1"


@pytest.mark.parametrize(
    ("data_change", "field"),
    [
        ({"score": 101}, "score"),
        ({"score": 50.5}, "score"),
        ({"score": True}, "score"),
        ({"round": 0}, "round"),
        ({"run_id": "a b"}, "run_id"),
        ({"criteria": []}, "criteria"),
        ({"criteria": "one criterion"}, "criteria"),
        ({"output": ""}, "output"),
        ({"output": "x" * (MAX_OUTPUT_CHARS + 1)}, "output"),
        ({"gaps": [{"criterion": "c", "missing": "rollback"}]}, "gaps[0].missing"),
        ({"gaps": [{"missing": []}]}, "gaps[0].criterion"),
    ],
)
def test_a_malformed_evaluation_is_refused_naming_the_field(data_change: dict[str, Any], field: str) -> None:
    data = {**evaluation().to_data(), **data_change}
    with pytest.raises(PairError) as refused:
        PairEvaluation.from_data(data)
    assert refused.value.field == field


def test_pair_minutes_are_written_only_by_pvm_and_belong_to_no_thread() -> None:
    assert {"pair_evaluation", "pair_revision"} <= SYSTEM_EVENT_TYPES
    assert thread_of(pair_minute("apollo", evaluation(), task_id="T-7")) is None


def test_an_evaluation_too_large_for_one_minute_keeps_fewer_terms_per_gap() -> None:
    from contracts.pair import KEPT_TERMS, MAX_CRITERIA, MAX_CRITERION_CHARS, MAX_TERM_CHARS, MAX_TERMS

    criteria = tuple(f"{i} " + "c" * (MAX_CRITERION_CHARS - 4) for i in range(MAX_CRITERIA))
    gaps = tuple(Gap(c, tuple("t" * MAX_TERM_CHARS for _ in range(MAX_TERMS)), (), 0) for c in criteria)
    big = evaluation(criteria=criteria, gaps=gaps, output="o" * 4_000)
    made = pair_minute("apollo", big, task_id="T-7")
    assert len(encode_minute(made)) <= 64 * 1024
    kept = pair_change(decode_minute(encode_minute(made)))
    assert isinstance(kept, PairEvaluation) and kept.score == big.score and kept.criteria == criteria
    assert all(len(g.missing) <= KEPT_TERMS for g in kept.gaps) and len(kept.gaps) == MAX_CRITERIA


def test_a_revision_too_large_for_one_minute_keeps_fewer_ids_per_retrieval() -> None:
    from contracts.pair import KEPT_TERMS, MAX_CRITERIA, MAX_OUTPUT_CHARS, MAX_RETRIEVED

    retrieved = tuple(
        Retrieved(
            f"criterion {i} " + "c" * 480,
            "q" * 3_000,
            tuple(f"01M8CCTMD465JQH9APEC74G3{j:02d}" for j in range(MAX_RETRIEVED)),
        )
        for i in range(MAX_CRITERIA)
    )
    big = PairRevision("0f3c", 1, "extractive", "r" * MAX_OUTPUT_CHARS, retrieved)
    made = pair_minute("apollo", big)
    kept = pair_change(decode_minute(encode_minute(made)))
    assert isinstance(kept, PairRevision) and kept.revision == big.revision and len(kept.retrieved) == MAX_CRITERIA
    assert all(len(r.ids) <= KEPT_TERMS for r in kept.retrieved)

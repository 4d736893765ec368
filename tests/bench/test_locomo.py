"""bench/locomo.py on a tiny conversation written here in LoCoMo's format (the real data's licence keeps it out of
the repository): every key reported, with and without a dense leg; a question whose evidence shares its words is
found; the categories counted; evidence ids normalised or counted as unmatched; the second process compared; and
a clear skip where the data is absent."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bench import locomo

KEYS = {
    "lexical_recall_at_5", "lexical_recall_at_10", "lexical_recall_at_20", "multihop_recall_at_10",
    "hybrid_recall_at_10", "rrf_recall_at_10", "bm25_recall_at_10", "dense_recall_at_10", "by_category",
    "same_thread_in_top10_mean", "differing_top10_between_runs", "questions", "turns", "unmatched_evidence",
    "timings", "machine", "elapsed_s", "methods",
}  # fmt: skip

SESSION_1 = [
    ("Alice", "Hi Bob! Guess what, I adopted a grey kitten yesterday, her name is Pepper."),
    ("Bob", "No way! I love cats. How old is she?"),
    ("Alice", "Ten weeks. She already climbs the curtains."),
    ("Bob", "My week was busy, I started pottery classes at the community centre."),
    ("Alice", "Pottery sounds relaxing. What did you make?"),
    ("Bob", "A lopsided blue bowl, but I am proud of it."),
]
SESSION_2 = [
    ("Bob", "Hey Alice, long time. I finally finished the marathon training plan."),
    ("Alice", "Congratulations! Which marathon are you running?"),
    ("Bob", "The Lisbon marathon in October."),
    ("Alice", "Pepper knocked my glasses off the table this morning."),
    ("Bob", "Cats are chaos. Here is my new bowl."),
    ("Alice", "That glaze looks great!"),
]


def turns(session: int, lines: list[tuple[str, str]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"speaker": speaker, "dia_id": f"D{session}:{i}", "text": text} for i, (speaker, text) in enumerate(lines, 1)
    ]
    if session == 2:
        out[4]["blip_caption"] = "a photo of a green ceramic bowl on a shelf"
        out[4]["img_url"] = ["https://example.invalid/bowl.jpg"]
    return out


CONVERSATION = {
    "sample_id": "conv-test",
    "conversation": {
        "speaker_a": "Alice",
        "speaker_b": "Bob",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": turns(1, SESSION_1),
        "session_2_date_time": "12:19 am on 4 January, 2024",
        "session_2": turns(2, SESSION_2),
        "session_3_date_time": "9:00 am on 5 January, 2024",  # a date without a session, as the release has
    },
    "qa": [
        {"question": "What is the name of the grey kitten Alice adopted?", "answer": "Pepper", "evidence": ["D1:1"],
         "category": 4},
        {"question": "Which marathon is Bob running?", "answer": "Lisbon", "evidence": ["D:2:3"], "category": 4},
        {"question": "When did Bob start pottery classes?", "answer": "May 2023", "evidence": ["D1:04"],
         "category": 2},
        {"question": "What did Bob make at pottery, before and after?", "answer": "bowls",
         "evidence": ["D1:6; D2:5"], "category": 1},
        {"question": "Would Alice enjoy a quiet cat?", "answer": "no", "evidence": ["D1:3", "D2:4"], "category": 3},
        {"question": "What did Alice make at pottery?", "adversarial_answer": "a bowl", "evidence": ["D1:6"],
         "category": 5},
        {"question": "What colour is Bob's car?", "answer": "unknown", "evidence": ["D30:05", "D"], "category": 4},
    ],
}  # fmt: skip


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "locomo-test.json"
    path.write_text(json.dumps([CONVERSATION]), encoding="utf-8")
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert locomo.main([*argv, "--json"]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_a_run_with_a_dense_leg_reports_every_key_and_finds_the_evidence_that_shares_the_words(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump = tmp_path / "dump.jsonl"
    out = run(["--data", str(data), "--embedder", "hash", "--dump", str(dump)], capsys)
    assert set(out) >= KEYS
    assert out["turns"] == 12 and out["questions"] == 6  # the last question names no turn
    assert out["questions_without_evidence"] == 1
    assert out["unmatched_evidence"] == 2 and out["evidence"]["normalised"] == 2  # "D:2:3", "D1:04"
    assert out["evidence"]["unmatched_examples"] == ["D30:05", "D"]
    assert set(out["methods"]) == {"lexical", "hybrid", "bm25", "dense", "rrf"}
    for value in (out["lexical_recall_at_10"], out["hybrid_recall_at_10"], out["rrf_recall_at_10"]):
        assert 0.0 <= value <= 1.0
    counts = {name: r["questions"] for name, r in out["by_category"]["lexical"].items()}
    assert counts == {"multi-hop": 1, "temporal": 1, "open-domain": 1, "single-hop": 2, "adversarial": 1}
    assert set(out["by_category"]) == set(out["methods"])
    assert isinstance(out["differing_top10_between_runs"], int) and out["differing_top10_between_runs"] >= 0
    assert set(out["differing_top10_between_runs_by_method"]) == {"lexical", "hybrid"}
    assert 1 <= out["same_thread_in_top10_mean"]["lexical"] <= 6

    rows = {row["key"]: row for row in map(json.loads, dump.read_text().splitlines())}
    assert len(rows) == 6
    kitten = rows["conv-test#0"]
    assert kitten["evidence"] == ["D1:1"] and kitten["category_name"] == "single-hop"
    for method in ("lexical", "bm25"):  # the words of the question are the turn's: first
        assert kitten[method]["top10"][0] == "D1:1" and kitten[method]["hit_at_10"] is True
    for method in ("hybrid", "dense", "rrf"):  # the hashing embeddings know spelling only: found, not first
        assert kitten[method]["hit_at_10"] is True and kitten[method]["recall_at_10"] == 1.0
    assert rows["conv-test#3"]["evidence"] == ["D1:6", "D2:5"]  # a list written as one string


def test_a_lexical_run_leaves_the_dense_methods_empty(data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run(["--data", str(data), "--embedder", "none"], capsys)
    assert set(out) >= KEYS and set(out["methods"]) == {"lexical", "bm25"}
    assert out["hybrid_recall_at_10"] is None and out["dense_recall_at_10"] is None and out["rrf_recall_at_10"] is None
    assert out["lexical_recall_at_10"] > 0 and out["bm25_recall_at_10"] > 0
    assert out["by_category"]["bm25"]["multi-hop"]["questions"] == 1
    assert out["differing_top10_between_runs_by_method"] == {"lexical": out["differing_top10_between_runs"]}


def test_without_the_data_it_says_where_to_put_it_and_skips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere" / "locomo-dev.json"
    assert locomo.main(["--data", str(missing), "--embedder", "none", "--json"]) == 0
    captured = capsys.readouterr()
    assert str(missing) in json.loads(captured.out)["skipped"]
    assert str(missing) in captured.err and "locomo-dev.json" in captured.err


def test_turns_take_their_sessions_date_a_second_apart_as_notes_of_their_speaker(data: Path) -> None:
    conversations, _, asked = locomo.load(data, None, 0, "as-dated")
    (conv,) = conversations
    assert asked == 7 and conv.project == "locomo-conv-test"
    first, second = conv.turns[0].minute, conv.turns[1].minute
    assert first.timestamp.startswith("2023-05-08T13:56:00.000") and second.timestamp.startswith("2023-05-08T13:56:01")
    assert first.agent_id == "alice" and first.thread_id == "session-1" and first.event_type == "message"
    assert first.memory_note == f'Alice said, "{SESSION_1[0][1]}"'
    image = conv.turns[10].minute
    assert image.thread_id == "session-2" and image.memory_note is not None
    assert image.memory_note.endswith('" and shared a photo of a green ceramic bowl on a shelf')
    assert locomo.session_date("12:19 am on 4 January, 2024") == datetime(2024, 1, 4, 0, 19, tzinfo=UTC)
    again, _, _ = locomo.load(data, None, 0, "as-dated")
    assert [t.minute.id for t in again[0].turns] == [t.minute.id for t in conv.turns]  # a second build, same ids

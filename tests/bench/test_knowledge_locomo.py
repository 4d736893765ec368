"""bench/knowledge_locomo.py on a tiny conversation written here in LoCoMo's format (the real data's licence keeps
it out of the repository): every metric reported and made of its counts, ROUGE-L as defined, fragments found, and
a clear skip where the data is absent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.knowledge_locomo import TARGETS, fragments, lead, main, repeated, rouge_l_f
from tests.openai_server import OpenAIServer, openai_server_fixture  # noqa: F401  (the `openai_server` fixture)

SESSION_1 = [
    ("Alice", "Hi Bob! I adopted a grey kitten yesterday, her name is Pepper."),
    ("Bob", "No way! I love cats."),
    ("Alice", "The billing service's database is Postgres."),  # one statement the rules read
]
SESSION_2 = [
    ("Bob", "I finished the marathon training plan. The race is in October."),  # what he says of himself
    ("Alice", "Pepper knocked my glasses off the table."),
    ("Alice", "I went to the dentist last week, nothing new there."),  # said of herself, cited by no observation
]


def conversation() -> dict[str, Any]:
    def turns(session: int, lines: list[tuple[str, str]]) -> list[dict[str, Any]]:
        return [{"speaker": s, "dia_id": f"D{session}:{i}", "text": t} for i, (s, t) in enumerate(lines, 1)]

    return {
        "sample_id": "conv-test",
        "conversation": {
            "speaker_a": "Alice",
            "speaker_b": "Bob",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": turns(1, SESSION_1),
            "session_2_date_time": "12:19 am on 4 January, 2024",
            "session_2": turns(2, SESSION_2),
        },
        "observation": {
            "session_1_observation": {
                "Alice": [
                    ["Alice adopted a kitten named Pepper.", "D1:1"],
                    ["Alice's team keeps billing on Postgres.", "D1:3"],
                ]
            },
            "session_2_observation": {"Bob": [["Bob runs a marathon in October.", "D2:1"]]},
        },
        "session_summary": {
            "session_1_summary": "Alice told Bob she adopted a grey kitten named Pepper. Bob loves cats.",
            "session_2_summary": "Bob finished his marathon training; the race is in October.",
        },
        "qa": [],
    }


@pytest.mark.integration
def test_the_benchmark_reports_every_metric_from_its_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "locomo.json"
    data.write_text(json.dumps([conversation()]), encoding="utf-8")
    assert main(["--data", str(data), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    metrics = {k: cell["value"] for k, cell in result["metrics"].items()}
    assert set(TARGETS) <= set(metrics) and result["machine"]["cores"]
    counts = result["knowledge"]
    assert counts["turns"] == 6 and counts["cited"] == 3
    # The Postgres turn (a typed fact), the kitten and the marathon (kept as said), the dentist (said, not cited).
    assert counts["knowledge"] == 4 and counts["knowledge_cited"] == 3
    assert metrics["observation_turn_recall"] == 1.0 and metrics["knowledge_turn_precision"] == 0.75
    assert metrics["cited_share"] == 0.5
    assert result["summaries"]["sessions"] == 2
    assert 0 < metrics["summary_rouge_l_f"] <= 1 and 0 < metrics["lead_rouge_l_f"] <= 1
    assert metrics["summary_vs_lead"] == pytest.approx(metrics["summary_rouge_l_f"] / metrics["lead_rouge_l_f"], 1e-3)
    assert metrics["summary_fragment_joins"] == 0 and metrics["summary_repeated_sentences"] == 0
    assert 0 <= metrics["key_topics_in_reference"] <= 1
    assert result["metrics"]["summary_fragment_joins"]["met"] is True


def test_rouge_l_fragments_and_repeats_are_measured_as_the_docstring_says() -> None:
    assert rouge_l_f("the cat sat on the mat", "the cat sat on the mat") == 1.0
    assert rouge_l_f("the cat sat", "the dog sat") == pytest.approx(2 / 3)  # LCS "the sat": P = R = 2/3
    assert rouge_l_f("", "anything") == 0.0
    assert lead(["one two three", "four five"], 4) == "one two three four"
    # A quote cut after its first sentence and never closed, and a note without a stop, break off.
    summary = 'Alice said, "Hi Bob! Bob said, "No way!" the build is red'
    assert fragments(summary) == ['Alice said, "Hi Bob!', 'Bob said, "No way!" the build is red']
    assert fragments('Alice said, "Hi Bob! Good to see you!" Bob said, "Hi."') == []
    assert repeated("Hi there. Hi there! Bye.") == 1


def test_absent_data_is_said_and_nothing_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--data", str(tmp_path / "absent.json"), "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "is absent" in captured.err


@pytest.mark.integration
def test_with_llm_it_extracts_and_summarizes_through_the_model_the_environment_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, openai_server: OpenAIServer
) -> None:
    data = tmp_path / "locomo.json"
    data.write_text(json.dumps([conversation()]), encoding="utf-8")
    monkeypatch.setenv("PVM_LLM_MODEL", "test-chat")
    monkeypatch.setenv("PVM_LLM_BASE_URL", openai_server.base_url)
    monkeypatch.setenv("PVM_SUMMARIZER", "llm")
    assert main(["--data", str(data), "--json", "--llm"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["extractor"], result["summarizer"]) == ("LLMExtractor", "LLMSummarizer")
    assert len(openai_server.chat_requests()) >= 3  # a chunk of turns to extract, and each session's summary
    monkeypatch.delenv("PVM_LLM_MODEL")
    assert main(["--data", str(data), "--json", "--llm"]) == 1  # said on stderr: set PVM_LLM_MODEL
    assert "set PVM_LLM_MODEL" in capsys.readouterr().err

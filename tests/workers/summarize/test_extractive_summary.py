"""The extractive summary reads as sentences: each ends with a stop, and none is said twice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from contracts import Minute
from contracts.facts import as_sentence
from contracts.summaries import ThreadRef
from workers.summarize.summarizers import ExtractiveSummarizer, Logged, balanced

START = datetime(2026, 3, 1, tzinfo=UTC)


def logged(notes: list[tuple[str, str]]) -> list[Logged]:
    return [
        Logged(
            i + 1,
            Minute.from_dict(
                {
                    "id": f"01KJP6FR00AAAAAAAAAAAAAA{i:02d}",
                    "timestamp": (START + timedelta(minutes=i)).isoformat().replace("+00:00", "Z"),
                    "event_type": kind,
                    "project_id": "p1",
                    "agent_id": note.split(" ", 1)[0] if " said, " in note else "a",
                    "data": {},
                    "context_references": [],
                    "memory_note": note,
                    "thread_id": "t1",
                    "scope": "project",
                }
            ),
        )
        for i, (note, kind) in enumerate(notes)
    ]


def test_notes_written_without_a_stop_do_not_run_together_and_a_sentence_is_said_once() -> None:
    # As `make demo`'s fix-login-bug thread read: notes without a stop ran into one another, and one sentence
    # said twice (another case, another stop) came back twice.
    minutes = logged(
        [
            ("reviewer failed fix-login-bug: flaky end-to-end login test timed out", "task_failed"),
            ("cookie SameSite=Lax fixes the redirect loop", "decision"),
            ("Cookie SameSite=Lax fixes the redirect loop.", "conflict_resolved"),
            ("deployer serialized the writers", "task_completed"),
        ]
    )
    summary = ExtractiveSummarizer(ratio=1.0).summarize("p1", ThreadRef.parse("t1"), minutes).summary
    assert summary == (
        "reviewer failed fix-login-bug: flaky end-to-end login test timed out. "
        "cookie SameSite=Lax fixes the redirect loop. "
        "deployer serialized the writers."
    )


def test_a_sentence_keeps_its_own_ending() -> None:
    assert as_sentence("the build is green") == "the build is green."
    assert as_sentence("is it green?") == "is it green?"
    assert as_sentence('she said "ship it."') == 'she said "ship it."'
    assert as_sentence("we cut the release …") == "we cut the release …"
    assert as_sentence("") == ""


def test_reported_speech_is_summarized_as_who_said_what_without_its_questions_or_talk_to_the_listener() -> None:
    # LoCoMo's turns read 'Caroline said, "Hey Mel! Good to see you!"': split into sentences, the first kept an
    # open quote that was never closed, and a later one a stray closing quote. Now each sentence is its speaker's,
    # named once a turn, and what happened outweighs the pleasantries.
    minutes = logged(
        [
            ('Caroline said, "Hey Mel! Good to see you!"', "message"),
            ('Melanie said, "The parade was great. This was ours." and shared a photo of a float', "message"),
            ('Caroline said, "Did you go with the kids? I adopted a rescue greyhound last month."', "message"),
        ]
    )
    summary = ExtractiveSummarizer(ratio=1.0).summarize("p1", ThreadRef.parse("t1"), minutes).summary
    assert summary == (
        "Caroline: Hey Mel! Melanie: The parade was great. This was ours. "
        "Caroline adopted a rescue greyhound last month."
    )
    # A note that is not reported speech keeps its quotes as written.
    quoted = logged([('"Ship the billing release tonight."', "message")])
    assert ExtractiveSummarizer(ratio=1.0).summarize("p1", ThreadRef.parse("t1"), quoted).summary == (
        '"Ship the billing release tonight."'
    )
    # A statement outranks a pleasantry when only one fits.
    short = ExtractiveSummarizer(ratio=0.01, min_tokens=16).summarize("p1", ThreadRef.parse("t1"), minutes).summary
    assert short == "Caroline adopted a rescue greyhound last month."  # what they said of themselves: of them
    assert balanced('she said "ok" twice') == 'she said "ok" twice'
    assert balanced("\u201cHey there!") == "\u201cHey there!\u201d"


def test_what_a_speaker_says_of_themselves_is_summarized_in_the_third_person() -> None:
    from workers.rules.statements import in_third_person

    assert (
        in_third_person("Dana", "I'm learning Spanish with my sister.") == "Dana is learning Spanish with their sister."
    )
    assert in_third_person("Dana", "My team shipped it and I really enjoy it.") == (
        "Dana's team shipped it and Dana really enjoys it."
    )
    assert in_third_person("Dana", "I go hiking, it helps me.") == "Dana goes hiking, it helps them."
    assert in_third_person("Dana", "The lake froze.") is None  # not of the speaker
    assert in_third_person("Dana", "I'd go.") is None  # would or had: not said which


def test_key_topics_name_what_was_talked_about_not_who_talked_or_how() -> None:
    # LoCoMo's sessions had 'said', the speakers' names and 'really' for key topics.
    minutes = logged(
        [
            ('caroline said, "I really loved the pottery class, the glaze came out great!"', "message"),
            ('melanie said, "Wow, pottery! I went camping by the lake with the kids."', "message"),
            ('caroline said, "The lake sounds great. I am thinking about adoption agencies."', "message"),
            ('melanie said, "Adoption is a big step, really. The kids loved camping."', "message"),
        ]
    )
    chunk = ExtractiveSummarizer().summarize("p1", ThreadRef.parse("t1"), minutes)
    assert chunk.key_topics and not {"said", "caroline", "melanie", "really", "great", "wow"} & set(chunk.key_topics)
    assert {"pottery", "camping", "adoption", "lake", "kids"} & set(chunk.key_topics)


def test_a_summary_says_a_thing_once_and_then_what_else_happened() -> None:
    # Three notes on the cache eviction, one on the schema migration: the first cache note outweighs the migration
    # note, but once it is kept, its key words count nothing in the other cache notes, so the migration comes next.
    # With room for every sentence, a note that only repeats what is said ("again" is a stop word) is left out.
    notes = [
        ("cache eviction storm hit the checkout replicas during the sale", "task_failed"),
        ("the cache eviction storm hit checkout replicas again", "observation"),
        ("the schema migration finished", "task_completed"),
        ("checkout replicas: cache eviction storm", "observation"),
    ]
    minutes = logged(notes)
    tight = ExtractiveSummarizer(ratio=0.0, min_tokens=31).summarize("p1", ThreadRef.parse("t1"), minutes).summary
    assert tight == "cache eviction storm hit the checkout replicas during the sale. the schema migration finished."
    roomy = ExtractiveSummarizer(ratio=1.0).summarize("p1", ThreadRef.parse("t1"), minutes).summary
    assert roomy == tight

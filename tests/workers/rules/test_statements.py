"""Statements: what a speaker says of themselves that lasts is kept as said, when no slot can be read from it.

The sentences are written for these tests (not taken from any benchmark set).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pvm.config import Settings
from tests.workers.minutes import minute
from workers.facts.extraction import RULE_CONFIDENCE, RuleExtractor
from workers.facts.pool import extractor_from_settings
from workers.rules.statements import STATEMENT, is_statement, reported, statements


@pytest.mark.parametrize(
    "sentence",
    [
        "I adopted a rescue greyhound last month.",
        "We've been going to the same lake every summer since 2015.",
        "My brother started a bakery in March.",
        "Honestly, I finished the first draft of my novel yesterday.",
        "I'm learning Portuguese for the trip with my partner.",
        "We volunteer at the food bank on weekends.",
        "I love restoring old bikes with my dad.",
    ],
)
def test_what_happened_to_the_speaker_or_holds_for_them_is_a_statement(sentence: str) -> None:
    assert is_statement(sentence)


@pytest.mark.parametrize(
    "sentence",
    [
        "Did you finish the draft you started last month?",  # a question
        'Did you finish the draft you started last month?"',  # however it is punctuated
        "Thanks so much, I really appreciated the help yesterday.",  # thanks
        "You should be so proud of what you did last year.",  # to the listener
        "I love your new painting of the harbour.",  # about the listener's thing
        "I'll look at the billing worker after lunch.",  # what the speaker means to do
        "I need to get this task wrapped up next Monday.",
        "I'm off work today and resting a lot.",  # for the day only
        "The vendor rejected our calls for sending too many.",  # "our" is not the subject
        "Sounds great, I went there once too.",  # small talk
        "I went there.",  # too short to say anything that lasts
    ],
)
def test_questions_thanks_encouragement_plans_and_small_talk_are_not(sentence: str) -> None:
    assert not is_statement(sentence)


def test_reported_speech_names_the_speaker() -> None:
    assert reported('Dana said, "I moved to Lisbon in May." and shared a photo of a tram') == (
        "Dana",
        "I moved to Lisbon in May.",
    )
    assert reported("deployer: build is green") == (None, "deployer: build is green")
    assert list(statements("Hi! I moved to Lisbon in May. Do you like it there? I've taught piano for ten years.")) == [
        "I moved to Lisbon in May.",
        "I've taught piano for ten years.",
    ]


def test_a_minute_no_rule_reads_keeps_what_its_speaker_said_in_their_statement_slot() -> None:
    note = 'Dana said, "Hey! I moved to Lisbon in May. I have been teaching piano for ten years."'
    found = RuleExtractor().extract([minute("message", memory_note=note, agent_id="dana-bot")])
    assert [(c.type, c.subject, c.attribute, c.value, c.single_valued) for c in found] == [
        ("fact", "dana", STATEMENT, "I moved to Lisbon in May", False),  # the value as cleaned; the text whole
        ("fact", "dana", STATEMENT, "I have been teaching piano for ten years", False),
    ]
    assert found[0].text == "Dana said: I moved to Lisbon in May."
    assert {c.rule for c in found} == {"statement"} and found[0].confidence == RULE_CONFIDENCE["statement"]
    # Without reported speech the minute's agent is the speaker.
    (own,) = RuleExtractor().extract(
        [minute("message", memory_note="I spent most of last week untangling the nightly retries.")]
    )
    assert (own.subject, own.attribute) == ("a1", STATEMENT)


def test_a_minute_with_a_typed_fact_keeps_no_statement_and_statements_can_be_turned_off() -> None:
    note = "I moved last week. The billing service's database is Postgres."
    (typed,) = RuleExtractor().extract([minute("message", memory_note=note)])
    assert typed.slot == ("billing service", "database")
    said = "I adopted a rescue greyhound last month."
    assert RuleExtractor(statements=False).extract([minute("message", memory_note=said)]) == []


def test_the_pools_extractor_keeps_statements_unless_pvm_fact_statements_is_off(tmp_path: Path) -> None:
    said = minute("message", memory_note="I adopted a rescue greyhound last month.")
    keep = extractor_from_settings(Settings.from_env({"PVM_HOME": str(tmp_path)}))
    off = extractor_from_settings(Settings.from_env({"PVM_HOME": str(tmp_path), "PVM_FACT_STATEMENTS": "off"}))
    assert [c.attribute for c in keep.extract([said])] == [STATEMENT]
    assert off.extract([said]) == []

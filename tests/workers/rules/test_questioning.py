"""Which sentences question a held fact: a change said in words no rule reads, of exactly one held slot."""

from __future__ import annotations

import pytest

from workers.rules.questioning import Held, content_words, may_question, questions, value_kinds

CADENCE = Held("f1", "trains", "cadence", "every two weeks")
WINDOW = Held("f2", "soc 2 programme", "observation window", "1 April to 30 September 2026")
AUDITOR = Held("f3", "soc 2 programme", "auditor", "Prescott & Lang LLP")
WINDOW_VALUE = Held("f4", "observation window", "value", "1 April to 30 September 2026")
PASSWORDS = Held("f5", "workforce passwords", "value", "at least 12 characters")
HELD = [CADENCE, WINDOW, AUDITOR, PASSWORDS]


@pytest.mark.parametrize(
    ("sentence", "fact"),
    [
        # The attribute left implied: the subject, a change, and a value of the held value's kind.
        ("Starting next Monday every train is one week long.", CADENCE),
        ("We're going weekly: from now on every train ships on Thursdays.", CADENCE),
        # The attribute named, the new value a date the held one does not hold.
        ("Prescott & Lang extended the observation window: it now ends on 31 October 2026.", WINDOW),
        ("From the 1st of next month workforce passwords go to 14 characters.", PASSWORDS),
    ],
)
def test_a_change_in_words_no_rule_reads_questions_the_one_slot_it_names(sentence: str, fact: Held) -> None:
    assert questions(sentence, HELD) == fact


@pytest.mark.parametrize(
    "sentence",
    [
        "Should we move to weekly trains?",  # a question
        "Maybe we go weekly trains next quarter.",  # a hedge
        "Random thought: we could move the trains to weekly, not a proposal yet.",  # a proposal
        "Every train is one week long.",  # no change said
        "The trains now run every two weeks, as before.",  # the held value said again
        "Twelve trains shipped since 6 April.",  # no value of a cadence's kind
        "The observation window now has 40 controls in scope.",  # a quantity, not a date
        "The new auditor starts on 3 June 2026.",  # the auditor's value is no date
    ],
)
def test_questions_hedges_restatements_and_other_kinds_question_nothing(sentence: str) -> None:
    assert questions(sentence, HELD) is None


def test_two_slots_that_fit_are_one_too_many_and_a_generic_attribute_names_nothing() -> None:
    other = Held("f9", "hotfix trains", "cadence", "every day")
    assert questions("Starting next Monday every train is one week long.", [CADENCE, other]) == CADENCE
    both = Held("f8", "trains", "length", "two weeks long")
    assert questions("Starting next Monday every train is one week long.", [CADENCE, both]) is None
    # "value" names no slot: the subject's words must be there.
    assert questions("It now ends on 31 October 2026.", [WINDOW_VALUE]) is None
    assert questions("The observation window now ends on 31 October 2026.", [WINDOW_VALUE]) == WINDOW_VALUE


def test_a_note_may_question_only_with_a_change_and_a_value() -> None:
    assert may_question("OK, we're going weekly. Starting next Monday every train is one week long.")
    assert not may_question("Thanks all, see you Monday.")
    assert not may_question("Every train is one week long.")  # no change said
    # The change, the value and the statement in one sentence: not a question here and a date there.
    assert not may_question("Should we go weekly now? Anyway, see you on 3 June.")


def test_value_kinds_and_content_words() -> None:
    assert value_kinds("every two weeks") == {"cadence"}
    assert value_kinds("1 April to 30 September 2026") == {"date"}
    assert value_kinds("Wednesday 18:00 UTC") == {"time"}
    assert value_kinds("99.7%") == {"percent"}
    assert value_kinds("within 4 hours of termination") == {"duration"}
    assert value_kinds("at least 12 characters") == {"count"}
    assert value_kinds("one week long") == {"cadence"}
    assert value_kinds("minSdk 4.2.1") == {"version"}
    assert content_words("The release trains of the app") == frozenset({"release", "train", "app"})


def test_a_subject_is_named_by_its_head_after_a_determiner_not_after_another_word() -> None:
    service = Held("f7", "auth service", "timeout", "30 seconds")
    train = Held("f6", "release train", "cadence", "every two weeks")
    assert questions("Starting next Monday every train is one week long.", [train]) == train
    assert questions("The service now times out after 10 seconds.", [service]) == service
    assert questions("The payments service now times out after 10 seconds.", [service]) is None

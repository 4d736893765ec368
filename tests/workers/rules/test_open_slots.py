"""Open slots: statements about things no `ATTRIBUTES` phrase names, read with the slot the sentence gives.

Wordings here are written for these tests (not taken from any benchmark set): labelled lines and list items
under a heading, definite copulas, ownership, change verbs, lists, dates; and the chatter that must read as
nothing.
"""

from __future__ import annotations

import pytest

from tests.workers.minutes import minute
from workers.facts.extraction import RULE_CONFIDENCE, Candidate, RuleExtractor, resolve_open_slots
from workers.rules.open_slots import Line, heading_subject, lines, names_something


def extract(note: str, event_type: str = "message") -> list[Candidate]:
    """The slots read from a note (what its speaker says of themselves is tested in test_statements.py)."""
    return RuleExtractor(statements=False).extract([minute(event_type, memory_note=note)])


def read(note: str) -> set[tuple[str, str, str]]:
    return {(c.subject, c.attribute, c.value) for c in extract(note)}


def test_a_list_item_under_a_heading_is_about_the_heading() -> None:
    note = (
        "Payments platform, the settled record:\n"
        "- Acquirer: Northwind Bank (contract signed in May)\n"
        "- Settlement window: 2 March to 9 March 2027\n"
        "- Card vault: Basis Theory"
    )
    assert read(note) == {
        ("payments platform", "acquirer", "Northwind Bank"),
        ("payments platform", "settlement window", "2 March to 9 March 2027"),
        ("payments platform", "card vault", "Basis Theory"),
    }
    assert {c.rule for c in extract(note)} == {"open_label"}
    assert all(c.confidence == RULE_CONFIDENCE["open_label"] for c in extract(note))


def test_lines_carry_their_lists_heading_and_only_theirs() -> None:
    note = "Kiosk fleet, baseline:\n* Vendor: Elo\n* OS: Android 13\nThe rollout starts soon."
    assert list(lines(note)) == [
        Line("Kiosk fleet, baseline:", None),
        Line("Vendor: Elo", "kiosk fleet", introduced=True),
        Line("OS: Android 13", "kiosk fleet", introduced=True),
        Line("The rollout starts soon.", None),
    ]
    assert heading_subject("Rollout plan for the kiosks, as agreed with ops:") == "rollout plan for the kiosks"
    assert heading_subject("we talked:") is None


def test_a_labelled_line_outside_a_list() -> None:
    assert read("Incident pager: Opsgenie.") == {("incident pager", "value", "Opsgenie")}
    assert read("Retention period for audit logs: 400 days.") == {("audit logs", "retention", "400 days")}


def test_a_plural_label_gives_one_fact_per_value_in_a_slot_that_holds_many() -> None:
    found = extract("Regions we serve from: Frankfurt, Dublin and Ohio.")
    assert found == []  # "we serve": a clause in the label
    found = extract("Supported browsers for the admin app: Firefox, Safari and Chrome.")
    assert {(c.subject, c.attribute, c.value) for c in found} == {
        ("admin app", "supported browsers", "Firefox"),
        ("admin app", "supported browsers", "Safari"),
        ("admin app", "supported browsers", "Chrome"),
    }
    assert not any(c.single_valued for c in found)


def test_named_values_in_one_line_are_one_fact_each() -> None:
    note = "Mobile baseline:\n- Android: minSdk 26, compileSdk 35."
    assert read(note) == {("android", "minsdk", "26"), ("android", "compilesdk", "35")}


def test_a_definite_copula_with_a_named_value() -> None:
    assert read("The new payment gateway is Adyen.") == {("payment gateway", "value", "Adyen")}
    assert read("The release manager for 7.1 is Tomás Ruiz.") == {("7.1", "release manager", "Tomás Ruiz")}
    # The inverse, with a list of named values.
    found = read("Scope: Billing and Refunds are the modules for this review.")
    assert found == {("review", "modules", "Billing"), ("review", "modules", "Refunds")}


def test_ownership_said_several_ways_is_one_owner_that_changes() -> None:
    (owned,) = extract("The ledger exporter is owned by Ana Costa.")
    assert (owned.type, owned.slot, owned.value, owned.single_valued) == (
        "entity",
        ("ledger exporter", "owner"),
        "Ana Costa",
        True,
    )
    assert read("Kenji owns billing, Ana owns refunds.") == {("billing", "owner", "Kenji"), ("refunds", "owner", "Ana")}
    (handed,) = extract("Handing the ledger exporter over to Bo Lind from today, I'm off to the search team.")
    assert (handed.slot, handed.value, handed.supersedes_hint) == (("ledger exporter", "owner"), "Bo Lind", True)
    assert extract("Giving ownership to the agent with the better record.") == []  # no name: nothing


def test_change_verbs_from_the_lexicon_supersede() -> None:
    for note, slot, value in [
        ("Deployment target moved to iOS 17 for 8.0.", ("deployment target", "value"), "iOS 17"),
        ("we pinned protobuf to 4.25.3 on every runner", ("protobuf", "value"), "4.25.3"),
        ("checkout_v3 goes to 40% today", ("checkout_v3", "value"), "40%"),
        ("Report worker replica count bumped to 6", ("report worker", "replicas"), "6"),
    ]:
        (c,) = extract(note)
        assert (c.slot, c.value, c.supersedes_hint, c.rule) == (slot, value, True, "open_change"), note
    assert extract("a second failure in a week goes to Ana") == []  # who handles it, not a value
    assert extract("reviewer reviewed a small change to the CI cache") == []  # "change" the noun


def test_a_lead_in_before_the_statement_is_read_past() -> None:
    (c,) = extract("Scratch that: the message bus is NATS, not Kafka.")
    assert (c.slot, c.value, c.supersedes_hint) == (("message bus", "value"), "NATS", True)
    (c,) = extract("Agreed with support: from the 1st of next month the reply SLA relaxes to 4 hours.")
    assert (c.slot, c.value, c.valid_from) == (("reply", "sla"), "4 hours", "2026-12-01T00:00:00.000000Z")


def test_dates_in_values_are_grounded_to_the_minute() -> None:
    (c,) = extract("Target date for the export rewrite: 15 January.")
    assert (c.slot, c.value) == (("export rewrite", "deadline"), "2027-01-15")  # the next 15 January
    (c,) = extract("this task is due next Monday, please")
    assert (c.slot, c.value) == (("task", "deadline"), "2026-11-30")


@pytest.mark.parametrize(
    "note",
    [
        "the database is Postgres",  # whose?
        "Update: the build is green again",
        "Priya: sounds good to me",
        "Tester on fix-login: session cookie expires after 5 minutes.",
        "checked the config: search api replica count reads three",
        "storing secrets in the repository is off-limits",
        "A must-have for the next release: dark mode",
        "ledgerd: a ledger daemon",
        "my favourite band is Coldplay",
        "The party was amazing!",
        "Caroline is so proud of Melanie",
        "we are swapping the vendor next week",
        "Runbook for the token store: check for a memory leak first.",
        "The overnight import broke: RAM usage grew until it was killed.",
        "everything else moves to Dagster",
        "is the message bus NATS now?",
        "the message bus might be NATS",
        "pt-BR stays post-launch",
    ],
)
def test_chatter_opinions_clauses_and_questions_read_as_nothing(note: str) -> None:
    assert extract(note) == []


def test_a_value_names_something() -> None:
    assert names_something("Basis Theory") and names_something("4.25.3") and names_something("qa/devices.yaml")
    assert not names_something("amazing") and not names_something("off-limits") and not names_something("quite Big")
    assert not names_something("exactly as Priya set it")


def test_a_bare_item_of_a_list_its_heading_introduces_is_one_of_many() -> None:
    note = "Test phones for the beta, agreed with QA:\n• Pixel 9 (Android 15)\n• Galaxy A55\n• 212 builds uploaded"
    found = extract(note)
    assert {(c.subject, c.attribute, c.value) for c in found} == {
        ("beta", "test phones", "Pixel 9"),
        ("beta", "test phones", "Galaxy A55"),
    }
    assert all(not c.single_valued and c.rule == "open_item" for c in found)
    # Without a colon the heading introduces nothing: the items are statements of their own.
    assert extract("Test phones for the beta.\n• Pixel 9\n• Galaxy A55") == []
    # Numbered items are items, not "1." sentences.
    assert read("Phones:\n1. Pixel 9\n2. Galaxy A55") == {
        ("phones", "value", "Pixel 9"),
        ("phones", "value", "Galaxy A55"),
    }


def test_arrows_state_a_change() -> None:
    for note, slot, value in [
        ("bumped grpcio 1.62 → 1.64 on the build image", ("grpcio", "value"), "1.64"),
        ("checkout_v3 -> 75%", ("checkout_v3", "value"), "75%"),
        ("Build image: ubuntu-22.04 → ubuntu-24.04", ("build image", "value"), "ubuntu-24.04"),
    ]:
        (c,) = extract(note)
        assert (c.slot, c.value, c.supersedes_hint) == (slot, value, True), note


def test_a_day_something_is_due_by_is_its_deadline() -> None:
    (goal,) = extract("The billing export is retired by 31 March 2027.")
    assert (goal.type, goal.slot, goal.value, goal.single_valued) == (
        "goal",
        ("billing export", "deadline"),
        "2027-03-31",
        True,
    )
    (fact,) = extract("The pricing review closes on 5 December.")
    assert (fact.type, fact.slot, fact.value) == ("fact", ("pricing review", "deadline"), "2026-12-05")
    assert extract("I am going to a concert on Saturday") == []
    assert extract("The billing export is retired by the platform team") == []  # no day


def test_how_often_and_where_a_thing_lives() -> None:
    assert read("Key rotations for all production services run monthly.") == {
        ("key rotations for all production services", "cadence", "monthly")
    }
    assert read("Production database access is reviewed every quarter, by two people.") == {
        ("production database access", "cadence", "every quarter")
    }
    (c,) = extract("Runbooks now live in the ops-handbook repo instead of the wiki.")
    assert (c.slot, c.value, c.supersedes_hint) == (("runbooks", "location"), "ops-handbook repo", True)
    assert extract("I go running every morning") == []
    assert extract("my brother lives in Ohio") == []


def test_a_labels_value_that_is_a_statement_is_about_the_label() -> None:
    assert read("kiosk app: minSdk goes to 31 (Android 12)") == {("kiosk app", "minsdk", "31")}
    assert read("Ledger service: request timeout is 45 seconds") == {
        ("ledger service", "request_timeout", "45 seconds")
    }
    assert read("Domain owners for now: Kenji owns billing, Ana owns refunds.") == {
        ("billing", "owner", "Kenji"),
        ("refunds", "owner", "Ana"),
    }
    # A label that is itself the statement: what it says, not what follows.
    assert read("The pricing review closes on 5 December: every team signs off by then.") == {
        ("pricing review", "deadline", "2026-12-05")
    }


def test_one_clause_of_a_sentence_can_state_it() -> None:
    note = "I'm moving to the search team, so the ledger exporter is handed over to Bo Lind from May 1."
    (c,) = extract(note)
    assert (c.slot, c.value, c.supersedes_hint) == (("ledger exporter", "owner"), "Bo Lind", True)


def test_how_a_thing_is_done_and_how_long_it_is_kept() -> None:
    assert read("Feature flags are served from Unleash Edge.") == {("feature flags", "served from", "Unleash Edge")}
    assert read("The load test is booked with Hammerhead Labs; results by Friday.") == {
        ("load test", "booked with", "Hammerhead Labs")
    }
    assert read("Audit logs are kept for 400 days today.") == {("audit logs", "retention", "400 days")}
    assert extract("The deploy is blocked by the flaky test.") == []  # how it is doing, not how it is done
    assert read("Workforce passwords are at least 14 characters.") == {
        ("workforce passwords", "value", "at least 14 characters")
    }


def test_identifiers_name_one_slot_however_the_sentence_reaches_them() -> None:
    first = extract("Warehouses, first sizing:\n- LOAD_WH (ingest jobs): Small\n- Mobile: minSdk 26")
    assert {(c.subject, c.attribute, c.value) for c in first} == {
        ("load_wh", "value", "Small"),
        ("mobile", "minsdk", "26"),
    }
    (bumped,) = extract("LOAD_WH bumped to Large, ingest was queueing.")
    (again,) = extract("Mobile minSdk is now 28 on main.")
    assert (bumped.slot, bumped.value, bumped.supersedes_hint) == (("load_wh", "value"), "Large", True)
    assert (again.slot, again.value, again.supersedes_hint) == (("mobile", "minsdk"), "28", True)
    assert extract("Rolling back to the previous release.") == []
    assert extract("cold start p50 back to 1.2 s on the Pixel 9") == []  # a measurement, not a setting
    (back,) = extract("LOAD_WH back to Small now that the backfill is over.")
    assert (back.slot, back.value) == (("load_wh", "value"), "Small")


def test_a_said_change_takes_the_one_slot_it_changes_and_nothing_on_overlap_alone() -> None:
    (old,) = extract("Raw event data is kept for 400 days.")
    (new,) = extract("Effective tomorrow, raw event retention drops to 90 days.")
    (near,) = extract("Raw event exports are kept for 30 days.")
    assert (old.slot, new.slot, new.supersedes_hint) == (
        ("raw event data", "retention"),
        ("raw event", "retention"),
        True,
    )
    assert [c.slot for c in resolve_open_slots([old, new], {})] == [old.slot, old.slot]
    # Two slots it could change: it stays where it was said.
    assert [c.slot for c in resolve_open_slots([old, near, new], {})][-1] == new.slot
    # A statement that says no change never moves, nor one of another attribute.
    (kept,) = extract("Raw event archives are kept for 2 years.")
    assert resolve_open_slots([old, kept], {})[-1].slot == kept.slot


def test_a_plural_labels_list_after_a_relative_clause_and_a_rating() -> None:
    assert read("Payment methods we accept: Visa for cards, SEPA for transfers and iDEAL for NL.") == {
        ("payment methods", "value", "Visa"),
        ("payment methods", "value", "SEPA"),
        ("payment methods", "value", "iDEAL"),
    }
    assert read("Columns in dim_account that we treat as PII: email, phone_number, birth_date.") == {
        ("dim_account", "columns", "email"),
        ("dim_account", "columns", "phone_number"),
        ("dim_account", "columns", "birth_date"),
    }
    assert read("Stripe is rated low risk because the DPA is signed.") == {("stripe", "rating", "low risk")}
    (c,) = extract("Stripe re-rated to medium risk after the incident.")  # the rating's change: one slot
    assert (c.slot, c.value, c.supersedes_hint) == (("stripe", "rating"), "medium risk", True)


def test_it_and_they_are_what_the_sentence_before_was_about() -> None:
    note = "The export service is owned by Ana Costa. It now lives in the platform-tools repo."
    assert read(note) == {
        ("export service", "owner", "Ana Costa"),
        ("export service", "location", "platform-tools repo"),
    }
    # With nothing read before, "it" stays a pronoun: nothing.
    assert extract("It is owned by Dana Cole.") == []
    assert extract("We met the vendor on Monday. It is owned by Dana Cole.") == []


def test_a_swap_named_by_its_old_value_takes_the_slot_that_holds_it_or_nothing() -> None:
    (flags,) = extract("Feature flags: LaunchDarkly.")
    (swap,) = extract("We're swapping LaunchDarkly for Unleash next sprint.")
    assert (swap.rule, swap.replaces_value, swap.value, swap.supersedes_hint) == (
        "open_swap",
        "LaunchDarkly",
        "Unleash",
        True,
    )
    assert [(c.slot, c.value) for c in resolve_open_slots([flags, swap], {})] == [
        (flags.slot, "LaunchDarkly"),
        (flags.slot, "Unleash"),
    ]
    # Its old value held nowhere: the swap says nothing PVM can place, and is dropped.
    assert resolve_open_slots([swap], {}) == []
    # "Y replaces X" and "moved off X to Y" are swaps too; a sentence that names the slot needs no resolving.
    (replaces,) = extract("Dagster replaces Airflow 1.10, self-hosted on EKS.")
    assert (replaces.replaces_value, replaces.value) == ("Airflow 1.10", "Dagster")
    (moved,) = extract("Migrating off Jenkins to Buildkite this sprint.")
    assert (moved.replaces_value, moved.value) == ("Jenkins", "Buildkite")
    (named,) = extract("Swapping SQLite for DynamoDB as the ledger service's DB.")
    assert (named.slot, named.value, named.replaces_value) == (("ledger service", "database"), "DynamoDB", None)


def test_a_value_added_to_a_list_joins_the_held_list_its_words_name() -> None:
    assert read("I'm adding the Moto G54 (budget tier) to the test phones.") == {
        ("test phones", "member", "Moto G54 (budget tier)")
    }
    assert read("Added Odile to the on-call rotation, starting Monday.") == {("on-call rotation", "member", "Odile")}
    assert read("We added 2 GB to the cache.") == set()  # an amount, not a member
    assert all(c.rule == "open_added" and not c.single_valued for c in extract("Added Odile to the on-call rotation."))
    # The list said before (held, or earlier in the batch): the added value joins it, whatever the list is called.
    phones = extract("Test phones for the kiosk rollout: Pixel 7 and Galaxy A54.")
    regions = extract("Regions for the kiosk rollout: Ohio and Oregon.")
    added = resolve_open_slots([*phones, *regions, *extract("Adding the Moto G54 to this year's test phone list.")], {})
    assert [(c.subject, c.attribute, c.value) for c in added][-1] == ("kiosk rollout", "test phones", "Moto G54")
    # No list named: it stays the list the sentence names.
    alone = resolve_open_slots([*phones, *extract("Adding Odile to the on-call rotation.")], {})
    assert [(c.subject, c.attribute) for c in alone][-1] == ("on-call rotation", "member")


def test_a_change_on_a_named_day_holds_from_that_day_and_finds_its_slot_by_stem() -> None:
    (later,) = extract("The kiosk screen timeout goes to 90 seconds on 1 July.")
    assert (later.slot, later.value, later.valid_from[:10]) == (
        ("kiosk screen", "timeout"),
        "90 seconds",
        "2026-07-01",
    )
    (held,) = extract("The timeout of the kiosk screens is 60 seconds.")
    moved = resolve_open_slots([held, later], {})
    assert moved[-1].slot == held.slot  # "kiosk screen" is the held "kiosk screens"


def test_what_the_speaker_says_is_theirs_they_own() -> None:
    (owned,) = extract("Reminder that the release notes are mine this cycle, so send changes to me.")
    assert (owned.slot, owned.value, owned.rule) == (("release notes", "owner"), "a1", "open_owner")
    assert read("The mistake is mine, I should have checked.") == set()
    assert read("Which one is mine?") == set()


def test_what_someone_asks_for_by_a_day_is_due_that_day() -> None:
    (due,) = extract("The auditors ask for the Q3 access review package by 15 June.")
    assert (due.type, due.slot, due.value, due.rule) == (
        "goal",
        ("q3 access review package", "deadline"),
        "2026-06-15",
        "open_due",
    )


def test_now_before_how_often_is_a_change_not_part_of_the_subject() -> None:
    (changed,) = extract("The release train now runs weekly.")
    (said,) = extract("The release train runs every two weeks.")
    assert (changed.slot, changed.value, changed.supersedes_hint) == (("release train", "cadence"), "weekly", True)
    assert (said.slot, said.supersedes_hint) == (("release train", "cadence"), False)


def test_a_time_limit_on_what_is_done_is_a_deadline_and_a_later_one_replaces_it() -> None:
    (held,) = extract("Support tickets from paying customers are answered within 4 business hours.")
    assert (held.type, held.slot, held.value, held.rule, held.single_valued) == (
        "constraint",
        ("support tickets from paying customers", "response deadline"),
        "within 4 business hours",
        "open_within",
        True,
    )
    # What is done names the deadline: a noun from the lexicon, "-ated" and "-ified" as nouns, else the stem.
    assert read("API keys are rotated within 90 days.") == {("api keys", "rotation deadline", "within 90 days")}
    assert read("On-call is notified within five minutes.") == {
        ("on-call", "notification deadline", "within five minutes")
    }
    assert read("Expense reports are uploaded within two weeks.") == {
        ("expense reports", "upload deadline", "within two weeks")
    }
    # ", not 4" names the limit it replaces: the change takes the held slot whose subject holds its words.
    (later,) = extract("From Monday, tickets are answered within 2 business hours, not 4.")
    assert (later.slot, later.supersedes_hint) == (("tickets", "response deadline"), True)
    assert resolve_open_slots([held, later], {})[-1].slot == held.slot
    (unsaid,) = extract("Tickets are answered within 2 business hours.")
    assert not unsaid.supersedes_hint
    assert resolve_open_slots([held, unsaid], {})[-1].slot == ("tickets", "response deadline")
    # A hope or a past event is no time limit on a thing.
    assert read("I hope we hear back within a week.") == set()
    assert read("We shipped it within two days, which was great.") == set()


def test_how_many_of_a_thing_each_one_needs_is_a_constraint_and_a_later_count_replaces_it() -> None:
    (held,) = extract("Release policy: every mobile release needs two sign-offs from QA, recorded in Jira.")
    assert (held.type, held.slot, held.value, held.rule, held.single_valued) == (
        "constraint",
        ("mobile release", "required sign-off"),
        "2 sign-offs",
        "open_needs",
        True,
    )
    assert read("Service passwords require at least 16 characters.") == {
        ("service passwords", "required character", "at least 16 characters")
    }
    (later,) = extract("Correction: mobile releases need three sign-offs, not two.")
    assert (later.slot, later.value, later.supersedes_hint) == (
        ("mobile releases", "required sign-off"),
        "3 sign-offs",
        True,
    )
    assert resolve_open_slots([held, later], {})[-1].slot == held.slot
    # A passing need, or the speaker's, is none.
    assert read("The migration needs 3 more days.") == set()
    assert read("I need 2 reviewers on this one.") == set()
    assert read("That needs one more look before we merge.") == set()


def test_a_time_of_day_a_thing_must_be_ready_by_is_a_deadline_and_a_new_time_keeps_its_days() -> None:
    (held,) = extract("Delivery register:\n• nightly_ledger export: ready by 05:30 UTC every day, holidays included.")
    assert (held.type, held.slot, held.value, held.rule, held.single_valued) == (
        "constraint",
        ("nightly_ledger export", "readiness deadline"),
        "05:30 UTC daily",
        "open_ready_by",
        True,
    )
    assert read("The churn dashboard is refreshed by 8 am on Mondays.") == {
        ("churn dashboard", "refresh deadline", "8 am Mondays")
    }
    assert read("Added to the register: orders_hourly mart fresh by 09:15 UTC on weekdays.") == {
        ("orders_hourly mart", "freshness deadline", "09:15 UTC weekdays")
    }
    (now,) = extract("The churn dashboard is now refreshed by noon, not 8 am.")
    assert now.supersedes_hint
    # "the export SLA moves to 06:00 UTC": the held deadline ("SLA" is a deadline's word), the days it holds on kept.
    (later,) = extract("From Monday the nightly_ledger SLA moves to 06:00 UTC.")
    assert (later.slot, later.value) == (("nightly_ledger", "sla"), "06:00 UTC")
    (moved,) = resolve_open_slots([held, later], {})[1:]
    assert (moved.slot, moved.value) == (held.slot, "06:00 UTC daily")
    # A state someone will be in, or was in, is no deadline of a thing.
    assert read("I'll be done by 5pm.") == set()
    assert read("The report was ready by 9 am today.") == set()
    assert read("We should be fine by 10:00.") == set()


def test_an_added_value_joins_the_list_of_the_thing_its_words_name_whole() -> None:
    criteria = extract("Security and Availability are the trust service criteria for this audit.")
    vendors = extract("Vendors in scope for this year: Okta and Zendesk.")
    added = resolve_open_slots([*criteria, *vendors, *extract("Adding Privacy to the audit scope.")], {})
    # "scope" is a word of the vendors' list too; the audit's list is the one whose subject the phrase names whole.
    assert [(c.subject, c.attribute, c.value) for c in added][-1] == ("audit", "trust service criteria", "Privacy")


def test_a_lead_in_names_the_thing_a_rule_is_about_when_the_sentence_does_not() -> None:
    note = "Contractor exit, agreed with HR: when a contract ends, every badge and laptop is returned within 3 days."
    assert read(note) == {("contractor exit", "return deadline", "within 3 days")}
    # The sentence's own subject comes first; a lead-in that is no thing names nothing.
    assert read("Contractor exit, agreed with HR: laptops are returned within 3 days.") == {
        ("laptops", "return deadline", "within 3 days")
    }
    assert read("Agreed with HR: when a contract ends, everything it held is returned within 3 days.") == set()


def test_what_a_thing_stays_on_how_far_it_is_rolled_out_and_a_role_as_its_value() -> None:
    assert read("The legacy billing jobs stay on Jenkins until Q4, everything else moves.") == {
        ("legacy billing jobs", "platform", "Jenkins")
    }
    assert read("core stays on 1.8") == set()  # a version of what was just said, not what it runs on
    assert read("The ticket stays on hold.") == set()
    (flag,) = extract("new_search flag now on for 10% of users (web only).")
    assert (flag.slot, flag.value, flag.supersedes_hint) == (("new_search flag", "value"), "10%", True)
    assert read("The ledger_v2 path is live for 5% of traffic.") == {("ledger_v2 path", "value", "5%")}
    # A later "goes to 25%" changes the same value.
    (later,) = extract("new_search goes to 25% today.")
    assert resolve_open_slots([flag, later], {})[-1].slot == flag.slot
    assert read("We're at 50% of the budget.") == set()
    assert read("The release manager is whoever holds the mobile on-call that week.") == {
        ("release manager", "value", "mobile on-call")
    }

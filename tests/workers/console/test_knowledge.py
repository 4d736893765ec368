"""The knowledge pages (workers/console/knowledge.py) over the real API handlers, streams and facts pool.

A change from the console is a minute the API's handler appends to the shard streams; `feed.settle()` hands the new
ones to the facts pool (in process, as the log pool's fan-out would), and the pages then show the change.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from contracts.minute import Minute
from pvm.config import Settings
from tests.workers.api.test_api_facts import FactsFeed
from tests.workers.console.conftest import OPS, ORIGIN, TEAM_A, sign_in

K = "/ui/projects/apollo/knowledge"
FACT_LINK = re.compile(r'href="/ui/projects/apollo/facts/([0-9a-f-]{36})"')


@pytest.fixture
def feed(redis_client: redis.Redis, settings: Settings) -> FactsFeed:
    return FactsFeed(redis_client, settings)


def change(client: TestClient, path: str, project: str = "apollo", **form: str) -> Any:
    """A change posted from a console form, as a browser of this origin sends it (the redirect not followed)."""
    return client.post(f"/ui/projects/{project}/{path}", data=form, headers=ORIGIN, follow_redirects=False)


def asserted(client: TestClient, feed: FactsFeed, **form: str) -> tuple[list[Minute], str]:
    """Assert a fact from the form and let the facts pool apply it: the change minutes written and the fact's id."""
    answer = change(client, "facts", **form)
    assert answer.status_code == 303, answer.text
    minutes = feed.settle()
    return minutes, fact_in(answer.headers["location"])


def fact_in(location: str) -> str:
    """The fact id a change's redirect names."""
    found = re.search(r"fact=([0-9a-f-]{36})", location)
    assert found is not None, location
    return found.group(1)


def iso_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def section(page: str, heading_id: str) -> str:
    """The part of a page from the heading with this id to the next h2."""
    start = page.index(f'id="{heading_id}"')
    end = page.find("<h2", start)
    return page[start : end if end >= 0 else len(page)]


# -- reading ------------------------------------------------------------------------------------------------------


def test_the_knowledge_page_lists_facts_by_tier_and_type(console: TestClient, feed: FactsFeed) -> None:
    asserted(console, feed, subject="payments", attribute="database", value="Postgres", type="decision")
    asserted(console, feed, subject="service:auth", attribute="session_ttl", value="30 minutes")
    asserted(console, feed, subject="ci", attribute="runner", value="ubuntu-24", tier="task", task_id="T-9")
    asserted(console, feed, subject="cdn", attribute="vendor", value="none yet", status="pending")
    assert change(console, "learn", key="oncall", value="team-b", tier="global").status_code == 303
    feed.settle()

    page = console.get(K, params={"task": "T-9"})
    assert page.status_code == 200, page.text
    task, project, shared = (
        section(page.text, "tier-task"),
        section(page.text, "tier-project"),
        section(page.text, "tier-global"),
    )
    assert "task:apollo:T-9" in task and "ubuntu-24" in task and "Postgres" not in task
    assert "<caption>decision · 1</caption>" in project and "Postgres" in project
    assert "<caption>fact · 2</caption>" in project and "30 minutes" in project
    assert "none yet" in project and ">pending<" in project  # pending facts wait to be promoted: listed, marked
    assert "team-b" not in shared  # a learned key has a section of its own
    assert "oncall" in section(page.text, "learned") and "team-b" in section(page.text, "learned")
    # without a task, no task tier; a type filter keeps its type
    plain = console.get(K)
    assert 'id="tier-task"' not in plain.text and "ubuntu-24" not in plain.text
    decisions = console.get(K, params={"type": "decision"})
    assert "Postgres" in decisions.text and "30 minutes" not in section(decisions.text, "tier-project")
    # promoted only: the pending fact leaves
    promoted = console.get(K, params={"status": "promoted"})
    assert "none yet" not in promoted.text and "30 minutes" in promoted.text
    # a page at a time, the filters kept in the pager's link
    first = console.get(K, params={"limit": "1", "type": "fact"})
    assert len(FACT_LINK.findall(section(first.text, "tier-project"))) == 1
    assert 'href="/ui/projects/apollo/knowledge?type=fact&amp;limit=1&amp;offset=1"' in first.text


def test_procedures_show_as_rules_highest_priority_first(console: TestClient, feed: FactsFeed) -> None:
    for condition, action in (("deploying to production", "page the on-call first"), ("a test fails", "rerun it")):
        asserted(console, feed, subject=condition, attribute="step", value=action, type="procedure")
    rules = section(console.get(K).text, "rules")
    assert "page the on-call first" in rules and "rerun it" in rules and "deploying to production" in rules


def test_as_of_shows_what_was_known_then(console: TestClient, feed: FactsFeed) -> None:
    asserted(console, feed, subject="service:auth", attribute="session_ttl", value="30 minutes")
    time.sleep(0.02)
    then = iso_now()
    time.sleep(0.02)
    asserted(console, feed, subject="service:auth", attribute="session_ttl", value="8 hours")
    now = section(console.get(K).text, "tier-project")
    assert "8 hours" in now and "30 minutes" not in now
    past = console.get(K, params={"as_of": then})
    assert past.status_code == 200
    assert "30 minutes" in section(past.text, "tier-project") and "8 hours" not in section(past.text, "tier-project")
    assert "What PVM knew at" in past.text and f'value="{then}"' in past.text
    # a time without an offset (what a datetime-local input sends) is read as UTC
    early = console.get(K, params={"as_of": "2020-01-01T00:00"})
    assert early.status_code == 200 and "2020-01-01 00:00:00" in early.text
    assert "minutes" not in section(early.text, "tier-project") and "hours" not in section(early.text, "tier-project")
    wrong = console.get(K, params={"as_of": "last tuesday"})
    assert wrong.status_code == 400 and "as_of" in wrong.text and "Traceback" not in wrong.text


def test_the_fact_page_shows_the_slots_history_and_the_minutes_behind_each_value(
    console: TestClient, feed: FactsFeed
) -> None:
    [first], old = asserted(console, feed, subject="service:auth", attribute="session_ttl", value="30 minutes")
    (second, superseding), new = asserted(
        console, feed, subject="service:auth", attribute="session_ttl", value="8 hours"
    )
    assert (second.event_type, superseding.event_type) == ("fact_asserted", "fact_superseded")
    page = console.get(f"/ui/projects/apollo/facts/{new}")
    assert page.status_code == 200, page.text
    history = section(page.text, "history")
    assert history.index("30 minutes") < history.index("8 hours")
    assert f'made by <a href="/ui/projects/apollo/minutes/{first.id}"' in history
    assert f'made by <a href="/ui/projects/apollo/minutes/{second.id}"' in history
    # the old value's status and end were set by the minute that superseded it
    assert f'set status, valid_until by <a href="/ui/projects/apollo/minutes/{superseding.id}"' in history
    assert ">superseded<" in history and ">promoted<" in history
    assert f'href="/ui/projects/apollo/facts/{old}"' in history  # the older value links to its own page
    assert "supersedes" in page.text


def test_an_unknown_or_malformed_fact_is_a_page_that_says_so(console: TestClient) -> None:
    missing = console.get("/ui/projects/apollo/facts/26715822-4642-5d0d-8e8d-756d5f3d703a")
    assert missing.status_code == 404 and "no fact 26715822" in missing.text and "Traceback" not in missing.text
    malformed = console.get("/ui/projects/apollo/facts/not-a-fact")
    assert malformed.status_code == 400 and "fact_id" in malformed.text


# -- changing ------------------------------------------------------------------------------------------------------


def test_asserting_from_the_form_writes_a_change_minute_that_shows_once_applied(
    console: TestClient, feed: FactsFeed
) -> None:
    answer = change(console, "facts", subject="service:auth", attribute="owner", value="team-a", agent_id="curator")
    assert answer.status_code == 303
    location = answer.headers["location"]
    assert location.startswith(f"{K}?done=asserted&minute=")
    [minute] = feed.written()  # the shard stream got the change, as from any agent
    assert minute.event_type == "fact_asserted" and minute.project_id == "apollo" and minute.agent_id == "curator"
    assert f"minute={minute.id}" in location
    assert "team-a" not in section(console.get(K).text, "tier-project")  # the pool has not applied it yet
    feed.read.clear()
    feed.settle()
    back = console.get(location)
    assert "Asserted" in back.text and f'href="/ui/projects/apollo/minutes/{minute.id}"' in back.text
    assert "team-a" in section(back.text, "tier-project")


def test_a_pending_fact_is_promoted_then_retracted_from_its_page(console: TestClient, feed: FactsFeed) -> None:
    _, fid = asserted(console, feed, subject="cdn", attribute="vendor", value="fastly", status="pending")
    page = console.get(f"/ui/projects/apollo/facts/{fid}")
    assert f'action="/ui/projects/apollo/facts/{fid}/promote"' in page.text and ">Promote</button>" in page.text

    promoted = change(console, f"facts/{fid}/promote")
    assert promoted.status_code == 303
    assert promoted.headers["location"].startswith(f"/ui/projects/apollo/facts/{fid}?done=promoted&minute=")
    [minute] = feed.settle()
    assert minute.event_type == "fact_promoted" and minute.id in promoted.headers["location"]
    page = console.get(promoted.headers["location"])
    assert "Promoted" in page.text and ">promoted<" in page.text and ">Promote</button>" not in page.text

    retracted = change(console, f"facts/{fid}/retract", reason="we moved to a different CDN")
    assert retracted.status_code == 303
    [minute] = feed.settle()
    assert minute.event_type == "fact_retracted" and "different CDN" in str(minute.data)
    page = console.get(f"/ui/projects/apollo/facts/{fid}")
    assert ">retracted<" in page.text and "/retract" not in page.text
    assert "fastly" not in console.get(K).text  # no longer known
    again = change(console, f"facts/{fid}/retract")
    assert again.status_code == 409 and "retracted already" in again.text
    assert feed.written() == []


def test_a_fact_is_promoted_one_tier_up_as_a_copy(console: TestClient, feed: FactsFeed) -> None:
    _, fid = asserted(console, feed, subject="ci", attribute="runner", value="ubuntu-24", tier="task", task_id="T-1")
    page = console.get(f"/ui/projects/apollo/facts/{fid}")
    assert 'name="to_tier" value="project"' in page.text
    up = change(console, f"facts/{fid}/promote", to_tier="project")
    assert up.status_code == 303
    [minute] = feed.settle()
    assert minute.event_type == "fact_tier_promoted"
    copy = fact_in(up.headers["location"])
    assert copy != fid
    project = section(console.get(K).text, "tier-project")
    assert "ubuntu-24" in project and copy in project


def test_learning_a_key_from_the_form(console: TestClient, feed: FactsFeed) -> None:
    answer = change(console, "learn", key="deploy window", value="Tue 10:00")
    assert answer.status_code == 303 and "done=learned" in answer.headers["location"]
    [minute] = feed.settle()
    assert minute.event_type == "fact_learned"
    learned = section(console.get(K).text, "learned")
    assert "deploy window" in learned and "Tue 10:00" in learned and "project:apollo" in learned
    change(console, "learn", key="deploy window", value="Wed 09:00")
    feed.settle()
    learned = section(console.get(K).text, "learned")
    assert "Wed 09:00" in learned and "Tue 10:00" not in learned


@pytest.mark.parametrize(
    ("path", "form", "field"),
    [
        ("facts", {"attribute": "a", "value": "v"}, "subject"),
        ("facts", {"subject": "s", "attribute": "a", "value": "v", "confidence": "lots"}, "confidence"),
        ("facts", {"subject": "s", "attribute": "a", "value": "v", "tier": "task"}, "task_id"),
        ("facts", {"subject": "s", "attribute": "a", "value": "v", "valid_from": "last tuesday"}, "valid_from"),
        ("learn", {"key": "deploy window"}, "value"),
    ],
)
def test_a_bad_form_is_refused_with_the_form_again_naming_the_field(
    console: TestClient, feed: FactsFeed, path: str, form: dict[str, str], field: str
) -> None:
    answer = change(console, path, **form)
    assert answer.status_code == 422, answer.text
    assert f"body field {field}" in answer.text and 'role="alert"' in answer.text and "Traceback" not in answer.text
    assert re.search(rf'name="{field}"[^>]*aria-invalid="true"', answer.text)  # the field is marked
    for value in form.values():
        assert f'value="{value}"' in answer.text  # what was typed is still there
    assert feed.written() == []


def test_a_change_from_another_origin_or_none_is_refused(console: TestClient, feed: FactsFeed) -> None:
    _, fid = asserted(console, feed, subject="s", attribute="a", value="v")
    for headers in ({}, {"Origin": "http://evil.example"}):
        for path, form in (
            ("facts", {"subject": "s", "attribute": "b", "value": "v"}),
            ("learn", {"key": "k", "value": "v"}),
            (f"facts/{fid}/retract", {}),
        ):
            answer = console.post(f"/ui/projects/apollo/{path}", data=form, headers=headers, follow_redirects=False)
            assert answer.status_code == 403, (path, headers)
    assert feed.written() == []


# -- tenancy ---------------------------------------------------------------------------------------------------------


def test_the_global_tier_is_hidden_and_refused_without_the_grant(
    console: TestClient, scoped_console: TestClient, feed: FactsFeed
) -> None:
    assert change(console, "learn", key="oncall", value="team-b", tier="global").status_code == 303
    [minute] = feed.settle()
    granted = console.get(K)
    assert 'id="tier-global"' in granted.text and "team-b" in section(granted.text, "learned")
    global_fact = str(minute.data["fact"]["id"])

    sign_in(scoped_console, OPS)  # every project, not the global tier
    page = scoped_console.get(K)
    assert page.status_code == 200 and 'id="tier-global"' not in page.text and "team-b" not in page.text
    assert '<option value="global"' not in page.text  # neither to filter by nor to learn into
    refused = scoped_console.get(K, params={"tier": "global"})
    assert refused.status_code == 403 and "global tier" in refused.text
    assert scoped_console.get(f"/ui/projects/apollo/facts/{global_fact}").status_code == 404
    learn = change(scoped_console, "learn", key="oncall", value="team-c", tier="global")
    assert learn.status_code == 403 and "global tier" in learn.text
    assert feed.written() == []


def test_a_token_for_apollo_neither_reads_nor_changes_borealis_facts(
    scoped_console: TestClient, feed: FactsFeed
) -> None:
    sign_in(scoped_console, OPS)
    answer = change(scoped_console, "facts", project="borealis", subject="s", attribute="a", value="theirs")
    assert answer.status_code == 303
    [minute] = feed.settle()
    theirs = str(minute.data["fact"]["id"])
    assert scoped_console.get(f"/ui/projects/borealis/facts/{theirs}").status_code == 200

    sign_in(scoped_console, TEAM_A)
    for path in ("/ui/projects/borealis/knowledge", f"/ui/projects/borealis/facts/{theirs}"):
        refused = scoped_console.get(path)
        assert refused.status_code == 403 and "may not read project borealis" in refused.text
    for path, form in (
        ("facts", {"subject": "s", "attribute": "a", "value": "mine"}),
        ("learn", {"key": "k", "value": "v"}),
        (f"facts/{theirs}/retract", {}),
        (f"facts/{theirs}/promote", {"to_tier": "global"}),
    ):
        assert change(scoped_console, path, project="borealis", **form).status_code == 403, path
    # under apollo's path, borealis's fact is not there
    assert scoped_console.get(f"/ui/projects/apollo/facts/{theirs}").status_code == 404
    assert change(scoped_console, f"facts/{theirs}/retract").status_code == 404
    assert "theirs" not in scoped_console.get(K).text
    assert feed.written() == []

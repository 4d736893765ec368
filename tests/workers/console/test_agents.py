"""The agents pages over the agent memory and recent windows a real index pool and minute cache filled."""

from __future__ import annotations

import html

import redis
from starlette.testclient import TestClient

from contracts import Minute, keys
from pvm.config import Settings
from pvm.stores.agent_memory import AgentMemoryStore
from pvm.stores.log import LogReader
from tests.memory_helpers import log_minutes
from tests.workers.console.conftest import TEAM_A, sign_in

MINUTE_LINK = 'href="/ui/projects/apollo/minutes/'


def window(redis_client: redis.Redis, agent_id: str) -> list[str]:
    """The agent's recent window, newest first."""
    return [i.decode() for i in redis_client.zrevrange(keys.agent_recent_window("apollo", agent_id), 0, -1)]


def minute_links(page: str) -> list[str]:
    return [s.split('"')[0] for s in page.split(MINUTE_LINK)[1:]]


def test_the_agents_page_lists_every_agent_with_its_track_record(
    console: TestClient, redis_client: redis.Redis
) -> None:
    page = console.get("/ui/projects/apollo/agents")
    assert page.status_code == 200, page.text
    store = AgentMemoryStore(redis_client)
    agents = store.agents("apollo")
    assert agents == ["coder", "deployer", "planner", "reviewer", "tester"]
    assert "5 agents in apollo" in page.text
    for agent_id in agents:
        memory = store.get("apollo", agent_id)
        row = page.text.split(f'href="/ui/projects/apollo/agents/{agent_id}"')[1].split("</tr>")[0]
        numbers = [memory.tasks_assigned, memory.tasks_completed, memory.tasks_failed]
        cells = [c.split("<")[0] for c in row.split('class="num')[1:4]]
        assert [int(c.rsplit(">", 1)[1]) for c in cells] == numbers
        assert f">{len(window(redis_client, agent_id))}</td>" in row  # its recent minutes


def test_the_agents_page_filters_by_id_and_pages_with_a_cursor(console: TestClient) -> None:
    page = console.get("/ui/projects/apollo/agents", params={"contains": "CODE"})
    assert "/agents/coder" in page.text and "/agents/tester" not in page.text
    first = console.get("/ui/projects/apollo/agents", params={"n": 3})
    assert first.text.count('<th scope="row"><a href="/ui/projects/apollo/agents/') == 3
    cursor = html.unescape(first.text.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0])
    assert "after=planner" in cursor
    second = console.get(cursor)
    assert "/agents/reviewer" in second.text and "/agents/tester" in second.text and "/agents/coder" not in second.text
    assert 'rel="next"' not in second.text


def test_an_agent_page_shows_its_track_record_and_its_recent_minutes_newest_first(
    console: TestClient, redis_client: redis.Redis, settings: Settings
) -> None:
    observed = Minute(
        project_id="apollo",
        event_type="capability_observed",
        agent_id="coder",
        data={"capability": "Postgres tuning"},
        memory_note="coder tuned the slow queries",
    )
    log_minutes(redis_client, settings, [observed])  # through the real log, cache and index pool
    memory = AgentMemoryStore(redis_client).get("apollo", "coder")
    assert "postgres tuning" in memory.capabilities
    page = console.get("/ui/projects/apollo/agents/coder")
    assert page.status_code == 200, page.text
    assert "Agent coder" in page.text
    for label, number in (("Assigned", memory.tasks_assigned), ("Failed", memory.tasks_failed)):
        assert f'<h2>{label}</h2><p class="big' in page.text
        assert page.text.split(f"<h2>{label}</h2>")[1].split("</p>")[0].endswith(f">{number}")
    assert f"{memory.mean_success:.0f}%" in page.text
    for capability in memory.capabilities:
        assert f'<span class="tag">{capability}</span>' in page.text
    newest = window(redis_client, "coder")
    assert newest and minute_links(page.text) == newest
    logged = LogReader(settings.log_dir).get_by_ids("apollo", newest)
    assert {r.minute.agent_id for r in logged.values()} == {"coder"}
    for record in logged.values():  # each minute's note, as it was logged
        assert (record.minute.memory_note or "") in html.unescape(page.text)


def test_an_agents_minutes_page_with_an_older_cursor(console: TestClient, redis_client: redis.Redis) -> None:
    newest = window(redis_client, "coder")
    assert len(newest) > 6
    first = console.get("/ui/projects/apollo/agents/coder", params={"n": 3})
    assert minute_links(first.text) == newest[:3]
    older = html.unescape(first.text.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0])
    assert "before=" in older
    second = console.get(older)
    assert minute_links(second.text) == newest[3:6]
    last = console.get("/ui/projects/apollo/agents/coder", params={"n": 1000})
    assert minute_links(last.text) == newest and 'rel="next"' not in last.text


def test_an_agent_the_project_never_saw_is_a_404_page(console: TestClient) -> None:
    answer = console.get("/ui/projects/apollo/agents/nobody")
    assert answer.status_code == 404 and "no agent &#39;nobody&#39;" in answer.text
    # another project's agent is not this project's
    assert console.get("/ui/projects/borealis/agents/nobody").status_code == 404


def test_bad_page_parameters_are_400_pages_naming_them(console: TestClient) -> None:
    answer = console.get("/ui/projects/apollo/agents", params={"n": 0})
    assert answer.status_code == 400 and "n=0" in answer.text
    answer = console.get("/ui/projects/apollo/agents/coder", params={"before": "soon"})
    assert answer.status_code == 400 and "before=" in html.unescape(answer.text)


def test_a_token_for_apollo_cannot_open_borealiss_agents(scoped_console: TestClient) -> None:
    sign_in(scoped_console, TEAM_A)
    assert scoped_console.get("/ui/projects/apollo/agents/coder").status_code == 200
    for path in ("/ui/projects/borealis/agents", "/ui/projects/borealis/agents/coder"):
        answer = scoped_console.get(path)
        assert answer.status_code == 403 and "may not read project borealis" in answer.text
        assert "/minutes/" not in answer.text

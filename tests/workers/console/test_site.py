from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.workers.console.conftest import OPS, ORIGIN, TEAM_A, sign_in


def test_the_projects_page_lists_each_project_with_its_minutes_and_links_to_its_overview(console: TestClient) -> None:
    page = console.get("/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'href="/ui/projects/apollo"' in page.text and 'href="/ui/projects/borealis"' in page.text
    assert 'href="/ui/projects/apollo/knowledge"' in page.text  # its facts, counted, link to what it knows
    overview = console.get("/ui/projects/apollo")
    assert overview.status_code == 200
    assert "Freshness per pool" in overview.text and ">80<" in overview.text  # 80 minutes logged


def test_every_page_forbids_what_is_not_its_own_origin_and_loads_nothing_from_elsewhere(console: TestClient) -> None:
    page = console.get("/ui")
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "http://" not in page.text.replace('href="/ui', "").split("<body>")[0]  # no stylesheet or font from afar
    assert console.get("/ui/static/console.css").status_code == 200
    assert console.get("/ui/static/console.js").status_code == 200


def test_a_console_without_tokens_has_no_login(console: TestClient) -> None:
    answer = console.get("/ui/login", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/ui"


def test_without_a_token_every_page_sends_the_browser_to_the_login_page_and_back(scoped_console: TestClient) -> None:
    answer = scoped_console.get("/ui/projects/apollo", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/login?next=%2Fui%2Fprojects%2Fapollo"
    login = scoped_console.get(answer.headers["location"])
    assert login.status_code == 200 and 'type="password"' in login.text
    assert 'value="/ui/projects/apollo"' in login.text
    # The static files the login page needs are open.
    assert scoped_console.get("/ui/static/console.css").status_code == 200


def test_a_wrong_token_is_refused_on_the_login_page_and_never_echoed(scoped_console: TestClient) -> None:
    answer = scoped_console.post("/ui/login", data={"token": "nearly-" + OPS}, headers=ORIGIN, follow_redirects=False)
    assert answer.status_code == 401 and "was not accepted" in answer.text
    assert "nearly-" not in answer.text and "set-cookie" not in answer.headers


def test_the_token_lives_in_an_httponly_strict_cookie_and_never_in_a_url(scoped_console: TestClient) -> None:
    answer = scoped_console.post(
        "/ui/login", data={"token": TEAM_A, "next": "/ui/projects/apollo"}, headers=ORIGIN, follow_redirects=False
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/projects/apollo"
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    assert TEAM_A not in answer.headers["location"]
    page = scoped_console.get("/ui/projects/apollo")
    assert page.status_code == 200 and TEAM_A not in page.text and "team-a" in page.text  # its name, not the token


def test_a_token_for_one_project_never_shows_another(scoped_console: TestClient) -> None:
    sign_in(scoped_console, TEAM_A)
    listing = scoped_console.get("/ui")
    assert "/ui/projects/apollo" in listing.text and "borealis" not in listing.text
    refused = scoped_console.get("/ui/projects/borealis")
    assert refused.status_code == 403 and "may not read project borealis" in refused.text
    assert "Traceback" not in refused.text


def test_a_token_for_every_project_sees_them_all(scoped_console: TestClient) -> None:
    sign_in(scoped_console, OPS)
    listing = scoped_console.get("/ui")
    assert "/ui/projects/apollo" in listing.text and "/ui/projects/borealis" in listing.text


def test_signing_out_forgets_the_token(scoped_console: TestClient) -> None:
    sign_in(scoped_console, OPS)
    assert scoped_console.post("/ui/logout", headers=ORIGIN, follow_redirects=False).status_code == 303
    assert scoped_console.get("/ui", follow_redirects=False).status_code == 303


@pytest.mark.parametrize("headers", [{}, {"Origin": "http://evil.example"}, {"Referer": "http://evil.example/x"}])
def test_a_form_post_from_another_origin_or_none_is_refused(
    scoped_console: TestClient, headers: dict[str, str]
) -> None:
    answer = scoped_console.post("/ui/login", data={"token": OPS}, headers=headers, follow_redirects=False)
    assert answer.status_code == 403 and "set-cookie" not in answer.headers


def test_a_project_id_that_is_no_project_id_is_a_page_that_says_so(console: TestClient) -> None:
    answer = console.get("/ui/projects/no%20such")
    assert answer.status_code == 400 and "Not a project" in answer.text and "Traceback" not in answer.text


def test_the_console_can_be_left_out(reader: object, redis_client: object, settings: object) -> None:
    from workers.api.app import create_app

    with TestClient(create_app(reader, redis_client, settings.shards)) as client:  # type: ignore[arg-type, attr-defined]
        assert client.get("/ui").status_code == 404
        assert client.get("/healthz").status_code == 200


def test_a_redis_that_does_not_answer_is_a_page_that_says_so_never_a_traceback(reader: object, settings: Any) -> None:
    import redis

    from tests.conftest import free_port
    from workers.api.app import create_app
    from workers.console.routes import CONSOLE

    gone = redis.Redis(port=free_port(), socket_connect_timeout=0.5)  # nothing listens there
    app = create_app(reader, gone, settings.shards, pages=CONSOLE, settings=settings)  # type: ignore[arg-type]
    with TestClient(app) as client:
        for path in ("/ui", "/ui/projects/apollo", "/ui/pools"):
            answer = client.get(path)
            assert answer.status_code == 503, (path, answer.text)
            assert "A store is unavailable" in answer.text and "Redis did not answer" in answer.text
            assert "Traceback" not in answer.text and answer.headers["content-type"].startswith("text/html")


def test_every_pvm_command_a_page_names_is_one_the_cli_has() -> None:
    import argparse
    import re
    from pathlib import Path

    from workers.ops.cli import build_parser

    [commands] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    templates = Path(__file__).resolve().parents[3] / "workers" / "console" / "templates"
    named = {m for t in templates.glob("*.html") for m in re.findall(r"<code>pvm ([a-z-]+)", t.read_text())}
    assert named and named <= set(commands.choices), named - set(commands.choices)

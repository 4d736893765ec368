"""The console in a real browser against a real stack: headless Chromium (Debian's `chromium`, which `make tools`
installs) driven by Playwright, over `pvm up`'s processes with `pvm serve` on loopback and a tokens file.

One stack and one browser for the module. The browser reaches nothing but the server: every request to another
host is aborted and recorded, and each test fails on any it recorded, on any console error (a script error, a
resource that failed to load, a refused inline script or style) and on any uncaught exception. The screenshot in
docs/console.png comes from here: `PVM_UPDATE_SCREENSHOT=1` writes it; a plain run writes its own to a temporary
folder and leaves the committed one alone.
"""

from __future__ import annotations

import os
import shutil
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page, Route, sync_playwright

from contracts import Minute, keys
from pvm.config import Settings
from pvm.emitter import Emitter
from tests.conftest import free_port
from tests.workers.api.test_api import write_tokens
from tests.workers.console.conftest import OPS, TEAM_A
from workers.ops.demo import sample_session
from workers.runtime.stack import Stack

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = ROOT / "docs" / "console.png"
# Chromium's own traffic (updates, field trials, safe browsing) stays off: the pages' requests are the only ones.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
MINUTES = {"apollo": 300, "borealis": 40}
CAUGHT_UP_S = 120  # the stack's pools on a loaded 2-core machine; usually a few seconds
WAIT_MS = 15_000  # Playwright's timeout for one navigation or one wait


@dataclass
class LiveStack:
    """`pvm up` on loopback with the console: its base URL and its Redis."""

    base_url: str
    settings: Settings
    connection: redis.Redis


@dataclass
class Watch:
    """What a browser context did that a console page must never do: errors logged, requests beyond the server."""

    errors: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)

    def clear(self) -> None:
        self.errors.clear()
        self.outside.clear()

    def assert_clean(self) -> None:
        assert not self.outside, f"requests left the server: {self.outside}"
        assert not self.errors, f"console errors: {self.errors}"


def _wait_until(ready: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"{what} within {timeout:.0f} s"
        time.sleep(0.2)


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/healthz", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def _caught_up(connection: redis.Redis) -> bool:
    """Every emitted minute durable, and every pool done with each project's log (the fact minutes the facts pool
    wrote back included)."""
    for project_id, emitted in MINUTES.items():
        durable = connection.hget(keys.log_head(project_id), "seq")
        if durable is None or int(durable) < emitted:
            return False
        for head in (keys.index_head, keys.facts_head, keys.summarize_head):
            if connection.hget(head(project_id), "seq") != durable:
                return False
    return True


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    home = tmp_path_factory.mktemp("console-stack")
    tokens = home / "tokens.json"
    write_tokens(tokens, ("team-a", TEAM_A, ["apollo"]), ("ops", OPS, ["*"]))
    settings = Settings(home=home, log_dir=home / "var/log", spool_dir=home / "spool", api_tokens_file=tokens)
    port = free_port()
    running = Stack(settings, api_port=port)
    try:
        live = running.start()
        connection = redis.Redis.from_url(str(live.redis_url))
        base_url = f"http://127.0.0.1:{port}"
        _wait_until(lambda: _healthy(base_url), "pvm serve answers /healthz", 60)
        with Emitter(settings=live) as emitter:
            for project_id, n in MINUTES.items():
                for minute in sample_session(project_id, n, seed=5):
                    emitter.emit(minute)
        _wait_until(lambda: _caught_up(connection), "the pools caught up with every minute", CAUGHT_UP_S)
        yield LiveStack(base_url, live, connection)
        connection.close()
    finally:
        running.stop(timeout=30)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"no Chromium at {CHROMIUM}: install Debian's `chromium` package "
            "(apt-get install -y --no-install-recommends chromium; `make test` does this through `make tools`)"
        )
    with sync_playwright() as driver:
        yield driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)


def open_context(browser: Browser, stack: LiveStack, watch: Watch) -> BrowserContext:
    """A fresh context (no cookie) whose requests reach only the server, and whose pages report their errors."""
    server = urllib.parse.urlsplit(stack.base_url).netloc
    context = browser.new_context(base_url=stack.base_url, viewport={"width": 1280, "height": 860})
    context.set_default_timeout(WAIT_MS)

    def only_the_server(route: Route) -> None:
        parts = urllib.parse.urlsplit(route.request.url)
        if parts.scheme in ("http", "https") and parts.netloc == server:
            route.continue_()
        else:
            watch.outside.append(route.request.url)
            route.abort()

    def console_error(message: ConsoleMessage) -> None:
        if message.type == "error":
            watch.errors.append(f"{message.text} ({message.location.get('url', '')})")

    context.route("**/*", only_the_server)
    context.on("console", console_error)
    context.on("weberror", lambda error: watch.errors.append(f"uncaught: {error.error}"))
    return context


def sign_in(page: Page, token: str, path: str = "/ui") -> None:
    """Through the login form, as a person does: the page asked for sends the browser to it, and back."""
    page.goto(path)
    assert urllib.parse.urlsplit(page.url).path == "/ui/login"
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"**{path}")


@pytest.fixture(scope="module")
def ops_watch() -> Watch:
    return Watch()


@pytest.fixture(scope="module")
def ops_page(browser: Browser, stack: LiveStack, ops_watch: Watch) -> Iterator[Page]:
    """One page signed in with the token for every project, shared by the tests that visit pages."""
    context = open_context(browser, stack, ops_watch)
    page = context.new_page()
    sign_in(page, OPS)
    yield page
    context.close()


@pytest.fixture
def watched(ops_page: Page, ops_watch: Watch) -> Iterator[Page]:
    ops_watch.clear()
    yield ops_page
    ops_watch.assert_clean()


def first_link(page: Page, prefix: str) -> str:
    """The first link on the page under `prefix` (a minute, a fact, a thread, an agent), to follow it."""
    link = page.locator(f'main a[href^="{prefix}"]').first
    assert link.count(), f"no link to {prefix}… on {page.url}"
    return str(link.get_attribute("href"))


PROJECT = "/ui/projects/apollo"
# Each page of the console, and how to reach it: a path, or (listing, link prefix) to follow the listing's first link.
PAGES: dict[str, str | tuple[str, str]] = {
    "projects": "/ui",
    "overview": PROJECT,
    "pools": "/ui/pools",
    "timeline": f"{PROJECT}/timeline",
    "minute": (f"{PROJECT}/timeline", f"{PROJECT}/minutes/"),
    "knowledge": f"{PROJECT}/knowledge",
    "fact": (f"{PROJECT}/knowledge", f"{PROJECT}/facts/"),
    "threads": f"{PROJECT}/threads",
    "thread": (f"{PROJECT}/threads", f"{PROJECT}/threads/"),
    "agents": f"{PROJECT}/agents",
    "agent": (f"{PROJECT}/agents", f"{PROJECT}/agents/"),
    "context": f"{PROJECT}/context?agent_id=coder",
    "search": f"{PROJECT}/search?q=deploy",
}


def visit(page: Page, name: str) -> None:
    target = PAGES[name]
    if isinstance(target, tuple):
        listing, prefix = target
        page.goto(listing)
        target = first_link(page, prefix)
    answer = page.goto(target)
    assert answer is not None and answer.status == 200, f"{name}: {target} answered {answer and answer.status}"
    page.wait_for_load_state("load")


@pytest.mark.parametrize("name", PAGES)
def test_each_page_loads_clean_with_nothing_from_beyond_the_server(watched: Page, name: str) -> None:
    visit(watched, name)
    assert watched.locator("main h1").inner_text().strip()
    assert watched.locator('nav[aria-label="Console"] a.brand').is_visible()
    # Nothing the page loaded came from anywhere but the server (the route recorded any that tried).
    origins = watched.evaluate("performance.getEntriesByType('resource').map(e => new URL(e.name).origin)")
    assert set(origins) <= {watched.evaluate("location.origin")}
    # Where the page has a filter or search box, "/" focuses it (and is not typed into it).
    box = watched.locator("[data-focus-key]")
    if box.count():
        typed = box.first.input_value()
        watched.locator("main h1").click()  # focus off any input, as after reading the page
        watched.keyboard.press("/")
        assert watched.evaluate("document.activeElement.hasAttribute('data-focus-key')"), name
        assert watched.evaluate("document.activeElement.value") == typed


def test_tab_reaches_the_skip_link_then_the_nav(watched: Page, stack: LiveStack) -> None:
    watched.goto(PROJECT)
    watched.keyboard.press("Tab")
    assert watched.evaluate("document.activeElement.className") == "skip"
    reached = []
    for _ in range(3):
        watched.keyboard.press("Tab")
        reached.append(watched.evaluate("document.activeElement.closest('nav') ? document.activeElement.href : ''"))
    assert reached[:2] == [f"{stack.base_url}/ui", f"{stack.base_url}{PROJECT}"]  # the brand, then the project
    # The skip link jumps over the nav to the page's content.
    watched.goto(PROJECT)
    watched.keyboard.press("Tab")
    watched.keyboard.press("Enter")
    assert watched.evaluate("document.activeElement.id") == "main"


def test_the_pools_page_refreshes_its_live_part_in_place(watched: Page, stack: LiveStack) -> None:
    watched.goto("/ui/pools")
    done = '#pools-live tr[data-stage="dispatch"] td:nth-of-type(7)'  # the dispatchers' minutes done
    before = int(watched.locator(done).inner_text().replace(",", ""))
    first = watched.locator("[data-refreshed]").inner_text()
    watched.evaluate("window.pvmSamePage = true")
    with Emitter(settings=stack.settings) as emitter:
        for _ in range(5):
            emitter.emit(Minute(project_id="pools-probe", event_type="message"))
    # Within two refreshes the new minutes show, in the same document: the part was swapped, not the page.
    watched.wait_for_function(
        "([cell, before]) => Number(document.querySelector(cell).textContent.replace(/,/g, '')) >= before + 5",
        arg=[done, before],
        timeout=WAIT_MS,
    )
    assert watched.evaluate("window.pvmSamePage") is True
    stamp = watched.locator("[data-refreshed]").inner_text()
    assert stamp != first and "failed" not in stamp
    assert watched.locator("#pools-live h2#stages").count() == 1  # swapped in place, not nested


def test_a_token_for_one_project_never_shows_another(browser: Browser, stack: LiveStack) -> None:
    watch = Watch()
    context = open_context(browser, stack, watch)
    page = context.new_page()
    try:
        sign_in(page, TEAM_A, PROJECT)
        page.goto("/ui")
        assert page.locator('main a[href="/ui/projects/apollo"]').count() == 1
        assert page.locator('a[href*="borealis"]').count() == 0 and "borealis" not in page.content()
        for path in ("/ui/projects/borealis", "/ui/projects/borealis/timeline", "/ui/projects/borealis/search?q=x"):
            answer = page.goto(path)
            assert answer is not None and answer.status == 403, path
            assert "may not read project borealis" in page.locator("main").inner_text()
        page.goto(f"{PROJECT}/search?q=deploy")
        assert "borealis" not in page.content()
        # The refusals above logged their status as a failed load; nothing else may have gone wrong.
        assert all("403" in error for error in watch.errors), watch.errors
        assert not watch.outside
    finally:
        context.close()


def test_a_wrong_token_stays_on_the_login_page(browser: Browser, stack: LiveStack) -> None:
    watch = Watch()
    context = open_context(browser, stack, watch)
    page = context.new_page()
    try:
        page.goto("/ui/pools")
        page.get_by_label("Token").fill("not-" + OPS)
        page.get_by_role("button", name="Sign in").click()
        assert page.get_by_role("alert").inner_text().startswith("That token was not accepted")
        assert urllib.parse.urlsplit(page.url).path == "/ui/login" and not context.cookies()
        assert all("401" in error for error in watch.errors), watch.errors
    finally:
        context.close()


def test_a_decision_is_followed_from_its_minute_to_its_fact_and_the_minute_that_replaced_it(watched: Page) -> None:
    # The team's first word on the docs site, as an agent minuted it: the oldest decision that names Sphinx.
    watched.goto(f"{PROJECT}/timeline?event_type=decision&n=1000")
    first = watched.locator("main tbody tr", has_text="Sphinx").last
    assert "we use sphinx" in first.inner_text().lower()
    first.locator('a[href*="/minutes/"]').first.click()
    assert "we use sphinx for the docs site" in watched.locator("main").inner_text().lower()
    # The minute page names the fact the facts pool made of it; the fact was later replaced.
    watched.locator('main a[href*="/facts/"]', has_text="Sphinx").first.click()
    fact = watched.locator("main").inner_text()
    assert "Sphinx" in fact and "superseded" in fact
    # Its slot's history leads to the value that replaced it, and that fact to the minute that decided it.
    watched.locator("main table tbody tr", has_text="MkDocs").locator('a[href*="/facts/"]').first.click()
    assert "(this fact)" in watched.locator("main tr.knowledge-this").inner_text()
    assert "MkDocs" in watched.locator("main tr.knowledge-this").inner_text()
    watched.locator('main dd a[href*="/minutes/"]').first.click()
    replaced_by = watched.locator("main").inner_text()
    assert "switch the docs site from sphinx to mkdocs" in replaced_by.lower() and "decision" in replaced_by


def test_a_fact_asserted_from_the_console_is_a_minute_in_the_timeline(watched: Page) -> None:
    watched.goto(f"{PROJECT}/knowledge")
    form = watched.locator("form.knowledge-form", has=watched.locator("#assert-title"))
    form.get_by_label("Subject").fill("service:console-probe")
    form.get_by_label("Attribute").fill("owner")
    form.get_by_label("Value").fill("Dana Whitfield")
    form.get_by_role("button", name="Assert").click()
    # The page says which minute carries the change, linked.
    done = watched.locator(".knowledge-done")
    assert "Asserted" in done.inner_text()
    minute_path = str(done.locator('a[href*="/minutes/"]').first.get_attribute("href"))
    # Once the log pool has made it durable, the timeline shows it as a knowledge change like any other.
    deadline = time.monotonic() + CAUGHT_UP_S
    while True:
        watched.goto(f"{PROJECT}/timeline?event_type=fact_asserted")
        row = watched.locator("main tbody tr", has=watched.locator(f'a[href="{minute_path}"]'))
        if row.count():
            break
        assert time.monotonic() < deadline, f"{minute_path} on the timeline within {CAUGHT_UP_S} s"
        time.sleep(0.5)
    assert "fact_asserted" in row.first.inner_text()
    watched.goto(minute_path)
    assert "Dana Whitfield" in watched.locator("main").inner_text()


def test_the_timeline_screenshot(watched: Page, tmp_path: Path) -> None:
    """The picture docs/console.png shows, taken from the live stack; written there only when asked to."""
    watched.goto(f"{PROJECT}/timeline")
    shot = tmp_path / "console.png"
    watched.screenshot(path=str(shot))
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 10_000
    if os.environ.get("PVM_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, SCREENSHOT)

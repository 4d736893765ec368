"""The docs site: README as a front door, every page in the nav, every link resolving, and a strict build
whose CLI, configuration and metrics references cover what the code defines."""

from __future__ import annotations

import argparse
import html
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import redis
import yaml

from contracts import keys
from pvm import defaults, engines
from pvm.config import settings_reference
from workers.ops.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 250

# [text](target) and ![alt](target), not inside `code`; reference-style links are not used here.
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
_EXPLICIT_ID = re.compile(r"\{\s*#([\w-]+)\s*\}\s*$")


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "hooks" / "reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _slug(text: str) -> str:
    """Python-Markdown's toc slug (what MkDocs makes a heading's id), which GitHub's matches for plain headings."""
    text = _CODE_SPAN.sub(lambda m: m.group(0)[1:-1], text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(markdown: str) -> set[str]:
    out: set[str] = set()
    for heading in _HEADING.findall(_FENCE.sub("", markdown)):
        explicit = _EXPLICIT_ID.search(heading)
        out.add(explicit.group(1) if explicit else _slug(heading))
    out.update(re.findall(r'<a\s+(?:id|name)="([^"]+)"', markdown))
    return out


def _links(markdown: str) -> Iterator[str]:
    text = _CODE_SPAN.sub("", _FENCE.sub("", markdown))
    for target in _LINK.findall(text):
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: are not checked
            yield target


def _pages() -> list[Path]:
    """Every Markdown page of the site: docs/ less the incoming drafts and the hooks."""
    return sorted(p for p in DOCS.rglob("*.md") if not p.relative_to(DOCS).parts[0].startswith(("_incoming", "hooks")))


def _nav_paths(nav: object) -> Iterator[str]:
    if isinstance(nav, str):
        if not re.match(r"^[a-z]+://", nav):
            yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from _nav_paths(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            yield from _nav_paths(value)


def _mkdocs_config() -> dict[str, object]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert isinstance(config, dict)
    return config


def _check_links(source: Path, generated: set[str]) -> list[str]:
    problems = []
    for target in _links(source.read_text()):
        path_part, _, anchor = target.partition("#")
        if not path_part:
            resolved = source
        else:
            resolved = (source.parent / path_part).resolve()
            rel_to_docs = resolved.relative_to(DOCS).as_posix() if resolved.is_relative_to(DOCS) else None
            if rel_to_docs in generated:
                continue  # made at build time; the strict build checks links into it and their anchors
            if not resolved.exists():
                problems.append(f"{source.relative_to(ROOT)}: {target} does not exist")
                continue
        if anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved.read_text()):
            problems.append(f"{source.relative_to(ROOT)}: {target}: no heading #{anchor} in {resolved.name}")
    return problems


def test_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; reference material goes to docs/"
    text = README.read_text()
    for must in ("make demo", "make test", "pip install pvm", "pip install 'pvm[server]'", "docs/"):
        assert must in text, f"README.md should mention {must!r}"


def test_readme_code_examples_are_short() -> None:
    """The emit and read examples are each at most 15 lines of code."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 2, "README.md should show emitting and reading in Python"
    for block in blocks:
        assert len(block.strip().splitlines()) <= 15, f"README example over 15 lines:\n{block}"


def test_every_relative_link_resolves() -> None:
    generated = set(_hook().GENERATED_PAGES)
    problems = []
    for source in [README, ROOT / "deploy" / "README.md", *_pages()]:
        problems += _check_links(source, generated)
    assert not problems, "\n".join(problems)


def test_readme_examples_run(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The emit and read examples work as printed, against a real Redis and the embedded vector engine."""
    monkeypatch.setenv("PVM_REDIS_URL", redis_url)
    monkeypatch.setenv("PVM_HOME", str(tmp_path))
    for name in ("PVM_LOG_DIR", "PVM_SPOOL_DIR", "PVM_QDRANT_URL", "PVM_EMBED_MODEL", "PVM_SHARDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    emit, read = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[:2]
    exec(compile(emit, "README.md (emit)", "exec"), {})
    assert redis_client.xlen(keys.stream(keys.shard_of("apollo", defaults.SHARDS))) == 2  # the invalid one never left
    scope: dict[str, object] = {}
    try:
        exec(compile(read, "README.md (read)", "exec"), scope)
    finally:
        engines.close_shared()  # the embedded engine locks tmp_path's var/qdrant for this process
    assert "Your track record" in str(scope["package"].render())  # type: ignore[attr-defined]


def test_every_decision_record_is_listed() -> None:
    index = (DOCS / "decisions" / "index.md").read_text()
    for record in sorted((DOCS / "decisions").glob("[0-9][0-9][0-9][0-9]-*.md")):
        assert f"({record.name})" in index, f"{record.name} is missing from docs/decisions/index.md"


def test_every_page_is_in_the_nav() -> None:
    config = _mkdocs_config()
    nav = set(_nav_paths(config["nav"]))
    pages = {p.relative_to(DOCS).as_posix() for p in _pages()} | set(_hook().GENERATED_PAGES)
    assert pages - nav == set(), f"pages missing from mkdocs.yml nav: {sorted(pages - nav)}"
    assert nav - pages == set(), f"nav entries with no page: {sorted(nav - pages)}"


def test_incoming_drafts_stay_out_of_the_site() -> None:
    excluded = str(_mkdocs_config().get("exclude_docs", ""))
    assert "_incoming/" in excluded.split()


def test_deploy_readme_points_to_the_docs() -> None:
    text = (ROOT / "deploy" / "README.md").read_text()
    assert len(text.splitlines()) <= 40, "deploy/README.md is a pointer; the operations guide lives in docs/"
    assert "../docs/operations/" in text


# -- the strict build and the generated references -----------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return out


def _page_text(site: Path, page: str) -> str:
    built = site / page.removesuffix(".md") / "index.html"
    assert built.exists(), f"{page} was not built"
    return html.unescape(re.sub(r"<[^>]+>", "", built.read_text()))


def _commands(parser: argparse.ArgumentParser, prefix: str = "pvm") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, f"{prefix} {name}")


def test_strict_build_renders_every_page(site: Path) -> None:
    for page in [p.relative_to(DOCS).as_posix() for p in _pages()]:
        name = page.removesuffix(".md")
        built = site / ("index.html" if name == "index" else f"{name.removesuffix('/index')}/index.html")
        assert built.exists(), f"{page} was not built"
    assert not (site / "_incoming").exists()
    assert not (site / "hooks").exists()


def test_cli_reference_covers_every_command_and_option(site: Path) -> None:
    text = _page_text(site, "reference/cli.md")
    for command, parser in _commands(build_parser()):
        assert command in text, f"{command} is missing from the CLI reference"
        for action in parser._actions:
            for option in action.option_strings:
                assert option in text, f"{command} {option} is missing from the CLI reference"
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction) or not action.help:
                continue
            assert action.help.split("(")[0].strip() in text, f"{command}: help of {action.dest} is missing"


def test_configuration_reference_covers_every_setting(site: Path) -> None:
    text = _page_text(site, "reference/configuration.md")
    reference = settings_reference()
    assert len(reference) >= 25
    for entry in reference:
        assert entry["env"] in text, f"{entry['env']} is missing from the configuration reference"


def test_metrics_reference_covers_every_family(site: Path) -> None:
    text = _page_text(site, "reference/metrics.md")
    families = _hook().metric_families()
    names = {f["name"] for f in families}
    assert {"pvm_stream_lag", "pvm_freshness_seconds", "pvm_stage_minutes_total"} <= names
    for family in families:
        assert family["name"] in text, f"{family['name']} is missing from the metrics reference"
        assert family["help"] in text

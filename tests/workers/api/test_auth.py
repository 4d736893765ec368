from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from workers.api.auth import (
    TokenFile,
    TokenFileError,
    add_to_file,
    load_tokens,
    new_token,
    parse_tokens,
    token_entry,
    token_sha256,
)

A_TOKEN = "team-a-token"
OPS_TOKEN = "ops-token"


def write_atomically(path: Path, document: Any) -> None:
    """Replace a file the way `pvm token new --file` and careful editors do: write aside, then rename."""
    aside = path.with_name(path.name + ".new")
    aside.write_text(json.dumps(document) if not isinstance(document, str) else document)
    os.replace(aside, path)


def entry(name: str, token: str, *projects: str) -> dict[str, Any]:
    return {"name": name, "sha256": token_sha256(token), "projects": list(projects)}


class Clock:
    """A clock the test moves by hand, so the once-a-second check needs no sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_valid_file_maps_token_hashes_to_scopes(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    upper = {**entry("ops", OPS_TOKEN, "*"), "sha256": token_sha256(OPS_TOKEN).upper(), "note": "on-call"}
    path.write_text(json.dumps({"tokens": [entry("team-a", A_TOKEN, "apollo", "borealis"), upper]}))
    scopes = load_tokens(path)
    team_a = scopes[token_sha256(A_TOKEN)]
    assert team_a.name == "team-a" and team_a.projects == {"apollo", "borealis"}
    assert team_a.allows("apollo") and team_a.allows("borealis") and not team_a.allows("cassini")
    ops = scopes[token_sha256(OPS_TOKEN)]  # hex is case-insensitive; extra keys are kept for people
    assert ops.all_projects and ops.allows("anything")
    assert TokenFile(path).lookup(A_TOKEN) == team_a
    assert TokenFile(path).lookup("team-a-tokenx") is None
    # nothing in the file is a token
    assert A_TOKEN not in path.read_text() and OPS_TOKEN not in path.read_text()
    assert parse_tokens({"tokens": []}) == {}


GOOD = entry("team-a", A_TOKEN, "apollo")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([GOOD], r"must be a JSON object \{\"tokens\""),
        ({"token": [GOOD]}, r"must be a JSON object \{\"tokens\""),
        ({"tokens": [GOOD, "ops"]}, r"tokens\[1\] must be an object, got str"),
        ({"tokens": [{**GOOD, "name": ""}]}, r"tokens\[0\] needs a non-empty string name"),
        ({"tokens": [{**GOOD, "sha256": "zz" * 32}]}, r"tokens\[0\] \('team-a'\) sha256 must be 64 hex digits"),
        ({"tokens": [{**GOOD, "sha256": "ab" * 31}]}, r"tokens\[0\] \('team-a'\) sha256 must be 64 hex digits"),
        ({"tokens": [{**GOOD, "sha256": None}]}, r"tokens\[0\] \('team-a'\) sha256 must be 64 hex digits"),
        ({"tokens": [{**GOOD, "projects": []}]}, r"tokens\[0\] \('team-a'\) projects must be a non-empty list"),
        ({"tokens": [{**GOOD, "projects": "apollo"}]}, r"tokens\[0\] \('team-a'\) projects must be a non-empty list"),
        ({"tokens": [{**GOOD, "projects": ["../etc"]}]}, r"tokens\[0\] \('team-a'\) project '\.\./etc' is not a valid"),
        ({"tokens": [{**GOOD, "projects": [""]}]}, r"project '' is not a valid project id"),
        ({"tokens": [{**GOOD, "projects": [7]}]}, r"project 7 is not a valid project id"),
        ({"tokens": [{**GOOD, "token": A_TOKEN}]}, r"tokens\[0\] \('team-a'\) holds a plaintext \"token\""),
        (
            {"tokens": [GOOD, {**GOOD, "name": "team-b"}]},
            r"tokens\[1\] \('team-b'\) has the same sha256 as 'team-a': one token, one entry",
        ),
        (
            {"tokens": [GOOD, entry("team-a", OPS_TOKEN, "*")]},
            r"tokens\[1\] \('team-a'\) has the same name as an earlier entry",
        ),
    ],
)
def test_invalid_files_are_refused_naming_the_file_and_entry(tmp_path: Path, document: Any, message: str) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(document))
    with pytest.raises(TokenFileError, match=message) as refused:
        TokenFile(path)
    assert str(refused.value).startswith(f"PVM_API_TOKENS_FILE {path}: ")
    assert A_TOKEN not in str(refused.value)


def test_missing_unreadable_and_non_json_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TokenFileError, match=r"does not exist .*pvm token new --file"):
        TokenFile(tmp_path / "nope.json")
    with pytest.raises(TokenFileError, match="cannot be read"):
        TokenFile(tmp_path)  # a directory
    (tmp_path / "bad.json").write_text('{"tokens": [')
    with pytest.raises(TokenFileError, match="is not JSON"):
        TokenFile(tmp_path / "bad.json")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TokenFileError, match="cannot be read"):
        TokenFile(tmp_path / "binary.json")


def test_changes_are_seen_at_the_next_check_and_a_broken_edit_keeps_the_last_good_set(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [entry("team-a", A_TOKEN, "apollo"), entry("ops", OPS_TOKEN, "*")]}))
    clock = Clock()
    tokens = TokenFile(path, check_every_s=1.0, clock=clock)

    write_atomically(path, {"tokens": [entry("ops", OPS_TOKEN, "*")]})
    clock.now += 0.5
    assert tokens.lookup(A_TOKEN) is not None  # not looked at yet: at most one check a second
    clock.now += 0.5
    assert tokens.lookup(A_TOKEN) is None  # revoked without a restart
    assert tokens.lookup(OPS_TOKEN) is not None

    caplog.set_level(logging.ERROR, logger="workers.api.auth")
    write_atomically(path, '{"tokens": [')
    for _ in range(3):
        clock.now += 1.0
        assert tokens.lookup(OPS_TOKEN) is not None
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "is not JSON" in errors[0] and "keeping the 1 tokens loaded before" in errors[0]

    path.unlink()
    clock.now += 1.0
    assert tokens.lookup(OPS_TOKEN) is not None  # a vanished file revokes nothing: the last good set stays
    write_atomically(path, {"tokens": [entry("team-a", A_TOKEN, "apollo")]})
    clock.now += 1.0
    assert tokens.lookup(OPS_TOKEN) is None and tokens.lookup(A_TOKEN) is not None


def test_an_in_place_edit_is_seen_too(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [entry("team-a", A_TOKEN, "apollo")]}))
    tokens = TokenFile(path, check_every_s=0)
    path.write_text(json.dumps({"tokens": [entry("team-a", A_TOKEN, "apollo", "borealis")]}))
    scope = tokens.lookup(A_TOKEN)
    assert scope is not None and scope.allows("borealis")


def test_add_to_file_creates_appends_and_refuses_a_duplicate_name(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "tokens.json"
    first, second = new_token(), new_token()
    assert first != second and len(first) >= 43
    add_to_file(path, token_entry("team-a", first, ["borealis", "apollo", "apollo"]))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {
        "tokens": [{"name": "team-a", "sha256": token_sha256(first), "projects": ["apollo", "borealis"]}]
    }
    document = json.loads(path.read_text())
    document["comment"] = "kept"
    path.write_text(json.dumps(document))
    add_to_file(path, token_entry("ops", second, ["*"]))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    scopes = load_tokens(path)
    assert {s.name for s in scopes.values()} == {"team-a", "ops"}
    assert json.loads(path.read_text())["comment"] == "kept"
    with pytest.raises(TokenFileError, match="already has a token named 'ops'"):
        add_to_file(path, token_entry("ops", new_token(), ["apollo"]))
    assert len(load_tokens(path)) == 2
    assert sorted(p.name for p in path.parent.iterdir()) == ["tokens.json"]  # no temp file left behind
    assert first not in path.read_text() and second not in path.read_text()


def test_add_to_file_leaves_a_broken_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text('{"tokens": [{"name": "x", "sha256": "nothex", "projects": ["apollo"]}]}')
    before = path.read_text()
    with pytest.raises(TokenFileError, match=r"tokens\[0\] \('x'\) sha256 .*fix it before adding tokens"):
        add_to_file(path, token_entry("team-a", new_token(), ["apollo"]))
    assert path.read_text() == before


def test_token_entries_name_a_bad_project_or_name() -> None:
    with pytest.raises(ValueError, match=r"token 'team-a': project 'a/b' is not a valid project id"):
        token_entry("team-a", new_token(), ["a/b"])
    with pytest.raises(ValueError, match="needs a non-empty string name"):
        token_entry(" ", new_token(), ["apollo"])
    with pytest.raises(ValueError, match="projects must be a non-empty list"):
        token_entry("team-a", new_token(), [])


def test_add_to_file_names_a_place_it_cannot_write(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(TokenFileError, match="cannot be written"):
        add_to_file(blocker / "tokens.json", token_entry("team-a", new_token(), ["apollo"]))


# -- the global tier (issue 10): a grant of its own ------------------------------------------------


def test_the_global_tier_needs_an_entry_that_grants_it(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    granted = {**entry("curator", OPS_TOKEN, "apollo"), "global": True}
    path.write_text(json.dumps({"tokens": [entry("team-a", A_TOKEN, "*"), granted]}))
    scopes = load_tokens(path)
    # every project is not the global tier: an old file (no "global") grants it to nobody
    every = scopes[token_sha256(A_TOKEN)]
    assert every.allows("anything") and not every.allows_global
    curator = scopes[token_sha256(OPS_TOKEN)]
    assert curator.allows_global and curator.allows("apollo") and not curator.allows("borealis")


def test_the_api_token_and_an_open_api_reach_the_global_tier() -> None:
    from workers.api.auth import EVERY_PROJECT

    assert EVERY_PROJECT.allows_global and EVERY_PROJECT.allows("anything")


@pytest.mark.parametrize("value", ["yes", 1, None, [], "true"])
def test_a_global_grant_that_is_not_a_boolean_is_refused(tmp_path: Path, value: Any) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [{**entry("curator", OPS_TOKEN, "apollo"), "global": value}]}))
    with pytest.raises(TokenFileError, match=r"tokens\[0\] \('curator'\) global must be true or false"):
        load_tokens(path)


def test_token_entries_write_the_global_grant_only_when_given(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    plain = token_entry("team-a", A_TOKEN, ["apollo"])
    assert "global" not in plain
    curator = token_entry("curator", OPS_TOKEN, ["apollo"], global_tier=True)
    assert curator["global"] is True
    add_to_file(path, plain)
    add_to_file(path, curator)
    scopes = load_tokens(path)
    assert scopes[token_sha256(OPS_TOKEN)].allows_global and not scopes[token_sha256(A_TOKEN)].allows_global

"""One project-id rule: every place a project id arrives accepts and refuses exactly the same ids."""

from __future__ import annotations

import argparse
import ast
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote, unquote

import msgpack
import pytest
import redis
from hypothesis import assume, given
from hypothesis import strategies as st
from starlette.testclient import TestClient

from contracts import InvalidMinute, Minute, check_project_id, decode_minute, encode_minute, is_valid_project_id
from contracts.minute import MAX_NAME_LENGTH
from pvm.protocols import MemoryPoint
from pvm.reader import ContextReader
from pvm.stores.log import SEGMENT_SUFFIX, LogReader, LogWriter
from pvm.vectors import check_point
from workers.api.app import create_app
from workers.api.auth import ALL_PROJECTS, parse_tokens, token_sha256
from workers.index import pool as index_pool
from workers.ops.cli.plumbing import project_id as _project_id

ROOT = Path(__file__).resolve().parents[1]

VALID = [
    "a",
    "Z",
    "7",
    "alpha",
    "Alpha-2",
    "beta_svc.v2",
    "a.",
    "a..b",
    "0-_.",
    "p" * MAX_NAME_LENGTH,
]
INVALID = [
    "",
    " ",
    "a b",
    " a",
    "a ",
    "a\t",
    "a\n",
    "a\x00b",
    "a/b",
    "/a",
    "a\\b",
    ".",
    "..",
    "../etc",
    ".hidden",
    "-x",
    "_x",
    "team:alpha",
    "a*",
    "a?b",
    "a#b",
    "a%2Fb",
    "p" * (MAX_NAME_LENGTH + 1),
    "é",
    "projé",
    "ß",
    "\uff41",  # fullwidth a
    "\u0661",  # an Arabic-Indic digit: a digit to \d, not to the rule
    "a\u200bb",  # zero-width space
    "🙂",
]
CASES = [(v, True) for v in VALID] + [(v, False) for v in INVALID]


def _minute_accepts(value: object) -> bool:
    try:
        Minute(project_id=value, event_type="message")  # type: ignore[arg-type]
    except InvalidMinute as exc:
        assert exc.field == "project_id"
        return False
    return True


def _wire_accepts(value: object) -> bool:
    raw = msgpack.packb({**_wire_minute(), "project_id": value})
    try:
        decode_minute(raw)
    except InvalidMinute as exc:
        assert exc.field == "project_id"
        return False
    return True


def _wire_minute() -> dict[str, object]:
    return {"v": 1, **Minute(project_id="p", event_type="message", id="m1").to_dict()}


def _index_pool_decode_accepts(value: object) -> bool:
    """What the index pool makes of a durable record naming this project (bytes the log holds, read as trusted)."""
    logged, bad = index_pool.decode([["m1", 1, msgpack.packb({**_wire_minute(), "project_id": value})]])
    assert len(logged) + len(bad) == 1
    return bool(logged)


def _cli_accepts(value: str) -> bool:
    try:
        assert _project_id(value) == value
    except argparse.ArgumentTypeError as exc:
        assert "is not a project id" in str(exc)
        return False
    return True


def _tokens_file_accepts(value: object) -> bool:
    entry = {"name": "team", "sha256": token_sha256("secret"), "projects": [value]}
    try:
        parse_tokens({"tokens": [entry]})
    except ValueError as exc:
        assert "is not a valid project id" in str(exc)
        return False
    return True


def _vector_point_accepts(value: str) -> bool:
    try:
        check_point(MemoryPoint(minute_id="m1", project_id=value, text="t", payload={"project_id": value}))
    except ValueError as exc:
        assert "project_id" in str(exc)
        return False
    return True


def _check_accepts(value: object) -> bool:
    try:
        assert check_project_id(value, field="--project") == value
    except InvalidMinute as exc:
        assert exc.field == "--project"
        return False
    return True


# Every entry point that needs no server, by name: each says whether it took the id.
OFFLINE: dict[str, Callable[[str], bool]] = {
    "is_valid_project_id": is_valid_project_id,
    "check_project_id": _check_accepts,
    "Minute": _minute_accepts,
    "decode_minute": _wire_accepts,
    "index_pool.decode": _index_pool_decode_accepts,
    "cli --project": _cli_accepts,
    "tokens file": _tokens_file_accepts,
    "vector point": _vector_point_accepts,
}


@pytest.mark.parametrize(("value", "valid"), CASES, ids=repr)
def test_every_entry_point_takes_exactly_the_valid_ids(value: str, valid: bool) -> None:
    assert {name: accepts(value) for name, accepts in OFFLINE.items()} == dict.fromkeys(OFFLINE, valid)


@pytest.mark.parametrize("value", [None, 7, 7.0, b"alpha", ["alpha"], {"alpha": 1}, True])
def test_what_is_not_text_is_never_a_project_id(value: object) -> None:
    for name in ("is_valid_project_id", "check_project_id", "Minute", "decode_minute", "index_pool.decode"):
        assert OFFLINE[name](value) is False, name  # type: ignore[arg-type]
    assert _tokens_file_accepts(value) is False


# Text that is near the rule: its alphabet, its neighbours, and what path and shell tricks are made of.
_ALPHABET = [*"aZ09_.-", " ", "/", "\\", ":", "\n", "\x00", "é", "\u0661", "\uff41", "🙂"]
_NEAR = st.text(alphabet=st.sampled_from(_ALPHABET), max_size=12) | st.text(max_size=MAX_NAME_LENGTH + 4)


@given(_NEAR)
def test_entry_points_agree_on_any_text(value: str) -> None:
    assume(value != ALL_PROJECTS)  # the tokens file's wildcard: the next test
    expected = is_valid_project_id(value)
    assert {name: accepts(value) for name, accepts in OFFLINE.items()} == dict.fromkeys(OFFLINE, expected)


def test_the_log_answers_only_for_valid_ids_whatever_the_disk_holds(tmp_path: Path) -> None:
    """A directory with a segment under an invalid name (made by hand) is never a project of the log."""
    writer = LogWriter(tmp_path)
    for value in VALID:
        writer.append(value, [("m1", "1-0", encode_minute(Minute(project_id=value, event_type="message", id="m1")))])
    planted = []
    for value in INVALID:
        if value in ("", ".", "..") or "/" in value or "\x00" in value:
            continue  # cannot be one directory name
        directory = tmp_path / value
        directory.mkdir(exist_ok=True)
        (directory / f"{0:020d}{SEGMENT_SUFFIX}").write_bytes(b"")
        planted.append(value)
    assert len(planted) > 15
    reader = LogReader(tmp_path)
    for value, valid in CASES:
        assert reader.has_project(value) is valid, value


@pytest.fixture
def api(redis_client: redis.Redis, tmp_path: Path) -> Iterator[TestClient]:
    reader = ContextReader(redis_client, LogReader(tmp_path), None)
    with TestClient(create_app(reader, redis_client, 1)) as client:
        yield client


def test_the_api_takes_exactly_the_valid_ids_in_its_paths(api: TestClient) -> None:
    for value, valid in CASES:
        answer = api.get(f"/v1/projects/{quote(value, safe='')}/recent")
        if valid:
            assert answer.status_code == 200, (value, answer.text)
        elif "/" in unquote(value) or value in ("", ".", ".."):  # the TestClient decodes a path once more
            assert answer.status_code == 404, (value, answer.text)  # not one path segment: no route takes it
        else:
            assert answer.status_code == 400, (value, answer.text)
            assert answer.json()["error"].startswith("path parameter project_id "), value


def test_one_module_holds_the_project_id_rule() -> None:
    """The pattern and the length limit of a project id are read in contracts/minute.py alone."""
    readers = []
    for package in ("contracts", "pvm", "workers", "bench"):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
            if "PROJECT_PATTERN" in names:
                readers.append(str(path.relative_to(ROOT)))
    assert readers == ["contracts/minute.py"]


def test_a_long_text_is_refused_without_being_remembered() -> None:
    """The validator remembers the ids it matched (a process sees few projects), never text over the length limit."""
    from contracts.minute import _matches_project_pattern

    before = _matches_project_pattern.cache_info().currsize
    assert not is_valid_project_id("p" * 1_000_000)
    assert _matches_project_pattern.cache_info().currsize == before


def test_the_tokens_files_wildcard_is_no_project_id() -> None:
    """`"*"` in a token's projects means every project; it is a project id nowhere."""
    assert _tokens_file_accepts(ALL_PROJECTS)
    assert not is_valid_project_id(ALL_PROJECTS)
    assert not any(accepts(ALL_PROJECTS) for name, accepts in OFFLINE.items() if name != "tokens file")

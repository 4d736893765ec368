"""The Markdown memory (workers/agent/memory_files.py): export, import as minutes, versions, read-only files, folders.

Facts reach the store the only way they can: change minutes applied by the facts store (`FactStore.apply_changes`,
what the facts pool runs for every change minute the log hands it). Random memories come from a seeded
generator, so a failure names its seed.
"""

from __future__ import annotations

import os
import random
import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, assume, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from contracts import decode_minute, keys, new_minute_id
from contracts.errors import InvalidFact
from contracts.fact_changes import (
    asserted_minute,
    edited_minute,
    fact_change,
    learned_minute,
    retracted_minute,
    tier_promoted_minute,
)
from contracts.facts import GLOBAL_KEY, Fact, FactStatus, FactType, TierKey
from contracts.minute import Minute
from contracts.summaries import Chunk, Episode, EpisodeKind, ThreadRef
from pvm.config import Settings
from pvm.stores.facts import FactStore
from tests.memory_helpers import use_settings
from workers.agent.memory_errors import MemoryConflict, MemoryFileError, MemoryForbidden, MemoryPathError
from workers.agent.memory_files import export_files, plan_import, stream_writer
from workers.agent.memory_folders import EXPORT_MARK, read_export_version, read_folder, write_folder
from workers.agent.memory_front_matter import parse
from workers.agent.memory_paths import fact_path
from workers.agent.memory_snapshot import FactRecord, MemorySnapshot, read_snapshot
from workers.ops import cli

P = "apollo"
TYPES = [t.value for t in FactType]
TRICKY = ["plain", 'quotes " and \\ slashes', "new\nline", "unicode ÄÖ 東京 \u2028 sep", "colon: yes # hash", "  pad  "]


def apply(connection: redis.Redis, minutes: list[Minute]) -> None:
    """Apply change minutes to the facts store, as the facts pool does once the log made them durable."""
    FactStore(connection).apply_changes([(m, fact_change(m)) for m in minutes])


def random_fact(rng: random.Random, i: int) -> Fact:
    """A fact in a slot of its own (so no supersession), with tricky text and a random type, tier and status."""
    mid = new_minute_id()
    task = rng.random() < 0.3
    return Fact.new(
        type=rng.choice(TYPES),
        text=f"{rng.choice(TRICKY)} fact {i}",
        subject=f"svc:{i} {rng.choice(['auth', 'db', 'café'])}",
        attribute=rng.choice(["owner", "ttl", "engine", "port"]) + f" {i}",
        value=rng.choice([f"v{i}", str(rng.randint(1, 99)), "Postgres 16", "true"]),
        tier_key=TierKey.for_task(P, f"T-{i % 3}") if task else TierKey.for_project(P),
        confidence=round(rng.random(), 3),
        importance=rng.choice([None, round(rng.random(), 2)]),
        source_minute_ids=[mid],
        status=rng.choice(["pending", "promoted"]),
        tags=rng.sample(["db", "ops", "auth", "x y"], rng.randint(0, 2)),
    )


def seed_memory(connection: redis.Redis, rng: random.Random, n: int) -> list[Fact]:
    """n random facts (some edited, some retracted) and two learned keys, applied to the store."""
    facts = [random_fact(rng, i) for i in range(n)]
    minutes = [asserted_minute(f) for f in facts]
    for f in rng.sample(facts, n // 4):
        minutes.append(edited_minute(f, importance=0.42, text=f"{f.text} (edited)"))
    for f in rng.sample(facts, n // 6):
        minutes.append(retracted_minute(f, "wrong"))
    minutes.append(learned_minute("deploy window", "Tue 10:00", TierKey.for_project(P)))
    minutes.append(learned_minute("oncall", "ana", TierKey.for_task(P, "T-1")))
    apply(connection, minutes)
    return facts


def streamed(connection: redis.Redis, settings: Settings) -> list[Minute]:
    out = []
    for shard in range(settings.shards):
        out += [decode_minute(f[keys.MINUTE_FIELD]) for _, f in connection.xrange(keys.stream(shard))]
    return out


# -- round trip ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_export_then_import_of_random_memories_writes_nothing(redis_client: redis.Redis, seed: int) -> None:
    rng = random.Random(seed)
    seed_memory(redis_client, rng, 40)
    snapshot = read_snapshot(redis_client, P)
    assert len(snapshot.records) == 42
    files = export_files(snapshot)
    plan = plan_import(snapshot, files)
    assert plan.changes == [], f"seed {seed}: {plan.to_dict()}"
    assert plan.unchanged == len(files) == 42
    # Reformatted by an editor (the whole front-matter as block YAML) is still no change.
    import yaml

    restyled = {}
    for path, text in files.items():
        front, body = parse(path, text)
        restyled[path] = "---\n" + yaml.safe_dump(front, allow_unicode=True, sort_keys=True) + "---\n" + body + "\n"
    assert plan_import(snapshot, restyled).changes == [], f"seed {seed}"


@given(
    text=st.text(min_size=1, max_size=200),
    subject=st.text(min_size=1, max_size=40),
    value=st.one_of(st.text(min_size=1, max_size=60), st.integers(), st.booleans()),
    tags=st.lists(st.text(min_size=1, max_size=20), max_size=3, unique=True),
    task=st.one_of(st.none(), st.text(min_size=1, max_size=30)),
)
@hsettings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
def test_any_fact_renders_to_a_file_that_imports_as_no_change(
    text: str, subject: str, value: str | int | bool, tags: list[str], task: str | None
) -> None:
    """Whatever its text holds (quotes, colons, '---' lines, control characters, line separators), a fact's file
    parses back to the same front-matter and imports as no change."""
    try:
        fact = Fact.new(
            type="fact",
            text=text,
            subject=subject,
            attribute="attr",
            value=value,
            tier_key=TierKey.for_project(P) if task is None else TierKey.for_task(P, task),
            confidence=0.5,
            source_minute_ids=[new_minute_id()],
            tags=tags,
        )
    except InvalidFact:
        assume(False)
        return
    record = FactRecord(fact.to_dict(), 1_795_708_800_000, fact)
    snapshot = MemorySnapshot(P, {fact.id: record})
    files = export_files(snapshot)
    [(path, rendered)] = files.items()
    front, body = parse(path, rendered)
    assert front["id"] == fact.id and front["value"] == fact.value and front["tags"] == list(fact.tags)
    assert front.get("task") == fact.task_id and front["subject"] == fact.subject
    assert body.strip() == fact.text.strip()
    assert plan_import(snapshot, files).changes == []


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_random_edits_write_exactly_the_right_minutes_and_apply_to_what_the_files_say(
    redis_client: redis.Redis, seed: int
) -> None:
    rng = random.Random(seed)
    seed_memory(redis_client, rng, 30)
    snapshot = read_snapshot(redis_client, P)
    files = export_files(snapshot)
    by_id = {parse(p, t)[0]["id"]: p for p, t in files.items()}
    live = [s.fact for s in snapshot.records.values() if s.fact.status.value != "retracted"]
    rng.shuffle(live)
    expected: Counter[tuple[str, str]] = Counter()
    edited = files.copy()
    for fact in live[:4]:  # importance and text: one fact_edited each
        path = by_id[fact.id]
        text = edited[path].replace(f"importance: {fact.importance!r}", "importance: 0.13", 1)
        edited[path] = text.rstrip("\n") + "\nMore detail.\n"
        expected[("fact_edited", fact.id)] += 1
    for fact in live[4:6]:  # removed file: fact_retracted
        del edited[by_id[fact.id]]
        expected[("fact_retracted", fact.id)] += 1
    for fact in live[6:8]:  # status: retracted
        path = by_id[fact.id]
        edited[path] = edited[path].replace(f'status: "{fact.status.value}"', 'status: "retracted"', 1)
        expected[("fact_retracted", fact.id)] += 1
    pending = [f for f in live[8:] if f.status.value == "pending"][:2]
    for fact in pending:  # status: promoted (each in a slot of its own: nothing to supersede)
        path = by_id[fact.id]
        edited[path] = edited[path].replace('status: "pending"', 'status: "promoted"', 1)
        expected[("fact_promoted", fact.id)] += 1
    edited["facts/project/new-by-hand.md"] = (
        "---\ntype: decision\nsubject: service:web\nattribute: framework\nvalue: Starlette\n---\n"
        "We serve with Starlette.\n"
    )
    # The export's version: the newest fact's file may be among those removed (its learned key, seed 4), and only
    # the version tells that whoever removed it had seen it (`test_the_export_version_...` below).
    plan = plan_import(snapshot, edited, exported_version=snapshot.last_ms)
    got = Counter((c.minute.event_type, c.fact_id) for c in plan.changes if c.minute.event_type != "fact_asserted")
    assert got == expected, f"seed {seed}"
    [asserted] = [c for c in plan.changes if c.minute.event_type == "fact_asserted"]
    assert len(plan.changes) == sum(expected.values()) + 1

    # Written and applied, the memory is what the files say: its export imports as no change.
    stream_writer(redis_client, 4)(plan.minutes)
    apply(redis_client, plan.minutes)
    after = read_snapshot(redis_client, P)
    assert after.records[asserted.fact_id].fact.value == "Starlette"
    for fact in live[:4]:
        assert after.records[fact.id].fact.importance == 0.13
        assert after.records[fact.id].fact.text.endswith("More detail.")
    for fact in live[4:8]:
        assert after.records[fact.id].fact.status.value == "retracted"
    for fact in pending:
        assert after.records[fact.id].fact.status.value == "promoted"
    assert plan_import(after, export_files(after)).changes == []


def test_a_new_value_in_a_single_valued_slot_supersedes_the_old_one(redis_client: redis.Redis) -> None:
    old = Fact.new(
        type="decision",
        text="db is Postgres 15",
        subject="stack",
        attribute="database",
        value="Postgres 15",
        tier_key=TierKey.for_project(P),
        confidence=1.0,
        source_minute_ids=[new_minute_id()],
        status="promoted",
        valid_from="2026-01-01T00:00:00Z",
    )
    apply(redis_client, [asserted_minute(old)])
    snapshot = read_snapshot(redis_client, P)
    files = export_files(snapshot)
    files["facts/project/decision/pg16.md"] = (
        "---\ntype: decision\nsubject: stack\nattribute: database\nvalue: Postgres 16\n---\n"
    )
    plan = plan_import(snapshot, files)
    assert [c.minute.event_type for c in plan.changes] == ["fact_asserted", "fact_superseded"]
    assert plan.changes[1].fact_id == old.id
    # With the caller's minute id (a retried request) every minute's id is the same in every plan: first, derived.
    first = new_minute_id()
    plans = [plan_import(snapshot, files, minute_id=first) for _ in range(2)]
    ids = [[c.minute.id for c in p.changes] for p in plans]
    assert ids[0] == ids[1] and ids[0][0] == first and len(set(ids[0])) == 2 and len(ids[0][1]) == 26
    assert plans[0].changes[0].minute.data["fact"]["source_minute_ids"] == [first]
    assert [c.minute.id for c in plan_import(snapshot, files).changes] != ids[0]


# -- refusals -----------------------------------------------------------------------------------------------------


def test_an_edit_of_a_fact_changed_since_the_export_is_refused_naming_the_file_and_both_versions(
    redis_client: redis.Redis, settings: Settings
) -> None:
    [fact] = seed_memory(redis_client, random.Random(7), 1)
    snapshot = read_snapshot(redis_client, P)
    files = export_files(snapshot)
    path = fact_path(fact)
    exported_version = snapshot.records[fact.id].last_ms
    later = (datetime.now(UTC) + timedelta(seconds=1)).isoformat().replace("+00:00", "Z")
    # Someone else's change, a second on: a version is the time (ms) of the newest change, so a change in the
    # same millisecond as the seed's would leave it as it was.
    apply(redis_client, [edited_minute(snapshot.records[fact.id].fact, confidence=0.01, timestamp=later)])
    now = read_snapshot(redis_client, P)
    files[path] = files[path].rstrip("\n") + "\nmy edit\n"
    with pytest.raises(MemoryConflict) as refused:
        plan_import(now, files)
    message = str(refused.value)
    assert path in message and str(exported_version) in message and str(now.records[fact.id].last_ms) in message
    assert "Export again" in message
    assert streamed(redis_client, settings) == []


def test_identity_fields_cannot_change_in_place_and_unknown_ids_are_refused(redis_client: redis.Redis) -> None:
    [fact] = seed_memory(redis_client, random.Random(8), 1)
    snapshot = read_snapshot(redis_client, P)
    files = export_files(snapshot)
    path = fact_path(fact)
    changed = files[path].replace(f'value: "{fact.value}"', 'value: "something else"', 1)
    with pytest.raises(MemoryFileError, match="value cannot change in place"):
        plan_import(snapshot, {**files, path: changed})
    other = files[path].replace(fact.id, "00000000-0000-5000-8000-000000000000")
    with pytest.raises(MemoryFileError, match="is not a fact of project apollo"):
        plan_import(snapshot, {**files, path: other})
    new_file = "---\nsubject: a\nattribute: b\nvalue: c\ntags: ops\n---\n"
    with pytest.raises(MemoryFileError, match=r"tags must be a list"):
        plan_import(snapshot, {**files, "facts/new.md": new_file})
    bad = files[path].replace('"importance": ', "").replace("importance: ", "importance: 7 #", 1)
    with pytest.raises(MemoryFileError, match=r"importance .*outside 0\.\.1"):
        plan_import(snapshot, {**files, path: bad})


def _thread_records() -> tuple[Chunk, Episode]:
    thread = ThreadRef.parse("deploy-42")
    chunk = Chunk(project_id=P, thread=thread, seq_ranges=((1, 10),), minute_count=10, summary="They deployed.")
    episode = Episode(
        project_id=P,
        thread=thread,
        kinds=(EpisodeKind(next(iter(EpisodeKind)).value),),
        title="Deploy failed then passed",
        summary="The deploy failed, was fixed, and passed.",
        minute_ids=(new_minute_id(),),
        first_seq=3,
        last_seq=9,
    )
    return chunk, episode


def test_episodes_and_summaries_are_read_only() -> None:
    chunk, episode = _thread_records()
    snapshot = MemorySnapshot(P, {}, (chunk,), (episode,))
    files = export_files(snapshot)
    assert sorted(p.split("/")[0] for p in files) == ["episodes", "summaries"]
    assert plan_import(snapshot, files).changes == []
    for path in files:
        edited = {**files, path: files[path].replace("passed.", "passed!").replace("deployed.", "deployed!")}
        with pytest.raises(MemoryConflict, match="read-only"):
            plan_import(snapshot, edited)
    with pytest.raises(MemoryConflict, match="read-only"):
        plan_import(snapshot, {**files, "episodes/new.md": "---\ntitle: x\n---\n"})


# -- the sandbox --------------------------------------------------------------------------------------------------

ATTACKS = [
    "../secrets.md",
    "facts/../../etc/passwd.md",
    "facts/../learned/x.md",
    "/etc/passwd.md",
    "facts//x.md",
    "facts/./x.md",
    "facts/.hidden.md",
    "facts/%2e%2e/%2e%2e/x.md",
    "facts/%252e%252e/x.md",
    "facts/..%2fx.md",
    "facts\\..\\x.md",
    "C:/facts/x.md",
    "facts/x.md\x00.txt",
    "facts/x\n.md",
    "facts/x.txt",
    "facts",
    "other/x.md",
    "facts/" + "a" * 300 + ".md",
    "facts/\u2025/x.md",
    "facts/x.md/",
    "",
]


@pytest.mark.parametrize("path", ATTACKS)
def test_paths_outside_the_memory_root_are_refused(path: str) -> None:
    snapshot = MemorySnapshot(P, {})
    with pytest.raises(MemoryPathError):
        plan_import(snapshot, {path: "---\nsubject: a\nattribute: b\nvalue: c\n---\n"}, partial=True)


@pytest.mark.parametrize("path", ["facts/../secrets.md", "facts/./x.md", "facts//x.md"])
def test_a_dot_segment_is_refused_saying_paths_stay_inside_the_memory_root(path: str) -> None:
    from workers.agent.memory_paths import check_memory_path

    with pytest.raises(MemoryPathError) as refused:
        check_memory_path(path)
    assert str(refused.value).endswith("segment; paths stay inside the project's memory root")


def test_fuzzed_paths_never_leave_the_root(tmp_path: Path) -> None:
    from workers.agent.memory_paths import check_memory_path

    rng = random.Random(13)
    segments = ["facts", "learned", "episodes", "..", ".", "%2e%2e", "a", "b.md", ".md", "x\x00.md", "~", "..%2f", ""]
    separators = ["/", "/", "/", "\\", "//", "%2f"]
    root = (tmp_path / "root").resolve()
    accepted = 0
    for _ in range(5000):
        parts = [rng.choice(segments) for _ in range(rng.randint(1, 5))]
        path = rng.choice(["", "", "/"]) + "".join(p + rng.choice(separators) for p in parts[:-1]) + parts[-1]
        try:
            checked = check_memory_path(path)
        except MemoryPathError:
            continue
        accepted += 1
        assert ".." not in checked.split("/") and "\x00" not in checked and "%" not in checked
        assert (root / checked).resolve().is_relative_to(root), path
    assert accepted > 0  # the generator reaches valid paths too


def test_a_folder_with_a_symlink_out_of_it_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("---\nsubject: a\nattribute: b\nvalue: c\n---\n")
    memory = tmp_path / "memory"
    write_folder(memory, export_files(MemorySnapshot(P, {})))
    (memory / "facts" / "project").mkdir(parents=True)
    (memory / "facts" / "project" / "inside.md").write_text("---\nsubject: a\nattribute: b\nvalue: c\n---\n")
    (memory / "facts" / "linked.md").symlink_to(memory / "facts" / "project" / "inside.md")
    assert sorted(read_folder(memory)) == ["facts/linked.md", "facts/project/inside.md"]
    os.symlink(outside / "secret.md", memory / "facts" / "escape.md")
    with pytest.raises(MemoryPathError, match="outside the memory folder"):
        read_folder(memory)
    (memory / "facts" / "escape.md").unlink()
    os.symlink(outside, memory / "learned")
    with pytest.raises(MemoryPathError, match="outside the memory folder"):
        read_folder(memory)
    with pytest.raises(MemoryPathError, match="symlink"):
        write_folder(memory, {})


def test_an_oversized_file_is_refused(tmp_path: Path) -> None:
    from pvm import defaults

    big = "---\nsubject: a\nattribute: b\nvalue: c\n---\n" + "x" * defaults.MEMORY_FILE_MAX_BYTES
    with pytest.raises(MemoryFileError, match="MEMORY_FILE_MAX_BYTES"):
        plan_import(MemorySnapshot(P, {}), {"facts/big.md": big})
    (tmp_path / "facts").mkdir()
    (tmp_path / "facts" / "big.md").write_text(big)
    with pytest.raises(MemoryFileError, match="MEMORY_FILE_MAX_BYTES"):
        read_folder(tmp_path)


# -- the global tier ----------------------------------------------------------------------------------------------


def seed_global(connection: redis.Redis) -> Fact:
    """A project fact promoted to the global tier and a global learned key; returns the fact's global copy."""
    fact = random_fact(random.Random(21), 0).with_(tier_key=TierKey.for_project(P), status=FactStatus.PROMOTED)
    promoted = tier_promoted_minute(fact)
    apply(connection, [asserted_minute(fact), promoted, learned_minute("region", "eu-west", GLOBAL_KEY, project_id=P)])
    return Fact.from_dict(promoted.data["fact"])


def global_paths(files: dict[str, str]) -> list[str]:
    return sorted(p for p in files if p.split("/")[1] == "global")


def test_the_global_tier_is_exported_only_with_the_grant(redis_client: redis.Redis) -> None:
    copy = seed_global(redis_client)
    plain = export_files(read_snapshot(redis_client, P))
    assert global_paths(plain) == [] and len(plain) == 1
    granted = export_files(read_snapshot(redis_client, P, include_global=True))
    [learned] = [p for p in global_paths(granted) if p.startswith("learned/global/")]
    assert global_paths(granted) == sorted([fact_path(copy), learned]) and fact_path(copy).startswith("facts/global/")
    assert set(granted) - set(plain) == set(global_paths(granted))
    assert parse(fact_path(copy), granted[fact_path(copy)])[0]["tier"] == "global"
    plan = plan_import(read_snapshot(redis_client, P, include_global=True), granted)
    assert plan.changes == [] and plan.unchanged == 3
    # Imported with the grant, a folder exported without it retracts no global fact.
    assert plan_import(read_snapshot(redis_client, P, include_global=True), plain).changes == []


def test_an_edit_of_a_global_fact_with_the_grant_writes_one_minute(redis_client: redis.Redis) -> None:
    copy = seed_global(redis_client)
    path = fact_path(copy)
    granted = export_files(read_snapshot(redis_client, P, include_global=True))
    edited = {**granted, path: granted[path].rstrip("\n") + "\nChecked by a person.\n"}
    plan = plan_import(read_snapshot(redis_client, P, include_global=True), edited)
    [change] = plan.changes
    assert (change.path, change.fact_id, change.minute.event_type) == (path, copy.id, "fact_edited")
    assert change.minute.project_id == P and change.minute.scope == "global"
    apply(redis_client, plan.minutes)
    after = export_files(read_snapshot(redis_client, P, include_global=True))
    assert after[path].endswith("Checked by a person.\n")
    retracted = after[path].replace('status: "promoted"', 'status: "retracted"')
    [change] = plan_import(read_snapshot(redis_client, P, include_global=True), {path: retracted}, partial=True).changes
    assert change.minute.event_type == "fact_retracted" and change.minute.scope == "global"
    key = "---\ntier: global\nsubject: learned\nattribute: default region\nvalue: eu-central\n---\n"
    [change] = plan_import(read_snapshot(redis_client, P, include_global=True), {"learned/global/r.md": key}).changes
    assert (change.minute.event_type, change.minute.project_id, change.minute.scope) == ("fact_learned", P, "global")
    fact = "---\ntier: global\nsubject: region\nattribute: default\nvalue: eu\n---\n"
    with pytest.raises(MemoryFileError, match="a new global fact comes only by promotion"):
        plan_import(read_snapshot(redis_client, P, include_global=True), {"facts/global/r.md": fact}, partial=True)


def test_a_global_file_without_the_grant_is_refused_naming_the_file(redis_client: redis.Redis) -> None:
    copy = seed_global(redis_client)
    path = fact_path(copy)
    granted = export_files(read_snapshot(redis_client, P, include_global=True))
    edited = granted[path].rstrip("\n") + "\nChecked by a person.\n"
    plain = read_snapshot(redis_client, P)
    with pytest.raises(MemoryForbidden, match=f"^{re.escape(path)}: the global tier is read-only without the global"):
        plan_import(plain, {path: edited}, partial=True)
    with pytest.raises(MemoryForbidden) as refused:
        plan_import(plain, granted)  # unedited: still refused, and nothing of the import is written
    assert sorted(p.partition(":")[0] for p in refused.value.problems) == global_paths(granted)
    new_global = "---\ntier: global\nsubject: region\nattribute: default\nvalue: eu\n---\n"
    with pytest.raises(MemoryForbidden, match=r"^facts/project/x\.md: the global tier is read-only"):
        plan_import(plain, {"facts/project/x.md": new_global}, partial=True)


# -- the CLI ------------------------------------------------------------------------------------------------------


def test_cli_export_edit_import(
    redis_client: redis.Redis,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    use_settings(settings, monkeypatch)
    [fact] = seed_memory(redis_client, random.Random(9), 1)
    out = tmp_path / "memory"
    assert cli.main(["export", "--project", P, "--out", str(out), "--tree"]) == 0
    shown = capsys.readouterr().out
    assert "3 files of project apollo" in shown and "learned/" in shown and "facts/" in shown
    assert cli.main(["import", "--project", P, str(out)]) == 0
    assert "wrote 0 minutes" in capsys.readouterr().out
    assert streamed(redis_client, settings) == []
    target = out / fact_path(fact)
    target.write_text(target.read_text().rstrip("\n") + "\nA person added this.\n")
    assert cli.main(["import", "--project", P, str(out), "--dry-run"]) == 0
    assert "would write 1 minutes" in capsys.readouterr().out
    assert streamed(redis_client, settings) == []
    assert cli.main(["import", "--project", P, str(out), "--json"]) == 0
    [minute] = streamed(redis_client, settings)
    assert minute.event_type == "fact_edited" and minute.data["changes"]["text"].endswith("A person added this.")
    (out / "facts" / "x.md").write_text("no front-matter")
    assert cli.main(["import", "--project", P, str(out)]) == 1
    assert "facts/x.md: a memory file starts with a '---' line" in capsys.readouterr().err


def test_cli_export_and_import_the_global_tier_only_with_global(
    redis_client: redis.Redis,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    use_settings(settings, monkeypatch)
    copy = seed_global(redis_client)
    out = tmp_path / "memory"
    assert cli.main(["export", "--project", P, "--out", str(out)]) == 0
    assert global_paths(read_folder(out)) == []
    assert cli.main(["export", "--project", P, "--out", str(out), "--global"]) == 0
    assert fact_path(copy) in global_paths(read_folder(out))
    target = out / fact_path(copy)
    target.write_text(target.read_text().rstrip("\n") + "\nChecked by a person.\n")
    capsys.readouterr()
    assert cli.main(["import", "--project", P, str(out)]) == 1
    assert f"{fact_path(copy)}: the global tier is read-only without the global grant" in capsys.readouterr().err
    assert streamed(redis_client, settings) == []
    assert cli.main(["import", "--project", P, str(out), "--global"]) == 0
    [minute] = streamed(redis_client, settings)
    assert (minute.event_type, minute.project_id, minute.scope) == ("fact_edited", P, "global")


# -- the demo's MEMORY step ---------------------------------------------------------------------------------------


def test_the_demo_exports_the_memory_and_prints_its_tree(redis_client: redis.Redis, tmp_path: Path) -> None:
    from workers.ops.demo import export_memory

    facts = seed_memory(redis_client, random.Random(10), 12)
    out = tmp_path / "var" / "memory"
    lines = export_memory(redis_client, P, str(out))
    assert lines[0].startswith(f"The project's memory as Markdown files in {out}/ (14 files;")
    assert "  facts/" in lines and "  learned/" in lines and any(line.strip() == "..." for line in lines)
    assert sorted(read_folder(out)) == sorted(export_files(read_snapshot(redis_client, P)))
    assert (out / fact_path(facts[0])).read_text().startswith("---\nid: ")


def test_a_fact_made_after_the_export_is_not_retracted_by_its_missing_file(redis_client: redis.Redis) -> None:
    rng = random.Random(12)
    seed_memory(redis_client, rng, 3)
    exported = read_snapshot(redis_client, P)
    files = export_files(exported)
    late = random_fact(rng, 99)
    later = (datetime.now(UTC) + timedelta(seconds=1)).isoformat().replace("+00:00", "Z")
    apply(redis_client, [asserted_minute(late, timestamp=later)])  # the facts pool goes on after the export
    removed = sorted(files)[0]
    del files[removed]
    plan = plan_import(read_snapshot(redis_client, P), files)
    assert [(c.minute.event_type, c.path) for c in plan.changes] == [("fact_retracted", removed)]
    plan = plan_import(read_snapshot(redis_client, P), files, exported_version=exported.last_ms)
    assert [(c.minute.event_type, c.path) for c in plan.changes] == [("fact_retracted", removed)]


def test_the_export_version_retracts_the_newest_facts_removed_file(redis_client: redis.Redis, tmp_path: Path) -> None:
    """Without it the import can only go by the files' own versions, and the newest fact's file, removed, leaves
    no file that saw it: the fact is kept as one made after the export. With it (kept beside the folders by
    `write_folder`, answered by the API), the removal retracts."""
    rng = random.Random(13)
    seed_memory(redis_client, rng, 3)
    later = (datetime.now(UTC) + timedelta(seconds=1)).isoformat().replace("+00:00", "Z")
    apply(redis_client, [asserted_minute(random_fact(rng, 99), timestamp=later)])  # the newest, by a second
    snapshot = read_snapshot(redis_client, P)
    [newest] = [r for r in snapshot.records.values() if r.last_ms == snapshot.last_ms]
    out = tmp_path / "memory"
    write_folder(out, export_files(snapshot), snapshot.last_ms)
    assert read_export_version(out) == snapshot.last_ms
    (out / fact_path(newest.raw)).unlink()
    files = read_folder(out)
    assert plan_import(snapshot, files).changes == []
    plan = plan_import(snapshot, files, exported_version=read_export_version(out))
    assert [(c.minute.event_type, c.fact_id) for c in plan.changes] == [("fact_retracted", newest.id)]

    write_folder(out, export_files(snapshot))  # a folder without the version: no mark left from before
    assert read_export_version(out) is None
    for bad in ("{}", "not json", '{"version": "soon"}', '{"version": -1}'):
        (out / EXPORT_MARK).write_text(bad)
        with pytest.raises(MemoryFileError, match=r"\.pvm-export\.json"):
            read_export_version(out)
    with pytest.raises(MemoryFileError, match="exported_version"):
        plan_import(snapshot, files, exported_version=True)  # type: ignore[arg-type]

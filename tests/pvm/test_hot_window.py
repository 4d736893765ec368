"""The embedded engine's hot window (`pvm.vectors.hot`): a large project's lexical searches read its newest minutes
first, the archive when the window finds too few; a project below `ARCHIVE_FACTOR` windows keeps none and answers
exactly as without one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contracts.memory import SearchFilters
from pvm.config import Settings
from pvm.engines import make_engine
from pvm.protocols import MemoryPoint
from pvm.vectors.edge import EdgeEngine
from pvm.vectors.hot import ARCHIVE_FACTOR, HOT_DIRECTORY, HOT_INDEXED

P = "hot-proj"
T0 = 1_790_000_000_000
HOT = 10  # the window holds the newest 10 to 20 minutes ...
LARGE = ARCHIVE_FACTOR * HOT  # ... of a project that has this many
MANY = LARGE + 40  # a large project: seeded at LARGE, then rotated (more than once)
BATCH = 5


def point(n: int, text: str) -> MemoryPoint:
    """Minute `m<n>` written at T0 + n seconds, in a thread of its own every 7 minutes."""
    minute_id = f"m{n:03d}"
    payload = {
        "project_id": P,
        "minute_id": minute_id,
        "agent_id": "coder" if n % 2 else "reviewer",
        "event_type": "task_completed",
        "category": "agent_capability",
        "timestamp_ms": T0 + n * 1000,
        "task_id": f"T-{n % 3}",
        "thread_id": f"th-{n // 7}",
        "scores": {"recency": 1.0, "relevance": 0.5, "accuracy": 0.5, "impact": 0.5, "composite": 0.5},
    }
    return MemoryPoint(minute_id=minute_id, project_id=P, text=text, payload=payload)


def texts(count: int) -> list[str]:
    """Every minute speaks of deploying the payments service; the first also of a zebra, which nobody repeats."""
    return [
        "deployed the payments service, zebra crossing noted" if n == 0 else f"deployed the payments service, step {n}"
        for n in range(count)
    ]


def write(engine: EdgeEngine, count: int) -> None:
    said = texts(count)
    for start in range(0, count, BATCH):
        engine.upsert([point(n, said[n]) for n in range(start, min(count, start + BATCH))])


def window_points(engine: EdgeEngine) -> int:
    hot = engine._hot
    assert hot is not None
    return sum(g.count(P) for g in hot.generations)


def query(engine: EdgeEngine, text: str, limit: int = 5, filters: SearchFilters | None = None) -> list[Any]:
    return engine.query(P, text, None, filters or SearchFilters(), limit, with_payload=False)


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[tuple[EdgeEngine, EdgeEngine]]:
    """An engine with a hot window of HOT minutes, and one without, on directories of their own."""
    hot, plain = EdgeEngine(tmp_path / "hot", hot_minutes=HOT), EdgeEngine(tmp_path / "plain")
    try:
        yield hot, plain
    finally:
        hot.close()
        plain.close()


def test_a_small_project_answers_exactly_as_without_a_window(engines: tuple[EdgeEngine, EdgeEngine]) -> None:
    hot, plain = engines
    for engine in engines:
        write(engine, LARGE - 1)  # one short of keeping a window: nothing is written twice
    assert window_points(hot) == 0
    for text in ("deployed payments", "zebra", "payments step 3"):
        got, want = query(hot, text, limit=8), query(plain, text, limit=8)
        assert [(c.minute_id, c.keyword) for c in got] == [(c.minute_id, c.keyword) for c in want]
    hot.upsert([point(LARGE - 1, "deployed the payments service, the last step")])
    assert window_points(hot) == HOT  # the archive reached LARGE: the window is seeded with its newest


def test_a_large_project_searches_its_newest_minutes_first(engines: tuple[EdgeEngine, EdgeEngine]) -> None:
    hot, plain = engines
    for engine in engines:
        write(engine, MANY)
    held = window_points(hot)
    assert HOT <= held <= 2 * HOT  # rotated: the older generation dropped whole, more than once
    newest = {f"m{n:03d}" for n in range(MANY - held, MANY)}
    found = query(hot, "deployed the payments service", limit=5)
    assert len(found) == 5 and {c.minute_id for c in found} <= newest
    assert hot.hot is not None and hot.hot.searches == {"window": 1}
    archive = query(plain, "deployed the payments service", limit=5)
    assert not {c.minute_id for c in archive} <= newest  # the archive's best are older: the window changed the answer


def test_a_window_that_finds_too_few_hands_the_query_to_the_archive(engines: tuple[EdgeEngine, EdgeEngine]) -> None:
    hot, plain = engines
    for engine in engines:
        write(engine, MANY)
    assert hot.hot is not None and not hot.hot.searches
    assert [c.minute_id for c in query(hot, "zebra crossing")] == ["m000"]  # older than the window
    assert hot.hot.searches == {"archive": 1}
    wide = query(hot, "deployed payments", limit=2 * HOT + 5)  # more than the window holds
    assert [c.minute_id for c in wide] == [c.minute_id for c in query(plain, "deployed payments", limit=2 * HOT + 5)]


def test_a_search_of_the_past_reads_the_archive(engines: tuple[EdgeEngine, EdgeEngine]) -> None:
    hot, plain = engines
    for engine in engines:
        write(engine, MANY)
    past = SearchFilters(until_ms=T0 + 30_000)
    got = query(hot, "deployed the payments service", filters=past)
    assert got and [c.minute_id for c in got] == [c.minute_id for c in query(plain, "deployed payments", filters=past)]
    assert all(int(c.minute_id[1:]) < 30 for c in got) and hot.hot is not None and not hot.hot.searches


def test_filters_and_annotations_apply_in_the_window(engines: tuple[EdgeEngine, EdgeEngine]) -> None:
    hot, _ = engines
    write(hot, MANY)
    coder = query(hot, "deployed the payments service", filters=SearchFilters(agents=("coder",)))
    assert coder and all(int(c.minute_id[1:]) % 2 for c in coder)
    best = query(hot, "deployed the payments service")[0].minute_id
    assert hot.annotate(P, {best: {"pruned_ms": T0 + 99_000}}) == 1
    after = query(hot, "deployed the payments service")
    assert best not in [c.minute_id for c in after] and len(after) == 5
    pruned = query(hot, "deployed the payments service", filters=SearchFilters(include_pruned=True), limit=20)
    assert best in [c.minute_id for c in pruned]


def test_the_windows_answers_carry_new_scores_once_kept(engines: tuple[EdgeEngine, EdgeEngine]) -> None:
    # The window's generations share the archive's kept ranking payloads (`RankingMemo`): an annotation's new
    # scores, written to the archive and the window, show in the next search however often the point was read.
    hot, _ = engines
    write(hot, MANY)
    assert hot.ranking.generation(P) > 0
    for _ in range(2):  # the second search reads the payloads kept by the first
        found = query(hot, "deployed the payments service")
        assert {c.payload["scores"]["composite"] for c in found} == {0.5}
    assert hot.hot is not None and hot.hot.searches == {"window": 2} and hot.ranking.hits > 0
    best = found[0].minute_id
    assert hot.annotate(P, {best: {"scores": {"composite": 0.9, "relevance": 0.9}}}) == 1
    again = {c.minute_id: c.payload["scores"]["composite"] for c in query(hot, "deployed the payments service")}
    assert again[best] == 0.9 and hot.hot.searches == {"window": 3}


def test_a_rotation_keeps_what_the_archive_kept(engines: tuple[EdgeEngine, EdgeEngine]) -> None:
    # A generation's points are copies of the archive's: a rotation (the older generation deleted) lets go of none
    # of the payloads the memo they share keeps, and the window answers as it does reading every payload.
    hot, _ = engines
    write(hot, MANY)
    assert hot.hot is not None
    kept = len(hot.ranking)
    assert kept >= MANY - 2 * HOT  # every upsert kept its points; a seeding's copies were let go and read again
    more = [point(n, f"deployed the payments service, step {n}") for n in range(MANY, MANY + 2 * HOT)]
    for start in range(0, len(more), BATCH):  # rotates the window again
        hot.upsert(more[start : start + BATCH])
    assert len(hot.ranking) == kept + 2 * HOT
    misses = hot.ranking.misses
    found = [(c.minute_id, c.payload) for c in query(hot, "deployed the payments service")]
    assert hot.hot.searches == {"window": 1} and hot.ranking.misses == misses  # every candidate's payload kept
    hot.ranking.forget(P)
    assert [(c.minute_id, c.payload) for c in query(hot, "deployed the payments service")] == found
    assert hot.ranking.misses > misses


def test_deleting_the_project_drops_its_window(engines: tuple[EdgeEngine, EdgeEngine]) -> None:
    hot, _ = engines
    write(hot, MANY)
    hot.delete_project(P)
    assert window_points(hot) == 0 and query(hot, "deployed payments") == []
    write(hot, 12)  # a rebuild starts small: no window until the project is large again
    assert window_points(hot) == 0


def test_the_window_is_found_again_after_a_restart(tmp_path: Path) -> None:
    engine = EdgeEngine(tmp_path / "v", hot_minutes=HOT)
    write(engine, MANY)
    before = [c.minute_id for c in query(engine, "deployed the payments service")]
    engine.close()
    assert (tmp_path / "v" / HOT_DIRECTORY).is_dir() and EdgeEngine(tmp_path / "v").projects() == [P]
    again = EdgeEngine(tmp_path / "v", hot_minutes=HOT)
    try:
        assert [c.minute_id for c in query(again, "deployed the payments service")] == before
        again.upsert([point(MANY, f"deployed the payments service, step {MANY}")])
        assert f"m{MANY:03d}" in [c.minute_id for c in query(again, f"payments step {MANY}", limit=1)]
    finally:
        again.close()


def test_a_failed_window_write_leaves_the_archive_whole(
    engines: tuple[EdgeEngine, EdgeEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    hot, plain = engines
    for engine in engines:
        write(engine, MANY)
    assert hot._hot is not None
    generation = hot._hot.generations[0]

    def broken(project_id: str, points: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(generation, "write_points", broken)
    monkeypatch.setattr(hot._hot.generations[1], "write_points", broken)
    hot.upsert([point(MANY, "deployed the payments service, once more")])
    plain.upsert([point(MANY, "deployed the payments service, once more")])
    assert hot.count(P) == MANY + 1 and window_points(hot) == 0  # the archive took it; the window was dropped
    hot.upsert([point(MANY + 1, "deployed the payments service, again")])  # its seeding fails too: retried later
    plain.upsert([point(MANY + 1, "deployed the payments service, again")])
    text = "deployed the payments service"
    assert [c.minute_id for c in query(hot, text)] == [c.minute_id for c in query(plain, text)]
    monkeypatch.undo()  # the disk has room again: the window is seeded once HOT more minutes came
    extra = [point(n, f"deployed the payments service, step {n}") for n in range(MANY + 2, MANY + 2 + HOT)]
    hot.upsert(extra[:-1])
    assert window_points(hot) == 0
    hot.upsert(extra[-1:])
    assert window_points(hot) == HOT


def test_a_window_needs_a_positive_size(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="hot_minutes"):
        EdgeEngine(tmp_path / "v", hot_minutes=-1)


def test_the_window_indexes_only_what_every_search_filters_on(engines: tuple[EdgeEngine, EdgeEngine]) -> None:
    hot, _ = engines
    write(hot, LARGE)
    assert hot._hot is not None
    with hot._hot.generations[0]._shard(P, create=False) as shard:
        assert shard is not None
        assert set(shard.info().payload_schema) == set(HOT_INDEXED)
    with hot._shard(P, create=False) as archive:
        assert archive is not None
        assert set(archive.info().payload_schema) > set(HOT_INDEXED)


@pytest.mark.parametrize("minutes", [0, 7])
def test_the_setting_sizes_the_window_of_the_configured_engine(tmp_path: Path, minutes: int) -> None:
    settings = Settings.from_env({"PVM_HOME": str(tmp_path), "PVM_SEARCH_HOT_MINUTES": str(minutes)})
    engine = make_engine(settings, None)
    try:
        assert isinstance(engine, EdgeEngine)
        assert (engine.hot is None) if minutes == 0 else (engine.hot is not None and engine.hot.minutes == minutes)
    finally:
        engine.close()


def test_optimize_reaches_the_window(engines: tuple[EdgeEngine, EdgeEngine], monkeypatch: pytest.MonkeyPatch) -> None:
    hot, _ = engines
    write(hot, MANY)
    assert hot.hot is not None
    held = window_points(hot)
    optimized: list[tuple[int, dict[str, bool]]] = []
    for g, generation in enumerate(hot.hot.generations):
        real = generation.optimize

        def counted(project_id: str | None = None, g: int = g, real: Any = real) -> dict[str, bool]:
            done = real(project_id)
            optimized.append((g, done))
            return done

        monkeypatch.setattr(generation, "optimize", counted)
    assert set(hot.optimize()) == {P}  # the archive's projects: the window's shards are not projects
    # Each generation optimized the shards it holds: the project's in the one being written after a rotation.
    assert len(optimized) == 2 and {P} == {p for _, done in optimized for p in done}
    optimized.clear()
    assert set(hot.optimize(P)) == {P} and [g for g, _ in optimized] == [0, 1]
    assert window_points(hot) == held
    assert query(hot, "deployed the payments service") and hot.hot.searches["window"] == 1

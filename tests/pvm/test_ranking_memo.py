"""`RankingMemo`: the candidates' ranking payloads the embedded engine keeps, and when it lets them go."""

from __future__ import annotations

import uuid

from pvm.vectors.ranking_memo import RankingMemo


def payload(n: int) -> dict[str, object]:
    return {"minute_id": f"m{n}", "scores": {"composite": n / 10}}


def test_a_read_that_a_write_overtook_is_used_but_not_kept() -> None:
    memo = RankingMemo()
    taken = memo.generation("alpha")
    memo.written("alpha", [7])  # lands while the read runs: the payloads it read may predate it
    memo.keep("alpha", taken, {1: payload(1)})
    assert memo.get("alpha", [1]) == {}
    # A write to another project does not hold this one's reads back.
    taken = memo.generation("alpha")
    memo.written("beta", [1])
    memo.keep("alpha", taken, {1: payload(1)})
    assert memo.get("alpha", [1]) == {1: payload(1)}
    assert memo.get("beta", [1]) == {}


def test_a_write_drops_the_points_it_touches_and_a_forget_the_project() -> None:
    memo = RankingMemo()
    memo.keep("alpha", memo.generation("alpha"), {1: payload(1), 2: payload(2)})
    memo.keep("beta", memo.generation("beta"), {1: payload(1)})
    memo.written("alpha", [2, 99])
    hits, misses = memo.hits, memo.misses
    assert memo.get("alpha", [1, 2]) == {1: payload(1)}
    assert (memo.hits - hits, memo.misses - misses) == (1, 1)
    memo.forget("alpha")
    assert memo.get("alpha", [1, 2]) == {}
    assert memo.get("beta", [1]) == {1: payload(1)}  # the same point id in another project is its own


def test_what_is_kept_is_bounded_least_recently_used_first() -> None:
    memo = RankingMemo(kept=3)
    memo.keep("alpha", memo.generation("alpha"), {1: payload(1), 2: payload(2), 3: payload(3)})
    assert set(memo.get("alpha", [1])) == {1}  # 1 is now the most recently used
    memo.keep("alpha", memo.generation("alpha"), {4: payload(4)})
    assert len(memo) == 3
    assert set(memo.get("alpha", [1, 2, 3, 4])) == {1, 3, 4}
    nothing = RankingMemo(kept=0)
    nothing.keep("alpha", nothing.generation("alpha"), {1: payload(1)})
    assert len(nothing) == 0


def test_a_write_keeps_what_it_wrote_as_the_most_recently_used_within_the_bound() -> None:
    memo = RankingMemo(kept=3)
    memo.keep("alpha", memo.generation("alpha"), {1: payload(1), 2: payload(2)})
    with memo.writes:
        memo.written("alpha", [2, 3, 4])
        memo.keep_written("alpha", {2: payload(20), 3: payload(3), 4: payload(4)})
    assert memo.get("alpha", [1, 2, 3, 4]) == {2: payload(20), 3: payload(3), 4: payload(4)}  # 1 was the oldest
    nothing = RankingMemo(kept=0)
    nothing.keep_written("alpha", {1: payload(1)})
    assert len(nothing) == 0


def test_uuid_point_ids_are_one_point_whichever_object_names_them_and_lookup_says_what_was_missing() -> None:
    # The engine hands the memo a new UUID object for a point at every query; the memo keeps a UUID's integer, so
    # keeping, finding and dropping a point agree whichever object names it.
    ids = [uuid.uuid5(uuid.NAMESPACE_URL, f"m{i}") for i in range(4)]
    again = [uuid.UUID(str(pid)) for pid in ids]
    memo = RankingMemo()
    memo.keep("alpha", memo.generation("alpha"), {ids[0]: payload(0), ids[1]: payload(1)})
    hits, misses = memo.hits, memo.misses
    found, missing = memo.lookup("alpha", [again[2], again[1], again[0], again[2], again[3], again[1]])
    assert found == {ids[0]: payload(0), ids[1]: payload(1)}
    assert missing == [ids[2], ids[3]]  # each once, in the order asked
    assert (memo.hits - hits, memo.misses - misses) == (2, 2)
    with memo.writes:
        memo.written("alpha", [again[0]])
        memo.keep_written("alpha", {again[3]: payload(3)})
    assert memo.get("alpha", ids) == {ids[1]: payload(1), ids[3]: payload(3)}

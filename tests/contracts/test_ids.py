"""Minute ids: unique, strictly increasing per process, sortable by time, ULID layout."""

from __future__ import annotations

import itertools
import re
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts import ids
from contracts.ids import id_timestamp_ms, new_minute_id
from contracts.minute import ID_PATTERN, MAX_ID_LENGTH

CROCKFORD = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")


def now_ms() -> int:
    return int(time.time() * 1000)


def test_shape_is_26_chars_of_crockford_base32() -> None:
    assert ids._ALPHABET == "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
    for _ in range(1000):
        value = new_minute_id()
        assert len(value) == 26
        assert CROCKFORD.fullmatch(value), value
        assert not set(value) & set("ILOU")
        # Every id PVM mints is a valid minute id.
        assert ID_PATTERN.fullmatch(value) and len(value) <= MAX_ID_LENGTH


def test_unique_over_100k() -> None:
    made = [new_minute_id() for _ in range(100_000)]
    assert len(set(made)) == len(made)


def test_strictly_increasing_within_a_process() -> None:
    made = [new_minute_id() for _ in range(100_000)]
    assert all(a < b for a, b in itertools.pairwise(made))


def test_timestamp_prefix_is_the_creation_time() -> None:
    before = now_ms()
    value = new_minute_id()
    after = now_ms()
    stamped = id_timestamp_ms(value)
    assert stamped is not None
    # The id may sit on an earlier id's millisecond if that one was minted "in the future".
    assert before - 1 <= stamped <= max(after, ids._last_ms)


def test_sortable_by_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # Another test of this process may have made an id at an explicit future time: ids then count up from it.
    monkeypatch.setattr(ids, "_last_ms", 0)
    first = new_minute_id()
    time.sleep(0.005)
    second = new_minute_id()
    time.sleep(0.005)
    third = new_minute_id()
    assert first < second < third
    stamps = [id_timestamp_ms(v) for v in (first, second, third)]
    assert stamps == sorted(stamps)
    assert stamps[0] < stamps[2]  # type: ignore[operator]


def test_explicit_time_sets_the_prefix() -> None:
    target = now_ms() + 3  # slightly ahead, so the process-wide state stays near the real clock
    value = new_minute_id(now_ms=max(target, ids._last_ms + 1))
    assert id_timestamp_ms(value) == max(target, ids._last_ms)


@given(st.integers(0, 2**48 - 1), st.integers(0, 2**48 - 1))
def test_time_prefix_orders_like_the_time(a: int, b: int) -> None:
    # Ids from different processes sort by their millisecond prefix.
    ea, eb = ids._encode(a, 10), ids._encode(b, 10)
    assert (ea < eb) == (a < b)
    assert id_timestamp_ms(ea + "0" * 16) == a


def test_backwards_clock_never_goes_backwards() -> None:
    latest = new_minute_id()
    stepped_back = new_minute_id(now_ms=now_ms() - 60_000)
    assert stepped_back > latest
    assert id_timestamp_ms(stepped_back) == id_timestamp_ms(latest)


def test_random_overflow_moves_to_the_next_millisecond() -> None:
    # Force the per-millisecond counter to its maximum; state only ever moves forward here.
    with ids._lock:
        ids._last_ms = max(ids._last_ms, now_ms())
        ids._last_random = ids._RANDOM_MAX
        stuck_ms = ids._last_ms
    value = new_minute_id(now_ms=stuck_ms)
    assert id_timestamp_ms(value) == stuck_ms + 1
    assert new_minute_id() > value


def test_threads_produce_unique_increasing_ids() -> None:
    per_thread, threads = 5_000, 8
    results: list[list[str]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads)

    def work(slot: int) -> None:
        start.wait()
        out = results[slot]
        for _ in range(per_thread):
            out.append(new_minute_id())

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    every = [value for chunk in results for value in chunk]
    assert len(every) == per_thread * threads
    assert len(set(every)) == len(every)
    for chunk in results:  # each thread sees its own ids strictly increasing
        assert all(a < b for a, b in itertools.pairwise(chunk))


def test_id_timestamp_ms_other_shapes() -> None:
    assert id_timestamp_ms("ext:jira.PVM-12") is None
    assert id_timestamp_ms("") is None
    assert id_timestamp_ms("U" * 26) is None  # U is not Crockford
    assert id_timestamp_ms("0" * 26) == 0
    value = new_minute_id()
    assert id_timestamp_ms(value.lower()) == id_timestamp_ms(value)


def test_a_derived_id_is_the_same_for_the_same_inputs_and_sorts_by_its_time() -> None:
    from contracts.ids import derived_minute_id

    first = derived_minute_id(1_795_687_200_000, "fact_asserted", "f1", "m1")
    assert first == derived_minute_id(1_795_687_200_000, "fact_asserted", "f1", "m1")
    assert CROCKFORD.fullmatch(first) and ID_PATTERN.fullmatch(first)
    assert id_timestamp_ms(first) == 1_795_687_200_000
    # Parts are netstrings: moving a boundary is another name.
    assert derived_minute_id(1_795_687_200_000, "ab", "c") != derived_minute_id(1_795_687_200_000, "a", "bc")
    assert first != derived_minute_id(1_795_687_200_000, "fact_asserted", "f1", "m2")
    assert derived_minute_id(1_795_687_200_001, "x") > derived_minute_id(1_795_687_200_000, "x")
    assert id_timestamp_ms(derived_minute_id(-5, "x")) == 0


def test_request_ids_repeat_for_the_same_first_and_kind_and_differ_otherwise() -> None:
    from contracts.ids import RequestIds

    first = new_minute_id()
    one, two = RequestIds(first, "fact-change"), RequestIds(first, "fact-change")
    made = [one.next() for _ in range(4)]
    assert made == [two.next() for _ in range(4)] and made[0] == first and len(set(made)) == 4
    assert all(id_timestamp_ms(m) == id_timestamp_ms(first) for m in made)  # derived ids keep the first's time
    other = RequestIds(first, "memory-change")
    assert [other.next() for _ in range(4)][1:] != made[1:]  # another kind of request, other ids
    fresh = RequestIds(None, "fact-change")
    assert len({fresh.next() for _ in range(3)}) == 3  # no first: new ids


def test_a_keyed_id_is_the_same_in_every_run_and_differs_by_key() -> None:
    at = 1_790_000_000_000
    made = [ids.keyed_minute_id(at, f"bench-sessions/{n}") for n in range(10_000)]
    assert made == [ids.keyed_minute_id(at, f"bench-sessions/{n}") for n in range(10_000)]
    assert len(set(made)) == len(made)
    assert all(CROCKFORD.fullmatch(m) and ID_PATTERN.fullmatch(m) for m in made)
    assert {id_timestamp_ms(m) for m in made} == {at}
    assert ids.keyed_minute_id(at + 1, "k") > ids.keyed_minute_id(at, "k")
    with pytest.raises(ValueError, match="at_ms"):
        ids.keyed_minute_id(-1, "k")

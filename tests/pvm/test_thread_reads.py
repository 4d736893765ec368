"""`ThreadReads`: what the embedded engine keeps of thread reads, and when it lets them go."""

from __future__ import annotations

from contracts.memory import SearchFilters
from pvm.protocols import Candidate
from pvm.vectors.thread_reads import ThreadReads

EVERY = SearchFilters()


def minutes(thread: str, count: int, prefix: str = "m") -> list[Candidate]:
    return [Candidate(f"{prefix}{thread}-{i}", {"thread_id": thread}) for i in range(count)]


def test_a_read_that_a_write_overtook_is_not_kept() -> None:
    reads = ThreadReads()
    taken = reads.generation("alpha")
    reads.written("alpha", [("x", "th-b")])  # lands while the read of th-a runs: it may or may not show in it
    reads.keep_whole("alpha", taken, EVERY, {"th-a": minutes("a", 2)})
    reads.keep_window("alpha", taken, "th-a", "around m0", minutes("a", 1))
    assert reads.whole("alpha", "th-a", EVERY) is None
    assert reads.window("alpha", "th-a", "around m0") is None
    # A write to another project does not hold this one's reads back.
    taken = reads.generation("alpha")
    reads.written("beta", [("x", "th-a")])
    reads.keep_whole("alpha", taken, EVERY, {"th-a": minutes("a", 2)})
    assert [c.minute_id for c in reads.whole("alpha", "th-a", EVERY) or ()] == ["ma-0", "ma-1"]
    assert reads.whole("beta", "th-a", EVERY) is None


def test_what_is_kept_is_bounded_least_recently_used_first() -> None:
    reads = ThreadReads(kept=10, threads=3)
    for thread in ("a", "b"):
        reads.keep_whole("alpha", reads.generation("alpha"), EVERY, {thread: minutes(thread, 4)})
    assert reads.sizes() == (2, 8)
    assert reads.whole("alpha", "a", EVERY) is not None  # a is now the most recently used
    reads.keep_whole("alpha", reads.generation("alpha"), EVERY, {"c": minutes("c", 4)})
    assert reads.sizes() == (2, 8)
    assert reads.whole("alpha", "b", EVERY) is None
    assert reads.whole("alpha", "a", EVERY) is not None
    # Threads read empty hold no minutes, and are bounded by their count.
    for thread in ("d", "e", "f"):
        reads.keep_whole("alpha", reads.generation("alpha"), EVERY, {thread: []})
    assert reads.sizes()[0] == 3
    assert reads.whole("alpha", "f", EVERY) == ()
    # A dropped thread lets go of its minutes: a later write to one of them drops nothing else.
    reads.written("alpha", [("mc-0", "")])
    assert reads.whole("alpha", "f", EVERY) == ()


def test_a_write_drops_the_threads_it_touches_old_and_new() -> None:
    reads = ThreadReads()
    taken = reads.generation("alpha")
    reads.keep_whole("alpha", taken, EVERY, {"a": minutes("a", 2), "b": minutes("b", 1), "c": minutes("c", 1)})
    reads.written("alpha", [("ma-1", "b")])  # ma-1 moved from a to b
    assert reads.whole("alpha", "a", EVERY) is None
    assert reads.whole("alpha", "b", EVERY) is None
    assert reads.whole("alpha", "c", EVERY) is not None
    reads.forget("alpha")
    assert reads.sizes() == (0, 0)

"""The messages between pools: the log pool's fan-out record and what a summarize batch changed of a thread."""

from __future__ import annotations

import msgpack

from contracts import Minute, encode_minute
from contracts.summaries import ThreadRef
from workers.runtime.messages import EPISODE, LoggedRecord, decode_fanned_out, summary_key, thread_changes


def test_a_logged_record_travels_as_an_array_and_reads_back_from_three_or_four_elements() -> None:
    minute = Minute(project_id="p1", event_type="message", memory_note="hello")
    record = LoggedRecord(minute.id, 7, encode_minute(minute), 1_700_000_000_000)
    wire = msgpack.unpackb(msgpack.packb([record], use_bin_type=True), raw=False)[0]
    assert wire == [minute.id, 7, encode_minute(minute), 1_700_000_000_000]
    assert LoggedRecord.read(wire) == record
    assert LoggedRecord.read(wire[:3]) == record._replace(entry_ms=None)  # a rebuild's, or an older job's
    assert LoggedRecord.read([*wire[:3], "not a time"]).entry_ms is None
    [decoded], bad = decode_fanned_out([wire, wire, ["bad", 8, b"\x00"]], "test")
    assert (decoded.seq, decoded.minute.id, decoded.entry_ms, bad) == (7, minute.id, 1_700_000_000_000, ["bad"])


def test_thread_changes_is_none_when_nothing_changed_and_names_what_merged_away() -> None:
    assert thread_changes("p1", ThreadRef.parse("project"), ([], []), ([], []), {}) is None
    assert summary_key("p1", EPISODE, "e1") == summary_key("p1", EPISODE, "e1") != summary_key("p2", EPISODE, "e1")

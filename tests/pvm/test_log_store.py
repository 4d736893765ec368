from __future__ import annotations

import gc
import multiprocessing
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from contracts import Minute, encode_minute
from pvm.frames import iter_frames, pack_frame
from pvm.stores import log as log_store
from pvm.stores.log import LogError, LogReader, LogWriter


def entries(project: str, n: int, start: int = 0) -> list[tuple[str, str, bytes]]:
    out = []
    for i in range(start, start + n):
        m = Minute(project_id=project, event_type="message", id=f"m{i:06d}", memory_note=f"note {i}")
        out.append((m.id, f"{1000 + i}-0", encode_minute(m)))
    return out


def test_append_then_read_back(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path)
    result = writer.append("p", entries("p", 10))
    assert [a.seq for a in result] == list(range(1, 11))
    assert all(a.new for a in result)
    reader = LogReader(tmp_path)
    assert reader.count("p") == 10
    assert [r.id for r in reader.get_recent("p", 3)] == ["m000007", "m000008", "m000009"]
    assert [r.seq for r in reader.history("p")] == list(range(1, 11))
    assert [r.seq for r in reader.history("p", after_seq=8)] == [9, 10]
    got = reader.get_by_ids("p", ["m000004", "nope", "m000000"])
    assert set(got) == {"m000004", "m000000"}
    assert got["m000004"].minute.memory_note == "note 4"
    assert got["m000004"].stream_id == "1004-0"
    assert reader.projects() == ["p"]
    assert reader.has_project("p")


def test_has_project_looks_at_one_directory_inside_the_log(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    LogWriter(tmp_path / "logs").append("p", entries("p", 1))
    (tmp_path / "logs" / "empty").mkdir()
    (tmp_path / "outside").mkdir()
    LogWriter(tmp_path).append("outside", entries("outside", 1))
    reader = LogReader(tmp_path / "logs")
    assert reader.has_project("p")
    for other in ("empty", "nobody", "../outside", "p/..", "", ".", "x" * 200):
        assert not reader.has_project(other), other
    assert not LogReader(tmp_path / "missing").has_project("p")


def test_has_project_sees_a_log_that_went_or_moved_to_other_segments(tmp_path: Path) -> None:
    # It looks at the segment it found last time first: gone, the directory is listed again.
    LogWriter(tmp_path).append("p", entries("p", 1))
    reader = LogReader(tmp_path)
    assert reader.has_project("p")
    (segment,) = (tmp_path / "p").glob("*.seg")
    segment.rename(tmp_path / "p" / "00000000000000999999.seg")
    assert reader.has_project("p")
    shutil.rmtree(tmp_path / "p")
    assert not reader.has_project("p")
    LogWriter(tmp_path).append("p", entries("p", 1))
    assert reader.has_project("p")


def test_redelivered_ids_are_skipped(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path)
    writer.append("p", entries("p", 5))
    again = writer.append("p", entries("p", 8))  # 5 old + 3 new
    assert [a.new for a in again] == [False] * 5 + [True] * 3
    assert [a.seq for a in again] == [1, 2, 3, 4, 5, 6, 7, 8]
    # a new writer (a restarted process) knows the ids from the files
    fresh = LogWriter(tmp_path)
    assert not any(a.new for a in fresh.append("p", entries("p", 8)))
    assert LogReader(tmp_path).count("p") == 8


def test_a_torn_last_record_is_repaired_on_open(tmp_path: Path) -> None:
    LogWriter(tmp_path).append("p", entries("p", 4))
    (segment,) = sorted((tmp_path / "p").glob("*.seg"))
    size = segment.stat().st_size
    head = segment.read_bytes()[:40]
    with open(segment, "ab") as f:  # a crash mid-append: half a record
        f.write(head)
    reader = LogReader(tmp_path)
    assert reader.count("p") == 4  # readers see the intact prefix
    writer = LogWriter(tmp_path)
    assert writer.open("p") == 40
    assert segment.stat().st_size == size
    writer.append("p", entries("p", 2, start=4))
    assert [r.seq for r in reader.history("p")] == [1, 2, 3, 4, 5, 6]


def test_corruption_inside_a_sealed_segment_is_an_error(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path, segment_bytes=600)
    writer.append("p", entries("p", 3))
    writer.append("p", entries("p", 3, start=3))
    segments = sorted((tmp_path / "p").glob("*.seg"))
    assert len(segments) >= 2
    data = bytearray(segments[0].read_bytes())
    data[-5] ^= 0xFF
    segments[0].write_bytes(bytes(data))
    with pytest.raises(LogError, match="sealed segment"):
        LogWriter(tmp_path).open("p")


def test_a_segment_whose_seqs_skip_one_is_an_error_never_a_record_misread(tmp_path: Path) -> None:
    # Reading counts seqs from a known one instead of decoding what it steps over; a segment that breaks the
    # writer's contiguity (a third record cut out by hand) must fail loudly, not shift every seq after the gap.
    LogWriter(tmp_path).append("p", entries("p", 6))
    [segment] = (tmp_path / "p").glob("*.seg")
    with open(segment, "rb") as f:
        payloads = [payload for _, _, payload in iter_frames(f)]
    segment.write_bytes(b"".join(pack_frame(p) for i, p in enumerate(payloads) if i != 2))  # seqs 1, 2, 4, 5, 6
    reader = LogReader(tmp_path)
    with pytest.raises(LogError, match="not contiguous"):
        list(reader.history("p"))
    with pytest.raises(LogError, match="not contiguous"):
        list(reader.backward("p"))


def test_segments_roll_over_and_read_as_one_log(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path, segment_bytes=2_000)
    for start in range(0, 60, 6):
        writer.append("p", entries("p", 6, start=start))
    assert len(list((tmp_path / "p").glob("*.seg"))) > 3
    reader = LogReader(tmp_path)
    assert reader.count("p") == 60
    assert [r.seq for r in reader.history("p")] == list(range(1, 61))
    assert [r.seq for r in reader.get_recent("p", 15)] == list(range(46, 61))
    assert reader.get_by_ids("p", ["m000001", "m000059"])["m000059"].seq == 60
    # Ids spread over the segments, asked out of order: each segment is read once, the answer in the asked order.
    asked = ["m000059", "m000003", "nope", "m000030", "m000002", "m000031"]
    got = reader.get_by_ids("p", asked)
    assert list(got) == [i for i in asked if i != "nope"]
    assert [got[i].seq for i in got] == [60, 4, 31, 3, 32]


def test_get_by_ids_without_refresh_reads_only_the_minutes_the_reader_has_indexed(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path, segment_bytes=2_000)
    writer.append("p", entries("p", 12))
    reader = LogReader(tmp_path)
    assert reader.get_by_ids("p", ["m000003"], refresh=False) == {}  # nothing indexed yet: the segments not read
    assert reader.get_by_ids("p", ["m000003"])["m000003"].seq == 4  # indexes the project
    writer.append("p", entries("p", 6, start=12))
    got = reader.get_by_ids("p", ["m000015", "m000001", "m000011"], refresh=False)
    assert list(got) == ["m000001", "m000011"] and got["m000011"].seq == 12  # written since: not looked for
    assert reader.get_by_ids("p", ["m000015"])["m000015"].seq == 16
    assert reader.get_by_ids("p", ["m000015"], refresh=False)["m000015"].seq == 16
    assert reader.get_by_ids("q", ["m000001"], refresh=False) == {}


def test_the_index_by_id_is_nothing_the_garbage_collector_walks(tmp_path: Path) -> None:
    # A reader indexes every minute of a project it was asked for by id (a million at a million minutes): the
    # places are plain ints, so the collector has nothing to walk there; and they still find every segment's records.
    writer = LogWriter(tmp_path, segment_bytes=2_000)
    for start in range(0, 60, 6):
        writer.append("p", entries("p", 6, start=start))
    reader = LogReader(tmp_path)
    assert reader.get_by_ids("p", ["m000000"])["m000000"].seq == 1
    writer.append("p", entries("p", 6, start=60))  # a new segment, indexed when first asked for
    got = reader.get_by_ids("p", [f"m{i:06d}" for i in range(66)])
    assert [r.seq for r in got.values()] == list(range(1, 67))
    assert len({r.seq for r in got.values()}) == 66 and len(list((tmp_path / "p").glob("*.seg"))) > 4
    index = reader._index["p"]
    assert len(index) == 66 and not gc.is_tracked(index)


def test_backward_reads_newest_first_and_from_a_cursor_down(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path, segment_bytes=2_000)
    for start in range(0, 60, 6):
        writer.append("p", entries("p", 6, start=start))
    reader = LogReader(tmp_path)
    assert [r.seq for r in reader.backward("p")] == list(range(60, 0, -1))
    starts = sorted(int(seg.stem) for seg in (tmp_path / "p").glob("*.seg"))
    # Cursors at a segment's first seq, just past it, inside one, at the newest and beyond: each reads exactly
    # the records below it, newest first.
    for before in sorted({1, 2, 31, 60, 61, 1_000, *starts, *(s + 1 for s in starts)}):
        got = [(r.seq, r.id) for r in reader.backward("p", before_seq=before)]
        assert got == [(seq, f"m{seq - 1:06d}") for seq in range(min(before, 61) - 1, 0, -1)], before
    assert list(reader.backward("nobody")) == []


def test_backward_never_opens_the_segments_at_or_after_its_cursor(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path, segment_bytes=2_000)
    for start in range(0, 60, 6):
        writer.append("p", entries("p", 6, start=start))
    segments = sorted((tmp_path / "p").glob("*.seg"))
    cursor = int(segments[len(segments) // 2].stem)
    for seg in segments:
        if int(seg.stem) >= cursor:  # a segment that cannot be read: opening it raises
            seg.unlink()
            seg.mkdir()
    reader = LogReader(tmp_path)
    assert [r.seq for r in reader.backward("p", before_seq=cursor)] == list(range(cursor - 1, 0, -1))
    with pytest.raises(IsADirectoryError):
        list(reader.backward("p"))


def test_history_reads_on_from_a_seq_without_opening_the_segments_before_it(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path, segment_bytes=2_000)
    for start in range(0, 60, 6):
        writer.append("p", entries("p", 6, start=start))
    reader = LogReader(tmp_path)
    segments = sorted((tmp_path / "p").glob("*.seg"))
    starts = [int(seg.stem) for seg in segments]
    for after in sorted({0, 1, 30, 59, 60, 100, *starts, *(s - 1 for s in starts)}):
        got = [(r.seq, r.id) for r in reader.history("p", after_seq=after)]
        assert got == [(seq, f"m{seq - 1:06d}") for seq in range(after + 1, 61)], after
    middle = len(segments) // 2
    for seg in segments[:middle]:  # a segment that cannot be read: opening it raises
        seg.unlink()
        seg.mkdir()
    after = starts[middle] - 1
    assert [r.seq for r in reader.history("p", after_seq=after)] == list(range(after + 1, 61))
    with pytest.raises(IsADirectoryError):
        list(reader.history("p", after_seq=after - 1))


def frame_offsets(segment: Path) -> list[int]:
    """Where each record of a segment starts, in seq order."""
    with open(segment, "rb") as f:
        return [offset for offset, _, _ in iter_frames(f)]


def corrupt(segment: Path, offset: int) -> None:
    """Flip a byte inside the record that starts at `offset`: a reader that reads it stops there."""
    with open(segment, "r+b") as f:
        f.seek(offset + 20)
        byte = f.read(1)
        f.seek(offset + 20)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_backward_starts_from_a_place_an_earlier_read_remembered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_store, "MARK_EVERY", 8)
    LogWriter(tmp_path).append("p", entries("p", 60))
    [segment] = (tmp_path / "p").glob("*.seg")
    marked = LogReader(tmp_path)
    assert len(list(marked.backward("p"))) == 60  # goes past seqs 56, 48, ... 8 and remembers where they start
    corrupt(segment, frame_offsets(segment)[50 - 1])  # seq 50: between the end and the mark at 48
    # A reader with no marks walks back from the end and stops at the damage; the marked one starts at 48.
    assert list(LogReader(tmp_path).backward("p", before_seq=45)) == []
    assert [r.seq for r in marked.backward("p", before_seq=45)] == list(range(44, 0, -1))
    assert [r.seq for r in marked.backward("p", before_seq=48)] == list(range(47, 0, -1))


def test_history_starts_from_a_place_reading_by_id_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_store, "MARK_EVERY", 8)
    LogWriter(tmp_path).append("p", entries("p", 60))
    [segment] = (tmp_path / "p").glob("*.seg")
    marked = LogReader(tmp_path)
    assert marked.get_by_ids("p", ["m000030"])["m000030"].seq == 31  # indexing goes past every seq
    corrupt(segment, frame_offsets(segment)[5 - 1])  # seq 5: before the mark at 16
    assert list(LogReader(tmp_path).history("p", after_seq=20)) == []
    assert [r.seq for r in marked.history("p", after_seq=20)] == list(range(21, 61))
    assert [r.seq for r in marked.history("p", after_seq=15)] == list(range(16, 61))


def test_places_remembered_of_a_log_since_replaced_are_forgotten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_store, "MARK_EVERY", 8)
    LogWriter(tmp_path).append("p", entries("p", 60))
    reader = LogReader(tmp_path)
    assert len(list(reader.backward("p"))) == 60
    shutil.rmtree(tmp_path / "p")  # restored from a backup whose records are longer: every offset moved
    longer = []
    for i in range(60):
        m = Minute(project_id="p", event_type="message", id=f"m{i:06d}", memory_note=f"a longer note {i}")
        longer.append((m.id, f"{1000 + i}-0", encode_minute(m)))
    LogWriter(tmp_path).append("p", longer)
    assert [r.seq for r in reader.backward("p", before_seq=45)] == list(range(44, 0, -1))
    assert [r.seq for r in reader.history("p", after_seq=20)] == list(range(21, 61))
    assert next(reader.backward("p", before_seq=2)).minute.memory_note == "a longer note 0"


def _write_overlapping(log_dir: str, worker: int) -> None:
    writer = LogWriter(log_dir)
    # every process appends the same 300 ids in batches: only one copy may land
    for start in range(0, 300, 25):
        writer.append("shared", entries("shared", 25, start=start))


def test_concurrent_writer_processes_never_duplicate(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_overlapping, args=(str(tmp_path), i)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    records = list(LogReader(tmp_path).history("shared"))
    assert len(records) == 300
    assert len({r.id for r in records}) == 300
    assert [r.seq for r in records] == list(range(1, 301))


def test_reader_sees_a_consistent_prefix_while_a_writer_appends(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path)
    writer.append("p", entries("p", 1))
    reader = LogReader(tmp_path)
    done = threading.Event()
    seen: list[int] = []
    broken: list[list[int]] = []

    def read() -> None:
        while not done.is_set():
            seqs = [r.seq for r in reader.history("p")]
            if seqs != list(range(1, len(seqs) + 1)):
                broken.append(seqs)
            seen.append(len(seqs))

    t = threading.Thread(target=read)
    t.start()
    for start in range(1, 2000, 50):
        writer.append("p", entries("p", 50, start=start))
    done.set()
    t.join()
    assert reader.count("p") == 2001
    assert not broken
    assert len(seen) > 1 and max(seen) <= 2001


def test_log_files_are_only_appended(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path)
    writer.append("p", entries("p", 5))
    (segment,) = (tmp_path / "p").glob("*.seg")
    before = segment.read_bytes()
    writer.append("p", entries("p", 5, start=5))
    assert segment.read_bytes().startswith(before)
    assert os.access(segment, os.R_OK)


def test_append_many_appends_free_projects_before_waiting_for_a_busy_one(tmp_path: Path) -> None:
    import fcntl
    import time

    writer = LogWriter(tmp_path)
    writer.open("busy")
    # Another writer process holds "busy" (a flock on its own open file description).
    other = os.open(tmp_path / "busy" / ".lock", os.O_RDWR)
    fcntl.flock(other, fcntl.LOCK_EX)
    batches = {"busy": entries("busy", 3), "free-a": entries("free-a", 4), "free-b": entries("free-b", 5)}
    result: dict[str, list] = {}
    thread = threading.Thread(target=lambda: result.update(writer.append_many(batches)))
    thread.start()
    try:
        reader = LogReader(tmp_path)
        deadline = time.monotonic() + 30
        while not (reader.has_project("free-b") and reader.count("free-b") == 5):
            assert time.monotonic() < deadline, "the free projects waited behind the busy one"
            time.sleep(0.01)
        assert reader.count("free-a") == 4
        assert thread.is_alive() and reader.count("busy") == 0  # still waiting for the busy project
    finally:
        fcntl.flock(other, fcntl.LOCK_UN)
        os.close(other)
        thread.join(30)
    assert list(result) == ["busy", "free-a", "free-b"]  # answered in the order asked
    assert [len(result[p]) for p in result] == [3, 4, 5]
    assert all(a.new for appended in result.values() for a in appended)
    assert [r.seq for r in LogReader(tmp_path).history("busy")] == [1, 2, 3]
    writer.close()


# -- group commit: one fsync per batch, the journal as the commit point -------------------------------------------


def project_batches(projects: int, per_project: int, start: int = 0) -> dict[str, list[tuple[str, str, bytes]]]:
    from tests.log_crash_writer import batch

    return batch(projects, per_project, start)


def test_one_fsync_per_batch_whatever_the_number_of_projects(tmp_path: Path) -> None:
    from pvm.fsync import fsync_calls

    writer = LogWriter(tmp_path)
    writer.append_many(project_batches(64, 1))  # opens the 64 projects and the journal
    for start in (1, 4):
        before = fsync_calls()
        result = writer.append_many(project_batches(64, 3, start=start))
        assert fsync_calls() - before == 1
        assert all(a.new for appended in result.values() for a in appended)
    before = fsync_calls()
    writer.append_many(project_batches(64, 3, start=4))  # all redelivered: nothing to commit
    assert fsync_calls() - before == 0
    reader = LogReader(tmp_path)
    assert [reader.count(f"p{p:02d}") for p in range(64)] == [7] * 64


def test_a_checkpoint_syncs_the_segments_and_empties_the_journal(tmp_path: Path) -> None:
    writer = LogWriter(tmp_path, journal_bytes=4_000)
    for start in range(0, 40, 4):
        writer.append_many(project_batches(3, 4, start=start))
    (journal,) = (tmp_path / ".journal").glob("*.jnl")
    assert journal.stat().st_size < 4_000  # emptied at each checkpoint
    writer.close()
    assert not list((tmp_path / ".journal").iterdir())  # a clean stop leaves nothing to recover
    reader = LogReader(tmp_path)
    assert reader.projects() == ["p00", "p01", "p02"]  # the journal directory is not a project
    assert [r.seq for r in reader.history("p01")] == list(range(1, 41))


def durable_sizes(log_dir: Path) -> dict[Path, int]:
    return {seg: seg.stat().st_size for seg in log_dir.glob("*/*.seg")}


def machine_crash(log_dir: Path, durable: dict[Path, int], torn: bytes = b"") -> None:
    """What a power cut leaves: each segment back at what was fsynced, newer segments gone (plus a torn write)."""
    for seg in log_dir.glob("*/*.seg"):
        if seg in durable:
            with open(seg, "r+b") as f:
                f.truncate(durable[seg])
                f.seek(durable[seg])
                f.write(torn)
        else:
            seg.unlink()


def gone(writer: LogWriter) -> None:
    """The end a crash gives a writer of this process: its files closed, no checkpoint, its journal left behind."""
    assert writer._journal is not None
    os.close(writer._journal.fd)
    for project in writer._projects.values():
        project.close()


def killed_at(log_dir: Path, mode: str, projects: int, per_project: int, start: int) -> None:
    """Run tests/log_crash_writer.py in its own process until it pauses at `mode`, then kill -9 it."""
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    args = [str(log_dir), mode, str(projects), str(per_project), str(start)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.log_crash_writer", *args], cwd=root, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "paused"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL


def assert_every_minute_once(log_dir: Path, projects: int, per_project: int) -> None:
    reader = LogReader(log_dir)
    for p in range(projects):
        records = list(reader.history(f"p{p:02d}"))
        assert [r.seq for r in records] == list(range(1, per_project + 1)), f"p{p:02d}"
        assert sorted(r.id for r in records) == [f"p{p:02d}-{i:06d}" for i in range(per_project)]


def test_kill_9_after_the_commit_then_a_machine_crash_keeps_every_minute_once(tmp_path: Path) -> None:
    first = LogWriter(tmp_path)
    first.append_many(project_batches(8, 5))
    first.close()  # a checkpoint: these segment bytes are durable
    durable = durable_sizes(tmp_path)
    killed_at(tmp_path, "after-commit", projects=8, per_project=6, start=5)
    # The batch was committed (journal fsynced), its segment bytes were not: the power cut takes them,
    # and tears a frame in one segment.
    machine_crash(tmp_path, durable, torn=b"\xa7\x01\x10\x00")
    assert LogReader(tmp_path).count("p03") == 5
    writer = LogWriter(tmp_path)
    assert writer.recover() == 8 * 6
    assert_every_minute_once(tmp_path, 8, 11)
    assert not list((tmp_path / ".journal").glob("*.jnl"))  # the gone writer's journal is removed once applied
    # The killed job's retry finds every minute logged (exactly once).
    again = writer.append_many(project_batches(8, 6, start=5))
    assert not any(a.new for appended in again.values() for a in appended)
    assert_every_minute_once(tmp_path, 8, 11)


def test_kill_9_before_the_commit_then_a_retry_and_a_machine_crash_keep_every_minute_once(tmp_path: Path) -> None:
    first = LogWriter(tmp_path)
    first.append_many(project_batches(8, 5))
    first.close()
    durable = durable_sizes(tmp_path)
    writer = LogWriter(tmp_path)
    writer.append_many(project_batches(8, 1, start=0))  # this process has the projects open before the kill
    # Killed after writing its frames to the segments, before its commit: not durable, not acked.
    killed_at(tmp_path, "before-commit", projects=8, per_project=6, start=5)
    # The job's retry, in a process that already had the projects open, finds them all in the segments
    # (the page cache) and acks them as duplicates: it must make them durable first (its own commit).
    retried = writer.append_many(project_batches(8, 6, start=5))
    assert not any(a.new for appended in retried.values() for a in appended)
    gone(writer)
    machine_crash(tmp_path, durable)
    LogWriter(tmp_path).recover()
    assert_every_minute_once(tmp_path, 8, 11)


@pytest.mark.slow
def test_readers_never_see_a_torn_record_while_writers_are_killed(tmp_path: Path) -> None:
    import subprocess
    import sys

    reader = LogReader(tmp_path)
    problems: list[str] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            for project in reader.projects():
                seqs = [r.seq for r in reader.history(project)]
                if seqs != list(range(1, len(seqs) + 1)):
                    problems.append(f"{project}: {seqs[-5:]}")
                recent = reader.get_recent(project, 3)
                if recent and recent[-1].seq != reader.count(project) and recent[-1].seq > reader.count(project):
                    problems.append(f"{project}: count behind its newest record")
                problems.extend(f"{project}: {r.seq} does not decode" for r in recent if r.minute.id != r.id)

    thread = threading.Thread(target=read)
    thread.start()
    root = Path(__file__).resolve().parents[2]
    try:
        for round_ in range(4):
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.log_crash_writer",
                    str(tmp_path),
                    "loop",
                    "4",
                    "40",
                    str(round_ * 100_000),
                ],
                cwd=root,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert proc.stdout is not None and proc.stdout.readline().strip() == "paused"
            time.sleep(0.2 + 0.1 * round_)  # a different instant in the append each round
            proc.kill()
            proc.wait(30)
    finally:
        done.set()
        thread.join(60)
    assert not problems, problems[:5]
    writer = LogWriter(tmp_path)  # repairs whatever torn tails the kills left
    for project in ("p00", "p01", "p02", "p03"):
        writer.open(project)
        records = list(reader.history(project))
        assert [r.seq for r in records] == list(range(1, len(records) + 1))
        assert len({r.id for r in records}) == len(records) > 0

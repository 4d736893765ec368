"""The durable chronological log: append-only, checksummed segment files per project.

Layout: ``<log_dir>/<project_id>/<first_seq:020d>.seg`` holding frames (see
`pvm.frames`) whose payload is a msgpack map::

    {"seq": n, "id": minute_id, "sid": stream_id, "at": durable_unix_time, "m": minute_bytes}

``seq`` numbers a project's records 1, 2, 3… in append order, so a project's
record count is the last record's ``seq``. ``m`` holds the minute exactly as the
producer encoded it. Writers of one project take an exclusive ``flock`` on
``<project>/.lock``; before appending they read whatever other writers added, so
the minute id stays an idempotency key across processes. Readers take no lock:
they read the intact prefix of each segment, which is always a whole number of
records.

A batch is committed by one fsync whatever the number of its projects: its
frames go to the segments, then the whole batch to the writer's journal
(``<log_dir>/.journal/<random>.jnl``), fsynced. Segments are fsynced behind it
at checkpoints and rebuilt from the journals after a machine crash
(docs/log-format.md, "Group commit").
"""

from __future__ import annotations

import fcntl
import itertools
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import msgpack

from contracts import Minute, decode_durable_fields, decode_durable_minute
from contracts.errors import PvmError
from contracts.minute import is_valid_project_id
from pvm import defaults
from pvm.frames import frame_at, intact_end, iter_frames, iter_frames_backward, pack_frame
from pvm.fsync import fsync_dir, fsync_file

SEGMENT_SUFFIX = ".seg"
JOURNAL_DIR = ".journal"  # not a project id: those start with a letter or digit
JOURNAL_SUFFIX = ".jnl"
JOURNAL_STAGING_SUFFIX = ".new"  # a journal being created, not yet under its flock
# A reader remembers where every MARK_EVERY-th record of a segment starts as it goes past: a page read from a
# cursor deep in a segment then steps over at most this many records to reach it (a thousand marks a million).
MARK_EVERY = 1024


class LogError(PvmError, RuntimeError):
    """The log directory is unusable (permissions, a corrupt segment in the middle)."""


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One durable minute as the log holds it."""

    seq: int
    id: str
    stream_id: str
    durable_at: float
    minute_bytes: bytes

    @property
    def minute(self) -> Minute:
        """The decoded minute (as logged: not validated again, so a minute logged under older rules still reads)."""
        return decode_durable_minute(self.minute_bytes)

    @property
    def fields(self) -> dict[str, Any]:
        """The minute's fields as `Minute.to_dict` gives them, at half the cost of `minute` (no `Minute` built)."""
        return decode_durable_fields(self.minute_bytes)


@dataclass(frozen=True, slots=True)
class Appended:
    """Where one minute of an appended batch stands in the log."""

    id: str
    seq: int
    new: bool  # False when the log already held this id (a redelivery or a retry)


def _decode_record(payload: bytes) -> LogRecord:
    body = msgpack.unpackb(payload, raw=False)
    return LogRecord(body["seq"], body["id"], body["sid"], body["at"], body["m"])


def _segments(project_dir: Path) -> list[Path]:
    try:
        names = sorted(p for p in os.listdir(project_dir) if p.endswith(SEGMENT_SUFFIX))
    except FileNotFoundError:
        return []
    return [project_dir / n for n in names]


class _ProjectWriter:
    """Append state of one project inside one process.

    ``durable_seq``: every record at or below it is known durable (made so by a journal commit, a checkpoint or
    the fsync on first open). ``unjournaled``: the payloads above it this process read from the segments (another
    writer's, possibly one killed before its commit): the next commit journals them before anything relies on them.
    """

    def __init__(self, project_dir: Path, segment_bytes: int) -> None:
        self.dir = project_dir
        self.segment_bytes = segment_bytes
        self.ids: dict[str, int] = {}
        self.last_seq = 0
        self.durable_seq = 0
        self.unjournaled: list[bytes] = []
        self.opened = False
        self.segment: Path | None = None
        self.segment_end = 0  # how far this process has read `segment`
        self.repaired_bytes = 0
        self.created = not project_dir.is_dir()  # its directory entry is durable at the next checkpoint
        project_dir.mkdir(parents=True, exist_ok=True)
        self.lock_fd = os.open(project_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        self.thread_lock = threading.Lock()

    def lock(self, wait: bool = True) -> bool:
        """Take the project (threads of this process, then other processes); False if ``wait=False`` and busy."""
        if not self.thread_lock.acquire(blocking=wait):
            return False
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.thread_lock.release()
            return False
        except BaseException:
            self.thread_lock.release()
            raise
        return True

    def unlock(self) -> None:
        fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
        self.thread_lock.release()

    def catch_up(self) -> None:
        """Read what other writers appended since we last looked; repair a torn tail. Under the lock."""
        segments = _segments(self.dir)
        if segments:
            if self.segment is not None and self.segment in segments:
                pending = segments[segments.index(self.segment) :]
            else:
                pending = segments
                self.segment_end = 0
            for i, seg in enumerate(pending):
                start = self.segment_end if seg == self.segment else 0
                with open(seg, "rb") as f:
                    end = start
                    for _, next_offset, payload in iter_frames(f, start):
                        record = _decode_record(payload)
                        self.ids[record.id] = record.seq
                        self.last_seq = record.seq
                        if record.seq > self.durable_seq and self.opened:
                            self.unjournaled.append(payload)
                        end = next_offset
                    size = os.fstat(f.fileno()).st_size
                if end < size:
                    if i != len(pending) - 1:
                        raise LogError(
                            f"{seg}: corrupt record at byte {end} in a sealed segment; restore it from backup"
                        )
                    # We hold the project lock, so no writer is mid-append: the tail is torn.
                    with open(seg, "r+b") as f:
                        f.truncate(end)
                        fsync_file(f.fileno())
                    self.repaired_bytes += size - end
                self.segment, self.segment_end = seg, end
        if not self.opened:
            # A writer killed after its segment write and before its commit may have left records only in the page
            # cache; make them durable before this process acks any of them as already logged.
            if self.segment is not None and self.segment_end > 0:
                with open(self.segment, "rb") as f:
                    fsync_file(f.fileno())
            self.durable_seq = self.last_seq
            self.opened = True

    def stage(self, entries: Sequence[tuple[str, str, bytes]], now: float) -> tuple[list[Appended], list[bytes]]:
        """Number the batch's new minutes (in memory only); returns where each stands and the new payloads."""
        out: list[Appended] = []
        payloads: list[bytes] = []
        for minute_id, stream_id, minute_bytes in entries:
            seq = self.ids.get(minute_id)
            if seq is not None:
                out.append(Appended(minute_id, seq, False))
                continue
            self.last_seq += 1
            seq = self.last_seq
            self.ids[minute_id] = seq
            payloads.append(
                msgpack.packb(
                    {"seq": seq, "id": minute_id, "sid": stream_id, "at": now, "m": minute_bytes}, use_bin_type=True
                )
            )
            out.append(Appended(minute_id, seq, True))
        return out, payloads

    def write(self, payloads: Sequence[bytes]) -> Path:
        """Write staged payloads to the current segment (no fsync: the journal commit makes them durable).

        Returns the segment written. A new segment seals the last one: that one is fsynced first, so only the
        newest segment of a project can ever lack bytes after a machine crash.
        """
        blob = b"".join(pack_frame(p) for p in payloads)
        first_seq = _decode_record(payloads[0]).seq
        if self.segment is None or (self.segment_end + len(blob) > self.segment_bytes and self.segment_end > 0):
            if self.segment is not None:
                with open(self.segment, "rb") as f:
                    fsync_file(f.fileno())
            self.segment = self.dir / f"{first_seq:020d}{SEGMENT_SUFFIX}"
            self.segment_end = 0
            self.created = True
        fd = os.open(self.segment, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            written = 0
            while written < len(blob):
                written += os.write(fd, blob[written:])
        finally:
            os.close(fd)
        self.segment_end += len(blob)
        return self.segment

    def forget(self, staged: Sequence[Appended]) -> None:
        """Undo `stage` after a failed write or commit: the next catch-up reads the segment again."""
        for a in staged:
            if a.new:
                self.ids.pop(a.id, None)
        self.last_seq = min([self.last_seq, *(a.seq - 1 for a in staged if a.new)])
        self.unjournaled.clear()
        self.segment = None

    def restore(self, payloads: Sequence[bytes], source: Path) -> int:
        """Append the journaled records the segments lack (after a machine crash); returns how many. Under the lock."""
        missing = sorted(
            (r.seq, p) for p in payloads if (r := _decode_record(p)).seq > self.last_seq and r.id not in self.ids
        )
        if not missing:
            return 0
        unique = list(dict(missing).items())
        expected = range(self.last_seq + 1, self.last_seq + 1 + len(unique))
        if [seq for seq, _ in unique] != list(expected):
            raise LogError(
                f"{self.dir}: the journals hold seqs {unique[0][0]}..{unique[-1][0]} but the log ends at "
                f"{self.last_seq} with a gap between (journal {source}); restore the log from backup"
            )
        segment = self.write([p for _, p in unique])
        with open(segment, "rb") as f:
            fsync_file(f.fileno())
        fsync_dir(self.dir)
        for _, payload in unique:
            record = _decode_record(payload)
            self.ids[record.id] = record.seq
        self.last_seq = self.durable_seq = unique[-1][0]
        return len(unique)

    def close(self) -> None:
        os.close(self.lock_fd)


class _Journal:
    """One log writer's commit record: a frame per batch, every project of the batch in it, fsynced once.

    Named ``<log_dir>/.journal/<random>.jnl`` and held under an exclusive ``flock`` for the writer's life, so a
    journal nobody holds belongs to a writer that is gone.
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        name = uuid.uuid4().hex
        staging = directory / f"{name}{JOURNAL_STAGING_SUFFIX}"
        fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)  # before it has a name a recovering writer looks at
        self.path = directory / f"{name}{JOURNAL_SUFFIX}"
        os.rename(staging, self.path)
        fsync_dir(directory)
        self.fd = fd
        self.size = 0

    def commit(self, batch: Mapping[str, Sequence[bytes]]) -> None:
        """Append ``{project_id: [record payload, ...]}`` as one frame and fsync: the batch is durable."""
        frame = pack_frame(msgpack.packb(dict(batch), use_bin_type=True))
        try:
            written = 0
            while written < len(frame):
                written += os.write(self.fd, frame[written:])
            fsync_file(self.fd)
        except BaseException:
            os.ftruncate(self.fd, self.size)  # best effort: a reader stops at a torn frame anyway
            raise
        self.size += len(frame)

    def empty(self) -> None:
        os.ftruncate(self.fd, 0)
        fsync_file(self.fd)
        self.size = 0

    def close(self) -> None:
        self.path.unlink(missing_ok=True)
        fsync_dir(self.path.parent)
        os.close(self.fd)


def _read_journal(path: Path) -> dict[str, list[bytes]] | None:
    """The records of a journal no writer holds, by project; None while its writer lives (or it is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        fcntl.flock(fd, fcntl.LOCK_UN)
        records: dict[str, list[bytes]] = {}
        with os.fdopen(os.dup(fd), "rb") as f:
            for _, _, payload in iter_frames(f):
                for project_id, payloads in msgpack.unpackb(payload, raw=False).items():
                    records.setdefault(project_id, []).extend(payloads)
        return records
    finally:
        os.close(fd)


class LogWriter:
    """Appends batches of minutes to the log of each project, idempotently by minute id, one fsync per batch.

    The batch's frames go to each project's segment (page cache), then the whole batch to this writer's journal,
    fsynced once: that fsync is the commit. Segments are fsynced behind it, at a checkpoint, and rebuilt from the
    journals after a machine crash (see docs/log-format.md).
    """

    def __init__(
        self,
        log_dir: Path | str,
        segment_bytes: int = defaults.LOG_SEGMENT_BYTES,
        journal_bytes: int = defaults.LOG_JOURNAL_BYTES,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.segment_bytes = segment_bytes
        self.journal_bytes = journal_bytes
        self._projects: dict[str, _ProjectWriter] = {}
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self._journal: _Journal | None = None
        self._recovered = False
        self._recover_lock = threading.Lock()
        self._written: set[Path] = set()  # segments written since the last checkpoint
        self.restored = 0  # records this writer restored from the journals of writers that are gone

    def _project(self, project_id: str) -> _ProjectWriter:
        with self._lock:
            writer = self._projects.get(project_id)
            if writer is None:
                writer = _ProjectWriter(self.log_dir / project_id, self.segment_bytes)
                self._projects[project_id] = writer
            return writer

    def recover(self) -> int:
        """Bring back what the journals of writers that are gone hold and the segments lack; returns how many.

        Runs once, before this writer's first append: after a machine crash the newest segments may lack
        records whose journal commit was durable. Journals of gone writers are removed afterwards. (After a
        kill -9 alone there is nothing to bring back: the segments were written before the commit.)
        """
        with self._recover_lock:  # another thread of this process appends only once it is done
            if self._recovered:
                return 0
            restored = self._recover()
            self._recovered = True
            self.restored += restored
            return restored

    def _recover(self) -> int:
        directory = self.log_dir / JOURNAL_DIR
        try:
            listed = os.listdir(directory)
        except FileNotFoundError:
            return 0
        names = sorted(n for n in listed if n.endswith(JOURNAL_SUFFIX))
        # A writer killed while creating its journal left it unnamed, and empty: nothing to bring back.
        staged = [directory / n for n in listed if n.endswith(JOURNAL_STAGING_SUFFIX)]
        gone = [path for path in staged if _read_journal(path) is not None]
        by_project: dict[str, list[tuple[bytes, Path]]] = {}
        for name in names:
            path = directory / name
            if self._journal is not None and path == self._journal.path:
                continue
            records = _read_journal(path)
            if records is None:
                continue
            gone.append(path)
            for project_id, payloads in records.items():
                by_project.setdefault(project_id, []).extend((p, path) for p in payloads)
        restored = 0
        for project_id in sorted(by_project):
            if not is_valid_project_id(project_id):
                raise LogError(f"journal {by_project[project_id][0][1]} names project {project_id!r}; remove it")
            writer = self._project(project_id)
            writer.lock()
            try:
                writer.catch_up()
                restored += writer.restore([p for p, _ in by_project[project_id]], by_project[project_id][0][1])
            finally:
                writer.unlock()
        for path in gone:
            path.unlink(missing_ok=True)
        if gone:
            fsync_dir(directory)
        return restored

    def open(self, project_id: str) -> int:
        """Open a project's log now (scan, repair a torn tail); return bytes cut from a torn tail."""
        self.recover()
        writer = self._project(project_id)
        writer.lock()
        try:
            writer.catch_up()
        finally:
            writer.unlock()
        return writer.repaired_bytes

    def append(self, project_id: str, entries: Sequence[tuple[str, str, bytes]]) -> list[Appended]:
        """Durably append ``(minute_id, stream_id, minute_bytes)`` entries.

        Ids the log already holds are skipped and reported with ``new=False``.
        """
        return self.append_many({project_id: entries})[project_id]

    def append_many(self, batches: Mapping[str, Sequence[tuple[str, str, bytes]]]) -> dict[str, list[Appended]]:
        """`append` for several projects in one commit (one fsync), whatever their number.

        Projects another writer holds are left out of that commit and waited for afterwards (a second commit),
        so two log workers given the same projects do not queue on each other's locks in turn.
        """
        self.recover()
        done: dict[str, list[Appended]] = {}
        free = [p for p in batches if self._project(p).lock(wait=False)]
        if free:
            done.update(self._commit({p: batches[p] for p in free}))
        busy = sorted(p for p in batches if p not in done)
        if busy:
            locked: list[str] = []
            try:
                for project_id in busy:  # in one order everywhere: no two writers wait on each other
                    self._project(project_id).lock()
                    locked.append(project_id)
            except BaseException:
                for project_id in locked:
                    self._project(project_id).unlock()
                raise
            done.update(self._commit({p: batches[p] for p in busy}))
        return {project_id: done[project_id] for project_id in batches}

    def _commit(self, batches: Mapping[str, Sequence[tuple[str, str, bytes]]]) -> dict[str, list[Appended]]:
        """Append and commit batches of projects this writer holds locked; releases the locks."""
        writers = {p: self._project(p) for p in batches}
        staged: dict[str, list[Appended]] = {}
        try:
            now = time.time()
            journaled: dict[str, list[bytes]] = {}
            written: set[Path] = set()
            for project_id, entries in batches.items():
                writer = writers[project_id]
                writer.catch_up()
                appended, payloads = writer.stage(entries, now)
                staged[project_id] = appended
                if payloads:
                    written.add(writer.write(payloads))
                if writer.unjournaled or payloads:
                    journaled[project_id] = writer.unjournaled + payloads
            if journaled:
                with self._commit_lock:
                    if self._journal is None:
                        self._journal = _Journal(self.log_dir / JOURNAL_DIR)
                    self._journal.commit(journaled)
                    self._written |= written
                    if self._journal.size >= self.journal_bytes:
                        self._checkpoint()
            for writer in writers.values():
                writer.durable_seq = writer.last_seq
                writer.unjournaled.clear()
            return staged
        except BaseException:
            for project_id, appended in staged.items():
                writers[project_id].forget(appended)
            raise
        finally:
            for writer in writers.values():
                writer.unlock()

    def _checkpoint(self) -> None:
        """Make the segments written since the last checkpoint durable on their own; then empty the journal."""
        assert self._journal is not None
        for segment in sorted(self._written):
            with open(segment, "rb") as f:
                fsync_file(f.fileno())
        for writer in list(self._projects.values()):
            if writer.created:
                fsync_dir(writer.dir)
                writer.created = False
        fsync_dir(self.log_dir)
        self._written.clear()
        self._journal.empty()

    def close(self) -> None:
        """Checkpoint and remove the journal (a clean stop leaves nothing to recover); close the projects."""
        with self._commit_lock:
            if self._journal is not None:
                self._checkpoint()
                self._journal.close()
                self._journal = None
        with self._lock:
            for writer in self._projects.values():
                writer.close()
            self._projects.clear()


def _counted(seg: Path, offset: int, payload: bytes, seq: int) -> LogRecord:
    """The record at `offset`, which counting from a known seq says is `seq`: a record that says otherwise means
    the segment's seqs are not contiguous, and every record skipped uncounted may be wrong, so it is an error."""
    record = _decode_record(payload)
    if record.seq != seq:
        raise LogError(
            f"{seg}: the record at byte {offset} holds seq {record.seq} where seq {seq} belongs; the segment's "
            "seqs are not contiguous, as the log writes them: restore the log from backup"
        )
    return record


_OFFSET_BITS = 48  # a record's place in `LogReader`'s index: its segment's slot above, its offset below
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1


class LogReader:
    """Reads the log while writers append. Safe to share between threads of one process."""

    def __init__(self, log_dir: Path | str) -> None:
        self.log_dir = Path(log_dir)
        # project -> (id -> its place: the segment's slot in `_slots` and the record's offset, in one int), and
        # how far each segment was indexed. One int a minute, not a (segment, offset) tuple: a tuple holding a
        # Path is an object the garbage collector walks in every full collection, a million of them at a million
        # minutes (~40 ms a collection at 100k); a dict of str -> int is not tracked at all.
        self._index: dict[str, dict[str, int]] = {}
        self._slots: dict[str, list[Path]] = {}  # project -> the segments its index names, by slot
        self._indexed_to: dict[str, dict[Path, int]] = {}
        # segment -> {seq: offset where that record starts}, every MARK_EVERY-th seq this reader went past
        self._marks: dict[Path, dict[int, int]] = {}
        self._segment_seen: dict[str, str] = {}  # project -> a segment of its log `has_project` found
        self._lock = threading.Lock()

    def projects(self) -> list[str]:
        """Every project with a log."""
        try:
            return sorted(p.name for p in self.log_dir.iterdir() if p.is_dir() and _segments(p))
        except FileNotFoundError:
            return []

    def has_project(self, project_id: str) -> bool:
        """Whether the project has a log (one directory looked at, where `projects` lists them all).

        Every context asks it: the segment found last time is looked at first (one stat: ~2.5 µs, where listing
        the directory took ~10 µs at 100k minutes), and the directory is listed again only when that segment is
        gone."""
        if not is_valid_project_id(project_id):
            return False  # never a path outside the log directory
        seen = self._segment_seen.get(project_id)
        if seen is not None and os.path.isfile(seen):
            return True
        directory = os.path.join(self.log_dir, project_id)
        try:
            with os.scandir(directory) as entries:
                found = next((e.path for e in entries if e.name.endswith(SEGMENT_SUFFIX)), None)
        except (FileNotFoundError, NotADirectoryError):
            found = None
        if found is None:
            self._segment_seen.pop(project_id, None)
            return False
        self._segment_seen[project_id] = found
        return True

    def backward(self, project_id: str, before_seq: int | None = None) -> Iterator[LogRecord]:
        """The project's records newest first; with `before_seq`, only those below it (a pager's cursor).

        Each segment is named by its first seq, so the segments that start at or after `before_seq` are
        skipped without being opened. In the one that holds the cursor, reading starts at the nearest place
        remembered at or above it (`MARK_EVERY`; a page's reading leaves them behind for the next page) and
        the newer records from there are stepped over undecoded: a page deep into a long log costs about
        the records it reads, not those it skips. Only a segment's intact prefix is read (a writer may be
        mid-append).
        """
        for seg in reversed(_segments(self.log_dir / project_id)):
            if before_seq is not None and int(seg.stem) >= before_seq:
                continue
            with open(seg, "rb") as f:
                yield from self._segment_backward(seg, f, before_seq)

    def _segment_backward(self, seg: Path, f: BinaryIO, before_seq: int | None) -> Iterator[LogRecord]:
        marks = self._marks.setdefault(seg, {})
        first: tuple[int, bytes] | None = None
        if before_seq is not None:
            above = [(mark, at) for mark, at in list(marks.items()) if mark >= before_seq]
            if above:
                mark_seq, offset = min(above)
                frames = iter_frames_backward(f, offset)
                first = next(frames, None)
                if first is None or _decode_record(first[1]).seq != mark_seq - 1:
                    marks.clear()  # the file is not what it was when marked (a log restored from backup)
                    first = None
        if first is None:
            size = os.fstat(f.fileno()).st_size
            frames = iter_frames_backward(f, size)
            first = next(frames, None)
            if first is None and size > 0:
                # The tail is mid-append or torn: find where the intact part ends (a forward scan).
                frames = iter_frames_backward(f, intact_end(f))
                first = next(frames, None)
            if first is None:
                return
        newest = _decode_record(first[1])
        seq = newest.seq
        if seq % MARK_EVERY == 0:
            marks[seq] = first[0]
        if before_seq is None or seq < before_seq:
            yield newest
        # A segment's seqs are contiguous: the frames below the newest count down from its seq.
        for offset, payload in frames:
            seq -= 1
            if seq % MARK_EVERY == 0:
                marks[seq] = offset
            if before_seq is None or seq < before_seq:
                yield _counted(seg, offset, payload, seq)

    def count(self, project_id: str) -> int:
        """How many minutes the project's log holds."""
        for record in self.backward(project_id):
            return record.seq
        return 0

    def get_recent(self, project_id: str, n: int) -> list[LogRecord]:
        """The newest `n` records, oldest first."""
        if n <= 0:
            return []
        out = list(itertools.islice(self.backward(project_id), n))
        out.reverse()
        return out

    def history(self, project_id: str, after_seq: int = 0) -> Iterator[LogRecord]:
        """Every record in append order, starting after `after_seq`.

        The segments that end at or below `after_seq` (the next one starts at or below ``after_seq + 1``) are
        not opened, and in the one that holds it reading starts at the nearest place remembered at or below
        it (`MARK_EVERY`: reading by id and reading backward leave them behind), the records up to it stepped
        over undecoded: reading on from a minute deep in a long log costs about the records read after it.
        """
        segments = _segments(self.log_dir / project_id)
        starts = [int(seg.stem) for seg in segments]
        for i, seg in enumerate(segments):
            if i + 1 < len(segments) and starts[i + 1] <= after_seq + 1:
                continue
            with open(seg, "rb") as f:
                yield from self._segment_forward(seg, f, starts[i], after_seq)

    def _segment_forward(self, seg: Path, f: BinaryIO, first_seq: int, after_seq: int) -> Iterator[LogRecord]:
        marks = self._marks.setdefault(seg, {})
        seq, offset = first_seq, 0
        below = [(mark, at) for mark, at in list(marks.items()) if first_seq < mark <= after_seq + 1]
        if below:
            mark_seq, mark_offset = max(below)
            head = next(iter_frames(f, mark_offset), None)
            if head is not None and _decode_record(head[2]).seq == mark_seq:
                seq, offset = mark_seq, mark_offset
            else:
                marks.clear()  # the file is not what it was when marked (a log restored from backup)
        # A segment's seqs are contiguous: the frames after the start count up from its seq.
        for start, _, payload in iter_frames(f, offset):
            if seq % MARK_EVERY == 0:
                marks[seq] = start
            if seq > after_seq:
                yield _counted(seg, start, payload, seq)
            seq += 1

    def _refresh_index(self, project_id: str) -> dict[str, int]:
        index = self._index.setdefault(project_id, {})
        done = self._indexed_to.setdefault(project_id, {})
        slots = self._slots.setdefault(project_id, [])
        for seg in _segments(self.log_dir / project_id):
            start = done.get(seg, 0)
            with open(seg, "rb") as f:
                if start >= os.fstat(f.fileno()).st_size:
                    continue
                end = start
                marks = self._marks.setdefault(seg, {})
                if seg not in slots:
                    slots.append(seg)
                slot = slots.index(seg) << _OFFSET_BITS
                for offset, next_offset, payload in iter_frames(f, start):
                    record = _decode_record(payload)
                    index[record.id] = slot | offset
                    if record.seq % MARK_EVERY == 0:
                        marks[record.seq] = offset
                    end = next_offset
            done[seg] = end
        return index

    def get_by_ids(self, project_id: str, ids: Iterable[str], *, refresh: bool = True) -> dict[str, LogRecord]:
        """The records with these minute ids (missing ids are absent from the result).

        With ``refresh=False`` only the minutes this reader has indexed already: the segments are not looked at
        for records written since (a dict lookup an id, and the reads)."""
        wanted = list(ids)
        with self._lock:
            index = self._index.get(project_id, {})
            if refresh and any(i not in index for i in wanted):
                index = self._refresh_index(project_id)
            slots = self._slots.get(project_id, [])
            places = [(i, index[i]) for i in wanted if i in index]
        by_segment: dict[Path, list[tuple[int, str]]] = {}
        for minute_id, place in places:
            by_segment.setdefault(slots[place >> _OFFSET_BITS], []).append((place & _OFFSET_MASK, minute_id))
        out: dict[str, LogRecord] = {}
        for seg, at in by_segment.items():  # each segment opened once, read in file order
            fd = os.open(seg, os.O_RDONLY)
            try:
                for offset, minute_id in sorted(at):
                    payload = frame_at(fd, offset)
                    if payload is not None:
                        out[minute_id] = _decode_record(payload)
            finally:
                os.close(fd)
        return {i: out[i] for i in wanted if i in out}

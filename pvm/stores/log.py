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
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from contracts import Minute, decode_durable_fields, decode_durable_minute
from contracts.errors import PvmError
from contracts.minute import is_valid_project_id
from pvm import defaults
from pvm.frames import intact_end, iter_frames, iter_frames_backward, pack_frame
from pvm.fsync import fsync_dir

SEGMENT_SUFFIX = ".seg"


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
    """Append state of one project inside one process."""

    def __init__(self, project_dir: Path, segment_bytes: int) -> None:
        self.dir = project_dir
        self.segment_bytes = segment_bytes
        self.ids: dict[str, int] = {}
        self.last_seq = 0
        self.segment: Path | None = None
        self.segment_end = 0  # how far this process has read `segment`
        self.repaired_bytes = 0
        project_dir.mkdir(parents=True, exist_ok=True)
        self.lock_fd = os.open(project_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        self.thread_lock = threading.Lock()

    def _catch_up(self) -> None:
        """Read what other writers appended since we last looked; repair a torn tail."""
        segments = _segments(self.dir)
        if not segments:
            return
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
                    end = next_offset
                size = os.fstat(f.fileno()).st_size
            if end < size:
                if i != len(pending) - 1:
                    raise LogError(f"{seg}: corrupt record at byte {end} in a sealed segment; restore it from backup")
                # We hold the project lock, so no writer is mid-append: the tail is torn.
                with open(seg, "r+b") as f:
                    f.truncate(end)
                    os.fsync(f.fileno())
                self.repaired_bytes += size - end
            self.segment, self.segment_end = seg, end

    def append(self, entries: Sequence[tuple[str, str, bytes]], wait: bool = True) -> list[Appended] | None:
        """Append under the project lock; with ``wait=False``, None (nothing done) if another writer holds it."""
        if not self.thread_lock.acquire(blocking=wait):
            return None
        try:
            try:
                fcntl.flock(self.lock_fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None
            try:
                self._catch_up()
                return self._append_locked(entries)
            finally:
                fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
        finally:
            self.thread_lock.release()

    def _append_locked(self, entries: Sequence[tuple[str, str, bytes]]) -> list[Appended]:
        out: list[Appended] = []
        frames: list[bytes] = []
        now = time.time()
        first_new_seq = self.last_seq + 1
        for minute_id, stream_id, minute_bytes in entries:
            seq = self.ids.get(minute_id)
            if seq is not None:
                out.append(Appended(minute_id, seq, False))
                continue
            self.last_seq += 1
            seq = self.last_seq
            self.ids[minute_id] = seq
            payload = msgpack.packb(
                {"seq": seq, "id": minute_id, "sid": stream_id, "at": now, "m": minute_bytes}, use_bin_type=True
            )
            frames.append(pack_frame(payload))
            out.append(Appended(minute_id, seq, True))
        if not frames:
            return out
        blob = b"".join(frames)
        new_segment = self.segment is None or (
            self.segment_end + len(blob) > self.segment_bytes and self.segment_end > 0
        )
        if new_segment:
            self.segment = self.dir / f"{first_new_seq:020d}{SEGMENT_SUFFIX}"
            self.segment_end = 0
        assert self.segment is not None
        fd = os.open(self.segment, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            written = 0
            while written < len(blob):
                written += os.write(fd, blob[written:])
            os.fsync(fd)
        except BaseException:
            # Forget the ids we did not make durable, so a retry writes them.
            for a in out:
                if a.new:
                    self.ids.pop(a.id, None)
            self.last_seq = first_new_seq - 1
            self.segment = None
            raise
        finally:
            os.close(fd)
        if new_segment:
            fsync_dir(self.dir)
        self.segment_end += len(blob)
        return out

    def close(self) -> None:
        os.close(self.lock_fd)


class LogWriter:
    """Appends batches of minutes to the log of each project, idempotently by minute id."""

    def __init__(self, log_dir: Path | str, segment_bytes: int = defaults.LOG_SEGMENT_BYTES) -> None:
        self.log_dir = Path(log_dir)
        self.segment_bytes = segment_bytes
        self._projects: dict[str, _ProjectWriter] = {}
        self._lock = threading.Lock()

    def _project(self, project_id: str) -> _ProjectWriter:
        with self._lock:
            writer = self._projects.get(project_id)
            if writer is None:
                writer = _ProjectWriter(self.log_dir / project_id, self.segment_bytes)
                self._projects[project_id] = writer
            return writer

    def open(self, project_id: str) -> int:
        """Open a project's log now (scan, repair a torn tail); return bytes cut from a torn tail."""
        writer = self._project(project_id)
        with writer.thread_lock:
            fcntl.flock(writer.lock_fd, fcntl.LOCK_EX)
            try:
                writer._catch_up()
            finally:
                fcntl.flock(writer.lock_fd, fcntl.LOCK_UN)
        return writer.repaired_bytes

    def append(self, project_id: str, entries: Sequence[tuple[str, str, bytes]]) -> list[Appended]:
        """Durably append ``(minute_id, stream_id, minute_bytes)`` entries; fsync once.

        Ids the log already holds are skipped and reported with ``new=False``.
        """
        appended = self._project(project_id).append(entries)
        assert appended is not None
        return appended

    def append_many(self, batches: Mapping[str, Sequence[tuple[str, str, bytes]]]) -> dict[str, list[Appended]]:
        """`append` for several projects, taking first the ones no other writer holds.

        Two log workers given batches of the same projects would otherwise queue
        on each project's lock in the same order; here each appends where it
        can without waiting, and waits only for what is left.
        """
        done: dict[str, list[Appended]] = {}
        busy = []
        for project_id, entries in batches.items():
            appended = self._project(project_id).append(entries, wait=False)
            if appended is None:
                busy.append(project_id)
            else:
                done[project_id] = appended
        for project_id in busy:
            done[project_id] = self.append(project_id, batches[project_id])
        return {project_id: done[project_id] for project_id in batches}

    def close(self) -> None:
        with self._lock:
            for writer in self._projects.values():
                writer.close()
            self._projects.clear()


class LogReader:
    """Reads the log while writers append. Safe to share between threads of one process."""

    def __init__(self, log_dir: Path | str) -> None:
        self.log_dir = Path(log_dir)
        # project -> (id -> (segment, offset)), and how far each segment was indexed
        self._index: dict[str, dict[str, tuple[Path, int]]] = {}
        self._indexed_to: dict[str, dict[Path, int]] = {}
        self._lock = threading.Lock()

    def projects(self) -> list[str]:
        """Every project with a log."""
        try:
            return sorted(p.name for p in self.log_dir.iterdir() if p.is_dir() and _segments(p))
        except FileNotFoundError:
            return []

    def has_project(self, project_id: str) -> bool:
        """Whether the project has a log (one directory looked at, where `projects` lists them all)."""
        if not is_valid_project_id(project_id):
            return False  # never a path outside the log directory
        try:
            with os.scandir(self.log_dir / project_id) as entries:
                return any(e.name.endswith(SEGMENT_SUFFIX) for e in entries)
        except (FileNotFoundError, NotADirectoryError):
            return False

    def _newest_backward(self, project_id: str) -> Iterator[LogRecord]:
        for seg in reversed(_segments(self.log_dir / project_id)):
            with open(seg, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                frames = iter_frames_backward(f, size)
                first = next(frames, None)
                if first is None and size > 0:
                    # The tail is mid-append or torn: find where the intact part ends (a forward scan).
                    frames = iter_frames_backward(f, intact_end(f))
                    first = next(frames, None)
                if first is None:
                    continue
                yield _decode_record(first[1])
                for _, payload in frames:
                    yield _decode_record(payload)

    def count(self, project_id: str) -> int:
        """How many minutes the project's log holds."""
        for record in self._newest_backward(project_id):
            return record.seq
        return 0

    def get_recent(self, project_id: str, n: int) -> list[LogRecord]:
        """The newest `n` records, oldest first."""
        out: list[LogRecord] = []
        if n <= 0:
            return out
        for record in self._newest_backward(project_id):
            out.append(record)
            if len(out) >= n:
                break
        out.reverse()
        return out

    def history(self, project_id: str, after_seq: int = 0) -> Iterator[LogRecord]:
        """Every record in append order, starting after `after_seq`."""
        for seg in _segments(self.log_dir / project_id):
            first_seq = int(seg.stem)
            with open(seg, "rb") as f:
                for _, _, payload in iter_frames(f):
                    if first_seq > after_seq:
                        yield _decode_record(payload)
                    else:
                        record = _decode_record(payload)
                        if record.seq > after_seq:
                            yield record

    def _refresh_index(self, project_id: str) -> dict[str, tuple[Path, int]]:
        index = self._index.setdefault(project_id, {})
        done = self._indexed_to.setdefault(project_id, {})
        for seg in _segments(self.log_dir / project_id):
            start = done.get(seg, 0)
            with open(seg, "rb") as f:
                if start >= os.fstat(f.fileno()).st_size:
                    continue
                end = start
                for offset, next_offset, payload in iter_frames(f, start):
                    index[_decode_record(payload).id] = (seg, offset)
                    end = next_offset
            done[seg] = end
        return index

    def get_by_ids(self, project_id: str, ids: Iterable[str]) -> dict[str, LogRecord]:
        """The records with these minute ids (missing ids are absent from the result)."""
        wanted = list(ids)
        with self._lock:
            index = self._index.get(project_id, {})
            if any(i not in index for i in wanted):
                index = self._refresh_index(project_id)
            places = [(i, index[i]) for i in wanted if i in index]
        out: dict[str, LogRecord] = {}
        for minute_id, (seg, offset) in places:
            with open(seg, "rb") as f:
                for _, _, payload in iter_frames(f, offset):
                    out[minute_id] = _decode_record(payload)
                    break
        return out

"""The emitter's local spool: an append-only file of minutes Redis could not take yet.

A frame holds the shard number, the shard count and the minute's wire bytes. Each spool
file belongs to one emitter, which holds an exclusive ``flock`` on it while it
lives. A spool whose lock is free belongs to a producer that exited or
crashed; the next emitter started with the same spool directory adopts it and
replays it. Frames (see `pvm.frames`) make a torn tail harmless: replay stops at
the last intact frame. The replay position is kept in a ``.pos`` file beside the
spool so a restarted replay resumes instead of starting over (a minute replayed
twice is dropped by the log's idempotency).

Redis can take part of a replayed batch and refuse the rest (a shard whose key
has the wrong type, memory running out midway). The position then stops at the
first minute that did not get through, and the frames after it that did are
remembered in memory, so the next attempt does not send them again. Only a
producer that exits with such a gap sends them twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from contracts import decode_durable_fields
from contracts.keys import shard_of
from pvm.frames import iter_frames, pack_frame

log = logging.getLogger(__name__)

SPOOL_SUFFIX = ".spool"
# A spool frame's payload: the shard number and the shard count it was computed for, then the minute's wire bytes.
_SHARD = struct.Struct(">HH")


@dataclass
class SpoolRead:
    """Minutes read from a spool for one replay round trip."""

    minutes: list[list[bytes]]  # per shard, the minutes' wire bytes in spool order
    offsets: list[list[int]]  # per shard, the offset of each minute's frame
    count: int
    end: int  # the offset just past the last frame looked at


class SpoolFile:
    """One locked spool file: append at the end, replay from a remembered position."""

    def __init__(self, path: Path, fd: int, owned: bool) -> None:
        self.path = path
        self.fd = fd  # holds the flock
        self.owned = owned  # written by this process (else adopted from a producer that is gone)
        self.pos_path = path.with_suffix(".pos")
        self.position = self._load_position()
        self.appended = 0  # minutes this process appended
        self.delivered = 0  # minutes this process replayed into Redis
        self._delivered_ahead: set[int] = set()  # frames past `position` that already reached Redis

    @classmethod
    def create(cls, directory: Path) -> SpoolFile:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{uuid.uuid4().hex}{SPOOL_SUFFIX}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return cls(path, fd, owned=True)

    @classmethod
    def adopt_orphans(cls, directory: Path) -> list[SpoolFile]:
        """Lock and return every spool in `directory` that no living emitter holds, oldest first."""
        if not directory.exists():
            return []
        found = []
        for path in sorted(directory.glob(f"*{SPOOL_SUFFIX}"), key=lambda p: p.stat().st_mtime):
            try:
                fd = os.open(path, os.O_RDWR | os.O_APPEND)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            found.append(cls(path, fd, owned=False))
        return found

    def _load_position(self) -> int:
        try:
            return int(self.pos_path.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def append(self, batch: Sequence[Sequence[bytes]]) -> int:
        """Append a batch (encoded minutes per shard); returns how many minutes.

        All or nothing: if the write fails (disk full), the file is cut back to
        where it was and the OSError raised, so no minute is both counted lost
        and replayed.
        """
        frames = []
        for shard, minutes in enumerate(batch):
            tag = _SHARD.pack(shard, len(batch))
            for raw in minutes:
                frames.append(pack_frame(tag + raw))
        if not frames:
            return 0
        data = memoryview(b"".join(frames))
        size = os.fstat(self.fd).st_size
        try:
            while data:
                data = data[os.write(self.fd, data) :]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, size)
            raise
        self.appended += len(frames)
        return len(frames)

    def read(self, limit: int, shards: int) -> SpoolRead:
        """Up to `limit` minutes after the replay position that have not reached Redis yet."""
        minutes: list[list[bytes]] = [[] for _ in range(shards)]
        offsets: list[list[int]] = [[] for _ in range(shards)]
        count = 0
        end = self.position
        with open(self.path, "rb") as f:
            for offset, next_offset, payload in iter_frames(f, self.position):
                end = next_offset
                if offset in self._delivered_ahead:
                    continue
                shard, written_for = _SHARD.unpack_from(payload)
                raw = payload[_SHARD.size :]
                if written_for != shards:
                    # Spooled by a producer with another PVM_SHARDS: shard again by project.
                    shard = shard_of(decode_durable_fields(raw)["project_id"], shards)
                minutes[shard].append(raw)
                offsets[shard].append(offset)
                count += 1
                if count >= limit:
                    break
        return SpoolRead(minutes, offsets, count, end)

    def commit(self, read: SpoolRead, reached: Sequence[bool]) -> int:
        """Record which minutes of `read` reached Redis (`reached` in shard-by-shard order); returns how many did.

        The position moves up to the first minute that did not; the ones after it
        that did are skipped by the next `read`.
        """
        flat = [offset for shard in read.offsets for offset in shard]
        missed = [offset for offset, ok in zip(flat, reached, strict=True) if not ok]
        position = min(missed) if missed else read.end
        ahead = self._delivered_ahead
        ahead.update(offset for offset, ok in zip(flat, reached, strict=True) if ok and offset > position)
        self._delivered_ahead = {offset for offset in ahead if offset > position}
        delivered = len(flat) - len(missed)
        self.delivered += delivered
        if position != self.position:
            self.advance(position)
        return delivered

    def advance(self, position: int) -> None:
        """Record that everything before `position` reached Redis.

        Saving the position is best-effort: without it a restarted replay starts
        earlier and sends some minutes twice, which the log's idempotency absorbs.
        """
        self.position = position
        tmp = self.pos_path.with_suffix(".pos.tmp")
        try:
            tmp.write_text(str(position))
            os.replace(tmp, self.pos_path)
        except OSError:
            log.warning("pvm spool: cannot save the replay position of %s", self.path, exc_info=True)

    def exhausted(self) -> bool:
        return self.position >= os.fstat(self.fd).st_size

    def remove(self) -> None:
        """Delete a fully replayed spool and release it."""
        for p in (self.path, self.pos_path):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        self.close()

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def close(self) -> None:
        """Release the file (and its lock) for the next producer to adopt."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

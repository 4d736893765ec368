"""The emitter's local spool: an append-only file of minutes Redis could not take yet.

A frame holds the shard number, the shard count and the minute's wire bytes. Each spool
file belongs to one emitter, which holds an exclusive ``flock`` on it while it
lives. A spool whose lock is free belongs to a producer that exited or
crashed; the next emitter started with the same spool directory adopts it and
replays it. Frames (see `pvm.frames`) make a torn tail harmless: replay stops at
the last intact frame. The replay position is kept in a ``.pos`` file beside the
spool so a restarted replay resumes instead of starting over (a minute replayed
twice is dropped by the log's idempotency).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import uuid
from collections.abc import Sequence
from pathlib import Path

import msgpack

from contracts.keys import shard_of
from pvm.frames import iter_frames, pack_frame

SPOOL_SUFFIX = ".spool"
# A spool frame's payload: the shard number and the shard count it was computed for, then the minute's wire bytes.
_SHARD = struct.Struct(">HH")


class SpoolFile:
    """One locked spool file: append at the end, replay from a remembered position."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd  # holds the flock
        self.pos_path = path.with_suffix(".pos")
        self.position = self._load_position()
        self.appended = 0

    @classmethod
    def create(cls, directory: Path) -> SpoolFile:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{uuid.uuid4().hex}{SPOOL_SUFFIX}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return cls(path, fd)

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
            found.append(cls(path, fd))
        return found

    def _load_position(self) -> int:
        try:
            return int(self.pos_path.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def append(self, batch: Sequence[Sequence[bytes]]) -> int:
        """Append a batch (encoded minutes per shard); returns how many minutes."""
        frames = []
        for shard, minutes in enumerate(batch):
            tag = _SHARD.pack(shard, len(batch))
            for raw in minutes:
                frames.append(pack_frame(tag + raw))
        if frames:
            os.write(self.fd, b"".join(frames))
            self.appended += len(frames)
        return len(frames)

    def read(self, limit: int, shards: int) -> tuple[list[list[bytes]], int, int]:
        """Up to `limit` minutes after the replay position as a batch, their count, and the position after them."""
        batch: list[list[bytes]] = [[] for _ in range(shards)]
        count = 0
        end = self.position
        with open(self.path, "rb") as f:
            for _, next_offset, payload in iter_frames(f, self.position):
                shard, written_for = _SHARD.unpack_from(payload)
                raw = payload[_SHARD.size :]
                if written_for != shards:
                    # Spooled by a producer with another PVM_SHARDS: shard again by project.
                    shard = shard_of(msgpack.unpackb(raw, raw=False)["project_id"], shards)
                batch[shard].append(raw)
                count += 1
                end = next_offset
                if count >= limit:
                    break
        return batch, count, end

    def advance(self, position: int) -> None:
        """Record that everything before `position` reached Redis."""
        self.position = position
        tmp = self.pos_path.with_suffix(".pos.tmp")
        tmp.write_text(str(position))
        os.replace(tmp, self.pos_path)

    def exhausted(self) -> bool:
        return self.position >= os.fstat(self.fd).st_size

    def remove(self) -> None:
        """Delete a fully replayed spool and release it."""
        for p in (self.path, self.pos_path):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        os.close(self.fd)
        self.fd = -1

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

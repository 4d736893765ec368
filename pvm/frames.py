"""Checksummed, length-framed records for append-only files (the log and the spool).

A frame is ``MAGIC(2) | length(u32) | crc32(u32) | payload | length(u32)``. The
leading header lets a reader walk forward and detect a torn or corrupt tail (a
short header, a short payload, a bad checksum); the trailing length lets a
reader walk backward from the end to the newest records without an index.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from typing import BinaryIO

MAGIC = b"\xa7\x01"
_HEADER = struct.Struct("<2sII")
_TRAILER = struct.Struct("<I")
HEADER_SIZE = _HEADER.size
OVERHEAD = _HEADER.size + _TRAILER.size
MAX_PAYLOAD = 16 * 1024 * 1024


def pack_frame(payload: bytes) -> bytes:
    """Frame one payload."""
    n = len(payload)
    return _HEADER.pack(MAGIC, n, zlib.crc32(payload)) + payload + _TRAILER.pack(n)


def iter_frames(f: BinaryIO, start: int = 0, end: int | None = None) -> Iterator[tuple[int, int, bytes]]:
    """Yield ``(offset, next_offset, payload)`` for each intact frame from `start`.

    Stops silently at the first frame that is incomplete or fails its checksum:
    that is where the intact part of the file ends (a writer may be mid-append,
    or a crash tore the tail). `end` bounds the read (exclusive).
    """
    f.seek(start)
    offset = start
    while end is None or offset + OVERHEAD <= end:
        header = f.read(HEADER_SIZE)
        said = _header(header) if len(header) == HEADER_SIZE else None
        if said is None:
            return
        length, crc = said
        body = f.read(length + _TRAILER.size)
        if len(body) < length + _TRAILER.size:
            return
        payload = _payload(body, 0, length, crc)
        if payload is None:
            return
        next_offset = offset + HEADER_SIZE + len(body)
        if end is not None and next_offset > end:
            return
        yield offset, next_offset, payload
        offset = next_offset


def frame_at(fd: int, offset: int, guess: int = 4096) -> bytes | None:
    """The payload of the intact frame that starts at `offset` of the file open as `fd`, or None where none does
    (a short, torn or corrupt frame, as `iter_frames` stops at). Read with `os.pread`: one call for a frame of up to
    `guess` bytes, where a seek and two buffered reads through a file object cost about twice as much."""
    head = os.pread(fd, max(guess, OVERHEAD), offset)
    said = _header(head) if len(head) >= HEADER_SIZE else None
    if said is None:
        return None
    length, crc = said
    total = OVERHEAD + length
    frame = head if len(head) >= total else head + os.pread(fd, total - len(head), offset + len(head))
    return _payload(frame, HEADER_SIZE, length, crc) if len(frame) >= total else None


def intact_end(f: BinaryIO, start: int = 0) -> int:
    """Offset just past the last intact frame at or after `start`."""
    end = start
    for _, next_offset, _ in iter_frames(f, start):
        end = next_offset
    return end


def iter_frames_backward(f: BinaryIO, end: int) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, payload)`` walking backward from `end` (an intact frame boundary)."""
    offset = end
    while offset > 0:
        if offset < OVERHEAD:
            return
        f.seek(offset - _TRAILER.size)
        (length,) = _TRAILER.unpack(f.read(_TRAILER.size))
        start = offset - OVERHEAD - length
        if start < 0 or length > MAX_PAYLOAD:
            return
        f.seek(start)
        frame = f.read(OVERHEAD + length)
        if len(frame) < OVERHEAD + length:
            return
        said = _header(frame)
        payload = _payload(frame, HEADER_SIZE, length, said[1]) if said is not None and said[0] == length else None
        if payload is None:
            return
        yield start, payload
        offset = start


def _header(header: bytes) -> tuple[int, int] | None:
    """The payload length and checksum a frame's header states, or None where these bytes do not start a frame."""
    magic, length, crc = _HEADER.unpack_from(header)
    return (length, crc) if magic == MAGIC and length <= MAX_PAYLOAD else None


def _payload(frame: bytes, at: int, length: int, crc: int) -> bytes | None:
    """The `length` bytes of payload at `at` of `frame`, or None where their checksum is not `crc` or the trailer
    after them does not repeat the length."""
    payload = frame[at : at + length]
    if zlib.crc32(payload) != crc or _TRAILER.unpack_from(frame, at + length)[0] != length:
        return None
    return payload

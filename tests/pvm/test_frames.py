from __future__ import annotations

import io
import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from pvm.frames import OVERHEAD, frame_at, intact_end, iter_frames, iter_frames_backward, pack_frame


@given(st.lists(st.binary(max_size=300), max_size=20))
def test_forward_and_backward_walks_return_every_payload(payloads: list[bytes]) -> None:
    blob = b"".join(pack_frame(p) for p in payloads)
    f = io.BytesIO(blob)
    assert [p for _, _, p in iter_frames(f)] == payloads
    assert [p for _, p in iter_frames_backward(f, len(blob))] == list(reversed(payloads))
    assert intact_end(f) == len(blob)


@given(st.lists(st.binary(min_size=1, max_size=100), min_size=1, max_size=10), st.data())
def test_a_torn_tail_ends_the_intact_prefix(payloads: list[bytes], data: st.DataObject) -> None:
    frames = [pack_frame(p) for p in payloads]
    whole = b"".join(frames[:-1])
    cut = data.draw(st.integers(min_value=0, max_value=len(frames[-1]) - 1))
    f = io.BytesIO(whole + frames[-1][:cut])
    assert [p for _, _, p in iter_frames(f)] == payloads[:-1]
    assert intact_end(f) == len(whole)


def test_a_flipped_byte_fails_the_checksum() -> None:
    frame = bytearray(pack_frame(b"hello world"))
    frame[OVERHEAD // 2 + 6] ^= 0xFF
    assert list(iter_frames(io.BytesIO(bytes(frame)))) == []


def test_a_frame_read_at_its_offset_is_what_the_walk_reads_and_nothing_where_no_intact_frame_starts(
    tmp_path: Path,
) -> None:
    payloads = [b"a" * 10, b"b" * 5_000, b"", b"c" * 300]  # one longer than a first read
    path = tmp_path / "frames.seg"
    whole = b"".join(pack_frame(p) for p in payloads)
    path.write_bytes(whole + pack_frame(b"torn tail")[:-3])
    with open(path, "rb") as f:
        walked = list(iter_frames(f))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert [frame_at(fd, offset) for offset, _, _ in walked] == payloads
        assert [frame_at(fd, offset, guess=8) for offset, _, _ in walked] == payloads
        assert frame_at(fd, len(whole)) is None  # torn
        assert frame_at(fd, len(whole) + 10_000) is None  # past the end
        assert frame_at(fd, walked[1][0] + 1) is None  # not a frame's start
    finally:
        os.close(fd)
    flipped = bytearray(whole)
    flipped[walked[3][0] + OVERHEAD] ^= 0xFF  # inside the last intact payload
    path.write_bytes(bytes(flipped))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert frame_at(fd, walked[3][0]) is None and frame_at(fd, walked[0][0]) == payloads[0]
    finally:
        os.close(fd)

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st

from pvm.frames import OVERHEAD, intact_end, iter_frames, iter_frames_backward, pack_frame


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

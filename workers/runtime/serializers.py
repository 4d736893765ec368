"""The msgpack serializer every RQ queue and worker of PVM uses (never pickle).

RQ's default serializer is pickle: anyone who can write to a shared Redis could
then run code in the workers. This one only ever builds plain data (maps, lists,
strings, bytes, numbers), and turns anything else into `SerializationError`.
"""

from __future__ import annotations

from typing import Any, cast

import msgpack


class SerializationError(ValueError):
    """Job data that is not msgpack (for example a planted pickle payload)."""


class MsgpackSerializer:
    """RQ serializer: ``dumps``/``loads`` with msgpack, strict on input."""

    @staticmethod
    def dumps(obj: Any, /) -> bytes:
        try:
            return cast(bytes, msgpack.packb(obj, use_bin_type=True, datetime=True))
        except (TypeError, ValueError, OverflowError) as exc:
            raise SerializationError(f"job data is not msgpack-serializable: {exc}") from None

    @staticmethod
    def loads(data: bytes, /) -> Any:
        try:
            return msgpack.unpackb(data, raw=False, strict_map_key=False, timestamp=3)
        except Exception as exc:  # msgpack raises several types for foreign bytes
            raise SerializationError(f"job data is not msgpack ({type(exc).__name__}); refusing to load it") from None

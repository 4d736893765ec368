"""The records the log pool fans out to the downstream pools, decoded once for all of them.

A record is ``[minute_id, log_seq, minute_bytes, entry_ms]`` (`workers.log.pool._fan_out`). The facts and
summarize pools read them the same way; the index pool keeps its own decoder (it trusts the durable bytes
and parses each minute's timestamp for ranking).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from contracts import ContractError, Minute, check_project_id, decode_durable_minute

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FannedOut:
    """A minute as the log made it durable: its sequence in the project's log and its stream entry time (or None)."""

    seq: int
    minute: Minute
    entry_ms: int | None = None


def decode_fanned_out(
    records: Sequence[Sequence[Any]], pool: str, check: Callable[[Minute], None] | None = None
) -> tuple[list[FannedOut], list[str]]:
    """The minutes of `records` (each once, by project and id) and the ids that would not decode.

    `check` may refuse a decoded minute a pool cannot use (raising a `ContractError`). A record that does not
    decode is skipped, its neighbours kept: it stays in the log, and its seq stays a gap below the pool's head
    until a replay with a reader that decodes it. `pool` names the pool in the warning.
    """
    good: list[FannedOut] = []
    bad: list[str] = []
    seen: set[tuple[str, str]] = set()
    for record in records:
        minute_id, seq, raw = record[0], record[1], record[2]
        entry_ms = record[3] if len(record) > 3 and type(record[3]) is int else None
        try:
            minute = decode_durable_minute(raw)
            check_project_id(minute.project_id)
            if check is not None:
                check(minute)
        except ContractError as exc:
            log.warning("%s pool: minute %s (log seq %s) does not decode: %s", pool, minute_id, seq, exc)
            bad.append(str(minute_id))
            continue
        if (minute.project_id, minute.id) not in seen:
            seen.add((minute.project_id, minute.id))
            good.append(FannedOut(int(seq), minute, entry_ms))
    return good, bad

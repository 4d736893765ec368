"""The messages one pool hands another, each defined once: what the pools and the benchmarks build and read.

- `LoggedRecord`: a minute the log pool made durable, as it fans it out to the index, facts and summarize
  pools (a msgpack array ``[minute_id, log_seq, minute_bytes, entry_ms]``; rebuilds from the log and jobs of
  older releases carry the first three). The facts and summarize pools decode a batch with
  `decode_fanned_out`; the index pool reads the same records with `LoggedRecord.read` and decodes them its
  own way (it trusts the durable bytes and parses each minute's timestamp for ranking).
- `ThreadChanges`: what a summarize batch changed of one thread (`thread_changes`), handed to the index
  queue as the summary-points job, because the index worker owns the vector engine.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, NotRequired, TypedDict

from contracts import ContractError, Minute, check_project_id, decode_durable_minute
from contracts.facts import check_time
from contracts.summaries import Chunk, Episode, ThreadRef

log = logging.getLogger(__name__)


class LoggedRecord(NamedTuple):
    """A minute the log made durable, as the log pool fans it out (a msgpack array on the wire)."""

    minute_id: str
    seq: int  # its sequence in its project's log
    minute_bytes: bytes  # the minute as the log holds it
    entry_ms: int | None = None  # its stream entry time (Redis's clock); None in rebuilds and older jobs

    @classmethod
    def read(cls, record: Sequence[Any]) -> LoggedRecord:
        """A record as a job carries it: three or four elements, a non-int entry time read as none."""
        entry_ms = record[3] if len(record) > 3 and type(record[3]) is int else None
        return cls(record[0], record[1], record[2], entry_ms)


@dataclass(frozen=True, slots=True)
class FannedOut:
    """A minute as the log made it durable: its sequence in the project's log and its stream entry time (or None)."""

    seq: int
    minute: Minute
    entry_ms: int | None = None


def decode_fanned_out(
    records: Sequence[Sequence[Any]],
    pool: str,
    check: Callable[[Minute], None] | None = None,
    known: Callable[[bytes], Minute | None] | None = None,
) -> tuple[list[FannedOut], list[str]]:
    """The minutes of `records` (each once, by project and id) and the ids that would not decode.

    `check` may refuse a decoded minute a pool cannot use (raising a `ContractError`). `known` may give the
    minute of bytes the pool built itself (already checked), which is then not decoded. A record that does not
    decode is skipped, its neighbours kept: it stays in the log, and its seq stays a gap below the pool's head
    until a replay with a reader that decodes it. `pool` names the pool in the warning.
    """
    good: list[FannedOut] = []
    bad: list[str] = []
    seen: set[tuple[str, str]] = set()
    for record in records:
        minute_id, seq, raw, entry_ms = LoggedRecord.read(record)
        built = known(raw) if known is not None else None
        try:
            minute = built if built is not None else decode_durable_minute(raw)
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


# -- summary points: what a summarize batch changed of a thread, for the index queue ------------------------------

# Summary point keys: uuid5 of (project, chunk | episode, record id) in this namespace.
SUMMARY_NAMESPACE = uuid.UUID("0c7a3d5e-9b21-5f4e-8a6d-3e2f1b0c9d87")
CHUNK = "chunk"
EPISODE = "episode"


class SummaryChange(TypedDict):
    """A chunk or episode made or changed: its record (``to_dict()``), its newest source's time (Unix ms, or
    None), and for a chunk the minute ids it stands for (None unless all are at hand; an episode names its own)."""

    record: dict[str, Any]
    sources: NotRequired[list[str] | None]
    at_ms: int | None


class ThreadChanges(TypedDict):
    """What a summarize batch changed of one thread: its chunks and episodes made or changed, and the point
    keys (`summary_key`) of those merged away or dropped."""

    thread: str
    chunks: list[SummaryChange]
    episodes: list[SummaryChange]
    retired: list[str]


def summary_key(project_id: str, of: str, record_id: str) -> str:
    """The point key of a chunk's or an episode's summary."""
    return str(uuid.uuid5(SUMMARY_NAMESPACE, f"{project_id}\x1f{of}\x1f{record_id}"))


def thread_changes(
    project_id: str,
    thread: ThreadRef,
    before: tuple[Sequence[Chunk], Sequence[Episode]],
    after: tuple[Sequence[Chunk], Sequence[Episode]],
    minutes: Mapping[int, tuple[str, str]],
) -> ThreadChanges | None:
    """The message for one thread: its chunks and episodes (as ``to_dict()``) that differ from `before`, and
    the keys of those gone; None when nothing changed. Records are compared as they are (frozen), and only
    the changed ones are turned into dicts.

    `minutes` maps log seq to (minute id, timestamp) for the thread's minutes at hand: a new chunk's sources
    are those in its seq ranges (a merged one's come from the chunks it merged, at the index worker); a
    record's ``at_ms`` is its newest source's timestamp among them.
    """
    times = {i: _ms(t) for i, t in minutes.values()}
    message = ThreadChanges(thread=str(thread), chunks=[], episodes=[], retired=[])
    pairs: tuple[tuple[str, Sequence[Chunk | Episode], Sequence[Chunk | Episode]], ...] = (
        (CHUNK, before[0], after[0]),
        (EPISODE, before[1], after[1]),
    )
    for of, old, new in pairs:
        was = {r.id: r for r in old}
        now = {r.id: r for r in new}
        for record_id, current in now.items():
            if was.get(record_id) == current:
                continue
            record = current.to_dict()
            if of == CHUNK:
                ranges = [tuple(r) for r in record.get("seq_ranges") or ()]
                found = [i for seq, (i, _) in sorted(minutes.items()) if any(a <= seq <= b for a, b in ranges)]
            else:
                found = [str(i) for i in record.get("minute_ids") or ()]
            known = [t for t in (times.get(i) for i in found) if t is not None]
            change = SummaryChange(record=record, at_ms=max(known) if known else None)
            if of == CHUNK:
                change["sources"] = found if len(found) == record.get("minute_count") else None
            (message["chunks"] if of == CHUNK else message["episodes"]).append(change)
        message["retired"] += [summary_key(project_id, of, r) for r in was if r not in now]
    if not (message["chunks"] or message["episodes"] or message["retired"]):
        return None
    return message


def _ms(timestamp: str) -> int | None:
    try:
        return int(check_time(timestamp, "timestamp").timestamp() * 1000)
    except ValueError:
        return None

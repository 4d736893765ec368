"""Moves minutes from the shard streams into RQ batch jobs, acknowledging each entry exactly when its job is stored.

One consumer group (`keys.DISPATCH_GROUP`) spans every shard stream; any number
of dispatchers join it. What one round read becomes jobs of at most
`dispatch_batch` minutes on the log queue, and the jobs, any dead letters and
the XACK of every entry go to Redis in one MULTI/EXEC: an entry is never
acknowledged without its job, and a job never exists without its entries being
acknowledged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from rq import Queue
from rq.queue import EnqueueData

from contracts import ContractError, decode_minute, keys
from pvm import defaults
from pvm.config import Settings
from pvm.connection import group_reply
from pvm.metrics import MetricsRecorder
from workers.runtime.queues import pool_job, pool_queue

log = logging.getLogger(__name__)


def default_consumer_name() -> str:
    """A consumer name unique to this process; pass a stable one to resume its pending entries after a restart."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _next_id(entry_id: str) -> str:
    ms, seq = _parse_id(entry_id)
    return f"{ms}-{seq + 1}"


@dataclass
class DeadLetter:
    """An entry that cannot be processed, with why."""

    entry_id: str
    reason: str
    raw: bytes


@dataclass
class Triage:
    """One read batch sorted into what goes to the log pool and what goes to the dead-letter stream."""

    good: list[tuple[str, bytes]] = field(default_factory=list)  # (entry id, minute bytes)
    dead: list[DeadLetter] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)  # pending ids whose entry was trimmed away


def triage(
    entries: Sequence[tuple[bytes | str, dict[bytes, bytes] | None]],
    deliveries: dict[str, int] | None = None,
    max_deliveries: int = defaults.DISPATCH_MAX_DELIVERIES,
) -> Triage:
    """Sort stream entries: decode and validate each minute; poison or over-delivered entries become dead letters."""
    out = Triage()
    for raw_id, fields in entries:
        entry_id = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
        if fields is None:
            out.deleted.append(entry_id)
            continue
        times = (deliveries or {}).get(entry_id, 1)
        raw = fields.get(keys.MINUTE_FIELD)
        if times > max_deliveries:
            out.dead.append(DeadLetter(entry_id, f"delivered {times} times (limit {max_deliveries})", raw or b""))
            continue
        if raw is None:
            names = ", ".join(sorted(k.decode(errors="replace") for k in fields))
            out.dead.append(DeadLetter(entry_id, f"entry has no 'm' field (fields: {names})", b""))
            continue
        try:
            decode_minute(raw)
        except ContractError as exc:
            out.dead.append(DeadLetter(entry_id, str(exc), raw))
            continue
        out.good.append((entry_id, raw))
    return out


@dataclass
class DispatcherStats:
    batches: int = 0  # log jobs enqueued
    minutes: int = 0
    dead: int = 0
    reclaimed: int = 0
    trimmed: int = 0
    reconnects: int = 0  # rounds that found Redis unreachable


class Dispatcher:
    """Reads the shard streams through the consumer group and turns batches into log jobs."""

    def __init__(
        self,
        connection: redis.Redis,
        settings: Settings,
        consumer: str | None = None,
        shards: Sequence[int] | None = None,
        block_ms: int = defaults.DISPATCH_BLOCK_MS,
    ) -> None:
        self.connection = connection
        self.settings = settings
        self.consumer = consumer or default_consumer_name()
        self.shards = list(shards) if shards is not None else list(range(settings.shards))
        self.streams = {keys.stream(s): s for s in self.shards}
        self.block_ms = block_ms
        self.batch = settings.dispatch_batch
        self.log_queue: Queue = pool_queue("log", connection)
        # The pools the log pool feeds: while one of them has jobs waiting, entries are gathered too.
        self.downstream_queues: list[Queue] = [pool_queue(pool, connection) for pool in settings.downstream]
        self.stats = DispatcherStats()
        self.metrics = MetricsRecorder(connection)
        self.stop_event = threading.Event()
        self._next_claim = 0.0
        self._next_trim = 0.0
        self.linger_s = defaults.DISPATCH_LINGER_MS / 1000
        self.downstream_linger_s = defaults.DISPATCH_DOWNSTREAM_LINGER_MS / 1000
        self._linger = self.linger_s  # how long the entries being gathered may wait (set when a flush is weighed)
        self._gathered: dict[int, list[tuple[bytes | str, dict[bytes, bytes] | None]]] = {}
        self._gathered_count = 0
        self._gathered_since = 0.0

    # -- set-up ------------------------------------------------------------

    def ensure_groups(self) -> None:
        """Create the consumer group on every shard stream (from the start, so nothing emitted earlier is missed)."""
        for stream in self.streams:
            try:
                self.connection.xgroup_create(stream, keys.DISPATCH_GROUP, id="0", mkstream=True)
            except redis.exceptions.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    # -- the loop ------------------------------------------------------------

    def run(self, max_idle_s: float | None = None) -> DispatcherStats:
        """Dispatch until `stop_event` is set (or, with `max_idle_s`, until nothing arrived for that long).

        Redis unreachable (a restart, a failover) does not end the loop: the
        dispatcher drops what it held in memory, waits with backoff, and when
        Redis answers again starts over from its own pending entries, which
        is exactly what it had read and not yet acknowledged.
        """
        idle_since = time.monotonic()
        wait = 0.0
        resume = True
        while not self.stop_event.is_set():
            try:
                if resume:
                    self.ensure_groups()
                    self.drain_own_pending()
                    if wait:
                        log.warning("dispatcher %s: Redis is back; resumed from its pending entries", self.consumer)
                    resume, wait = False, 0.0
                n = self._round()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                self._forget_gathered()
                if not wait:
                    log.warning("dispatcher %s: Redis unreachable (%s); retrying", self.consumer, exc)
                wait = min(max(wait * 2, defaults.DISPATCH_RECONNECT_MIN_S), defaults.DISPATCH_RECONNECT_MAX_S)
                self.stats.reconnects += 1
                resume = True
                self.stop_event.wait(wait)
                n = 0
            if n:
                idle_since = time.monotonic()
            elif max_idle_s is not None and time.monotonic() - idle_since >= max_idle_s:
                break
        with contextlib.suppress(redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            self.flush_gathered()
        return self.stats

    def _forget_gathered(self) -> None:
        # Entries read but not dispatched stay pending for this consumer in Redis; drain_own_pending
        # finds them again (or, if their job was stored before the connection broke, they are acknowledged).
        self._gathered, self._gathered_count = {}, 0

    def _round(self) -> int:
        """Housekeeping when due, then one read; returns entries read."""
        now = time.monotonic()
        # Housekeeping errors never end the loop: what it missed, the next round (or another dispatcher) does.
        if now >= self._next_claim:
            self._next_claim = now + defaults.DISPATCH_CLAIM_INTERVAL_S
            try:
                self.reclaim()
            except redis.exceptions.ResponseError:
                log.exception("dispatcher %s: reclaim failed; retrying next round", self.consumer)
        if now >= self._next_trim:
            self._next_trim = now + defaults.DISPATCH_TRIM_INTERVAL_S
            try:
                self.trim()
            except redis.exceptions.ResponseError:
                log.exception("dispatcher %s: trim failed; retrying next round", self.consumer)
        return self.poll_once()

    def poll_once(self) -> int:
        """Read one round of new entries; dispatch what was gathered when it is time. Returns entries read.

        Gathered entries are dispatched when a batch is full, when the log
        pool and the pools it feeds have nothing queued (the pipeline is idle:
        send now), when a read finds nothing new, or when the linger time has
        passed: `DISPATCH_LINGER_MS` while only the log pool has work queued,
        `DISPATCH_DOWNSTREAM_LINGER_MS` while a pool it feeds has. Minutes
        arriving one by one would otherwise each become a job of their own at
        every stage (at 1,000 minutes/s, evenly spaced: 18 minutes a job, and
        the pools never caught up; `bench/freshness.py`). COUNT is per stream,
        so a round may gather several batches; `dispatch_many` cuts them into
        jobs of at most one batch each.
        """
        if self._gathered_count:
            left = self._linger - (time.monotonic() - self._gathered_since)
            block = max(1, int(left * 1000))
        else:
            block = self.block_ms
        response = group_reply(
            self.connection.xreadgroup(
                keys.DISPATCH_GROUP,
                self.consumer,
                {stream: ">" for stream in self.streams},
                count=self.batch,
                block=block,
            )
        )
        got = 0
        for stream_name, entries in response:
            stream = stream_name.decode()
            if not self._gathered_count:
                self._gathered_since = time.monotonic()
            self._gathered.setdefault(self.streams[stream], []).extend(entries)
            self._gathered_count += len(entries)
            got += len(entries)
        if self._gathered_count and (got == 0 or self._gathered_count >= self.batch or self._send_now()):
            self.flush_gathered()
        return got

    def _send_now(self) -> bool:
        """Whether what was gathered goes now: the pipeline is idle (no job waiting in the log pool's queue nor in
        a queue of a pool it feeds: one round trip), or it has waited its linger (the longer one while a pool the
        log pool feeds is behind)."""
        pipe = self.connection.pipeline(transaction=False)
        for queue in (self.log_queue, *self.downstream_queues):
            pipe.llen(queue.key)
        log_waiting, *downstream_waiting = pipe.execute()
        if not log_waiting and not any(downstream_waiting):
            return True
        self._linger = self.downstream_linger_s if any(downstream_waiting) else self.linger_s
        return time.monotonic() - self._gathered_since >= self._linger

    def flush_gathered(self) -> int:
        """Dispatch everything gathered so far (as jobs of at most one batch each)."""
        gathered, self._gathered, self._gathered_count = self._gathered, {}, 0
        return self.dispatch_many(gathered) if gathered else 0

    def drain_own_pending(self) -> int:
        """Re-dispatch entries this consumer read but never acknowledged (it crashed mid-batch)."""
        handled = 0
        for stream, shard in self.streams.items():
            start = "0"
            while True:
                response = group_reply(
                    self.connection.xreadgroup(keys.DISPATCH_GROUP, self.consumer, {stream: start}, count=self.batch)
                )
                entries = response[0][1] if response else []
                if not entries:
                    break
                handled += self.dispatch(shard, entries, self._deliveries(stream, entries))
                start = entries[-1][0].decode()
        if handled:
            log.info("dispatcher %s: re-dispatched %d pending entries of its own", self.consumer, handled)
        return handled

    def reclaim(self) -> int:
        """Take over entries that other (dead or stuck) consumers left pending past the idle timeout."""
        claimed_total = 0
        for stream, shard in self.streams.items():
            start = "0-0"
            while True:
                try:
                    next_start, entries, *_ = self.connection.xautoclaim(
                        stream,
                        keys.DISPATCH_GROUP,
                        self.consumer,
                        min_idle_time=self.settings.claim_idle_ms,
                        start_id=start,
                        count=self.batch,
                    )
                except redis.exceptions.ResponseError as exc:
                    if "NOGROUP" in str(exc):
                        self.ensure_groups()
                        break
                    raise
                if entries:
                    claimed_total += self.dispatch(shard, entries, self._deliveries(stream, entries))
                start = next_start.decode() if isinstance(next_start, bytes) else next_start
                if start == "0-0":
                    break
        self.forget_stale_consumers()
        if claimed_total:
            self.stats.reclaimed += claimed_total
            log.info("dispatcher %s: reclaimed %d entries from silent consumers", self.consumer, claimed_total)
        return claimed_total

    def forget_stale_consumers(self, idle_ms: int = defaults.DISPATCH_STALE_CONSUMER_MS) -> list[str]:
        """Remove consumers that hold nothing and were idle for `idle_ms` (restarted dispatchers leave them behind)."""
        removed = []
        for stream in self.streams:
            try:
                consumers = self.connection.xinfo_consumers(stream, keys.DISPATCH_GROUP)
            except redis.exceptions.ResponseError:
                continue
            for c in consumers:
                name = c["name"].decode() if isinstance(c["name"], bytes) else c["name"]
                if name != self.consumer and int(c["pending"]) == 0 and int(c["idle"]) >= idle_ms:
                    # DELCONSUMER drops the consumer's pending entries, so only an empty one goes.
                    self.connection.xgroup_delconsumer(stream, keys.DISPATCH_GROUP, name)
                    removed.append(name)
        return removed

    def _deliveries(self, stream: str, entries: Sequence[tuple[bytes | str, object]]) -> dict[str, int]:
        if not entries:
            return {}
        first = entries[0][0]
        last = entries[-1][0]
        rows = self.connection.xpending_range(stream, keys.DISPATCH_GROUP, min=first, max=last, count=len(entries) + 10)
        out: dict[str, int] = {}
        for row in rows:
            mid = row["message_id"]
            out[mid.decode() if isinstance(mid, bytes) else str(mid)] = int(row["times_delivered"])
        return out

    # -- one batch -------------------------------------------------------------

    def dispatch(
        self,
        shard: int,
        entries: Sequence[tuple[bytes | str, dict[bytes, bytes] | None]],
        deliveries: dict[str, int] | None = None,
    ) -> int:
        """Dispatch entries of one shard (see `dispatch_many`)."""
        return self.dispatch_many({shard: entries}, deliveries)

    def dispatch_many(
        self,
        batches: Mapping[int, Sequence[tuple[bytes | str, dict[bytes, bytes] | None]]],
        deliveries: dict[str, int] | None = None,
    ) -> int:
        """Enqueue log jobs for entries of any shards, dead-letter their poison, XACK all, in one MULTI/EXEC.

        No job carries more than `dispatch_batch` minutes. The shards' minutes
        are laid end to end, each shard in stream order, and cut into jobs that
        are enqueued in that order: a log pool taking jobs first in, first out
        appends each project's minutes in stream order.
        """
        started = time.monotonic()
        handled = 0
        good: list[tuple[int, list[object]]] = []  # (shard, [entry id, minute bytes])
        dead_total = 0
        with self.connection.pipeline(transaction=True) as pipe:
            now = repr(time.time())
            acks: list[tuple[str, list[str]]] = []
            for shard, entries in batches.items():
                if not entries:
                    continue
                handled += len(entries)
                sorted_ = triage(entries, deliveries, self.settings.max_deliveries)
                stream = keys.stream(shard)
                good.extend((shard, [entry_id, raw]) for entry_id, raw in sorted_.good)
                for dead in sorted_.dead:
                    pipe.xadd(
                        keys.dead_letter_stream(shard),
                        {
                            "reason": dead.reason,
                            "raw": dead.raw,
                            "stream": stream,
                            "entry_id": dead.entry_id,
                            "consumer": self.consumer,
                            "at": now,
                        },
                        maxlen=defaults.DEAD_LETTER_MAXLEN,
                        approximate=True,
                    )
                dead_total += len(sorted_.dead)
                acks.append(
                    (stream, [e for e, _ in sorted_.good] + [d.entry_id for d in sorted_.dead] + sorted_.deleted)
                )
            if not handled:
                return 0
            jobs = [self._log_job(good[i : i + self.batch]) for i in range(0, len(good), self.batch)]
            if jobs:
                self.log_queue.enqueue_many(jobs, pipeline=pipe)
            for stream, ids in acks:
                pipe.xack(stream, keys.DISPATCH_GROUP, *ids)
            pipe.execute()
        self.stats.batches += len(jobs)
        self.stats.minutes += len(good)
        self.stats.dead += dead_total
        self.metrics.batch("dispatch", len(good), time.monotonic() - started, failures=dead_total)  # best-effort
        if dead_total:
            log.warning("dispatcher %s: %d entries dead-lettered", self.consumer, dead_total)
        return handled

    def _log_job(self, minutes: Sequence[tuple[int, list[object]]]) -> EnqueueData:
        shards = sorted({shard for shard, _ in minutes})
        return pool_job(
            keys.LOG_JOB,
            ([entry for _, entry in minutes],),
            timeout=self.settings.job_timeout,
            description=f"log {len(minutes)} minutes from shards {shards}",
        )

    # -- housekeeping ------------------------------------------------------------

    def trim(self) -> int:
        """Trim each stream below what every consumer group has acknowledged; returns entries removed."""
        removed = 0
        for stream in self.streams:
            try:
                groups = self.connection.xinfo_groups(stream)
            except redis.exceptions.ResponseError:
                continue
            if not groups:
                continue
            boundary = min(self.group_floor(stream, group) for group in groups)
            if boundary > (0, 0):
                removed += int(self.connection.xtrim(stream, minid=f"{boundary[0]}-{boundary[1]}", approximate=False))
        self.stats.trimmed += removed
        return removed

    def group_floor(self, stream: str, group: dict[str, Any]) -> tuple[int, int]:
        """The lowest entry id a consumer group may still need: its oldest pending, else the next undelivered.

        `group` is the group's XINFO GROUPS row, read before this call. Other
        consumers keep working in between; that is safe because entries only
        become pending above the row's last-delivered id, and pending ones
        below it only get acknowledged.
        """
        summary = self.connection.xpending(stream, group["name"]) if int(group["pending"]) > 0 else None
        low = summary.get("min") if summary else None
        if low:
            return _parse_id(low.decode() if isinstance(low, bytes) else low)
        # Nothing pending (another dispatcher may have acked all of it since XINFO): everything delivered is done.
        last = group["last-delivered-id"]
        return _parse_id(_next_id(last.decode() if isinstance(last, bytes) else last))

"""The producer side: `Emitter.emit()` hands a minute off in microseconds and never blocks the agent.

`emit()` validates and encodes the minute (raising `InvalidMinute` for bad
input: the only thing it ever raises) and appends it to an in-memory buffer. A
background flusher sends the buffer to the sharded streams in pipelined XADD
batches. When Redis is unreachable, or the buffer is full, minutes go to a local
spool file (`pvm.spool`) and are replayed, in order, once Redis answers again;
while a spool is being replayed, new minutes queue behind it to keep order.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from contracts import Minute, encode_minute, keys, new_minute_id
from contracts.minute import utc_now_iso
from pvm import defaults
from pvm.config import Settings
from pvm.spool import SpoolFile

log = logging.getLogger(__name__)

_REDIS_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


@dataclass(frozen=True)
class EmitterStats:
    """Counters of one emitter since it started."""

    emitted: int  # accepted by emit()
    sent: int  # XADDed to Redis (directly or from the spool)
    spooled: int  # written to the local spool
    dropped: int  # lost: could neither be sent nor spooled (disk failure)
    buffered: int  # waiting in memory now
    spool_backlog: bool  # a spool is waiting to be replayed


def _xadd_prefix(stream: str) -> bytes:
    name = stream.encode()
    field = keys.MINUTE_FIELD
    return b"*5\r\n$4\r\nXADD\r\n$%d\r\n%s\r\n$1\r\n*\r\n$%d\r\n%s\r\n" % (len(name), name, len(field), field)


def _as_minute(minute: Minute | Mapping[str, Any]) -> Minute:
    if isinstance(minute, Minute):
        return minute
    raw = dict(minute)
    raw.setdefault("id", new_minute_id())
    raw.setdefault("timestamp", utc_now_iso())
    return Minute.from_dict(raw)


class Emitter:
    """Fire-and-forget producer of minutes onto the PVM streams.

    Use as a context manager, or call `close()` before exit so buffered minutes
    are sent (or spooled). Thread-safe: many agent threads may share one emitter.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        settings: Settings | None = None,
        shards: int | None = None,
        spool_dir: Path | str | None = None,
        buffer_size: int = defaults.EMIT_BUFFER_SIZE,
        batch_size: int = defaults.EMIT_BATCH_SIZE,
        connection: redis.Redis | None = None,
    ) -> None:
        settings = settings or Settings.from_env()
        self.shards = shards or settings.shards
        self.streams = [keys.stream(s) for s in range(self.shards)]
        self.spool_dir = Path(spool_dir) if spool_dir else settings.spool_dir
        self.buffer_size = buffer_size
        self.batch_size = batch_size
        url = redis_url or settings.redis_url
        if connection is None:
            if not url:
                from pvm.connection import NoRedisConfigured

                raise NoRedisConfigured()
            connection = redis.Redis.from_url(
                url,
                socket_connect_timeout=defaults.EMIT_SOCKET_TIMEOUT_S,
                socket_timeout=defaults.EMIT_SOCKET_TIMEOUT_S,
            )
        self.connection = connection
        # One deque of encoded minutes per shard: plain bytes are not tracked by the
        # garbage collector, so a full buffer adds nothing to GC pauses in the agent.
        self._buffers: list[deque[bytes]] = [deque() for _ in range(self.shards)]
        self._shard_capacity = max(1, buffer_size // self.shards)
        self._prefixes = [_xadd_prefix(s) for s in self.streams]
        self._spool_lock = threading.Lock()
        self._own_spool: SpoolFile | None = None
        self._replay: list[SpoolFile] = SpoolFile.adopt_orphans(self.spool_dir)
        self._counter_lock = threading.Lock()
        self._emitted = 0
        self._sent = 0
        self._spooled = 0
        self._dropped = 0
        self._redis_up = True
        self._asleep = False  # the flusher found nothing for a while and sleeps longer
        self._in_flight = 0  # minutes taken from the buffers and not yet sent or spooled
        self._wake = threading.Event()
        self._closing = False
        self._closed = False
        self._flushed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="pvm-emitter", daemon=True)
        self._thread.start()

    # -- the agent's side -------------------------------------------------

    def emit(self, minute: Minute | Mapping[str, Any]) -> str:
        """Queue a minute for delivery and return its id. Raises only `InvalidMinute` (a ValueError)."""
        m = _as_minute(minute)
        raw = encode_minute(m)
        shard = keys.shard_of(m.project_id, self.shards)
        with self._counter_lock:
            self._emitted += 1
        buf = self._buffers[shard]
        if len(buf) < self._shard_capacity and not self._closed:
            buf.append(raw)
            # Only a long-idle flusher is woken: waking it on every call would make
            # it compete with the agent for the GIL mid-burst; it polls every 2 ms.
            if self._asleep:
                self._wake.set()
        else:
            batch: list[list[bytes]] = [[] for _ in range(self.shards)]
            batch[shard].append(raw)
            self._spill(batch)
        return m.id

    def emit_sync(self, minute: Minute | Mapping[str, Any]) -> str:
        """XADD one minute now and return its stream entry id; raises redis errors to the caller.

        For callers who need the stream position (tests, tools). Minutes queued
        by `emit()` may still be in flight, so ordering against them is not kept.
        """
        m = _as_minute(minute)
        raw = encode_minute(m)
        shard = keys.shard_of(m.project_id, self.shards)
        entry_id = self.connection.xadd(self.streams[shard], {keys.MINUTE_FIELD: raw})
        with self._counter_lock:
            self._emitted += 1
            self._sent += 1
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    def stats(self) -> EmitterStats:
        with self._counter_lock:
            return EmitterStats(
                emitted=self._emitted,
                sent=self._sent,
                spooled=self._spooled,
                dropped=self._dropped,
                buffered=self._buffered(),
                spool_backlog=bool(self._replay) or self._own_spool is not None,
            )

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the buffer is empty and any spool is replayed; True if that happened in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._flushed:
            while self._buffered() or self._in_flight or self._replay or self._own_spool is not None:
                self._wake.set()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._flushed.wait(0.05 if remaining is None else min(0.05, remaining))
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Send what is buffered (waiting up to `timeout`), spool the rest, and stop the flusher."""
        if self._closed:
            return
        self.flush(timeout)
        self._closing = True
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=max(timeout, 1.0))
        leftover, count = self._take(self._buffered())
        if count:
            self._spill(leftover)
        with self._spool_lock:
            for spool in [*self._replay, *([self._own_spool] if self._own_spool else [])]:
                spool.close()

    def __enter__(self) -> Emitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the flusher's side -----------------------------------------------

    def _spill(self, batch: list[list[bytes]]) -> None:
        try:
            with self._spool_lock:
                if self._own_spool is None:
                    self._own_spool = SpoolFile.create(self.spool_dir)
                n = self._own_spool.append(batch)
            with self._counter_lock:
                self._spooled += n
        except OSError:
            lost = sum(len(b) for b in batch)
            log.exception("pvm emitter: cannot write the spool in %s; %d minutes dropped", self.spool_dir, lost)
            with self._counter_lock:
                self._dropped += lost

    def _buffered(self) -> int:
        return sum(len(b) for b in self._buffers)

    def _send(self, batch: list[list[bytes]]) -> None:
        """XADD the items in one pipelined round trip.

        Commands are packed by hand: redis-py's pipeline spends ~15 us per
        command in Python, which would cap a producer near 50k minutes/s.
        """
        parts = []
        count = 0
        for shard, minutes in enumerate(batch):
            prefix = self._prefixes[shard]
            for raw in minutes:
                parts.append(prefix)
                parts.append(b"$%d\r\n" % len(raw))
                parts.append(raw)
                parts.append(b"\r\n")
            count += len(minutes)
        pool = self.connection.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_packed_command([b"".join(parts)], check_health=False)
            errors = []
            for _ in range(count):
                reply = conn.read_response(disable_decoding=True)
                if isinstance(reply, redis.exceptions.ResponseError):
                    errors.append(reply)
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        if errors:
            raise redis.exceptions.ResponseError(f"XADD refused: {errors[0]}")
        with self._counter_lock:
            self._sent += count

    def _take(self, limit: int) -> tuple[list[list[bytes]], int]:
        """Pop up to `limit` buffered minutes as a batch (a list of minutes per shard) and their count.

        Plain lists of bytes, no tuple per minute: the flusher shares the GIL with
        the agent, and fewer tracked objects mean fewer collector pauses for both.
        """
        batch: list[list[bytes]] = []
        count = 0
        for buf in self._buffers:
            take = min(len(buf), limit - count)
            batch.append([buf.popleft() for _ in range(take)])
            count += take
        return batch, count

    def _replay_spools(self) -> None:
        """Send spooled minutes in order; raises redis errors when Redis is still down."""
        while True:
            with self._spool_lock:
                if not self._replay and self._own_spool is not None:
                    # Our own spool is next: from now on new minutes wait in memory again.
                    self._replay.append(self._own_spool)
                    self._own_spool = None
                if not self._replay:
                    return
                spool = self._replay[0]
            batch, count, end = spool.read(self.batch_size, self.shards)
            if count:
                self._send(batch)
                spool.advance(end)
                continue
            # Nothing intact past the position: replayed (a torn tail is dropped with it).
            with self._spool_lock:
                spool.remove()
                self._replay.pop(0)

    def _run(self) -> None:
        last_busy = time.monotonic()
        while True:
            try:
                if self._replay or self._own_spool is not None:
                    if self._redis_up or self._probe():
                        # Keep arrival order: what is in memory goes behind the spool first.
                        if self._own_spool is not None and self._buffered():
                            self._spill(self._take(self._buffered())[0])
                        self._replay_spools()
                        self._redis_up = True
                        continue
                    if self._buffered():
                        self._spill(self._take(self._buffered())[0])
                    self._notify()
                    if self._closing:
                        return
                    self._wake.wait(defaults.EMIT_RECONNECT_INTERVAL_S)
                    self._wake.clear()
                    continue
                batch, count = self._take(self.batch_size)
                if not count:
                    self._notify()
                    if self._closing:
                        return
                    if time.monotonic() - last_busy > defaults.EMIT_IDLE_AFTER_S:
                        self._asleep = True
                        self._wake.wait(defaults.EMIT_IDLE_POLL_S)
                        self._wake.clear()
                        self._asleep = False
                    else:
                        self._wake.wait(defaults.EMIT_FLUSH_INTERVAL_S)
                        self._wake.clear()
                    continue
                last_busy = time.monotonic()
                self._in_flight = count
                try:
                    self._send(batch)
                except _REDIS_ERRORS:
                    self._redis_up = False
                    log.warning("pvm emitter: Redis unreachable; spooling to %s", self.spool_dir)
                    self._spill(batch)
                finally:
                    self._in_flight = 0
            except _REDIS_ERRORS:
                self._redis_up = False
                time.sleep(defaults.EMIT_RECONNECT_INTERVAL_S)
            except Exception:
                log.exception("pvm emitter: flusher error; continuing")
                time.sleep(defaults.EMIT_RECONNECT_INTERVAL_S)

    def _probe(self) -> bool:
        try:
            self.connection.ping()
        except _REDIS_ERRORS:
            return False
        return True

    def _notify(self) -> None:
        with self._flushed:
            self._flushed.notify_all()

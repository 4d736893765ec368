"""The producer side: `Emitter.emit()` hands a minute off in microseconds and never blocks the agent.

`emit()` validates and encodes the minute (raising `InvalidMinute` for bad
input: the only thing it ever raises) and appends it to an in-memory buffer,
capped in minutes and in bytes. A background flusher sends the buffer to the
sharded streams in pipelined XADD batches. Whatever Redis does not take goes to
a local spool file (`pvm.spool`): minutes past the buffer's cap, and everything
while Redis is unreachable or refuses writes (OOM, READONLY after a failover,
NOPERM, WRONGTYPE...). The spool is replayed, in order, once Redis takes a
replayed batch again; while a spool waits, new minutes queue behind it to keep
order. A process that exits without `close()` still sends what it buffered,
within `EMIT_EXIT_TIMEOUT_S`, and spools the rest.

Ordering caveats: Redis may refuse some XADDs of a pipelined batch and accept
others (memory freed midway, one shard's key of the wrong type). The accepted
ones stay in the stream and the refused ones are spooled and sent later, so a
refused minute can land after a later minute of the same shard. Likewise a
minute spilled because the buffer was full goes ahead of older minutes still in
memory.
"""

from __future__ import annotations

import atexit

# The socket module encodes a host name with the "idna" codec on every connect, importing it on first use. A
# process forked while another thread held the import lock cannot import it: its emitter's first connect failed
# with "unknown encoding: idna" and spooled everything (tests/pvm/test_emitter_exit.py, a CI flake). Loaded here,
# the codec is in the registry before any fork.
import encodings.idna  # noqa: F401
import logging
import multiprocessing.util
import os
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from contracts import Minute, encode_minute, keys, new_minute_id
from contracts.facts import Fact, FactType, Tier
from contracts.minute import utc_now_iso
from pvm import defaults
from pvm.config import Settings
from pvm.knowledge import learn_minute, promote_minute
from pvm.spool import SpoolFile

log = logging.getLogger(__name__)

_TRANSPORT_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)

# Refusals that pass by themselves (memory freed, a replica promoted, a load or a
# script finished, a cluster healed): retried every EMIT_RECONNECT_INTERVAL_S,
# like an unreachable Redis. Any other refusal (NOPERM, WRONGTYPE, NOAUTH...)
# needs an operator: its minutes wait in the spool too, retried with a back-off.
PASSING_REFUSALS = frozenset(
    {"OOM", "READONLY", "LOADING", "BUSY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "MISCONF", "NOREPLICAS"}
)
UNREACHABLE = "unreachable"

# What became of one XADD of a pipelined round trip.
_UNANSWERED, _ACCEPTED, _REFUSED = 0, 1, 2


@dataclass(frozen=True)
class EmitterStats:
    """Counters of one emitter, all read at one instant.

    Every minute the emitter accepted is in exactly one place, so at every instant
    ``emitted == sent + spooled + dropped + buffered + in_flight``. `spooled` is
    what the spool holds now: a replayed minute moves from `spooled` to `sent`.
    """

    emitted: int  # accepted by emit() or emit_sync()
    sent: int  # reached Redis, directly or replayed from this emitter's spool
    spooled: int  # in this emitter's spool now, waiting to be replayed
    dropped: int  # lost: could neither be sent nor spooled (disk failure)
    buffered: int  # waiting in memory
    in_flight: int  # taken from memory, not yet settled: on the wire, or being written to the spool
    spooled_total: int  # ever written to the spool (replays do not lower it)
    refused: int  # XADDs Redis answered with an error (a minute refused again on a retry counts again)
    last_refusal: str | None  # the latest such error, e.g. "READONLY You can't write against a read only replica."
    outage: str | None  # why minutes go to the spool now: "unreachable", a refusal code ("OOM", "NOPERM"...), or None
    adopted: int  # minutes replayed from spools that earlier producers left behind (not part of `emitted`)
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


def _refusal_code(error: BaseException) -> str | None:
    """The code of an error Redis answered with (OOM, READONLY, WRONGTYPE...); None for a failed connection."""
    if type(error) is redis.exceptions.ConnectionError:
        return None  # the socket failed, or "max number of clients reached": both pass by themselves
    code = getattr(error, "status_code", None)
    if code:
        return str(code)
    if isinstance(error, redis.exceptions.ResponseError):
        head = str(error).split(" ", 1)[0]
        return head if head.isupper() else "ERR"
    return None


def _describe(error: BaseException) -> str:
    code = _refusal_code(error)
    text = str(error)
    return text if code is None or text.startswith(code) else f"{code} {text}"


def _slice(batch: Sequence[list[bytes]], start: int, stop: int) -> list[list[bytes]]:
    """Minutes `start` to `stop` of a batch (a list of minutes per shard), counted shard by shard."""
    out = []
    offset = 0
    for minutes in batch:
        n = len(minutes)
        out.append(minutes[min(max(start - offset, 0), n) : min(max(stop - offset, 0), n)])
        offset += n
    return out


def _merge(first: Sequence[list[bytes]], then: Sequence[list[bytes]]) -> list[list[bytes]]:
    return [a + b for a, b in zip(first, then, strict=True)]


def _size(batch: Sequence[list[bytes]]) -> int:
    return sum(len(raw) for minutes in batch for raw in minutes)


@dataclass
class _Outcome:
    """How Redis answered one pipelined round trip of XADDs."""

    status: bytearray  # per minute, in send order (shard by shard): _ACCEPTED, _REFUSED or _UNANSWERED
    accepted: int = 0
    refused: int = 0
    refusal: BaseException | None = None  # the first error reply
    failure: BaseException | None = None  # the connection failed; minutes after the last reply are unanswered

    @property
    def complete(self) -> bool:
        return self.accepted == len(self.status)

    @property
    def reason(self) -> str:
        """Why the batch did not all get through: a refusal code, or UNREACHABLE."""
        for error in (self.refusal, self.failure):
            code = _refusal_code(error) if error is not None else None
            if code:
                return code
        return UNREACHABLE

    def unsent(self, batch: Sequence[list[bytes]]) -> list[list[bytes]]:
        """The minutes of `batch` Redis did not accept, per shard, in order."""
        out = []
        i = 0
        for minutes in batch:
            out.append([raw for j, raw in enumerate(minutes) if self.status[i + j] != _ACCEPTED])
            i += len(minutes)
        return out


@dataclass(eq=False)
class _Taken:
    """Minutes the flusher took from the buffers to send; the first `done` (shard by shard) are settled."""

    batch: list[list[bytes]]
    count: int
    done: int = field(default=0)


class Emitter:
    """Fire-and-forget producer of minutes onto the PVM streams.

    Use as a context manager, or call `close()`, to choose when buffered minutes
    are sent (or spooled); a process that exits without either still sends them
    within `EMIT_EXIT_TIMEOUT_S` and spools the rest, and a dropped Emitter's
    flusher sends them and stops. Thread-safe: many agent threads may share one
    emitter.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        settings: Settings | None = None,
        shards: int | None = None,
        spool_dir: Path | str | None = None,
        buffer_size: int = defaults.EMIT_BUFFER_SIZE,
        buffer_bytes: int = defaults.EMIT_BUFFER_BYTES,
        batch_size: int = defaults.EMIT_BATCH_SIZE,
        connection: redis.Redis | None = None,
    ) -> None:
        settings = settings or Settings.from_env()
        self.shards = shards or settings.shards
        self.streams = [keys.stream(s) for s in range(self.shards)]
        self.spool_dir = Path(spool_dir) if spool_dir else settings.spool_dir
        self.buffer_size = buffer_size
        self.buffer_bytes = buffer_bytes
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
        self._outbox = _Outbox(connection, self.streams, self.spool_dir, buffer_size, buffer_bytes, batch_size)
        # Dropped without close(): the flusher sends what is left and stops, without blocking whoever dropped it.
        weakref.finalize(self, self._outbox.release).atexit = False

    # -- the agent's side -------------------------------------------------

    def emit(self, minute: Minute | Mapping[str, Any]) -> str:
        """Queue a minute for delivery and return its id. Raises only `InvalidMinute` (a ValueError)."""
        m = _as_minute(minute)
        self._outbox.put(keys.shard_of(m.project_id, self.shards), encode_minute(m))
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
        self._outbox.count_sent_directly()
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    # -- knowledge: learn / promote (pvm.knowledge) --------------------------

    def learn(
        self,
        project_id: str,
        key: str,
        value: str | int | float | bool,
        tier: Tier | str = Tier.PROJECT,
        *,
        task_id: str | None = None,
        type: FactType | str = FactType.FACT,
        text: str | None = None,
        agent_id: str | None = None,
    ) -> str:
        """Remember `value` under `key` in a tier (``task`` with `task_id`, ``project``, ``global``); the minute id.

        Emits a ``fact_learned`` minute like `emit` (fire-and-forget); once the
        facts pool applies it, `ContextReader.recall` returns it and the key's
        previous value in that tier is superseded (kept in history). Raises
        `InvalidFact` / `InvalidMinute` (ValueErrors) naming the argument to fix.
        """
        return self.emit(
            learn_minute(project_id, key, value, tier, task_id=task_id, type=type, text=text, agent_id=agent_id)
        )

    def promote(self, fact: Fact | Mapping[str, Any], *, agent_id: str | None = None) -> str:
        """Copy a current fact one tier up (task -> project -> global); the ``fact_tier_promoted`` minute's id.

        `fact` is a `Fact` (from `ContextReader.recall`) or a fact of a context (`ContextPackage.facts`).
        """
        return self.emit(promote_minute(fact, agent_id=agent_id))

    def stats(self) -> EmitterStats:
        return self._outbox.stats()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until nothing is buffered or in flight and every spool is replayed; True if that happened in time."""
        return self._outbox.flush(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Send what is buffered (waiting up to `timeout`), spool the rest, and stop the flusher."""
        self._outbox.close(timeout)

    def __enter__(self) -> Emitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Outbox:
    """An emitter's buffers, spool and flusher thread.

    Kept apart from `Emitter` so that nothing but the agent holds the Emitter:
    the flusher thread references this object only.
    """

    def __init__(
        self,
        connection: redis.Redis,
        streams: Sequence[str],
        spool_dir: Path,
        buffer_size: int,
        buffer_bytes: int,
        batch_size: int,
    ) -> None:
        self.connection = connection
        self.shards = len(streams)
        self.spool_dir = spool_dir
        self.buffer_size = buffer_size
        self.buffer_bytes = buffer_bytes
        self.batch_size = batch_size
        self._prefixes = [_xadd_prefix(s) for s in streams]
        # `_lock` guards the buffers and every counter, so that each minute is in
        # exactly one place whenever stats() looks. `_spool_lock` guards the spool
        # files; where both are needed, `_spool_lock` is taken first.
        self._lock = threading.Lock()
        self._spool_lock = threading.Lock()
        # One list of encoded minutes per shard: plain bytes are not tracked by the garbage
        # collector, so a full buffer adds nothing to GC pauses in the agent.
        self._buffers: list[list[bytes]] = [[] for _ in range(self.shards)]
        self._buffered = 0
        self._buffered_bytes = 0
        self._taken: _Taken | None = None  # what the flusher is sending; close() spools it if the flusher hangs
        self._taken_bytes = 0
        self._spilling_bytes = 0  # what the flusher took from the buffers to write to the spool, until it is there
        self._emitted = 0
        self._sent = 0
        self._spooled = 0
        self._spooled_total = 0
        self._dropped = 0
        self._in_flight = 0
        self._refused = 0
        self._last_refusal: str | None = None
        self._adopted = 0
        self._own_spool: SpoolFile | None = None
        self._replay: list[SpoolFile] = SpoolFile.adopt_orphans(spool_dir)
        # The flusher's state.
        self._outage: str | None = None  # set while minutes go to the spool because Redis did not take them
        self._retry_at = 0.0  # when to offer Redis the spool again
        self._backoff = 0.0
        self._asleep = False  # the flusher found nothing for a while and sleeps longer
        self._wake = threading.Event()
        self._flushed = threading.Condition()
        self._closing = False  # the flusher stops once it has nothing left it can send
        self._closed = False  # emit() writes to the spool directly
        self._stopped = False  # close() gave up on the flusher and spooled what it held
        self._close_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="pvm-emitter", daemon=True)
        _live.add(self)
        self._thread.start()

    # -- called from the agent's threads ------------------------------------

    def put(self, shard: int, raw: bytes) -> None:
        size = len(raw)
        with self._lock:
            self._emitted += 1
            fits = (
                not self._closed
                and self._buffered + self._in_flight < self.buffer_size
                and self._buffered_bytes + self._taken_bytes + self._spilling_bytes + size <= self.buffer_bytes
            )
            if fits:
                self._buffers[shard].append(raw)
                self._buffered += 1
                self._buffered_bytes += size
            else:
                self._in_flight += 1
        if not fits:
            batch: list[list[bytes]] = [[] for _ in range(self.shards)]
            batch[shard].append(raw)
            self._spill(batch, 1)
        elif self._asleep:
            # Only a long-idle flusher is woken: waking it on every call would make
            # it compete with the agent for the GIL mid-burst; it polls every 2 ms.
            self._wake.set()

    def count_sent_directly(self) -> None:
        with self._lock:
            self._emitted += 1
            self._sent += 1

    def stats(self) -> EmitterStats:
        with self._lock:
            return EmitterStats(
                emitted=self._emitted,
                sent=self._sent,
                spooled=self._spooled,
                dropped=self._dropped,
                buffered=self._buffered,
                in_flight=self._in_flight,
                spooled_total=self._spooled_total,
                refused=self._refused,
                last_refusal=self._last_refusal,
                outage=self._outage,
                adopted=self._adopted,
                spool_backlog=bool(self._replay) or self._own_spool is not None,
            )

    def flush(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._flushed:
            while not self._drained():
                if not self._thread.is_alive():
                    return False  # closed with a spool left for the next producer
                self._wake.set()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._flushed.wait(0.05 if remaining is None else min(0.05, remaining))
        return True

    def close(self, timeout: float) -> None:
        with self._close_lock:
            if self._closed:
                return
            deadline = time.monotonic() + timeout
            self.flush(timeout)
            with self._lock:
                self._closed = True
            self._closing = True
            self._wake.set()
            self._thread.join(max(deadline - time.monotonic(), defaults.EMIT_CLOSE_GRACE_S))
            if self._thread.is_alive():
                self._abandon()

    def restart_in_child(self) -> None:
        """After fork(), in the child: a fresh, empty outbox with its own flusher on the same streams.

        The child has no flusher thread, and its copies of the locks may be held by a
        parent thread that does not exist here. What was buffered and the spool files
        stay the parent's (the parent sends them); the child counts from zero.
        """
        self._lock = threading.Lock()
        self._spool_lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._wake = threading.Event()
        self._flushed = threading.Condition()
        self._buffers = [[] for _ in range(self.shards)]
        self._buffered = self._buffered_bytes = 0
        self._taken, self._taken_bytes, self._spilling_bytes = None, 0, 0
        self._emitted = self._sent = self._spooled = self._spooled_total = self._dropped = 0
        self._in_flight = self._refused = self._adopted = 0
        self._last_refusal = None
        for spool in [*self._replay, *([self._own_spool] if self._own_spool else [])]:
            spool.close()  # this process's descriptor only: the parent keeps its lock and its spool
        self._own_spool, self._replay = None, []
        self._outage, self._retry_at, self._backoff, self._asleep = None, 0.0, 0.0, False
        if self._closed or self._closing:
            return
        self._thread = threading.Thread(target=self._run, name="pvm-emitter", daemon=True)
        _live.add(self)
        self._thread.start()

    def release(self) -> None:
        """The Emitter was dropped: let the flusher send what is left and stop, without waiting for it here.

        Only a flag: this may run inside a garbage collection on any thread, even
        the flusher's while it holds a lock; the flusher polls it within 0.1 s.
        """
        self._closing = True

    def _drained(self) -> bool:
        with self._lock:
            return not (self._buffered or self._in_flight or self._replay or self._own_spool is not None)

    def _abandon(self) -> None:
        """Spool what the flusher holds and what is buffered: the flusher hangs (say, on a server that never answers).

        The batch on the wire may reach Redis as well; the log keeps one copy.
        """
        with self._lock:
            self._stopped = True
            taken, self._taken = self._taken, None
            self._taken_bytes = 0
            batch, count = self._take_buffers()
        if taken is not None:
            batch = _merge(_slice(taken.batch, taken.done, taken.count), batch)
            count += taken.count - taken.done
        if count:
            log.warning("pvm emitter: Redis did not answer in time; %d minutes spooled to %s", count, self.spool_dir)
            self._spill(batch, count)
        self._close_spools()

    # -- the flusher's side -----------------------------------------------

    def _take_buffers(self) -> tuple[list[list[bytes]], int]:
        """Empty the buffers into one batch, counted in flight from the same instant. Call with `_lock` held."""
        batch, count = self._buffers, self._buffered
        self._buffers = [[] for _ in range(self.shards)]
        self._buffered = 0
        self._buffered_bytes = 0
        self._in_flight += count
        return batch, count

    def _take(self) -> _Taken | None:
        with self._lock:
            if not self._buffered:
                return None
            self._taken_bytes += self._buffered_bytes
            batch, count = self._take_buffers()
            self._taken = _Taken(batch, count)
            return self._taken

    def _spill_buffered(self) -> None:
        """Move what is buffered to the spool; its bytes count against the buffer's cap until the spool has them."""
        with self._lock:
            if not self._buffered:
                return
            size = self._buffered_bytes
            self._spilling_bytes += size
            batch, count = self._take_buffers()
        try:
            self._spill(batch, count)
        finally:
            with self._lock:
                self._spilling_bytes -= size

    def _spill(self, batch: Sequence[Sequence[bytes]], count: int) -> None:
        """Append minutes counted in flight to this emitter's spool, and count them spooled (or dropped)."""
        try:
            with self._spool_lock:
                if self._own_spool is None or self._own_spool.closed:
                    self._own_spool = SpoolFile.create(self.spool_dir)
                self._own_spool.append(batch)
                # Still under the spool lock: the flusher cannot replay them before they are counted.
                with self._lock:
                    self._in_flight -= count
                    self._spooled += count
                    self._spooled_total += count
        except OSError:
            log.exception("pvm emitter: cannot write the spool in %s; %d minutes dropped", self.spool_dir, count)
            with self._lock:
                self._in_flight -= count
                self._dropped += count

    def _send(self, batch: Sequence[Sequence[bytes]], count: int) -> _Outcome:
        """XADD the minutes of `batch` in one pipelined round trip and say what became of each.

        Commands are packed by hand: redis-py's pipeline spends ~15 us per
        command in Python, which would cap a producer near 50k minutes/s.
        """
        parts = []
        for shard, minutes in enumerate(batch):
            prefix = self._prefixes[shard]
            for raw in minutes:
                parts.append(prefix)
                parts.append(b"$%d\r\n" % len(raw))
                parts.append(raw)
                parts.append(b"\r\n")
        outcome = _Outcome(bytearray(count))
        pool = self.connection.connection_pool
        try:
            conn = pool.get_connection()
        except Exception as exc:  # unreachable, or refused at the handshake (WRONGPASS, max clients)
            outcome.failure = exc
            return outcome
        try:
            conn.send_packed_command([b"".join(parts)], check_health=False)
            status = outcome.status
            for i in range(count):
                try:
                    # Read every reply, refusals included: the connection stays in step.
                    conn.read_response(disable_decoding=True, disconnect_on_error=False)
                except redis.exceptions.RedisError as exc:
                    if _refusal_code(exc) is None:
                        raise
                    status[i] = _REFUSED
                    outcome.refused += 1
                    if outcome.refusal is None:
                        outcome.refusal = exc
                else:
                    status[i] = _ACCEPTED
                    outcome.accepted += 1
        except Exception as exc:
            conn.disconnect()
            outcome.failure = exc
            if not isinstance(exc, (*_TRANSPORT_ERRORS, redis.exceptions.RedisError)):
                log.exception("pvm emitter: unexpected error sending to Redis; spooling")
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        return outcome

    def _count_refusals(self, outcome: _Outcome) -> None:
        """Call with `_lock` held."""
        if outcome.refusal is not None:
            self._refused += outcome.refused
            self._last_refusal = _describe(outcome.refusal)

    def _deliver(self, taken: _Taken) -> None:
        """Send what the flusher took, a batch per round trip; what Redis does not take goes to the spool."""
        while taken.done < taken.count:
            start, stop = taken.done, min(taken.done + self.batch_size, taken.count)
            batch = taken.batch if stop - start == taken.count else _slice(taken.batch, start, stop)
            outcome = self._send(batch, stop - start)
            size = _size(batch)
            with self._lock:
                if self._taken is not taken:
                    return  # close() gave up waiting and spooled these while they were on the wire
                taken.done = stop
                self._sent += outcome.accepted
                self._in_flight -= outcome.accepted
                self._count_refusals(outcome)
                if outcome.complete:
                    self._taken_bytes -= size
                    continue
                # The rest stays counted in flight, and its bytes against the buffer's cap, until it is in the
                # spool: until then it is still in memory, and the agent's threads must not buffer past the cap.
                self._taken = None
            rest = _merge(outcome.unsent(batch), _slice(taken.batch, stop, taken.count))
            self._spill(rest, stop - start - outcome.accepted + taken.count - stop)
            with self._lock:
                self._taken_bytes = 0  # the flusher holds nothing now (it takes again only after this returns)
            self._enter_outage(outcome)
            return
        with self._lock:
            if self._taken is taken:
                self._taken = None

    def _replay_spools(self) -> bool:
        """Replay spooled minutes in order; True once none is left, False when Redis did not take a batch."""
        while not self._stopped:
            with self._spool_lock:
                if not self._replay and self._own_spool is not None:
                    # Our own spool is next: from now on new minutes wait in memory again.
                    self._replay.append(self._own_spool)
                    self._own_spool = None
                if not self._replay:
                    return True
                spool = self._replay[0]
            read = spool.read(self.batch_size, self.shards)
            if not read.count:
                self._retire(spool)
                continue
            outcome = self._send(read.minutes, read.count)
            delivered = spool.commit(read, [s == _ACCEPTED for s in outcome.status])
            with self._lock:
                if spool.owned:
                    self._sent += delivered
                    self._spooled -= delivered
                else:
                    self._adopted += delivered
                self._count_refusals(outcome)
            if not outcome.complete:
                self._enter_outage(outcome)
                return False
        return False

    def _retire(self, spool: SpoolFile) -> None:
        """Delete a spool with nothing left to replay (a torn tail goes with it)."""
        lost = spool.appended - spool.delivered if spool.owned else 0
        with self._spool_lock:
            spool.remove()
            self._replay.remove(spool)
        if lost > 0:
            log.error("pvm emitter: %d spooled minutes could not be read back from %s; dropped", lost, spool.path)
            with self._lock:
                self._spooled -= lost
                self._dropped += lost

    def _enter_outage(self, outcome: _Outcome) -> None:
        """Spool from now on, log once per cause, and decide when to offer Redis the spool again."""
        reason = outcome.reason
        passing = reason == UNREACHABLE or reason in PASSING_REFUSALS
        if passing:
            delay = defaults.EMIT_RECONNECT_INTERVAL_S
        else:  # an operator must fix it: don't hammer Redis meanwhile
            delay = min(max(2 * self._backoff, defaults.EMIT_REFUSED_RETRY_S), defaults.EMIT_REFUSED_RETRY_MAX_S)
            self._backoff = delay
        self._retry_at = time.monotonic() + delay
        if reason == self._outage:
            return
        self._outage = reason
        if reason == UNREACHABLE:
            log.warning("pvm emitter: Redis unreachable (%s); spooling to %s", outcome.failure, self.spool_dir)
        elif passing:
            log.warning(
                "pvm emitter: Redis refuses writes (%s); spooling to %s and retrying every %.1f s",
                _describe(outcome.refusal or outcome.failure or Exception(reason)),
                self.spool_dir,
                delay,
            )
        else:
            log.error(
                "pvm emitter: Redis refuses writes (%s); minutes are kept in the spool in %s and retried with "
                "back-off up to %g s: fix the cause (ACL permissions, the stream key's type) and they are replayed",
                _describe(outcome.refusal or outcome.failure or Exception(reason)),
                self.spool_dir,
                defaults.EMIT_REFUSED_RETRY_MAX_S,
            )

    def _end_outage(self) -> None:
        if self._outage is not None:
            log.warning("pvm emitter: Redis takes writes again; the spool is replayed")
            self._outage = None
            self._backoff = 0.0

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self._finish()

    def _loop(self) -> None:
        last_busy = time.monotonic()
        while not self._stopped:
            try:
                if self._outage is not None or self._replay or self._own_spool is not None:
                    # The spool is the probe: a replay attempt fails on a read-only replica, where PING does not.
                    if self._outage is None or time.monotonic() >= self._retry_at:
                        if self._own_spool is not None:
                            self._spill_buffered()  # keep arrival order: what is in memory goes behind the spool
                        if self._replay_spools():
                            self._end_outage()
                            continue
                    self._spill_buffered()
                    self._notify()
                    if self._closing:
                        return
                    self._wake.wait(max(0.0, self._retry_at - time.monotonic()))
                    self._wake.clear()
                    continue
                taken = self._take()
                if taken is None:
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
                self._deliver(taken)
            except Exception:
                log.exception("pvm emitter: flusher error; continuing")
                self._wake.wait(defaults.EMIT_RECONNECT_INTERVAL_S)

    def _finish(self) -> None:
        """The flusher stops: spool what is still in memory and release the spools for the next producer."""
        if not self._stopped:
            self._spill_buffered()
        self._close_spools()
        self._notify()

    def _close_spools(self) -> None:
        with self._spool_lock:
            for spool in [*self._replay, *([self._own_spool] if self._own_spool else [])]:
                spool.close()

    def _notify(self) -> None:
        with self._flushed:
            self._flushed.notify_all()


# Emitters whose flusher may still hold minutes. Their flusher threads keep them alive; the set does not.
_live: weakref.WeakSet[_Outbox] = weakref.WeakSet()


def _close_at_exit() -> None:
    """Interpreter exit: emitters send what they hold within one shared bound, then spool the rest."""
    deadline = time.monotonic() + defaults.EMIT_EXIT_TIMEOUT_S
    for outbox in list(_live):
        outbox.close(max(0.0, deadline - time.monotonic()))


def _restart_in_child() -> None:
    """After fork(), in the child: every live emitter gets a flusher of its own, so what the child emits is sent.

    multiprocessing's children end with os._exit(), which skips atexit: they close
    their emitters from multiprocessing's own exit hook (`_close_at_multiprocessing_exit`).
    """
    inherited = list(_live)
    _live.clear()
    for outbox in inherited:
        outbox.restart_in_child()


def _close_at_multiprocessing_exit(_anchor: object) -> None:
    """In a multiprocessing child, once it has cleared its parent's finalizers: close emitters when it ends."""
    multiprocessing.util.Finalize(None, _close_at_exit, exitpriority=100)


class _ForkAnchor:
    """multiprocessing keys its after-fork hooks by a live object."""


_FORK_ANCHOR = _ForkAnchor()
atexit.register(_close_at_exit)
os.register_at_fork(after_in_child=_restart_in_child)
multiprocessing.util.register_after_fork(_FORK_ANCHOR, _close_at_multiprocessing_exit)

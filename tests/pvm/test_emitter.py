from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgpack
import pytest
import redis

from contracts import InvalidMinute, Minute, keys
from pvm import defaults
from pvm.config import Settings
from pvm.emitter import Emitter
from pvm.spool import SpoolFile
from tests.conftest import free_port


def stream_ids(r: redis.Redis, shards: int = 4) -> list[str]:
    out = []
    for s in range(shards):
        for _, fields in r.xrange(keys.stream(s)):
            out.append(msgpack.unpackb(fields[keys.MINUTE_FIELD])["id"])
    return out


def test_emit_reaches_the_shard_of_its_project(redis_client: redis.Redis, settings: Settings) -> None:
    with Emitter(settings=settings) as em:
        ids = [em.emit(Minute(project_id=f"proj{i % 5}", event_type="message")) for i in range(200)]
        assert em.flush(5)
        stats = em.stats()
    assert (stats.emitted, stats.sent, stats.spooled, stats.dropped) == (200, 200, 0, 0)
    assert sorted(stream_ids(redis_client)) == sorted(ids)
    for s in range(4):
        for _, fields in redis_client.xrange(keys.stream(s)):
            assert keys.shard_of(msgpack.unpackb(fields[b"m"])["project_id"], 4) == s


def test_emit_accepts_a_mapping_and_fills_id_and_timestamp(redis_client: redis.Redis, settings: Settings) -> None:
    with Emitter(settings=settings) as em:
        minute_id = em.emit({"project_id": "p", "event_type": "decision", "data": {"task_id": "t1"}})
    assert stream_ids(redis_client) == [minute_id]


@pytest.mark.parametrize(
    ("minute", "field"),
    [
        (
            {"project_id": "p", "event_type": "task_completed", "data": {"success_criteria_met": 140}},
            "data.success_criteria_met",
        ),
        ({"event_type": "message"}, "project_id"),
        ({"project_id": "p", "event_type": "message", "id": "bad id!"}, "id"),
        ({"project_id": "p", "event_type": "message", "timestamp": "tuesday"}, "timestamp"),
        ({"project_id": "p", "event_type": "message", "memory_note": "x" * 70_000}, "memory_note"),
        ({"project_id": "p", "event_type": "message", "data": {"blob": "x" * 66_000}}, "minute"),
    ],
)
def test_an_invalid_minute_raises_a_value_error_naming_the_field(
    settings: Settings, minute: dict[str, object], field: str
) -> None:
    with Emitter(settings=settings) as em:
        with pytest.raises(ValueError) as info:
            em.emit(minute)
        assert isinstance(info.value, InvalidMinute)
        assert info.value.field == field
        assert field in str(info.value)
        assert em.stats().emitted == 0


def test_emit_sync_returns_the_stream_id(redis_client: redis.Redis, settings: Settings) -> None:
    with Emitter(settings=settings) as em:
        entry_id = em.emit_sync(Minute(project_id="p", event_type="message"))
    shard = keys.shard_of("p", 4)
    assert redis_client.xrange(keys.stream(shard))[0][0].decode() == entry_id


def test_without_redis_minutes_are_spooled_and_replayed_by_the_next_emitter(
    redis_client: redis.Redis, settings: Settings, tmp_path: Path
) -> None:
    dead_url = f"redis://127.0.0.1:{free_port()}/0"
    em = Emitter(dead_url, settings=settings)
    ids = [em.emit(Minute(project_id="p", event_type="message")) for _ in range(50)]
    assert not em.flush(1.0)
    em.close(timeout=0.5)
    stats = em.stats()
    assert stats.emitted == 50 and stats.sent == 0 and stats.spooled == 50 and stats.dropped == 0
    assert list(settings.spool_dir.glob("*.spool"))
    # a new producer process with a reachable Redis adopts the orphaned spool and replays it in order
    with Emitter(settings=settings) as again:
        assert again.flush(5)
    assert stream_ids(redis_client) == ids
    assert not list(settings.spool_dir.glob("*.spool"))


def test_a_full_buffer_spills_to_the_spool_instead_of_blocking(redis_client: redis.Redis, settings: Settings) -> None:
    em = Emitter(f"redis://127.0.0.1:{free_port()}/0", settings=settings, buffer_size=8)
    for _ in range(100):
        em.emit(Minute(project_id="p", event_type="message"))
    em.close(timeout=0.5)
    stats = em.stats()
    assert stats.spooled == 100 and stats.dropped == 0


def test_a_spool_with_a_torn_tail_replays_its_intact_part(redis_client: redis.Redis, settings: Settings) -> None:
    spool = SpoolFile.create(settings.spool_dir)
    from contracts import encode_minute

    minutes = [Minute(project_id="p", event_type="message") for _ in range(3)]
    batch: list[list[bytes]] = [[], [], [], []]
    batch[keys.shard_of("p", 4)] = [encode_minute(m) for m in minutes]
    spool.append(batch)
    with open(spool.path, "ab") as f:
        f.write(b"\xa7\x01\xff\xff")  # the producer died mid-write
    spool.close()
    with Emitter(settings=settings) as em:
        assert em.flush(5)
    assert stream_ids(redis_client) == [m.id for m in minutes]


def test_close_sends_what_is_buffered(redis_client: redis.Redis, settings: Settings) -> None:
    em = Emitter(settings=settings)
    for _ in range(1000):
        em.emit(Minute(project_id="p", event_type="message"))
    em.close()
    time.sleep(0.05)
    assert len(stream_ids(redis_client)) == 1000


def test_a_spool_written_with_another_shard_count_is_resharded(redis_client: redis.Redis, settings: Settings) -> None:
    from contracts import encode_minute

    spool = SpoolFile.create(settings.spool_dir)
    minutes = [Minute(project_id=f"proj{i}", event_type="message") for i in range(20)]
    batch: list[list[bytes]] = [[] for _ in range(7)]
    for m in minutes:
        batch[keys.shard_of(m.project_id, 7)].append(encode_minute(m))
    spool.append(batch)
    spool.close()
    with Emitter(settings=settings) as em:  # 4 shards
        assert em.flush(5)
    assert sorted(stream_ids(redis_client)) == sorted(m.id for m in minutes)
    for s in range(4):
        for _, fields in redis_client.xrange(keys.stream(s)):
            assert keys.shard_of(msgpack.unpackb(fields[b"m"])["project_id"], 4) == s


@contextmanager
def silent_redis() -> Iterator[str]:
    """A URL whose server accepts connections and never answers: every command hangs until its socket timeout."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"


def test_minutes_the_flusher_is_writing_to_the_spool_count_against_the_byte_cap(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until the spool has them, minutes taken from the buffers to be spooled are still in memory: an emit meanwhile
    goes to the spool itself rather than buffer past `buffer_bytes` (under load it once held 16 kB against 10)."""
    import threading

    monkeypatch.setattr(defaults, "EMIT_SOCKET_TIMEOUT_S", 30.0)
    release = threading.Event()
    append = SpoolFile.append

    def slow_append(self: SpoolFile, batch: object) -> int:
        if threading.current_thread().name == "spiller":
            assert release.wait(10), "the test never released the spill"
        return append(self, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(SpoolFile, "append", slow_append)
    minutes = [Minute(project_id="p", event_type="message", memory_note="x" * 4000) for _ in range(3)]
    with silent_redis() as url:
        em = Emitter(url, settings=settings, buffer_bytes=10_000)
        outbox = em._outbox
        em.emit(minutes[0])
        deadline = time.monotonic() + 10
        while em.stats().in_flight != 1:  # the flusher took it and hangs on the silent server
            assert time.monotonic() < deadline, em.stats()
            time.sleep(0.005)
        em.emit(minutes[1])  # 4 kB held by the flusher + 4 kB buffered: within the cap
        assert em.stats().buffered == 1
        spiller = threading.Thread(target=outbox._spill_buffered, name="spiller")
        spiller.start()
        while em.stats().buffered != 0:  # the spiller holds minute 1 until `release`
            assert time.monotonic() < deadline, em.stats()
            time.sleep(0.005)
        emitter = threading.Thread(target=em.emit, args=(minutes[2],))
        emitter.start()
        while em.stats().emitted != 3:
            assert time.monotonic() < deadline, em.stats()
            time.sleep(0.005)
        stats = em.stats()
        assert stats.buffered == 0 and stats.in_flight == 3, stats  # minute 2 waits for the spool, not in memory
        release.set()
        spiller.join(10)
        emitter.join(10)
        em.close(timeout=0.2)
    stats = em.stats()
    assert stats.spooled == 3 and stats.dropped == 0 and stats.in_flight == 0


def test_a_batch_redis_did_not_take_counts_against_the_byte_cap_until_spooled(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other half: a batch the flusher sent and Redis did not take (here the server refuses connections) stays
    in memory until the spool has it, so it counts against `buffer_bytes` meanwhile: with 4 kB of it being spooled
    and 4 kB buffered, a third 4 kB minute goes to the spool, not the buffer (12 kB against a cap of 10)."""
    import threading

    release, spilling = threading.Event(), threading.Event()
    append = SpoolFile.append

    def slow_append(self: SpoolFile, batch: object) -> int:
        if threading.current_thread().name == "pvm-emitter" and not release.is_set():
            spilling.set()
            assert release.wait(10), "the test never released the spill"
        return append(self, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(SpoolFile, "append", slow_append)
    minutes = [Minute(project_id="p", event_type="message", memory_note="x" * 4000) for _ in range(3)]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"redis://127.0.0.1:{probe.getsockname()[1]}/0"  # bound, never listening: refused
        em = Emitter(closed, settings=settings, buffer_bytes=10_000)
        em.emit(minutes[0])
        assert spilling.wait(10), em.stats()  # refused; the flusher is writing minute 0 to the spool
        em.emit(minutes[1])  # 4 kB being spooled + 4 kB buffered: within the cap
        assert em.stats().buffered == 1
        emitter = threading.Thread(target=em.emit, args=(minutes[2],))
        emitter.start()
        deadline = time.monotonic() + 10
        while em.stats().emitted != 3:
            assert time.monotonic() < deadline, em.stats()
            time.sleep(0.005)
        stats = em.stats()
        assert stats.buffered == 1, stats  # minute 2 waits for the spool, not in memory past the cap
        release.set()
        emitter.join(10)
        em.close(timeout=0.2)
    stats = em.stats()
    assert stats.spooled == 3 and stats.dropped == 0 and stats.in_flight == 0, stats


def test_the_buffer_is_capped_in_bytes_too(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(defaults, "EMIT_SOCKET_TIMEOUT_S", 30.0)
    minutes = [Minute(project_id="p", event_type="message", memory_note="x" * 4000) for _ in range(50)]
    with silent_redis() as url:
        em = Emitter(url, settings=settings, buffer_bytes=10_000)
        for m in minutes:
            em.emit(m)
        stats = em.stats()
        # the flusher hangs on the silent server: at most ~10 kB of minutes may wait in memory, the rest is spooled
        assert stats.buffered + stats.in_flight <= 2 and stats.spooled_total >= 48
        em.close(timeout=0.2)
    stats = em.stats()
    assert stats.spooled == 50 and stats.dropped == 0
    with Emitter(settings=settings) as again:
        assert again.flush(5)
    assert sorted(stream_ids(redis_client)) == sorted(m.id for m in minutes)

"""AsyncEmitter and AsyncContextReader on a real Redis, log and engine, driven by asyncio.run."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from contracts import Minute
from pvm import AsyncContextReader, AsyncEmitter, ContextReader, engines
from pvm.config import Settings
from tests.conftest import free_port
from tests.memory_helpers import log_minutes, use_settings
from tests.pvm.test_emitter import stream_ids
from workers.ops.demo import sample_session


def test_the_async_emitter_hands_off_without_waiting_and_flushes_in_a_thread(
    redis_client: redis.Redis, settings: Settings
) -> None:
    async def run() -> tuple[list[str], str, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        beat = asyncio.create_task(ticker())
        async with AsyncEmitter(settings=settings) as emitter:
            ids = [emitter.emit(Minute(project_id=f"p{i % 3}", event_type="message")) for i in range(300)]
            ids.append(emitter.learn("p0", "deploy window", "Tue 10:00"))
            seen = ticks
            assert await emitter.flush(10)
            entry = await emitter.emit_now({"project_id": "p1", "event_type": "decision"})
            beat.cancel()
            # The loop ran other tasks while the flush waited in its thread.
            return ids, entry, ticks - seen

    ids, entry, ticks_during_flush = asyncio.run(run())
    assert set(ids) <= set(stream_ids(redis_client)) and len(stream_ids(redis_client)) == 302
    assert entry.count("-") == 1 and ticks_during_flush > 0


def test_the_async_emitter_spools_when_redis_is_unreachable(settings: Settings) -> None:
    down = Settings(redis_url=f"redis://127.0.0.1:{free_port()}", shards=4, spool_dir=settings.spool_dir)

    async def run() -> tuple[list[str], int]:
        emitter = AsyncEmitter(settings=down)
        ids = [emitter.emit(Minute(project_id="p", event_type="message")) for _ in range(50)]
        await emitter.aclose(timeout=1)
        return ids, emitter.stats().spooled

    ids, spooled = asyncio.run(run())
    assert len(set(ids)) == 50 and spooled == 50


def test_the_async_reader_answers_as_the_sync_one(
    redis_client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_settings(settings, monkeypatch)
    minutes = list(sample_session("apollo", 40, seed=7))
    log_minutes(redis_client, settings, minutes)
    sync = ContextReader.from_settings(settings)

    async def run() -> tuple[list[dict[str, object]], str, list[dict[str, object]]]:
        with ThreadPoolExecutor(2) as pool:
            async with AsyncContextReader.from_settings(settings, executor=pool) as reader:
                recent, package, found = await asyncio.gather(
                    reader.get_recent("apollo", 7),
                    reader.build_context("apollo", "coder", budget_tokens=100_000),
                    reader.get_by_ids("apollo", [minutes[3].id, minutes[1].id]),
                )
                return recent, package.render().splitlines()[0], found

    recent, heading, found = asyncio.run(run())
    assert recent == sync.get_recent("apollo", 7) and heading.startswith("# Context for coder")
    assert [m["id"] for m in found] == [minutes[3].id, minutes[1].id]
    sync.close()
    engines.close_shared()

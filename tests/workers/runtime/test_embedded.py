"""The embedded Valkey: servers started at once by several processes each get a port of their own."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import redis

from workers.runtime.embedded import EmbeddedRedis


def _start_and_report(data_dir: str, ready: multiprocessing.Barrier, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    ready.wait()  # every process starts its server at the same moment
    server = EmbeddedRedis(data_dir=data_dir)
    try:
        server.start()
        out.put(("ok", server.port, redis.Redis.from_url(server.url).ping()))
    except Exception as exc:
        out.put(("failed", repr(exc), False))
    finally:
        server.stop()


def test_servers_started_at_once_by_several_processes_all_start(tmp_path: Path) -> None:
    n = 4
    context = multiprocessing.get_context("spawn")
    ready, out = context.Barrier(n), context.Queue()
    processes = [
        context.Process(target=_start_and_report, args=(str(tmp_path / f"s{i}"), ready, out)) for i in range(n)
    ]
    for p in processes:
        p.start()
    results = [out.get(timeout=60) for _ in processes]
    for p in processes:
        p.join(timeout=30)
    assert [r[0] for r in results] == ["ok"] * n, results
    assert len({r[1] for r in results}) == n and all(r[2] for r in results)


def test_a_given_port_is_used_as_given(tmp_path: Path) -> None:
    """A port named by the caller is not swapped for another: taken, the start fails and says so."""
    first = EmbeddedRedis(data_dir=tmp_path / "a").start()
    again = EmbeddedRedis(data_dir=tmp_path / "b", port=first.port)
    try:
        with pytest.raises(Exception, match="in use"):
            again.start()
    finally:
        again.stop()
        first.stop()

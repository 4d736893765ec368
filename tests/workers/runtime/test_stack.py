"""`pvm up`'s supervision: children restarted, a crash loop slowed down instead of spun."""

from __future__ import annotations

import time

import pytest

from pvm.config import Settings
from workers.runtime.stack import Stack


def wait_dead(stack: Stack, name: str) -> None:
    deadline = time.monotonic() + 30
    while stack.children[name].poll() is None:
        assert time.monotonic() < deadline, f"{name} did not exit"
        time.sleep(0.02)


def test_a_child_that_keeps_dying_at_start_is_restarted_with_backoff(settings: Settings) -> None:
    stack = Stack(settings, api_port=None)
    stack._start_child("bad", ["no-such-command"])  # pvm exits at once with a usage error
    try:
        wait_dead(stack, "bad")
        t = time.monotonic()
        stack.restarts.spawned("bad", t - 0.1)  # on the test's clock it died 0.1 s after its start, however slow
        assert stack.restart_dead(now=t) == ["bad"]  # the first exit: restarted at once
        wait_dead(stack, "bad")
        assert stack.restart_dead(now=t + 0.5) == []  # the second in a row: in 1 s
        assert stack.restart_dead(now=t + 1.4) == []
        assert stack.restart_dead(now=t + 1.6) == ["bad"]
        wait_dead(stack, "bad")
        assert stack.restart_dead(now=t + 2.0) == []  # the third: in 2 s
        assert stack.restart_dead(now=t + 4.1) == ["bad"]
        wait_dead(stack, "bad")
        # One that had run for a while is restarted at once, and the count starts again.
        stack.restarts.started["bad"] = t + 4.1 - 3600
        assert stack.restart_dead(now=t + 5.0) == ["bad"]
        wait_dead(stack, "bad")
        assert stack.restart_dead(now=t + 5.1) == ["bad"]  # one quick exit after a long run: still at once
    finally:
        stack.stop(timeout=5)


def test_crash_loop_delays_are_capped(settings: Settings) -> None:
    stack = Stack(settings, api_port=None)
    stack._start_child("bad", ["no-such-command"])
    try:
        t = time.monotonic()
        stack.restarts.spawned("bad", t)
        for _ in range(12):
            wait_dead(stack, "bad")
            while not stack.restart_dead(now=t):
                t += 0.5
            stack.restarts.started["bad"] = t  # on the test's clock, the child started now
        assert stack.restarts.quick_exits["bad"] == 12
        wait_dead(stack, "bad")
        assert stack.restart_dead(now=t) == [] and stack.restarts.restart_at["bad"] - t == 30.0
    finally:
        stack.stop(timeout=5)


def test_a_worker_group_slows_a_crash_loop_down_too(settings: Settings) -> None:
    from workers.runtime.runner import WorkerGroup

    group = WorkerGroup(["log"], 1, settings.with_(shards=0))  # every child exits: PVM_SHARDS=0 is refused
    group.start()
    try:

        def wait_child_dead() -> None:
            deadline = time.monotonic() + 30
            while group.children[0].poll() is None:
                assert time.monotonic() < deadline
                time.sleep(0.02)

        wait_child_dead()
        assert group.children[0].returncode == 2
        t = time.monotonic()
        group.restarts.spawned("worker 0 of log", t - 0.1)  # a quick exit on the test's clock, however slow
        assert group.restart_dead(now=t) == [0]
        wait_child_dead()
        assert group.restart_dead(now=t + 0.5) == []
        assert group.restart_dead(now=t + 1.6) == [0]
    finally:
        group.stop(timeout=5)


def test_pvm_up_runs_the_log_facts_and_summarize_pools_and_the_index_pool_with_a_qdrant_server(
    settings: Settings,
) -> None:
    # With the embedded engine the index and evaluate pools run inside `pvm serve` (one process owns its files).
    assert Stack(settings, api_port=None).processes == {"log": 1, "facts": 1, "summarize": 1}
    served = Stack(settings.with_(qdrant_url="http://qdrant:6333"), {"facts": 3, "summarize": 2}, api_port=None)
    assert served.processes == {"log": 1, "facts": 3, "summarize": 2, "index": 1, "evaluate": 1}
    with pytest.raises(ValueError, match="evaluate pool cannot have extra processes"):
        Stack(settings, {"evaluate": 2}, api_port=None)
    # Every pool the log feeds by default has a worker in `pvm up` (the index pool's is `pvm serve` or its own).
    assert set(Settings.from_env({}).downstream) - {"index"} <= set(Stack(settings, api_port=None).processes)


def test_pvm_up_mcp_serves_the_mcp_tools_beside_the_api(settings: Settings) -> None:
    from workers.ops.cli import build_parser

    assert build_parser().parse_args(["up", "--mcp"]).mcp
    assert Stack(settings, api_port=8123, mcp=True).serve_args() == ["serve", "--port", "8123", "--mcp"]
    assert Stack(settings, api_port=8123).serve_args() == ["serve", "--port", "8123"]
    with pytest.raises(ValueError, match="--mcp serves the MCP tools beside the reader API"):
        Stack(settings, api_port=None, mcp=True)

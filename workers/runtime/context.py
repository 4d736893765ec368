"""The worker context: what a worker builds once when it starts and hands to every job it runs.

Like arq's ``ctx``: a job function takes the context as its first argument (`workers.runtime.jobs` passes it),
so a pool reads its settings and its Redis connection from it and keeps its long-lived parts (stores, queues,
engines, extractors) in it, built on the first job that needs them, for the worker's life. Nothing is cached
at module level: a new worker (a new test, a restarted process) starts from fresh settings.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import redis

from pvm.config import Settings

Part = TypeVar("Part")


class WorkerContext:
    """A worker's settings, its Redis connection, and the parts its pools built from them."""

    def __init__(self, connection: redis.Redis, settings: Settings | None = None) -> None:
        self.connection = connection
        self._settings = settings
        self._parts: dict[Callable[[WorkerContext], Any], Any] = {}
        self._lock = threading.Lock()

    @property
    def settings(self) -> Settings:
        """The worker's settings: those it was started with, else the environment's when a job first asks."""
        if self._settings is None:
            self._settings = Settings.from_env()
        return self._settings

    def part(self, build: Callable[[WorkerContext], Part]) -> Part:
        """The part `build` makes from this context: built on first use, then the same one for the worker's life."""
        with self._lock:
            if build not in self._parts:
                self._parts[build] = build(self)
            return self._parts[build]  # type: ignore[no-any-return]

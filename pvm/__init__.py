"""PVM: the memory layer for fleets of AI agents. Agents import `Emitter` to write minutes."""

from __future__ import annotations

from contracts import InvalidMinute, Minute, new_minute_id
from pvm.config import Settings
from pvm.emitter import Emitter, EmitterStats

__all__ = ["Emitter", "EmitterStats", "InvalidMinute", "Minute", "Settings", "new_minute_id"]

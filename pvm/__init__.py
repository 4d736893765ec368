"""PVM: the memory layer for fleets of AI agents. Agents write with `Emitter` and read with `ContextReader`."""

from __future__ import annotations

from contracts import InvalidMinute, Minute, new_minute_id
from pvm.config import Settings
from pvm.emitter import Emitter, EmitterStats
from pvm.reader import ContextReader

__all__ = ["ContextReader", "Emitter", "EmitterStats", "InvalidMinute", "Minute", "Settings", "new_minute_id"]

"""Minutes the pool tests share: the contract's golden vectors, and a terse builder at a fixed time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contracts import Minute

VECTORS = Path(__file__).resolve().parents[2] / "contracts" / "vectors"
T0 = "2026-11-26T10:00:00.000000Z"
T0_S = 1_795_687_200.0  # T0 as Unix seconds


def golden(name: str) -> Minute:
    """The minute of golden vector `name` (contracts/vectors/<name>.json)."""
    raw = json.loads((VECTORS / f"{name}.json").read_text())
    raw.pop("v")
    return Minute.from_dict(raw)


def minute(event_type: str, n: int = 0, **fields: Any) -> Minute:
    """Minute number `n` of project p1 by agent a1 at `T0`, unless `fields` say otherwise."""
    fields.setdefault("project_id", "p1")
    fields.setdefault("agent_id", "a1")
    fields.setdefault("timestamp", T0)
    return Minute(event_type=event_type, id=f"id{n:05d}", **fields)

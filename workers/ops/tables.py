"""The plain-text tables `pvm` prints, the CLI's and the demo's: rows under upper-case column names, durations as
cells, and the log tail (a project's newest minutes).

Both `workers.ops.cli` and `workers.ops.demo` import it, so the demo prints the log tail without going through the
CLI (which runs the demo).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pvm.stores.log import LogRecord

# The columns of `pvm log tail`'s table (its --json has every field of `minute_row`).
TAIL_COLUMNS = ("seq", "timestamp", "event_type", "agent_id", "task_id", "memory_note")


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as a table: a header of the column names in upper case, cells cut at 60 characters, None as empty."""
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max([len(c)] + [min(len(row[i]), 60) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    for row in cells:
        lines.append("  ".join(v[:60].ljust(w) for v, w in zip(row, widths, strict=True)))
    return "\n".join(lines)


def age(seconds: float | None) -> str:
    """A duration as a cell: 250ms, 12.5s, 3.0m, 2.5h; `-` for none."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def minute_row(record: LogRecord) -> dict[str, Any]:
    """A log record as a row of the log tail: the minute's fields, where the log holds it, and the whole minute."""
    m = record.minute
    return {
        "seq": record.seq,
        "id": m.id,
        "timestamp": m.timestamp,
        "event_type": m.event_type,
        "agent_id": m.agent_id,
        "task_id": m.data.get("task_id"),
        "thread_id": m.thread_id,
        "memory_note": m.memory_note,
        "stream_id": record.stream_id,
        "durable_at": datetime.fromtimestamp(record.durable_at, UTC).isoformat(timespec="milliseconds"),
        "minute": m.to_dict(),
    }


def log_tail_text(project: str, count: int, rows: Sequence[dict[str, Any]]) -> str:
    """What `pvm log tail` prints (and `pvm demo` shows): how many minutes the log holds, then the newest as a table."""
    return f"project {project}: {count} minutes in the log; newest {len(rows)}:\n" + table(rows, TAIL_COLUMNS)

"""A memory file's text: its YAML front matter and body, rendered from a record and parsed back; no I/O.

PVM writes each field as ``key: <JSON value>`` (JSON is YAML, and quick to write and read back); a file a
person rewrote in other YAML is read with the safe loader. `fact_front` is a fact file's front matter in
`FACT_KEYS` order; `render_chunk` and `render_episode` render the derived, read-only files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, date, datetime
from typing import Any

import yaml

from contracts.facts import Fact, Tier
from contracts.summaries import Chunk, Episode
from workers.agent.memory_errors import MemoryFileError

# The front-matter of a fact file, in the order it is written. `sources` and `relations` are the fact's
# source_minute_ids and relationships; `tier` and `task` its tier key.
FACT_KEYS = (
    "id",
    "type",
    "tier",
    "task",
    "subject",
    "attribute",
    "value",
    "status",
    "importance",
    "confidence",
    "valid_from",
    "valid_until",
    "single_valued",
    "tags",
    "sources",
    "relations",
    "recorded_at",
    "promoted_from",
    "period",
    "version",
)
# What a new file (no `id`) may say: the rest PVM sets.


_quoted = json.encoder.encode_basestring
_quoted_ascii = json.encoder.encode_basestring_ascii


def _scalar(value: Any) -> str:
    """One front-matter value as JSON, which YAML reads as the same value; escaped where YAML would stumble.

    The JSON encoder's own string quoting (its C function), called directly: an export renders every field
    of every fact, and `json.dumps` per field costs several times more.
    """
    if isinstance(value, str):
        return _quoted(value) if value.isprintable() else _quoted_ascii(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return json.dumps(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=True)


def render(front: Mapping[str, Any], body: str) -> str:
    """A memory file: ``---``, one ``key: <JSON value>`` line per field, ``---``, the body and a newline."""
    lines = ["---", *(f"{k}: {_scalar(v)}" for k, v in front.items()), "---", body.strip("\n"), ""]
    return "\n".join(lines)


def fact_front(fact: Fact | Mapping[str, Any], version: int) -> dict[str, Any]:
    """A fact file's front-matter, in `FACT_KEYS` order, from a `Fact` or its `Fact.to_dict` form."""
    d = fact.to_dict() if isinstance(fact, Fact) else fact
    tier, _, rest = str(d["tier_key"]).partition(":")
    front: dict[str, Any] = {"id": d["id"], "type": d["type"], "tier": tier}
    if tier == Tier.TASK.value:
        front["task"] = rest.partition(":")[2]
    front.update(
        subject=d["subject"],
        attribute=d["attribute"],
        value=d["value"],
        status=d["status"],
        importance=d["importance"],
        confidence=d["confidence"],
        valid_from=d["valid_from"],
        valid_until=d["valid_until"],
        single_valued=d["single_valued"],
        tags=d["tags"],
        sources=d["source_minute_ids"],
        relations=d["relationships"],
        recorded_at=d["recorded_at"],
        promoted_from=d["promoted_from"],
        period=d.get("period", 0),
        version=version,
    )
    return front


def _derived_front(record: dict[str, Any], kind: str) -> dict[str, Any]:
    front = {"kind": kind, "read_only": True}
    front.update((k, v) for k, v in record.items() if k != "summary")
    return front


def render_chunk(chunk: Chunk) -> str:
    return render(_derived_front(chunk.to_dict(), "summary"), chunk.summary)


def render_episode(episode: Episode) -> str:
    return render(_derived_front(episode.to_dict(), "episode"), episode.summary)


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse(path: str, text: str) -> tuple[dict[str, Any], str]:
    """The front-matter (a mapping) and the body of a memory file; `MemoryFileError` naming `path` when malformed.

    Lines PVM wrote (``key: <JSON>``) are read as JSON; anything else a person wrote is read as YAML.
    Timestamps YAML reads as dates come back as ISO 8601 text.
    """
    if not text.startswith("---\n"):
        raise MemoryFileError(f"{path}: a memory file starts with a '---' line, then its front-matter, then '---'")
    end = text.find("\n---\n", 3)
    if end < 0:
        end = text.find("\n---", 3)
        if end < 0 or text[end + 4 :].strip():
            raise MemoryFileError(f"{path}: the front-matter has no closing '---' line")
    head, body = text[4:end], text[end + 5 :]
    front = _json_front(head)
    if front is None:
        try:
            loaded = yaml.load(head, Loader=_LOADER)
        except yaml.YAMLError as exc:
            raise MemoryFileError(f"{path}: the front-matter is not YAML: {str(exc)[:200]}") from None
        if not isinstance(loaded, dict):
            raise MemoryFileError(f"{path}: the front-matter must be a mapping of fields (key: value lines)")
        front = {str(k): _plain(v) for k, v in loaded.items()}
    return front, body.strip("\n")


def _json_front(head: str) -> dict[str, Any] | None:
    """The front-matter as PVM writes it (``key: <JSON>`` lines), or None when a person wrote some other YAML."""
    front: dict[str, Any] = {}
    for line in head.split("\n"):
        if not line.strip():
            continue
        key, sep, raw = line.partition(": ")
        if not sep or not key.isidentifier():
            return None
        try:
            front[key] = json.loads(raw)
        except ValueError:
            return None
    return front


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return f"{value.isoformat()}T00:00:00Z"
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value

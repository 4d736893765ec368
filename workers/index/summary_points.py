"""Summary points: a thread's chunk and episode summaries as vector points, so that search can return them.

The summarize pool keeps each thread's chunks and episodes in Redis (`pvm.stores.summaries`). What a batch
changed of a thread (the message `workers.runtime.messages.ThreadChanges`: chunks made, merged or newly
summarized by a model; episodes made or grown; those that merged away) it hands to the index queue as one
job (`keys.SUMMARY_POINTS_JOB`), because the index worker owns the vector engine's files; that job
(`workers.index.pool.run_summaries`) makes the points (`plan`, `index_summaries`) and upserts them.

A summary point (kind ``summary``) holds the record (``Chunk.to_dict()`` / ``Episode.to_dict()``), what the
legs index (`summary_text`), the thread, and ``sources``: the minute ids it stands for. An episode names
its minutes; a chunk made in the batch names the minutes it was cut from; a merged chunk takes the sources
of the chunks it merged (their points, retired in the same job). ``timestamp_ms`` (what recency ranks by)
is its newest source's. A record that merged into another or was dropped leaves a ``summary_retired``
point under its key (found by no search), so a stale summary never answers.

Replay: `replay_summaries` rebuilds the threads and hands every thread to this job again (full), with the chunks
and episodes that merged away or were dropped on the way as retired: the index reset deleted their points too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from contracts.ids import id_timestamp_ms
from contracts.summaries import ThreadKind, ThreadRef
from pvm import defaults
from pvm.protocols import SUMMARY, SUMMARY_RETIRED, Embedder, MemoryPoint, StoredPoint, VectorEngine
from workers.runtime.messages import CHUNK, EPISODE, summary_key

log = logging.getLogger(__name__)


def summary_text(of: str, record: Mapping[str, Any]) -> str:
    """What the legs index of a summary: a chunk's summary, topics, decisions and outcome; an episode's title,
    summary and outcome."""
    if of == CHUNK:
        parts = [record.get("summary"), *(record.get("key_topics") or ()), *(record.get("decisions") or ())]
    else:
        parts = [record.get("title"), record.get("summary")]
    parts.append(record.get("outcome"))
    return " ".join(dict.fromkeys(str(p) for p in parts if p))


def _capped(ids: Sequence[str]) -> list[str]:
    """`ids` once each; past `SUMMARY_POINT_MAX_SOURCES`, its first and last halves."""
    unique = list(dict.fromkeys(ids))
    most = defaults.SUMMARY_POINT_MAX_SOURCES
    if len(unique) <= most:
        return unique
    return unique[: most // 2] + unique[len(unique) - (most - most // 2) :]


# -- the points (the index worker) --------------------------------------------------------------------------------


def needed(project_id: str, message: Mapping[str, Any]) -> list[str]:
    """The stored points `plan` reads for one thread's message: its chunks' and episodes', and the retired."""
    keys = [summary_key(project_id, CHUNK, str(e["record"]["id"])) for e in message.get("chunks") or ()]
    keys += [summary_key(project_id, EPISODE, str(e["record"]["id"])) for e in message.get("episodes") or ()]
    return list(dict.fromkeys([*keys, *(message.get("retired") or ())]))


def _within(inner: Sequence[Sequence[int]], outer: Sequence[Sequence[int]]) -> bool:
    return all(any(a <= lo and hi <= b for a, b in outer) for lo, hi in inner)


def plan(project_id: str, message: Mapping[str, Any], stored: Mapping[str, StoredPoint]) -> list[MemoryPoint]:
    """The points one thread's message makes, given the stored points `needed` named. A point keeps its stored
    dense vector while its text stays the same; otherwise its `dense` is None (the caller embeds it)."""
    thread = ThreadRef.parse(message["thread"])
    retired = [stored[k] for k in message.get("retired") or () if k in stored]
    out: list[MemoryPoint] = []
    for of in (CHUNK, EPISODE):
        for entry in message.get(f"{of}s") or ():
            record = dict(entry["record"])
            key = summary_key(project_id, of, str(record["id"]))
            previous = stored.get(key)
            if of == EPISODE:
                sources = [str(i) for i in record.get("minute_ids") or ()]
            elif entry.get("sources") is not None:
                sources = [str(i) for i in entry["sources"]]
            else:  # a merged chunk, or one whose summary a model rewrote: the sources its points had
                ranges = record.get("seq_ranges") or ()
                sources = [
                    str(i)
                    for p in ([previous] if previous is not None else []) + retired
                    if p.payload.get("of") == CHUNK
                    and (p is previous or _within((p.payload.get("record") or {}).get("seq_ranges") or (), ranges))
                    for i in p.payload.get("sources") or ()
                ]
            at_ms = entry.get("at_ms")
            out.append(_point(project_id, thread, of, key, record, _capped(sources), previous, at_ms))
    kept = {p.minute_id for p in out}
    for key in message.get("retired") or ():
        if key not in kept:
            payload = {"kind": SUMMARY_RETIRED, "project_id": project_id}
            out.append(MemoryPoint(key, project_id, "", payload, kind=SUMMARY_RETIRED))
    return out


def _point(
    project_id: str,
    thread: ThreadRef,
    of: str,
    key: str,
    record: dict[str, Any],
    sources: list[str],
    previous: StoredPoint | None,
    at_ms: int | None,
) -> MemoryPoint:
    text = summary_text(of, record)
    times = [t for t in (id_timestamp_ms(i) for i in sources) if t is not None]
    if at_ms is not None:
        times.append(at_ms)
    if previous is not None and isinstance(previous.payload.get("timestamp_ms"), int):
        times.append(previous.payload["timestamp_ms"])
    timestamp = max(times) if times else None
    payload: dict[str, Any] = {
        "kind": SUMMARY,
        "project_id": project_id,
        "of": of,
        "thread": str(thread),
        "thread_id": thread.name if thread.kind is ThreadKind.THREAD else None,
        "task_id": thread.name if thread.kind is ThreadKind.TASK else None,
        "timestamp_ms": timestamp,
        "text": text,
        "sources": sources,
        "record": record,
    }
    same_text = previous is not None and previous.payload.get("text") == text
    dense = previous.dense if same_text and previous is not None else None
    return MemoryPoint(key, project_id, text, payload, dense=dense, kind=SUMMARY)


def index_summaries(
    engine: VectorEngine, embedder: Embedder | None, project_id: str, threads: Sequence[Mapping[str, Any]]
) -> dict[str, int]:
    """Upsert the summary points of one project's thread messages (embedded when `embedder` has dimensions)."""
    counts = {"summaries": 0, "retired": 0, "embedded": 0}
    points: list[MemoryPoint] = []
    for message in threads:
        keys = needed(project_id, message)
        stored = {p.key: p for p in engine.get_points(project_id, keys, with_vectors=True)} if keys else {}
        points += plan(project_id, message, stored)
    dense_on = embedder is not None and embedder.dimensions is not None
    missing = [i for i, p in enumerate(points) if p.kind == SUMMARY and p.dense is None and p.text]
    if dense_on and missing:
        assert embedder is not None
        vectors = embedder.embed([points[i].embed_text for i in missing])
        for i, vector in zip(missing, vectors, strict=True):
            p = points[i]
            points[i] = MemoryPoint(p.minute_id, p.project_id, p.text, p.payload, dense=list(vector), kind=p.kind)
        counts["embedded"] = len(missing)
    if points:
        engine.upsert(points)
    counts["summaries"] = sum(1 for p in points if p.kind == SUMMARY)
    counts["retired"] = sum(1 for p in points if p.kind == SUMMARY_RETIRED)
    return counts

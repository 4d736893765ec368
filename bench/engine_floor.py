#!/usr/bin/env python
"""Engine floor benchmark: what one indexed minute costs inside the embedded engine (qdrant-edge), before any of
the index pool's own Python, and so the most minutes/s one index process can reach on this machine.

Minutes come from `bench/sessions.py` (as `bench/reader.py` loads them) and become points exactly as the
index pool makes them (`workers.index.pool.decode`, `_points`; the engine's `_pack`, BM25 and point ids). Then,
each step timed over all points, best of `--repeats`:

- python_us        the engine's Python per point: checks, BM25, packing the payload, the point id;
- point_us         building the `qdrant_edge.Point`: with the stored payload, and with none (the binding
                   converts the payload value by value; `value_conversion_us` is the cost of one value of each
                   type, from dicts of five);
- update_us        `EdgeShard.update(upsert_points)` in chunks as `EdgeEngine.upsert` writes them: on a shard
                   with PVM's payload indexes (what every search filter needs), without them, and without payloads;
- engine_floor_us  point with payload + update with PVM's indexes: the engine's share of one indexed minute.
                   ceiling_per_s = 1e6 / engine_floor_us is what one index process could reach if the pool's
                   Python (decode, build points, agent memory, heads, checks, BM25, packing) cost nothing;
- update_overlaps_python  whether a thread running `update` lets another thread run Python meanwhile (the
                   binding releasing the GIL): if not, one process cannot hide the pool's Python behind it.

`bench/reader.py` measures the whole pool (index_per_s); this says how much of it the engine takes.

    .venv/bin/python bench/engine_floor.py --json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgpack
import qdrant_edge as qe

from bench.machine import machine
from bench.reader import build_minutes
from pvm.vectors import LEXICAL, check_point, edge, stored_point_id
from workers.index import pool as index_pool

VALUE_SAMPLES: dict[str, Any] = {"str": "agent-1", "int": 1_795_713_916_474, "float": 0.6337, "bool": True}
SPIN_LOOPS = 1_000_000


def points_of(count: int, seed: int) -> list[Any]:
    """`count` minute points of one project, as the index pool builds them (lexical only: no dense text)."""
    minutes = build_minutes(count, seed)
    project = minutes[0][0].project_id
    now_ms = int(time.time() * 1000)
    records = [[m.id, seq, raw, now_ms] for seq, (m, raw) in enumerate(minutes, 1) if m.project_id == project]
    logged, undecodable = index_pool.decode(records)
    if undecodable:
        raise SystemExit(f"engine floor: {len(undecodable)} generated minutes did not decode")
    return index_pool._points(logged, time.time(), dense=False)[:count]


def per_point(step: Callable[[], Any], points: int, repeats: int) -> float:
    """The best of `repeats` runs of `step`, in microseconds per point."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - started)
    return round(best / points * 1e6, 2)


def bare_shard(directory: Path, indexes: bool) -> qe.EdgeShard:
    """A shard configured as `EdgeEngine` configures one (lexical only), with or without PVM's payload indexes."""
    shard = qe.EdgeShard.create(
        str(directory),
        qe.EdgeConfig(
            vectors=None,
            sparse_vectors={LEXICAL: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
            wal_enabled=True,
            max_search_threads=edge.SEARCH_THREADS,
        ),
    )
    if indexes:
        for field, schema in edge._payload_indexes():
            shard.update(qe.UpdateOperation.create_field_index(field, schema))
    return shard


def timed_update(root: Path, name: str, points: Sequence[qe.Point], indexes: bool, repeats: int) -> float:
    """µs per point of upserting `points` into fresh shards (one per repeat: every run writes new points)."""
    best = float("inf")
    for run in range(repeats):
        shard = bare_shard(root / f"{name}-{run}", indexes)
        try:
            started = time.perf_counter()
            for start in range(0, len(points), edge.UPSERT_CHUNK):
                shard.update(qe.UpdateOperation.upsert_points(list(points[start : start + edge.UPSERT_CHUNK])))
            best = min(best, time.perf_counter() - started)
        finally:
            shard.close()
    return round(best / len(points) * 1e6, 2)


def value_conversion(points: int, repeats: int) -> dict[str, float]:
    """µs to convert one payload value of each type: a five-value dict of it, minus an empty one, per value."""
    vector = {LEXICAL: qe.SparseVector([1, 5, 9], [1.0, 1.0, 1.0])}
    empty = per_point(lambda: [qe.Point(i, vector, {}) for i in range(points)], points, repeats)
    out = {}
    for kind, value in VALUE_SAMPLES.items():
        payload = {f"f{i}": value for i in range(5)}
        full = per_point(lambda p=payload: [qe.Point(i, vector, p) for i in range(points)], points, repeats)
        out[kind] = round(max(0.0, full - empty) / 5, 2)
    return out


def overlaps_python(root: Path, points: Sequence[qe.Point]) -> dict[str, Any]:
    """Whether Python runs in another thread while `update` works (timed alone, then side by side)."""

    def spin() -> None:
        total = 0
        for i in range(SPIN_LOOPS):
            total += i * i % 7

    def update(shard: qe.EdgeShard) -> None:
        for start in range(0, len(points), edge.UPSERT_CHUNK):
            shard.update(qe.UpdateOperation.upsert_points(list(points[start : start + edge.UPSERT_CHUNK])))

    shards = [bare_shard(root / f"overlap-{i}", indexes=True) for i in range(2)]
    try:
        started = time.perf_counter()
        update(shards[0])
        alone_update = time.perf_counter() - started
        started = time.perf_counter()
        spin()
        alone_spin = time.perf_counter() - started
        thread = threading.Thread(target=update, args=(shards[1],))
        started = time.perf_counter()
        thread.start()
        spin()
        thread.join()
        together = time.perf_counter() - started
    finally:
        for shard in shards:
            shard.close()
    serial = alone_update + alone_spin
    return {
        "update_s": round(alone_update, 4),
        "python_s": round(alone_spin, 4),
        "together_s": round(together, 4),
        # Overlapped work would take about max(update, python); held, about their sum or more.
        "update_overlaps_python": together < serial - 0.5 * min(alone_update, alone_spin),
    }


def run(count: int, repeats: int, seed: int) -> dict[str, Any]:
    points = points_of(count, seed)
    n = len(points)
    lexical = edge.LexicalEncoder()
    packer = msgpack.Packer()
    vectors = [lexical.document(p.text) for p in points]
    payloads = [edge._pack(p, packer) for p in points]
    ids = [stored_point_id(p) for p in points]
    python_us = {
        "check": per_point(lambda: [check_point(p) for p in points], n, repeats),
        "bm25": per_point(lambda: [lexical.document(p.text) for p in points], n, repeats),
        "pack": per_point(lambda: [edge._pack(p, packer) for p in points], n, repeats),
        "point_id": per_point(lambda: [stored_point_id(p) for p in points], n, repeats),
    }
    with_payload = per_point(
        lambda: [qe.Point(i, {LEXICAL: v}, p) for i, v, p in zip(ids, vectors, payloads, strict=True)], n, repeats
    )
    without_payload = per_point(
        lambda: [qe.Point(i, {LEXICAL: v}, None) for i, v in zip(ids, vectors, strict=True)], n, repeats
    )
    full = [qe.Point(i, {LEXICAL: v}, p) for i, v, p in zip(ids, vectors, payloads, strict=True)]
    bare = [qe.Point(i, {LEXICAL: v}, None) for i, v in zip(ids, vectors, strict=True)]
    types: dict[str, int] = {}
    for value in payloads[0].values():
        kind = type(value).__name__
        types[kind] = types.get(kind, 0) + 1
    with tempfile.TemporaryDirectory(prefix="pvm-engine-floor-") as tmp:
        root = Path(tmp)
        update_us = {
            "pvm_indexes": timed_update(root, "indexed", full, True, repeats),
            "no_indexes": timed_update(root, "plain", full, False, repeats),
            "no_payload": timed_update(root, "bare", bare, False, repeats),
        }
        overlap = overlaps_python(root, full)
    floor = round(with_payload + update_us["pvm_indexes"], 2)
    return {
        "points": n,
        "repeats": repeats,
        "python_us": python_us,
        "point_us": {"with_payload": with_payload, "without_payload": without_payload},
        "payload_conversion_us": round(with_payload - without_payload, 2),
        "payload_values": types,
        "value_conversion_us": value_conversion(min(n, 5_000), repeats),
        "update_us": update_us,
        "engine_floor_us": floor,
        "ceiling_per_s": round(1e6 / floor),
        **overlap,
        "qdrant_edge": importlib.metadata.version("qdrant-edge-py"),
        "machine": machine(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--points", type=int, default=20_000, help="minute points to time (default 20,000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each step; the best counts (default 3)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.points < 100 or args.repeats < 1:
        parser.error("--points must be at least 100 and --repeats at least 1")
    result = run(args.points, args.repeats, args.seed)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['points']:,} points, best of {result['repeats']} (qdrant-edge {result['qdrant_edge']})")
    print(f"  python before the engine   {sum(result['python_us'].values()):6.1f} us  {result['python_us']}")
    print(
        f"  Point, with payload        {result['point_us']['with_payload']:6.1f} us  (without: "
        f"{result['point_us']['without_payload']} us; one value: {result['value_conversion_us']})"
    )
    print(f"  update, PVM's indexes      {result['update_us']['pvm_indexes']:6.1f} us  {result['update_us']}")
    print(
        f"  engine floor               {result['engine_floor_us']:6.1f} us  -> at most "
        f"{result['ceiling_per_s']:,} minutes/s with no pool Python at all"
    )
    print(f"  update lets Python run     {result['update_overlaps_python']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

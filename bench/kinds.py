#!/usr/bin/env python
"""Search with facts and summaries beside the minutes: recall@10 on the timeline set with and without them.

Issue 12 item 6. The timeline set (`bench/timeline.py`) goes through the pools' own cores, as a live stack
would run them, on an embedded Valkey and the embedded engine:

- the index pool's steps (`bench.retrieval.index`): every minute a point;
- the facts pool (`workers.facts.pool.facts_batch`, rule extraction): its knowledge-change minutes, read back
  from the streams, fed to it again (as the log would) until it writes no more, then through the index
  pool's fact step (`workers.index.fact_points`): every fact a point;
- the summarize pool (`workers.summarize.pool.summarize_batch`): the summary-point jobs it queues, run as
  the index worker runs them (`workers.index.pool.run_summaries`): every chunk and episode a point.

Then every question is searched with ``kinds`` minutes only (the default), and with facts and/or summaries
too; a returned fact or summary *finds* an answer minute when its sources (``source_minute_ids``, a
summary's ``sources``) include it. Recall@10 = |answer minutes found in the top 10 results| / |answer
minutes|. Lexical-only and hybrid (the default weights, hashing or MiniLM embeddings as bench/retrieval.py).

    .venv/bin/python bench/kinds.py --json
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis

from bench.harness import machine_line, say, workspace
from bench.machine import machine
from bench.metrics import mean_recall, recall_at_k
from bench.retrieval import HASH_DIMENSIONS, CachedEmbedder, index, labeled_sets, sets_main, start_server
from bench.sessions import LabeledSession, Query
from contracts import decode_minute, encode_minute, keys
from contracts.memory import FactHit, RankWeights, SearchHit, SummaryHit
from pvm import defaults
from pvm.embedders import OpenAIEmbedder
from pvm.search import Hit, HybridSearch
from pvm.vectors.edge import EdgeEngine
from workers.facts.pool import FactsContext, facts_batch
from workers.index import fact_points, summary_points
from workers.runtime.queues import pool_queue
from workers.summarize.pool import SummarizeContext, summarize_batch

K = 10
BATCH = defaults.FANOUT_BATCH_SIZE
KIND_SETS: dict[str, tuple[str, ...]] = {
    "minutes": ("minute",),
    "minutes_facts": ("minute", "fact"),
    "minutes_summaries": ("minute", "summary"),
    "minutes_facts_summaries": ("minute", "fact", "summary"),
}


def found_ids(hits: Iterable[Hit]) -> list[str]:
    """The minutes the results stand for, in rank order, each once: a minute itself, a fact's or a summary's
    sources."""
    out: dict[str, None] = {}
    for h in hits:
        if isinstance(h, SearchHit):
            out[h.minute_id] = None
        elif isinstance(h, (FactHit, SummaryHit)):
            out.update(dict.fromkeys(h.sources))
    return list(out)


def recall(
    search: HybridSearch, project: str, queries: Sequence[Query], kinds: tuple[str, ...], now_ms: int
) -> dict[str, Any]:
    rows = []
    sources: list[int] = []  # of each fact or summary returned: how many minutes it stands for
    for q in queries:
        hits = search.search(project, q.text, k=K, now_ms=now_ms, kinds=kinds)
        others = [h for h in hits if isinstance(h, (FactHit, SummaryHit))]
        sources.extend(len(h.sources) for h in others)
        # the search cut the results at K; every minute they stand for counts
        rows.append((q, recall_at_k(found_ids(hits), q.relevant, None), len(others)))
    out: dict[str, Any] = {"recall_at_10": mean_recall(r for _, r, _ in rows)}
    for flag in ("multihop", "old"):
        of = [r for q, r, _ in rows if getattr(q, flag)]
        out[f"{flag}_recall_at_10"] = mean_recall(of) if of else None
    for kind in sorted({q.kind for q in queries}):
        out[f"kind_{kind}"] = mean_recall(r for q, r, _ in rows if q.kind == kind)
    out["other_kinds_per_answer"] = round(sum(n for _, _, n in rows) / len(rows), 2)
    out["sources_per_other_kind"] = round(sum(sources) / len(sources), 1) if sources else None
    return out


def _records(minutes: Sequence[Any], first_seq: int) -> list[list[Any]]:
    now_ms = int(time.time() * 1000)
    return [[m.id, first_seq + i, encode_minute(m), now_ms] for i, m in enumerate(minutes)]


def _stream_entries(connection: redis.Redis, shards: int, last: dict[str, bytes]) -> list[bytes]:
    raws: list[bytes] = []
    for shard in range(shards):
        name = keys.stream(shard)
        start = b"(" + last[name] if name in last else b"-"
        for entry_id, fields in connection.xrange(name, min=start, max="+"):
            last[name] = entry_id
            raws.append(fields[keys.MINUTE_FIELD])
    return raws


def index_facts(
    connection: redis.Redis, settings: Any, session: LabeledSession, engine: EdgeEngine, embedder: Any
) -> int:
    """The session through the facts pool, its change minutes back through it, then the fact points; how many."""
    ctx = FactsContext.build(connection, settings)
    seq = 0
    tail: dict[str, bytes] = {}
    changes: list[Any] = []
    pending = list(session.minutes)
    for _ in range(4):  # the pool's own changes come back through the log; it applies them, maybe writes more
        if not pending:
            break
        for start in range(0, len(pending), BATCH):
            part = pending[start : start + BATCH]
            facts_batch(ctx, connection, _records(part, seq + 1))
            seq += len(part)
        pending = [decode_minute(raw) for raw in _stream_entries(connection, settings.shards, tail)]
        changes += pending
    parsed, _ = fact_points.parse((m, i, fact_points.instant_ms(m.timestamp)) for i, m in enumerate(changes, 1))
    by_tenant: dict[str, list[fact_points.ParsedChange]] = {}
    for c in parsed:
        by_tenant.setdefault(c.tenant, []).append(c)
    facts = 0
    for tenant, of_tenant in by_tenant.items():
        point_keys, cleared = fact_points.needed(of_tenant)
        stored = {p.key: p for p in engine.get_points(tenant, point_keys, tier_keys=cleared, with_vectors=True)}
        planned = fact_points.plan(tenant, of_tenant, stored)
        points = planned.points
        if embedder is not None:
            vectors = embedder.embed([p.embed_text for p in points])
            points = [
                type(p)(p.minute_id, p.project_id, p.text, p.payload, dense=v if p.text else None, kind=p.kind)
                for p, v in zip(points, vectors, strict=True)
            ]
        if points:
            engine.upsert(points)
        facts += planned.facts
    return facts


def index_summaries(
    connection: redis.Redis, settings: Any, session: LabeledSession, engine: EdgeEngine, embedder: Any
) -> int:
    """The session through the summarize pool, and the summary-point jobs it queued as the index worker runs them."""
    ctx = SummarizeContext.build(connection, settings)
    for start in range(0, len(session.minutes), BATCH):
        summarize_batch(ctx, connection, _records(session.minutes[start : start + BATCH], start + 1))
        queue = pool_queue("index", connection)
        for job in [j for j in queue.jobs if j.func_name == keys.SUMMARY_POINTS_JOB]:
            project_id, threads = job.args
            summary_points.index_summaries(engine, embedder, project_id, threads)
        queue.empty()
    return sum(engine.count(p, kind="summary") for p in {m.project_id for m in session.minutes})


def run_timeline(session: LabeledSession, embedder: Any, now_ms: int) -> dict[str, Any]:
    project = session.minutes[0].project_id
    with tempfile.TemporaryDirectory(prefix="pvm-bench-kinds-") as tmp, workspace("retrieval-kinds") as ws:
        engine = EdgeEngine(Path(tmp), dense_dimensions=embedder.dimensions)
        try:
            say(f"kinds bench: {len(session.minutes):,} minutes; indexing minutes, facts, summaries")
            index(session, engine, embedder, now_ms / 1000)
            facts = index_facts(ws.connection, ws.settings, session, engine, embedder)
            summaries = index_summaries(ws.connection, ws.settings, session, engine, embedder)
            modes = {
                "lexical": HybridSearch(engine, None, RankWeights(*defaults.SEARCH_WEIGHTS)),
                "hybrid": HybridSearch(engine, embedder, RankWeights(*defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS)),
            }
            out: dict[str, Any] = {"minutes": len(session.minutes), "facts": facts, "summaries": summaries}
            for mode, search in modes.items():
                out[mode] = {name: recall(search, project, session.queries, kinds, now_ms)
                             for name, kinds in KIND_SETS.items()}  # fmt: skip
        finally:
            engine.close()
    return out


def run(embedder_name: str, seed: int, scale: float) -> dict[str, Any]:
    end_ms = int(time.time() * 1000)
    now_ms = end_ms + 60_000
    session = labeled_sets(seed, scale, end_ms)["timeline"]
    server = start_server(embedder_name)
    try:
        model = "all-MiniLM-L6-v2" if embedder_name == "minilm" else "hash-embed"
        dims = None if embedder_name == "minilm" else HASH_DIMENSIONS
        embedder = CachedEmbedder(OpenAIEmbedder(server.base_url, "bench", model, dimensions=dims))
        result = run_timeline(session, embedder, now_ms)
    finally:
        server.stop()
    for mode in ("lexical", "hybrid"):
        base = result[mode]["minutes"]["recall_at_10"]
        result[f"{mode}_with_facts_and_summaries_minus_minutes"] = round(
            result[mode]["minutes_facts_summaries"]["recall_at_10"] - base, 3
        )
    result.update({"set": "timeline", "embedder": model, "seed": seed, "scale": scale, "machine": machine()})
    return result


def table(result: dict[str, Any]) -> str:
    lines = [f"timeline set, {result['minutes']:,} minutes, {result['facts']} facts, {result['summaries']} summaries "
             f"({result['embedder']}); recall@10 (multi-hop, old)", ""]  # fmt: skip
    for mode in ("lexical", "hybrid"):
        for name, r in result[mode].items():
            lines.append(
                f"{mode:<8}{name:<26}{r['recall_at_10']:>7.3f}  ({r['multihop_recall_at_10']}, "
                f"{r['old_recall_at_10']})  other kinds in top 10: {r['other_kinds_per_answer']} "
                f"(standing for {r['sources_per_other_kind']} minutes each)"
            )
    lines += ["", machine_line(result["machine"], server=False)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return sets_main("bench/kinds.py", __doc__, run, table, argv)


if __name__ == "__main__":
    sys.exit(main())

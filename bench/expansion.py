#!/usr/bin/env python
"""Multi-hop candidates measured (issue 12 item 5): thread neighbours, reference expansion and pseudo-relevance
feedback.

On the three labeled sets of `bench/retrieval.py` (sessions, timeline, and multihop, held out), indexed as
there, recall@10 of every question, of the multi-hop ones and of the single-hop ones, lexical-only and
hybrid (the default weights and fusion; the thread lift on, as by default), for:

- ``base``: the defaults;
- ``neighbours_<n>_<decay>``: the best n hits bring in the minute before and the minute after them in their
  thread (the thread's order as the reader's thread view keeps it; here from the generated session), read by
  id, at decay times their score (`NeighbourSearch`);
- ``refs_<n>_<decay>``: the best n hits of a search bring in the minutes they reference
  (``context_references``, read by id) at decay times their score (`ReferenceSearch`);
- ``prf_<docs>_<terms>``: pseudo-relevance feedback on the lexical leg: the query plus the most frequent
  words of its best `docs` lexical hits (not in the query, `terms` of them); the dense leg embeds the
  query as asked.

A candidate is kept only where it raises multi-hop recall on the tuning sets (sessions, timeline) without
lowering single-hop recall there; the held-out set is reported only.

    .venv/bin/python bench/expansion.py --json
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import machine_line, say
from bench.machine import machine
from bench.metrics import mean_recall, recall_at_k
from bench.retrieval import HASH_DIMENSIONS, HELD_OUT, CachedEmbedder, index, labeled_sets, sets_main, start_server
from bench.sessions import LabeledSession, Query
from contracts import Minute
from contracts.memory import RankWeights, SearchFilters, SearchHit
from pvm import defaults
from pvm.embedders import OpenAIEmbedder
from pvm.search import HybridSearch, SearchResult
from pvm.vectors.edge import EdgeEngine
from workers.index.pool import lexical_text

K = 10
REFS = ((3, 0.95), (5, 0.95), (10, 0.95), (3, 0.9), (3, 0.7), (3, 0.5), (5, 0.5))
NEIGHBOURS = ((1, 0.95), (3, 0.95), (5, 0.95), (3, 0.9), (3, 0.7), (5, 0.5))
PRF = ((3, 5), (5, 10))
_WORD = re.compile(r"[a-z][a-z0-9-]{3,}")
_COMMON = frozenset(
    "that this with from they have were been will what which when where their there about after before into "  # noqa: SIM905
    "over under than then them these those your ours also only just more most some such very task agent".split()
)


class FeedbackSearch(HybridSearch):
    """Pseudo-relevance feedback on the lexical leg: the query and the top words of its best lexical hits."""

    def __init__(self, *args: Any, docs: int, terms: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.docs, self.terms = docs, terms
        self._asked = ""

    def search_result(self, project_id: str, query: str, *args: Any, **kwargs: Any) -> SearchResult:
        first = self.engine.query(project_id, query, None, SearchFilters(), self.docs, with_payload=True)
        asked = set(_WORD.findall(query.lower()))
        counts: Counter[str] = Counter()
        for c in first[: self.docs]:
            try:
                text = lexical_text(Minute.from_dict(c.payload.get("minute") or {}))
            except Exception:  # a point without a readable minute adds nothing
                continue
            counts.update(w for w in _WORD.findall(text.lower()) if w not in asked and w not in _COMMON)
        expanded = " ".join([query, *(w for w, _ in counts.most_common(self.terms))])
        self._asked = query
        try:
            return super().search_result(project_id, expanded, *args, **kwargs)
        finally:
            self._asked = ""

    def _embed(self, query: str) -> tuple[list[float] | None, str | None]:
        return super()._embed(self._asked or query)  # the dense leg embeds the question as asked


class ReferenceSearch(HybridSearch):
    """Reference expansion: the best `hits` hits bring in the minutes they reference (``context_references``)
    at `decay` times their score (parts "reference"), read by id; the best k of all."""

    def __init__(self, *args: Any, hits: int, decay: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hits, self.decay = hits, decay

    def search_result(self, project_id: str, query: str, *args: Any, **kwargs: Any) -> SearchResult:
        result = super().search_result(project_id, query, *args, **kwargs)
        k = kwargs.get("k", defaults.SEARCH_K)
        have = {h.minute_id for h in result.hits}
        lifted: dict[str, float] = {}
        for h in result.hits[: self.hits]:
            for ref in h.minute.get("context_references") or ():
                if isinstance(ref, str) and ref not in have and ref not in lifted:
                    lifted[ref] = h.score * self.decay
        found = self.engine.retrieve(project_id, list(lifted)) if lifted else []
        return _expanded(result, k, lifted, found, "reference")


def _expanded(result: SearchResult, k: int, lifted: dict[str, float], found: Sequence[Any], part: str) -> SearchResult:
    """`result`'s hits and the `found` candidates at their `lifted` scores (parts `part`), the best k of all."""
    more = [
        SearchHit(c.minute_id, lifted[c.minute_id], c.payload.get("minute") or {}, "", parts={part: 1.0})
        for c in found
        if c.payload.get("kind") is None
    ]
    return SearchResult(sorted([*result.hits, *more], key=lambda h: -h.score)[:k], result.degraded)


class NeighbourSearch(HybridSearch):
    """Thread neighbours: the best `hits` hits bring in the minute before and the minute after them in their
    thread at `decay` times their score (parts "neighbour"), read by id; the best k of all.

    `threads` gives each minute's thread as the ordered ids of its minutes (what the reader's thread view holds).
    """

    def __init__(self, *args: Any, threads: dict[str, list[str]], hits: int, decay: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hits, self.decay = hits, decay
        self.threads = threads
        self.place = {minute_id: i for ids in threads.values() for i, minute_id in enumerate(ids)}

    def search_result(self, project_id: str, query: str, *args: Any, **kwargs: Any) -> SearchResult:
        result = super().search_result(project_id, query, *args, **kwargs)
        have = {h.minute_id for h in result.hits}
        lifted: dict[str, float] = {}
        for h in result.hits[: self.hits]:
            ids = self.threads.get(h.minute_id)
            if not ids:
                continue
            at = self.place[h.minute_id]
            for neighbour in ids[max(0, at - 1) : at] + ids[at + 1 : at + 2]:
                if neighbour not in have and neighbour not in lifted:
                    lifted[neighbour] = h.score * self.decay
        found = self.engine.retrieve(project_id, list(lifted)) if lifted else []
        return _expanded(result, kwargs.get("k", defaults.SEARCH_K), lifted, found, "neighbour")


def thread_order(session: LabeledSession) -> dict[str, list[str]]:
    """Each threaded minute's id -> the ids of its thread's minutes, oldest first (the minutes come in order)."""
    by_thread: dict[str, list[str]] = {}
    for m in session.minutes:
        if m.thread_id:
            by_thread.setdefault(m.thread_id, []).append(m.id)
    return {minute_id: ids for ids in by_thread.values() for minute_id in ids}


def recall(search: HybridSearch, project: str, queries: Sequence[Query], now_ms: int) -> dict[str, Any]:
    rows = []
    for q in queries:
        ids = [h.minute_id for h in search.search_result(project, q.text, k=K, now_ms=now_ms).hits]
        rows.append((q, recall_at_k(ids, q.relevant, K)))

    def mean(values: list[float]) -> float | None:
        return mean_recall(values) if values else None

    return {
        "recall_at_10": mean([r for _, r in rows]),
        "multihop_recall_at_10": mean([r for q, r in rows if q.multihop]),
        "single_hop_recall_at_10": mean([r for q, r in rows if not q.multihop]),
    }


def run_set(session: LabeledSession, embedder: Any, now_ms: int) -> dict[str, Any]:
    project = session.minutes[0].project_id
    threads = thread_order(session)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pvm-bench-expansion-") as tmp:
        engine = EdgeEngine(Path(tmp), dense_dimensions=embedder.dimensions)
        try:
            index(session, engine, embedder, now_ms / 1000)
            legs = {
                "lexical": (None, RankWeights(*defaults.SEARCH_WEIGHTS)),
                "hybrid": (embedder, RankWeights(*defaults.SEARCH_WEIGHTS_WITH_EMBEDDINGS)),
            }
            for mode, (dense, weights) in legs.items():
                variants: dict[str, Any] = {}
                variants["base"] = recall(HybridSearch(engine, dense, weights), project, session.queries, now_ms)
                for docs, terms in PRF:
                    search: HybridSearch = FeedbackSearch(engine, dense, weights, docs=docs, terms=terms)
                    variants[f"prf_{docs}_{terms}"] = recall(search, project, session.queries, now_ms)
                for hits, decay in NEIGHBOURS:
                    search = NeighbourSearch(engine, dense, weights, threads=threads, hits=hits, decay=decay)
                    variants[f"neighbours_{hits}_{decay:g}"] = recall(search, project, session.queries, now_ms)
                for hits, decay in REFS:
                    search = ReferenceSearch(engine, dense, weights, hits=hits, decay=decay)
                    variants[f"refs_{hits}_{decay:g}"] = recall(search, project, session.queries, now_ms)
                out[mode] = variants
        finally:
            engine.close()
    return out


def run(embedder_name: str, seed: int, scale: float) -> dict[str, Any]:
    end_ms = int(time.time() * 1000)
    now_ms = end_ms + 60_000
    sets = labeled_sets(seed, scale, end_ms)
    server = start_server(embedder_name)
    try:
        model = "all-MiniLM-L6-v2" if embedder_name == "minilm" else "hash-embed"
        dims = None if embedder_name == "minilm" else HASH_DIMENSIONS
        embedder = CachedEmbedder(OpenAIEmbedder(server.base_url, "bench", model, dimensions=dims))
        per_set = {}
        for name, session in sets.items():
            say(f"expansion bench: {name}: {len(session.minutes):,} minutes, {len(session.queries)} queries")
            per_set[name] = run_set(session, embedder, now_ms)
    finally:
        server.stop()
    return {
        "sets": per_set,
        "held_out": sorted(HELD_OUT),
        "embedder": model,
        "seed": seed,
        "scale": scale,
        "machine": machine(),
    }


def table(result: dict[str, Any]) -> str:
    lines = [f"recall@10 all / multi-hop / single-hop ({result['embedder']}; held out: {result['held_out']})", ""]
    for name, modes in result["sets"].items():
        for mode, variants in modes.items():
            for variant, r in variants.items():
                cells = [r["recall_at_10"], r["multihop_recall_at_10"], r["single_hop_recall_at_10"]]
                text = " / ".join("-" if v is None else f"{v:.3f}" for v in cells)
                lines.append(f"{name:<10}{mode:<9}{variant:<16}{text}")
    lines += ["", machine_line(result["machine"], server=False)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return sets_main("bench/expansion.py", __doc__, run, table, argv)


if __name__ == "__main__":
    sys.exit(main())
